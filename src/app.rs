//! From what the user typed to what happens: find the project, build the search path, compose, then print
//! (`--cfg`, `--info`), complete (`--shell-completion`), or run one job or a sweep and write its records.

use crate::cli::{CfgKind, Cli, InfoKind, Shell};
use crate::config::compose::{Composed, RunMode};
use crate::config::errors::ConfigError;
use crate::config::grammar::{parse_override, Override};
use crate::config::interpolate::{resolve_all, resolve_path, ResolveContext};
use crate::config::repository::{Repository, SearchRoot};
use crate::config::tree::{Node, Value};
use crate::config::{defaults, sweep, yaml};
use crate::records::{self, JobInfo};
use clap::{CommandFactory, FromArgMatches, Parser};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The file whose presence marks a project root (searched from the current directory upward).
pub const PROJECT_MARKER: &str = "conf/train.yaml";
pub const DEFAULT_CONFIG_NAME: &str = "train";

/// Entry point used by `main`: never panics on user input, prints one clear error and exits non-zero.
pub fn main_entry(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let args = crate::cli::normalize_args(args);
    if args.get(1).is_some_and(|a| a == "logbook") {
        return logbook_entry(&args[2..]);
    }
    let wants_help = args.iter().skip(1).any(|a| a == "--help" || a == "-h");
    let mut command = Cli::command();
    if wants_help {
        if let Ok(setup) = Setup::discover(&Cli::parse_from(["train"])) {
            command = command.after_help(groups_help(&setup.repo));
        }
    }
    let matches = match command.try_get_matches_from(&args) {
        Ok(m) => m,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(2);
        }
    };
    match run(&cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("Error: {e}");
            ExitCode::from(1)
        }
    }
}

