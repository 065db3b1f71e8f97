//! NCHW ↔ channel-blocked `(N, ⌈C/L⌉, H, W, L)` data, and the zero padding of blocked planes. Channels past
//! C in the last block are zeros.

use crate::buffer::{assume_init, uninit};
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// NCHW data → blocked data (zeros in the lanes past `c`).
pub fn block(data: &[f32], (n, c, hw): (usize, usize, usize), lanes: usize) -> Vec<f32> {
    let cb = c.div_ceil(lanes);
    let mut out = vec![0f32; n * cb * hw * lanes];
    out.par_chunks_mut(hw * lanes)
        .enumerate()
        .for_each(|(plane, dst)| {
            let (img, b) = (plane / cb, plane % cb);
            for lane in 0..lanes.min(c - b * lanes) {
                let src = &data[(img * c + b * lanes + lane) * hw..][..hw];
                for (p, v) in src.iter().enumerate() {
                    dst[p * lanes + lane] = *v;
                }
            }
        });
    out
}

/// Blocked data → NCHW data with `c` channels.
pub fn unblock(data: &[f32], (n, c, hw): (usize, usize, usize), lanes: usize) -> Vec<f32> {
    let cb = c.div_ceil(lanes);
    let mut out = vec![0f32; n * c * hw];
    out.par_chunks_mut(hw).enumerate().for_each(|(plane, dst)| {
        let (img, ch) = (plane / c, plane % c);
        let src = &data[(img * cb + ch / lanes) * hw * lanes..][..hw * lanes];
        for (p, d) in dst.iter_mut().enumerate() {
            *d = src[p * lanes + ch % lanes];
        }
    });
    out
}

/// Blocked `x` with `p` zero pixels around each plane: (N, CB, H + 2p, W + 2p, L).
pub fn pad(x: &[f32], (n, cb, h, w, l): (usize, usize, usize, usize, usize), p: usize) -> Vec<f32> {
    let (hp, wp) = (h + 2 * p, w + 2 * p);
    let mut out = uninit(n * cb * hp * wp * l);
    out.par_chunks_mut(hp * wp * l)
        .zip(x.par_chunks(h * w * l))
        .for_each(|(dst, src)| {
            let zero = MaybeUninit::new(0f32);
            // Top rows, each row's left border, then its right border with the next row's left one.
            dst[..(p * wp + p) * l].fill(zero);
            for y in 0..h {
                let row = ((y + p) * wp + p) * l;
                for (d, s) in dst[row..][..w * l]
                    .iter_mut()
                    .zip(&src[y * w * l..][..w * l])
                {
                    *d = MaybeUninit::new(*s);
                }
                let gap_end = if y + 1 < h {
                    row + (w + 2 * p) * l
                } else {
                    dst.len()
                };
                dst[row + w * l..gap_end].fill(zero);
            }
        });
    // SAFETY: every element of every plane was written above (borders zero, interior copied).
    unsafe { assume_init(out) }
}

/// The inner (H, W) of each padded plane: the inverse of `pad`.
pub fn crop(
    x: &[f32],
    (n, cb, h, w, l): (usize, usize, usize, usize, usize),
    p: usize,
) -> Vec<f32> {
    let (hp, wp) = (h + 2 * p, w + 2 * p);
    let mut out = uninit(n * cb * h * w * l);
    out.par_chunks_mut(h * w * l)
        .zip(x.par_chunks(hp * wp * l))
        .for_each(|(dst, src)| {
            for y in 0..h {
                let row = &src[((y + p) * wp + p) * l..][..w * l];
                for (d, s) in dst[y * w * l..][..w * l].iter_mut().zip(row) {
                    *d = MaybeUninit::new(*s);
                }
            }
        });
    // SAFETY: every row of every plane was copied.
    unsafe { assume_init(out) }
}
