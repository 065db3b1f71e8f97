//! The GEMM kernel (`trainyard_conv::gemm`) against a plain loop: every element of C is one chain of fused
//! multiply-adds in the order of k on every path, so each path this CPU runs must give exactly the bits of
//! `f32::mul_add` summed in that order, and stay within float32 rounding of a float64 sum. Odd shapes
//! (one row, columns not a multiple of the block, a reduction longer than one L1 slice), transposed and
//! batched operands. Then the Candle op's autograd against Candle's own matmul.

mod common;

use candle_core::Var;
use common::kernels::{assert_same_gradients, max_diff, tensor, values};
use rstest::rstest;
use trainyard::backend::candle::kernels::direct::matmul::{linear, matmul as candle_matmul};
use trainyard_conv::gemm::{matmul, matmul_bias, Dims, Strides};
use trainyard_conv::Isa;

/// (f32 fused chain in the order of k, float64 sum) of every element of C.
fn reference(d: Dims, a: (&[f32], Strides), b: (&[f32], Strides)) -> (Vec<f32>, Vec<f64>) {
    reference_from(d, a, b, &vec![0.0; d.n])
}

/// `reference` with each column's chain starting from `start[j]`.
fn reference_from(
    d: Dims,
    (a, sa): (&[f32], Strides),
    (b, sb): (&[f32], Strides),
    start: &[f32],
) -> (Vec<f32>, Vec<f64>) {
    let mut exact = Vec::new();
    let mut wide = Vec::new();
    for bi in 0..d.batch {
        for i in 0..d.m {
            for j in 0..d.n {
                let (mut s32, mut s64) = (start[j], f64::from(start[j]));
                for k in 0..d.k {
                    let x = a[bi * sa.batch + i * sa.row + k * sa.col];
                    let y = b[bi * sb.batch + k * sb.row + j * sb.col];
                    s32 = x.mul_add(y, s32);
                    s64 += f64::from(x) * f64::from(y);
                }
                exact.push(s32);
                wide.push(s64);
            }
        }
    }
    (exact, wide)
}

#[rstest]
#[case::one_row(1, 1, 7, 5, false, false)]
#[case::square(1, 24, 24, 24, false, false)]
#[case::odd_columns(1, 17, 64, 17, false, false)]
#[case::long_reduction(1, 9, 400, 50, false, false)]
#[case::transposed_b(1, 33, 192, 49, false, true)]
#[case::transposed_a(1, 20, 300, 33, true, false)]
#[case::both_transposed(1, 11, 65, 3, true, true)]
#[case::batched(5, 17, 64, 17, false, true)]
#[case::batched_wide(3, 13, 17, 100, true, false)]
#[case::b_packed_by_each_task(1, 9, 300, 64, false, false)]
#[case::b_packed_by_each_task_batched(2, 5, 40, 32, true, false)]
#[case::b_packed_by_each_task_transposed(1, 5, 300, 37, false, true)]
#[case::b_packed_by_each_task_odd_columns(2, 3, 130, 45, true, false)]
fn every_path_gives_the_bits_of_a_fused_chain(
    #[case] batch: usize,
    #[case] m: usize,
    #[case] k: usize,
    #[case] n: usize,
    #[case] a_t: bool,
    #[case] b_t: bool,
) {
    let d = Dims { batch, m, k, n };
    let a = values(batch * m * k, 1);
    let b = values(batch * k * n, 2);
    // A stored (batch, m, k), or (batch, k, m) and read transposed; B likewise.
    let sa = if a_t {
        Strides::contiguous(k, m).t()
    } else {
        Strides::contiguous(m, k)
    };
    let sb = if b_t {
        Strides::contiguous(n, k).t()
    } else {
        Strides::contiguous(k, n)
    };
    let (exact, wide) = reference(d, (&a, sa), (&b, sb));
    let isas: Vec<Isa> = [Isa::Avx512, Isa::Avx2, Isa::Portable16, Isa::Portable8]
        .into_iter()
        .filter(|i| i.supported())
        .collect();
    // The portable paths run on every machine: a `supported()` that said no to all would check nothing.
    assert!(
        isas.contains(&Isa::Portable16) && isas.contains(&Isa::Portable8),
        "{isas:?}"
    );
    for isa in isas {
        let c = matmul(isa, d, (&a, sa), (&b, sb));
        assert_eq!(c, exact, "{isa:?}: not the fused chain's bits");
        // With a bias the chain starts from it.
        let bias = values(n, 3);
        let with_bias = matmul_bias(isa, d, (&a, sa), (&b, sb), &bias);
        let (started, _) = reference_from(d, (&a, sa), (&b, sb), &bias);
        assert_eq!(with_bias, started, "{isa:?}: bias");
        let worst = c
            .iter()
            .zip(&wide)
            .map(|(&x, &y)| (f64::from(x) - y).abs() / (1.0 + y.abs()))
            .fold(0f64, f64::max);
        assert!(worst < 1e-5 * (k as f64).sqrt(), "{isa:?}: {worst}");
    }
}

