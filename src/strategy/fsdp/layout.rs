//! Where FSDP keeps things: each unit's parameters as one flat vector in name order, padded to a multiple
//! of the world size, of which rank r owns slice r (and of its gradient and every optimizer slot); the
//! keys and file names those slices have in checkpoints.

use crate::tensor::{HostTensor, StateDict};

/// Where each parameter sits in the flat vector, and which slice is this rank's.
#[derive(Debug, Clone, PartialEq)]
pub struct FlatLayout {
    /// Parameters in flat order, with their shapes.
    pub params: Vec<(String, Vec<usize>)>,
    /// Real elements (the rest, up to `shard_len * world`, is zero padding).
    pub numel: usize,
    pub shard_len: usize,
    pub rank: usize,
    pub world: usize,
}

impl FlatLayout {
    pub fn new(params: Vec<(String, Vec<usize>)>, rank: usize, world: usize) -> FlatLayout {
        let numel = params
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum();
        FlatLayout {
            params,
            numel,
            shard_len: numel.div_ceil(world.max(1)),
            rank,
            world: world.max(1),
        }
    }

    pub fn padded(&self) -> usize {
        self.shard_len * self.world
    }

    /// This rank's slice of the padded flat vector.
    pub fn shard_range(&self) -> std::ops::Range<usize> {
        self.rank * self.shard_len..(self.rank + 1) * self.shard_len
    }

    /// Named tensors (a slot per parameter: `<prefix><param><suffix>`) as one padded flat vector; `None`
    /// when no parameter has the slot, an error when only some have it.
    pub fn flatten(
        &self,
        state: &StateDict,
        prefix: &str,
        suffix: &str,
    ) -> anyhow::Result<Option<Vec<f32>>> {
        let mut flat = Vec::with_capacity(self.padded());
        let mut missing = Vec::new();
        for (name, shape) in &self.params {
            let key = format!("{prefix}{name}{suffix}");
            match state.get(&key) {
                Some(t) if &t.shape == shape => flat.extend_from_slice(&t.data),
                Some(t) => anyhow::bail!(
                    "tensor '{key}': checkpoint shape {:?}, model shape {shape:?}",
                    t.shape
                ),
                None => missing.push(key),
            }
        }
        if missing.len() == self.params.len() {
            return Ok(None);
        }
        anyhow::ensure!(
            missing.is_empty(),
            "the checkpoint lacks {} of the model's tensors, e.g. '{}'",
            missing.len(),
            missing[0]
        );
        flat.resize(self.padded(), 0.0);
        Ok(Some(flat))
    }

    /// The inverse of `flatten`: named tensors from a flat vector (padding ignored).
    pub fn unflatten(&self, flat: &[f32], prefix: &str, suffix: &str) -> StateDict {
        crate::tensor::layout_ranges(&self.params)
            .map(|(name, shape, range)| {
                let t = HostTensor {
                    shape: shape.to_vec(),
                    data: flat[range].to_vec(),
                };
                (format!("{prefix}{name}{suffix}"), t)
            })
            .collect()
    }
}

/// The optimizer's key for unit `u`'s flat slice; its slot `flat<u>.<slot>` holds `<param>.<slot>` of
/// every parameter of the unit.
pub fn unit_key(u: usize) -> String {
    format!("flat{u}")
}
/// Checkpoint key of unit `u`'s parameter slice in a sharded checkpoint (slots:
/// `optimizer.fsdp.units.<u>.flat_param.<slot>`).
pub fn shard_key(u: usize) -> String {
    format!("fsdp.units.{u}.flat_param")
}
/// Optimizer slot names the built-in rules use (`optim`).
pub const SLOTS: &[&str] = &["momentum_buffer", "exp_avg", "exp_avg_sq"];

/// The slot names `optimizer` keeps: the built-in rules', or a registered rule's own.
pub fn slots(optimizer: &crate::schema::OptimizerConfig) -> Vec<&'static str> {
    match &optimizer.registered {
        Some(r) => r.slots.clone(),
        None => SLOTS.to_vec(),
    }
}

/// The file name of rank `rank`'s part of a sharded checkpoint whose rank-0 file is `name`
/// (`last.safetensors` → `last.shard1.safetensors`); the same locally and in an object store.
pub fn shard_file_name(name: &str, rank: usize) -> String {
    let stem = name.strip_suffix(".safetensors").unwrap_or(name);
    format!("{stem}.shard{rank}.safetensors")
}

/// The named tensors of `layout` (prefix/suffix: a slot) flattened and padded; empty for a unit
/// without parameters.
pub fn flat_or_empty(
    layout: &FlatLayout,
    state: &StateDict,
    prefix: &str,
    suffix: &str,
) -> anyhow::Result<Option<Vec<f32>>> {
    if layout.params.is_empty() {
        return Ok(Some(Vec::new()));
    }
    layout.flatten(state, prefix, suffix)
}

/// Optimizer-prefixed entries that belong to the engine, not to the sharded optimizer: its forward-pass
/// counter (dropout streams) and its loss scaler's state.
pub fn engine_owned(key: &str) -> bool {
    key == "optimizer.forward_calls" || key.starts_with("optimizer.grad_scaler.")
}

pub fn counter(value: u64) -> HostTensor {
    HostTensor {
        shape: vec![1],
        data: vec![value as f32],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn layout(rank: usize, world: usize) -> FlatLayout {
        FlatLayout::new(
            vec![("a".into(), vec![2, 3]), ("b".into(), vec![5])],
            rank,
            world,
        )
    }

    #[rstest]
    #[case::one(1, 11, 11)]
    #[case::two(2, 6, 12)]
    #[case::four(4, 3, 12)]
    #[case::more_ranks_than_values(16, 1, 16)]
    fn shards_cover_the_padded_vector(
        #[case] world: usize,
        #[case] shard: usize,
        #[case] padded: usize,
    ) {
        let l = layout(world - 1, world);
        assert_eq!((l.numel, l.shard_len, l.padded()), (11, shard, padded));
        // Every rank's shard is its own slice, in rank order, and together they are the padded vector.
        for rank in 0..world {
            assert_eq!(
                layout(rank, world).shard_range(),
                rank * shard..(rank + 1) * shard,
                "rank {rank}"
            );
        }
        assert_eq!(l.shard_range().end, padded);
    }

    #[test]
    fn flatten_and_unflatten_round_trip() {
        let l = layout(0, 2);
        let mut state = StateDict::new();
        state.insert(
            "optimizer.a.exp_avg".into(),
            HostTensor {
                shape: vec![2, 3],
                data: (0..6).map(|i| i as f32).collect(),
            },
        );
        state.insert(
            "optimizer.b.exp_avg".into(),
            HostTensor {
                shape: vec![5],
                data: vec![9.0; 5],
            },
        );
        let flat = l
            .flatten(&state, "optimizer.", ".exp_avg")
            .unwrap()
            .unwrap();
        assert_eq!(flat.len(), 12);
        assert_eq!(flat[11], 0.0, "padding is zero");
        assert_eq!(l.unflatten(&flat, "optimizer.", ".exp_avg"), state);
        assert_eq!(l.flatten(&state, "", "").unwrap(), None);
    }

    #[test]
    fn a_partial_slot_is_an_error_that_names_the_tensor() {
        let l = layout(0, 2);
        let mut state = StateDict::new();
        state.insert(
            "a".into(),
            HostTensor {
                shape: vec![2, 3],
                data: vec![0.0; 6],
            },
        );
        let e = l.flatten(&state, "", "").unwrap_err().to_string();
        assert!(e.contains("'b'"), "{e}");
    }
}
