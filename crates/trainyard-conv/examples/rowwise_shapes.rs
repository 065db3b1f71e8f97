//! ViT-Tiny/8's row-wise ops on this crate's kernels alone (batch 64: 1088 rows of 192, the MLP's 768):
//! LayerNorm, GELU and softmax, forward and backward, median milliseconds. The whole Candle op, its
//! bookkeeping included, is `examples/step_profile vit-ops`; PyTorch's is `bench/vit_profile.py`.
//!
//! usage: RAYON_NUM_THREADS=2 cargo run --release --manifest-path crates/trainyard-conv/Cargo.toml \
//!            --example rowwise_shapes [runs] [isa]

mod common;

use common::{ms, values};
use trainyard_conv::rowwise;
use trainyard_conv::Isa;

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(50, |v| {
        v.parse().unwrap_or_else(|_| {
            panic!("runs: {v:?} is not a count (usage: rowwise_shapes [runs] [isa])")
        })
    });
    let isa = args.next().map_or_else(Isa::detected, |v| {
        Isa::parse(&v)
            .unwrap_or_else(|| panic!("{v:?} is not an ISA: avx512, avx2, portable16, portable"))
    });
    assert!(isa.supported(), "{isa:?} is not supported by this CPU");
    common::block_for_env_l1();
    let (rows, d, hidden, heads, tokens) = (64 * 17, 192, 768, 3, 17);
    let (x, dy) = (values(rows * d, 1), values(rows * d, 2));
    let (w, b) = (values(d, 3), values(d, 4));
    let (h, dh) = (values(rows * hidden, 5), values(rows * hidden, 6));
    let scores = values(64 * heads * tokens * tokens, 7);
    let y = rowwise::softmax(isa, &scores, tokens);
    let pool = rayon::ThreadPoolBuilder::new()
        .build()
        .expect("a thread pool");
    pool.install(|| {
        println!("{} ({} threads)", isa.name(), rayon::current_num_threads());
        let rows_of = [
            (
                "layer norm 1088x192",
                ms(n, || drop(rowwise::layer_norm(isa, &x, &w, &b, 1e-6))),
                ms(n, || {
                    drop(rowwise::layer_norm_backward(isa, &x, &w, &dy, 1e-6))
                }),
            ),
            (
                "gelu 1088x768",
                ms(n, || drop(rowwise::gelu(isa, &h))),
                ms(n, || drop(rowwise::gelu_backward(isa, &h, &dh))),
            ),
            (
                "softmax 64x3x17x17",
                ms(n, || drop(rowwise::softmax(isa, &scores, tokens))),
                ms(n, || {
                    drop(rowwise::softmax_backward(isa, &y, &scores, tokens))
                }),
            ),
        ];
        for (name, fwd, bwd) in rows_of {
            println!("  {name:22} fwd {fwd:6.3} ms  bwd {bwd:6.3} ms");
        }
    });
}
