//! The register-blocked inner loops of the direct convolution, written once over `simd::Vector` and
//! compiled per instruction set at the entry points below (`#[target_feature]` functions that inline the
//! generic code, so the vector intrinsics become single instructions there).
//!
//! Two kernels cover the three passes, as oneDNN's direct convolutions do over nChw16c:
//! - `gather`: a tile of up to RW output pixels × NB output-channel blocks held in registers while the
//!   reduction runs over input-channel blocks, kernel taps and the lanes of a block (one broadcast input
//!   value times NB weight vectors per step). Forward, and the input gradient of stride-1 convolutions (a
//!   forward convolution of the padded output gradient with the flipped, transposed kernel); with one tap
//!   per call and `accumulate`, the input gradient of strided ones (each output pixel scatters into the
//!   input pixels it read).
//! - `weight`: a tile of NI input lanes × NB output-channel blocks of one kernel tap's weight gradient, summed
//!   over every output pixel of an image.
//!
//! Every output element is one chain of fused multiply-adds whose order depends only on the lane count, not
//! on the tile shape or the instruction set: paths with equal lanes agree bit for bit.

#[cfg(target_arch = "x86_64")]
use crate::simd::{Avx2, Avx512};
use crate::simd::{Portable, Vector};
use crate::Isa;

/// Tile shapes per instruction set: RW pixels × NB blocks of accumulators in the gather kernel (AVX-512's
/// 32 registers hold 24 accumulators, 3 weight vectors and a broadcast; AVX2's 16 hold 12, 2 weight vectors
/// and a broadcast), NI lanes × NB blocks in the weight kernel. A tile that fills every register (AVX2's
/// 4 × 3 did) leaves the compiler none spare: it kept an accumulator on the stack, 2x slower.
trait Tiles: Vector {
    const RW: usize;
    const NB: usize;
    const WEIGHT_NI: usize;
    const WEIGHT_NB: usize;
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
    const WEIGHT_NI: usize = 4;
    const WEIGHT_NB: usize = 2;
}

/// The shapes of the SIMD path with the same lanes: the weight gradient's task split follows the group
/// size, and with it the order its partial sums are added in, so twins must share it to agree bit for bit.
impl<const L: usize> Tiles for Portable<L> {
    const RW: usize = if L >= 16 { 8 } else { 6 };
    const NB: usize = if L >= 16 { 3 } else { 2 };
    const WEIGHT_NI: usize = if L >= 16 { 8 } else { 4 };
    const WEIGHT_NB: usize = if L >= 16 { 3 } else { 2 };
}

/// Weight bytes a gather keeps hot across its pixel tiles: most of a 48 KiB L1, the rest for inputs.
const L1_WEIGHT_BYTES: usize = 32 * 1024;

/// The largest tile dimensions any path uses (array sizes; unused entries are optimised away).
const MAX_WEIGHT_NI: usize = 8;

/// One gather problem over blocked buffers (all offsets in f32s):
/// `C[c_off(p) + o·c_n ..+L] (+)= Σ_k Σ_(ta,tb) Σ_l A[a_off(p) + k·a_k + ta + l] · B[o·b_n + k·b_k + tb + l·L ..+L]`
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
    /// Add into C (the scatter form) rather than overwrite it.
    pub accumulate: bool,
}

/// Pointers into one gather's buffers.
#[derive(Clone, Copy)]
pub(super) struct GatherData {
    pub a: *const f32,
    pub b: *const f32,
    pub c: *mut f32,
}

