//! A project's own optimizer and learning-rate schedule (`trainyard::registry`), written as
//! lightning-hydra-template writes `torch.optim.*` nodes (`_target_`, `_partial_: true`): this test binary
//! registers a plain SGD rule, Lion (with a state slot) and a warm-up schedule, as a user's crate does,
//! then trains through trainyard's whole command line (`app::main_entry`, in this process). The rule is
//! applied at every step with the scheduled rate (plain SGD equals the built-in SGD to the bit), its
//! state is checkpointed and resumed exactly, and bad input fails at its key and place.

mod common;

use std::path::{Path, PathBuf};
use trainyard::registry::{
    LrSchedule, OptimizerRule, OptimizerStep, ParamState, RuleTensor, ScheduleContext,
};

/// `p ← p − lr·g`: what torch.optim.SGD does without momentum or decay.
struct PlainSgd;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

fn plain_sgd(_: NoArgs) -> anyhow::Result<PlainSgd> {
    Ok(PlainSgd)
}

impl OptimizerRule for PlainSgd {
    fn slots(&self) -> Vec<&'static str> {
        Vec::new()
    }
    fn update<T: RuleTensor>(
        &self,
        p: &T,
        grad: &T,
        _: &mut ParamState<'_, T>,
        step: &OptimizerStep,
    ) -> anyhow::Result<T> {
        p.minus(&grad.affine(step.lr, 0.0)?)
    }
}

trainyard::register_optimizer!("tests.optim.PlainSgd", plain_sgd);

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LionArgs {
    #[serde(default = "lion_betas")]
    betas: [f64; 2],
    #[serde(default)]
    weight_decay: f64,
}

fn lion_betas() -> [f64; 2] {
    [0.9, 0.99]
}

/// Lion (Chen et al. 2023, as lucidrains/lion-pytorch writes it): the sign of an interpolation of the
/// momentum and the gradient, with decoupled weight decay; one slot, `exp_avg`.
struct Lion(LionArgs);

fn lion(args: LionArgs) -> anyhow::Result<Lion> {
    anyhow::ensure!(
        args.betas.iter().all(|b| (0.0..1.0).contains(b)),
        "betas must lie in [0, 1), got {:?}",
        args.betas
    );
    Ok(Lion(args))
}

impl OptimizerRule for Lion {
    fn slots(&self) -> Vec<&'static str> {
        vec!["exp_avg"]
    }
    fn update<T: RuleTensor>(
        &self,
        p: &T,
        grad: &T,
        state: &mut ParamState<'_, T>,
        step: &OptimizerStep,
    ) -> anyhow::Result<T> {
        let [b1, b2] = self.0.betas;
        let m = match state.get("exp_avg") {
            Some(m) => m.duplicate(),
            None => grad.affine(0.0, 0.0)?,
        };
        let c = m.affine(b1, 0.0)?.plus(&grad.affine(1.0 - b1, 0.0)?)?;
        let decayed = p.affine(1.0 - step.lr * self.0.weight_decay, 0.0)?;
        let new_p = decayed.minus(&c.signum()?.affine(step.lr, 0.0)?)?;
        state.set(
            "exp_avg",
            m.affine(b2, 0.0)?.plus(&grad.affine(1.0 - b2, 0.0)?)?,
        )?;
        Ok(new_p)
    }
}

trainyard::register_optimizer!("tests.optim.Lion", lion);

/// A rule that keeps state it did not declare: refused when it sets it.
struct Undeclared;

fn undeclared(_: NoArgs) -> anyhow::Result<Undeclared> {
    Ok(Undeclared)
}

impl OptimizerRule for Undeclared {
    fn slots(&self) -> Vec<&'static str> {
        Vec::new()
    }
    fn update<T: RuleTensor>(
        &self,
        p: &T,
        grad: &T,
        state: &mut ParamState<'_, T>,
        _: &OptimizerStep,
    ) -> anyhow::Result<T> {
        state.set("velocity", grad.owned_copy()?)?;
        Ok(p.duplicate())
    }
}

