//! The three passes of a blocked direct convolution: weights are packed per pass into the blocks the
//! kernels read (`[out block][in block][tap][L in][L out]`), and work split over rayon in fixed tasks, so
//! results do not depend on scheduling.
//!
//! - forward: a gather over (input blocks × taps) for tiles of output pixels, each pixel reading only the
//!   taps inside the input (`taps`), so the input is never padded.
//! - input gradient: the same gather from the output gradient with the transposed kernel, each input pixel
//!   reading the output pixels (and taps) that read it: one kernel for every stride.
//! - weight gradient: per (chunk of output-block group × input block pairs, run of images) task, summed
//!   over the same tap groups in L1-sized runs of pixels, in a fixed order.

use crate::buffer::{assume_init, uninit};
use crate::cache::Budget;
use crate::kernels::{self, Gather, GatherData, WeightProblem};
use crate::taps::{forward_axis, input_grad_axis, pixel_groups, AxisGroup};
use crate::Isa;
use rayon::prelude::*;

/// Tasks per thread a gather is split into, so uneven tasks still balance.
const TASKS_PER_THREAD: usize = 4;

/// How a gather of `pixels` × `blocks` is cut into (pixel chunks, block chunks): each pixel chunk reads
/// every weight of its blocks and each block chunk every input of its pixels, so the split that reads
/// the least memory (chunks × bytes) is chosen among those with enough tasks for the threads. Large
/// images with few channels split by pixels; small images with many channels (weights larger than the
/// activations) by output blocks.
fn split_work(pixels: usize, blocks: usize, (weights, inputs): (usize, usize)) -> (usize, usize) {
    let want = TASKS_PER_THREAD * rayon::current_num_threads().max(1);
    (1..=blocks.min(want))
        .map(|bc| (want.div_ceil(bc).min(pixels).max(1), bc))
        .min_by_key(|&(pc, bc)| pc * weights + bc * inputs)
        .unwrap_or((1, 1))
}

/// One convolution's sizes: blocked input (N, IB, H, W, L), kernel (O, I, K, K).
#[derive(Debug, Clone, Copy)]
pub struct Geometry {
    pub n: usize,
    pub c_in: usize,
    pub c_out: usize,
    pub h: usize,
    pub w: usize,
    pub k: usize,
    pub stride: usize,
    pub padding: usize,
    pub lanes: usize,
}

impl Geometry {
    pub fn oh(&self) -> usize {
        (self.h + 2 * self.padding - self.k) / self.stride + 1
    }
    pub fn ow(&self) -> usize {
        (self.w + 2 * self.padding - self.k) / self.stride + 1
    }
    pub fn ib(&self) -> usize {
        self.c_in.div_ceil(self.lanes)
    }
    pub fn ob(&self) -> usize {
        self.c_out.div_ceil(self.lanes)
    }
    /// Channels in the last input block (the rest of its lanes are zero padding).
    fn live_in(&self) -> usize {
        self.c_in - self.ib().saturating_sub(1) * self.lanes
    }
    /// Channels in the last output block.
    fn live_out(&self) -> usize {
        self.c_out - self.ob().saturating_sub(1) * self.lanes
    }
    fn taps(&self) -> usize {
        self.k * self.k
    }
}

/// A raw pointer tasks share to write disjoint parts of one buffer.
#[derive(Clone, Copy)]
struct Shared(*mut f32);
// SAFETY: each task writes only its own elements (the callers' task splits are disjoint).
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

impl Shared {
    /// The pointer (a method, so closures capture the `Sync` wrapper rather than its field).
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// How the kernel (O, I, K, K) is laid out for a pass.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Packing {
    /// `[O block][I block][tap][L i][L o]`: forward.
    Forward,
    /// `[I block][O block][tap][L o][L i]`: the input gradient.
    Transposed,
}

/// What a convolution's numbers are: f32 throughout, or bf16 autocast's on f32 FMAs (`bf16::fma`): the
/// weights rounded to bf16 as they are packed and each sum rounded as it is stored, so neither costs a
/// pass of its own. The other operand (input or output gradient) must hold bf16 values already.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Precision {
    F32,
    Bf16,
    /// `Bf16`'s operands with the f32 sums stored as they are: for an epilogue that adds a bias before
    /// autocast's one rounding of a convolution with a bias.
    Bf16Sums,
}

