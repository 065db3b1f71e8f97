//! Augmentation and normalisation, as torchvision defines them, on 8-bit HWC images. Randomness comes from
//! a generator keyed by (seed, epoch, sample index), so results do not depend on worker scheduling.

use super::Image;
use crate::rng::Rng;
use crate::schema::Transform;

/// Apply the geometric/colour steps, then append normalised `f32` CHW to `out`; returns (C, H, W).
pub fn apply(
    steps: &[Transform],
    mut img: Image,
    rng: &mut Rng,
    out: &mut Vec<f32>,
) -> (usize, usize, usize) {
    let mut mean: Vec<f64> = vec![0.0; img.channels];
    let mut std: Vec<f64> = vec![1.0; img.channels];
    for step in steps {
        img = match step {
            Transform::RandomCrop { size, padding } => {
                let padded = pad(&img, *padding);
                let y = rng.below(padded.height.saturating_sub(*size) + 1);
                let x = rng.below(padded.width.saturating_sub(*size) + 1);
                crop(&padded, y, x, *size, *size)
            }
            Transform::RandomResizedCrop { size, scale, ratio } => {
                let (y, x, h, w) = resized_crop_box(&img, *scale, *ratio, rng);
                resize_exact(&crop(&img, y, x, h, w), *size, *size)
            }
            Transform::HorizontalFlip { p } => {
                if rng.next_f64() < *p {
                    flip(&img)
                } else {
                    img
                }
            }
            Transform::Resize { size } => {
                // torchvision: the shorter side becomes `size`, aspect ratio kept.
                let (h, w) = if img.height <= img.width {
                    (
                        *size,
                        (*size as f64 * img.width as f64 / img.height as f64) as usize,
                    )
                } else {
                    (
                        (*size as f64 * img.height as f64 / img.width as f64) as usize,
                        *size,
                    )
                };
                resize_exact(&img, h, w)
            }
            Transform::CenterCrop { size } => {
                let y = img.height.saturating_sub(*size) / 2;
                let x = img.width.saturating_sub(*size) / 2;
                crop(
                    &pad_to(&img, *size),
                    y.min(img.height),
                    x.min(img.width),
                    *size,
                    *size,
                )
            }
            Transform::Normalize { mean: m, std: s } => {
                for c in 0..img.channels {
                    mean[c] = m.get(c).or(m.last()).copied().unwrap_or(0.0);
                    std[c] = s.get(c).or(s.last()).copied().unwrap_or(1.0);
                }
                img
            }
        };
    }
    let plane = img.height * img.width;
    out.reserve(plane * img.channels);
    for c in 0..img.channels {
        let (m, s) = (mean[c] as f32, std[c] as f32);
        for p in 0..plane {
            out.push((img.pixels[p * img.channels + c] as f32 / 255.0 - m) / s);
        }
    }
    (img.channels, img.height, img.width)
}

fn pad(img: &Image, padding: usize) -> Image {
    if padding == 0 {
        return img.clone();
    }
    let (h, w, c) = (
        img.height + 2 * padding,
        img.width + 2 * padding,
        img.channels,
    );
    let mut pixels = vec![0u8; h * w * c];
    for y in 0..img.height {
        let src = &img.pixels[y * img.width * c..(y + 1) * img.width * c];
        let dst = ((y + padding) * w + padding) * c;
        pixels[dst..dst + src.len()].copy_from_slice(src);
    }
    Image {
        height: h,
        width: w,
        channels: c,
        pixels,
        label: img.label,
    }
}

/// Zero-pad (centred) up to at least `size` in both dimensions, as torchvision's CenterCrop does.
fn pad_to(img: &Image, size: usize) -> Image {
    if img.height >= size && img.width >= size {
        return img.clone();
    }
    let p = size.saturating_sub(img.height.min(img.width)).div_ceil(2);
    pad(img, p)
}

fn crop(img: &Image, y: usize, x: usize, h: usize, w: usize) -> Image {
    let c = img.channels;
    let h = h.min(img.height - y.min(img.height));
    let w = w.min(img.width - x.min(img.width));
    let mut pixels = Vec::with_capacity(h * w * c);
    for row in y..y + h {
        let start = (row * img.width + x) * c;
        pixels.extend_from_slice(&img.pixels[start..start + w * c]);
    }
    Image {
        height: h,
        width: w,
        channels: c,
        pixels,
        label: img.label,
    }
}

fn flip(img: &Image) -> Image {
    let c = img.channels;
    let mut pixels = Vec::with_capacity(img.pixels.len());
    for y in 0..img.height {
        for x in (0..img.width).rev() {
            let at = (y * img.width + x) * c;
            pixels.extend_from_slice(&img.pixels[at..at + c]);
        }
    }
    Image {
        pixels,
        ..img.clone()
    }
}

