//! `logger.wandb`: a Weights & Biases run written as W&B's client writes one in offline mode
//! (`<save_dir>/wandb/offline-run-<time>-<id>/run-<id>.wandb` and its `files/`), so that `wandb sync
//! <dir>` uploads it later from any machine with access. No network and no API key here: the record log
//! is the whole run (its config and tags, one history row per logged row, the summary, the files, the
//! exit code). With `offline: false`, `wandb sync` is run at the end when a `WANDB_API_KEY` and the
//! `wandb` command are there; otherwise the run's place and the command to upload it are printed.

pub mod record_log;

use super::{MetricSink, Row, RunEnd};
use crate::schema::LogModel;
use record_log::RecordLog;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// W&B's record types, generated at build time from `proto/wandb_internal.proto`.
#[allow(clippy::all, missing_docs)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/wandb_internal.rs"));
}
use proto::record::RecordType;

/// What the run is, for its run record.
pub struct WandbRun<'a> {
    pub settings: &'a crate::schema::WandbLogger,
    /// The typed experiment as JSON: one config item per top-level key.
    pub config: serde_json::Value,
    /// The resolved config, uploaded as a file of the run.
    pub config_yaml: &'a str,
    pub task_name: &'a str,
    /// The sweep the run is a job of: its group, unless `group` is set.
    pub sweep: Option<&'a str>,
}

pub struct WandbSink {
    log: RecordLog,
    dir: PathBuf,
    run_id: String,
    num: i64,
    rows: i64,
    started: Instant,
    latest: BTreeMap<String, f64>,
    files: Vec<String>,
    sync: bool,
    log_model: LogModel,
    /// The run directory, whose `summary.json` becomes a file of the W&B run at the end.
    run_dir: PathBuf,
    finished: bool,
}

/// A W&B run id: 8 characters of `[a-z0-9]`, as the client generates them.
fn new_run_id() -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..8)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// A float as JSON the way W&B's client writes it (Python's `json.dumps`: `NaN`, `Infinity`).
fn json_number(v: f64) -> String {
    match v {
        v if v.is_nan() => "NaN".into(),
        v if v == f64::INFINITY => "Infinity".into(),
        v if v == f64::NEG_INFINITY => "-Infinity".into(),
        v => serde_json::Value::from(v).to_string(),
    }
}

fn history_item(key: &str, value_json: String) -> proto::HistoryItem {
    proto::HistoryItem {
        key: key.to_string(),
        nested_key: Vec::new(),
        value_json,
    }
}

fn summary_item(key: &str, value_json: String) -> proto::SummaryItem {
    proto::SummaryItem {
        key: key.to_string(),
        nested_key: Vec::new(),
        value_json,
    }
}

fn non_empty(s: &Option<String>) -> Option<&str> {
    s.as_deref().filter(|s| !s.is_empty())
}

impl WandbSink {
    /// Start the run in `run_dir` (`save_dir` is relative to it): its directory, header and run record.
    pub fn create(run_dir: &Path, run: &WandbRun) -> anyhow::Result<WandbSink> {
        let s = run.settings;
        let run_id = non_empty(&s.id).map_or_else(new_run_id, str::to_string);
        let wandb_dir = match s.save_dir.as_str() {
            "" | "." => run_dir.join("wandb"),
            other => run_dir.join(other).join("wandb"),
        };
        let stamp = chrono::Local::now().format("%Y%m%d_%H%M%S");
        let dir = wandb_dir.join(format!("offline-run-{stamp}-{run_id}"));
        std::fs::create_dir_all(dir.join("files"))?;
        let latest = wandb_dir.join("latest-run");
        let _ = std::fs::remove_file(&latest);
        let _ = std::os::unix::fs::symlink(dir.file_name().unwrap_or_default(), &latest);
        let log = RecordLog::create(&dir.join(format!("run-{run_id}.wandb")))?;
        let mut sink = WandbSink {
            log,
            dir,
            run_id,
            num: 0,
            rows: 0,
            started: Instant::now(),
            latest: BTreeMap::new(),
            files: Vec::new(),
            sync: !s.offline,
            log_model: s.log_model,
            run_dir: run_dir.to_path_buf(),
            finished: false,
        };
        sink.write(RecordType::Header(proto::HeaderRecord {
            version_info: Some(proto::VersionInfo {
                producer: format!("trainyard {}", env!("CARGO_PKG_VERSION")),
                min_consumer: String::new(),
            }),
        }))?;
        let run_record = sink.run_record(run);
        sink.write(RecordType::Run(run_record))?;
        std::fs::write(
            sink.dir.join("files/trainyard-config.yaml"),
            run.config_yaml,
        )?;
        sink.files.push("trainyard-config.yaml".into());
        Ok(sink)
    }

