//! Matching published weights (torchvision/timm names) to a model, the same way for every backend.

use super::pos_embed;
use crate::tensor::{HostTensor, StateDict};

/// A model tensor as the pretrained-weight loader sees it.
pub struct Slot<'a> {
    pub name: &'a str,
    pub shape: Vec<usize>,
    /// Parameters of the classifier head may be missing or shaped differently (a new `num_classes`).
    pub trainable: bool,
}

/// What `plan_pretrained` decided: tensors to set (by name), and names left as initialised.
pub struct PretrainedPlan {
    pub set: Vec<(String, HostTensor)>,
    pub kept: Vec<String>,
}

/// Match published weights to a model, the same way for every backend: every parameter and buffer must be
/// present with its shape, except the classifier head (`fc.*`, `head.*`), which is left as initialised when
/// its shape differs; a ViT `pos_embed` for another image size is resampled as timm does; tensors the model
/// does not have are an error. Returns what to set, and the names left as they were.
pub fn plan_pretrained(
    slots: &[Slot],
    state: &StateDict,
    head: &[String],
) -> anyhow::Result<PretrainedPlan> {
    let is_head = |name: &str| {
        head.iter().any(|h| {
            name.strip_prefix(h.as_str())
                .is_some_and(|rest| rest.starts_with('.'))
        })
    };
    let mut set = Vec::new();
    let mut kept = Vec::new();
    let mut problems = Vec::new();
    for slot in slots {
        let mut found = state.get(slot.name).cloned();
        if let (Some(t), "pos_embed") = (&found, slot.name) {
            let dims = &slot.shape;
            if t.shape.len() == 3 && t.shape[2] == dims[2] && t.shape[1] != dims[1] {
                let grid = ((dims[1] - 1) as f64).sqrt().round() as usize;
                found = Some(pos_embed::resample(t, 1, grid)?);
            }
        }
        match found {
            Some(t) if t.shape == slot.shape => set.push((slot.name.to_string(), t)),
            _ if slot.trainable && is_head(slot.name) => kept.push(slot.name.to_string()),
            Some(t) => problems.push(format!(
                "{}: file has shape {:?}, model has {:?}",
                slot.name, t.shape, slot.shape
            )),
            None => problems.push(format!("{}: missing from the file", slot.name)),
        }
    }
    let known: std::collections::BTreeSet<&str> = slots.iter().map(|s| s.name).collect();
    let unexpected: Vec<&String> = state
        .keys()
        .filter(|k| !k.starts_with("optimizer.") && !known.contains(k.as_str()))
        .collect();
    if !unexpected.is_empty() {
        problems.push(format!(
            "{} tensors the model does not have, e.g. {}",
            unexpected.len(),
            unexpected
                .iter()
                .take(3)
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if !problems.is_empty() {
        anyhow::bail!(
            "the pretrained weights do not fit this model:\n    - {}",
            problems.join("\n    - ")
        );
    }
    Ok(PretrainedPlan { set, kept })
}
