//! Multi-head self-attention of one fused `qkv` activation, forward and backward, for the short
//! sequences of a small ViT (a few dozen tokens): `softmax(q·kᵀ·scale)·v` per head, read straight from
//! the qkv linear layer's output `(B, N, 3·D)` (q, k, v side by side, heads within each) and written in
//! the `(B, N, D)` layout the output projection reads. Composed from tensor ops the same attention costs
//! a permute and three copies of q, k and v, two batched products, a softmax and, backward, three
//! zero-padded gradients of the q/k/v slices; here each (batch, head) is one task over a few KiB.
//!
//! The score matrix is recomputed in the backward pass (N² per head, cheaper than keeping it).

use crate::rowwise::{exp, sum};
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

/// Lanes of the accumulators the small products below keep in registers: 4 vectors of 16, so four
/// independent chains of fused multiply-adds hide the instruction's latency (the sums over a head's
/// 64 lanes, or a row of up to 64 scores).
const GROUP: usize = 64;

/// `acc[l] = Σ_r w[r]·rows[r][l]` for W lanes (whole registers when W is a multiple of 16), where row r
/// starts at `rows(r)`.
#[inline(always)]
fn combine<const W: usize>(w: &[f32], rows: impl Fn(usize) -> usize, src: &[f32]) -> [f32; W] {
    let mut acc = [0f32; W];
    for (r, &x) in w.iter().enumerate() {
        let row = &src[rows(r)..][..W];
        for l in 0..W {
            acc[l] = x.mul_add(row[l], acc[l]);
        }
    }
    acc
}

/// `combine` for a run-time width: groups of 64 lanes, then the rest in 16s, then single lanes.
#[inline(always)]
fn combine_into(
    w: &[f32],
    rows: impl Fn(usize) -> usize + Copy,
    src: &[f32],
    out: &mut [f32],
    add: bool,
) {
    let width = out.len();
    let mut put = |c0: usize, v: &[f32]| {
        for (o, &a) in out[c0..c0 + v.len()].iter_mut().zip(v) {
            *o = if add { *o + a } else { a };
        }
    };
    let mut c0 = 0;
    while c0 + GROUP <= width {
        put(c0, &combine::<GROUP>(w, |r| rows(r) + c0, src));
        c0 += GROUP;
    }
    if c0 + 32 <= width {
        put(c0, &combine::<32>(w, |r| rows(r) + c0, src));
        c0 += 32;
    }
    while c0 + 16 <= width {
        put(c0, &combine::<16>(w, |r| rows(r) + c0, src));
        c0 += 16;
    }
    while c0 < width {
        put(c0, &combine::<1>(w, |r| rows(r) + c0, src));
        c0 += 1;
    }
}

/// `out[j] = Σ_c a[c]·t[c][j]` for the np columns (a multiple of 16).
#[inline(always)]
fn row_times(a: &[f32], t: &[f32], np: usize, out: &mut [f32]) {
    combine_into(a, |c| c * np, t, &mut out[..np], false);
}

/// `out += Σ_j w[j]·rows_j` over the head's n rows of `part` (values, or keys and queries in the backward
/// pass).
#[inline(always)]
fn weighted_rows(qkv: &[f32], s: Heads, (part, h): (usize, usize), w: &[f32], out: &mut [f32]) {
    combine_into(w, |j| at(s, j, part, h), qkv, &mut out[..s.head_dim], true);
}

