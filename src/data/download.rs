//! `data.download: true`: fetch CIFAR-10/100 and (Fashion-)MNIST from the addresses torchvision uses, check the
//! published MD5 of every file, and put the data in place atomically: files are streamed to a temporary name
//! and renamed only once their checksum matches; archives are extracted into a temporary directory that is
//! renamed to `data.root` in one step, so an interrupted download never leaves a half-written data set.
//!
//! `data.mirror` replaces the official base address (same file names); `data.checksums` replaces the published
//! MD5 of named files (for a mirror that re-packs them).

use super::DataError;
use crate::schema::{DataConfig, DataName};
use md5::{Digest, Md5};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One file as published: where it lives and its MD5.
#[derive(Debug, Clone, Copy)]
struct Remote {
    base: &'static str,
    file: &'static str,
    md5: &'static str,
}

/// How the downloaded files become the data set under `data.root`.
#[derive(Debug, Clone, Copy)]
enum Source {
    /// A tar.gz whose single top directory holds `expected` (CIFAR): extracted and renamed to the root.
    Archive {
        remote: Remote,
        expected: &'static [&'static str],
    },
    /// Files stored as they are, directly under the root (MNIST's gzipped IDX files; the reader un-gzips).
    Files(&'static [Remote]),
}

const TORONTO: &str = "https://www.cs.toronto.edu/~kriz/";
const MNIST: &str = "https://ossci-datasets.s3.amazonaws.com/mnist/";
const FASHION: &str = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/";

const CIFAR10_FILES: &[&str] = &[
    "data_batch_1.bin",
    "data_batch_2.bin",
    "data_batch_3.bin",
    "data_batch_4.bin",
    "data_batch_5.bin",
    "test_batch.bin",
];
const CIFAR100_FILES: &[&str] = &["train.bin", "test.bin"];

