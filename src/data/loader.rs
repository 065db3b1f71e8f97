//! The loader: worker threads decode and augment whole batches ahead of the trainer, a bounded queue holds
//! them, and the trainer receives them in sampler order whatever order the workers finish in.

use super::sampler::Order;
use super::stream::Stream;
use super::{transforms, DataError, Dataset, Streamed};
use crate::platform::rng::Rng;
use crate::schema::Transform;
use std::any::Any;
use std::collections::BTreeMap;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;

/// A batch ready for a backend: `f32` NCHW pixels and `u32` labels — or a registered dataset's samples
/// (`tensors`: their own shape, and their targets when those are values rather than classes).
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// Row-major inputs, one sample after another (`channels * height * width` values each).
    pub images: Vec<f32>,
    /// Class targets (empty when the targets are values).
    pub labels: Vec<u32>,
    pub channels: usize,
    pub height: usize,
    pub width: usize,
    /// The backend's own copy of this batch, when the loader made one (`LoaderSpec::stager`).
    pub staged: Option<BackendBatch>,
    /// A registered dataset's samples: their shape (which `channels`/`height`/`width` flatten) and their
    /// value targets.
    pub tensors: Option<TensorSamples>,
}

/// A finished batch gives its image buffer back for the next batch to fill: a batch of ImageNet-sized
/// images is tens of MB, which the allocator would otherwise map and zero-fill afresh every batch (a
/// third of the loader's time per image, measured). At most `KEPT` buffers wait.
impl Drop for Batch {
    fn drop(&mut self) {
        let images = std::mem::take(&mut self.images);
        if images.capacity() >= RECYCLED_FROM {
            let mut kept = RECYCLED.lock().unwrap_or_else(|p| p.into_inner());
            if kept.len() < KEPT {
                kept.push(images);
            }
        }
    }
}

/// Buffers at least this long (floats) are recycled; smaller ones cost the allocator nothing.
const RECYCLED_FROM: usize = 1 << 18;
const KEPT: usize = 8;
static RECYCLED: std::sync::Mutex<Vec<Vec<f32>>> = std::sync::Mutex::new(Vec::new());

/// An empty buffer for a batch's images, a recycled one when there is one (its memory already mapped).
fn batch_buffer() -> Vec<f32> {
    let mut kept = RECYCLED.lock().unwrap_or_else(|p| p.into_inner());
    let mut buffer = kept.pop().unwrap_or_default();
    buffer.clear();
    buffer
}

/// What a batch of a registered dataset's samples adds to the NCHW view.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSamples {
    /// One sample's input shape.
    pub input_shape: Vec<usize>,
    /// Value targets, one sample after another, and one sample's shape; `None` for class targets.
    pub targets: Option<(Vec<f32>, Vec<usize>)>,
}

impl TensorSamples {
    /// Rows `rows` of a batch of these samples (DataParallel's scatter).
    pub fn rows(&self, rows: std::ops::Range<usize>) -> TensorSamples {
        TensorSamples {
            input_shape: self.input_shape.clone(),
            targets: self.targets.as_ref().map(|(values, shape)| {
                let per: usize = shape.iter().product();
                (
                    values[rows.start * per..rows.end * per].to_vec(),
                    shape.clone(),
                )
            }),
        }
    }
}

/// A backend's copy of a batch (for a GPU: images and labels in page-locked memory, ready for an
/// asynchronous copy), opaque to the loader; the backend that made it reads it back by downcasting.
#[derive(Clone)]
pub struct BackendBatch(pub Arc<dyn Any + Send + Sync>);

impl std::fmt::Debug for BackendBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BackendBatch(..)")
    }
}

