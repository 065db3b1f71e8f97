//! `train`: compose an experiment from YAML and overrides, then run it. All logic lives in the library.

/// Training allocates and frees activation-sized buffers every step; mimalloc reuses them instead of
/// handing pages back to the kernel and faulting them in again (glibc's large-block mmap path). The counting
/// wrapper measures heap use for the batch-size finder.
#[global_allocator]
static ALLOCATOR: trainyard::memory::Counting<mimalloc::MiMalloc> =
    trainyard::memory::Counting(mimalloc::MiMalloc);

/// mimalloc v2's `mi_option_purge_delay`: -1 keeps freed pages mapped, so the next step's buffers of the
/// same size do not fault in and zero fresh pages (10% of a ResNet step otherwise).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

fn main() -> std::process::ExitCode {
    // SAFETY: sets a process-wide allocator option before any worker thread exists.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    trainyard::app::main_entry(std::env::args_os())
}
