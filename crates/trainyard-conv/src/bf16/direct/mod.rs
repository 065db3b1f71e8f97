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
//! - The input gradient is a stride-1 convolution of the output gradient per phase of the input pixels
//!   (`input_grad`), read in place the same way; the weight gradient has its own layout (`weight_grad`).
//!
//! Weights become VNNI B tiles, one per (16 output channels, tap, 32 input channels). Each 16 × 16 f32 C
//! tile is 16 output pixels × one output block: 16 rows of 64 bytes, each a pixel of the blocked output.
//! Sums are f32 and the result is rounded to bf16 (kept as f32), autocast's bf16 convolution output; or
//! left unrounded (`forward_sums_of`) for an epilogue that adds a bias before that one rounding.

use super::pack::{
    from_bf16, pairs as vnni_pairs, round_f32, round_into, Tile, Windows, TILE_K, TILE_ROWS,
};
use super::{Tier, Values};
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
    fits && tier.supported()
}

/// `conv2d(x, w)` with bf16 operands, f32 sums and a bf16-rounded result: `x` blocked (`g.input_len()`),
/// `w` as (O, I, K, K); the result blocked (`g.output_len()`, zeros past `c_out`).
///
/// # Panics
/// If `handles(tier, g)` is false or a slice's length does not fit `g`.
pub fn forward(tier: Tier, x: &[f32], w: &[f32], g: &Geometry) -> Vec<f32> {
    forward_of(tier, Values::F32(x), w, g)
}

/// `forward` of an input that may be rounded already (`Values::Rounded`: the fma tier reads it in place).
///
/// # Panics
/// As `forward`.
pub fn forward_of(tier: Tier, x: Values, w: &[f32], g: &Geometry) -> Vec<f32> {
    forward_stored(tier, x, w, g, true)
}

/// `forward_of` with the f32 sums stored unrounded: a convolution with a bias, whose epilogue adds the
/// bias and then rounds once, as autocast's bf16 convolution does (rounding here too would round twice).
///
/// # Panics
/// As `forward`.
pub fn forward_sums_of(tier: Tier, x: Values, w: &[f32], g: &Geometry) -> Vec<f32> {
    forward_stored(tier, x, w, g, false)
}

/// `forward_of`, its sums rounded as stored under `round`.
fn forward_stored(tier: Tier, x: Values, w: &[f32], g: &Geometry, round: bool) -> Vec<f32> {
    assert!(
        handles(tier, g),
        "direct bf16 conv: {g:?} on {}",
        tier.name()
    );
    assert_eq!(
        x.slice().len(),
        g.input_len(),
        "direct bf16 conv: input length"
    );
    assert_eq!(
        w.len(),
        g.c_out * g.c_in * g.k * g.k,
        "direct bf16 conv: weight length"
    );
    if tier == Tier::Fma {
        return super::fma::conv_forward(x, w, g, round);
    }
    let x = x.slice();
    let taps = g.tap_count();
    let all: Vec<usize> = (0..taps).collect();
    let weights = pack_weights((g.c_out, g.c_in, taps), &all, |ob, slab| {
        // Output channel o's (I·K²) weights are lane o − 16·ob of the slab's rows.
        for (j, src) in w
            .chunks_exact(g.c_in * taps)
            .skip(ob * LANES)
            .take(LANES)
            .enumerate()
        {
            for (r, v) in src.iter().enumerate() {
                slab[r * LANES + j] = *v;
            }
        }
    });
    // Every element is written by exactly one task (each output pixel of each block), so no zeroing.
    let mut y: Vec<f32> = Vec::with_capacity(g.output_len());
    let (oh, ow) = g.out();
    let out = Out {
        ptr: y.as_mut_ptr(),
        blocks: g.c_out.div_ceil(LANES),
        pixels: oh * ow,
        round,
    };
    let (hp, wp) = g.padded();
    let source = Source::input(g);
    if g.stride == 1 {
        let offsets: Vec<usize> = (0..taps).map(|t| (t / g.k) * wp + t % g.k).collect();
        let reach = (oh * wp).div_ceil(CHUNK) * CHUNK + offsets[taps - 1];
        let input = Padded::new(x, &source, (g.padding, g.padding), (hp, wp), reach);
        let plan = InPlace {
            input: &input,
            offsets: &offsets,
            weights: &weights,
            grid: (oh, ow),
        };
        plan.run(tier, |img, block, (r, c), sums| {
            out.store(img, block, r * ow + c, sums)
        });
    } else {
        let input = Padded::new(x, &source, (g.padding, g.padding), (hp, wp), hp * wp);
        gathered(tier, &input, &weights, g, &out);
    }
    // SAFETY: the tasks wrote every pixel of every block of every image, all `output_len()` values.
    unsafe { y.set_len(g.output_len()) };
    y
}

