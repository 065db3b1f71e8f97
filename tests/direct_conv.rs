//! The blocked direct convolution (`trainyard_conv`) against a float64 loop and path against path: every
//! instruction set this CPU runs gives the portable path's results bit for bit (same lane count, same
//! order of sums), and all of them are within float32 rounding of the float64 reference, on odd shapes
//! (non-square, stride 2, padding 0/1/3, channels not a multiple of the block). Then the Candle ops: the
//! convolution's autograd against the im2col path, and blocked BatchNorm against the planar one.

mod common;

use candle_core::{Tensor, Var};
use common::kernels::{assert_same_gradients, max_diff, tensor, values};
use rstest::rstest;
use trainyard::backend::candle::kernels::batchnorm::{self, Then};
use trainyard::backend::candle::kernels::direct;
use trainyard_conv::conv::{forward, input_grad, weight_grad, Geometry};
use trainyard_conv::layout::{block, unblock};
use trainyard_conv::Isa;

/// Forward output, input gradient and weight gradient in float64, straight from the definition.
fn reference(g: &Geometry, x: &[f32], w: &[f32], dy: &[f32]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (oh, ow, k) = (g.oh(), g.ow(), g.k);
    let mut y = vec![0f64; g.n * g.c_out * oh * ow];
    let mut dx = vec![0f64; x.len()];
    let mut dw = vec![0f64; w.len()];
    for n in 0..g.n {
        for o in 0..g.c_out {
            for yy in 0..oh {
                for xx in 0..ow {
                    let yi = ((n * g.c_out + o) * oh + yy) * ow + xx;
                    for i in 0..g.c_in {
                        for kh in 0..k {
                            for kw in 0..k {
                                let ih = (yy * g.stride + kh) as isize - g.padding as isize;
                                let iw = (xx * g.stride + kw) as isize - g.padding as isize;
                                if ih < 0 || iw < 0 || ih as usize >= g.h || iw as usize >= g.w {
                                    continue;
                                }
                                let xi = ((n * g.c_in + i) * g.h + ih as usize) * g.w + iw as usize;
                                let wi = ((o * g.c_in + i) * k + kh) * k + kw;
                                y[yi] += f64::from(x[xi]) * f64::from(w[wi]);
                                dx[xi] += f64::from(dy[yi]) * f64::from(w[wi]);
                                dw[wi] += f64::from(dy[yi]) * f64::from(x[xi]);
                            }
                        }
                    }
                }
            }
        }
    }
    (y, dx, dw)
}

/// The three passes on `isa`, in NCHW.
fn run(isa: Isa, g: &Geometry, x: &[f32], w: &[f32], dy: &[f32]) -> [Vec<f32>; 3] {
    let l = isa.lanes();
    let g = Geometry { lanes: l, ..*g };
    let (hw, ohw) = (g.h * g.w, g.oh() * g.ow());
    let xb = block(x, (g.n, g.c_in, hw), l);
    let dyb = block(dy, (g.n, g.c_out, ohw), l);
    let y = unblock(&forward(isa, &xb, w, &g), (g.n, g.c_out, ohw), l);
    let dx = unblock(&input_grad(isa, &dyb, w, &g), (g.n, g.c_in, hw), l);
    let dw = weight_grad(isa, &xb, &dyb, &g);
    [y, dx, dw]
}

fn assert_close(what: &str, got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        let err = (f64::from(*a) - b).abs() / scale;
        assert!(
            err < 2e-6,
            "{what}[{i}]: {a} vs {b} (relative to the largest: {err:e})"
        );
    }
}

