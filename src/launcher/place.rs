//! Where a job writes, decided before anything is written: its output directory (`hydra.run.dir`, a sweep's
//! `hydra.sweep.subdir`, or `logs/<task_name>/runs/<date_time>`), its resolved `hydra` node and the resolve
//! context that serves `${hydra:runtime.output_dir}` and friends to the job's config.

use crate::config::errors::ConfigError;
use crate::config::interpolate::{resolve_all, resolve_path, ResolveContext};
use crate::config::tree::{Node, Value};
use crate::config::yaml;
use crate::project::Setup;
use std::path::{Path, PathBuf};

/// A job's place: its output directory, its resolved `hydra` node, and the resolve context that serves
/// `${hydra:runtime.output_dir}` and friends to the job's config.
pub struct JobPlace {
    pub output_dir: PathBuf,
    pub task_name: String,
    pub hydra: Node,
    pub ctx: ResolveContext,
}

/// Work out where a job writes, before anything is written (also used by `--cfg --resolve` to preview it).
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
    let mut with_task = Node::empty_map();
    if let Some(m) = with_task.as_map_mut() {
        m.insert("hydra".into(), hydra);
        m.insert(
            "task_name".into(),
            Node::new(Value::Str(task_name.clone()), Default::default()),
        );
    }
    let mut resolved_hydra = resolve_all(&with_task, ctx)?
        .get("hydra")
        .cloned()
        .unwrap_or_else(Node::empty_map);
    let stamp = ctx.now.format("%Y-%m-%d_%H-%M-%S").to_string();
    let output_dir = match sweep_dir {
        Some(dir) => {
            let sub = resolved_hydra
                .get("sweep.subdir")
                .filter(|n| n.value != Value::Null)
                .map(|n| n.value.display_python())
                .unwrap_or_else(|| num.to_string());
            dir.join(sub)
        }
        None => match resolved_hydra.get("run.dir").and_then(Node::as_str) {
            Some(dir) => setup.project_root.join(dir),
            None => setup
                .project_root
                .join("logs")
                .join(&task_name)
                .join("runs")
                .join(&stamp),
        },
    };
    let runtime = yaml::parse(
        &format!(
            "runtime:\n  output_dir: {}\njob:\n  name: {}\n  num: {num}\n  config_name: {}\n",
            yaml::quote_if_needed(&output_dir.display().to_string()),
            yaml::quote_if_needed(&task_name),
            yaml::quote_if_needed(&setup.config_name)
        ),
        "<job runtime>",
    )
    .map_err(ConfigError::from)?
    .unwrap_or_else(Node::empty_map);
    resolved_hydra.merge(runtime);
    let mut job_ctx = ctx.clone();
    job_ctx.hydra = Some(resolved_hydra.clone());
    Ok(JobPlace {
        output_dir,
        task_name,
        hydra: resolved_hydra,
        ctx: job_ctx,
    })
}
