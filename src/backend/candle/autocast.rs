//! `trainer.precision=bf16-mixed` on the Candle CPU path: PyTorch autocast's numerics without its kernels.
//! Under bf16 autocast the operands and results of convolutions and matrix products are rounded to
//! bfloat16 (round-to-nearest-even), products accumulate in f32, and everything else (normalisation, softmax,
//! loss, optimizer, master weights) computes in f32 — the split PyTorch's autocast makes. The cast's backward
//! rounds gradients to bf16 too, as autocast's bf16 ops do. An op autocast leaves alone keeps its input's
//! dtype: a ResNet's BatchNorm of a bf16 convolution's output, and its residual add, return bf16 tensors in
//! PyTorch, so trainyard's ResNet rounds their outputs and the gradients they pass back (`resnet::BnOf`,
//! `fused::add_relu_rounded`); its convolutions then read those as bf16 already. Likewise a ViT's GELU and
//! attention return bf16 both ways, and a LayerNorm whose only reader is a linear layer stores the bf16s
//! that layer would round it to, so the linear layers read them in place (`direct::Rounded`). CPUs
//! without bf16 arithmetic gain no speed from this; it reproduces the accuracy a user will see with bf16
//! autocast.
//!
//! On a CPU with bf16 instructions (AMX-BF16 or AVX512-BF16: `trainyard_conv::bf16::Tier`) the
//! convolutions run on them, forward and backward, as oneDNN runs autocast's; on AVX-512 without a bf16
//! instruction faster than an FMA, on the blocked f32 kernels over rounded operands (`Tier::Fma`);
//! elsewhere the products are f32 products of rounded operands (emulated, slower than 32-true). `train`
//! says once when it is one of the last two.
//!
//! Where `torch.autocast` is a thread-local switch, here the mode is a value each forward pass carries
//! (`models::Pass`), so nothing outside the call decides how it computes.

use super::kernels::cpu::{f32_slice, is_cpu_f32, with_f32};
use super::kernels::direct::Rounded;
use super::kernels::tape;
use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};
use trainyard_conv::bf16::Tier;

/// The autocast mode of one forward pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Autocast {
    /// bf16 rounding of matrix products' and convolutions' operands and results.
    pub bf16: bool,
    /// The bf16 instructions products run on; `None`: emulated.
    pub tier: Option<Tier>,
}

impl Autocast {
    /// No autocast: every op in f32.
    pub const OFF: Autocast = Autocast {
        bf16: false,
        tier: None,
    };

    /// bf16 autocast emulated (f32 products of rounded operands): where only its roundings are wanted
    /// (`round`), which are the same on every tier.
    pub const EMULATED: Autocast = Autocast {
        bf16: true,
        tier: None,
    };

    /// bf16 autocast on this CPU's bf16 instructions (`bf16_tier`).
    pub fn bf16() -> Autocast {
        Autocast {
            bf16: true,
            tier: bf16_tier(),
        }
    }

    /// Whether a pass under this mode keeps `x`'s activations blocked between the stem and the head (a
    /// ResNet's, a declared model's, the CNN's after its first block): on the CPU in f32 with a
    /// direct-convolution path, and under bf16 autocast where that path's convolutions run on a bf16 tier
    /// (`conv2d_bf16`, `conv2d_bf16_sums`); emulated bf16 keeps the im2col path, which rounds operands as
    /// autocast does.
    pub(super) fn blocks_activations(self, x: &Tensor) -> Option<super::kernels::direct::Isa> {
        use super::kernels::direct;
        let bf16_ok = |isa: direct::Isa| match (self.bf16, self.tier) {
            (false, _) => true,
            (true, Some(tier)) => direct::conv::bf16_blocks(isa, tier),
            (true, None) => false,
        };
        direct::active().filter(|isa| bf16_ok(*isa) && is_cpu_f32(x))
    }

    /// `t` rounded to bf16 and back when autocast is on (differentiable); `t` itself otherwise.
    pub fn round(self, t: &Tensor) -> Result<Tensor> {
        if !self.bf16 || t.dtype() != DType::F32 {
            Ok(t.clone())
        } else if is_cpu_f32(t) {
            tape::op1(&t.contiguous()?, RoundBf16)
        } else {
            t.to_dtype(DType::BF16)?.to_dtype(DType::F32)
        }
    }

