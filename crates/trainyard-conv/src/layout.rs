//! NCHW ↔ channel-blocked `(N, ⌈C/L⌉, H, W, L)` data. Channels past C in the last block are zeros. (No
//! padding: the convolutions read only the taps inside their input, `taps`.)

use rayon::prelude::*;

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
