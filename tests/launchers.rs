//! The launchers past one process, for real:
//! - joblib: jobs in parallel processes end exactly as the sequential (basic) launcher's;
//! - resumable sweeps: the launching `train` killed mid-sweep, the same command with the same
//!   `hydra.sweep.dir` keeps the completed jobs, reruns the rest under their numbers, and the interrupted
//!   job continues from its own last checkpoint (basic and joblib launchers; on SLURM, jobs still running
//!   are waited for and those that ended meanwhile kept);
//! - submitit_slurm on a real SLURM cluster (scripts/slurm-test-cluster.sh: munged, slurmctld, two slurmd
//!   on this host): a 4-job array, bad input (unknown key, unknown partition, no sbatch, a failing job),
//!   requeue on `scancel --signal=USR1` ending with the uninterrupted run's weights, an optuna search as
//!   arrays, and (feature torch)
//!   a 2-node DDP job started by srun. Without root or SLURM's packages these say SKIPPED and pass.

mod common;
use common::{real_project, summary, weights, worst_relative_difference, SMALL_CNN, TRAIN};
use rstest::rstest;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `train -m` in `root` with SMALL_CNN, `extra` and the sweep directory `dir`.
fn sweep(root: &Path, dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = sweep_command(root, dir, extra);
    cmd.envs(env.iter().copied());
    cmd.output().unwrap()
}

fn sweep_command(root: &Path, dir: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(TRAIN);
    cmd.arg("-m")
        .args(SMALL_CNN)
        .args(extra)
        .arg(format!("hydra.sweep.dir={}", dir.display()))
        .current_dir(root)
        .env_remove("TRAIN_CONFIG_PATH");
    cmd
}

fn text(out: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn ok(out: Output) -> Output {
    assert!(out.status.success(), "{}", text(&out));
    out
}

fn sweep_record(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("sweep.json")).unwrap()).unwrap()
}

/// Every job's final metrics and weights, by job number.
fn results(dir: &Path, jobs: usize) -> Vec<(serde_json::Value, trainyard::tensor::StateDict)> {
    (0..jobs)
        .map(|n| {
            let run = dir.join(n.to_string());
            let s = summary(&run);
            (s["final_metrics"].clone(), weights(&run))
        })
        .collect()
}

fn assert_same_results(a: &Path, b: &Path, jobs: usize) {
    for (n, ((ma, wa), (mb, wb))) in results(a, jobs)
        .into_iter()
        .zip(results(b, jobs))
        .enumerate()
    {
        assert_eq!(ma, mb, "job #{n}: final metrics differ");
        let diff = worst_relative_difference(&wa, &wb);
        assert!(diff == 0.0, "job #{n}: weights differ by {diff:e}");
    }
}

const TWO_JOBS: &[&str] = &["optimizer.lr=0.001,0.003"];

