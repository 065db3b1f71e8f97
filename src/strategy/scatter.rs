//! DataParallel's scatter: a batch cut into contiguous chunks the way `torch.chunk` (and so
//! `nn.DataParallel`) cuts it: ceil(B/N) rows each, the last smaller, and fewer than N chunks when the
//! rows run out first (B=2 on 3 replicas gives 2 chunks; B=9 on 4 gives 3 of 3).

use crate::data::loader::Batch;

/// The row counts of `torch.chunk(batch, n)` for a batch of `rows` rows.
fn chunk_lengths(rows: usize, n: usize) -> Vec<usize> {
    if rows == 0 || n == 0 {
        return Vec::new();
    }
    let size = rows.div_ceil(n);
    (0..rows)
        .step_by(size)
        .map(|start| size.min(rows - start))
        .collect()
}

/// The batch's chunks for `n` replicas, in order (replica r takes chunk r; replicas past the last chunk
/// take nothing).
pub fn scatter(batch: &Batch, n: usize) -> Vec<Batch> {
    let per_row = batch.channels * batch.height * batch.width;
    let mut start = 0;
    chunk_lengths(batch.len(), n)
        .into_iter()
        .map(|len| {
            let rows = start..start + len;
            start += len;
            Batch {
                images: batch.images[rows.start * per_row..rows.end * per_row].to_vec(),
                labels: match batch.labels.is_empty() {
                    true => Vec::new(),
                    false => batch.labels[rows.clone()].to_vec(),
                },
                channels: batch.channels,
                height: batch.height,
                width: batch.width,
                staged: None,
                tensors: batch.tensors.as_ref().map(|t| t.rows(rows)),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case::even(8, 2, vec![4, 4])]
    #[case::uneven(7, 3, vec![3, 3, 1])]
    #[case::last_partial_batch(5, 3, vec![2, 2, 1])]
    #[case::fewer_rows_than_replicas(2, 3, vec![1, 1])]
    #[case::chunks_run_out_before_replicas(9, 4, vec![3, 3, 3])]
    #[case::one_replica(5, 1, vec![5])]
    #[case::one_row(1, 4, vec![1])]
    #[case::empty(0, 2, vec![])]
    fn chunks_follow_torch_chunk(#[case] rows: usize, #[case] n: usize, #[case] want: Vec<usize>) {
        assert_eq!(chunk_lengths(rows, n), want);
    }

    #[test]
    fn scatter_keeps_rows_whole_and_in_order() {
        // 5 rows of 1x1x2 pixels: row i holds [i, i + 0.5], label i.
        let batch = Batch {
            images: (0..5).flat_map(|i| [i as f32, i as f32 + 0.5]).collect(),
            labels: (0..5).collect(),
            channels: 1,
            height: 1,
            width: 2,
            staged: None,
            tensors: None,
        };
        let parts = scatter(&batch, 3);
        let labels: Vec<Vec<u32>> = parts.iter().map(|b| b.labels.clone()).collect();
        assert_eq!(labels, vec![vec![0, 1], vec![2, 3], vec![4]]);
        assert_eq!(parts[1].images, vec![2.0, 2.5, 3.0, 3.5]);
        assert_eq!(parts[2].images, vec![4.0, 4.5]);
        assert!(parts
            .iter()
            .all(|b| (b.channels, b.height, b.width) == (1, 1, 2)));
    }
}
