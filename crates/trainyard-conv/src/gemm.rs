//! Single-precision matrix products `C = A·B`, batched, with any strides of A and B (a transpose is a
//! stride, never a copy): the linear layers and attention products of the Candle backend. The `gemm`
//! crate's kernels are AVX2-only on stable Rust (its AVX-512 path needs nightly), half of what an AVX-512
//! core computes per cycle; this is the same register-blocked kernel as the direct convolution's gather.
//!
//! B is packed into column blocks of L lanes (zero past n), so the kernel reads it as whole vectors: a
//! small B (a weight) once per call (`[batch][block][k][L]`), shared by the tasks; a B larger than A (an
//! activation in a weight gradient) by each task, one L1-sized panel of its own columns per slice of
//! the reduction. A is read in place through its strides, one broadcast per row and step of the
//! reduction. A tile of MR rows × NB blocks sits in registers while the reduction runs in slices whose
//! packed B stays in L1; the whole tile runs out of line, with registers of its own. Each element of C is
//! one chain of fused multiply-adds in the order of k, whatever the path or tile: every path gives the
//! same bits.

use crate::buffer::{assume_init, uninit, Aligned};
use crate::cache::Budget;
#[cfg(target_arch = "x86_64")]
use crate::simd::{Avx2, Avx512};
use crate::simd::{Portable, Vector};
use crate::Isa;
use rayon::prelude::*;

/// Where element (b, i, j) of a batch of matrices lies: `b·batch + i·row + j·col` f32s from the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strides {
    pub batch: usize,
    pub row: usize,
    pub col: usize,
}

impl Strides {
    /// A contiguous (batch, rows, cols) array.
    pub fn contiguous(rows: usize, cols: usize) -> Strides {
        Strides {
            batch: rows * cols,
            row: cols,
            col: 1,
        }
    }

    /// The same matrices transposed.
    pub fn t(self) -> Strides {
        Strides {
            batch: self.batch,
            row: self.col,
            col: self.row,
        }
    }
}

/// `batch` products of an (m × k) by a (k × n) matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    pub batch: usize,
    pub m: usize,
    pub k: usize,
    pub n: usize,
}

/// Tasks per thread, so uneven tasks still balance.
const TASKS_PER_THREAD: usize = 4;
/// The largest tile any path uses (the edge tile's scratch size).
const MAX_MR: usize = 8;
const MAX_NB: usize = 3;
/// How many steps of the reduction ahead a strided A is prefetched (8: −12-15% time on the ViT-Tiny weight
/// gradients; 4 and 16 measured no better).
const PREFETCH_STEPS: usize = 8;

/// Tile shape per path: MR rows × NB column blocks of accumulators (AVX-512's 32 registers hold 24 and
/// three B vectors and a broadcast; AVX2's 16 hold 12, two B vectors and a broadcast: 4 × 3 left no
/// register spare, and the compiler kept one accumulator on the stack, 2x slower).
trait Tile: Vector {
    const MR: usize;
    const NB: usize;
    /// A whole MR × NB tile.
    unsafe fn full(t: TileArgs);
}

/// One tile's operands: A's rows (first element, row stride, column stride), B's vectors (first vector,
/// stride between steps of the reduction, between column blocks), the steps, C (first element, row
/// stride), what the sums start from, and how far ahead a strided A is prefetched (0: not). Strides in f32s.
#[derive(Clone, Copy)]
struct TileArgs {
    a: (*const f32, usize, usize),
    b: (*const f32, usize, usize),
    ks: usize,
    c: (*mut f32, usize),
    start: Start,
    pf: usize,
}

