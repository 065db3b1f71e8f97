//! Every decision of the plan, without a machine.

use super::*;
use rstest::rstest;

fn experiment(trainer: &str) -> Experiment {
    crate::testing::experiment(
        "{name: mlp, num_classes: 4, hidden: [8]}",
        "{name: sgd, lr: 0.1}",
        trainer,
        4,
    )
}

fn machine(torch: bool, cuda_devices: usize, nccl_shim: bool) -> Machine {
    Machine {
        torch,
        s3: false,
        nccl_shim,
        cuda_devices,
        cuda_missing: "no driver".into(),
        heap_accounting: false,
    }
}

fn no_env(_: &str) -> Option<String> {
    None
}

#[rstest]
#[case::torchrun(&[("RANK", "1"), ("WORLD_SIZE", "2")], 1, Some("WORLD_SIZE=2"))]
#[case::srun(&[("SLURM_NTASKS", "4")], 1, Some("SLURM_NTASKS=4"))]
#[case::interactive_allocation(&[("SLURM_NTASKS", "4"), ("SLURM_JOB_NAME", "bash")], 1, None)]
#[case::torchrun_with_one_process(&[("RANK", "0"), ("WORLD_SIZE", "1")], 1, None)]
#[case::several_nodes(&[], 2, Some("trainer.num_nodes=2"))]
#[case::plain(&[], 1, None)]
fn data_parallel_is_one_process_on_one_node(
    #[case] env: &[(&str, &str)],
    #[case] nodes: usize,
    #[case] refused_for: Option<&str>,
) {
    let mut exp = experiment("{strategy: dp, devices: 2}");
    exp.trainer.num_nodes = nodes;
    let get = |k: &str| {
        env.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    };
    match (
        RunPlan::new(&exp, &machine(false, 0, false), &get),
        refused_for,
    ) {
        (Ok(plan), None) => {
            assert_eq!(
                (plan.launch, plan.devices_per_node),
                (RankProcesses::InProcess, 2)
            )
        }
        (Err(e), Some(key)) => {
            let e = e.to_string();
            assert!(e.contains(key) && e.contains("trainer=ddp"), "{e}");
        }
        (got, want) => panic!("{:?} but expected refusal for {want:?}", got.map(|_| ())),
    }
}

/// What a build or machine cannot run is refused by name, with the fix.
#[rstest]
#[case::ddp_without_libtorch("{strategy: ddp, devices: 2}", "candle", false, "--features torch")]
#[case::tch_without_libtorch(
    "{strategy: single, devices: 1}",
    "tch",
    false,
    "backend=tch: this build has no libtorch"
)]
#[case::candle_on_a_gpu(
    "{strategy: single, devices: 1, accelerator_gpu: true}",
    "candle",
    true,
    "backend=tch for GPUs"
)]
#[case::candle_fp16(
    "{strategy: single, devices: 1, precision_16: true}",
    "candle",
    true,
    "32-true and bf16-mixed only"
)]
#[case::sync_batchnorm_under_dp(
    "{strategy: dp, devices: 2, sync_batchnorm: true}",
    "candle",
    true,
    "SyncBatchNorm reduces over the ranks"
)]
fn what_this_build_cannot_run_is_refused(
    #[case] trainer: &str,
    #[case] backend: &str,
    #[case] torch: bool,
    #[case] fix: &str,
) {
    let trainer = trainer
        .replace(", accelerator_gpu: true", "")
        .replace(", precision_16: true", "");
    let mut exp = experiment(&trainer);
    exp.backend = if backend == "tch" {
        Backend::Tch
    } else {
        Backend::Candle
    };
    if fix.contains("GPUs") {
        exp.trainer.accelerator = Accelerator::Gpu;
    }
    if fix.contains("32-true") {
        exp.trainer.precision = Precision::Mixed16;
    }
    let e = RunPlan::new(&exp, &machine(torch, 0, false), &no_env)
        .unwrap_err()
        .to_string();
    assert!(e.contains(fix), "{e}");
}

