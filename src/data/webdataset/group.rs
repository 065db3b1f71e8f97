//! A shard's members grouped into samples, as WebDataset groups them: consecutive members whose names
//! share a key make one sample. One walk serves both ways of reading shards: indexing a local file
//! (the image members' places, read later by position) and streaming one (the image bytes, read now).

use super::Keys;
use crate::data::DataError;
use std::io::Read;

/// Where a sample's image is: its place in the shard (indexing), or its bytes (streaming).
#[derive(Debug, Clone)]
pub(super) enum ImageAt {
    Span { offset: u64, len: u64 },
    Bytes(Vec<u8>),
}

/// One complete sample: its key, image member and class.
#[derive(Debug, Clone)]
pub(super) struct Found {
    pub key: String,
    pub image: ImageAt,
    pub ext: String,
    pub label: u32,
}

/// How to walk one shard.
pub(super) struct Walk<'a> {
    /// The shard's path or URL, for errors.
    pub shard: &'a str,
    /// The file's length when known (a member ending past it is a truncated tar).
    pub file_len: Option<u64>,
    pub keys: &'a Keys,
    pub classes: usize,
    /// Image bytes are read for the samples from this one on (streaming); before it (and always when
    /// indexing, `usize::MAX`) only their places are kept.
    pub read_from: usize,
}

pub(super) fn corrupt(shard: &str, message: impl Into<String>) -> DataError {
    DataError::Corrupt {
        path: shard.to_string(),
        message: message.into(),
    }
}

/// The key and extension of a member path, as WebDataset splits them: the extension starts at the first
/// dot of the file name (`a/b.seg.png` is key `a/b`, extension `seg.png`).
/// A name starting with a dot (`.hidden`, macOS's `._a.jpg`) has no key and is skipped, as WebDataset's
/// pattern `^((?:.*/|)[^.]+)[.]([^/]*)$` skips it.
pub(super) fn key_and_ext(path: &str) -> Option<(&str, &str)> {
    let name_start = path.rfind('/').map_or(0, |i| i + 1);
    let dot = path[name_start..].find('.')?;
    if dot == 0 {
        return None;
    }
    let dot = dot + name_start;
    Some((&path[..dot], &path[dot + 1..]))
}

impl Walk<'_> {
    /// Each complete sample of `entries` in order, handed to `sample` (which returns false to stop);
    /// the number of samples walked.
    pub fn run<R: Read>(
        &self,
        entries: tar::Entries<'_, R>,
        mut sample: impl FnMut(Found) -> Result<bool, DataError>,
    ) -> Result<usize, DataError> {
        let mut done = 0usize;
        let mut current: Option<Pending> = None;
        for entry in entries {
            let damaged = |e: &dyn std::fmt::Display, done: usize| {
                corrupt(
                    self.shard,
                    format!("truncated or damaged tar (after {done} samples): {e}"),
                )
            };
            let mut entry = entry.map_err(|e| damaged(&e, done))?;
            if !entry.header().entry_type().is_file() {
                continue;
            }
            let (offset, size) = (entry.raw_file_position(), entry.size());
            if self.file_len.is_some_and(|len| offset + size > len) {
                return Err(damaged(&"a member ends past the end of the file", done));
            }
            let name = entry
                .path()
                .map_err(|e| corrupt(self.shard, e.to_string()))?
                .to_string_lossy()
                .to_string();
            let Some((key, ext)) = key_and_ext(&name) else {
                continue;
            };
            let ext = ext.to_ascii_lowercase();
            if current.as_ref().is_some_and(|c| c.key != key) {
                let found = current.take().expect("checked").finish(self)?;
                done += 1;
                if !sample(found)? {
                    return Ok(done);
                }
            }
            let pending = current.get_or_insert_with(|| Pending::new(key));
            if let Some(rank) = self.keys.image.iter().position(|e| *e == ext) {
                if pending.image.as_ref().is_none_or(|(r, ..)| rank < *r) {
                    let at = if done >= self.read_from {
                        let mut bytes = Vec::with_capacity(size as usize);
                        entry
                            .read_to_end(&mut bytes)
                            .map_err(|e| damaged(&e, done))?;
                        if bytes.len() as u64 != size {
                            return Err(damaged(
                                &format!("sample '{key}': its .{ext} is cut short"),
                                done,
                            ));
                        }
                        ImageAt::Bytes(bytes)
                    } else {
                        ImageAt::Span { offset, len: size }
                    };
                    pending.image = Some((rank, at, ext.clone()));
                }
            } else if ext == self.keys.label {
                pending.label = Some(self.label(&mut entry, key, &ext)?);
            }
        }
        if let Some(last) = current {
            let found = last.finish(self)?;
            done += 1;
            sample(found)?;
        }
        Ok(done)
    }

    /// A label member's class, checked against `classes`.
    fn label(&self, entry: &mut impl Read, key: &str, ext: &str) -> Result<u32, DataError> {
        let mut text = String::new();
        entry.read_to_string(&mut text).map_err(|e| {
            corrupt(
                self.shard,
                format!("sample '{key}': its .{ext} is not text: {e}"),
            )
        })?;
        let classes = self.classes;
        parse_label(&text, ext)
            .and_then(|l| {
                (l < classes)
                    .then_some(l as u32)
                    .ok_or_else(|| format!("class {l} is not below data.num_classes={classes}"))
            })
            .map_err(|m| corrupt(self.shard, format!("sample '{key}': its .{ext}: {m}")))
    }
}

