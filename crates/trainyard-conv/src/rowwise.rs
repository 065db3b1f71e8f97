//! The row-wise ops of a transformer block over contiguous rows (the last dimension): LayerNorm, softmax
//! and GELU (erf form), forward and backward, one pass over memory each. Built from basic tensor ops they
//! take 5-12 passes and as many fresh buffers per call, which is most of a small ViT's step that is not a
//! matrix product.
//!
//! The loops are plain Rust written to vectorise (sums over 16 independent lanes, branch-free `exp` and
//! `erf`), compiled per instruction set at one entry point (`run`) like the convolution kernels. Sums run
//! in a fixed order: results do not depend on the thread count.

use crate::buffer::{assume_init, uninit};
use crate::Isa;
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Rows per parallel task, at least; the LayerNorm parameter gradients are summed over this many fixed
/// chunks of rows, so they do not depend on the number of threads.
const ROWS_PER_TASK: usize = 16;

/// One chunk of rows of one op; outputs are written completely.
enum Job<'a> {
    LayerNorm {
        x: &'a [f32],
        w: &'a [f32],
        b: &'a [f32],
        eps: f32,
        y: &'a mut [MaybeUninit<f32>],
    },
    LayerNormBackward {
        x: &'a [f32],
        w: &'a [f32],
        dy: &'a [f32],
        eps: f32,
        dx: &'a mut [MaybeUninit<f32>],
        /// This chunk's Σ dy·x̂ and Σ dy, per feature.
        dw: &'a mut [f32],
        db: &'a mut [f32],
    },
    Softmax {
        x: &'a [f32],
        dim: usize,
        y: &'a mut [MaybeUninit<f32>],
    },
    SoftmaxBackward {
        y: &'a [f32],
        dy: &'a [f32],
        dim: usize,
        dx: &'a mut [MaybeUninit<f32>],
    },
    Gelu {
        x: &'a [f32],
        y: &'a mut [MaybeUninit<f32>],
    },
    GeluBackward {
        x: &'a [f32],
        dy: &'a [f32],
        dx: &'a mut [MaybeUninit<f32>],
    },
    /// Adds each row of `x` to `acc`.
    ColumnSums { x: &'a [f32], acc: &'a mut [f32] },
}

/// `Σ f(i)` over `0..n` in 16 interleaved partial sums (so it vectorises), added in a fixed order.
#[inline(always)]
pub(crate) fn sum(n: usize, f: impl Fn(usize) -> f32) -> f32 {
    let mut acc = [0f32; 16];
    let full = n / 16 * 16;
    for i0 in (0..full).step_by(16) {
        for (l, a) in acc.iter_mut().enumerate() {
            *a += f(i0 + l);
        }
    }
    for i in full..n {
        acc[i - full] += f(i);
    }
    hsum(acc)
}

/// The sum of 16 lanes as a tree (halves added in place: a few shuffles and adds once vectorised, where
/// a left-to-right sum is 16 dependent additions).
#[inline(always)]
pub fn hsum(mut acc: [f32; 16]) -> f32 {
    for width in [8, 4, 2, 1] {
        for i in 0..width {
            acc[i] += acc[i + width];
        }
    }
    acc[0]
}

/// `e^x` in f32, branch-free: x = n·ln2 + r, a degree-7 polynomial of r (|r| ≤ ln2/2, error below an ulp),
/// times 2^n built in the exponent bits. Inputs below -87 give ~e^-87 rather than 0 (no subnormals).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // 1.5·2^23: adding and subtracting it rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    // t's low mantissa bits hold round(x·log2 e) (offset by 2^22): the integer n without a float → int
    // conversion, which would keep the loop from vectorising.
    let t = x.mul_add(LOG2E, ROUND);
    let n = t - ROUND;
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let mut p: f32 = 1.0 / 5040.0;
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = p.mul_add(r, c);
    }
    // 2^n: n + 127 in the exponent field (the offset and the rest of t's bits shift out).
    p * f32::from_bits(t.to_bits().wrapping_add(127) << 23)
}

/// erf(x) in f32 (Abramowitz & Stegun 7.1.26: absolute error below 1.5e-7), branch-free.
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / 0.327_591_1f32.mul_add(a, 1.0);
    let mut poly = 1.061_405_4f32;
    for c in [-1.453_152_1, 1.421_413_8, -0.284_496_74, 0.254_829_6] {
        poly = poly.mul_add(t, c);
    }
    (-(poly * t)).mul_add(exp(-a * a), 1.0).copysign(x)
}

const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
/// 1/√(2π): the standard normal density's constant.
const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;

