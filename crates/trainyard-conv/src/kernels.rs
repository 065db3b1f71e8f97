//! The register-blocked inner loops of the direct convolution, written once over `simd::Vector` and
//! compiled per instruction set at the entry points below (`#[target_feature]` functions that inline the
//! generic code, so the vector intrinsics become single instructions there).
//!
//! Two kernels cover the three passes, as oneDNN's direct convolutions do over nChw16c:
//! - `gather`: a tile of up to RW output pixels × NB output-channel blocks held in registers while the
//!   reduction runs over input-channel blocks, kernel taps and the lanes of a block (one broadcast input
//!   value times NB weight vectors per step). Forward, and the input gradient (a gather from the output
//!   gradient with the transposed kernel); the caller groups pixels so a tile's pixels share their taps.
//! - `weight`: a tile of NI rows × NB output-channel blocks of the weight gradient, summed over a list of
//!   output pixels (an L1-sized run, across images); a row is one (kernel tap, input lane), and a tile's
//!   rows may span two taps.
//!
//! Every output element is one chain of fused multiply-adds whose order depends only on the lane count, not
//! on the tile shape or the instruction set: paths with equal lanes agree bit for bit.

use crate::cache::Budget;
#[cfg(target_arch = "x86_64")]
use crate::simd::{Avx2, Avx512};
use crate::simd::{Portable, Vector};
use crate::Isa;

/// Tile shapes per instruction set: RW pixels × NB blocks of accumulators in the gather kernel (AVX-512's
/// 32 registers hold 24 accumulators, 3 weight vectors and a broadcast; AVX2's 16 hold 12, 2 weight vectors
/// and a broadcast), NI (tap, lane) rows × NB blocks in the weight kernel (AVX2: 6 × 2, 12 FMA chains,
/// 15 registers). A tile that fills every register (AVX2's 4 × 3 did) leaves the compiler none spare: it
/// kept an accumulator on the stack, 2x slower.
trait Tiles: Vector {
    const RW: usize;
    const NB: usize;
    const WEIGHT_NI: usize;
    const WEIGHT_NB: usize;

    /// One weight tile (`weight_tile`), inlined unless the path runs it out of line.
    #[inline(always)]
    unsafe fn weight_tile<const NI: usize, const NB: usize, const CONSECUTIVE: bool>(
        p: &WeightProblem,
        ptrs: (*const f32, *const f32, *mut f32),
        rows: &[(usize, usize)],
    ) {
        weight_tile::<Self, NI, NB, CONSECUTIVE>(p, ptrs, rows)
    }
}

#[cfg(target_arch = "x86_64")]
impl Tiles for Avx512 {
    const RW: usize = 8;
    const NB: usize = 3;
    const WEIGHT_NI: usize = 8;
    const WEIGHT_NB: usize = 3;
}

#[cfg(target_arch = "x86_64")]
impl Tiles for Avx2 {
    const RW: usize = 6;
    const NB: usize = 2;
    const WEIGHT_NI: usize = 6;
    const WEIGHT_NB: usize = 2;

    /// Out of line, so the 12 accumulators, 2 gradient vectors and a broadcast (15 of 16 registers) get
    /// the registers to themselves: inlined beside the task's other shapes, LLVM kept an accumulator on
    /// the stack in some builds and not in others (ResNet-18's backward +8% with an unrelated change).
    #[inline(always)]
    unsafe fn weight_tile<const NI: usize, const NB: usize, const CONSECUTIVE: bool>(
        p: &WeightProblem,
        ptrs: (*const f32, *const f32, *mut f32),
        rows: &[(usize, usize)],
    ) {
        weight_tile_avx2_out_of_line::<NI, NB, CONSECUTIVE>(p, ptrs, rows)
    }
}

/// rustc drops `#[inline(never)]` from a `#[target_feature]` function, so the out-of-line call goes
/// through this featureless shim, into which the featured tile cannot be inlined (as `gemm`'s tiles do).
#[cfg(target_arch = "x86_64")]
#[inline(never)]
unsafe fn weight_tile_avx2_out_of_line<
    const NI: usize,
    const NB: usize,
    const CONSECUTIVE: bool,
