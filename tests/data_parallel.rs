//! DataParallel (`trainer=dp`) for real, through the `train` binary: one process, N replicas in threads.
//! - Equivalence: N replicas end with the same weights as one process with the same `data.batch_size`
//!   (DP's batch is the global batch), on Candle (default build) and tch (feature `torch`), including
//!   batches that do not divide by N, a last partial batch, gradient accumulation, and batches with fewer
//!   rows than replicas.
//! - Refusals: several nodes, or several processes started by torchrun, are refused by name.

mod common;
use common::{real_project, run_in, summary, weights, worst_relative_difference, SMALL_CNN, TRAIN};
use rstest::rstest;

/// `trainer=dp_sim trainer.devices=N` with `data.batch_size=B` = one process with batch B: the same
/// weights after every step (SGD with Nesterov momentum, so a wrong weighting shows at once), the same
/// validation metrics, and `devices` = N in summary.json.
#[rstest]
#[case::candle_2_replicas("candle", 2, &["data.batch_size=32"], 10)]
#[case::candle_7_rows_on_3_replicas_accumulating("candle", 3,
    &["data.batch_size=7", "data.train_size=68", "trainer.accumulate_grad_batches=2"], 5)]
#[case::candle_fewer_rows_than_replicas("candle", 3,
    &["data.batch_size=2", "trainer.limit_train_batches=10"], 10)]
#[cfg_attr(feature = "torch", case::tch_2_replicas("tch", 2, &["data.batch_size=32"], 10))]
#[cfg_attr(feature = "torch", case::tch_7_rows_on_3_replicas_accumulating("tch", 3,
    &["data.batch_size=7", "data.train_size=68", "trainer.accumulate_grad_batches=2"], 5))]
fn dp_matches_one_process_with_the_same_batch(
    #[case] backend: &str,
    #[case] replicas: usize,
    #[case] extra: &[&str],
    #[case] steps: u64,
) {
    let p = real_project();
    let backend = format!("backend={backend}");
    let devices = format!("trainer.devices={replicas}");
    let common = [
        &[backend.as_str(), "optimizer=sgd", "scheduler=constant"],
        extra,
    ]
    .concat();
    let single = run_in(p.path(), "single", &common);
    let dp = run_in(
        p.path(),
        "dp",
        &[
            &common[..],
            &["trainer=dp", "trainer.accelerator=cpu", &devices],
        ]
        .concat(),
    );
    let (s, d) = (summary(&single), summary(&dp));
    assert_eq!(s["global_step"], steps);
    assert_eq!(d["global_step"], steps);
    assert_eq!(d["strategy"], "dp");
    assert_eq!(d["devices"], replicas);
    assert_eq!(d["global_batch_size"], s["global_batch_size"]);
    let worst = worst_relative_difference(&weights(&dp), &weights(&single));
    eprintln!("{backend} {replicas} replicas {extra:?}: worst relative difference {worst:e}");
    assert!(
        worst < 1e-5,
        "DP weights differ from single-process by {worst:e}"
    );
    let metric = |v: &serde_json::Value, k: &str| v["final_metrics"][k].as_f64().unwrap();
    // Validation is scattered too; its statistics are summed over the replicas.
    let (vs, vd) = (metric(&s, "val/loss"), metric(&d, "val/loss"));
    assert!((vs - vd).abs() < 1e-4 * vs.abs(), "val/loss {vd} vs {vs}");
    assert_eq!(metric(&d, "val/acc1"), metric(&s, "val/acc1"));
    // The runs trained: the weights moved from where they started.
    common::assert_trained(p.path(), &single, &common, 1e-3);
}

/// DataParallel is one process on one node: several nodes, or being one of several processes under
/// torchrun, is refused before a run directory is made, naming the key and the alternative.
#[rstest]
#[case::several_nodes(&["trainer.num_nodes=2"], &[], "trainer.num_nodes=2")]
#[case::under_torchrun(&[], &[("RANK", "1"), ("LOCAL_RANK", "1"), ("WORLD_SIZE", "2")], "WORLD_SIZE=2")]
fn dp_outside_one_process_is_refused(
    #[case] extra: &[&str],
    #[case] env: &[(&str, &str)],
    #[case] named: &str,
) {
    let p = real_project();
    let out = std::process::Command::new(TRAIN)
        .args(SMALL_CNN)
        .args(["trainer=dp_sim"])
        .args(extra)
        .current_dir(p.path())
        .env_remove("TRAIN_CONFIG_PATH")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("trainer.strategy=dp") && err.contains(named) && err.contains("trainer=ddp"),
        "{err}"
    );
    assert!(
        !p.path().join("logs").exists(),
        "no run directory for a refused run"
    );
}
