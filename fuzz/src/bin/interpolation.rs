//! AFL++ target: `trainyard::config::fuzz_targets::interpolation` on each input.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        trainyard::config::fuzz_targets::interpolation(data);
    });
}
