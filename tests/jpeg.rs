//! JPEG input decoded as Pillow decodes it: files Pillow writes (4:2:0, 4:2:2 and 4:4:4 chroma, gray,
//! progressive, a restart interval, odd sizes) decode to Pillow's own pixels, bit for bit; a region and a
//! DCT-scaled decode equal Pillow's `crop` of the full decode and its `draft` mode; a cut-off file is an
//! error, as in Pillow. trainyard's own Huffman decoder (used for one-scan baseline files) gives libjpeg's
//! pixels at every scale and region, on standard and optimised tables, restart intervals and gray, and
//! on damaged data falls back to libjpeg's decoder, so its repairs and errors are unchanged.

mod common;
use trainyard::data::jpeg;

const SCRIPT: &str = r#"
import io, json, sys
import numpy as np
from PIL import Image
out = sys.argv[1]
rng = np.random.default_rng(7)
yy, xx = np.mgrid[0:133, 0:201].astype(np.float32)
base = 127 + 80 * np.sin(xx * 0.05 + yy * 0.03)
rgb = np.stack([base, np.roll(base, 40, 1), np.roll(base, 30, 0)], -1) + rng.normal(0, 12, (133, 201, 3))
rgb = Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8))
cases = {
    "s420": dict(subsampling=2, quality=90),
    "s422": dict(subsampling=1, quality=85),
    "s444": dict(subsampling=0, quality=95),
    "progressive": dict(progressive=True, quality=80),
    "restart": dict(quality=75, restart_marker_blocks=3),
}
meta = {}
for name, kw in cases.items():
    buf = io.BytesIO(); rgb.save(buf, format="JPEG", **kw)
    open(f"{out}/{name}.jpg", "wb").write(buf.getvalue())
    img = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    open(f"{out}/{name}.rgb", "wb").write(np.asarray(img).tobytes())
    # A crop of the full decode, and the draft (DCT-scaled) decode at 1/2.
    open(f"{out}/{name}.crop", "wb").write(np.asarray(img.crop((37, 21, 37 + 90, 21 + 70))).tobytes())
    d = Image.open(io.BytesIO(buf.getvalue())); d.draft("RGB", (100, 66)); d = d.convert("RGB")
    meta[name] = d.size
    open(f"{out}/{name}.half", "wb").write(np.asarray(d).tobytes())
gray = rgb.convert("L"); buf = io.BytesIO(); gray.save(buf, format="JPEG", quality=90)
open(f"{out}/gray.jpg", "wb").write(buf.getvalue())
open(f"{out}/gray.l", "wb").write(np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("L")).tobytes())
json.dump(meta, open(f"{out}/meta.json", "w"))
"#;

