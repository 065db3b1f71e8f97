use super::*;

/// `cargo test --release --lib conv::timing -- --ignored --nocapture`: GFLOP/s of each kernel on
/// ResNet-18-CIFAR's conv shapes at batch 64.
#[test]
#[ignore]
fn resnet18_cifar_shapes() {
    for (c, hw, o, stride) in [
        (3, 32, 64, 1),
        (64, 32, 64, 1),
        (64, 32, 128, 2),
        (128, 16, 128, 1),
        (256, 8, 256, 1),
        (512, 4, 512, 1),
    ] {
        let x = Tensor::ones((64, c, hw, hw), DType::F32, &Device::Cpu).unwrap();
        let w = Tensor::ones((o, c, 3, 3), DType::F32, &Device::Cpu).unwrap();
        let y = conv2d(&x, &w, stride, 1).unwrap();
        let (_, _, oh, ow) = y.dims4().unwrap();
        let flops = 2.0 * 64.0 * (o * oh * ow * c * 9) as f64;
        let time = |f: &dyn Fn()| {
            let t = std::time::Instant::now();
            for _ in 0..3 {
                f();
            }
            t.elapsed().as_secs_f64() / 3.0
        };
        let tf = time(&|| {
            conv2d(&x, &w, stride, 1).unwrap();
        });
        let ti = time(&|| {
            y.apply_op2_no_bwd(
                &w,
                &InputGrad {
                    stride,
                    padding: 1,
                    h: hw,
                    w: hw,
                    bf16: None,
                },
            )
            .unwrap();
        });
        let tw = time(&|| {
            x.apply_op2_no_bwd(
                &y,
                &WeightGrad {
                    stride,
                    padding: 1,
                    k: 3,
                    bf16: None,
                },
            )
            .unwrap();
        });
        println!(
            "c{c} {hw}px -> {o} s{stride}: fwd {:.1} ms ({:.0} GF/s)  dx {:.1} ms ({:.0})  dw {:.1} ms ({:.0})",
            tf * 1e3, flops / tf / 1e9, ti * 1e3, flops / ti / 1e9, tw * 1e3, flops / tw / 1e9
        );
    }
}
