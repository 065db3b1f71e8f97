//! hydra-submitit-launcher's `submitit_slurm`: group the jobs by the allocation they need, write one
//! array script per group, submit them, wait, and record each job's result (a resumed sweep first waits
//! for jobs an earlier attempt submitted that SLURM still runs, and keeps the results of those that ended
//! meanwhile, instead of submitting them twice).

use super::slurm::{self, ArrayGroup, SlurmConf, Submitted};
use super::{LaunchContext, Launcher, Progress, SweepJob};
use crate::config::compose::RunMode;
use crate::config::errors::ConfigError;
use crate::config::hydra::{compose_with_hydra, split_hydra};
use crate::config::tree::Node;
use crate::job::in_sweep::JobResult;
use std::collections::BTreeMap;

/// The SLURM launcher, its settings read (and checked) from `hydra.launcher`.
pub struct SlurmArrayLauncher {
    conf: SlurmConf,
}

impl SlurmArrayLauncher {
    pub fn read(settings: &Node) -> Result<SlurmArrayLauncher, ConfigError> {
        Ok(SlurmArrayLauncher {
            conf: SlurmConf::read(settings)?,
        })
    }
}

impl Launcher for SlurmArrayLauncher {
    fn launch(
        &self,
        cx: &LaunchContext,
        batch: &[SweepJob],
        progress: &mut dyn Progress,
    ) -> Result<(), ConfigError> {
        run(&self.conf, cx, batch, progress)
    }
}

/// The allocation a job needs: (nodes, tasks per node), from its typed config: `trainer.num_nodes`, and
/// one task per device for DDP/FSDP (SLURM then starts every rank).
fn job_shape(cx: &LaunchContext, job: &SweepJob) -> Result<(usize, usize), ConfigError> {
    let setup = cx.setup;
    let overrides = cx.job_overrides(&job.overrides)?;
    let composed = compose_with_hydra(&setup.repo, &setup.config_name, &overrides, RunMode::Run)?;
    let (job_cfg, hydra) = split_hydra(composed.config);
    let place = crate::job::place::place_job(
        setup,
        &job_cfg,
        hydra,
        job.num,
        Some(cx.sweep_dir()),
        cx.ctx,
    )?;
    let resolved = crate::config::interpolate::resolve_all(&job_cfg, &place.ctx)?;
    let exp = crate::schema::extract(&resolved)?;
    let t = &exp.trainer;
    let tasks = match (t.strategy, t.devices) {
        (
            crate::schema::Strategy::Ddp | crate::schema::Strategy::Fsdp,
            crate::schema::Devices::Count(n),
        ) => n.max(1),
        _ => 1,
    };
    Ok((t.num_nodes.max(1), tasks))
}

/// Submit `jobs` and wait for them; `shape` gives each job's allocation.
fn run(
    conf: &SlurmConf,
    cx: &LaunchContext,
    jobs: &[SweepJob],
    progress: &mut dyn Progress,
) -> Result<(), ConfigError> {
    let cmd = &cx.command;
    let folder = conf.folder();
    std::fs::create_dir_all(&folder)
        .map_err(|e| ConfigError::Io(format!("could not create {}: {e}", folder.display())))?;
    let mut submitted = Vec::new();
    let mut groups: BTreeMap<(usize, usize), Vec<SweepJob>> = BTreeMap::new();
    for job in jobs {
        if let Some(id) = &job.previous_launch_id {
            if slurm::still_alive(id)? {
                eprintln!(
                    "#{} : still in SLURM's queue as job {id}; waiting for it",
                    job.num
                );
                submitted.push(Submitted {
                    job: job.clone(),
                    id: id.clone(),
                    script: None,
                });
                continue;
            }
            // It ended while no sweep watched (the launching `train` was killed): its result stands.
            if let Some(result) = JobResult::read(&cmd.sweep_dir, job.num)
                .filter(|r| r.state.is_done() && r.output_dir.is_some())
            {
                eprintln!(
                    "#{} : SLURM job {id} finished while no sweep was watching; its result is kept",
                    job.num
                );
                progress.ended(result)?;
                continue;
            }
        }
        // A job whose config does not type is still submitted: it fails on the cluster with the same error,
        // recorded as that job's failure, while the sweep's other jobs run.
        let (nodes, tasks) = job_shape(cx, job).unwrap_or((1, 1));
        let key = (
            nodes.max(conf.nodes as usize),
            tasks.max(conf.tasks_per_node as usize),
        );
        groups.entry(key).or_default().push(job.clone());
    }
    for (n, ((nodes, tasks_per_node), jobs)) in groups.into_iter().enumerate() {
        let group = ArrayGroup {
            nodes,
            tasks_per_node,
            jobs,
        };
        let stamp = chrono::Local::now().format("%Y%m%d-%H%M%S%.3f");
        let script = folder.join(format!("array-{stamp}-{n}.sbatch"));
        let text = slurm::sbatch_script(conf, &group, cmd, &script);
        crate::storage::records::write_atomic(&script, text.as_bytes())
            .map_err(|e| ConfigError::Io(format!("could not write {}: {e}", script.display())))?;
        for job in &group.jobs {
            JobResult::clear(&cmd.sweep_dir, job.num);
        }
        let array = slurm::submit(conf, &script)?;
        eprintln!(
            "Submitted SLURM array job {array} ({} job(s), {nodes} node(s) × {tasks_per_node} task(s) each): {}",
            group.jobs.len(),
            script.display()
        );
        for (i, job) in group.jobs.into_iter().enumerate() {
            let id = format!("{array}_{i}");
            eprintln!(
                "#{} : {} (SLURM job {id})",
                job.num,
                job.overrides.join(" ")
            );
            progress.started(&job);
            progress.submitted(job.num, &id);
            submitted.push(Submitted {
                job,
                id,
                script: Some(script.clone()),
            });
        }
        progress.save()?;
    }
    slurm::wait(conf, &cmd.sweep_dir, submitted, &mut |mut result, job| {
        if let Some(dir) = &result.output_dir {
            slurm::record_beside_job(conf, job, dir);
        }
        if let Some(error) = result.error.as_mut().filter(|e| !e.contains("_log.")) {
            error.push_str(&format!(
                "\n    (SLURM job {}; its log: {})",
                job.id,
                slurm::log_file(conf, job).display()
            ));
        }
        progress.ended(result)
    })
}
