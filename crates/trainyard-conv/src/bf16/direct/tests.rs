use super::*;
use crate::bf16::pack::to_bf16;
use rstest::rstest;

/// Every product of the convolution, as NCHW indices (output, input, weight): each output pixel with each
/// input channel and kernel tap that lands inside the input.
fn each_product(g: &Geometry, mut visit: impl FnMut(usize, usize, usize)) {
    let (oh, ow) = g.out();
    for (n, o) in (0..g.n).flat_map(|n| (0..g.c_out).map(move |o| (n, o))) {
        for (py, px) in (0..oh).flat_map(|a| (0..ow).map(move |b| (a, b))) {
            let out = ((n * g.c_out + o) * oh + py) * ow + px;
            for i in 0..g.c_in {
                for (kh, kw) in (0..g.k).flat_map(|a| (0..g.k).map(move |b| (a, b))) {
                    let ih = (py * g.stride + kh) as isize - g.padding as isize;
                    let iw = (px * g.stride + kw) as isize - g.padding as isize;
                    if ih < 0 || iw < 0 || ih >= g.h as isize || iw >= g.w as isize {
                        continue;
                    }
                    let input = ((n * g.c_in + i) * g.h + ih as usize) * g.w + iw as usize;
                    visit(out, input, ((o * g.c_in + i) * g.k + kh) * g.k + kw);
                }
            }
        }
    }
}

/// `v` rounded to bf16, in f64.
fn r(v: f32) -> f64 {
    from_bf16(to_bf16(v)) as f64
}

fn to_f32(v: Vec<f64>) -> Vec<f32> {
    v.into_iter().map(|v| v as f32).collect()
}

/// The convolution in f64 over bf16-rounded operands, NCHW in and out.
fn reference(x: &[f32], w: &[f32], g: &Geometry) -> Vec<f32> {
    let (oh, ow) = g.out();
    let mut y = vec![0f64; g.n * g.c_out * oh * ow];
    each_product(g, |out, input, weight| y[out] += r(x[input]) * r(w[weight]));
    to_f32(y)
}

/// `reference`'s input gradient for the output gradient `dy` (NCHW), in f64 over bf16 operands.
fn reference_input_grad(dy: &[f32], w: &[f32], g: &Geometry) -> Vec<f32> {
    let mut dx = vec![0f64; g.n * g.c_in * g.h * g.w];
    each_product(g, |out, input, weight| {
        dx[input] += r(dy[out]) * r(w[weight])
    });
    to_f32(dx)
}

