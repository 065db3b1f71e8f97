//! The three passes of a blocked direct convolution: weights are packed
//! per pass into the blocks the kernels read (`[out block][in block][tap][L in][L out]`), inputs padded once
//! per pass, and work split over rayon in fixed tasks, so results do not depend on scheduling.
//!
//! - forward: a gather over (input blocks × taps) for tiles of output pixels.
//! - input gradient: stride 1, a forward convolution of the output gradient padded by K − 1 − P with the
//!   flipped, transposed kernel; strided, each output pixel's gradient scattered into the input pixels it
//!   read, one tap at a time (no wasted products on the zeros a dilated gradient would hold).
//! - weight gradient: per (output-block group, input block) task, summed image by image in a fixed order.

use crate::buffer::{assume_init, uninit};
use crate::kernels::{self, Gather, GatherData, WeightProblem};
use crate::layout::{crop, pad};
use crate::Isa;
use rayon::prelude::*;

/// Tasks per thread a gather is split into, so uneven tasks still balance.
const TASKS_PER_THREAD: usize = 4;

/// Gradient bytes a strided input-gradient task keeps hot across its taps: half a typical 1-2 MiB L2.
const L2_OUTPUT_BYTES: usize = 512 * 1024;

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
    /// `[I block][O block][tap][L o][L i]`, taps flipped: the stride-1 input gradient.
    TransposedFlipped,
    /// `[I block][O block][tap][L o][L i]`: the strided input gradient's scatter.
    Transposed,
}

fn pack(w: &[f32], g: &Geometry, how: Packing) -> Vec<f32> {
    let (l, t) = (g.lanes, g.taps());
    let (outer, inner) = match how {
        Packing::Forward => (g.ob(), g.ib()),
        _ => (g.ib(), g.ob()),
    };
    let block = t * l * l;
    let mut out = uninit(outer * inner * block);
    // One (outer, inner) block pair per task, written in order; its source (L × L channel pairs × taps,
    // 9 KiB for 3x3 kernels and 16 lanes) stays in L1 while it is read across.
    out.par_chunks_mut(block)
        .enumerate()
        .for_each(|(pair, dst)| {
            let (ob, ib) = (pair / inner, pair % inner);
            for tap in 0..t {
                let src_tap = match how {
                    Packing::TransposedFlipped => t - 1 - tap,
                    _ => tap,
                };
                for row in 0..l {
                    for col in 0..l {
                        // Forward: rows are input lanes, columns output lanes; transposed: the reverse.
                        let (o, i) = match how {
                            Packing::Forward => (ob * l + col, ib * l + row),
                            _ => (ib * l + row, ob * l + col),
                        };
                        let v = if o < g.c_out && i < g.c_in {
                            w[(o * g.c_in + i) * t + src_tap]
                        } else {
                            0.0
                        };
                        dst[(tap * l + row) * l + col] = std::mem::MaybeUninit::new(v);
                    }
                }
            }
        });
    // SAFETY: every element of every block was written.
    unsafe { assume_init(out) }
}

/// Gathers into a fresh (N, out blocks, OH, OW, L) buffer: `a` is (N, kblocks, HP, WP, L), already padded.
fn gather_all(
    isa: Isa,
    (a, b): (&[f32], &[f32]),
    (n, (kblocks, live), hp, wp): (usize, (usize, usize), usize, usize),
    (out_blocks, oh, ow): (usize, usize, usize),
    (k, stride): (usize, usize),
) -> Vec<f32> {
    let l = isa.lanes();
    let taps: Vec<(usize, usize)> = (0..k * k)
        .map(|t| (((t / k) * wp + t % k) * l, t * l * l))
        .collect();
    let g = Gather {
        taps: &taps,
        kblocks,
        live,
        a_k: hp * wp * l,
        b_k: k * k * l * l,
        b_n: kblocks * k * k * l * l,
        c_n: oh * ow * l,
        accumulate: false,
    };
    let (a_img, c_img) = (kblocks * hp * wp * l, out_blocks * oh * ow * l);
    let mut c = uninit(n * c_img);
    let out = Shared(c.as_mut_ptr() as *mut f32);
    let total = n * oh * ow;
    let split = split_work(total, out_blocks, (b.len(), a.len()));
    let (px_chunk, blk_chunk) = (total.div_ceil(split.0), out_blocks.div_ceil(split.1));
    (0..split.0 * split.1).into_par_iter().for_each(|task| {
        let (pt, bt) = (task / split.1, task % split.1);
        let blocks = bt * blk_chunk..out_blocks.min((bt + 1) * blk_chunk);
        let px: Vec<(usize, usize)> = (pt * px_chunk..total.min((pt + 1) * px_chunk))
            .map(|p| {
                let (img, y, x) = (p / (oh * ow), (p / ow) % oh, p % ow);
                (
                    img * a_img + (y * stride * wp + x * stride) * l,
                    img * c_img + (y * ow + x) * l,
                )
            })
            .collect();
        let d = GatherData {
            a: a.as_ptr(),
            b: b.as_ptr(),
            c: out.get(),
        };
        // SAFETY: the task's pixels × blocks are its own; offsets stay inside `a`, `b` and `c` by construction;
        // `isa` was checked by the caller.
        unsafe { kernels::gather(isa, &g, d, &px, blocks) };
    });
    // SAFETY: the tasks stored every lane of every block of every pixel.
    unsafe { assume_init(c) }
}

