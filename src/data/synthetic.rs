//! A generated image-classification set that a small network can learn in seconds: each class is a fixed
//! arrangement of coloured blobs (drawn from the seed), and each sample is its class pattern shifted,
//! brightened and noised. Deterministic by (seed, split, index); any size and resolution.

use super::{DataError, Dataset, Image, Split};
use crate::platform::rng::Rng;
use crate::schema::DataConfig;

#[derive(Debug, Clone)]
struct Blob {
    cy: f32,
    cx: f32,
    radius: f32,
    color: [f32; 3],
}

pub struct Synthetic {
    len: usize,
    size: usize,
    channels: usize,
    classes: Vec<Vec<Blob>>,
    seed: u64,
    split: Split,
}

impl Synthetic {
    pub fn new(cfg: &DataConfig, split: Split, seed: u64) -> Self {
        let len = match split {
            Split::Train => cfg.train_size.unwrap_or(4096),
            Split::Val | Split::Test => cfg.val_size.unwrap_or(1024),
        };
        Synthetic::with_shape(
            len,
            cfg.image_size,
            cfg.channels,
            cfg.num_classes,
            seed,
            split,
        )
    }

    pub fn with_shape(
        len: usize,
        size: usize,
        channels: usize,
        num_classes: usize,
        seed: u64,
        split: Split,
    ) -> Self {
        // Class patterns depend on the seed only, so train and val share them.
        let classes = (0..num_classes)
            .map(|c| {
                let mut rng = Rng::keyed(&[seed, 0xC1A55, c as u64]);
                (0..3)
                    .map(|_| Blob {
                        cy: rng.uniform(0.2, 0.8) as f32,
                        cx: rng.uniform(0.2, 0.8) as f32,
                        radius: rng.uniform(0.12, 0.3) as f32,
                        color: [rng.next_f32(), rng.next_f32(), rng.next_f32()],
                    })
                    .collect()
            })
            .collect();
        Synthetic {
            len,
            size,
            channels,
            classes,
            seed,
            split,
        }
    }
}

impl Dataset for Synthetic {
    fn len(&self) -> usize {
        self.len
    }

    fn num_classes(&self) -> usize {
        self.classes.len()
    }

    fn get(&self, index: usize) -> Result<Image, DataError> {
        let label = index % self.classes.len().max(1);
        let split_key = match self.split {
            Split::Train => 1,
            Split::Val => 2,
            Split::Test => 3,
        };
        let mut rng = Rng::keyed(&[self.seed, split_key, index as u64]);
        let n = self.size;
        let (dy, dx) = (rng.uniform(-0.1, 0.1) as f32, rng.uniform(-0.1, 0.1) as f32);
        let gain = rng.uniform(0.7, 1.3) as f32;
        // A round Gaussian blob is a row factor times a column factor: 2n exponentials per blob
        // instead of n².
        let blobs = &self.classes[label];
        let factors = |centre: f32, shift: f32, blob: &Blob| -> Vec<f32> {
            (0..n)
                .map(|i| {
                    let d = (i as f32 + 0.5) / n as f32 - centre - shift;
                    (-d * d / (2.0 * blob.radius * blob.radius)).exp()
                })
                .collect()
        };
        let rows: Vec<Vec<f32>> = blobs.iter().map(|b| factors(b.cy, dy, b)).collect();
        let cols: Vec<Vec<f32>> = blobs.iter().map(|b| factors(b.cx, dx, b)).collect();
        let mut noise = NormalPairs::default();
        let mut pixels = vec![0u8; n * n * self.channels];
        for y in 0..n {
            for x in 0..n {
                let mut value = [0.1f32; 3];
                for (k, blob) in blobs.iter().enumerate() {
                    let w = rows[k][y] * cols[k][x];
                    for (v, c) in value.iter_mut().zip(blob.color) {
                        *v += w * c;
                    }
                }
                for ch in 0..self.channels {
                    let v = if self.channels == 1 {
                        (value[0] + value[1] + value[2]) / 3.0
                    } else {
                        value[ch % 3]
                    };
                    let noise = noise.next(&mut rng) * 0.08;
                    pixels[(y * n + x) * self.channels + ch] =
                        ((v * gain + noise).clamp(0.0, 1.0) * 255.0) as u8;
                }
            }
        }
        Ok(Image {
            height: n,
            width: n,
            channels: self.channels,
            pixels,
            label: label as u32,
        })
    }
}