#[test]
fn a_batch_repeating_one_matrix_reads_it_through_a_zero_stride() {
    let d = Dims {
        batch: 4,
        m: 3,
        k: 5,
        n: 18,
    };
    let a = values(3 * 5, 3);
    let b = values(4 * 5 * 18, 4);
    let sa = Strides {
        batch: 0,
        row: 5,
        col: 1,
    };
    let sb = Strides::contiguous(5, 18);
    let (exact, _) = reference(d, (&a, sa), (&b, sb));
    assert_eq!(matmul(Isa::detected(), d, (&a, sa), (&b, sb)), exact);
}

#[test]
fn an_empty_reduction_gives_zeros() {
    let d = Dims {
        batch: 2,
        m: 3,
        k: 0,
        n: 4,
    };
    assert_eq!(
        matmul(
            Isa::Portable8,
            d,
            (&[], Strides::contiguous(3, 0)),
            (&[], Strides::contiguous(0, 4))
        ),
        vec![0.0; 24]
    );
}

#[test]
fn the_candle_op_and_its_gradients_match_candles_matmul() {
    let isa = Isa::detected();
    let a = Var::from_tensor(&tensor(&[2, 3, 17, 64], 5)).unwrap();
    let b = Var::from_tensor(&tensor(&[2, 3, 17, 64], 6)).unwrap();
    let probe = tensor(&[2, 3, 17, 17], 7);
    // Attention's q·kᵀ: B read transposed through its strides.
    let ours = candle_matmul(isa, a.as_tensor(), &b.as_tensor().t().unwrap()).unwrap();
    let theirs = a.as_tensor().matmul(&b.as_tensor().t().unwrap()).unwrap();
    assert!(max_diff(&ours, &theirs) < 1e-5);
    assert_same_gradients((&ours, &theirs), &probe, &[&a, &b], 1e-5);
}

#[test]
fn linear_matches_candles_and_its_gradients_reach_weight_bias_and_input() {
    let isa = Isa::detected();
    let x = Var::from_tensor(&tensor(&[4, 17, 40], 8)).unwrap();
    let w = Var::from_tensor(&tensor(&[33, 40], 9)).unwrap();
    let b = Var::from_tensor(&tensor(&[33], 10)).unwrap();
    let probe = tensor(&[4, 17, 33], 11);
    let ours = linear(isa, x.as_tensor(), w.as_tensor(), b.as_tensor()).unwrap();
    let theirs = x
        .as_tensor()
        .broadcast_matmul(&w.as_tensor().t().unwrap())
        .unwrap()
        .broadcast_add(b.as_tensor())
        .unwrap();
    assert_eq!(ours.dims(), &[4, 17, 33]);
    assert!(max_diff(&ours, &theirs) < 1e-5);
    assert_same_gradients((&ours, &theirs), &probe, &[&x, &w, &b], 1e-4);
}
