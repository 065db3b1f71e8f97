//! ReduceLROnPlateau (`scheduler=plateau`, or the template's `torch.optim.lr_scheduler.ReduceLROnPlateau`)
//! against torch's own: the same metric sequence gives the same learning rate after every step, for each
//! mode, threshold mode, cooldown, floor and a NaN (PyTorch from TRAINYARD_TORCH_PYTHON; without it that
//! test says SKIPPED, except under CI, where it fails). In a run: the rate is cut after the validations
//! that did not improve, a resumed run continues the same curve, and `trainer.min_epochs` holds
//! EarlyStopping.

mod common;

use rstest::rstest;
use std::process::Command;
use trainyard::optim::plateau::Plateau;

const METRICS: &[f64] = &[
    1.0,
    0.9,
    0.9,
    0.95,
    0.91,
    0.9,
    0.89999,
    0.85,
    0.86,
    0.87,
    0.88,
    0.84,
    0.84,
    0.84,
    0.84,
    0.84,
    0.83,
    0.9,
    1.0,
    1.1,
    0.5,
    0.5,
    0.5,
    0.5,
    f64::NAN,
    0.5,
    0.5,
];

/// torch's learning rates for `METRICS` with these keyword arguments (Python literals).
fn torch_lrs(python: &str, kwargs: &str) -> Vec<f64> {
    let metrics: Vec<String> = METRICS
        .iter()
        .map(|m| match m.is_nan() {
            true => "float('nan')".to_string(),
            false => format!("{m:?}"),
        })
        .collect();
    let script = format!(
        "import torch\n\
         p = torch.nn.Parameter(torch.zeros(1))\n\
         opt = torch.optim.SGD([p], lr=0.5)\n\
         s = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, {kwargs})\n\
         for m in [{}]:\n    s.step(m)\n    print(repr(opt.param_groups[0]['lr']))\n",
        metrics.join(", ")
    );
    let out = Command::new(python).args(["-c", &script]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect()
}

#[rstest]
#[case::defaults_patience_2("{patience: 2}", "patience=2")]
#[case::max_mode(
    "{mode: max, patience: 1, factor: 0.5}",
    "mode='max', patience=1, factor=0.5"
)]
#[case::abs_threshold(
    "{threshold_mode: abs, threshold: 0.01, patience: 1}",
    "threshold_mode='abs', threshold=0.01, patience=1"
)]
#[case::cooldown_and_floor(
    "{patience: 0, cooldown: 2, factor: 0.5, min_lr: 0.05}",
    "patience=0, cooldown=2, factor=0.5, min_lr=0.05"
)]
#[case::rel_threshold_one("{patience: 1, threshold: 1.0}", "patience=1, threshold=1.0")]
#[case::eps_stops_tiny_cuts(
    "{patience: 0, factor: 0.9, eps: 0.02}",
    "patience=0, factor=0.9, eps=0.02"
)]
fn the_rate_follows_torch(#[case] ours: &str, #[case] torch: &str) {
    let Some(python) = common::torch_python() else {
        return;
    };
    let text = format!("{{name: plateau, {}}}", ours.trim_matches(['{', '}']));
    let cfg: trainyard::schema::SchedulerConfig = {
        let node = trainyard::config::yaml::parse(&text, "s.yaml")
            .unwrap()
            .unwrap();
        serde_json::from_value(node.to_json()).unwrap()
    };
    let mut plateau = Plateau::new(&cfg, 0.5).unwrap();
    let mine: Vec<f64> = METRICS
        .iter()
        .map(|&m| {
            plateau.step(m);
            plateau.lr()
        })
        .collect();
    let theirs = torch_lrs(&python, torch);
    assert_eq!(mine.len(), theirs.len());
    for (i, (a, b)) in mine.iter().zip(&theirs).enumerate() {
        assert!(
            (a - b).abs() <= 1e-12 * b.abs(),
            "step {i}: ours {a}, torch {b}\n{mine:?}\n{theirs:?}"
        );
    }
}

/// `val/loss` never improves by 100 after the first validation: with patience 0 the rate halves after
/// every later epoch's validation.
const HALVING: &[&str] = &[
    "scheduler=plateau",
    "scheduler.threshold_mode=abs",
    "scheduler.threshold=100",
    "scheduler.patience=0",
    "scheduler.factor=0.5",
    "optimizer.lr=0.002",
    "trainer.max_epochs=4",
    "callbacks.model_checkpoint.save_top_k=-1",
    "callbacks.model_checkpoint.monitor=null",
];

fn epoch_lrs(run: &std::path::Path) -> Vec<f64> {
    common::csv_rows(run)
        .iter()
        .filter(|r| r.iter().any(|(k, _)| k == "val/loss"))
        .filter_map(|r| r.iter().find(|(k, _)| k == "lr").map(|(_, v)| *v))
        .collect()
}

#[test]
fn the_rate_is_cut_on_a_plateau_and_a_resumed_run_continues_the_curve() {
    let root = common::real_project();
    let straight = common::run_in(root.path(), "straight", HALVING);
    assert_eq!(epoch_lrs(&straight), vec![0.002, 0.002, 0.001, 0.0005]);
    let ckpt = format!(
        "ckpt_path={}",
        straight.join("checkpoints/epoch_001.safetensors").display()
    );
    let resumed = common::run_in(
        root.path(),
        "resumed",
        &[HALVING, &[ckpt.as_str()]].concat(),
    );
    assert_eq!(epoch_lrs(&resumed), vec![0.001, 0.0005]);
    let worst =
        common::worst_relative_difference(&common::weights(&resumed), &common::weights(&straight));
    assert_eq!(
        worst, 0.0,
        "the resumed run must train with the plateau's rate"
    );
}

/// EarlyStopping with patience 1 on a metric that never improves (by 100) stops at its first validation
/// without improvement, after the second epoch; `trainer.min_epochs=5` holds it until five have run.
#[rstest]
#[case::stops_early(&[], 2)]
#[case::held_by_min_epochs(&["trainer.min_epochs=5"], 5)]
#[case::held_mid_epoch(&["trainer.min_epochs=3", "trainer.val_check_interval=0.5"], 3)]
fn min_epochs_holds_early_stopping(#[case] extra: &[&str], #[case] epochs: u64) {
    let root = common::real_project();
    let base = [
        "trainer.max_epochs=6",
        "callbacks.early_stopping={monitor: val/loss, mode: min, patience: 1, min_delta: 100}",
    ];
    let run = common::run_in(root.path(), "run", &[&base[..], extra].concat());
    let s = common::summary(&run);
    assert_eq!(s["epochs_completed"], epochs, "{s}");
}

/// A plateau schedule in a run that never validates is refused (its rate would never move), and so is a
/// per-step interval it would not follow.
#[rstest]
#[case::no_validation("trainer.limit_val_batches=0", &["trainer.limit_val_batches", "never validates"])]
#[case::step_interval("+scheduler.interval=step", &["scheduler.interval", "once per validation"])]
fn a_plateau_it_could_not_follow_is_refused(#[case] extra: &str, #[case] says: &[&str]) {
    let root = common::real_project();
    let out = common::train(
        root.path(),
        &["experiment=quickstart", "scheduler=plateau", extra],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    for s in says {
        assert!(err.contains(s), "{s}: {err}");
    }
}
