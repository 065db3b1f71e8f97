//! hydra-submitit-launcher's `submitit_slurm`, on SLURM's own client tools (no Python): a sweep becomes one
//! `sbatch --array` per job shape (throttled by `array_parallelism`), each array task runs
//! `srun train --sweep-job N` on its allocation (`nodes` × `tasks_per_node`, at least the job's
//! `trainer.num_nodes` × its devices for DDP/FSDP, so trainyard's SLURM detection forms the process group),
//! and the launching `train` waits with `squeue`, reading each job's result as it ends. The generated
//! script is kept in the submitit folder and beside each job (`slurm.sbatch`, with `slurm.json`: ids and
//! log files).

use super::local::folder_of;
use super::{JobCommand, SweepJob};
use crate::config::errors::ConfigError;
use crate::config::tree::{Node, Value};
use crate::job::in_sweep::JobResult;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// `hydra.launcher` of `submitit_slurm`, resolved (hydra-submitit-launcher 1.2's `SlurmQueueConf`).
#[derive(Debug, Clone, Default)]
pub struct SlurmConf {
    pub submitit_folder: String,
    pub timeout_min: i64,
    pub cpus_per_task: Option<i64>,
    pub gpus_per_node: Option<i64>,
    pub tasks_per_node: i64,
    pub mem_gb: Option<i64>,
    pub nodes: i64,
    pub name: String,
    pub stderr_to_stdout: bool,
    pub partition: Option<String>,
    pub qos: Option<String>,
    pub comment: Option<String>,
    pub constraint: Option<String>,
    pub exclude: Option<String>,
    pub gres: Option<String>,
    pub cpus_per_gpu: Option<i64>,
    pub gpus_per_task: Option<i64>,
    pub mem_per_gpu: Option<String>,
    pub mem_per_cpu: Option<String>,
    pub account: Option<String>,
    pub signal_delay_s: i64,
    pub max_num_timeout: i64,
    pub additional_parameters: BTreeMap<String, String>,
    pub array_parallelism: i64,
    pub setup: Vec<String>,
    pub srun_args: Vec<String>,
}

impl SlurmConf {
    /// Read the resolved `hydra.launcher` node (already checked against the plugin's schema).
    pub fn read(node: &Node) -> Result<SlurmConf, ConfigError> {
        let get = |k: &str| node.get(k).map(|n| &n.value);
        let int = |k: &str, default: i64| match get(k) {
            Some(Value::Int(i)) => *i,
            _ => default,
        };
        let opt_int = |k: &str| match get(k) {
            Some(Value::Int(i)) => Some(*i),
            _ => None,
        };
        let opt_str = |k: &str| match get(k) {
            Some(Value::Null) | None => None,
            Some(v) => Some(v.display_python()),
        };
        let list = |k: &str| match get(k) {
            Some(Value::List(items)) => items.iter().map(|n| n.value.display_python()).collect(),
            _ => Vec::new(),
        };
        let conf = SlurmConf {
            submitit_folder: opt_str("submitit_folder").unwrap_or_default(),
            timeout_min: int("timeout_min", 60),
            cpus_per_task: opt_int("cpus_per_task"),
            gpus_per_node: opt_int("gpus_per_node"),
            tasks_per_node: int("tasks_per_node", 1),
            mem_gb: opt_int("mem_gb"),
            nodes: int("nodes", 1),
            name: opt_str("name").unwrap_or_else(|| "train".into()),
            stderr_to_stdout: matches!(get("stderr_to_stdout"), Some(Value::Bool(true))),
            partition: opt_str("partition"),
            qos: opt_str("qos"),
            comment: opt_str("comment"),
            constraint: opt_str("constraint"),
            exclude: opt_str("exclude"),
            gres: opt_str("gres"),
            cpus_per_gpu: opt_int("cpus_per_gpu"),
            gpus_per_task: opt_int("gpus_per_task"),
            mem_per_gpu: opt_str("mem_per_gpu"),
            mem_per_cpu: opt_str("mem_per_cpu"),
            account: opt_str("account"),
            signal_delay_s: int("signal_delay_s", 120),
            max_num_timeout: int("max_num_timeout", 0),
            additional_parameters: match get("additional_parameters") {
                Some(Value::Map(m)) => m
                    .iter()
                    .map(|(k, v)| (k.clone(), v.value.display_python()))
                    .collect(),
                _ => BTreeMap::new(),
            },
            array_parallelism: int("array_parallelism", 256),
            setup: list("setup"),
            srun_args: list("srun_args"),
        };
        for (key, value) in [
            ("timeout_min", conf.timeout_min),
            ("tasks_per_node", conf.tasks_per_node),
            ("nodes", conf.nodes),
            ("array_parallelism", conf.array_parallelism),
        ] {
            if value < 1 {
                return Err(ConfigError::composition(format!(
                    "hydra.launcher.{key}={value}: must be at least 1{}",
                    crate::config::errors::at(
                        &node.get(key).map(|n| n.source.clone()).unwrap_or_default()
                    )
                )));
            }
        }
        Ok(conf)
    }