/// Forward: blocked `x` (N, IB, H, W, L) and kernel (O, I, K, K) → blocked (N, OB, OH, OW, L).
pub fn forward(isa: Isa, x: &[f32], w: &[f32], g: &Geometry) -> Vec<f32> {
    let (hp, wp) = (g.h + 2 * g.padding, g.w + 2 * g.padding);
    let padded;
    let xp = if g.padding == 0 {
        x
    } else {
        padded = pad(x, (g.n, g.ib(), g.h, g.w, g.lanes), g.padding);
        &padded
    };
    let packed = pack(w, g, Packing::Forward);
    gather_all(
        isa,
        (xp, &packed),
        (g.n, (g.ib(), g.live_in()), hp, wp),
        (g.ob(), g.oh(), g.ow()),
        (g.k, g.stride),
    )
}

/// Input gradient: blocked `dy` (N, OB, OH, OW, L) → blocked (N, IB, H, W, L).
pub fn input_grad(isa: Isa, dy: &[f32], w: &[f32], g: &Geometry) -> Vec<f32> {
    let (oh, ow, l) = (g.oh(), g.ow(), g.lanes);
    if g.stride == 1 && g.padding < g.k {
        let p = g.k - 1 - g.padding;
        let dyp = pad(dy, (g.n, g.ob(), oh, ow, l), p);
        let packed = pack(w, g, Packing::TransposedFlipped);
        return gather_all(
            isa,
            (&dyp, &packed),
            (g.n, (g.ob(), g.live_out()), oh + 2 * p, ow + 2 * p),
            (g.ib(), g.h, g.w),
            (g.k, 1),
        );
    }
    scatter_input_grad(isa, dy, w, g)
}

/// The strided input gradient: each output pixel's gradient added into the (padded) input pixels it read,
/// one tap at a time, one task per run of images. A run's pixels go through each tap's gather together,
/// so a tap's weights are read once per run, not once per image: in ResNet's deep strided layers the
/// weights (4.5 MiB at 256 → 512) outgrow L2 while an image has 16 output pixels. Within a tap no two
/// output pixels reach the same input pixel, so each sum runs in tap order however images are grouped.
fn scatter_input_grad(isa: Isa, dy: &[f32], w: &[f32], g: &Geometry) -> Vec<f32> {
    let (oh, ow, l, s) = (g.oh(), g.ow(), g.lanes, g.stride);
    let (hp, wp) = (g.h + 2 * g.padding, g.w + 2 * g.padding);
    let packed = pack(w, g, Packing::Transposed);
    let (a_img, c_img) = (g.ob() * oh * ow * l, g.ib() * hp * wp * l);
    let mut dxp = vec![0f32; g.n * c_img];
    let out = Shared(dxp.as_mut_ptr());
    // As many images per run as the threads leave, while the run's gradients (read and written once per
    // tap) stay within L2; large images keep one image per task, as their weights are small.
    let tasks = (TASKS_PER_THREAD * rayon::current_num_threads().max(1)).clamp(1, g.n.max(1));
    let fit = (L2_OUTPUT_BYTES / (c_img * std::mem::size_of::<f32>())).max(1);
    let per_task = g.n.div_ceil(tasks).min(fit).max(1);
    (0..g.n.div_ceil(per_task))
        .into_par_iter()
        .for_each(|task| {
            let images = task * per_task..g.n.min((task + 1) * per_task);
            for tap in 0..g.taps() {
                let (kh, kw) = (tap / g.k, tap % g.k);
                let taps = [(0, tap * l * l)];
                let gather = Gather {
                    taps: &taps,
                    kblocks: g.ob(),
                    live: g.live_out(),
                    a_k: oh * ow * l,
                    b_k: g.taps() * l * l,
                    b_n: g.ob() * g.taps() * l * l,
                    c_n: hp * wp * l,
                    // The first tap writes over the zeros (no two output pixels of a tap share an
                    // input pixel); the later ones add.
                    accumulate: tap > 0,
                };
                let px: Vec<(usize, usize)> = images
                    .clone()
                    .flat_map(|img| {
                        (0..oh * ow).map(move |p| {
                            let (y, x) = (p / ow, p % ow);
                            (
                                img * a_img + p * l,
                                img * c_img + ((y * s + kh) * wp + x * s + kw) * l,
                            )
                        })
                    })
                    .collect();
                let d = GatherData {
                    a: dy.as_ptr(),
                    b: packed.as_ptr(),
                    c: out.get(),
                };
                // SAFETY: each task writes only its own images' padded gradients; within the task the taps
                // run one after another; offsets stay in bounds by construction.
                unsafe { kernels::gather(isa, &gather, d, &px, 0..g.ib()) };
            }
        });
    match g.padding {
        // Unpadded (ResNet's 1×1 stride-2 shortcuts): the buffer already is the gradient.
        0 => dxp,
        p => crop(&dxp, (g.n, g.ib(), g.h, g.w, l), p),
    }
}