trainyard::register_optimizer!("tests.optim.Undeclared", undeclared);

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct WarmupArgs {
    warmup_steps: u64,
    #[serde(default)]
    poisoned_after: Option<u64>,
}

/// Linear warm-up to the base rate over `warmup_steps`, then linear decay to 0 at the run's end; a rate
/// of NaN after `poisoned_after` (to test the refusal).
struct Warmup(WarmupArgs);

fn warmup(args: WarmupArgs) -> anyhow::Result<Warmup> {
    anyhow::ensure!(args.warmup_steps > 0, "warmup_steps must be at least 1");
    Ok(Warmup(args))
}

impl LrSchedule for Warmup {
    fn lr(&self, step: u64, run: &ScheduleContext) -> f64 {
        if self.0.poisoned_after.is_some_and(|k| step > k) {
            return f64::NAN;
        }
        let w = self.0.warmup_steps;
        if step < w {
            return run.base_lr * (step + 1) as f64 / w as f64;
        }
        let left = run.total_steps.saturating_sub(step) as f64;
        run.base_lr * left / run.total_steps.saturating_sub(w).max(1) as f64
    }
}

trainyard::register_schedule!("tests.schedules.Warmup", warmup);

/// The project's own group options, as its `conf/` would hold them (given with `-cd`).
const OPTIONS: &[(&str, &str)] = &[
    (
        "optimizer/plain_sgd.yaml",
        "_target_: tests.optim.PlainSgd\n_partial_: true\nlr: 0.05\n",
    ),
    (
        "optimizer/lion.yaml",
        "_target_: tests.optim.Lion\n_partial_: true\nlr: 0.002\nbetas: [0.9, 0.99]\nweight_decay: 0.1\n",
    ),
    (
        "optimizer/undeclared.yaml",
        "_target_: tests.optim.Undeclared\nlr: 0.1\n",
    ),
    (
        "scheduler/warmup.yaml",
        "_target_: tests.schedules.Warmup\n_partial_: true\nwarmup_steps: 5\n",
    ),
];

