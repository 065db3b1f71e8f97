//! `s3://bucket/key` for checkpoints: multipart upload, download, delete, existence — object_store's S3 client
//! (cargo feature `s3`) on a small tokio runtime. Credentials and endpoint come only from the usual AWS
//! environment variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`,
//! `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`), so they never enter the config, the run records or the logs.
//! An upload is atomic on the server: the object appears only when the multipart upload completes.

use std::path::Path;

/// A parsed `s3://bucket/key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Url {
    pub bucket: String,
    pub key: String,
}

impl S3Url {
    pub fn parse(url: &str) -> anyhow::Result<S3Url> {
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| anyhow::anyhow!("{url}: not an s3:// URL"))?;
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        anyhow::ensure!(
            !bucket.is_empty(),
            "{url}: no bucket name (expected s3://bucket/prefix)"
        );
        Ok(S3Url {
            bucket: bucket.to_string(),
            key: key.trim_matches('/').to_string(),
        })
    }

    /// This prefix joined with a file name.
    pub fn join(&self, name: &str) -> S3Url {
        S3Url {
            bucket: self.bucket.clone(),
            key: if self.key.is_empty() {
                name.to_string()
            } else {
                format!("{}/{name}", self.key)
            },
        }
    }
}

impl S3Url {
    /// The object's last key component (its file name).
    pub fn file_name(&self) -> &str {
        self.key.rsplit('/').next().unwrap_or_default()
    }

    /// The object beside this one called `name`.
    pub fn with_file_name(&self, name: &str) -> S3Url {
        let key = match self.key.rsplit_once('/') {
            Some((dir, _)) => format!("{dir}/{name}"),
            None => name.to_string(),
        };
        S3Url {
            bucket: self.bucket.clone(),
            key,
        }
    }
}

impl std::fmt::Display for S3Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.key)
    }
}

pub fn is_s3(path: &str) -> bool {
    path.starts_with("s3://")
}

#[cfg(feature = "s3")]
mod client {
    use super::S3Url;
    use anyhow::Context;
    use object_store::{ObjectStore, ObjectStoreExt, WriteMultipart};
    use std::io::Read;
    use std::path::Path;

