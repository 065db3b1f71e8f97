//! How jobs start, as Hydra splits it: the sweeper chooses the jobs (`sweep`: Hydra's BasicSweeper,
//! `search_sweep`: the optuna sweeper, `trial_judge`: a trial's reports to its study and pruner, `resume`:
//! continuing an earlier sweep), a launcher runs them (in this process; `local`: processes on
//! this machine; `slurm`, `slurm_sweep`: a SLURM array), and each job (`job`, `sweep_job` in a process of
//! its own) trains in this process, as a rank of a distributed run, or by starting this node's workers
//! through `node`, torchrun's job. `requeue` is SLURM's auto-requeue on its warning signal. `place`
//! decides where a job writes before it runs; `logs` routes its log lines into its run directory.

pub mod extras;
pub mod job;
pub mod launch;
pub mod local;
pub mod logs;
pub mod node;
pub mod outcome;
pub mod place;
pub mod requeue;
pub mod resume;
pub mod search_sweep;
pub mod slurm;
pub mod slurm_sweep;
pub mod supervisor;
pub mod sweep;
pub mod sweep_job;
pub mod tally;
pub mod trial_judge;
