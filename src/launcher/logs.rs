//! A job's log files: `train.log` beside the console for a single process; `train.rank<N>.log` for every
//! rank of a distributed run, rank 0 also writing `train.log` and the console.

use crate::config::errors::ConfigError;
use std::path::{Path, PathBuf};

/// Run `f` with its `tracing` output going to the console and to the run's `train.log` (scoped, so each job
/// of a sweep logs into its own directory).
pub fn with_run_log<T>(file: std::fs::File, f: impl FnOnce() -> T) -> T {
    use tracing_subscriber::fmt::writer::MakeWriterExt;
    let file = std::sync::Arc::new(file);
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_target(false)
        .with_writer(std::io::stdout.and(file))
        .finish();
    tracing::subscriber::with_default(subscriber, f)
}

/// A distributed worker's logging: every rank writes `train.rank<N>.log`; rank 0 also writes `train.log`
/// and the console (the other ranks would only repeat it).
pub fn with_rank_log<T>(
    output_dir: &Path,
    rank: usize,
    f: impl FnOnce() -> T,
) -> Result<T, ConfigError> {
    use tracing_subscriber::fmt::writer::MakeWriterExt;
    let open = |path: PathBuf| {
        std::fs::File::create(&path)
            .map(std::sync::Arc::new)
            .map_err(|e| ConfigError::Io(format!("could not create {}: {e}", path.display())))
    };
    let own = open(super::node::rank_log(output_dir, rank))?;
    let builder = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_target(false);
    Ok(if rank == 0 {
        let main = open(output_dir.join("train.log"))?;
        let subscriber = builder
            .with_writer(std::io::stdout.and(main).and(own))
            .finish();
        tracing::subscriber::with_default(subscriber, f)
    } else {
        tracing::subscriber::with_default(builder.with_writer(own).finish(), f)
    })
}