    /// `a @ b` (batched, broadcasting) under autocast's rules.
    pub fn matmul(self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        if !self.bf16 {
            return match super::kernels::direct::active() {
                Some(isa) => super::kernels::direct::matmul::matmul(isa, a, b),
                None => a.broadcast_matmul(b),
            };
        }
        use super::kernels::direct;
        if let (Some(tier), Some(isa)) = (self.tier, direct::active()) {
            // The roundings inside the op.
            if let Some(c) = direct::matmul::matmul_bf16(isa, tier, a, b)? {
                return Ok(c);
            }
        }
        self.round(&self.round(a)?.broadcast_matmul(&self.round(b)?)?)
    }

    /// `x @ wᵀ + b` (PyTorch's `nn.Linear`): under autocast, bf16 operands (bias included), one rounding
    /// of the f32-accumulated result, as a bf16 `addmm` does.
    pub fn linear(self, x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
        self.linear_of((x, Rounded::NONE), w, b)
    }

    /// `linear` where, under autocast, `rounded` names what holds bf16 values already: `x` (its producer
    /// rounded as it stored: a bf16 op's result, or an op whose only reader is this layer) and the
    /// gradient of the result (its only reader passes back bf16s). The `fma` tier then reads them in place
    /// instead of rounding copies: the same numbers, if the claims are true.
    pub fn linear_of(
        self,
        (x, rounded): (&Tensor, Rounded),
        w: &Tensor,
        b: &Tensor,
    ) -> Result<Tensor> {
        if !self.bf16 {
            return match super::kernels::direct::active() {
                Some(isa) => super::kernels::direct::matmul::linear(isa, x, w, b),
                None => x.broadcast_matmul(&w.t()?)?.broadcast_add(b),
            };
        }
        use super::kernels::direct;
        if let (Some(tier), Some(isa)) = (self.tier, direct::active()) {
            if let Some(y) = direct::matmul::linear_bf16(isa, tier, (x, rounded), w, b)? {
                return Ok(y);
            }
        }
        self.round(
            &self
                .round(x)?
                .broadcast_matmul(&self.round(w)?.t()?)?
                .broadcast_add(&self.round(b)?)?,
        )
    }

    /// `conv2d(x, w)` (`conv::conv2d`): under autocast, bf16 operands and one rounding of the result.
    pub fn conv2d(self, x: &Tensor, w: &Tensor, stride: usize, padding: usize) -> Result<Tensor> {
        if !self.bf16 {
            return super::kernels::conv::conv2d(x, w, stride, padding);
        }
        use super::kernels::conv;
        if let (Some(tier), true) = (self.tier, conv::handles(x, w)?) {
            // The roundings inside the op (`conv2d_on`).
            return conv::conv2d_on(x, w, stride, padding, Some(tier));
        }
        let y = conv::conv2d(&self.round(x)?, &self.round(w)?, stride, padding)?;
        self.round(&y)
    }

    /// `conv2d(x, w) + bias`, `bias` per output channel: PyTorch's `F.conv2d(x, w, b)`, under
    /// autocast one bf16 op, `bf16(conv(bf16(x), bf16(w)) + bf16(b))`: the bias added to the f32 sums, then
    /// one rounding (rounding the convolution and adding an f32 bias after it left the result in f32).
    /// Composed from the f32 convolution over rounded operands: for a small convolution such as a ViT's
    /// patch embedding, whose rounded copies cost little.
    pub fn conv2d_bias(
        self,
        x: &Tensor,
        w: &Tensor,
        bias: &Tensor,
        stride: usize,
        padding: usize,
    ) -> Result<Tensor> {
        use super::kernels::conv;
        let bias = tape::ops::reshape(bias, (1, bias.elem_count(), 1, 1))?;
        if !self.bf16 {
            return tape::ops::broadcast_add(&conv::conv2d(x, w, stride, padding)?, &bias);
        }
        let sums = conv::conv2d(&self.round(x)?, &self.round(w)?, stride, padding)?;
        self.round(&tape::ops::broadcast_add(&sums, &self.round(&bias)?)?)
    }

    /// `relu(conv2d(x, w) + bias)`: the fused op; under autocast PyTorch's `relu(F.conv2d(x, w, b))`,
    /// `relu(bf16(conv(bf16 x, bf16 w) + bf16(b)))`: on a bf16 tier the fused op with the bias inside the
    /// rounding, else the composition (`conv2d_bias`). (It used to round the convolution and add the f32
    /// bias after it, which left the result in f32.)
    pub fn conv2d_bias_relu(
        self,
        x: &Tensor,
        w: &Tensor,
        bias: &Tensor,
        stride: usize,
        padding: usize,
    ) -> Result<Tensor> {
        use super::kernels::conv_relu;
        if !self.bf16 {
            return conv_relu::conv2d_bias_relu(x, w, bias, stride, padding);
        }
        if let (Some(tier), true) = (self.tier, conv_relu::handles(x, w, bias)?) {
            return conv_relu::conv2d_bias_relu_on(x, w, bias, (stride, padding), Some(tier));
        }
        super::kernels::fused::relu(&self.conv2d_bias(x, w, bias, stride, padding)?)
    }
}