>(
    p: &WeightProblem,
    ptrs: (*const f32, *const f32, *mut f32),
    rows: &[(usize, usize)],
) {
    weight_tile_avx2::<NI, NB, CONSECUTIVE>(p, ptrs, rows)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn weight_tile_avx2<const NI: usize, const NB: usize, const CONSECUTIVE: bool>(
    p: &WeightProblem,
    ptrs: (*const f32, *const f32, *mut f32),
    rows: &[(usize, usize)],
) {
    weight_tile::<Avx2, NI, NB, CONSECUTIVE>(p, ptrs, rows)
}

/// The shapes of the SIMD path with the same lanes: the weight gradient's task split follows the group
/// size, and with it the order its partial sums are added in, so twins must share it to agree bit for bit.
impl<const L: usize> Tiles for Portable<L> {
    const RW: usize = if L >= 16 { 8 } else { 6 };
    const NB: usize = if L >= 16 { 3 } else { 2 };
    const WEIGHT_NI: usize = if L >= 16 { 8 } else { 6 };
    const WEIGHT_NB: usize = if L >= 16 { 3 } else { 2 };
}

/// One gather problem over blocked buffers (all offsets in f32s):
/// `C[c_off(p) + o·c_n ..+L] = Σ_k Σ_(ta,tb) Σ_l A[a_off(p) + k·a_k + ta + l] · B[o·b_n + k·b_k + tb + l·L ..+L]`
/// for each pixel `p` (its offsets listed by the caller) and output block `o`.
pub(super) struct Gather<'a> {
    /// (offset in A, offset in B) of each kernel tap.
    pub taps: &'a [(usize, usize)],
    /// Reduction blocks (input-channel blocks for the forward pass).
    pub kblocks: usize,
    /// Lanes of the last reduction block that hold channels (L unless the channel count is not a
    /// multiple of L): the zero lanes past them are skipped (the CIFAR stem's 3 channels: 3 of 16).
    pub live: usize,
    pub a_k: usize,
    pub b_k: usize,
    pub b_n: usize,
    pub c_n: usize,
    /// Round each sum to bf16 as the reduction's last slice stores it (`conv::Precision::Bf16`).
    pub round: bool,
}

/// Pointers into one gather's buffers.
#[derive(Clone, Copy)]
pub(super) struct GatherData {
    pub a: *const f32,
    pub b: *const f32,
    pub c: *mut f32,
}

/// A run of output pixels the weight gradient sums over (offsets in f32s from the task's input block and
/// output-gradient block): (offset of the pixel's input at its first tap, offset of its gradient).
pub(super) struct WeightProblem<'a> {
    pub px: &'a [(usize, usize)],
    /// Distance between output-gradient channel blocks.
    pub g_plane: usize,
}

#[inline(always)]
unsafe fn gather_tile<V: Vector, const RW: usize, const NB: usize>(
    g: &Gather,
    d: GatherData,
    px: &[(usize, usize)],
    (ob, ks): (usize, std::ops::Range<usize>),
) {
    let l = V::LANES;
    let mut a_off = [0usize; RW];
    let mut c_off = [0usize; RW];
    for r in 0..RW {
        a_off[r] = px[r].0;
        c_off[r] = px[r].1 + ob * g.c_n;
    }
    let mut acc = [[V::zero(); NB]; RW];
    // A later slice of the reduction adds to what the earlier ones stored.
    if ks.start > 0 {
        for r in 0..RW {
            for j in 0..NB {
                acc[r][j] = V::load(d.c.add(c_off[r] + j * g.c_n));
            }
        }
    }
    let b = d.b.add(ob * g.b_n);
    let round = g.round && ks.end == g.kblocks;
    for k in ks {
        for &(ta, tb) in g.taps {
            let ak = d.a.add(k * g.a_k + ta);
            let bk = b.add(k * g.b_k + tb);
            let lanes = if k + 1 == g.kblocks { g.live } else { l };
            for li in 0..lanes {
                let mut w = [V::zero(); NB];
                for (j, w) in w.iter_mut().enumerate() {
                    *w = V::load(bk.add(j * g.b_n + li * l));
                }
                for r in 0..RW {
                    let x = V::splat(ak.add(a_off[r] + li));
                    for j in 0..NB {
                        acc[r][j] = acc[r][j].fma(x, w[j]);
                    }
                }
            }
        }
    }
    for r in 0..RW {
        for j in 0..NB {
            let sums = if round {
                acc[r][j].round_bf16()
            } else {
                acc[r][j]
            };
            sums.store(d.c.add(c_off[r] + j * g.c_n));
        }
    }
}

