use super::*;
use rstest::rstest;

/// A deterministic pseudo-random matrix in [-2, 2).
fn matrix(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect()
}

/// The product of the bf16-rounded operands in f64: what every tier approximates by f32 sums.
fn reference(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f64> {
    let r = |v: f32| from_bf16(pack::to_bf16(v)) as f64;
    let mut c = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|kk| r(a[i * k + kk]) * r(b[kk * n + j])).sum();
        }
    }
    c
}

fn tiers() -> Vec<Tier> {
    [Tier::Amx, Tier::Avx512Bf16, Tier::Fma, Tier::Portable]
        .into_iter()
        .filter(|t| t.supported())
        .collect()
}

#[rstest]
#[case::one_tile(16, 16, 32)]
#[case::edges_everywhere(37, 45, 83)]
#[case::first_conv(64, 1024, 27)]
#[case::long_reduction(20, 70, 1100)]
#[case::single_row(1, 33, 5)]
fn every_tier_gives_the_product_of_the_rounded_operands(
    #[case] m: usize,
    #[case] n: usize,
    #[case] k: usize,
    #[values(false, true)] parallel: bool,
) {
    let (a, b) = (matrix(m * k, 1), matrix(k * n, 2));
    let want = reference(m, n, k, &a, &b);
    for tier in tiers() {
        let mut c = vec![f32::NAN; m * n];
        matmul(
            tier,
            (m, n, k),
            (&mut c, (n, 1)),
            false,
            (&a, (k, 1)),
            (&b, (n, 1)),
            parallel,
        );
        for (i, (got, want)) in c.iter().zip(&want).enumerate() {
            // f32 sums of k exact products, each at most 4 in size.
            let tol = 4.0 * k as f64 * f32::EPSILON as f64 * 4.0;
            assert!(
                (*got as f64 - want).abs() <= tol,
                "{} at ({}, {}): {got} vs {want}",
                tier.name(),
                i / n,
                i % n
            );
        }
    }
}

#[test]
fn strides_transposes_and_accumulation_are_honoured() {
    let (m, n, k) = (19, 40, 50);
    let (a, b) = (matrix(m * k, 3), matrix(k * n, 4));
    let at: Vec<f32> = (0..m * k).map(|t| a[(t % m) * k + t / m]).collect();
    let bt: Vec<f32> = (0..k * n).map(|t| b[(t % k) * n + t / k]).collect();
    let want = reference(m, n, k, &a, &b);
    for tier in tiers() {
        // C written transposed (column-major) on top of ones, from transposed A and B.
        let mut c = vec![1f32; m * n];
        matmul(
            tier,
            (m, n, k),
            (&mut c, (1, m)),
            true,
            (&at, (1, m)),
            (&bt, (1, k)),
            true,
        );
        for i in 0..m {
            for j in 0..n {
                let got = c[j * m + i] as f64;
                assert!(
                    (got - 1.0 - want[i * n + j]).abs() < 1e-3,
                    "{} ({i}, {j})",
                    tier.name()
                );
            }
        }
    }
}

#[test]
fn avx512_bf16_sums_as_the_portable_reference_does() {
    // vdpbf16ps adds a pair's two products to each sum in the order of k, as the portable block does; the
    // two differ only in where the intermediate roundings fall.
    if !Tier::Avx512Bf16.supported() {
        return;
    }
    let (m, n, k) = (33, 48, 96);
    let (a, b) = (matrix(m * k, 5), matrix(k * n, 6));
    let run = |tier| {
        let mut c = vec![0f32; m * n];
        matmul(
            tier,
            (m, n, k),
            (&mut c, (n, 1)),
            false,
            (&a, (k, 1)),
            (&b, (n, 1)),
            false,
        );
        c
    };
    let (simd, portable) = (run(Tier::Avx512Bf16), run(Tier::Portable));
    let worst = simd
        .iter()
        .zip(&portable)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(worst < 1e-4, "largest difference {worst}");
}

#[test]
fn names_round_trip() {
    for tier in [Tier::Amx, Tier::Avx512Bf16, Tier::Fma, Tier::Portable] {
        assert_eq!(Tier::parse(tier.name()), Some(tier));
    }
    assert_eq!(Tier::parse("avx2"), None);
}

#[rstest]
#[case::whole_tiles(32, 64, 64)]
#[case::edges(21, 37, 45)]
fn operands_made_row_by_row_equal_stored_ones(
    #[case] m: usize,
    #[case] n: usize,
    #[case] k: usize,
) {
    let (a, b) = (matrix(m * k, 7), matrix(k * n, 8));
    let a_rows = |i: usize, buf: &mut [f32]| buf.copy_from_slice(&a[i * k..(i + 1) * k]);
    let b_rows = |kk: usize, buf: &mut [f32]| buf.copy_from_slice(&b[kk * n..(kk + 1) * n]);
    for tier in tiers() {
        let mut stored = vec![0f32; m * n];
        matmul(
            tier,
            (m, n, k),
            (&mut stored, (n, 1)),
            false,
            (&a, (k, 1)),
            (&b, (n, 1)),
            false,
        );
        // Garbage in this thread's packs first: every tile must be written or zeroed.
        let junk = vec![f32::NAN; 64 * 64];
        let mut c = vec![0f32; 64 * 64];
        matmul(
            tier,
            (64, 64, 64),
            (&mut c, (64, 1)),
            false,
            (&junk, (64, 1)),
            (&junk, (64, 1)),
            false,
        );
        let mut made = vec![0f32; m * n];
        let ops = (Operand::Rows(&a_rows), Operand::Rows(&b_rows));
        product(
            tier,
            (m, n, k),
            (&mut made, (n, 1)),
            Write::Store,
            ops,
            false,
        );
        assert_eq!(made, stored, "{}", tier.name());
        let packed = Packed::lhs(&a, (k, 1), (m, k));
        let ops = (Operand::Packed(&packed), Operand::Strided(&b, (n, 1)));
        product(
            tier,
            (m, n, k),
            (&mut made, (n, 1)),
            Write::StoreBf16,
            ops,
            true,
        );
        let rounded: Vec<f32> = stored.iter().map(|v| round(*v)).collect();
        assert_eq!(
            made,
            rounded,
            "{} packed once, rounded as stored",
            tier.name()
        );
    }
}

