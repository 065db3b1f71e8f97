//! JPEG decoding for training input with libjpeg-turbo's decoder (`mozjpeg-sys` builds it, with its
//! SIMD when `nasm` is installed): the decoder Pillow uses, with the same integer IDCT and upsampling, so
//! the pixels are Pillow's. For a crop it decodes no more than the crop needs: at 1/2, 1/4 or 1/8 of the
//! size in the DCT domain when the crop, resized to the output, allows it, and only down to the crop's
//! last row.
//!
//! libjpeg reports a fatal error by calling back into Rust, which unwinds (`resume_unwind`) to the
//! `catch_unwind` around each decode here, so a damaged file is an `Err`, never an abort. A file that
//! ends early is an error too (libjpeg only warns and pads it with gray), as Pillow's default is.

mod entropy;

use super::Image;
use mozjpeg_sys::JDIMENSION as Dimension;
use mozjpeg_sys::{jpeg_common_struct, jpeg_error_mgr, JWRN_JPEG_EOF};
use std::os::raw::c_int;

/// Does `bytes` start as a JPEG file (SOI marker)?
pub fn is_jpeg(bytes: &[u8]) -> bool {
    bytes.starts_with(&[0xFF, 0xD8, 0xFF])
}

/// Why a JPEG could not be decoded.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// The data ends before the image does (a cut-off download, a truncated shard member).
    Truncated,
    /// libjpeg's own message: a damaged file, or one it cannot convert (CMYK), which another decoder may.
    Libjpeg(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Truncated => write!(
                f,
                "the JPEG data ends before the image does (truncated file)"
            ),
            Failure::Libjpeg(m) => write!(f, "{m}"),
        }
    }
}

/// The image's (height, width), from its header only.
pub fn size(bytes: &[u8]) -> Result<(usize, usize), Failure> {
    guarded(|| {
        let d = Decompressor::read_header(bytes)?;
        Ok((d.info.image_height as usize, d.info.image_width as usize))
    })
}

/// The whole image, 8-bit RGB (or gray for one channel).
pub fn decode(bytes: &[u8], channels: usize, label: u32) -> Result<Image, Failure> {
    let rows = decode_region(bytes, channels, 8, None, Vec::new())?;
    Ok(Image {
        height: rows.rows,
        width: rows.width,
        channels: rows.channels,
        pixels: rows.pixels,
        label,
    })
}

/// Part of an image decoded at `scale`/8 of its size.
pub struct Rows {
    /// `rows` × `width` pixels: the image's columns from `left`, its rows from `top`.
    pub pixels: Vec<u8>,
    pub left: usize,
    pub top: usize,
    pub width: usize,
    pub rows: usize,
    pub channels: usize,
}

/// The region `(top, left, height, width)` (at this scale; `None`: all of it) of the image decoded at
/// `scale`/8 of its size (8, 4, 2 or 1), into `buffer` (reused). libjpeg widens the columns to whole
/// blocks (`left` and `width` say which it gave), skips the rows above without their colour work, and
/// never decodes the rows below.
pub fn decode_region(
    bytes: &[u8],
    channels: usize,
    scale: u8,
    region: Option<(usize, usize, usize, usize)>,
    buffer: Vec<u8>,
) -> Result<Rows, Failure> {
    match attempt(|| region_rows(bytes, channels, scale, region, buffer, Huffman::Own)) {
        Some(result) => result,
        // A file the fast entropy decoder gave up on: libjpeg's own decoder, with its repairs and
        // warnings.
        None => {
            guarded(|| region_rows(bytes, channels, scale, region, Vec::new(), Huffman::Libjpeg))
        }
    }
}

/// [`decode_region`] with libjpeg's own Huffman decoder throughout: what the fast one is checked against.
#[doc(hidden)]
pub fn decode_region_libjpeg(
    bytes: &[u8],
    channels: usize,
    scale: u8,
    region: Option<(usize, usize, usize, usize)>,
) -> Result<Rows, Failure> {
    guarded(|| region_rows(bytes, channels, scale, region, Vec::new(), Huffman::Libjpeg))
}

/// Whether [`decode_region`] decodes this file's entropy-coded data with [`entropy::Decoder`] (one
/// sequential 8-bit Huffman scan, ending in a marker) and gets through it without falling back to libjpeg's
/// decoder: what tests check, so that the fast path is known to be the one they exercise.
#[doc(hidden)]
pub fn fast_entropy_decodes(bytes: &[u8], channels: usize) -> bool {
    let whole = || region_rows(bytes, channels, 8, None, Vec::new(), Huffman::OwnOnly);
    matches!(attempt(whole), Some(Ok(_)))
}

/// Whose Huffman decoder a decode uses.
#[derive(Clone, Copy, PartialEq)]
enum Huffman {
    /// [`entropy::Decoder`] where it takes the file, else libjpeg's.
    Own,
    /// [`entropy::Decoder`] or an error (what tests check).
    OwnOnly,
    Libjpeg,
}