/// Weight gradient (O, I, K, K) from blocked `x` and `dy`.
pub fn weight_grad(isa: Isa, x: &[f32], dy: &[f32], g: &Geometry) -> Vec<f32> {
    let (oh, ow, l, k) = (g.oh(), g.ow(), g.lanes, g.k);
    let (hp, wp) = (g.h + 2 * g.padding, g.w + 2 * g.padding);
    let padded;
    let xp = if g.padding == 0 {
        x
    } else {
        padded = pad(x, (g.n, g.ib(), g.h, g.w, l), g.padding);
        &padded
    };
    let group = kernels::weight_group(isa);
    let groups = g.ob().div_ceil(group);
    let taps: Vec<usize> = (0..k * k).map(|t| ((t / k) * wp + t % k) * l).collect();
    let p = WeightProblem {
        oh,
        ow,
        x_row: g.stride * wp * l,
        x_px: g.stride * l,
        g_plane: oh * ow * l,
    };
    let (x_img, g_img) = (g.ib() * hp * wp * l, g.ob() * oh * ow * l);
    // Tasks: (output-block group, input block, run of images); a few per thread, so small layers with
    // few blocks still use every core. The runs' partial sums are added in run order below, so results
    // depend on the thread count but never on scheduling.
    let pairs = groups * g.ib();
    let want = TASKS_PER_THREAD * rayon::current_num_threads().max(1);
    let runs = want.div_ceil(pairs).clamp(1, g.n);
    let per_run = g.n.div_ceil(runs);
    let partials: Vec<(usize, usize, Vec<f32>)> = (0..pairs * runs)
        .into_par_iter()
        .map(|task| {
            let (pair, run) = (task / runs, task % runs);
            let (grp, ib) = (pair / g.ib(), pair % g.ib());
            let ob = grp * group;
            let nb = group.min(g.ob() - ob);
            let mut acc = vec![0f32; k * k * nb * l * l];
            let live = if ib + 1 == g.ib() { g.live_in() } else { l };
            let rows = kernels::weight_rows(&taps, nb, live, l);
            for img in run * per_run..g.n.min((run + 1) * per_run) {
                let ptrs = (
                    xp[img * x_img + ib * hp * wp * l..].as_ptr(),
                    dy[img * g_img + ob * oh * ow * l..].as_ptr(),
                    acc.as_mut_ptr(),
                );
                // SAFETY: `acc` is taps × nb × L × L and `rows` were made for it; the input and gradient
                // offsets stay in bounds.
                unsafe { kernels::weight(isa, &p, ptrs, &rows, nb) };
            }
            (ob, nb, acc)
        })
        .collect();
    // Unpacked in parallel, one output channel's row (I × K × K, written in order) per task.
    let t = k * k;
    let mut dw = vec![0f32; g.c_out * g.c_in * t];
    dw.par_chunks_mut(g.c_in * t)
        .enumerate()
        .for_each(|(o, row)| {
            let (grp, ol) = ((o / l) / group, o % l);
            for (i, taps) in row.chunks_exact_mut(t).enumerate() {
                let pair = grp * g.ib() + i / l;
                let il = i % l;
                for (tap, v) in taps.iter_mut().enumerate() {
                    let mut sum = 0f32;
                    for (ob, nb, acc) in &partials[pair * runs..(pair + 1) * runs] {
                        sum += acc[((tap * nb + (o / l - ob)) * l + il) * l + ol];
                    }
                    *v = sum;
                }
            }
        });
    dw
}
