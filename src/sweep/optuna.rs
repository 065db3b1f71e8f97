//! `hydra/sweeper=optuna`: a search. It asks the sampler for a batch of `n_jobs` trials, hands them to
//! the sweep's launcher as jobs (so the joblib and SLURM launchers run trials too), reads each job's
//! `optimized_metric` from its `summary.json`, tells the study, and repeats until `n_trials`. The study
//! lives in a journal file (the sweep directory's `study.journal` unless `storage` names one): rerunning
//! the command with `hydra.sweep.dir=` continues it, completed and pruned trials kept, failed and
//! unfinished ones run again under their own numbers and values.

use super::tally::Tally;
use super::{SweepInput, SweepRun, Sweeper};
use crate::config::errors::{at, did_you_mean, ConfigError};
use crate::config::grammar::{parse_override, Element, ParsedValue, Quote};
use crate::config::hydra::optuna::OptunaSettings;
use crate::config::interpolate::{resolve_path, ResolveContext};
use crate::config::tree::{Map, Node, Source, Value};
use crate::job::trial_judge::point_at;
use crate::launch::{Progress, SweepJob};
use crate::search::journal::{Entry, Journal, StudyHeader};
use crate::search::{Choice, Sampler, Study, Trial, TrialState};
use crate::storage::records::{self, JobState};
use crate::trainer::summary::{RunStatus, Summary};
use indexmap::IndexMap;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The metrics every run records (in `summary.json`'s `final_metrics`), what a search may optimise.
const METRICS: [&str; 8] = [
    "val/acc1_best",
    "val/acc1",
    "val/acc5_best",
    "val/acc5",
    "val/loss_best",
    "val/loss",
    "train/loss",
    "train/acc1",
];

/// lightning-hydra-template's names for the same metrics (its `val/acc` is top-1).
const ALIASES: [(&str, &str); 3] = [
    ("val/acc", "val/acc1"),
    ("val/acc_best", "val/acc1_best"),
    ("train/acc", "train/acc1"),
];

/// The run metric the search optimises: the top-level `optimized_metric` (as the template sets it in
/// its `hparams_search` configs), checked against what runs record before any trial runs.
pub fn optimized_metric(job_cfg: &Node, ctx: &ResolveContext) -> Result<String, ConfigError> {
    // A registered loss names its own metrics (and classification's accuracies are then not recorded).
    // So does lightning-hydra-template's module (`accuracy_names: acc`: `val/acc`, no top-5).
    let loss = crate::schema::registered_loss(job_cfg)?;
    // The run's stateful metrics (`metrics:`) too: a search may optimise `val/f1`.
    let stateful = crate::schema::read_metrics(job_cfg)?;
    let metrics =
        crate::schema::RunMetrics::named(loss.as_ref(), crate::schema::accuracy_names_of(job_cfg))
            .with_stateful(&stateful);
    let topk = metrics.is_topk_classification();
    let recorded: Vec<String> = match topk {
        false => metrics.names(),
        true => METRICS
            .iter()
            .map(|m| m.to_string())
            .chain(metrics.stateful().iter().flat_map(|(n, _)| {
                [
                    format!("val/{n}_best"),
                    format!("val/{n}"),
                    format!("train/{n}"),
                ]
            }))
            .collect(),
    };
    let known = recorded.join(", ");
    let Some(node) = job_cfg.get("optimized_metric") else {
        return Err(ConfigError::Schema(format!(
            "hydra/sweeper=optuna needs `optimized_metric`, the run metric to optimise: set it in the \
             search's config (`optimized_metric: val/acc1_best`, as lightning-hydra-template's \
             hparams_search configs do) or add it with +optimized_metric=val/loss. Runs record: {known}"
        )));
    };
    let value = resolve_path(job_cfg, "optimized_metric", ctx)?;
    let Some(name) = value.as_str().map(str::to_string) else {
        return Err(ConfigError::Schema(format!(
            "optimized_metric: expected a metric name, got '{}'; runs record: {known}{}",
            value.value.display_python(),
            at(&node.source)
        )));
    };
    if let (true, Some((_, canonical))) = (topk, ALIASES.iter().find(|(alias, _)| *alias == name)) {
        return Ok(canonical.to_string());
    }
    if recorded.contains(&name) {
        return Ok(name);
    }
    let aliases = ALIASES.iter().filter(|_| topk).map(|(a, _)| *a);
    let candidates = recorded.iter().map(String::as_str).chain(aliases);
    let hint = did_you_mean(&name, candidates)
        .map(|s| format!(" Did you mean '{s}'?"))
        .unwrap_or_default();
    Err(ConfigError::Schema(format!(
        "optimized_metric='{name}': no run records this metric, so no trial could be judged.{hint} \
         Runs record: {known}{}",
        at(&node.source)
    )))
}

/// The optuna sweeper, its settings and the metric it optimises read (and checked) from the master
/// config before anything is written.
pub struct OptunaSweeper {
    search: OptunaSettings,
    metric: String,
}

impl OptunaSweeper {
    pub fn build(input: &SweepInput) -> Result<OptunaSweeper, ConfigError> {
        let sweeper =
            crate::job::place::master_key(input.job_cfg, input.hydra, "sweeper", input.ctx)?;
        let metric = optimized_metric(input.job_cfg, input.ctx)?;
        let search = OptunaSettings::read(&sweeper, &input.job_args())?;
        Ok(OptunaSweeper { search, metric })
    }
}

impl Sweeper for OptunaSweeper {
    fn planned_jobs(&self) -> Option<&[Vec<String>]> {
        None
    }

    fn sweep(&self, run: &SweepRun) -> Result<ExitCode, ConfigError> {
        let record = super::resume::reopen(run.sweep_dir(), run.task_name)?;
        let tally = Tally::new(run.sweep_dir(), record, run.fail_fast);
        tally.save()?;
        search(run, &self.search, &self.metric, tally)
    }
}

/// The search: trials in batches through the launcher, until `n_trials` have a result.
fn search(
    run: &SweepRun,
    search: &OptunaSettings,
    metric: &str,
    mut tally: Tally,
) -> Result<ExitCode, ConfigError> {
    let (task_name, sweep_dir) = (run.task_name, run.sweep_dir());
    let journal = Journal::at(&journal_path(
        search.storage.as_deref(),
        sweep_dir,
        &run.cx.setup.project_root,
    )?);
    let header = StudyHeader {
        study_name: search
            .study_name
            .clone()
            .unwrap_or_else(|| task_name.to_string()),
        direction: search.direction,
        metric: metric.to_string(),
        space: search.space.clone(),
        pruner: search.pruner,
    };
    let mut study = open_study(&journal, &header)?;
    point_at(sweep_dir, &journal.path)?;
    recover_finished(&journal, &mut study, &mut tally, metric)?;
    let total = match search.sampler {
        Sampler::Grid { .. } => search
            .sampler
            .grid_size(&search.space)
            .unwrap_or(search.n_trials)
            .min(search.n_trials),
        _ => search.n_trials,
    };
    let mut retry: VecDeque<usize> = study
        .trials
        .iter()
        .filter(|t| matches!(t.state, TrialState::Fail | TrialState::Running))
        .map(|t| t.number)
        .collect();
    let mut next = study.trials.iter().map(|t| t.number + 1).max().unwrap_or(0);
    eprintln!(
        "Study '{}' in {} ({}, {} {}): {} of {total} trials have a result{}",
        header.study_name,
        records::display(&journal.path),
        search.sampler.name(),
        match search.direction {
            crate::search::Direction::Minimize => "minimize",
            crate::search::Direction::Maximize => "maximize",
        },
        metric,
        study.finished_count(),
        match retry.len() {
            0 => String::new(),
            n => format!("; {n} failed or unfinished to run again"),
        }
    );
    let failure = loop {
        let mut batch = Vec::new();
        while batch.len() < search.n_jobs {
            if let Some(number) = retry.pop_front() {
                batch.push(number);
                continue;
            }
            if next >= total {
                break;
            }
            let params = search.sampler.sample(&study, next);
            journal_append(
                &journal,
                &Entry::Ask {
                    trial: next,
                    params: params.clone(),
                },
            )?;
            study.add_running(next, params);
            batch.push(next);
            next += 1;
        }
        if batch.is_empty() {
            break None;
        }
        let todo: Vec<SweepJob> = batch
            .iter()
            .map(|&number| {
                let overrides =
                    trial_overrides(&study.trial(number).expect("asked").params, search);
                tally.record.add_job(number, &overrides);
                // A retried trial's earlier cluster job may still run: the launcher waits for it.
                let previous_launch_id = tally
                    .record
                    .jobs
                    .iter()
                    .find(|j| j.num == number)
                    .and_then(|j| j.launch_id.clone());
                SweepJob {
                    num: number,
                    overrides,
                    previous_launch_id,
                }
            })
            .collect();
        tally.save()?;
        run.launcher.launch(run.cx, &todo, &mut tally)?;
        study = reload(&journal)?;
        for &number in &batch {
            tell(&journal, &mut study, &mut tally, number, metric)?;
        }
        tally.save()?;
        if let Some(why) = too_many_failures(&study, search.max_failure_rate, &retry) {
            break Some(why);
        }
        if tally.stopped() {
            break None;
        }
    };
    write_results(sweep_dir, &study)?;
    if let Some(why) = failure {
        tally.stop(why.clone());
        eprintln!("{why}");
    }
    tally.finish(total)
}

/// Where the study's journal is: `storage: null` keeps it in the sweep directory; a path (or
/// `journal:`/`file:` URL) names a file, relative to the project. Optuna's database URLs are refused.
fn journal_path(
    storage: Option<&str>,
    sweep_dir: &Path,
    project_root: &Path,
) -> Result<PathBuf, ConfigError> {
    let Some(storage) = storage.filter(|s| !s.trim().is_empty()) else {
        return Ok(absolute(&sweep_dir.join("study.journal"), project_root));
    };
    let path = storage
        .strip_prefix("journal:")
        .or_else(|| storage.strip_prefix("file://"))
        .or_else(|| storage.strip_prefix("file:"))
        .unwrap_or(storage);
    if path.contains("://") {
        return Err(ConfigError::Schema(format!(
            "hydra.sweeper.storage='{storage}': trainyard keeps a study in a journal file, not in a \
             database; use storage: null (the sweep directory's study.journal) or a file path such as \
             storage: logs/studies/mnist.journal"
        )));
    }
    let path = absolute(Path::new(path), project_root);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| ConfigError::Io(format!("cannot create {}: {e}", dir.display())))?;
    }
    Ok(path)
}

