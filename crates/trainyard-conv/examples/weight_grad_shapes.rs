//! ResNet-18-CIFAR's convolution weight gradients alone (batch 64), median milliseconds of 7 calls after
//! a warm-up, on the rayon pool as `train` runs them, and the step's total (each shape times its count).
//! The figures for the weight kernel's rows in `bench/RESULTS.md`.
//!
//! usage: RAYON_NUM_THREADS=2 cargo run --release --manifest-path crates/trainyard-conv/Cargo.toml \
//!            --example weight_grad_shapes [avx512|avx2|portable16|portable]

use std::time::Instant;
use trainyard_conv::conv::{weight_grad, Geometry};
use trainyard_conv::Isa;

/// `train`'s allocator (src/main.rs).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// (in, out, image size, stride, count in the model); 3×3 kernels, padding 1.
const SHAPES: [(usize, usize, usize, usize, usize); 8] = [
    (3, 64, 32, 1, 1),
    (64, 64, 32, 1, 4),
    (64, 128, 32, 2, 1),
    (128, 128, 16, 1, 3),
    (128, 256, 16, 2, 1),
    (256, 256, 8, 1, 3),
    (256, 512, 8, 2, 1),
    (512, 512, 4, 1, 3),
];

fn main() {
    let isa = std::env::args()
        .nth(1)
        .and_then(|name| Isa::parse(&name))
        .unwrap_or_else(Isa::detected);
    assert!(isa.supported(), "{isa:?} is not supported by this CPU");
    let l = isa.lanes();
    let pool = rayon::ThreadPoolBuilder::new().build().unwrap();
    pool.install(|| {
        let mut total = 0.0;
        for (c_in, c_out, size, stride, count) in SHAPES {
            let g = Geometry {
                n: 64,
                c_in,
                c_out,
                h: size,
                w: size,
                k: 3,
                stride,
                padding: 1,
                lanes: l,
            };
            let x = vec![0.5f32; g.n * g.ib() * l * size * size];
            let dy = vec![0.25f32; g.n * g.ob() * l * g.oh() * g.ow()];
            let mut times: Vec<f64> = (0..8)
                .map(|_| {
                    let started = Instant::now();
                    std::hint::black_box(weight_grad(isa, &x, &dy, &g));
                    started.elapsed().as_secs_f64() * 1e3
                })
                .skip(1)
                .collect();
            times.sort_by(f64::total_cmp);
            let ms = times[times.len() / 2];
            println!("{c_in:>3} -> {c_out:<3} {size:>2} px stride {stride} x{count}: {ms:7.2} ms");
            total += ms * count as f64;
        }
        println!("{} weight gradients per step: {total:.1} ms", isa.name());
    });
}
