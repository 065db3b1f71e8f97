//! The Candle op over `trainyard_conv`'s direct convolution: blocked input, (O, I, K, K) kernel, with its
//! own backward (input gradient only when something upstream needs it).
//!
//! Under bf16 autocast (`conv2d_bf16`) the forward and both gradients, at every stride, run on
//! `trainyard_conv::bf16::direct` on the CPU's bf16 tier (AMX, AVX512-BF16, or f32 FMAs over rounded
//! operands): bf16 operands, f32 sums, a rounded result, autocast's numbers as the emulated path computes
//! them. A convolution with a bias (`conv2d_bf16_sums`) leaves its sums unrounded for the epilogue that
//! adds the bias and rounds once (`bias_relu_pool::bias_relu_pool2_bf16`).

use super::layout::with_blocked;
use crate::backend::candle::kernels::cpu::{f32_slice as slice, with_f32};
use crate::backend::candle::kernels::tape;
use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};
use trainyard_conv::bf16::{direct as bf16_direct, Tier, Values};
use trainyard_conv::conv::{forward, input_grad, weight_grad, Geometry};
use trainyard_conv::Isa;

/// The Candle op: blocked `x` convolved with `w` (O, I, K, K), with its backward.
struct DirectConv {
    isa: Isa,
    stride: usize,
    padding: usize,
    /// bf16 autocast on this tier: operands and results rounded (`conv2d_bf16`).
    bf16: Option<Tier>,
    /// Which of its bf16 operands arrive rounded already.
    rounded: Rounded,
    /// Under bf16, the f32 sums stored unrounded, for a bias epilogue that rounds (`conv2d_bf16_sums`).
    sums: bool,
}

pub use super::Rounded;

/// `v` as the bf16 kernels take it: `Rounded` when its claim (`flag`) says it holds bf16s.
fn values(flag: bool, v: &[f32]) -> Values<'_> {
    if flag {
        Values::Rounded(v)
    } else {
        Values::F32(v)
    }
}

impl DirectConv {
    fn geometry(&self, x: &Shape, w: &Shape) -> Result<Geometry> {
        let (n, ib, h, wd, lanes) = x.dims5()?;
        let (c_out, c_in, k, k2) = w.dims4()?;
        if lanes != self.isa.lanes() || c_in.div_ceil(lanes) != ib || k != k2 {
            candle_core::bail!(
                "direct conv: input {x:?} (blocks of {}) does not fit kernel {w:?}",
                self.isa.lanes()
            );
        }
        if h + 2 * self.padding < k || wd + 2 * self.padding < k {
            candle_core::bail!(
                "direct conv: a {h}x{wd} input (padding {}) is smaller than the {k}x{k} kernel",
                self.padding
            );
        }
        Ok(Geometry {
            n,
            c_in,
            c_out,
            h,
            w: wd,
            k,
            stride: self.stride,
            padding: self.padding,
            lanes,
        })
    }
}

impl CustomOp2 for DirectConv {
    fn name(&self) -> &'static str {
        "trainyard-direct-conv"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let g = self.geometry(l1.shape(), l2.shape())?;
        let (x, w) = (slice(s1, l1)?, slice(s2, l2)?);
        let y = match self.bf16 {
            Some(tier) if self.sums => {
                bf16_direct::forward_sums_of(tier, values(self.rounded.input, x), w, &g)
            }
            Some(tier) => bf16_direct::forward_of(tier, values(self.rounded.input, x), w, &g),
            None => forward(self.isa, x, w, &g),
        };
        let shape = Shape::from((g.n, g.ob(), g.oh(), g.ow(), g.lanes));
        Ok((CpuStorage::F32(y), shape))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let g = self.geometry(x.shape(), w.shape())?;
        let dev = x.device();
        // Under autocast both gradients run on the bf16 tier, which rounds the operands and each result:
        // autocast's numbers (the fma tier rounds `dy` once for both, in `Gradient`, unless it arrives
        // rounded: `Rounded::grad`). At 32-true the f32 kernels read the tensors in place.
        let (dx, dw) = with_f32(grad, |dy| {
            let bf16 = self
                .bf16
                .map(|tier| bf16_direct::Gradient::of(tier, values(self.rounded.grad, dy)));
            let dx = if x.track_op() {
                let d = with_f32(w, |wd| {
                    Ok(match &bf16 {
                        Some(dy) => dy.input_grad(wd, &g),
                        None => input_grad(self.isa, dy, wd, &g),
                    })
                })?;
                Some(Tensor::from_vec(d, x.shape(), dev)?)
            } else {
                None
            };
            let dw = if w.track_op() {
                let d = with_blocked(x, |xd, _| {
                    Ok(match &bf16 {
                        Some(dy) => dy.weight_grad_of(values(self.rounded.input, xd), &g),
                        None => weight_grad(self.isa, xd, dy, &g),
                    })
                })?;
                Some(Tensor::from_vec(d, w.shape(), dev)?)
            } else {
                None
            };
            Ok((dx, dw))
        })?;
        Ok((dx, dw))
    }
}

/// Blocked `x` (N, ⌈C/L⌉, H, W, L) convolved with `w` (O, C, K, K) on `isa`: blocked (N, ⌈O/L⌉, OH, OW, L).
pub fn conv2d(isa: Isa, x: &Tensor, w: &Tensor, stride: usize, padding: usize) -> Result<Tensor> {
    conv2d_on(isa, (None, Rounded::NONE, false), x, w, (stride, padding))
}

