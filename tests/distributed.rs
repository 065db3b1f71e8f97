//! Distributed training for real, through the `train` binary: the node launcher starts worker processes,
//! they rendezvous on c10d's TCPStore and reduce gradients over Gloo.
//! - Equivalence: 2-process DDP ends with the same weights as one process with the same global batch.
//! - Failure: a worker killed with SIGKILL mid-epoch stops the run with a message naming it; `ckpt_path=last`
//!   then resumes to completion.
//! - Multi-node: two network namespaces joined by a veth pair act as two nodes (root only; skipped with a
//!   message elsewhere).
//!
//! Needs `--features torch` and libtorch (scripts/install-libtorch.sh).
#![cfg(feature = "torch")]

mod common;
use common::{real_project, run_in, summary, weights, worst_relative_difference, SMALL_CNN, TRAIN};
use rstest::rstest;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use trainyard::storage::checkpoint;

/// 2 processes × batch 16 over Gloo = 1 process × batch 32: same weights after an epoch (SGD with
/// momentum, so a wrong average or a missed bucket shows at once), for both backends; with buckets small
/// enough to split the model, and with gradient accumulation. Validation over 63 images (32 on rank 0,
/// 31 on rank 1) sees each exactly once: the same metrics as one process.
#[rstest]
#[case::tch("tch", &[], 10)]
#[case::candle("candle", &[], 10)]
#[case::tch_small_buckets_accumulating("tch",
    &["trainer.ddp.bucket_cap_mb=0.005", "trainer.accumulate_grad_batches=2"], 5)]
#[case::candle_small_buckets("candle", &["trainer.ddp.bucket_cap_mb=0.005"], 10)]
fn ddp_matches_one_process_with_the_same_global_batch(
    #[case] backend: &str,
    #[case] extra: &[&str],
    #[case] steps: u64,
) {
    let p = real_project();
    let backend = format!("backend={backend}");
    let mut common = shared_overrides(&backend, "data.val_size=63");
    // Settings both runs share (the bucket size only matters to DDP; one process ignores it).
    let (ddp_only, shared) = split_under(extra, "trainer.ddp.");
    common.extend(shared);
    let single = run_in(
        p.path(),
        "single",
        &[&common[..], &["data.batch_size=32"]].concat(),
    );
    let ddp = run_in(
        p.path(),
        "ddp",
        &[
            &common[..],
            &["trainer=ddp_sim", "data.batch_size=16"],
            &ddp_only[..],
        ]
        .concat(),
    );
    let (s, d) = (summary(&single), summary(&ddp));
    assert_eq!(s["global_step"], steps);
    assert_eq!(d["global_step"], steps);
    assert_eq!(d["strategy"], "ddp");
    assert_eq!(d["devices"], 2);
    assert_eq!(d["global_batch_size"], s["global_batch_size"]);
    let worst = worst_relative_difference(&weights(&ddp), &weights(&single));
    assert!(
        worst < 1e-5,
        "DDP weights differ from single-process by {worst:e}"
    );
    // The runs trained: the weights moved from where they started.
    common::assert_trained(
        p.path(),
        &single,
        &[&common[..], &["data.batch_size=32"]].concat(),
        1e-3,
    );
    // Metrics are global and exact: each validation image counted once, as in one process.
    same_validation(&d, &s);
    let acc = d["final_metrics"]["val/acc1"].as_f64().unwrap();
    // Every rank logged the same validation accuracy as rank 0's summary.
    let rank1 = std::fs::read_to_string(ddp.join("train.rank1.log")).unwrap();
    assert!(
        rank1.contains(&format!("val/acc1 {acc:.3}")),
        "rank 1 logged another val/acc1 than {acc:.3}:\n{rank1}"
    );
    // Only rank 0 writes the run's records.
    assert!(ddp.join("train.rank0.log").exists() && ddp.join("metrics.csv").exists());
}

/// What both runs of an equivalence test share: the backend, SGD at a constant rate, the validation size.
fn shared_overrides<'a>(backend: &'a str, val_size: &'a str) -> Vec<&'a str> {
    vec![backend, "optimizer=sgd", "scheduler=constant", val_size]
}

