//! The run plan (ripgrep's lowargs → hiargs): every decision derived from the typed experiment, made once
//! before anything runs, and every "this build cannot run this, because …" check, in one place.
//! - `RunPlan`: how the job's ranks start (in this process, or one process per device), where this
//!   process sits (`comm::env`), how the process group forms (Gloo, NCCL for CUDA tensors), and what this
//!   build and machine can do for it;
//! - `LoopPlan`: the training loop's arithmetic for this rank (batches, accumulation, steps, validation
//!   rounds and checks, limits, `fast_dev_run`, `overfit_batches`), from the data sets' sizes.
//!
//! Pure: the machine's facts come in as a value (`Machine`) and the environment as a function, so every
//! decision is a unit test. Checks of the config's own consistency (types, ranges, choices) stay with the
//! typed schema (`schema::validate`); what is left here depends on the build, the machine or the launcher.

use crate::comm::env::Cluster;
use crate::comm::JoinOptions;
use crate::schema::{
    Accelerator, Backend, BatchSizeFinder, Devices, Experiment, FastDevRun, Limit, Limit0,
    Precision, ProcessGroupBackend, StateDictType, Strategy,
};

/// What this build and machine offer a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Machine {
    /// The build has libtorch (`--features torch`): the tch backend and c10d's collectives.
    pub torch: bool,
    /// The build has the S3 client (`--features s3`).
    pub s3: bool,
    /// The build carries the NCCL shim.
    pub nccl_shim: bool,
    /// CUDA devices libtorch sees; 0 with the reason when there are none (or CUDA was not asked about).
    pub cuda_devices: usize,
    pub cuda_missing: String,
    /// The process counts its heap (the `train` binary's allocator): the batch-size finder's CPU budget.
    pub heap_accounting: bool,
}

impl Machine {
    /// This build and machine. CUDA is probed only when `exp` could use it (a tch run not pinned to the
    /// CPU), so a Candle run never loads libtorch's CUDA library.
    #[cfg_attr(not(feature = "torch"), allow(unused_mut))]
    pub fn probe(exp: &Experiment) -> Machine {
        let mut machine = Machine {
            torch: cfg!(feature = "torch"),
            s3: crate::storage::s3::AVAILABLE,
            nccl_shim: false,
            cuda_devices: 0,
            cuda_missing: "CUDA was not asked about (not a tch run on a GPU)".into(),
            heap_accounting: crate::platform::memory::is_counting(),
        };
        #[cfg(feature = "torch")]
        {
            machine.nccl_shim = crate::comm::nccl::built();
            if exp.backend == Backend::Tch && exp.trainer.accelerator != Accelerator::Cpu {
                if crate::platform::cuda::is_available() {
                    machine.cuda_devices = crate::platform::cuda::device_count();
                } else {
                    machine.cuda_missing = crate::platform::cuda::why_unavailable();
                }
            }
        }
        #[cfg(not(feature = "torch"))]
        let _ = exp;
        machine
    }
}

/// How a job's ranks start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankProcesses {
    /// This process trains (single device; DataParallel's replicas in threads).
    InProcess,
    /// One process per device: `train` starts this node's workers, or an external launcher (torchrun,
    /// srun) started this process as one of them.
    ProcessPerDevice,
}

/// Where and how a job runs.
#[derive(Debug, Clone)]
pub struct RunPlan {
    pub strategy: Strategy,
    pub launch: RankProcesses,
    /// Devices on each node: DDP/FSDP processes, DataParallel replicas; 1 for a single device.
    pub devices_per_node: usize,
    /// Where this process sits among the run's processes (process-per-device strategies).
    pub cluster: Option<Cluster>,
    /// How the process group forms (process-per-device strategies).
    pub join: JoinOptions,
    /// FSDP writes one checkpoint file per rank.
    pub sharded_checkpoints: bool,
    /// The batch-size finder's settings, when it runs before training.
    pub batch_size_finder: Option<BatchSizeFinder>,
    /// What the run should hear about but not stop for.
    pub warnings: Vec<String>,
}

