//! What the user typed, parsed without side effects (Hydra's flag names). `app` turns it into actions.

use clap::{Parser, ValueEnum};
use std::ffi::OsString;
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CfgKind {
    /// The job's config (without the `hydra` node).
    Job,
    /// The `hydra` node only.
    Hydra,
    /// Everything.
    All,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InfoKind {
    /// Everything below.
    All,
    /// The flattened defaults list: config path, package, parent.
    Defaults,
    /// The defaults tree as composed.
    DefaultsTree,
    /// The config search path.
    Searchpath,
    /// The composed config.
    Config,
    /// The configuration reference: every key of the typed config, its type, default and meaning
    /// (Markdown; not part of `all`).
    Schema,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// Compose a training experiment from YAML config groups and command-line overrides, then run it.
#[derive(Debug, Parser)]
#[command(name = "train", version, about, max_term_width = 110)]
pub struct Cli {
    /// Primary config directory; replaces the project's search path (`-cp`).
    #[arg(long = "config-path", value_name = "DIR")]
    pub config_path: Option<PathBuf>,

    /// Primary config name, without `.yaml` (`-cn`). Default: `train`.
    #[arg(long = "config-name", value_name = "NAME")]
    pub config_name: Option<String>,

    /// Add a config directory to the search path (`-cd`); may repeat.
    #[arg(long = "config-dir", value_name = "DIR")]
    pub config_dir: Vec<PathBuf>,

    /// Print the composed config and exit without running.
    #[arg(short = 'c', long = "cfg", value_enum, value_name = "job|hydra|all")]
    pub cfg: Option<CfgKind>,

    /// With --cfg: resolve `${...}` interpolations before printing.
    #[arg(long)]
    pub resolve: bool,

    /// With --cfg: print only the node at this dotted key.
    #[arg(short = 'p', long = "package", value_name = "KEY")]
    pub package: Option<String>,

    /// Print information about composition and exit.
    #[arg(short = 'i', long, value_enum, num_args = 0..=1, default_missing_value = "all")]
    pub info: Option<InfoKind>,

    /// Run a sweep: one job per combination of the swept values.
    #[arg(short = 'm', long)]
    pub multirun: bool,

    /// With --multirun: stop at the first failing job.
    #[arg(long = "fail-fast")]
    pub fail_fast: bool,

    /// Print a completion script for the shell (`-sc`) and exit.
    #[arg(long = "shell-completion", value_enum, value_name = "SHELL")]
    pub shell_completion: Option<Shell>,

    /// Used by the completion scripts: print candidates for the word being completed.
    #[arg(
        long = "complete",
        hide = true,
        value_name = "WORD",
        allow_hyphen_values = true
    )]
    pub complete: Option<String>,

    /// Set by the parallel and SLURM launchers: run job NUM of the sweep in `--sweep-dir` in this process.
    #[arg(
        long = "sweep-job",
        hide = true,
        value_name = "NUM",
        requires = "sweep_dir"
    )]
    pub sweep_job: Option<usize>,

    /// With `--sweep-job`: the sweep's directory.
    #[arg(long = "sweep-dir", hide = true, value_name = "DIR")]
    pub sweep_dir: Option<PathBuf>,

    /// Overrides: `key=value`, `group=option`, `+key=value`, `++key=value`, `~key`; sweeps with `-m`: `a=1,2`.
    #[arg(value_name = "OVERRIDE", allow_hyphen_values = false)]
    pub overrides: Vec<String>,
}

/// `train --help`'s list of the commands besides running (each answers `--help` itself).
pub const COMMANDS: &str = "Commands (`train COMMAND --help` for each):
  train [OVERRIDES]              compose the config and run it (a sweep with -m)
  train eval ckpt_path=FILE ...  test a checkpoint's model on the test split; trains nothing
  train predict ckpt_path=FILE ...  one row per input (class and probability, or values) to CSV/parquet
  train init [DIR] [--crate]     write a new project on top of the built-in config groups
  train logbook [PATHS]          write logs/logbook.md: runs compared, plots, sweep sections
  train pack out=DIR ...         write a dataset as WebDataset shards
  train export ckpt=FILE out=FILE  a checkpoint's weights for PyTorch (.safetensors), or a TorchScript run's module (.pt)";

