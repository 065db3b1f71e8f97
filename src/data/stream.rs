//! The reader of a dataset read as shards: one thread per epoch reads the rank's shards front to back in
//! the sampler's read order (`Order::reads`), keeping each sample the epoch still asks for until a loader
//! worker takes it. Read-ahead is bounded (the shuffle buffer plus the batches in flight); a worker
//! waiting for a sample not read yet lifts the bound, so the reader can never wait on a worker that waits
//! on it. A resumed epoch asks for fewer samples: a shard none of whose rest is asked for is not opened,
//! and one is opened at its first sample still asked for.

use super::{DataError, Dataset, Streamed};
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;

/// An epoch's reader and the samples it has read.
pub struct Stream {
    shared: Arc<Shared>,
    reader: Option<thread::JoinHandle<()>>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// Samples read and not taken yet (an index asked for twice, as padding does, is kept twice).
    ready: HashMap<usize, Vec<Streamed>>,
    held: usize,
    /// Workers waiting for a sample not read yet.
    waiting: usize,
    /// The reader's error, given to every worker that asks after it.
    failed: Option<String>,
    /// The epoch ended (the loader was dropped): the reader stops, workers stop waiting.
    stopped: bool,
    /// The reader read all it was asked to.
    finished: bool,
}

/// One stretch of a shard to read: `shard` from its sample `start` on, each read sample's index.
struct Stretch {
    shard: usize,
    start: usize,
    indices: Vec<usize>,
}

