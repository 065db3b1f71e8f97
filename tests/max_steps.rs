//! `trainer.max_steps`: a run that stops mid-epoch keeps its weights (ModelCheckpoint's `last`, as
//! Lightning writes it at the training epoch's end) and resumes from there exactly; one that stops on an
//! epoch's last batch validates and checkpoints that epoch as usual.

mod common;
use common::{real_project, run_in, summary, weights, worst_relative_difference};
use rstest::rstest;

/// Plain, constant-rate SGD, so the schedule does not depend on where the run is told to stop. 320
/// images in batches of 64: five steps an epoch on one rank.
const STEADY: &[&str] = &[
    "optimizer=sgd",
    "scheduler=constant",
    "data.batch_size=64",
    "trainer.max_epochs=3",
    "trainer.log_every_n_steps=1",
];

fn args<'a>(strategy: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
    let mut all = STEADY.to_vec();
    all.extend_from_slice(strategy);
    all.extend_from_slice(extra);
    all
}

/// Every rank stops at the same step, so a sharded model is gathered for `last` as at any checkpoint.
/// (On two ranks an epoch is three steps of 64 images per rank.)
#[rstest]
#[case::single(&[], 3)]
#[case::data_parallel(&["trainer=dp_sim"], 3)]
#[cfg_attr(feature = "torch", case::ddp(&["trainer=ddp_sim"], 2))]
#[cfg_attr(feature = "torch", case::fsdp(&["trainer=fsdp_sim"], 2))]
fn a_run_stopped_mid_epoch_keeps_its_weights_and_resumes_exactly(
    #[case] strategy: &[&str],
    #[case] stop_at: u64,
) {
    let p = real_project();
    let stop = format!("trainer.max_steps={stop_at}");
    let stopped = run_in(p.path(), "stopped", &args(strategy, &[&stop]));
    let s = summary(&stopped);
    assert_eq!(s["status"], "max_steps reached", "{s}");
    assert_eq!(s["global_step"], stop_at, "{s}");
    let last = stopped.join("checkpoints/last.safetensors");
    let training = trainyard::storage::checkpoint::load(&last)
        .unwrap()
        .training
        .expect("training state in the checkpoint");
    assert_eq!(
        (training.epoch, training.batches_done, training.global_step),
        (0, stop_at, stop_at)
    );

    let ckpt = format!("ckpt_path={}", last.display());
    let resumed = run_in(
        p.path(),
        "resumed",
        &args(strategy, &["trainer.max_steps=7", &ckpt]),
    );
    let straight = run_in(
        p.path(),
        "straight",
        &args(strategy, &["trainer.max_steps=7"]),
    );
    assert_eq!(summary(&resumed)["global_step"], 7);
    // Only the remaining steps ran: the resumed run's first row is past the checkpoint's step.
    let first = common::first_logged_step(&resumed);
    assert!(first > stop_at, "the resumed run logged step {first} again");
    let diff = worst_relative_difference(&weights(&resumed), &weights(&straight));
    assert!(
        diff < 1e-6,
        "resumed and uninterrupted runs differ by {diff:e}"
    );
}

#[test]
fn max_steps_on_an_epochs_last_batch_validates_and_checkpoints_that_epoch() {
    let p = real_project();
    let run = run_in(p.path(), "run", &args(&[], &["trainer.max_steps=5"]));
    let s = summary(&run);
    assert_eq!(s["status"], "max_steps reached", "{s}");
    assert_eq!(s["epochs_completed"], 1, "{s}");
    assert!(s["final_metrics"]["val/acc1"].is_number(), "validated: {s}");
    let training = trainyard::storage::checkpoint::load(&run.join("checkpoints/last.safetensors"))
        .unwrap()
        .training
        .unwrap();
    assert_eq!((training.batches_done, training.global_step), (0, 5));
}