    /// Said after S3 errors when the usual credentials are not set (object_store then asks the EC2
    /// instance-metadata service, which fails confusingly elsewhere).
    fn hint() -> &'static str {
        if std::env::var_os("AWS_ACCESS_KEY_ID").is_none() {
            "\n    (AWS_ACCESS_KEY_ID is not set: export AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION and, \
             for a non-AWS server, AWS_ENDPOINT_URL)"
        } else {
            ""
        }
    }

    /// Part size of multipart uploads (S3's minimum is 5 MiB).
    const PART: usize = 8 << 20;

    /// Tries per request (the first and its retries), as the AWS CLI and SDKs read `AWS_MAX_ATTEMPTS`;
    /// unset, object_store's own 11 (10 retries). Retries back off exponentially (0.1 s doubling, to
    /// 15 s apart) within 3 minutes a request, on 5xx, 429, timeouts and broken connections
    /// (`AWS_TIMEOUT`, e.g. `30s`, bounds one try).
    fn retry_config() -> anyhow::Result<object_store::RetryConfig> {
        let mut retry = object_store::RetryConfig::default();
        if let Some(raw) = std::env::var_os("AWS_MAX_ATTEMPTS") {
            let raw = raw.to_string_lossy();
            let attempts: usize = raw.trim().parse().ok().filter(|&n| n >= 1).ok_or_else(|| {
                anyhow::anyhow!(
                    "AWS_MAX_ATTEMPTS={raw}: expected a whole number of tries per S3 request, at least 1 \
                     (1: no retries)"
                )
            })?;
            retry.max_retries = attempts - 1;
        }
        Ok(retry)
    }

    fn store(url: &S3Url) -> anyhow::Result<object_store::aws::AmazonS3> {
        object_store::aws::AmazonS3Builder::from_env()
            .with_bucket_name(&url.bucket)
            .with_retry(retry_config()?)
            .build()
            .with_context(|| {
                format!("{url}: cannot set up the S3 client (check AWS_REGION / AWS_ENDPOINT_URL)")
            })
    }

    fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the runtime for S3 transfers")
    }

    fn key(url: &S3Url) -> object_store::path::Path {
        object_store::path::Path::from(url.key.as_str())
    }

    pub fn upload(local: &Path, url: &S3Url) -> anyhow::Result<()> {
        let store = store(url)?;
        let mut file = std::fs::File::open(local)
            .with_context(|| format!("cannot read {} to upload", local.display()))?;
        runtime()?.block_on(async {
            let upload = store
                .put_multipart(&key(url))
                .await
                .with_context(|| format!("{url}: cannot start the upload{}", hint()))?;
            let mut writer = WriteMultipart::new_with_chunk_size(upload, PART);
            let mut buf = vec![0u8; PART];
            let failed = loop {
                let n = match file.read(&mut buf) {
                    Ok(0) => break None,
                    Ok(n) => n,
                    Err(e) => {
                        break Some(
                            anyhow::Error::new(e).context(format!("reading {}", local.display())),
                        )
                    }
                };
                if let Err(e) = writer.wait_for_capacity(4).await {
                    break Some(anyhow::Error::new(e).context(format!("{url}: upload failed")));
                }
                writer.write(&buf[..n]);
            };
            if let Some(e) = failed {
                // The parts sent so far are the server's to drop (S3 keeps, and bills, an upload never
                // completed or aborted). `finish` aborts on its own failures.
                if let Err(abort) = writer.abort().await {
                    tracing::warn!("{url}: could not abort the failed upload: {abort}");
                }
                return Err(e);
            }
            writer
                .finish()
                .await
                .with_context(|| format!("{url}: upload failed"))?;
            anyhow::Ok(())
        })
    }

    pub fn download(url: &S3Url, local: &Path) -> anyhow::Result<()> {
        let store = store(url)?;
        let bytes = runtime()?.block_on(async {
            store
                .get(&key(url))
                .await
                .with_context(|| format!("{url}: cannot download{}", hint()))?
                .bytes()
                .await
                .with_context(|| format!("{url}: download interrupted"))
        })?;
        crate::storage::records::write_atomic(local, &bytes)
            .with_context(|| format!("cannot write {}", local.display()))
    }

    pub fn delete(url: &S3Url) -> anyhow::Result<()> {
        let store = store(url)?;
        runtime()?
            .block_on(store.delete(&key(url)))
            .with_context(|| format!("{url}: cannot delete{}", hint()))
    }

    /// Every object under the prefix `url` (recursively, or only at its own level) and its size.
    pub fn list(url: &S3Url, recursive: bool) -> anyhow::Result<Vec<(S3Url, u64)>> {
        let store = store(url)?;
        let rt = runtime()?;
        let mut found = Vec::new();
        let mut pending = vec![(!url.key.is_empty()).then(|| key(url))];
        while let Some(prefix) = pending.pop() {
            let listed = rt
                .block_on(store.list_with_delimiter(prefix.as_ref()))
                .with_context(|| format!("{url}: cannot list{}", hint()))?;
            if recursive {
                pending.extend(listed.common_prefixes.into_iter().map(Some));
            }
            found.extend(listed.objects.into_iter().map(|o| {
                let object = S3Url {
                    bucket: url.bucket.clone(),
                    key: o.location.to_string(),
                };
                (object, o.size)
            }));
        }
        found.sort_by(|a, b| a.0.key.cmp(&b.0.key));
        Ok(found)
    }

    /// The object's bytes as a `Read` streaming its body: nothing is stored. A connection dropped
    /// mid-body is resumed where it broke (object_store asks again for the rest, by range, and refuses
    /// a body whose ETag changed), so no byte is lost or read twice.
    pub fn open_read(url: &S3Url) -> anyhow::Result<Box<dyn Read + Send>> {
        let store = store(url)?;
        let runtime = runtime()?;
        let body = runtime
            .block_on(store.get(&key(url)))
            .with_context(|| format!("{url}: cannot read{}", hint()))?
            .into_stream();
        Ok(Box::new(BodyReader {
            url: url.to_string(),
            runtime,
            body,
            chunk: bytes::Bytes::new(),
        }))
    }

    /// An object's body read chunk by chunk on its own small runtime.
    struct BodyReader {
        url: String,
        runtime: tokio::runtime::Runtime,
        body: futures_util::stream::BoxStream<'static, object_store::Result<bytes::Bytes>>,
        chunk: bytes::Bytes,
    }

    impl Read for BodyReader {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            use futures_util::StreamExt;
            while self.chunk.is_empty() {
                match self.runtime.block_on(self.body.next()) {
                    None => return Ok(0),
                    Some(Ok(chunk)) => self.chunk = chunk,
                    Some(Err(e)) => {
                        return Err(std::io::Error::other(format!(
                            "{}: the download broke off and could not be resumed: {e}",
                            self.url
                        )))
                    }
                }
            }
            let n = out.len().min(self.chunk.len());
            out[..n].copy_from_slice(&self.chunk.split_to(n));
            Ok(n)
        }
    }

    pub fn exists(url: &S3Url) -> anyhow::Result<bool> {
        let store = store(url)?;
        match runtime()?.block_on(store.head(&key(url))) {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => {
                Err(anyhow::Error::new(e).context(format!("{url}: cannot look it up{}", hint())))
            }
        }
    }
}

