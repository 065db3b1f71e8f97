//! MLflow's tracking REST API (`/api/2.0/mlflow/...`), the calls a training run needs: find or create
//! the experiment, create and end the run, log batches of metrics, params and tags, and upload artifacts
//! through the tracking server's artifact proxy (`mlflow server` serves `mlflow-artifacts:` by default).
//! Transient failures (no connection, 429, 5xx) are retried with exponential back-off.

use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

/// MLflow's limits for one `runs/log-batch` call.
pub const MAX_METRICS: usize = 1000;
pub const MAX_PARAMS: usize = 100;
pub const MAX_TAGS: usize = 100;

pub struct Client {
    agent: ureq::Agent,
    base: String,
    /// Waits between attempts of one call (the call is tried once more than this has entries).
    backoff: Vec<Duration>,
}

#[derive(Debug)]
pub enum CallError {
    /// The server answered with this status and body (not worth retrying).
    Status(u16, String),
    /// Nobody answered (connection refused, timed out), after every retry.
    Unreachable(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Status(code, body) => write!(f, "HTTP {code}: {body}"),
            CallError::Unreachable(why) => write!(f, "no answer: {why}"),
        }
    }
}

impl std::error::Error for CallError {}

pub struct RunInfo {
    pub run_id: String,
    pub experiment_id: String,
    pub artifact_uri: String,
}

impl Client {
    pub fn new(tracking_uri: &str, backoff: Vec<Duration>) -> Client {
        let config = ureq::Agent::config_builder()
            .timeout_connect(Some(Duration::from_secs(5)))
            .timeout_global(Some(Duration::from_secs(60)))
            .http_status_as_error(false)
            .build();
        Client {
            agent: config.into(),
            base: tracking_uri.trim_end_matches('/').to_string(),
            backoff,
        }
    }

    /// One call, retried while the server is unreachable or busy.
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, CallError> {
        let url = format!("{}{path}", self.base);
        let mut attempt = 0;
        loop {
            let sent = match (method, body) {
                ("GET", _) => self.agent.get(&url).call(),
                (_, Some(b)) => self
                    .agent
                    .post(&url)
                    .header("Content-Type", "application/json")
                    .send(b.to_string()),
                (_, None) => self.agent.post(&url).send_empty(),
            };
            let retry = match sent {
                Ok(mut r) => {
                    let code = r.status().as_u16();
                    let text = r.body_mut().read_to_string().unwrap_or_default();
                    if code < 300 {
                        return Ok(serde_json::from_str(&text).unwrap_or(Value::Null));
                    }
                    if code != 429 && code < 500 {
                        return Err(CallError::Status(code, text));
                    }
                    format!("HTTP {code}")
                }
                Err(e) => e.to_string(),
            };
            match self.backoff.get(attempt) {
                Some(wait) => std::thread::sleep(*wait),
                None => return Err(CallError::Unreachable(format!("{method} {url}: {retry}"))),
            }
            attempt += 1;
        }
    }

    /// The experiment's id, created when there is none of that name.
    pub fn experiment(&self, name: &str) -> Result<String, CallError> {
        let path = format!(
            "/api/2.0/mlflow/experiments/get-by-name?experiment_name={}",
            encode(name)
        );
        match self.call("GET", &path, None) {
            Ok(v) => Ok(text(&v["experiment"]["experiment_id"])),
            Err(CallError::Status(404, _)) => {
                let v = self.call(
                    "POST",
                    "/api/2.0/mlflow/experiments/create",
                    Some(&json!({ "name": name })),
                )?;
                Ok(text(&v["experiment_id"]))
            }
            Err(e) => Err(e),
        }
    }

    pub fn create_run(
        &self,
        experiment_id: &str,
        run_name: &str,
        start_ms: i64,
        tags: &[(String, String)],
    ) -> Result<RunInfo, CallError> {
        let tags: Vec<Value> = tags
            .iter()
            .map(|(k, v)| json!({ "key": k, "value": v }))
            .collect();
        let v = self.call(
            "POST",
            "/api/2.0/mlflow/runs/create",
            Some(&json!({
                "experiment_id": experiment_id,
                "run_name": run_name,
                "start_time": start_ms,
                "tags": tags,
            })),
        )?;
        let info = &v["run"]["info"];
        Ok(RunInfo {
            run_id: text(&info["run_id"]),
            experiment_id: experiment_id.to_string(),
            artifact_uri: text(&info["artifact_uri"]),
        })
    }

    /// One `log-batch` (the caller keeps within MLflow's limits).
    pub fn log_batch(
        &self,
        run_id: &str,
        metrics: &[Value],
        params: &[(String, String)],
        tags: &[(String, String)],
    ) -> Result<(), CallError> {
        let pairs = |items: &[(String, String)]| -> Vec<Value> {
            items
                .iter()
                .map(|(k, v)| json!({ "key": k, "value": v }))
                .collect()
        };
        self.call(
            "POST",
            "/api/2.0/mlflow/runs/log-batch",
            Some(&json!({
                "run_id": run_id,
                "metrics": metrics,
                "params": pairs(params),
                "tags": pairs(tags),
            })),
        )
        .map(|_| ())
    }

    pub fn end_run(&self, run_id: &str, status: &str, end_ms: i64) -> Result<(), CallError> {
        self.call(
            "POST",
            "/api/2.0/mlflow/runs/update",
            Some(&json!({ "run_id": run_id, "status": status, "end_time": end_ms })),
        )
        .map(|_| ())
    }

    /// Upload `file` as the run's artifact `name` (a path under the run's artifact root), through the
    /// server's artifact proxy. Only `mlflow-artifacts:` roots (the server's default) are written here.
    pub fn upload_artifact(&self, run: &RunInfo, name: &str, file: &Path) -> Result<(), CallError> {
        let Some(root) = run.artifact_uri.strip_prefix("mlflow-artifacts:") else {
            return Err(CallError::Status(
                0,
                format!(
                    "the run's artifact root is {}: trainyard uploads through the tracking server's \
                     artifact proxy (mlflow-artifacts:), start the server with --serve-artifacts",
                    run.artifact_uri
                ),
            ));
        };
        let root = root.trim_start_matches('/');
        let url = format!(
            "{}/api/2.0/mlflow-artifacts/artifacts/{root}/{}",
            self.base,
            name.split('/').map(encode).collect::<Vec<_>>().join("/")
        );
        let bytes = std::fs::read(file)
            .map_err(|e| CallError::Status(0, format!("cannot read {}: {e}", file.display())))?;
        let mut attempt = 0;
        loop {
            let why = match self.agent.put(&url).send(&bytes[..]) {
                Ok(r) if r.status().as_u16() < 300 => return Ok(()),
                Ok(r) if r.status().as_u16() != 429 && r.status().as_u16() < 500 => {
                    return Err(CallError::Status(r.status().as_u16(), format!("PUT {url}")))
                }
                Ok(r) => format!("HTTP {}", r.status()),
                Err(e) => e.to_string(),
            };
            match self.backoff.get(attempt) {
                Some(wait) => std::thread::sleep(*wait),
                None => return Err(CallError::Unreachable(format!("PUT {url}: {why}"))),
            }
            attempt += 1;
        }
    }
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

/// Percent-encode a URL path segment or query value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
