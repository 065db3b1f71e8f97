//! The `Fma` tier: autocast's bf16 products as f32 FMAs over bf16-rounded operands, on the f32 kernels
//! (`crate::conv`, `crate::gemm`). A product of two bf16s is exact in f32, so this is the same arithmetic as
//! the bf16 instructions up to the order of the f32 sums. It is the fastest way to autocast's numbers
//! where the CPU has AVX-512F but no bf16 instruction that multiplies faster than an FMA: Skylake and Ice
//! Lake Xeons (no bf16 at all), and Sapphire/Emerald Rapids with AMX withheld (a VM), where `vdpbf16ps`
//! does half an FMA's multiply-adds a cycle (`avx512::dot_beats_fma`).
//!
//! A convolution's input (or output gradient) is rounded into an f32 copy in one pass, unless its producer
//! stored bf16s already (`Values::Rounded`: read in place), the gradient once for both of its products
//! (`direct::Gradient`); its weights are rounded as the f32 kernel packs them and
//! its sums as the kernel stores them. A GEMM's right operand is rounded as the f32 GEMM packs it and its
//! sums as the GEMM stores them (`gemm::matmul_bf16_into`); its left one, which the GEMM reads in place, is
//! rounded into a copy unless its producer stored bf16s (`Operand::Bf16`).

use super::pack::{self, round_f32, round_to};
use super::{Operand, Values, Write};
use crate::buffer::{assume_init, uninit};
use crate::conv::{self, Geometry, Precision};
use crate::gemm::{self, Dims, Strides};
use crate::Isa;
use rayon::prelude::*;
use std::borrow::Cow;
use std::mem::MaybeUninit;

/// The f32 kernels' instruction set: the tier needs the 16-lane blocks of AVX-512F.
const ISA: Isa = Isa::Avx512;

/// Whether this CPU runs the tier.
pub fn available() -> bool {
    ISA.supported()
}

/// `v` with each value rounded to the nearest bf16 (kept as f32; a NaN stays a quiet NaN), in parallel,
/// written once (no zeroing): autocast's cast of a tensor.
pub fn rounded(v: &[f32]) -> Vec<f32> {
    let mut out = uninit(v.len());
    out.par_chunks_mut(1 << 14)
        .zip(v.par_chunks(1 << 14))
        .for_each(|(d, s)| round_to(s, d));
    // SAFETY: every element was written above.
    unsafe { assume_init(out) }
}

/// `v` rounded to bf16 in place: autocast's bf16 result.
fn round_owned(mut v: Vec<f32>) -> Vec<f32> {
    v.par_chunks_mut(1 << 14).for_each(pack::round_in_place);
    v
}

/// `direct::forward` on this tier: `x` rounded in one pass (read in place when `Values::Rounded`); the
/// weights rounded as the f32 kernel packs them and, under `round`, the sums as it stores them
/// (`conv::Precision::Bf16`; else `Bf16Sums`).
pub fn conv_forward(x: Values, w: &[f32], g: &Geometry, round: bool) -> Vec<f32> {
    let precision = if round {
        Precision::Bf16
    } else {
        Precision::Bf16Sums
    };
    conv::forward_at(ISA, precision, &x.as_rounded(), w, g)
}

/// `direct::input_grad` on this tier, of a gradient `dy` already rounded (`direct::Gradient`).
pub fn conv_input_grad(dy: &[f32], w: &[f32], g: &Geometry) -> Vec<f32> {
    conv::input_grad_at(ISA, Precision::Bf16, dy, w, g)
}

/// `direct::weight_grad` on this tier, of a gradient `dy` already rounded (`direct::Gradient`) and the
/// input `x` (rounded into a copy unless `Values::Rounded`); the result, the size of the weights, is
/// rounded in a pass of its own.
pub fn conv_weight_grad(x: Values, dy: &[f32], g: &Geometry) -> Vec<f32> {
    round_owned(conv::weight_grad(ISA, &x.as_rounded(), dy, g))
}

/// One matrix's (row, column) strides.
fn strided(rs: usize, cs: usize) -> Strides {
    Strides {
        batch: 0,
        row: rs,
        col: cs,
    }
}

/// The left operand as the f32 GEMM reads it, every value a bf16: in place when its producer stored
/// bf16s (`Operand::Bf16`); else rounded into a copy. A dense strided one (row- or column-major, the span
/// it reaches at most twice its size) is rounded over its span in place order, a pass that vectorises,
/// and keeps its strides (the GEMM reads any); others become contiguous copies.
fn lhs_rounded<'a>(op: &Operand<'a>, (rows, cols): (usize, usize)) -> (Cow<'a, [f32]>, Strides) {
    match *op {
        Operand::Bf16(data, (rs, cs)) => return (Cow::Borrowed(data), strided(rs, cs)),
        Operand::Strided(data, (rs, cs)) => {
            let span = (rows - 1) * rs + (cols - 1) * cs + 1;
            if span <= 2 * rows * cols {
                return (Cow::Owned(rounded(&data[..span])), strided(rs, cs));
            }
        }
        Operand::Rows(_) | Operand::Packed(_) => {}
    }
    (
        Cow::Owned(materialised(op, (rows, cols))),
        Strides::contiguous(rows, cols),
    )
}