fn absolute(path: &Path, root: &Path) -> PathBuf {
    match path.is_absolute() {
        true => path.to_path_buf(),
        false => root.join(path),
    }
}

fn journal_append(journal: &Journal, entry: &Entry) -> Result<(), ConfigError> {
    journal
        .append(entry)
        .map_err(|e| ConfigError::Io(format!("{e:#}")))
}

fn reload(journal: &Journal) -> Result<Study, ConfigError> {
    Ok(journal
        .load()
        .map_err(|e| ConfigError::Io(format!("{e:#}")))?
        .map(|(_, s)| s)
        .unwrap_or_default())
}

/// The study in `journal`, or a new one written there. The same journal must hold the same search
/// (name, direction, metric, space); only the pruner may change between runs.
fn open_study(journal: &Journal, header: &StudyHeader) -> Result<Study, ConfigError> {
    let existing = journal
        .load()
        .map_err(|e| ConfigError::Io(format!("{e:#}")))?;
    let Some((earlier, study)) = existing else {
        journal_append(journal, &Entry::Study(header.clone()))?;
        return Ok(Study::new(header.space.clone(), header.direction));
    };
    let shown = records::display(&journal.path);
    let differs = |what: &str, was: String, now: String| {
        ConfigError::Schema(format!(
            "the study in {shown} {what} {was}, this command {now}: a study continues only with the \
             same search. Start a new one in another hydra.sweep.dir (or storage), or rerun the \
             earlier command"
        ))
    };
    if earlier.study_name != header.study_name {
        return Err(differs(
            "is named",
            format!("'{}'", earlier.study_name),
            format!("names '{}' (hydra.sweeper.study_name)", header.study_name),
        ));
    }
    if earlier.direction != header.direction || earlier.metric != header.metric {
        return Err(differs(
            "optimises",
            format!("{:?} {}", earlier.direction, earlier.metric),
            format!("{:?} {}", header.direction, header.metric),
        ));
    }
    if earlier.space != header.space {
        let describe = |space: &IndexMap<String, crate::search::Distribution>| {
            space
                .iter()
                .map(|(k, d)| format!("{k}: {}", d.describe()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(differs(
            "searches",
            format!("{{{}}}", describe(&earlier.space)),
            format!("{{{}}}", describe(&header.space)),
        ));
    }
    if earlier.pruner != header.pruner {
        journal_append(journal, &Entry::Study(header.clone()))?;
    }
    Ok(study)
}

/// Trials the journal has as running whose job did end (the sweeper stopped between the job's end and
/// telling the study): told now from their summaries, not run again.
fn recover_finished(
    journal: &Journal,
    study: &mut Study,
    tally: &mut Tally,
    metric: &str,
) -> Result<(), ConfigError> {
    let running: Vec<usize> = study
        .trials
        .iter()
        .filter(|t| t.state == TrialState::Running)
        .map(|t| t.number)
        .collect();
    for number in running {
        let done = tally
            .record
            .jobs
            .iter()
            .any(|j| j.num == number && j.state.is_done() && j.output_dir.is_some());
        if done {
            tell(journal, study, tally, number, metric)?;
        }
    }
    Ok(())
}

/// A trial's overrides: its sampled values, then the search's fixed overrides (the plugin's order).
fn trial_overrides(params: &IndexMap<String, Choice>, search: &OptunaSettings) -> Vec<String> {
    params
        .iter()
        .map(|(k, v)| format!("{k}={}", override_text(v)))
        .chain(search.fixed.iter().cloned())
        .collect()
}

/// A sampled value as override text that reads back as the same value (a string that would read as
/// a number, or holds grammar characters, is quoted).
fn override_text(value: &Choice) -> String {
    let element = match value {
        Choice::Null => Element::Null,
        Choice::Bool(b) => Element::Bool(*b),
        Choice::Int(i) => Element::Int(*i),
        Choice::Float(x) => Element::Float(*x),
        Choice::Str(s) => {
            let bare = Element::Str {
                value: s.clone(),
                quote: Quote::None,
            }
            .to_override_string();
            let reads_back = matches!(
                parse_override(&format!("k={bare}")).map(|o| o.value),
                Ok(Some(ParsedValue::Element(Element::Str { value, .. }))) if value == *s
            );
            return match reads_back {
                true => bare,
                false => Element::Str {
                    value: s.clone(),
                    quote: Quote::Single,
                }
                .to_override_string(),
            };
        }
    };
    element.to_override_string()
}

/// Tell the study how trial `number` ended, from its job's record and `summary.json`: completed with
/// the metric's final value, pruned with its last reported one, or failed (a job without the metric
/// fails too, with the reason in the sweep's record).
fn tell(
    journal: &Journal,
    study: &mut Study,
    tally: &mut Tally,
    number: usize,
    metric: &str,
) -> Result<(), ConfigError> {
    let job = tally.record.jobs.iter().find(|j| j.num == number).cloned();
    let (state, value, error) = match job {
        Some(j) if j.state.is_done() => match j.output_dir.as_deref().map(Summary::read) {
            Some(Ok(Some(summary))) => judge_summary(
                &summary,
                study.trial(number),
                metric,
                j.output_dir.as_deref(),
            ),
            Some(Err(e)) => (TrialState::Fail, None, Some(format!("{e:#}"))),
            _ => (
                TrialState::Fail,
                None,
                Some("the job left no summary.json".to_string()),
            ),
        },
        _ => (TrialState::Fail, None, None),
    };
    journal_append(
        journal,
        &Entry::Tell {
            trial: number,
            state,
            value,
        },
    )?;
    if let Some(t) = study.trial_mut(number) {
        t.state = state;
        t.value = value;
    }
    match state {
        TrialState::Pruned => tally.record.set_job(number, JobState::Pruned, None),
        TrialState::Fail if error.is_some() => {
            eprintln!(
                "Error in trial #{number}: {}",
                error.as_deref().unwrap_or("")
            );
            tally.record.set_job(number, JobState::Failed, error);
        }
        _ => {}
    }
    Ok(())
}

fn judge_summary(
    summary: &Summary,
    trial: Option<&Trial>,
    metric: &str,
    dir: Option<&Path>,
) -> (TrialState, Option<f64>, Option<String>) {
    if let RunStatus::Pruned(_) = summary.status {
        let last = trial
            .and_then(Trial::last_intermediate)
            .map(|(_, v)| v)
            .or_else(|| summary.final_metrics.get(metric).copied());
        return (TrialState::Pruned, last, None);
    }
    match summary.final_metrics.get(metric) {
        Some(v) if !v.is_nan() => (TrialState::Complete, Some(*v), None),
        Some(_) => (
            TrialState::Fail,
            None,
            Some(format!("optimized_metric {metric} is NaN")),
        ),
        None => {
            let recorded: Vec<&str> = summary.final_metrics.keys().map(String::as_str).collect();
            (
                TrialState::Fail,
                None,
                Some(format!(
                    "optimized_metric {metric} is not in {}: the run recorded {} (did it validate? \
                     val/ metrics need a validation set and a validation epoch)",
                    dir.map(|d| records::display(&d.join(Summary::FILE)))
                        .unwrap_or_default(),
                    recorded.join(", ")
                )),
            )
        }
    }
}

/// hydra-optuna-sweeper's `max_failure_rate`: the search stops once failed trials are more than this
/// share of the trials with an outcome (the default 0.0 stops at the first failure). Trials of an earlier
/// attempt still waiting to run again (`pending`) are not counted.
fn too_many_failures(
    study: &Study,
    max_failure_rate: f64,
    pending: &VecDeque<usize>,
) -> Option<String> {
    let outcomes = study
        .trials
        .iter()
        .filter(|t| t.state != TrialState::Running && !pending.contains(&t.number));
    let (told, failed) = outcomes.fold((0, 0), |(n, f), t| {
        (n + 1, f + usize::from(t.state == TrialState::Fail))
    });
    let rate = failed as f64 / told.max(1) as f64;
    (failed > 0 && rate > max_failure_rate).then(|| {
        format!(
            "Failed trials {failed} of {told} ({:.0}%) exceed hydra.sweeper.max_failure_rate={max_failure_rate}; \
             the search stops here (rerun with hydra.sweep.dir= to retry the failed trials)",
            rate * 100.0
        )
    })
}

/// Optuna's `optimization_results.yaml`: `name`, `best_params`, `best_value` (written when a trial
/// completed; printed as the plugin logs it).
fn write_results(sweep_dir: &Path, study: &Study) -> Result<(), ConfigError> {
    let Some(best) = study.best_trial() else {
        eprintln!("No trial completed: there is no best value yet");
        return Ok(());
    };
    let value = best.value.expect("a completed trial has a value");
    let scalar = |v: Value| Node::new(v, Source::Internal);
    let mut params = Map::new();
    for (k, v) in &best.params {
        params.insert(
            k.clone(),
            scalar(match v {
                Choice::Null => Value::Null,
                Choice::Bool(b) => Value::Bool(*b),
                Choice::Int(i) => Value::Int(*i),
                Choice::Float(x) => Value::Float(*x),
                Choice::Str(s) => Value::Str(s.clone()),
            }),
        );
    }
    let mut root = Map::new();
    root.insert("name".into(), scalar(Value::Str("optuna".into())));
    root.insert("best_params".into(), scalar(Value::Map(params)));
    root.insert("best_value".into(), scalar(Value::Float(value)));
    let path = sweep_dir.join("optimization_results.yaml");
    records::write_atomic(
        &path,
        crate::config::yaml::to_yaml(&scalar(Value::Map(root))).as_bytes(),
    )
    .map_err(|e| ConfigError::Io(format!("cannot write {}: {e}", path.display())))?;
    let shown: Vec<String> = best
        .params
        .iter()
        .map(|(k, v)| format!("{k}: {}", override_text(v)))
        .collect();
    println!(
        "Best parameters (trial #{}): {{{}}}",
        best.number,
        shown.join(", ")
    );
    println!("Best value: {value}");
    println!("Results: {}", records::display(&path));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case(Choice::Int(3), "3")]
    #[case(Choice::Float(0.001), "0.001")]
    #[case(Choice::Float(2.0), "2.0")]
    #[case(Choice::Bool(true), "True")]
    #[case(Choice::Str("adam".into()), "adam")]
    #[case(Choice::Str("12".into()), "'12'")]
    #[case(Choice::Str("a b,c".into()), r"a\ b\,c")]
    fn sampled_values_read_back_as_themselves(#[case] value: Choice, #[case] text: &str) {
        assert_eq!(override_text(&value), text);
    }

    #[rstest]
    #[case(None, "logs/x/multiruns/1/study.journal")]
    #[case(Some("studies/a.journal"), "studies/a.journal")]
    #[case(Some("journal:studies/b.journal"), "studies/b.journal")]
    #[case(Some("file://ROOT/abs/c.journal"), "abs/c.journal")]
    fn storage_names_a_journal_file(#[case] storage: Option<&str>, #[case] want: &str) {
        let root = tempfile::tempdir().unwrap();
        let storage = storage.map(|s| s.replace("ROOT", &root.path().display().to_string()));
        let got = journal_path(
            storage.as_deref(),
            Path::new("logs/x/multiruns/1"),
            root.path(),
        );
        assert_eq!(got.unwrap(), root.path().join(want));
    }

    #[test]
    fn database_storage_is_refused_with_the_fix() {
        let err = journal_path(
            Some("sqlite:///example.db"),
            Path::new("s"),
            Path::new("/tmp"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("sqlite:///example.db") && err.contains("storage: null"),
            "{err}"
        );
    }

    #[test]
    fn failure_rate_stops_at_the_first_failure_by_default() {
        let mut study = Study::new(IndexMap::new(), crate::search::Direction::Minimize);
        for n in 0..4 {
            study.add_running(n, IndexMap::new());
            study.trial_mut(n).unwrap().state = TrialState::Complete;
        }
        let none = VecDeque::new();
        assert!(too_many_failures(&study, 0.0, &none).is_none());
        study.trial_mut(3).unwrap().state = TrialState::Fail;
        assert!(too_many_failures(&study, 0.0, &none).is_some());
        assert!(too_many_failures(&study, 0.25, &none).is_none());
        assert!(too_many_failures(&study, 0.2, &none).is_some());
        // A failure of an earlier attempt that waits to run again does not stop the rerun.
        assert!(too_many_failures(&study, 0.0, &VecDeque::from([3])).is_none());
    }
}
