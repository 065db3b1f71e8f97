//! CIFAR-10 / CIFAR-100 in the binary format the authors distribute: records of label byte(s) followed by
//! 3072 bytes of planar RGB (1024 R, 1024 G, 1024 B). Files are read whole into memory.

use super::{DataError, Dataset, Image, Split};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// `data_batch_{1..5}.bin`, `test_batch.bin`; 1 label byte.
    Cifar10,
    /// `train.bin`, `test.bin`; coarse and fine label bytes (the fine label is used).
    Cifar100,
}

const PIXELS: usize = 32 * 32 * 3;

pub struct Cifar {
    records: Vec<u8>,
    label_bytes: usize,
    num_classes: usize,
}

impl Cifar {
    pub fn files(variant: Variant, split: Split) -> Vec<&'static str> {
        match (variant, split) {
            (Variant::Cifar10, Split::Train) => {
                vec![
                    "data_batch_1.bin",
                    "data_batch_2.bin",
                    "data_batch_3.bin",
                    "data_batch_4.bin",
                    "data_batch_5.bin",
                ]
            }
            (Variant::Cifar10, Split::Val | Split::Test) => vec!["test_batch.bin"],
            (Variant::Cifar100, Split::Train) => vec!["train.bin"],
            (Variant::Cifar100, Split::Val | Split::Test) => vec!["test.bin"],
        }
    }

    pub fn open(root: &Path, variant: Variant, split: Split) -> Result<Self, DataError> {
        let label_bytes = if variant == Variant::Cifar10 { 1 } else { 2 };
        let record = label_bytes + PIXELS;
        let mut records = Vec::new();
        for name in Cifar::files(variant, split) {
            let path: PathBuf = root.join(name);
            let bytes = std::fs::read(&path).map_err(|_| DataError::Missing {
                name: format!("{variant:?}").to_lowercase(),
                looked_for: path.display().to_string(),
                hint: format!(
                    "Put the binary version of the data set there (files {}), or point data.root at it, or set data.download=true to fetch it.",
                    Cifar::files(variant, split).join(", ")
                ),
            })?;
            if bytes.len() % record != 0 {
                return Err(DataError::corrupt(
                    &path,
                    format!(
                        "size {} is not a multiple of the {record}-byte record",
                        bytes.len()
                    ),
                ));
            }
            records.extend_from_slice(&bytes);
        }
        let num_classes = if variant == Variant::Cifar10 { 10 } else { 100 };
        let data = Cifar {
            records,
            label_bytes,
            num_classes,
        };
        if let Some(bad) = (0..data.len()).find(|&i| data.label(i) as usize >= num_classes) {
            return Err(DataError::corrupt(
                root,
                format!(
                    "record {bad} has label {} >= {num_classes}",
                    data.label(bad)
                ),
            ));
        }
        Ok(data)
    }

    fn label(&self, index: usize) -> u8 {
        let record = self.label_bytes + PIXELS;
        self.records[index * record + self.label_bytes - 1]
    }
}

impl Dataset for Cifar {
    fn len(&self) -> usize {
        self.records.len() / (self.label_bytes + PIXELS)
    }

    fn num_classes(&self) -> usize {
        self.num_classes
    }

    fn get(&self, index: usize) -> Result<Image, DataError> {
        let record = self.label_bytes + PIXELS;
        let start = index * record + self.label_bytes;
        let planar = &self.records[start..start + PIXELS];
        let mut pixels = vec![0u8; PIXELS];
        for p in 0..1024 {
            for c in 0..3 {
                pixels[p * 3 + c] = planar[c * 1024 + p];
            }
        }
        Ok(Image {
            height: 32,
            width: 32,
            channels: 3,
            pixels,
            label: self.label(index) as u32,
        })
    }
}

/// Write records in the CIFAR binary format (used by tests to make tiny real files).
pub fn write_records(
    path: &Path,
    variant: Variant,
    items: &[(u32, Vec<u8>)],
) -> std::io::Result<()> {
    let mut out = Vec::new();
    for (label, hwc) in items {
        if variant == Variant::Cifar100 {
            out.push(0);
        }
        out.push(*label as u8);
        for c in 0..3 {
            for p in 0..1024 {
                out.push(hwc[p * 3 + c]);
            }
        }
    }
    std::fs::write(path, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(seed: u8) -> Vec<u8> {
        (0..PIXELS).map(|i| (i as u8).wrapping_mul(seed)).collect()
    }

    #[test]
    fn reads_what_the_format_says() {
        let dir = tempfile::tempdir().unwrap();
        for (i, name) in Cifar::files(Variant::Cifar10, Split::Train)
            .iter()
            .enumerate()
        {
            write_records(
                &dir.path().join(name),
                Variant::Cifar10,
                &[(i as u32, image(i as u8 + 1)), (9, image(7))],
            )
            .unwrap();
        }
        write_records(
            &dir.path().join("test_batch.bin"),
            Variant::Cifar10,
            &[(3, image(3))],
        )
        .unwrap();
        let train = Cifar::open(dir.path(), Variant::Cifar10, Split::Train).unwrap();
        assert_eq!(train.len(), 10);
        let img = train.get(2).unwrap();
        assert_eq!(img.label, 1);
        assert_eq!(img.pixels, image(2));
        assert_eq!(train.get(3).unwrap().label, 9);
        let val = Cifar::open(dir.path(), Variant::Cifar10, Split::Val).unwrap();
        assert_eq!(val.len(), 1);
    }

    #[test]
    fn cifar100_uses_the_fine_label() {
        let dir = tempfile::tempdir().unwrap();
        write_records(
            &dir.path().join("train.bin"),
            Variant::Cifar100,
            &[(42, image(1))],
        )
        .unwrap();
        let train = Cifar::open(dir.path(), Variant::Cifar100, Split::Train).unwrap();
        assert_eq!(train.get(0).unwrap().label, 42);
        assert_eq!(train.num_classes(), 100);
    }

    #[test]
    fn missing_and_truncated_files_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let err = Cifar::open(dir.path(), Variant::Cifar10, Split::Val)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("test_batch.bin") && err.contains("data.root"),
            "{err}"
        );
        std::fs::write(dir.path().join("test_batch.bin"), [0u8; 100]).unwrap();
        let err = Cifar::open(dir.path(), Variant::Cifar10, Split::Val)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("not a multiple of the 3073-byte record"),
            "{err}"
        );
    }
}