/// One image's weight-gradient reduction: `x` the padded input, `g` the output gradient (offsets in f32s).
pub(super) struct WeightProblem {
    pub oh: usize,
    pub ow: usize,
    /// Input pitch of one output row (stride × padded width × L) and of one output pixel (stride × L).
    pub x_row: usize,
    pub x_px: usize,
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
    if g.accumulate || ks.start > 0 {
        for r in 0..RW {
            for j in 0..NB {
                acc[r][j] = V::load(d.c.add(c_off[r] + j * g.c_n));
            }
        }
    }
    let b = d.b.add(ob * g.b_n);
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
            acc[r][j].store(d.c.add(c_off[r] + j * g.c_n));
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
        // The reduction in slices whose weights (nb blocks × taps × L × L) stay in L1 across the tiles.
        let per_k = nb * g.taps.len() * V::LANES * V::LANES * std::mem::size_of::<f32>();
        let slice = (L1_WEIGHT_BYTES / per_k).max(1);
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

#[inline(always)]
unsafe fn weight_tile<V: Vector, const NB: usize>(
    p: &WeightProblem,
    (x, g, acc_p): (*const f32, *const f32, *mut f32),
    ni: usize,
) {
    let l = V::LANES;
    let mut acc = [[V::zero(); NB]; MAX_WEIGHT_NI];
    for (i, row) in acc.iter_mut().enumerate().take(ni) {
        for (j, a) in row.iter_mut().enumerate() {
            *a = V::load(acc_p.add(j * l * l + i * l));
        }
    }
    for oy in 0..p.oh {
        let xr = x.add(oy * p.x_row);
        let gr = g.add(oy * p.ow * l);
        for ox in 0..p.ow {
            let xp = xr.add(ox * p.x_px);
            let mut gv = [V::zero(); NB];
            for (j, v) in gv.iter_mut().enumerate() {
                *v = V::load(gr.add(j * p.g_plane + ox * l));
            }
            for (i, row) in acc.iter_mut().enumerate().take(ni) {
                let xv = V::splat(xp.add(i));
                for j in 0..NB {
                    row[j] = row[j].fma(xv, gv[j]);
                }
            }
        }
    }
    for (i, row) in acc.iter().enumerate().take(ni) {
        for (j, a) in row.iter().enumerate() {
            a.store(acc_p.add(j * l * l + i * l));
        }
    }
}

/// One image's contribution to the weight gradient of `nb` output blocks and one input block (its first
/// `live` lanes), every tap:
/// `acc` is `[tap][nb][L in][L out]`; `x` points at the image's input block (padded), `g` at its first
/// output-gradient block; `taps` are the input offsets of the kernel taps.
#[inline(always)]
unsafe fn weight_task<V: Tiles>(
    p: &WeightProblem,
    (x, g, acc): (*const f32, *const f32, *mut f32),
    taps: &[usize],
    (nb, live): (usize, usize),
) {
    let l = V::LANES;
    let ni = V::WEIGHT_NI.min(MAX_WEIGHT_NI);
    for (t, &ta) in taps.iter().enumerate() {
        // Input lanes past `live` are zero padding: their rows of the gradient stay zero.
        for i0 in (0..live.min(l)).step_by(ni) {
            let args = (x.add(ta + i0), g, acc.add(t * nb * l * l + i0 * l));
            match nb {
                1 => weight_tile::<V, 1>(p, args, ni),
                2 => weight_tile::<V, 2>(p, args, ni),
                3 => weight_tile::<V, 3>(p, args, ni),
                _ => weight_tile::<V, 4>(p, args, ni),
            }
        }
    }
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
    taps: &[usize],
    blocks_live: (usize, usize),
) {
    weight_task::<Avx512>(p, ptrs, taps, blocks_live)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn weight_avx2(
    p: &WeightProblem,
    ptrs: (*const f32, *const f32, *mut f32),
    taps: &[usize],
    blocks_live: (usize, usize),
) {
    weight_task::<Avx2>(p, ptrs, taps, blocks_live)
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

/// Runs one image's weight-gradient task on `isa`.
///
/// # Safety
/// `x`, `g` and `acc` hold everything `p`, `taps` and `nb` reach (`acc`: taps × nb × L × L); `isa` is
/// supported by this CPU. `blocks_live` is (output blocks, live input lanes).
pub(super) unsafe fn weight(
    isa: Isa,
    p: &WeightProblem,
    ptrs: (*const f32, *const f32, *mut f32),
    taps: &[usize],
    blocks_live: (usize, usize),
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => weight_avx512(p, ptrs, taps, blocks_live),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => weight_avx2(p, ptrs, taps, blocks_live),
        Isa::Portable16 => weight_task::<Portable<16>>(p, ptrs, taps, blocks_live),
        _ => weight_task::<Portable<8>>(p, ptrs, taps, blocks_live),
    }
}
