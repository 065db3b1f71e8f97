//! ImageNet-style training input straight from a JPEG file: RandomResizedCrop, then a horizontal flip and
//! normalisation, in one pass that decodes no more of the file than the crop needs. The crop is drawn
//! from the header's size with the same random numbers as the general path (`transforms::apply`); the
//! file is decoded at 1/2, 1/4 or 1/8 of its size in the DCT domain when the crop still covers the output
//! at that size, and only down to the crop's last row; the crop is resized (Pillow's antialiased
//! bilinear filter) from the decoded rows, and flipped and normalised on its way into the batch buffer.
//!
//! At full size (a crop too small to shrink in the DCT domain) the result equals the general path's to
//! the bit: the same decoder, the same crop, the same filter. Shrunk in the DCT domain it differs as
//! Pillow's `draft` mode differs from a full decode.

use super::{jpeg, transforms, DataError, EncodedImage};
use crate::platform::rng::Rng;
use crate::schema::Transform;

/// The training transforms this path computes: a random resized crop, then optionally a flip and a
/// normalisation (in either order).
struct Plan {
    size: usize,
    scale: [f64; 2],
    ratio: [f64; 2],
    flip: Option<f64>,
    mean: Vec<f64>,
    std: Vec<f64>,
}

fn plan(steps: &[Transform], channels: usize) -> Option<Plan> {
    let (first, rest) = steps.split_first()?;
    let Transform::RandomResizedCrop { size, scale, ratio } = first else {
        return None;
    };
    let mut plan = Plan {
        size: *size,
        scale: *scale,
        ratio: *ratio,
        flip: None,
        mean: vec![0.0; channels],
        std: vec![1.0; channels],
    };
    let mut normalized = false;
    for step in rest {
        match step {
            Transform::HorizontalFlip { p } if plan.flip.is_none() => plan.flip = Some(*p),
            Transform::Normalize { mean, std } if !normalized => {
                normalized = true;
                for c in 0..channels {
                    plan.mean[c] = mean.get(c).or(mean.last()).copied().unwrap_or(0.0);
                    plan.std[c] = std.get(c).or(std.last()).copied().unwrap_or(1.0);
                }
            }
            _ => return None,
        }
    }
    Some(plan)
}

