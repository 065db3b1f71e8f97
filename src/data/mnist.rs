//! MNIST and Fashion-MNIST in IDX format (`train-images-idx3-ubyte`, `train-labels-idx1-ubyte`,
//! `t10k-...`), raw or gzip-compressed (`.gz`), in the data root itself or where torchvision's
//! `MNIST(root)`/`FashionMNIST(root)` keeps them (`<root>/MNIST/raw/`), so a user's download is read as it is.

use super::{DataError, Dataset, Image, Split};
use std::io::Read;
use std::path::{Path, PathBuf};

pub struct Mnist {
    images: Vec<u8>,
    labels: Vec<u8>,
    rows: usize,
    cols: usize,
}

fn read_maybe_gz(root: &Path, stem: &str) -> Result<(PathBuf, Vec<u8>), DataError> {
    for name in [stem.to_string(), format!("{stem}.gz")] {
        let path = root.join(&name);
        if let Ok(bytes) = std::fs::read(&path) {
            if name.ends_with(".gz") {
                let mut out = Vec::new();
                flate2::read::GzDecoder::new(&bytes[..])
                    .read_to_end(&mut out)
                    .map_err(|e| {
                        DataError::corrupt(&path, format!("not a valid gzip file: {e}"))
                    })?;
                return Ok((path, out));
            }
            return Ok((path, bytes));
        }
    }
    Err(DataError::Missing {
        name: "mnist".into(),
        looked_for: format!("{} (or .gz)", root.join(stem).display()),
        hint: "Put the IDX files there (train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-...; torchvision's <root>/MNIST/raw/ is read too), or point data.root at them, or set data.download=true to fetch them.".into(),
    })
}

fn be_u32(bytes: &[u8], at: usize) -> usize {
    u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]) as usize
}

/// The folder holding the IDX files: `root`, or torchvision's `<root>/<folder>/raw/` when `root` has none.
pub(crate) fn files_dir(root: &Path, torchvision_folder: &str) -> PathBuf {
    let here = ["train-images-idx3-ubyte", "train-images-idx3-ubyte.gz"]
        .iter()
        .any(|f| root.join(f).exists());
    let torchvision = root.join(torchvision_folder).join("raw");
    match !here && torchvision.is_dir() {
        true => torchvision,
        false => root.to_path_buf(),
    }
}

impl Mnist {
    /// MNIST (`fashion`: Fashion-MNIST) under `root`.
    pub fn open_in(root: &Path, fashion: bool, split: Split) -> Result<Self, DataError> {
        let folder = if fashion { "FashionMNIST" } else { "MNIST" };
        Self::open(&files_dir(root, folder), split)
    }

    pub fn open(root: &Path, split: Split) -> Result<Self, DataError> {
        let prefix = match split {
            Split::Train => "train",
            Split::Val | Split::Test => "t10k",
        };
        let (ipath, images) = read_maybe_gz(root, &format!("{prefix}-images-idx3-ubyte"))?;
        let (lpath, labels) = read_maybe_gz(root, &format!("{prefix}-labels-idx1-ubyte"))?;
        if images.len() < 16 || be_u32(&images, 0) != 0x0803 {
            return Err(DataError::corrupt(
                &ipath,
                "not an IDX3 image file (magic 0x00000803)",
            ));
        }
        if labels.len() < 8 || be_u32(&labels, 0) != 0x0801 {
            return Err(DataError::corrupt(
                &lpath,
                "not an IDX1 label file (magic 0x00000801)",
            ));
        }
        let (n, rows, cols) = (be_u32(&images, 4), be_u32(&images, 8), be_u32(&images, 12));
        if images.len() != 16 + n * rows * cols {
            return Err(DataError::corrupt(
                &ipath,
                format!("header says {n} images of {rows}x{cols}, file size disagrees"),
            ));
        }
        if be_u32(&labels, 4) != n || labels.len() != 8 + n {
            return Err(DataError::corrupt(
                &lpath,
                format!("expected {n} labels to match the image file"),
            ));
        }
        Ok(Mnist {
            images: images[16..].to_vec(),
            labels: labels[8..].to_vec(),
            rows,
            cols,
        })
    }
}