const MNIST_FILES: &[Remote] = &[
    Remote {
        base: MNIST,
        file: "train-images-idx3-ubyte.gz",
        md5: "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    },
    Remote {
        base: MNIST,
        file: "train-labels-idx1-ubyte.gz",
        md5: "d53e105ee54ea40749a09fcbcd1e9432",
    },
    Remote {
        base: MNIST,
        file: "t10k-images-idx3-ubyte.gz",
        md5: "9fb629c4189551a2d022fa330f9573f3",
    },
    Remote {
        base: MNIST,
        file: "t10k-labels-idx1-ubyte.gz",
        md5: "ec29112dd5afa0611ce80d1b7f02629c",
    },
];
const FASHION_FILES: &[Remote] = &[
    Remote {
        base: FASHION,
        file: "train-images-idx3-ubyte.gz",
        md5: "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    },
    Remote {
        base: FASHION,
        file: "train-labels-idx1-ubyte.gz",
        md5: "25c81989df183df01b3e8a0aad5dffbe",
    },
    Remote {
        base: FASHION,
        file: "t10k-images-idx3-ubyte.gz",
        md5: "bef4ecab320f06d8554ea6380940ec79",
    },
    Remote {
        base: FASHION,
        file: "t10k-labels-idx1-ubyte.gz",
        md5: "bb300cfdad3c16e7a12a480ee83cd310",
    },
];

fn source(name: DataName) -> Result<Option<Source>, DataError> {
    Ok(match name {
        DataName::Synthetic | DataName::Registered | DataName::Parquet | DataName::Webdataset => {
            None
        }
        DataName::Cifar10 => Some(Source::Archive {
            remote: Remote {
                base: TORONTO,
                file: "cifar-10-binary.tar.gz",
                md5: "c32a1d4ab5d03f1284b67883e8d87530",
            },
            expected: CIFAR10_FILES,
        }),
        DataName::Cifar100 => Some(Source::Archive {
            remote: Remote {
                base: TORONTO,
                file: "cifar-100-binary.tar.gz",
                md5: "03b5dce01913d631647c71ecec9e9cb8",
            },
            expected: CIFAR100_FILES,
        }),
        DataName::Mnist => Some(Source::Files(MNIST_FILES)),
        DataName::FashionMnist => Some(Source::Files(FASHION_FILES)),
        DataName::Cinic10 | DataName::Imagenet => {
            return Err(DataError::Unsupported(format!(
                "data.download=true: {}; put train/<class>/*.{{JPEG,png}} and val/ under data.root yourself \
                 and set data.download=false",
                if name == DataName::Imagenet {
                    "ImageNet cannot be fetched unattended (image-net.org needs a registered account)"
                } else {
                    "CINIC-10 is published as a zip of image folders on Edinburgh DataShare, not fetched here"
                }
            )))
        }
    })
}

/// Make sure the data set named by `cfg` is on disk when `data.download` is set: download what is missing,
/// verify it, and install it under `data.root`. Does nothing when the files are already there.
pub fn ensure(cfg: &DataConfig) -> Result<(), DataError> {
    if !cfg.download {
        return Ok(());
    }
    let Some(source) = source(cfg.name)? else {
        return Ok(());
    };
    let root = PathBuf::from(cfg.root.clone().unwrap_or_else(|| "data".into()));
    let fetcher = Fetcher::new(cfg);
    match source {
        Source::Files(remotes) => {
            // MNIST already in torchvision's folder (`<root>/MNIST/raw/`) is used there.
            let root = match cfg.name {
                DataName::Mnist => super::mnist::files_dir(&root, "MNIST"),
                DataName::FashionMnist => super::mnist::files_dir(&root, "FashionMNIST"),
                _ => root,
            };
            std::fs::create_dir_all(&root).map_err(|e| io_error(&root, e))?;
            for remote in remotes {
                let dest = root.join(remote.file);
                let unpacked = root.join(remote.file.trim_end_matches(".gz"));
                if !dest.is_file() && !unpacked.is_file() {
                    fetcher.fetch_verified(remote, &dest)?;
                }
            }
        }
        Source::Archive { remote, expected } => {
            if expected.iter().all(|f| root.join(f).is_file()) {
                return Ok(());
            }
            install_archive(&fetcher, &remote, expected, &root)?;
        }
    }
    Ok(())
}

/// Download (or reuse a verified) archive beside the root, extract it into a temporary directory, and rename
/// the directory holding the expected files to the root.
fn install_archive(
    fetcher: &Fetcher,
    remote: &Remote,
    expected: &[&str],
    root: &Path,
) -> Result<(), DataError> {
    let parent = match root.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|e| io_error(&parent, e))?;
    if root.exists() {
        let empty = std::fs::read_dir(root)
            .map(|mut d| d.next().is_none())
            .unwrap_or(false);
        if !empty {
            return Err(DataError::Unsupported(format!(
                "data.download=true: {} exists but lacks {}; remove it (or point data.root at an empty or \
                 missing directory) so the download can be installed there",
                root.display(),
                expected.join(", ")
            )));
        }
        std::fs::remove_dir(root).map_err(|e| io_error(root, e))?;
    }
    let archive = parent.join(remote.file);
    let expected_md5 = fetcher.expected_md5(remote);
    let reusable = archive.is_file() && md5_of_file(&archive)? == expected_md5;
    if !reusable {
        fetcher.fetch_verified(remote, &archive)?;
    }
    let staging = tempfile::Builder::new()
        .prefix(".extract-")
        .tempdir_in(&parent)
        .map_err(|e| io_error(&parent, e))?;
    let file = std::fs::File::open(&archive).map_err(|e| io_error(&archive, e))?;
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(file));
    let entries = tar
        .entries()
        .map_err(|e| DataError::corrupt(&archive, e.to_string()))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| DataError::corrupt(&archive, e.to_string()))?;
        // `unpack_in` refuses members that would land outside the staging directory (`..`, absolute paths).
        entry
            .unpack_in(staging.path())
            .map_err(|e| DataError::corrupt(&archive, e.to_string()))?;
    }
    let found = holding_dir(staging.path(), expected).ok_or_else(|| {
        DataError::corrupt(
            &archive,
            format!("the archive does not contain {}", expected.join(", ")),
        )
    })?;
    std::fs::rename(&found, root).map_err(|e| io_error(root, e))?;
    tracing::info!("installed {} into {}", remote.file, root.display());
    Ok(())
}

