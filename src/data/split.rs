//! `data.train_val_test_split`: a data set's train and test files pooled, then cut into train, validation
//! and test parts exactly as PyTorch's `random_split(ConcatDataset([train, test]), lengths,
//! generator=torch.Generator().manual_seed(seed))` cuts them (lightning-hydra-template's MNISTDataModule):
//! the same samples land in the same part, so a run's validation and test sets are the ones its PyTorch
//! twin measures.

use super::{DataError, Dataset, Image, Split};
use crate::registry::Sample;
use crate::schema::SplitLength;
use std::sync::Arc;

/// The part `split` of `pool`, cut by `lengths` with `seed`.
pub fn part_of(
    pool: Arc<dyn Dataset>,
    lengths: &[SplitLength],
    seed: u64,
    split: Split,
) -> Result<Arc<dyn Dataset>, DataError> {
    let counts = counts(lengths, pool.len())?;
    let order = torch_randperm(pool.len(), seed);
    let part = match split {
        Split::Train => 0,
        Split::Val => 1,
        Split::Test => 2,
    };
    let start: usize = counts[..part].iter().sum();
    let indices = order[start..start + counts[part]].to_vec();
    Ok(Arc::new(Subset {
        inner: pool,
        indices,
    }))
}

/// The three parts' sizes, as `random_split` reads `lengths`: fractions when they add up to 1 (any mix of
/// `0.9` and `0`: each part the floor of its share, the remainder dealt one by one from the first), else
/// counts that add up to the pool.
pub fn counts(lengths: &[SplitLength], total: usize) -> Result<Vec<usize>, DataError> {
    if lengths.len() != 3 {
        return Err(DataError::Unsupported(format!(
            "data.train_val_test_split has {} parts; it takes three (train, validation, test)",
            lengths.len()
        )));
    }
    let values: Vec<f64> = lengths
        .iter()
        .map(|l| match l {
            SplitLength::Count(n) => *n as f64,
            SplitLength::Fraction(f) => *f,
        })
        .collect();
    let sum: f64 = values.iter().sum();
    // PyTorch's test: math.isclose(sum(lengths), 1) and sum(lengths) <= 1.
    if (sum - 1.0).abs() <= 1e-9 && sum <= 1.0 {
        if values.iter().any(|f| !(0.0..=1.0).contains(f)) {
            return Err(DataError::Unsupported(format!(
                "data.train_val_test_split {values:?}: fractions must each be in [0, 1]"
            )));
        }
        let mut counts: Vec<usize> = values
            .iter()
            .map(|f| (f * total as f64).floor() as usize)
            .collect();
        let remainder = total - counts.iter().sum::<usize>();
        for i in 0..remainder {
            counts[i % 3] += 1;
        }
        return Ok(counts);
    }
    if let Some(f) = values.iter().find(|v| v.fract() != 0.0 || **v < 0.0) {
        return Err(DataError::Unsupported(format!(
            "data.train_val_test_split {values:?}: {f} is not a count, and the parts do not add up to 1 \
             as fractions; give three counts that add up to {total}, or fractions (e.g. [0.8, 0.1, 0.1])"
        )));
    }
    let counts: Vec<usize> = values.iter().map(|v| *v as usize).collect();
    let sum: usize = counts.iter().sum();
    if sum != total {
        return Err(DataError::Unsupported(format!(
            "data.train_val_test_split {counts:?} adds up to {sum}, but the train and test files hold {total} \
             samples together: give three counts that add up to {total}, or fractions (e.g. [0.8, 0.1, 0.1])"
        )));
    }
    Ok(counts)
}

/// `torch.randperm(n, generator=torch.Generator().manual_seed(seed))` on the CPU: libtorch's Fisher-Yates
/// over the Mersenne Twister's 32-bit outputs (`randperm_cpu`, for n below 2^32 / 20).
pub fn torch_randperm(n: usize, seed: u64) -> Vec<usize> {
    let mut twister = rand_mt::Mt::new(seed as u32);
    let mut order: Vec<usize> = (0..n).collect();
    for i in 0..n.saturating_sub(1) {
        let z = twister.next_u32() as usize % (n - i);
        order.swap(i, i + z);
    }
    order
}

/// Several data sets one after another (PyTorch's `ConcatDataset`).
pub struct Concat {
    parts: Vec<Arc<dyn Dataset>>,
}

impl Concat {
    pub fn new(parts: Vec<Arc<dyn Dataset>>) -> Self {
        Concat { parts }
    }