/// A distributed run's final validation metrics equal one process's: each image counted once (with an
/// odd count the shares are uneven; padding them would count one twice, and k/(n+1) is never k'/n).
fn same_validation(dist: &serde_json::Value, single: &serde_json::Value) {
    let metric = |s: &serde_json::Value, k: &str| s["final_metrics"][k].as_f64().unwrap();
    let (acc, single_acc) = (metric(dist, "val/acc1"), metric(single, "val/acc1"));
    assert!(
        acc > 0.0 && (acc - single_acc).abs() < 1e-9,
        "val/acc1 {acc} vs one process {single_acc}"
    );
    let (loss, single_loss) = (metric(dist, "val/loss"), metric(single, "val/loss"));
    assert!(
        (loss - single_loss).abs() < 1e-4 * single_loss.abs(),
        "val/loss {loss} vs one process {single_loss}"
    );
}

/// `extra` split into the overrides under `prefix` (for the distributed run only) and the rest.
fn split_under<'a>(extra: &[&'a str], prefix: &str) -> (Vec<&'a str>, Vec<&'a str>) {
    extra.iter().copied().partition(|o| o.starts_with(prefix))
}

/// A 2-process `trainer=fsdp_sim` run with this sharding strategy into `root/fsdp`.
fn run_fsdp(root: &Path, sharding: &str, extra: &[&str]) -> PathBuf {
    let strategy = format!("trainer.fsdp.sharding_strategy={sharding}");
    run_in(
        root,
        "fsdp",
        &[extra, &["trainer=fsdp_sim", strategy.as_str()]].concat(),
    )
}

/// Model and optimizer state (optimizer.* included, counters excluded) of a run's last checkpoint.
fn full_state(run: &Path) -> trainyard::tensor::StateDict {
    checkpoint::load(&run.join("checkpoints/last.safetensors"))
        .unwrap()
        .state
        .into_iter()
        .filter(|(k, _)| !matches!(k.as_str(), "optimizer.step" | "optimizer.forward_calls"))
        .collect()
}

/// Per-rank parameter / optimizer-state / most-held-whole bytes from summary.json.
fn state_bytes(summary: &serde_json::Value, rank: usize) -> (u64, u64, u64) {
    let row = &summary["state_bytes_per_rank"][rank];
    (
        row["parameters"].as_u64().unwrap(),
        row["optimizer_state"].as_u64().unwrap(),
        row["unsharded_peak"].as_u64().unwrap(),
    )
}

/// 2-process FSDP = 1 process with the same global batch, for every sharding strategy and both backends:
/// the consolidated (`state_dict_type: full`) checkpoint holds the same weights AND the same optimizer
/// state (momentum buffers) as the single-process run's, and a sharding strategy that shards keeps half
/// the parameter and optimizer-state bytes per rank. Validation over 33 images (17 on rank 0 in two
/// batches, 16 on rank 1 in one: rank 1 still joins rank 0's second round of gathers) gives one process's
/// metrics.
#[rstest]
#[case::tch_full_shard("tch", "FULL_SHARD", &[])]
#[case::candle_full_shard("candle", "FULL_SHARD", &[])]
#[case::tch_shard_grad_op_accumulating_clipped("tch", "SHARD_GRAD_OP",
    &["trainer.accumulate_grad_batches=2", "trainer.gradient_clip_val=0.5"])]
