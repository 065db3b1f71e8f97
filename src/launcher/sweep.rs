//! Hydra's BasicSweeper with its BasicLauncher: expand the sweep into jobs (leftmost override slowest), write
//! `multirun.yaml` and the plan (`sweep.json`), run the jobs one after another, and end with a table and
//! the sweep's logbook section.

use super::job::run_job;
use crate::cli::{CfgKind, Cli};
use crate::config::compose::RunMode;
use crate::config::errors::ConfigError;
use crate::config::grammar::Override;
use crate::config::hydra::runtime::is_hydra_override;
use crate::config::hydra::{compose_with_hydra, parse_overrides, split_hydra, HydraSettings};
use crate::config::interpolate::{resolve_path, ResolveContext};
use crate::config::sweep;
use crate::config::tree::{Node, Value};
use crate::config::yaml;
use crate::introspect::print_cfg;
use crate::project::Setup;
use crate::records;
use std::process::ExitCode;

pub fn run_sweep(
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
    // Every job is composed with the sweep's Hydra overrides first, then its own (Hydra's load_sweep_config).
    let hydra_overrides: Vec<String> = overrides
        .iter()
        .filter(|o| is_hydra_override(o))
        .map(|o| o.input.clone())
        .collect();
    let job_overrides = |job: &[String]| {
        let texts: Vec<String> = hydra_overrides.iter().chain(job).cloned().collect();
        parse_overrides(&texts)
    };
    if cli.cfg.is_some() {
        for (i, job) in jobs.iter().enumerate() {
            let parsed = job_overrides(job)?;
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
    let (job_cfg, hydra) = split_hydra(master.config.clone());
    let settings = HydraSettings::read(&hydra)?;
    check_sweeper(&settings)?;
    let task_name = match job_cfg.get("task_name") {
        Some(_) => resolve_path(&job_cfg, "task_name", ctx)?
            .value
            .display_python(),
        None => setup.config_name.clone(),
    };
    let sweep_dir = super::place::sweep_dir(setup, &job_cfg, &hydra, ctx)?;
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
        record.set_job(num, records::JobState::Running, None);
        save(&record)?;
        let outcome = job_overrides(job)
            .and_then(|parsed| {
                compose_with_hydra(&setup.repo, &setup.config_name, &parsed, RunMode::Run)
            })
            .and_then(|composed| run_job(setup, composed, job, num, Some(&sweep_dir), ctx));
        record.set_job(
            num,
            match outcome {
                Ok(_) => records::JobState::Completed,
                Err(_) => records::JobState::Failed,
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

/// Only Hydra's basic sweeper and launcher run here so far; another choice is refused before any job runs.
fn check_sweeper(settings: &HydraSettings) -> Result<(), ConfigError> {
    if settings.sweeper != "basic" {
        return Err(ConfigError::composition(format!(
            "hydra/sweeper={}: trainyard runs Hydra's basic sweeper (grid sweeps over `a=1,2 b=x,y` and \
             hydra.sweeper.params); the {} sweeper is not supported yet. Use `override hydra/sweeper: basic` \
             or sweep with comma lists.",
            settings.sweeper, settings.sweeper
        )));
    }
    if settings.launcher != "basic" {
        return Err(ConfigError::composition(format!(
            "hydra/launcher={}: trainyard launches a sweep's jobs one after another (Hydra's basic launcher); \
             the {} launcher is not supported yet.",
            settings.launcher, settings.launcher
        )));
    }
    Ok(())
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