#[cfg(not(feature = "s3"))]
mod client {
    use super::S3Url;
    use std::path::Path;

    fn unavailable(url: &S3Url) -> anyhow::Error {
        anyhow::anyhow!(
            "{url}: this build has no S3 support; rebuild with `cargo build --release --features s3`"
        )
    }
    pub fn upload(_: &Path, url: &S3Url) -> anyhow::Result<()> {
        Err(unavailable(url))
    }
    pub fn download(url: &S3Url, _: &Path) -> anyhow::Result<()> {
        Err(unavailable(url))
    }
    pub fn delete(url: &S3Url) -> anyhow::Result<()> {
        Err(unavailable(url))
    }
    pub fn exists(url: &S3Url) -> anyhow::Result<bool> {
        Err(unavailable(url))
    }
    pub fn list(url: &S3Url, _recursive: bool) -> anyhow::Result<Vec<(S3Url, u64)>> {
        Err(unavailable(url))
    }
    pub fn open_read(url: &S3Url) -> anyhow::Result<Box<dyn std::io::Read + Send>> {
        Err(unavailable(url))
    }
}

/// Whether this build can reach S3.
pub const AVAILABLE: bool = cfg!(feature = "s3");

/// Upload `local` to `url` (multipart).
pub fn upload(local: &Path, url: &S3Url) -> anyhow::Result<()> {
    client::upload(local, url)
}

/// Download `url` to `local`, atomically.
pub fn download(url: &S3Url, local: &Path) -> anyhow::Result<()> {
    client::download(url, local)
}

pub fn delete(url: &S3Url) -> anyhow::Result<()> {
    client::delete(url)
}

pub fn exists(url: &S3Url) -> anyhow::Result<bool> {
    client::exists(url)
}

/// The object `url` read as a stream (no local copy), resumed where a dropped connection broke it off.
pub fn open_read(url: &S3Url) -> anyhow::Result<Box<dyn std::io::Read + Send>> {
    client::open_read(url)
}

