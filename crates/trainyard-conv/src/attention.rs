//! Multi-head self-attention of one fused `qkv` activation, forward and backward, for the short
//! sequences of a small ViT (a few dozen tokens): `softmax(q·kᵀ·scale)·v` per head, read straight from
//! the qkv linear layer's output `(B, N, 3·D)` (q, k, v side by side, heads within each) and written in
//! the `(B, N, D)` layout the output projection reads. Composed from tensor ops the same attention costs
//! a permute and three copies of q, k and v, two batched products, a softmax and, backward, three
//! zero-padded gradients of the q/k/v slices; here each (batch, head) is one task over a few KiB.
//!
//! The score matrix is recomputed in the backward pass (N² per head, cheaper than keeping it).
//!
//! At `Precision::Bf16` it computes what bf16 autocast's composed attention does (two bf16 batched
//! products, the softmax between them in f32): the scores, the probabilities as the second product reads
//! them and the output rounded to bf16, and backward each product's gradients (and the incoming one)
//! rounded as a bf16 matmul's backward rounds them; sums stay f32. `qkv` must hold bf16 values already
//! (the output of autocast's qkv linear layer).

use crate::bf16::pack::round_f32;
pub use crate::conv::Precision;
use crate::rowwise::{exp, sum};
#[cfg(target_arch = "x86_64")]
use crate::simd::{Avx2, Avx512};
use crate::simd::{Portable, Vector};
use crate::Isa;
use rayon::prelude::*;

/// One attention problem's sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heads {
    pub batch: usize,
    /// Tokens.
    pub n: usize,
    pub heads: usize,
    /// Width of one head; D = heads × head_dim.
    pub head_dim: usize,
}

impl Heads {
    fn d(&self) -> usize {
        self.heads * self.head_dim
    }
}

/// Scratch of one task: a head's keys or values transposed (`hd × np`, np = n rounded up to 16 so each
/// row of scores is whole vectors), and two `n × np` score matrices.
struct Scratch {
    np: usize,
    t: Vec<f32>,
    p: Vec<f32>,
    ds: Vec<f32>,
}

impl Scratch {
    fn new(s: Heads) -> Scratch {
        let np = s.n.div_ceil(16) * 16;
        Scratch {
            np,
            t: vec![0f32; s.head_dim * np],
            p: vec![0f32; s.n * np],
            ds: vec![0f32; s.n * np],
        }
    }
}

/// Offset of token `t`'s part `part` (0 q, 1 k, 2 v) of head `h` in one batch element's qkv rows.
#[inline(always)]
fn at(s: Heads, t: usize, part: usize, h: usize) -> usize {
    t * 3 * s.d() + part * s.d() + h * s.head_dim
}

/// `t[c][j] = part_j[c]`: head `h`'s keys (part 1) or values (part 2) transposed, so a row of scores is
/// a sum of whole vectors over c. The padding columns stay zero.
#[inline(always)]
fn transpose_part(qkv: &[f32], s: Heads, (part, h): (usize, usize), t: &mut [f32], np: usize) {
    for j in 0..s.n {
        for (c, &v) in qkv[at(s, j, part, h)..][..s.head_dim].iter().enumerate() {
            t[c * np + j] = v;
        }
    }
}

/// Rows of a small product computed together: each source row is loaded once for all of them, and their
/// accumulators (ROWS × VECTORS registers: 8 on every path) are independent chains of fused multiply-adds,
/// enough to hide the instruction's latency. One row at a time ran latency-bound.
const ROWS: usize = 4;
/// Vectors per row of the accumulators.
const VECTORS: usize = 2;

/// `out[o(q) + c0 + l] (+)= Σ_r w[q][r]·src[rows(r) + c0 + l]` for R weight rows `w` at once, over
/// NV vectors of lanes from column `c0`. Every element is one chain of fused multiply-adds over r in order,
/// whatever R, NV or the path.
///
/// # Safety
/// Every `rows(r) + c0` and `o(q) + c0` has NV vectors of lanes inside `src` and `out`; every `w[q]` holds
/// `w[0].len()` values.
#[inline(always)]
unsafe fn combine<V: Vector, const R: usize, const NV: usize>(
    w: [&[f32]; R],
    (rows, src): (impl Fn(usize) -> usize, &[f32]),
    (out, o): (&mut [f32], impl Fn(usize) -> usize),
    c0: usize,
    add: bool,
) {
    let mut acc = [[V::zero(); NV]; R];
    for r in 0..w[0].len() {
        let p = src.as_ptr().add(rows(r) + c0);
        let row: [V; NV] = std::array::from_fn(|j| V::load(p.add(j * V::LANES)));
        for (a, wq) in acc.iter_mut().zip(&w) {
            let x = V::splat(wq.as_ptr().add(r));
            for (v, &y) in a.iter_mut().zip(&row) {
                *v = v.fma(x, y);
            }
        }
    }
    for (q, a) in acc.iter().enumerate() {
        let d = out.as_mut_ptr().add(o(q) + c0);
        for (j, &v) in a.iter().enumerate() {
            let d = d.add(j * V::LANES);
            if add {
                V::load(d).add(v).store(d);
            } else {
                v.store(d);
            }
        }
    }
}

