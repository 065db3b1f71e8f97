//! WebDataset shards (`data=webdataset`): POSIX tar files in which the members of one sample share a key
//! (`n01440764_10026.jpg`, `n01440764_10026.cls`, ...: the key is the member's path up to the first dot of
//! its file name, as WebDataset groups them), named by brace patterns (`train-{000000..001281}.tar`).
//!
//! A split opens by reading each shard's tar headers once (the image members' offsets and sizes, and
//! the small label members' contents), so every sample has an address: the loader then reads samples as a
//! map-style dataset, which gives the distributed sampler's guarantees unchanged (each sample once per
//! epoch across ranks and workers, a shuffle seeded per epoch, exact mid-epoch resume from a checkpoint's
//! position). Reads are positioned reads of one member. Shards on S3 are copied to the local cache first
//! (`storage::s3::mirror_objects`); streaming without a local copy is not done yet.

use super::{DataError, Dataset, Image, Split};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Where one sample's image lies in its shard, and its class.
#[derive(Debug, Clone)]
struct Member {
    shard: usize,
    key: String,
    offset: u64,
    len: u64,
    ext: String,
    label: u32,
}

pub struct WebDataset {
    shards: Vec<PathBuf>,
    samples: Vec<Member>,
    classes: usize,
    channels: usize,
}

/// Which members hold the image and the label (`data.image_key`, `data.label_key`).
#[derive(Debug, Clone)]
pub struct Keys {
    /// Image extensions, in order of preference (`jpg;png`).
    pub image: Vec<String>,
    /// The label's extension: `cls` (the class as text) or `json` (its `label` field).
    pub label: String,
}

impl Keys {
    pub fn parse(image: &str, label: &str) -> Keys {
        Keys {
            image: image
                .split(';')
                .map(|s| s.trim().to_ascii_lowercase())
                .filter(|s| !s.is_empty())
                .collect(),
            label: label.trim().to_ascii_lowercase(),
        }
    }
}

