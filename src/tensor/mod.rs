//! The tensors that cross module boundaries: `HostTensor`/`StateDict` (named host tensors, the currency of
//! checkpoints, pretrained weights and cross-backend tests) and `Flat` vectors (a 1-D vector on the host
//! or on a libtorch device, what gradients and FSDP slices travel as). Every other layer builds on these;
//! this one uses none of them.

pub mod candle_cpu;
pub mod flat;

pub use flat::{Flat, FlatHome};
use std::collections::BTreeMap;

/// A tensor on the host, in row-major `f32`: the currency of checkpoints and cross-backend tests.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl HostTensor {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Named tensors in a stable order: model weights under their torchvision/timm names, optimizer state
/// under `optimizer.<param>.<slot>`.
pub type StateDict = BTreeMap<String, HostTensor>;

/// Where each named tensor of a flat layout sits in the flat buffer (in layout order): the one walk
/// that FSDP's flattening and the engines' `set_parameters`/`take_gradients` share.
pub fn layout_ranges(
    layout: &[(String, Vec<usize>)],
) -> impl Iterator<Item = (&str, &[usize], std::ops::Range<usize>)> {
    layout.iter().scan(0usize, |at, (name, shape)| {
        let start = *at;
        *at += shape.iter().product::<usize>();
        Some((name.as_str(), shape.as_slice(), start..*at))
    })
}
