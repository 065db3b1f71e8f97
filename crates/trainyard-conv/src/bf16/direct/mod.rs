//! Direct bf16 convolution over channel-blocked activations (`(N, ⌈C/16⌉, H, W, 16)` f32, nChw16c), as
//! oneDNN's AMX convolutions run autocast's bf16 convolutions: no im2col matrix and no layout change.
//!
//! The input is rounded once into a zero-padded bf16 copy with 32 channels a pixel (two blocks): one
//! pixel's channels are one 64-byte row of an A tile, so the A tile of 16 output pixels at one kernel tap
//! and 32 input channels is 16 rows of that copy.
//! - Stride 1: the 16 rows are read in place (`tileloadd`, 64-byte stride). Output pixels are numbered
//!   along the padded width, so a tile runs on from one row into the next without a gather: the 2·padding
//!   columns past each row's end are computed and dropped.
//! - Other strides: each tap's 16 rows are gathered into a scratch tile, once per 32 output pixels for all
//!   output channel blocks.
//!
//! Weights become VNNI B tiles, one per (16 output channels, tap, 32 input channels). Each 16 × 16 f32 C
//! tile is 16 output pixels × one output block: 16 rows of 64 bytes, each a pixel of the blocked output.
//! Sums are f32 and the result is rounded to bf16 (kept as f32), autocast's bf16 convolution output.

use super::pack::{from_bf16, round_f32, round_into, to_bf16, Tile, Windows, TILE_K, TILE_ROWS};
use super::Tier;
use rayon::prelude::*;

mod weight_grad;
pub use weight_grad::weight_grad;

/// f32 channels per block of the activations (nChw16c).
pub const LANES: usize = 16;
/// bf16 channels per pixel of the padded copy: one A-tile row.
const PAIR: usize = TILE_K;
/// Output pixels per task: two A tiles.
const CHUNK: usize = 2 * TILE_ROWS;

/// The f32 kernels' geometry, with 16 lanes (nChw16c).
pub use crate::conv::Geometry;

/// What the bf16 kernels derive from a `Geometry`.
trait Shape {
    /// The output's height and width.
    fn out(&self) -> (usize, usize);
    /// The zero-padded input's height and width.
    fn padded(&self) -> (usize, usize);
    /// Blocks of 32 input channels: the reduction tiles per tap.
    fn in_pairs(&self) -> usize;
    fn tap_count(&self) -> usize;
    /// Blocked element counts of the input and the output.
    fn input_len(&self) -> usize;
    fn output_len(&self) -> usize;
}

impl Shape for Geometry {
    fn out(&self) -> (usize, usize) {
        (self.oh(), self.ow())
    }

    fn padded(&self) -> (usize, usize) {
        (self.h + 2 * self.padding, self.w + 2 * self.padding)
    }

    fn in_pairs(&self) -> usize {
        self.c_in.div_ceil(PAIR)
    }

    fn tap_count(&self) -> usize {
        self.k * self.k
    }

    fn input_len(&self) -> usize {
        self.n * self.ib() * self.h * self.w * LANES
    }

    fn output_len(&self) -> usize {
        self.n * self.ob() * self.oh() * self.ow() * LANES
    }
}

/// Whether `direct::forward` takes this shape on `tier` (AMX, or the portable reference of its arithmetic).
pub fn handles(tier: Tier, g: &Geometry) -> bool {
    let fits = g.lanes == LANES
        && g.k >= 1
        && g.stride >= 1
        && g.h + 2 * g.padding >= g.k
        && g.w + 2 * g.padding >= g.k;
    fits && matches!(tier, Tier::Amx | Tier::Portable) && tier.supported()
}