/// A small CNN on generated images (trainyard's quick start, shrunk; the tests run in the crate's root,
/// whose conf/ and experiments/ are the project's), with the options above and `extra` overrides.
fn args(dir: &Path, run: &Path, extra: &[&str]) -> Vec<String> {
    let options = dir.join("options");
    for (file, text) in OPTIONS {
        let path = options.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let mut args: Vec<String> = vec![
        "train".into(),
        "-cd".into(),
        options.display().to_string(),
        "experiment=quickstart".into(),
        "data.train_size=256".into(),
        "data.val_size=64".into(),
        "data.num_workers=0".into(),
        "model.channels=[8,16]".into(),
        "callbacks.model_summary=null".into(),
        "trainer.max_epochs=2".into(),
        "trainer.log_every_n_steps=1".into(),
        "trainer.deterministic=true".into(),
        format!("hydra.run.dir={}", run.display()),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// Train in this process (where the rules are registered); the run directory.
fn train(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let run = dir.join(name);
    let code =
        trainyard::app::main_entry(args(dir, &run, extra).iter().map(std::ffi::OsString::from));
    assert_eq!(
        code,
        std::process::ExitCode::SUCCESS,
        "train {}",
        extra.join(" ")
    );
    run
}

/// The error of a run that fails (in this process, where the rules are registered).
fn refused(extra: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let args = args(dir.path(), &dir.path().join("r"), extra);
    match trainyard::app::try_main(args.iter().map(std::ffi::OsString::from)) {
        Err(e) => e,
        Ok(code) => panic!("{extra:?} was accepted ({code:?})"),
    }
}

#[rstest::rstest]
#[case::candle("backend=candle")]
#[cfg_attr(feature = "torch", case::tch("backend=tch"))]
fn a_registered_rule_is_applied_at_every_step_with_the_scheduled_rate(#[case] backend: &str) {
    let dir = tempfile::tempdir().unwrap();
    // (quickstart sets optimizer.lr, over the option's)
    let own = train(
        dir.path(),
        "own",
        &[
            backend,
            "optimizer=plain_sgd",
            "optimizer.lr=0.05",
            "scheduler=warmup",
        ],
    );
    // The same rule, built in: torch.optim.SGD without momentum, under the same schedule.
    let builtin = train(
        dir.path(),
        "builtin",
        &[
            backend,
            "optimizer=sgd",
            "optimizer.lr=0.05",
            "optimizer.momentum=0",
            "optimizer.nesterov=false",
            "optimizer.weight_decay=0",
            "scheduler=warmup",
        ],
    );
    let (a, b) = (common::weights(&own), common::weights(&builtin));
    assert_eq!(common::worst_relative_difference(&a, &b), 0.0);
    // It trained: the weights left where a rate of 0 keeps them.
    let frozen = train(
        dir.path(),
        "frozen",
        &[
            backend,
            "optimizer=plain_sgd",
            "optimizer.lr=1e-30",
            "scheduler=warmup",
        ],
    );
    let moved = common::worst_relative_difference(&a, &common::weights(&frozen));
    assert!(moved > 1e-3, "the weights moved only {moved:e}");
    // The logged rate is the schedule's: warm-up over 5 steps, then down to 0 at the run's end (8
    // steps: 256 samples in batches of 64, two epochs).
    let mut rates: Vec<(u64, f64)> = Vec::new();
    for row in common::csv_rows(&own) {
        let value = |key: &str| {
            row.iter()
                .find(|(k, _)| k.starts_with(key))
                .map(|(_, v)| *v)
        };
        if let (Some(step), Some(lr)) = (value("step"), value("lr")) {
            // An epoch's end row repeats its last step's.
            if rates.last().is_none_or(|(s, _)| *s != step as u64) {
                rates.push((step as u64, lr));
            }
        }
    }
    let rates: Vec<f64> = rates.into_iter().map(|(_, lr)| lr).collect();
    let want = [
        0.01,
        0.02,
        0.03,
        0.04,
        0.05,
        0.05 * 3.0 / 3.0,
        0.05 * 2.0 / 3.0,
        0.05 / 3.0,
    ];
    assert_eq!(rates.len(), want.len(), "logged rates {rates:?}");
    for (got, want) in rates.iter().zip(want) {
        assert!((got - want).abs() < 1e-9, "logged rates {rates:?}");
    }
}

#[rstest::rstest]
#[case::candle("backend=candle")]
#[cfg_attr(feature = "torch", case::tch("backend=tch"))]
fn a_rule_with_state_saves_it_and_resumes_exactly(#[case] backend: &str) {
    let dir = tempfile::tempdir().unwrap();
    // A constant rate: the first epoch is then the same whether the run is to last one epoch or three.
    let lion = [backend, "optimizer=lion", "scheduler=constant"];
    let whole = train(
        dir.path(),
        "whole",
        &[&lion[..], &["trainer.max_epochs=3"]].concat(),
    );
    let ckpt =
        trainyard::storage::checkpoint::load(&whole.join("checkpoints/last.safetensors")).unwrap();
    let slots: Vec<&String> = ckpt
        .state
        .keys()
        .filter(|k| k.starts_with("optimizer."))
        .collect();
    assert!(
        ckpt.state.contains_key("optimizer.head.weight.exp_avg"),
        "{slots:?}"
    );
    // Stopped after one epoch and resumed: it continues at step 5 (not from scratch), and only the saved
    // state (weights, Lion's momentum, the step) can make it end where the uninterrupted run ended.
    let part = train(
        dir.path(),
        "part",
        &[&lion[..], &["trainer.max_epochs=1"]].concat(),
    );
    let last = format!(
        "ckpt_path={}",
        part.join("checkpoints/last.safetensors").display()
    );
    let resumed = train(
        dir.path(),
        "resumed",
        &[&lion[..], &["trainer.max_epochs=3", &last]].concat(),
    );
    assert_eq!(
        common::worst_relative_difference(&common::weights(&resumed), &common::weights(&whole)),
        0.0
    );
    assert_eq!(common::first_logged_step(&resumed), 5);
}

#[rstest::rstest]
#[case::unknown_argument(
    &["optimizer=lion", "+optimizer.beta=[0.9,0.9]"],
    &["'optimizer.beta'", "unknown field `beta`", "_target_ tests.optim.Lion", "+optimizer.beta="]
)]
#[case::refused_argument(
    &["optimizer=lion", "optimizer.betas=[0.9,1.5]"],
    &["'optimizer'", "betas must lie in [0, 1)", "lion.yaml:1"]
)]
#[case::not_partial(
    &["optimizer=lion", "optimizer._partial_=false"],
    &["'optimizer._partial_'", "the model's parameters", "Make it true where it is set"]
)]
#[case::partial_not_a_bool(
    &["scheduler=warmup", "scheduler._partial_=yes"],
    &["'scheduler._partial_'", "expected true or false", "scheduler._partial_=yes"]
)]
#[case::no_rate(&["optimizer=lion", "~optimizer.lr"], &["optimizer.lr"])]
#[case::misspelt_optimizer(
    &["optimizer=lion", "optimizer._target_=tests.optim.Loin"],
    &["tests.optim.Loin", "Did you mean 'tests.optim.Lion'?", "optimizer._target_=tests.optim.Loin"]
)]
#[case::misspelt_schedule(
    &["scheduler=warmup", "scheduler._target_=tests.schedules.Warmpu"],
    &["tests.schedules.Warmpu", "Did you mean 'tests.schedules.Warmup'?"]
)]
#[case::schedule_argument(
    &["scheduler=warmup", "scheduler.warmup_steps=0"],
    &["'scheduler'", "warmup_steps must be at least 1"]
)]
#[case::name_by_hand(&["optimizer.name=registered"], &["'optimizer.name'", "_target_"])]
fn bad_optimizers_and_schedules_fail_at_their_key(#[case] extra: &[&str], #[case] wanted: &[&str]) {
    let err = refused(extra);
    for w in wanted {
        assert!(err.contains(w), "missing {w:?} in:\n{err}");
    }
}

