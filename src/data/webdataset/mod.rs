//! WebDataset shards (`data=webdataset`): POSIX tar files in which the members of one sample share a key
//! (`n01440764_10026.jpg`, `n01440764_10026.cls`, ...: the key is the member's path up to the first dot of
//! its file name, as WebDataset groups them), named by brace patterns (`train-{000000..001281}.tar`).
//!
//! A split opens by reading each shard's tar headers once (the image members' offsets and sizes, and
//! the small label members' contents), so every sample has an address: the loader then reads samples as a
//! map-style dataset, which gives the distributed sampler's guarantees unchanged (each sample once per
//! epoch across ranks and workers, a shuffle seeded per epoch, exact mid-epoch resume from a checkpoint's
//! position). Reads are positioned reads of one member; shards on S3 read this way are copied to the local
//! cache first (`storage::s3::mirror_objects`). Shards can also be read as streams, front to back, with
//! no local copy (`streamed`): what `s3://` shards get unless `data.stream_shards=false`.

mod group;
pub mod streamed;

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

    fn sample_id(&self, index: usize) -> Option<String> {
        Some(self.key(index).to_string())
    }

    fn num_classes(&self) -> usize {
        self.classes
    }

    fn get(&self, index: usize) -> Result<Image, DataError> {
        let m = &self.samples[index];
        let bytes = self.read_member(m)?;
        super::decode_image(&bytes, self.channels, m.label).map_err(|e| {
            DataError::corrupt(
                &self.shards[m.shard],
                format!("sample '{}': its .{} cannot be decoded: {e}", m.key, m.ext),
            )
        })
    }

    fn label(&self, index: usize) -> Option<Result<u32, DataError>> {
        Some(Ok(self.samples[index].label))
    }

    /// The image member's bytes, for the loader's JPEG path (decoding only what the crop needs).
    fn encoded_image(&self, index: usize) -> Option<Result<super::EncodedImage, DataError>> {
        let m = &self.samples[index];
        Some(self.read_member(m).map(|bytes| super::EncodedImage {
            bytes,
            label: m.label,
            channels: self.channels,
            shard: self.shards[m.shard].display().to_string().into(),
            name: format!("sample '{}'", m.key),
        }))
    }

    fn encoded(&self, index: usize) -> Option<Result<(Vec<u8>, String), DataError>> {
        let m = &self.samples[index];
        Some(self.read_member(m).map(|b| (b, m.ext.clone())))
    }
}

/// A shard that is not there, and how its name came about.
fn missing_shard(shard: &dyn std::fmt::Display, e: impl std::fmt::Display) -> DataError {
    DataError::Missing {
        name: "WebDataset shard".into(),
        looked_for: shard.to_string(),
        hint: format!(
            "{e}; check data.train_urls / data.val_urls (brace patterns such as \
             train-{{000000..000009}}.tar expand to one file each)"
        ),
    }
}

/// One shard's samples appended to `out`: the image members' places and the labels.
fn index_shard(
    path: &Path,
    shard: usize,
    keys: &Keys,
    classes: usize,
    out: &mut Vec<Member>,
) -> Result<(), DataError> {
    let file = std::fs::File::open(path).map_err(|e| missing_shard(&path.display(), e))?;
    let file_len = file.metadata().map(|m| m.len()).ok();
    let name = path.display().to_string();
    // Seeking over each member's data: opening a split reads the headers and labels, not the images.
    let mut archive = tar::Archive::new(std::io::BufReader::new(file));
    let entries = archive
        .entries_with_seek()
        .map_err(|e| DataError::corrupt(path, format!("not a tar file: {e}")))?;
    let walk = group::Walk {
        shard: &name,
        file_len,
        keys,
        classes,
        read_from: usize::MAX,
    };
    walk.run(entries, |found| {
        let group::ImageAt::Span { offset, len } = found.image else {
            unreachable!("indexing keeps places, not bytes")
        };
        out.push(Member {
            shard,
            key: found.key,
            offset,
            len,
            ext: found.ext,
            label: found.label,
        });
        Ok(true)
    })?;
    Ok(())
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

/// The split's shards: `data.train_urls` (or `val_urls`; `test_urls`, else `val_urls`) expanded, all
/// local or all `s3://`.
pub fn split_urls(urls: &str, key: &str) -> Result<Vec<String>, DataError> {
    let expanded = expand_urls(urls).map_err(|m| DataError::Unsupported(format!("{key}: {m}")))?;
    let remote = expanded
        .iter()
        .filter(|u| crate::storage::s3::is_s3(u))
        .count();
    if remote != 0 && remote != expanded.len() {
        return Err(DataError::Unsupported(format!(
            "{key}: mixes s3:// and local shards; name one kind"
        )));
    }
    Ok(expanded)
}

/// The split's shards as local files, `s3://` ones copied to the local cache (`data.stream_shards=false`).
pub fn split_paths(urls: &str, key: &str) -> Result<Vec<PathBuf>, DataError> {
    let expanded = split_urls(urls, key)?;
    if !expanded.iter().any(|u| crate::storage::s3::is_s3(u)) {
        return Ok(expanded.into_iter().map(PathBuf::from).collect());
    }
    crate::storage::s3::mirror_objects(&expanded)
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
}