/// `conv2d(x, w)` with bf16 operands, f32 sums and a bf16-rounded result: `x` blocked (`g.input_len()`),
/// `w` as (O, I, K, K); the result blocked (`g.output_len()`, zeros past `c_out`).
///
/// # Panics
/// If `handles(tier, g)` is false or a slice's length does not fit `g`.
pub fn forward(tier: Tier, x: &[f32], w: &[f32], g: &Geometry) -> Vec<f32> {
    assert!(
        handles(tier, g),
        "direct bf16 conv: {g:?} on {}",
        tier.name()
    );
    assert_eq!(x.len(), g.input_len(), "direct bf16 conv: input length");
    assert_eq!(
        w.len(),
        g.c_out * g.c_in * g.k * g.k,
        "direct bf16 conv: weight length"
    );
    let weights = pack_weights(w, g);
    // Stride 1 reads tiles in place and may run up to a chunk and a kernel row past the last pixel.
    let slack = if g.stride == 1 { CHUNK + g.k } else { 0 };
    let input = Padded::new(x, g, slack);
    // Every element is written by exactly one task (each output pixel of each block), so no zeroing.
    let mut y: Vec<f32> = Vec::with_capacity(g.output_len());
    let (oh, ow) = g.out();
    let ob = g.c_out.div_ceil(LANES);
    // Output pixels as numbered per image: along the padded width at stride 1, else as they are.
    let row = if g.stride == 1 { input.wp } else { ow };
    let chunks = (oh * row).div_ceil(CHUNK);
    let out = Out {
        ptr: y.as_mut_ptr(),
        blocks: ob,
        pixels: oh * ow,
    };
    let tile = std::mem::size_of::<Tile>();
    // Tiles each thread gathers per chunk at strides other than 1 (two per reduction step).
    let gather = if g.stride == 1 {
        0
    } else {
        2 * g.tap_count() * g.in_pairs()
    };
    let b_steps: Vec<usize> = (0..weights.per_block).map(|t| t * tile).collect();
    (0..g.n * chunks).into_par_iter().for_each_init(
        || (Worker::new(tier, gather), [0f32; 32 * 32]),
        |(worker, sums), task| {
            let (img, chunk) = (task / chunks, task % chunks);
            let first = chunk * CHUNK;
            let a = worker.a_operand(&input, g, img, first);
            for pair in 0..ob.div_ceil(2) {
                let nt = (ob - 2 * pair).min(2);
                let b = Windows {
                    base: weights.tiles[2 * pair * weights.per_block..].as_ptr() as *const u8,
                    steps: &b_steps,
                    row: 2 * TILE_K,
                    next: weights.per_block * tile,
                };
                // SAFETY: `a_operand`'s windows lie in the padded input (its slack covers the stride-1
                // tiles that run past the last pixel) or the scratch; `nt` B blocks exist from `pair`.
                unsafe { worker.block(&a.view(), (&b, nt), false, sums) };
                for r in 0..CHUNK {
                    let q = first + r;
                    let (y_row, y_col) = (q / row, q % row);
                    if y_row >= oh || y_col >= ow {
                        continue;
                    }
                    for j in 0..nt {
                        let src = &sums[r * 32 + j * LANES..][..LANES];
                        out.store(img, 2 * pair + j, y_row * ow + y_col, src);
                    }
                }
            }
        },
    );
    // SAFETY: the tasks wrote every pixel of every block of every image, all `output_len()` values.
    unsafe { y.set_len(g.output_len()) };
    y
}

/// `forward`'s input gradient at stride 1, bf16 as autocast computes it (the rounded gradient and weight,
/// a rounded result): the same convolution of `dy` with each kernel flipped and its input and output
/// channels swapped, padded by K − 1 − p. `None` at other strides (and when p ≥ K), which the caller
/// computes otherwise.
///
/// # Panics
/// As `forward`, for `dy` of `g.output_len()` values.
pub fn input_grad(tier: Tier, dy: &[f32], w: &[f32], g: &Geometry) -> Option<Vec<f32>> {
    if g.stride != 1 || g.padding >= g.k {
        return None;
    }
    assert_eq!(
        w.len(),
        g.c_out * g.c_in * g.tap_count(),
        "direct bf16 conv: weight length"
    );
    let (oh, ow) = g.out();
    let taps = g.tap_count();
    let mut flipped = vec![0f32; w.len()];
    for o in 0..g.c_out {
        for i in 0..g.c_in {
            for tap in 0..taps {
                flipped[(i * g.c_out + o) * taps + taps - 1 - tap] =
                    w[(o * g.c_in + i) * taps + tap];
            }
        }
    }
    let transposed = Geometry {
        c_in: g.c_out,
        c_out: g.c_in,
        h: oh,
        w: ow,
        padding: g.k - 1 - g.padding,
        ..*g
    };
    Some(forward(tier, dy, &flipped, &transposed))
}

/// The weights as B tiles: `[output block][tap][32 input channels]`, each in VNNI pairs.
struct Weights {
    tiles: Vec<Tile>,
    /// Tiles per output block (taps × input pairs): the reduction steps.
    per_block: usize,
}