/// `forward` at strides other than 1: each tap's input rows gathered into scratch tiles once per 32
/// output pixels, for all output blocks.
fn gathered(tier: Tier, input: &Padded, weights: &Weights, g: &Geometry, out: &Out) {
    let (oh, ow) = g.out();
    let ob = g.c_out.div_ceil(LANES);
    let chunks = (oh * ow).div_ceil(CHUNK);
    let gather = 2 * g.tap_count() * g.in_pairs();
    (0..g.n * chunks).into_par_iter().for_each_init(
        || (Worker::new(tier, gather), [0f32; 32 * 32]),
        |(worker, sums), task| {
            let (img, chunk) = (task / chunks, task % chunks);
            let first = chunk * CHUNK;
            let a = worker.gather(input, g, img, first);
            let every = 0..ob.div_ceil(2);
            worker.blocks(&a.view(), weights, (every, ob), sums, |block, r, sums| {
                let q = first + r;
                if q < oh * ow {
                    out.store(img, block, q, sums);
                }
            });
        },
    );
}

/// `forward`'s input gradient, bf16 as autocast computes it (the rounded gradient and weight, a rounded
/// result), at every stride. The input pixels of each phase (iy + p ≡ φy, ix + p ≡ φx mod s) take the
/// taps kh = φy + s·t, kw = φx + s·u only, from output pixel (a − t, b − u), where iy = s·a + φy − p: a
/// stride-1 convolution of `dy` (zero-padded by ⌈K/s⌉ − 1) with that phase's kernel taps, flipped and
/// with input and output channels swapped. At stride 1 there is one phase, the whole kernel.
///
/// # Panics
/// As `forward`, for `dy` of `g.output_len()` values.
pub fn input_grad(tier: Tier, dy: &[f32], w: &[f32], g: &Geometry) -> Vec<f32> {
    Gradient::new(tier, dy).input_grad(w, g)
}

/// The output gradient of `forward` as `tier`'s gradient kernels read it. On the fma tier it is rounded
/// to bf16 here, once for both gradients (unless it is `Values::Rounded` already); the bf16-instruction
/// tiers round it as they pack it.
pub struct Gradient<'a> {
    tier: Tier,
    values: std::borrow::Cow<'a, [f32]>,
}

impl<'a> Gradient<'a> {
    pub fn new(tier: Tier, dy: &'a [f32]) -> Self {
        Gradient::of(tier, Values::F32(dy))
    }

    /// The gradient `dy`, which may be rounded already (`Values::Rounded`: then no copy on any tier).
    pub fn of(tier: Tier, dy: Values<'a>) -> Self {
        let values = match tier {
            Tier::Fma => dy.as_rounded(),
            _ => std::borrow::Cow::Borrowed(dy.slice()),
        };
        Gradient { tier, values }
    }

    /// `input_grad` of this gradient.
    pub fn input_grad(&self, w: &[f32], g: &Geometry) -> Vec<f32> {
        let (tier, dy) = (self.tier, &self.values[..]);
        assert!(
            handles(tier, g),
            "direct bf16 conv: {g:?} on {}",
            tier.name()
        );
        assert_eq!(
            dy.len(),
            g.output_len(),
            "direct bf16 conv: gradient length"
        );
        assert_eq!(
            w.len(),
            g.c_out * g.c_in * g.tap_count(),
            "direct bf16 conv: weight length"
        );
        match tier {
            Tier::Fma => super::fma::conv_input_grad(dy, w, g),
            _ => input_grad_on_tiles(tier, dy, w, g),
        }
    }

    /// `weight_grad` of this gradient.
    pub fn weight_grad(&self, x: &[f32], g: &Geometry) -> Vec<f32> {
        self.weight_grad_of(Values::F32(x), g)
    }

    /// `weight_grad` of this gradient and an input that may be rounded already.
    pub fn weight_grad_of(&self, x: Values, g: &Geometry) -> Vec<f32> {
        weight_grad::weight_grad_of(self.tier, x, &self.values, g)
    }
}

