//! DDP's gradient buckets: how gradients are grouped for averaging (`trainer.ddp.bucket_cap_mb`), shared by
//! the strategy's post-backward averaging and libtorch's reducer, which averages during the backward pass.

/// How gradients are averaged across ranks: the `trainer.ddp` settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradSync {
    pub bucket_cap_bytes: usize,
    /// A parameter without a gradient counts as zero on that rank instead of being an error.
    pub find_unused_parameters: bool,
    /// Gradients alias the reducer's buckets instead of being copied back (libtorch's reducer only:
    /// the other paths have no bucket a gradient could alias, so it changes nothing there).
    pub gradient_as_bucket_view: bool,
}

/// Group tensors (given by element count, in the order gradients become ready) into buckets of at most
/// `cap_bytes` of f32; a tensor larger than the cap is a bucket of its own. Returns index ranges.
pub fn buckets(numels: &[usize], cap_bytes: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    for (i, &n) in numels.iter().enumerate() {
        let size = n * 4;
        if i > start && bytes + size > cap_bytes {
            out.push(start..i);
            start = i;
            bytes = 0;
        }
        bytes += size;
    }
    if start < numels.len() {
        out.push(start..numels.len());
    }
    out
}

/// The error DDP gives when a parameter took no part in the loss.
pub fn unused_parameters_error(names: &[String]) -> anyhow::Error {
    anyhow::anyhow!(
        "DDP: {} parameter(s) received no gradient in this step: {}{}.\n    \
         Every rank must produce a gradient for every parameter before the all-reduce. If parts of the \
         model are unused on purpose, set trainer.ddp.find_unused_parameters=true (they then count as zero)",
        names.len(),
        names.iter().take(5).cloned().collect::<Vec<_>>().join(", "),
        if names.len() > 5 { ", ..." } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case::one_bucket(&[10, 10, 10], 1000, vec![0..3])]
    #[case::split(&[100, 100, 100], 800, vec![0..2, 2..3])]
    #[case::oversized_alone(&[10, 1000, 10], 100, vec![0..1, 1..2, 2..3])]
    #[case::empty(&[], 100, vec![])]
    fn buckets_respect_the_cap(
        #[case] numels: &[usize],
        #[case] cap: usize,
        #[case] expected: Vec<std::ops::Range<usize>>,
    ) {
        assert_eq!(buckets(numels, cap), expected);
    }

    #[test]
    fn unused_parameters_are_named_with_the_fix() {
        let e = unused_parameters_error(&["head.weight".into()]).to_string();
        assert!(
            e.contains("head.weight") && e.contains("find_unused_parameters=true"),
            "{e}"
        );
    }
}