/// NCCL joins the group exactly where a CUDA tch run can use it; asked for where it cannot, it is refused.
#[rstest]
#[case::cpu_run(Backend::Tch, Accelerator::Cpu, None, 2, true, Ok(false))]
#[case::gpu_run(Backend::Tch, Accelerator::Gpu, None, 2, true, Ok(true))]
#[case::gpu_run_without_shim(Backend::Tch, Accelerator::Auto, None, 2, false, Ok(false))]
#[case::gloo_asked(
    Backend::Tch,
    Accelerator::Gpu,
    Some(ProcessGroupBackend::Gloo),
    2,
    true,
    Ok(false)
)]
#[case::nccl_on_candle(
    Backend::Candle,
    Accelerator::Cpu,
    Some(ProcessGroupBackend::Nccl),
    0,
    true,
    Err("needs backend=tch")
)]
#[case::nccl_without_gpu(
    Backend::Tch,
    Accelerator::Gpu,
    Some(ProcessGroupBackend::Nccl),
    0,
    true,
    Err("finds no GPU: no driver")
)]
#[case::nccl_on_the_cpu(
    Backend::Tch,
    Accelerator::Cpu,
    Some(ProcessGroupBackend::Nccl),
    2,
    true,
    Err("is the CPU")
)]
#[case::nccl_without_shim(
    Backend::Tch,
    Accelerator::Gpu,
    Some(ProcessGroupBackend::Nccl),
    2,
    false,
    Err("no NCCL shim")
)]
fn nccl_where_a_cuda_run_can_use_it(
    #[case] backend: Backend,
    #[case] accelerator: Accelerator,
    #[case] asked: Option<ProcessGroupBackend>,
    #[case] cuda_devices: usize,
    #[case] shim: bool,
    #[case] want: Result<bool, &str>,
) {
    let mut exp = experiment("{strategy: ddp, devices: 2}");
    exp.backend = backend;
    exp.trainer.accelerator = accelerator;
    exp.trainer.process_group_backend = asked;
    let mut warnings = Vec::new();
    let got = wants_nccl(&exp, &machine(true, cuda_devices, shim), &mut warnings);
    match (got, want) {
        (Ok(got), Ok(want)) => assert_eq!(got, want),
        (Err(e), Err(part)) => assert!(e.to_string().contains(part), "{e}"),
        (got, want) => panic!("{got:?}, expected {want:?}"),
    }
    let warned = !warnings.is_empty();
    assert_eq!(
        warned,
        asked.is_none() && cuda_devices > 0 && !shim && backend == Backend::Tch
    );
}

#[test]
fn auto_devices_count_visible_gpus_and_one_elsewhere() {
    let mut exp = experiment("{strategy: ddp, devices: 2}");
    exp.trainer.devices = Devices::Auto;
    assert_eq!(devices_per_node(&exp, &machine(true, 4, true)), 4);
    assert_eq!(devices_per_node(&exp, &machine(true, 0, true)), 1);
}

