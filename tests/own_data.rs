//! A project's own data and loss (`trainyard::registry`), beyond classification: this test binary
//! registers a regression dataset (a generated table) and a Huber loss with two metrics, as a user's crate
//! does, then trains through trainyard's whole command line (`app::main_entry`, in this process): the
//! metrics are logged as `train/<name>` and `val/<name>`, monitored by ModelCheckpoint and EarlyStopping,
//! kept as `_best`, and a resumed run equals an uninterrupted one. Bad input fails at its key and place.

mod common;

use candle_core::{DType, Tensor};
use std::path::{Path, PathBuf};
use trainyard::registry::{
    CandleLoss, DataContext, DataSplit, LossValue, MapDataset, Metric, Sample, Target,
};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LineArgs {
    features: usize,
    train_size: usize,
    val_size: usize,
    #[serde(default)]
    noise: f32,
}

/// y = sum_i (-1)^i x_i / (i + 1) + 0.5 + noise, x ~ U(-1, 1): a regression an MLP learns in a few epochs.
struct Line {
    rows: Vec<(Vec<f32>, f32)>,
}

fn line(args: LineArgs, ctx: &DataContext) -> anyhow::Result<Line> {
    anyhow::ensure!(args.features >= 1, "features must be at least 1");
    let (n, salt) = match ctx.split {
        DataSplit::Train => (args.train_size, 1),
        DataSplit::Val | DataSplit::Test => (args.val_size, 2),
    };
    let mut state = ctx
        .seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(salt);
    let mut uniform = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let rows = (0..n)
        .map(|_| {
            let x: Vec<f32> = (0..args.features).map(|_| uniform()).collect();
            let y = x
                .iter()
                .enumerate()
                .map(|(i, &v)| if i % 2 == 0 { v } else { -v } / (i + 1) as f32)
                .sum::<f32>()
                + 0.5
                + args.noise * uniform();
            (x, y)
        })
        .collect();
    Ok(Line { rows })
}

impl MapDataset for Line {
    fn len(&self) -> usize {
        self.rows.len()
    }
    fn get(&self, index: usize) -> anyhow::Result<Sample> {
        let (x, y) = &self.rows[index];
        Ok(Sample {
            input: x.clone(),
            shape: vec![x.len()],
            target: Target::Values {
                values: vec![*y],
                shape: vec![1],
            },
        })
    }
}

trainyard::register_dataset!("tests.data.Line", line);

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct HuberArgs {
    delta: f64,
}

/// torch.nn.HuberLoss, reporting the mean absolute error and the share of predictions within 0.1.
struct Huber {
    delta: f64,
}

impl CandleLoss for Huber {
    fn metrics(&self) -> Vec<Metric> {
        vec![Metric::lower("mae"), Metric::higher("within_tenth")]
    }
    fn compute(&self, output: &Tensor, target: &Tensor) -> candle_core::Result<LossValue> {
        let diff = (output - target.reshape(output.dims())?)?;
        let abs = diff.abs()?;
        let d = self.delta;
        let quadratic = abs.minimum(d)?;
        let linear = (&abs - &quadratic)?;
        let loss = ((quadratic.sqr()? * 0.5)? + (linear * d)?)?.mean_all()?;
        let close = abs.detach().lt(0.1)?.to_dtype(DType::F32)?.mean_all()?;
        Ok(LossValue {
            loss,
            metrics: vec![abs.detach().mean_all()?, close],
        })
    }
}

fn huber(args: HuberArgs) -> anyhow::Result<Huber> {
    anyhow::ensure!(args.delta > 0.0, "field `delta`: must be positive");
    Ok(Huber { delta: args.delta })
}

trainyard::register_candle_loss!("tests.losses.Huber", huber);

/// trainyard's conf/ plus this test's groups: `data=line`, `loss=huber`, `model=regressor`.
fn project() -> tempfile::TempDir {
    let dir = common::real_project();
    let conf = dir.path().join("conf");
    std::fs::write(
        conf.join("data/line.yaml"),
        "_target_: tests.data.Line\nfeatures: 6\ntrain_size: 1024\nval_size: 256\nnoise: 0.02\n\
         batch_size: 32\nnum_workers: 0\nnum_classes: 1\n",
    )
    .unwrap();
    std::fs::create_dir_all(conf.join("loss")).unwrap();
    std::fs::write(
        conf.join("loss/huber.yaml"),
        "_target_: tests.losses.Huber\ndelta: 1.0\n",
    )
    .unwrap();
    std::fs::write(
        conf.join("model/regressor.yaml"),
        "name: mlp\nnum_classes: ${data.num_classes}\nhidden: [64, 64]\ndropout: 0.0\n",
    )
    .unwrap();
    dir
}

