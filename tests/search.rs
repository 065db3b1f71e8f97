//! `hydra/sweeper=optuna` end to end on the quickstart: a real search records its trials and best values,
//! continues when rerun in its directory, prunes a bad trial through the trainer, and refuses bad input
//! before its first trial.

mod common;
use common::{real_project, summary, train};
use std::path::Path;
use std::process::Output;

/// Small and fast: a few seconds a trial.
const TINY: &[&str] = &[
    "experiment=quickstart",
    "data.train_size=128",
    "data.val_size=64",
    "model.channels=[4]",
    "trainer.max_epochs=2",
    "callbacks.model_summary=null",
];

fn run(root: &Path, extra: &[&str]) -> Output {
    let args: Vec<&str> = TINY.iter().chain(extra).copied().collect();
    train(root, &args)
}

fn text(o: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn journal(sweep: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(sweep.join("study.journal"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `(trial, state, value)` of every trial the journal told.
fn told(sweep: &Path) -> Vec<(u64, String, Option<f64>)> {
    journal(sweep)
        .iter()
        .filter(|e| e["op"] == "tell")
        .map(|e| {
            (
                e["trial"].as_u64().unwrap(),
                e["state"].as_str().unwrap().to_string(),
                e["value"].as_f64(),
            )
        })
        .collect()
}

#[test]
fn a_search_records_its_best_in_optuna_s_format_and_continues_when_rerun() {
    let p = real_project();
    let sweep = p.path().join("logs/search");
    let common = [
        "hparams_search=quickstart_optuna",
        "hydra.sweep.dir=logs/search",
        "hydra.sweeper.pruner=null",
    ];
    let mut args = common.to_vec();
    args.push("hydra.sweeper.n_trials=3");
    let out = run(p.path(), &args);
    assert!(out.status.success(), "{}", text(&out));
    let first = told(&sweep);
    assert_eq!(first.len(), 3, "{first:?}");
    // Each trial's value is its run's own val/acc1_best, read from its summary.json.
    for (n, state, value) in &first {
        assert_eq!(state, "complete");
        let s = summary(&sweep.join(n.to_string()));
        assert_eq!(s["final_metrics"]["val/acc1_best"].as_f64(), *value);
    }
    let results = std::fs::read_to_string(sweep.join("optimization_results.yaml")).unwrap();
    let best = first
        .iter()
        .filter_map(|(_, _, v)| *v)
        .fold(f64::NEG_INFINITY, f64::max);
    assert!(
        results.starts_with("name: optuna\nbest_params:\n"),
        "{results}"
    );
    for key in [
        "optimizer.lr: ",
        "data.batch_size: ",
        "optimizer.weight_decay: ",
    ] {
        assert!(results.contains(&format!("  {key}")), "{results}");
    }
    assert!(
        results.contains(&format!("best_value: {best}")),
        "{results}"
    );
    let logbook = std::fs::read_to_string(sweep.join("logbook.md")).unwrap();
    assert!(
        logbook.contains("### Search: study `quickstart`, maximize `val/acc1_best`"),
        "{logbook}"
    );
    let trial0 = std::fs::metadata(sweep.join("0/summary.json"))
        .unwrap()
        .modified()
        .unwrap();

    // Rerun with more trials: the three results are kept, two trials are added, numbered on.
    let mut args = common.to_vec();
    args.push("hydra.sweeper.n_trials=5");
    let out = run(p.path(), &args);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("3 of 5 trials have a result"),
        "{}",
        text(&out)
    );
    let second = told(&sweep);
    assert_eq!(
        second.iter().map(|t| t.0).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4]
    );
    assert_eq!(&second[..3], &first[..]);
    let again = std::fs::metadata(sweep.join("0/summary.json"))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(trial0, again, "a completed trial is not run again");
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(sweep.join("sweep.json")).unwrap()).unwrap();
    assert_eq!(record["jobs"].as_array().unwrap().len(), 5);

    // The same directory with another search is refused, naming both.
    let mut args = common.to_vec();
    args.push("hydra.sweeper.direction=minimize");
    let out = run(p.path(), &args);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("optimises Maximize val/acc1_best"),
        "{}",
        text(&out)
    );
}

