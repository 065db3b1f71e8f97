//! Sweep jobs in processes of their own on this machine: Hydra's joblib launcher (`n_jobs` at once) and
//! submitit's local launcher (every job at once, `timeout_min`). Each job is `train --sweep-job N` with its
//! share of the machine: `CUDA_VISIBLE_DEVICES` for its slot's GPUs, or, on a CPU machine, its share of
//! the cores as thread-pool sizes (a value the user set is kept). Killing the launching `train` kills
//! the jobs (they die with it), and the sweep can then be resumed.

use super::{JobCommand, LaunchContext, Launcher, Progress, SweepJob};
use crate::config::errors::ConfigError;
use crate::config::tree::{Node, Value};
use crate::job::in_sweep::JobResult;
use crate::platform::signals;
use crate::storage::records::JobState;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The local launchers' settings.
#[derive(Debug, Clone)]
pub struct LocalLauncher {
    /// Jobs at once.
    pub n_jobs: usize,
    /// A job still running after this long is stopped and counts as failed.
    pub timeout: Option<Duration>,
    /// Where each job's console output goes (`<num>.out`, `<num>.err`).
    pub log_dir: PathBuf,
}

/// joblib's `n_jobs`: -1 is every core, -2 all but one, and so on; 0 is refused.
pub fn joblib_n_jobs(n_jobs: i64, cores: usize) -> Result<usize, ConfigError> {
    match n_jobs {
        0 => Err(ConfigError::composition(
            "hydra.launcher.n_jobs=0: the joblib launcher needs at least one job at a time (-1: one per core)",
        )),
        n if n > 0 => Ok(n as usize),
        n => Ok((cores as i64 + 1 + n).max(1) as usize),
    }
}

/// The GPUs this machine lets jobs use: `CUDA_VISIBLE_DEVICES` when set, else what `nvidia-smi -L` lists.
fn visible_gpus() -> Vec<String> {
    if let Ok(v) = std::env::var("CUDA_VISIBLE_DEVICES") {
        return v
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
    }
    let Ok(out) = Command::new("nvidia-smi").arg("-L").output() else {
        return Vec::new();
    };
    let n = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("GPU "))
        .count();
    (0..n).map(|i| i.to_string()).collect()
}

/// What slot `slot` of `slots` gets: its GPUs (an equal share, or one shared round-robin when there are
/// fewer GPUs than slots) and its threads.
pub fn slot_share(
    slot: usize,
    slots: usize,
    gpus: &[String],
    cores: usize,
) -> (Vec<String>, usize) {
    let threads = (cores / slots.max(1)).max(1);
    if gpus.is_empty() {
        return (Vec::new(), threads);
    }
    let per = gpus.len() / slots.max(1);
    let mine = match per {
        0 => vec![gpus[slot % gpus.len()].clone()],
        k => gpus[slot * k..(slot + 1) * k].to_vec(),
    };
    (mine, threads)
}

struct Running {
    job: SweepJob,
    slot: usize,
    child: Child,
    started: Instant,
}

