//! Hydra's BasicSweeper: the sweep expanded into jobs up front (leftmost override slowest, then
//! `hydra.sweeper.params`), planned in `sweep.json` before any runs (or the same sweep resumed from its
//! directory), and handed to the launcher in one batch.

use super::tally::Tally;
use super::{SweepInput, SweepRun, Sweeper};
use crate::config::errors::ConfigError;
use crate::config::sweep;
use crate::config::tree::Value;
use crate::launch::{Progress, SweepJob};
use crate::storage::records;
use std::process::ExitCode;

pub struct BasicSweeper {
    jobs: Vec<Vec<String>>,
}

impl BasicSweeper {
    pub fn build(input: &SweepInput) -> Result<BasicSweeper, ConfigError> {
        let params: Vec<String> = match input.hydra.get("sweeper.params").map(|n| &n.value) {
            Some(Value::Map(m)) => m
                .iter()
                .map(|(k, v)| format!("{k}={}", sweep::param_override_text(v)))
                .collect(),
            _ => Vec::new(),
        };
        Ok(BasicSweeper {
            jobs: sweep::expand(&input.setup.repo, &params, input.overrides)?,
        })
    }
}

impl Sweeper for BasicSweeper {
    fn planned_jobs(&self) -> Option<&[Vec<String>]> {
        Some(&self.jobs)
    }

    fn sweep(&self, run: &SweepRun) -> Result<ExitCode, ConfigError> {
        let sweep_dir = run.sweep_dir();
        // The plan, before any job runs: the logbook lists every job from it, started or not. An earlier
        // record of the same sweep in this directory is resumed.
        let (record, resumed) =
            super::resume::plan_or_resume(sweep_dir, run.task_name, &self.jobs)?;
        let mut tally = Tally::new(sweep_dir, record, run.fail_fast);
        tally.save()?;
        let todo: Vec<SweepJob> = tally
            .record
            .jobs
            .iter()
            .filter(|j| !j.state.is_done())
            .map(|j| SweepJob {
                num: j.num,
                overrides: j.overrides.clone(),
                previous_launch_id: j.launch_id.clone(),
            })
            .collect();
        let total = self.jobs.len();
        match resumed {
            true if todo.is_empty() => eprintln!(
                "The sweep in {} has nothing to do: all {total} of its jobs completed earlier (its \
                 results and logbook section stand; choose another hydra.sweep.dir for a new sweep)",
                records::display(sweep_dir)
            ),
            true => eprintln!(
                "Resuming the sweep in {}: {} of {total} jobs completed earlier; running {}",
                records::display(sweep_dir),
                total - todo.len(),
                todo.iter()
                    .map(|j| format!("#{}", j.num))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            false => eprintln!(
                "Launching {total} jobs into {}",
                records::display(sweep_dir)
            ),
        }
        run.launcher.launch(run.cx, &todo, &mut tally)?;
        tally.finish(total)
    }
}
