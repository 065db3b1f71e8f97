//! An in-process `Collective` for the threads of one process (DataParallel's replicas): no library, no
//! sockets, so it works in every build. The ranks meet at each call; the last to arrive computes the result
//! for all. Reductions fold the ranks' buffers in rank order, so every rank receives the same bits whatever
//! the order of arrival. A rank that fails aborts the group, so no other waits for it forever.
//!
//! With the `torch` feature the ranks also average libtorch tensors where they are (`average_flats`): the
//! last to arrive adds them up in rank order on rank 0's device and divides once, and each rank reads the
//! mean from there, as `nn.DataParallel`'s reduce-add and broadcast do, device to device without the host.

use super::collective::{through_host, Collective, ReduceOp};
use crate::tensor::Flat;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// What one rank brings to a call.
#[derive(Debug)]
enum Values {
    F32(Vec<f32>),
    F64(Vec<f64>),
    #[cfg(feature = "torch")]
    Tch(SharedTensor),
}

/// A tensor the ranks of a round share. While shared they only read it (`to`, and `copy_` from it into
/// their own tensors). The one write is the mean's accumulation into rank 0's input, by the rank that
/// completes the round while every other rank waits.
#[cfg(feature = "torch")]
#[derive(Debug)]
struct SharedTensor(tch::Tensor);

// SAFETY: see above: while shared, the tensor is only read, and libtorch reads are thread-safe. Keep it
// so: nothing in this module may write through a shared handle (or a shallow clone of one).
#[cfg(feature = "torch")]
unsafe impl Sync for SharedTensor {}

/// Which collective a rank called (all ranks must call the same one).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Call {
    AllReduce(ReduceOp),
    /// The sum in rank order divided by the group size (tensors only).
    #[cfg(feature = "torch")]
    Mean,
    Broadcast(usize),
    Barrier,
}

/// The meeting point, one round (generation) at a time.
struct Round {
    generation: u64,
    arrived: usize,
    inputs: Vec<Option<(Call, Values)>>,
    /// The outcome of the last completed round (read by its ranks before the next round can complete).
    result: Result<Arc<Values>, String>,
    /// Why the group stopped, when a rank failed.
    aborted: Option<String>,
}

struct Shared {
    round: Mutex<Round>,
    done: Condvar,
}

/// The error of a rank released from a collective because another rank failed (that rank's own error
/// says what went wrong).
#[derive(Debug, Clone)]
pub struct Aborted(pub String);

impl std::fmt::Display for Aborted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the replica group stopped: {}", self.0)
    }
}

impl std::error::Error for Aborted {}

/// One rank's handle on an in-process group. Each rank's handle is used by one thread at a time.
pub struct LocalCollective {
    rank: usize,
    size: usize,
    shared: Arc<Shared>,
}

/// A group of `size` ranks: handle r is rank r.
pub fn group(size: usize) -> Vec<LocalCollective> {
    let shared = Arc::new(Shared {
        round: Mutex::new(Round {
            generation: 0,
            arrived: 0,
            inputs: (0..size).map(|_| None).collect(),
            result: Err("no collective has completed yet".into()),
            aborted: None,
        }),
        done: Condvar::new(),
    });
    (0..size)
        .map(|rank| LocalCollective {
            rank,
            size,
            shared: shared.clone(),
        })
        .collect()
}