impl LocalLauncher {
    /// hydra-joblib-launcher: `n_jobs` at once (-1: one per core), `timeout` in seconds.
    pub fn joblib(settings: &Node, sweep_dir: &Path) -> Result<LocalLauncher, ConfigError> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(LocalLauncher {
            n_jobs: joblib_n_jobs(number(settings, "n_jobs").unwrap_or(-1.0) as i64, cores)?,
            timeout: number(settings, "timeout").map(Duration::from_secs_f64),
            log_dir: sweep_dir.join(".jobs"),
        })
    }

    /// submitit's local launcher: every job at once, `timeout_min`, logs in `submitit_folder`.
    pub fn submitit(settings: &Node, sweep_dir: &Path) -> LocalLauncher {
        LocalLauncher {
            n_jobs: usize::MAX,
            timeout: number(settings, "timeout_min").map(|m| Duration::from_secs_f64(m * 60.0)),
            log_dir: match settings.get("submitit_folder").and_then(Node::as_str) {
                Some(f) => folder_of(f).to_path_buf(),
                None => sweep_dir.join(".submitit"),
            },
        }
    }

    /// Run the jobs, `n_jobs` at a time, each reported to `progress` as it starts and ends; a false from
    /// `progress.ended` stops the sweep (`--fail-fast`): the running jobs are then stopped. A stop signal to this process
    /// (SIGTERM, SIGUSR1) is passed on to every running job, which writes a resume checkpoint and ends as
    /// preempted; no further job starts, and rerunning the sweep resumes each from its checkpoint.
    pub fn run(
        &self,
        cmd: &JobCommand,
        jobs: &[SweepJob],
        progress: &mut dyn Progress,
    ) -> Result<(), ConfigError> {
        std::fs::create_dir_all(&self.log_dir).map_err(|e| {
            ConfigError::Io(format!("could not create {}: {e}", self.log_dir.display()))
        })?;
        // The jobs bound their own checkpointing by trainer.preemption_grace_s; this process only waits
        // for them (dying first would take them along: they die with their parent).
        if let Err(e) = signals::arm_preemption(Duration::from_secs(24 * 3600)) {
            tracing::warn!("could not catch SIGTERM/SIGUSR1 in the sweep's launcher: {e}");
        }
        let slots = self.n_jobs.min(jobs.len()).max(1);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let gpus = visible_gpus();
        let mut free: Vec<usize> = (0..slots).rev().collect();
        let mut queue = jobs.iter();
        let mut running: Vec<Running> = Vec::new();
        let mut passed_on = false;
        loop {
            while let Some(slot) = free.pop() {
                // After a stop signal no job starts (nor a search's next batch).
                let stopping = passed_on || signals::preemption_requested();
                let Some(job) = queue.next().filter(|_| !stopping) else {
                    free.push(slot);
                    break;
                };
                JobResult::clear(&cmd.sweep_dir, job.num);
                let share = slot_share(slot, slots, &gpus, cores);
                let child = self.spawn(cmd, job, share)?;
                progress.started(job);
                progress.save()?;
                running.push(Running {
                    job: job.clone(),
                    slot,
                    child,
                    started: Instant::now(),
                });
            }
            if running.is_empty() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
            if !passed_on && signals::preemption_requested() {
                passed_on = true;
                let signal = signals::received_signal().unwrap_or("a stop signal");
                eprintln!(
                    "{signal}: passing it on to the {} running job(s); each writes a resume checkpoint",
                    running.len()
                );
                for r in &running {
                    // SAFETY: kill(2) on the pid of a child this process has not reaped yet.
                    unsafe { libc::kill(r.child.id() as libc::pid_t, libc::SIGTERM) };
                }
            }
            let mut i = 0;
            while i < running.len() {
                let r = &mut running[i];
                let timed_out = self.timeout.is_some_and(|t| r.started.elapsed() > t);
                if timed_out {
                    let _ = r.child.kill();
                }
                let Some(status) = r
                    .child
                    .try_wait()
                    .map_err(|e| ConfigError::Io(e.to_string()))?
                else {
                    i += 1;
                    continue;
                };
                let r = running.swap_remove(i);
                free.push(r.slot);
                let result = self.result_of(cmd, &r, status, timed_out, passed_on);
                // After a stop signal every job is left to write its checkpoint.
                if !progress.ended(result)? && !passed_on {
                    for mut other in running.drain(..) {
                        let _ = other.child.kill();
                        let _ = other.child.wait();
                    }
                    return Ok(());
                }
            }
        }
    }

    /// What an ended job reports: its own result file, else preempted (it exited with the preemption
    /// status, or died of the SIGTERM passed on before it could catch it), else a failure naming its log.
    fn result_of(
        &self,
        cmd: &JobCommand,
        r: &Running,
        status: std::process::ExitStatus,
        timed_out: bool,
        passed_on: bool,
    ) -> JobResult {
        use std::os::unix::process::ExitStatusExt;
        if let Some(result) = JobResult::read(&cmd.sweep_dir, r.job.num) {
            return result;
        }
        let killed_by_ours = passed_on && status.signal() == Some(libc::SIGTERM);
        if status.code() == Some(signals::EXIT_PREEMPTED.into()) || killed_by_ours {
            return JobResult {
                state: JobState::Preempted,
                ..JobResult::failed(
                    r.job.num,
                    "stopped at a resume checkpoint by a stop signal".into(),
                )
            };
        }
        JobResult::failed(
            r.job.num,
            format!(
                "the job's process {} without reporting a result; see {}",
                match timed_out {
                    true => format!(
                        "ran past the launcher's timeout ({:.0}s) and was stopped",
                        self.timeout.unwrap_or_default().as_secs_f64()
                    ),
                    false => format!("ended ({status})"),
                },
                self.log_file(r.job.num, "err").display()
            ),
        )
    }

    fn log_file(&self, num: usize, stream: &str) -> PathBuf {
        self.log_dir.join(format!("{num}.{stream}"))
    }

    fn spawn(
        &self,
        cmd: &JobCommand,
        job: &SweepJob,
        (gpus, threads): (Vec<String>, usize),
    ) -> Result<Child, ConfigError> {
        let open = |stream: &str| -> Result<std::fs::File, ConfigError> {
            let path = self.log_file(job.num, stream);
            std::fs::File::create(&path)
                .map_err(|e| ConfigError::Io(format!("could not create {}: {e}", path.display())))
        };
        let mut command = Command::new(&cmd.exe);
        command
            .args(cmd.args(job))
            .current_dir(&cmd.cwd)
            .env(crate::comm::NOW_ENV, &cmd.now)
            .stdin(Stdio::null())
            .stdout(open("out")?)
            .stderr(open("err")?);
        if !gpus.is_empty() {
            command.env("CUDA_VISIBLE_DEVICES", gpus.join(","));
        }
        for pool in ["OMP_NUM_THREADS", "RAYON_NUM_THREADS"] {
            if std::env::var_os(pool).is_none() {
                command.env(pool, threads.to_string());
            }
        }
        die_with_parent(&mut command);
        command.spawn().map_err(|e| {
            ConfigError::Io(format!(
                "could not start job #{} ({}): {e}",
                job.num,
                cmd.exe.display()
            ))
        })
    }
}

