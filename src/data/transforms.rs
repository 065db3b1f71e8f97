//! Augmentation and normalisation, as torchvision defines them, on 8-bit HWC images. Randomness comes from
//! a generator keyed by (seed, epoch, sample index), so results do not depend on worker scheduling.

use super::Image;
use crate::platform::rng::Rng;
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
                let (y, x, h, w) = resized_crop_box(img.height, img.width, *scale, *ratio, rng);
                resize_region(&img, (y, x, h, w), *size, *size)
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

/// `img` resized to `h`×`w` (see `resize_region`).
fn resize_exact(img: &Image, h: usize, w: usize) -> Image {
    resize_region(img, (0, 0, img.height, img.width), h, w)
}

thread_local! {
    static RESIZER: std::cell::RefCell<fast_image_resize::Resizer> =
        std::cell::RefCell::new(fast_image_resize::Resizer::new());
}

/// The region `(top, left, height, width)` of `img` resized to `h`×`w` with Pillow's bilinear filter, which
/// widens its support when shrinking (antialiasing) — what torchvision's PIL path and `antialias=True` do.
/// The region is cut out first, as torchvision's `resized_crop` does, so the filter never reads pixels
/// outside it.
fn resize_region(
    img: &Image,
    (top, left, rh, rw): (usize, usize, usize, usize),
    h: usize,
    w: usize,
) -> Image {
    use fast_image_resize::{images, FilterType, PixelType, ResizeAlg, ResizeOptions};
    if (top, left, rh, rw) != (0, 0, img.height, img.width) {
        return resize_region(&crop(img, top, left, rh, rw), (0, 0, rh, rw), h, w);
    }
    if (h, w) == (rh, rw) {
        return img.clone();
    }
    let options = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::Bilinear));
    let resize_plane = |pixels: &[u8], pixel: PixelType| -> Vec<u8> {
        let src = images::ImageRef::new(img.width as u32, img.height as u32, pixels, pixel)
            .expect("u8 buffers are always aligned and Image keeps pixels.len() == h * w * c");
        let mut dst = images::Image::new(w as u32, h as u32, pixel);
        RESIZER
            .with(|r| r.borrow_mut().resize(&src, &mut dst, &options))
            .expect("same pixel type on both sides and a crop box inside the image");
        dst.into_vec()
    };
    let c = img.channels;
    let pixels = match c {
        1 => resize_plane(&img.pixels, PixelType::U8),
        2 => resize_plane(&img.pixels, PixelType::U8x2),
        3 => resize_plane(&img.pixels, PixelType::U8x3),
        4 => resize_plane(&img.pixels, PixelType::U8x4),
        _ => {
            // More channels than any pixel type: resample each channel as its own plane.
            let mut out = vec![0u8; h * w * c];
            for ch in 0..c {
                let plane: Vec<u8> = img.pixels.iter().skip(ch).step_by(c).copied().collect();
                for (i, v) in resize_plane(&plane, PixelType::U8).into_iter().enumerate() {
                    out[i * c + ch] = v;
                }
            }
            out
        }
    };
    Image {
        height: h,
        width: w,
        channels: c,
        pixels,
        label: img.label,
    }
}

/// torchvision's RandomResizedCrop.get_params on an image of `height`×`width`: 10 tries at a random
/// area/aspect, else a centre crop. (top, left, height, width).
pub(super) fn resized_crop_box(
    height: usize,
    width: usize,
    scale: [f64; 2],
    ratio: [f64; 2],
    rng: &mut Rng,
) -> (usize, usize, usize, usize) {
    let (height, width) = (height as f64, width as f64);
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
    fn shrinking_is_antialiased_like_pillow() {
        // A one-pixel checkerboard halved: Pillow's bilinear filter averages neighbours (mid grey), where
        // point-sampled bilinear would pick one phase of the pattern (black or white stripes).
        let (h, w) = (16, 16);
        let pixels: Vec<u8> = (0..h * w)
            .map(|i| if (i / w + i % w) % 2 == 0 { 0 } else { 255 })
            .collect();
        let img = Image {
            height: h,
            width: w,
            channels: 1,
            pixels,
            label: 0,
        };
        let small = resize_exact(&img, 8, 8);
        assert!(
            small.pixels[9..55]
                .iter()
                .all(|&v| (100..=155).contains(&v)),
            "{:?}",
            small.pixels
        );
        // Channels beyond four resample plane by plane.
        let rgbish = ramp(9, 7);
        let five = Image {
            channels: 5,
            pixels: (0..9 * 7 * 5).map(|i| (i * 7 % 256) as u8).collect(),
            ..rgbish.clone()
        };
        let out = resize_exact(&five, 4, 3);
        assert_eq!((out.channels, out.pixels.len()), (5, 4 * 3 * 5));
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
