//! `train pack out=DIR [split=train] [maxcount=10000] [prefix=train] <overrides...>`: the split of the
//! dataset the overrides compose (`data=cifar10`, `data=imagenet data.root=...`, `data=parquet_mnist`,
//! any `data:` a run can read) written as WebDataset shards, `DIR/<prefix>-000000.tar`, ... of
//! `maxcount` samples each: `<key>.<ext>` (the file's own bytes where the dataset reads encoded files — JPEG
//! folders, parquet; PNG of the decoded pixels otherwise, lossless) and `<key>.cls`. Each shard is written
//! to a temporary name and renamed when complete. Prints the pattern `data.train_urls` takes.

use crate::config::compose::RunMode;
use crate::config::hydra::{compose_with_hydra, parse_overrides, split_hydra};
use crate::config::interpolate::{resolve_all, ResolveContext};
use crate::data::{Dataset, Split};
use crate::project::{ConfigLocation, Setup};
use anyhow::Context;
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const KEYS: [&str; 4] = ["out", "split", "maxcount", "prefix"];

fn usage() -> &'static str {
    "train pack out=shards/ [split=train|val|test] [maxcount=10000] [prefix=<split>] data=... [overrides]"
}

/// Parse the pack arguments, compose the dataset from the rest, write its shards.
pub fn run(args: &[OsString]) -> anyhow::Result<ExitCode> {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "Write a split of any dataset a run reads as WebDataset shards (tar files of maxcount \
             samples each),\nfor `data=webdataset`.\n\nUsage: {}\n\n  out=DIR        where the shards go \
             (DIR/<prefix>-000000.tar, ...)\n  split=SPLIT    train (default), val or test\n  \
             maxcount=N     samples per shard (default 10000)\n  prefix=NAME    the shards' name \
             (default: the split)\n  -cp/-cn/-cd    where the configs come from, as for `train`\n  \
             OVERRIDES      compose the dataset as a run would (data=cifar10 data.root=...)",
            usage()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let (mut out, mut split, mut maxcount, mut prefix) = (None, Split::Train, 10_000usize, None);
    let mut overrides = Vec::new();
    let mut location = ConfigLocation::default();
    let mut args = args.iter().map(|a| a.to_string_lossy().to_string());
    while let Some(arg) = args.next() {
        // The config's location, as `train` itself takes it (`-cp DIR`, `--config-path=DIR`, ...).
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with('-') => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        if let Some(kind) = config_flag(&flag) {
            let value = match inline {
                Some(v) => v,
                None => args
                    .next()
                    .with_context(|| format!("train pack: {flag} needs a value"))?,
            };
            match kind {
                'p' => location.config_path = Some(PathBuf::from(value)),
                'n' => location.config_name = Some(value),
                _ => location.config_dir.push(PathBuf::from(value)),
            }
            continue;
        }
        match arg.split_once('=') {
            Some(("out", v)) => out = Some(PathBuf::from(v)),
            Some(("split", v)) => {
                split = match v {
                    "train" => Split::Train,
                    "val" | "validation" => Split::Val,
                    "test" => Split::Test,
                    other => anyhow::bail!("train pack: split={other}: use train, val or test"),
                }
            }
            Some(("maxcount", v)) => {
                maxcount = v
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .with_context(|| format!("train pack: maxcount={v}: a positive number"))?
            }
            Some(("prefix", v)) => prefix = Some(v.to_string()),
            Some((key, _)) if !key.contains('.') && !key.starts_with(['+', '~']) => {
                if let Some(near) = crate::config::errors::did_you_mean(key, KEYS.iter().copied()) {
                    anyhow::bail!(
                        "train pack: '{key}' is not a pack argument; did you mean '{near}'?"
                    );
                }
                overrides.push(arg)
            }
            _ => overrides.push(arg),
        }
    }
    let out = out.with_context(|| format!("train pack needs out=; usage: {}", usage()))?;
    let (data, seed) = compose_data(&location, &overrides)?;
    let dataset = crate::data::open(&data, split, seed)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("data={}", data_name(&data)))?;
    let prefix = prefix.unwrap_or_else(|| {
        match split {
            Split::Train => "train",
            Split::Val => "val",
            Split::Test => "test",
        }
        .to_string()
    });
    anyhow::ensure!(
        !dataset.is_empty(),
        "train pack: the {prefix} split of data={} holds no samples",
        data_name(&data)
    );
    let shards = write_shards(dataset.as_ref(), &out, &prefix, maxcount)?;
    let last = shards.saturating_sub(1);
    println!(
        "Packed {} samples into {shards} shard(s): {}",
        dataset.len(),
        out.join(format!("{prefix}-{{000000..{last:06}}}.tar"))
            .display()
    );
    Ok(ExitCode::SUCCESS)
}

