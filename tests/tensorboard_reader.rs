//! TensorBoard's own Python reader loads the event files a run writes. Needs a Python with the
//! `tensorboard` package named by TRAINYARD_TB_PYTHON; `.ci/run` installs one and sets it. Without it the
//! test says so and passes, so a bare `cargo test` still works on a fresh machine.

use std::path::Path;
use std::process::Command;

const TRAIN: &str = env!("CARGO_BIN_EXE_train");

const READER: &str = r#"
import sys, glob
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
files = glob.glob(sys.argv[1] + "/events.out.tfevents.*")
assert len(files) == 1, files
acc = EventAccumulator(sys.argv[1])
acc.Reload()
tags = acc.Tags()["scalars"]
for tag in sorted(tags):
    events = acc.Scalars(tag)
    print(tag, len(events), events[-1].step, repr(events[-1].value))
"#;

#[test]
fn tensorboard_reads_our_event_files() {
    let Ok(python) = std::env::var("TRAINYARD_TB_PYTHON") else {
        eprintln!(
            "skipped: set TRAINYARD_TB_PYTHON to a python with the tensorboard package (CI does)"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for sub in ["conf", "experiments"] {
        let status = Command::new("cp")
            .arg("-r")
            .arg(root.join(sub))
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(status.success());
    }
    let out = Command::new(TRAIN)
        .args([
            "experiment=quickstart",
            "logger=tensorboard",
            "data.train_size=128",
            "data.val_size=64",
            "trainer.log_every_n_steps=1",
            "model.channels=[4]",
        ])
        .current_dir(dir.path())
        .env_remove("TRAIN_CONFIG_PATH")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let runs: Vec<_> = std::fs::read_dir(dir.path().join("logs/quickstart/runs"))
        .unwrap()
        .flatten()
        .collect();
    let tb_dir = runs[0].path().join("tensorboard");
    let summary: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(runs[0].path().join("summary.json")).unwrap(),
    )
    .unwrap();

    let read = Command::new(python)
        .arg("-c")
        .arg(READER)
        .arg(&tb_dir)
        .output()
        .unwrap();
    assert!(
        read.status.success(),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    let text = String::from_utf8_lossy(&read.stdout).to_string();
    let line = |tag: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{tag} ")))
            .unwrap_or_else(|| panic!("{tag} missing:\n{text}"))
            .to_string()
    };
    // 128 samples / batch 64 = 2 steps per epoch, 2 epochs: train/loss logged every step.
    assert!(line("train/loss").starts_with("train/loss 6 4 "), "{text}");
    assert!(line("lr").starts_with("lr 4 4 "), "{text}");
    let val: f64 = line("val/acc1")
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let want = summary["final_metrics"]["val/acc1"].as_f64().unwrap();
    assert!(
        (val - want).abs() < 1e-6,
        "tensorboard val/acc1 {val} vs summary {want}"
    );
}