/// The lanes past the last whole vector, one at a time (the same chains, in plain Rust).
#[inline(always)]
fn combine_lanes<const R: usize>(
    w: [&[f32]; R],
    (rows, src): (impl Fn(usize) -> usize, &[f32]),
    (out, o): (&mut [f32], impl Fn(usize) -> usize),
    lanes: std::ops::Range<usize>,
    add: bool,
) {
    for c in lanes {
        for (q, wq) in w.iter().enumerate() {
            let mut acc = 0f32;
            for (r, &x) in wq.iter().enumerate() {
                acc = x.mul_add(src[rows(r) + c], acc);
            }
            let d = &mut out[o(q) + c];
            *d = if add { *d + acc } else { acc };
        }
    }
}

/// `combine` over a run-time `width`: groups of VECTORS vectors, then single vectors, then single lanes.
#[inline(always)]
fn combine_width<V: Vector, const R: usize>(
    w: [&[f32]; R],
    src: (impl Fn(usize) -> usize + Copy, &[f32]),
    (out, o): (&mut [f32], impl Fn(usize) -> usize + Copy),
    width: usize,
    add: bool,
) {
    let len = w[0].len();
    assert!(
        w.iter().all(|x| x.len() == len),
        "weight rows of one length"
    );
    let reach = |f: &dyn Fn(usize) -> usize, n: usize| (0..n).map(f).max().map_or(0, |m| m + width);
    assert!(reach(&src.0, len) <= src.1.len(), "source rows inside src");
    assert!(reach(&o, R) <= out.len(), "output rows inside out");
    let l = V::LANES;
    let mut c0 = 0;
    // SAFETY: the rows reach `width` lanes inside src and out (asserted above); c0 + vectors ≤ width.
    unsafe {
        while c0 + VECTORS * l <= width {
            combine::<V, R, VECTORS>(w, src, (&mut *out, o), c0, add);
            c0 += VECTORS * l;
        }
        while c0 + l <= width {
            combine::<V, R, 1>(w, src, (&mut *out, o), c0, add);
            c0 += l;
        }
    }
    combine_lanes(w, src, (out, o), c0..width, add);
}

/// For every output row i < m: `out[o(i) ..+width] (+)= Σ_r w(i)[r]·src[rows(r) ..+width]`, ROWS rows at
/// a time.
#[inline(always)]
fn product<'w, V: Vector>(
    m: usize,
    w: impl Fn(usize) -> &'w [f32],
    src: (impl Fn(usize) -> usize + Copy, &[f32]),
    (out, o): (&mut [f32], impl Fn(usize) -> usize + Copy),
    width: usize,
    add: bool,
) {
    let mut i = 0;
    while i + ROWS <= m {
        let ws = std::array::from_fn::<_, ROWS, _>(|q| w(i + q));
        combine_width::<V, ROWS>(ws, src, (&mut *out, |q| o(i + q)), width, add);
        i += ROWS;
    }
    for i in i..m {
        combine_width::<V, 1>([w(i)], src, (&mut *out, |_| o(i)), width, add);
    }
}

/// `P = softmax(q·kᵀ·scale)` of head `h` into `w.p` (rows of np, zero past n).
#[inline(always)]
fn probabilities<V: Vector>(
    qkv: &[f32],
    s: Heads,
    h: usize,
    scale: f32,
    w: &mut Scratch,
    bf16: bool,
) {
    let (n, np, hd) = (s.n, w.np, s.head_dim);
    transpose_part(qkv, s, (1, h), &mut w.t, np);
    let q = |i: usize| &qkv[at(s, i, 0, h)..][..hd];
    product::<V>(n, q, (|c| c * np, &w.t), (&mut w.p, |i| i * np), np, false);
    for i in 0..n {
        let pi = &mut w.p[i * np..(i + 1) * np];
        if bf16 {
            // q·kᵀ is a bf16 product: its result rounded before the scale.
            round_all(&mut pi[..n]);
        }
        let mut max = [f32::NEG_INFINITY; 16];
        for (j, &v) in pi[..n].iter().enumerate() {
            max[j % 16] = max[j % 16].max(v);
        }
        let max = max.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) * scale;
        for v in pi[..n].iter_mut() {
            *v = exp(*v * scale - max);
        }
        let inv = 1.0 / pi[..n].iter().sum::<f32>();
        for v in pi[..n].iter_mut() {
            *v *= inv;
        }
    }
}