/// `P = softmax(q·kᵀ·scale)` of head `h` into `w.p` (rows of np, zero past n).
#[inline(always)]
fn probabilities(qkv: &[f32], s: Heads, h: usize, scale: f32, w: &mut Scratch) {
    let (n, np) = (s.n, w.np);
    transpose_part(qkv, s, (1, h), &mut w.t, np);
    for i in 0..n {
        let pi = &mut w.p[i * np..(i + 1) * np];
        row_times(&qkv[at(s, i, 0, h)..][..s.head_dim], &w.t, np, pi);
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

/// One batch element, forward: `out` is its (N, D) rows, zero on entry.
#[inline(always)]
fn forward_one(qkv: &[f32], s: Heads, scale: f32, out: &mut [f32]) {
    let (n, hd, d) = (s.n, s.head_dim, s.d());
    let mut w = Scratch::new(s);
    for h in 0..s.heads {
        probabilities(qkv, s, h, scale, &mut w);
        for i in 0..n {
            let pi = &w.p[i * w.np..][..n];
            weighted_rows(qkv, s, (2, h), pi, &mut out[i * d + h * hd..][..hd]);
        }
    }
}

/// One batch element, backward: `dqkv` is its (N, 3·D) rows (zero on entry), from the output gradient
/// `dout` (N, D).
#[inline(always)]
fn backward_one(qkv: &[f32], dout: &[f32], s: Heads, scale: f32, dqkv: &mut [f32]) {
    let (n, hd, d) = (s.n, s.head_dim, s.d());
    let mut w = Scratch::new(s);
    let np = w.np;
    for h in 0..s.heads {
        probabilities(qkv, s, h, scale, &mut w);
        transpose_part(qkv, s, (2, h), &mut w.t, np);
        for i in 0..n {
            let g = &dout[i * d + h * hd..][..hd];
            // dP_i = dO_i·vᵀ; dS = P ⊙ (dP − Σ_j dP·P), scaled.
            let dsi = &mut w.ds[i * np..(i + 1) * np];
            row_times(g, &w.t, np, dsi);
            let pi = &w.p[i * np..(i + 1) * np];
            let weighted = sum(n, |j| dsi[j] * pi[j]);
            for j in 0..n {
                dsi[j] = pi[j] * (dsi[j] - weighted) * scale;
            }
        }
        // dV_j = Σ_i P[i][j]·dO_i (a column of P, gathered into a row).
        let mut column = vec![0f32; n];
        for j in 0..n {
            for (i, c) in column.iter_mut().enumerate() {
                *c = w.p[i * np + j];
            }
            let out = &mut dqkv[at(s, j, 2, h)..][..hd];
            combine_into(&column, |i| i * d + h * hd, dout, out, true);
        }
        // dQ_i = Σ_j dS[i][j]·k_j; dK_j = Σ_i dS[i][j]·q_i (a column of dS: gathered into a row first).
        for i in 0..n {
            let dsi = &w.ds[i * np..][..n];
            weighted_rows(qkv, s, (1, h), dsi, &mut dqkv[at(s, i, 0, h)..][..hd]);
        }
        for j in 0..n {
            for (i, c) in column.iter_mut().enumerate() {
                *c = w.ds[i * np + j];
            }
            weighted_rows(qkv, s, (0, h), &column, &mut dqkv[at(s, j, 1, h)..][..hd]);
        }
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

#[inline(always)]
fn run_job(job: Job, s: Heads, scale: f32) {
    match job {
        Job::Forward { qkv, out } => forward_one(qkv, s, scale, out),
        Job::Backward { qkv, dout, dqkv } => backward_one(qkv, dout, s, scale, dqkv),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn run_avx512(job: Job, s: Heads, scale: f32) {
    run_job(job, s, scale)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_avx2(job: Job, s: Heads, scale: f32) {
    run_job(job, s, scale)
}

fn run(isa: Isa, job: Job, s: Heads, scale: f32) {
    assert!(isa.supported(), "{isa:?} is not supported by this CPU");
    match isa {
        // SAFETY: the CPU has the features (checked above).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { run_avx512(job, s, scale) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { run_avx2(job, s, scale) },
        _ => run_job(job, s, scale),
    }
}

/// Attention of `qkv` (B, N, 3·D) → (B, N, D), scores scaled by `scale` (1/√head_dim in a ViT).
///
/// # Panics
/// If `qkv` does not hold B × N × 3·D values.
pub fn forward(isa: Isa, qkv: &[f32], s: Heads, scale: f32) -> Vec<f32> {
    let (rows_in, rows_out) = (s.n * 3 * s.d(), s.n * s.d());
    assert_eq!(qkv.len(), s.batch * rows_in, "qkv holds (B, N, 3·D) values");
    let mut out = vec![0f32; s.batch * rows_out];
    out.par_chunks_mut(rows_out.max(1))
        .zip(qkv.par_chunks(rows_in.max(1)))
        .for_each(|(o, q)| run(isa, Job::Forward { qkv: q, out: o }, s, scale));
    out
}

/// The gradient of `qkv` (B, N, 3·D) from the output gradient `dout` (B, N, D).
///
/// # Panics
/// If the buffers do not hold the sizes `s` names.
pub fn backward(isa: Isa, qkv: &[f32], dout: &[f32], s: Heads, scale: f32) -> Vec<f32> {
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
                s,
                scale,
            )
        });
    dqkv
}