/// `train logbook ...`: read run directories, write the logbook.
fn logbook_entry(args: &[OsString]) -> ExitCode {
    let cli = match crate::cli::LogbookCli::try_parse_from(
        std::iter::once(OsString::from("train logbook")).chain(args.iter().cloned()),
    ) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let logs = || -> PathBuf {
        std::env::current_dir()
            .ok()
            .and_then(|cwd| find_project(&cwd).ok())
            .map(|root| root.join("logs"))
            .unwrap_or_else(|| PathBuf::from("logs"))
    };
    let paths = if cli.paths.is_empty() {
        vec![logs()]
    } else {
        cli.paths.clone()
    };
    let output = cli
        .output
        .clone()
        .unwrap_or_else(|| logs().join("logbook.md"));
    match crate::logbook::write_logbook(&paths, &output) {
        Ok(w) => {
            println!(
                "Logbook: {} ({} run(s), {} plot(s))",
                records::display(&w.markdown),
                w.runs,
                w.svgs.len()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("Error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Where configs come from and where outputs go.
pub struct Setup {
    pub repo: Repository,
    pub config_name: String,
    /// Outputs (`logs/`) are written relative to this directory.
    pub project_root: PathBuf,
}

impl Setup {
    pub fn discover(cli: &Cli) -> Result<Setup, ConfigError> {
        let cwd = std::env::current_dir()
            .map_err(|e| ConfigError::Io(format!("no current directory: {e}")))?;
        let config_name = cli
            .config_name
            .clone()
            .unwrap_or_else(|| DEFAULT_CONFIG_NAME.to_string());
        let mut roots = Vec::new();
        let project_root;
        if let Some(dir) = &cli.config_path {
            let dir = cwd.join(dir);
            if !dir.is_dir() {
                return Err(ConfigError::MissingConfig(format!(
                    "Primary config directory not found: {}\n    (from --config-path/-cp)",
                    dir.display()
                )));
            }
            roots.push(SearchRoot {
                dir,
                mount: String::new(),
                provider: "main".into(),
            });
            project_root = cwd.clone();
        } else {
            let root = find_project(&cwd)?;
            roots.push(SearchRoot {
                dir: root.join("conf"),
                mount: String::new(),
                provider: "main".into(),
            });
            roots.push(SearchRoot {
                dir: root.join("experiments"),
                mount: "experiment".into(),
                provider: "project".into(),
            });
            project_root = root;
        }
        for dir in &cli.config_dir {
            let dir = cwd.join(dir);
            if !dir.is_dir() {
                return Err(ConfigError::MissingConfig(format!(
                    "Additional config directory not found: {}\n    (from --config-dir/-cd)",
                    dir.display()
                )));
            }
            roots.push(SearchRoot {
                dir,
                mount: String::new(),
                provider: "command-line".into(),
            });
        }
        Ok(Setup {
            repo: Repository::new(roots),
            config_name,
            project_root,
        })
    }
}

/// The project root: `TRAIN_CONFIG_PATH`, else the nearest directory upward holding `conf/train.yaml`.
pub fn find_project(cwd: &Path) -> Result<PathBuf, ConfigError> {
    if let Ok(dir) = std::env::var("TRAIN_CONFIG_PATH") {
        let dir = cwd.join(dir);
        if dir.join(PROJECT_MARKER).is_file() {
            return Ok(dir);
        }
        return Err(ConfigError::MissingConfig(format!(
            "TRAIN_CONFIG_PATH={} has no {PROJECT_MARKER}",
            dir.display()
        )));
    }
    for dir in cwd.ancestors() {
        if dir.join(PROJECT_MARKER).is_file() {
            return Ok(dir.to_path_buf());
        }
    }
    Err(ConfigError::MissingConfig(format!(
        "No project found: looked for {PROJECT_MARKER} in {} and its parents.\n\
         Run train inside a project, pass --config-path/-cp DIR, or set TRAIN_CONFIG_PATH=<project dir>.",
        cwd.display()
    )))
}

pub fn parse_overrides(texts: &[String]) -> Result<Vec<Override>, ConfigError> {
    texts
        .iter()
        .map(|t| parse_override(t).map_err(|e| ConfigError::Parse(e.to_string())))
        .collect()
}

/// The `hydra` node every composition starts from, so `hydra.run.dir=...` and sweeper params can be set.
fn builtin_hydra() -> Node {
    let text = "hydra:\n  run:\n    dir: null\n  sweep:\n    dir: null\n    subdir: null\n  sweeper:\n    params: {}\n  job:\n    name: null\n";
    yaml::parse(text, "<builtin hydra config>")
        .ok()
        .flatten()
        .unwrap_or_else(Node::empty_map)
}

/// Compose with the built-in `hydra` node underneath (a primary config's `hydra:` block merges over it).
pub fn compose_with_hydra(
    repo: &Repository,
    config_name: &str,
    overrides: &[Override],
    mode: RunMode,
) -> Result<Composed, ConfigError> {
    crate::config::compose::compose_over(builtin_hydra(), repo, config_name, overrides, mode)
}

/// Split a composed tree into the job's config and the `hydra` node.
pub fn split_hydra(mut config: Node) -> (Node, Node) {
    let hydra = config
        .as_map_mut()
        .and_then(|m| m.shift_remove("hydra"))
        .unwrap_or_else(Node::empty_map);
    (config, hydra)
}

fn run(cli: &Cli) -> Result<ExitCode, ConfigError> {
    if let Some(shell) = cli.shell_completion {
        print!("{}", completion_script(shell));
        return Ok(ExitCode::SUCCESS);
    }
    let setup = Setup::discover(cli)?;
    if let Some(word) = &cli.complete {
        for c in complete(&setup, word) {
            println!("{c}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let overrides = parse_overrides(&cli.overrides)?;
    let mut ctx = ResolveContext::from_process();
    // A worker started by the node launcher resolves `${now:...}` at the launcher's time: one run directory.
    if let Some(now) = std::env::var(crate::comm::NOW_ENV)
        .ok()
        .and_then(|s| parse_now(&s))
    {
        ctx.now = now;
    }
    if let Some(info) = cli.info {
        print_info(&setup, &overrides, info, cli.multirun)?;
        return Ok(ExitCode::SUCCESS);
    }
    if cli.multirun {
        return run_sweep(cli, &setup, &overrides, &ctx);
    }
    let composed = compose_with_hydra(&setup.repo, &setup.config_name, &overrides, RunMode::Run)?;
    if let Some(kind) = cli.cfg {
        print_cfg(cli, &setup, kind, &composed.config, 0, &ctx)?;
        return Ok(ExitCode::SUCCESS);
    }
    let job = run_job(&setup, composed, &cli.overrides, 0, None, &ctx)?;
    if !job.message.is_empty() {
        println!("{}", job.message);
    }
    Ok(ExitCode::SUCCESS)
}

/// A launch time from the launcher or rank 0, in its own offset (not converted to this node's zone).
fn parse_now(text: &str) -> Option<chrono::DateTime<chrono::FixedOffset>> {
    chrono::DateTime::parse_from_rfc3339(text).ok()
}

fn print_cfg(
    cli: &Cli,
    setup: &Setup,
    kind: CfgKind,
    full: &Node,
    num: usize,
    ctx: &ResolveContext,
) -> Result<(), ConfigError> {
    let (job, hydra) = split_hydra(full.clone());
    let ctx = &if cli.resolve {
        let sweep_dir = cli
            .multirun
            .then(|| setup.project_root.join("logs").join("<sweep>"));
        place_job(setup, &job, hydra.clone(), num, sweep_dir.as_deref(), ctx)?.ctx
    } else {
        ctx.clone()
    };
    let mut node = match kind {
        CfgKind::Job => job,
        CfgKind::Hydra => {
            let mut m = Node::empty_map();
            if let Some(map) = m.as_map_mut() {
                map.insert("hydra".into(), hydra);
            }
            m
        }
        CfgKind::All => full.clone(),
    };
    if cli.resolve {
        node = resolve_all(&node, ctx)?;
    }
    if let Some(key) = &cli.package {
        node = node.get(key).cloned().ok_or_else(|| {
            ConfigError::composition(format!("--package: no key '{key}' in the composed config"))
        })?;
        let mut wrapped = Node::empty_map();
        if let Some(map) = wrapped.as_map_mut() {
            map.insert(key.clone(), node);
        }
        node = wrapped;
    }
    print!("{}", yaml::to_yaml(&node));
    Ok(())
}

fn print_info(
    setup: &Setup,
    overrides: &[Override],
    kind: InfoKind,
    multirun: bool,
) -> Result<(), ConfigError> {
    let all = kind == InfoKind::All;
    if all || kind == InfoKind::Searchpath {
        println!(
            "Config search path\n------------------\n{}\n",
            setup.repo.describe()
        );
    }
    let mode = if multirun {
        RunMode::Multirun
    } else {
        RunMode::Run
    };
    let composed = compose_with_hydra(&setup.repo, &setup.config_name, overrides, mode)?;
    if all || kind == InfoKind::DefaultsTree {
        println!(
            "Defaults Tree\n-------------\n{}",
            defaults::render_tree(&composed.defaults.tree)
        );
    }
    if all || kind == InfoKind::Defaults {
        println!("Defaults List\n-------------");
        println!(
            "| {:<40} | {:<24} | {:<24} |",
            "Config path", "Package", "Parent"
        );
        for d in &composed.defaults.defaults {
            println!(
                "| {:<40} | {:<24} | {:<24} |",
                d.config_path,
                d.package,
                d.parent.clone().unwrap_or_default()
            );
        }
        println!();
    }
    if all || kind == InfoKind::Config {
        let (job, _) = split_hydra(composed.config);
        println!("Config\n------\n{}", yaml::to_yaml(&job));
    }
    Ok(())
}

/// What one job did.
pub struct JobOutcome {
    pub output_dir: PathBuf,
    pub message: String,
    /// Final `val/acc1`, shown in the sweep table.
    pub main_metric: Option<f64>,
}

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

/// Run `f` with its `tracing` output going to the console and to the run's `train.log` (scoped, so each job
/// of a sweep logs into its own directory).
fn with_run_log<T>(file: std::fs::File, f: impl FnOnce() -> T) -> T {
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
fn with_rank_log<T>(
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
    let own = open(crate::comm::launch::rank_log(output_dir, rank))?;
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

/// The node launcher's side of a distributed job: start this node's workers, wait, and report.
fn launch_node(
    cluster: crate::comm::env::Cluster,
    output_dir: &Path,
    ctx: &ResolveContext,
) -> Result<JobOutcome, ConfigError> {
    let exe = std::env::current_exe()
        .map_err(|e| ConfigError::Io(format!("cannot find this program to start workers: {e}")))?;
    let node = cluster.node_rank;
    let launch = crate::comm::launch::NodeLaunch {
        exe,
        args: std::env::args_os().skip(1).collect(),
        now: ctx.now.to_rfc3339(),
        run_dir: output_dir.to_path_buf(),
        cluster,
    };
    let started = std::time::Instant::now();
    crate::comm::launch::run_node(&launch).map_err(|e| ConfigError::Run(format!("{e:#}")))?;
    let summary = std::fs::read_to_string(output_dir.join("summary.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
    let message = match &summary {
        Some(s) => format!(
            "{}: {} after {} epochs ({} steps) on {} process(es) in {:.1}s; {}\nRun directory: {}",
            s["task_name"].as_str().unwrap_or("?"),
            s["status"].as_str().unwrap_or("?"),
            s["epochs_completed"],
            s["global_step"],
            s["devices"].as_u64().unwrap_or(1) * s["num_nodes"].as_u64().unwrap_or(1),
            started.elapsed().as_secs_f64(),
            match s["final_metrics"]["val/acc1"].as_f64() {
                Some(a) => format!("val/acc1 {a:.4}"),
                None => "no validation".to_string(),
            },
            records::display(output_dir)
        ),
        // Other nodes: rank 0 (on node 0) writes the run's records.
        None => format!(
            "node {node}: all workers finished in {:.1}s (rank 0 writes the run records on node 0)",
            started.elapsed().as_secs_f64()
        ),
    };
    Ok(JobOutcome {
        main_metric: summary.and_then(|s| s["final_metrics"]["val/acc1"].as_f64()),
        message,
        output_dir: output_dir.to_path_buf(),
    })
}

/// Run one composed job: resolve, validate against the schema, write its records.
fn run_job(
    setup: &Setup,
    composed: Composed,
    overrides: &[String],
    num: usize,
    sweep_dir: Option<&Path>,
    ctx: &ResolveContext,
) -> Result<JobOutcome, ConfigError> {
    let (job_cfg, hydra) = split_hydra(composed.config);
    let mut place = place_job(setup, &job_cfg, hydra.clone(), num, sweep_dir, ctx)?;
    let mut resolved = resolve_all(&job_cfg, &place.ctx)?;
    let mut experiment = crate::schema::extract(&resolved)?;
    let run_error = |e: anyhow::Error| ConfigError::Run(format!("{e:#}"));
    crate::trainer::check_supported(&experiment).map_err(run_error)?;
    let mut dist = None;
    if matches!(
        experiment.trainer.strategy,
        crate::schema::Strategy::Ddp | crate::schema::Strategy::Fsdp
    ) {
        let cluster = crate::comm::env::detect_from_process(
            crate::comm::devices_per_node(&experiment),
            experiment.trainer.num_nodes,
        )
        .map_err(run_error)?;
        if cluster.worker.is_none() {
            if sweep_dir.is_some() {
                return Err(ConfigError::Run(
                    "a multirun of distributed jobs: launch each job on its own (without -m), or sweep with \
                     trainer=single"
                        .into(),
                ));
            }
            return launch_node(cluster, &place.output_dir, &place.ctx);
        }
        let now = place.ctx.now.to_rfc3339();
        let (joined, agreed) = crate::comm::join(&cluster, &experiment, &now).map_err(run_error)?;
        if agreed != now {
            // Another node launched this run: use rank 0's launch time, so every rank has one run directory.
            let mut agreed_ctx = ctx.clone();
            agreed_ctx.now = parse_now(&agreed).ok_or_else(|| {
                ConfigError::Run(format!("rank 0 sent a bad launch time '{agreed}'"))
            })?;
            place = place_job(setup, &job_cfg, hydra, num, sweep_dir, &agreed_ctx)?;
            resolved = resolve_all(&job_cfg, &place.ctx)?;
            experiment = crate::schema::extract(&resolved)?;
        }
        dist = Some(joined);
    }
    let output_dir = place.output_dir.clone();
    if let Some(d) = dist.as_ref().filter(|d| !d.is_leader()) {
        // Ranks other than 0 train and log to their own file; rank 0 writes the run's records.
        std::fs::create_dir_all(&output_dir).map_err(|e| {
            ConfigError::Io(format!("could not create {}: {e}", output_dir.display()))
        })?;
        let config_yaml = yaml::to_yaml(&resolved);
        with_rank_log(&output_dir, d.rank, || {
            crate::trainer::fit_on(&experiment, &output_dir, &config_yaml, Some(d))
        })?
        .map_err(|e| ConfigError::Run(format!("rank {}: {e:#}", d.rank)))?;
        return Ok(JobOutcome {
            output_dir,
            message: String::new(),
            main_metric: None,
        });
    }
    let info = JobInfo {
        name: place.task_name,
        config_name: setup.config_name.clone(),
        num,
        mode: if sweep_dir.is_some() {
            "MULTIRUN"
        } else {
            "RUN"
        },
        output_dir: output_dir.clone(),
        overrides: overrides.to_vec(),
        choices: composed.choices.into_iter().collect(),
        resolved_hydra: place.hydra,
    };
    records::write_job_records(&info, &job_cfg, &resolved).map_err(|e| {
        ConfigError::Io(format!(
            "could not write run records in {}: {e}",
            output_dir.display()
        ))
    })?;
    let config_yaml = yaml::to_yaml(&resolved);
    if sweep_dir.is_none() {
        print!("{config_yaml}");
    }
    let run_state = records::RunState::started();
    let record_state = |state: &records::RunState| {
        state.write(&output_dir).map_err(|e| {
            ConfigError::Io(format!(
                "could not write {}: {e}",
                output_dir.join("run.json").display()
            ))
        })
    };
    record_state(&run_state)?;
    let summary = match &dist {
        Some(d) => with_rank_log(&output_dir, d.rank, || {
            crate::trainer::fit_on(&experiment, &output_dir, &config_yaml, Some(d))
        })?,
        None => {
            let log_file = std::fs::File::create(output_dir.join("train.log")).map_err(|e| {
                ConfigError::Io(format!(
                    "could not create {}: {e}",
                    output_dir.join("train.log").display()
                ))
            })?;
            with_run_log(log_file, || {
                crate::trainer::fit(&experiment, &output_dir, &config_yaml)
            })
        }
    };
    record_state(&run_state.ended(summary.as_ref().err().map(|e| format!("{e:#}"))))?;
    // Under our node launcher, the launcher reports the run (once); rank 0 stays quiet.
    let launched_here = dist.is_some() && std::env::var_os(crate::comm::NOW_ENV).is_some();
    let summary = summary.map_err(|e| {
        ConfigError::Run(format!(
            "{e:#}\n    (run directory: {})",
            records::display(&output_dir)
        ))
    })?;
    if launched_here {
        return Ok(JobOutcome {
            message: String::new(),
            main_metric: summary.final_metrics.get("val/acc1").copied(),
            output_dir,
        });
    }
    Ok(JobOutcome {
        message: format!(
            "{}: {} after {} epochs ({} steps) in {:.1}s; {}\nRun directory: {}",
            summary.task_name,
            summary.status,
            summary.epochs_completed,
            summary.global_step,
            summary.wall_time_s,
            match summary.final_metrics.get("val/acc1") {
                Some(a) => format!("val/acc1 {a:.4}"),
                None => "no validation".to_string(),
            },
            records::display(&output_dir)
        ),
        main_metric: summary.final_metrics.get("val/acc1").copied(),
        output_dir,
    })
}

fn run_sweep(
    cli: &Cli,
    setup: &Setup,
    overrides: &[Override],
    ctx: &ResolveContext,
) -> Result<ExitCode, ConfigError> {
    let master = compose_with_hydra(
        &setup.repo,
        &setup.config_name,
        overrides,
        RunMode::Multirun,
    )?;
    let params: Vec<String> = match master.config.get("hydra.sweeper.params").map(|n| &n.value) {
        Some(Value::Map(m)) => m
            .iter()
            .map(|(k, v)| format!("{k}={}", scalar_for_override(v)))
            .collect(),
        _ => Vec::new(),
    };
    let jobs = sweep::expand(&setup.repo, &params, overrides)?;
    if cli.cfg.is_some() {
        for (i, job) in jobs.iter().enumerate() {
            let parsed = parse_overrides(job)?;
            let composed =
                compose_with_hydra(&setup.repo, &setup.config_name, &parsed, RunMode::Run)?;
            if i > 0 {
                println!("---");
            }
            print_cfg(
                cli,
                setup,
                cli.cfg.unwrap_or(CfgKind::Job),
                &composed.config,
                i,
                ctx,
            )?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let (_, hydra) = split_hydra(master.config.clone());
    let (job_cfg, _) = split_hydra(master.config.clone());
    let task_name = match job_cfg.get("task_name") {
        Some(_) => resolve_path(&job_cfg, "task_name", ctx)?
            .value
            .display_python(),
        None => setup.config_name.clone(),
    };
    let stamp = ctx.now.format("%Y-%m-%d_%H-%M-%S").to_string();
    let sweep_dir = match hydra.get("sweep.dir").and_then(Node::as_str) {
        Some(d) => setup.project_root.join(d),
        None => setup
            .project_root
            .join("logs")
            .join(&task_name)
            .join("multiruns")
            .join(&stamp),
    };
    std::fs::create_dir_all(&sweep_dir)
        .map_err(|e| ConfigError::Io(format!("could not create {}: {e}", sweep_dir.display())))?;
    let mut multirun = Node::empty_map();
    if let Some(m) = multirun.as_map_mut() {
        m.insert("hydra".into(), hydra);
    }
    records::write_atomic(
        &sweep_dir.join("multirun.yaml"),
        yaml::to_yaml(&job_cfg).as_bytes(),
    )
    .map_err(|e| ConfigError::Io(e.to_string()))?;
    // The plan, before any job runs: the logbook lists every job from it, started or not.
    let mut record = records::SweepRecord::plan(&task_name, &jobs);
    let save = |record: &records::SweepRecord| {
        record.write(&sweep_dir).map_err(|e| {
            ConfigError::Io(format!(
                "could not write {}: {e}",
                sweep_dir.join(records::SweepRecord::FILE).display()
            ))
        })
    };
    save(&record)?;
    eprintln!(
        "Launching {} jobs into {}",
        jobs.len(),
        records::display(&sweep_dir)
    );
    let mut rows = Vec::new();
    let mut failed = 0;
    let mut stopped_because = None;
    for (num, job) in jobs.iter().enumerate() {
        eprintln!("#{num} : {}", job.join(" "));
        record.set_job(num, "running", None);
        save(&record)?;
        let outcome = parse_overrides(job)
            .and_then(|parsed| {
                compose_with_hydra(&setup.repo, &setup.config_name, &parsed, RunMode::Run)
            })
            .and_then(|composed| run_job(setup, composed, job, num, Some(&sweep_dir), ctx));
        record.set_job(
            num,
            if outcome.is_ok() {
                "completed"
            } else {
                "failed"
            },
            outcome.as_ref().err().map(|e| e.to_string()),
        );
        save(&record)?;
        match outcome {
            Ok(outcome) => rows.push((
                num,
                job.join(" "),
                "ok".to_string(),
                outcome
                    .main_metric
                    .map(|m| format!("val/acc1 {m:.4}"))
                    .unwrap_or_else(|| "-".into()),
            )),
            Err(e) => {
                failed += 1;
                eprintln!("Error in job #{num}: {e}");
                rows.push((num, job.join(" "), "FAILED".to_string(), "-".to_string()));
                if cli.fail_fast {
                    eprintln!("--fail-fast: stopping after the first failed job");
                    stopped_because = Some(format!("--fail-fast: job #{num} failed"));
                    break;
                }
            }
        }
    }
    record.end(stopped_because);
    save(&record)?;
    println!("| job | overrides | status | main metric |");
    println!("|---|---|---|---|");
    for (num, ov, status, metric) in &rows {
        println!("| {num} | {ov} | {status} | {metric} |");
    }
    println!("{} of {} jobs failed", failed, jobs.len());
    match crate::logbook::write_sweep_section(&sweep_dir) {
        Ok(w) => println!("Logbook section: {}", records::display(&w.markdown)),
        Err(e) => eprintln!("warning: could not write the sweep's logbook section: {e:#}"),
    }
    Ok(if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// A YAML value of `hydra.sweeper.params` as override text (`32,64,128` stays a sweep).
fn scalar_for_override(v: &Node) -> String {
    match &v.value {
        Value::Str(s) => s.clone(),
        other => other
            .display_python()
            .replace("True", "true")
            .replace("False", "false")
            .replace("None", "null"),
    }
}

/// The `--help` footer: every config group and its options.
fn groups_help(repo: &Repository) -> String {
    let mut out = String::from("Config groups (override with GROUP=OPTION):\n");
    let mut stack: Vec<String> = repo.list_groups("");
    stack.sort();
    let mut groups = Vec::new();
    while let Some(g) = stack.pop() {
        for sub in repo.list_groups(&g) {
            stack.push(format!("{g}/{sub}"));
        }
        groups.push(g);
    }
    groups.sort();
    for g in groups {
        let options = repo.group_options(&g);
        if !options.is_empty() {
            out.push_str(&format!("  {g}: {}\n", options.join(", ")));
        }
    }
    out.push_str("\nPrint the composed config with --cfg job; sweep with -m key=a,b.");
    out
}

/// Candidates for the word being completed: `group=`, `group=option`, `key.path=`.
pub fn complete(setup: &Setup, word: &str) -> Vec<String> {
    let prefix: String = word
        .chars()
        .take_while(|c| matches!(c, '+' | '~'))
        .collect();
    let body = &word[prefix.len()..];
    if let Some((key, partial)) = body.split_once('=') {
        if setup.repo.group_exists(key) {
            return setup
                .repo
                .group_options(key)
                .into_iter()
                .filter(|o| o.starts_with(partial))
                .map(|o| format!("{prefix}{key}={o}"))
                .collect();
        }
        return Vec::new();
    }
    let mut out: Vec<String> = Vec::new();
    let mut groups = setup.repo.list_groups("");
    groups.sort();
    for g in groups {
        out.push(format!("{prefix}{g}="));
    }
    if let Ok(composed) =
        compose_with_hydra(&setup.repo, &setup.config_name, &[], RunMode::Multirun)
    {
        let (job, _) = split_hydra(composed.config);
        for p in job.all_paths() {
            out.push(format!("{prefix}{p}="));
        }
    }
    out.retain(|c| c.starts_with(word));
    out.sort();
    out.dedup();
    out
}

fn completion_script(shell: Shell) -> String {
    match shell {
        Shell::Bash => r#"# bash completion for train: eval "$(train --shell-completion bash)"
_train_complete() {
    local cur="${COMP_WORDS[COMP_CWORD]}"
    COMPREPLY=($(train --complete "$cur" 2>/dev/null))
    compopt -o nospace 2>/dev/null
}
complete -F _train_complete train
"#
        .into(),
        Shell::Zsh => r#"# zsh completion for train: eval "$(train --shell-completion zsh)"
_train() {
    local -a candidates
    candidates=(${(f)"$(train --complete "${words[CURRENT]}" 2>/dev/null)"})
    compadd -S '' -- $candidates
}
compdef _train train
"#
        .into(),
        Shell::Fish => r#"# fish completion for train: train --shell-completion fish | source
complete -c train -f -a '(train --complete (commandline -ct) 2>/dev/null)'
"#
        .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker on a node in another time zone resolves `${now:...}` at rank 0's wall-clock time, as rank
    /// 0 wrote it (so both nodes name the same run directory), not converted to its own zone.
    #[test]
    fn a_launch_time_keeps_the_offset_it_was_taken_in() {
        let mut ctx = ResolveContext::from_process();
        for sent in ["2026-11-23T10:05:00+09:00", "2026-11-23T10:05:00-05:00"] {
            ctx.now = parse_now(sent).unwrap();
            let root = crate::config::yaml::parse("dir: ${now:%Y-%m-%d_%H-%M}", "t.yaml")
                .unwrap()
                .unwrap();
            let out = crate::config::interpolate::resolve_all(&root, &ctx).unwrap();
            assert_eq!(
                out.get("dir").unwrap().to_json(),
                "2026-11-23_10-05",
                "{sent}"
            );
        }
        assert!(parse_now("yesterday").is_none());
    }
}
