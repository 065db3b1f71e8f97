//! `trainer.gradient_clip_algorithm`: one SGD step with clipping by value moves no weight by more than
//! learning rate × the limit, on every strategy, and clipping by norm is still the default.

mod common;
use common::{real_project, run_in, weights};
use rstest::rstest;

/// Plain SGD (no momentum, no weight decay): a step moves each weight by exactly lr × its gradient.
const ONE_SGD_STEP: &[&str] = &[
    "optimizer=sgd",
    "optimizer.momentum=0.0",
    "optimizer.nesterov=false",
    "optimizer.weight_decay=0.0",
    "scheduler=constant",
    "trainer.limit_train_batches=1",
];

/// The largest change of any weight between two runs' last checkpoints, and how many weights moved by
/// at least `at_least`.
fn largest_change(a: &std::path::Path, b: &std::path::Path, at_least: f32) -> (f32, usize) {
    let (wa, wb) = (weights(a), weights(b));
    let mut most = 0f32;
    let mut many = 0;
    for (name, ta) in &wa {
        for (x, y) in ta.data.iter().zip(&wb[name].data) {
            let d = (x - y).abs();
            most = most.max(d);
            many += usize::from(d >= at_least);
        }
    }
    (most, many)
}

#[rstest]
#[case::single(&[])]
#[case::data_parallel(&["trainer=dp_sim"])]
#[cfg_attr(feature = "torch", case::tch(&["backend=tch", "trainer.accelerator=cpu"]))]
#[cfg_attr(feature = "torch", case::ddp(&["trainer=ddp_sim"]))]
#[cfg_attr(feature = "torch", case::fsdp(&["trainer=fsdp_sim"]))]
fn clipping_by_value_bounds_every_update(#[case] strategy: &[&str]) {
    let p = real_project();
    let lr = 0.5f32;
    let limit = 1e-3f32;
    let run = |dir: &str, extra: &[&str]| {
        let mut args: Vec<String> = ONE_SGD_STEP.iter().map(|s| s.to_string()).collect();
        args.extend(strategy.iter().map(|s| s.to_string()));
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_in(p.path(), dir, &args)
    };
    // (lr 0 is refused: a step this small moves nothing measurable against lr × limit.)
    let start = run("start", &["optimizer.lr=1e-12"]);
    let lr_arg = format!("optimizer.lr={lr}");
    let clip_arg = format!("trainer.gradient_clip_val={limit}");
    let by_value = run(
        "by_value",
        &[&lr_arg, &clip_arg, "trainer.gradient_clip_algorithm=value"],
    );
    let (most, at_limit) = largest_change(&start, &by_value, 0.999 * lr * limit);
    assert!(most <= lr * limit * 1.0001, "a weight moved {most}");
    assert!(
        at_limit > 100,
        "only {at_limit} weights moved by lr × limit"
    );
    // By norm (the default) with the same limit, the whole update is that long: most weights move far
    // less, and none is cut to the value limit.
    let by_norm = run("by_norm", &[&lr_arg, &clip_arg]);
    let (_, at_limit_norm) = largest_change(&start, &by_norm, 0.999 * lr * limit);
    assert!(
        at_limit_norm < at_limit / 10,
        "{at_limit_norm} vs {at_limit}"
    );
    // The whole update (every parameter; BatchNorm's running statistics are not gradients) is lr × limit
    // long: the gradient's norm was cut to the limit, not to zero nor left whole.
    let length = update_length(&start, &by_norm);
    assert!(
        (length / (lr * limit) as f64 - 1.0).abs() < 0.01,
        "the clipped update is {length:e} long, not lr × limit = {:e}",
        lr * limit
    );
}

/// The L2 length of the change of every parameter between two runs (buffers left out).
fn update_length(a: &std::path::Path, b: &std::path::Path) -> f64 {
    let (wa, wb) = (weights(a), weights(b));
    wa.iter()
        .filter(|(name, _)| !name.contains("running_") && !name.ends_with("num_batches_tracked"))
        .flat_map(|(name, ta)| {
            ta.data
                .iter()
                .zip(&wb[name].data)
                .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
                .collect::<Vec<_>>()
        })
        .sum::<f64>()
        .sqrt()
}