/// The result of a round, from every rank's input in rank order.
fn combine(inputs: Vec<(Call, Values)>) -> Result<Values, String> {
    let (call, first) = &inputs[0];
    for (rank, (c, v)) in inputs.iter().enumerate() {
        let same_kind = std::mem::discriminant(v) == std::mem::discriminant(first);
        if c != call || !same_kind || len(v) != len(first) {
            return Err(format!(
                "ranks called different collectives: rank 0 {call:?} on {} values, rank {rank} {c:?} on {} values",
                len(first),
                len(v)
            ));
        }
    }
    match *call {
        Call::Barrier => Ok(Values::F32(Vec::new())),
        Call::Broadcast(root) => inputs
            .into_iter()
            .nth(root)
            .map(|(_, v)| v)
            .ok_or_else(|| format!("broadcast from rank {root}, which is not in the group")),
        Call::AllReduce(op) => {
            let mut it = inputs.into_iter().map(|(_, v)| v);
            let mut acc = it.next().ok_or("an empty group")?;
            for v in it {
                match (&mut acc, v) {
                    (Values::F32(a), Values::F32(b)) => fold(a, &b, op),
                    (Values::F64(a), Values::F64(b)) => fold(a, &b, op),
                    _ => return Err(format!("{op:?} over tensors: tensors are averaged only")),
                }
            }
            Ok(acc)
        }
        #[cfg(feature = "torch")]
        Call::Mean => {
            let n = inputs.len();
            let mut it = inputs.into_iter().map(|(_, v)| match v {
                Values::Tch(t) => Ok(t.0),
                _ => Err("a mean over host values: host values are all-reduced".to_string()),
            });
            let first = it.next().ok_or("an empty group")??;
            // Rank 0's tensor (in f32) is the accumulator: no rank reads it but this one until the
            // round ends, and the sum needs no fresh memory.
            let mean = (|| -> anyhow::Result<tch::Tensor> {
                let mut acc = first.f_to_kind(tch::Kind::Float)?;
                tch::no_grad(|| -> anyhow::Result<()> {
                    for t in it {
                        let t = t.map_err(|e| anyhow::anyhow!(e))?;
                        let _ = acc.f_add_(&t.f_to_kind(tch::Kind::Float)?.f_to(acc.device())?)?;
                    }
                    let _ = acc.f_div_scalar_(n as f64)?;
                    Ok(())
                })?;
                Ok(acc)
            })()
            .map_err(|e| format!("averaging the replicas' tensors: {e}"))?;
            Ok(Values::Tch(SharedTensor(mean)))
        }
    }
}

fn len(v: &Values) -> usize {
    match v {
        Values::F32(d) => d.len(),
        Values::F64(d) => d.len(),
        #[cfg(feature = "torch")]
        Values::Tch(t) => t.0.numel(),
    }
}

fn fold<T: Copy + PartialOrd + std::ops::Add<Output = T>>(
    acc: &mut [T],
    other: &[T],
    op: ReduceOp,
) {
    for (a, &b) in acc.iter_mut().zip(other) {
        *a = match op {
            ReduceOp::Sum => *a + b,
            ReduceOp::Max if b > *a => b,
            ReduceOp::Min if b < *a => b,
            ReduceOp::Max | ReduceOp::Min => *a,
        };
    }
}

impl LocalCollective {
    fn lock(&self) -> anyhow::Result<MutexGuard<'_, Round>> {
        self.shared
            .round
            .lock()
            .map_err(|_| anyhow::anyhow!("a replica panicked inside a collective"))
    }

    /// Bring `values` to a `call`; returns the round's result once every rank has come.
    fn meet(&self, call: Call, values: Values) -> anyhow::Result<Arc<Values>> {
        let mut round = self.lock()?;
        if let Some(why) = &round.aborted {
            return Err(Aborted(why.clone()).into());
        }
        let generation = round.generation;
        round.inputs[self.rank] = Some((call, values));
        round.arrived += 1;
        if round.arrived == self.size {
            let inputs: Vec<(Call, Values)> =
                round.inputs.iter_mut().flat_map(Option::take).collect();
            round.result = combine(inputs).map(Arc::new);
            round.arrived = 0;
            round.generation += 1;
            self.shared.done.notify_all();
        } else {
            // The next round cannot complete without this rank, so once the generation moves on, `result`
            // is this round's.
            while round.generation == generation && round.aborted.is_none() {
                round = self
                    .shared
                    .done
                    .wait(round)
                    .map_err(|_| anyhow::anyhow!("a replica panicked inside a collective"))?;
            }
            if round.generation == generation {
                return Err(Aborted(round.aborted.clone().unwrap_or_default()).into());
            }
        }
        round.result.clone().map_err(|e| anyhow::anyhow!(e))
    }

    /// Stop the group: every rank waiting in a collective, and every later call, fails with `why`.
    pub fn abort(&self, why: &str) {
        // A poisoned lock still holds the state; the abort must get through.
        let mut round = self.shared.round.lock().unwrap_or_else(|p| p.into_inner());
        round.aborted.get_or_insert_with(|| why.to_string());
        self.shared.done.notify_all();
    }
}