/// The command line of a regression run into `run` (the callbacks monitor `val/mae`).
fn args(project: &Path, run: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "train",
        "-cp",
        &project.join("conf").display().to_string(),
        "-cn",
        "train",
        "data=line",
        "+loss=huber",
        "model=regressor",
        "optimizer=adam",
        "optimizer.lr=0.003",
        "scheduler=constant",
        "trainer.max_epochs=4",
        "callbacks.model_checkpoint.monitor=val/mae",
        "callbacks.model_checkpoint.mode=min",
        "callbacks.model_checkpoint.save_top_k=-1",
        "callbacks.early_stopping.monitor=val/within_tenth",
        "callbacks.early_stopping.mode=max",
        &format!("hydra.run.dir={}", run.display()),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// Run `train` in this process; the error output is the process's own (a failed run panics here).
fn run(project: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let dir = project.join(name);
    let code = trainyard::app::main_entry(args(project, &dir, extra).into_iter().map(Into::into));
    assert_eq!(code, std::process::ExitCode::SUCCESS, "run {name} failed");
    dir
}

fn weights(run: &Path) -> Vec<(String, Vec<f32>)> {
    let ckpt =
        trainyard::storage::checkpoint::load(&run.join("checkpoints/last.safetensors")).unwrap();
    ckpt.state
        .into_iter()
        .filter(|(k, _)| !k.starts_with("optimizer."))
        .map(|(k, t)| (k, t.data))
        .collect()
}

#[test]
fn a_regression_with_its_own_data_and_loss_learns_logs_its_metrics_and_resumes() {
    let project = project();
    let straight = run(project.path(), "straight", &[]);
    let s = common::summary(&straight);
    let m = &s["final_metrics"];
    let mae = m["val/mae"].as_f64().unwrap();
    // Predicting the mean leaves an error of about 0.4 on this table.
    assert!(
        mae < 0.12,
        "val/mae {mae}: the regression did not learn: {s}"
    );
    assert!(m["val/mae_best"].as_f64().unwrap() <= mae + 1e-12, "{s}");
    assert!(m["val/within_tenth"].as_f64().unwrap() > 0.4, "{s}");
    assert!(
        m.get("val/acc1").is_none(),
        "no accuracy for a regression: {s}"
    );
    assert_eq!(s["best"]["monitor"], "val/mae", "{s}");
    assert_eq!(s["data"], "registered", "{s}");
    let csv = std::fs::read_to_string(straight.join("metrics.csv")).unwrap();
    let header = csv.lines().next().unwrap();
    for column in [
        "train/loss",
        "train/mae",
        "train/within_tenth",
        "val/mae",
        "val/within_tenth",
    ] {
        assert!(
            header.split(',').any(|c| c == column),
            "no {column} in {header}"
        );
    }
    assert!(!header.contains("acc1"), "{header}");
    // The best checkpoint is the epoch with the lowest val/mae.
    let value =
        |row: &[(String, f64)], key: &str| row.iter().find(|(k, _)| k == key).map(|(_, v)| *v);
    let best_epoch = common::csv_rows(&straight)
        .iter()
        .filter_map(|r| Some((value(r, "val/mae")?, value(r, "epoch")?)))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, epoch)| epoch as u64)
        .unwrap();
    assert_eq!(s["best"]["epoch"], best_epoch, "{s}");

    let first = straight.join("checkpoints/epoch_000.safetensors");
    let resumed = run(
        project.path(),
        "resumed",
        &[&format!("ckpt_path={}", first.display())],
    );
    assert_eq!(
        weights(&straight),
        weights(&resumed),
        "resumed != uninterrupted"
    );
    assert_eq!(
        common::summary(&resumed)["final_metrics"]["val/mae_best"],
        m["val/mae_best"],
        "the best so far survives the resume"
    );
}