fn pack(w: &[f32], g: &Geometry, how: Packing, precision: Precision) -> Vec<f32> {
    let cast = |v: f32| match precision {
        Precision::F32 => v,
        Precision::Bf16 | Precision::Bf16Sums => crate::bf16::pack::round_f32(v),
    };
    let (l, t) = (g.lanes, g.taps());
    let (outer, inner) = match how {
        Packing::Forward => (g.ob(), g.ib()),
        _ => (g.ib(), g.ob()),
    };
    let (block, plane) = (t * l * l, l * l);
    let mut out = uninit(outer * inner * block);
    // One (outer, inner) block pair per task; its source (L × L channel pairs × taps, 9 KiB for 3x3
    // kernels and 16 lanes) stays in L1. Each channel pair's taps are read as the one run they are in the
    // source and spread over the block's tap planes, so no index is computed per element.
    out.par_chunks_mut(block)
        .enumerate()
        .for_each(|(pair, dst)| {
            let (first, second) = (pair / inner, pair % inner);
            let (o_block, i_block) = match how {
                Packing::Forward => (first, second),
                Packing::Transposed => (second, first),
            };
            for o_lane in 0..l {
                for i_lane in 0..l {
                    // Forward: rows are input lanes, columns output lanes; transposed: the reverse.
                    let at = match how {
                        Packing::Forward => i_lane * l + o_lane,
                        Packing::Transposed => o_lane * l + i_lane,
                    };
                    let taps = dst[at..].iter_mut().step_by(plane);
                    let (o, i) = (o_block * l + o_lane, i_block * l + i_lane);
                    if o < g.c_out && i < g.c_in {
                        let src = &w[(o * g.c_in + i) * t..][..t];
                        for (d, v) in taps.zip(src) {
                            *d = std::mem::MaybeUninit::new(cast(*v));
                        }
                    } else {
                        taps.for_each(|d| *d = std::mem::MaybeUninit::new(0.0));
                    }
                }
            }
        });
    // SAFETY: every element of every block was written.
    unsafe { assume_init(out) }
}

/// The source of a gather: blocked (N, kblocks, H, W, L) data, unpadded, and the lanes of its last block
/// that hold channels.
struct Source<'a> {
    data: &'a [f32],
    n: usize,
    kblocks: usize,
    live: usize,
    h: usize,
    w: usize,
}

