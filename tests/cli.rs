//! The `train` binary end to end, in throwaway projects: printing, errors, run records, sweeps, help, completion.

use rstest::rstest;
mod common;
use common::{real_project, train, TRAIN};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A tiny project: conf/train.yaml with groups, and experiments/ as the `experiment` group.
fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let files: &[(&str, &str)] = &[
        (
            "conf/train.yaml",
            "defaults:\n  - _self_\n  - model: small\n  - trainer: single\n  - optional debug: null\n  - experiment: null\n\ntask_name: demo\nseed: 42\nlr: 0.1\nname: run_${seed}\n",
        ),
        ("conf/model/small.yaml", "name: small\nwidth: 16\n"),
        ("conf/model/large.yaml", "name: large\nwidth: 1024\n"),
        ("conf/trainer/single.yaml", "strategy: single\nmax_epochs: 3\ndevices: 1\n"),
        ("conf/trainer/ddp.yaml", "strategy: ddp\nmax_epochs: 3\ndevices: 2\nnum_nodes: 1\n"),
        ("conf/debug/fast.yaml", "# @package _global_\ntrainer:\n  max_epochs: 1\n"),
        (
            "conf/sweep/lr.yaml",
            "# @package _global_\nhydra:\n  sweeper:\n    params:\n      lr: 0.1,0.01\n",
        ),
        (
            "experiments/big.yaml",
            "# @package _global_\ndefaults:\n  - override /model: large\n  - override /trainer: ddp\n\ntask_name: big\ntrainer:\n  num_nodes: 2\n",
        ),
    ];
    for (path, text) in files {
        let p = dir.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    dir
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}
fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