#[rstest]
#[case::same_3x3((2, 3, 5, 7, 9), (3, 1, 1))]
#[case::strided_3x3_odd_channels((1, 17, 19, 6, 5), (3, 2, 1))]
#[case::pointwise_strided((2, 16, 32, 8, 8), (1, 2, 0))]
#[case::stem_7x7_pad3((1, 20, 9, 11, 6), (7, 2, 3))]
#[case::valid_3x3((3, 33, 18, 5, 7), (3, 1, 0))]
#[case::many_out_blocks((2, 8, 70, 4, 4), (3, 1, 1))]
#[case::pointwise((1, 5, 7, 9, 9), (1, 1, 0))]
#[case::strided_valid_uncovered_edge((2, 24, 24, 10, 3), (3, 2, 0))]
#[case::one_pixel((1, 16, 16, 1, 1), (3, 1, 1))]
// Enough images that the weight gradient sums several runs of images, the last run shorter.
#[case::strided_runs_of_images((19, 12, 20, 6, 7), (3, 2, 1))]
// Border outputs that read only padding (zeros), input pixels no tap reaches (stride past the kernel),
// and a wide kernel whose input pixels read 1 to 4 taps per axis.
#[case::pointwise_padded((2, 9, 10, 5, 6), (1, 1, 1))]
#[case::stride_past_the_kernel((1, 8, 12, 9, 7), (2, 3, 1))]
#[case::stride_3_5x5((2, 10, 17, 11, 9), (5, 3, 2))]
// Deep 4x4 layers: more images than a weight task's pixel run, groups of 1, 2 and 4 pixels an image.
#[case::small_image_many_images((40, 20, 24, 4, 4), (3, 1, 1))]
// Enough block pairs that the weight gradient cuts them into chunks with shorter last ones (both ways).
#[case::pointwise_many_blocks((3, 200, 210, 5, 4), (1, 1, 0))]
#[case::chunks_of_3x3_pairs((2, 40, 50, 5, 6), (3, 1, 1))]
// An empty batch: empty outputs and a zero weight gradient, not a panic.
#[case::no_images((0, 5, 6, 4, 4), (3, 1, 1))]
fn every_path_matches_float64_and_simd_matches_portable_bit_for_bit(
    #[case] (n, c_in, c_out, h, w): (usize, usize, usize, usize, usize),
    #[case] (k, stride, padding): (usize, usize, usize),
) {
    let g = Geometry {
        n,
        c_in,
        c_out,
        h,
        w,
        k,
        stride,
        padding,
        lanes: 0,
    };
    let x = values(n * c_in * h * w, 1);
    let wt = values(c_out * c_in * k * k, 2);
    let dy = values(n * c_out * g.oh() * g.ow(), 3);
    let (y, dx, dw) = reference(&g, &x, &wt, &dy);
    let mut ran = Vec::new();
    for isa in [Isa::Avx512, Isa::Avx2, Isa::Portable16, Isa::Portable8] {
        if !isa.supported() {
            continue;
        }
        let got = run(isa, &g, &x, &wt, &dy);
        for (what, (got, want)) in ["forward", "input grad", "weight grad"]
            .iter()
            .zip(got.iter().zip([&y, &dx, &dw]))
        {
            assert_close(&format!("{isa:?} {what}"), got, want);
        }
        let twin = isa.portable_twin();
        if twin != isa {
            let portable = run(twin, &g, &x, &wt, &dy);
            assert!(got == portable, "{isa:?} differs from {twin:?}");
        }
        ran.push(isa);
    }
    assert!(
        ran.len() >= 2,
        "at least the two portable paths run: {ran:?}"
    );
}

#[test]
fn the_widest_path_of_this_cpu_is_detected() {
    let isa = Isa::detected();
    assert!(isa.supported());
    if std::arch::is_x86_feature_detected!("avx512f") {
        assert_eq!(isa, Isa::Avx512);
    }
}

/// The Candle op's gradients (through `to_blocked`/`from_blocked`) equal the im2col op's within rounding.
#[rstest]
#[case(3, 1, 1)]
#[case(3, 2, 1)]
#[case(1, 2, 0)]
fn candle_op_gradients_match_the_im2col_path(
    #[case] k: usize,
    #[case] stride: usize,
    #[case] padding: usize,
) {
    let isa = Isa::detected();
    let x = Var::from_tensor(&tensor(&[2, 12, 9, 7], 4)).unwrap();
    let w = Var::from_tensor(&tensor(&[20, 12, k, k], 5)).unwrap();
    let blocked = direct::layout::to_blocked(&x, isa.lanes()).unwrap();
    let ours = direct::conv::conv2d(isa, &blocked, &w, stride, padding).unwrap();
    let ours = direct::layout::from_blocked(&ours, 20).unwrap();
    let theirs =
        trainyard::backend::candle::kernels::conv::conv2d(&x, &w, stride, padding).unwrap();
    assert!(max_diff(&ours, &theirs) < 1e-5);
    let probe = tensor(ours.dims(), 6);
    assert_same_gradients((&ours, &theirs), &probe, &[&x, &w], 1e-4);
}

