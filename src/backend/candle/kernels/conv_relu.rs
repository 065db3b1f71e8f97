//! `relu(conv2d(x, w) + bias)` as one op, for the plain CNN's blocks. Apart, the three ops cost two extra
//! full passes over the conv's output in the forward pass, and in the backward pass each op boundary
//! costs Candle a zeroed buffer and an add to accumulate the gradient; fused, bias and ReLU run on each
//! task's output while it is in cache, and the backward pass is one masking pass before the conv's own.

use crate::backend::candle::kernels::tape;
use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use trainyard_conv::bf16::{round as round_bf16, Tier};
use trainyard_conv::buffer::{assume_init, uninit};

use super::conv;
use super::cpu::{f32_slice as slice, with_f32};

/// `relu(conv2d(x, w, stride, padding) + bias)`, `bias` per output channel. Off the fused kernel's domain
/// it is the composition of the separate ops (under autocast: `autocast::Autocast::conv2d_bias_relu`).
pub fn conv2d_bias_relu(
    x: &Tensor,
    w: &Tensor,
    bias: &Tensor,
    stride: usize,
    padding: usize,
) -> Result<Tensor> {
    if !handles(x, w, bias)? {
        let y = conv::conv2d(x, w, stride, padding)?;
        return super::fused::relu(&super::fused::add_channel_bias(&y, bias)?);
    }
    conv2d_bias_relu_on(x, w, bias, (stride, padding), None)
}

/// Whether `conv2d_bias_relu_on` takes these operands (CPU, f32, a square kernel).
pub fn handles(x: &Tensor, w: &Tensor, bias: &Tensor) -> Result<bool> {
    Ok(conv::handles(x, w)? && super::cpu::is_cpu_f32(bias))
}

/// The fused op, under bf16 autocast (`bf16`: the tier) as PyTorch's `relu(F.conv2d(x, w, b))` computes
/// it there: `relu(bf16(conv(bf16 x, bf16 w) + bf16(b)))`, the bias added to the f32 sums before their
/// one rounding. The operands must be ones `handles` takes.
pub fn conv2d_bias_relu_on(
    x: &Tensor,
    w: &Tensor,
    bias: &Tensor,
    (stride, padding): (usize, usize),
    bf16: Option<Tier>,
) -> Result<Tensor> {
    tape::op3(
        &x.contiguous()?,
        &w.contiguous()?,
        &bias.contiguous()?,
        ConvBiasRelu {
            stride,
            padding,
            bf16,
        },
    )
}

struct ConvBiasRelu {
    stride: usize,
    padding: usize,
    bf16: Option<Tier>,
}