impl Stream {
    /// Start reading `reads` (indices into `dataset`, whose shards hold `lens`), keeping those `wanted`
    /// asks for (as often as it asks), at most `bound` ahead of the workers.
    pub fn start(
        dataset: Arc<dyn Dataset>,
        lens: &[usize],
        reads: &[usize],
        wanted: &[usize],
        bound: usize,
    ) -> Stream {
        let mut asked: HashMap<usize, usize> = HashMap::new();
        for &i in wanted {
            *asked.entry(i).or_default() += 1;
        }
        let stretches = stretches(lens, reads);
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        });
        let reader = {
            let shared = shared.clone();
            thread::spawn(move || {
                // A dataset's iterator that panics ends the epoch with an error, never a hang.
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    read(&*dataset, &stretches, asked, bound.max(1), &shared)
                }))
                .unwrap_or_else(|panic| {
                    let what = panic
                        .downcast_ref::<String>()
                        .map(String::as_str)
                        .or_else(|| panic.downcast_ref::<&str>().copied())
                        .unwrap_or("a panic");
                    Err(DataError::Unsupported(format!(
                        "the dataset's shard reader panicked: {what}"
                    )))
                });
                let mut state = shared.state.lock().unwrap_or_else(|p| p.into_inner());
                state.finished = true;
                state.failed = outcome.err().map(|e| e.to_string());
                shared.changed.notify_all();
            })
        };
        Stream {
            shared,
            reader: Some(reader),
        }
    }

    /// Sample `index`, waiting for the reader to reach it.
    pub fn take(&self, index: usize) -> Result<Streamed, DataError> {
        let mut state = self.shared.state.lock().unwrap();
        loop {
            if let Some(sample) = state.ready.get_mut(&index).and_then(Vec::pop) {
                if state.ready[&index].is_empty() {
                    state.ready.remove(&index);
                }
                state.held -= 1;
                self.shared.changed.notify_all();
                return Ok(sample);
            }
            if let Some(e) = &state.failed {
                return Err(DataError::Unsupported(e.clone()));
            }
            if state.stopped {
                return Err(DataError::Unsupported(
                    "the epoch's reader was stopped".into(),
                ));
            }
            if state.finished {
                return Err(DataError::Unsupported(format!(
                    "sample {index} is not among the samples this epoch reads"
                )));
            }
            state.waiting += 1;
            self.shared.changed.notify_all();
            state = self.shared.changed.wait(state).unwrap();
            state.waiting -= 1;
        }
    }

    /// Stop the reader and every worker waiting on it.
    pub fn stop(&self) {
        self.shared.state.lock().unwrap().stopped = true;
        self.shared.changed.notify_all();
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.stop();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

/// `reads` cut into stretches of consecutive samples of one shard.
fn stretches(lens: &[usize], reads: &[usize]) -> Vec<Stretch> {
    let starts: Vec<usize> = lens
        .iter()
        .scan(0, |next, len| {
            let start = *next;
            *next += len;
            Some(start)
        })
        .collect();
    let mut out: Vec<Stretch> = Vec::new();
    for &i in reads {
        let shard = starts.partition_point(|&s| s <= i) - 1;
        let offset = i - starts[shard];
        match out.last_mut() {
            Some(s) if s.shard == shard && s.start + s.indices.len() == offset => s.indices.push(i),
            _ => out.push(Stretch {
                shard,
                start: offset,
                indices: vec![i],
            }),
        }
    }
    out
}

/// The reader thread: each stretch with a sample still asked for is opened at the first such sample.
fn read(
    dataset: &dyn Dataset,
    stretches: &[Stretch],
    mut asked: HashMap<usize, usize>,
    bound: usize,
    shared: &Shared,
) -> Result<(), DataError> {
    for stretch in stretches {
        let Some(first) = stretch
            .indices
            .iter()
            .position(|i| asked.get(i).is_some_and(|&n| n > 0))
        else {
            continue;
        };
        let mut samples = dataset.open_shard(stretch.shard, stretch.start + first)?;
        let last = stretch
            .indices
            .iter()
            .rposition(|i| asked.get(i).is_some_and(|&n| n > 0))
            .unwrap_or(first);
        for &index in &stretch.indices[first..=last] {
            let sample = samples.next().unwrap_or_else(|| {
                Err(DataError::Unsupported(format!(
                    "shard {} ended before sample {index}",
                    stretch.shard
                )))
            })?;
            let Some(n) = asked.get_mut(&index).filter(|n| **n > 0) else {
                if shared.state.lock().unwrap().stopped {
                    return Ok(());
                }
                continue;
            };
            *n -= 1;
            let mut state = shared.state.lock().unwrap();
            while state.held >= bound && state.waiting == 0 && !state.stopped {
                state = shared.changed.wait(state).unwrap();
            }
            if state.stopped {
                return Ok(());
            }
            state.ready.entry(index).or_default().push(sample);
            state.held += 1;
            shared.changed.notify_all();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Image, SampleIter};
    use crate::registry::{Sample, Target};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Shards of `lens` samples whose input is their index; counts the samples read.
    struct Counted {
        lens: Vec<usize>,
        read: AtomicUsize,
    }

    impl Dataset for Counted {
        fn len(&self) -> usize {
            self.lens.iter().sum()
        }
        fn get(&self, _: usize) -> Result<Image, DataError> {
            unreachable!()
        }
        fn num_classes(&self) -> usize {
            1
        }
        fn open_shard(&self, shard: usize, start: usize) -> Result<SampleIter<'_>, DataError> {
            let base: usize = self.lens[..shard].iter().sum();
            Ok(Box::new((start..self.lens[shard]).map(move |i| {
                self.read.fetch_add(1, Ordering::SeqCst);
                Ok(Streamed::Tensor(Sample {
                    input: vec![(base + i) as f32],
                    shape: vec![1],
                    target: Target::Class(0),
                }))
            })))
        }
    }

    fn counted(lens: &[usize]) -> Arc<Counted> {
        Arc::new(Counted {
            lens: lens.to_vec(),
            read: AtomicUsize::new(0),
        })
    }

    /// The workers' order is not the read order, and a bound of 1 does not stall it.
    #[test]
    fn samples_come_in_the_asked_order_whatever_the_bound() {
        let lens = [3, 4, 2];
        let reads: Vec<usize> = vec![3, 4, 5, 6, 0, 1, 2, 7, 8];
        let wanted: Vec<usize> = vec![8, 0, 3, 4, 2, 7, 1, 6, 5];
        for bound in [1, 4, 100] {
            let set = counted(&lens);
            let stream = Stream::start(set.clone(), &lens, &reads, &wanted, bound);
            let got: Vec<f32> = wanted
                .iter()
                .map(|&i| stream.take(i).unwrap().into_tensor().unwrap().input[0])
                .collect();
            assert_eq!(got, wanted.iter().map(|&i| i as f32).collect::<Vec<_>>());
            drop(stream);
            assert_eq!(set.read.load(Ordering::SeqCst), 9, "each read once");
        }
    }

    /// A resumed epoch: shards whose asked samples are all taken are not opened; a shard is opened at
    /// its first sample still asked for; padding's repeats are given twice.
    #[test]
    fn a_resumed_epoch_reads_only_what_is_left() {
        let lens = [4, 4];
        let reads = vec![4, 5, 6, 7, 0, 1, 2, 3, 4];
        let set = counted(&lens);
        let stream = Stream::start(set.clone(), &lens, &reads, &[2, 3, 4], 8);
        for i in [2, 3, 4] {
            assert_eq!(
                stream.take(i).unwrap().into_tensor().unwrap().input[0],
                i as f32
            );
        }
        drop(stream);
        // shard 1 from 0 (index 4), shard 0 from 2, the repeat of index 4 is not asked again.
        assert_eq!(set.read.load(Ordering::SeqCst), 1 + 2);
        let set = counted(&lens);
        let stream = Stream::start(set.clone(), &lens, &reads, &[4, 4], 8);
        assert!(stream.take(4).is_ok() && stream.take(4).is_ok());
    }

    /// A dataset whose shard iterator panics: the workers get an error, not a hang.
    struct Panicking;

    impl Dataset for Panicking {
        fn len(&self) -> usize {
            4
        }
        fn get(&self, _: usize) -> Result<Image, DataError> {
            unreachable!()
        }
        fn num_classes(&self) -> usize {
            1
        }
        fn open_shard(&self, _: usize, _: usize) -> Result<SampleIter<'_>, DataError> {
            Ok(Box::new((0..4).map(|i| {
                assert!(i < 2, "row {i} is malformed");
                Ok(Streamed::Tensor(Sample {
                    input: vec![i as f32],
                    shape: vec![1],
                    target: Target::Class(0),
                }))
            })))
        }
    }

    #[test]
    fn a_panicking_shard_ends_the_epoch_with_its_message() {
        let stream = Stream::start(Arc::new(Panicking), &[4], &[0, 1, 2, 3], &[0, 1, 2, 3], 8);
        assert!(stream.take(0).is_ok() && stream.take(1).is_ok());
        let e = stream.take(2).unwrap_err().to_string();
        assert!(
            e.contains("panicked") && e.contains("row 2 is malformed"),
            "{e}"
        );
    }

    #[test]
    fn a_stopped_stream_releases_its_waiters() {
        let lens = [2];
        let set = counted(&lens);
        let stream = Arc::new(Stream::start(set, &lens, &[0, 1], &[0, 1], 1));
        stream.stop();
        let e = stream.take(7).unwrap_err().to_string();
        assert!(e.contains("stopped"), "{e}");
    }
}
