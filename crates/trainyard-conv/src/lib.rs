//! Direct 2-D convolution in channel-blocked layouts for training on the CPU, the way oneDNN's
//! `jit_avx512_core_conv` and `jit_avx2_conv` work: activations are `(N, C/L, H, W, L)` ("nChw16c" with
//! L = 16 on AVX-512, "nChw8c" with L = 8 on AVX2), so the L channels of a pixel are one vector register and
//! a convolution is a register-blocked sum with no im2col matrix, no col2im and no layout change between
//! layers. Forward, input gradient and weight gradient, over plain f32 slices (the Candle ops that use them
//! live in `trainyard::backend::candle::direct`).
//!
//! - `simd`: the vector type of each path (AVX-512, AVX2+FMA, portable arrays).
//! - `kernels`: the register-blocked loops, compiled per path.
//! - `conv`: weight packing and the three passes over rayon.
//! - `taps`: which kernel taps each output pixel reads (none in the padding), pixels grouped by them.
//! - `layout`: NCHW ↔ blocked data.
//! - `cache`: the core's L1 data cache, which every blocking is a fraction of.
//!
//! The same paths serve the transformer's kernels:
//! - `gemm`: batched matrix products with any strides (linear layers: bias fused, weight gradients in the
//!   weight's layout), the gather kernel's register blocking over rows × column blocks.
//! - `rowwise`: LayerNorm, softmax, GELU and column sums, one pass each way.
//! - `attention`: multi-head self-attention of a fused qkv activation, forward and backward.
//!
//! A crate of its own so that it is optimised in every build profile, like the `gemm` crate it replaces
//! for these shapes: the kernels are unusable unoptimised, and the tests train models through them.

// The register-blocked loops index several arrays (accumulators, vectors, offsets) by the same row or
// lane: index loops say that more plainly than zipped iterators.
#![allow(clippy::needless_range_loop)]

/// `$tile::<$V, rows, blocks>(args)` for run-time `rows` (1..=8) and `blocks` (1..=4): a kernel's tile is
/// const-generic (its accumulators are a register array), so the edge tiles pick their shape here.
macro_rules! by_tile_shape {
    ($tile:ident, $V:ty, $rows:expr, $nb:expr, $args:tt) => {
        match $rows {
            1 => by_tile_shape!(@nb $tile, $V, 1, $nb, $args),
            2 => by_tile_shape!(@nb $tile, $V, 2, $nb, $args),
            3 => by_tile_shape!(@nb $tile, $V, 3, $nb, $args),
            4 => by_tile_shape!(@nb $tile, $V, 4, $nb, $args),
            5 => by_tile_shape!(@nb $tile, $V, 5, $nb, $args),
            6 => by_tile_shape!(@nb $tile, $V, 6, $nb, $args),
            7 => by_tile_shape!(@nb $tile, $V, 7, $nb, $args),
            _ => by_tile_shape!(@nb $tile, $V, 8, $nb, $args),
        }
    };
    (@nb $tile:ident, $V:ty, $rows:literal, $nb:expr, ($($a:expr),*)) => {
        match $nb {
            1 => $tile::<$V, $rows, 1>($($a),*),
            2 => $tile::<$V, $rows, 2>($($a),*),
            3 => $tile::<$V, $rows, 3>($($a),*),
            _ => $tile::<$V, $rows, 4>($($a),*),
        }
    };
}

pub mod attention;
pub mod bf16;
pub mod buffer;
pub mod cache;
pub mod conv;
pub mod gemm;
mod kernels;
pub mod layout;
pub mod rowwise;
mod simd;
mod taps;

/// The instruction set a direct convolution runs on, which also fixes the block width L.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512F: 16 lanes.
    Avx512,
    /// AVX2 with FMA: 8 lanes.
    Avx2,
    /// Plain Rust with AVX-512's block width (the reference for the AVX-512 path).
    Portable16,
    /// Plain Rust with AVX2's block width.
    Portable8,
}

impl Isa {
    /// Channels per block: the vector width.
    pub fn lanes(self) -> usize {
        match self {
            Isa::Avx512 | Isa::Portable16 => 16,
            Isa::Avx2 | Isa::Portable8 => 8,
        }
    }

    /// Whether this CPU runs the path.
    pub fn supported(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            Isa::Portable16 | Isa::Portable8 => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The portable path with the same block width (what a SIMD path is checked against).
    pub fn portable_twin(self) -> Isa {
        if self.lanes() == 16 {
            Isa::Portable16
        } else {
            Isa::Portable8
        }
    }

    /// The widest path this CPU has, the name the bench tables print ("avx512", "avx2", "portable").
    pub fn detected() -> Isa {
        [Isa::Avx512, Isa::Avx2]
            .into_iter()
            .find(|isa| isa.supported())
            .unwrap_or(Isa::Portable8)
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Portable16 | Isa::Portable8 => "portable",
        }
    }

    /// Reads `TRAINYARD_CONV_ISA`'s value; `None` for anything else.
    pub fn parse(name: &str) -> Option<Isa> {
        match name {
            "avx512" => Some(Isa::Avx512),
            "avx2" => Some(Isa::Avx2),
            "portable" => Some(Isa::Portable8),
            "portable16" => Some(Isa::Portable16),
            _ => None,
        }
    }
}