/// `conv2d` under bf16 autocast on `tier`: bf16 operands, f32 sums, rounded results, forward and backward;
/// the operands `rounded` names arrive as bf16s. The blocked layout must be 16 lanes (`bf16_blocks`).
pub fn conv2d_bf16(
    on: (Isa, Tier),
    x: &Tensor,
    w: &Tensor,
    geometry: (usize, usize),
    rounded: Rounded,
) -> Result<Tensor> {
    conv2d_bf16_stored(on, x, w, geometry, (rounded, false))
}

/// `conv2d_bf16` with the f32 sums left unrounded: for a convolution with a bias, whose epilogue adds
/// the bias and rounds once (`bias_relu_pool::bias_relu_pool2_bf16`), as autocast's bf16 convolution
/// does. The backward is `conv2d_bf16`'s.
pub fn conv2d_bf16_sums(
    on: (Isa, Tier),
    x: &Tensor,
    w: &Tensor,
    geometry: (usize, usize),
    rounded: Rounded,
) -> Result<Tensor> {
    conv2d_bf16_stored(on, x, w, geometry, (rounded, true))
}

/// `conv2d_bf16`, its sums stored unrounded under `sums`.
fn conv2d_bf16_stored(
    (isa, tier): (Isa, Tier),
    x: &Tensor,
    w: &Tensor,
    (stride, padding): (usize, usize),
    (rounded, sums): (Rounded, bool),
) -> Result<Tensor> {
    if !bf16_blocks(isa, tier) {
        candle_core::bail!(
            "direct conv: bf16 on {} needs {}'s 16-lane blocks",
            tier.name(),
            isa.name()
        );
    }
    conv2d_on(isa, (Some(tier), rounded, sums), x, w, (stride, padding))
}

/// Whether the blocked path runs bf16 autocast's convolutions on `tier` (AMX, AVX512-BF16, or their
/// portable reference): over 16-lane blocks, the layout whose pixel is half an A-tile row.
pub fn bf16_blocks(isa: Isa, tier: Tier) -> bool {
    isa.lanes() == bf16_direct::LANES && tier.supported()
}

fn conv2d_on(
    isa: Isa,
    (bf16, rounded, sums): (Option<Tier>, Rounded, bool),
    x: &Tensor,
    w: &Tensor,
    (stride, padding): (usize, usize),
) -> Result<Tensor> {
    if !isa.supported() {
        candle_core::bail!("direct conv: this CPU has no {} path", isa.name());
    }
    #[cfg(test)]
    let rounded = if tests::TRUST_ROUNDED.get() || rounded == Rounded::NONE {
        rounded
    } else {
        tests::DISTRUSTED.set(tests::DISTRUSTED.get() + 1);
        Rounded::NONE
    };
    tape::op2(
        &x.contiguous()?,
        &w.contiguous()?,
        DirectConv {
            isa,
            stride,
            padding,
            bf16,
            rounded,
            sums,
        },
    )
}

#[cfg(test)]
#[allow(clippy::too_many_arguments)] // rstest cases: one argument per geometry field
pub(crate) mod tests {
    use super::super::matmul::tests::{assert_as_emulated, EMULATED};
    use super::*;
    use crate::backend::candle::kernels::cpu::seeded;
    use crate::backend::candle::kernels::direct::layout::{from_blocked, to_blocked};
    use candle_core::Var;
    use std::cell::Cell;

    thread_local! {
        /// Whether this thread's bf16 convolutions and linear layers read the operands their callers call
        /// rounded in place (else they round copies, whatever their `Rounded` says):
        /// `operands_called_rounded_are_bf16s`, `vit_operands_called_rounded_are_bf16s`.
        pub(crate) static TRUST_ROUNDED: Cell<bool> = const { Cell::new(true) };
        /// How many convolutions and linear layers this thread built with their claims set aside.
        pub(crate) static DISTRUSTED: Cell<usize> = const { Cell::new(0) };
    }

    /// bf16 autocast's blocked convolution on each tier that runs here (AMX, and its portable reference)
    /// equals the emulated roundings around the f32 convolution, forward and both gradients: ResNet's
    /// 3x3 and downsampling convolutions, its 1x1 shortcut and the CIFAR stem's 3 channels.
    #[rstest::rstest]
    #[case::resnet_3x3(2, 32, 8, 8, 32, 3, (1, 1))]
    #[case::downsampling(2, 16, 9, 9, 32, 3, (2, 1))]
    #[case::shortcut(2, 32, 8, 8, 48, 1, (2, 0))]
    #[case::cifar_stem(2, 3, 8, 8, 16, 3, (1, 1))]
    fn bf16_blocked_matches_emulated_autocast(
        #[case] n: usize,
        #[case] c: usize,
        #[case] h: usize,
        #[case] w: usize,
        #[case] o: usize,
        #[case] k: usize,
        #[case] (stride, pad): (usize, usize),
        #[values("amx", "avx512-bf16", "fma", "portable")] tier: &str,
    ) {
        let Some(tier) = Tier::parse(tier).filter(|t| t.supported()) else {
            return;
        };
        let isa = [Isa::detected(), Isa::Portable16]
            .into_iter()
            .find(|isa| bf16_blocks(*isa, tier))
            .expect("Portable16 has 16 lanes");
        let x = Var::from_tensor(&seeded(&[n, c, h, w], 1, -1.0, 1.0)).unwrap();
        let wt = Var::from_tensor(&seeded(&[o, c, k, k], 2, -1.0, 1.0)).unwrap();
        let blocked = to_blocked(&x, isa.lanes()).unwrap();
        let y = conv2d_bf16((isa, tier), &blocked, &wt, (stride, pad), Rounded::NONE).unwrap();
        let ours = from_blocked(&y, o).unwrap();
        let theirs = EMULATED.conv2d(&x, &wt, stride, pad).unwrap();
        assert_as_emulated(ours, theirs, &[("x", &x), ("w", &wt)], tier);
    }
}
