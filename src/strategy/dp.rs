//! DataParallel (`trainer=dp`), as `torch.nn.DataParallel` and Lightning's DP strategy do it: one process,
//! N replicas of the model (`trainer.devices`; on CUDA replica r on cuda:r), each in a thread of its own.
//! The loader's batch is the global batch; it is scattered into contiguous chunks (`scatter`), every replica
//! runs forward and backward on its chunk at the same time, the gradients are combined into exactly the
//! full batch's mean gradient, and every replica takes the same optimizer step.
//!
//! The combination is DDP's gradient mean (`ddp::average_gradients`) over an in-process group
//! (`comm::local`): replica r scales its loss by N·len(r)/B, so the mean over N replicas is
//! Σ len(r)/B · grad(r), the full batch's mean. A replica without rows contributes zero gradients. tch
//! replicas average their gradient buckets device to device through that group; Candle's go through the host.
//!
//! BatchNorm: PyTorch re-replicates the module from device 0 at every forward pass, so only replica 0's
//! running statistics (from chunk 0) survive. Here replica 0 is the model: its state is what `state_dict`
//! returns, and the others take replica 0's buffers before they evaluate.

use super::scatter::scatter;
use super::{Ranks, Strategy};
use crate::backend::{self, Engine, Placement, StateBytes, StepStats};
use crate::comm::buckets::GradSync;
use crate::comm::local::{self, LocalCollective};
use crate::data::loader::Batch;
use crate::optim::GradClip;
use crate::schema::Experiment;
use crate::tensor::StateDict;

pub struct DataParallel {
    replicas: Vec<Box<dyn Engine>>,
    comms: Vec<LocalCollective>,
    /// One process: rank 0 of 1 (the replicas are not ranks).
    ranks: Ranks,
    /// DDP's buckets; parameters without a gradient count as zero (a replica may get no rows, and
    /// DataParallel has no unused-parameter check).
    sync: GradSync,
    /// The model has BatchNorm running statistics (decided once).
    has_buffers: bool,
    /// Replicas other than 0 hold running statistics of their own chunks since the last training pass.
    buffers_stale: bool,
}