/// `Σ f(v)` over a slice, in the order `sum` adds (16 interleaved lanes, then a tree), walked as chunks so
/// no index needs a bounds check (through `sum`'s indices, LayerNorm's row loops stayed half scalar).
#[inline(always)]
fn sum_of(a: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0f32; 16];
    let mut chunks = a.chunks_exact(16);
    for c in &mut chunks {
        for l in 0..16 {
            acc[l] += f(c[l]);
        }
    }
    for (l, &v) in chunks.remainder().iter().enumerate() {
        acc[l] += f(v);
    }
    hsum(acc)
}

#[inline(always)]
fn layer_norm_row(x: &[f32], w: &[f32], b: &[f32], eps: f32, y: &mut [MaybeUninit<f32>]) {
    let d = x.len();
    let mean = sum_of(x, |v| v) / d as f32;
    let var = sum_of(x, |v| (v - mean) * (v - mean)) / d as f32;
    let rstd = 1.0 / (var + eps).sqrt();
    for (((o, &v), &w), &b) in y.iter_mut().zip(x).zip(w).zip(b) {
        o.write((v - mean) * rstd * w + b);
    }
}

/// `Σ f(x, w, dy)` over three slices of one length, in `sum_of`'s order.
#[inline(always)]
fn sum_of3(x: &[f32], w: &[f32], dy: &[f32], f: impl Fn(f32, f32, f32) -> f32) -> f32 {
    let mut acc = [0f32; 16];
    let (mut xs, mut ws, mut gs) = (x.chunks_exact(16), w.chunks_exact(16), dy.chunks_exact(16));
    for ((xc, wc), gc) in (&mut xs).zip(&mut ws).zip(&mut gs) {
        for l in 0..16 {
            acc[l] += f(xc[l], wc[l], gc[l]);
        }
    }
    let rest = xs
        .remainder()
        .iter()
        .zip(ws.remainder())
        .zip(gs.remainder());
    for (l, ((&x, &w), &g)) in rest.enumerate() {
        acc[l] += f(x, w, g);
    }
    hsum(acc)
}

/// dx = rstd·(g − mean(g) − x̂·mean(g·x̂)) with g = dy·w; dw += dy·x̂, db += dy.
#[inline(always)]
fn layer_norm_backward_row(
    (x, w, dy, eps): (&[f32], &[f32], &[f32], f32),
    dx: &mut [MaybeUninit<f32>],
    (dw, db): (&mut [f32], &mut [f32]),
) {
    let d = x.len();
    let mean = sum_of(x, |v| v) / d as f32;
    let var = sum_of(x, |v| (v - mean) * (v - mean)) / d as f32;
    let rstd = 1.0 / (var + eps).sqrt();
    let g_mean = sum_of3(x, w, dy, |_, w, g| g * w) / d as f32;
    let gx_mean = sum_of3(x, w, dy, |x, w, g| g * w * (x - mean) * rstd) / d as f32;
    let inputs = x.iter().zip(w).zip(dy);
    let outputs = dx.iter_mut().zip(dw.iter_mut()).zip(db.iter_mut());
    for (((&x, &w), &g), ((dx, dw), db)) in inputs.zip(outputs) {
        let xhat = (x - mean) * rstd;
        dx.write(rstd * (g * w - g_mean - xhat * gx_mean));
        *dw += g * xhat;
        *db += g;
    }
}

#[inline(always)]
fn softmax_row(x: &[f32], y: &mut [MaybeUninit<f32>]) {
    let mut max = [f32::NEG_INFINITY; 16];
    for (i, &v) in x.iter().enumerate() {
        max[i % 16] = max[i % 16].max(v);
    }
    let max = max.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    for (o, &v) in y.iter_mut().zip(x) {
        o.write(exp(v - max));
    }
    // SAFETY: written just above.
    let e = unsafe { &mut *(y as *mut [MaybeUninit<f32>] as *mut [f32]) };
    let scale = 1.0 / sum(e.len(), |i| e[i]);
    for v in e.iter_mut() {
        *v *= scale;
    }
}

