//! AFL++ target: `trainyard::config::fuzz_targets::defaults` on each input, its conf tree held in memory.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        trainyard::config::fuzz_targets::defaults(data);
    });
}
