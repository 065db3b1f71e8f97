//! Running one job, whoever chose it and whichever launcher started it: `place` decides where it writes,
//! `run` resolves, types and plans its config and trains (in this process, as one rank of a distributed
//! run, or by starting this node's workers through `node`, torchrun's job), `supervisor` restarts a
//! single process (`trainer.max_restarts`), `requeue` is SLURM's auto-requeue on its warning signal,
//! `logs` routes its log lines into its run directory, `outcome` is what it reports. `in_sweep` is a
//! sweep's job in a process of its own (`train --sweep-job N`) and the result file it leaves for the
//! sweep; `trial_judge` reports a search trial's validations to its study and pruner.

pub mod extras;
pub mod in_sweep;
pub mod logs;
pub mod node;
pub mod outcome;
pub mod place;
pub mod requeue;
pub mod run;
pub mod supervisor;
pub mod trial_judge;
