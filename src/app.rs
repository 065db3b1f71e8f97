//! From what the user typed to what happens: `train logbook ...` writes the logbook, `train export ...`
//! writes a TorchScript run's trained module (`export`), `train eval ...` is a run with `train=false
//! test=true` (lightning-hydra-template's `eval.py`); otherwise find the
//! project (`project`), then complete (`--shell-completion`, `--complete`), look (`--cfg`, `--info`:
//! `introspect`) or run one job or a sweep (`launcher`).

use crate::cli::Cli;
use crate::config::compose::RunMode;
use crate::config::errors::ConfigError;
use crate::config::hydra::{compose_with_hydra, parse_overrides};
use crate::config::interpolate::ResolveContext;
use crate::introspect::{
    complete, completion_script, groups_help, print_cfg, print_info, CfgPrint,
};
use crate::job::run::{parse_now, run_job};
use crate::project::{find_project, ConfigLocation, Setup};
use crate::storage::records;
use crate::sweep::run_sweep;
use clap::{CommandFactory, FromArgMatches, Parser};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

/// mimalloc v2's `mi_option_purge_delay`: -1 keeps freed pages mapped, so the next step's buffers of the
/// same size do not fault in and zero fresh pages (10% of a ResNet step otherwise).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// The whole `train` program (what `trainyard::main!()` expands to call): process-wide settings made
/// before any thread exists, then `main_entry` over the command line.
pub fn run_main() -> ExitCode {
    // SAFETY: sets a process-wide allocator option before any worker thread exists.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    keep_libtorch_heap();
    // Where our SIMD kernels run (every heavy op of the CNN, ResNet and ViT), Candle's own elementwise
    // thread pool only competes with rayon's workers for the cores: its few remaining ops run on the
    // calling thread instead (ViT-Tiny step ~3% faster, ResNet unchanged). A value the user set wins.
    let simd = !matches!(
        trainyard_conv::Isa::detected(),
        trainyard_conv::Isa::Portable8 | trainyard_conv::Isa::Portable16
    );
    let direct_off = std::env::var("TRAINYARD_CONV").as_deref() == Ok("im2col");
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() && simd && !direct_off {
        // Before any thread exists (nothing has started one yet), so no other thread reads the environment.
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
    main_entry(std::env::args_os())
}

/// libtorch allocates through the C heap (glibc), which hands blocks over its dynamic threshold back to
/// the kernel when freed: every step's parameter-sized tensors (gradients, optimizer temporaries) were
/// then fresh pages to fault in again (ResNet-18's CPU step: 84 instead of 98 ms with the heap kept, SGD's
/// update 16 instead of 28 ms). Blocks up to 32 MiB come from the heap, and freed memory is not trimmed.
fn keep_libtorch_heap() {
    #[cfg(all(feature = "torch", target_os = "linux", target_env = "gnu"))]
    // SAFETY: glibc's mallopt, called before any thread allocates through the C heap.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}

/// `train`'s `main`, for this crate's binary and for a user's crate that registers its own models
/// (`registry`): the allocator trainyard measures memory with (mimalloc, counted for the batch-size
/// finder), and `app::run_main`.
#[macro_export]
macro_rules! main {
    () => {
        /// Training allocates and frees activation-sized buffers every step; mimalloc reuses them instead
        /// of handing pages back to the kernel and faulting them in again. The counting wrapper measures
        /// heap use for the batch-size finder.
        #[global_allocator]
        static ALLOCATOR: $crate::platform::memory::Counting<$crate::mimalloc::MiMalloc> =
            $crate::platform::memory::Counting($crate::mimalloc::MiMalloc);

        fn main() -> ::std::process::ExitCode {
            $crate::app::run_main()
        }
    };
}

/// Entry point used by `main`: never panics on user input, prints one clear error and exits non-zero.
pub fn main_entry(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    match try_main(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("Error: {e}");
            ExitCode::from(1)
        }
    }
}

/// `main_entry` with its error returned rather than printed (for a crate's tests of its own config).
/// Command-line syntax errors and `--help` are clap's, printed as usual.
pub fn try_main(args: impl IntoIterator<Item = OsString>) -> Result<ExitCode, String> {
    let mut args = crate::cli::normalize_args(args);
    let wants_help = args.iter().skip(1).any(|a| a == "--help" || a == "-h");
    let mut eval = false;
    if args.get(1).is_some_and(|a| a == "eval") {
        // lightning-hydra-template's `src/eval.py`: test the model of `ckpt_path`, train nothing.
        args.remove(1);
        args.extend(["++train=false".into(), "++test=true".into()]);
        eval = true;
    }
    let mut predict = false;
    if args.get(1).is_some_and(|a| a == "predict") {
        // Lightning's `trainer.predict`: the `predict` node first, so that `predict.output=...` given on
        // the command line overrides its defaults; training and testing off, last, so nothing re-enables
        // them.
        args.remove(1);
        args.insert(1, "++predict.split=test".into());
        args.insert(2, "++predict.output=predictions.csv".into());
        args.extend(["++train=false".into(), "++test=false".into()]);
        predict = true;
    }
    if args.get(1).is_some_and(|a| a == "init") {
        return crate::project::init::run(&args[2..]).map_err(|e| format!("{e:#}"));
    }
    if args.get(1).is_some_and(|a| a == "logbook") {
        return Ok(logbook_entry(&args[2..]));
    }
    if args.get(1).is_some_and(|a| a == "export") {
        return crate::export::run(&args[2..]).map_err(|e| format!("{e:#}"));
    }
    if args.get(1).is_some_and(|a| a == "pack") {
        return crate::pack::run(&args[2..]).map_err(|e| format!("{e:#}"));
    }
    let mut command = Cli::command();
    if wants_help {
        let groups = match Setup::discover(&ConfigLocation::default()) {
            Ok(setup) => {
                let plugins = [
                    ("Sweepers", "hydra/sweeper", crate::sweep::names()),
                    ("Launchers", "hydra/launcher", crate::launch::names()),
                ];
                groups_help(&setup.repo, &plugins)
            }
            Err(e) => format!("(config groups not listed: {e})"),
        };
        command = if eval {
            command
                .name("train eval")
                .about(crate::cli::EVAL_ABOUT)
                .after_help(groups)
        } else if predict {
            command
                .name("train predict")
                .about(crate::cli::PREDICT_ABOUT)
                .after_help(groups)
        } else {
            command.after_help(format!("{}\n\n{groups}", crate::cli::COMMANDS))
        };
    }
    let matches = match command.try_get_matches_from(&args) {
        Ok(m) => m,
        Err(e) => {
            let _ = e.print();
            return Ok(ExitCode::from(if e.use_stderr() { 2 } else { 0 }));
        }
    };
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return Ok(ExitCode::from(2));
        }
    };
    match run(&cli) {
        Err(ConfigError::NodeMissing(message)) => {
            eprintln!("Error: {message}");
            Ok(ExitCode::from(crate::comm::EXIT_NODE_MISSING))
        }
        Err(ConfigError::CollectiveTimeout(message)) => {
            eprintln!("Error: {message}");
            Ok(ExitCode::from(crate::comm::EXIT_COLLECTIVE_TIMEOUT))
        }
        other => other.map_err(|e| e.to_string()),
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
            .and_then(|cwd| find_project(&cwd).ok().flatten())
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

/// What a launch runs: one job (already composed), or a sweep.
enum Invocation {
    Single(Box<crate::config::compose::Composed>),
    Sweep,
}

/// Hydra's `get_mode` and `_run_app`: a config may make every launch a sweep (`hydra.mode: MULTIRUN`, as
/// Optuna presets do); `--multirun` wins over a configured `RUN`, with a warning. A single run is composed
/// once; only a run that fails to compose (a sweep override without `-m`) or asks for a sweep is composed
/// again as a sweep's master config.
fn decide_launch(
    cli: &Cli,
    setup: &Setup,
    overrides: &[crate::config::grammar::Override],
) -> Result<Invocation, ConfigError> {
    let configured = || {
        compose_with_hydra(
            &setup.repo,
            &setup.config_name,
            overrides,
            RunMode::Multirun,
        )
        .ok()
        .and_then(|c| configured_mode(&c.config))
    };
    if cli.multirun {
        if configured() == Some(RunMode::Run) {
            eprintln!("warning: running with --multirun, overriding the config's hydra.mode=RUN");
        }
        return Ok(Invocation::Sweep);
    }
    let composed = compose_with_hydra(&setup.repo, &setup.config_name, overrides, RunMode::Run);
    // `--cfg` without `-m` prints the one job's config, as Hydra's `show_cfg` composes it, even where
    // the config asks for a sweep (`hydra.mode: MULTIRUN`, as the template's `hparams_search` does).
    if cli.cfg.is_some() {
        return Ok(Invocation::Single(Box::new(composed?)));
    }
    match composed {
        Ok(c) if configured_mode(&c.config) == Some(RunMode::Multirun) => Ok(Invocation::Sweep),
        Ok(c) => Ok(Invocation::Single(Box::new(c))),
        Err(_) if configured() == Some(RunMode::Multirun) => Ok(Invocation::Sweep),
        Err(e) => Err(e),
    }
}

/// The `hydra.mode` a composed config sets, if any.
fn configured_mode(config: &crate::config::tree::Node) -> Option<RunMode> {
    match config.get("hydra.mode").and_then(|n| n.as_str()) {
        Some("RUN") => Some(RunMode::Run),
        Some("MULTIRUN") => Some(RunMode::Multirun),
        _ => None,
    }
}

/// Where the command line says configs come from.
fn config_source(cli: &Cli) -> ConfigLocation {
    ConfigLocation {
        config_path: cli.config_path.clone(),
        config_name: cli.config_name.clone(),
        config_dir: cli.config_dir.clone(),
    }
}

/// What `--cfg` asks to print, if it is given.
fn cfg_print(cli: &Cli) -> Option<CfgPrint> {
    cli.cfg.map(|kind| CfgPrint {
        kind,
        resolve: cli.resolve,
        package: cli.package.clone(),
    })
}

fn run(cli: &Cli) -> Result<ExitCode, ConfigError> {
    if let Some(shell) = cli.shell_completion {
        print!("{}", completion_script(shell));
        return Ok(ExitCode::SUCCESS);
    }
    if cli.info == Some(crate::cli::InfoKind::Schema) {
        print!("{}", crate::schema::reference::reference_markdown());
        return Ok(ExitCode::SUCCESS);
    }
    let setup = Setup::discover(&config_source(cli))?;
    if let Some(word) = &cli.complete {
        for c in complete(&setup, word) {
            println!("{c}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    // Said once per command: not again by the jobs and workers it starts.
    let started_by_train =
        cli.sweep_job.is_some() || std::env::var_os(crate::comm::NOW_ENV).is_some();
    if let (Some(notice), false) = (setup.shipped_notice(), started_by_train) {
        eprintln!("{notice}");
    }
    let overrides = parse_overrides(&cli.overrides)?;
    let mut ctx = ResolveContext::from_process();
    // A process started by a launcher (a worker, a supervised run) notes a stop signal from its very start:
    // one passed on while it starts up is acted on at its first step, not fatal.
    if std::env::var_os(crate::comm::NOW_ENV).is_some() {
        if let Err(e) = crate::platform::signals::arm_preemption(std::time::Duration::from_secs(25))
        {
            tracing::warn!("could not catch SIGTERM/SIGUSR1: {e}");
        }
    }
    // A worker started by the node launcher resolves `${now:...}` at the launcher's time: one run directory.
    if let Some(now) = std::env::var(crate::comm::NOW_ENV)
        .ok()
        .and_then(|s| parse_now(&s))
    {
        ctx.now = now;
    }
    if let (Some(num), Some(dir)) = (cli.sweep_job, &cli.sweep_dir) {
        return crate::job::in_sweep::run_sweep_job(&setup, num, dir, &cli.overrides, &ctx);
    }
    if let Some(info) = cli.info {
        print_info(&setup, &overrides, info, cli.multirun)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut composed = match decide_launch(cli, &setup, &overrides)? {
        Invocation::Single(composed) => {
            for warning in composed.defaults.dropped_warnings(&setup.repo) {
                eprintln!("{warning}");
            }
            *composed
        }
        Invocation::Sweep => {
            let mut overrides = overrides;
            overrides.extend(parse_overrides(&["hydra.mode=MULTIRUN".to_string()])?);
            if let Some(print) = cfg_print(cli) {
                // `--cfg ... -m`: each job's config, as it would run.
                let jobs = crate::sweep::cfg_jobs(&setup, &overrides, &ctx, print.resolve)?;
                for (i, (config, job_ctx)) in jobs.iter().enumerate() {
                    if i > 0 {
                        println!("---");
                    }
                    print_cfg(&print, config, job_ctx)?;
                }
                return Ok(ExitCode::SUCCESS);
            }
            return run_sweep(cli.fail_fast, &setup, &overrides, &ctx);
        }
    };
    if configured_mode(&composed.config).is_none() {
        // What composing with `hydra.mode=RUN` appended would give, without composing twice.
        crate::config::hydra::runtime::record_mode(&mut composed.config, RunMode::Run);
    }
    if let Some(print) = cfg_print(cli) {
        print_cfg(&print, &composed.config, &ctx)?;
        return Ok(ExitCode::SUCCESS);
    }
    let job = run_job(&setup, composed, &cli.overrides, None, &ctx)?;
    if !job.message.is_empty() {
        println!("{}", job.message);
    }
    if job.preempted {
        return Ok(crate::job::outcome::preempted_exit_code());
    }
    Ok(ExitCode::SUCCESS)
}