/// A search whose second trial is hopeless: grid over a good and a diverging learning rate, minimising
/// the validation loss, a median pruner that judges from the first trial on.
const PRUNE_SEARCH: &str = "# @package _global_
defaults:
  - override /hydra/sweeper: optuna
  - override /hydra/sweeper/sampler: grid
optimized_metric: val/loss
hydra:
  mode: MULTIRUN
  sweeper:
    direction: minimize
    n_trials: 2
    n_jobs: 1
    sampler:
      seed: 7
    pruner:
      _target_: optuna.pruners.MedianPruner
      n_startup_trials: 1
      n_warmup_steps: 0
    params:
      optimizer.lr: choice(0.003, 0.5)
";

#[test]
fn the_median_pruner_stops_a_bad_trial_through_the_trainer_and_records_it_as_pruned() {
    let p = real_project();
    std::fs::write(
        p.path().join("conf/hparams_search/prune_test.yaml"),
        PRUNE_SEARCH,
    )
    .unwrap();
    let out = run(
        p.path(),
        &["hparams_search=prune_test", "hydra.sweep.dir=logs/prune"],
    );
    assert!(
        out.status.success(),
        "a pruned trial is no failure: {}",
        text(&out)
    );
    let sweep = p.path().join("logs/prune");
    let asked: Vec<f64> = journal(&sweep)
        .iter()
        .filter(|e| e["op"] == "ask")
        .map(|e| e["params"]["optimizer.lr"].as_f64().unwrap())
        .collect();
    assert_eq!(
        asked,
        [0.003, 0.5],
        "the grid's order under seed 7 changed; pick a seed that runs the good rate first"
    );
    let states: Vec<String> = told(&sweep).into_iter().map(|t| t.1).collect();
    assert_eq!(states, ["complete", "pruned"], "{}", text(&out));
    let s = summary(&sweep.join("1"));
    assert!(
        s["status"]
            .as_str()
            .unwrap()
            .starts_with("pruned at epoch 0"),
        "{s}"
    );
    assert_eq!(
        s["epochs_completed"], 1,
        "stopped after its first validation: {s}"
    );
    let record = std::fs::read_to_string(sweep.join("sweep.json")).unwrap();
    assert!(record.contains("\"pruned\""), "{record}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("| pruned |"),
        "{}",
        text(&out)
    );
}

#[rstest::rstest]
#[case::no_metric(&["hydra/sweeper=optuna", "optimizer.lr=interval(0.001,0.1)"], "needs `optimized_metric`")]
#[case::metric_typo(
    &["hparams_search=quickstart_optuna", "optimized_metric=val/acc_bset"],
    "Did you mean 'val/acc_best'?"
)]
#[case::direction_typo(
    &["hparams_search=quickstart_optuna", "hydra.sweeper.direction=maximise"],
    "Did you mean 'maximize'?"
)]
#[case::unknown_distribution(
    &["hparams_search=quickstart_optuna", "optimizer.lr=normal(0,1)"],
    "normal"
)]
#[case::database_storage(
    &["hparams_search=quickstart_optuna", "hydra.sweeper.storage=sqlite:///x.db"],
    "storage: null"
)]
#[case::continuous_grid(
    &["hparams_search=quickstart_optuna", "hydra/sweeper/sampler=grid", "hydra.sweeper.sampler._target_=optuna.samplers.GridSampler"],
    "GridSampler only supports discrete distributions"
)]
fn bad_searches_are_refused_before_the_first_trial(#[case] extra: &[&str], #[case] message: &str) {
    let p = real_project();
    let mut args = vec!["-m", "hydra.sweep.dir=logs/bad"];
    args.extend_from_slice(extra);
    let out = run(p.path(), &args);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(message),
        "{}",
        text(&out)
    );
    assert!(
        !p.path().join("logs/bad/0").exists(),
        "no trial may run: {}",
        text(&out)
    );
}

