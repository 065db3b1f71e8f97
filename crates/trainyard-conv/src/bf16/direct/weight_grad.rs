//! `forward`'s weight gradient on the same tiles, at every stride: for each tap, dW[o][i] is the product of
//! the output gradient transposed (A: 16 output channels × 32 output pixels) and the input pixels those
//! outputs read at that tap (B: 32 pixels × 16 input channels in VNNI pairs), summed over the batch.
//!
//! Output pixels are numbered along rows of `row` = ⌈(W + 2p) / s⌉ pixels, and the padded input (its width
//! rounded up to s·row) is cut into s row phases: phase φ holds rows φ, φ + s, …. At tap (kh, kw) output
//! q reads pixel s·q + (kh / s)·s·row + kw of phase kh mod s. The gradient is zero at the columns past
//! each output row, so those products add nothing, and a tap's 32 input pixels form the pairs (j, j + s)
//! for j = base, base + 2s, …: each phase is kept once per residue of `base` mod 2s, in those pairs, so
//! every window is 16 consecutive rows of 64 bytes, read in place. At stride 1 that is the input twice
//! (pairs from even and from odd pixels).
//!
//! A task owns 32 output × 32 input channels and all taps. It walks the batch image by image, each image's
//! gradient and input windows staying in L2 across the taps, and keeps each tap's sums in f32 between
//! images.

use super::{Geometry, Shape, Steps, Worker, CHUNK, LANES, ZEROS};
use crate::bf16::pack::{pairs as vnni_pairs, round_f32, round_into, Tile, TILE_K, TILE_ROWS};
use crate::bf16::{Tier, Values};
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// `forward`'s weight gradient (O, I, K, K), bf16 as autocast computes it: the rounded input and output
/// gradient, f32 sums, a rounded result. `x` and `dy` blocked.
///
/// # Panics
/// As `forward`, for `dy` of `g.output_len()` values.
pub fn weight_grad(tier: Tier, x: &[f32], dy: &[f32], g: &Geometry) -> Vec<f32> {
    super::Gradient::new(tier, dy).weight_grad(x, g)
}

/// `weight_grad` with `dy` as `Gradient` holds it (rounded already on the fma tier).
pub(super) fn weight_grad_of(tier: Tier, x: Values, dy: &[f32], g: &Geometry) -> Vec<f32> {
    assert!(
        super::handles(tier, g),
        "direct bf16 conv: {g:?} on {}",
        tier.name()
    );
    assert_eq!(
        x.slice().len(),
        g.input_len(),
        "direct bf16 conv: input length"
    );
    assert_eq!(
        dy.len(),
        g.output_len(),
        "direct bf16 conv: gradient length"
    );
    if tier == Tier::Fma {
        return crate::bf16::fma::conv_weight_grad(x, dy, g);
    }
    let x = x.slice();
    let numbering = Numbering::new(g);
    let gradient = Transposed::new(dy, g, &numbering);
    let input = Paired::new(x, g, &numbering);
    let (ob, ib, taps) = (
        g.c_out.div_ceil(LANES),
        g.c_in.div_ceil(LANES),
        g.tap_count(),
    );
    let (chunks, s) = (numbering.chunks, g.stride);
    let tile = std::mem::size_of::<Tile>();
    let tasks: Vec<(usize, usize)> = (0..ob.div_ceil(2))
        .flat_map(|o| (0..ib.div_ceil(2)).map(move |i| (o, i)))
        .collect();
    let sums: Vec<Vec<[f32; 32 * 32]>> = tasks
        .par_iter()
        .map_init(
            || Worker::new(tier, 0),
            |worker, &(o, i)| {
                let mut per_tap = vec![[0f32; 32 * 32]; taps];
                let mut a = Steps {
                    base: gradient.tiles.as_ptr() as *const u8,
                    steps: Vec::new(),
                    row: 2 * TILE_K,
                    next: chunks * tile,
                };
                let mut b = Steps {
                    base: input.data.as_ptr() as *const u8,
                    steps: Vec::new(),
                    row: 2 * TILE_K,
                    next: input.block_bytes(),
                };
                let nt = (ib - 2 * i).min(2);
                // Images per product: enough chunks that loading and storing the sums is amortised
                // (a deep stage's small planes are one chunk an image).
                let group = MIN_STEPS.div_ceil(chunks).max(1);
                for first in (0..g.n).step_by(group) {
                    let images = first..(first + group).min(g.n);
                    let each = |img: usize| (0..chunks).map(move |c| (img, c));
                    a.steps.clear();
                    a.steps.extend(
                        images
                            .clone()
                            .flat_map(each)
                            .map(|(img, c)| ((img * ob + 2 * o) * chunks + c) * tile),
                    );
                    for (tap, sums) in per_tap.iter_mut().enumerate() {
                        let (kh, kw) = (tap / g.k, tap % g.k);
                        let shift = (kh / s) * s * numbering.row + kw;
                        b.steps.clear();
                        b.steps
                            .extend(images.clone().flat_map(each).map(|(img, c)| {
                                input.window((img, 2 * i, kh % s), s * c * CHUNK + shift)
                            }));
                        // SAFETY: the A windows are tiles of `gradient` (a second output block past the
                        // last is its zero slack); the B windows lie in `input` (its slack covers the
                        // last chunk's run past the padded image and a second block past the last).
                        unsafe { worker.block(&a.view(), (&b.view(), nt), true, sums) };
                    }
                }
                per_tap
            },
        )
        .collect();
    let mut dw: Vec<f32> = Vec::with_capacity(g.c_out * g.c_in * taps);
    let rows = 2 * LANES * g.c_in * taps;
    // Each pair of output blocks owns 32 consecutive output channels of dW: written by one task group.
    dw.spare_capacity_mut()[..g.c_out * g.c_in * taps]
        .par_chunks_mut(rows)
        .enumerate()
        .for_each(|(o, out)| {
            for (&(_, i), per_tap) in tasks.iter().zip(&sums).filter(|((to, _), _)| *to == o) {
                for (tap, block) in per_tap.iter().enumerate() {
                    for r in 0..(out.len() / (g.c_in * taps)) {
                        for c in 0..32.min(g.c_in - 2 * i * LANES) {
                            let in_c = 2 * i * LANES + c;
                            let v = round_f32(block[r * 32 + c]);
                            out[(r * g.c_in + in_c) * taps + tap] = MaybeUninit::new(v);
                        }
                    }
                }
            }
        });
    // SAFETY: every (output, input, tap) element was written above: each task group covers all input
    // channels of its output rows, every tap.
    unsafe { dw.set_len(g.c_out * g.c_in * taps) };
    dw
}

