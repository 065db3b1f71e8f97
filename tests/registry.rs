//! Models written in Rust and registered under a `_target_` (`trainyard::registry`), as a user's crate
//! does: this test binary registers one, then trains it through trainyard's whole command line
//! (`app::main_entry`, in this process), and checks what the config engine says about bad arguments.

mod common;

use candle_core::{Result, Tensor};
use candle_nn::{Linear, Module, VarBuilder};
use std::path::Path;
use trainyard::registry::{CandleModel, ModelContext};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct GatedArgs {
    hidden: usize,
}

/// Pooled colour statistics through a gated MLP: a model the zoo does not have.
struct Gated {
    value: Linear,
    gate: Linear,
    head: Linear,
}

fn gated(args: GatedArgs, vb: VarBuilder, ctx: &ModelContext) -> anyhow::Result<Gated> {
    let features = ctx.channels * 4 * 4;
    Ok(Gated {
        value: candle_nn::linear(features, args.hidden, vb.pp("value"))?,
        gate: candle_nn::linear(features, args.hidden, vb.pp("gate"))?,
        head: candle_nn::linear(args.hidden, ctx.num_classes, vb.pp("head"))?,
    })
}

impl CandleModel for Gated {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        let (_, _, h, w) = x.dims4()?;
        let pooled = x.avg_pool2d((h / 4, w / 4))?.flatten_from(1)?;
        let gate = self.gate.forward(&pooled)?;
        let gate = (gate.neg()?.exp()? + 1.0)?.recip()?;
        let h = self.value.forward(&pooled)?.relu()?.mul(&gate)?;
        self.head.forward(&h)
    }
}

trainyard::register_candle_model!("tests.models.Gated", gated);

fn experiment(model: &str) -> std::result::Result<trainyard::schema::Experiment, String> {
    let text = format!(
        "task_name: t\nseed: 3\nmodel: {model}\n\
         data: {{name: synthetic, num_classes: 4, image_size: 8, batch_size: 4}}\n\
         optimizer: {{name: sgd, lr: 0.1}}\nscheduler: {{name: constant}}\n\
         trainer: {{strategy: single, devices: 1, accelerator: cpu, precision: 32, max_epochs: 1}}\n\
         paths: {{root_dir: ., data_dir: d, log_dir: l, output_dir: o}}\n"
    );
    let node = trainyard::config::yaml::parse(&text, "t.yaml")
        .unwrap()
        .unwrap();
    trainyard::schema::extract(&node).map_err(|e| e.to_string())
}

fn architecture(model: &str) -> std::result::Result<trainyard::model::Architecture, String> {
    let exp = experiment(model)?;
    trainyard::model::Architecture::new(&exp.model, 3, 8).map_err(|e| format!("{e:#}"))
}

#[test]
fn a_registered_model_is_in_the_hyperparameters_loggers_record() {
    let hparams = experiment("{_target_: tests.models.Gated, hidden: 6}")
        .unwrap()
        .hparams()
        .unwrap();
    assert_eq!(hparams["model"]["_target_"], "tests.models.Gated");
    assert_eq!(hparams["model"]["hidden"], 6);
}

#[test]
fn a_registered_model_is_built_with_its_typed_arguments_and_seeded_variables() {
    let arch = architecture("{_target_: tests.models.Gated, hidden: 6}").unwrap();
    let specs = arch.specs();
    let names: Vec<(&str, &[usize])> = specs
        .iter()
        .map(|s| (s.name.as_str(), s.shape.as_slice()))
        .collect();
    assert_eq!(
        names,
        [
            ("value.weight", &[6, 48][..]),
            ("value.bias", &[6][..]),
            ("gate.weight", &[6, 48][..]),
            ("gate.bias", &[6][..]),
            ("head.weight", &[4, 6][..]),
            ("head.bias", &[4][..]),
        ]
    );
    // Starting values come from the seed (the same on every rank), not from a thread's RNG.
    let again = architecture("{_target_: tests.models.Gated, hidden: 6}").unwrap();
    for (a, b) in specs.iter().zip(again.specs()) {
        assert_eq!(
            a.initial_value(3).data,
            b.initial_value(3).data,
            "{}",
            a.name
        );
    }
    // candle-nn's rules: weights Kaiming-normal (fan in, ReLU gain), biases U(±1/sqrt(fan in)).
    let w = specs[0].initial_value(3).data;
    let std = (w.iter().map(|v| v * v).sum::<f32>() / w.len() as f32).sqrt();
    let want = (2.0f32 / 48.0).sqrt();
    assert!((std / want - 1.0).abs() < 0.15, "std {std}, want {want}");
    let b = specs[1].initial_value(3).data;
    let bound = 1.0 / 48f32.sqrt();
    assert!(
        b.iter().all(|v| v.abs() <= bound) && b.iter().any(|v| *v != 0.0),
        "{b:?}"
    );
    assert_eq!(arch.head(), ["head"]);
}