/// `input_grad` on the bf16 instructions' tiers (asserted by the caller).
fn input_grad_on_tiles(tier: Tier, dy: &[f32], w: &[f32], g: &Geometry) -> Vec<f32> {
    let (oh, ow) = g.out();
    let (s, k) = (g.stride, g.k);
    let pad = k.div_ceil(s) - 1;
    let phases: Vec<Phase> = (0..s)
        .flat_map(|y| (0..s).map(move |x| (y, x)))
        .map(|(y, x)| Phase::new(g, y, x))
        .collect();
    let hp = pad + phases.iter().map(|f| f.rows.end).max().unwrap_or(0).max(oh);
    let wp = pad + phases.iter().map(|f| f.cols.end).max().unwrap_or(0).max(ow);
    let offsets: Vec<Vec<usize>> = phases.iter().map(|f| f.offsets(pad, wp)).collect();
    let reach = phases
        .iter()
        .zip(&offsets)
        .map(|(f, o)| (f.rows.len() * wp).div_ceil(CHUNK) * CHUNK + o.iter().max().unwrap_or(&0))
        .max()
        .unwrap_or(0);
    let source = Source {
        n: g.n,
        c: g.c_out,
        h: oh,
        w: ow,
    };
    let input = Padded::new(dy, &source, (pad, pad), (hp, wp), reach);
    let taps = g.tap_count();
    let mut dx: Vec<f32> = Vec::with_capacity(g.input_len());
    let out = Out {
        ptr: dx.as_mut_ptr(),
        blocks: g.c_in.div_ceil(LANES),
        pixels: g.h * g.w,
        round: true,
    };
    for (phase, offsets) in phases.iter().zip(&offsets) {
        let pixel = |(a, b): (usize, usize)| {
            let iy = s * (phase.rows.start + a) + phase.y - g.padding;
            let ix = s * (phase.cols.start + b) + phase.x - g.padding;
            iy * g.w + ix
        };
        let grid = (phase.rows.len(), phase.cols.len());
        if offsets.is_empty() {
            // No tap reaches these pixels: their gradient is zero.
            out.zero(g.n, grid, pixel);
            continue;
        }
        let kernel_taps: Vec<usize> = phase
            .taps
            .0
            .iter()
            .flat_map(|kh| phase.taps.1.iter().map(move |kw| kh * k + kw))
            .collect();
        // The transposed convolution: output block ib is input channels 16·ib.., reducing over the
        // output channels o, whose weights (I, K²) hold the block's 16 channels × K² in a row.
        let weights = pack_weights((g.c_in, g.c_out, taps), &kernel_taps, |ib, slab| {
            let lanes = LANES.min(g.c_in - ib * LANES);
            for (o, src) in w.chunks_exact(g.c_in * taps).enumerate() {
                let block = &src[ib * LANES * taps..][..lanes * taps];
                for (j, kernel) in block.chunks_exact(taps).enumerate() {
                    for (kk, v) in kernel.iter().enumerate() {
                        slab[(o * taps + kk) * LANES + j] = *v;
                    }
                }
            }
        });
        let plan = InPlace {
            input: &input,
            offsets,
            weights: &weights,
            grid,
        };
        plan.run(tier, |img, block, at, sums| {
            out.store(img, block, pixel(at), sums)
        });
    }
    // SAFETY: every input pixel lies in exactly one phase's grid, written above (all blocks, images).
    unsafe { dx.set_len(g.input_len()) };
    dx
}

/// One phase of `input_grad`: the input pixels it covers and the kernel taps that reach them.
struct Phase {
    y: usize,
    x: usize,
    /// The output-grid rows a (iy = s·a + y − p) and columns b whose pixels lie in the input.
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    /// Kernel rows and columns of this phase: y, y + s, … below K (and x, x + s, …).
    taps: (Vec<usize>, Vec<usize>),
}

impl Phase {
    fn new(g: &Geometry, y: usize, x: usize) -> Phase {
        let (s, p) = (g.stride, g.padding);
        // a with 0 ≤ s·a + y − p < h.
        let range = |phase: usize, len: usize| {
            let first = p.saturating_sub(phase).div_ceil(s);
            let end = (len + p).saturating_sub(phase).div_ceil(s);
            first..end.max(first)
        };
        let taps = |phase: usize| (phase..g.k).step_by(s).collect::<Vec<_>>();
        Phase {
            y,
            x,
            rows: range(y, g.h),
            cols: range(x, g.w),
            taps: (taps(y), taps(x)),
        }
    }

