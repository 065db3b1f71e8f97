//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod kernels;
pub mod netns;
pub mod s3_server;
pub mod shards;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `train` binary under test.
pub const TRAIN: &str = env!("CARGO_BIN_EXE_train");

/// A loopback port free right now (for a rendezvous a test starts).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Run `train` in `cwd` (a test project), ignoring any project named in the environment.
pub fn train(cwd: &Path, args: &[&str]) -> Output {
    Command::new(TRAIN)
        .args(args)
        .current_dir(cwd)
        .env_remove("TRAIN_CONFIG_PATH")
        .output()
        .unwrap()
}

/// A run's `summary.json`.
pub fn summary(run: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap()
}

/// The output of a command that must have succeeded: its stdout (on failure, both streams are shown).
pub fn succeeded(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// A copy of this repository's own conf/ and experiments/ in a temp dir, so runs write their logs there.
pub fn real_project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for sub in ["conf", "experiments"] {
        copy_dir(&root.join(sub), &dir.path().join(sub));
    }
    dir
}

pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A small, fast quick start: 320 training images, a tiny CNN without dropout or batch norm (so the only
/// difference between strategies is where the gradients are summed).
pub const SMALL_CNN: &[&str] = &[
    "experiment=quickstart",
    "data.train_size=320",
    "data.val_size=64",
    "data.num_workers=1",
    "model.channels=[8,16]",
    "trainer.max_epochs=1",
    "callbacks.model_summary=null",
];

/// Run `train` with SMALL_CNN and `extra` into `root/dir`; panics with the output when it fails.
pub fn run_in(root: &Path, dir: &str, extra: &[&str]) -> PathBuf {
    run_with(root, dir, SMALL_CNN, extra)
}

/// Run `train` with `base` then `extra` into `root/dir`; panics with the output when it fails.
pub fn run_with(root: &Path, dir: &str, base: &[&str], extra: &[&str]) -> PathBuf {
    let run_dir = format!("hydra.run.dir={dir}");
    let mut args: Vec<&str> = base.to_vec();
    args.extend_from_slice(extra);
    args.push(&run_dir);
    let out = train(root, &args);
    assert!(
        out.status.success(),
        "train {}\nstdout:\n{}\nstderr:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    root.join(dir)
}

/// The weights and buffers (no optimizer state) of a run's last checkpoint.
pub fn weights(run: &Path) -> trainyard::tensor::StateDict {
    trainyard::storage::checkpoint::load(&run.join("checkpoints/last.safetensors"))
        .unwrap()
        .state
        .into_iter()
        .filter(|(k, _)| !k.starts_with("optimizer."))
        .collect()
}

/// ‖a − b‖ / ‖b‖ over every tensor, worst case. Fails (naming the tensor) on a missing or extra tensor, a
/// shape or length mismatch, or a NaN/infinite value on either side: a broken run cannot pass as close.
pub fn worst_relative_difference(
    a: &trainyard::tensor::StateDict,
    b: &trainyard::tensor::StateDict,
) -> f64 {
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "the two state dicts hold different tensors"
    );
    let mut worst = (0.0f64, "");
    for (k, x) in a {
        let y = &b[k];
        assert_eq!(x.shape, y.shape, "{k}: shapes differ");
        assert_eq!(x.data.len(), y.data.len(), "{k}: lengths differ");
        if let Some(i) = x.data.iter().chain(&y.data).position(|v| !v.is_finite()) {
            panic!("{k}: a non-finite value (element {i} of the two tensors, first then second)");
        }
        let diff: f64 = x
            .data
            .iter()
            .zip(&y.data)
            .map(|(p, q)| f64::from(p - q).powi(2))
            .sum::<f64>()
            .sqrt();
        let norm: f64 = y
            .data
            .iter()
            .map(|q| f64::from(*q).powi(2))
            .sum::<f64>()
            .sqrt();
        let relative = diff / norm.max(1e-12);
        if relative > worst.0 {
            worst = (relative, k);
        }
    }
    if worst.0 > 0.0 {
        eprintln!("worst relative difference {:.3e} in {}", worst.0, worst.1);
    }
    worst.0
}

/// The run trained: its weights moved from where the same config starts (`args` run again with a tiny
/// learning rate, which needs `optimizer=sgd scheduler=constant` in `args`) by more than `at_least`
/// (relative, worst tensor), so a no-op optimizer cannot pass for training. (The rate must be positive:
/// 1e-30 moves nothing a float32 can show.)
pub fn assert_trained(root: &Path, trained: &Path, args: &[&str], at_least: f64) {
    let mut start = args.to_vec();
    start.push("optimizer.lr=1e-30");
    let initial = run_in(root, "initial-weights", &start);
    let moved = worst_relative_difference(&weights(trained), &weights(&initial));
    assert!(
        moved > at_least,
        "the weights moved only {moved:e} from their initial values (at least {at_least:e} expected)"
    );
}

/// A run's `metrics.csv` rows as (column, value) pairs, empty cells left out.
pub fn csv_rows(run_dir: &Path) -> Vec<Vec<(String, f64)>> {
    let text = std::fs::read_to_string(run_dir.join("metrics.csv")).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    lines
        .map(|l| {
            header
                .iter()
                .zip(l.split(','))
                .filter(|(_, v)| !v.is_empty())
                .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
                .collect()
        })
        .collect()
}

/// The optimizer steps of a run's `metrics.csv` rows, in order (an epoch's row repeats its last step).
#[allow(dead_code)]
pub fn logged_steps(run_dir: &Path) -> Vec<u64> {
    csv_rows(run_dir)
        .iter()
        .filter_map(|row| {
            row.iter()
                .find(|(k, _)| k == "step")
                .map(|(_, v)| *v as u64)
        })
        .collect()
}

/// The first optimizer step a run logged in `metrics.csv`: a resumed run's is past its checkpoint's step
/// (a restart from scratch logs the early steps again).
#[allow(dead_code)]
pub fn first_logged_step(run_dir: &Path) -> u64 {
    logged_steps(run_dir)
        .first()
        .copied()
        .unwrap_or_else(|| panic!("{}: no step logged", run_dir.display()))
}

/// Two runs ran at once: two processes (their `run.json` pids differ), each started before the other ended.
#[allow(dead_code)]
pub fn assert_ran_at_once(a: &Path, b: &Path) {
    let record = |dir: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).unwrap()).unwrap()
    };
    let (a, b) = (record(a), record(b));
    assert_ne!(a["pid"], b["pid"], "one process each: {a} {b}");
    let time = |v: &serde_json::Value, k: &str| {
        chrono::DateTime::parse_from_rfc3339(v[k].as_str().unwrap_or_default())
            .unwrap_or_else(|e| panic!("{k} of {v}: {e}"))
    };
    assert!(
        time(&a, "started_at") < time(&b, "ended_at")
            && time(&b, "started_at") < time(&a, "ended_at"),
        "they ran one after the other: {a} {b}"
    );
}