/// The whole tile out of line, so it gets registers of its own: inlined into `task` beside every edge
/// shape, LLVM kept A's stride and B's pointers on the stack and reloaded them every step of the
/// reduction (7 extra loads per 12 FMAs on AVX2, near the load ports' limit). rustc drops
/// `#[inline(never)]` from a `#[target_feature]` function, so the call goes through a featureless shim,
/// into which the featured kernel cannot be inlined and which is itself never inlined.
macro_rules! out_of_line_tile {
    ($V:ty, $features:literal, $mr:literal, $nb:literal, $shim:ident, $featured:ident) => {
        #[cfg(target_arch = "x86_64")]
        impl Tile for $V {
            const MR: usize = $mr;
            const NB: usize = $nb;
            #[inline(always)]
            unsafe fn full(t: TileArgs) {
                $shim(t)
            }
        }

        #[cfg(target_arch = "x86_64")]
        #[inline(never)]
        unsafe fn $shim(t: TileArgs) {
            $featured(t)
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $featured(t: TileArgs) {
            tile::<$V, $mr, $nb>(t)
        }
    };
}

out_of_line_tile!(Avx512, "avx512f", 8, 3, out_of_line_avx512, full_avx512);
out_of_line_tile!(Avx2, "avx2,fma", 6, 2, out_of_line_avx2, full_avx2);

/// The shapes of the SIMD path with the same lanes (the twin it is tested against).
impl<const L: usize> Tile for Portable<L> {
    const MR: usize = if L >= 16 { 8 } else { 6 };
    const NB: usize = if L >= 16 { 3 } else { 2 };
    #[inline(always)]
    unsafe fn full(t: TileArgs) {
        by_tile_shape!(tile, Self, Self::MR, Self::NB, (t))
    }
}

/// `C = A·B` for every matrix of the batch; C comes back contiguous (batch, m, n).
///
/// # Panics
/// If `isa` is not supported by this CPU, or a stride reaches outside `a` or `b`.
pub fn matmul(isa: Isa, d: Dims, a: (&[f32], Strides), b: (&[f32], Strides)) -> Vec<f32> {
    product(isa, d, a, b, None)
}

/// `C = A·B + bias` for every matrix of the batch, `bias` (n values) added to every row: the sums start
/// from the bias, so it costs no pass of its own (`nn.Linear`'s `addmm`).
///
/// # Panics
/// As `matmul`, and if `bias` does not hold n values.
pub fn matmul_bias(
    isa: Isa,
    d: Dims,
    a: (&[f32], Strides),
    b: (&[f32], Strides),
    bias: &[f32],
) -> Vec<f32> {
    assert_eq!(bias.len(), d.n, "one bias per column");
    product(isa, d, a, b, Some(bias))
}

fn product(
    isa: Isa,
    d: Dims,
    a: (&[f32], Strides),
    b: (&[f32], Strides),
    bias: Option<&[f32]>,
) -> Vec<f32> {
    assert!(isa.supported(), "{isa:?} is not supported by this CPU");
    let len = d.batch * d.m * d.n;
    if len == 0 {
        return Vec::new();
    }
    if d.k == 0 {
        return match bias {
            Some(bias) => bias.iter().copied().cycle().take(len).collect(),
            None => vec![0.0; len],
        };
    }
    let mut c = uninit(len);
    let plan = Plan {
        bias_first: bias,
        ..Plan::F32
    };
    // SAFETY: `c` holds the batch of contiguous m × n matrices.
    unsafe { product_at(isa, d, a, b, plan, (c.as_mut_ptr() as *mut f32, d.n)) };
    // SAFETY: the first reduction slice of every tile stored every element of C (k > 0).
    unsafe { assume_init(c) }
}

/// What a product does besides `C = A·B`: where its sums start, and what its last reduction slice does
/// to them as it stores them.
#[derive(Clone, Copy)]
struct Plan<'a> {
    /// Values (n) every row's sums start from (`matmul_bias`).
    bias_first: Option<&'a [f32]>,
    /// B rounded to bf16 as it is packed.
    round_b: bool,
    /// Values (n) added to every row's sums once the reduction is done (a bf16 `addmm`'s bias).
    bias_last: Option<&'a [f32]>,
    /// Each sum rounded to bf16 as it is stored.
    round_c: bool,
}

impl Plan<'_> {
    const F32: Plan<'static> = Plan {
        bias_first: None,
        round_b: false,
        bias_last: None,
        round_c: false,
    };
}