#[test]
fn cfg_job_prints_composed_config_and_runs_nothing() {
    let p = project();
    let out = train(p.path(), &["--cfg", "job", "experiment=big", "lr=0.5"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("task_name: big"), "{text}");
    assert!(text.contains("name: large"), "{text}");
    assert!(text.contains("num_nodes: 2"), "{text}");
    assert!(text.contains("lr: 0.5"), "{text}");
    assert!(
        text.contains("name: run_${seed}"),
        "unresolved without --resolve: {text}"
    );
    assert!(
        !text.contains("hydra:"),
        "job config has no hydra node: {text}"
    );
    assert!(
        !p.path().join("logs").exists(),
        "--cfg must not create run directories"
    );
}

#[test]
fn resolve_and_package() {
    let p = project();
    let out = train(p.path(), &["--cfg", "job", "--resolve", "-p", "name"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "name: run_42\n");
}

#[test]
fn works_from_a_subfolder() {
    let p = project();
    let sub = p.path().join("conf/model");
    let out = train(&sub, &["--cfg", "job", "model=large"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("width: 1024"));
}

#[rstest]
#[case(&["trainer.max_epoch=3"], "Could not override 'trainer.max_epoch'", "Did you mean 'trainer.max_epochs'?")]
#[case(&["+seed=1"], "Could not append to config. An item is already at 'seed'", "++seed=1")]
#[case(&["model=huge"], "Could not find 'model/huge'", "Available options in 'model'")]
#[case(&["a=[1"], "Error parsing override 'a=[1'", "")]
#[case(&["lr=0.1,0.2"], "Ambiguous value for argument 'lr=0.1,0.2'", "--multirun")]
#[case(&["foo=1"], "Could not override 'foo'", "To append to your config use +foo=1")]
#[case(&["model=../train"], "invalid option '../train'", "(set at override 'model=../train')")]
#[case(&["model=/etc/passwd"], "an absolute file path is not a config name", "")]
fn bad_input_gives_one_clear_error(#[case] args: &[&str], #[case] first: &str, #[case] hint: &str) {
    let p = project();
    let mut all = vec!["--cfg", "job"];
    all.extend_from_slice(args);
    let out = train(p.path(), &all);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains(first), "{err}");
    assert!(err.contains(hint), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!err.contains("stack backtrace"), "{err}");
}

#[test]
fn error_names_file_and_line_of_bad_yaml() {
    let p = project();
    std::fs::write(
        p.path().join("conf/model/broken.yaml"),
        "name: x\nname: y\n",
    )
    .unwrap();
    let out = train(p.path(), &["--cfg", "job", "model=broken"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("broken.yaml:2:1"), "{err}");
    assert!(err.contains("duplicate key name"), "{err}");
}

#[test]
fn info_shows_defaults_tree_and_searchpath() {
    let p = project();
    let out = train(p.path(), &["--info", "defaults-tree", "experiment=big"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("model: large"), "{text}");
    assert!(text.contains("experiment: big"), "{text}");
    let out = train(p.path(), &["--info", "searchpath"]);
    assert!(stdout(&out).contains("experiments"), "{}", stdout(&out));
}

#[test]
fn help_lists_groups_and_options() {
    let p = project();
    let out = train(p.path(), &["--help"]);
    assert!(out.status.success());
    let text = stdout(&out);
    // The project's options beside the shipped ones, marked as its own.
    let models = text
        .lines()
        .find(|l| l.trim_start().starts_with("model: "))
        .expect(&text);
    for option in ["large*", "small*", "cnn", "resnet18"] {
        assert!(models.contains(option), "{models}");
    }
    assert!(text.contains("big*"), "{text}");
    assert!(text.contains("--config-name"), "{text}");
}

#[test]
fn completion_offers_groups_options_and_keys() {
    let p = project();
    let out = train(p.path(), &["--complete", "model="]);
    let text = stdout(&out);
    let offered: Vec<&str> = text.lines().collect();
    for option in ["model=large", "model=small", "model=resnet18"] {
        assert!(offered.contains(&option), "{offered:?}");
    }
    let out = train(p.path(), &["--complete", "trainer.max"]);
    assert!(
        stdout(&out).contains("trainer.max_epochs="),
        "{}",
        stdout(&out)
    );
    let out = train(p.path(), &["--shell-completion", "bash"]);
    assert!(stdout(&out).contains("complete -F _train_complete train"));
}

#[test]
fn a_run_is_checked_against_the_schema() {
    let p = project();
    let out = train(p.path(), &["model=large", "seed=7"]);
    // The demo project has no typed training sections, so the schema rejects it with a clear message.
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(err.contains("Error in config key"), "{err}");
}

fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|r| {
            r.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

#[test]
fn quickstart_run_writes_hydra_records() {
    let p = real_project();
    let mut args = vec!["experiment=quickstart", "seed=7"];
    args.extend_from_slice(TINY);
    let out = train(p.path(), &args);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("task_name: quickstart"),
        "the run prints its config: {}",
        stdout(&out)
    );
    let runs = subdirs(&p.path().join("logs/quickstart/runs"));
    assert_eq!(runs.len(), 1, "{runs:?}");
    let hydra_dir = runs[0].join(".hydra");
    let config = std::fs::read_to_string(hydra_dir.join("config.yaml")).unwrap();
    assert!(config.contains("seed: 7"), "{config}");
    assert!(
        config.contains("output_dir: ${hydra:runtime.output_dir}"),
        "config.yaml is as composed: {config}"
    );
    let resolved = std::fs::read_to_string(hydra_dir.join("resolved.yaml")).unwrap();
    assert!(
        resolved.contains(&format!("output_dir: {}", runs[0].display())),
        "{resolved}"
    );
    let overrides = std::fs::read_to_string(hydra_dir.join("overrides.yaml")).unwrap();
    assert!(
        overrides.starts_with("- experiment=quickstart\n- seed=7\n"),
        "{overrides}"
    );
    let hydra = std::fs::read_to_string(hydra_dir.join("hydra.yaml")).unwrap();
    for needle in [
        "experiment: quickstart",
        "model: cnn",
        // A single run has no job number (Hydra leaves `hydra.job.num` unset outside a sweep).
        "num: ???",
        "mode: RUN",
        "- hydra.mode=RUN",
        "cwd:",
        "output_dir:",
    ] {
        assert!(
            hydra.contains(needle),
            "{needle} missing from hydra.yaml:\n{hydra}"
        );
    }
}

#[test]
fn every_shipped_experiment_composes_and_validates() {
    let p = real_project();
    for entry in std::fs::read_dir(p.path().join("experiments"))
        .unwrap()
        .flatten()
    {
        let name = entry
            .path()
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .to_string();
        let out = train(
            p.path(),
            &["--cfg", "job", "--resolve", &format!("experiment={name}")],
        );
        assert!(out.status.success(), "experiment {name}: {}", stderr(&out));
        // No job is placed by --cfg, so `${hydra:runtime.output_dir}` prints null as under Hydra; a run
        // has its directory there.
        let printed = stdout(&out);
        assert!(printed.contains("  output_dir: null\n"), "{printed}");
        let printed = printed.replace("  output_dir: null\n", "  output_dir: /placed/run\n");
        let resolved = trainyard::config::yaml::parse(&printed, "printed")
            .unwrap()
            .unwrap();
        if let Err(e) = trainyard::schema::extract(&resolved) {
            panic!("experiment {name} does not fit the schema: {e}");
        }
    }
}

/// Settings the schema reads are in the shipped group files, so `key=value` overrides them without `+`
/// (`data.pin_memory` was in the schema but in no data file: README's `data.pin_memory=false` was
/// refused, and only `+data.pin_memory=false` got through).
#[rstest]
fn loader_settings_override_on_every_data_group(
    #[values("cifar10", "cinic10", "imagenet", "mnist", "synthetic")] data: &str,
    #[values("pin_memory=false", "drop_last=true")] setting: &str,
) {
    overrides_without_plus(&format!("data={data}"), &format!("data.{setting}"));
}

#[rstest]
fn adam_settings_override(
    #[values("adam", "adamw")] optimizer: &str,
    #[values("eps=0.001", "weight_decay=0.1")] setting: &str,
) {
    overrides_without_plus(
        &format!("optimizer={optimizer}"),
        &format!("optimizer.{setting}"),
    );
}

/// `train --cfg job -p KEY GROUP=CHOICE KEY=VALUE` prints `KEY: VALUE`.
fn overrides_without_plus(group: &str, assignment: &str) {
    let p = real_project();
    let (key, value) = assignment.split_once('=').unwrap();
    let out = train(p.path(), &["--cfg", "job", "-p", key, group, assignment]);
    assert!(
        out.status.success(),
        "{group} {assignment}: {}",
        stderr(&out)
    );
    let printed = stdout(&out).replace(", ", ",");
    assert_eq!(
        printed.trim_end(),
        format!("{key}: {value}"),
        "{group} {assignment}"
    );
}

/// Keeps training in these tests to a fraction of a second.
const TINY: &[&str] = &[
    "data.train_size=64",
    "data.val_size=32",
    "trainer.max_epochs=1",
    "model.channels=[4]",
];

#[test]
fn sweep_from_yaml_runs_every_job_into_the_multirun_dir() {
    let p = real_project();
    let out = train(
        p.path(),
        &[
            &["-m", "sweep=batch_size", "experiment=quickstart"][..],
            TINY,
        ]
        .concat(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let sweeps = subdirs(&p.path().join("logs/sweep_batch_size/multiruns"));
    assert_eq!(sweeps.len(), 1);
    assert!(sweeps[0].join("multirun.yaml").is_file());
    let jobs = subdirs(&sweeps[0]);
    assert_eq!(
        jobs.iter()
            .map(|j| j.file_name().unwrap().to_string_lossy().to_string())
            .collect::<Vec<_>>(),
        ["0", "1", "2"]
    );
    for (job, batch) in jobs.iter().zip([32, 64, 128]) {
        let resolved = std::fs::read_to_string(job.join(".hydra/resolved.yaml")).unwrap();
        assert!(
            resolved.contains(&format!("batch_size: {batch}")),
            "{resolved}"
        );
    }
    let table = stdout(&out);
    let last = table
        .lines()
        .find(|l| l.starts_with("| 2 |"))
        .unwrap_or_default();
    assert!(
        last.contains("data.batch_size=128 sweep=batch_size experiment=quickstart"),
        "{table}"
    );
    assert!(
        table.contains("| job | overrides | status | val/acc1 ↑ |") && last.contains("| ok | 0."),
        "the sweep table leads with the run's metric and its direction: {table}"
    );
}

#[test]
fn a_failing_job_does_not_stop_the_sweep_but_fails_the_exit_code() {
    let p = real_project();
    let mut args = vec!["-m", "experiment=quickstart", "data.batch_size=0,32"];
    args.extend_from_slice(TINY);
    let out = train(p.path(), &args);
    assert!(!out.status.success());
    let table = stdout(&out);
    let row = |n: &str| {
        table
            .lines()
            .find(|l| l.starts_with(&format!("| {n} |")))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        row("0").contains("data.batch_size=0") && row("0").contains("| FAILED |"),
        "{table}"
    );
    assert!(
        row("1").contains("data.batch_size=32") && row("1").contains("| ok |"),
        "{table}"
    );
    assert!(
        stderr(&out).contains("batch size must be at least 1"),
        "{}",
        stderr(&out)
    );

    let mut args = vec![
        "-m",
        "--fail-fast",
        "experiment=quickstart",
        "data.batch_size=0,32",
    ];
    args.extend_from_slice(TINY);
    let out = train(p.path(), &args);
    assert!(!out.status.success());
    // The table lists every planned job: the one --fail-fast kept from running says so.
    assert!(
        stdout(&out).contains("data.batch_size=32 data.train_size")
            && stdout(&out).contains("| not run |"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn schema_errors_point_at_the_override() {
    let p = real_project();
    let out = train(p.path(), &["experiment=quickstart", "trainer.precision=64"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("unknown precision '64'"), "{err}");
    assert!(
        err.contains("(set at override 'trainer.precision=64')"),
        "{err}"
    );
    let out = train(p.path(), &["experiment=quickstart", "optimizer.name=sgdd"]);
    assert!(
        stderr(&out).contains("Did you mean 'sgd'?"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn multirun_cfg_prints_one_document_per_job_in_order() {
    let p = project();
    let out = train(
        p.path(),
        &[
            "-m",
            "--cfg",
            "job",
            "-p",
            "lr",
            "lr=1,2",
            "model=small,large",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let docs: Vec<String> = stdout(&out).split("---\n").map(str::to_string).collect();
    assert_eq!(docs, vec!["lr: 1\n", "lr: 1\n", "lr: 2\n", "lr: 2\n"]);
}

#[test]
fn sweep_declared_in_yaml_expands() {
    let p = project();
    let out = train(p.path(), &["-m", "--cfg", "job", "-p", "lr", "+sweep=lr"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "lr: 0.1\n---\nlr: 0.01\n");
    // The command line wins over the YAML sweep for the same key.
    let out = train(
        p.path(),
        &["-m", "--cfg", "job", "-p", "lr", "+sweep=lr", "lr=5"],
    );
    assert_eq!(stdout(&out), "lr: 5\n");
}

#[test]
fn config_path_replaces_the_search_path() {
    let p = project();
    let other = tempfile::tempdir().unwrap();
    std::fs::write(other.path().join("main.yaml"), "x: 1\n").unwrap();
    let out = train(
        p.path(),
        &[
            "-cp",
            other.path().to_str().unwrap(),
            "-cn",
            "main",
            "--cfg",
            "job",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "x: 1\n");
}

/// A config that includes itself through its defaults list (found by fuzzing: a stack overflow) is one
/// clear error naming the chain.
#[test]
fn a_defaults_list_cycle_is_named() {
    let p = project();
    let conf = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(conf.path().join("data")).unwrap();
    std::fs::create_dir_all(conf.path().join("model")).unwrap();
    let files = [
        ("main.yaml", "defaults:\n  - model: a\n  - _self_\n"),
        ("model/a.yaml", "defaults:\n  - /data: x\nname: a\n"),
        ("data/x.yaml", "defaults:\n  - /model: a\nsize: 1\n"),
    ];
    for (name, text) in files {
        std::fs::write(conf.path().join(name), text).unwrap();
    }
    let args = [
        "-cp",
        conf.path().to_str().unwrap(),
        "-cn",
        "main",
        "--cfg",
        "job",
    ];
    let out = train(p.path(), &args);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(
            "Defaults List cycle: 'model/a' includes itself (main -> model/a -> data/x -> model/a)"
        ),
        "{err}"
    );
}

#[test]
fn train_config_path_names_the_project() {
    let p = project();
    let elsewhere = tempfile::tempdir().unwrap();
    let out = Command::new(TRAIN)
        .args(["--cfg", "job", "-p", "lr"])
        .current_dir(elsewhere.path())
        .env("TRAIN_CONFIG_PATH", p.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "lr: 0.1\n");
}

/// With no project above the current directory, the shipped configs stand in, and `train` says so once.
#[test]
fn no_project_uses_the_built_in_configs() {
    let empty = tempfile::tempdir().unwrap();
    let out = train(empty.path(), &["--cfg", "job", "experiment=cifar"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("task_name: cifar"),
        "{}",
        stdout(&out)
    );
    let notice = "No project here (no conf/train.yaml in";
    assert_eq!(stderr(&out).matches(notice).count(), 1, "{}", stderr(&out));
}

/// Bad YAML fails fast and names the file and line (an alias bomb must not hang `train`; a syntax error names
/// where the broken construct began), and dict keys keep their YAML type as Hydra prints them.
#[rstest]
#[case::alias_bomb("", &[], false, &["bad.yaml:6:", "alias expansion exceeds 100000 nodes: a YAML alias bomb?"])]
#[case::unclosed_flow_sequence(
    "name: x\nwidth: [1, 2\nother: 3\n",
    &[],
    false,
    &["bad.yaml:3:", "while parsing a flow sequence that began at", "bad.yaml:2:8"]
)]
#[case::null_key_in_file("name: x\nwidth:\n  null: 1\n", &[], false, &["bad.yaml:3:", "Incompatible key type 'NoneType'\n    full_key: width"])]
#[case::typed_keys(
    "name: x\nwidth: {1: a, '2': b}\n",
    &["+x={123: 1, 1.5: c}"],
    true,
    &["  width:\n    1: a\n    '2': b\n", "x:\n  123: 1\n  1.5: c\n"]
)]
#[case::null_key_in_override(
    "name: x\n",
    &["+x={a: {null: 1}}"],
    false,
    &["Error merging override +x={a: {null: 1}}\nIncompatible key type 'NoneType'\n    full_key: x.a"]
)]
fn bad_yaml_fails_fast_with_file_and_line_and_keys_keep_their_type(
    #[case] yaml: &str,
    #[case] extra: &[&str],
    #[case] ok: bool,
    #[case] expected: &[&str],
) {
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let p = project();
    let yaml = if yaml.is_empty() {
        // Nine levels of nine aliases: 387 million nodes if expanded.
        let mut text = String::from("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
        for (prev, name) in "abcdefgh".chars().zip("bcdefghi".chars()) {
            let items = vec![format!("*{prev}"); 9].join(", ");
            text.push_str(&format!("{name}: &{name} [{items}]\n"));
        }
        text
    } else {
        yaml.to_string()
    };
    std::fs::write(p.path().join("conf/model/bad.yaml"), yaml).unwrap();
    let mut args = vec!["--cfg", "job", "model=bad"];
    args.extend_from_slice(extra);
    let mut child = Command::new(TRAIN)
        .args(&args)
        .current_dir(p.path())
        .env_remove("TRAIN_CONFIG_PATH")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The parser itself is timed in yaml.rs (< 1 s); here a generous bound only tells a hang from a slow machine.
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(10) {
            child.kill().ok();
            panic!("train {args:?} still running after 10 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.success(), ok, "{}", stderr(&out));
    let text = if ok { stdout(&out) } else { stderr(&out) };
    for part in expected {
        assert!(text.contains(part), "{part:?} not in:\n{text}");
    }
    assert!(!text.contains("panicked"), "{text}");
}

/// What the training step logs reaches the run's console and log file: the step runs on a rayon worker
/// (single) or a thread per replica (DataParallel), where a subscriber scoped to the main thread saw
/// nothing (a bad `TRAINYARD_CONV_ISA` or `TRAINYARD_CONV_L1D` was then ignored without a word).
#[rstest]
#[case::single(&[])]
#[case::data_parallel(&["trainer=dp_sim"])]
fn warnings_from_the_training_step_reach_the_console_and_the_log(#[case] strategy: &[&str]) {
    let p = real_project();
    let mut args = vec!["experiment=quickstart"];
    args.extend_from_slice(TINY);
    args.extend_from_slice(strategy);
    let out = Command::new(TRAIN)
        .args(&args)
        .current_dir(p.path())
        .env_remove("TRAIN_CONFIG_PATH")
        .env("TRAINYARD_CONV_L1D", "lots")
        .env("TRAINYARD_CONV_ISA", "sse9")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let console = stdout(&out);
    for needle in [
        "TRAINYARD_CONV_L1D=lots is not a size",
        "TRAINYARD_CONV_ISA=sse9",
    ] {
        assert!(
            console.contains(needle),
            "{needle} missing from the console:\n{console}"
        );
    }
    let runs = subdirs(&p.path().join("logs/quickstart/runs"));
    let log = std::fs::read_to_string(runs[0].join("train.log")).unwrap();
    assert!(
        log.contains("TRAINYARD_CONV_L1D=lots is not a size"),
        "{log}"
    );
}
