//! `trainer.profiler` end to end: Lightning's SimpleProfiler report from a real run, its counts matching
//! what the run did, in the console, `summary.json` or the file Lightning names.

mod common;
use common::{real_project, run_in, summary};
use rstest::rstest;

/// Every action's number of calls in a run's `summary.json`.
fn calls(run: &std::path::Path) -> std::collections::BTreeMap<String, u64> {
    summary(run)["profile"]
        .as_array()
        .expect("summary.json has the profile")
        .iter()
        .map(|a| {
            (
                a["action"].as_str().unwrap().to_string(),
                a["calls"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// 320 images in batches of 32: 10 batches an epoch; with accumulation, half as many optimizer steps.
#[rstest]
#[case::single("single", &[], 10)]
#[case::accumulating("single", &["trainer.accumulate_grad_batches=2"], 5)]
#[case::data_parallel("dp", &["trainer=dp_sim"], 10)]
fn counts_match_the_run(#[case] strategy: &str, #[case] extra: &[&str], #[case] steps: u64) {
    let p = real_project();
    let mut args = vec![
        "trainer.profiler=simple",
        "data.batch_size=32",
        "trainer.max_epochs=2",
    ];
    args.extend_from_slice(extra);
    let run = run_in(p.path(), "run", &args);
    let calls = calls(&run);
    let expect = [
        ("run_training_epoch".to_string(), 2),
        ("run_training_batch".to_string(), 20),
        ("train_dataloader_next".to_string(), 20),
        (format!("[Strategy]{strategy}.forward_backward"), 20),
        (format!("[Strategy]{strategy}.optimizer_step"), 2 * steps),
        ("run_validation".to_string(), 2),
        // 64 validation images in batches of 32, twice.
        (format!("[Strategy]{strategy}.validation_step"), 4),
        ("read_batch_stats".to_string(), 20),
        ("setup".to_string(), 1),
    ];
    for (action, n) in expect {
        assert_eq!(calls.get(&action), Some(&n), "{action} in {calls:?}");
    }
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(log.contains("FIT Profiler Report"), "{log}");
    assert!(log.contains("Percentage %"), "{log}");
}

/// With a filename the report goes to `<dirpath>/fit-<filename>.txt` (Lightning's name), not the console;
/// without a profiler there is no report and no profile.
#[rstest]
#[case::to_a_file(
    "trainer.profiler={filename: perf, dirpath: profiles, extended: false}",
    Some("profiles/fit-perf.txt")
)]
#[case::off("trainer.profiler=null", None)]
fn report_goes_where_configured(#[case] setting: &str, #[case] file: Option<&str>) {
    let p = real_project();
    let run = run_in(p.path(), "run", &[setting]);
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(!log.contains("FIT Profiler Report"), "{log}");
    match file {
        Some(file) => {
            let text = std::fs::read_to_string(run.join(file)).unwrap();
            assert!(text.contains("[Strategy]single.forward_backward"), "{text}");
            assert!(!text.contains("Num calls"), "extended: false: {text}");
            assert!(!calls(&run).is_empty());
        }
        None => assert!(summary(&run).get("profile").is_none_or(|p| p.is_null())),
    }
}

/// `debug=profiler` (lightning-hydra-template's): one epoch of a few batches, then the report.
#[test]
fn debug_profiler_config() {
    let p = real_project();
    let run = run_in(p.path(), "run", &["debug=profiler"]);
    let calls = calls(&run);
    assert_eq!(calls.get("run_training_epoch"), Some(&1), "{calls:?}");
    assert_eq!(calls.get("run_training_batch"), Some(&5), "{calls:?}");
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(log.contains("FIT Profiler Report"), "{log}");
}

/// Each DDP rank writes its own file (`fit-perf-<rank>.txt`), with its own counts.
#[cfg(feature = "torch")]
#[test]
fn ddp_ranks_write_a_file_each() {
    let p = real_project();
    let run = run_in(
        p.path(),
        "run",
        &[
            "trainer=ddp_sim",
            "trainer.profiler={filename: perf}",
            "data.batch_size=32",
        ],
    );
    for rank in 0..2 {
        let text = std::fs::read_to_string(run.join(format!("fit-perf-{rank}.txt"))).unwrap();
        // 320 images over two ranks, batches of 32: 5 each.
        assert!(
            text.lines()
                .any(|l| l.contains("[Strategy]ddp.forward_backward") && l.contains("|  5 ")),
            "rank {rank}: {text}"
        );
    }
}
