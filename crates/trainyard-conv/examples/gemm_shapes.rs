//! The ViT-Tiny/8 linear layers' three products (forward with bias, input gradient, weight gradient) on
//! this crate's GEMM alone, median milliseconds: the figures `bench/vit_profile.py` sets beside MKL's.
//!
//! usage: RAYON_NUM_THREADS=2 cargo run --release --manifest-path crates/trainyard-conv/Cargo.toml \
//!            --example gemm_shapes [runs] [isa] [only]
//! (isa: avx512, avx2, portable16, portable, else `TRAINYARD_CONV_ISA`, else the CPU's widest; only:
//! one product, "fc2:dw", or an M x K x N product of contiguous matrices, "1088x192x576", with its GF/s)
//! `TRAINYARD_CONV_L1D=32K` blocks for another L1 than the detected one.

mod common;

use common::{ms, values};
use trainyard_conv::gemm::{matmul, matmul_bias, Dims, Strides};
use trainyard_conv::Isa;

/// "MxKxN" as a product's (m, k, n).
fn shape(text: &str) -> Option<(usize, usize, usize)> {
    let v: Vec<usize> = text
        .split('x')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    (v.len() == 3).then(|| (v[0], v[1], v[2]))
}

fn main() {
    // Run on a worker of the pool, as `train` does: a product called from outside it is queued into the
    // pool and its caller sleeps and wakes (~60 us a call on a VM, a tenth of a ViT product).
    let pool = rayon::ThreadPoolBuilder::new()
        .build()
        .expect("a thread pool");
    pool.install(run);
}

fn run() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(30, |v| {
        v.parse().unwrap_or_else(|_| {
            panic!("runs: {v:?} is not a count (usage: gemm_shapes [runs] [isa] [only])")
        })
    });
    let isa_name = args.next().map(|v| (v, "the isa argument")).or_else(|| {
        std::env::var("TRAINYARD_CONV_ISA")
            .ok()
            .map(|v| (v, "TRAINYARD_CONV_ISA"))
    });
    let isa = match isa_name {
        Some((v, source)) => Isa::parse(&v).unwrap_or_else(|| {
            panic!("{source}={v:?} is not an ISA: avx512, avx2, portable16, portable")
        }),
        None => Isa::detected(),
    };
    common::block_for_env_l1();
    // "fc2:dw" runs that product alone (for a profiler); every product otherwise.
    let only = args.next();
    if let Some((m, k, nn)) = only.as_deref().and_then(shape) {
        let (a, b) = (values(m * k, 1), values(k * nn, 2));
        let d = Dims {
            batch: 1,
            m,
            k,
            n: nn,
        };
        let t = ms(n, || {
            std::hint::black_box(matmul(
                isa,
                d,
                (&a, Strides::contiguous(m, k)),
                (&b, Strides::contiguous(k, nn)),
            ));
        });
        println!(
            "{m}x{k}x{nn}: {:.1} us  {:.1} GF/s",
            t * 1e3,
            2.0 * (m * k * nn) as f64 / t / 1e6
        );
        return;
    }
    let products = [
        ("qkv", 192, 576),
        ("proj", 192, 192),
        ("fc1", 192, 768),
        ("fc2", 768, 192),
    ];
    if let Some(o) = only.as_deref() {
        let known = o.split_once(':').is_some_and(|(name, pass)| {
            products.iter().any(|p| p.0 == name) && ["fwd", "dx", "dw"].contains(&pass)
        });
        assert!(
            known,
            "only: {o:?} is neither a product (qkv|proj|fc1|fc2 : fwd|dx|dw, e.g. fc2:dw) nor MxKxN"
        );
    }
    let skip = |what: &str| only.as_deref().is_some_and(|o| o != what);
    let rows = 64 * 17;
    let dims = |m, k, n| Dims { batch: 1, m, k, n };
    let (mut total, mut out) = (0.0, Vec::new());
    for (name, i, o) in products {
        let (x, w, b, dy) = (
            values(rows * i, 1),
            values(o * i, 2),
            values(o, 3),
            values(rows * o, 4),
        );
        let (sx, sw, sdy) = (
            Strides::contiguous(rows, i),
            Strides::contiguous(o, i),
            Strides::contiguous(rows, o),
        );
        let time = |what: &str, f: &mut dyn FnMut()| {
            if skip(&format!("{name}:{what}")) {
                0.0
            } else {
                ms(n, f)
            }
        };
        let fwd = time("fwd", &mut || {
            std::hint::black_box(matmul_bias(
                isa,
                dims(rows, i, o),
                (&x, sx),
                (&w, sw.t()),
                &b,
            ));
        });
        let dx = time("dx", &mut || {
            std::hint::black_box(matmul(isa, dims(rows, o, i), (&dy, sdy), (&w, sw)));
        });
        let dw = time("dw", &mut || {
            std::hint::black_box(matmul(isa, dims(o, rows, i), (&dy, sdy.t()), (&x, sx)));
        });
        total += fwd + dx + dw;
        out.push(format!(
            "  gemm {name:5} fwd {fwd:7.3} ms  dx {dx:7.3} ms  dw {dw:7.3} ms"
        ));
    }
    println!(
        "{} ({}): {total:.3} ms per block",
        isa.name(),
        rayon::current_num_threads()
    );
    for line in out {
        println!("{line}");
    }
}
