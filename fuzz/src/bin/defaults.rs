//! AFL++ target: `trainyard::config::fuzz_targets::defaults` on each input, its conf tree written in a
//! scratch folder of this process (`$TMPDIR/trainyard-fuzz-<pid>`).
fn main() {
    let scratch = std::env::temp_dir().join(format!("trainyard-fuzz-{}", std::process::id()));
    afl::fuzz!(|data: &[u8]| {
        trainyard::config::fuzz_targets::defaults(data, &scratch);
    });
}