impl Launcher for LocalLauncher {
    fn launch(
        &self,
        cx: &LaunchContext,
        batch: &[SweepJob],
        progress: &mut dyn Progress,
    ) -> Result<(), ConfigError> {
        self.run(&cx.command, batch, progress)
    }
}

/// A number of the launcher's settings (an int or a float), when set.
fn number(settings: &Node, key: &str) -> Option<f64> {
    match settings.get(key).map(|n| &n.value) {
        Some(Value::Int(i)) => Some(*i as f64),
        Some(Value::Float(f)) => Some(*f),
        _ => None,
    }
}

/// The job dies with the `train` that started it, instead of training on as an orphan.
fn die_with_parent(command: &mut Command) {
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        use std::os::unix::process::CommandExt;
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

/// The directory of submitit's `submitit_folder` pattern, where `%j` (a job id) cannot be known before
/// submission: the pattern up to its first component with a `%`.
pub fn folder_of(pattern: &str) -> &Path {
    let path = Path::new(pattern);
    let mut end = path;
    for ancestor in path.ancestors() {
        if !ancestor.to_string_lossy().contains('%') {
            end = ancestor;
            break;
        }
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case(-1, 8, 8)]
    #[case(-2, 8, 7)]
    #[case(3, 8, 3)]
    #[case(-20, 8, 1)]
    fn n_jobs_as_joblib_reads_it(#[case] n: i64, #[case] cores: usize, #[case] want: usize) {
        assert_eq!(joblib_n_jobs(n, cores).unwrap(), want);
    }

    #[test]
    fn zero_jobs_at_once_is_refused() {
        assert!(joblib_n_jobs(0, 4)
            .unwrap_err()
            .to_string()
            .contains("n_jobs=0"));
    }

    #[rstest]
    #[case(0, 2, &["0", "1", "2", "3"], 8, &["0", "1"], 4)]
    #[case(1, 2, &["0", "1", "2", "3"], 8, &["2", "3"], 4)]
    #[case(2, 3, &["5", "7"], 6, &["5"], 2)]
    #[case(1, 2, &[], 2, &[], 1)]
    fn each_slot_gets_its_share(
        #[case] slot: usize,
        #[case] slots: usize,
        #[case] gpus: &[&str],
        #[case] cores: usize,
        #[case] want_gpus: &[&str],
        #[case] want_threads: usize,
    ) {
        let gpus: Vec<String> = gpus.iter().map(|s| s.to_string()).collect();
        let (mine, threads) = slot_share(slot, slots, &gpus, cores);
        assert_eq!(mine, want_gpus);
        assert_eq!(threads, want_threads);
    }

    #[rstest]
    #[case("/s/.submitit/%j", "/s/.submitit")]
    #[case("/s/.submitit", "/s/.submitit")]
    #[case("/s/%j/x", "/s")]
    fn the_folder_before_the_job_id(#[case] pattern: &str, #[case] want: &str) {
        assert_eq!(folder_of(pattern), Path::new(want));
    }
}