/// A sample whose members are being read.
struct Pending {
    key: String,
    image: Option<(usize, ImageAt, String)>,
    label: Option<u32>,
}

impl Pending {
    fn new(key: &str) -> Self {
        Pending {
            key: key.to_string(),
            image: None,
            label: None,
        }
    }

    fn finish(self, walk: &Walk) -> Result<Found, DataError> {
        let (_, image, ext) = self.image.ok_or_else(|| {
            corrupt(
                walk.shard,
                format!(
                    "sample '{}' has no image member (.{}); set data.image_key to its extension",
                    self.key,
                    walk.keys.image.join(" or .")
                ),
            )
        })?;
        let label = self.label.ok_or_else(|| {
            corrupt(
                walk.shard,
                format!(
                    "sample '{}' has no .{} member; set data.label_key to its label's extension",
                    self.key, walk.keys.label
                ),
            )
        })?;
        Ok(Found {
            key: self.key,
            image,
            ext,
            label,
        })
    }
}

/// A class from a label member: the number itself (`.cls`, `.txt`, ...) or a JSON object's `label` (or
/// `cls`) field.
pub(super) fn parse_label(text: &str, ext: &str) -> Result<usize, String> {
    if ext == "json" {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let field = value
            .get("label")
            .or_else(|| value.get("cls"))
            .ok_or("no 'label' (or 'cls') field")?;
        return field
            .as_u64()
            .map(|v| v as usize)
            .ok_or_else(|| format!("'label' is {field}, not a class number"));
    }
    text.trim()
        .parse()
        .map_err(|_| format!("'{}' is not a class number", text.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rstest::rstest]
    #[case("n0144/n0144_10026.jpg", Some(("n0144/n0144_10026", "jpg")))]
    #[case("dir.v2/sample.seg.png", Some(("dir.v2/sample", "seg.png")))]
    #[case("README", None)]
    #[case("n01/._n01_1.jpg", None)]
    #[case(".hidden", None)]
    fn keys_split_at_the_first_dot_of_the_name(
        #[case] path: &str,
        #[case] expected: Option<(&str, &str)>,
    ) {
        assert_eq!(key_and_ext(path), expected);
    }

    #[rstest::rstest]
    #[case("7\n", "cls", Ok(7))]
    #[case("{\"label\": 3, \"w\": 2}", "json", Ok(3))]
    #[case("cat", "cls", Err("'cat' is not a class number"))]
    #[case("{\"y\": 3}", "json", Err("no 'label'"))]
    fn labels_parse(#[case] text: &str, #[case] ext: &str, #[case] expected: Result<usize, &str>) {
        match (parse_label(text, ext), expected) {
            (Ok(a), Ok(b)) => assert_eq!(a, b),
            (Err(e), Err(says)) => assert!(e.contains(says), "{e}"),
            (got, want) => panic!("{got:?} vs {want:?}"),
        }
    }
}
