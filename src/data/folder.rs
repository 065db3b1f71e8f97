//! Image folders (torchvision's `ImageFolder`): `root/<split>/<class>/*.{jpg,jpeg,png}` for CINIC-10
//! (`train`, `valid`, `test`) and ImageNet (`train`, `val`). Classes are the sorted folder names;
//! images are decoded on demand by the loader's worker threads.

use super::{DataError, Dataset, Image, Split};
use std::path::{Path, PathBuf};

pub struct ImageFolder {
    files: Vec<(PathBuf, u32)>,
    classes: Vec<String>,
}

const EXTENSIONS: &[&str] = &["jpg", "jpeg", "png"];

impl ImageFolder {
    /// The first of `candidates` that exists under `root` is the split's folder.
    pub fn open(root: &Path, split: Split, name: &str) -> Result<Self, DataError> {
        let candidates: &[&str] = match split {
            Split::Train => &["train"],
            Split::Val => &["val", "valid", "validation", "test"],
            Split::Test => &["test", "val", "valid", "validation"],
        };
        let dir = candidates.iter().map(|c| root.join(c)).find(|d| d.is_dir()).ok_or_else(|| DataError::Missing {
            name: name.to_string(),
            looked_for: candidates.iter().map(|c| root.join(c).display().to_string()).collect::<Vec<_>>().join(", "),
            hint: "Lay the images out as <root>/<split>/<class>/*.jpg (or .png), or point data.root at them.".into(),
        })?;
        let mut classes: Vec<String> = std::fs::read_dir(&dir)
            .map_err(|e| DataError::corrupt(&dir, e.to_string()))?
            .flatten()
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().to_string())
            .collect();
        classes.sort();
        let mut files = Vec::new();
        for (label, class) in classes.iter().enumerate() {
            let mut in_class: Vec<PathBuf> = std::fs::read_dir(dir.join(class))
                .map_err(|e| DataError::corrupt(&dir.join(class), e.to_string()))?
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.extension()
                        .and_then(|x| x.to_str())
                        .is_some_and(|x| EXTENSIONS.contains(&x.to_ascii_lowercase().as_str()))
                })
                .collect();
            in_class.sort();
            files.extend(in_class.into_iter().map(|p| (p, label as u32)));
        }
        if files.is_empty() {
            return Err(DataError::corrupt(
                &dir,
                "no .jpg/.jpeg/.png images in any class folder",
            ));
        }
        Ok(ImageFolder { files, classes })
    }

    pub fn classes(&self) -> &[String] {
        &self.classes
    }
}

impl Dataset for ImageFolder {
    fn len(&self) -> usize {
        self.files.len()
    }

    fn sample_id(&self, index: usize) -> Option<String> {
        Some(self.files[index].0.display().to_string())
    }

    fn num_classes(&self) -> usize {
        self.classes.len()
    }

    fn get(&self, index: usize) -> Result<Image, DataError> {
        let (path, label) = &self.files[index];
        let bytes = std::fs::read(path).map_err(|e| DataError::corrupt(path, e.to_string()))?;
        super::decode_image(&bytes, 3, *label)
            .map_err(|e| DataError::corrupt(path, format!("cannot decode image: {e}")))
    }

    /// The file's bytes, for the loader's JPEG path (decoding only what the crop needs).
    fn encoded_image(&self, index: usize) -> Option<Result<super::EncodedImage, DataError>> {
        let (path, label) = &self.files[index];
        Some(
            std::fs::read(path)
                .map(|bytes| super::EncodedImage {
                    bytes,
                    label: *label,
                    channels: 3,
                    shard: path.display().to_string().into(),
                    name: String::new(),
                })
                .map_err(|e| DataError::corrupt(path, e.to_string())),
        )
    }

    fn label(&self, index: usize) -> Option<Result<u32, DataError>> {
        Some(Ok(self.files[index].1))
    }

    fn encoded(&self, index: usize) -> Option<Result<(Vec<u8>, String), DataError>> {
        let (path, _) = &self.files[index];
        let ext = path
            .extension()
            .and_then(|x| x.to_str())
            .map(|x| x.to_ascii_lowercase().replace("jpeg", "jpg"))
            .unwrap_or_else(|| "jpg".into());
        Some(
            std::fs::read(path)
                .map(|bytes| (bytes, ext))
                .map_err(|e| DataError::corrupt(path, e.to_string())),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_png_and_jpeg_with_sorted_classes() {
        let dir = tempfile::tempdir().unwrap();
        for (class, color) in [("cat", [200u8, 10, 10]), ("airplane", [10, 10, 200])] {
            let d = dir.path().join("train").join(class);
            std::fs::create_dir_all(&d).unwrap();
            let img = image::RgbImage::from_pixel(12, 10, image::Rgb(color));
            img.save(d.join("a.png")).unwrap();
            img.save(d.join("b.JPEG")).unwrap();
            std::fs::write(d.join("notes.txt"), "ignored").unwrap();
        }
        let set = ImageFolder::open(dir.path(), Split::Train, "cinic10").unwrap();
        assert_eq!(set.classes(), ["airplane", "cat"]);
        assert_eq!(set.len(), 4);
        let img = set.get(0).unwrap();
        assert_eq!((img.label, img.width, img.height), (0, 12, 10));
        assert_eq!(&img.pixels[..3], &[10, 10, 200]);
        let jpeg = set.get(3).unwrap();
        assert_eq!(jpeg.label, 1);
        assert!(
            jpeg.pixels[0] > 150,
            "JPEG decodes close to the source colour"
        );
    }

    #[test]
    fn missing_split_and_bad_images_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let err = ImageFolder::open(dir.path(), Split::Val, "imagenet")
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("val") && err.contains("data.root"), "{err}");
        let d = dir.path().join("val/x");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("broken.jpg"), b"not a jpeg").unwrap();
        let set = ImageFolder::open(dir.path(), Split::Val, "imagenet").unwrap();
        let err = set.get(0).err().unwrap().to_string();
        assert!(
            err.contains("broken.jpg") && err.contains("cannot decode"),
            "{err}"
        );
    }
}