/// `decode_region`'s work, with the Huffman decoding `huffman` says.
fn region_rows(
    bytes: &[u8],
    channels: usize,
    scale: u8,
    region: Option<(usize, usize, usize, usize)>,
    mut buffer: Vec<u8>,
    huffman: Huffman,
) -> Result<Rows, Failure> {
    {
        let mut d = Decompressor::read_header(bytes)?;
        let info = &mut d.info;
        info.scale_num = scale.into();
        info.scale_denom = 8;
        info.out_color_space = if channels == 1 {
            mozjpeg_sys::JCS_GRAYSCALE
        } else {
            mozjpeg_sys::JCS_RGB
        };
        // SAFETY: the header was read; libjpeg checks the call sequence itself (errors unwind).
        unsafe { mozjpeg_sys::jpeg_start_decompress(info) };
        if huffman != Huffman::Libjpeg {
            // SAFETY: started, nothing read yet, from memory; the decoder lives in `d`, whose drop
            // destroys the decompressor first.
            d.entropy = unsafe { entropy::Decoder::install(info) };
            if d.entropy.is_none() && huffman == Huffman::OwnOnly {
                return Err(Failure::Libjpeg(
                    "not a scan the own Huffman decoder takes".into(),
                ));
            }
        }
        let (full_h, full_w) = (info.output_height as usize, info.output_width as usize);
        let (top, left, height, width) = region.unwrap_or((0, 0, full_h, full_w));
        let bottom = (top + height).min(full_h);
        let (mut x, mut w) = (
            left as Dimension,
            width.min(full_w - left.min(full_w)) as Dimension,
        );
        if (x, w as usize) != (0, full_w) {
            unsafe { mozjpeg_sys::jpeg_crop_scanline(info, &mut x, &mut w) };
        }
        if top > 0 {
            unsafe { mozjpeg_sys::jpeg_skip_scanlines(info, top as Dimension) };
        }
        let c = info.output_components as usize;
        let row_len = w as usize * c;
        let rows = bottom.saturating_sub(top);
        // libjpeg writes every byte of every row, so the buffer is not zeroed first (that cost as much
        // as the colour conversion).
        buffer.clear();
        buffer.reserve(rows * row_len);
        for row in buffer.spare_capacity_mut()[..rows * row_len].chunks_exact_mut(row_len) {
            let mut pointer = row.as_mut_ptr().cast::<u8>();
            // SAFETY: one row of `output_width` (the cropped width) × components bytes.
            let read = unsafe { mozjpeg_sys::jpeg_read_scanlines(info, &mut pointer, 1) };
            if read != 1 {
                return Err(Failure::Truncated);
            }
        }
        // SAFETY: all `rows` rows were written above.
        unsafe { buffer.set_len(rows * row_len) };
        Ok(Rows {
            pixels: buffer,
            left: x as usize,
            top,
            width: w as usize,
            rows,
            channels: c,
        })
    }
}

/// A libjpeg decompressor over `bytes`, destroyed when dropped (also when an error unwinds past it).
struct Decompressor<'a> {
    info: Box<mozjpeg_sys::jpeg_decompress_struct>,
    _errors: Box<jpeg_error_mgr>,
    /// The Huffman decoder in libjpeg's place, when there is one.
    entropy: Option<entropy::Installed>,
    _bytes: std::marker::PhantomData<&'a [u8]>,
}

impl<'a> Decompressor<'a> {
    fn read_header(bytes: &'a [u8]) -> Result<Self, Failure> {
        let mut errors = Box::new(error_manager());
        // SAFETY: a zeroed struct with its error manager set is what jpeg_CreateDecompress expects; the
        // source buffer outlives the decompressor (the lifetime), and the boxes never move.
        unsafe {
            let mut info: Box<mozjpeg_sys::jpeg_decompress_struct> = Box::new(std::mem::zeroed());
            info.common.err = &mut *errors;
            mozjpeg_sys::jpeg_CreateDecompress(
                &mut *info,
                mozjpeg_sys::JPEG_LIB_VERSION,
                std::mem::size_of::<mozjpeg_sys::jpeg_decompress_struct>(),
            );
            let mut d = Decompressor {
                info,
                _errors: errors,
                entropy: None,
                _bytes: std::marker::PhantomData,
            };
            mozjpeg_sys::jpeg_mem_src(&mut d.info, bytes.as_ptr(), bytes.len() as _);
            mozjpeg_sys::jpeg_read_header(&mut d.info, 1);
            Ok(d)
        }
    }
}

impl Drop for Decompressor<'_> {
    fn drop(&mut self) {
        // SAFETY: created by jpeg_CreateDecompress; destroying mid-decode is allowed (jpeg_abort).
        unsafe { mozjpeg_sys::jpeg_destroy_decompress(&mut self.info) };
    }
}

/// `run` with libjpeg's errors (unwound out of its callbacks) turned into `Failure`s.
fn guarded<T>(run: impl FnOnce() -> Result<T, Failure>) -> Result<T, Failure> {
    attempt(run).unwrap_or_else(|| Err(Failure::Libjpeg("the JPEG decoder gave up".into())))
}

