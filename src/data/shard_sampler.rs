//! Which samples a rank reads in an epoch when its dataset is a stream of shards (`Dataset::shard_lens`),
//! as WebDataset splits by node and worker: the shards are shuffled per epoch (seeded, the same on every
//! rank) and dealt to the ranks whole, rank r taking every world-th from r, so the split changes with the
//! epoch; a rank reads its shards front to back, and a seeded shuffle buffer mixes them. Training shares
//! are made equal (`UnevenShards`: pad or drop) to a count that is the same in every epoch, because the
//! loop's length and the learning-rate schedule are planned before the first epoch; validation reads each
//! sample once, shares as they fall.

use crate::platform::rng::Rng;
use crate::schema::UnevenShards;

#[derive(Debug, Clone)]
pub struct ShardSampler {
    /// Samples in each shard, in the dataset's shard order.
    pub lens: Vec<usize>,
    pub num_replicas: usize,
    pub rank: usize,
    pub shuffle: bool,
    pub seed: u64,
    /// Shuffle buffer size (`data.shuffle_buffer`); 0 or 1: read order.
    pub buffer: usize,
    /// Training: every rank reads the same count; `None`: each sample once (validation, test).
    pub even: Option<UnevenShards>,
}

/// This rank's samples in an epoch: as the step gets them, and as they are read from the shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardOrder {
    pub order: Vec<usize>,
    pub reads: Vec<usize>,
}

impl ShardSampler {
    /// Refuses a split in which some rank would get no shard.
    pub fn check(&self) -> Result<(), String> {
        let shards = self.nonempty().len();
        if shards < self.num_replicas {
            return Err(format!(
                "the dataset has {shards} shards holding samples, fewer than the {} ranks that read it: \
                 each rank reads whole shards; write at least {} shards (more shards than ranks also \
                 balances the shares)",
                self.num_replicas, self.num_replicas
            ));
        }
        Ok(())
    }

    /// Shards that hold samples (an empty one is never dealt).
    fn nonempty(&self) -> Vec<usize> {
        (0..self.lens.len()).filter(|&s| self.lens[s] > 0).collect()
    }

    /// The shards rank `rank` reads in `epoch`, in reading order.
    fn shards_of(&self, epoch: u64, rank: usize) -> Vec<usize> {
        let mut order = self.nonempty();
        if self.shuffle {
            Rng::keyed(&[self.seed, epoch, 0x0053_4841_5244]).shuffle(&mut order);
        }
        order
            .into_iter()
            .skip(rank)
            .step_by(self.num_replicas.max(1))
            .collect()
    }

    /// Samples `rank` reads in an epoch before padding or dropping (validation's shares are fixed: its
    /// shards are not shuffled).
    fn own_count(&self, epoch: u64, rank: usize) -> usize {
        self.shards_of(epoch, rank)
            .iter()
            .map(|&s| self.lens[s])
            .sum()
    }

    /// This rank's samples per epoch: for training the same on every rank and in every epoch (the most
    /// any rank's shards can hold when padding, the least when dropping, over every way of dealing them).
    pub fn share(&self) -> usize {
        let mut lens: Vec<usize> = self.nonempty().iter().map(|&s| self.lens[s]).collect();
        let world = self.num_replicas.max(1);
        match self.even {
            Some(UnevenShards::Pad) => {
                lens.sort_unstable_by(|a, b| b.cmp(a));
                lens.iter().take(lens.len().div_ceil(world)).sum()
            }
            Some(UnevenShards::Drop) => {
                lens.sort_unstable();
                lens.iter().take(lens.len() / world).sum()
            }
            None => self.own_count(0, self.rank),
        }
    }

    /// The largest rank's share (the validation rounds every rank takes part in).
    pub fn largest_share(&self) -> usize {
        match self.even {
            Some(_) => self.share(),
            None => (0..self.num_replicas.max(1))
                .map(|r| self.own_count(0, r))
                .max()
                .unwrap_or(0),
        }
    }

    /// This rank's samples in `epoch`.
    pub fn order(&self, epoch: u64) -> ShardOrder {
        let starts: Vec<usize> = self
            .lens
            .iter()
            .scan(0, |next, len| {
                let start = *next;
                *next += len;
                Some(start)
            })
            .collect();
        let mut reads: Vec<usize> = self
            .shards_of(epoch, self.rank)
            .into_iter()
            .flat_map(|s| starts[s]..starts[s] + self.lens[s])
            .collect();
        if self.even.is_some() {
            let share = self.share();
            let own = reads.len();
            // Padding repeats the rank's stream from its start, as DistributedSampler repeats indices.
            for i in own..share {
                reads.push(reads[i % own]);
            }
            reads.truncate(share);
        }
        let order = match self.shuffle && self.buffer > 1 {
            true => shuffle_buffer(
                &reads,
                self.buffer,
                &mut Rng::keyed(&[self.seed, epoch, self.rank as u64, 0x4255_4646]),
            ),
            false => reads.clone(),
        };
        ShardOrder { order, reads }
    }
}