/// A worker thread's buffers, reused from image to image (each allocation of their size would be
/// mapped and zero-filled afresh).
#[derive(Default)]
struct Scratch {
    resizer: fast_image_resize::Resizer,
    decoded: Vec<u8>,
    region: Vec<u8>,
    resized: Vec<u8>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// `steps` applied to the JPEG `image`, appended to `out` as normalised `f32` CHW; (C, H, W). `None`
/// when this path does not apply (not a JPEG, other transforms): the caller decodes and uses
/// `transforms::apply`, with `rng` untouched.
pub fn apply_encoded(
    steps: &[Transform],
    image: &EncodedImage,
    rng: &mut Rng,
    out: &mut Vec<f32>,
) -> Option<Result<(usize, usize, usize), DataError>> {
    if !jpeg::is_jpeg(&image.bytes) {
        return None;
    }
    let plan = plan(steps, image.channels.clamp(1, 3))?;
    let (height, width) = jpeg::size(&image.bytes).ok()?;
    let (top, left, h, w) =
        transforms::resized_crop_box(height, width, plan.scale, plan.ratio, rng);
    let flip = plan.flip.is_some_and(|p| rng.next_f64() < p);
    // The most the DCT domain may shrink: the crop must still cover the output at that size.
    let scale = [1u8, 2, 4]
        .into_iter()
        .find(|&k| h * k as usize >= plan.size * 8 && w * k as usize >= plan.size * 8)
        .unwrap_or(8);
    let scaled = |v: usize, full: usize, to: usize| v as f64 * to as f64 / full as f64;
    Some(SCRATCH.with(|cell| {
        let scratch = &mut *cell.borrow_mut();
        // The crop at this scale (libjpeg's size there: ceil(size * k / 8)), on whole pixels: at full size
        // exactly the drawn box.
        let (sh, sw) = (
            (height * scale as usize).div_ceil(8),
            (width * scale as usize).div_ceil(8),
        );
        let y0 = (scaled(top, height, sh).round() as usize).min(sh - 1);
        let x0 = (scaled(left, width, sw).round() as usize).min(sw - 1);
        let y1 = (scaled(top + h, height, sh).round() as usize).clamp(y0 + 1, sh);
        let x1 = (scaled(left + w, width, sw).round() as usize).clamp(x0 + 1, sw);
        let rows = jpeg::decode_region(
            &image.bytes,
            image.channels,
            scale,
            Some((y0, x0, y1 - y0, x1 - x0)),
            std::mem::take(&mut scratch.decoded),
        )
        .map_err(|e| image.corrupt(e))?;
        resize(
            scratch,
            &rows,
            (0, x0 - rows.left, rows.rows, x1 - x0),
            plan.size,
        );
        let channels = rows.channels;
        scratch.decoded = rows.pixels;
        Ok(normalize_into(
            &scratch.resized,
            channels,
            plan.size,
            flip,
            &plan,
            out,
        ))
    }))
}

/// The crop `(top, left, height, width)` of the decoded rows resized to `size`×`size` into
/// `scratch.resized`. The crop is cut out first, as torchvision's `resized_crop` (and
/// `transforms::apply`) cut it, so the filter never reads past its edges.
fn resize(
    scratch: &mut Scratch,
    rows: &jpeg::Rows,
    (top, left, height, width): (usize, usize, usize, usize),
    size: usize,
) {
    use fast_image_resize::{images, FilterType, PixelType, ResizeAlg, ResizeOptions};
    let c = rows.channels;
    let pixel = match c {
        1 => PixelType::U8,
        _ => PixelType::U8x3,
    };
    let region = &mut scratch.region;
    region.clear();
    for y in top..top + height {
        let start = (y * rows.width + left) * c;
        region.extend_from_slice(&rows.pixels[start..start + width * c]);
    }
    scratch.resized.resize(size * size * c, 0);
    if (height, width) == (size, size) {
        scratch.resized.copy_from_slice(region);
        return;
    }
    let src = images::ImageRef::new(width as u32, height as u32, region, pixel)
        .expect("the region holds height × width × channels bytes");
    let mut dst =
        images::Image::from_slice_u8(size as u32, size as u32, &mut scratch.resized, pixel)
            .expect("the buffer holds size × size × channels bytes");
    let options = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::Bilinear));
    scratch
        .resizer
        .resize(&src, &mut dst, &options)
        .expect("same pixel type on both sides");
}

