//! Dropout masks drawn on the host from the step's seeded generator: every backend draws the same mask,
//! so runs agree across backends (and FSDP's recomputed stages replay the same masks).

use crate::platform::rng::Rng;

/// Inverted-dropout multipliers (0 or 1/keep) drawn on the host from the step's seeded generator: every
/// backend draws the same mask, so runs agree across backends.
pub fn dropout_mask(n: usize, prob: f64, rng: &mut Rng) -> Vec<f32> {
    let keep = 1.0 - prob;
    (0..n)
        .map(|_| {
            if rng.next_f64() < keep {
                (1.0 / keep) as f32
            } else {
                0.0
            }
        })
        .collect()
}
