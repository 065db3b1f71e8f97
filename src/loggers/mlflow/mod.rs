//! `logger.mlflow`: the run on an MLflow tracking server, over its REST API. The experiment and the run
//! are made when the run starts (with the config flattened into params); each logged row then goes onto a
//! bounded queue that a thread empties in `log-batch` calls (the rows of up to a second, at most MLflow's
//! 1000 metrics per call), so the training step never waits for the network. Calls are retried with back-off; a server that stops
//! answering costs the rows it missed, never the run, and the run says so once, at its end. With
//! `log_model`, the best (or every) checkpoint, `summary.json` and the run's logbook section are uploaded
//! as artifacts.

pub mod rest;

use super::{MetricSink, Row, RunEnd};
use crate::schema::{LogModel, MlflowLogger};
use rest::{CallError, Client, RunInfo};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Rows waiting for the sender thread; more are dropped (and counted) rather than slowing training.
const QUEUE_ROWS: usize = 4096;

/// How long the sender gathers rows into one call: each call costs the server (and, on a small machine,
/// the training beside it) far more than its rows do.
const GATHER: Duration = Duration::from_secs(1);

/// What the run is, for the run MLflow keeps.
pub struct MlflowRun<'a> {
    pub settings: &'a MlflowLogger,
    /// The typed experiment as JSON: flattened into params.
    pub config: Value,
    pub run_name: String,
    pub sweep: Option<&'a str>,
    pub run_dir: &'a Path,
}

enum Message {
    Row(Vec<Value>),
    End {
        status: &'static str,
        artifacts: Vec<(String, PathBuf)>,
    },
}

/// What the sender thread managed.
#[derive(Default)]
struct Delivery {
    rows_lost: usize,
    first_failure: Option<String>,
    artifact_errors: Vec<String>,
}

pub struct MlflowSink {
    queue: Option<SyncSender<Message>>,
    sender: Option<JoinHandle<Delivery>>,
    tracking_uri: String,
    run_id: String,
    rows: usize,
    rows_not_queued: usize,
    log_model: LogModel,
    run_dir: PathBuf,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as i64
}

/// The tracking server: `tracking_uri`, else `MLFLOW_TRACKING_URI`; an HTTP(S) server only.
pub fn tracking_uri(settings: &MlflowLogger) -> anyhow::Result<String> {
    let uri = settings
        .tracking_uri
        .clone()
        .filter(|u| !u.is_empty())
        .or_else(|| {
            std::env::var("MLFLOW_TRACKING_URI")
                .ok()
                .filter(|u| !u.is_empty())
        });
    match uri {
        Some(u) if u.starts_with("http://") || u.starts_with("https://") => Ok(u),
        Some(u) => anyhow::bail!(
            "logger.mlflow.tracking_uri={u}: trainyard logs to an MLflow tracking server over HTTP; \
             start one (`mlflow server --host 127.0.0.1 --port 5000`) and set tracking_uri: http://127.0.0.1:5000"
        ),
        None => anyhow::bail!(
            "logger.mlflow: no tracking server named; set logger.mlflow.tracking_uri=http://HOST:PORT or \
             the MLFLOW_TRACKING_URI environment variable (MLflow's local ./mlruns files are not written)"
        ),
    }
}

/// The config as MLflow params: dotted keys, JSON values (strings bare), within MLflow's size limits.
fn flatten(prefix: &str, v: &Value, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, child, out);
            }
        }
        Value::String(s) => out.push((prefix.to_string(), s.clone())),
        other => out.push((prefix.to_string(), other.to_string())),
    }
}