    /// Each tap's pixel offset in `dy` padded by `pad` (width `wp`) from grid pixel (0, 0): tap (t, u)
    /// reads output pixel (a − t, b − u). Empty when no tap reaches this phase or its grid is empty.
    fn offsets(&self, pad: usize, wp: usize) -> Vec<usize> {
        if self.rows.is_empty() || self.cols.is_empty() {
            return Vec::new();
        }
        let (ty, tx) = (self.taps.0.len(), self.taps.1.len());
        (0..ty * tx)
            .map(|tap| {
                let (t, u) = (tap / tx, tap % tx);
                (self.rows.start + pad - t) * wp + self.cols.start + pad - u
            })
            .collect()
    }
}

/// The weights as B tiles: `[output block][tap][32 input channels]`, each in VNNI pairs.
struct Weights {
    tiles: Vec<Tile>,
    /// Tiles per output block (taps × input pairs): the reduction steps.
    per_block: usize,
}

/// B tiles for `c_out` output channels reducing over `c_red` channels at the kernel taps `taps` (indices
/// into the K² of the kernel). `slab(block, out)` writes one output block's weights as
/// `[reduction channel][K²][16 output channels]` (zeros past `c_out`); each task packs its block's tiles
/// from that slab, which stays in cache, two of its 16-lane rows paired per tile row.
fn pack_weights(
    (c_out, c_red, k2): (usize, usize, usize),
    taps: &[usize],
    slab: impl Fn(usize, &mut [f32]) + Sync,
) -> Weights {
    let kb = c_red.div_ceil(PAIR);
    let per_block = taps.len() * kb;
    let mut tiles = vec![Tile::ZERO; c_out.div_ceil(LANES) * per_block];
    tiles.par_chunks_mut(per_block).enumerate().for_each_init(
        || vec![0f32; c_red * k2 * LANES],
        |weights, (ob, block)| {
            if c_out - ob * LANES < LANES {
                // The lanes past `c_out` stay zero (the slab is reused between blocks).
                weights.fill(0.0);
            }
            slab(ob, weights);
            let row = |i: usize, kk: usize| &weights[(i * k2 + kk) * LANES..][..LANES];
            for (step, tile) in block.iter_mut().enumerate() {
                let (kk, pair) = (taps[step / kb], step % kb);
                for (p, line) in tile.words().chunks_exact_mut(LANES).enumerate() {
                    let i = pair * PAIR + 2 * p;
                    if i >= c_red {
                        break;
                    }
                    let hi = if i + 1 < c_red {
                        row(i + 1, kk)
                    } else {
                        &ZEROS
                    };
                    vnni_pairs(row(i, kk), hi, line);
                }
            }
        },
    );
    Weights { tiles, per_block }
}

/// 16 f32 zeros: a missing channel or a padding pixel.
const ZEROS: [f32; LANES] = [0.0; LANES];

/// The channels, images and size of what `Padded` copies.
struct Source {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
}

impl Source {
    fn input(g: &Geometry) -> Source {
        Source {
            n: g.n,
            c: g.c_in,
            h: g.h,
            w: g.w,
        }
    }
}

/// A blocked tensor rounded to bf16 and zero-padded: `(N, ⌈C/32⌉, plane)` where each (image, channel
/// pair) plane is `hp × wp` pixels of 32 channels (the source at `top`, `left`) and zeros up to `reach`
/// pixels.
struct Padded {
    data: Vec<u16>,
    wp: usize,
    /// u16s per (image, channel pair) plane.
    plane: usize,
    pairs: usize,
}

