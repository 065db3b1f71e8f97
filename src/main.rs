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
    // Where our SIMD kernels run (every heavy op of the CNN, ResNet and ViT), Candle's own elementwise
    // thread pool only competes with rayon's workers for the cores: its few remaining ops run on the
    // calling thread instead (ViT-Tiny step ~3% faster, ResNet unchanged). A value the user set wins.
    let simd = !matches!(
        trainyard_conv::Isa::detected(),
        trainyard_conv::Isa::Portable8 | trainyard_conv::Isa::Portable16
    );
    let direct_off = std::env::var("TRAINYARD_CONV").as_deref() == Ok("im2col");
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() && simd && !direct_off {
        // Before any thread exists (nothing has started one yet), so no other thread reads the environment.
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
    trainyard::app::main_entry(std::env::args_os())
}