impl DataParallel {
    /// `devices` replicas of the experiment's engine, replica r on device r.
    pub fn build(exp: &Experiment, devices: usize) -> anyhow::Result<Self> {
        let replicas = (0..devices)
            .map(|r| {
                let placement = Placement {
                    device_index: r,
                    ..Placement::default()
                };
                backend::build(exp, &placement)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let mut sync = super::ddp::grad_sync(exp);
        sync.find_unused_parameters = true;
        Self::new(replicas, sync)
    }

    /// Replicas that start alike: every one is made replica 0's copy.
    pub fn new(replicas: Vec<Box<dyn Engine>>, sync: GradSync) -> anyhow::Result<Self> {
        anyhow::ensure!(
            !replicas.is_empty(),
            "trainer.strategy=dp needs at least one device: set trainer.devices"
        );
        let state = replicas[0].state_dict()?;
        let has_buffers = state.keys().any(|k| k.contains("running_"));
        let mut engine = DataParallel {
            comms: local::group(replicas.len()),
            ranks: Ranks::single(),
            replicas,
            sync,
            has_buffers,
            buffers_stale: false,
        };
        engine.load_into_others(&state)?;
        Ok(engine)
    }

    /// Load replica 0's `state` into every other replica.
    fn load_into_others(&mut self, state: &StateDict) -> anyhow::Result<()> {
        for (r, replica) in self.replicas.iter_mut().enumerate().skip(1) {
            replica
                .load_state_dict(state)
                .map_err(|e| e.context(format!("dp replica {r}")))?;
        }
        Ok(())
    }

    /// Run `job` on every replica at once, one thread each; results in replica order. A replica that
    /// fails (or panics) stops the group, so no other is left waiting for it in a collective.
    fn on_all<T: Send>(
        &mut self,
        job: impl Fn(usize, &mut dyn Engine, &LocalCollective) -> anyhow::Result<T> + Sync,
    ) -> anyhow::Result<Vec<T>> {
        /// Aborts the group if the replica's job did not succeed: on an error and on a panic alike.
        struct AbortUnlessDone<'a> {
            comm: &'a LocalCollective,
            replica: usize,
            done: bool,
        }
        impl Drop for AbortUnlessDone<'_> {
            fn drop(&mut self) {
                if !self.done {
                    self.comm
                        .abort(&format!("dp replica {} failed", self.replica));
                }
            }
        }
        let job = &job;
        // The run's logging is scoped to this thread: each replica logs through it too.
        let logging = &tracing::dispatcher::get_default(|d| d.clone());
        let results: Vec<anyhow::Result<T>> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .replicas
                .iter_mut()
                .zip(&self.comms)
                .enumerate()
                .map(|(r, (engine, comm))| {
                    s.spawn(move || {
                        tracing::dispatcher::with_default(logging, || {
                            let mut guard = AbortUnlessDone {
                                comm,
                                replica: r,
                                done: false,
                            };
                            let out = job(r, engine.as_mut(), comm);
                            guard.done = out.is_ok();
                            out
                        })
                    })
                })
                .collect();
            handles
                .into_iter()
                .enumerate()
                .map(|(r, h)| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("panicked")))
                        .map_err(|e| e.context(format!("dp replica {r}")))
                })
                .collect()
        });
        // A replica released from a collective by another's failure reports only that: report the cause.
        let (mut values, mut cause, mut released) = (Vec::new(), None, None);
        for result in results {
            match result {
                Ok(v) => values.push(v),
                Err(e) if e.downcast_ref::<local::Aborted>().is_some() => {
                    released.get_or_insert(e);
                }
                Err(e) => {
                    cause.get_or_insert(e);
                }
            }
        }
        match cause.or(released) {
            Some(e) => Err(e),
            None => Ok(values),
        }
    }

    /// `batch` scattered, `job` run on each replica's chunk at once, the statistics summed.
    fn on_chunks(
        &mut self,
        batch: &Batch,
        job: impl Fn(&mut dyn Engine, &Batch) -> anyhow::Result<StepStats> + Sync,
    ) -> anyhow::Result<StepStats> {
        let parts = scatter(batch, self.replicas.len());
        let stats = self.on_all(|r, engine, _| match parts.get(r) {
            Some(part) => job(engine, part),
            None => Ok(StepStats::default()),
        })?;
        let mut total = StepStats::default();
        for s in &stats {
            total.add(s);
        }
        Ok(total)
    }
}

impl Strategy for DataParallel {
    fn ranks(&self) -> &Ranks {
        &self.ranks
    }
    /// Replica 0: checkpoints, the loss scale and the parameter count are its (every replica holds the
    /// same model).
    fn engine(&self) -> &dyn Engine {
        self.replicas[0].as_ref()
    }
    fn engine_mut(&mut self) -> &mut dyn Engine {
        self.replicas[0].as_mut()
    }

    fn replicas(&self) -> usize {
        self.replicas.len()
    }

    fn forward_backward(
        &mut self,
        batch: &Batch,
        grad_scale: f64,
        _ends_window: bool,
    ) -> anyhow::Result<StepStats> {
        let (n, rows) = (self.replicas.len(), batch.len());
        let stats = self.on_chunks(batch, |engine, part| {
            // Averaging over n replicas then gives Σ len/B · grad(chunk): the full batch's mean.
            let weight = (part.len() * n) as f64 / rows as f64;
            engine.forward_backward(part, grad_scale * weight)
        })?;
        self.buffers_stale |= self.has_buffers;
        Ok(stats)
    }