/// Gathers into a fresh (N, out blocks, OH, OW, L) buffer, each output pixel summed over the taps its row
/// and column groups say land inside `src` (`taps::AxisGroup`); `b` is packed `[out block][k block][tap]
/// [L][L]` with taps numbered `kh·k + kw`. Pixels no tap reaches are zeros.
fn gather_groups(
    isa: Isa,
    src: &Source,
    b: &[f32],
    (out_blocks, oh, ow): (usize, usize, usize),
    (rows, cols): (&[AxisGroup], &[AxisGroup]),
    k: usize,
    precision: Precision,
) -> Vec<f32> {
    let l = isa.lanes();
    let groups = pixel_groups((rows, cols), (src.w, ow), (k, l));
    // Each group's taps as the kernel reads them: (offset in A, offset in B).
    let group_taps: Vec<Vec<(usize, usize)>> = (groups.iter())
        .map(|group| {
            (group.taps.iter())
                .map(|&(t, ta)| (ta, t * l * l))
                .collect()
        })
        .collect();
    let (a_img, c_img) = (src.kblocks * src.h * src.w * l, out_blocks * oh * ow * l);
    let mut c = uninit(src.n * c_img);
    let out = Shared(c.as_mut_ptr() as *mut f32);
    // Pixels in the order (image, group, pixel of the group), cut into contiguous chunks.
    let per_img = oh * ow;
    let total = src.n * per_img;
    let split = split_work(total, out_blocks, (b.len(), src.data.len()));
    let (px_chunk, blk_chunk) = (total.div_ceil(split.0), out_blocks.div_ceil(split.1));
    (0..split.0 * split.1).into_par_iter().for_each(|task| {
        let (pt, bt) = (task / split.1, task % split.1);
        let blocks = bt * blk_chunk..out_blocks.min((bt + 1) * blk_chunk);
        let chunk = pt * px_chunk..total.min((pt + 1) * px_chunk);
        if chunk.is_empty() {
            return;
        }
        let images = chunk.start / per_img..=(chunk.end - 1) / per_img;
        let mut first = 0;
        for (group, taps) in groups.iter().zip(&group_taps) {
            let group_px = &group.px;
            // This group's pixels inside the chunk, image by image.
            let px: Vec<(usize, usize)> = (images.clone())
                .flat_map(|img| {
                    let at = img * per_img + first;
                    let lo = chunk.start.clamp(at, at + group_px.len()) - at;
                    let hi = chunk.end.clamp(at, at + group_px.len()) - at;
                    (group_px[lo..hi].iter()).map(move |&(a, c)| (img * a_img + a, img * c_img + c))
                })
                .collect();
            first += group_px.len();
            let g = Gather {
                taps,
                kblocks: src.kblocks,
                live: src.live,
                a_k: src.h * src.w * l,
                b_k: k * k * l * l,
                b_n: src.kblocks * k * k * l * l,
                c_n: oh * ow * l,
                round: precision == Precision::Bf16,
            };
            let d = GatherData {
                a: src.data.as_ptr(),
                b: b.as_ptr(),
                c: out.get(),
            };
            // A group with no taps (a strided 1×1 kernel's skipped pixels) stores zeros.
            // SAFETY: the task's pixels × blocks are its own; every tap of a group lands inside the source,
            // so offsets stay inside `a`, `b` and `c` by construction; `isa` was checked by the caller.
            unsafe { kernels::gather(isa, &g, d, &px, blocks.clone()) };
        }
    });
    // SAFETY: the tasks stored every lane of every block of every pixel.
    unsafe { assume_init(c) }
}

/// Forward: blocked `x` (N, IB, H, W, L) and kernel (O, I, K, K) → blocked (N, OB, OH, OW, L).
pub fn forward(isa: Isa, x: &[f32], w: &[f32], g: &Geometry) -> Vec<f32> {
    forward_at(isa, Precision::F32, x, w, g)
}

/// `forward` at `precision`.
pub fn forward_at(isa: Isa, precision: Precision, x: &[f32], w: &[f32], g: &Geometry) -> Vec<f32> {
    let (rows, cols) = (
        forward_axis(g.oh(), (g.h, g.k, g.stride, g.padding)),
        forward_axis(g.ow(), (g.w, g.k, g.stride, g.padding)),
    );
    let src = Source {
        data: x,
        n: g.n,
        kblocks: g.ib(),
        live: g.live_in(),
        h: g.h,
        w: g.w,
    };
    let packed = pack(w, g, Packing::Forward, precision);
    gather_groups(
        isa,
        &src,
        &packed,
        (g.ob(), g.oh(), g.ow()),
        (&rows, &cols),
        g.k,
        precision,
    )
}

/// Input gradient: blocked `dy` (N, OB, OH, OW, L) → blocked (N, IB, H, W, L). Each input pixel gathers
/// from the output pixels that read it, through the taps that reached it (for stride s, the taps of its
/// phase: a 3 × 3 stride-2 kernel's input pixels read 1, 2 or 4 taps), so every input pixel is written
/// once, with no padded or dilated copy of the gradient.
pub fn input_grad(isa: Isa, dy: &[f32], w: &[f32], g: &Geometry) -> Vec<f32> {
    input_grad_at(isa, Precision::F32, dy, w, g)
}

