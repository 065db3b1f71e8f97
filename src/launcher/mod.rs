//! How jobs start, as Hydra splits it: the sweeper chooses the jobs (`sweep`: Hydra's BasicSweeper), the
//! launcher runs them (`job`: in this process, as a rank of a distributed run, or by starting this node's
//! workers through `node`, torchrun's job). `place` decides where a job writes before it runs; `logs`
//! routes its log lines into its run directory.

pub mod job;
pub mod logs;
pub mod node;
pub mod place;
pub mod sweep;