/// The staging directory itself or one of its subdirectories that holds every expected file.
fn holding_dir(staging: &Path, expected: &[&str]) -> Option<PathBuf> {
    let holds = |d: &Path| expected.iter().all(|f| d.join(f).is_file());
    if holds(staging) {
        return None; // files at the archive's top level: not the published layout
    }
    std::fs::read_dir(staging)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|d| d.is_dir() && holds(d))
}

/// HTTP GET with timeouts, streaming to a temporary file while hashing.
struct Fetcher {
    agent: ureq::Agent,
    mirror: Option<String>,
    checksums: std::collections::BTreeMap<String, String>,
}

impl Fetcher {
    fn new(cfg: &DataConfig) -> Self {
        let config = ureq::Agent::config_builder()
            .timeout_connect(Some(Duration::from_secs(30)))
            .timeout_recv_body(Some(Duration::from_secs(60)))
            .build();
        Fetcher {
            agent: config.into(),
            mirror: cfg.mirror.clone(),
            checksums: cfg.checksums.clone(),
        }
    }

    fn url(&self, remote: &Remote) -> String {
        match &self.mirror {
            Some(m) => format!("{}/{}", m.trim_end_matches('/'), remote.file),
            None => format!("{}{}", remote.base, remote.file),
        }
    }

    fn expected_md5(&self, remote: &Remote) -> String {
        self.checksums
            .get(remote.file)
            .map(|s| s.to_ascii_lowercase())
            .unwrap_or_else(|| remote.md5.to_string())
    }

    /// Download `remote` to `dest`: stream to a temporary file beside it, compare the MD5, rename.
    fn fetch_verified(&self, remote: &Remote, dest: &Path) -> Result<(), DataError> {
        let url = self.url(remote);
        let dir = dest.parent().unwrap_or(Path::new("."));
        let started = Instant::now();
        tracing::info!("downloading {url} -> {}", dest.display());
        let mut response = self.agent.get(&url).call().map_err(|e| {
            DataError::Unsupported(format!(
                "data.download=true: GET {url} failed: {e}\n    Without network access, fetch {} by hand into {} \
                 (or set data.mirror=<base URL> to use a mirror) and run again.",
                remote.file,
                dir.display()
            ))
        })?;
        let mut part = tempfile::Builder::new()
            .prefix(&format!(".{}.", remote.file))
            .suffix(".part")
            .tempfile_in(dir)
            .map_err(|e| io_error(dir, e))?;
        let mut reader = response.body_mut().as_reader();
        let mut hasher = Md5::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        loop {
            let n = reader.read(&mut buf).map_err(|e| {
                DataError::Unsupported(format!(
                    "data.download=true: reading {url} failed after {total} bytes: {e}"
                ))
            })?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            part.write_all(&buf[..n])
                .map_err(|e| io_error(part.path(), e))?;
            total += n as u64;
        }
        let got = hex(&hasher.finalize());
        let want = self.expected_md5(remote);
        if got != want {
            let from = if self.checksums.contains_key(remote.file) {
                "data.checksums"
            } else {
                "the published checksum"
            };
            return Err(DataError::Corrupt {
                path: url,
                message: format!(
                    "MD5 {got} does not match {want} ({from}); the download ({total} bytes) was discarded. \
                     If a mirror re-packs the file, set its checksum with \
                     data.checksums={{{}: <md5>}}",
                    remote.file
                ),
            });
        }
        part.as_file().sync_all().map_err(|e| io_error(dest, e))?;
        part.persist(dest).map_err(|e| io_error(dest, e.error))?;
        tracing::info!(
            "downloaded {} ({total} bytes, MD5 ok) in {:.1}s",
            remote.file,
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }
}

fn md5_of_file(path: &Path) -> Result<String, DataError> {
    let mut file = std::fs::File::open(path).map_err(|e| io_error(path, e))?;
    let mut hasher = Md5::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(|e| io_error(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn io_error(path: &Path, e: std::io::Error) -> DataError {
    DataError::corrupt(path, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md5_of_known_text() {
        let mut h = Md5::new();
        h.update(b"abc");
        assert_eq!(hex(&h.finalize()), "900150983cd24fb0d6963f7d28e17f72");
    }

    #[test]
    fn image_folders_cannot_be_downloaded() {
        let err = source(DataName::Imagenet).unwrap_err().to_string();
        assert!(err.contains("data.download=true") && err.contains("data.root"));
    }
}