#[case::candle_shard_grad_op("candle", "SHARD_GRAD_OP", &[])]
#[case::tch_no_shard("tch", "NO_SHARD", &[])]
#[case::candle_no_shard_adamw("candle", "NO_SHARD", &["optimizer=adamw"])]
#[case::tch_full_shard_grouped_units("tch", "FULL_SHARD", &["trainer.fsdp.min_num_params=200"])]
fn fsdp_matches_one_process_with_the_same_global_batch(
    #[case] backend: &str,
    #[case] sharding: &str,
    #[case] extra: &[&str],
) {
    let p = real_project();
    let backend = format!("backend={backend}");
    let mut common = shared_overrides(&backend, "data.val_size=33");
    // FSDP's own settings go to the FSDP run only.
    let (fsdp_only, shared) = split_under(extra, "trainer.fsdp.");
    common.extend(shared);
    let single = run_in(
        p.path(),
        "single",
        &[&common[..], &["data.batch_size=32"]].concat(),
    );
    let fsdp = run_fsdp(
        p.path(),
        sharding,
        &[&common[..], &["data.batch_size=16"], &fsdp_only[..]].concat(),
    );
    let (s, f) = (summary(&single), summary(&fsdp));
    assert_eq!(f["strategy"], "fsdp");
    same_validation(&f, &s);
    assert_eq!(f["global_step"], s["global_step"]);
    assert!(s["global_step"].as_u64().unwrap() >= 5);
    let (a, b) = (full_state(&fsdp), full_state(&single));
    assert!(
        b.keys().any(|k| k.starts_with("optimizer.")),
        "the single run has optimizer state"
    );
    let worst = worst_relative_difference(&a, &b);
    assert!(
        worst < 1e-5,
        "FSDP {sharding} state differs from single-process by {worst:e}"
    );
    let (params, optim, _) = state_bytes(&s, 0);
    for rank in 0..2 {
        let (p_rank, o_rank, whole) = state_bytes(&f, rank);
        if sharding == "NO_SHARD" {
            assert_eq!((p_rank, o_rank), (params, optim), "rank {rank}");
        } else {
            // Half, up to the padding of each unit's flat vector to a multiple of the world size (one
            // value per unit at most; the small cnn has five units).
            let padding = 4 * 5;
            assert!(
                p_rank * 2 >= params && p_rank * 2 <= params + padding,
                "rank {rank}: {p_rank} parameter bytes of {params}"
            );
            assert!(
                o_rank * 2 >= optim && o_rank * 2 <= optim + padding,
                "rank {rank}: {o_rank} optimizer bytes of {optim}"
            );
        }
        // FULL_SHARD holds one unit whole at a time (the small cnn's largest is 3/4 of it); the others
        // the whole model while computing.
        if sharding == "FULL_SHARD" {
            assert!(
                whole < params,
                "rank {rank}: {whole} of {params} bytes whole at once"
            );
        } else {
            assert_eq!(whole, params, "rank {rank}");
        }
    }
}

/// `16-mixed` under FSDP (PyTorch's ShardedGradScaler): each rank unscales its own gradient slices and
/// the ranks agree on overflow, so they skip the same steps and move the loss scale the same way as
/// 2-process DDP, whose all-reduce spreads an inf to every rank before it unscales. (One process with the
/// whole batch is no reference here: a rank's loss is the mean over its half, so its fp16 gradients are
/// twice as large and overflow at half the scale, in PyTorch too.) The initial scale (2^24) is large
/// enough that the first steps overflow in fp16 and are skipped; later ones are taken.
#[rstest]
#[case::full_shard("FULL_SHARD")]
#[case::shard_grad_op("SHARD_GRAD_OP")]
fn fsdp_16_mixed_skips_and_steps_as_ddp(#[case] sharding: &str) {
    let p = real_project();
    let common = [
        "backend=tch",
        "optimizer=sgd",
        "scheduler=constant",
        "trainer.precision=16-mixed",
        "trainer.grad_scaler.init_scale=16777216",
        "data.batch_size=16",
    ];
    let ddp = run_in(
        p.path(),
        "ddp",
        &[&common[..], &["trainer=ddp_sim"]].concat(),
    );
    let fsdp = run_fsdp(p.path(), sharding, &common);
    let (a, b) = (full_state(&fsdp), full_state(&ddp));
    let scale = |s: &trainyard::tensor::StateDict| s["optimizer.grad_scaler.scale"].data[0];
    assert!(
        scale(&b) < 16777216.0,
        "the first steps overflowed and lowered the scale: {}",
        scale(&b)
    );
    assert_eq!(scale(&a), scale(&b), "the loss scale moved differently");
    let worst = worst_relative_difference(&a, &b);
    eprintln!("FSDP {sharding} 16-mixed vs DDP: {worst:e}");
    assert!(
        worst < 1e-5,
        "FSDP {sharding} 16-mixed state differs from DDP's by {worst:e}"
    );
    // Had every step overflowed, each would have halved the scale.
    let steps = summary(&ddp)["global_step"].as_u64().unwrap();
    assert!(
        f64::from(scale(&b)) > 16777216.0 / 2f64.powi(steps as i32),
        "some of the {steps} steps were taken, not all skipped: scale {}",
        scale(&b)
    );
}