fn data_name(data: &crate::schema::DataConfig) -> String {
    serde_json::to_value(data.name)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// `-cp`/`--config-path`, `-cn`/`--config-name`, `-cd`/`--config-dir`: which one (p, n, d).
fn config_flag(flag: &str) -> Option<char> {
    match flag {
        "-cp" | "--config-path" => Some('p'),
        "-cn" | "--config-name" => Some('n'),
        "-cd" | "--config-dir" => Some('d'),
        _ => None,
    }
}

/// The `data:` section the overrides compose, resolved and typed as a run's would be, and the run's
/// seed (generated and registered datasets read it).
fn compose_data(
    location: &ConfigLocation,
    overrides: &[String],
) -> anyhow::Result<(crate::schema::DataConfig, u64)> {
    let err = |e: crate::config::errors::ConfigError| anyhow::anyhow!("{e}");
    let setup = Setup::discover(location).map_err(err)?;
    let parsed = parse_overrides(overrides).map_err(err)?;
    let composed =
        compose_with_hydra(&setup.repo, &setup.config_name, &parsed, RunMode::Run).map_err(err)?;
    // Placed as a run would be (its directory worked out, nothing written), so every interpolation
    // resolves as the run's would.
    let (job, hydra) = split_hydra(composed.config);
    let place = crate::job::place::place_job(
        &setup,
        &job,
        hydra,
        0,
        None,
        &ResolveContext::from_process(),
    )
    .map_err(err)?;
    let resolved = resolve_all(&job, &place.ctx).map_err(err)?;
    let experiment = crate::schema::extract(&resolved).map_err(err)?;
    Ok((experiment.data, experiment.seed))
}

/// Every sample of `dataset`, in order, into `dir/<prefix>-NNNNNN.tar` of `maxcount` samples each; the
/// number of shards.
pub fn write_shards(
    dataset: &dyn Dataset,
    dir: &Path,
    prefix: &str,
    maxcount: usize,
) -> anyhow::Result<usize> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut shard = 0;
    for start in (0..dataset.len()).step_by(maxcount) {
        let path = dir.join(format!("{prefix}-{shard:06}.tar"));
        let tmp = dir.join(format!(".{prefix}-{shard:06}.tar.tmp"));
        let end = (start + maxcount).min(dataset.len());
        let written = write_shard(dataset, start..end, &tmp).and_then(|()| {
            std::fs::rename(&tmp, &path)
                .with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))
        });
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e.context(format!("writing {}", path.display())));
        }
        shard += 1;
    }
    Ok(shard)
}

/// The samples `range` of `dataset` as one tar file at `tmp`, flushed to disk.
fn write_shard(
    dataset: &dyn Dataset,
    range: std::ops::Range<usize>,
    tmp: &Path,
) -> anyhow::Result<()> {
    let file =
        std::fs::File::create(tmp).with_context(|| format!("cannot write {}", tmp.display()))?;
    let mut tar = tar::Builder::new(std::io::BufWriter::new(file));
    for index in range {
        let (bytes, ext, label) = sample_bytes(dataset, index)?;
        let key = format!("{index:09}");
        append(&mut tar, &format!("{key}.{ext}"), &bytes)?;
        append(
            &mut tar,
            &format!("{key}.cls"),
            label.to_string().as_bytes(),
        )?;
    }
    let mut writer = tar.into_inner()?;
    writer.flush()?;
    writer.get_ref().sync_all()?;
    Ok(())
}

/// Sample `index` as an image file's bytes, its extension and its class: the file it was read from
/// when the dataset keeps one (no decoding), else PNG of its pixels.
fn sample_bytes(dataset: &dyn Dataset, index: usize) -> anyhow::Result<(Vec<u8>, String, u32)> {
    let named = |e: crate::data::DataError| anyhow::anyhow!("sample {index}: {e}");
    if let (Some(encoded), Some(label)) = (dataset.encoded(index), dataset.label(index)) {
        let (bytes, ext) = encoded.map_err(named)?;
        return Ok((bytes, ext, label.map_err(named)?));
    }
    let image = dataset.get(index).map_err(named)?;
    let color = if image.channels == 1 {
        image::ExtendedColorType::L8
    } else {
        image::ExtendedColorType::Rgb8
    };
    let mut png = Vec::new();
    image::ImageEncoder::write_image(
        image::codecs::png::PngEncoder::new(&mut png),
        &image.pixels,
        image.width as u32,
        image.height as u32,
        color,
    )
    .with_context(|| format!("sample {index}: cannot encode as PNG"))?;
    Ok((png, "png".into(), image.label))
}

fn append<W: Write>(tar: &mut tar::Builder<W>, name: &str, bytes: &[u8]) -> anyhow::Result<()> {
    let mut header = tar::Header::new_ustar();
    header.set_size(bytes.len() as u64);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_entry_type(tar::EntryType::Regular);
    tar.append_data(&mut header, name, bytes)
        .with_context(|| format!("cannot add {name} to the shard"))
}
