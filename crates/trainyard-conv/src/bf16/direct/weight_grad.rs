//! `forward`'s weight gradient on the same tiles, at stride 1: for each tap, dW[o][i] is the product of
//! the output gradient transposed (A: 16 output channels × 32 pixels) and the input shifted by the tap
//! (B: 32 pixels × 16 input channels in VNNI pairs), summed over every pixel of the batch.
//!
//! Pixels are numbered along the padded width, as the forward numbers them: the gradient is zero at the
//! 2·padding columns past each row, so those products add nothing, and a tap's input window is a run of
//! consecutive pixels. The input is kept twice in pixel pairs (pairs starting at even and at odd pixels),
//! so every window, whatever its shift, is read in place: 16 rows of 64 bytes.
//!
//! A task owns 32 output × 32 input channels and all taps. It walks the batch image by image, each image's
//! gradient and input windows staying in L2 across the taps, and keeps each tap's sums in f32 between
//! images.

use super::{Geometry, Shape, Steps, Worker, CHUNK, LANES};
use crate::bf16::pack::{round_f32, round_into, Tile, TILE_K, TILE_ROWS};
use crate::bf16::Tier;
use rayon::prelude::*;

/// `forward`'s weight gradient at stride 1 (O, I, K, K), bf16 as autocast computes it: the rounded input
/// and output gradient, f32 sums, a rounded result. `x` and `dy` blocked; `None` at other strides.
///
/// # Panics
/// As `forward`, for `dy` of `g.output_len()` values.
pub fn weight_grad(tier: Tier, x: &[f32], dy: &[f32], g: &Geometry) -> Option<Vec<f32>> {
    if g.stride != 1 {
        return None;
    }
    assert!(
        super::handles(tier, g),
        "direct bf16 conv: {g:?} on {}",
        tier.name()
    );
    assert_eq!(x.len(), g.input_len(), "direct bf16 conv: input length");
    assert_eq!(
        dy.len(),
        g.output_len(),
        "direct bf16 conv: gradient length"
    );
    let (oh, _) = g.out();
    let (_, wp) = g.padded();
    let chunks = (oh * wp).div_ceil(CHUNK);
    let gradient = Transposed::new(dy, g, chunks);
    let input = Paired::new(x, g, chunks);
    let (ob, ib, taps) = (
        g.c_out.div_ceil(LANES),
        g.c_in.div_ceil(LANES),
        g.tap_count(),
    );
    let tile = std::mem::size_of::<Tile>();
    let tasks: Vec<(usize, usize)> = (0..ob.div_ceil(2))
        .flat_map(|o| (0..ib.div_ceil(2)).map(move |i| (o, i)))
        .collect();
    let sums: Vec<Vec<[f32; 32 * 32]>> = tasks
        .par_iter()
        .map_init(
            || Worker::new(tier, g),
            |worker, &(o, i)| {
                let mut per_tap = vec![[0f32; 32 * 32]; taps];
                let mut a = Steps {
                    base: gradient.tiles.as_ptr() as *const u8,
                    steps: Vec::with_capacity(chunks),
                    row: 2 * TILE_K,
                    next: chunks * tile,
                };
                let mut b = Steps {
                    base: input.data.as_ptr() as *const u8,
                    steps: Vec::with_capacity(chunks),
                    row: 2 * TILE_K,
                    next: input.block_bytes(),
                };
                let nt = (ib - 2 * i).min(2);
                for img in 0..g.n {
                    a.steps.clear();
                    a.steps
                        .extend((0..chunks).map(|c| ((img * ob + 2 * o) * chunks + c) * tile));
                    for (tap, sums) in per_tap.iter_mut().enumerate() {
                        let shift = (tap / g.k) * wp + tap % g.k;
                        b.steps.clear();
                        b.steps.extend(
                            (0..chunks).map(|c| input.window(img, 2 * i, c * CHUNK + shift)),
                        );
                        worker.sums = *sums;
                        // SAFETY: the A windows are tiles of `gradient` (a second output block past the
                        // last is its zero slack); the B windows lie in `input` (its slack covers the
                        // last chunk's run past the padded image and a second block past the last).
                        unsafe { worker.block(&a.view(), (&b.view(), nt), true) };
                        *sums = worker.sums;
                    }
                }
                per_tap
            },
        )
        .collect();
    let mut dw = vec![0f32; g.c_out * g.c_in * taps];
    for (&(o, i), per_tap) in tasks.iter().zip(&sums) {
        for (tap, block) in per_tap.iter().enumerate() {
            for r in 0..32 {
                for c in 0..32 {
                    let (out_c, in_c) = (2 * o * LANES + r, 2 * i * LANES + c);
                    if out_c < g.c_out && in_c < g.c_in {
                        let v = block[r * 32 + c];
                        dw[(out_c * g.c_in + in_c) * taps + tap] = round_f32(v);
                    }
                }
            }
        }
    }
    Some(dw)
}

