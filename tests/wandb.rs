//! `logger=wandb`: the offline run is read back with W&B's own reader (`wandb leet inspect --json`, wandb
//! 0.31.0 from PyPI; `TRAINYARD_WANDB` names its `wandb` command, `.ci/run` installs it): no corrupt or
//! incomplete chunk, every history row equal to `metrics.csv`'s, the config, tags, group, the summary and
//! the exit code. Without the client these tests say SKIPPED and pass.

mod common;
use common::{csv_rows, real_project, train};
use std::path::{Path, PathBuf};
use std::process::Output;

fn wandb_cli() -> Option<PathBuf> {
    let path = std::env::var_os("TRAINYARD_WANDB")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv-wandb/bin/wandb"));
    if path.is_file() {
        return Some(path);
    }
    common::skip(
        "wandb",
        "W&B's client is not installed (TRAINYARD_WANDB, or .venv-wandb with wandb==0.31.0)",
    );
    None
}

const TINY: &[&str] = &[
    "experiment=quickstart",
    "data.train_size=256",
    "data.val_size=64",
    "model.channels=[4]",
    "trainer.max_epochs=2",
    "callbacks.model_summary=null",
    "logger=wandb",
];

fn text(o: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The records of the W&B run under `run_dir`, as W&B's reader prints them; its stderr must be empty.
fn inspect(cli: &Path, run_dir: &Path) -> Vec<serde_json::Value> {
    let out = std::process::Command::new(cli)
        .args(["leet", "inspect", "--json"])
        .arg(run_dir.join("wandb/latest-run"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        out.stderr.is_empty(),
        "W&B's reader complained: {}",
        text(&out)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn of_type<'a>(records: &'a [serde_json::Value], kind: &str) -> Vec<&'a serde_json::Value> {
    records.iter().filter(|r| r["type"] == kind).collect()
}

#[test]
fn an_offline_run_reads_back_with_w_and_b_s_reader_row_for_row() {
    let Some(cli) = wandb_cli() else { return };
    let p = real_project();
    let mut args = TINY.to_vec();
    args.extend([
        "trainer.log_every_n_steps=1",
        "logger.wandb.group=ablation",
        "logger.wandb.notes='first try'",
        "logger.wandb.log_model=true",
        "hydra.run.dir=logs/run",
    ]);
    let out = train(p.path(), &args);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("upload it with: wandb sync logs/run/wandb/offline-run-"),
        "{}",
        text(&out)
    );
    let run = p.path().join("logs/run");
    let records = inspect(&cli, &run);
    assert_eq!(records[0]["type"], "header");
    let started = of_type(&records, "run");
    assert_eq!(started.len(), 1);
    let r = &started[0]["run"];
    assert_eq!(r["project"], "trainyard");
    assert_eq!(r["run_group"], "ablation");
    assert_eq!(r["notes"], "first try");
    assert_eq!(r["display_name"], "quickstart");
    assert_eq!(
        r["tags"],
        serde_json::json!(["quickstart", "synthetic", "cnn"])
    );
    assert_eq!(r["config"]["update"]["data"]["train_size"], 256);
    assert_eq!(r["config"]["update"]["optimizer"]["lr"], 0.003);

    // Every metrics.csv row is one history row with the same values, in order.
    let history = of_type(&records, "history");
    let rows = csv_rows(&run);
    assert_eq!(history.len(), rows.len());
    for (i, (h, row)) in history.iter().zip(&rows).enumerate() {
        let item = &h["history"]["item"];
        assert_eq!(item["_step"], i as u64);
        for (key, value) in row {
            let key = match key.as_str() {
                "step" => "trainer/global_step",
                k => k,
            };
            let got = item[key]
                .as_f64()
                .unwrap_or_else(|| panic!("row {i} lacks {key}: {item}"));
            assert!(
                (got - value).abs() <= 1e-6 * value.abs().max(1.0),
                "row {i} {key}: {got} vs {value}"
            );
        }
    }
    let summary = of_type(&records, "summary");
    let last = &summary.last().unwrap()["summary"]["update"];
    let s = common::summary(&run);
    assert_eq!(
        last["val/acc1"].as_f64(),
        s["final_metrics"]["val/acc1"].as_f64()
    );
    // The resolved config and (log_model) the best checkpoint are files of the run.
    let files = &of_type(&records, "files")[0]["files"]["files"];
    assert_eq!(files[0]["path"], "trainyard-config.yaml");
    let best = Path::new(s["best_checkpoint"].as_str().unwrap());
    let listed = format!(
        "checkpoints/{}",
        best.file_name().unwrap().to_string_lossy()
    );
    assert_eq!(files[1]["path"], "trainyard-summary.json");
    assert_eq!(files[2]["path"], listed.as_str());
    // The run's logbook section and its plots, as the logbook writes them.
    assert_eq!(files[3]["path"], "logbook/logbook.md");
    let page =
        std::fs::read_to_string(run.join("wandb/latest-run/files/logbook/logbook.md")).unwrap();
    assert!(
        page.contains("# Logbook") && page.contains("quickstart"),
        "{page}"
    );
    let plots = files.as_array().unwrap().iter().filter(|f| {
        f["path"]
            .as_str()
            .is_some_and(|p| p.starts_with("logbook/") && p.ends_with(".svg"))
    });
    assert!(plots.count() >= 1, "{files}");
    let uploaded = run.join("wandb/latest-run/files").join(&listed);
    assert_eq!(
        std::fs::read(uploaded).unwrap(),
        std::fs::read(best).unwrap()
    );
    let exit = of_type(&records, "exit");
    assert_eq!(exit.len(), 1);
    assert!(
        exit[0]["exit"].get("exit_code").is_none_or(|c| c == 0),
        "{}",
        exit[0]
    );
    assert_eq!(records.last().unwrap()["type"], "exit");
    // W&B's uploader takes it as a run to sync.
    let dry = std::process::Command::new(&cli)
        .args(["sync", "--dry-run"])
        .arg(run.join("wandb/latest-run"))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&dry.stderr).contains("Would sync 1 run(s)"),
        "{}",
        text(&dry)
    );
}

