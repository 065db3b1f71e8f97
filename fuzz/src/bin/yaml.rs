//! AFL++ target: `trainyard::config::fuzz_targets::yaml` on each input.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        trainyard::config::fuzz_targets::yaml(data);
    });
}