impl RunPlan {
    /// Plan `exp` on `machine`, reading the launcher's environment through `env`; refuses, by name and
    /// with the fix, what this build or machine cannot run.
    pub fn new(
        exp: &Experiment,
        machine: &Machine,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> anyhow::Result<RunPlan> {
        check_supported(exp, machine)?;
        check_in_process_placement(exp, env)?;
        let t = &exp.trainer;
        let launch = match t.strategy {
            Strategy::Single | Strategy::Dp => RankProcesses::InProcess,
            Strategy::Ddp | Strategy::Fsdp => RankProcesses::ProcessPerDevice,
        };
        let devices_per_node = devices_per_node(exp, machine);
        let cluster = match launch {
            RankProcesses::ProcessPerDevice => Some(crate::comm::env::detect(
                env,
                devices_per_node,
                t.num_nodes,
            )?),
            RankProcesses::InProcess => None,
        };
        let mut warnings = Vec::new();
        let nccl =
            launch == RankProcesses::ProcessPerDevice && wants_nccl(exp, machine, &mut warnings)?;
        let batch_size_finder = finder_config(exp, &mut warnings)?;
        if let Some(cfg) = &batch_size_finder {
            check_finder(exp, cfg, machine)?;
        }
        Ok(RunPlan {
            strategy: t.strategy,
            launch,
            devices_per_node,
            cluster,
            join: JoinOptions {
                nccl,
                rendezvous_timeout_s: t.rendezvous_timeout_s,
                collective_timeout_s: t.collective_timeout_s,
            },
            sharded_checkpoints: t.strategy == Strategy::Fsdp
                && t.fsdp.as_ref().map(|f| f.state_dict_type) == Some(StateDictType::Sharded),
            batch_size_finder,
            warnings,
        })
    }

    /// Must this process start the node's workers (no external launcher started it as one)?
    pub fn launches_workers(&self) -> bool {
        self.cluster.as_ref().is_some_and(|c| c.worker.is_none())
    }

    /// A sweep's jobs run one after another in this process: a job that must start workers of its own
    /// cannot be one of them.
    pub fn check_sweepable(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            !self.launches_workers(),
            "a multirun of distributed jobs: launch each job on its own (without -m), or sweep with \
             trainer=single"
        );
        Ok(())
    }
}

/// The finder's settings when the run asks for one: `callbacks.batch_size_finder`, with its mode taken
/// from `trainer.auto_scale_batch_size` when that is set (Lightning 1.x's flag). Skipped under
/// `fast_dev_run`, as Lightning does.
fn finder_config(
    exp: &Experiment,
    warnings: &mut Vec<String>,
) -> anyhow::Result<Option<BatchSizeFinder>> {
    let mut cfg = match (
        &exp.callbacks.batch_size_finder,
        exp.trainer.auto_scale_batch_size,
    ) {
        (None, None) => return Ok(None),
        (Some(c), _) => c.clone(),
        (None, Some(_)) => serde_json::from_value(serde_json::json!({}))?,
    };
    if let Some(mode) = exp.trainer.auto_scale_batch_size {
        cfg.mode = mode;
    }
    if !matches!(
        exp.trainer.fast_dev_run,
        FastDevRun::Flag(false) | FastDevRun::Batches(0)
    ) {
        warnings.push(
            "batch size finder skipped: trainer.fast_dev_run is set (as Lightning does)".into(),
        );
        return Ok(None);
    }
    Ok(Some(cfg))
}

/// The finder measures what it tries: on the CPU against a heap budget, which needs the counting
/// allocator that only the `train` binary installs.
fn check_finder(exp: &Experiment, cfg: &BatchSizeFinder, machine: &Machine) -> anyhow::Result<()> {
    let on_gpu = matches!(
        exp.trainer.accelerator,
        Accelerator::Gpu | Accelerator::Cuda
    );
    anyhow::ensure!(
        on_gpu || cfg.max_memory.is_some() || cfg.max_val.is_some(),
        "the batch size finder on the CPU needs a memory budget: set callbacks.batch_size_finder.max_memory \
         (bytes; e.g. +callbacks.batch_size_finder.max_memory=4000000000) or max_val — nothing runs out of \
         device memory here"
    );
    anyhow::ensure!(
        cfg.max_memory.is_none() || machine.heap_accounting,
        "callbacks.batch_size_finder.max_memory needs heap accounting, which only the `train` binary installs"
    );
    Ok(())
}

/// Local devices per node (DDP's processes, DataParallel's replicas): `trainer.devices`, or with `auto`
/// the visible GPUs of a tch run (one on the CPU, as Lightning does; Candle runs on the CPU here).
pub fn devices_per_node(exp: &Experiment, machine: &Machine) -> usize {
    match exp.trainer.devices {
        Devices::Count(n) => n,
        Devices::Auto => machine.cuda_devices.max(1),
    }
}