/// bf16 autocast's product on f32 FMAs (`bf16::fma`), one matrix: `C = A·bf16(B) [+ bias]` into `c`
/// (row stride `c_row`), each element rounded to bf16 under `round`. B is rounded as it is packed (unless
/// `round_b` is false: it holds bf16s already) and the bias is added to each sum after the reduction,
/// before the rounding; A must hold bf16 values already (it is read in place, one broadcast per element).
/// Every element of C's m × n is written, none read.
///
/// # Panics
/// As `matmul`, if `d.batch` is not 1, if C's rows reach outside `c`, or if `bias` does not hold n
/// values.
pub(crate) fn matmul_bf16_into(
    isa: Isa,
    d: Dims,
    a: (&[f32], Strides),
    (b, round_b): ((&[f32], Strides), bool),
    bias: Option<&[f32]>,
    (c, c_row): (&mut [std::mem::MaybeUninit<f32>], usize),
    round: bool,
) {
    assert_eq!(d.batch, 1, "one matrix");
    if d.m == 0 || d.n == 0 {
        return;
    }
    assert!(
        c_row >= d.n && (d.m - 1) * c_row + d.n <= c.len(),
        "C's rows reach outside it"
    );
    assert!(bias.is_none_or(|v| v.len() == d.n), "one bias per column");
    let c = c.as_mut_ptr() as *mut f32;
    if d.k == 0 {
        for i in 0..d.m {
            for j in 0..d.n {
                // SAFETY: checked against `c`'s length above.
                unsafe {
                    let sum = bias.map_or(0.0, |v| v[j]);
                    *c.add(i * c_row + j) = if round { crate::bf16::round(sum) } else { sum };
                }
            }
        }
        return;
    }
    let plan = Plan {
        round_b,
        bias_last: bias,
        round_c: round,
        ..Plan::F32
    };
    // SAFETY: C's m rows of n lie in `c` (checked above).
    unsafe { product_at(isa, d, a, b, plan, (c, c_row)) }
}

/// The product into `c` (row stride `c_row`, matrices `d.m · c_row` apart), k > 0 and C not empty.
///
/// # Safety
/// `c` holds the batch's m rows of n at that stride.
unsafe fn product_at(
    isa: Isa,
    d: Dims,
    (a, sa): (&[f32], Strides),
    (b, sb): (&[f32], Strides),
    plan: Plan,
    (c, c_row): (*mut f32, usize),
) {
    assert!(isa.supported(), "{isa:?} is not supported by this CPU");
    assert!(
        reach(d.batch, (d.m, d.k), sa) < a.len(),
        "A's strides reach outside it"
    );
    assert!(
        reach(d.batch, (d.k, d.n), sb) < b.len(),
        "B's strides reach outside it"
    );
    let l = isa.lanes();
    // B larger than A (an activation in a weight gradient) is packed by each task, a reduction slice
    // of its own columns at a time, into an L1-sized panel that every row tile then reads from L1 (the
    // split gives such a product column chunks, so each element is copied about once). A small B (a
    // weight) is packed whole once and shared by the tasks.
    let local = d.n > d.m;
    let packed = (!local).then(|| pack_b(b, sb, d, l, plan.round_b));
    let (mr, nb) = tile_shape(isa);
    let blocks = d.n.div_ceil(l);
    // Padded to whole blocks, so the kernel loads full vectors.
    let padded = |v: &[f32]| {
        let mut p = v.to_vec();
        p.resize(blocks * l, 0.0);
        p
    };
    let (bias_first, bias_last) = (plan.bias_first.map(padded), plan.bias_last.map(padded));
    let (row_tiles, groups) = (d.m.div_ceil(mr), blocks.div_ceil(nb));
    let want = TASKS_PER_THREAD * rayon::current_num_threads().max(1);
    let (row_chunks, group_chunks) = split(
        want.div_ceil(d.batch),
        (row_tiles, groups),
        (d.m * d.k, d.k * d.n),
    );
    let (rows_per, groups_per) = (
        row_tiles.div_ceil(row_chunks),
        groups.div_ceil(group_chunks),
    );
    let out = SharedOut(c);
    (0..d.batch * row_chunks * group_chunks)
        .into_par_iter()
        .for_each(|task| {
            let bi = task / (row_chunks * group_chunks);
            let (rt, gt) = ((task / group_chunks) % row_chunks, task % group_chunks);
            let rows = (rt * rows_per * mr).min(d.m)..((rt + 1) * rows_per * mr).min(d.m);
            let cols = (gt * groups_per * nb).min(blocks)..((gt + 1) * groups_per * nb).min(blocks);
            let job = Job {
                d,
                a: a[bi * sa.batch..].as_ptr(),
                sa,
                b: match &packed {
                    None => BSource::Strided(b[bi * sb.batch..].as_ptr(), sb),
                    Some(p) => {
                        BSource::Packed(p.as_ptr().wrapping_add(bi * d.n.div_ceil(l) * d.k * l))
                    }
                },
                c: out.get().wrapping_add(bi * d.m * c_row),
                c_row,
                bias: bias_first.as_ref().map(|v| v.as_ptr()),
                round_b: plan.round_b,
                end: End {
                    bias: bias_last.as_ref().map_or(std::ptr::null(), |v| v.as_ptr()),
                    round: plan.round_c,
                },
            };
            // SAFETY: the task's rows × column blocks of batch `bi` are its own; `reach` bounded A and
            // a strided B, the packed B holds every block × k × L; `isa` was checked above.
            unsafe { run(isa, &job, rows, cols) };
        });
}

