//! FSDP's units at run time: each unit's slices on this rank, how they are gathered and reduced over the
//! ranks (the collectives keep device slices on their device), the exchange the engine drives while it
//! computes unit by unit (`FULL_SHARD`), and the size-based wrap policy that groups stages into units.

use super::layout::FlatLayout;
use crate::backend::units::UnitExchange;
use crate::comm::collective::Collective;
use crate::model::stages::StageLayouts;
use crate::optim::OptTensor;
use crate::tensor::Flat;
use anyhow::Context;

/// One FSDP unit (a stage of the model: stem, block, head) and this rank's slices of it.
pub struct Unit {
    pub layout: FlatLayout,
    /// This rank's slice of the unit's flat parameters (`NO_SHARD`: all of them, unpadded).
    pub shard: Flat,
    /// The mean gradient of `shard`, summed over micro-batches, from the reductions until the step.
    pub grad: Option<Flat>,
}

impl Unit {
    /// Add a reduced gradient slice to what this step has gathered.
    pub fn accumulate(&mut self, grad: Flat) -> anyhow::Result<()> {
        self.grad = Some(match self.grad.take() {
            Some(prev) => prev.plus(&grad)?,
            None => grad,
        });
        Ok(())
    }
}

/// How one rank gathers and reduces units: the collective and whether the units are sharded.
#[derive(Clone, Copy)]
pub struct Comms<'a> {
    pub comm: &'a dyn Collective,
    pub sharded: bool,
}

impl Comms<'_> {
    /// The unit's full flat parameters, padding included (every rank takes part when sharded).
    pub fn gather(&self, layout: &FlatLayout, slice: &Flat) -> anyhow::Result<Flat> {
        if !self.sharded || layout.numel == 0 {
            return slice.owned_copy();
        }
        self.comm
            .gather_flat(slice)
            .context("FSDP: all-gathering the parameter shards")
    }

    /// This rank's slice of the unit's gradient averaged over ranks, from this rank's whole-unit
    /// gradient (`numel` values).
    pub fn reduce(&self, layout: &FlatLayout, grad: Flat) -> anyhow::Result<Flat> {
        anyhow::ensure!(
            grad.len() == layout.numel,
            "FSDP: a unit gradient of {} values for {} parameters",
            grad.len(),
            layout.numel
        );
        if layout.numel == 0 {
            return Ok(grad);
        }
        let mut mine = if self.sharded {
            self.comm
                .reduce_scatter_flat(grad.padded(layout.padded())?)
                .context("FSDP: reduce-scattering the gradients")?
        } else {
            self.comm
                .all_reduce_flat(grad)
                .context("FSDP (NO_SHARD): all-reducing the gradients")?
        };
        mine.divide_in_place(self.comm.world_size() as f64)?;
        Ok(mine)
    }
}

/// What the engine asks of the strategy while it computes unit by unit (`FULL_SHARD`).
pub struct Exchange<'s> {
    pub units: &'s mut [Unit],
    pub named: &'s StageLayouts,
    pub groups: &'s [std::ops::Range<usize>],
    pub comms: Comms<'s>,
    /// The most parameter bytes held whole at once.
    pub peak: &'s mut u64,
}

impl UnitExchange for Exchange<'_> {
    fn layouts(&self) -> &StageLayouts {
        self.named
    }

    fn units(&self) -> &[std::ops::Range<usize>] {
        self.groups
    }

    fn unshard(&mut self, unit: usize) -> anyhow::Result<Flat> {
        let u = &self.units[unit];
        let full = self.comms.gather(&u.layout, &u.shard)?;
        *self.peak = (*self.peak).max(4 * u.layout.numel as u64);
        full.truncated(u.layout.numel)
    }

    fn reduce(&mut self, unit: usize, grad: Flat) -> anyhow::Result<()> {
        let u = &mut self.units[unit];
        let mine = self.comms.reduce(&u.layout, grad)?;
        u.accumulate(mine)
    }
}