/// The input gradient on every tier here against the f64 reference: strides 1, 2 and 3, kernels the
/// stride does not divide, phases no tap reaches (a strided 1×1), padding wider than the kernel.
#[rstest]
#[case::resnet_3x3(Geometry { n: 2, c_in: 32, c_out: 48, h: 6, w: 7, k: 3, stride: 1, padding: 1, lanes: LANES })]
#[case::pointwise(Geometry { n: 1, c_in: 64, c_out: 16, h: 5, w: 5, k: 1, stride: 1, padding: 0, lanes: LANES })]
#[case::no_padding(Geometry { n: 2, c_in: 16, c_out: 32, h: 6, w: 5, k: 3, stride: 1, padding: 0, lanes: LANES })]
#[case::downsampling(Geometry { n: 2, c_in: 32, c_out: 48, h: 8, w: 8, k: 3, stride: 2, padding: 1, lanes: LANES })]
#[case::downsampling_odd(Geometry { n: 2, c_in: 16, c_out: 32, h: 9, w: 7, k: 3, stride: 2, padding: 1, lanes: LANES })]
#[case::shortcut_1x1(Geometry { n: 2, c_in: 48, c_out: 32, h: 8, w: 6, k: 1, stride: 2, padding: 0, lanes: LANES })]
#[case::stem_7x7(Geometry { n: 1, c_in: 3, c_out: 16, h: 13, w: 12, k: 7, stride: 2, padding: 3, lanes: LANES })]
#[case::stride_3(Geometry { n: 2, c_in: 16, c_out: 16, h: 10, w: 11, k: 3, stride: 3, padding: 1, lanes: LANES })]
#[case::wide_padding(Geometry { n: 1, c_in: 16, c_out: 16, h: 5, w: 4, k: 3, stride: 1, padding: 3, lanes: LANES })]
#[case::weights_past_the_cache(Geometry { n: 2, c_in: 272, c_out: 256, h: 4, w: 5, k: 3, stride: 1, padding: 1, lanes: LANES })]
fn input_gradient_matches_the_reference(
    #[case] g: Geometry,
    #[values(Tier::Amx, Tier::Avx512Bf16, Tier::Portable)] tier: Tier,
) {
    if !tier.supported() {
        return;
    }
    let (oh, ow) = g.out();
    let dy_nchw = values(g.n * g.c_out * oh * ow, 5);
    let w = values(g.c_out * g.c_in * g.k * g.k, 11);
    let dy = crate::layout::block(&dy_nchw, (g.n, g.c_out, oh * ow), LANES);
    let dx = input_grad(tier, &dy, &w, &g);
    let got = crate::layout::unblock(&dx, (g.n, g.c_in, g.h * g.w), LANES);
    let expected = reference_input_grad(&dy_nchw, &w, &g);
    for (i, (a, e)) in got.iter().zip(&expected).enumerate() {
        assert!(
            (a - e).abs() <= e.abs() / 128.0 + 1e-4,
            "{g:?}: element {i}: {a} vs {e}"
        );
    }
    let ib = g.c_in.div_ceil(LANES);
    for (i, v) in dx.iter().enumerate() {
        let channel = ((i / (g.h * g.w * LANES)) % ib) * LANES + i % LANES;
        if channel >= g.c_in {
            assert_eq!(*v, 0.0, "lane past c_in at {i}");
        }
    }
}

/// `reference`'s weight gradient for the output gradient `dy` (NCHW), in f64 over bf16 operands.
fn reference_weight_grad(x: &[f32], dy: &[f32], g: &Geometry) -> Vec<f32> {
    let mut dw = vec![0f64; g.c_out * g.c_in * g.k * g.k];
    each_product(g, |out, input, weight| {
        dw[weight] += r(dy[out]) * r(x[input])
    });
    to_f32(dw)
}