/// How one matrix's (row tiles × column groups) is cut into (row chunks, group chunks) for about `want`
/// tasks: each row chunk reads all of B and each group chunk all of A, so the cut that reads the least
/// (chunks × sizes) wins: rows when B is a small weight (forward, input gradient), column groups when B is
/// a large activation (the weight gradient `dyᵀ·x`).
fn split(
    want: usize,
    (row_tiles, groups): (usize, usize),
    (a_len, b_len): (usize, usize),
) -> (usize, usize) {
    (1..=groups.min(want))
        .map(|gc| (want.div_ceil(gc).min(row_tiles).max(1), gc))
        .min_by_key(|&(rc, gc)| rc * b_len + gc * a_len)
        .unwrap_or((1, 1))
}

/// The largest offset a batch of (rows × cols) matrices with strides `s` reaches.
fn reach(batch: usize, (rows, cols): (usize, usize), s: Strides) -> usize {
    (batch - 1) * s.batch + (rows - 1) * s.row + (cols - 1) * s.col
}

fn tile_shape(isa: Isa) -> (usize, usize) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => (Avx512::MR, Avx512::NB),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => (Avx2::MR, Avx2::NB),
        Isa::Portable16 => (Portable::<16>::MR, Portable::<16>::NB),
        _ => (Portable::<8>::MR, Portable::<8>::NB),
    }
}

/// B's value as packed: rounded to bf16 under `ROUND`.
#[inline(always)]
fn packed_value<const ROUND: bool>(v: f32) -> f32 {
    if ROUND {
        crate::bf16::pack::round_f32(v)
    } else {
        v
    }
}

/// B as `[batch][column block][k][L]`, zero past column n, rounded to bf16 under `round`.
fn pack_b(b: &[f32], sb: Strides, d: Dims, l: usize, round: bool) -> Aligned {
    // The choice made once, outside the copy loops.
    if round {
        pack_b_as::<true>(b, sb, d, l)
    } else {
        pack_b_as::<false>(b, sb, d, l)
    }
}

fn pack_b_as<const ROUND: bool>(b: &[f32], sb: Strides, d: Dims, l: usize) -> Aligned {
    let blocks = d.n.div_ceil(l);
    let panel = d.k * l;
    let mut packed = Aligned::uninit(d.batch * blocks * panel);
    let out = packed.as_uninit_mut();
    out.par_chunks_mut(panel).enumerate().for_each(|(i, dst)| {
        let (bi, j0) = (i / blocks, (i % blocks) * l);
        let width = l.min(d.n - j0);
        let src = &b[bi * sb.batch + j0 * sb.col..];
        if sb.row == 1 && sb.col != 1 {
            // B read transposed (a linear layer's weight): each lane's column is contiguous in k. Read
            // 16 steps of k of every lane (one line each) and write them into the 16 rows of the panel
            // they fill, so the rows are whole while in L1: lane by lane down all of k, a 768-deep
            // panel (48 KiB) was evicted before the next lane came back to its lines.
            for k0 in (0..d.k).step_by(16) {
                let ks = 16.min(d.k - k0);
                let rows = &mut dst[k0 * l..(k0 + ks) * l];
                for lane in 0..l {
                    if lane < width {
                        let col = &src[lane * sb.col + k0..][..ks];
                        for (kk, &v) in col.iter().enumerate() {
                            rows[kk * l + lane].write(packed_value::<ROUND>(v));
                        }
                    } else {
                        for kk in 0..ks {
                            rows[kk * l + lane].write(0.0);
                        }
                    }
                }
            }
            return;
        }
        if sb.col == 1 {
            for (kk, row) in dst.chunks_mut(l).enumerate() {
                let (valid, pad) = row.split_at_mut(width);
                for (v, &x) in valid.iter_mut().zip(&src[kk * sb.row..][..width]) {
                    v.write(packed_value::<ROUND>(x));
                }
                for v in pad {
                    v.write(0.0);
                }
            }
            return;
        }
        for (kk, row) in dst.chunks_mut(l).enumerate() {
            for (lane, v) in row.iter_mut().enumerate() {
                v.write(if lane < width {
                    packed_value::<ROUND>(src[kk * sb.row + lane * sb.col])
                } else {
                    0.0
                });
            }
        }
    });
    // Every lane of every panel was written.
    packed
}

