//! Generated segmentation data (`own_model.data.Shapes`): each image is noise with one filled rectangle
//! (class 1, bright) and one disc (class 2, dark) at random places and sizes; its target is the mask of
//! classes per pixel (0: background), as a segmentation data set gives it. Sample `i` of a split is the
//! same on every rank and every epoch (drawn from the seed, the split and `i`).

use trainyard::registry::{DataContext, DataSplit, MapDataset, Sample, Target};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ShapesArgs {
    /// Images per split: training, validation (the test split is the validation one).
    train_size: usize,
    val_size: usize,
    /// The images' side in pixels (a multiple of 4: the U-Net halves it twice).
    size: usize,
    /// The noise's standard deviation around the shapes' levels (+1, -1, 0).
    #[serde(default = "noise")]
    noise: f32,
}

fn noise() -> f32 {
    0.3
}

struct Shapes {
    len: usize,
    size: usize,
    noise: f32,
    /// Where this split's samples are drawn from.
    stream: u64,
}

fn shapes(args: ShapesArgs, ctx: &DataContext) -> anyhow::Result<Shapes> {
    anyhow::ensure!(
        args.size >= 8 && args.size.is_multiple_of(4),
        "field `size`: {} is not a multiple of 4 from 8 up",
        args.size
    );
    let (len, split) = match ctx.split {
        DataSplit::Train => (args.train_size, 1),
        DataSplit::Val | DataSplit::Test => (args.val_size, 2),
    };
    Ok(Shapes {
        len,
        size: args.size,
        noise: args.noise,
        stream: ctx.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ split,
    })
}

/// splitmix64: a small, well-mixed generator, enough for test images.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// Standard normal (Box-Muller).
    fn normal(&mut self) -> f32 {
        let u = ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let v = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
    }
}

impl MapDataset for Shapes {
    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, index: usize) -> anyhow::Result<Sample> {
        let s = self.size;
        let mut rng = Rng(self.stream ^ (index as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93));
        let mut mask = vec![0.0f32; s * s];
        // The rectangle: sides from a quarter to half the image.
        let (w, h) = (s / 4 + rng.below(s / 4), s / 4 + rng.below(s / 4));
        let (x0, y0) = (rng.below(s - w), rng.below(s - h));
        for y in y0..y0 + h {
            mask[y * s + x0..y * s + x0 + w].fill(1.0);
        }
        // The disc, drawn over it: a radius from an eighth to a quarter of the image.
        let r = (s / 8 + rng.below(s / 8)) as isize;
        let (cx, cy) = (rng.below(s) as isize, rng.below(s) as isize);
        for y in 0..s as isize {
            for x in 0..s as isize {
                if (x - cx).pow(2) + (y - cy).pow(2) <= r * r {
                    mask[y as usize * s + x as usize] = 2.0;
                }
            }
        }
        let input = mask
            .iter()
            .map(|&c| {
                let level = [0.0, 1.0, -1.0][c as usize];
                level + self.noise * rng.normal()
            })
            .collect();
        Ok(Sample {
            input,
            shape: vec![1, s, s],
            target: Target::Values {
                values: mask,
                shape: vec![s, s],
            },
        })
    }
}

trainyard::register_dataset!("own_model.data.Shapes", shapes);