impl PartialEq for BackendBatch {
    /// The same copy; two stagings of equal batches are still equal batches by their pixels.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Copies each finished batch where its backend reads it fastest, in the loader's worker threads, so
/// the copy is off the training step's path: PyTorch DataLoader's `pin_memory`, for a GPU.
pub trait StageBatch: Send + Sync {
    fn stage(&self, batch: &Batch) -> anyhow::Result<BackendBatch>;
}

impl Batch {
    /// Samples in the batch.
    pub fn len(&self) -> usize {
        match self.channels * self.height * self.width {
            0 => self.labels.len(),
            per => self.images.len() / per,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What an epoch of loading needs.
#[derive(Clone)]
pub struct LoaderSpec {
    pub dataset: Arc<dyn Dataset>,
    pub transforms: Arc<Vec<Transform>>,
    pub batch_size: usize,
    pub drop_last: bool,
    pub num_workers: usize,
    /// Batches kept ready per worker.
    pub prefetch: usize,
    pub seed: u64,
    /// The backend's staging of each batch (a GPU's page-locked copy), if it wants one.
    pub stager: Option<Arc<dyn StageBatch>>,
    /// A dataset read as shards: samples its reader may hold beyond the batches in flight (the
    /// shuffle buffer's size).
    pub read_ahead: usize,
    /// `data.skip_corrupt`: a sample whose image cannot be decoded is left out of its batch and counted
    /// here; `None`: it stops the run.
    pub skipped: Option<Arc<super::skipped::Skipped>>,
}

/// Build one batch from sample indices (augmentation keyed by seed, epoch and sample index); a dataset
/// read as shards gives its samples through the epoch's `stream`.
fn make_batch(
    spec: &LoaderSpec,
    stream: Option<&Stream>,
    epoch: u64,
    indices: &[usize],
) -> Result<Batch, DataError> {
    let tensors = spec.dataset.yields_tensors();
    let batch = match stream {
        Some(stream) if tensors => tensor_batch(|i| stream.take(i)?.into_tensor(), indices)?,
        Some(stream) => image_batch(spec, epoch, indices, |i| match stream.take(i)? {
            Streamed::Encoded(image) => Ok(Pixels::Encoded(image)),
            other => other.into_image().map(Pixels::Decoded),
        })?,
        None if tensors => tensor_batch(|i| spec.dataset.tensor(i), indices)?,
        None => image_batch(spec, epoch, indices, |i| {
            match spec.dataset.encoded_image(i) {
                Some(image) => image.map(Pixels::Encoded),
                None => spec.dataset.get(i).map(Pixels::Decoded),
            }
        })?,
    };
    stage(spec, batch)
}

/// A sample's image as the dataset gives it.
enum Pixels {
    Decoded(super::Image),
    /// Still encoded: a JPEG goes through `fused` (only what the crop needs is decoded).
    Encoded(super::EncodedImage),
}

/// Images decoded and transformed into one batch; every image must come out the first one's size.
fn image_batch(
    spec: &LoaderSpec,
    epoch: u64,
    indices: &[usize],
    image: impl Fn(usize) -> Result<Pixels, DataError>,
) -> Result<Batch, DataError> {
    let mut images = batch_buffer();
    let mut labels = Vec::with_capacity(indices.len());
    let mut shape = None;
    for &i in indices {
        let rng = &mut Rng::keyed(&[spec.seed, epoch, i as u64]);
        let before = images.len();
        let sample = image(i).and_then(|pixels| match pixels {
            Pixels::Decoded(img) => {
                let label = img.label;
                Ok((
                    transforms::apply(&spec.transforms, img, rng, &mut images),
                    label,
                ))
            }
            Pixels::Encoded(encoded) => {
                let label = encoded.label;
                let dims =
                    match super::fused::apply_encoded(&spec.transforms, &encoded, rng, &mut images)
                    {
                        Some(dims) => dims?,
                        None => {
                            transforms::apply(&spec.transforms, encoded.decode()?, rng, &mut images)
                        }
                    };
                Ok((dims, label))
            }
        });
        let dims = match (sample, &spec.skipped) {
            (Ok((dims, label)), _) => {
                labels.push(label);
                dims
            }
            (Err(e @ DataError::Corrupt { .. }), Some(skipped)) => {
                images.truncate(before);
                skipped.record(&e);
                continue;
            }
            (Err(e), _) => return Err(e),
        };
        match shape {
            None => {
                // Room for the whole batch at once: growing by doubling would copy it again and again.
                let (c, h, w) = dims;
                images.reserve(c * h * w * (indices.len() - 1));
                shape = Some(dims)
            }
            Some(first) if first != dims => {
                return Err(DataError::Unsupported(format!(
                    "images in a batch differ in size ({first:?} vs {dims:?} as C,H,W); add a resize or crop transform"
                )))
            }
            Some(_) => {}
        }
    }
    if labels.is_empty() && !indices.is_empty() {
        return Err(DataError::Unsupported(format!(
            "every sample of a batch of {} was damaged and left out (data.skip_corrupt): the data set's \
             images cannot be decoded",
            indices.len()
        )));
    }
    let (channels, height, width) = shape.unwrap_or((0, 0, 0));
    Ok(Batch {
        images,
        labels,
        channels,
        height,
        width,
        staged: None,
        tensors: None,
    })
}

/// A registered dataset's samples, stacked; every sample must have the first one's shapes.
fn tensor_batch(
    sample: impl Fn(usize) -> Result<crate::registry::Sample, DataError>,
    indices: &[usize],
) -> Result<Batch, DataError> {
    use crate::registry::Target;
    let mut images = Vec::new();
    let mut labels = Vec::new();
    let mut values = Vec::new();
    let mut shapes: Option<(Vec<usize>, Option<Vec<usize>>)> = None;
    for &i in indices {
        let sample = sample(i)?;
        let target_shape = match &sample.target {
            Target::Class(c) => {
                labels.push(*c);
                None
            }
            Target::Values { values: v, shape } => {
                values.extend_from_slice(v);
                Some(shape.clone())
            }
        };
        let these = (sample.shape, target_shape);
        match &shapes {
            None => shapes = Some(these),
            Some(first) if *first != these => {
                return Err(DataError::Unsupported(format!(
                    "sample {i} has input shape {:?} and target {:?}, the batch's first {:?} and {:?}: every \
                     sample of a dataset has the same shapes and the same kind of target",
                    these.0, these.1, first.0, first.1
                )))
            }
            Some(_) => {}
        }
        images.extend_from_slice(&sample.input);
    }
    let (input_shape, target_shape) = shapes.unwrap_or_default();
    let (channels, height, width) = match input_shape.as_slice() {
        [c, h, w] => (*c, *h, *w),
        shape => (shape.iter().product(), 1, 1),
    };
    Ok(Batch {
        images,
        labels,
        channels,
        height,
        width,
        staged: None,
        tensors: Some(TensorSamples {
            input_shape,
            targets: target_shape.map(|shape| (values, shape)),
        }),
    })
}

/// The backend's staged copy of a finished batch, when it asked for one.
fn stage(spec: &LoaderSpec, mut batch: Batch) -> Result<Batch, DataError> {
    if let Some(stager) = &spec.stager {
        batch.staged = Some(
            stager
                .stage(&batch)
                .map_err(|e| DataError::Unsupported(format!("staging a batch: {e:#}")))?,
        );
    }
    Ok(batch)
}

/// Split this epoch's indices into batches.
fn batches_of(indices: &[usize], batch_size: usize, drop_last: bool) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = indices
        .chunks(batch_size.max(1))
        .map(<[usize]>::to_vec)
        .collect();
    if drop_last && out.last().is_some_and(|b| b.len() < batch_size) {
        out.pop();
    }
    out
}

/// Iterate over an epoch's batches, built by `num_workers` threads (or inline when 0).
pub struct EpochLoader {
    receiver: Option<mpsc::Receiver<(usize, Result<Batch, DataError>)>>,
    inline: Option<(LoaderSpec, u64, Vec<Vec<usize>>)>,
    pending: BTreeMap<usize, Result<Batch, DataError>>,
    next: usize,
    total: usize,
    workers: Vec<thread::JoinHandle<()>>,
    /// The reader of a dataset read as shards.
    stream: Option<Arc<Stream>>,
}

impl EpochLoader {
    pub fn new(spec: &LoaderSpec, epoch: u64, order: &Order) -> Self {
        let batches = batches_of(&order.indices, spec.batch_size, spec.drop_last);
        let total = batches.len();
        let stream = match (&order.reads, spec.dataset.shard_lens()) {
            (Some(reads), Some(lens)) => {
                let wanted: Vec<usize> = batches.iter().flatten().copied().collect();
                let in_flight = spec.batch_size * (spec.num_workers + 1) * (spec.prefetch + 1);
                Some(Arc::new(Stream::start(
                    spec.dataset.clone(),
                    &lens,
                    reads,
                    &wanted,
                    spec.read_ahead + in_flight,
                )))
            }
            _ => None,
        };
        if spec.num_workers == 0 {
            return EpochLoader {
                receiver: None,
                inline: Some((spec.clone(), epoch, batches)),
                pending: BTreeMap::new(),
                next: 0,
                total,
                workers: Vec::new(),
                stream,
            };
        }
        let (tx, rx) = mpsc::sync_channel(spec.num_workers * spec.prefetch.max(1));
        let batches = Arc::new(batches);
        let workers = (0..spec.num_workers)
            .map(|worker| {
                let (tx, spec, batches) = (tx.clone(), spec.clone(), batches.clone());
                let stream = stream.clone();
                thread::spawn(move || {
                    for b in (worker..batches.len()).step_by(spec.num_workers) {
                        let batch = make_batch(&spec, stream.as_deref(), epoch, &batches[b]);
                        if tx.send((b, batch)).is_err() {
                            return; // the consumer went away
                        }
                    }
                })
            })
            .collect();
        EpochLoader {
            receiver: Some(rx),
            inline: None,
            pending: BTreeMap::new(),
            next: 0,
            total,
            workers,
            stream,
        }
    }

    pub fn len(&self) -> usize {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }
}

impl Iterator for EpochLoader {
    type Item = Result<Batch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.total {
            return None;
        }
        if let Some((spec, epoch, batches)) = &self.inline {
            let b = make_batch(spec, self.stream.as_deref(), *epoch, &batches[self.next]);
            self.next += 1;
            return Some(b);
        }
        let rx = self.receiver.as_ref()?;
        while !self.pending.contains_key(&self.next) {
            match rx.recv() {
                Ok((i, b)) => {
                    self.pending.insert(i, b);
                }
                Err(_) => {
                    return Some(Err(DataError::Unsupported(
                        "a loader worker stopped unexpectedly".into(),
                    )))
                }
            }
        }
        let b = self.pending.remove(&self.next);
        self.next += 1;
        b
    }
}

impl Drop for EpochLoader {
    fn drop(&mut self) {
        // Workers waiting on the reader are released first; dropping the receiver then makes blocked
        // workers' sends fail, so they exit.
        if let Some(stream) = &self.stream {
            stream.stop();
        }
        self.receiver.take();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{synthetic::Synthetic, Split};

    fn spec(workers: usize) -> LoaderSpec {
        LoaderSpec {
            dataset: Arc::new(Synthetic::with_shape(37, 8, 3, 4, 1, Split::Train)),
            transforms: Arc::new(vec![
                Transform::RandomCrop {
                    size: 8,
                    padding: 2,
                },
                Transform::HorizontalFlip { p: 0.5 },
            ]),
            batch_size: 5,
            drop_last: false,
            num_workers: workers,
            prefetch: 2,
            seed: 3,
            stager: None,
            read_ahead: 0,
            skipped: None,
        }
    }

    /// Stages a copy of the labels, and fails on a batch holding label `fail_on` (when set).
    struct CopyLabels {
        fail_on: Option<u32>,
    }

    impl StageBatch for CopyLabels {
        fn stage(&self, batch: &Batch) -> anyhow::Result<BackendBatch> {
            if let Some(bad) = self.fail_on.filter(|l| batch.labels.contains(l)) {
                anyhow::bail!("no room for label {bad}");
            }
            Ok(BackendBatch(Arc::new(batch.labels.clone())))
        }
    }

    #[rstest::rstest]
    #[case::inline(0)]
    #[case::workers(3)]
    fn each_batch_carries_its_staging(#[case] workers: usize) {
        let mut s = spec(workers);
        s.stager = Some(Arc::new(CopyLabels { fail_on: None }));
        let indices: Vec<usize> = (0..37).collect();
        let batches: Vec<Batch> = EpochLoader::new(&s, 0, &Order::of(indices.clone()))
            .map(Result::unwrap)
            .collect();
        assert_eq!(batches.len(), 8);
        for b in &batches {
            let staged = b.staged.as_ref().expect("staged");
            assert_eq!(staged.0.downcast_ref::<Vec<u32>>(), Some(&b.labels));
        }
        // Unstaged, the pixels are the same.
        let plain: Vec<Batch> = EpochLoader::new(&spec(workers), 0, &Order::of(indices.clone()))
            .map(Result::unwrap)
            .collect();
        assert!(plain.iter().all(|b| b.staged.is_none()));
        assert!(plain
            .iter()
            .zip(&batches)
            .all(|(p, b)| p.images == b.images));
    }

    #[test]
    fn a_failed_staging_is_the_batch_error() {
        let mut s = spec(2);
        let indices: Vec<usize> = (0..37).collect();
        let label = EpochLoader::new(&s, 0, &Order::of(indices.clone()))
            .nth(3)
            .unwrap()
            .unwrap()
            .labels[0];
        s.stager = Some(Arc::new(CopyLabels {
            fail_on: Some(label),
        }));
        let err = EpochLoader::new(&s, 0, &Order::of(indices.clone()))
            .find_map(Result::err)
            .expect("an error");
        assert!(
            err.to_string()
                .contains(&format!("staging a batch: no room for label {label}")),
            "{err}"
        );
    }

    #[test]
    fn workers_give_the_same_batches_in_the_same_order_as_inline() {
        let indices: Vec<usize> = (0..37).rev().collect();
        let inline: Vec<Batch> = EpochLoader::new(&spec(0), 1, &Order::of(indices.clone()))
            .map(Result::unwrap)
            .collect();
        let threaded: Vec<Batch> = EpochLoader::new(&spec(3), 1, &Order::of(indices.clone()))
            .map(Result::unwrap)
            .collect();
        assert_eq!(inline.len(), 8);
        assert_eq!(inline, threaded);
        assert_eq!(inline[0].images.len(), 5 * 3 * 8 * 8);
        assert_eq!(
            (inline[0].channels, inline[0].height, inline[0].width),
            (3, 8, 8)
        );
        assert_eq!(inline[7].len(), 2);
        // Another epoch augments differently.
        let other: Vec<Batch> = EpochLoader::new(&spec(2), 2, &Order::of(indices.clone()))
            .map(Result::unwrap)
            .collect();
        assert_ne!(inline[0].images, other[0].images);
    }

    #[test]
    fn drop_last_and_early_drop() {
        let mut s = spec(2);
        s.drop_last = true;
        let indices: Vec<usize> = (0..37).collect();
        assert_eq!(
            EpochLoader::new(&s, 0, &Order::of(indices.clone())).count(),
            7
        );
        // Dropping a loader mid-epoch must not hang.
        let mut l = EpochLoader::new(&s, 0, &Order::of(indices.clone()));
        l.next();
        drop(l);
    }
}