/// Refuse, by name, what the experiment asks for that this build cannot do, rather than ignore it.
fn check_supported(exp: &Experiment, machine: &Machine) -> anyhow::Result<()> {
    let t = &exp.trainer;
    let mut missing: Vec<String> = Vec::new();
    if matches!(t.strategy, Strategy::Ddp | Strategy::Fsdp) && !machine.torch {
        missing.push(format!(
            "trainer.strategy={}: its collectives are libtorch's c10d (Gloo), which this build does not \
             have; eval \"$(scripts/install-libtorch.sh)\" and rebuild with --features torch",
            t.strategy
        ));
    }
    if t.sync_batchnorm && t.strategy == Strategy::Dp {
        missing.push(
            "trainer.sync_batchnorm=true with trainer.strategy=dp: SyncBatchNorm reduces over the ranks of a \
             process group (ddp, fsdp), as PyTorch's does; use trainer=ddp, or set \
             trainer.sync_batchnorm=false"
                .into(),
        );
    }
    if matches!(t.strategy, Strategy::Ddp | Strategy::Fsdp)
        && (t.auto_scale_batch_size.is_some() || exp.callbacks.batch_size_finder.is_some())
    {
        missing.push(format!(
            "trainer.auto_scale_batch_size with trainer.strategy={}: find the batch size with one device \
             (trainer=single), then train with it",
            t.strategy
        ));
    }
    if matches!(t.accelerator, Accelerator::Gpu | Accelerator::Cuda)
        && exp.backend == Backend::Candle
    {
        missing.push(
            "trainer.accelerator=gpu on backend=candle: Candle's CUDA path; use backend=tch for GPUs, \
             or trainer.accelerator=cpu (or auto)"
                .into(),
        );
    }
    if let Some(spec) = exp.model.registered.as_deref() {
        let target = &spec.target;
        // On Candle a registered model is built over the engine's variables, so FSDP shards it as one
        // unit (PyTorch's FSDP without an auto-wrap policy); a libtorch module holds its own tensors.
        if t.strategy == Strategy::Fsdp && exp.backend == Backend::Tch {
            missing.push(format!(
                "trainer.strategy=fsdp with model _target_ {target} on backend=tch: the module holds its \
                 own tensors, which FSDP cannot swap for its flat shards; use trainer=ddp, or \
                 backend=candle (a model registered with register_candle_model! shards as one FSDP unit)"
            ));
        }
        if exp.backend == Backend::Tch && !crate::registry::runs_on_tch(target) {
            missing.push(format!(
                "backend=tch with model _target_ {target}: it is registered for Candle \
                 (register_candle_model!); register its tch version under the same _target_ with \
                 register_tch_model!, or use backend=candle"
            ));
        }
        if exp.backend == Backend::Candle && crate::registry::model(target).is_none() {
            missing.push(format!(
                "backend=candle with model _target_ {target}: it runs on libtorch only (register_tch_model!, \
                 or a TorchScript module); use backend=tch"
            ));
        }
    }
    if let Some(loss) = &exp.loss {
        let target = &loss.spec.target;
        if exp.backend == Backend::Tch && !crate::registry::loss_runs_on_tch(target) {
            missing.push(format!(
                "backend=tch with loss: _target_ {target}: it is registered for Candle \
                 (register_candle_loss!); register its tch version under the same _target_ with \
                 register_tch_loss!, or use backend=candle"
            ));
        }
        if exp.backend == Backend::Candle && crate::registry::loss(target).is_none() {
            missing.push(format!(
                "backend=candle with loss: _target_ {target}: it runs on libtorch only \
                 (register_tch_loss!); use backend=tch"
            ));
        }
    }
    if exp.backend == Backend::Tch && !machine.torch {
        missing.push(
            "backend=tch: this build has no libtorch; eval \"$(scripts/install-libtorch.sh)\" and \
             rebuild with --features torch"
                .into(),
        );
    }
    if exp.backend == Backend::Candle
        && !matches!(t.precision, Precision::Full | Precision::MixedBf16)
    {
        missing.push(format!(
            "trainer.precision={}: the Candle CPU backend runs 32-true and bf16-mixed only (fp16 with loss \
             scaling and pure-bf16 weights need backend=tch)",
            serde_json::to_value(t.precision)
                .unwrap_or_default()
                .as_str()
                .unwrap_or("?")
        ));
    }
    let remote_dir = exp
        .callbacks
        .model_checkpoint
        .as_ref()
        .is_some_and(|c| crate::storage::s3::is_s3(&c.dirpath));
    let remote_ckpt = exp
        .ckpt_path
        .as_deref()
        .is_some_and(crate::storage::s3::is_s3);
    if (remote_dir || remote_ckpt) && !machine.s3 {
        missing.push(
            "s3:// checkpoints (callbacks.model_checkpoint.dirpath / ckpt_path): this build has no S3 \
             support; rebuild with `cargo build --release --features s3`"
                .into(),
        );
    }
    if missing.is_empty() {
        return Ok(());
    }
    anyhow::bail!(
        "this build cannot run the experiment as configured yet; not implemented:\n    - {}",
        missing.join("\n    - ")
    )
}

