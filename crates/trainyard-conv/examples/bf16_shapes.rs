//! The bf16 products of ResNet-18-CIFAR's convolutions as the im2col conv runs them (batch 64, one
//! single-threaded product per task of ≥ 512 output pixels, the tasks over the rayon pool): the forward
//! pass `W (out × in·k²) · col (in·k² × pixels)`, the input gradient `Wᵀ · dY` and the weight gradient
//! `dY · colᵀ`, on each bf16 tier this CPU has and, for comparison, the f32 GEMM (`gemm::matmul`) on the
//! widest f32 path. Median milliseconds of 5 batches, and the step's totals.
//!
//! usage: RAYON_NUM_THREADS=2 cargo run --release --manifest-path crates/trainyard-conv/Cargo.toml \
//!            --example bf16_shapes

mod common;

use rayon::prelude::*;
use trainyard_conv::bf16::{matmul, Tier};
use trainyard_conv::gemm::{self, Dims, Strides};
use trainyard_conv::Isa;

use common::RESNET18;

fn main() {
    let tiers: Vec<Tier> = [Tier::Amx, Tier::Avx512Bf16]
        .into_iter()
        .filter(|t| t.supported())
        .collect();
    let isa = Isa::detected();
    common::block_for_env_l1();
    let pool = rayon::ThreadPoolBuilder::new().build().unwrap();
    pool.install(|| {
        let mut totals = vec![0f64; tiers.len() + 1];
        for &(c_in, c_out, size, k, stride, count) in &RESNET18 {
            let ohw = (size / stride) * (size / stride);
            let images = 512usize.div_ceil(ohw).clamp(1, 32);
            let (tasks, pixels) = (64 / images, images * ohw);
            let ckk = c_in * k * k;
            let w = common::values(c_out * ckk, 1);
            let col = common::values(ckk * pixels, 2);
            let dy = common::values(c_out * pixels, 3);
            // (m, n, k, lhs, lhs strides, rhs, rhs strides) of the three passes.
            let passes = [
                (c_out, pixels, ckk, &w, (ckk, 1), &col, (pixels, 1)),
                (ckk, pixels, c_out, &w, (1, ckk), &dy, (pixels, 1)),
                (c_out, ckk, pixels, &dy, (pixels, 1), &col, (1, pixels)),
            ];
            let mut line = format!("{c_in:>3} -> {c_out:<3} {size:>2} px k{k} s{stride} x{count}:");
            for (t, tier) in tiers.iter().enumerate() {
                let ms: f64 = passes
                    .iter()
                    .map(|&(m, n, kk, a, sa, b, sb)| {
                        let mut c = vec![0f32; m * n * tasks];
                        common::ms(5, || {
                            c.par_chunks_mut(m * n).for_each(|c| {
                                matmul(
                                    *tier,
                                    (m, n, kk),
                                    (c, (n, 1)),
                                    false,
                                    (a, sa),
                                    (b, sb),
                                    false,
                                )
                            })
                        })
                    })
                    .sum();
                line += &format!("  {} {ms:6.2} ms", tier.name());
                totals[t] += ms * count as f64;
            }
            let f32_ms: f64 = passes
                .iter()
                .map(|&(m, n, kk, a, (ar, ac), b, (br, bc))| {
                    let d = Dims {
                        batch: 1,
                        m,
                        k: kk,
                        n,
                    };
                    let sa = Strides {
                        batch: 0,
                        row: ar,
                        col: ac,
                    };
                    let sb = Strides {
                        batch: 0,
                        row: br,
                        col: bc,
                    };
                    common::ms(5, || {
                        (0..tasks)
                            .into_par_iter()
                            .map(|_| gemm::matmul(isa, d, (a, sa), (b, sb)).len())
                            .sum::<usize>()
                    })
                })
                .sum();
            line += &format!("  f32 {} {f32_ms:6.2} ms", isa.name());
            *totals.last_mut().unwrap() += f32_ms * count as f64;
            println!("{line}");
        }
        let names: Vec<&str> = tiers.iter().map(|t| t.name()).chain([isa.name()]).collect();
        for (name, ms) in names.iter().zip(&totals) {
            println!("per step (three passes): {name} {ms:.1} ms");
        }
    });
}