/// Bilinear resize (half-pixel centres, as PIL/torchvision without antialias).
pub fn resize_exact(img: &Image, h: usize, w: usize) -> Image {
    if h == img.height && w == img.width {
        return img.clone();
    }
    let c = img.channels;
    let (sy, sx) = (img.height as f32 / h as f32, img.width as f32 / w as f32);
    let mut pixels = vec![0u8; h * w * c];
    for y in 0..h {
        let fy = ((y as f32 + 0.5) * sy - 0.5).clamp(0.0, (img.height - 1) as f32);
        let (y0, ty) = (fy.floor() as usize, fy.fract());
        let y1 = (y0 + 1).min(img.height - 1);
        for x in 0..w {
            let fx = ((x as f32 + 0.5) * sx - 0.5).clamp(0.0, (img.width - 1) as f32);
            let (x0, tx) = (fx.floor() as usize, fx.fract());
            let x1 = (x0 + 1).min(img.width - 1);
            for ch in 0..c {
                let p = |yy: usize, xx: usize| img.pixels[(yy * img.width + xx) * c + ch] as f32;
                let top = p(y0, x0) * (1.0 - tx) + p(y0, x1) * tx;
                let bottom = p(y1, x0) * (1.0 - tx) + p(y1, x1) * tx;
                pixels[(y * w + x) * c + ch] = (top * (1.0 - ty) + bottom * ty).round() as u8;
            }
        }
    }
    Image {
        height: h,
        width: w,
        channels: c,
        pixels,
        label: img.label,
    }
}

/// torchvision's RandomResizedCrop.get_params: 10 tries at a random area/aspect, else a centre crop.
fn resized_crop_box(
    img: &Image,
    scale: [f64; 2],
    ratio: [f64; 2],
    rng: &mut Rng,
) -> (usize, usize, usize, usize) {
    let (height, width) = (img.height as f64, img.width as f64);
    let area = height * width;
    let (lr0, lr1) = (ratio[0].ln(), ratio[1].ln());
    for _ in 0..10 {
        let target = area * rng.uniform(scale[0], scale[1]);
        let aspect = rng.uniform(lr0, lr1).exp();
        let w = (target * aspect).sqrt().round();
        let h = (target / aspect).sqrt().round();
        if w > 0.0 && h > 0.0 && w <= width && h <= height {
            let y = rng.below((height - h) as usize + 1);
            let x = rng.below((width - w) as usize + 1);
            return (y, x, h as usize, w as usize);
        }
    }
    let in_ratio = width / height;
    let (w, h) = if in_ratio < ratio[0] {
        (width, (width / ratio[0]).round())
    } else if in_ratio > ratio[1] {
        ((height * ratio[1]).round(), height)
    } else {
        (width, height)
    };
    (
        ((height - h) / 2.0) as usize,
        ((width - w) / 2.0) as usize,
        h as usize,
        w as usize,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(h: usize, w: usize) -> Image {
        Image {
            height: h,
            width: w,
            channels: 1,
            pixels: (0..h * w).map(|i| i as u8).collect(),
            label: 0,
        }
    }

    #[test]
    fn normalize_gives_chw_floats() {
        let img = Image {
            height: 1,
            width: 2,
            channels: 3,
            pixels: vec![255, 0, 51, 0, 255, 102],
            label: 0,
        };
        let mut out = Vec::new();
        let steps = [Transform::Normalize {
            mean: vec![0.5, 0.5, 0.0],
            std: vec![0.5, 0.5, 1.0],
        }];
        apply(&steps, img, &mut Rng::new(0), &mut out);
        assert_eq!(out, vec![1.0, -1.0, -1.0, 1.0, 0.2, 0.4]);
    }

    #[test]
    fn random_crop_with_padding_keeps_size_and_content() {
        let steps = [Transform::RandomCrop {
            size: 4,
            padding: 2,
        }];
        let mut seen_shift = false;
        for seed in 0..20 {
            let mut out = Vec::new();
            apply(&steps, ramp(4, 4), &mut Rng::new(seed), &mut out);
            assert_eq!(out.len(), 16);
            seen_shift |= out[0] == 0.0 && out.iter().any(|v| *v > 0.0);
        }
        assert!(seen_shift, "padding shows up as zeros in some crops");
    }

    #[test]
    fn flip_mirrors_rows() {
        let steps = [Transform::HorizontalFlip { p: 1.0 }];
        let mut out = Vec::new();
        apply(&steps, ramp(2, 3), &mut Rng::new(0), &mut out);
        let px: Vec<u8> = out.iter().map(|v| (v * 255.0).round() as u8).collect();
        assert_eq!(px, vec![2, 1, 0, 5, 4, 3]);
    }

    #[test]
    fn resize_and_center_crop_shapes() {
        let steps = [
            Transform::Resize { size: 8 },
            Transform::CenterCrop { size: 6 },
        ];
        let mut out = Vec::new();
        apply(&steps, ramp(4, 6), &mut Rng::new(0), &mut out);
        assert_eq!(out.len(), 36);
        let steps = [Transform::RandomResizedCrop {
            size: 5,
            scale: [0.08, 1.0],
            ratio: [0.75, 1.333],
        }];
        let mut out = Vec::new();
        apply(&steps, ramp(16, 12), &mut Rng::new(4), &mut out);
        assert_eq!(out.len(), 25);
    }
}