/// `trainer.strategy=dp` is one process on one node: refuse several nodes, and refuse being one of several
/// processes started by an external launcher (each would train alone on the whole data set). `env` reads
/// the environment.
fn check_in_process_placement(
    exp: &Experiment,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<()> {
    if exp.trainer.strategy != Strategy::Dp {
        return Ok(());
    }
    anyhow::ensure!(
        exp.trainer.num_nodes <= 1,
        "trainer.strategy=dp with trainer.num_nodes={}: DataParallel runs in one process on one node; set \
         trainer.num_nodes=1, or use trainer=ddp to train across nodes",
        exp.trainer.num_nodes
    );
    let number = |key: &str| env(key).and_then(|v| v.trim().parse::<usize>().ok());
    let interactive_slurm = matches!(
        env("SLURM_JOB_NAME").as_deref(),
        Some("bash" | "interactive")
    );
    let launched = match (number("WORLD_SIZE"), number("SLURM_NTASKS")) {
        (Some(n), _) if n > 1 && env("RANK").is_some() => Some(("WORLD_SIZE", n, "torchrun")),
        (_, Some(n)) if n > 1 && !interactive_slurm => Some(("SLURM_NTASKS", n, "srun")),
        _ => None,
    };
    if let Some((key, n, launcher)) = launched {
        anyhow::bail!(
            "trainer.strategy=dp runs every replica in one process, but this process is one of {n} ({key}={n}): \
             start `train ... trainer=dp` once, without {launcher}, or use trainer=ddp for one process per device"
        );
    }
    Ok(())
}

/// Does the process group take NCCL for its CUDA tensors? `trainer.process_group_backend=nccl` must be
/// able to (tch on a CUDA device, with the NCCL shim built in); unset, NCCL is taken where it can be, as
/// Lightning picks nccl on GPUs (a run that asks for a GPU and has none fails in the engine, with its own
/// message). Host-side collectives always stay on Gloo.
fn wants_nccl(
    exp: &Experiment,
    machine: &Machine,
    warnings: &mut Vec<String>,
) -> anyhow::Result<bool> {
    let t = &exp.trainer;
    // gpu, cuda and auto all need a device libtorch can see.
    let on_cuda = exp.backend == Backend::Tch
        && t.accelerator != Accelerator::Cpu
        && machine.cuda_devices > 0;
    match t.process_group_backend {
        Some(ProcessGroupBackend::Gloo) => Ok(false),
        Some(ProcessGroupBackend::Nccl) => {
            anyhow::ensure!(
                exp.backend == Backend::Tch,
                "trainer.process_group_backend=nccl needs backend=tch (Candle runs on the CPU here); \
                 use trainer.process_group_backend=gloo (or null)"
            );
            anyhow::ensure!(
                on_cuda,
                "trainer.process_group_backend=nccl needs a run on CUDA, and trainer.accelerator={} {}; \
                 use trainer.accelerator=gpu on a GPU machine, or trainer.process_group_backend=gloo \
                 (or null)",
                format!("{:?}", t.accelerator).to_lowercase(),
                if t.accelerator == Accelerator::Cpu {
                    "is the CPU".to_string()
                } else {
                    format!("finds no GPU: {}", machine.cuda_missing)
                }
            );
            anyhow::ensure!(
                machine.nccl_shim,
                "trainer.process_group_backend=nccl: this build has no NCCL shim (build.rs found no \
                 CUDA/NCCL headers; scripts/install-libtorch.sh fetches them); rebuild, or use \
                 trainer.process_group_backend=gloo"
            );
            Ok(true)
        }
        None if !on_cuda => Ok(false),
        None if !machine.nccl_shim => {
            warnings.push(
                "this build has no NCCL shim: CUDA tensors are reduced through Gloo (host copies, slow); \
                 rebuild with the CUDA/NCCL headers (scripts/install-libtorch.sh) for NCCL"
                    .into(),
            );
            Ok(false)
        }
        None => Ok(true),
    }
}

/// The training loop's arithmetic for one rank (Lightning's fit loop): how many batches an epoch trains
/// and validates, how they group into optimizer steps, when validation runs, when training ends.
#[derive(Debug, Clone, PartialEq)]
pub struct LoopPlan {
    /// Training batches per epoch (after `fast_dev_run`, `overfit_batches`, `limit_train_batches`).
    pub train_batches: usize,
    /// Micro-batches per optimizer step (`accumulate_grad_batches`).
    pub accumulate: usize,
    pub steps_per_epoch: u64,
    pub max_epochs: u64,
    /// `max_steps`, when set.
    pub max_steps: Option<u64>,
    /// Optimizer steps the schedule spans.
    pub total_steps: u64,
    /// This rank's validation batches, and the rounds every rank takes part in (the largest share's):
    /// every image is validated once, and a rank whose share is used up joins the others' collectives.
    pub val_batches: usize,
    pub val_rounds: usize,
    /// Mid-epoch validation every this many batches (`val_check_interval`).
    pub val_every: Option<usize>,
    pub check_val_every_n_epoch: u64,
    /// `overfit_batches`: validation runs on the training set's first batches.
    pub overfit: bool,
    /// Callbacks and loggers run (off under `fast_dev_run`, as Lightning does).
    pub callbacks_on: bool,
    pub log_every_n_steps: u64,
}

/// How many samples one rank trains and validates on per epoch (its samplers' shares).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shares {
    /// This rank's training samples (the same on every rank).
    pub train: usize,
    /// This rank's validation samples, and the largest rank's (validation shares are not padded).
    pub val: usize,
    pub val_largest: usize,
}