/// The right operand as the f32 GEMM reads it, and whether the GEMM must round it as it packs it: in
/// place (rounded as packed unless `Operand::Bf16`), or made from its rows (rounded).
fn rhs_readable<'a>(
    op: &Operand<'a>,
    (rows, cols): (usize, usize),
) -> ((Cow<'a, [f32]>, Strides), bool) {
    match *op {
        Operand::Strided(data, (rs, cs)) => ((Cow::Borrowed(data), strided(rs, cs)), true),
        Operand::Bf16(data, (rs, cs)) => ((Cow::Borrowed(data), strided(rs, cs)), false),
        _ => (
            (
                Cow::Owned(materialised(op, (rows, cols))),
                Strides::contiguous(rows, cols),
            ),
            false,
        ),
    }
}

/// An operand as a rounded, contiguous `rows × cols` f32 matrix.
fn materialised(op: &Operand, (rows, cols): (usize, usize)) -> Vec<f32> {
    if rows == 0 || cols == 0 {
        return Vec::new();
    }
    match op {
        Operand::Strided(data, (rs, cs)) | Operand::Bf16(data, (rs, cs)) => {
            let mut out = uninit(rows * cols);
            out.par_chunks_mut(cols).enumerate().for_each(|(i, row)| {
                if *cs == 1 {
                    round_to(&data[i * rs..][..cols], row);
                } else {
                    for (j, d) in row.iter_mut().enumerate() {
                        *d = MaybeUninit::new(round_f32(data[i * rs + j * cs]));
                    }
                }
            });
            // SAFETY: every row was written above.
            unsafe { assume_init(out) }
        }
        Operand::Rows(f) => {
            let mut out = vec![0f32; rows * cols];
            out.par_chunks_mut(cols).enumerate().for_each(|(i, row)| {
                f(i, row);
                pack::round_in_place(row);
            });
            out
        }
        Operand::Packed(p) => {
            let mut out = vec![0f32; rows * cols];
            p.unpack(&mut out);
            out
        }
    }
}

/// The product into C's rows (`c`, row stride `c_row`): `C = A·B [+ bias]`, rounded under `round`. The
/// f32 GEMM rounds B as it packs it and the sums as it stores them; only an A its producer did not round
/// is copied.
fn product_into(
    (m, n, k): super::Dims,
    (c, c_row): (&mut [MaybeUninit<f32>], usize),
    round: bool,
    (lhs, rhs): (Operand, Operand),
    bias: Option<&[f32]>,
) {
    let dims = Dims { batch: 1, m, k, n };
    if m == 0 || n == 0 {
        return;
    }
    let (a, sa) = if k == 0 {
        (Cow::Borrowed(&[][..]), Strides::contiguous(m, k))
    } else {
        lhs_rounded(&lhs, (m, k))
    };
    let ((b, sb), round_b) = if k == 0 {
        ((Cow::Borrowed(&[][..]), Strides::contiguous(k, n)), false)
    } else {
        rhs_readable(&rhs, (k, n))
    };
    gemm::matmul_bf16_into(
        ISA,
        dims,
        (&a, sa),
        ((&b, sb), round_b),
        bias,
        (c, c_row),
        round,
    );
}

/// `bf16::product` on this tier: one f32 GEMM over rounded operands (B rounded as it is packed, A in
/// place when `Operand::Bf16`), its sums stored straight into `dst` when its rows are contiguous and do not
/// overlap; else (accumulated, as the other tiers do, after the product; or a transposed `dst`) made
/// contiguous first and then put in place.
pub fn product(
    (m, n, k): super::Dims,
    (dst, (dst_rs, dst_cs)): (&mut [f32], (usize, usize)),
    write: Write,
    (lhs, rhs): (Operand, Operand),
) {
    let round = write == Write::StoreBf16;
    if write != Write::Accumulate && dst_cs == 1 && dst_rs >= n {
        // SAFETY: the view only ever has initialised f32s written into it.
        let c = unsafe { &mut *(dst as *mut [f32] as *mut [MaybeUninit<f32>]) };
        return product_into((m, n, k), (c, dst_rs), round, (lhs, rhs), None);
    }
    let c = product_new((m, n, k), (lhs, rhs), None, round);
    for (i, row) in c.chunks_exact(n).enumerate() {
        for (j, v) in row.iter().enumerate() {
            let d = &mut dst[i * dst_rs + j * dst_cs];
            *d = match write {
                Write::Store | Write::StoreBf16 => *v,
                Write::Accumulate => *d + v,
            };
        }
    }
}

/// The product as a new m × n matrix, `bias` (already rounded) added to the sums, each result rounded
/// under `round` (`bf16::rounded_product` on this tier), every element written once (no zeroing).
pub fn product_new(
    (m, n, k): super::Dims,
    (lhs, rhs): (Operand, Operand),
    bias: Option<&[f32]>,
    round: bool,
) -> Vec<f32> {
    if m == 0 || n == 0 {
        return Vec::new();
    }
    let mut c = uninit(m * n);
    product_into((m, n, k), (&mut c, n), round, (lhs, rhs), bias);
    // SAFETY: `product_into` wrote every element of the m × n matrix.
    unsafe { assume_init(c) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bf16::{direct, Tier};

    /// The tier's convolution against the portable reference of the bf16 instructions' arithmetic: the
    /// same rounded operands and f32 sums, so equal up to the order of the sums (and the rounding of the
    /// result that order may tip).
    #[test]
    fn convolutions_match_the_portable_tier() {
        if !available() {
            return;
        }
        let g = Geometry {
            n: 2,
            c_in: 40,
            c_out: 24,
            h: 7,
            w: 6,
            k: 3,
            stride: 2,
            padding: 1,
            lanes: 16,
        };
        let seeded = |len: usize, seed: u32| -> Vec<f32> {
            (0..len)
                .map(|i| {
                    ((i as u32).wrapping_mul(2654435761) ^ seed) as f32 / u32::MAX as f32 - 0.5
                })
                .collect()
        };
        // A blocked tensor of `c` channels: its lanes past `c` are zero.
        let blocked = |c: usize, plane: usize, seed: u32| -> Vec<f32> {
            let cb = c.div_ceil(16);
            let mut v = seeded(g.n * cb * plane * 16, seed);
            for (i, v) in v.iter_mut().enumerate() {
                if ((i / (plane * 16)) % cb) * 16 + i % 16 >= c {
                    *v = 0.0;
                }
            }
            v
        };
        let x = blocked(g.c_in, g.h * g.w, 7);
        let w = seeded(g.c_out * g.c_in * 9, 3);
        let close = |a: &[f32], b: &[f32], what: &str| {
            assert_eq!(a.len(), b.len(), "{what}: length");
            for (i, (p, q)) in a.iter().zip(b).enumerate() {
                assert!(
                    (p - q).abs() <= q.abs() / 64.0 + 1e-4,
                    "{what}: element {i}: {p} vs {q}"
                );
            }
        };
        // The fused rounding (weights as packed, sums as stored) is bit for bit a pass over the f32
        // kernel's result on rounded operands: the same sums in the same order.
        let same_bits =
            |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
        let (xr, wr) = (rounded(&x), rounded(&w));
        let passes_fwd = rounded(&conv::forward(ISA, &xr, &wr, &g));
        assert!(same_bits(
            &conv_forward(Values::F32(&x), &w, &g, true),
            &passes_fwd
        ));
        let dyr = rounded(&blocked(g.c_out, g.oh() * g.ow(), 5));
        let passes = rounded(&conv::input_grad(ISA, &dyr, &wr, &g));
        assert!(same_bits(&conv_input_grad(&dyr, &w, &g), &passes));
        // An input its producer rounded is read in place: the same bits as rounding a copy. (Handed
        // unrounded values as `Rounded`, the tier uses them as they are, so the result moves.)
        let dw_passes = conv_weight_grad(Values::F32(&x), &dyr, &g);
        assert!(same_bits(
            &conv_forward(Values::Rounded(&xr), &w, &g, true),
            &passes_fwd
        ));
        assert!(same_bits(
            &conv_weight_grad(Values::Rounded(&xr), &dyr, &g),
            &dw_passes
        ));
        assert!(!same_bits(
            &conv_forward(Values::Rounded(&x), &w, &g, true),
            &passes_fwd
        ));
        assert!(!same_bits(
            &conv_weight_grad(Values::Rounded(&x), &dyr, &g),
            &dw_passes
        ));
        let y = conv_forward(Values::F32(&x), &w, &g, true);
        close(&y, &direct::forward(Tier::Portable, &x, &w, &g), "forward");
        assert!(y.iter().all(|v| *v == round_f32(*v)), "a rounded result");
        let dy = blocked(g.c_out, g.oh() * g.ow(), 11);
        let dy_rounded = rounded(&dy);
        close(
            &conv_input_grad(&dy_rounded, &w, &g),
            &direct::input_grad(Tier::Portable, &dy, &w, &g),
            "input gradient",
        );
        close(
            &conv_weight_grad(Values::F32(&x), &dy_rounded, &g),
            &direct::weight_grad(Tier::Portable, &x, &dy, &g),
            "weight gradient",
        );
    }
}