#[rstest::rstest]
#[case::unknown_argument(
    "{_target_: tests.models.Gated, hidden: 6, hiden: 3}",
    &["_target_ tests.models.Gated", "unknown field `hiden`", "t.yaml:3"]
)]
#[case::missing_argument(
    "{_target_: tests.models.Gated}",
    &["_target_ tests.models.Gated", "missing field `hidden`", "t.yaml:3"]
)]
#[case::wrong_type(
    "{_target_: tests.models.Gated, hidden: many}",
    &["_target_ tests.models.Gated", "invalid type", "t.yaml:3"]
)]
#[case::not_registered(
    "{_target_: tests.models.Gatde, hidden: 6}",
    &["_target_ tests.models.Gatde is not registered by this program. Did you mean 'tests.models.Gated'?", "register_candle_model!"]
)]
#[case::python_code(
    "{_target_: my_project.models.LitNet, hidden: 6}",
    &["my_project.models.LitNet is Python code of your project", "register_candle_model!"]
)]
#[cfg_attr(
    not(feature = "torch"),
    case::torchscript_without_libtorch(
        "{_target_: trainyard.TorchScript, path: net.pt}",
        &["(model=torchscript) trains on libtorch", "rebuild with --features torch", "t.yaml:3"]
    )
)]
fn bad_registered_models_fail_with_the_key_and_the_place(
    #[case] model: &str,
    #[case] wanted: &[&str],
) {
    let err = architecture(model).err().expect("an error");
    for w in wanted {
        assert!(err.contains(w), "missing {w:?} in:\n{err}");
    }
    // "Did you mean" leads when there is a near miss (not the last of several lines).
    if let Some(pos) = err.find("Did you mean") {
        assert!(!err[..pos].contains('\n'), "not on the first line:\n{err}");
    }
}

/// trainyard's whole command line over a project whose model is the registered one: it trains, learns,
/// and its checkpoint holds the model's own variable names.
#[test]
fn a_registered_model_trains_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    common::copy_dir(&root.join("conf"), &dir.path().join("conf"));
    std::fs::write(
        dir.path().join("conf/model/gated.yaml"),
        "_target_: tests.models.Gated\nhidden: 32\n",
    )
    .unwrap();
    let run = dir.path().join("run");
    let args = [
        "train".to_string(),
        "-cp".into(),
        dir.path().join("conf").display().to_string(),
        "-cn".into(),
        "train".into(),
        "model=gated".into(),
        "data.train_size=1024".into(),
        "data.val_size=256".into(),
        "data.num_workers=0".into(),
        "optimizer=adam".into(),
        "optimizer.lr=0.01".into(),
        "trainer.max_epochs=3".into(),
        format!("hydra.run.dir={}", run.display()),
    ];
    let code = trainyard::app::main_entry(args.iter().map(std::ffi::OsString::from));
    assert_eq!(code, std::process::ExitCode::SUCCESS);
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(
        summary["num_parameters"],
        2 * (48 * 32 + 32) + 32 * 10 + 10,
        "{summary}"
    );
    let acc = summary["final_metrics"]["val/acc1"].as_f64().unwrap();
    assert!(
        acc > 0.4,
        "val/acc1 {acc}: not far above chance (0.1): {summary}"
    );
    let ckpt =
        trainyard::storage::checkpoint::load(&run.join("checkpoints/last.safetensors")).unwrap();
    for name in ["value.weight", "gate.bias", "head.weight"] {
        assert!(ckpt.state.contains_key(name), "no {name}");
    }
}