#[test]
fn the_builtin_mse_loss_and_data_parallel_train_the_same_table() {
    let project = project();
    let run = run(
        project.path(),
        "mse",
        &[
            "loss._target_=torch.nn.MSELoss",
            "~loss.delta",
            "trainer=dp_sim",
            "trainer.max_epochs=3",
            "callbacks.early_stopping.monitor=val/mae",
            "callbacks.early_stopping.mode=min",
        ],
    );
    let s = common::summary(&run);
    let mae = s["final_metrics"]["val/mae"].as_f64().unwrap();
    assert!(mae < 0.15 && mae > 1e-3, "val/mae {mae}: {s}");
    assert_eq!(s["strategy"], "dp", "{s}");
}

/// torch.nn's MSELoss on libtorch is the Candle one: the same table, model (the zoo's MLP, the same
/// starting weights on both backends), batches and Adam steps give the same metrics on both backends.
#[cfg(feature = "torch")]
#[test]
fn the_builtin_losses_train_alike_on_both_backends() {
    let project = project();
    let both: Vec<serde_json::Value> = ["candle", "tch"]
        .iter()
        .map(|backend| {
            let run = run(
                project.path(),
                backend,
                &[
                    &format!("backend={backend}"),
                    "loss._target_=torch.nn.MSELoss",
                    "~loss.delta",
                    "trainer.max_epochs=2",
                    "callbacks.early_stopping.monitor=val/mae",
                    "callbacks.early_stopping.mode=min",
                ],
            );
            common::summary(&run)
        })
        .collect();
    assert_eq!(both[1]["backend"], "tch");
    for key in ["train/loss", "train/mae", "val/loss", "val/mae"] {
        let (c, t) = (
            both[0]["final_metrics"][key].as_f64().unwrap(),
            both[1]["final_metrics"][key].as_f64().unwrap(),
        );
        assert!(
            (c - t).abs() <= 1e-3 * c.abs().max(1e-3),
            "{key}: candle {c}, tch {t}"
        );
    }
    assert!(both[1]["final_metrics"]["val/mae"].as_f64().unwrap() < 0.2);
}

/// The error of a run that must not start (in this process, where the test's dataset is registered).
fn refused(extra: &[&str]) -> String {
    let project = project();
    let dir = project.path().join("bad");
    let args = args(project.path(), &dir, extra);
    match trainyard::app::try_main(args.into_iter().map(Into::into)) {
        Err(e) => e,
        Ok(code) => panic!("{extra:?} was accepted ({code:?})"),
    }
}