/// What `train eval --help` says before the flags `train` itself takes.
pub const EVAL_ABOUT: &str = "Test the model of a checkpoint on the test split, training nothing \
(lightning-hydra-template's eval.py): `train eval ckpt_path=logs/.../checkpoints/last.safetensors \
[OVERRIDES]`, with the same flags, groups and overrides as `train` (-cn eval for the template's eval.yaml).";

/// What `train predict --help` says before the flags `train` itself takes.
pub const PREDICT_ABOUT: &str = "Predict every input of a split with the model of a checkpoint \
(Lightning's trainer.predict), training nothing: `train predict ckpt_path=logs/.../checkpoints/last.safetensors \
[predict.split=test|val|train] [predict.output=predictions.csv|FILE.parquet] [OVERRIDES]`. One row per input: \
its index and id (file path or WebDataset key, where the data set has one), its target, and the predicted \
class with its probability (classification) or the predicted values; on every strategy, each input once. \
A relative predict.output is inside the run directory.";

/// Hydra spells some flags with two-letter single dashes (`-cp`, `-cn`, `-cd`, `-sc`); clap cannot, so map them.
pub fn normalize_args(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    args.into_iter()
        .map(|a| match a.to_str() {
            Some("-cp") => "--config-path".into(),
            Some("-cn") => "--config-name".into(),
            Some("-cd") => "--config-dir".into(),
            Some("-sc") => "--shell-completion".into(),
            Some(s) if s.starts_with("-cp=") => format!("--config-path={}", &s[4..]).into(),
            Some(s) if s.starts_with("-cn=") => format!("--config-name={}", &s[4..]).into(),
            Some(s) if s.starts_with("-cd=") => format!("--config-dir={}", &s[4..]).into(),
            _ => a,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(normalize_args(args.iter().map(OsString::from))).unwrap()
    }

    #[test]
    fn hydra_style_flags() {
        let cli = parse(&[
            "train", "-cp", "cfgs", "-cn", "main", "--cfg", "job", "a=1", "-m", "b=2,3",
        ]);
        assert_eq!(cli.config_path, Some(PathBuf::from("cfgs")));
        assert_eq!(cli.config_name.as_deref(), Some("main"));
        assert_eq!(cli.cfg, Some(CfgKind::Job));
        assert!(cli.multirun);
        assert_eq!(cli.overrides, vec!["a=1", "b=2,3"]);
    }

    #[test]
    fn info_without_value_means_all() {
        assert_eq!(parse(&["train", "--info"]).info, Some(InfoKind::All));
        assert_eq!(
            parse(&["train", "--info", "defaults-tree"]).info,
            Some(InfoKind::DefaultsTree)
        );
    }

    #[test]
    fn tilde_and_plus_overrides_are_positional() {
        let cli = parse(&["train", "~a", "+b=1", "++c=2"]);
        assert_eq!(cli.overrides, vec!["~a", "+b=1", "++c=2"]);
    }
}

/// `train logbook [PATHS...] [-o FILE]`: write the experiment logbook from run directories.
#[derive(Debug, Parser)]
#[command(
    name = "train logbook",
    about = "Write a markdown logbook (tables, reproduce commands, SVG plots, sweep sections) from run directories",
    max_term_width = 110
)]
pub struct LogbookCli {
    /// Run directories, sweep directories or logs directories to read (searched recursively).
    /// Default: the project's `logs/`.
    #[arg(value_name = "PATHS")]
    pub paths: Vec<PathBuf>,

    /// Where to write the markdown; the SVG plots go beside it. Default: `logs/logbook.md` in the project.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
}