/// Reduction steps (chunks of 32 pixels) per tile product at least, where images are small: each product
/// loads and stores its 32 × 32 sums once.
const MIN_STEPS: usize = 16;

/// How output pixels are numbered for the tiles (see the module's comment).
struct Numbering {
    /// Output pixels per numbered row: the padded width over the stride, rounded up.
    row: usize,
    /// Chunks of 32 numbered pixels per image.
    chunks: usize,
}

impl Numbering {
    fn new(g: &Geometry) -> Numbering {
        let (oh, _) = g.out();
        let (_, wp) = g.padded();
        let row = wp.div_ceil(g.stride);
        Numbering {
            row,
            chunks: (oh * row).div_ceil(CHUNK),
        }
    }
}

/// The output gradient as A tiles `[image][output block][chunk]`: row j is channel j of the block, its
/// 32 values the chunk's numbered pixels (zero past each row's end and past the last row), rounded to
/// bf16. One zero block of slack at the end.
struct Transposed {
    tiles: Vec<Tile>,
}

impl Transposed {
    fn new(dy: &[f32], g: &Geometry, numbering: &Numbering) -> Transposed {
        let (oh, ow) = g.out();
        let (row, chunks) = (numbering.row, numbering.chunks);
        let planes = g.n * g.c_out.div_ceil(LANES);
        let mut tiles: Vec<Tile> = Vec::with_capacity((planes + 1) * chunks);
        let spare = &mut tiles.spare_capacity_mut()[..(planes + 1) * chunks];
        let (body, slack) = spare.split_at_mut(planes * chunks);
        slack.fill(MaybeUninit::new(Tile::ZERO));
        body.par_chunks_mut(chunks)
            .enumerate()
            .for_each(|(plane, out)| {
                let src = &dy[plane * oh * ow * LANES..][..oh * ow * LANES];
                let mut columns = [[0u16; LANES]; CHUNK];
                for (c, tile) in out.iter_mut().enumerate() {
                    for (e, column) in columns.iter_mut().enumerate() {
                        let q = c * CHUNK + e;
                        let (y, x) = (q / row, q % row);
                        if y < oh && x < ow {
                            round_into(&src[(y * ow + x) * LANES..][..LANES], column);
                        } else {
                            *column = [0; LANES];
                        }
                    }
                    let mut t = Tile::ZERO;
                    for (j, line) in t.0.chunks_exact_mut(TILE_K).enumerate() {
                        for (v, column) in line.iter_mut().zip(&columns) {
                            *v = column[j];
                        }
                    }
                    tile.write(t);
                }
            });
        // SAFETY: the body's tiles were written by the tasks, the slack above.
        unsafe { tiles.set_len((planes + 1) * chunks) };
        Transposed { tiles }
    }
}