#[inline(always)]
fn run_job(job: Job) {
    match job {
        Job::LayerNorm { x, w, b, eps, y } => {
            let d = w.len();
            for (xr, yr) in x.chunks_exact(d).zip(y.chunks_exact_mut(d)) {
                layer_norm_row(xr, w, b, eps, yr);
            }
        }
        Job::LayerNormBackward {
            x,
            w,
            dy,
            eps,
            dx,
            dw,
            db,
        } => {
            let d = w.len();
            for ((xr, gr), dr) in x
                .chunks_exact(d)
                .zip(dy.chunks_exact(d))
                .zip(dx.chunks_exact_mut(d))
            {
                layer_norm_backward_row((xr, w, gr, eps), dr, (&mut *dw, &mut *db));
            }
        }
        Job::Softmax { x, dim, y } => {
            for (xr, yr) in x.chunks_exact(dim).zip(y.chunks_exact_mut(dim)) {
                softmax_row(xr, yr);
            }
        }
        Job::SoftmaxBackward { y, dy, dim, dx } => {
            for ((yr, gr), dr) in y
                .chunks_exact(dim)
                .zip(dy.chunks_exact(dim))
                .zip(dx.chunks_exact_mut(dim))
            {
                let dot = sum(dim, |i| yr[i] * gr[i]);
                for i in 0..dim {
                    dr[i].write(yr[i] * (gr[i] - dot));
                }
            }
        }
        Job::Gelu { x, y } => {
            for (o, &v) in y.iter_mut().zip(x) {
                o.write(0.5 * v * (1.0 + erf(v * FRAC_1_SQRT_2)));
            }
        }
        Job::GeluBackward { x, dy, dx } => {
            for ((o, &v), &g) in dx.iter_mut().zip(x).zip(dy) {
                let cdf = 0.5 * (1.0 + erf(v * FRAC_1_SQRT_2));
                let pdf = FRAC_1_SQRT_2PI * exp(-0.5 * v * v);
                o.write(g * (cdf + v * pdf));
            }
        }
        Job::ColumnSums { x, acc } => {
            for row in x.chunks_exact(acc.len()) {
                for (a, v) in acc.iter_mut().zip(row) {
                    *a += v;
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn run_avx512(job: Job) {
    run_job(job)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_avx2(job: Job) {
    run_job(job)
}

/// Runs one chunk on the widest code `isa` allows.
fn run(isa: Isa, job: Job) {
    assert!(isa.supported(), "{isa:?} is not supported by this CPU");
    match isa {
        // SAFETY: the CPU has the features (checked above).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { run_avx512(job) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { run_avx2(job) },
        _ => run_job(job),
    }
}

/// Rows per task for `rows` rows of `dim` values (elementwise ops: `dim` = 1).
fn chunk_rows(rows: usize, dim: usize) -> usize {
    let want = 4 * rayon::current_num_threads().max(1);
    rows.div_ceil(want)
        .max(ROWS_PER_TASK.div_ceil(dim.max(1)).max(1))
        .max(1)
}

/// LayerNorm over rows of `w.len()` values: `(x − mean)/√(var + eps)·w + b`.
pub fn layer_norm(isa: Isa, x: &[f32], w: &[f32], b: &[f32], eps: f32) -> Vec<f32> {
    layer_norm_to(isa, x, (w, b), eps, false)
}

/// `layer_norm` stored rounded to bf16 (kept as f32): under bf16 autocast, a LayerNorm whose only reader
/// is a bf16 product (which would round it anyway) hands it bf16s to read in place.
pub fn layer_norm_bf16(isa: Isa, x: &[f32], w: &[f32], b: &[f32], eps: f32) -> Vec<f32> {
    layer_norm_to(isa, x, (w, b), eps, true)
}

fn layer_norm_to(isa: Isa, x: &[f32], (w, b): (&[f32], &[f32]), eps: f32, round: bool) -> Vec<f32> {
    let d = w.len();
    let mut y = uninit(x.len());
    let rows = chunk_rows(x.len() / d.max(1), d) * d;
    y.par_chunks_mut(rows.max(1))
        .zip(x.par_chunks(rows.max(1)))
        .for_each(|(y, x)| {
            run(isa, Job::LayerNorm { x, w, b, eps, y });
            if round {
                round_written(y);
            }
        });
    // SAFETY: every row was written.
    unsafe { assume_init(y) }
}

/// Values just written (a task's chunk, still in cache) rounded to bf16 in place.
fn round_written(y: &mut [MaybeUninit<f32>]) {
    for v in y {
        // SAFETY: the caller wrote every value.
        let f = unsafe { v.assume_init() };
        v.write(crate::bf16::pack::round_f32(f));
    }
}

/// LayerNorm's gradients (input, weight, bias) from the input and the output gradient.
pub fn layer_norm_backward(
    isa: Isa,
    x: &[f32],
    w: &[f32],
    dy: &[f32],
    eps: f32,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let d = w.len();
    let n = x.len() / d.max(1);
    // A fixed number of chunks, so the parameter gradients sum in the same order on any thread count.
    let rows = n.div_ceil(ROWS_PER_TASK * 4).max(1) * d;
    let chunks = x.len().div_ceil(rows.max(1));
    let mut dx = uninit(x.len());
    let mut partial = vec![0f32; chunks * 2 * d];
    dx.par_chunks_mut(rows.max(1))
        .zip(x.par_chunks(rows.max(1)).zip(dy.par_chunks(rows.max(1))))
        .zip(partial.par_chunks_mut(2 * d))
        .for_each(|((dx, (x, dy)), p)| {
            let (dw, db) = p.split_at_mut(d);
            run(
                isa,
                Job::LayerNormBackward {
                    x,
                    w,
                    dy,
                    eps,
                    dx,
                    dw,
                    db,
                },
            );
        });
    let (mut dw, mut db) = (vec![0f32; d], vec![0f32; d]);
    for p in partial.chunks(2 * d) {
        for i in 0..d {
            dw[i] += p[i];
            db[i] += p[d + i];
        }
    }
    // SAFETY: every row was written.
    (unsafe { assume_init(dx) }, dw, db)
}

/// Softmax over rows of `dim` values.
pub fn softmax(isa: Isa, x: &[f32], dim: usize) -> Vec<f32> {
    let mut y = uninit(x.len());
    let rows = chunk_rows(x.len() / dim.max(1), dim) * dim;
    y.par_chunks_mut(rows.max(1))
        .zip(x.par_chunks(rows.max(1)))
        .for_each(|(y, x)| {
            run(isa, Job::Softmax { x, dim, y });
        });
    // SAFETY: every row was written.
    unsafe { assume_init(y) }
}

/// Softmax's input gradient from its output `y`: `y·(dy − Σ dy·y)` per row.
pub fn softmax_backward(isa: Isa, y: &[f32], dy: &[f32], dim: usize) -> Vec<f32> {
    let mut dx = uninit(y.len());
    let rows = chunk_rows(y.len() / dim.max(1), dim) * dim;
    dx.par_chunks_mut(rows.max(1))
        .zip(y.par_chunks(rows.max(1)).zip(dy.par_chunks(rows.max(1))))
        .for_each(|(dx, (y, dy))| run(isa, Job::SoftmaxBackward { y, dy, dim, dx }));
    // SAFETY: every row was written.
    unsafe { assume_init(dx) }
}

/// GELU, erf form: `x·Φ(x)`.
pub fn gelu(isa: Isa, x: &[f32]) -> Vec<f32> {
    gelu_to(isa, x, false)
}

/// `gelu` stored rounded to bf16 (kept as f32): GELU of a bf16 tensor under autocast, which returns bf16.
pub fn gelu_bf16(isa: Isa, x: &[f32]) -> Vec<f32> {
    gelu_to(isa, x, true)
}

fn gelu_to(isa: Isa, x: &[f32], round: bool) -> Vec<f32> {
    let mut y = uninit(x.len());
    let chunk = x
        .len()
        .div_ceil(4 * rayon::current_num_threads().max(1))
        .max(4096);
    y.par_chunks_mut(chunk)
        .zip(x.par_chunks(chunk))
        .for_each(|(y, x)| {
            run(isa, Job::Gelu { x, y });
            if round {
                round_written(y);
            }
        });
    // SAFETY: every element was written.
    unsafe { assume_init(y) }
}

/// GELU's input gradient: `dy·(Φ(x) + x·φ(x))`.
pub fn gelu_backward(isa: Isa, x: &[f32], dy: &[f32]) -> Vec<f32> {
    gelu_backward_to(isa, x, dy, false)
}

/// `gelu_backward` stored rounded to bf16 (kept as f32): the gradient GELU of a bf16 tensor passes back
/// under autocast.
pub fn gelu_backward_bf16(isa: Isa, x: &[f32], dy: &[f32]) -> Vec<f32> {
    gelu_backward_to(isa, x, dy, true)
}

fn gelu_backward_to(isa: Isa, x: &[f32], dy: &[f32], round: bool) -> Vec<f32> {
    let mut dx = uninit(x.len());
    let chunk = x
        .len()
        .div_ceil(4 * rayon::current_num_threads().max(1))
        .max(4096);
    dx.par_chunks_mut(chunk)
        .zip(x.par_chunks(chunk).zip(dy.par_chunks(chunk)))
        .for_each(|(dx, (x, dy))| {
            run(isa, Job::GeluBackward { x, dy, dx });
            if round {
                round_written(dx);
            }
        });
    // SAFETY: every element was written.
    unsafe { assume_init(dx) }
}

/// The sums of the columns of `rows × dim` values (a bias gradient): fixed chunks of rows, so the order of
/// the sums does not depend on the thread count.
pub fn column_sums(isa: Isa, x: &[f32], dim: usize) -> Vec<f32> {
    let rows = x.len() / dim.max(1);
    let per = rows.div_ceil(ROWS_PER_TASK * 4).max(1) * dim;
    let mut partial = vec![0f32; x.len().div_ceil(per.max(1)) * dim];
    partial
        .par_chunks_mut(dim.max(1))
        .zip(x.par_chunks(per.max(1)))
        .for_each(|(acc, x)| run(isa, Job::ColumnSums { x, acc }));
    let mut out = vec![0f32; dim];
    for p in partial.chunks(dim.max(1)) {
        for (o, v) in out.iter_mut().zip(p) {
            *o += v;
        }
    }
    out
}