#[rstest::rstest]
#[case::dataset_typo(&["data._target_=tests.data.Lnie"], &["tests.data.Lnie", "register_dataset!", "Did you mean 'tests.data.Line'?"])]
#[case::dataset_argument_type(&["data.features=six"], &["data.features", "invalid type", "data.features=six"])]
#[case::dataset_unknown_argument(&["+data.rows=3"], &["data.rows", "unknown field `rows`", "+data.rows=3"])]
#[case::dataset_own_check(&["data.features=0"], &["features must be at least 1", "tests.data.Line"])]
#[case::value_targets_without_a_loss(&["~loss"], &["not classes", "+loss._target_=torch.nn.MSELoss"])]
#[case::loss_typo(&["loss._target_=torch.nn.MSELos"], &["loss._target_", "Did you mean 'torch.nn.MSELoss'?"])]
#[case::loss_argument(&["loss.delta=-1"], &["loss.delta", "must be positive", "loss.delta=-1"])]
#[case::monitor_typo(&["callbacks.model_checkpoint.monitor=val/mea"], &["callbacks.model_checkpoint.monitor", "val/mea", "Did you mean 'val/mae'?"])]
#[case::smoothing_another_loss(&["+model.label_smoothing=0.1"], &["model.label_smoothing", "tests.losses.Huber", "+model.label_smoothing=0.1"])]
#[case::accuracy_of_a_regression(&["callbacks.early_stopping.monitor=val/acc"], &["no metric 'val/acc'", "val/within_tenth"])]
#[cfg_attr(feature = "torch", case::candle_loss_on_tch(&["backend=tch"], &["backend=tch with loss: _target_ tests.losses.Huber", "register_tch_loss!"]))]
fn bad_data_loss_and_monitors_fail_before_training(
    #[case] extra: &[&str],
    #[case] wanted: &[&str],
) {
    let err = refused(extra);
    for w in wanted {
        assert!(err.contains(w), "missing {w:?} in:\n{err}");
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct BlobArgs {
    size: usize,
    train_size: usize,
    val_size: usize,
}

/// Noisy grey images with one bright square; the mask marks the square's pixels (class 1).
struct Blobs {
    items: Vec<(Vec<f32>, Vec<f32>)>,
    size: usize,
}

fn blobs(args: BlobArgs, ctx: &DataContext) -> anyhow::Result<Blobs> {
    let (n, salt) = match ctx.split {
        DataSplit::Train => (args.train_size, 11),
        DataSplit::Val | DataSplit::Test => (args.val_size, 12),
    };
    let mut state = ctx.seed ^ salt;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    let s = args.size;
    let items = (0..n)
        .map(|_| {
            let side = 2 + (next() * 3.0) as usize;
            let (top, left) = (
                (next() * (s - side) as f32) as usize,
                (next() * (s - side) as f32) as usize,
            );
            let mut image = vec![0f32; s * s];
            let mut mask = vec![0f32; s * s];
            for y in 0..s {
                for x in 0..s {
                    let inside = (top..top + side).contains(&y) && (left..left + side).contains(&x);
                    mask[y * s + x] = f32::from(u8::from(inside));
                    image[y * s + x] = if inside { 1.0 } else { 0.0 } + 0.3 * (next() - 0.5);
                }
            }
            (image, mask)
        })
        .collect();
    Ok(Blobs { items, size: s })
}

impl MapDataset for Blobs {
    fn len(&self) -> usize {
        self.items.len()
    }
    fn get(&self, index: usize) -> anyhow::Result<Sample> {
        let (image, mask) = &self.items[index];
        Ok(Sample {
            input: image.clone(),
            shape: vec![1, self.size, self.size],
            target: Target::Values {
                values: mask.clone(),
                shape: vec![self.size, self.size],
            },
        })
    }
    fn num_classes(&self) -> Option<usize> {
        Some(2)
    }
}

trainyard::register_dataset!("tests.data.Blobs", blobs);

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PixelNetArgs {
    width: usize,
}

/// Two 3x3 convolutions, then per-pixel logits over the classes: `[N, classes, H, W]`.
struct PixelNet {
    conv: candle_nn::Conv2d,
    mid: candle_nn::Conv2d,
    head: candle_nn::Conv2d,
}

fn pixel_net(
    args: PixelNetArgs,
    vb: candle_nn::VarBuilder,
    ctx: &trainyard::registry::ModelContext,
) -> anyhow::Result<PixelNet> {
    let same = candle_nn::Conv2dConfig {
        padding: 1,
        ..Default::default()
    };
    let c = ctx.input_shape[0];
    Ok(PixelNet {
        conv: candle_nn::conv2d(c, args.width, 3, same, vb.pp("conv"))?,
        mid: candle_nn::conv2d(args.width, args.width, 3, same, vb.pp("mid"))?,
        head: candle_nn::conv2d(
            args.width,
            ctx.num_classes,
            1,
            Default::default(),
            vb.pp("head"),
        )?,
    })
}

impl trainyard::registry::CandleModel for PixelNet {
    fn forward_t(&self, x: &Tensor, _train: bool) -> candle_core::Result<Tensor> {
        use candle_nn::Module;
        let h = self.conv.forward(x)?.relu()?;
        let h = self.mid.forward(&h)?.relu()?;
        self.head.forward(&h)
    }
}

trainyard::register_candle_model!("tests.models.PixelNet", pixel_net);

/// Segmentation: a registered model's per-pixel logits against a mask, scored by torch.nn's
/// CrossEntropyLoss (classes in dimension 1) and its pixel accuracy `acc`.
#[test]
fn segmentation_with_per_pixel_cross_entropy_learns_the_masks() {
    let project = project();
    let conf = project.path().join("conf");
    std::fs::write(
        conf.join("data/blobs.yaml"),
        "_target_: tests.data.Blobs\nsize: 12\ntrain_size: 512\nval_size: 128\nbatch_size: 32\nnum_workers: 0\n",
    )
    .unwrap();
    std::fs::write(
        conf.join("model/pixel_net.yaml"),
        "_target_: tests.models.PixelNet\nwidth: 8\n",
    )
    .unwrap();
    let run = run(
        project.path(),
        "segmentation",
        &[
            "data=blobs",
            "model=pixel_net",
            "loss._target_=torch.nn.CrossEntropyLoss",
            "~loss.delta",
            "trainer.max_epochs=5",
            "optimizer.lr=0.01",
            "callbacks.model_checkpoint.monitor=val/acc",
            "callbacks.model_checkpoint.mode=max",
            "callbacks.early_stopping.monitor=val/loss",
            "callbacks.early_stopping.mode=min",
        ],
    );
    let s = common::summary(&run);
    let acc = s["final_metrics"]["val/acc"].as_f64().unwrap();
    // Calling every pixel background scores about 0.9 on these masks.
    assert!(acc > 0.97, "val/acc {acc}: the masks were not learned: {s}");
    assert_eq!(s["best"]["monitor"], "val/acc", "{s}");

    // The dataset counts two classes; a config that says otherwise is refused at its override.
    let mut bad = args(
        project.path(),
        &project.path().join("bad"),
        &["data=blobs", "+data.num_classes=3"],
    );
    bad.extend(
        [
            "model=pixel_net",
            "loss._target_=torch.nn.CrossEntropyLoss",
            "~loss.delta",
        ]
        .map(String::from),
    );
    let err =
        trainyard::app::try_main(bad.into_iter().map(Into::into)).expect_err("3 classes accepted");
    for want in ["data.num_classes", "2 classes", "+data.num_classes=3"] {
        assert!(err.contains(want), "missing {want:?} in:\n{err}");
    }
}

/// A metric of this crate's own: the largest absolute error seen, its state reduced by `max` over ranks.
struct MaxError {
    worst: trainyard::metrics::State,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

fn max_error(_: NoArgs) -> anyhow::Result<MaxError> {
    Ok(MaxError {
        worst: trainyard::metrics::State::new("worst", trainyard::metrics::Reduce::Max, vec![0.0]),
    })
}

impl trainyard::metrics::Metric for MaxError {
    fn update(
        &mut self,
        preds: &trainyard::tensor::HostTensor,
        target: &trainyard::tensor::HostTensor,
    ) -> trainyard::metrics::Result<()> {
        for (p, t) in preds.data.iter().zip(&target.data) {
            self.worst.values[0] = self.worst.values[0].max(f64::from((p - t).abs()));
        }
        Ok(())
    }
    fn compute(&self) -> trainyard::metrics::Result<trainyard::metrics::Value> {
        Ok(trainyard::metrics::Value::Scalar(self.worst.values[0]))
    }
    fn states(&self) -> Vec<&trainyard::metrics::State> {
        vec![&self.worst]
    }
    fn states_mut(&mut self) -> Vec<&mut trainyard::metrics::State> {
        vec![&mut self.worst]
    }
    fn higher_is_better(&self) -> bool {
        false
    }
}

trainyard::register_metric!("tests.metrics.MaxError", max_error);

/// R² and a crate's own metric on the regression, with no global: computed over each whole epoch
/// (not averaged batch by batch), logged, and monitored (R² by ModelCheckpoint, the crate's by
/// EarlyStopping, each in its own direction).
#[test]
fn a_regression_declares_r2_and_its_own_metric() {
    let project = project();
    let dir = run(
        project.path(),
        "r2",
        &[
            "+metrics.r2={_target_: torchmetrics.R2Score}",
            "+metrics.worst={_target_: tests.metrics.MaxError}",
            "callbacks.model_checkpoint.monitor=val/r2",
            "callbacks.model_checkpoint.mode=max",
            "callbacks.early_stopping.monitor=val/worst",
            "callbacks.early_stopping.mode=min",
        ],
    );
    let s = common::summary(&dir);
    let m = &s["final_metrics"];
    let (r2, worst, mae) = (
        m["val/r2"].as_f64().unwrap(),
        m["val/worst"].as_f64().unwrap(),
        m["val/mae"].as_f64().unwrap(),
    );
    // The regression learns (mae < 0.12 above): most of the targets' variance is explained.
    assert!(r2 > 0.8 && r2 <= 1.0, "val/r2 {r2}: {s}");
    assert!(
        worst >= mae && worst < 2.0,
        "val/worst {worst}, val/mae {mae}"
    );
    assert!(m["train/r2"].as_f64().is_some(), "{s}");
    assert_eq!(s["best"]["monitor"], "val/r2");
    let csv = std::fs::read_to_string(dir.join("metrics.csv")).unwrap();
    assert!(csv.lines().next().unwrap().contains("val/r2"), "{csv}");
}
