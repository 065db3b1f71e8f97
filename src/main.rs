//! `train`: compose an experiment from YAML and overrides, then run it. All logic lives in the library.

/// Training allocates and frees activation-sized buffers every step; mimalloc reuses them instead of
/// handing pages back to the kernel and faulting them in again (glibc's large-block mmap path).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    trainyard::app::main_entry(std::env::args_os())
}
