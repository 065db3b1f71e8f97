//! WebDataset shards read as streams (`data.stream_shards`, the default for `s3://` shards): each shard is
//! read front to back, once per epoch, with nothing stored locally, as WebDataset's own loader reads
//! them. The dataset is a stream of shards (`Dataset::shard_lens`), so the shard sampler deals whole
//! shards to the ranks, the epoch's reader thread reads them with bounded read-ahead, a seeded shuffle
//! buffer mixes them, and a resumed epoch opens each shard at its first sample not trained on yet.
//!
//! The sampler needs each shard's sample count before the first epoch. A local shard's count comes
//! from its tar headers (seeking over the data); an S3 shard is counted by reading it through once, and
//! the count is kept in the local cache beside the object's size, so later runs (and the other ranks
//! of a node) do not read it again.

use super::group::{self, Found, ImageAt, Walk};
use super::Keys;
use crate::data::{DataError, Dataset, EncodedImage, Image, SampleIter, Streamed};
use crate::storage::s3;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub struct StreamedShards {
    urls: Vec<Arc<str>>,
    lens: Vec<usize>,
    keys: Keys,
    classes: usize,
    channels: usize,
}

/// Samples a shard's reader thread may read ahead of the epoch's reader.
const CHANNEL: usize = 8;

impl StreamedShards {
    /// The shards `urls` (local paths, or all `s3://`), counted.
    pub fn open(
        urls: Vec<String>,
        keys: &Keys,
        classes: usize,
        channels: usize,
    ) -> Result<Self, DataError> {
        let lens = if urls.iter().any(|u| s3::is_s3(u)) {
            remote_counts(&urls, keys, classes)?
        } else {
            urls.iter()
                .map(|u| local_count(Path::new(u), keys, classes))
                .collect::<Result<_, _>>()?
        };
        if lens.iter().sum::<usize>() == 0 {
            return Err(DataError::Unsupported(format!(
                "the shards {} hold no samples",
                urls.join(", ")
            )));
        }
        Ok(StreamedShards {
            urls: urls.into_iter().map(Arc::from).collect(),
            lens,
            keys: keys.clone(),
            classes,
            channels,
        })
    }

    /// The shard and place within it of sample `index`.
    fn locate(&self, index: usize) -> (usize, usize) {
        let mut rest = index;
        for (shard, &len) in self.lens.iter().enumerate() {
            if rest < len {
                return (shard, rest);
            }
            rest -= len;
        }
        panic!("sample {index} is past the {} samples", self.len())
    }
}

impl Dataset for StreamedShards {
    fn len(&self) -> usize {
        self.lens.iter().sum()
    }

    fn num_classes(&self) -> usize {
        self.classes
    }

    /// By index, for the rare reader that is not the loader (which streams): the shard is read up to
    /// the sample.
    fn get(&self, index: usize) -> Result<Image, DataError> {
        let (shard, at) = self.locate(index);
        self.open_shard(shard, at)?
            .next()
            .unwrap_or_else(|| {
                Err(group::corrupt(
                    &self.urls[shard],
                    format!("the shard ended before its sample {at}"),
                ))
            })?
            .into_image()
    }

    fn shard_lens(&self) -> Option<Vec<usize>> {
        Some(self.lens.clone())
    }