impl Shares {
    /// Rank `rank` of `world` over data sets of `train_len` and `val_len` samples read by index: the
    /// training shares padded to equal length (PyTorch's DistributedSampler), rank r validating every
    /// world-th sample from r.
    pub fn by_index(rank: usize, world: usize, train_len: usize, val_len: usize) -> Shares {
        let world = world.max(1);
        Shares {
            train: train_len.div_ceil(world),
            val: val_len.saturating_sub(rank).div_ceil(world),
            val_largest: val_len.div_ceil(world),
        }
    }
}

impl LoopPlan {
    /// The loop for one rank whose samplers give it `shares` (the validation set is the training set
    /// under `overfit_batches`).
    pub fn new(exp: &Experiment, shares: Shares) -> anyhow::Result<LoopPlan> {
        let t = &exp.trainer;
        let batch = exp.data.batch_size.max(1);
        anyhow::ensure!(shares.train > 0, "the training set is empty");
        let fast_dev = match t.fast_dev_run {
            FastDevRun::Flag(true) => Some(1usize),
            FastDevRun::Batches(n) if n > 0 => Some(n as usize),
            _ => None,
        };
        let overfit = overfit_limit(exp);
        let share = shares.train;
        let available = match exp.data.drop_last {
            true => share / batch,
            false => share.div_ceil(batch),
        };
        let train_batches = match (fast_dev, overfit) {
            (Some(n), _) => n.min(available),
            (None, Some(limit)) => limited(available, limit),
            (None, None) => limited(available, t.limit_train_batches),
        };
        anyhow::ensure!(
            train_batches > 0,
            "no training batches: check data.batch_size and trainer.limit_train_batches"
        );
        let val_batches_of = |samples: usize| {
            let available = samples.div_ceil(batch);
            match (fast_dev, overfit) {
                (Some(n), _) => n.min(available),
                (None, Some(_)) => train_batches,
                (None, None) => limited(available, t.limit_val_batches),
            }
        };
        let (mine, largest) = (shares.val, shares.val_largest);
        let accumulate = t.accumulate_grad_batches.max(1) as usize;
        let steps_per_epoch = train_batches.div_ceil(accumulate) as u64;
        let max_epochs = if fast_dev.is_some() { 1 } else { t.max_epochs };
        let max_steps = (t.max_steps > 0).then_some(t.max_steps as u64);
        // Lightning's val_check_interval: a fraction of the epoch's batches, or every N batches.
        let val_every = match t.val_check_interval {
            Limit::Fraction(f) if f < 1.0 => {
                Some(((train_batches as f64 * f).floor() as usize).max(1))
            }
            Limit::Fraction(_) => None,
            Limit::Batches(n) => {
                let n = (n as usize).max(1);
                anyhow::ensure!(
                    n <= train_batches,
                    "trainer.val_check_interval={n} is more than the {train_batches} training batches of an \
                     epoch: use at most {train_batches}, or a fraction such as 0.25"
                );
                Some(n)
            }
        };
        Ok(LoopPlan {
            train_batches,
            accumulate,
            steps_per_epoch,
            max_epochs,
            max_steps,
            total_steps: max_steps.unwrap_or(max_epochs * steps_per_epoch),
            val_batches: val_batches_of(mine),
            val_rounds: val_batches_of(largest),
            val_every,
            check_val_every_n_epoch: t.check_val_every_n_epoch.max(1),
            overfit: overfit.is_some(),
            callbacks_on: fast_dev.is_none(),
            log_every_n_steps: t.log_every_n_steps.max(1),
        })
    }

