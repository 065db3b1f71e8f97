//! What the kernel crate's timing examples share: `train`'s allocator, the median timer, deterministic
//! inputs and the L1 override `train` reads.

use std::time::Instant;

/// `train`'s allocator (src/main.rs): an op's output is then reused memory, not fresh pages, as in a step.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Median milliseconds of `f` over `n` runs, after one warm-up.
pub fn ms<T>(n: usize, mut f: impl FnMut() -> T) -> f64 {
    std::hint::black_box(f());
    let mut t: Vec<f64> = (0..n.max(1))
        .map(|_| {
            let s = Instant::now();
            std::hint::black_box(f());
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

/// `len` values in [-1, 1) from a fixed linear congruential sequence.
#[allow(dead_code)] // not every example makes its own inputs
pub fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 23) as f32) - 1.0
        })
        .collect()
}

/// `TRAINYARD_CONV_L1D=32K` blocks for another L1 than the detected one (as `train` reads it); call before
/// any kernel runs. Prints the size the kernels block for.
pub fn block_for_env_l1() {
    if let Ok(v) = std::env::var("TRAINYARD_CONV_L1D") {
        let bytes = trainyard_conv::cache::parse_size(&v)
            .unwrap_or_else(|| panic!("TRAINYARD_CONV_L1D={v:?} is not a size: 32K, 48KiB, 32768"));
        trainyard_conv::cache::set_l1d_bytes(bytes).expect("set before any kernel runs");
    }
    eprintln!(
        "blocking for a {} KiB L1",
        trainyard_conv::cache::l1d_bytes() / 1024
    );
}

/// (in, out, image size, kernel, stride, count in the model); padding k / 2. The stem's input gradient is
/// never asked for (the images need none), so its row times the weight gradient only.
pub type Shape = (usize, usize, usize, usize, usize, usize);

/// ResNet-18 with the CIFAR stem at 32 px.
#[allow(dead_code)] // not every example times these shapes
pub const RESNET18: [Shape; 11] = [
    (3, 64, 32, 3, 1, 1),
    (64, 64, 32, 3, 1, 4),
    (64, 128, 32, 3, 2, 1),
    (64, 128, 32, 1, 2, 1),
    (128, 128, 16, 3, 1, 3),
    (128, 256, 16, 3, 2, 1),
    (128, 256, 16, 1, 2, 1),
    (256, 256, 8, 3, 1, 3),
    (256, 512, 8, 3, 2, 1),
    (256, 512, 8, 1, 2, 1),
    (512, 512, 4, 3, 1, 3),
];