/// The output pointer shared by the tasks, each writing its own tiles.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);
// SAFETY: tasks write disjoint tiles of the buffer, which outlives them.
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}
impl SharedOut {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Where a task finds B.
#[derive(Clone, Copy)]
enum BSource {
    /// Packed whole by `pack_b`: `[column block][k][L]`.
    Packed(*const f32),
    /// In place with its strides: the task packs a panel of its own columns per reduction slice.
    Strided(*const f32, Strides),
}

/// One matrix of the batch: A at its first element, B at its first element or block, C at its first
/// element.
struct Job {
    d: Dims,
    a: *const f32,
    sa: Strides,
    b: BSource,
    c: *mut f32,
    /// Between C's rows.
    c_row: usize,
    /// The bias padded to whole blocks, where every row's sums start.
    bias: Option<*const f32>,
    /// B rounded to bf16 as it is packed (a strided B's panels).
    round_b: bool,
    /// What the last reduction slice does as it stores.
    end: End,
}

/// What is done to a tile's sums once the last slice of the reduction has stored them (`finish`): the
/// values at `bias` (padded to whole blocks; null: none) added, then each rounded to bf16 under `round`.
#[derive(Clone, Copy)]
struct End {
    bias: *const f32,
    round: bool,
}

impl End {
    /// Sums stored as they are (every slice but the last, and f32 products).
    const NONE: End = End {
        bias: std::ptr::null(),
        round: false,
    };