/// `state_dict_type: sharded`: each rank writes its slice (`last.safetensors` on rank 0,
/// `last.shard1.safetensors` on rank 1) and reads it back on `ckpt_path=last`; an interrupted run resumed
/// this way ends with the same slices as an uninterrupted one.
#[test]
fn sharded_fsdp_checkpoints_resume_to_the_same_state() {
    let p = real_project();
    let common = [
        "backend=tch",
        "optimizer=sgd",
        "scheduler=constant",
        "trainer=fsdp_sim",
        "trainer.fsdp.state_dict_type=sharded",
        "data.batch_size=16",
    ];
    let whole = run_in(
        p.path(),
        "whole",
        &[&common[..], &["trainer.max_epochs=2"]].concat(),
    );
    let part = run_in(p.path(), "part", &common);
    let resumed_from = format!(
        "ckpt_path={}",
        part.join("checkpoints/last.safetensors").display()
    );
    let resumed = run_in(
        p.path(),
        "resumed",
        &[
            &common[..],
            &["trainer.max_epochs=2", resumed_from.as_str()],
        ]
        .concat(),
    );
    assert_eq!(
        summary(&resumed)["global_step"],
        summary(&whole)["global_step"]
    );
    // Only the second epoch ran: the first logged step is past the checkpoint's.
    let stopped_at = summary(&part)["global_step"].as_u64().unwrap();
    let first = common::first_logged_step(&resumed);
    assert!(
        first > stopped_at,
        "the resumed run logged step {first} again (checkpoint at {stopped_at})"
    );
    for file in ["last.safetensors", "last.shard1.safetensors"] {
        let slice = |run: &Path| {
            let state = checkpoint::load(&run.join("checkpoints").join(file))
                .unwrap()
                .state;
            assert!(
                state.contains_key("optimizer.fsdp.units.1.flat_param.momentum_buffer"),
                "{file}: {:?}",
                state.keys().collect::<Vec<_>>()
            );
            let slices: Vec<f32> = state
                .iter()
                .filter(|(k, _)| k.starts_with("fsdp.units.") && k.ends_with(".flat_param"))
                .flat_map(|(_, t)| t.data.clone())
                .collect();
            assert!(!slices.is_empty());
            slices
        };
        let (a, b) = (slice(&resumed), slice(&whole));
        assert_eq!(a.len(), b.len());
        let worst = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-6, "{file}: resumed differs by {worst}");
    }
}

/// SyncBatchNorm: with `trainer.sync_batchnorm=true`, 2 DDP processes × batch 16 normalise with the
/// statistics of the global batch of 32, so a BatchNorm network (ResNet-18, CIFAR stem, 8x8 images) takes
/// the same step as one process with batch 32: same weights, running statistics and gradients (the
/// momentum buffers after one step); without it, each rank normalises its own half and the runs differ
/// (the control that shows the test can fail). One step, because this tiny-image ResNet is chaotic:
/// float rounding differences (1e-6 after a step) grow ~30x per step, and even two single-process runs
/// on the two backends differ by O(1) after five steps.
#[rstest]
#[case::tch("tch")]
#[case::candle("candle")]
fn sync_batchnorm_matches_one_process_with_the_same_global_batch(#[case] backend: &str) {
    let p = real_project();
    let backend = format!("backend={backend}");
    let common = [
        backend.as_str(),
        "model=resnet18",
        "model.cifar_stem=true",
        "~model.channels",
        "data.image_size=8",
        "data.train_size=160",
        "data.val_size=32",
        "optimizer=sgd",
        "scheduler=constant",
        "trainer.limit_train_batches=1",
    ];
    let single = run_in(
        p.path(),
        "single",
        &[&common[..], &["data.batch_size=32"]].concat(),
    );
    let ddp = |dir: &str, sync: &str| {
        run_in(
            p.path(),
            dir,
            &[
                &common[..],
                &["trainer=ddp_sim", "data.batch_size=16", sync],
            ]
            .concat(),
        )
    };
    let synced = ddp("synced", "trainer.sync_batchnorm=true");
    let reference = full_state(&single);
    assert!(reference.contains_key("bn1.running_var"));
    let got = full_state(&synced);
    let worst = worst_relative_difference(&got, &reference);
    let mut by_tensor: Vec<(f64, &String)> = got
        .iter()
        .map(|(k, v)| {
            let one = |t: &trainyard::tensor::HostTensor| {
                std::iter::once((k.clone(), t.clone())).collect::<trainyard::tensor::StateDict>()
            };
            (worst_relative_difference(&one(v), &one(&reference[k])), k)
        })
        .collect();
    by_tensor.sort_by(|a, b| b.0.total_cmp(&a.0));
    assert!(
        worst < 1e-4,
        "SyncBatchNorm DDP differs from one process by {worst:e}; worst tensors: {:?}",
        &by_tensor[..5]
    );
    let unsynced = ddp("unsynced", "trainer.sync_batchnorm=false");
    let apart = worst_relative_difference(&full_state(&unsynced), &reference);
    assert!(
        apart > 1e-2,
        "without SyncBatchNorm the runs should differ, but only by {apart:e}"
    );
}