/// The weight gradient on every tier here against the f64 reference (odd block counts, so the slack past
/// the last block is read; strides 2 and 3, odd and even sizes).
#[rstest]
#[case::resnet_3x3(Geometry { n: 2, c_in: 32, c_out: 32, h: 6, w: 7, k: 3, stride: 1, padding: 1, lanes: LANES })]
#[case::odd_blocks(Geometry { n: 3, c_in: 48, c_out: 16, h: 5, w: 5, k: 3, stride: 1, padding: 1, lanes: LANES })]
#[case::cifar_stem(Geometry { n: 2, c_in: 3, c_out: 48, h: 8, w: 8, k: 3, stride: 1, padding: 1, lanes: LANES })]
#[case::pointwise(Geometry { n: 2, c_in: 16, c_out: 32, h: 9, w: 4, k: 1, stride: 1, padding: 0, lanes: LANES })]
#[case::downsampling(Geometry { n: 2, c_in: 32, c_out: 48, h: 8, w: 8, k: 3, stride: 2, padding: 1, lanes: LANES })]
#[case::downsampling_odd(Geometry { n: 2, c_in: 16, c_out: 16, h: 9, w: 7, k: 3, stride: 2, padding: 1, lanes: LANES })]
#[case::shortcut_1x1(Geometry { n: 3, c_in: 48, c_out: 32, h: 8, w: 6, k: 1, stride: 2, padding: 0, lanes: LANES })]
#[case::stem_7x7(Geometry { n: 1, c_in: 3, c_out: 16, h: 13, w: 12, k: 7, stride: 2, padding: 3, lanes: LANES })]
#[case::stride_3(Geometry { n: 2, c_in: 16, c_out: 16, h: 10, w: 11, k: 3, stride: 3, padding: 1, lanes: LANES })]
#[case::images_in_groups(Geometry { n: 5, c_in: 16, c_out: 16, h: 14, w: 14, k: 3, stride: 1, padding: 1, lanes: LANES })]
fn weight_gradient_matches_the_reference(
    #[case] g: Geometry,
    #[values(Tier::Amx, Tier::Avx512Bf16, Tier::Portable)] tier: Tier,
) {
    if !tier.supported() {
        return;
    }
    let (oh, ow) = g.out();
    let x_nchw = values(g.n * g.c_in * g.h * g.w, 3);
    let dy_nchw = values(g.n * g.c_out * oh * ow, 5);
    let x = crate::layout::block(&x_nchw, (g.n, g.c_in, g.h * g.w), LANES);
    let dy = crate::layout::block(&dy_nchw, (g.n, g.c_out, oh * ow), LANES);
    let dw = weight_grad(tier, &x, &dy, &g);
    let expected = reference_weight_grad(&x_nchw, &dy_nchw, &g);
    let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (i, (a, e)) in dw.iter().zip(&expected).enumerate() {
        assert!(
            (a - e).abs() <= e.abs() / 128.0 + scale * 1e-5,
            "{g:?}: element {i}: {a} vs {e}"
        );
        assert_eq!(*a, from_bf16(to_bf16(*a)), "element {i} is not a bf16");
    }
}