/// Blocked BatchNorm (+ReLU): the planar op's output, statistics and gradients, with channels that do not
/// fill the last block; eval mode too.
#[rstest]
#[case(Then::Nothing)]
#[case(Then::Relu)]
fn blocked_batch_norm_matches_the_planar_one(#[case] then: Then) {
    let lanes = Isa::detected().lanes();
    let x = Var::from_tensor(&tensor(&[3, 11, 5, 4], 7)).unwrap();
    let gamma = Var::from_tensor(&tensor(&[11], 8)).unwrap();
    let beta = Var::from_tensor(&tensor(&[11], 9)).unwrap();
    let (planar, st) = batchnorm::train(&x, &gamma, &beta, 1e-5, then, None)
        .unwrap()
        .unwrap();
    let xb = direct::layout::to_blocked(&x, lanes).unwrap();
    let (blocked, bst) =
        direct::batchnorm::train(&xb, &gamma, &beta, 1e-5, (then, false), None).unwrap();
    let padding_lanes = blocked
        .narrow(1, 0, 1)
        .unwrap()
        .narrow(4, 11 % lanes, lanes - 11 % lanes);
    if lanes > 11 {
        assert_eq!(
            padding_lanes
                .unwrap()
                .abs()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap(),
            0.0
        );
    }
    let ours = direct::layout::from_blocked(&blocked, 11).unwrap();
    assert!(max_diff(&ours, &planar) < 1e-6);
    assert_eq!(st.count, bst.count);
    for (a, b) in st
        .mean
        .iter()
        .zip(&bst.mean)
        .chain(st.var.iter().zip(&bst.var))
    {
        assert!((a - b).abs() < 1e-6);
    }
    let probe = tensor(&[3, 11, 5, 4], 10);
    assert_same_gradients((&ours, &planar), &probe, &[&x, &gamma, &beta], 1e-5);
    let (mean, var) = (tensor(&[11], 11), tensor(&[11], 12).abs().unwrap());
    let planar = batchnorm::eval(&x, &gamma, &beta, (&mean, &var), 1e-5, then)
        .unwrap()
        .unwrap();
    let blocked =
        direct::batchnorm::eval(&xb, &gamma, &beta, (&mean, &var), 1e-5, (then, false)).unwrap();
    let ours = direct::layout::from_blocked(&blocked, 11).unwrap();
    assert!(max_diff(&ours, &planar) < 1e-6);
}