    fn run_record(&self, run: &WandbRun) -> proto::RunRecord {
        let s = run.settings;
        let config = match &run.config {
            serde_json::Value::Object(m) => m
                .iter()
                .map(|(k, v)| proto::ConfigItem {
                    key: k.clone(),
                    nested_key: Vec::new(),
                    value_json: v.to_string(),
                })
                .collect(),
            _ => Vec::new(),
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        proto::RunRecord {
            run_id: self.run_id.clone(),
            entity: non_empty(&s.entity).unwrap_or_default().to_string(),
            project: s.project.clone(),
            config: Some(proto::ConfigRecord {
                update: config,
                remove: Vec::new(),
            }),
            run_group: non_empty(&s.group)
                .or(run.sweep)
                .unwrap_or_default()
                .to_string(),
            job_type: non_empty(&s.job_type).unwrap_or_default().to_string(),
            notes: non_empty(&s.notes).unwrap_or_default().to_string(),
            display_name: non_empty(&s.name).unwrap_or(run.task_name).to_string(),
            tags: s.tags.clone(),
            host: crate::storage::records::hostname(),
            start_time: Some(prost_types::Timestamp {
                seconds: now.as_secs() as i64,
                nanos: now.subsec_nanos() as i32,
            }),
            ..Default::default()
        }
    }

    fn write(&mut self, record: RecordType) -> anyhow::Result<()> {
        use prost::Message;
        self.num += 1;
        let record = proto::Record {
            num: self.num,
            record_type: Some(record),
            info: Some(proto::RecordInfo {
                stream_id: self.run_id.clone(),
            }),
        };
        self.log.append(&record.encode_to_vec())?;
        Ok(())
    }

    /// `_step`, `_runtime`, `_timestamp` of the row being written.
    fn clock(&self) -> [(&'static str, String); 3] {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        [
            ("_step", self.rows.to_string()),
            (
                "_runtime",
                json_number(self.started.elapsed().as_secs_f64()),
            ),
            ("_timestamp", json_number(now.as_secs_f64())),
        ]
    }

    fn end(&mut self, exit_code: i32, final_metrics: &BTreeMap<String, f64>) -> anyhow::Result<()> {
        self.finished = true;
        for (k, v) in final_metrics {
            self.latest.insert(k.clone(), *v);
        }
        let mut update: Vec<proto::SummaryItem> = self
            .latest
            .iter()
            .map(|(k, v)| summary_item(k, json_number(*v)))
            .collect();
        update.extend(self.clock().into_iter().map(|(k, v)| match k {
            "_step" => summary_item(k, (self.rows - 1).max(0).to_string()),
            _ => summary_item(k, v),
        }));
        self.write(RecordType::Summary(proto::SummaryRecord {
            update,
            remove: Vec::new(),
        }))?;
        let files = self
            .files
            .iter()
            .map(|path| proto::FilesItem {
                path: path.clone(),
                policy: proto::files_item::PolicyType::End as i32,
                r#type: proto::files_item::FileType::Other as i32,
            })
            .collect();
        self.write(RecordType::Files(proto::FilesRecord { files }))?;
        self.write(RecordType::Exit(proto::RunExitRecord {
            exit_code,
            runtime: self.started.elapsed().as_secs() as i32,
        }))?;
        self.log.sync()?;
        Ok(())
    }

    /// `log_model`: the best checkpoint (`true`; the last one when nothing was monitored) or every
    /// checkpoint of the run (`all`) become files of the run (`files/checkpoints/`), so `wandb sync`
    /// uploads them.
    fn add_checkpoints(&mut self, end: &RunEnd) -> anyhow::Result<()> {
        let chosen: Vec<PathBuf> = match self.log_model {
            LogModel::No => return Ok(()),
            LogModel::Best => end
                .best_checkpoint
                .or(end.last_checkpoint)
                .map(Path::to_path_buf)
                .into_iter()
                .collect(),
            LogModel::All => match end
                .best_checkpoint
                .or(end.last_checkpoint)
                .and_then(Path::parent)
            {
                Some(dir) => std::fs::read_dir(dir)?
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                    .collect(),
                None => Vec::new(),
            },
        };
        self.add_files("checkpoints", &chosen)
    }

    /// `sources` become files of the run under `files/<folder>/`, hard-linked (copied across file systems).
    fn add_files(&mut self, folder: &str, sources: &[PathBuf]) -> anyhow::Result<()> {
        let into = self.dir.join("files").join(folder);
        for source in sources {
            let Some(name) = source.file_name() else {
                continue;
            };
            std::fs::create_dir_all(&into)?;
            let target = into.join(name);
            let _ = std::fs::remove_file(&target);
            if std::fs::hard_link(source, &target).is_err() {
                std::fs::copy(source, &target)?;
            }
            self.files
                .push(format!("{folder}/{}", name.to_string_lossy()));
        }
        Ok(())
    }

    /// Upload with the real client when asked to and able to; otherwise say how.
    fn upload_or_say_how(&self) {
        let shown = crate::storage::records::display(&self.dir);
        let has_key = std::env::var_os("WANDB_API_KEY").is_some_and(|k| !k.is_empty());
        if self.sync && has_key {
            match std::process::Command::new("wandb")
                .arg("sync")
                .arg(&self.dir)
                .status()
            {
                Ok(s) if s.success() => return,
                Ok(s) => {
                    eprintln!("warning: `wandb sync {shown}` failed ({s}); the run stays on disk")
                }
                Err(e) => {
                    eprintln!("warning: cannot run `wandb sync` ({e}); the run stays on disk")
                }
            }
        }
        eprintln!("W&B run (offline): {shown}\n  upload it with: wandb sync {shown}");
    }
}

impl MetricSink for WandbSink {
    fn log(&mut self, row: &Row) -> anyhow::Result<()> {
        let mut item: Vec<proto::HistoryItem> = row
            .values
            .iter()
            .map(|(k, v)| history_item(k, json_number(*v)))
            .collect();
        // As Lightning's WandbLogger logs them: the epoch and the optimizer step are metrics too.
        for (k, v) in [("epoch", row.epoch), ("trainer/global_step", row.step)] {
            item.push(history_item(k, v.to_string()));
        }
        item.extend(self.clock().into_iter().map(|(k, v)| history_item(k, v)));
        for (k, v) in row.values {
            self.latest.insert(k.to_string(), *v);
        }
        self.write(RecordType::History(proto::HistoryRecord {
            item,
            step: Some(proto::HistoryStep { num: self.rows }),
        }))?;
        self.rows += 1;
        Ok(())
    }

    fn keeps_run_report(&self) -> bool {
        true
    }

    fn finish(&mut self, end: &RunEnd) -> anyhow::Result<()> {
        let summary = self.run_dir.join("summary.json");
        if summary.is_file() {
            std::fs::copy(&summary, self.dir.join("files/trainyard-summary.json"))?;
            self.files.push("trainyard-summary.json".into());
        }
        self.add_checkpoints(end)?;
        self.add_files("logbook", end.logbook)?;
        self.end(0, end.final_metrics)?;
        self.upload_or_say_how();
        Ok(())
    }
}

/// A run that ends in an error (or a panic) still ends its W&B run, with exit code 1.
impl Drop for WandbSink {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.end(1, &BTreeMap::new());
            eprintln!(
                "W&B run (offline, failed): {}",
                crate::storage::records::display(&self.dir)
            );
        }
    }
}