/// The pixels `px` × output blocks `blocks` of one gather, in tiles of the path's shape.
#[inline(always)]
unsafe fn gather_task<V: Tiles>(
    g: &Gather,
    d: GatherData,
    px: &[(usize, usize)],
    blocks: std::ops::Range<usize>,
) {
    let mut ob = blocks.start;
    while ob < blocks.end {
        let nb = (blocks.end - ob).min(V::NB);
        // The reduction in slices whose weights (nb blocks × taps × L × L) stay in L1 across the tiles; a
        // group with no taps reads no weights, and one slice stores its zeros once.
        let slice = match g.taps.len() {
            0 => g.kblocks.max(1),
            taps => {
                let weight_bytes = Budget::current().gather_weights();
                (weight_bytes / (nb * taps * V::LANES * V::LANES * size_of::<f32>())).max(1)
            }
        };
        for k0 in (0..g.kblocks).step_by(slice) {
            let ks = k0..(k0 + slice).min(g.kblocks);
            for tile in px.chunks(V::RW) {
                by_tile_shape!(
                    gather_tile,
                    V,
                    tile.len(),
                    nb,
                    (g, d, tile, (ob, ks.clone()))
                );
            }
        }
        ob += nb;
    }
}

/// NI rows × NB output blocks of weight-gradient accumulators, summed over a run of output pixels.
/// A row is one (kernel tap, input lane): `rows[r]` = (its input offset from `x`, its accumulator offset
/// from `acc_p`). Rows may come from different taps, so a tap's last lanes fill a tile with the next
/// tap's first ones instead of running as a narrow tile of their own (AVX2's 8 lanes in tiles of 6).
/// `CONSECUTIVE`: the rows are consecutive lanes of one tap, so their offsets are constants from the
/// first row's (what AVX-512's tiles always are: with a register per offset they ran ~5% slower).
#[inline(always)]
unsafe fn weight_tile<V: Vector, const NI: usize, const NB: usize, const CONSECUTIVE: bool>(
    p: &WeightProblem,
    (x, g, acc_p): (*const f32, *const f32, *mut f32),
    rows: &[(usize, usize)],
) {
    let l = V::LANES;
    let mut x_off = [0usize; NI];
    let mut acc_off = [0usize; NI];
    for r in 0..NI {
        (x_off[r], acc_off[r]) = match CONSECUTIVE {
            true => (rows[0].0 + r, rows[0].1 + r * l),
            false => rows[r],
        };
    }
    let mut acc = [[V::zero(); NB]; NI];
    for (row, &off) in acc.iter_mut().zip(&acc_off) {
        for (j, a) in row.iter_mut().enumerate() {
            *a = V::load(acc_p.add(off + j * l * l));
        }
    }
    for &(xo, go) in p.px {
        let xp = x.add(xo);
        let mut gv = [V::zero(); NB];
        for (j, v) in gv.iter_mut().enumerate() {
            *v = V::load(g.add(go + j * p.g_plane));
        }
        for (row, &off) in acc.iter_mut().zip(&x_off) {
            let xv = V::splat(xp.add(off));
            for j in 0..NB {
                row[j] = row[j].fma(xv, gv[j]);
            }
        }
    }
    for (row, &off) in acc.iter().zip(&acc_off) {
        for (j, a) in row.iter().enumerate() {
            a.store(acc_p.add(off + j * l * l));
        }
    }
}

/// The rows of a weight task for `nb` output blocks and one input block: each (tap, input lane) pair
/// below `live` (the lanes past it are zero padding, their gradient stays zero), as (input offset, offset
/// of its sums in `[tap][nb][L in][L out]`); `taps` are (tap index, input offset from a pixel's base).
pub(super) fn weight_rows(
    taps: &[(usize, usize)],
    nb: usize,
    live: usize,
    l: usize,
) -> Vec<(usize, usize)> {
    let live = live.min(l);
    let mut rows = Vec::with_capacity(taps.len() * live);
    for &(t, ta) in taps {
        rows.extend((0..live).map(|i| (ta + i, t * nb * l * l + i * l)));
    }
    rows
}