/// Under bf16 autocast (`round`) the blocked BatchNorm stores its output and its input gradient rounded to
/// bf16, as PyTorch's BatchNorm of a bf16 tensor returns them: bit for bit the f32 op's values rounded,
/// train and eval mode; its weights' gradients stay the f32 op's (f32, as PyTorch's for f32 weights).
#[rstest]
#[case(Then::Nothing)]
#[case(Then::Relu)]
fn blocked_batch_norm_under_bf16_rounds_its_output_and_input_gradient(#[case] then: Then) {
    use trainyard_conv::bf16::pack::round_f32;
    let lanes = Isa::detected().lanes();
    let x = tensor(&[3, 11, 5, 4], 7);
    let xb = Var::from_tensor(&direct::layout::to_blocked(&x, lanes).unwrap()).unwrap();
    let gamma = Var::from_tensor(&tensor(&[11], 8)).unwrap();
    let beta = Var::from_tensor(&tensor(&[11], 9)).unwrap();
    let probe = tensor(xb.dims(), 10);
    let bits = |t: &Tensor| -> Vec<u32> {
        let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        v.iter().map(|v| v.to_bits()).collect()
    };
    let rounded_bits = |t: &Tensor| -> Vec<u32> {
        let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        v.iter().map(|v| round_f32(*v).to_bits()).collect()
    };
    let run = |round: bool| {
        let (y, _) =
            direct::batchnorm::train(&xb, &gamma, &beta, 1e-5, (then, round), None).unwrap();
        let grads = (&y * &probe)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let grad = |v: &Var| grads.get(v.as_tensor()).unwrap().clone();
        (y, grad(&xb), grad(&gamma), grad(&beta))
    };
    let (f32s, bf16s) = (run(false), run(true));
    assert_eq!(bits(&bf16s.0), rounded_bits(&f32s.0), "output");
    assert_eq!(bits(&bf16s.1), rounded_bits(&f32s.1), "input gradient");
    assert_ne!(bits(&f32s.1), rounded_bits(&f32s.1), "an f32 gradient");
    assert_eq!(bits(&bf16s.2), bits(&f32s.2), "gamma's gradient");
    assert_eq!(bits(&bf16s.3), bits(&f32s.3), "beta's gradient");
    let (mean, var) = (tensor(&[11], 11), tensor(&[11], 12).abs().unwrap());
    let eval = |round: bool| {
        let stats = (&mean, &var);
        direct::batchnorm::eval(&xb, &gamma, &beta, stats, 1e-5, (then, round)).unwrap()
    };
    assert_eq!(bits(&eval(true)), rounded_bits(&eval(false)), "eval output");
}

/// `bias_relu_pool2` (one op) gives the same bits as `bias_relu` then `max_pool2`: the pooled values, the
/// convolution's gradient and the bias's, on even and odd planes (the last row and column in no window),
/// with ties inside windows (values rounded to a coarse grid, many of them 0 after the ReLU).
#[rstest]
#[case::even_16_lanes(&[3, 11, 8, 6], 16)]
#[case::odd_16_lanes(&[2, 21, 7, 5], 16)]
#[case::odd_8_lanes(&[2, 21, 7, 5], 8)]
fn fused_bias_relu_pool_gives_the_bits_of_the_two_ops(
    #[case] dims: &[usize],
    #[case] lanes: usize,
) {
    let coarse = (tensor(dims, 16) * 4.0).unwrap().round().unwrap();
    let x = Var::from_tensor(&direct::layout::to_blocked(&coarse, lanes).unwrap()).unwrap();
    let bias = Var::from_tensor(&(tensor(&[dims[1]], 17) * 2.0).unwrap().round().unwrap()).unwrap();
    let fused = direct::bias_relu_pool::bias_relu_pool2(&x, &bias).unwrap();
    let apart = direct::elementwise::max_pool2(&direct::elementwise::bias_relu(&x, &bias).unwrap())
        .unwrap();
    assert_eq!(fused.dims(), apart.dims());
    let bits = |t: &Tensor| -> Vec<u32> {
        t.flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    };
    assert_eq!(bits(&fused), bits(&apart));
    let probe = tensor(fused.dims(), 18);
    let grads = |y: &Tensor| (y * &probe).unwrap().sum_all().unwrap().backward().unwrap();
    let (g1, g2) = (grads(&fused), grads(&apart));
    for v in [&x, &bias] {
        assert_eq!(bits(g1.get(v).unwrap()), bits(g2.get(v).unwrap()));
    }
    let dx = g1
        .get(&x)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert!(
        dx.iter().any(|v| *v != 0.0),
        "some gradient reaches the convolution"
    );
}