#[test]
fn zip_tagged_sweeps_run_in_lockstep() {
    let p = real_project();
    let out = run(
        p.path(),
        &[
            "-m",
            "hydra.sweep.dir=logs/zip",
            "trainer.max_epochs=1",
            "optimizer.lr=tag(zip, choice(0.01, 0.003))",
            "data.batch_size=tag(zip, choice(32, 64))",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let sweep = p.path().join("logs/zip");
    for (job, (lr, batch)) in [("0", ("0.01", "32")), ("1", ("0.003", "64"))] {
        let cfg = std::fs::read_to_string(sweep.join(job).join(".hydra/resolved.yaml")).unwrap();
        assert!(
            cfg.contains(&format!("lr: {lr}")) && cfg.contains(&format!("batch_size: {batch}")),
            "{cfg}"
        );
    }
    assert!(
        !sweep.join("2").exists(),
        "two jobs, not the product's four"
    );
}

#[test]
fn trials_run_in_parallel_through_the_joblib_launcher_and_report_from_their_processes() {
    let p = real_project();
    let out = run(
        p.path(),
        &[
            "hparams_search=quickstart_optuna",
            "hydra.sweep.dir=logs/parallel",
            "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2",
            "hydra.sweeper.n_jobs=2",
            "hydra.sweeper.n_trials=4",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let sweep = p.path().join("logs/parallel");
    let entries = journal(&sweep);
    let told = told(&sweep);
    assert_eq!(told.len(), 4, "{told:?}");
    for (n, state, value) in &told {
        // Every trial's process reported each validation to the shared journal.
        let reports: Vec<&serde_json::Value> = entries
            .iter()
            .filter(|e| e["op"] == "report" && e["trial"] == *n)
            .collect();
        assert!(!reports.is_empty(), "trial {n} reported nothing");
        if state == "complete" {
            assert_eq!(reports.len(), 2, "one report per epoch: {reports:?}");
            let s = summary(&sweep.join(n.to_string()));
            assert_eq!(s["final_metrics"]["val/acc1_best"].as_f64(), *value);
        }
    }
    // The first batch's two trials ran at once: two processes, each started before the other ended.
    common::assert_ran_at_once(&sweep.join("0"), &sweep.join("1"));
}

#[test]
fn failed_trials_run_again_with_their_numbers_and_values_when_the_search_is_rerun() {
    let p = real_project();
    let sweep = p.path().join("logs/retry");
    let common = [
        "hparams_search=quickstart_optuna",
        "hydra.sweep.dir=logs/retry",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.max_failure_rate=1.0",
    ];
    // Every trial fails (an image size no model takes); the search records them and fails.
    let mut args = common.to_vec();
    args.push("data.image_size=-1");
    let out = run(p.path(), &args);
    assert!(!out.status.success(), "{}", text(&out));
    let first = told(&sweep);
    assert_eq!(
        first.iter().map(|t| t.1.as_str()).collect::<Vec<_>>(),
        ["fail", "fail"]
    );
    let asked = |sweep: &Path| -> Vec<serde_json::Value> {
        journal(sweep)
            .into_iter()
            .filter(|e| e["op"] == "ask")
            .map(|e| e["params"].clone())
            .collect()
    };
    let values = asked(&sweep);

    // Fixed and rerun: the same two trials run again, nothing new is asked.
    let out = run(p.path(), &common);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("2 failed or unfinished to run again"),
        "{}",
        text(&out)
    );
    assert_eq!(asked(&sweep), values, "no new trial, the same values");
    let last: Vec<(u64, String)> = told(&sweep)[2..]
        .iter()
        .map(|t| (t.0, t.1.clone()))
        .collect();
    assert_eq!(last, [(0, "complete".into()), (1, "complete".into())]);
    let record = std::fs::read_to_string(sweep.join("sweep.json")).unwrap();
    assert!(
        !record.contains("image_size=-1"),
        "the record shows what ran: {record}"
    );
}