/// [`guarded`], or `None` when the fast entropy decoder gave up on the file ([`entropy::Fallback`]).
fn attempt<T>(run: impl FnOnce() -> Result<T, Failure>) -> Option<Result<T, Failure>> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
        Ok(result) => Some(result),
        Err(payload) if payload.is::<entropy::Fallback>() => None,
        Err(payload) => Some(Err(match payload.downcast::<Failure>() {
            Ok(failure) => *failure,
            Err(other) => Failure::Libjpeg(
                other
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| other.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "the JPEG decoder failed".into()),
            ),
        })),
    }
}

/// libjpeg's standard error manager, whose fatal errors and end-of-data warning unwind to `guarded`.
fn error_manager() -> jpeg_error_mgr {
    // SAFETY: jpeg_std_error fills every field of the zeroed struct.
    let mut manager: jpeg_error_mgr = unsafe { std::mem::zeroed() };
    unsafe { mozjpeg_sys::jpeg_std_error(&mut manager) };
    manager.error_exit = Some(fatal);
    manager.emit_message = Some(warning);
    manager
}

extern "C-unwind" fn fatal(cinfo: &mut jpeg_common_struct) {
    std::panic::resume_unwind(Box::new(Failure::Libjpeg(message(cinfo))));
}

extern "C-unwind" fn warning(cinfo: &mut jpeg_common_struct, level: c_int) {
    // SAFETY: libjpeg calls back with its error manager set.
    let code = unsafe { (*cinfo.err).msg_code };
    if level < 0 && code == JWRN_JPEG_EOF as c_int {
        std::panic::resume_unwind(Box::new(Failure::Truncated));
    }
}

/// libjpeg's text for its current message.
fn message(cinfo: &mut jpeg_common_struct) -> String {
    // SAFETY: the error manager is set while libjpeg calls back; format_message writes at most 80 bytes
    // (JMSG_LENGTH_MAX) into the buffer, which the binding declares as shared but libjpeg writes.
    unsafe {
        let err = &*cinfo.err;
        let Some(format) = err.format_message else {
            return format!("libjpeg error {}", err.msg_code);
        };
        let format: unsafe extern "C-unwind" fn(&mut jpeg_common_struct, &mut [u8; 80]) =
            std::mem::transmute(format);
        let mut buffer = [0u8; 80];
        format(cinfo, &mut buffer);
        let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
        String::from_utf8_lossy(&buffer[..end]).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 40x24 RGB JPEG of a gradient, encoded by the `image` crate.
    fn sample() -> Vec<u8> {
        let img = image::RgbImage::from_fn(40, 24, |x, y| {
            image::Rgb([(x * 6) as u8, (y * 10) as u8, 90])
        });
        let mut out = std::io::Cursor::new(Vec::new());
        img.write_to(&mut out, image::ImageFormat::Jpeg).unwrap();
        out.into_inner()
    }

    #[test]
    fn decodes_whole_scaled_and_partial() {
        let bytes = sample();
        assert!(is_jpeg(&bytes));
        assert_eq!(size(&bytes).unwrap(), (24, 40));
        let full = decode(&bytes, 3, 7).unwrap();
        assert_eq!((full.height, full.width, full.label), (24, 40, 7));
        // Close to what was encoded (a lossy format: a few levels off at most).
        let off = full.pixels[(10 * 40 + 20) * 3] as i32 - 120;
        assert!(off.abs() <= 6, "{off}");
        let half = decode_region(&bytes, 3, 4, None, Vec::new()).unwrap();
        assert_eq!((half.width, half.rows), (20, 12));
        let top = decode_region(&bytes, 3, 8, Some((0, 0, 5, 40)), Vec::new()).unwrap();
        assert_eq!(top.rows, 5);
        assert_eq!(top.pixels[..], full.pixels[..5 * 40 * 3]);
        // Columns widened to whole blocks; skipped rows and cropped columns decode as the full image.
        let part = decode_region(&bytes, 3, 8, Some((9, 13, 7, 10)), Vec::new()).unwrap();
        assert!(
            part.left <= 13 && part.left + part.width >= 23,
            "{} {}",
            part.left,
            part.width
        );
        for y in 0..7 {
            for x in 0..part.width {
                for c in 0..3 {
                    assert_eq!(
                        part.pixels[(y * part.width + x) * 3 + c],
                        full.pixels[((9 + y) * 40 + part.left + x) * 3 + c],
                        "row {y} column {x}"
                    );
                }
            }
        }
        let gray = decode(&bytes, 1, 0).unwrap();
        assert_eq!((gray.channels, gray.pixels.len()), (1, 24 * 40));
    }

    #[test]
    fn damaged_and_truncated_files_are_errors() {
        let bytes = sample();
        assert_eq!(
            decode(&bytes[..bytes.len() / 2], 3, 0).unwrap_err(),
            Failure::Truncated
        );
        // The frame header's sample precision (the byte after SOF0's length) set to 3 bits.
        let mut damaged = bytes.clone();
        let sof = damaged.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
        damaged[sof + 4] = 3;
        let e = decode(&damaged, 3, 0).unwrap_err().to_string();
        assert!(e.contains("precision 3"), "{e}");
        assert!(size(b"\xFF\xD8\xFF garbage").is_err());
    }
}
