//! A job's logging, as its `hydra/job_logging` option describes it: the console (coloured for `colorlog` on a
//! terminal, errors only for `disabled`/`none`), the log file its file handler names (`train.log` by
//! default), the root level (`DEBUG` with `hydra.verbose`); for a distributed run every rank also writes
//! `train.rank<N>.log`.

use crate::config::errors::ConfigError;
use crate::config::hydra::LoggingStyle;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tracing::Level;
use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer;

/// How one job logs.
#[derive(Debug, Clone)]
pub struct LogSetup {
    pub style: LoggingStyle,
    /// The job's log file (`hydra.job_logging.handlers.file.filename`), absent when the style has none.
    pub file: Option<PathBuf>,
    pub level: Level,
    /// `extras.ignore_warnings`: the job's warnings are not shown or kept (errors still are).
    pub hide_warnings: bool,
}

impl LogSetup {
    fn console_level(&self) -> Level {
        match self.style {
            LoggingStyle::Quiet => Level::ERROR,
            _ => self.level,
        }
    }
}

fn open(path: &Path) -> Result<Arc<std::fs::File>, ConfigError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| ConfigError::Io(format!("could not create {}: {e}", dir.display())))?;
    }
    std::fs::File::create(path)
        .map(Arc::new)
        .map_err(|e| ConfigError::Io(format!("could not create {}: {e}", path.display())))
}

/// Run `f` with its `tracing` output going to the console (when `console`) and to `files`, scoped so each
/// job of a sweep logs into its own directory.
fn with_logging<T>(
    setup: &LogSetup,
    console: bool,
    files: Vec<Arc<std::fs::File>>,
    f: impl FnOnce() -> T,
) -> T {
    let colour = setup.style == LoggingStyle::Colour && std::io::stdout().is_terminal();
    let console_layer = console.then(|| {
        tracing_subscriber::fmt::layer()
            .with_ansi(colour)
            .with_target(false)
            .with_writer(std::io::stdout.with_max_level(setup.console_level()))
    });
    let file_layer = (!files.is_empty()).then(|| {
        let writer = files
            .into_iter()
            .map(BoxMakeWriter::new)
            .reduce(|a, b| BoxMakeWriter::new(a.and(b)))
            .expect("at least one file");
        tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_target(false)
            .with_writer(writer.with_max_level(setup.level))
    });
    let hide_warnings = setup.hide_warnings;
    let subscriber = tracing_subscriber::registry()
        .with(console_layer)
        .with(file_layer.map(|l| l.boxed()))
        .with(tracing_subscriber::filter::filter_fn(move |meta| {
            !(hide_warnings && *meta.level() == Level::WARN)
        }));
    tracing::subscriber::with_default(subscriber, f)
}

/// A single-process job's logging: the console and its log file.
pub fn with_run_log<T>(setup: &LogSetup, f: impl FnOnce() -> T) -> Result<T, ConfigError> {
    let files = match &setup.file {
        Some(path) => vec![open(path)?],
        None => Vec::new(),
    };
    Ok(with_logging(setup, true, files, f))
}

/// A distributed worker's logging: every rank writes `train.rank<N>.log`; rank 0 also writes the job's log
/// file and the console (the other ranks would only repeat it).
pub fn with_rank_log<T>(
    output_dir: &Path,
    rank: usize,
    setup: &LogSetup,
    f: impl FnOnce() -> T,
) -> Result<T, ConfigError> {
    let mut files = vec![open(&super::node::rank_log(output_dir, rank))?];
    if rank == 0 {
        if let Some(path) = &setup.file {
            files.push(open(path)?);
        }
    }
    Ok(with_logging(setup, rank == 0, files, f))
}