/// The output gradient as A tiles `[image][output block][chunk]`: row j is channel j of the block, its
/// 32 values the chunk's pixels along the padded width (zero past each row's end and past the last row),
/// rounded to bf16. One zero block of slack at the end.
struct Transposed {
    tiles: Vec<Tile>,
}

impl Transposed {
    fn new(dy: &[f32], g: &Geometry, chunks: usize) -> Transposed {
        let (oh, ow) = g.out();
        let (_, wp) = g.padded();
        let ob = g.c_out.div_ceil(LANES);
        let mut tiles = vec![Tile::ZERO; (g.n * ob + 1) * chunks];
        tiles[..g.n * ob * chunks]
            .par_chunks_mut(chunks)
            .enumerate()
            .for_each(|(plane, out)| {
                let src = &dy[plane * oh * ow * LANES..][..oh * ow * LANES];
                for row in 0..oh {
                    for col in 0..ow {
                        let q = row * wp + col;
                        let mut pixel = [0u16; LANES];
                        round_into(&src[(row * ow + col) * LANES..][..LANES], &mut pixel);
                        let tile = &mut out[q / CHUNK].0;
                        for (j, v) in pixel.into_iter().enumerate() {
                            tile[j * TILE_K + q % CHUNK] = v;
                        }
                    }
                }
            });
        Transposed { tiles }
    }
}

/// The zero-padded input in VNNI pixel pairs, twice: `[parity][image][input block][pair][16 channels][2]`,
/// where pair t of parity p holds pixels 2t + p and 2t + p + 1 (along the padded width) of each channel.
/// Each block's plane has slack past the padded image for the last chunk's windows, and one plane of
/// slack ends the buffer.
struct Paired {
    data: Vec<u16>,
    /// Pairs per (parity, image, block) plane.
    pairs: usize,
    images: usize,
    blocks: usize,
}

impl Paired {
    fn new(x: &[f32], g: &Geometry, chunks: usize) -> Paired {
        let (hp, wp) = g.padded();
        let blocks = g.c_in.div_ceil(LANES);
        // The last window starts at most at the last chunk plus the widest shift, and runs 32 pixels.
        let reach = chunks * CHUNK + (g.k - 1) * wp + g.k + 1;
        let pairs = reach.max(hp * wp).div_ceil(2) + 1;
        let plane = pairs * 2 * LANES;
        let mut data = vec![0u16; (2 * g.n * blocks + 1) * plane];
        let p = g.padding;
        let (even, odd) = data[..2 * g.n * blocks * plane].split_at_mut(g.n * blocks * plane);
        even.par_chunks_mut(plane)
            .zip(odd.par_chunks_mut(plane))
            .enumerate()
            .for_each(|(index, (even, odd))| {
                let src = &x[index * g.h * g.w * LANES..][..g.h * g.w * LANES];
                for ih in 0..g.h {
                    for iw in 0..g.w {
                        let q = (ih + p) * wp + iw + p;
                        let mut pixel = [0u16; LANES];
                        round_into(&src[(ih * g.w + iw) * LANES..][..LANES], &mut pixel);
                        // Pixel q is element q % 2 of even pair q / 2, and element (q - 1) % 2 of odd
                        // pair (q - 1) / 2 (q ≥ 1: the padded image's first pixel is padding or q = 0).
                        let at = |t: usize, e: usize| (t * LANES) * 2 + e;
                        for (c, v) in pixel.iter().enumerate() {
                            even[at(q / 2, q % 2) + 2 * c] = *v;
                            if q >= 1 {
                                odd[at((q - 1) / 2, (q - 1) % 2) + 2 * c] = *v;
                            }
                        }
                    }
                }
            });
        Paired {
            data,
            pairs,
            images: g.n,
            blocks,
        }
    }

    /// Bytes from one block's plane to the next's (the second B tile of a step).
    fn block_bytes(&self) -> usize {
        self.pairs * 2 * LANES * 2
    }

    /// The byte offset of the B tile whose 32 pixels start at `start` (along the padded width) in block
    /// `block` of image `img`: 16 consecutive pairs of the plane of `start`'s parity.
    fn window(&self, img: usize, block: usize, start: usize) -> usize {
        let plane = ((start % 2) * self.images + img) * self.blocks + block;
        plane * self.block_bytes() + (start / 2) * 2 * LANES * 2
    }
}

/// Rows of a B tile are pixel pairs: 16 of them make the 32 pixels of a chunk.
const _: () = assert!(TILE_ROWS * 2 == CHUNK);