/// The `fma` tier rounds B as the f32 GEMM packs it and the sums (plus a bias) as the GEMM stores them,
/// straight into C's rows: bit for bit what rounding copies of both operands, one f32 GEMM and a pass over
/// its result gave, for each way of writing C (stored, accumulated, rounded; contiguous, with a row pitch,
/// transposed) and B read as a weight is (transposed) or plainly. An operand called `Operand::Bf16` is
/// read as it is: the same bits when it holds bf16s, others when it does not.
#[rstest]
#[case::weight_packed_once(37, 24, 70, true)]
#[case::activation_packed_per_task(9, 45, 33, false)]
fn the_fma_tier_rounds_as_it_packs_and_stores(
    #[case] m: usize,
    #[case] n: usize,
    #[case] k: usize,
    #[case] b_transposed: bool,
) {
    use crate::gemm::{self, Dims, Strides};
    if !Tier::Fma.supported() {
        return;
    }
    let (a, b, bias) = (matrix(m * k, 5), matrix(k * n, 6), matrix(n, 7));
    // B as the (n × k) weight of a linear layer read transposed, or a (k × n) matrix.
    let (b_data, b_strides): (Vec<f32>, (usize, usize)) = if b_transposed {
        ((0..k * n).map(|t| b[(t % k) * n + t / k]).collect(), (1, k))
    } else {
        (b.clone(), (n, 1))
    };
    let sums = gemm::matmul(
        crate::Isa::Avx512,
        Dims { batch: 1, m, k, n },
        (&rounded(&a), Strides::contiguous(m, k)),
        (&rounded(&b), Strides::contiguous(k, n)),
    );
    let same = |x: &[f32], y: &[f32]| x.iter().zip(y).all(|(x, y)| x.to_bits() == y.to_bits());
    let a_rounded = rounded(&a);
    for (lhs, in_place) in [
        (Operand::Strided(&a, (k, 1)), false),
        (Operand::Bf16(&a_rounded, (k, 1)), true),
    ] {
        let rhs = Operand::Strided(&b_data, b_strides);
        for (write, (pitch, transposed)) in [Write::Store, Write::Accumulate, Write::StoreBf16]
            .into_iter()
            .flat_map(|w| [(n, false), (n + 3, false), (m, true)].map(|d| (w, d)))
        {
            let (rs, cs) = if transposed { (1, m) } else { (pitch, 1) };
            let len = if transposed { m * n } else { m * pitch };
            let mut c = vec![0.5f32; len];
            product(
                Tier::Fma,
                (m, n, k),
                (&mut c, (rs, cs)),
                write,
                (lhs, rhs),
                true,
            );
            for i in 0..m {
                for j in 0..n {
                    let (got, v) = (c[i * rs + j * cs], sums[i * n + j]);
                    let want = match write {
                        Write::Store => v,
                        // Added after the product, as the other tiers add.
                        Write::Accumulate => 0.5 + v,
                        Write::StoreBf16 => round(v),
                    };
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{write:?}, pitch {pitch}, transposed C {transposed}, in place {in_place}: ({i}, {j})"
                    );
                }
            }
            if !transposed {
                // The pitch's padding is left alone.
                assert!((0..m).all(|i| c[i * pitch + n..(i + 1) * pitch].iter().all(|v| *v == 0.5)));
            }
        }
        // An addmm: the rounded bias added to the sums, then one rounding.
        let addmm = rounded_product(Tier::Fma, (m, n, k), (lhs, rhs), Some(&bias), true);
        let want: Vec<f32> = (0..m * n)
            .map(|t| round(sums[t] + round(bias[t % n])))
            .collect();
        assert!(same(&addmm, &want), "addmm, in place {in_place}");
        for tier in tiers() {
            let theirs = rounded_product(tier, (m, n, k), (lhs, rhs), Some(&bias), true);
            let close = theirs
                .iter()
                .zip(&want)
                .all(|(x, y)| (x - y).abs() <= y.abs() / 64.0 + 1e-3);
            assert!(close, "{}'s addmm", tier.name());
        }
    }
    // B called bf16s is not rounded again as it is packed: the same bits when it holds them.
    let b_rounded = rounded(&b_data);
    let product_of =
        |lhs: Operand, rhs: Operand| rounded_product(Tier::Fma, (m, n, k), (lhs, rhs), None, true);
    let honest: Vec<f32> = sums.iter().map(|v| round(*v)).collect();
    let both = product_of(
        Operand::Bf16(&a_rounded, (k, 1)),
        Operand::Bf16(&b_rounded, b_strides),
    );
    assert!(same(&both, &honest));
    // Unrounded values called bf16s are read as they are: the product moves, whichever side.
    let rhs = Operand::Strided(&b_data, b_strides);
    assert!(!same(&product_of(Operand::Bf16(&a, (k, 1)), rhs), &honest));
    let lhs = Operand::Strided(&a, (k, 1));
    assert!(!same(
        &product_of(lhs, Operand::Bf16(&b_data, b_strides)),
        &honest
    ));
}