#[test]
fn a_record_larger_than_a_block_spans_several_and_reads_back() {
    let Some(cli) = wandb_cli() else { return };
    let p = real_project();
    // 9000 tags: a run record of about 80 KB, three 32 KiB blocks.
    let tags: Vec<String> = (0..9000).map(|i| format!("tag{i}")).collect();
    let tags = format!("tags=[{}]", tags.join(","));
    let mut args = TINY.to_vec();
    args.extend([tags.as_str(), "hydra.run.dir=logs/big"]);
    let out = train(p.path(), &args);
    assert!(out.status.success(), "{}", text(&out));
    let run = p.path().join("logs/big");
    let file = std::fs::read_dir(run.join("wandb/latest-run"))
        .unwrap()
        .flatten()
        .find(|e| e.path().extension().is_some_and(|x| x == "wandb"))
        .unwrap();
    assert!(file.metadata().unwrap().len() > 2 * 32 * 1024);
    let records = inspect(&cli, &run);
    let tags = &of_type(&records, "run")[0]["run"]["tags"];
    assert_eq!(tags.as_array().unwrap().len(), 9000);
    assert_eq!(tags[8999], "tag8999");
    assert_eq!(of_type(&records, "history").len(), csv_rows(&run).len());
}

#[test]
fn a_failed_run_ends_its_w_and_b_run_with_exit_code_1() {
    let Some(cli) = wandb_cli() else { return };
    let p = real_project();
    let mut args = TINY.to_vec();
    // The first epoch's checkpoint cannot be written: the run fails after its first rows were logged.
    args.extend([
        "callbacks.model_checkpoint.dirpath=/proc/trainyard-cannot-write-here",
        "hydra.run.dir=logs/failed",
    ]);
    let out = train(p.path(), &args);
    assert!(!out.status.success(), "{}", text(&out));
    let run = p.path().join("logs/failed");
    let records = inspect(&cli, &run);
    assert!(!of_type(&records, "history").is_empty());
    let exit = of_type(&records, "exit");
    assert_eq!(exit.len(), 1, "{records:?}");
    assert_eq!(exit[0]["exit"]["exit_code"], 1);
    assert_eq!(records.last().unwrap()["type"], "exit");
}

#[test]
fn sweep_jobs_are_grouped_by_their_sweep() {
    let Some(cli) = wandb_cli() else { return };
    let p = real_project();
    let mut args = vec!["-m"];
    args.extend(TINY);
    args.extend(["seed=1,2", "hydra.sweep.dir=logs/sweep"]);
    let out = train(p.path(), &args);
    assert!(out.status.success(), "{}", text(&out));
    for job in ["0", "1"] {
        let run = p.path().join("logs/sweep").join(job);
        let records = inspect(&cli, &run);
        assert_eq!(of_type(&records, "run")[0]["run"]["run_group"], "sweep");
        let runs = std::fs::read_dir(run.join("wandb"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("offline-run-"))
            .count();
        assert_eq!(runs, 1, "one W&B run per job");
    }
}

/// DDP (two processes over Gloo, feature torch): one W&B run, written by rank 0, with the run's rows.
#[cfg(feature = "torch")]
#[test]
fn a_ddp_run_is_one_w_and_b_run_written_by_rank_zero() {
    let Some(cli) = wandb_cli() else { return };
    let p = real_project();
    let mut args = TINY.to_vec();
    args.extend([
        "trainer=ddp_sim",
        "data.batch_size=16",
        "hydra.run.dir=logs/ddp",
    ]);
    let out = train(p.path(), &args);
    assert!(out.status.success(), "{}", text(&out));
    let run = p.path().join("logs/ddp");
    let runs = std::fs::read_dir(run.join("wandb"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("offline-run-"))
        .count();
    assert_eq!(runs, 1, "rank 1 writes no W&B run");
    let records = inspect(&cli, &run);
    assert_eq!(of_type(&records, "history").len(), csv_rows(&run).len());
    assert_eq!(of_type(&records, "exit").len(), 1);
}
