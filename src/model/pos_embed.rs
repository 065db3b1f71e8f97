//! Resampling a ViT's absolute position embeddings to another grid (loading 224px weights for 32px
//! CIFAR images), as timm's `resample_abs_pos_embed` does by default: prefix tokens kept, the grid resized
//! with PyTorch's anti-aliased bicubic filter (`F.interpolate(mode="bicubic", antialias=True)`).
//! Backend-neutral: works on host tensors before they are handed to an engine.

use crate::tensor::HostTensor;

/// `pos_embed` (1, prefix + old², D) → (1, prefix + new², D).
pub fn resample(pos: &HostTensor, prefix: usize, new_grid: usize) -> anyhow::Result<HostTensor> {
    let [one, tokens, dim] = pos.shape[..] else {
        anyhow::bail!(
            "pos_embed has shape {:?}, expected (1, tokens, dim)",
            pos.shape
        );
    };
    let old_grid = ((tokens.saturating_sub(prefix)) as f64).sqrt().round() as usize;
    if one != 1 || old_grid * old_grid + prefix != tokens {
        anyhow::bail!(
            "pos_embed has shape {:?}: not {prefix} prefix token(s) plus a square grid",
            pos.shape
        );
    }
    let old_w = weights(old_grid, new_grid);
    let mut out = pos.data[..prefix * dim].to_vec();
    out.resize((prefix + new_grid * new_grid) * dim, 0.0);
    let grid = &pos.data[prefix * dim..];
    // Rows first (H), then columns (W), each with the same separable filter; accumulate in f64.
    let mut rows = vec![0f64; new_grid * old_grid * dim];
    for (oy, taps) in old_w.iter().enumerate() {
        for ox in 0..old_grid {
            for &(iy, w) in taps {
                let src = &grid[(iy * old_grid + ox) * dim..][..dim];
                let dst = &mut rows[(oy * old_grid + ox) * dim..][..dim];
                for (d, s) in dst.iter_mut().zip(src) {
                    *d += w * *s as f64;
                }
            }
        }
    }
    for oy in 0..new_grid {
        for (ox, taps) in old_w.iter().enumerate() {
            let dst = &mut out[(prefix + oy * new_grid + ox) * dim..][..dim];
            for &(ix, w) in taps {
                let src = &rows[(oy * old_grid + ix) * dim..][..dim];
                for (d, s) in dst.iter_mut().zip(src) {
                    *d += (w * s) as f32;
                }
            }
        }
    }
    Ok(HostTensor {
        shape: vec![1, prefix + new_grid * new_grid, dim],
        data: out,
    })
}

/// PyTorch's anti-aliased cubic filter (a = -0.5, as PIL).
fn cubic(x: f64) -> f64 {
    let a = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * a
    } else {
        0.0
    }
}

/// For each output index, the input indices and normalised weights (align_corners=False).
fn weights(input: usize, output: usize) -> Vec<Vec<(usize, f64)>> {
    let scale = input as f64 / output as f64;
    let support = if scale >= 1.0 { 2.0 * scale } else { 2.0 };
    let inv = if scale >= 1.0 { 1.0 / scale } else { 1.0 };
    (0..output)
        .map(|i| {
            let center = scale * (i as f64 + 0.5);
            let lo = ((center - support + 0.5).floor().max(0.0)) as usize;
            let hi = ((center + support + 0.5).floor() as usize).min(input);
            let taps: Vec<(usize, f64)> = (lo..hi)
                .map(|j| (j, cubic((j as f64 - center + 0.5) * inv)))
                .collect();
            let total: f64 = taps.iter().map(|(_, w)| w).sum();
            taps.into_iter()
                .map(|(j, w)| (j, if total != 0.0 { w / total } else { 0.0 }))
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid(g: usize, dim: usize, f: impl Fn(usize, usize, usize) -> f32) -> HostTensor {
        let mut data = vec![9.0; dim];
        for y in 0..g {
            for x in 0..g {
                for d in 0..dim {
                    data.push(f(y, x, d));
                }
            }
        }
        HostTensor {
            shape: vec![1, 1 + g * g, dim],
            data,
        }
    }

    #[test]
    fn same_size_is_identity_and_prefix_is_kept() {
        let pos = grid(3, 2, |y, x, d| (y * 10 + x + d) as f32);
        let out = resample(&pos, 1, 3).unwrap();
        assert_eq!(out.shape, pos.shape);
        for (a, b) in out.data.iter().zip(&pos.data) {
            assert!((a - b).abs() < 1e-5);
        }
    }

    #[test]
    fn constants_stay_constant_up_and_down() {
        let pos = grid(7, 3, |_, _, d| d as f32 + 0.5);
        for g in [2, 5, 14] {
            let out = resample(&pos, 1, g).unwrap();
            assert_eq!(out.shape, vec![1, 1 + g * g, 3]);
            assert_eq!(&out.data[..3], &[9.0, 9.0, 9.0]);
            for (i, v) in out.data[3..].iter().enumerate() {
                assert!((v - ((i % 3) as f32 + 0.5)).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn not_a_square_grid_is_refused() {
        let pos = HostTensor {
            shape: vec![1, 6, 2],
            data: vec![0.0; 12],
        };
        assert!(resample(&pos, 1, 2)
            .unwrap_err()
            .to_string()
            .contains("square grid"));
    }
}