fn values(len: usize, seed: u32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(2_654_435_761).max(1);
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            (state % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

/// Every tier that runs here against the f64 reference of the same bf16 operands: a result within one
/// bf16 rounding (plus the f32 sums' order) of the reference, bf16-representable, zero past `c_out`.
#[rstest]
#[case::resnet_3x3(Geometry { n: 2, c_in: 64, c_out: 64, h: 8, w: 8, k: 3, stride: 1, padding: 1, lanes: LANES })]
#[case::downsampling(Geometry { n: 2, c_in: 32, c_out: 48, h: 9, w: 7, k: 3, stride: 2, padding: 1, lanes: LANES })]
#[case::shortcut_1x1(Geometry { n: 1, c_in: 64, c_out: 32, h: 8, w: 8, k: 1, stride: 2, padding: 0, lanes: LANES })]
#[case::odd_channels(Geometry { n: 1, c_in: 16, c_out: 24, h: 5, w: 6, k: 3, stride: 1, padding: 1, lanes: LANES })]
#[case::no_padding(Geometry { n: 3, c_in: 48, c_out: 16, h: 6, w: 5, k: 3, stride: 1, padding: 0, lanes: LANES })]
#[case::wide_row(Geometry { n: 1, c_in: 32, c_out: 32, h: 3, w: 37, k: 3, stride: 1, padding: 1, lanes: LANES })]
#[case::weights_past_the_cache(Geometry { n: 2, c_in: 256, c_out: 272, h: 4, w: 5, k: 3, stride: 1, padding: 1, lanes: LANES })]
fn every_tier_matches_the_reference(
    #[case] g: Geometry,
    #[values(Tier::Amx, Tier::Avx512Bf16, Tier::Portable)] tier: Tier,
) {
    if !tier.supported() {
        eprintln!("SKIPPED: {} is not supported here", tier.name());
        return;
    }
    let x_nchw = values(g.n * g.c_in * g.h * g.w, 7);
    let w = values(g.c_out * g.c_in * g.k * g.k, 11);
    let x = crate::layout::block(&x_nchw, (g.n, g.c_in, g.h * g.w), LANES);
    let y = forward(tier, &x, &w, &g);
    let (oh, ow) = g.out();
    let got = crate::layout::unblock(&y, (g.n, g.c_out, oh * ow), LANES);
    let expected = reference(&x_nchw, &w, &g);
    for (i, (a, e)) in got.iter().zip(&expected).enumerate() {
        let tolerance = e.abs() / 128.0 + 1e-4;
        assert!(
            (a - e).abs() <= tolerance,
            "{g:?} on {}: element {i}: {a} vs {e}",
            tier.name()
        );
        assert_eq!(*a, from_bf16(to_bf16(*a)), "element {i} is not a bf16");
    }
    let ob = g.c_out.div_ceil(LANES);
    for (i, v) in y.iter().enumerate() {
        let channel = ((i / (oh * ow * LANES)) % ob) * LANES + i % LANES;
        if channel >= g.c_out {
            assert_eq!(*v, 0.0, "lane past c_out at {i}");
        }
    }
}

/// `forward_sums_of` stores the sums `forward_of` rounds: the same sums, bit for bit once rounded, and
/// not rounded themselves (a bias epilogue rounds after adding the bias), on every tier here, the fma
/// tier's f32 kernels included.
#[rstest]
#[case::resnet_3x3(Geometry { n: 2, c_in: 32, c_out: 24, h: 6, w: 7, k: 3, stride: 1, padding: 1, lanes: LANES })]
#[case::downsampling(Geometry { n: 2, c_in: 16, c_out: 32, h: 9, w: 7, k: 3, stride: 2, padding: 1, lanes: LANES })]
fn unrounded_sums_round_to_the_rounded_result(
    #[case] g: Geometry,
    #[values(Tier::Amx, Tier::Avx512Bf16, Tier::Fma, Tier::Portable)] tier: Tier,
) {
    if !tier.supported() {
        eprintln!("SKIPPED: {} is not supported here", tier.name());
        return;
    }
    let x_nchw = values(g.n * g.c_in * g.h * g.w, 3);
    let w = values(g.c_out * g.c_in * g.k * g.k, 5);
    let x = crate::layout::block(&x_nchw, (g.n, g.c_in, g.h * g.w), LANES);
    let rounded = forward_of(tier, Values::F32(&x), &w, &g);
    let sums = forward_sums_of(tier, Values::F32(&x), &w, &g);
    assert_eq!(sums.len(), rounded.len());
    for (i, (s, r)) in sums.iter().zip(&rounded).enumerate() {
        assert_eq!(
            round_f32(*s).to_bits(),
            r.to_bits(),
            "{} element {i}",
            tier.name()
        );
    }
    let unrounded = sums.iter().filter(|s| round_f32(**s) != **s).count();
    assert!(
        unrounded > sums.len() / 2,
        "{}: {unrounded} of {} sums are not bf16s",
        tier.name(),
        sums.len()
    );
}

/// A partial last output block packs zeros past `c_out`, even when its thread packed a full block just
/// before from the same (reused) slab.
#[test]
fn a_partial_block_packs_zeros_past_c_out() {
    // Three blocks: one split of a one-thread pool leaves the last two to one slab.
    let (c_out, c_red) = (40, 32);
    let w = values(c_out * c_red, 13);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let weights = pool.install(|| {
        pack_weights((c_out, c_red, 1), &[0], |ob, slab| {
            for (j, src) in w
                .chunks_exact(c_red)
                .skip(ob * LANES)
                .take(LANES)
                .enumerate()
            {
                for (r, v) in src.iter().enumerate() {
                    slab[r * LANES + j] = *v;
                }
            }
        })
    });
    let last = &weights.tiles[2 * weights.per_block].0;
    for p in 0..TILE_K / 2 {
        for j in 0..TILE_ROWS {
            for e in 0..2 {
                let v = last[p * TILE_K + 2 * j + e];
                let expected = if j < c_out - 2 * LANES {
                    to_bf16(w[(2 * LANES + j) * c_red + 2 * p + e])
                } else {
                    0
                };
                assert_eq!(v, expected, "row {p}, column {j}, element {e}");
            }
        }
    }
}