    /// Every replica averages its gradients with the others' (DDP's mean over the in-process group)
    /// and takes the same step.
    fn optimizer_step(
        &mut self,
        lr: f64,
        momentum: Option<f64>,
        clip: Option<GradClip>,
    ) -> anyhow::Result<f64> {
        let sync = self.sync;
        let norms = self.on_all(|_, engine, comm| {
            let mut grads = engine.take_gradients()?;
            super::ddp::average_gradients(comm, &mut grads, &sync)?;
            engine.put_gradients(grads)?;
            engine.optimizer_step(lr, momentum, clip)
        })?;
        Ok(norms[0])
    }

    /// The replicas' outputs in the order their chunks were cut: the batch's, whole.
    fn take_outputs(&mut self) -> anyhow::Result<Option<crate::tensor::HostTensor>> {
        let mut whole: Option<crate::tensor::HostTensor> = None;
        for replica in &mut self.replicas {
            let Some(part) = replica.take_outputs()? else {
                continue;
            };
            match whole.as_mut() {
                None => whole = Some(part),
                Some(w) => {
                    anyhow::ensure!(
                        w.shape[1..] == part.shape[1..],
                        "replicas' outputs differ in shape: {:?} and {:?}",
                        w.shape,
                        part.shape
                    );
                    w.shape[0] += part.shape[0];
                    w.data.extend(part.data);
                }
            }
        }
        Ok(whole)
    }

    fn evaluate(&mut self, batch: &Batch) -> anyhow::Result<StepStats> {
        if self.buffers_stale {
            let state = self.replicas[0].state_dict()?;
            self.load_into_others(&state)?;
            self.buffers_stale = false;
        }
        self.on_chunks(batch, |engine, part| engine.evaluate(part))
    }

    fn load_state_dict(&mut self, state: &StateDict) -> anyhow::Result<()> {
        self.replicas[0].load_state_dict(state)?;
        self.load_into_others(state)?;
        self.buffers_stale = false;
        Ok(())
    }

    fn load_pretrained(
        &mut self,
        published: &StateDict,
        head: &[String],
    ) -> anyhow::Result<Vec<String>> {
        let kept = backend::load_pretrained(self.replicas[0].as_mut(), published, head)?;
        let state = self.replicas[0].state_dict()?;
        self.load_into_others(&state)?;
        Ok(kept)
    }