/// `train SMALL_CNN ARGS` in `root` as rank `rank` of `world` under a torchrun-style environment
/// (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_*; no launcher of ours), rendezvous on a fresh loopback port.
fn torchrun_worker(root: &Path, rank: usize, world: usize, args: &[&str]) -> std::process::Output {
    let (rank, world, port) = (
        rank.to_string(),
        world.to_string(),
        common::free_port().to_string(),
    );
    Command::new(TRAIN)
        .args(SMALL_CNN)
        .args(args)
        .current_dir(root)
        .env_remove("TRAIN_CONFIG_PATH")
        .envs([
            ("RANK", rank.as_str()),
            ("LOCAL_RANK", rank.as_str()),
            ("WORLD_SIZE", world.as_str()),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", port.as_str()),
        ])
        .output()
        .unwrap()
}

/// `trainer.process_group_backend=nccl` where NCCL cannot run is refused before any collective, naming
/// the setting and what to change (one worker, rank 0 of 1 under a torchrun-style environment).
#[rstest]
#[case::on_the_cpu(&["backend=tch"], "trainer.accelerator=cpu is the CPU")]
#[case::with_candle(&["backend=candle"], "needs backend=tch")]
#[case::on_a_gpu_that_is_not_there(&["backend=tch", "trainer.accelerator=gpu"], "finds no GPU: libtorch's CUDA library")]
fn nccl_where_it_cannot_run_is_refused_by_name(#[case] extra: &[&str], #[case] says: &str) {
    if trainyard::platform::cuda::is_available() {
        eprintln!("SKIPPED: this machine has a CUDA device, so NCCL is not refused here");
        return;
    }
    let p = real_project();
    let mut args = vec!["trainer=ddp_sim", "trainer.process_group_backend=nccl"];
    args.extend_from_slice(extra);
    let out = torchrun_worker(p.path(), 0, 1, &args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("trainer.process_group_backend=nccl") && err.contains(says),
        "{err}"
    );
}