impl WebDataset {
    /// The samples of the shards `paths` (local files), indexed, labels checked against `num_classes`.
    pub fn open(
        paths: Vec<PathBuf>,
        keys: &Keys,
        num_classes: usize,
        channels: usize,
    ) -> Result<Self, DataError> {
        let mut samples = Vec::new();
        for (shard, path) in paths.iter().enumerate() {
            index_shard(path, shard, keys, num_classes, &mut samples)?;
        }
        if samples.is_empty() {
            return Err(DataError::Unsupported(format!(
                "the shards {} hold no samples",
                paths
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        Ok(WebDataset {
            shards: paths,
            samples,
            classes: num_classes,
            channels,
        })
    }

    /// Sample `index`'s key (its shard's member name without the extension).
    pub fn key(&self, index: usize) -> &str {
        &self.samples[index].key
    }

    fn read_member(&self, m: &Member) -> Result<Vec<u8>, DataError> {
        let path = &self.shards[m.shard];
        let mut file =
            std::fs::File::open(path).map_err(|e| DataError::corrupt(path, e.to_string()))?;
        let mut bytes = vec![0u8; m.len as usize];
        file.seek(SeekFrom::Start(m.offset))
            .and_then(|_| file.read_exact(&mut bytes))
            .map_err(|e| {
                DataError::corrupt(
                    path,
                    format!("sample '{}': cannot read its .{}: {e}", m.key, m.ext),
                )
            })?;
        Ok(bytes)
    }
}

impl Dataset for WebDataset {
    fn len(&self) -> usize {
        self.samples.len()
    }

    fn num_classes(&self) -> usize {
        self.classes
    }

    fn get(&self, index: usize) -> Result<Image, DataError> {
        let m = &self.samples[index];
        let bytes = self.read_member(m)?;
        let decoded = image::load_from_memory(&bytes).map_err(|e| {
            DataError::corrupt(
                &self.shards[m.shard],
                format!("sample '{}': its .{} cannot be decoded: {e}", m.key, m.ext),
            )
        })?;
        Ok(super::decoded_image(decoded, self.channels, m.label))
    }

    fn label(&self, index: usize) -> Option<Result<u32, DataError>> {
        Some(Ok(self.samples[index].label))
    }

    fn encoded(&self, index: usize) -> Option<Result<(Vec<u8>, String), DataError>> {
        let m = &self.samples[index];
        Some(self.read_member(m).map(|b| (b, m.ext.clone())))
    }
}

/// The key and extension of a member path, as WebDataset splits them: the extension starts at the first
/// dot of the file name (`a/b.seg.png` is key `a/b`, extension `seg.png`).
/// A name starting with a dot (`.hidden`, macOS's `._a.jpg`) has no key and is skipped, as WebDataset's
/// pattern `^((?:.*/|)[^.]+)[.]([^/]*)$` skips it.
fn key_and_ext(path: &str) -> Option<(&str, &str)> {
    let name_start = path.rfind('/').map_or(0, |i| i + 1);
    let dot = path[name_start..].find('.')?;
    if dot == 0 {
        return None;
    }
    let dot = dot + name_start;
    Some((&path[..dot], &path[dot + 1..]))
}

/// One shard's samples appended to `out`: consecutive members with the same key make a sample.
fn index_shard(
    path: &Path,
    shard: usize,
    keys: &Keys,
    classes: usize,
    out: &mut Vec<Member>,
) -> Result<(), DataError> {
    let file = std::fs::File::open(path).map_err(|e| DataError::Missing {
        name: "WebDataset shard".into(),
        looked_for: path.display().to_string(),
        hint: format!(
            "{e}; check data.train_urls / data.val_urls (brace patterns such as \
                       train-{{000000..000009}}.tar expand to one file each)"
        ),
    })?;
    let file_len = file.metadata().map(|m| m.len()).unwrap_or(u64::MAX);
    // Seeking over each member's data: opening a split reads the headers and labels, not the images.
    let mut archive = tar::Archive::new(std::io::BufReader::new(file));
    let entries = archive
        .entries_with_seek()
        .map_err(|e| DataError::corrupt(path, format!("not a tar file: {e}")))?;
    let mut current: Option<Pending> = None;
    for entry in entries {
        let mut entry = entry.map_err(|e| {
            DataError::corrupt(
                path,
                format!(
                    "truncated or damaged tar (after {} samples): {e}",
                    out.len()
                ),
            )
        })?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        if entry.raw_file_position() + entry.size() > file_len {
            return Err(DataError::corrupt(
                path,
                format!(
                    "truncated or damaged tar (after {} samples): a member ends past the end of the file",
                    out.len()
                ),
            ));
        }
        let name = entry
            .path()
            .map_err(|e| DataError::corrupt(path, e.to_string()))?
            .to_string_lossy()
            .to_string();
        let Some((key, ext)) = key_and_ext(&name) else {
            continue;
        };
        let ext = ext.to_ascii_lowercase();
        if current.as_ref().is_some_and(|c| c.key != key) {
            let done = current.take().expect("checked");
            out.push(done.finish(path, shard, keys)?);
        }
        let pending = current.get_or_insert_with(|| Pending::new(key));
        if keys.image.contains(&ext) {
            let rank = keys.image.iter().position(|e| *e == ext).expect("contains");
            if pending.image.as_ref().is_none_or(|(r, ..)| rank < *r) {
                pending.image = Some((rank, entry.raw_file_position(), entry.size(), ext.clone()));
            }
        } else if ext == keys.label {
            let mut text = String::new();
            entry.read_to_string(&mut text).map_err(|e| {
                DataError::corrupt(path, format!("sample '{key}': its .{ext} is not text: {e}"))
            })?;
            let label = parse_label(&text, &ext).and_then(|l| {
                (l < classes)
                    .then_some(l as u32)
                    .ok_or_else(|| format!("class {l} is not below data.num_classes={classes}"))
            });
            pending.label = Some(label.map_err(|m| {
                DataError::corrupt(path, format!("sample '{key}': its .{ext}: {m}"))
            })?);
        }
    }
    if let Some(last) = current {
        out.push(last.finish(path, shard, keys)?);
    }
    Ok(())
}

/// A sample whose members are being read.
struct Pending {
    key: String,
    image: Option<(usize, u64, u64, String)>,
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

    fn finish(self, path: &Path, shard: usize, keys: &Keys) -> Result<Member, DataError> {
        let (_, offset, len, ext) = self.image.ok_or_else(|| {
            DataError::corrupt(
                path,
                format!(
                    "sample '{}' has no image member (.{}); set data.image_key to its extension",
                    self.key,
                    keys.image.join(" or .")
                ),
            )
        })?;
        let label = self.label.ok_or_else(|| {
            DataError::corrupt(
                path,
                format!(
                    "sample '{}' has no .{} member; set data.label_key to its label's extension",
                    self.key, keys.label
                ),
            )
        })?;
        Ok(Member {
            shard,
            key: self.key,
            offset,
            len,
            ext,
            label,
        })
    }
}

/// A class from a label member: the number itself (`.cls`, `.txt`, ...) or a JSON object's `label` (or
/// `cls`) field.
fn parse_label(text: &str, ext: &str) -> Result<usize, String> {
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

/// WebDataset's URL patterns: `{000..099}` (zero-padded like its first bound) and `{a,b}` expand, several
/// braces multiply; `::` separates patterns.
pub fn expand_urls(pattern: &str) -> Result<Vec<String>, String> {
    let mut all = Vec::new();
    for part in pattern.split("::").map(str::trim).filter(|p| !p.is_empty()) {
        all.extend(expand_one(part)?);
    }
    if all.is_empty() {
        return Err(format!("'{pattern}' names no shard"));
    }
    Ok(all)
}

fn expand_one(pattern: &str) -> Result<Vec<String>, String> {
    let Some(open) = pattern.find('{') else {
        if pattern.contains('}') {
            return Err(format!("'{pattern}': '}}' without '{{'"));
        }
        return Ok(vec![pattern.to_string()]);
    };
    let close = pattern[open..]
        .find('}')
        .map(|i| i + open)
        .ok_or_else(|| format!("'{pattern}': '{{' without '}}'"))?;
    let (head, body, tail) = (
        &pattern[..open],
        &pattern[open + 1..close],
        &pattern[close + 1..],
    );
    let choices: Vec<String> = if let Some((a, b)) = body.split_once("..") {
        let (lo, hi): (u64, u64) = (
            a.parse()
                .map_err(|_| format!("'{pattern}': '{a}' is not a number"))?,
            b.parse()
                .map_err(|_| format!("'{pattern}': '{b}' is not a number"))?,
        );
        if lo > hi {
            return Err(format!("'{pattern}': the range {{{body}}} runs backwards"));
        }
        // As braceexpand (and bash): zero-padded to the wider bound when either has a leading zero.
        let padded = (a.len() > 1 && a.starts_with('0')) || (b.len() > 1 && b.starts_with('0'));
        let width = if padded { a.len().max(b.len()) } else { 0 };
        (lo..=hi).map(|n| format!("{n:0width$}")).collect()
    } else {
        body.split(',').map(str::to_string).collect()
    };
    let rest = expand_one(tail)?;
    Ok(choices
        .iter()
        .flat_map(|c| rest.iter().map(move |r| format!("{head}{c}{r}")))
        .collect())
}

/// The split's shards as local files: `data.train_urls` (or `val_urls`; `test_urls`, else `val_urls`)
/// expanded; `s3://` ones copied to the local cache.
pub fn split_paths(urls: &str, key: &str) -> Result<Vec<PathBuf>, DataError> {
    let expanded = expand_urls(urls).map_err(|m| DataError::Unsupported(format!("{key}: {m}")))?;
    let (remote, local): (Vec<String>, Vec<String>) = expanded
        .into_iter()
        .partition(|u| crate::storage::s3::is_s3(u));
    if !remote.is_empty() && !local.is_empty() {
        return Err(DataError::Unsupported(format!(
            "{key}: mixes s3:// and local shards; name one kind"
        )));
    }
    if remote.is_empty() {
        return Ok(local.into_iter().map(PathBuf::from).collect());
    }
    crate::storage::s3::mirror_objects(&remote)
        .map_err(|e| DataError::Unsupported(format!("{key}={urls}: {e:#}")))
}

/// Which configured URLs a split reads, and the key that named them.
pub fn urls_of<'a>(
    split: Split,
    train: Option<&'a str>,
    val: Option<&'a str>,
    test: Option<&'a str>,
) -> Result<(&'a str, &'static str), DataError> {
    let found = match split {
        Split::Train => train.map(|u| (u, "data.train_urls")),
        Split::Val => val.map(|u| (u, "data.val_urls")),
        Split::Test => test
            .map(|u| (u, "data.test_urls"))
            .or(val.map(|u| (u, "data.val_urls"))),
    };
    found.ok_or_else(|| {
        DataError::Unsupported(format!(
            "data=webdataset needs data.{}_urls for its {} split (a shard pattern such as \
             shards/{}-{{000000..000009}}.tar)",
            match split {
                Split::Train => "train",
                _ => "val",
            },
            match split {
                Split::Train => "training",
                Split::Val => "validation",
                Split::Test => "test",
            },
            match split {
                Split::Train => "train",
                _ => "val",
            },
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rstest::rstest]
    #[case("a-{000..002}.tar", &["a-000.tar", "a-001.tar", "a-002.tar"])]
    #[case("s3://b/{x,y}/p-{8..10}.tar", &["s3://b/x/p-8.tar", "s3://b/x/p-9.tar", "s3://b/x/p-10.tar", "s3://b/y/p-8.tar", "s3://b/y/p-9.tar", "s3://b/y/p-10.tar"])]
    #[case("one.tar::two-{1..2}.tar", &["one.tar", "two-1.tar", "two-2.tar"])]
    #[case("plain.tar", &["plain.tar"])]
    #[case("x{8..10}", &["x8", "x9", "x10"])]
    #[case("x{1..010}", &["x001", "x002", "x003", "x004", "x005", "x006", "x007", "x008", "x009", "x010"])]
    fn braces_expand_as_webdataset_does(#[case] pattern: &str, #[case] expected: &[&str]) {
        assert_eq!(expand_urls(pattern).unwrap(), expected);
    }

    #[rstest::rstest]
    #[case("a-{000..002.tar", "without '}'")]
    #[case("a-{5..2}.tar", "runs backwards")]
    #[case("a-{x..2}.tar", "'x' is not a number")]
    #[case("a-}.tar", "without '{'")]
    fn bad_patterns_say_why(#[case] pattern: &str, #[case] says: &str) {
        let err = expand_urls(pattern).unwrap_err();
        assert!(err.contains(says), "{err}");
    }

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