/// `input_grad` at `precision`.
pub fn input_grad_at(
    isa: Isa,
    precision: Precision,
    dy: &[f32],
    w: &[f32],
    g: &Geometry,
) -> Vec<f32> {
    let (rows, cols) = (
        input_grad_axis(g.h, (g.oh(), g.k, g.stride, g.padding)),
        input_grad_axis(g.w, (g.ow(), g.k, g.stride, g.padding)),
    );
    let src = Source {
        data: dy,
        n: g.n,
        kblocks: g.ob(),
        live: g.live_out(),
        h: g.oh(),
        w: g.ow(),
    };
    let packed = pack(w, g, Packing::Transposed, precision);
    let out = (g.ib(), g.h, g.w);
    gather_groups(isa, &src, &packed, out, (&rows, &cols), g.k, precision)
}

/// The pixels of a weight gradient grouped by the taps that land inside the input (as the forward pass
/// reads them: `taps`), each group's pixels listed over a run of images and cut into L1-sized runs.
struct WeightRegion {
    /// (tap index, input offset from a pixel's base).
    taps: Vec<(usize, usize)>,
    /// Per run of images, its pixel runs: (input offset of a pixel's base, gradient offset), from the
    /// block bases of image 0.
    runs: Vec<Vec<PixelRun>>,
}

type PixelRun = Vec<(usize, usize)>;

/// A weight task's rows: (input offset, offset of its sums), see `kernels::weight_rows`.
type Rows = Vec<(usize, usize)>;

/// The weight gradient's tap groups with their pixels, for runs of `per_run` images, cut into pixel runs of
/// about `run_px` (groups no tap reaches add nothing and are left out).
fn weight_regions(
    g: &Geometry,
    (per_run, runs): (usize, usize),
    run_px: usize,
) -> Vec<WeightRegion> {
    let (oh, ow, l) = (g.oh(), g.ow(), g.lanes);
    let rows = forward_axis(oh, (g.h, g.k, g.stride, g.padding));
    let cols = forward_axis(ow, (g.w, g.k, g.stride, g.padding));
    let (x_img, g_img) = (g.ib() * g.h * g.w * l, g.ob() * oh * ow * l);
    let groups = pixel_groups((&rows, &cols), (g.w, ow), (g.k, l));
    (groups.into_iter())
        .filter(|group| !group.taps.is_empty())
        .map(|group| {
            let runs = (0..runs)
                .map(|run| {
                    let images = run * per_run..g.n.min((run + 1) * per_run);
                    let px: PixelRun = images
                        .flat_map(|img| {
                            (group.px.iter()).map(move |&(x, y)| (img * x_img + x, img * g_img + y))
                        })
                        .collect();
                    // Runs of equal length, so no run is a short tail.
                    let len = px.len().div_ceil(px.len().div_ceil(run_px).max(1)).max(1);
                    px.chunks(len).map(<[_]>::to_vec).collect()
                })
                .collect();
            WeightRegion {
                taps: group.taps,
                runs,
            }
        })
        .collect()
}

/// How the weight gradient's `all_groups` × `all_inputs` (output-block group, input block) pairs are cut
/// into tasks: chunks of `groups` × `inputs` pairs, each over `runs` runs of `per_run` images.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WeightSplit {
    all_groups: usize,
    all_inputs: usize,
    groups: usize,
    inputs: usize,
    runs: usize,
    per_run: usize,
}

