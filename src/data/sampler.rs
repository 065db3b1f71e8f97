//! Which sample indices a rank sees in an epoch, with PyTorch `DistributedSampler` semantics: a seeded
//! shuffle per epoch (`set_epoch`), then either padding (repeat from the start) so every rank gets the same
//! count, or `drop_last` truncation; rank r takes every `num_replicas`-th index starting at r. Without
//! `pad` the shares stay uneven and every sample is seen exactly once (exact distributed validation).

use crate::platform::rng::Rng;

#[derive(Debug, Clone)]
pub struct DistributedSampler {
    pub len: usize,
    pub num_replicas: usize,
    pub rank: usize,
    pub shuffle: bool,
    pub seed: u64,
    pub drop_last: bool,
    /// Repeat samples so every rank gets the same count (PyTorch's default); off: each sample once, and
    /// the first `len % num_replicas` ranks get one more.
    pub pad: bool,
}

impl DistributedSampler {
    pub fn single(len: usize, shuffle: bool, seed: u64) -> Self {
        DistributedSampler {
            len,
            num_replicas: 1,
            rank: 0,
            shuffle,
            seed,
            drop_last: false,
            pad: true,
        }
    }

    /// Samples per rank per epoch.
    pub fn num_samples(&self) -> usize {
        if self.drop_last {
            self.len / self.num_replicas
        } else if self.pad {
            self.len.div_ceil(self.num_replicas)
        } else {
            self.len
                .saturating_sub(self.rank)
                .div_ceil(self.num_replicas)
        }
    }

    /// This rank's indices for `epoch`.
    pub fn indices(&self, epoch: u64) -> Vec<usize> {
        let mut all: Vec<usize> = (0..self.len).collect();
        if self.shuffle {
            Rng::keyed(&[self.seed, epoch, 0x5A_4D_50]).shuffle(&mut all);
        }
        let total = match (self.drop_last, self.pad) {
            (false, false) => all.len(),
            _ => self.num_samples() * self.num_replicas,
        };
        if total > all.len() && !all.is_empty() {
            let mut i = 0;
            while all.len() < total {
                all.push(all[i % self.len]);
                i += 1;
            }
        }
        all.truncate(total);
        all.into_iter()
            .skip(self.rank)
            .step_by(self.num_replicas)
            .collect()
    }
}

/// The samples a rank takes in an epoch: by index, or shard by shard.
#[derive(Debug, Clone)]
pub enum Sampler {
    Samples(DistributedSampler),
    Shards(super::shard_sampler::ShardSampler),
}

/// A rank's samples for (the rest of) an epoch, in the order the step gets them; for a dataset read as
/// shards, also the order they are read in (the loader's reader follows it and skips what is not asked).
#[derive(Debug, Clone, Default)]
pub struct Order {
    pub indices: Vec<usize>,
    pub reads: Option<std::sync::Arc<Vec<usize>>>,
}

impl Order {
    /// Read by index, in this order.
    pub fn of(indices: Vec<usize>) -> Order {
        Order {
            indices,
            reads: None,
        }
    }

    /// The order without its first `n` samples (a resumed epoch's trained batches).
    pub fn skip(mut self, n: usize) -> Order {
        self.indices.drain(..n.min(self.indices.len()));
        self
    }
}

impl Sampler {
    /// This rank's samples in `epoch`.
    pub fn order(&self, epoch: u64) -> Order {
        match self {
            Sampler::Samples(s) => Order::of(s.indices(epoch)),
            Sampler::Shards(s) => {
                let o = s.order(epoch);
                Order {
                    indices: o.order,
                    reads: Some(std::sync::Arc::new(o.reads)),
                }
            }
        }
    }

    /// This rank's samples per epoch.
    pub fn share(&self) -> usize {
        match self {
            Sampler::Samples(s) => s.num_samples(),
            Sampler::Shards(s) => s.share(),
        }
    }

    /// The largest rank's share (for validation, whose shares may differ).
    pub fn largest_share(&self) -> usize {
        match self {
            Sampler::Samples(s) => match s.pad || s.drop_last {
                true => s.num_samples(),
                false => s.len.div_ceil(s.num_replicas.max(1)),
            },
            Sampler::Shards(s) => s.largest_share(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case(10, 3, false, 4)]
    #[case(10, 3, true, 3)]
    #[case(9, 3, false, 3)]
    #[case(1, 4, false, 1)]
    fn every_rank_gets_the_same_count(
        #[case] len: usize,
        #[case] replicas: usize,
        #[case] drop_last: bool,
        #[case] expected: usize,
    ) {
        let mut union = Vec::new();
        for rank in 0..replicas {
            let s = DistributedSampler {
                len,
                num_replicas: replicas,
                rank,
                shuffle: true,
                seed: 1,
                drop_last,
                pad: true,
            };
            let idx = s.indices(0);
            assert_eq!(idx.len(), expected);
            union.extend(idx);
        }
        union.sort();
        union.dedup();
        if !drop_last {
            assert_eq!(union.len(), len, "padding repeats, never skips");
        }
    }

    /// Without padding every sample goes to exactly one rank, and `num_samples` says how many each gets.
    #[rstest]
    #[case(10, 3, vec![4, 3, 3])]
    #[case(9, 3, vec![3, 3, 3])]
    #[case(1, 4, vec![1, 0, 0, 0])]
    fn unpadded_shares_see_each_sample_once(
        #[case] len: usize,
        #[case] replicas: usize,
        #[case] counts: Vec<usize>,
    ) {
        let mut union = Vec::new();
        for (rank, &count) in counts.iter().enumerate() {
            let s = DistributedSampler {
                num_replicas: replicas,
                rank,
                pad: false,
                ..DistributedSampler::single(len, true, 1)
            };
            let idx = s.indices(0);
            assert_eq!((idx.len(), s.num_samples()), (count, count), "rank {rank}");
            union.extend(idx);
        }
        union.sort();
        assert_eq!(union, (0..len).collect::<Vec<_>>());
    }

    #[test]
    fn shuffle_changes_with_epoch_not_with_rank_count() {
        let s = DistributedSampler::single(100, true, 7);
        assert_ne!(s.indices(0), s.indices(1));
        assert_eq!(s.indices(3), s.indices(3));
        // The global order is the same whatever the world size: rank r of 2 sees the even/odd positions.
        let global = s.indices(2);
        let r1 = DistributedSampler {
            num_replicas: 2,
            rank: 1,
            ..s.clone()
        }
        .indices(2);
        assert_eq!(
            r1,
            global
                .iter()
                .skip(1)
                .step_by(2)
                .copied()
                .collect::<Vec<_>>()
        );
    }
}