    /// The folder the scripts and SLURM's log files go to.
    pub fn folder(&self) -> PathBuf {
        folder_of(&self.submitit_folder).to_path_buf()
    }
}

/// Jobs that need the same allocation: one array job.
#[derive(Debug, Clone)]
pub struct ArrayGroup {
    pub nodes: usize,
    pub tasks_per_node: usize,
    pub jobs: Vec<SweepJob>,
}

/// Quote a word for bash.
fn sh(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
    {
        return word.to_string();
    }
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The sbatch script of one array job (`script` is where it is written, recorded in its environment).
pub fn sbatch_script(
    conf: &SlurmConf,
    group: &ArrayGroup,
    cmd: &JobCommand,
    script: &Path,
) -> String {
    let folder = conf.folder();
    let log = |stream: &str| folder.join(format!("%A_%a_log.{stream}"));
    let mut s = String::from("#!/bin/bash\n");
    s.push_str(&format!(
        "# Written by trainyard for the sweep in {} (hydra/launcher=submitit_slurm): jobs {}.\n\
         # Array task i runs the i-th job listed below; submit with `sbatch --parsable {}`.\n",
        cmd.sweep_dir.display(),
        group
            .jobs
            .iter()
            .map(|j| format!("#{}", j.num))
            .collect::<Vec<_>>()
            .join(", "),
        script.display()
    ));
    let mut opt = |k: &str, v: String| s.push_str(&format!("#SBATCH --{k}={v}\n"));
    opt("job-name", sh(&conf.name));
    opt(
        "array",
        format!(
            "0-{}%{}",
            group.jobs.len().saturating_sub(1),
            conf.array_parallelism
        ),
    );
    opt("output", sh(&log("out").to_string_lossy()));
    opt(
        "error",
        sh(&log(if conf.stderr_to_stdout { "out" } else { "err" }).to_string_lossy()),
    );
    opt("time", conf.timeout_min.to_string());
    opt("nodes", group.nodes.to_string());
    opt("ntasks-per-node", group.tasks_per_node.to_string());
    opt("signal", format!("USR1@{}", conf.signal_delay_s));
    opt("open-mode", "append".into());
    let ints = [
        ("cpus-per-task", conf.cpus_per_task),
        ("gpus-per-node", conf.gpus_per_node),
        ("cpus-per-gpu", conf.cpus_per_gpu),
        ("gpus-per-task", conf.gpus_per_task),
    ];
    for (k, v) in ints {
        if let Some(v) = v {
            opt(k, v.to_string());
        }
    }
    if let Some(gb) = conf.mem_gb {
        opt("mem", format!("{gb}GB"));
    }
    let strs = [
        ("partition", &conf.partition),
        ("qos", &conf.qos),
        ("comment", &conf.comment),
        ("constraint", &conf.constraint),
        ("exclude", &conf.exclude),
        ("gres", &conf.gres),
        ("mem-per-gpu", &conf.mem_per_gpu),
        ("mem-per-cpu", &conf.mem_per_cpu),
        ("account", &conf.account),
    ];
    for (k, v) in strs {
        if let Some(v) = v {
            opt(k, sh(v));
        }
    }
    for (k, v) in &conf.additional_parameters {
        opt(&k.replace('_', "-"), sh(v));
    }
    s.push_str(if conf.max_num_timeout > 0 {
        "#SBATCH --requeue\n"
    } else {
        "#SBATCH --no-requeue\n"
    });
    s.push('\n');
    for line in &conf.setup {
        s.push_str(line);
        s.push('\n');
    }
    s.push_str(&format!(
        "export {}={}\nexport {}={}\ncd {}\n",
        crate::comm::NOW_ENV,
        sh(&cmd.now),
        crate::job::requeue::MAX_REQUEUES_ENV,
        conf.max_num_timeout,
        sh(&cmd.cwd.to_string_lossy())
    ));
    s.push_str("case \"$SLURM_ARRAY_TASK_ID\" in\n");
    for (i, job) in group.jobs.iter().enumerate() {
        let words: Vec<String> = cmd
            .args(job)
            .iter()
            .map(|a| sh(&a.to_string_lossy()))
            .collect();
        s.push_str(&format!("  {i}) JOB=({}) ;;\n", words.join(" ")));
    }
    s.push_str("  *) echo \"no job for array task $SLURM_ARRAY_TASK_ID\" >&2; exit 2 ;;\nesac\n");
    let srun_args: Vec<String> = conf.srun_args.iter().map(|a| sh(a)).collect();
    s.push_str(&format!(
        "exec srun --unbuffered {}{} \"${{JOB[@]}}\"\n",
        srun_args
            .iter()
            .map(|a| format!("{a} "))
            .collect::<String>(),
        sh(&cmd.exe.to_string_lossy())
    ));
    s
}

/// Run a SLURM client tool; a missing tool is an error saying what it is needed for.
fn slurm_tool(tool: &str, args: &[&str]) -> Result<std::process::Output, ConfigError> {
    Command::new(tool).args(args).output().map_err(|e| {
        ConfigError::Run(match e.kind() {
            std::io::ErrorKind::NotFound => format!(
                "hydra/launcher=submitit_slurm needs SLURM's `{tool}`, which is not on PATH: run the sweep \
                 on a SLURM login node, or use hydra/launcher=joblib to run it on this machine"
            ),
            _ => format!("could not run `{tool}`: {e}"),
        })
    })
}

/// Submit one array job; its id.
pub fn submit(conf: &SlurmConf, script: &Path) -> Result<String, ConfigError> {
    let out = slurm_tool("sbatch", &["--parsable", &script.to_string_lossy()])?;
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if !out.status.success() {
        let lower = stderr.to_lowercase();
        let key = [
            ("partition", conf.partition.as_deref()),
            ("qos", conf.qos.as_deref()),
            ("account", conf.account.as_deref()),
            ("constraint", conf.constraint.as_deref()),
            ("exclude", conf.exclude.as_deref()),
        ]
        .into_iter()
        .find(|(k, _)| lower.contains(k) || (*k == "exclude" && lower.contains("node")));
        let blame = match key {
            Some((k, Some(v))) => format!("hydra.launcher.{k}={v}: "),
            Some(("partition", None)) => {
                "hydra.launcher.partition (not set: the cluster's default partition): ".into()
            }
            _ => String::new(),
        };
        return Err(ConfigError::Run(format!(
            "{blame}SLURM refused the sweep's array job:\n    {}\n    (script: {})",
            stderr.replace('\n', "\n    "),
            script.display()
        )));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let id = text.trim().split(';').next().unwrap_or("").to_string();
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit()) {
        return Err(ConfigError::Run(format!(
            "sbatch printed no job id (stdout '{}', stderr '{stderr}')",
            text.trim()
        )));
    }
    Ok(id)
}

/// SLURM's states in which a job may still run (or run again).
fn still_queued(state: &str) -> bool {
    matches!(
        state,
        "PENDING"
            | "RUNNING"
            | "CONFIGURING"
            | "COMPLETING"
            | "REQUEUED"
            | "REQUEUE_FED"
            | "REQUEUE_HOLD"
            | "RESIZING"
            | "SUSPENDED"
            | "SIGNALING"
            | "STAGE_OUT"
            | "RESV_DEL_HOLD"
    )
}

/// The state of each listed job (`123_4` ids) that `squeue` still knows.
fn queue_states(ids: &[&str]) -> Result<BTreeMap<String, String>, ConfigError> {
    let joined = ids.join(",");
    let out = slurm_tool(
        "squeue",
        &["-h", "-r", "--states=all", "-o", "%i|%T", "-j", &joined],
    )?;
    // An id SLURM has forgotten makes squeue fail: every job is then looked at one by one.
    if !out.status.success() && ids.len() > 1 {
        let mut all = BTreeMap::new();
        for id in ids {
            all.extend(queue_states(&[id])?);
        }
        return Ok(all);
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('|'))
        .map(|(id, state)| (id.trim().to_string(), state.trim().to_string()))
        .collect())
}