/// Each value rounded to bf16 (kept as f32).
#[inline(always)]
fn round_all(v: &mut [f32]) {
    v.iter_mut().for_each(|x| *x = round_f32(*x));
}

/// One batch element, forward: `out` is its (N, D) rows.
#[inline(always)]
fn forward_one<V: Vector>(qkv: &[f32], s: Heads, scale: f32, out: &mut [f32], bf16: bool) {
    let (n, hd, d) = (s.n, s.head_dim, s.d());
    let mut w = Scratch::new(s);
    let np = w.np;
    for h in 0..s.heads {
        probabilities::<V>(qkv, s, h, scale, &mut w, bf16);
        if bf16 {
            // P is the second bf16 product's operand.
            w.p.chunks_mut(np).for_each(|pi| round_all(&mut pi[..n]));
        }
        let p = |i: usize| &w.p[i * np..][..n];
        let v = |j| at(s, j, 2, h);
        product::<V>(n, p, (v, qkv), (&mut *out, |i| i * d + h * hd), hd, false);
    }
    if bf16 {
        round_all(out);
    }
}

/// `m`'s n × n corner transposed into `t` (rows of np), so its columns can be read as rows.
#[inline(always)]
fn transpose_square(m: &[f32], n: usize, np: usize, t: &mut [f32]) {
    for i in 0..n {
        for j in 0..n {
            t[j * np + i] = m[i * np + j];
        }
    }
}

/// One batch element, backward: `dqkv` is its (N, 3·D) rows (zero on entry), from the output gradient
/// `dout` (N, D).
#[inline(always)]
fn backward_one<V: Vector>(
    qkv: &[f32],
    dout: &[f32],
    s: Heads,
    scale: f32,
    dqkv: &mut [f32],
    bf16: bool,
) {
    let (n, hd, d) = (s.n, s.head_dim, s.d());
    let mut w = Scratch::new(s);
    let np = w.np;
    let mut cols = vec![0f32; n * np];
    // The output's gradient as the second product's backward reads it: rounded under bf16.
    let rounded_dout: Vec<f32>;
    let dout = if bf16 {
        rounded_dout = dout.iter().map(|v| round_f32(*v)).collect();
        &rounded_dout[..]
    } else {
        dout
    };
    for h in 0..s.heads {
        probabilities::<V>(qkv, s, h, scale, &mut w, bf16);
        transpose_part(qkv, s, (2, h), &mut w.t, np);
        // dP = dO·vᵀ; dS = P ⊙ (dP − Σ_j dP·P), scaled.
        let g = |i: usize| &dout[i * d + h * hd..][..hd];
        product::<V>(n, g, (|c| c * np, &w.t), (&mut w.ds, |i| i * np), np, false);
        for i in 0..n {
            let (dsi, pi) = (&mut w.ds[i * np..][..n], &w.p[i * np..][..n]);
            if bf16 {
                // dP is a bf16 product's operand gradient.
                round_all(dsi);
            }
            let weighted = sum(n, |j| dsi[j] * pi[j]);
            for j in 0..n {
                dsi[j] = pi[j] * (dsi[j] - weighted) * scale;
            }
            if bf16 {
                // The gradient of q·kᵀ's rounded result, rounded as that product's backward takes it.
                round_all(dsi);
            }
        }
        let (qs, ks, vs) = (|j| at(s, j, 0, h), |j| at(s, j, 1, h), |j| at(s, j, 2, h));
        // dV_j = Σ_i P[i][j]·dO_i (the columns of P, as rows of its transpose; rounded P under bf16,
        // as the forward's second product read it).
        transpose_square(&w.p, n, np, &mut cols);
        if bf16 {
            cols.chunks_mut(np).for_each(|c| round_all(&mut c[..n]));
        }
        let pt = |j: usize| &cols[j * np..][..n];
        product::<V>(
            n,
            pt,
            (|i| i * d + h * hd, dout),
            (&mut *dqkv, vs),
            hd,
            true,
        );
        // dQ_i = Σ_j dS[i][j]·k_j; dK_j = Σ_i dS[i][j]·q_i.
        let ds = |i: usize| &w.ds[i * np..][..n];
        product::<V>(n, ds, (ks, qkv), (&mut *dqkv, qs), hd, true);
        transpose_square(&w.ds, n, np, &mut cols);
        let dst = |j: usize| &cols[j * np..][..n];
        product::<V>(n, dst, (qs, qkv), (&mut *dqkv, ks), hd, true);
    }
    if bf16 {
        // dq, dk and dv are bf16 products' gradients.
        round_all(dqkv);
    }
}