/// The zero-padded input in VNNI pixel pairs, once per row phase and residue mod 2s:
/// `[image][input block][phase φ][residue ρ][pair u][16 channels][2]`, where pair u of residue ρ holds
/// pixels 2s·u + ρ and 2s·u + ρ + s of phase φ (its rows of s·row pixels one after another) of each
/// channel. Each plane reaches past the padded image for the last chunk's windows, and one block of
/// slack ends the buffer.
struct Paired {
    data: Vec<u32>,
    /// Pairs per (image, block, residue) plane.
    pairs: usize,
    stride: usize,
    blocks: usize,
}

impl Paired {
    fn new(x: &[f32], g: &Geometry, numbering: &Numbering) -> Paired {
        let (s, p) = (g.stride, g.padding);
        let wp = s * numbering.row;
        let blocks = g.c_in.div_ceil(LANES);
        // The last window starts at most at the last chunk's first pixel plus the widest shift, and
        // reaches 2s·15 + s pixels further.
        let last = s * (numbering.chunks - 1) * CHUNK + (g.k - 1) / s * wp + g.k - 1;
        let pairs = last / (2 * s) + TILE_ROWS + 1;
        let plane = pairs * LANES;
        let per_block = s * 2 * s * plane;
        let len = (g.n * blocks + 1) * per_block;
        let mut data: Vec<u32> = Vec::with_capacity(len);
        let spare = &mut data.spare_capacity_mut()[..len];
        let (body, slack) = spare.split_at_mut(g.n * blocks * per_block);
        slack.fill(MaybeUninit::new(0));
        body.par_chunks_mut(per_block)
            .enumerate()
            .for_each(|(index, out)| {
                let src = &x[index * g.h * g.w * LANES..][..g.h * g.w * LANES];
                // Pixel (row, column) of phase φ's rows: its 16 channels, or zeros in the padding and
                // past the image.
                let pixel = |phase: usize, (r, c): (usize, usize)| -> &[f32] {
                    let r = phase + s * r;
                    if r < p || r >= p + g.h || c < p || c >= p + g.w {
                        &ZEROS
                    } else {
                        &src[((r - p) * g.w + c - p) * LANES..][..LANES]
                    }
                };
                // (row, column) of the pixel `by` further along the rows of `wp` pixels.
                let step = |(mut r, mut c): (usize, usize), by: usize| {
                    c += by;
                    while c >= wp {
                        (r, c) = (r + 1, c - wp);
                    }
                    (r, c)
                };
                for (index, plane) in out.chunks_exact_mut(plane).enumerate() {
                    let (phase, residue) = (index / (2 * s), index % (2 * s));
                    let mut first = step((0, 0), residue);
                    for line in plane.chunks_exact_mut(LANES) {
                        let second = step(first, s);
                        let mut words = [0u32; LANES];
                        vnni_pairs(pixel(phase, first), pixel(phase, second), &mut words);
                        for (d, w) in line.iter_mut().zip(words) {
                            d.write(w);
                        }
                        first = step(first, 2 * s);
                    }
                }
            });
        // SAFETY: every plane's pairs were written by the tasks, the slack above.
        unsafe { data.set_len(len) };
        Paired {
            data,
            pairs,
            stride: s,
            blocks,
        }
    }

    /// Bytes from one block's planes to the next's (the second B tile of a step).
    fn block_bytes(&self) -> usize {
        self.stride * 2 * self.stride * self.pairs * LANES * 4
    }

    /// The byte offset of the B tile whose 32 pixels are `start`, `start + s`, … of row phase `phase`
    /// in block `block` of image `img`: 16 consecutive pairs of the plane of `start`'s residue.
    fn window(&self, (img, block, phase): (usize, usize, usize), start: usize) -> usize {
        let period = 2 * self.stride;
        let plane = ((img * self.blocks + block) * self.stride + phase) * period + start % period;
        (plane * self.pairs + start / period) * LANES * 4
    }
}

/// Rows of a B tile are pixel pairs: 16 of them make the 32 pixels of a chunk.
const _: () = assert!(TILE_ROWS * 2 == CHUNK);