/// Nothing waits forever: a worker whose peers never come gives up after `trainer.rendezvous_timeout_s`
/// with a message that says what to check.
#[test]
fn a_rendezvous_nobody_joins_times_out_with_advice() {
    let p = real_project();
    let started = Instant::now();
    // Rank 1 of 2, with no rank 0 anywhere.
    let out = torchrun_worker(
        p.path(),
        1,
        2,
        &[
            "backend=tch",
            "trainer=ddp_sim",
            "trainer.rendezvous_timeout_s=3",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        err.contains("node 0 (rank 0, which hosts the rendezvous) did not come to the rendezvous")
            && err.contains("rendezvous_timeout_s=3")
            && err.contains("are MASTER_ADDR/MASTER_PORT the same on every node?"),
        "{err}"
    );
}

/// kill -9 on rank 1 in the middle of an epoch: the run stops at once with a message naming rank 1 and the
/// signal, no process is left behind, and `ckpt_path=last` resumes the run to its end.
#[test]
fn a_killed_worker_stops_the_run_and_the_run_resumes_from_its_checkpoint() {
    let p = real_project();
    let args: Vec<&str> = [
        SMALL_CNN,
        &[
            "backend=tch",
            "trainer=ddp_sim",
            "data.batch_size=8",
            "data.train_size=4096",
            "trainer.max_epochs=3",
            "trainer.collective_timeout_s=30",
            "hydra.run.dir=runs/first",
        ],
    ]
    .concat();
    let mut launcher = Command::new(TRAIN)
        .args(&args)
        .current_dir(p.path())
        .env_remove("TRAIN_CONFIG_PATH")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let run = p.path().join("runs/first");
    // Wait for the first epoch's checkpoint, then for training to be under way in epoch 2.
    let start = Instant::now();
    while !run.join("checkpoints/last.safetensors").exists() {
        assert!(
            start.elapsed() < Duration::from_secs(240),
            "no checkpoint after 240s"
        );
        assert!(
            launcher.try_wait().unwrap().is_none(),
            "the run ended early"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    let workers = common::workers_of(launcher.id());
    assert_eq!(workers.len(), 2, "{workers:?}");
    let (victim, _) = workers.iter().find(|(_, r)| r == "1").unwrap().clone();
    let killed_at = Instant::now();
    // SAFETY: signalling a process this test started (a child of the launcher).
    unsafe { libc::kill(victim as i32, libc::SIGKILL) };
    let status = loop {
        if let Some(s) = launcher.try_wait().unwrap() {
            break s;
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(30),
            "the launcher did not stop within the collective timeout"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(launcher.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(!status.success());
    assert!(
        err.contains("worker rank 1") && err.contains("signal 9"),
        "{err}"
    );
    assert!(err.contains("ckpt_path=auto"), "{err}");
    for (pid, _) in &workers {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .map(|s| s.contains(") Z "))
                    .unwrap_or(true),
            "worker {pid} is still running"
        );
    }
    // Resume: the same command with ckpt_path pointing at the interrupted run's last checkpoint.
    let last = run.join("checkpoints/last.safetensors");
    let ckpt = format!("ckpt_path={}", last.display());
    let resumed = run_in(
        p.path(),
        "runs/resumed",
        &[
            "backend=tch",
            "trainer=ddp_sim",
            "data.batch_size=8",
            "data.train_size=4096",
            "trainer.max_epochs=3",
            &ckpt,
        ],
    );
    let s = summary(&resumed);
    assert_eq!(s["epochs_completed"], 3);
    assert_eq!(s["status"], "completed");
    assert!(
        s["resumed_from"]
            .as_str()
            .unwrap()
            .contains("first/checkpoints/last.safetensors"),
        "{}",
        s["resumed_from"]
    );
}

/// Two network namespaces joined by a veth pair: two "nodes" that can reach each other only over that
/// link. `train ... trainer=ddp trainer.num_nodes=2 trainer.devices=1` runs once in each with NODE_RANK
/// 0/1 and MASTER_ADDR = node 0's veth address; both finish, into one run directory, and agree.
#[test]
fn two_nodes_in_two_network_namespaces() {
    let Some(nodes) = common::netns::TwoNodes::create("two_nodes_in_two_network_namespaces", 7)
    else {
        return;
    };
    let p = real_project();
    let node = |n: usize| {
        let mut cmd = nodes.command(n, TRAIN);
        cmd.args(SMALL_CNN)
            .args(shared_overrides("backend=tch", "data.val_size=63"))
            .args([
                "trainer=ddp",
                "trainer.accelerator=cpu",
                "trainer.num_nodes=2",
                "trainer.devices=1",
                "trainer.sync_batchnorm=false",
                "trainer.process_group_backend=gloo",
                "trainer.rendezvous_timeout_s=60",
                "trainer.collective_timeout_s=60",
                "data.batch_size=16",
            ])
            .current_dir(p.path())
            .env_remove("TRAIN_CONFIG_PATH")
            .env("MASTER_ADDR", &nodes.addr[0])
            .env("MASTER_PORT", "29531")
            .env("NODE_RANK", n.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd.spawn().unwrap()
    };
    let n0 = node(0);
    let n1 = node(1);
    let (o0, o1) = (
        n0.wait_with_output().unwrap(),
        n1.wait_with_output().unwrap(),
    );
    for (name, o) in [("node 0", &o0), ("node 1", &o1)] {
        assert!(
            o.status.success(),
            "{name} failed:\nstdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // One run directory for both nodes: rank 0's summary and rank 1's log side by side.
    let runs: Vec<PathBuf> = std::fs::read_dir(p.path().join("logs/quickstart/runs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    let run = &runs[0];
    let s = summary(run);
    assert_eq!(s["num_nodes"], 2);
    assert_eq!(s["devices"], 1);
    assert_eq!(s["global_batch_size"], 32);
    let acc = s["final_metrics"]["val/acc1"].as_f64().unwrap();
    let rank1 = std::fs::read_to_string(run.join("train.rank1.log")).unwrap();
    assert!(rank1.contains(&format!("val/acc1 {acc:.3}")), "{rank1}");
    // The two nodes took one process's steps over the same global batch of 32.
    let single = run_in(
        p.path(),
        "single",
        &[
            &shared_overrides("backend=tch", "data.val_size=63")[..],
            &["data.batch_size=32"],
        ]
        .concat(),
    );
    let worst = worst_relative_difference(&weights(run), &weights(&single));
    assert!(
        worst < 1e-5,
        "the two nodes' weights differ from one process's by {worst:e}"
    );
    same_validation(&s, &summary(&single));
}