/// A distributed job launched by `train` itself cannot be a sweep's job; under a launcher it can.
#[test]
fn only_jobs_started_by_a_launcher_can_be_swept() {
    let exp = experiment("{strategy: ddp, devices: 2}");
    let plan = RunPlan::new(&exp, &machine(true, 0, false), &no_env).unwrap();
    assert!(plan.launches_workers());
    let e = plan.check_sweepable().unwrap_err().to_string();
    assert!(e.contains("multirun of distributed jobs"), "{e}");
    let torchrun = |k: &str| {
        [
            ("RANK", "1"),
            ("LOCAL_RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
        ]
        .iter()
        .find(|(n, _)| *n == k)
        .map(|(_, v)| v.to_string())
    };
    let plan = RunPlan::new(&exp, &machine(true, 0, false), &torchrun).unwrap();
    assert!(!plan.launches_workers());
    plan.check_sweepable().unwrap();
    assert_eq!(plan.cluster.unwrap().worker.unwrap().rank, 1);
}

/// The loop's arithmetic, as Lightning's fit loop does it: (train_len, val_len, world, rank, setting) →
/// (train batches, steps per epoch, this rank's validation batches, validation rounds).
#[rstest]
#[case::plain(40, 10, 1, 0, "", (10, 10, 3, 3))]
#[case::accumulation(40, 10, 1, 0, "accumulate=3", (10, 4, 3, 3))]
#[case::two_ranks_pad_training_not_validation(42, 9, 2, 1, "", (6, 6, 1, 2))]
#[case::limits(40, 10, 1, 0, "limit_train=3 limit_val=0.5", (3, 3, 1, 1))]
#[case::fast_dev_run(40, 10, 1, 0, "fast_dev_run=2", (2, 2, 2, 2))]
#[case::overfit(40, 10, 1, 0, "overfit=2", (2, 2, 2, 2))]
#[case::drop_last(42, 10, 1, 0, "drop_last", (10, 10, 3, 3))]
fn the_loop_shape_follows_lightning(
    #[case] train_len: usize,
    #[case] val_len: usize,
    #[case] world: usize,
    #[case] rank: usize,
    #[case] setting: &str,
    #[case] want: (usize, u64, usize, usize),
) {
    let mut exp = experiment("{strategy: single, devices: 1}");
    for s in setting.split_whitespace() {
        let (key, value) = s.split_once('=').unwrap_or((s, ""));
        let t = &mut exp.trainer;
        match key {
            "accumulate" => t.accumulate_grad_batches = value.parse().unwrap(),
            "limit_train" => t.limit_train_batches = Limit::Batches(value.parse().unwrap()),
            "limit_val" => t.limit_val_batches = Limit::Fraction(value.parse().unwrap()),
            "fast_dev_run" => t.fast_dev_run = FastDevRun::Batches(value.parse().unwrap()),
            "overfit" => t.overfit_batches = Limit0::Batches(value.parse().unwrap()),
            "drop_last" => exp.data.drop_last = true,
            other => panic!("{other}"),
        }
    }
    let plan = LoopPlan::new(&exp, Shares::by_index(rank, world, train_len, val_len)).unwrap();
    assert_eq!(
        (
            plan.train_batches,
            plan.steps_per_epoch,
            plan.val_batches,
            plan.val_rounds
        ),
        want
    );
    assert_eq!(plan.callbacks_on, !setting.starts_with("fast_dev_run"));
}

#[test]
fn validation_checks_follow_the_interval_and_the_epochs() {
    let mut exp = experiment("{strategy: single, devices: 1}");
    exp.trainer.val_check_interval = Limit::Fraction(0.5);
    exp.trainer.max_epochs = 3;
    exp.trainer.check_val_every_n_epoch = 2;
    let plan = LoopPlan::new(&exp, Shares::by_index(0, 1, 40, 10)).unwrap();
    assert_eq!(plan.val_every, Some(5));
    // Mid-epoch checks in epochs whose number divides by 2 (the second: epoch index 1), not at the end.
    assert!(plan.validates_after_batch(1, 4) && !plan.validates_after_batch(0, 4));
    assert!(!plan.validates_after_batch(1, 9));
    // At epoch ends: every second epoch, and the last.
    let ends: Vec<bool> = (1..=3).map(|e| plan.validates_at_epoch_end(e)).collect();
    assert_eq!(ends, vec![false, true, true]);
    assert!(plan.ends_window(9) && plan.ends_window(0));
    exp.trainer.val_check_interval = Limit::Batches(11);
    let e = LoopPlan::new(&exp, Shares::by_index(0, 1, 40, 10))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("val_check_interval=11") && e.contains("at most 10"),
        "{e}"
    );
}

#[rstest]
#[case::empty(0, "the training set is empty")]
#[case::no_batches(40, "no training batches")]
fn a_loop_without_batches_is_refused(#[case] train_len: usize, #[case] why: &str) {
    let mut exp = experiment("{strategy: single, devices: 1}");
    exp.trainer.limit_train_batches = Limit::Batches(0);
    let e = LoopPlan::new(&exp, Shares::by_index(0, 1, train_len, 10))
        .unwrap_err()
        .to_string();
    assert!(e.contains(why), "{e}");
}