/// Under bf16 autocast the CNN's blocked epilogue (`bias_relu_pool2_bf16`, and `bias_relu_bf16` for
/// planes with no 2x2 window) over a convolution's unrounded sums gives the bits of autocast's
/// composition, `max_pool2(relu(bf16(x + bf16(b))))`, planar and emulated: the bias inside the one
/// rounding. Its input gradient (a bf16 probe, which the emulated rounding's backward leaves as it is)
/// equals the composition's too, and the bias's is a bf16 as the composition's is.
#[rstest]
#[case::pooled(&[2, 21, 7, 5], true)]
#[case::no_window(&[2, 21, 1, 3], false)]
fn bf16_bias_relu_pool_rounds_once_after_the_bias(#[case] dims: &[usize], #[case] pool: bool) {
    use trainyard::backend::candle::autocast::Autocast;
    use trainyard::backend::candle::kernels::fused;
    use trainyard_conv::bf16::pack::round_f32;
    let lanes = Isa::detected().lanes();
    let x = Var::from_tensor(&tensor(dims, 21)).unwrap();
    let bias = Var::from_tensor(&tensor(&[dims[1]], 22)).unwrap();
    let xb = direct::layout::to_blocked(&x, lanes).unwrap();
    let ours = if pool {
        direct::bias_relu_pool::bias_relu_pool2_bf16(&xb, &bias).unwrap()
    } else {
        direct::elementwise::bias_relu_bf16(&xb, &bias).unwrap()
    };
    let ours = direct::layout::from_blocked(&ours, dims[1]).unwrap();
    let round = |t: &Tensor| Autocast::EMULATED.round(t).unwrap();
    let summed = round(&fused::add_channel_bias(&x, &round(&bias)).unwrap());
    let theirs = fused::relu(&summed).unwrap();
    let theirs = if pool {
        fused::max_pool2d(&theirs, 2, 2, 0).unwrap()
    } else {
        theirs
    };
    let bits = |t: &Tensor| -> Vec<u32> {
        let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        v.iter().map(|v| v.to_bits()).collect()
    };
    assert_eq!(ours.dims(), theirs.dims());
    assert_eq!(bits(&ours), bits(&theirs));
    // Without the rounding of the sum, other bits.
    let unrounded = fused::add_channel_bias(&x, &round(&bias)).unwrap();
    let unrounded = fused::relu(&unrounded).unwrap();
    let unrounded = if pool {
        fused::max_pool2d(&unrounded, 2, 2, 0).unwrap()
    } else {
        unrounded
    };
    assert_ne!(bits(&ours), bits(&unrounded));
    let probe = round(&tensor(theirs.dims(), 23));
    assert_same_gradients((&ours, &theirs), &probe, &[&x], 1e-6);
    // The bias's gradient is a bf16, as the cast's backward returns it: the rounding of the same sum
    // (in another order, so within one rounding of the composition's).
    let grads = |t: &Tensor| (t * &probe).unwrap().sum_all().unwrap().backward().unwrap();
    let db = |t: &Tensor| grads(t).get(&bias).unwrap().to_vec1::<f32>().unwrap();
    for (c, (a, b)) in db(&ours).iter().zip(db(&theirs)).enumerate() {
        assert_eq!(round_f32(*a), *a, "channel {c}: {a} is no bf16");
        assert!(
            (a - b).abs() <= b.abs() / 256.0 + 1e-6,
            "channel {c}: {a} vs {b}"
        );
    }
}

/// The small CNN's blocked ops equal the planar ones: bias + ReLU (with the bias gradient) and 2x2
/// max-pooling on an odd-sized plane (the last row and column dropped, as PyTorch's floor mode does).
#[test]
fn blocked_bias_relu_and_max_pool_match_the_planar_ops() {
    use trainyard::backend::candle::kernels::fused;
    let lanes = Isa::detected().lanes();
    let x = Var::from_tensor(&tensor(&[2, 11, 7, 5], 13)).unwrap();
    let bias = Var::from_tensor(&tensor(&[11], 14)).unwrap();
    let xb = direct::layout::to_blocked(&x, lanes).unwrap();
    let ours = direct::elementwise::max_pool2(&direct::elementwise::bias_relu(&xb, &bias).unwrap())
        .unwrap();
    let ours = direct::layout::from_blocked(&ours, 11).unwrap();
    let planar = fused::add_channel_bias(&x, &bias).unwrap();
    let theirs = fused::max_pool2d(&fused::relu(&planar).unwrap(), 2, 2, 0).unwrap();
    assert_eq!(ours.dims(), &[2, 11, 3, 2]);
    assert_eq!(max_diff(&ours, &theirs), 0.0);
    let probe = tensor(&[2, 11, 3, 2], 15);
    assert_same_gradients((&ours, &theirs), &probe, &[&x, &bias], 1e-5);
}