/// A job submitted (or found still queued from an earlier attempt) and not ended yet.
pub struct Submitted {
    pub job: SweepJob,
    pub id: String,
    /// The array script it was submitted with; unknown for a job an earlier attempt submitted.
    pub script: Option<PathBuf>,
}

impl Submitted {
    fn log(&self, folder: &Path, stream: &str) -> PathBuf {
        folder.join(format!("{}_log.{stream}", self.id))
    }
}

/// Is an earlier attempt's SLURM job still queued or running (a resumed sweep waits for it)?
pub fn still_alive(id: &str) -> Result<bool, ConfigError> {
    Ok(queue_states(&[id])?
        .get(id)
        .is_some_and(|s| still_queued(s)))
}

/// Wait for the submitted jobs, handing each result to `done` as it ends; `done` returning false stops
/// the sweep (`--fail-fast`): the others are cancelled.
pub fn wait(
    conf: &SlurmConf,
    sweep_dir: &Path,
    mut pending: Vec<Submitted>,
    done: &mut dyn FnMut(JobResult, &Submitted) -> Result<bool, ConfigError>,
) -> Result<(), ConfigError> {
    let mut gone_since: BTreeMap<String, Instant> = BTreeMap::new();
    while !pending.is_empty() {
        std::thread::sleep(Duration::from_millis(250));
        let ids: Vec<&str> = pending.iter().map(|p| p.id.as_str()).collect();
        let states = queue_states(&ids)?;
        let mut i = 0;
        while i < pending.len() {
            let p = &pending[i];
            let state = states.get(&p.id).map(String::as_str);
            let result = JobResult::read(sweep_dir, p.job.num);
            let ended = match (&result, state) {
                (Some(_), Some(s)) => !still_queued(s) || s == "COMPLETING",
                (Some(_), None) => true,
                (None, Some(s)) => !still_queued(s),
                (None, None) => true,
            };
            if !ended {
                i += 1;
                continue;
            }
            // The result is written before the job's process exits; give the file system a moment.
            let first_seen = *gone_since.entry(p.id.clone()).or_insert_with(Instant::now);
            if result.is_none() && first_seen.elapsed() < Duration::from_secs(2) {
                i += 1;
                continue;
            }
            let p = pending.swap_remove(i);
            let result = result.unwrap_or_else(|| {
                JobResult::failed(
                    p.job.num,
                    format!(
                        "SLURM job {} ended{} without a result; its log: {}",
                        p.id,
                        state.map(|s| format!(" in state {s}")).unwrap_or_default(),
                        log_file(conf, &p).display()
                    ),
                )
            });
            if !done(result, &p)? {
                for other in &pending {
                    let _ = slurm_tool("scancel", &[&other.id]);
                }
                return Ok(());
            }
        }
    }
    Ok(())
}