impl Padded {
    fn new(
        x: &[f32],
        src: &Source,
        (top, left): (usize, usize),
        (hp, wp): (usize, usize),
        reach: usize,
    ) -> Padded {
        let (cb, pairs) = (src.c.div_ceil(LANES), src.c.div_ceil(PAIR));
        let plane = hp.max(reach.div_ceil(wp)) * wp * PAIR;
        let mut data: Vec<u16> = Vec::with_capacity(src.n * pairs * plane);
        // Every element is written below: the padding, the slack and a missing second block as zeros.
        let spare = &mut data.spare_capacity_mut()[..src.n * pairs * plane];
        spare
            .par_chunks_mut(plane)
            .enumerate()
            .for_each(|(idx, dst)| {
                let (img, pair) = (idx / pairs, idx % pairs);
                let zero = std::mem::MaybeUninit::new(0u16);
                for (r, line) in dst.chunks_mut(wp * PAIR).enumerate() {
                    if r < top || r >= top + src.h {
                        line.fill(zero);
                        continue;
                    }
                    line[..left * PAIR].fill(zero);
                    line[(left + src.w) * PAIR..].fill(zero);
                    let pixels = &mut line[left * PAIR..(left + src.w) * PAIR];
                    for half in 0..2 {
                        let block = 2 * pair + half;
                        let ih = r - top;
                        for (iw, d) in pixels.chunks_mut(PAIR).enumerate() {
                            let d = &mut d[half * LANES..][..LANES];
                            if block >= cb {
                                d.fill(zero);
                                continue;
                            }
                            let s = &x
                                [((img * cb + block) * src.h * src.w + ih * src.w + iw) * LANES..]
                                [..LANES];
                            let mut rounded = [0u16; LANES];
                            round_into(s, &mut rounded);
                            for (d, v) in d.iter_mut().zip(rounded) {
                                d.write(v);
                            }
                        }
                    }
                }
            });
        // SAFETY: every element up to this length was written above.
        unsafe { data.set_len(src.n * pairs * plane) };
        Padded {
            data,
            wp,
            plane,
            pairs,
        }
    }
}

/// A stride-1 convolution whose A tiles are read in place from a `Padded` copy: output pixels numbered
/// along the padded width (so a tile runs on from one row into the next, the columns past `grid.1`
/// computed and dropped), each tap at a fixed pixel offset from its output pixel.
struct InPlace<'a> {
    input: &'a Padded,
    /// Each tap's pixel offset in the padded plane from its output pixel.
    offsets: &'a [usize],
    weights: &'a Weights,
    /// Output rows and columns.
    grid: (usize, usize),
}

impl InPlace<'_> {
    /// Every output pixel of every block of every image, as f32 sums handed to `store(image, block,
    /// (row, column), 16 sums)`.
    fn run(&self, tier: Tier, store: impl Fn(usize, usize, (usize, usize), &[f32]) + Sync) {
        let input = self.input;
        let (rows, cols) = self.grid;
        let chunks = (rows * input.wp).div_ceil(CHUNK);
        let images = input.data.len() / (input.pairs * input.plane);
        let ob = self.weights.tiles.len() / self.weights.per_block;
        let kb = input.pairs;
        // The A windows of output pixels `first..first + 32` of image `img`.
        let windows = |img: usize, first: usize| {
            let plane = |pair: usize| (img * kb + pair) * input.plane;
            let steps = (0..self.offsets.len() * kb)
                .map(|step| {
                    let (tap, pair) = (step / kb, step % kb);
                    2 * (plane(pair) + (first + self.offsets[tap]) * PAIR)
                })
                .collect();
            Steps {
                base: input.data.as_ptr() as *const u8,
                steps,
                row: 2 * PAIR,
                next: 2 * TILE_ROWS * PAIR,
            }
        };
        let chunk = |worker: &Worker, sums: &mut _, (img, chunk), blocks| {
            let first = chunk * CHUNK;
            let a = windows(img, first);
            worker.blocks(
                &a.view(),
                self.weights,
                (blocks, ob),
                sums,
                |block, r, sums| {
                    let q = first + r;
                    let (y, x) = (q / input.wp, q % input.wp);
                    if y < rows && x < cols {
                        store(img, block, (y, x), sums);
                    }
                },
            );
        };
        let init = || (Worker::new(tier, 0), [0f32; 32 * 32]);
        let pairs = ob.div_ceil(2);
        if self.weights.tiles.len() * std::mem::size_of::<Tile>() <= WEIGHTS_PER_CHUNK {
            // Every output block per chunk of pixels: the weights stay in cache across chunks.
            (0..images * chunks)
                .into_par_iter()
                .for_each_init(init, |(worker, sums), task| {
                    chunk(worker, sums, (task / chunks, task % chunks), 0..pairs)
                });
        } else {
            // Weights larger than a core's cache: each task keeps one pair of output blocks' weights
            // (cached) and walks one image's pixels, instead of streaming every weight per chunk.
            (0..pairs * images)
                .into_par_iter()
                .for_each_init(init, |(worker, sums), task| {
                    let (pair, img) = (task / images, task % images);
                    for c in 0..chunks {
                        chunk(worker, sums, (img, c), pair..pair + 1);
                    }
                });
        }
    }
}