impl WeightSplit {
    /// The split that moves the fewest bytes: a task reads its images' input blocks once per chunk of
    /// output groups and their gradient blocks once per chunk of input blocks (a pixel run stays in L1
    /// across the chunk's pairs), and each run of images beyond the first writes and reads its own copy
    /// of the sums. Chunks' sums fit `sums_bytes` (`Budget::weight_sums`); there are enough tasks for the
    /// threads.
    fn new(g: &Geometry, group: usize, want: usize, sums_bytes: usize) -> Self {
        let f = std::mem::size_of::<f32>();
        let (groups, ib, l) = (g.ob().div_ceil(group), g.ib(), g.lanes);
        let pair_bytes = g.taps() * group * l * l * f;
        let x_bytes = g.n * ib * g.h * g.w * l * f;
        let dy_bytes = g.n * g.ob() * g.oh() * g.ow() * l * f;
        let w_bytes = groups * ib * pair_bytes;
        let fit = (sums_bytes / pair_bytes).max(1);
        let mut best = None;
        for gs in 1..=groups.min(fit) {
            let is = (fit / gs).clamp(1, ib);
            let chunks = groups.div_ceil(gs) * ib.div_ceil(is);
            let runs = want.div_ceil(chunks).clamp(1, g.n);
            let per_run = g.n.div_ceil(runs);
            let runs = g.n.div_ceil(per_run);
            let cost = x_bytes * groups.div_ceil(gs)
                + dy_bytes * ib.div_ceil(is)
                + 2 * (runs - 1) * w_bytes;
            if best.is_none_or(|(c, _)| cost < c) {
                let split = Self {
                    all_groups: groups,
                    all_inputs: ib,
                    groups: gs,
                    inputs: is,
                    runs,
                    per_run,
                };
                best = Some((cost, split));
            }
        }
        best.map(|(_, split)| split).expect("at least one group")
    }

    fn input_chunks(&self) -> usize {
        self.all_inputs.div_ceil(self.inputs)
    }

    fn chunks(&self) -> usize {
        self.all_groups.div_ceil(self.groups) * self.input_chunks()
    }

    /// The output groups and input blocks of chunk `c`.
    fn chunk(&self, c: usize) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
        let (gc, ic) = (c / self.input_chunks(), c % self.input_chunks());
        (
            gc * self.groups..self.all_groups.min((gc + 1) * self.groups),
            ic * self.inputs..self.all_inputs.min((ic + 1) * self.inputs),
        )
    }

    /// The chunk holding pair (`grp`, `ib`), and the pair's place among the chunk's pairs (group-major).
    fn pair(&self, grp: usize, ib: usize) -> (usize, usize) {
        let c = (grp / self.groups) * self.input_chunks() + ib / self.inputs;
        let inputs = self.chunk(c).1.len();
        (c, (grp % self.groups) * inputs + ib % self.inputs)
    }
}

/// Weight gradient (O, I, K, K) from blocked `x` and `dy`. Each task sums its pixels group by group (the
/// taps inside the input), in runs of pixels across images, so no padded copy of `x` is made, no product
/// reads padding, and a tile's accumulators stay in registers over a whole run rather than one small image.
/// A pixel run serves every (output group, input block) pair of the task's chunk while it is in L1.
pub fn weight_grad(isa: Isa, x: &[f32], dy: &[f32], g: &Geometry) -> Vec<f32> {
    let (oh, ow, l, k) = (g.oh(), g.ow(), g.lanes, g.k);
    if g.n == 0 || g.c_in == 0 || g.c_out == 0 {
        // No images: no gradient. No channels: no weights.
        return vec![0f32; g.c_out * g.c_in * k * k];
    }
    let group = kernels::weight_group(isa);
    let groups = g.ob().div_ceil(group);
    // Tasks: (chunk of pairs, run of images); a few per thread, so small layers with few blocks still use
    // every core. The runs' partial sums are added in run order below, so results depend on the thread
    // count and the L1 size (how many runs) but never on scheduling.
    let want = TASKS_PER_THREAD * rayon::current_num_threads().max(1);
    let budget = Budget::current();
    let split = WeightSplit::new(g, group, want, budget.weight_sums());
    let runs = split.runs;
    // A pixel reads `group` gradient vectors and about stride² input vectors.
    let px_bytes = (group + g.stride * g.stride) * l * std::mem::size_of::<f32>();
    let run_px = (budget.weight_run() / px_bytes).max(16);
    let regions = weight_regions(g, (split.per_run, runs), run_px);
    let (p_plane, x_plane) = (oh * ow * l, g.h * g.w * l);
    let pair_len = k * k * group * l * l;
    // Each region's rows for a full or last output group × a full or last input block.
    let nb_last = g.ob() - (groups - 1) * group;
    let row_sets: Vec<[Rows; 4]> = (regions.iter())
        .map(|r| {
            [
                (group, l),
                (group, g.live_in()),
                (nb_last, l),
                (nb_last, g.live_in()),
            ]
            .map(|(nb, live)| kernels::weight_rows(&r.taps, nb, live, l))
        })
        .collect();
    let partials: Vec<Vec<f32>> = (0..split.chunks() * runs)
        .into_par_iter()
        .map(|task| {
            let (chunk, run) = (task / runs, task % runs);
            let (grps, ibs) = split.chunk(chunk);
            let mut acc = vec![0f32; grps.len() * ibs.len() * pair_len];
            for (region, row_sets) in regions.iter().zip(&row_sets) {
                for px in &region.runs[run] {
                    let p = WeightProblem {
                        px,
                        g_plane: p_plane,
                    };
                    for (il, ib) in ibs.clone().enumerate() {
                        for (gl, grp) in grps.clone().enumerate() {
                            let nb = group.min(g.ob() - grp * group);
                            let last = (grp + 1 == groups, ib + 1 == g.ib());
                            let rows = &row_sets[usize::from(last.0) * 2 + usize::from(last.1)];
                            let at = (gl * ibs.len() + il) * pair_len;
                            let bases = (
                                x[ib * x_plane..].as_ptr(),
                                dy[grp * group * p_plane..].as_ptr(),
                                acc[at..].as_mut_ptr(),
                            );
                            // SAFETY: the pair's sums are taps × nb × L × L from `at` and `rows` were made
                            // for them; every tap of a group lands inside the input, so the input and
                            // gradient offsets stay in bounds.
                            unsafe { kernels::weight(isa, &p, bases, rows, nb) };
                        }
                    }
                }
            }
            acc
        })
        .collect();
    unpack_weight_sums(g, (group, pair_len), &split, &partials)
}

