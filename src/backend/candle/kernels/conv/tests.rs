use super::*;
use crate::backend::candle::kernels::cpu::max_rel;
use candle_core::Var;

fn seeded(shape: &[usize], seed: u64) -> Tensor {
    crate::backend::candle::kernels::cpu::seeded(shape, seed, -1.0, 1.0)
}

/// Forward and both gradients agree with Candle's reference kernels for every geometry the zoo uses.
#[rstest::rstest]
#[case(2, 3, 8, 8, 4, 3, 1, 1)]
#[case(3, 4, 9, 9, 5, 3, 2, 1)]
#[case(2, 3, 16, 16, 8, 7, 2, 3)]
#[case(2, 6, 5, 5, 4, 1, 1, 0)]
#[case(2, 6, 6, 6, 4, 1, 2, 0)]
#[case(1, 2, 4, 4, 3, 3, 1, 0)]
#[case(5, 2, 3, 3, 2, 3, 1, 1)]
#[case(9, 3, 4, 4, 6, 3, 2, 1)]
#[case(7, 8, 2, 2, 5, 1, 1, 0)]
#[case(4, 16, 8, 8, 32, 3, 2, 1)]
#[case(4, 16, 8, 8, 32, 1, 2, 0)]
#[case(4, 8, 32, 32, 8, 3, 1, 1)]
#[case(4, 3, 32, 32, 8, 3, 1, 1)]
#[case(4, 256, 8, 8, 512, 3, 2, 1)]
#[case(4, 256, 8, 8, 512, 1, 2, 0)]
#[case(4, 128, 16, 16, 256, 3, 2, 1)]
#[case(4, 256, 8, 8, 256, 3, 1, 1)]
#[case(4, 128, 16, 16, 256, 1, 2, 0)]
#[case(8, 512, 4, 4, 2048, 1, 1, 0)]
#[case(8, 2048, 4, 4, 512, 1, 1, 0)]
#[case(8, 64, 32, 32, 256, 1, 1, 0)]
#[case(8, 256, 32, 32, 64, 1, 1, 0)]
#[case(2, 3, 5, 7, 4, 3, 1, 1)]
#[case(2, 3, 6, 9, 4, 5, 1, 2)]
#[case(2, 2, 1, 1, 3, 3, 1, 1)]
fn matches_candle(
    #[case] n: usize,
    #[case] c: usize,
    #[case] h: usize,
    #[case] w: usize,
    #[case] o: usize,
    #[case] k: usize,
    #[case] stride: usize,
    #[case] pad: usize,
) {
    let x = Var::from_tensor(&seeded(&[n, c, h, w], 1)).unwrap();
    let wt = Var::from_tensor(&seeded(&[o, c, k, k], 2)).unwrap();
    let probe = seeded(
        &[
            n,
            o,
            (h + 2 * pad - k) / stride + 1,
            (w + 2 * pad - k) / stride + 1,
        ],
        3,
    );
    let ours = conv2d(&x, &wt, stride, pad).unwrap();
    let reference = x.conv2d(&wt, pad, stride, 1, 1).unwrap();
    assert!(max_rel(&ours, &reference) < 1e-5);
    let g_ours = (ours * &probe)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let g_ref = (reference * &probe)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    for v in [&x, &wt] {
        let (a, b) = (g_ours.get(v).unwrap(), g_ref.get(v).unwrap());
        assert!(max_rel(a, b) < 1e-5, "gradient differs: {}", max_rel(a, b));
    }
}

#[test]
fn skips_the_input_gradient_of_plain_tensors() {
    let x = seeded(&[2, 3, 6, 6], 1);
    let wt = Var::from_tensor(&seeded(&[4, 3, 3, 3], 2)).unwrap();
    let grads = conv2d(&x, &wt, 1, 1)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert!(grads.get(&x).is_none());
    assert!(grads.get(&wt).is_some());
}

/// Under bf16 autocast, the op on each tier (its roundings where products pack and write) equals the
/// emulated composition `round(conv(round(x), round(w)))`, forward and backward, to within one bf16
/// rounding (f32 sums in another order can land on the other side of one).
#[rstest::rstest]
#[case::same_3x3_flipped_input_gradient(4, 8, 8, 8, 16, 3, 1, 1)]
#[case::strided_3x3_col2im(4, 16, 8, 8, 32, 3, 2, 1)]
#[case::pointwise(2, 16, 8, 8, 8, 1, 1, 0)]
#[case::strided_1x1(4, 16, 8, 8, 32, 1, 2, 0)]
#[case::stem(3, 3, 16, 16, 8, 3, 1, 1)]
#[case::one_image_parallel_products(1, 8, 6, 6, 4, 3, 1, 1)]
#[case::many_images_per_task(16, 32, 4, 4, 40, 3, 1, 1)]
fn bf16_tiers_match_emulated_autocast(
    #[case] n: usize,
    #[case] c: usize,
    #[case] h: usize,
    #[case] w: usize,
    #[case] o: usize,
    #[case] k: usize,
    #[case] stride: usize,
    #[case] pad: usize,
    #[values("amx", "avx512-bf16", "fma", "portable")] tier: &str,
) {
    use crate::backend::candle::autocast::Autocast;
    let Some(tier) = Tier::parse(tier).filter(|t| t.supported()) else {
        return;
    };
    let x = Var::from_tensor(&seeded(&[n, c, h, w], 1)).unwrap();
    let wt = Var::from_tensor(&seeded(&[o, c, k, k], 2)).unwrap();
    let (oh, ow) = (
        (h + 2 * pad - k) / stride + 1,
        (w + 2 * pad - k) / stride + 1,
    );
    let probe = seeded(&[n, o, oh, ow], 3);
    let ours = conv2d_on(&x, &wt, stride, pad, Some(tier)).unwrap();
    let emulated = Autocast {
        bf16: true,
        tier: None,
    }
    .conv2d(&x, &wt, stride, pad)
    .unwrap();
    let tol = 1.0 / 128.0;
    assert!(
        max_rel(&ours, &emulated) < tol,
        "forward: {}",
        max_rel(&ours, &emulated)
    );
    let rounded = |t: &Tensor| {
        t.to_dtype(DType::BF16)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
    };
    let flat = ours.flatten_all().unwrap();
    assert_eq!(
        rounded(&flat).to_vec1::<f32>().unwrap(),
        flat.to_vec1::<f32>().unwrap(),
        "output rounded"
    );
    let grads = |y: Tensor| (y * &probe).unwrap().sum_all().unwrap().backward().unwrap();
    let (g_ours, g_emulated) = (grads(ours), grads(emulated));
    for (name, v) in [("input", &x), ("weight", &wt)] {
        let (a, b) = (g_ours.get(v).unwrap(), g_emulated.get(v).unwrap());
        assert!(
            max_rel(a, b) < tol,
            "{name} gradient on {}: {}",
            tier.name(),
            max_rel(a, b)
        );
        let a_flat = a.flatten_all().unwrap();
        assert_eq!(
            rounded(&a_flat).to_vec1::<f32>().unwrap(),
            a_flat.to_vec1::<f32>().unwrap(),
            "{name} gradient rounded"
        );
    }
}
