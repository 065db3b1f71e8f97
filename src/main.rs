//! `train`: compose an experiment from YAML and overrides, then run it. All logic lives in the library.
fn main() -> std::process::ExitCode {
    trainyard::app::main_entry(std::env::args_os())
}