/// The weight gradient (O, I, K, K) from the tasks' partial sums (per chunk and run, each pair's
/// `[tap][nb][L in][L out]` at its place in the chunk), in parallel, one (output-block group, input
/// block) pair per task: its sums (a few KiB) are added in run order and transposed in L1, one output
/// block at a time, into the L rows of L inputs × K × K weights it writes per output block.
fn unpack_weight_sums(
    g: &Geometry,
    (group, pair_len): (usize, usize),
    split: &WeightSplit,
    partials: &[Vec<f32>],
) -> Vec<f32> {
    let (l, t, runs) = (g.lanes, g.taps(), split.runs);
    let mut dw = uninit(g.c_out * g.c_in * t);
    let out = Shared(dw.as_mut_ptr() as *mut f32);
    (0..split.all_groups * g.ib())
        .into_par_iter()
        .for_each(|pair| {
            let (grp, ib) = (pair / g.ib(), pair % g.ib());
            let (chunk, place) = split.pair(grp, ib);
            let at = place * pair_len;
            let parts = &partials[chunk * runs..(chunk + 1) * runs];
            let (ob, nb) = (grp * group, group.min(g.ob() - grp * group));
            let inputs = l.min(g.c_in - ib * l);
            // [output lane][input lane][tap]
            let mut rows = vec![0f32; l * l * t];
            for bo in 0..nb {
                for (run, acc) in parts.iter().enumerate() {
                    for tap in 0..t {
                        for il in 0..inputs {
                            let sums = &acc[at + ((tap * nb + bo) * l + il) * l..][..l];
                            for (ol, &v) in sums.iter().enumerate() {
                                let d = &mut rows[(ol * l + il) * t + tap];
                                *d = if run == 0 { v } else { *d + v };
                            }
                        }
                    }
                }
                for ol in 0..l.min(g.c_out - (ob + bo) * l) {
                    let o = (ob + bo) * l + ol;
                    let row = &rows[ol * l * t..][..inputs * t];
                    // SAFETY: (o, this input block) belongs to this pair alone; the row fits in `dw`.
                    unsafe {
                        let dst = out.get().add((o * g.c_in + ib * l) * t);
                        std::ptr::copy_nonoverlapping(row.as_ptr(), dst, row.len());
                    }
                }
            }
        });
    // SAFETY: the pairs cover every (output channel, input channel) and each wrote all its taps.
    unsafe { assume_init(dw) }
}