fn pack_weights(w: &[f32], g: &Geometry) -> Weights {
    let (taps, kb) = (g.tap_count(), g.in_pairs());
    let per_block = taps * kb;
    let mut tiles = vec![Tile::ZERO; g.c_out.div_ceil(LANES) * per_block];
    tiles
        .par_chunks_mut(per_block)
        .enumerate()
        .for_each(|(ob, block)| {
            for (step, tile) in block.iter_mut().enumerate() {
                let (tap, pair) = (step / kb, step % kb);
                for p in 0..TILE_K / 2 {
                    for j in 0..TILE_ROWS {
                        for e in 0..2 {
                            let (o, i) = (ob * LANES + j, pair * PAIR + 2 * p + e);
                            if o < g.c_out && i < g.c_in {
                                let v = w[(o * g.c_in + i) * g.tap_count() + tap];
                                tile.0[p * TILE_K + 2 * j + e] = to_bf16(v);
                            }
                        }
                    }
                }
            }
        });
    Weights { tiles, per_block }
}

/// The input rounded to bf16 and zero-padded: `(N, ⌈C/32⌉, H + 2p, W + 2p, 32)`, each (image, channel
/// pair) plane followed by `slack` zero pixels.
struct Padded {
    data: Vec<u16>,
    wp: usize,
    /// u16s per (image, channel pair) plane, slack included.
    plane: usize,
    pairs: usize,
}

impl Padded {
    fn new(x: &[f32], g: &Geometry, slack: usize) -> Padded {
        let (hp, wp) = g.padded();
        let (cb, pairs, p) = (g.c_in.div_ceil(LANES), g.in_pairs(), g.padding);
        let plane = (hp * wp + slack) * PAIR;
        let mut data: Vec<u16> = Vec::with_capacity(g.n * pairs * plane);
        // Every element is written below: the padding, the slack and a missing second block as zeros.
        let spare = &mut data.spare_capacity_mut()[..g.n * pairs * plane];
        spare
            .par_chunks_mut(plane)
            .enumerate()
            .for_each(|(idx, dst)| {
                let (img, pair) = (idx / pairs, idx % pairs);
                let zero = std::mem::MaybeUninit::new(0u16);
                for (r, line) in dst[..hp * wp * PAIR].chunks_mut(wp * PAIR).enumerate() {
                    if r < p || r >= p + g.h {
                        line.fill(zero);
                        continue;
                    }
                    line[..p * PAIR].fill(zero);
                    line[(p + g.w) * PAIR..].fill(zero);
                    let pixels = &mut line[p * PAIR..(p + g.w) * PAIR];
                    for half in 0..2 {
                        let block = 2 * pair + half;
                        let ih = r - p;
                        for (iw, d) in pixels.chunks_mut(PAIR).enumerate() {
                            let d = &mut d[half * LANES..][..LANES];
                            if block >= cb {
                                d.fill(zero);
                                continue;
                            }
                            let s = &x[((img * cb + block) * g.h * g.w + ih * g.w + iw) * LANES..]
                                [..LANES];
                            let mut rounded = [0u16; LANES];
                            round_into(s, &mut rounded);
                            for (d, v) in d.iter_mut().zip(rounded) {
                                d.write(v);
                            }
                        }
                    }
                }
                dst[hp * wp * PAIR..].fill(zero);
            });
        // SAFETY: every element up to this length was written above.
        unsafe { data.set_len(g.n * pairs * plane) };
        Padded {
            data,
            wp,
            plane,
            pairs,
        }
    }
}

/// `Windows` that own their steps.
struct Steps {
    base: *const u8,
    steps: Vec<usize>,
    row: usize,
    next: usize,
}

impl Steps {
    fn view(&self) -> Windows<'_> {
        Windows {
            base: self.base,
            steps: &self.steps,
            row: self.row,
            next: self.next,
        }
    }
}

/// One thread's state: its AMX session and gather scratch.
struct Worker {
    tier: Tier,
    #[cfg(target_arch = "x86_64")]
    session: Option<super::amx::Session>,
    scratch: Vec<Tile>,
}

impl Worker {
    /// A worker with `gather` scratch tiles.
    fn new(tier: Tier, gather: usize) -> Worker {
        Worker {
            tier,
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `handles` checked the tier is supported.
            session: (tier == Tier::Amx).then(|| unsafe { super::amx::Session::start() }),
            scratch: vec![Tile::ZERO; gather],
        }
    }

