//! What a new user tripped on (issue 59's findings), each fixed and held here: `ckpt_path=last` takes the
//! newest run by its recorded start, not the last folder by name; a resumed run with nothing left to train
//! says so; `train eval` needs no training data and reports what it measured, not epochs; `run.json`
//! records why a run stopped; a weights-only export loads into PyTorch with `strict=True`; a finished
//! sweep run again says it has nothing to do.

mod common;

use common::{shards, summary, train};
use std::process::{Command, Output};

const SMALL: &[&str] = &[
    "experiment=quickstart",
    "data.train_size=128",
    "data.val_size=64",
    "data.batch_size=64",
    "task_name=t",
];

fn ok(out: &Output) -> (String, String) {
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    );
    assert!(out.status.success(), "{o}\n{e}");
    (o, e)
}

fn with(extra: &[&str]) -> Vec<String> {
    SMALL.iter().chain(extra).map(|s| s.to_string()).collect()
}

#[test]
fn ckpt_path_last_takes_the_newest_run_and_says_when_nothing_is_left_to_train() {
    let p = tempfile::tempdir().unwrap();
    let args = |extra: &[&str]| with(extra);
    let run = |a: Vec<String>| {
        ok(&train(
            p.path(),
            &a.iter().map(String::as_str).collect::<Vec<_>>(),
        ))
    };
    // Named so that sorting by name would pick the older one.
    run(args(&[
        "trainer.max_epochs=1",
        "hydra.run.dir=logs/t/zzz-older",
    ]));
    run(args(&[
        "trainer.max_epochs=2",
        "hydra.run.dir=logs/t/aaa-newer",
    ]));
    let (stdout, _) = run(args(&[
        "trainer.max_epochs=3",
        "ckpt_path=last",
        "hydra.run.dir=logs/t/resumed",
    ]));
    let s = summary(&p.path().join("logs/t/resumed"));
    let from = s["resumed_from"].as_str().unwrap();
    assert!(from.contains("aaa-newer"), "resumed from {from}");
    assert_eq!(s["epochs_completed"], 3, "{stdout}");
    let record = common::run_json(&p.path().join("logs/t/resumed"));
    assert_eq!(
        record["stopped_because"],
        "max_epochs reached (3 epochs, 6 steps)"
    );
    // The newest run is now `resumed`, at epoch 3: with max_epochs=3 nothing is left to train.
    let (stdout, _) = run(args(&[
        "trainer.max_epochs=3",
        "ckpt_path=last",
        "hydra.run.dir=logs/t/again",
    ]));
    assert!(
        stdout.contains("nothing to train") && stdout.contains("resumed"),
        "{stdout}"
    );
    assert!(!stdout.contains("completed after"), "{stdout}");
    let record = common::run_json(&p.path().join("logs/t/again"));
    let why = record["stopped_because"].as_str().unwrap();
    assert!(why.starts_with("nothing to train"), "{why}");
}

#[test]
fn run_json_records_an_early_stop_with_its_metric() {
    let p = tempfile::tempdir().unwrap();
    let a = with(&[
        "trainer.max_epochs=5",
        "callbacks.early_stopping={monitor: val/loss, mode: min, patience: 0, min_delta: 100}",
        "hydra.run.dir=logs/t/early",
    ]);
    ok(&train(
        p.path(),
        &a.iter().map(String::as_str).collect::<Vec<_>>(),
    ));
    let record = common::run_json(&p.path().join("logs/t/early"));
    let why = record["stopped_because"].as_str().unwrap();
    assert!(
        why.starts_with("early stopped") && why.contains("val/loss"),
        "{why}"
    );
}