/// `pixels` (HWC, `size`×`size`) appended to `out` as CHW, mirrored when `flip`, normalised as
/// `transforms::apply` normalises: each channel's 256 values are computed once with the same arithmetic
/// (so the same bits) and looked up.
fn normalize_into(
    pixels: &[u8],
    channels: usize,
    size: usize,
    flip: bool,
    plan: &Plan,
    out: &mut Vec<f32>,
) -> (usize, usize, usize) {
    let tables: Vec<[f32; 256]> = (0..channels)
        .map(|c| {
            let (m, s) = (plan.mean[c] as f32, plan.std[c] as f32);
            std::array::from_fn(|v| (v as f32 / 255.0 - m) / s)
        })
        .collect();
    let plane = size * size;
    let base = out.len();
    out.resize(base + channels * plane, 0.0);
    let (planes, _) = out[base..].split_at_mut(channels * plane);
    for (c, (table, plane_out)) in tables
        .iter()
        .zip(planes.chunks_exact_mut(plane))
        .enumerate()
    {
        for (row_in, row_out) in pixels
            .chunks_exact(size * channels)
            .zip(plane_out.chunks_exact_mut(size))
        {
            let values = row_in.chunks_exact(channels).map(|p| table[p[c] as usize]);
            if flip {
                for (o, v) in row_out.iter_mut().rev().zip(values) {
                    *o = v;
                }
            } else {
                for (o, v) in row_out.iter_mut().zip(values) {
                    *o = v;
                }
            }
        }
    }
    (channels, size, size)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `w`×`h` JPEG of a smooth pattern with texture.
    fn photo(w: u32, h: u32) -> Vec<u8> {
        let img = image::RgbImage::from_fn(w, h, |x, y| {
            let t = ((x * 7 + y * 3) % 23) as u8;
            image::Rgb([(x % 256) as u8 ^ t, (y % 256) as u8, ((x + y) % 256) as u8])
        });
        let mut out = std::io::Cursor::new(Vec::new());
        img.write_to(&mut out, image::ImageFormat::Jpeg).unwrap();
        out.into_inner()
    }

    fn encoded(bytes: Vec<u8>) -> EncodedImage {
        EncodedImage {
            bytes,
            label: 3,
            channels: 3,
            shard: "test.tar".into(),
            name: "sample 'k'".into(),
        }
    }

    fn imagenet(size: usize) -> Vec<Transform> {
        vec![
            Transform::RandomResizedCrop {
                size,
                scale: [0.08, 1.0],
                ratio: [0.75, 4.0 / 3.0],
            },
            Transform::HorizontalFlip { p: 0.5 },
            Transform::Normalize {
                mean: vec![0.485, 0.456, 0.406],
                std: vec![0.229, 0.224, 0.225],
            },
        ]
    }

    /// Without DCT scaling (crops smaller than twice the output) the fused path gives the general
    /// path's floats to the bit, whatever the crop and flip; with it, values stay close.
    #[test]
    fn equals_the_general_path() {
        let image = encoded(photo(120, 90));
        let steps = imagenet(64);
        for key in 0..40u64 {
            let (mut fused, mut general) = (Vec::new(), Vec::new());
            let dims = apply_encoded(&steps, &image, &mut Rng::keyed(&[1, key]), &mut fused)
                .expect("a JPEG and ImageNet's transforms")
                .unwrap();
            let decoded = image.clone().decode().unwrap();
            let want = transforms::apply(&steps, decoded, &mut Rng::keyed(&[1, key]), &mut general);
            assert_eq!(dims, want);
            let worst = fused
                .iter()
                .zip(&general)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            let at = fused.iter().zip(&general).position(|(a, b)| a != b);
            assert!(
                fused == general,
                "crop {key} differs: worst {worst} first at {at:?} of {}",
                fused.len()
            );
        }
        let big = encoded(photo(640, 480));
        let steps = imagenet(32);
        let mut worst = 0.0f32;
        for key in 0..20u64 {
            let (mut fused, mut general) = (Vec::new(), Vec::new());
            apply_encoded(&steps, &big, &mut Rng::keyed(&[2, key]), &mut fused)
                .unwrap()
                .unwrap();
            let decoded = big.clone().decode().unwrap();
            transforms::apply(&steps, decoded, &mut Rng::keyed(&[2, key]), &mut general);
            let mean_diff: f32 = fused
                .iter()
                .zip(&general)
                .map(|(a, b)| (a - b).abs())
                .sum::<f32>()
                / fused.len() as f32;
            worst = worst.max(mean_diff);
        }
        // In normalised units (1/255/0.225 per level): a few levels on average at most.
        assert!(worst < 0.1, "{worst}");
    }

    #[test]
    fn other_input_takes_the_general_path() {
        let steps = imagenet(32);
        let png = {
            let img = image::RgbImage::new(40, 40);
            let mut out = std::io::Cursor::new(Vec::new());
            img.write_to(&mut out, image::ImageFormat::Png).unwrap();
            out.into_inner()
        };
        let mut rng = Rng::keyed(&[5]);
        let before = rng.clone().next_f64();
        assert!(apply_encoded(&steps, &encoded(png), &mut rng, &mut Vec::new()).is_none());
        let resize_first = vec![Transform::Resize { size: 32 }];
        assert!(apply_encoded(
            &resize_first,
            &encoded(photo(40, 40)),
            &mut rng,
            &mut Vec::new()
        )
        .is_none());
        assert_eq!(
            rng.next_f64(),
            before,
            "the random numbers were not touched"
        );
        // Cut off a third of the way through the image data: every crop reaches further down.
        let bytes = photo(300, 200);
        let err = apply_encoded(
            &steps,
            &encoded(bytes[..bytes.len() / 3].to_vec()),
            &mut rng,
            &mut Vec::new(),
        )
        .unwrap()
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("test.tar") && err.contains("sample 'k'") && err.contains("truncated"),
            "{err}"
        );
    }
}