#[test]
fn joblib_runs_jobs_in_parallel_with_the_sequential_launchers_results() {
    let p = real_project();
    let (seq, par) = (p.path().join("seq"), p.path().join("par"));
    // One thread per job in both: the sums in a convolution's backward pass are split by thread.
    let env = [("RAYON_NUM_THREADS", "1"), ("OMP_NUM_THREADS", "1")];
    ok(sweep(p.path(), &seq, TWO_JOBS, &env));
    let started = Instant::now();
    let out = ok(sweep(
        p.path(),
        &par,
        &[
            TWO_JOBS,
            &["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],
        ]
        .concat(),
        &env,
    ));
    let elapsed = started.elapsed();
    assert!(String::from_utf8_lossy(&out.stdout).contains("0 of 2 jobs failed"));
    assert_same_results(&seq, &par, 2);
    // Each job in its own process, its output beside the sweep's record.
    for n in 0..2 {
        assert!(par.join(format!(".jobs/{n}.json")).is_file());
        assert!(par
            .join(n.to_string())
            .join(".hydra/overrides.yaml")
            .is_file());
    }
    let rec = sweep_record(&par);
    assert_eq!(rec["state"], "completed", "{rec}");
    // In parallel: two processes, each started before the other ended.
    common::assert_ran_at_once(&par.join("0"), &par.join("1"));
    eprintln!("joblib sweep of 2 jobs took {:.1}s", elapsed.as_secs_f64());
}

/// Start a sweep, kill the launching `train` (SIGKILL) once job #1 has written a checkpoint, then run the
/// same command again: job #0 is kept, #1 resumes from its checkpoint, #2 runs; the results equal an
/// uninterrupted sweep's.
#[rstest]
#[case::basic(&[])]
#[case::joblib(&["hydra/launcher=joblib", "hydra.launcher.n_jobs=1"])]
fn a_killed_sweep_resumes_where_it_stopped(#[case] launcher: &[&str]) {
    let p = real_project();
    let (clean, dir) = (p.path().join("clean"), p.path().join("resumed"));
    let env = [("RAYON_NUM_THREADS", "1"), ("OMP_NUM_THREADS", "1")];
    let extra = [
        launcher,
        &["optimizer.lr=0.001,0.002,0.003", "trainer.max_epochs=3"],
    ]
    .concat();
    ok(sweep(p.path(), &clean, &extra, &env));
    let mut child = sweep_command(p.path(), &dir, &extra)
        .envs(env)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let checkpoint = dir.join("1/checkpoints/last.safetensors");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !checkpoint.is_file() {
        assert!(Instant::now() < deadline, "job #1 never wrote a checkpoint");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the sweep ended before it was killed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let first_started = std::fs::read_to_string(dir.join("0/run.json")).unwrap();
    let out = ok(sweep(p.path(), &dir, &extra, &env));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Resuming the sweep") && stderr.contains("1 of 3 jobs completed earlier"),
        "{}",
        text(&out)
    );
    // Job #0 was not run again; job #1 continued from its own checkpoint, under its own number.
    assert_eq!(
        std::fs::read_to_string(dir.join("0/run.json")).unwrap(),
        first_started
    );
    let s1 = summary(&dir.join("1"));
    let from = s1["resumed_from"].as_str().unwrap_or_default();
    assert!(
        from.contains("1/checkpoints/last"),
        "job #1 resumed from '{from}'"
    );
    assert!(!dir.join("3").exists(), "a job was renumbered");
    assert_eq!(sweep_record(&dir)["state"], "completed");
    assert_same_results(&clean, &dir, 3);
}

/// SIGTERM to a sweep's `train` (joblib, two jobs at once) reaches its running jobs: each writes a resume
/// checkpoint and ends preempted, the third job never starts, and the sweep exits with the preemption
/// status. The same command then resumes both from their own checkpoints and runs the third; the results
/// equal an uninterrupted sweep's. (Before, the jobs were killed with the launcher, losing their epoch.)
#[test]
fn a_stop_signal_to_a_sweep_reaches_its_jobs() {
    let p = real_project();
    let (clean, dir) = (p.path().join("clean"), p.path().join("stopped"));
    let env = [("RAYON_NUM_THREADS", "1"), ("OMP_NUM_THREADS", "1")];
    let extra = [
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "optimizer.lr=0.001,0.002,0.003",
        "trainer.max_epochs=3",
    ];
    ok(sweep(p.path(), &clean, &extra, &env));
    let mut child = sweep_command(p.path(), &dir, &extra)
        .envs(env)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !(dir.join("0/run.json").is_file() && dir.join("1/run.json").is_file()) {
        assert!(Instant::now() < deadline, "the jobs never started");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the sweep ended before the signal"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{stderr}");
    assert!(
        stderr.contains("passing it on to the 2 running job(s)"),
        "{stderr}"
    );
    let record = sweep_record(&dir);
    let states: Vec<&str> = record["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["preempted", "preempted", "planned"], "{record}");
    assert!(!dir.join("2").exists(), "job #2 started after the signal");
    let out = ok(sweep(p.path(), &dir, &extra, &env));
    for n in 0..2 {
        let from = summary(&dir.join(n.to_string()))["resumed_from"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            from.contains(&format!("{n}/checkpoints/")),
            "job #{n} resumed from '{from}'\n{}",
            text(&out)
        );
    }
    assert_eq!(sweep_record(&dir)["state"], "completed");
    assert_same_results(&clean, &dir, 3);
}

#[test]
fn a_directory_holding_another_sweep_is_refused() {
    let p = real_project();
    let dir = p.path().join("s");
    ok(sweep(
        p.path(),
        &dir,
        &["trainer.max_epochs=0", "seed=1,2"],
        &[],
    ));
    let out = sweep(p.path(), &dir, &["trainer.max_epochs=0", "seed=1,3"], &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("holds a different sweep") && err.contains("seed=3"),
        "{err}"
    );
}

#[rstest]
#[case::unknown_key(&["hydra/launcher=submitit_slurm", "+hydra.launcher.partiton=gpu"], "Did you mean 'partition'")]
#[case::zero_jobs(&["hydra/launcher=joblib", "hydra.launcher.n_jobs=0"], "hydra.launcher.n_jobs=0")]
#[case::unknown_launcher(&["hydra/launcher=ray"], "Could not find 'hydra/launcher/ray'")]
fn bad_launcher_settings_fail_before_any_job(#[case] extra: &[&str], #[case] expected: &str) {
    let p = real_project();
    let dir = p.path().join("s");
    let out = sweep(p.path(), &dir, &[TWO_JOBS, extra].concat(), &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(expected), "{err}");
    assert!(!dir.join("0").exists());
}

/// A launcher the project configures but this program cannot run (its own `hydra/launcher/ray.yaml`, as
/// hydra-ray-launcher's users have) is refused by name, with the list of those that run, before any job.
#[test]
fn a_configured_launcher_that_does_not_run_here_is_refused_by_name() {
    let p = real_project();
    let group = p.path().join("conf/hydra/launcher");
    std::fs::create_dir_all(&group).unwrap();
    std::fs::write(
        group.join("ray.yaml"),
        "_target_: hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher\n",
    )
    .unwrap();
    let dir = p.path().join("s");
    let out = sweep(
        p.path(),
        &dir,
        &[TWO_JOBS, &["hydra/launcher=ray"]].concat(),
        &[],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot run the ray launcher") && err.contains("joblib ("),
        "{err}"
    );
    assert!(
        !dir.exists(),
        "nothing is written before the launcher is known"
    );
}

#[test]
fn a_missing_sbatch_is_named() {
    let p = real_project();
    let out = sweep(
        p.path(),
        &p.path().join("s"),
        &[TWO_JOBS, &["hydra/launcher=submitit_slurm"]].concat(),
        &[("PATH", "/nonexistent")],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("needs SLURM's `sbatch`, which is not on PATH"),
        "{err}"
    );
}

/// A SLURM cluster on this host for one test, stopped (by pid) when dropped. One at a time: two clusters
/// would share this machine's two cores, and their jobs' timings with them.
struct Cluster {
    dir: tempfile::TempDir,
    conf: PathBuf,
    _one_at_a_time: std::sync::MutexGuard<'static, ()>,
}

static ONE_CLUSTER: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Cluster {
    fn start() -> Option<Cluster> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/slurm-test-cluster.sh");
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            common::skip(
                "slurm",
                "a SLURM test cluster needs root (slurmd runs jobs as their user)",
            );
            return None;
        }
        if Command::new("slurmctld").arg("-V").output().is_err() {
            common::skip(
                "slurm",
                "SLURM is not installed (scripts/slurm-test-cluster.sh install)",
            );
            return None;
        }
        let one_at_a_time = ONE_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new(&script)
            .args(["start", &dir.path().to_string_lossy()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cluster did not start: {}",
            text(&out)
        );
        Some(Cluster {
            conf: dir.path().join("slurm.conf"),
            dir,
            _one_at_a_time: one_at_a_time,
        })
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![("SLURM_CONF", self.conf.display().to_string())]
    }

    fn command(&self, tool: &str, args: &[&str]) -> Output {
        Command::new(tool)
            .args(args)
            .env("SLURM_CONF", &self.conf)
            .output()
            .unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/slurm-test-cluster.sh");
        let _ = Command::new(script)
            .args(["stop", &self.dir.path().to_string_lossy()])
            .output();
    }
}

fn slurm_sweep(c: &Cluster, root: &Path, dir: &Path, extra: &[&str]) -> Output {
    let env = c.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    sweep(
        root,
        dir,
        &[&["hydra/launcher=submitit_slurm"], extra].concat(),
        &[
            &env[..],
            &[("RAYON_NUM_THREADS", "1"), ("OMP_NUM_THREADS", "1")],
        ]
        .concat(),
    )
}

/// One cluster, several scenarios in turn (a cluster takes a second to start; the scenarios share it).
#[test]
fn submitit_slurm_on_a_real_cluster() {
    let Some(c) = Cluster::start() else { return };
    let p = real_project();
    let root = p.path();

    // A 4-job array, throttled to 2 at a time: every job's run directory, the script beside each.
    let dir = root.join("array");
    let out = ok(slurm_sweep(
        &c,
        root,
        &dir,
        &[
            "seed=1,2",
            "optimizer.lr=0.001,0.003",
            "hydra.launcher.array_parallelism=2",
        ],
    ));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Submitted SLURM array job"),
        "{}",
        text(&out)
    );
    for n in 0..4 {
        let run = dir.join(n.to_string());
        assert_eq!(summary(&run)["status"], "completed", "job #{n}");
        let script = std::fs::read_to_string(run.join("slurm.sbatch")).unwrap();
        assert!(script.contains("#SBATCH --array=0-3%2"), "{script}");
        let info: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(run.join("slurm.json")).unwrap())
                .unwrap();
        assert!(
            info["job_id"].as_str().unwrap().ends_with(&format!("_{n}")),
            "{info}"
        );
    }
    assert_eq!(sweep_record(&dir)["state"], "completed");

    // Bad input: a partition the cluster does not have, named with the key.
    let out = slurm_sweep(
        &c,
        root,
        &root.join("bad"),
        &[TWO_JOBS[0], "hydra.launcher.partition=nope"],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("hydra.launcher.partition=nope") && err.contains("nvalid partition"),
        "{err}"
    );

    // A job that fails on the cluster: named with its log file; the other job's result is kept.
    let dir = root.join("failing");
    let out = slurm_sweep(&c, root, &dir, &["data.image_size=32,-1"]);
    assert!(!out.status.success());
    let all = text(&out);
    assert!(
        all.contains("Error in job #1") && all.contains("_log.err"),
        "{all}"
    );
    assert_eq!(summary(&dir.join("0"))["status"], "completed");

    a_killed_controller_resumes_without_submitting_twice(&c, root);
    a_search_runs_its_trials_as_slurm_arrays(&c, root);
    requeue_ends_with_the_uninterrupted_weights(&c, root);
}