/// One run of pixels' contribution to the weight gradient of `nb` output blocks and one input block, every
/// row of `weight_rows`: `x` points at the input block, `g` at the first output-gradient block.
#[inline(always)]
unsafe fn weight_task<V: Tiles>(
    p: &WeightProblem,
    ptrs: (*const f32, *const f32, *mut f32),
    rows: &[(usize, usize)],
    nb: usize,
) {
    let l = V::LANES;
    // As few tiles as WEIGHT_NI allows, their rows shared out evenly: a narrow last tile has too few
    // chains to hide the FMA latency (a 1×1 kernel's 8 AVX2 lanes run as 4 + 4, not 6 + 2).
    let tiles = rows.len().div_ceil(V::WEIGHT_NI).max(1);
    let (base, wider) = (rows.len() / tiles, rows.len() % tiles);
    let mut start = 0;
    for t in 0..tiles {
        let tile = &rows[start..start + base + usize::from(t < wider)];
        start += tile.len();
        if tile.is_empty() {
            continue;
        }
        let (x0, acc0) = tile[0];
        let consecutive = (tile.iter().enumerate()).all(|(r, &row)| row == (x0 + r, acc0 + r * l));
        match consecutive {
            true => by_tile_shape!(weight_tile_consecutive, V, tile.len(), nb, (p, ptrs, tile)),
            false => by_tile_shape!(weight_tile_any, V, tile.len(), nb, (p, ptrs, tile)),
        }
    }
}

#[inline(always)]
unsafe fn weight_tile_consecutive<V: Tiles, const NI: usize, const NB: usize>(
    p: &WeightProblem,
    ptrs: (*const f32, *const f32, *mut f32),
    rows: &[(usize, usize)],
) {
    V::weight_tile::<NI, NB, true>(p, ptrs, rows)
}

#[inline(always)]
unsafe fn weight_tile_any<V: Tiles, const NI: usize, const NB: usize>(
    p: &WeightProblem,
    ptrs: (*const f32, *const f32, *mut f32),
    rows: &[(usize, usize)],
) {
    V::weight_tile::<NI, NB, false>(p, ptrs, rows)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn gather_avx512(
    g: &Gather,
    d: GatherData,
    px: &[(usize, usize)],
    b: std::ops::Range<usize>,
) {
    gather_task::<Avx512>(g, d, px, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gather_avx2(g: &Gather, d: GatherData, px: &[(usize, usize)], b: std::ops::Range<usize>) {
    gather_task::<Avx2>(g, d, px, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn weight_avx512(
    p: &WeightProblem,
    ptrs: (*const f32, *const f32, *mut f32),
    rows: &[(usize, usize)],
    nb: usize,
) {
    weight_task::<Avx512>(p, ptrs, rows, nb)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn weight_avx2(
    p: &WeightProblem,
    ptrs: (*const f32, *const f32, *mut f32),
    rows: &[(usize, usize)],
    nb: usize,
) {
    weight_task::<Avx2>(p, ptrs, rows, nb)
}

/// Runs one gather task on `isa`.
///
/// # Safety
/// `d`'s buffers hold every offset `g`, `px` and `blocks` reach; no other thread writes the C elements
/// this task writes; `isa` is supported by this CPU (`Isa::supported`).
pub(super) unsafe fn gather(
    isa: Isa,
    g: &Gather,
    d: GatherData,
    px: &[(usize, usize)],
    blocks: std::ops::Range<usize>,
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => gather_avx512(g, d, px, blocks),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => gather_avx2(g, d, px, blocks),
        Isa::Portable16 => gather_task::<Portable<16>>(g, d, px, blocks),
        _ => gather_task::<Portable<8>>(g, d, px, blocks),
    }
}

/// The largest output-block group `isa`'s weight kernel takes at once.
pub(super) fn weight_group(isa: Isa) -> usize {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => Avx512::WEIGHT_NB,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => Avx2::WEIGHT_NB,
        Isa::Portable16 => Portable::<16>::WEIGHT_NB,
        _ => Portable::<8>::WEIGHT_NB,
    }
}

/// Runs one run of pixels' weight-gradient task on `isa`.
///
/// # Safety
/// `x`, `g` and `acc` hold everything `p`, `rows` and `nb` reach (`acc`: taps × nb × L × L, `rows` from
/// `weight_rows` with this `nb`); `isa` is supported by this CPU.
pub(super) unsafe fn weight(
    isa: Isa,
    p: &WeightProblem,
    ptrs: (*const f32, *const f32, *mut f32),
    rows: &[(usize, usize)],
    nb: usize,
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => weight_avx512(p, ptrs, rows, nb),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => weight_avx2(p, ptrs, rows, nb),
        Isa::Portable16 => weight_task::<Portable<16>>(p, ptrs, rows, nb),
        _ => weight_task::<Portable<8>>(p, ptrs, rows, nb),
    }
}