enum Job<'a> {
    Forward {
        qkv: &'a [f32],
        out: &'a mut [f32],
    },
    Backward {
        qkv: &'a [f32],
        dout: &'a [f32],
        dqkv: &'a mut [f32],
    },
}

/// One problem's settings: its sizes, the score scale and whether it runs as bf16 autocast.
#[derive(Clone, Copy)]
struct Setting {
    s: Heads,
    scale: f32,
    bf16: bool,
}

#[inline(always)]
fn run_job<V: Vector>(job: Job, at: Setting) {
    let Setting { s, scale, bf16 } = at;
    match job {
        Job::Forward { qkv, out } => forward_one::<V>(qkv, s, scale, out, bf16),
        Job::Backward { qkv, dout, dqkv } => backward_one::<V>(qkv, dout, s, scale, dqkv, bf16),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn run_avx512(job: Job, at: Setting) {
    run_job::<Avx512>(job, at)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_avx2(job: Job, at: Setting) {
    run_job::<Avx2>(job, at)
}

fn run(isa: Isa, job: Job, at: Setting) {
    assert!(isa.supported(), "{isa:?} is not supported by this CPU");
    match isa {
        // SAFETY: the CPU has the features (checked above).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { run_avx512(job, at) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { run_avx2(job, at) },
        Isa::Portable16 => run_job::<Portable<16>>(job, at),
        _ => run_job::<Portable<8>>(job, at),
    }
}

/// Attention of `qkv` (B, N, 3·D) → (B, N, D), scores scaled by `scale` (1/√head_dim in a ViT).
///
/// # Panics
/// If `qkv` does not hold B × N × 3·D values.
pub fn forward(isa: Isa, qkv: &[f32], s: Heads, scale: f32) -> Vec<f32> {
    forward_at(isa, Precision::F32, qkv, s, scale)
}

/// `forward` at `precision` (module docs).
pub fn forward_at(isa: Isa, precision: Precision, qkv: &[f32], s: Heads, scale: f32) -> Vec<f32> {
    let at = Setting {
        s,
        scale,
        bf16: precision == Precision::Bf16,
    };
    let (rows_in, rows_out) = (s.n * 3 * s.d(), s.n * s.d());
    assert_eq!(qkv.len(), s.batch * rows_in, "qkv holds (B, N, 3·D) values");
    let mut out = vec![0f32; s.batch * rows_out];
    out.par_chunks_mut(rows_out.max(1))
        .zip(qkv.par_chunks(rows_in.max(1)))
        .for_each(|(o, q)| run(isa, Job::Forward { qkv: q, out: o }, at));
    out
}

/// The gradient of `qkv` (B, N, 3·D) from the output gradient `dout` (B, N, D).
///
/// # Panics
/// If the buffers do not hold the sizes `s` names.
pub fn backward(isa: Isa, qkv: &[f32], dout: &[f32], s: Heads, scale: f32) -> Vec<f32> {
    backward_at(isa, Precision::F32, qkv, dout, s, scale)
}

/// `backward` at `precision` (module docs).
pub fn backward_at(
    isa: Isa,
    precision: Precision,
    qkv: &[f32],
    dout: &[f32],
    s: Heads,
    scale: f32,
) -> Vec<f32> {
    let at = Setting {
        s,
        scale,
        bf16: precision == Precision::Bf16,
    };
    let (rows_in, rows_out) = (s.n * 3 * s.d(), s.n * s.d());
    assert_eq!(qkv.len(), s.batch * rows_in, "qkv holds (B, N, 3·D) values");
    assert_eq!(
        dout.len(),
        s.batch * rows_out,
        "dout holds (B, N, D) values"
    );
    let mut dqkv = vec![0f32; qkv.len()];
    dqkv.par_chunks_mut(rows_in.max(1))
        .zip(
            qkv.par_chunks(rows_in.max(1))
                .zip(dout.par_chunks(rows_out.max(1))),
        )
        .for_each(|(dq, (q, g))| {
            run(
                isa,
                Job::Backward {
                    qkv: q,
                    dout: g,
                    dqkv: dq,
                },
                at,
            )
        });
    dqkv
}
