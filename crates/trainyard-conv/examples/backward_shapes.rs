//! ResNet-18-CIFAR's (or ResNet-50's at 64 px) convolution passes alone (batch 64): the forward pass, the input gradient and the
//! weight gradient of each shape, median milliseconds of 7 calls after a warm-up, on the rayon pool as `train`
//! runs them, and the step's totals (each shape times its count). The figures for the backward kernels'
//! rows in `bench/RESULTS.md` (the whole op, Candle included, is `examples/step_profile resnet-convs`).
//!
//! usage: RAYON_NUM_THREADS=2 cargo run --release --manifest-path crates/trainyard-conv/Cargo.toml \
//!            --example backward_shapes [avx512|avx2|portable16|portable] [resnet18|resnet50] [in->out]
//!
//! A last argument such as `512->512` times only the shapes with those channels (for `perf`);
//! `TRAINYARD_CONV_L1D=32K` blocks for another L1 than the detected one.

mod common;

use common::{Shape, RESNET18};

use trainyard_conv::conv::{forward, input_grad, weight_grad, Geometry};
use trainyard_conv::Isa;

/// torchvision's ResNet-50 (stride on the 3×3 convolutions) at 64 px: stem, then 16, 8, 4 and 2 px.
const RESNET50: [Shape; 23] = [
    (3, 64, 64, 7, 2, 1),
    (64, 64, 16, 1, 1, 1),
    (256, 64, 16, 1, 1, 2),
    (64, 64, 16, 3, 1, 3),
    (64, 256, 16, 1, 1, 4),
    (256, 128, 16, 1, 1, 1),
    (512, 128, 8, 1, 1, 3),
    (128, 128, 16, 3, 2, 1),
    (128, 128, 8, 3, 1, 3),
    (128, 512, 8, 1, 1, 4),
    (256, 512, 16, 1, 2, 1),
    (512, 256, 8, 1, 1, 1),
    (1024, 256, 4, 1, 1, 5),
    (256, 256, 8, 3, 2, 1),
    (256, 256, 4, 3, 1, 5),
    (256, 1024, 4, 1, 1, 6),
    (512, 1024, 8, 1, 2, 1),
    (1024, 512, 4, 1, 1, 1),
    (2048, 512, 2, 1, 1, 2),
    (512, 512, 4, 3, 2, 1),
    (512, 512, 2, 3, 1, 2),
    (512, 2048, 2, 1, 1, 3),
    (1024, 2048, 4, 1, 2, 1),
];

fn main() {
    let isa = std::env::args()
        .nth(1)
        .and_then(|name| Isa::parse(&name))
        .unwrap_or_else(Isa::detected);
    assert!(isa.supported(), "{isa:?} is not supported by this CPU");
    common::block_for_env_l1();
    let l = isa.lanes();
    let rest: Vec<String> = std::env::args().skip(2).collect();
    let shapes: &[Shape] = match rest.first().map(String::as_str) {
        Some("resnet50") => &RESNET50,
        _ => &RESNET18,
    };
    let only = rest.iter().find(|a| a.contains("->"));
    let pool = rayon::ThreadPoolBuilder::new().build().unwrap();
    pool.install(|| {
        let (mut forwards, mut inputs, mut weights) = (0.0, 0.0, 0.0);
        for &(c_in, c_out, size, k, stride, count) in shapes {
            if only.is_some_and(|o| *o != format!("{c_in}->{c_out}")) {
                continue;
            }
            let g = Geometry {
                n: 64,
                c_in,
                c_out,
                h: size,
                w: size,
                k,
                stride,
                padding: k / 2,
                lanes: l,
            };
            let x = vec![0.5f32; g.n * g.ib() * l * size * size];
            let w = vec![0.125f32; c_out * c_in * k * k];
            let dy = vec![0.25f32; g.n * g.ob() * l * g.oh() * g.ow()];
            let fwd_ms = common::ms(7, || forward(isa, &x, &w, &g));
            let dx_ms = if c_in == 3 {
                0.0
            } else {
                common::ms(7, || input_grad(isa, &dy, &w, &g))
            };
            let dw_ms = common::ms(7, || weight_grad(isa, &x, &dy, &g));
            println!(
                "{c_in:>3} -> {c_out:<3} {size:>2} px k{k} s{stride} x{count}: forward {fwd_ms:6.2} ms  input {dx_ms:6.2} ms  weight {dw_ms:6.2} ms"
            );
            forwards += fwd_ms * count as f64;
            inputs += dx_ms * count as f64;
            weights += dw_ms * count as f64;
        }
        println!(
            "{} per step: forward {forwards:.1} ms, input gradients {inputs:.1} ms, weight gradients {weights:.1} ms",
            isa.name()
        );
    });
}
