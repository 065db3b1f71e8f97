//! JPEG input decoded as Pillow decodes it: files Pillow writes (4:2:0, 4:2:2 and 4:4:4 chroma, gray,
//! progressive, a restart interval, odd sizes) decode to Pillow's own pixels, bit for bit; a region and a
//! DCT-scaled decode equal Pillow's `crop` of the full decode and its `draft` mode; a cut-off file is an
//! error, as in Pillow.

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