impl CustomOp3 for ConvBiasRelu {
    fn name(&self) -> &'static str {
        "trainyard-conv2d-bias-relu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let g = conv::geometry(l1, l2, (self.stride, self.padding), self.bf16)?;
        let b = slice(s3, l3)?;
        let (c, hw) = (g.c_out(), g.out_hw());
        if b.len() != c {
            candle_core::bail!("bias has {} values for {c} channels", b.len());
        }
        let (x, w) = (slice(s1, l1)?, slice(s2, l2)?);
        let y = match self.bf16 {
            None => conv::forward(&g, x, w, &|_, out| {
                for (plane, o) in out.chunks_mut(hw).enumerate() {
                    let v = b[plane % c];
                    for o in o {
                        *o = (*o + v).max(0.0);
                    }
                }
            }),
            // The sums stored unrounded, then the bias (a bf16 under autocast) and the one rounding.
            Some(_) => conv::forward_rounding(&g, x, w, false, &|_, out| {
                for (plane, o) in out.chunks_mut(hw).enumerate() {
                    let v = round_bf16(b[plane % c]);
                    for o in o {
                        *o = round_bf16(*o + v).max(0.0);
                    }
                }
            }),
        };
        Ok((CpuStorage::F32(y), g.out_shape()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (n, c, h, wd) = res.dims4()?;
        let (pre, mut db) = relu_grad_and_channel_sums(res, grad, n, c, h * wd)?;
        if self.bf16.is_some() {
            // Autocast's cast of the bias passes back the bf16 convolution's bias gradient.
            trainyard_conv::bf16::pack::round_in_place(&mut db);
        }
        let pre = Tensor::from_vec(pre, res.shape(), res.device())?;
        let (gx, gw) = conv::backward(x, w, &pre, (self.stride, self.padding), self.bf16)?;
        Ok((gx, gw, Some(Tensor::from_vec(db, c, res.device())?)))
    }
}

/// The gradient before the ReLU (`grad` where the output is positive) and its sum per channel (the bias
/// gradient): per-image partials in f64, added in image order, so the result does not depend on threads.
fn relu_grad_and_channel_sums(
    res: &Tensor,
    grad: &Tensor,
    n: usize,
    c: usize,
    hw: usize,
) -> Result<(Vec<f32>, Vec<f32>)> {
    with_f32(res, |y| {
        with_f32(grad, |g| {
            let mut pre = uninit(n * c * hw);
            let partials: Vec<Vec<f64>> = pre
                .par_chunks_mut(c * hw)
                .zip(y.par_chunks(c * hw).zip(g.par_chunks(c * hw)))
                .map(|(pre, (y, g))| {
                    let mut sums = vec![0f64; c];
                    for (ch, sum) in sums.iter_mut().enumerate() {
                        let span = ch * hw..(ch + 1) * hw;
                        let mut total = 0f64;
                        for ((p, y), g) in pre[span.clone()]
                            .iter_mut()
                            .zip(&y[span.clone()])
                            .zip(&g[span])
                        {
                            let v = if *y > 0.0 { *g } else { 0.0 };
                            p.write(v);
                            total += v as f64;
                        }
                        *sum = total;
                    }
                    sums
                })
                .collect();
            let mut db = vec![0f64; c];
            for p in &partials {
                for (d, v) in db.iter_mut().zip(p) {
                    *d += v;
                }
            }
            // SAFETY: every image's every channel span was written above.
            let pre = unsafe { assume_init(pre) };
            Ok((pre, db.into_iter().map(|v| v as f32).collect()))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Var;

    fn seeded(shape: &[usize], seed: u64) -> Tensor {
        super::super::cpu::seeded(shape, seed, -1.0, 1.0)
    }

    use crate::backend::candle::kernels::cpu::max_rel;

    /// Forward and all three gradients agree with Candle's conv, broadcast add and ReLU.
    #[rstest::rstest]
    #[case(2, 3, 8, 8, 4, 1, 1)]
    #[case(3, 4, 9, 9, 5, 2, 1)]
    #[case(9, 8, 8, 8, 16, 1, 1)]
    #[case(4, 16, 16, 16, 32, 1, 1)]
    fn matches_candle(
        #[case] n: usize,
        #[case] c: usize,
        #[case] h: usize,
        #[case] w: usize,
        #[case] o: usize,
        #[case] stride: usize,
        #[case] pad: usize,
    ) {
        let x = Var::from_tensor(&seeded(&[n, c, h, w], 1)).unwrap();
        let wt = Var::from_tensor(&seeded(&[o, c, 3, 3], 2)).unwrap();
        let b = Var::from_tensor(&seeded(&[o], 4)).unwrap();
        let ours = conv2d_bias_relu(&x, &wt, &b, stride, pad).unwrap();
        let reference = x
            .conv2d(&wt, pad, stride, 1, 1)
            .unwrap()
            .broadcast_add(&b.reshape((1, o, 1, 1)).unwrap())
            .unwrap()
            .relu()
            .unwrap();
        assert!(max_rel(&ours, &reference) < 1e-5);
        let probe = seeded(ours.dims(), 3);
        let g1 = (ours * &probe)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let g2 = (reference * &probe)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        for v in [&x, &wt, &b] {
            let (a, r) = (g1.get(v).unwrap(), g2.get(v).unwrap());
            assert!(max_rel(a, r) < 1e-5, "gradient differs: {}", max_rel(a, r));
        }
    }

    /// The images get no gradient (the conv skips it), the kernel and bias do.
    #[test]
    fn skips_the_input_gradient_of_plain_tensors() {
        let x = seeded(&[2, 3, 6, 6], 1);
        let wt = Var::from_tensor(&seeded(&[4, 3, 3, 3], 2)).unwrap();
        let b = Var::from_tensor(&seeded(&[4], 3)).unwrap();
        let y = conv2d_bias_relu(&x, &wt, &b, 1, 1).unwrap();
        let grads = y.sum_all().unwrap().backward().unwrap();
        assert!(grads.get(&x).is_none());
        assert!(grads.get(&wt).is_some() && grads.get(&b).is_some());
    }
}