    /// `test: true` over this rank's `mine` test samples (the largest rank's `largest`): its batches and
    /// the rounds every rank takes part in (shares unpadded, as validation's), within `limit_test_batches` or `fast_dev_run`.
    pub fn test_batches(exp: &Experiment, mine: usize, largest: usize) -> (usize, usize) {
        Self::measured_batches(exp, exp.trainer.limit_test_batches, mine, largest)
    }

    /// `train predict`'s batches, as `test_batches` with `limit_predict_batches`.
    pub fn predict_batches(exp: &Experiment, mine: usize, largest: usize) -> (usize, usize) {
        Self::measured_batches(exp, exp.trainer.limit_predict_batches, mine, largest)
    }

    fn measured_batches(
        exp: &Experiment,
        limit: Limit,
        mine: usize,
        largest: usize,
    ) -> (usize, usize) {
        let batch = exp.data.batch_size.max(1);
        let batches_of = |samples: usize| {
            let available = samples.div_ceil(batch);
            match exp.trainer.fast_dev_run {
                FastDevRun::Flag(true) => available.min(1),
                FastDevRun::Batches(n) if n > 0 => available.min(n as usize),
                _ => limited(available, limit),
            }
        };
        (batches_of(mine), batches_of(largest))
    }

    /// Does any rank validate at all?
    pub fn validates(&self) -> bool {
        self.val_rounds > 0
    }

    /// Does the mid-epoch validation after batch `i` (0-based) of `epoch` run?
    pub fn validates_after_batch(&self, epoch: u64, i: usize) -> bool {
        self.val_every.is_some_and(|n| (i + 1).is_multiple_of(n))
            && i + 1 < self.train_batches
            && self.validates()
            && (epoch + 1).is_multiple_of(self.check_val_every_n_epoch)
    }

    /// Does validation run when epoch `epochs_done - 1` ends?
    pub fn validates_at_epoch_end(&self, epochs_done: u64) -> bool {
        self.validates()
            && (epochs_done.is_multiple_of(self.check_val_every_n_epoch)
                || epochs_done == self.max_epochs)
    }

    /// Does batch `i` end an accumulation window (an optimizer step follows it)?
    pub fn ends_window(&self, i: usize) -> bool {
        (i + 1).is_multiple_of(self.accumulate) || i + 1 == self.train_batches
    }
}

/// `overfit_batches`, when set: training and validation both run on the training set's first batches.
pub fn overfit_limit(exp: &Experiment) -> Option<Limit> {
    match exp.trainer.overfit_batches {
        Limit0::Batches(n) if n > 0 => Some(Limit::Batches(n)),
        Limit0::Fraction(f) if f > 0.0 => Some(Limit::Fraction(f)),
        _ => None,
    }
}

/// How many of `available` batches a limit allows (Lightning's rules: an int counts, a float is a fraction).
fn limited(available: usize, limit: Limit) -> usize {
    match limit {
        Limit::Batches(n) => available.min(n as usize),
        Limit::Fraction(f) => {
            let n = (available as f64 * f).floor() as usize;
            if f > 0.0 {
                n.max(1).min(available)
            } else {
                0
            }
        }
    }
}

#[cfg(test)]
mod tests;
