//! Where a job writes, decided before anything is written: its output directory (`hydra.run.dir`, or a
//! sweep's directory joined with `hydra.sweep.subdir`), its `hydra` node with the run-time fields filled,
//! and the resolve context that serves `${hydra:runtime.output_dir}` and friends to the job's config.

use crate::config::compose::RunMode;
use crate::config::errors::ConfigError;
use crate::config::hydra::runtime::{fill_job, JobRuntime};
use crate::config::interpolate::{resolve_hydra_key, resolve_path, ResolveContext};
use crate::config::tree::{Node, Value};
use crate::project::Setup;
use std::path::{Path, PathBuf};

/// A job's place: its output directory, its `hydra` node (run-time fields filled, as `.hydra/hydra.yaml`
/// records it), and the resolve context that serves `${hydra:...}` to the job's config.
pub struct JobPlace {
    pub output_dir: PathBuf,
    pub task_name: String,
    pub hydra: Node,
    pub ctx: ResolveContext,
}

/// Work out where a job writes, before anything is written (also used by `--cfg --resolve` to preview it).
/// `sweep_dir` is the sweep's resolved directory when the job is part of one (`num` is then its number).
pub fn place_job(
    setup: &Setup,
    job_cfg: &Node,
    hydra: Node,
    num: usize,
    sweep_dir: Option<&Path>,
    ctx: &ResolveContext,
) -> Result<JobPlace, ConfigError> {
    let task_name = match job_cfg.get("task_name") {
        Some(_) => resolve_path(job_cfg, "task_name", ctx)?
            .value
            .display_python(),
        None => setup.config_name.clone(),
    };
    let mode = match sweep_dir {
        Some(_) => RunMode::Multirun,
        None => RunMode::Run,
    };
    let mut runtime = JobRuntime {
        output_dir: None,
        num: sweep_dir.map(|_| num),
        mode,
    };
    // The job's number (and mode) first: `hydra.sweep.subdir` is `${hydra.job.num}` by default.
    let mut hydra = hydra;
    fill_job(&mut hydra, &runtime);
    let mut job_ctx = ctx.clone();
    job_ctx.hydra = Some(hydra.clone());
    let dir_text = |key: &str| -> Result<String, ConfigError> {
        let node = resolve_hydra_key(job_cfg, key, &job_ctx)?;
        match node.value {
            Value::Str(s) => Ok(s),
            Value::Null => Err(ConfigError::composition(format!(
                "hydra.{key} is null: set it to the directory a job writes to{}",
                crate::config::errors::at(&node.source)
            ))),
            other => Ok(other.display_python()),
        }
    };
    let output_dir = match sweep_dir {
        Some(dir) => dir.join(dir_text("sweep.subdir")?),
        None => setup.project_root.join(dir_text("run.dir")?),
    };
    runtime.output_dir = Some(output_dir.clone());
    fill_job(&mut hydra, &runtime);
    job_ctx.hydra = Some(hydra.clone());
    Ok(JobPlace {
        output_dir,
        task_name,
        hydra,
        ctx: job_ctx,
    })
}

/// A sweep's directory (`hydra.sweep.dir`, resolved against the master config; relative to the project).
pub fn sweep_dir(
    setup: &Setup,
    job_cfg: &Node,
    hydra: &Node,
    ctx: &ResolveContext,
) -> Result<PathBuf, ConfigError> {
    let node = master_key(job_cfg, hydra, "sweep.dir", ctx)?;
    Ok(setup.project_root.join(node.value.display_python()))
}

/// A key of the sweep's `hydra` node, resolved against the master config (no job number yet).
pub fn master_key(
    job_cfg: &Node,
    hydra: &Node,
    key: &str,
    ctx: &ResolveContext,
) -> Result<Node, ConfigError> {
    let mut master_ctx = ctx.clone();
    let mut hydra = hydra.clone();
    fill_job(
        &mut hydra,
        &JobRuntime {
            output_dir: None,
            num: None,
            mode: RunMode::Multirun,
        },
    );
    master_ctx.hydra = Some(hydra);
    resolve_hydra_key(job_cfg, key, &master_ctx)
}