/// The file SLURM writes a job's errors to.
pub fn log_file(conf: &SlurmConf, job: &Submitted) -> PathBuf {
    job.log(
        &conf.folder(),
        if conf.stderr_to_stdout { "out" } else { "err" },
    )
}

/// Keep the generated script and the SLURM ids and log files beside the job's run directory.
pub fn record_beside_job(conf: &SlurmConf, submitted: &Submitted, output_dir: &Path) {
    let folder = conf.folder();
    if let Some(script) = &submitted.script {
        let _ = std::fs::copy(script, output_dir.join("slurm.sbatch"));
    }
    let info = serde_json::json!({
        "job_id": submitted.id,
        "script": submitted.script,
        "stdout": submitted.log(&folder, "out"),
        "stderr": log_file(conf, submitted),
    });
    let _ = crate::storage::records::write_atomic(
        &output_dir.join("slurm.json"),
        serde_json::to_string_pretty(&info)
            .unwrap_or_default()
            .as_bytes(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_carries_the_plugins_keys_and_one_line_per_job() {
        let conf = SlurmConf {
            submitit_folder: "/s/.submitit/%j".into(),
            timeout_min: 30,
            tasks_per_node: 1,
            nodes: 1,
            name: "train".into(),
            partition: Some("gpu".into()),
            signal_delay_s: 90,
            max_num_timeout: 2,
            array_parallelism: 3,
            setup: vec!["module load cuda".into()],
            additional_parameters: [("mail_type".to_string(), "END".to_string())].into(),
            ..SlurmConf::default()
        };
        let cmd = JobCommand {
            exe: "/bin/train".into(),
            config_flags: vec![],
            hydra_overrides: vec!["hydra.sweep.dir=/s".into()],
            sweep_dir: "/s".into(),
            now: "2026-11-25T10:00:00+00:00".into(),
            cwd: "/p".into(),
        };
        let job = |num: usize, o: &str| SweepJob {
            num,
            overrides: vec![o.into()],
            previous_launch_id: None,
        };
        let group = ArrayGroup {
            nodes: 2,
            tasks_per_node: 2,
            jobs: vec![job(4, "lr=0.1"), job(7, "tag='a b'")],
        };
        let text = sbatch_script(&conf, &group, &cmd, Path::new("/s/.submitit/a.sbatch"));
        for want in [
            "#SBATCH --array=0-1%3",
            "#SBATCH --time=30",
            "#SBATCH --nodes=2",
            "#SBATCH --ntasks-per-node=2",
            "#SBATCH --signal=USR1@90",
            "#SBATCH --partition=gpu",
            "#SBATCH --mail-type=END",
            "#SBATCH --requeue",
            "#SBATCH --output=/s/.submitit/%A_%a_log.out",
            "module load cuda",
            "export TRAINYARD_MAX_REQUEUES=2",
            "  0) JOB=(--sweep-job 4 --sweep-dir /s -- hydra.sweep.dir=/s lr=0.1) ;;",
            "  1) JOB=(--sweep-job 7 --sweep-dir /s -- hydra.sweep.dir=/s 'tag='\\''a b'\\''') ;;",
            "exec srun --unbuffered /bin/train \"${JOB[@]}\"",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }
}