/// f32 tensors (name, shape, values) as a safetensors file.
pub fn write_safetensors(path: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)]) {
    let bytes: Vec<(String, Vec<u8>, Vec<usize>)> = tensors
        .iter()
        .map(|(k, s, d)| {
            (
                k.clone(),
                d.iter().flat_map(|v| v.to_le_bytes()).collect(),
                s.clone(),
            )
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = bytes
        .iter()
        .map(|(k, b, s)| {
            let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b);
            (k.clone(), view.unwrap())
        })
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

/// A test's prerequisite (`what`: slurm, netns, mlflow, wandb) is missing: it says SKIPPED and passes,
/// unless `TRAINYARD_REQUIRE` (a comma list; CI sets it) names it, where it fails instead, so a CI run
/// cannot go green with the test not run.
pub fn skip(what: &str, why: &str) {
    let required = std::env::var("TRAINYARD_REQUIRE").unwrap_or_default();
    if required.split(',').any(|r| r.trim() == what) {
        panic!("{what} is required here (TRAINYARD_REQUIRE={required}), but {why}");
    }
    eprintln!("SKIPPED: {why}");
}

/// A python with torch and safetensors (TRAINYARD_TORCH_PYTHON), or `None` with SKIPPED said; under CI
/// it must be set.
pub fn torch_python() -> Option<String> {
    match std::env::var("TRAINYARD_TORCH_PYTHON") {
        Ok(p) => Some(p),
        Err(_) if std::env::var_os("CI").is_some() => {
            panic!("CI must set TRAINYARD_TORCH_PYTHON (a python with torch and safetensors)")
        }
        Err(_) => {
            eprintln!("SKIPPED: set TRAINYARD_TORCH_PYTHON to a python with torch and safetensors");
            None
        }
    }
}

/// The processes `pid` started (Linux's `/proc/<pid>/task/<pid>/children`).
pub fn child_pids(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// The largest `step` in a run's `metrics.csv` so far (0 before any row).
pub fn logged_step(run: &Path) -> u64 {
    std::fs::read_to_string(run.join("metrics.csv"))
        .ok()
        .and_then(|text| {
            let mut lines = text.lines();
            let column = lines.next()?.split(',').position(|c| c == "step")?;
            lines
                .filter_map(|l| l.split(',').nth(column)?.parse::<f64>().ok())
                .map(|v| v as u64)
                .max()
        })
        .unwrap_or(0)
}

/// The child processes of `pid` with their `RANK` (a launcher's workers): (pid, RANK).
pub fn workers_of(pid: u32) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // Field 4 (after the parenthesised command) is the parent pid.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let ppid: u32 = after.split(' ').nth(1).unwrap().parse().unwrap();
        if ppid == pid {
            let environ = std::fs::read(format!("/proc/{child}/environ")).unwrap_or_default();
            let rank = String::from_utf8_lossy(&environ)
                .split('\0')
                .find_map(|kv| kv.strip_prefix("RANK=").map(str::to_string))
                .unwrap_or_default();
            out.push((child, rank));
        }
    }
    out
}

/// A run directory's `run.json`, parsed.
pub fn run_json(run: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(run.join("run.json")).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("run.json: {e}: {text}"))
}

/// A run that was interrupted and resumed ended as the uninterrupted `clean` one did: each step logged
/// once in metrics.csv, and the last checkpoint's weights and optimizer state equal within 1e-6.
pub fn assert_same_end(run: &Path, clean: &Path) {
    assert_eq!(
        logged_steps(run),
        logged_steps(clean),
        "metrics.csv repeats or loses steps"
    );
    let full = |dir: &Path| {
        trainyard::storage::checkpoint::load(&dir.join("checkpoints/last.safetensors"))
            .unwrap()
            .state
    };
    let diff = worst_relative_difference(&full(run), &full(clean));
    assert!(
        diff <= 1e-6,
        "weights and optimizer state differ by {diff:e}"
    );
}