#[test]
fn a_rate_that_is_not_a_number_stops_the_run_naming_the_schedule() {
    let err = refused(&[
        "optimizer=plain_sgd",
        "scheduler=warmup",
        "+scheduler.poisoned_after=3",
    ]);
    assert!(
        err.contains("tests.schedules.Warmup") && err.contains("step 4"),
        "{err}"
    );
}

#[test]
fn a_slot_the_rule_did_not_declare_is_refused() {
    let err = refused(&["optimizer=undeclared"]);
    assert!(err.contains("velocity") && err.contains("slots()"), "{err}");
}

#[test]
fn a_registered_optimizer_and_schedule_are_in_the_hyperparameters_loggers_record() {
    let text = "task_name: t\nseed: 3\nmodel: {name: mlp, hidden: [4], num_classes: 4}\n\
         data: {name: synthetic, num_classes: 4, image_size: 8, batch_size: 4}\n\
         optimizer: {_target_: tests.optim.Lion, _partial_: true, lr: 0.002, betas: [0.9, 0.99], weight_decay: 0.1}\n\
         scheduler: {_target_: tests.schedules.Warmup, _partial_: true, warmup_steps: 5}\n\
         trainer: {strategy: single, devices: 1, accelerator: cpu, precision: 32, max_epochs: 1}\n\
         paths: {root_dir: ., data_dir: d, log_dir: l, output_dir: o}\n";
    let node = trainyard::config::yaml::parse(text, "t.yaml")
        .unwrap()
        .unwrap();
    let exp = trainyard::schema::extract(&node).unwrap();
    let hparams = exp.hparams().unwrap();
    let optimizer = &hparams["optimizer"];
    assert_eq!(optimizer["_target_"], "tests.optim.Lion");
    assert_eq!(optimizer["lr"], 0.002);
    assert_eq!(optimizer["betas"], serde_json::json!([0.9, 0.99]));
    assert_eq!(optimizer["weight_decay"], 0.1);
    assert_eq!(hparams["scheduler"]["_target_"], "tests.schedules.Warmup");
    assert_eq!(hparams["scheduler"]["warmup_steps"], 5);
    assert_eq!(hparams["model"]["name"], "mlp");
}