impl Dataset for Mnist {
    fn len(&self) -> usize {
        self.labels.len()
    }
    fn num_classes(&self) -> usize {
        10
    }
    fn get(&self, index: usize) -> Result<Image, DataError> {
        let size = self.rows * self.cols;
        Ok(Image {
            height: self.rows,
            width: self.cols,
            channels: 1,
            pixels: self.images[index * size..(index + 1) * size].to_vec(),
            label: self.labels[index] as u32,
        })
    }
}

/// Write an IDX image/label pair (tests use it to make tiny real files).
#[cfg(test)]
fn write_idx(
    root: &Path,
    prefix: &str,
    rows: usize,
    cols: usize,
    items: &[(u8, Vec<u8>)],
    gz: bool,
) -> std::io::Result<()> {
    let mut images = Vec::new();
    for v in [0x0803u32, items.len() as u32, rows as u32, cols as u32] {
        images.extend_from_slice(&v.to_be_bytes());
    }
    let mut labels = Vec::new();
    for v in [0x0801u32, items.len() as u32] {
        labels.extend_from_slice(&v.to_be_bytes());
    }
    for (label, px) in items {
        images.extend_from_slice(px);
        labels.push(*label);
    }
    for (name, bytes) in [
        (format!("{prefix}-images-idx3-ubyte"), images),
        (format!("{prefix}-labels-idx1-ubyte"), labels),
    ] {
        if gz {
            use std::io::Write;
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            enc.write_all(&bytes)?;
            std::fs::write(root.join(format!("{name}.gz")), enc.finish()?)?;
        } else {
            std::fs::write(root.join(name), bytes)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case(false)]
    #[case(true)]
    fn reads_raw_and_gzip(#[case] gz: bool) {
        let dir = tempfile::tempdir().unwrap();
        let items: Vec<(u8, Vec<u8>)> = (0..5)
            .map(|i| (i as u8, vec![i as u8 * 10; 28 * 28]))
            .collect();
        write_idx(dir.path(), "train", 28, 28, &items, gz).unwrap();
        let m = Mnist::open(dir.path(), Split::Train).unwrap();
        assert_eq!(m.len(), 5);
        let img = m.get(3).unwrap();
        assert_eq!(
            (img.label, img.height, img.channels, img.pixels[0]),
            (3, 28, 1, 30)
        );
    }

    /// torchvision's layout: the files under `<root>/MNIST/raw/` (gzipped, as it downloads them), and
    /// Fashion-MNIST's under `<root>/FashionMNIST/raw/` beside them.
    #[test]
    fn reads_torchvisions_layout() {
        let dir = tempfile::tempdir().unwrap();
        let raw = dir.path().join("MNIST/raw");
        std::fs::create_dir_all(&raw).unwrap();
        let digits: Vec<(u8, Vec<u8>)> = (0..4).map(|i| (i as u8, vec![7; 28 * 28])).collect();
        write_idx(&raw, "t10k", 28, 28, &digits, true).unwrap();
        write_idx(&raw, "train", 28, 28, &digits, true).unwrap();
        let fashion = dir.path().join("FashionMNIST/raw");
        std::fs::create_dir_all(&fashion).unwrap();
        write_idx(&fashion, "t10k", 28, 28, &digits[..2], false).unwrap();
        write_idx(&fashion, "train", 28, 28, &digits[..2], false).unwrap();
        assert_eq!(
            Mnist::open_in(dir.path(), false, Split::Val).unwrap().len(),
            4
        );
        assert_eq!(
            Mnist::open_in(dir.path(), true, Split::Val).unwrap().len(),
            2
        );
    }

    #[test]
    fn bad_magic_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("t10k-images-idx3-ubyte"), [0u8; 32]).unwrap();
        std::fs::write(dir.path().join("t10k-labels-idx1-ubyte"), [0u8; 32]).unwrap();
        let err = Mnist::open(dir.path(), Split::Val)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("magic 0x00000803"), "{err}");
    }
}