    /// Every replica's, together: what this one process holds.
    fn state_bytes(&self) -> StateBytes {
        let mut total = StateBytes::default();
        for replica in &self.replicas {
            let b = replica.state_bytes();
            total.parameters += b.parameters;
            total.gradients += b.gradients;
            total.optimizer_state += b.optimizer_state;
            total.unsharded_peak += b.unsharded_peak;
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::rng::Rng;
    use crate::schema::Backend;
    use rstest::rstest;

    fn experiment_on(backend: Backend, model: &str) -> Experiment {
        let mut exp = experiment(model);
        exp.backend = backend;
        exp
    }

    fn experiment(model: &str) -> Experiment {
        crate::testing::experiment(
            model,
            "{name: sgd, lr: 0.1, momentum: 0.9, nesterov: true, weight_decay: 0.01}",
            "{strategy: dp, devices: 2}",
            4,
        )
    }

    fn batch(rows: usize, seed: u64) -> Batch {
        let mut rng = Rng::new(seed);
        Batch {
            images: (0..rows * 3 * 8 * 8).map(|_| rng.normal() as f32).collect(),
            labels: (0..rows as u32)
                .map(|i| (i * 7 + seed as u32) % 4)
                .collect(),
            channels: 3,
            height: 8,
            width: 8,
            staged: None,
            tensors: None,
        }
    }

    fn one(exp: &Experiment) -> Box<dyn Engine> {
        backend::build(exp, &Placement::single()).unwrap()
    }

    fn data_parallel(exp: &Experiment, n: usize) -> DataParallel {
        let replicas = (0..n).map(|_| one(exp)).collect();
        let mut sync = crate::strategy::ddp::grad_sync(exp);
        sync.find_unused_parameters = true;
        DataParallel::new(replicas, sync).unwrap()
    }

    /// ‖a − b‖ / ‖b‖, worst tensor.
    fn worst(a: &StateDict, b: &StateDict) -> f64 {
        assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
        a.iter()
            .map(|(k, x)| {
                let (mut d, mut n) = (0.0f64, 0.0f64);
                for (p, q) in x.data.iter().zip(&b[k].data) {
                    d += f64::from(p - q).powi(2);
                    n += f64::from(*q).powi(2);
                }
                d.sqrt() / n.sqrt().max(1e-12)
            })
            .fold(0.0, f64::max)
    }

    /// N replicas on scattered chunks take the step one engine takes on the whole batch: SGD with
    /// momentum over 3 steps of 2 accumulated micro-batches, including batches that do not divide by N and
    /// batches with fewer rows than replicas (replicas without rows contribute zero).
    #[rstest]
    #[case::candle(Backend::Candle)]
    #[cfg_attr(feature = "torch", case::tch(Backend::Tch))]
    fn replicas_take_the_whole_batch_step(
        #[case] backend: Backend,
        #[values((8, 2), (7, 3), (5, 3), (2, 3))] rows_and_replicas: (usize, usize),
    ) {
        let (rows, n) = rows_and_replicas;
        let exp = experiment_on(backend, "{name: mlp, num_classes: 4, hidden: [16]}");
        let mut one = one(&exp);
        let mut dp = data_parallel(&exp, n);
        for step in 0..3u64 {
            for micro in 0..2 {
                let b = batch(rows, step * 2 + micro);
                let s1 = one.forward_backward(&b, 0.5).unwrap();
                let sn = dp.forward_backward(&b, 0.5, micro == 1).unwrap();
                assert_eq!(sn.count, s1.count);
                assert!((sn.loss_sum - s1.loss_sum).abs() < 1e-5 * s1.loss_sum.abs().max(1.0));
            }
            let g1 = one
                .optimizer_step(0.1, None, Some(GradClip::Norm(10.0)))
                .unwrap();
            let gn = dp
                .optimizer_step(0.1, None, Some(GradClip::Norm(10.0)))
                .unwrap();
            assert!((g1 - gn).abs() < 1e-5 * g1, "gradient norm {gn} vs {g1}");
        }
        let worst = worst(&dp.state_dict().unwrap(), &one.state_dict().unwrap());
        assert!(worst < 1e-5, "dp differs from one engine by {worst:e}");
        // Every replica holds the same model and optimizer state (a replica without rows has counted
        // fewer forward passes, which only keys dropout masks).
        let model = |r: usize| -> StateDict {
            let mut s = dp.replicas[r].state_dict().unwrap();
            s.remove("optimizer.forward_calls");
            s
        };
        for r in 1..n {
            assert!(model(r) == model(0), "replica {r} differs from replica 0");
        }
        let e1 = one.evaluate(&batch(rows, 99)).unwrap();
        let en = dp.evaluate(&batch(rows, 99)).unwrap();
        assert_eq!((en.count, en.correct1), (e1.count, e1.correct1));
    }

    /// BatchNorm under DataParallel: the model's running statistics are replica 0's (from chunk 0 only),
    /// and every replica evaluates with them.
    #[rstest]
    #[case::candle(Backend::Candle)]
    #[cfg_attr(feature = "torch", case::tch(Backend::Tch))]
    fn batchnorm_statistics_are_replica_zeros(#[case] backend: Backend) {
        let exp = experiment_on(
            backend,
            "{name: resnet18, num_classes: 4, cifar_stem: true}",
        );
        let mut dp = data_parallel(&exp, 2);
        let mut chunk0 = one(&exp);
        let b = batch(4, 1);
        dp.forward_backward(&b, 1.0, true).unwrap();
        chunk0.forward_backward(&scatter(&b, 2)[0], 1.0).unwrap();
        let (got, want) = (dp.state_dict().unwrap(), chunk0.state_dict().unwrap());
        let running: Vec<&String> = want.keys().filter(|k| k.contains("running_")).collect();
        assert!(!running.is_empty());
        for k in &running {
            assert_eq!(got[*k], want[*k], "{k}");
        }
        // Replica 1 saw other rows: its statistics differ until evaluation makes them replica 0's.
        let other = dp.replicas[1].state_dict().unwrap();
        assert_ne!(other["bn1.running_mean"], want["bn1.running_mean"]);
        let stats = dp.evaluate(&b).unwrap();
        let other = dp.replicas[1].state_dict().unwrap();
        for k in &running {
            assert_eq!(other[*k], want[*k], "{k}");
        }
        let whole = chunk0.evaluate(&b).unwrap();
        assert_eq!((stats.count, stats.correct1), (whole.count, whole.correct1));
        assert!((stats.loss_sum - whole.loss_sum).abs() < 1e-4 * whole.loss_sum.abs());
    }

    /// A replica that fails stops the step with its own error, and no other replica hangs.
    #[test]
    fn a_failing_replica_fails_the_step() {
        let exp = experiment("{name: mlp, num_classes: 4, hidden: [8]}");
        let mut dp = data_parallel(&exp, 2);
        let mut bad = batch(4, 1);
        bad.labels[3] = 99; // out of range for 4 classes: only replica 1 (rows 2..4) sees it
        let err = dp.forward_backward(&bad, 1.0, true).unwrap_err();
        assert!(format!("{err:#}").contains("dp replica 1"), "{err:#}");
        // Replica 0 waits in the gradient reduction for replica 1, which fails before it: the step
        // fails with replica 1's error, not with replica 0's release from the wait.
        let mut dp = data_parallel(&exp, 2);
        let second = dp.replicas.pop().unwrap();
        dp.replicas.push(Box::new(FailsToReduce(second)));
        dp.forward_backward(&batch(4, 1), 1.0, true).unwrap();
        let err = format!("{:#}", dp.optimizer_step(0.1, None, None).unwrap_err());
        assert!(err.contains("dp replica 1: no gradients today"), "{err}");
    }

    /// An engine whose gradients fail to come out, after replica 0 has reached the reduction.
    struct FailsToReduce(Box<dyn Engine>);

    impl Engine for FailsToReduce {
        fn forward_backward(&mut self, b: &Batch, s: f64) -> anyhow::Result<StepStats> {
            self.0.forward_backward(b, s)
        }
        fn evaluate(&mut self, b: &Batch) -> anyhow::Result<StepStats> {
            self.0.evaluate(b)
        }
        fn predict(&mut self, b: &Batch) -> anyhow::Result<crate::tensor::HostTensor> {
            self.0.predict(b)
        }
        fn take_gradients(&mut self) -> anyhow::Result<crate::backend::Gradients> {
            std::thread::sleep(std::time::Duration::from_millis(50)); // replica 0 is waiting by now
            anyhow::bail!("no gradients today")
        }
        fn put_gradients(&mut self, g: crate::backend::Gradients) -> anyhow::Result<()> {
            self.0.put_gradients(g)
        }
        fn optimizer_step(
            &mut self,
            lr: f64,
            m: Option<f64>,
            c: Option<GradClip>,
        ) -> anyhow::Result<f64> {
            self.0.optimizer_step(lr, m, c)
        }
        fn state_dict(&self) -> anyhow::Result<StateDict> {
            self.0.state_dict()
        }
        fn load_state_dict(&mut self, s: &StateDict) -> anyhow::Result<()> {
            self.0.load_state_dict(s)
        }
        fn parameter_shapes(&self) -> Vec<(String, Vec<usize>)> {
            self.0.parameter_shapes()
        }
        fn state_bytes(&self) -> StateBytes {
            self.0.state_bytes()
        }
    }
}
