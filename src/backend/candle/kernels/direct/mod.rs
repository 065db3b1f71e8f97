//! Direct convolution on the CPU in a channel-blocked layout, the way oneDNN's `jit_avx512_core_conv` and
//! `jit_avx2_conv` work: activations are kept as `(N, C/L, H, W, L)` ("nChw16c" with L = 16 on AVX-512,
//! "nChw8c" with L = 8 on AVX2), so the L channels of a pixel are one vector register and a convolution is
//! a register-blocked sum with no im2col matrix, no col2im and no layout change between layers. A model
//! converts at its edges (`to_blocked` after the stem, `from_blocked` before the head); convolutions,
//! BatchNorm (+ReLU) and the residual add run blocked in between.
//!
//! - `conv`: the convolution op (kernels: the `trainyard_conv` crate).
//! - `layout`: NCHW ↔ blocked conversions as differentiable ops.
//! - `batchnorm`: training and eval BatchNorm (+ReLU) over blocked activations.
//! - `elementwise`: the small CNN's bias + ReLU and 2x2 max-pool over blocked activations.
//! - `bias_relu_pool`: the two as one op, for the CNN's blocks (one pass each way instead of four); under
//!   bf16 autocast it rounds `sum + bias` once, over the unrounded sums of `conv::conv2d_bf16_sums`.
//! - `matmul`: matrix products and linear layers on the same path's GEMM kernel (transformers).
//! - `rowwise`: LayerNorm, softmax and GELU over the last dimension, one pass each way (transformers).
//! - `attention`: multi-head self-attention as one op over the qkv projection (transformers).
//!
//! The path is chosen once per process from the CPU (`Isa::detected`), or forced with
//! `TRAINYARD_CONV_ISA=avx512|avx2|portable` (benchmarks, and the tests that compare paths);
//! `TRAINYARD_CONV=im2col` turns the blocked path off. The kernels block for the core's L1 data cache as
//! CPUID reports it; `TRAINYARD_CONV_L1D=32K` makes them block for another size (a benchmark modelling a
//! smaller core).

/// What a bf16 convolution or linear layer may take as bf16 already, so the `fma` tier reads it in place
/// instead of rounding a copy (`trainyard_conv::bf16::Values`, `Operand::Bf16`): its input, when an op
/// that rounds as it stores made it (autocast's BatchNorm and residual add: `batchnorm::train`'s `round`,
/// `fused::add_relu_rounded`; a ViT's attention, GELU, or a LayerNorm rounded for its reader), and its
/// output gradient, when the only op reading its output passes back a rounded gradient (such a BatchNorm;
/// the attention; GELU). Only a caller that knows the graph (ResNet's and ViT's blocks) can say so; a
/// claim that is not true computes with unrounded operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rounded {
    /// The input `x` holds bf16s.
    pub input: bool,
    /// The gradient of the output that reaches the backward holds bf16s.
    pub grad: bool,
}

impl Rounded {
    /// Nothing known: the op rounds its operands itself.
    pub const NONE: Rounded = Rounded {
        input: false,
        grad: false,
    };
}

pub mod attention;
pub mod batchnorm;
pub mod bias_relu_pool;
pub mod conv;
pub mod elementwise;
pub mod layout;
pub mod matmul;
pub mod rowwise;

use std::sync::OnceLock;
pub use trainyard_conv::Isa;

/// The path models train on in this process: `Some` when the blocked layout is on.
pub fn active() -> Option<Isa> {
    static CHOICE: OnceLock<Option<Isa>> = OnceLock::new();
    *CHOICE.get_or_init(|| {
        if std::env::var("TRAINYARD_CONV").as_deref() == Ok("im2col") {
            return None;
        }
        if let Ok(size) = std::env::var("TRAINYARD_CONV_L1D") {
            block_for_l1(&size);
        }
        match std::env::var("TRAINYARD_CONV_ISA") {
            Ok(name) => match Isa::parse(&name).filter(|isa| isa.supported()) {
                Some(isa) => Some(isa),
                None => {
                    tracing::warn!(
                        "TRAINYARD_CONV_ISA={name} is not a path this CPU runs (avx512, avx2, portable); using {}",
                        Isa::detected().name()
                    );
                    default_choice()
                }
            },
            // Without SIMD the im2col path (the `gemm` crate's kernels) is faster than portable loops.
            Err(_) => default_choice(),
        }
    })
}

/// Sets the L1 size the kernels block for, before the first of them runs (`active` runs first).
fn block_for_l1(size: &str) {
    use trainyard_conv::cache;
    let bytes = cache::parse_size(size);
    match bytes.map(cache::set_l1d_bytes) {
        Some(Ok(())) if Some(cache::l1d_bytes()) != bytes => tracing::warn!(
            "TRAINYARD_CONV_L1D={size} is outside the 16-64 KiB the blockings were measured over; blocking for {} KiB",
            cache::l1d_bytes() / 1024
        ),
        Some(Ok(())) => {}
        Some(Err(used)) => tracing::warn!(
            "TRAINYARD_CONV_L1D={size} came after the first kernel ran; blocking for {} KiB",
            used / 1024
        ),
        None => tracing::warn!(
            "TRAINYARD_CONV_L1D={size} is not a size (32K, 48KiB, 32768); blocking for the detected {} KiB",
            cache::l1d_bytes() / 1024
        ),
    }
}

fn default_choice() -> Option<Isa> {
    Some(Isa::detected()).filter(|isa| !matches!(isa, Isa::Portable8 | Isa::Portable16))
}
