//! Gradient accumulation by the numbers (Lightning's `accumulate_grad_batches`): batches of 16 accumulated
//! two at a time train the weights that batches of 32 do (the same samples in the same order, each
//! micro-batch's loss scaled by a half), with half the optimizer steps of the micro-batches; and the count
//! of accumulated batches matters (three at a time trains other weights).

mod common;

use common::{run_with, summary, weights, worst_relative_difference};

const MLP: &[&str] = &[
    "experiment=quickstart",
    "model=mlp",
    "model.channels=null",
    "model.hidden=[32]",
    "model.dropout=0.0",
    "optimizer=sgd",
    "optimizer.lr=0.05",
    "scheduler=constant",
    "data.train_size=192",
    "data.val_size=32",
    "trainer.max_epochs=2",
];

#[test]
fn accumulated_micro_batches_train_the_whole_batchs_weights() {
    let p = tempfile::tempdir().unwrap();
    let whole = run_with(p.path(), "whole", MLP, &["data.batch_size=32"]);
    let accumulated = run_with(
        p.path(),
        "accumulated",
        MLP,
        &["data.batch_size=16", "trainer.accumulate_grad_batches=2"],
    );
    let diff = worst_relative_difference(&weights(&accumulated), &weights(&whole));
    assert!(diff < 1e-5, "batch 16 x 2 against batch 32: {diff}");
    // 192 samples a epoch: 6 optimizer steps of 32, twice; the 12 micro-batches of an epoch make 6.
    assert_eq!(summary(&whole)["global_step"], 12);
    assert_eq!(summary(&accumulated)["global_step"], 12);

    let three = run_with(
        p.path(),
        "three",
        MLP,
        &["data.batch_size=16", "trainer.accumulate_grad_batches=3"],
    );
    let diff = worst_relative_difference(&weights(&three), &weights(&whole));
    assert!(
        diff > 1e-3,
        "accumulating three is another schedule: {diff}"
    );
}