fn clipped(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

impl MlflowSink {
    /// Make the experiment and the run, log the params, start the sender thread.
    pub fn create(run: &MlflowRun) -> anyhow::Result<MlflowSink> {
        let s = run.settings;
        let uri = tracking_uri(s)?;
        let backoff: Vec<Duration> = [250, 500, 1000, 2000, 4000]
            .iter()
            .map(|ms| Duration::from_millis(*ms))
            .collect();
        let client = Client::new(&uri, backoff);
        let failed = |what: &str, e: CallError| {
            anyhow::anyhow!("MLflow at {uri}: could not {what}: {e} (logger.mlflow.tracking_uri)")
        };
        let experiment = client
            .experiment(&s.experiment_name)
            .map_err(|e| failed("find or create the experiment", e))?;
        let mut tags: Vec<(String, String)> = vec![
            ("mlflow.source.name".into(), "trainyard".into()),
            (
                "trainyard.run_dir".into(),
                run.run_dir.display().to_string(),
            ),
        ];
        if let Some(sweep) = run.sweep {
            tags.push(("trainyard.sweep".into(), sweep.into()));
        }
        for (k, v) in &s.tags {
            let v = match v {
                Value::String(t) => t.clone(),
                other => other.to_string(),
            };
            tags.push((k.clone(), v));
        }
        let name = s.run_name.clone().unwrap_or_else(|| run.run_name.clone());
        let info = client
            .create_run(&experiment, &name, now_ms(), &tags)
            .map_err(|e| failed("create the run", e))?;
        let mut params = Vec::new();
        flatten("", &run.config, &mut params);
        let params: Vec<(String, String)> = params
            .into_iter()
            .map(|(k, v)| (clipped(k, 250), clipped(v, 6000)))
            .collect();
        for chunk in params.chunks(rest::MAX_PARAMS) {
            client
                .log_batch(&info.run_id, &[], chunk, &[])
                .map_err(|e| failed("log the config as params", e))?;
        }
        let (queue, inbox) = sync_channel(QUEUE_ROWS);
        let run_id = info.run_id.clone();
        let sender = std::thread::Builder::new()
            .name("mlflow-sender".into())
            .spawn(move || deliver(&client, &info, inbox))?;
        Ok(MlflowSink {
            queue: Some(queue),
            sender: Some(sender),
            tracking_uri: uri,
            run_id,
            rows: 0,
            rows_not_queued: 0,
            log_model: s.log_model,
            run_dir: run.run_dir.to_path_buf(),
        })
    }

    /// End the run on the server and wait for the sender; say once what was lost.
    fn close(&mut self, status: &'static str, artifacts: Vec<(String, PathBuf)>) {
        let Some(queue) = self.queue.take() else {
            return;
        };
        let _ = queue.send(Message::End { status, artifacts });
        drop(queue);
        let delivery = self
            .sender
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        let lost = delivery.rows_lost + self.rows_not_queued;
        if lost > 0 {
            eprintln!(
                "warning: MLflow at {}: {lost} of {} rows of run {} were not logged ({}); the training run \
                 itself is complete and metrics.csv has every row",
                self.tracking_uri,
                self.rows,
                self.run_id,
                delivery
                    .first_failure
                    .as_deref()
                    .unwrap_or("the sender's queue was full")
            );
        }
        for e in delivery.artifact_errors {
            eprintln!("warning: MLflow artifact not uploaded: {e}");
        }
    }

    /// `log_model`: the checkpoints to upload, with `summary.json` and the run's logbook section.
    fn artifacts(&self, end: &RunEnd) -> Vec<(String, PathBuf)> {
        let checkpoint = end.best_checkpoint.or(end.last_checkpoint);
        let chosen: Vec<PathBuf> = match self.log_model {
            LogModel::No => return Vec::new(),
            LogModel::Best => checkpoint.map(Path::to_path_buf).into_iter().collect(),
            LogModel::All => checkpoint
                .and_then(Path::parent)
                .and_then(|d| std::fs::read_dir(d).ok())
                .map(|entries| {
                    entries
                        .flatten()
                        .map(|e| e.path())
                        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                        .collect()
                })
                .unwrap_or_default(),
        };
        let mut out: Vec<(String, PathBuf)> = chosen
            .into_iter()
            .filter_map(|p| {
                let name = p.file_name()?.to_string_lossy().into_owned();
                Some((format!("checkpoints/{name}"), p))
            })
            .collect();
        let summary = self.run_dir.join("summary.json");
        if summary.is_file() {
            out.push(("summary.json".into(), summary));
        }
        for file in end.logbook {
            if let Some(name) = file.file_name() {
                out.push((format!("logbook/{}", name.to_string_lossy()), file.clone()));
            }
        }
        out
    }
}

/// The sender thread: batch the queued rows into `log-batch` calls until the run ends.
fn deliver(client: &Client, run: &RunInfo, inbox: Receiver<Message>) -> Delivery {
    let mut d = Delivery::default();
    let mut gone = false;
    while let Ok(first) = inbox.recv() {
        let mut rows = Vec::new();
        let mut end = None;
        match first {
            Message::Row(r) => rows.push(r),
            Message::End { status, artifacts } => end = Some((status, artifacts)),
        }
        let until = std::time::Instant::now() + GATHER;
        let mut metrics: usize = rows.iter().map(Vec::len).sum();
        while end.is_none() && metrics < rest::MAX_METRICS {
            let left = until.saturating_duration_since(std::time::Instant::now());
            match inbox.recv_timeout(left) {
                Ok(Message::Row(r)) => {
                    metrics += r.len();
                    rows.push(r);
                }
                Ok(Message::End { status, artifacts }) => end = Some((status, artifacts)),
                Err(_) => break,
            }
        }
        if gone {
            d.rows_lost += rows.len();
        } else if let Err(e) = send_rows(client, &run.run_id, &rows) {
            d.rows_lost += rows.len();
            d.first_failure.get_or_insert_with(|| e.to_string());
            // An unreachable server stays so for this run: later rows are counted, not retried.
            gone = matches!(e, CallError::Unreachable(_));
        }
        if let Some((status, artifacts)) = end {
            if !gone {
                for (name, file) in &artifacts {
                    if let Err(e) = client.upload_artifact(run, name, file) {
                        d.artifact_errors.push(format!("{name}: {e}"));
                    }
                }
                if let Err(e) = client.end_run(&run.run_id, status, now_ms()) {
                    d.first_failure.get_or_insert_with(|| e.to_string());
                }
            }
            break;
        }
    }
    d
}

/// Rows' metrics in calls of at most MLflow's 1000.
fn send_rows(client: &Client, run_id: &str, rows: &[Vec<Value>]) -> Result<(), CallError> {
    let metrics: Vec<Value> = rows.iter().flatten().cloned().collect();
    for chunk in metrics.chunks(rest::MAX_METRICS) {
        client.log_batch(run_id, chunk, &[], &[])?;
    }
    Ok(())
}

impl MetricSink for MlflowSink {
    fn log(&mut self, row: &Row) -> anyhow::Result<()> {
        let Some(queue) = &self.queue else {
            return Ok(());
        };
        let at = now_ms();
        let step = row.step as i64;
        // MLflow's JSON has no NaN or infinity: such values are left out of the row.
        let metrics: Vec<Value> = row
            .values
            .iter()
            .filter(|(_, v)| v.is_finite())
            .map(|(k, v)| (*k, *v))
            .chain([("epoch", row.epoch as f64)])
            .map(|(k, v)| json!({ "key": k, "value": v, "timestamp": at, "step": step }))
            .collect();
        self.rows += 1;
        match queue.try_send(Message::Row(metrics)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.rows_not_queued += 1
            }
        }
        Ok(())
    }

    /// The section is an artifact with `log_model` only.
    fn keeps_run_report(&self) -> bool {
        self.log_model != LogModel::No
    }

    fn finish(&mut self, end: &RunEnd) -> anyhow::Result<()> {
        let artifacts = self.artifacts(end);
        self.close("FINISHED", artifacts);
        Ok(())
    }
}

/// A run that fails (or panics) ends its MLflow run as FAILED.
impl Drop for MlflowSink {
    fn drop(&mut self) {
        self.close("FAILED", Vec::new());
    }
}