/// The local cache of objects read from S3: `TRAINYARD_CACHE`, else `$XDG_CACHE_HOME/trainyard`, else
/// `~/.cache/trainyard`.
pub fn cache_dir() -> std::path::PathBuf {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(dir) = env("TRAINYARD_CACHE") {
        return dir.into();
    }
    let base = env("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| env("HOME").map(|h| std::path::PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("trainyard")
}

/// The objects under the prefix `url` whose names end with `suffix`, copied to
/// `cache_dir()/s3/<bucket>/<key>` (each one not there yet, or there with another size, downloaded
/// atomically); the local directory of the prefix. An empty listing is an error naming the prefix.
pub fn mirror_prefix(url: &str, suffix: &str) -> anyhow::Result<std::path::PathBuf> {
    let prefix = S3Url::parse(url)?;
    let base = cache_dir().join("s3").join(&prefix.bucket);
    let objects: Vec<(S3Url, u64)> = client::list(&prefix, true)?
        .into_iter()
        .filter(|(o, _)| o.key.ends_with(suffix))
        .collect();
    anyhow::ensure!(
        !objects.is_empty(),
        "no *{suffix} objects under {prefix} (check the bucket and prefix)"
    );
    let kept = copy_to_cache(&objects)?;
    let local = if prefix.key.is_empty() {
        base
    } else {
        base.join(&prefix.key)
    };
    // A cached copy of an object no longer under the prefix (a republished dataset) is not read again.
    remove_unlisted(&local, suffix, &kept)?;
    Ok(local)
}

/// Files ending with `suffix` under `dir` that are not in `kept`, removed.
fn remove_unlisted(dir: &Path, suffix: &str, kept: &[std::path::PathBuf]) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            remove_unlisted(&path, suffix, kept)?;
        } else if path.to_string_lossy().ends_with(suffix) && !kept.contains(&path) {
            tracing::info!(
                "{}: no longer on S3, removed from the cache",
                path.display()
            );
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

/// The objects `urls` (each one listed beside its neighbours, so a missing one is named) copied to the
/// local cache as `mirror_prefix` copies them; their local paths, in the same order.
pub fn mirror_objects(urls: &[String]) -> anyhow::Result<Vec<std::path::PathBuf>> {
    copy_to_cache(&sizes(urls)?)
}

/// The objects `urls` and their sizes, each listed beside its neighbours (one listing per folder), so a
/// missing one is an error naming it.
pub fn sizes(urls: &[String]) -> anyhow::Result<Vec<(S3Url, u64)>> {
    let mut listed: std::collections::HashMap<(String, String), Vec<(S3Url, u64)>> =
        std::collections::HashMap::new();
    let mut objects = Vec::with_capacity(urls.len());
    for url in urls {
        let object = S3Url::parse(url)?;
        let dir = object
            .key
            .rsplit_once('/')
            .map_or("", |(d, _)| d)
            .to_string();
        let siblings = match listed.entry((object.bucket.clone(), dir.clone())) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(client::list(
                &S3Url {
                    bucket: object.bucket.clone(),
                    key: dir,
                },
                false,
            )?),
        };
        let size = siblings
            .iter()
            .find(|(o, _)| *o == object)
            .map(|(_, size)| *size)
            .ok_or_else(|| anyhow::anyhow!("{object}: no such object"))?;
        objects.push((object, size));
    }
    Ok(objects)
}

/// Each object not yet in `cache_dir()/s3/<bucket>/<key>` with its size downloaded there (atomically);
/// the local paths.
fn copy_to_cache(objects: &[(S3Url, u64)]) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let mut paths = Vec::with_capacity(objects.len());
    for (object, size) in objects {
        let local = cache_dir()
            .join("s3")
            .join(&object.bucket)
            .join(&object.key);
        let cached = std::fs::metadata(&local).is_ok_and(|m| m.len() == *size);
        if !cached {
            if let Some(dir) = local.parent() {
                std::fs::create_dir_all(dir)?;
            }
            tracing::info!("{object}: copying to {}", local.display());
            client::download(object, &local)?;
        }
        paths.push(local);
    }
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rstest::rstest]
    #[case("s3://b/p/q", "b", "p/q")]
    #[case("s3://b", "b", "")]
    #[case("s3://b/p/", "b", "p")]
    fn parses(#[case] url: &str, #[case] bucket: &str, #[case] key: &str) {
        let u = S3Url::parse(url).unwrap();
        assert_eq!((u.bucket.as_str(), u.key.as_str()), (bucket, key));
    }

    #[test]
    fn joins_and_rejects() {
        let u = S3Url::parse("s3://b/run").unwrap().join("last.safetensors");
        assert_eq!(u.to_string(), "s3://b/run/last.safetensors");
        assert!(S3Url::parse("s3:///x").is_err());
        assert!(S3Url::parse("/tmp/x").is_err());
    }
}