#[test]
fn decodes_as_pillow_does() {
    let Some(python) = common::torch_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let made = std::process::Command::new(python)
        .args(["-c", SCRIPT, dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    common::succeeded(&made);
    let read = |name: &str| std::fs::read(dir.path().join(name)).unwrap();
    let meta: serde_json::Value = serde_json::from_slice(&read("meta.json")).unwrap();
    for case in ["s420", "s422", "s444", "progressive", "restart"] {
        let bytes = read(&format!("{case}.jpg"));
        let full = jpeg::decode(&bytes, 3, 0).unwrap();
        assert_eq!((full.width, full.height), (201, 133));
        assert!(
            full.pixels == read(&format!("{case}.rgb")),
            "{case}: not Pillow's pixels"
        );
        // A region: columns widened to whole blocks, rows skipped above; the crop within equals Pillow's.
        let part = jpeg::decode_region(&bytes, 3, 8, Some((21, 37, 70, 90)), Vec::new()).unwrap();
        let mut crop = Vec::new();
        for y in 0..70 {
            let start = (y * part.width + 37 - part.left) * 3;
            crop.extend_from_slice(&part.pixels[start..start + 90 * 3]);
        }
        assert!(
            crop == read(&format!("{case}.crop")),
            "{case}: the region differs"
        );
        let half = jpeg::decode_region(&bytes, 3, 4, None, Vec::new()).unwrap();
        let size = &meta[case];
        assert_eq!(
            (half.width as u64, half.rows as u64),
            (size[0].as_u64().unwrap(), size[1].as_u64().unwrap())
        );
        assert!(
            half.pixels == read(&format!("{case}.half")),
            "{case}: not Pillow's draft pixels"
        );
        let cut = jpeg::decode(&bytes[..bytes.len() * 2 / 3], 3, 0).unwrap_err();
        assert_eq!(cut, jpeg::Failure::Truncated, "{case}");
    }
    let gray = jpeg::decode(&read("gray.jpg"), 1, 0).unwrap();
    assert_eq!(gray.channels, 1);
    assert!(gray.pixels == read("gray.l"), "gray: not Pillow's pixels");
}

const ENTROPY_SCRIPT: &str = r#"
import io, sys
import numpy as np
from PIL import Image, ImageFile
ImageFile.MAXBLOCK = 1 << 24  # optimised tables at quality 100 need a larger encoder buffer
out = sys.argv[1]
rng = np.random.default_rng(11)
def photo(w, h, noise):
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    base = 127 + 80 * np.sin(xx * 0.021 + yy * 0.033 + 1)
    img = np.stack([base, np.roll(base, 40, 1), np.roll(base, 80, 0)], -1) + rng.normal(0, noise, (h, w, 3))
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
big, odd = photo(500, 375, 18), photo(203, 77, 30)
cases = {
    "standard": (big, dict(quality=90)),
    "optimized": (big, dict(quality=90, optimize=True)),
    "q100_444": (big, dict(quality=100, subsampling=0, optimize=True)),
    "q40_422": (odd, dict(quality=40, subsampling=1)),
    "restart_every_block": (odd, dict(quality=85, restart_marker_blocks=1)),
    "restart_rows": (big, dict(quality=92, restart_marker_rows=2, optimize=True)),
    "gray": (big.convert("L"), dict(quality=95, optimize=True)),
    "tiny": (photo(1, 1, 0), dict(quality=90)),
}
for name, (img, kw) in cases.items():
    buf = io.BytesIO(); img.save(buf, format="JPEG", **kw)
    open(f"{out}/{name}.jpg", "wb").write(buf.getvalue())
buf = io.BytesIO(); big.save(buf, format="JPEG", quality=90, progressive=True)
open(f"{out}/progressive.jpg", "wb").write(buf.getvalue())
"#;

/// The fast decoder and libjpeg's agree on `bytes`: the same pixels and region, or the same error.
fn same_as_libjpeg(bytes: &[u8], channels: usize, what: &str) {
    let (h, w) = jpeg::size(bytes).unwrap();
    let regions = [
        None,
        Some((0, 0, h / 3 + 1, w)),
        Some((h / 2, w / 3, h - h / 2, w / 2 + 1)),
    ];
    for scale in [8u8, 4, 2, 1] {
        for region in regions {
            // Regions are given at the decoded scale.
            let region = region.map(|(t, l, rh, rw)| {
                let s = |v: usize| (v * scale as usize).div_ceil(8);
                (s(t), s(l), s(rh).max(1), s(rw).max(1))
            });
            let fast = jpeg::decode_region(bytes, channels, scale, region, Vec::new());
            let slow = jpeg::decode_region_libjpeg(bytes, channels, scale, region);
            let context = format!("{what}, scale {scale}/8, region {region:?}");
            match (fast, slow) {
                (Ok(a), Ok(b)) => {
                    assert_eq!(
                        (a.left, a.top, a.width, a.rows, a.channels),
                        (b.left, b.top, b.width, b.rows, b.channels),
                        "{context}"
                    );
                    assert!(a.pixels == b.pixels, "{context}: the pixels differ");
                }
                (Err(a), Err(b)) => assert_eq!(a, b, "{context}"),
                (a, b) => panic!("{context}: {:?} vs {:?}", a.err(), b.err()),
            }
        }
    }
}

#[test]
fn own_entropy_decoder_gives_libjpegs_pixels_or_falls_back() {
    let Some(python) = common::torch_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let made = std::process::Command::new(python)
        .args(["-c", ENTROPY_SCRIPT, dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    common::succeeded(&made);
    let read = |name: &str| std::fs::read(dir.path().join(format!("{name}.jpg"))).unwrap();
    let cases = [
        "standard",
        "optimized",
        "q100_444",
        "q40_422",
        "restart_every_block",
        "restart_rows",
        "gray",
        "tiny",
    ];
    for case in cases {
        let bytes = read(case);
        let channels = if case == "gray" { 1 } else { 3 };
        assert!(
            jpeg::fast_entropy_decodes(&bytes, channels),
            "{case}: the fast decoder did not take the file"
        );
        same_as_libjpeg(&bytes, channels, case);
        if channels == 3 {
            same_as_libjpeg(&bytes, 1, &format!("{case} as gray"));
        }
    }
    // 10 KB of stray bytes before a restart marker: libjpeg skips them (a warning), and so does the fast
    // decoder, which has to unstuff past them to find the next segment.
    let bytes = read("restart_rows");
    let rst = bytes.windows(2).position(|w| w == [0xFF, 0xD2]).unwrap();
    let mut stray = bytes[..rst].to_vec();
    stray.extend(std::iter::repeat_n(0x5Au8, 10_000));
    stray.extend_from_slice(&bytes[rst..]);
    assert!(jpeg::fast_entropy_decodes(&stray, 3));
    same_as_libjpeg(&stray, 3, "stray bytes before a restart marker");
    let progressive = read("progressive");
    assert!(!jpeg::fast_entropy_decodes(&progressive, 3));
    same_as_libjpeg(&progressive, 3, "progressive");

    // Damaged data inside the scan: both decoders repair it alike (libjpeg's warnings, gray fill) or
    // fail alike.
    let bytes = read("standard");
    let scan = bytes.windows(2).rposition(|w| w == [0xFF, 0xDA]).unwrap() + 20;
    let mut fell_back = 0;
    for (i, at) in (scan..bytes.len() - 2).step_by(9973).enumerate() {
        let mut damaged = bytes.clone();
        let flipped = damaged[at] ^ (0x5A + i as u8);
        if flipped == 0xFF || damaged[at] == 0xFF || damaged[at - 1] == 0xFF {
            continue;
        }
        damaged[at] = flipped;
        fell_back += !jpeg::fast_entropy_decodes(&damaged, 3) as usize;
        same_as_libjpeg(&damaged, 3, &format!("a byte flipped at {at}"));
    }
    assert!(fell_back > 0, "no damage made the fast decoder give up");
    // The scan cut short and the file ended properly (EOI): libjpeg fills the rest with gray.
    let mut short = bytes[..bytes.len() * 3 / 5].to_vec();
    short.extend_from_slice(&[0xFF, 0xD9]);
    assert!(!jpeg::fast_entropy_decodes(&short, 3));
    same_as_libjpeg(&short, 3, "a scan cut short before EOI");
    // Cut with no marker after it: truncated, as before.
    let cut = &bytes[..bytes.len() * 3 / 5];
    assert!(!jpeg::fast_entropy_decodes(cut, 3));
    same_as_libjpeg(cut, 3, "a truncated file");
}