/// Standard normal values two at a time (Marsaglia's polar method: no trigonometry, and both values of
/// each pair used), in f32: the pixel noise was most of a generated image's cost.
#[derive(Default)]
struct NormalPairs {
    spare: Option<f32>,
}

impl NormalPairs {
    fn next(&mut self, rng: &mut Rng) -> f32 {
        if let Some(v) = self.spare.take() {
            return v;
        }
        loop {
            let u = 2.0 * rng.next_f32() - 1.0;
            let v = 2.0 * rng.next_f32() - 1.0;
            let s = u * u + v * v;
            if s > 0.0 && s < 1.0 {
                let scale = (-2.0 * s.ln() / s).sqrt();
                self.spare = Some(v * scale);
                return u * scale;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_balanced_and_class_dependent() {
        let a = Synthetic::with_shape(100, 16, 3, 10, 1, Split::Train);
        let b = Synthetic::with_shape(100, 16, 3, 10, 1, Split::Train);
        assert_eq!(a.get(7).unwrap(), b.get(7).unwrap());
        assert_eq!(a.get(7).unwrap().label, 7);
        assert_eq!(a.get(17).unwrap().label, 7);
        // Same class, different samples differ; different seeds give different patterns.
        assert_ne!(a.get(7).unwrap().pixels, a.get(17).unwrap().pixels);
        let c = Synthetic::with_shape(100, 16, 3, 10, 2, Split::Train);
        assert_ne!(a.get(7).unwrap().pixels, c.get(7).unwrap().pixels);
        // Balanced: 100 samples over 10 classes is 10 of each.
        let mut counts = [0usize; 10];
        for i in 0..100 {
            counts[a.get(i).unwrap().label as usize] += 1;
        }
        assert_eq!(counts, [10; 10]);
    }

    /// The pixel noise is standard normal: mean 0, variance 1, and about 68% within one deviation.
    #[test]
    fn noise_is_standard_normal() {
        let mut rng = Rng::new(11);
        let mut pairs = NormalPairs::default();
        let values: Vec<f64> = (0..200_000)
            .map(|_| f64::from(pairs.next(&mut rng)))
            .collect();
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / values.len() as f64;
        let within = values.iter().filter(|v| v.abs() < 1.0).count() as f64 / values.len() as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "variance {var}");
        assert!(
            (within - 0.6827).abs() < 0.01,
            "within one deviation {within}"
        );
    }

    /// A nearest-class-mean classifier must beat chance by far, or the set is not learnable.
    #[test]
    fn learnable_by_a_trivial_classifier() {
        let train = Synthetic::with_shape(400, 16, 3, 10, 5, Split::Train);
        let val = Synthetic::with_shape(200, 16, 3, 10, 5, Split::Val);
        let dim = 16 * 16 * 3;
        let mut means = vec![vec![0f64; dim]; 10];
        for i in 0..train.len() {
            let img = train.get(i).unwrap();
            for (m, p) in means[img.label as usize].iter_mut().zip(&img.pixels) {
                *m += *p as f64 / 40.0;
            }
        }
        let mut correct = 0;
        for i in 0..val.len() {
            let img = val.get(i).unwrap();
            let best = (0..10)
                .min_by(|&a, &b| {
                    let d = |c: usize| {
                        means[c]
                            .iter()
                            .zip(&img.pixels)
                            .map(|(m, p)| (m - *p as f64).powi(2))
                            .sum::<f64>()
                    };
                    d(a).partial_cmp(&d(b)).unwrap()
                })
                .unwrap();
            correct += usize::from(best as u32 == img.label);
        }
        assert!(correct > 100, "nearest-mean accuracy {correct}/200");
    }
}