/// WebDataset's shuffle buffer: fill `size` items, then each item read takes the place of a random one
/// sent on; what is left is sent on shuffled. The item sent at place k was read at place k + `size` at
/// the latest, so a reader `size` samples ahead of the step keeps it fed.
fn shuffle_buffer(items: &[usize], size: usize, rng: &mut Rng) -> Vec<usize> {
    let mut buffer = Vec::with_capacity(size);
    let mut out = Vec::with_capacity(items.len());
    for &item in items {
        if buffer.len() < size {
            buffer.push(item);
            continue;
        }
        let j = rng.below(size);
        out.push(std::mem::replace(&mut buffer[j], item));
    }
    rng.shuffle(&mut buffer);
    out.extend(buffer);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn sampler(
        lens: &[usize],
        world: usize,
        rank: usize,
        even: Option<UnevenShards>,
    ) -> ShardSampler {
        ShardSampler {
            lens: lens.to_vec(),
            num_replicas: world,
            rank,
            shuffle: true,
            seed: 3,
            buffer: 5,
            even,
        }
    }

    fn all_ranks(
        lens: &[usize],
        world: usize,
        even: Option<UnevenShards>,
        epoch: u64,
    ) -> Vec<Vec<usize>> {
        (0..world)
            .map(|r| sampler(lens, world, r, even).order(epoch).order)
            .collect()
    }

    /// Equal shards dealt evenly: every sample once per epoch across ranks, the same count on each.
    #[rstest]
    #[case::two_ranks(&[4, 4, 4, 4, 4, 4], 2)]
    #[case::three_ranks(&[3; 9], 3)]
    #[case::one_rank(&[2, 7, 0, 5], 1)]
    fn each_sample_once_per_epoch(#[case] lens: &[usize], #[case] world: usize) {
        let total: usize = lens.iter().sum();
        for epoch in 0..3 {
            for even in [Some(UnevenShards::Pad), Some(UnevenShards::Drop), None] {
                let ranks = all_ranks(lens, world, even, epoch);
                let mut seen: Vec<usize> = ranks.concat();
                seen.sort_unstable();
                assert_eq!(
                    seen,
                    (0..total).collect::<Vec<_>>(),
                    "epoch {epoch} {even:?}"
                );
                assert!(ranks.iter().all(|r| r.len() == total / world));
            }
        }
    }

    /// Uneven shards: pad repeats and skips nothing, drop skips and repeats nothing, validation reads
    /// each once; the training count is the same on every rank and in every epoch.
    #[rstest]
    #[case::pad(Some(UnevenShards::Pad), 15)]
    #[case::drop(Some(UnevenShards::Drop), 3)]
    fn uneven_shards_pad_or_drop(#[case] even: Option<UnevenShards>, #[case] share: usize) {
        let lens = [5, 1, 7, 2, 0, 3];
        let total: usize = lens.iter().sum();
        for epoch in 0..6 {
            let ranks = all_ranks(&lens, 2, even, epoch);
            assert!(ranks.iter().all(|r| r.len() == share), "{ranks:?}");
            let mut seen = ranks.concat();
            seen.sort_unstable();
            let mut distinct = seen.clone();
            distinct.dedup();
            match even {
                Some(UnevenShards::Pad) => assert_eq!(distinct.len(), total),
                _ => assert_eq!(distinct.len(), seen.len()),
            }
        }
        let val = all_ranks(&lens, 2, None, 0);
        assert_eq!(val.concat().len(), total);
        let s = sampler(&lens, 2, 0, None);
        assert_eq!(s.largest_share(), val.iter().map(Vec::len).max().unwrap());
    }

    /// The split and the order change with the epoch; the buffer mixes shards, and the sample sent at
    /// place k was read by place k + `buffer`.
    #[test]
    fn the_split_and_the_mix_change_with_the_epoch() {
        let lens = [10; 8];
        let s = sampler(&lens, 2, 1, Some(UnevenShards::Pad));
        let (a, b) = (s.order(0), s.order(1));
        assert_ne!(a.reads, b.reads, "another split of the shards");
        assert_ne!(a.order, a.reads, "the buffer mixes");
        assert_eq!(s.order(0), a, "seeded");
        let mut sorted = a.order.clone();
        sorted.sort_unstable();
        let mut reads = a.reads.clone();
        reads.sort_unstable();
        assert_eq!(sorted, reads);
        let read_at = |x: usize| a.reads.iter().position(|&r| r == x).unwrap();
        for (i, &x) in a.order.iter().enumerate().take(a.order.len() - s.buffer) {
            assert!(read_at(x) <= i + s.buffer, "sample {x} sent at {i}");
        }
    }

    #[test]
    fn fewer_shards_than_ranks_is_refused() {
        let e = sampler(&[4, 0, 4], 3, 0, Some(UnevenShards::Pad))
            .check()
            .unwrap_err();
        assert!(e.contains("2 shards") && e.contains("3 ranks"), "{e}");
    }
}