/// Kill the launching `train` once its array is submitted, then run the same command again: the jobs SLURM
/// still runs are waited for and those that ended meanwhile keep their results; nothing is submitted twice.
fn a_killed_controller_resumes_without_submitting_twice(c: &Cluster, root: &Path) {
    let dir = root.join("killed");
    let extra = [
        "hydra/launcher=submitit_slurm",
        "seed=1,2,3",
        "hydra.launcher.array_parallelism=1",
    ];
    let mut cmd = sweep_command(root, &dir, &extra);
    cmd.envs(c.env())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let submitted = || {
        std::fs::read_to_string(dir.join("sweep.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .is_some_and(|r| {
                r["jobs"]
                    .as_array()
                    .is_some_and(|j| j.len() == 3 && j.iter().all(|j| j["launch_id"].is_string()))
            })
    };
    while !submitted() {
        assert!(Instant::now() < deadline, "the array was not submitted");
        std::thread::sleep(Duration::from_millis(100));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let out = ok(slurm_sweep(c, root, &dir, &extra[1..]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("Submitted SLURM array job"),
        "nothing is submitted twice: {}",
        text(&out)
    );
    assert!(
        stderr.contains("waiting for it") || stderr.contains("its result is kept"),
        "{}",
        text(&out)
    );
    for n in 0..3 {
        assert_eq!(
            summary(&dir.join(n.to_string()))["status"],
            "completed",
            "job #{n}"
        );
    }
    assert_eq!(sweep_record(&dir)["state"], "completed");
}

/// `hydra/sweeper=optuna` on SLURM: each batch of `n_jobs` trials is an array; every trial reports its
/// validations to the study's journal from its cluster job, and the study ends with all trials told.
fn a_search_runs_its_trials_as_slurm_arrays(c: &Cluster, root: &Path) {
    let dir = root.join("search");
    let out = ok(slurm_sweep(
        c,
        root,
        &dir,
        &[
            "hparams_search=quickstart_optuna",
            "hydra.sweeper.n_trials=4",
            "hydra.sweeper.n_jobs=2",
            "hydra.sweeper.pruner=null",
        ],
    ));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("Submitted SLURM array job").count(),
        2,
        "two batches of two trials: {}",
        text(&out)
    );
    let journal: Vec<serde_json::Value> = std::fs::read_to_string(dir.join("study.journal"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for n in 0..4 {
        let told: Vec<&serde_json::Value> = journal
            .iter()
            .filter(|e| e["op"] == "tell" && e["trial"] == n)
            .collect();
        assert_eq!(told.len(), 1, "trial {n}: {journal:?}");
        assert_eq!(told[0]["state"], "complete");
        let value = told[0]["value"].as_f64();
        assert_eq!(
            summary(&dir.join(n.to_string()))["final_metrics"]["val/acc1_best"].as_f64(),
            value
        );
        assert!(
            journal
                .iter()
                .any(|e| e["op"] == "report" && e["trial"] == n),
            "trial {n} reported from its SLURM job"
        );
    }
    assert!(dir.join("optimization_results.yaml").is_file());
}

/// `scancel --signal=USR1` mid-run: the job checkpoints, requeues itself, resumes, and ends with the
/// weights of a run that was never interrupted.
fn requeue_ends_with_the_uninterrupted_weights(c: &Cluster, root: &Path) {
    let extra = [
        "trainer.max_epochs=3",
        "data.train_size=1024",
        "optimizer.lr=0.002",
    ];
    let clean = root.join("uninterrupted");
    ok(sweep(
        root,
        &clean,
        &extra,
        &[("RAYON_NUM_THREADS", "1"), ("OMP_NUM_THREADS", "1")],
    ));
    let dir = root.join("requeued");
    let env = c.env();
    let launcher = [
        "hydra/launcher=submitit_slurm",
        "hydra.launcher.max_num_timeout=1",
    ];
    let child = sweep_command(root, &dir, &[&launcher[..], &extra[..]].concat())
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .envs([("RAYON_NUM_THREADS", "1"), ("OMP_NUM_THREADS", "1")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Signal once the job has trained a few steps.
    let metrics = dir.join("0/metrics.csv");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let rows = std::fs::read_to_string(&metrics)
            .map(|t| t.lines().count())
            .unwrap_or(0);
        if rows >= 3 {
            break;
        }
        assert!(Instant::now() < deadline, "the job never started training");
        std::thread::sleep(Duration::from_millis(50));
    }
    let record = sweep_record(&dir);
    let id = record["jobs"][0]["launch_id"].as_str().unwrap().to_string();
    let out = c.command("scancel", &["--signal=USR1", &id]);
    assert!(out.status.success(), "{}", text(&out));
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let run = dir.join("0");
    let s = summary(&run);
    assert_eq!(s["status"], "completed");
    let from = s["resumed_from"].as_str().unwrap_or_default();
    assert!(
        from.ends_with("hpc_ckpt.safetensors"),
        "resumed from '{from}'"
    );
    let diff = worst_relative_difference(&weights(&run), &weights(&clean.join("0")));
    assert!(diff == 0.0, "the requeued run's weights differ by {diff:e}");
    let log = std::fs::read_to_string(
        serde_json::from_str::<serde_json::Value>(
            &std::fs::read_to_string(run.join("slurm.json")).unwrap(),
        )
        .unwrap()["stdout"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert!(log.contains("requeued"), "{log}");
}

/// `trainer.num_nodes=2`: one 2-node allocation, srun starts one `train` per node, SLURM's environment
/// forms the process group; one run directory, the same metrics as two local processes. A test of its own
/// (its own cluster), so CI's feature pass runs it without the default scenarios above.
#[cfg(feature = "torch")]
#[test]
fn two_node_ddp_through_srun() {
    let Some(c) = Cluster::start() else { return };
    let p = real_project();
    let root = p.path();
    let c = &c;
    let ddp = ["trainer=ddp", "trainer.devices=1", "backend=candle"];
    let dir = root.join("two-nodes");
    ok(slurm_sweep(
        c,
        root,
        &dir,
        &[&ddp[..], &["trainer.num_nodes=2", "seed=3"]].concat(),
    ));
    let script = std::fs::read_to_string(dir.join("0/slurm.sbatch")).unwrap();
    assert!(
        script.contains("#SBATCH --nodes=2") && script.contains("--ntasks-per-node=1"),
        "{script}"
    );
    let entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .chars()
                .all(|c| c.is_ascii_digit())
        })
        .collect();
    assert_eq!(
        entries.len(),
        1,
        "one run directory for the job, not one per rank"
    );
    let on_slurm = summary(&dir.join("0"));
    assert_eq!(on_slurm["num_nodes"], 2, "{on_slurm}");
    let local = root.join("two-local");
    ok(sweep(
        root,
        &local,
        // joblib: each job in a process of its own, which may start its workers (the basic launcher's
        // in-process jobs may not).
        &[
            "hydra/launcher=joblib",
            "trainer=ddp_sim",
            "backend=candle",
            "seed=3",
        ],
        &[("RAYON_NUM_THREADS", "1"), ("OMP_NUM_THREADS", "1")],
    ));
    let here = summary(&local.join("0"));
    for key in ["val/acc1", "val/loss", "train/loss"] {
        let (a, b) = (
            on_slurm["final_metrics"][key].as_f64().unwrap(),
            here["final_metrics"][key].as_f64().unwrap(),
        );
        assert!(
            (a - b).abs() <= 1e-6 * b.abs().max(1.0),
            "{key}: {a} on SLURM, {b} locally"
        );
    }
}