/// A cast to bf16 and back as one f32 op, forward and backward (the gradient rounded as the cast's
/// backward rounds it). Through Candle's own casts the backward summed gradients as bf16 tensors, on an
/// element-at-a-time path that took ~40% of a ResNet-18 step, and the body left trainyard's tape.
struct RoundBf16;

impl CustomOp1 for RoundBf16 {
    fn name(&self) -> &'static str {
        "trainyard-round-bf16"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        Ok((
            CpuStorage::F32(rounded(f32_slice(s, l)?)),
            l.shape().clone(),
        ))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let g = with_f32(grad, |g| Ok(rounded(g)))?;
        Ok(Some(Tensor::from_vec(g, grad.shape(), grad.device())?))
    }
}

/// Each value rounded to the nearest bf16 (ties to even), kept as f32.
pub(super) fn rounded(x: &[f32]) -> Vec<f32> {
    trainyard_conv::bf16::rounded(x)
}

/// The bf16 tier of this process: the fastest this CPU has (`Tier::detected`), or
/// `TRAINYARD_BF16=amx|avx512-bf16|fma|emulated` (benchmarks, and the tests that compare tiers); `None`
/// (emulated) on a CPU without AVX-512, said once, as is a choice of f32 FMAs.
pub fn bf16_tier() -> Option<Tier> {
    static CHOICE: std::sync::OnceLock<Option<Tier>> = std::sync::OnceLock::new();
    *CHOICE.get_or_init(|| {
        let choice = match std::env::var("TRAINYARD_BF16").as_deref() {
            Ok("emulated") => None,
            Ok(name) => match Tier::parse(name).filter(|t| t.supported()) {
                Some(tier) => Some(tier),
                None => {
                    tracing::warn!(
                        "TRAINYARD_BF16={name} is not a tier this CPU runs (amx, avx512-bf16, fma, portable, emulated); using the fastest it has"
                    );
                    Tier::detected()
                }
            },
            Err(_) => Tier::detected(),
        };
        match choice {
            None => tracing::warn!(
                "trainer.precision=bf16-mixed: this CPU has neither AMX-BF16 nor AVX-512, so bf16 is \
                 emulated (f32 products of bf16-rounded operands: autocast's accuracy, slower than 32-true)"
            ),
            Some(Tier::Fma) => tracing::info!(
                "trainer.precision=bf16-mixed: this CPU has no AMX and no bf16 instruction faster than its \
                 FMAs, so autocast's products run as f32 FMAs over bf16-rounded operands (the same numbers; \
                 about 32-true's speed, not faster)"
            ),
            Some(_) => {}
        }
        choice
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// Round-to-nearest-even to bf16 (finite values), written out so the test does not trust Candle's cast.
    fn bf16_round(v: f32) -> f32 {
        let bits = v.to_bits();
        f32::from_bits(((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16)
    }

    #[test]
    fn matmul_rounds_operands_and_result_only_under_autocast() {
        let a = Tensor::new(&[[1.0f32 + 1.0 / 512.0, 3.0]], &Device::Cpu).unwrap();
        let b = Tensor::new(&[[1.0f32], [1.0 / 3.0]], &Device::Cpu).unwrap();
        let full = Autocast::OFF
            .matmul(&a, &b)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap()[0][0];
        assert_eq!(full, (1.0f32 + 1.0 / 512.0) + 3.0 * (1.0 / 3.0));
        let mixed = Autocast {
            bf16: true,
            tier: None,
        }
        .matmul(&a, &b)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap()[0][0];
        let expected = bf16_round(bf16_round(1.0 + 1.0 / 512.0) + 3.0 * bf16_round(1.0 / 3.0));
        assert_eq!(mixed, expected);
        assert_ne!(mixed, full);
    }

    /// A convolution with a bias under autocast is one bf16 op: the bias is added to the f32 sum of the
    /// rounded operands, then the result is rounded. Here 1 + 2⁻⁹ rounds to 1; rounding the convolution
    /// first and adding the bias after it returned 1 + 2⁻⁹, an f32 that is no bf16.
    #[test]
    fn a_convolution_with_a_bias_rounds_once_after_the_bias() {
        let x = Tensor::new(&[[[[1.0f32, 1.0 + 1.0 / 128.0]]]], &Device::Cpu).unwrap();
        let w = Tensor::new(&[[[[1.0f32]]]], &Device::Cpu).unwrap();
        let b = Tensor::new(&[1.0f32 / 512.0], &Device::Cpu).unwrap();
        let value = |ac: Autocast| {
            ac.conv2d_bias(&x, &w, &b, 1, 0)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        };
        let mixed = value(Autocast::EMULATED);
        let want: Vec<f32> = [1.0f32, 1.0 + 1.0 / 128.0]
            .iter()
            .map(|v| bf16_round(v + 1.0 / 512.0))
            .collect();
        assert_eq!(mixed, want);
        assert_eq!(mixed, vec![1.0, 1.0 + 1.0 / 128.0]);
        assert_eq!(
            value(Autocast::OFF),
            vec![1.0 + 1.0 / 512.0, 1.0 + 1.0 / 128.0 + 1.0 / 512.0]
        );
    }

    /// `relu(F.conv2d(x, w, b))` under autocast (the CNN's blocks, a declared conv+ReLU) on every tier
    /// this CPU runs and emulated: the bias inside the one rounding, as in `conv2d_bias`. Rounding the
    /// convolution and adding the f32 bias after it (the old placement) returned 1 + 2⁻⁹, an f32 that is
    /// no bf16; rounding the convolution and then again after the bias returns 1 + 2⁻⁷ for the last one.
    #[rstest::rstest]
    fn a_convolution_with_a_bias_and_relu_rounds_once_after_the_bias(
        #[values("emulated", "amx", "avx512-bf16", "fma", "portable")] tier: &str,
    ) {
        let ac = match tier {
            "emulated" => Autocast::EMULATED,
            name => match Tier::parse(name).filter(|t| t.supported()) {
                Some(tier) => Autocast {
                    bf16: true,
                    tier: Some(tier),
                },
                None => return,
            },
        };
        // Two input channels, a 1x1 kernel of ones: each output is the sum of the two channels. The
        // loss weighs the three outputs by 1, 2⁻⁹ and 4.
        let run = |(first, second): ([f32; 3], [f32; 3]), bias: f32| {
            let x = Tensor::new(&[[[first], [second]]], &Device::Cpu).unwrap();
            let w = Var::new(&[[[[1.0f32]], [[1.0]]]], &Device::Cpu).unwrap();
            let b = Var::new(&[bias], &Device::Cpu).unwrap();
            let y = ac.conv2d_bias_relu(&x, &w, &b, 1, 0).unwrap();
            let values = y.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            // The gradients reach the weight and the bias (the ReLU's mask from the rounded output).
            let probe = Tensor::new(&[[[[1.0f32, 1.0 / 512.0, 4.0]]]], &Device::Cpu).unwrap();
            let grads = (y * probe).unwrap().sum_all().unwrap().backward().unwrap();
            let db = grads.get(&b).unwrap().to_vec1::<f32>().unwrap()[0];
            assert!(grads.get(&w).is_some());
            (values, db)
        };
        let (values, db) = run(([1.0, 1.0 + 1.0 / 128.0, -1.0], [0.0; 3]), 1.0 / 512.0);
        assert_eq!(values, vec![1.0, 1.0 + 1.0 / 128.0, 0.0], "{tier}");
        // The bias's gradient, 1 + 2⁻⁹ (the third output is masked), is rounded to bf16 as the backward
        // of autocast's cast of the bias returns it.
        assert_eq!(db, 1.0, "{tier}");
        // 1 + 5·2⁻¹⁰ - 2⁻⁹ = 1 + 3·2⁻¹⁰ rounds to 1; 1 + 5·2⁻¹⁰ alone rounds up to 1 + 2⁻⁷.
        let (values, _) = run(([1.0; 3], [5.0 / 1024.0, 0.0, 0.0]), -1.0 / 512.0);
        assert_eq!(values, vec![1.0; 3], "{tier}");
    }

    #[test]
    fn gradients_flow_through_the_rounding() {
        let w = Var::new(&[[0.1f32, 0.2], [0.3, 0.4]], &Device::Cpu).unwrap();
        let x = Tensor::new(&[[1.0f32, 2.0]], &Device::Cpu).unwrap();
        let loss = Autocast {
            bf16: true,
            tier: None,
        }
        .matmul(&x, w.as_tensor())
        .unwrap()
        .sum_all()
        .unwrap();
        let g = loss.backward().unwrap();
        let gw = g.get(w.as_tensor()).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(gw, vec![vec![1.0, 1.0], vec![2.0, 2.0]]);
        assert_eq!(g.get(w.as_tensor()).unwrap().dtype(), DType::F32);
    }
}