/// Bytes of packed weights up to which `InPlace::run` multiplies every output block per chunk of
/// pixels (the weights then stay in a core's L2 from one chunk to the next); past it, each task keeps
/// one pair of output blocks and walks the pixels. ResNet-18's stages at 256 and 512 channels (1.2 and
/// 4.7 MB of weights) take the second order: 3% of a CIFAR step on AMX.
const WEIGHTS_PER_CHUNK: usize = 1 << 20;

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

    /// The A tiles of output pixels `first..first + 32` of image `img` (strides other than 1), gathered
    /// into the scratch tiles.
    fn gather(&mut self, input: &Padded, g: &Geometry, img: usize, first: usize) -> Steps {
        let (taps, kb) = (g.tap_count(), input.pairs);
        let plane = |pair: usize| (img * kb + pair) * input.plane;
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

    /// The two A tiles `a` times the weights of the output block pairs `pairs` (of `ob` blocks):
    /// `store(block, row, 16 sums)` for each of the 32 rows (output pixels) of each block.
    fn blocks(
        &self,
        a: &Windows,
        weights: &Weights,
        (pairs, ob): (std::ops::Range<usize>, usize),
        sums: &mut [f32; 32 * 32],
        mut store: impl FnMut(usize, usize, &[f32]),
    ) {
        let tile = std::mem::size_of::<Tile>();
        let b_steps: Vec<usize> = (0..weights.per_block).map(|t| t * tile).collect();
        for pair in pairs {
            let nt = (ob - 2 * pair).min(2);
            let b = Windows {
                base: weights.tiles[2 * pair * weights.per_block..].as_ptr() as *const u8,
                steps: &b_steps,
                row: 2 * TILE_K,
                next: weights.per_block * tile,
            };
            // SAFETY: the A windows lie in the caller's padded input (its reach covers tiles that run
            // past the last pixel) or scratch; `nt` B blocks exist from `pair`.
            unsafe { self.block(a, (&b, nt), false, sums) };
            for r in 0..CHUNK {
                for j in 0..nt {
                    store(2 * pair + j, r, &sums[r * 32 + j * LANES..][..LANES]);
                }
            }
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
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the caller's promise; the tier is supported (`handles`).
            Tier::Avx512Bf16 => unsafe {
                super::avx512::windows_block(a, (b, nt), accumulate, sums)
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
    /// Round each sum to bf16 as it is stored (else the f32 sums: `forward_sums_of`).
    round: bool,
}

// SAFETY: each task writes only its own output pixels (disjoint between tasks).
unsafe impl Sync for Out {}

impl Out {
    /// Zeros at the pixels `pixel((row, column))` of a `grid`, in every block of `images` images.
    fn zero(&self, images: usize, grid: (usize, usize), pixel: impl Fn((usize, usize)) -> usize) {
        for (img, block) in (0..images).flat_map(|i| (0..self.blocks).map(move |b| (i, b))) {
            for at in (0..grid.0).flat_map(|a| (0..grid.1).map(move |b| (a, b))) {
                self.store(img, block, pixel(at), &[0.0; LANES]);
            }
        }
    }

    /// Pixel `pixel` of output block `block` of image `img`: `src`, rounded to bf16 under `round`.
    fn store(&self, img: usize, block: usize, pixel: usize, src: &[f32]) {
        debug_assert!(
            block < self.blocks && pixel < self.pixels,
            "store at {block}, {pixel}"
        );
        let at = ((img * self.blocks + block) * self.pixels + pixel) * LANES;
        // SAFETY: img < n, block < blocks and pixel < pixels (the caller's loop bounds), so the 16 values
        // are inside the output, and no other task writes this pixel.
        let dst = unsafe { std::slice::from_raw_parts_mut(self.ptr.add(at), LANES) };
        if self.round {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = round_f32(*s);
            }
        } else {
            dst.copy_from_slice(&src[..LANES]);
        }
    }
}

#[cfg(test)]
mod tests;