    /// The epilogue of the tile whose first column block is `ob` (L lanes each).
    fn at_block(self, ob: usize, l: usize) -> End {
        let bias = if self.bias.is_null() {
            self.bias
        } else {
            self.bias.wrapping_add(ob * l)
        };
        End { bias, ..self }
    }
}

/// What a tile's accumulators start from.
#[derive(Clone, Copy)]
enum Start {
    Zero,
    /// C's values (a later slice of the reduction).
    Load,
    /// The bias vectors of the tile's blocks.
    Bias(*const f32),
}

/// An MR × NB tile of C: `c[r][j·L..] (+)= Σ_kk a[r·a_row + kk·a_col] · b[j·b_blk + kk·b_k ..+L]`,
/// with A's line `pf` steps ahead prefetched (0: none).
#[inline(always)]
unsafe fn tile<V: Vector, const MR: usize, const NB: usize>(t: TileArgs) {
    let TileArgs {
        a: (a, a_row, a_col),
        b: (b, b_k, b_blk),
        ks,
        c: (c, c_row),
        start,
        pf,
    } = t;
    let l = V::LANES;
    #[cfg(not(target_arch = "x86_64"))]
    let _ = pf; // the prefetch below is x86-only
    let mut acc = [[V::zero(); NB]; MR];
    match start {
        Start::Zero => {}
        Start::Load => {
            for (r, row) in acc.iter_mut().enumerate() {
                for (j, v) in row.iter_mut().enumerate() {
                    *v = V::load(c.add(r * c_row + j * l));
                }
            }
        }
        Start::Bias(p) => {
            for row in acc.iter_mut() {
                for (j, v) in row.iter_mut().enumerate() {
                    *v = V::load(p.add(j * l));
                }
            }
        }
    }
    for kk in 0..ks {
        let bk = b.add(kk * b_k);
        let mut w = [V::zero(); NB];
        for (j, v) in w.iter_mut().enumerate() {
            *v = V::load(bk.add(j * b_blk));
        }
        let ak = a.add(kk * a_col);
        #[cfg(target_arch = "x86_64")]
        if pf > 0 {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                ak.wrapping_add(pf * a_col) as *const i8,
            );
        }
        for (r, row) in acc.iter_mut().enumerate() {
            let x = V::splat(ak.add(r * a_row));
            for j in 0..NB {
                row[j] = row[j].fma(x, w[j]);
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        for (j, v) in row.iter().enumerate() {
            v.store(c.add(r * c_row + j * l));
        }
    }
}

/// A tile's `rows × width` sums just stored at `c` (row stride `c_row`), finished as `end` says: its bias
/// added, then each rounded. A pass of its own over values still in L1: in the tile's store, the rounding
/// kept LLVM from holding the accumulators in registers (2.2x slower).
#[inline(always)]
unsafe fn finish<V: Vector>(c: *mut f32, c_row: usize, (rows, width): (usize, usize), end: End) {
    let l = V::LANES;
    let whole = width / l * l;
    for r in 0..rows {
        let row = c.add(r * c_row);
        for j in (0..whole).step_by(l) {
            let mut v = V::load(row.add(j));
            if !end.bias.is_null() {
                v = v.add(V::load(end.bias.add(j)));
            }
            if end.round {
                v = v.round_bf16();
            }
            v.store(row.add(j));
        }
        for j in whole..width {
            let mut v = *row.add(j);
            if !end.bias.is_null() {
                v += *end.bias.add(j);
            }
            if end.round {
                v = crate::bf16::pack::round_f32(v);
            }
            *row.add(j) = v;
        }
    }
}

/// Rows `rows` × column blocks `cols` of one matrix, in tiles of the path's shape. Tiles that reach past
/// column n run on a scratch tile and copy their valid part.
#[inline(always)]
unsafe fn task<V: Tile>(job: &Job, rows: std::ops::Range<usize>, cols: std::ops::Range<usize>) {
    let (l, d) = (V::LANES, job.d);
    // Packed-B bytes one reduction slice keeps hot across the row tiles (`Budget::gemm_panel`).
    let panel_bytes = Budget::current().gemm_panel();
    let slice = (panel_bytes / (V::NB * l * std::mem::size_of::<f32>())).max(1);
    let mut scratch = [0f32; MAX_MR * MAX_NB * 16];
    // A read down its columns (a weight gradient's `dyᵀ`) steps a whole row of memory per step of the
    // reduction, beyond what the hardware prefetcher follows: fetch it ahead.
    let pf = if job.sa.col >= 16 { PREFETCH_STEPS } else { 0 };
    let mut panel = Aligned::uninit(match job.b {
        BSource::Strided(..) => slice * V::NB * l,
        BSource::Packed(_) => 0,
    });
    for k0 in (0..d.k).step_by(slice) {
        let ks = slice.min(d.k - k0);
        let start = |ob: usize| match (k0, job.bias) {
            (0, Some(p)) => Start::Bias(p.add(ob * l)),
            (0, None) => Start::Zero,
            _ => Start::Load,
        };
        let last = k0 + ks == d.k;
        let mut ob = cols.start;
        while ob < cols.end {
            let nb = (cols.end - ob).min(V::NB);
            let width = ((ob + nb) * l).min(d.n) - ob * l;
            let b = match job.b {
                BSource::Strided(raw, sb) => {
                    pack_panel(
                        raw,
                        (sb, job.round_b),
                        (k0, ks),
                        (ob * l, width),
                        nb * l,
                        panel.as_mut_ptr(),
                    );
                    (panel.as_ptr(), nb * l, l)
                }
                BSource::Packed(p) => (p.add((ob * d.k + k0) * l), l, d.k * l),
            };
            let start = start(ob);
            let end = if last {
                job.end.at_block(ob, l)
            } else {
                End::NONE
            };
            for r0 in rows.clone().step_by(V::MR) {
                let mr = V::MR.min(rows.end - r0);
                let c = job.c.add(r0 * job.c_row + ob * l);
                let args = TileArgs {
                    a: (
                        job.a.add(r0 * job.sa.row + k0 * job.sa.col),
                        job.sa.row,
                        job.sa.col,
                    ),
                    b,
                    ks,
                    c: (c, job.c_row),
                    start,
                    pf,
                };
                let finished = end.bias.is_null() && !end.round;
                if width == nb * l && mr == V::MR && nb == V::NB {
                    V::full(args);
                    if !finished {
                        finish::<V>(c, job.c_row, (mr, width), end);
                    }
                    continue;
                }
                if width == nb * l {
                    by_tile_shape!(tile, V, mr, nb, (args));
                    if !finished {
                        finish::<V>(c, job.c_row, (mr, width), end);
                    }
                    continue;
                }
                let pitch = nb * l;
                for r in 0..mr {
                    for j in 0..width {
                        // A first slice starts from zero or the bias, not from the scratch.
                        scratch[r * pitch + j] = if k0 > 0 {
                            *c.add(r * job.c_row + j)
                        } else {
                            0.0
                        };
                    }
                }
                let args = TileArgs {
                    c: (scratch.as_mut_ptr(), pitch),
                    ..args
                };
                by_tile_shape!(tile, V, mr, nb, (args));
                for r in 0..mr {
                    for j in 0..width {
                        *c.add(r * job.c_row + j) = scratch[r * pitch + j];
                    }
                }
                if !finished {
                    finish::<V>(c, job.c_row, (mr, width), end);
                }
            }
            ob += nb;
        }
    }
}

/// B's rows `k0..k0 + ks` and columns `j0..j0 + width` copied into `dst` as `[kk][pitch]`, zero past
/// `width`, rounded to bf16 under `round`: one panel of a task's column blocks, read whole vectors at a
/// time by the tiles.
///
/// # Safety
/// `b` with strides `sb` holds every element of those rows and columns; `dst` holds `ks × pitch` f32s.
unsafe fn pack_panel(
    b: *const f32,
    (sb, round): (Strides, bool),
    (k0, ks): (usize, usize),
    (j0, width): (usize, usize),
    pitch: usize,
    dst: *mut f32,
) {
    // The choice made once, outside the copy loops.
    if round {
        pack_panel_as::<true>(b, sb, (k0, ks), (j0, width), pitch, dst)
    } else {
        pack_panel_as::<false>(b, sb, (k0, ks), (j0, width), pitch, dst)
    }
}

/// `pack_panel`, rounding under `ROUND`.
///
/// # Safety
/// As `pack_panel`.
#[inline(always)]
unsafe fn pack_panel_as<const ROUND: bool>(
    b: *const f32,
    sb: Strides,
    (k0, ks): (usize, usize),
    (j0, width): (usize, usize),
    pitch: usize,
    dst: *mut f32,
) {
    let dst = std::slice::from_raw_parts_mut(dst.cast::<std::mem::MaybeUninit<f32>>(), ks * pitch);
    if sb.col == 1 {
        for (kk, row) in dst.chunks_exact_mut(pitch).enumerate() {
            let src = std::slice::from_raw_parts(b.add((k0 + kk) * sb.row + j0), width);
            for (v, &x) in row.iter_mut().zip(src) {
                v.write(packed_value::<ROUND>(x));
            }
            for v in &mut row[width..] {
                v.write(0.0);
            }
        }
        return;
    }
    // Columns read one at a time, in order along k when B is a transposed weight (`sb.row == 1`).
    for lane in 0..width {
        let src = b.add(k0 * sb.row + (j0 + lane) * sb.col);
        for kk in 0..ks {
            dst[kk * pitch + lane].write(packed_value::<ROUND>(*src.add(kk * sb.row)));
        }
    }
    for row in dst.chunks_exact_mut(pitch) {
        for v in &mut row[width..] {
            v.write(0.0);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn task_avx512(job: &Job, rows: std::ops::Range<usize>, cols: std::ops::Range<usize>) {
    task::<Avx512>(job, rows, cols)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn task_avx2(job: &Job, rows: std::ops::Range<usize>, cols: std::ops::Range<usize>) {
    task::<Avx2>(job, rows, cols)
}

/// # Safety
/// `job`'s pointers hold everything `rows` and `cols` reach; no other thread writes those tiles of C;
/// `isa` is supported by this CPU.
unsafe fn run(isa: Isa, job: &Job, rows: std::ops::Range<usize>, cols: std::ops::Range<usize>) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => task_avx512(job, rows, cols),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => task_avx2(job, rows, cols),
        Isa::Portable16 => task::<Portable<16>>(job, rows, cols),
        _ => task::<Portable<8>>(job, rows, cols),
    }
}