    /// The A tiles of output pixels `first..first + 32` of image `img`: in place at stride 1, else
    /// gathered into the scratch tiles.
    fn a_operand(&mut self, input: &Padded, g: &Geometry, img: usize, first: usize) -> Steps {
        let (taps, kb) = (g.tap_count(), input.pairs);
        let plane = |pair: usize| (img * kb + pair) * input.plane;
        if g.stride == 1 {
            let steps = (0..taps * kb)
                .map(|step| {
                    let (tap, pair) = (step / kb, step % kb);
                    let (kh, kw) = (tap / g.k, tap % g.k);
                    2 * (plane(pair) + (first + kh * input.wp + kw) * PAIR)
                })
                .collect();
            return Steps {
                base: input.data.as_ptr() as *const u8,
                steps,
                row: 2 * PAIR,
                next: 2 * TILE_ROWS * PAIR,
            };
        }
        let (oh, ow) = g.out();
        for step in 0..taps * kb {
            let (tap, pair) = (step / kb, step % kb);
            let (kh, kw) = (tap / g.k, tap % g.k);
            for r in 0..CHUNK {
                let dst =
                    &mut self.scratch[2 * step + r / TILE_ROWS].0[(r % TILE_ROWS) * PAIR..][..PAIR];
                let q = first + r;
                if q >= oh * ow {
                    dst.fill(0);
                    continue;
                }
                let (ih, iw) = ((q / ow) * g.stride + kh, (q % ow) * g.stride + kw);
                dst.copy_from_slice(
                    &input.data[plane(pair) + (ih * input.wp + iw) * PAIR..][..PAIR],
                );
            }
        }
        let tile = std::mem::size_of::<Tile>();
        Steps {
            base: self.scratch.as_ptr() as *const u8,
            steps: (0..taps * kb).map(|step| 2 * step * tile).collect(),
            row: 2 * PAIR,
            next: tile,
        }
    }

    /// `sums` (32 rows × 32 columns, row stride 32) =, or with `accumulate` +=, the two A tiles times
    /// `nt` B tiles of every step.
    ///
    /// # Safety
    /// As `amx::Session::windows_block`: every tile the windows name lies in one allocation.
    unsafe fn block(
        &self,
        a: &Windows,
        (b, nt): (&Windows, usize),
        accumulate: bool,
        sums: &mut [f32; 32 * 32],
    ) {
        match self.tier {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the caller's promise; the session was started for this thread.
            Tier::Amx => unsafe {
                self.session
                    .as_ref()
                    .expect("started")
                    .windows_block(a, (b, nt), accumulate, sums)
            },
            // SAFETY: the caller's promise.
            _ => unsafe { portable_block(a, (b, nt), accumulate, sums) },
        }
    }
}

/// The block in plain Rust, pair by pair as `vdpbf16ps` adds them: the reference the AMX path is held to.
///
/// # Safety
/// As `Worker::block`.
unsafe fn portable_block(
    a: &Windows,
    (b, nt): (&Windows, usize),
    accumulate: bool,
    out: &mut [f32; 32 * 32],
) {
    if !accumulate {
        out.fill(0.0);
    }
    // SAFETY: each row read lies in its operand's allocation (the caller's promise).
    let row = |w: &Windows, at: usize| unsafe {
        std::slice::from_raw_parts(w.base.add(at) as *const u16, TILE_K)
    };
    for (&a_at, &b_at) in a.steps.iter().zip(b.steps) {
        for r in 0..CHUNK {
            let a_row = row(a, a_at + (r / TILE_ROWS) * a.next + (r % TILE_ROWS) * a.row);
            for j in 0..nt {
                for c in 0..TILE_ROWS {
                    let mut s = 0f32;
                    for p in 0..TILE_K / 2 {
                        let b_row = row(b, b_at + j * b.next + p * b.row);
                        s += from_bf16(a_row[2 * p]) * from_bf16(b_row[2 * c])
                            + from_bf16(a_row[2 * p + 1]) * from_bf16(b_row[2 * c + 1]);
                    }
                    out[r * 32 + j * LANES + c] += s;
                }
            }
        }
    }
}

/// The blocked output, written by tasks at disjoint pixels.
struct Out {
    ptr: *mut f32,
    blocks: usize,
    pixels: usize,
}

// SAFETY: each task writes only its own output pixels (disjoint between tasks).
unsafe impl Sync for Out {}

impl Out {
    /// Pixel `pixel` of output block `block` of image `img`: `src` rounded to bf16.
    fn store(&self, img: usize, block: usize, pixel: usize, src: &[f32]) {
        let at = ((img * self.blocks + block) * self.pixels + pixel) * LANES;
        // SAFETY: img < n, block < blocks and pixel < pixels (the caller's loop bounds), so the 16 values
        // are inside the output, and no other task writes this pixel.
        let dst = unsafe { std::slice::from_raw_parts_mut(self.ptr.add(at), LANES) };
        for (d, s) in dst.iter_mut().zip(src) {
            *d = round_f32(*s);
        }
    }
}

#[cfg(test)]
mod tests;