    fn locate(&self, mut index: usize) -> (&dyn Dataset, usize) {
        for part in &self.parts {
            if index < part.len() {
                return (part.as_ref(), index);
            }
            index -= part.len();
        }
        panic!("index past the end of the concatenated data sets");
    }
}

impl Dataset for Concat {
    fn len(&self) -> usize {
        self.parts.iter().map(|p| p.len()).sum()
    }
    fn get(&self, index: usize) -> Result<Image, DataError> {
        let (part, i) = self.locate(index);
        part.get(i)
    }
    fn num_classes(&self) -> usize {
        self.parts.first().map_or(0, |p| p.num_classes())
    }
    fn yields_tensors(&self) -> bool {
        self.parts.first().is_some_and(|p| p.yields_tensors())
    }
    fn tensor(&self, index: usize) -> Result<Sample, DataError> {
        let (part, i) = self.locate(index);
        part.tensor(i)
    }
    fn encoded(&self, index: usize) -> Option<Result<(Vec<u8>, String), DataError>> {
        let (part, i) = self.locate(index);
        part.encoded(i)
    }
    fn label(&self, index: usize) -> Option<Result<u32, DataError>> {
        let (part, i) = self.locate(index);
        part.label(i)
    }
}

/// The samples of a data set at `indices` (PyTorch's `Subset`).
pub struct Subset {
    inner: Arc<dyn Dataset>,
    indices: Vec<usize>,
}

impl Dataset for Subset {
    fn len(&self) -> usize {
        self.indices.len()
    }
    fn sample_id(&self, index: usize) -> Option<String> {
        self.inner.sample_id(self.indices[index])
    }
    fn get(&self, index: usize) -> Result<Image, DataError> {
        self.inner.get(self.indices[index])
    }
    fn num_classes(&self) -> usize {
        self.inner.num_classes()
    }
    fn yields_tensors(&self) -> bool {
        self.inner.yields_tensors()
    }
    fn tensor(&self, index: usize) -> Result<Sample, DataError> {
        self.inner.tensor(self.indices[index])
    }
    fn encoded(&self, index: usize) -> Option<Result<(Vec<u8>, String), DataError>> {
        self.inner.encoded(self.indices[index])
    }
    fn label(&self, index: usize) -> Option<Result<u32, DataError>> {
        self.inner.label(self.indices[index])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use SplitLength::{Count, Fraction};

    /// PyTorch 2.11's own output (`torch.randperm(n, generator=torch.Generator().manual_seed(42))`); the
    /// whole 70,000 permutation is checked against PyTorch in tests/template.rs's torch oracle.
    #[rstest]
    #[case(10, vec![2, 6, 1, 8, 4, 5, 0, 9])]
    #[case(1000, vec![542, 618, 816, 68, 94, 215, 60, 585])]
    #[case(70000, vec![37542, 64941, 23546, 30182, 19690, 46550, 59030, 28299])]
    fn randperm_is_torchs(#[case] n: usize, #[case] head: Vec<usize>) {
        let order = torch_randperm(n, 42);
        assert_eq!(&order[..head.len()], &head[..]);
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert!(sorted.iter().enumerate().all(|(i, &v)| i == v));
    }

    #[rstest]
    #[case::counts(vec![Count(6), Count(2), Count(2)], 10, vec![6, 2, 2])]
    #[case::fractions_with_a_remainder(vec![Fraction(0.5), Fraction(0.25), Fraction(0.25)], 11, vec![6, 3, 2])]
    #[case::fractions_and_a_zero(vec![Fraction(0.9), Fraction(0.1), Count(0)], 10, vec![9, 1, 0])]
    fn lengths_are_read_as_random_split_reads_them(
        #[case] lengths: Vec<SplitLength>,
        #[case] total: usize,
        #[case] want: Vec<usize>,
    ) {
        assert_eq!(counts(&lengths, total).unwrap(), want);
    }

    #[rstest]
    #[case::wrong_sum(vec![Count(6), Count(2), Count(1)], "adds up to 9")]
    #[case::two_parts(vec![Count(6), Count(4)], "three")]
    #[case::fractions_off(vec![Fraction(0.5), Fraction(0.2), Fraction(0.2)], "do not add up to 1")]
    fn bad_lengths_are_named(#[case] lengths: Vec<SplitLength>, #[case] want: &str) {
        let err = counts(&lengths, 10).unwrap_err().to_string();
        assert!(err.contains(want), "{err}");
    }
}