#[test]
fn train_eval_needs_no_training_data_and_reports_what_it_measured() {
    let p = tempfile::tempdir().unwrap();
    let cifar = p.path().join("cifar");
    shards::write_cifar(&cifar, 20, 30);
    let out = p.path().join("shards");
    shards::pack(p.path(), &cifar, &out, "train", 50);
    shards::pack(p.path(), &cifar, &out, "val", 50);
    let train_urls = format!(
        "data.train_urls='{}/train-{{000000..000001}}.tar'",
        out.display()
    );
    let val_urls = format!("data.val_urls={}/val-000000.tar", out.display());
    let fit: Vec<&str> = shards::ON_SHARDS
        .iter()
        .copied()
        .chain([
            train_urls.as_str(),
            val_urls.as_str(),
            "trainer.max_epochs=1",
        ])
        .chain(["hydra.run.dir=logs/fit"])
        .collect();
    ok(&train(p.path(), &fit));
    let ckpt = format!(
        "ckpt_path={}/logs/fit/checkpoints/last.safetensors",
        p.path().display()
    );
    // No data.train_urls at all: evaluating reads the test split alone.
    let eval: Vec<&str> = ["eval"]
        .into_iter()
        .chain(shards::ON_SHARDS.iter().copied())
        .chain([val_urls.as_str(), ckpt.as_str(), "hydra.run.dir=logs/eval"])
        .collect();
    let (stdout, stderr) = ok(&train(p.path(), &eval));
    let report = stdout
        .lines()
        .find(|l| l.starts_with("quickstart: "))
        .unwrap_or_else(|| panic!("no report in\n{stdout}\n{stderr}"));
    assert!(
        report.contains("evaluated ")
            && report.contains("last.safetensors on the test split (30 samples)"),
        "{report}"
    );
    assert!(report.contains("test/acc1"), "{report}");
    for trained in ["epochs", "completed after", "steps)"] {
        assert!(!report.contains(trained), "{trained:?} in {report}");
    }
    assert!(!stdout.contains("Resumed from"), "{stdout}");
    assert!(stdout.contains("Evaluating the weights of"), "{stdout}");
    let s = summary(&p.path().join("logs/eval"));
    assert_eq!(s["eval_only"]["samples"], 30);
    assert_eq!(
        common::run_json(&p.path().join("logs/eval"))["stopped_because"],
        "evaluated only (train=false)"
    );
}

#[test]
fn a_finished_sweep_run_again_has_nothing_to_do() {
    let p = tempfile::tempdir().unwrap();
    let a = with(&[
        "-m",
        "trainer.max_epochs=1",
        "optimizer.lr=0.01,0.02",
        "hydra.sweep.dir=logs/sweep",
    ]);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    ok(&train(p.path(), &a));
    let (stdout, stderr) = ok(&train(p.path(), &a));
    let all = format!("{stdout}{stderr}");
    assert!(
        all.contains("has nothing to do: all 2 of its jobs completed earlier"),
        "{all}"
    );
    assert!(
        !all.contains("; running \n") && !all.trim_end().ends_with("running"),
        "{all}"
    );
}

/// The weights-only export is what PyTorch's `load_state_dict(strict=True)` takes: torchvision's
/// CIFAR-stem ResNet-18 loads it with no key missing or unexpected, and gives our logits.
#[test]
fn a_weights_only_export_loads_into_pytorch_strictly() {
    let p = tempfile::tempdir().unwrap();
    let a = with(&[
        "model=resnet18",
        "model.cifar_stem=true",
        "~model.channels",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=1",
        "hydra.run.dir=logs/r",
    ]);
    ok(&train(
        p.path(),
        &a.iter().map(String::as_str).collect::<Vec<_>>(),
    ));
    let ckpt = p.path().join("logs/r/checkpoints/last.safetensors");
    let weights = p.path().join("weights.safetensors");
    let (stdout, _) = ok(&train(
        p.path(),
        &[
            "export",
            &format!("ckpt={}", ckpt.display()),
            &format!("out={}", weights.display()),
        ],
    ));
    assert!(stdout.contains("strict=True"), "{stdout}");
    // No training state in it; the checkpoint has it.
    let exported = trainyard::storage::checkpoint::load(&weights)
        .unwrap()
        .state;
    let full = trainyard::storage::checkpoint::load(&ckpt).unwrap().state;
    assert!(full.keys().any(|k| k.starts_with("optimizer.")));
    assert!(!exported.keys().any(|k| k.starts_with("optimizer.")));
    assert_eq!(
        exported.len(),
        full.keys().filter(|k| !k.starts_with("optimizer.")).count()
    );
    let Some(python) = common::torch_python() else {
        return;
    };
    let script = format!(
        "import torch, torchvision\nfrom safetensors.torch import load_file\n\
         m = torchvision.models.resnet18(num_classes=10)\n\
         m.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)\nm.maxpool = torch.nn.Identity()\n\
         r = m.load_state_dict(load_file({:?}), strict=True)\n\
         assert not r.missing_keys and not r.unexpected_keys, r\n\
         assert m.bn1.num_batches_tracked.dtype == torch.int64\nprint('strict load ok')\n",
        weights.display().to_string()
    );
    let out = Command::new(python).args(["-c", &script]).output().unwrap();
    let (stdout, _) = ok(&out);
    assert!(stdout.contains("strict load ok"), "{stdout}");
}