impl Collective for LocalCollective {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.size
    }
    fn all_reduce_f32(&self, data: &mut [f32], op: ReduceOp) -> anyhow::Result<()> {
        if let Values::F32(out) = &*self.meet(Call::AllReduce(op), Values::F32(data.to_vec()))? {
            data.copy_from_slice(out);
        }
        Ok(())
    }
    fn all_reduce_f64(&self, data: &mut [f64], op: ReduceOp) -> anyhow::Result<()> {
        if let Values::F64(out) = &*self.meet(Call::AllReduce(op), Values::F64(data.to_vec()))? {
            data.copy_from_slice(out);
        }
        Ok(())
    }
    fn broadcast_f32(&self, data: &mut [f32], root: usize) -> anyhow::Result<()> {
        if let Values::F32(out) = &*self.meet(Call::Broadcast(root), Values::F32(data.to_vec()))? {
            data.copy_from_slice(out);
        }
        Ok(())
    }
    fn barrier(&self) -> anyhow::Result<()> {
        self.meet(Call::Barrier, Values::F32(Vec::new()))
            .map(|_| ())
    }
    /// Host buffers are summed in rank order and divided; libtorch tensors are averaged where they are:
    /// the last rank to arrive adds them up in rank order on rank 0's device, in f32, and divides once,
    /// and every rank reads that one mean (nn.DataParallel's reduce-add and broadcast).
    fn average_flats(&self, flats: Vec<Flat>) -> anyhow::Result<Vec<Flat>> {
        flats
            .into_iter()
            .map(|f| match f {
                #[cfg(feature = "torch")]
                Flat::Tch(t) => {
                    let mean = self.meet(Call::Mean, Values::Tch(SharedTensor(t)))?;
                    let Values::Tch(mean) = &*mean else {
                        anyhow::bail!("an in-process tensor mean came back as host values")
                    };
                    Ok(Flat::Tch(mean.0.shallow_clone()))
                }
                host => through_host::average(self, host),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    /// Run `f` on every rank of a fresh group, one thread each; results in rank order.
    fn on_ranks<T: Send>(size: usize, f: impl Fn(&LocalCollective) -> T + Sync) -> Vec<T> {
        let ranks = group(size);
        std::thread::scope(|s| {
            let handles: Vec<_> = ranks.iter().map(|c| s.spawn(|| f(c))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[rstest]
    #[case::sum(ReduceOp::Sum, [6.0, 0.0])]
    #[case::max(ReduceOp::Max, [3.0, 2.0])]
    #[case::min(ReduceOp::Min, [1.0, -2.0])]
    fn all_reduce_gives_every_rank_the_result(#[case] op: ReduceOp, #[case] want: [f64; 2]) {
        // Rank r brings [r + 1, (r - 1) * 2]: ranks 0..3 bring [1, -2], [2, 0], [3, 2].
        let out = on_ranks(3, |c| {
            let r = c.rank() as f64;
            let mut v64 = [r + 1.0, (r - 1.0) * 2.0];
            c.all_reduce_f64(&mut v64, op).unwrap();
            let mut v32 = [r as f32 + 1.0, (r as f32 - 1.0) * 2.0];
            c.all_reduce_f32(&mut v32, op).unwrap();
            (v64, v32)
        });
        for (v64, v32) in out {
            assert_eq!(v64, want);
            assert_eq!(v32, [want[0] as f32, want[1] as f32]);
        }
    }

    /// Sums fold in rank order, so every rank gets the same bits as a sequential sum 0 + 1 + 2 + ...
    #[test]
    fn sums_are_in_rank_order_on_every_rank() {
        let values = [1e8f32, 1.0, -1e8, 0.5];
        let want = ((values[0] + values[1]) + values[2]) + values[3];
        for _ in 0..20 {
            let out = on_ranks(4, |c| {
                let mut v = [values[c.rank()]];
                c.all_reduce_f32(&mut v, ReduceOp::Sum).unwrap();
                v[0].to_bits()
            });
            assert!(out.iter().all(|&b| b == want.to_bits()), "{out:?}");
        }
    }

    /// Tensors are averaged where they are: summed in rank order, then divided once (the same bits as
    /// the host sum divided by the group size); only rank 0's tensor, the accumulator, is written.
    #[cfg(feature = "torch")]
    #[test]
    fn tensors_average_in_rank_order() {
        let values = [1e8f32, 1.0, -1e8, 0.5];
        let want = (((values[0] + values[1]) + values[2]) + values[3]) / 4.0;
        let out = on_ranks(4, |c| {
            let t = tch::Tensor::from_slice(&[values[c.rank()], c.rank() as f32]);
            let mean = c.average_flats(vec![Flat::Tch(t.shallow_clone())]).unwrap();
            if c.rank() > 0 {
                let mine = Vec::<f32>::try_from(&t).unwrap();
                assert_eq!(mine, vec![values[c.rank()], c.rank() as f32]);
            }
            mean[0].to_vec().unwrap()
        });
        for v in out {
            assert_eq!((v[0].to_bits(), v[1]), (want.to_bits(), 1.5));
        }
        let e = on_ranks(2, |c| {
            let t = tch::Tensor::zeros([c.rank() as i64 + 1], tch::kind::FLOAT_CPU);
            c.average_flats(vec![Flat::Tch(t)])
                .err()
                .expect("tensors of different lengths")
                .to_string()
        });
        assert!(
            e.iter().all(|e| e.contains("different collectives")),
            "{e:?}"
        );
    }

    #[test]
    fn broadcast_and_barrier_over_many_rounds() {
        let out = on_ranks(3, |c| {
            let mut seen = Vec::new();
            for round in 0..50 {
                let root = round % 3;
                let mut v = [c.rank() as f32, round as f32];
                c.broadcast_f32(&mut v, root).unwrap();
                seen.push(v);
                c.barrier().unwrap();
            }
            seen
        });
        for seen in &out {
            for (round, v) in seen.iter().enumerate() {
                assert_eq!(*v, [(round % 3) as f32, round as f32]);
            }
        }
    }

    #[test]
    fn mismatched_calls_are_an_error_on_every_rank() {
        let out = on_ranks(2, |c| {
            let mut v = vec![0.0f32; c.rank() + 1];
            c.all_reduce_f32(&mut v, ReduceOp::Sum)
                .unwrap_err()
                .to_string()
        });
        for e in out {
            assert!(e.contains("different collectives"), "{e}");
        }
    }

    /// A rank that fails aborts the group: the others stop waiting, with the reason.
    #[test]
    fn abort_releases_the_waiting_ranks() {
        let out = on_ranks(3, |c| {
            if c.rank() == 2 {
                c.abort("replica 2 failed: out of memory");
                return String::new();
            }
            c.barrier().unwrap_err().to_string()
        });
        assert!(
            out[0].contains("replica 2 failed: out of memory"),
            "{out:?}"
        );
        assert!(out[1].contains("replica 2 failed"), "{out:?}");
    }

    #[test]
    fn a_group_of_one_returns_its_own_values() {
        let c = group(1).pop().unwrap();
        let mut v = [2.5f32];
        c.all_reduce_f32(&mut v, ReduceOp::Max).unwrap();
        c.barrier().unwrap();
        assert_eq!((v, c.rank(), c.world_size()), ([2.5], 0, 1));
    }
}