    /// The shard's samples from its `start`-th on, read by a thread of their own (the tar reader owns
    /// the connection) and handed over through a small channel; dropping the iterator stops it.
    fn open_shard(&self, shard: usize, start: usize) -> Result<SampleIter<'_>, DataError> {
        let url = self.urls[shard].clone();
        let (keys, classes, channels) = (self.keys.clone(), self.classes, self.channels);
        let (tx, rx) = std::sync::mpsc::sync_channel(CHANNEL);
        std::thread::spawn(move || {
            let walk = Walk {
                shard: &url,
                file_len: None,
                keys: &keys,
                classes,
                read_from: start,
            };
            let mut at = 0usize;
            let walked = walk_stream(&walk, |found: Found| {
                at += 1;
                if at <= start {
                    return Ok(true);
                }
                let ImageAt::Bytes(bytes) = found.image else {
                    unreachable!("images are read from `start` on")
                };
                let image = EncodedImage {
                    bytes,
                    label: found.label,
                    channels,
                    shard: url.clone(),
                    name: format!("sample '{}'", found.key),
                };
                // The receiver gone (the epoch ended): stop reading.
                Ok(tx.send(Ok(Streamed::Encoded(image))).is_ok())
            });
            if let Err(e) = walked {
                let _ = tx.send(Err(e));
            }
        });
        Ok(Box::new(rx.into_iter()))
    }
}

/// `walk` over its shard read front to back (a local file, or an S3 object's body: no local copy);
/// the number of samples walked.
fn walk_stream(
    walk: &Walk,
    sample: impl FnMut(Found) -> Result<bool, DataError>,
) -> Result<usize, DataError> {
    let url = walk.shard;
    let reader: Box<dyn Read + Send> = if s3::is_s3(url) {
        let object = s3::S3Url::parse(url).map_err(|e| DataError::Unsupported(format!("{e:#}")))?;
        s3::open_read(&object).map_err(|e| DataError::Unsupported(format!("{e:#}")))?
    } else {
        Box::new(std::fs::File::open(url).map_err(|e| super::missing_shard(&url, e))?)
    };
    let mut archive = tar::Archive::new(std::io::BufReader::with_capacity(1 << 18, reader));
    let entries = archive
        .entries()
        .map_err(|e| group::corrupt(url, format!("not a tar file: {e}")))?;
    walk.run(entries, sample)
}

/// A local shard's samples, counted from its headers as the indexed reader reads them (seeking over
/// the members' data).
fn local_count(path: &Path, keys: &Keys, classes: usize) -> Result<usize, DataError> {
    let mut samples = Vec::new();
    super::index_shard(path, 0, keys, classes, &mut samples)?;
    Ok(samples.len())
}

/// What the cache keeps of a counted S3 shard.
#[derive(serde::Serialize, serde::Deserialize)]
struct Counted {
    size: u64,
    samples: usize,
}

/// Each S3 shard's samples: from the cache when it counted an object of the same size, else read
/// through once (streamed, nothing stored but the count).
fn remote_counts(urls: &[String], keys: &Keys, classes: usize) -> Result<Vec<usize>, DataError> {
    let listed = s3::sizes(urls).map_err(|e| DataError::Unsupported(format!("{e:#}")))?;
    let mut counts = Vec::with_capacity(listed.len());
    for (object, size) in listed {
        let url = object.to_string();
        let record = count_record(&object);
        let cached = std::fs::read(&record)
            .ok()
            .and_then(|b| serde_json::from_slice::<Counted>(&b).ok())
            .filter(|c| c.size == size);
        if let Some(c) = cached {
            counts.push(c.samples);
            continue;
        }
        tracing::info!("{url}: counting its samples (read once; the count is cached)");
        let walk = Walk {
            shard: &url,
            file_len: None,
            keys,
            classes,
            read_from: usize::MAX,
        };
        let samples = walk_stream(&walk, |_| Ok(true))?;
        let json = serde_json::to_vec(&Counted { size, samples }).expect("plain numbers");
        if let Err(e) = crate::storage::records::write_atomic(&record, &json) {
            tracing::warn!(
                "cannot cache the count of {url} in {}: {e}",
                record.display()
            );
        }
        counts.push(samples);
    }
    Ok(counts)
}

/// Where the count of an S3 shard is cached.
fn count_record(object: &s3::S3Url) -> PathBuf {
    s3::cache_dir()
        .join("shard-counts")
        .join(&object.bucket)
        .join(format!("{}.json", object.key))
}
