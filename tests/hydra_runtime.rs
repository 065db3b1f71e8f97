//! Hydra's runtime end to end, through the `train` binary in throwaway projects: Hydra's own config groups
//! (`override hydra/job_logging: ...`), the `hydra` node's keys with Hydra's meaning (`job.chdir`,
//! `job.env_set`, `mode`, `verbose`, logging styles), `${hydra:...}`, and the keys refused with a reason.

use rstest::rstest;
mod common;
use common::{real_project, train};
use std::path::{Path, PathBuf};
use std::process::Output;

const TINY: &[&str] = &[
    "experiment=quickstart",
    "data.train_size=64",
    "data.val_size=32",
    "trainer.max_epochs=1",
    "model.channels=[4]",
];

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

fn run_dirs(root: &Path) -> Vec<PathBuf> {
    let base = root.join("logs/quickstart/runs");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&base)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs
}

fn write(root: &Path, path: &str, text: &str) {
    let p = root.join(path);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

fn run(root: &Path, extra: &[&str]) -> Output {
    let mut args: Vec<&str> = TINY.to_vec();
    args.extend_from_slice(extra);
    train(root, &args)
}

#[test]
fn hydra_groups_are_composed_and_their_options_chosen() {
    let p = real_project();
    let out = train(
        p.path(),
        &[
            "--cfg",
            "hydra",
            "hydra/job_logging=colorlog",
            "hydra/hydra_logging=disabled",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for needle in [
        "hydra/job_logging: colorlog",
        "hydra/hydra_logging: disabled",
        "hydra/launcher: basic",
        "hydra/sweeper: basic",
        "colorlog.ColoredFormatter",
        "BasicSweeper",
        "- hydra/job_logging=colorlog",
        "cwd:",
    ] {
        assert!(
            text.contains(needle),
            "{needle} missing from --cfg hydra:\n{text}"
        );
    }
}

#[test]
fn a_project_overrides_hydra_groups_from_its_own_hydra_option() {
    let p = real_project();
    // As lightning-hydra-template does it: `- hydra: default` in the primary config, whose defaults
    // override Hydra's logging groups relative to the `hydra` group.
    write(
        p.path(),
        "conf/hydra/default.yaml",
        "defaults:\n  - override hydra_logging: colorlog\n  - override job_logging: colorlog\n\
         job_logging:\n  handlers:\n    file:\n      filename: ${hydra.runtime.output_dir}/${task_name}.log\n",
    );
    let train_yaml = std::fs::read_to_string(p.path().join("conf/train.yaml")).unwrap();
    write(
        p.path(),
        "conf/train.yaml",
        &train_yaml.replace("  - debug: null\n", "  - debug: null\n  - hydra: default\n"),
    );
    let out = run(p.path(), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let runs = run_dirs(p.path());
    assert_eq!(runs.len(), 1);
    // The job log is where the project's file handler names it.
    assert!(runs[0].join("quickstart.log").is_file(), "{runs:?}");
    assert!(!runs[0].join("train.log").exists());
    let hydra = std::fs::read_to_string(runs[0].join(".hydra/hydra.yaml")).unwrap();
    assert!(hydra.contains("hydra/job_logging: colorlog"), "{hydra}");
}

#[test]
fn a_legacy_hydra_group_entry_without_override_fails_as_in_hydra() {
    let p = real_project();
    let train_yaml = std::fs::read_to_string(p.path().join("conf/train.yaml")).unwrap();
    write(
        p.path(),
        "conf/train.yaml",
        &train_yaml.replace(
            "  - debug: null\n",
            "  - debug: null\n  - hydra/job_logging: disabled\n",
        ),
    );
    let out = train(p.path(), &["--cfg", "job"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("Multiple values for hydra/job_logging. To override a value use 'override hydra/job_logging: disabled'"),
        "{err}"
    );
    assert!(
        err.contains("conf/train.yaml:"),
        "the error names the file and line: {err}"
    );
}

#[rstest]
#[case::disabled("disabled", false)]
#[case::none("none", false)]
#[case::stdout("stdout", false)]
#[case::colorlog("colorlog", true)]
#[case::default("default", true)]
fn logging_styles_decide_the_log_file(#[case] style: &str, #[case] has_file: bool) {
    let p = real_project();
    let choice = format!("hydra/job_logging={style}");
    let out = run(p.path(), &[&choice]);
    assert!(out.status.success(), "{}", stderr(&out));
    let runs = run_dirs(p.path());
    assert_eq!(runs[0].join("train.log").is_file(), has_file, "{style}");
    if style == "disabled" {
        // Errors only on the console: no per-epoch lines.
        assert!(!stdout(&out).contains("epoch 1/1"), "{}", stdout(&out));
    }
}

#[test]
fn verbose_and_a_debug_root_level_log_debug_lines() {
    let p = real_project();
    let out = run(
        p.path(),
        &[
            "hydra.job_logging.root.level=DEBUG",
            "hydra.run.dir=logs/quickstart/runs/a",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let quiet = run(p.path(), &["hydra.run.dir=logs/quickstart/runs/b"]);
    assert!(quiet.status.success());
    let runs = run_dirs(p.path());
    let debug_log = std::fs::read_to_string(runs[0].join("train.log")).unwrap();
    let info_log = std::fs::read_to_string(runs[1].join("train.log")).unwrap();
    assert!(debug_log.contains("DEBUG"), "{debug_log}");
    assert!(!info_log.contains("DEBUG"), "{info_log}");
    let verbose = run(p.path(), &["hydra.verbose=true"]);
    assert!(verbose.status.success(), "{}", stderr(&verbose));
}

#[test]
fn env_set_reaches_the_job_config_and_chdir_moves_into_the_run_dir() {
    let p = real_project();
    let out = run(
        p.path(),
        &[
            "+hydra.job.env_set.TRAINYARD_TEST_TAG=from_env_set",
            "hydra.job.chdir=true",
            "tags=[${oc.env:TRAINYARD_TEST_TAG},${hydra:runtime.cwd}]",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let runs = run_dirs(p.path());
    let resolved = std::fs::read_to_string(runs[0].join(".hydra/resolved.yaml")).unwrap();
    assert!(resolved.contains("- from_env_set"), "{resolved}");
    let cwd = p.path().canonicalize().unwrap();
    assert!(
        resolved.contains(&format!("- {}", cwd.display()))
            || resolved.contains(&format!("- {}", p.path().display())),
        "the launch directory, not the run directory: {resolved}"
    );
    let hydra = std::fs::read_to_string(runs[0].join(".hydra/hydra.yaml")).unwrap();
    assert!(hydra.contains("chdir: true"), "{hydra}");
}

#[test]
fn a_config_that_sets_multirun_mode_sweeps_without_dash_m() {
    let p = real_project();
    write(
        p.path(),
        "conf/sweep/seeds.yaml",
        "# @package _global_\nhydra:\n  mode: MULTIRUN\n  sweeper:\n    params:\n      seed: 1,2\n",
    );
    let out = run(p.path(), &["sweep=seeds"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("Launching 2 jobs"),
        "{}",
        stderr(&out)
    );
    let sweeps: Vec<_> = std::fs::read_dir(p.path().join("logs/quickstart/multiruns"))
        .unwrap()
        .flatten()
        .collect();
    assert_eq!(sweeps.len(), 1);
    let hydra = std::fs::read_to_string(sweeps[0].path().join("1/.hydra/hydra.yaml")).unwrap();
    assert!(hydra.contains("num: 1"), "{hydra}");
    assert!(hydra.contains("mode: MULTIRUN"), "{hydra}");
}

#[rstest]
#[case::unknown_key(&["hydra.jobb.name=x"], "Could not override 'hydra.jobb.name'")]
#[case::bad_bool(&["hydra.job.chdir=maybe"], "Value 'maybe' is not a valid bool")]
#[case::bad_mode(&["hydra.mode=SOMETIMES"], "expected one of [RUN, MULTIRUN]")]
#[case::output_subdir(&["hydra.output_subdir=null"], "trainyard keeps a run's records in `.hydra/`")]
#[case::callbacks(&["+hydra.callbacks.log._target_=my.Callback"], "Hydra callbacks are Python classes")]
#[case::cmaes(
    &["-m", "hydra/sweeper=optuna", "hydra/sweeper/sampler=cmaes", "+optimized_metric=val/loss", "optimizer.lr=interval(0.001,0.1)"],
    "is not a sampler trainyard runs"
)]
#[case::sweep_hydra(&["-m", "hydra.job.name=a,b"], "Sweeping over Hydra's configuration is not supported")]
#[case::sweep_hydra_in_a_search(
    &["-m", "hydra/sweeper=optuna", "+optimized_metric=val/loss", "optimizer.lr=interval(0.001,0.1)", "hydra.job.chdir=true,false"],
    "Sweeping over Hydra's configuration is not supported : 'hydra.job.chdir=true,false'"
)]
#[case::searchpath(&["hydra.searchpath=[pkg://my.configs]"], "only file:// paths can be searched here")]
#[case::logging_null(&["hydra.job_logging=null"], "Error merging override hydra.job_logging=null")]
fn refused_hydra_settings_say_why(#[case] args: &[&str], #[case] expected: &str) {
    let p = real_project();
    let out = run(p.path(), args);
    assert!(!out.status.success(), "{args:?} succeeded");
    let err = stderr(&out);
    assert!(err.contains(expected), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn searchpath_adds_a_directory_of_groups() {
    let p = real_project();
    let extra = tempfile::tempdir().unwrap();
    write(
        extra.path(),
        "model/tiny_extra.yaml",
        "# @package model\nname: cnn\nchannels: [2]\n",
    );
    let sp = format!("hydra.searchpath=[file://{}]", extra.path().display());
    let out = train(p.path(), &["--cfg", "job", &sp, "model=tiny_extra"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("- 2"), "{}", stdout(&out));
    let info = train(p.path(), &["--info", "searchpath", &sp]);
    assert!(
        stdout(&info).contains("provider=hydra"),
        "{}",
        stdout(&info)
    );
}

#[test]
fn hydra_values_resolve_in_the_job_config() {
    let p = real_project();
    let out = train(
        p.path(),
        &[
            "--cfg",
            "job",
            "--resolve",
            "+choice=${hydra:runtime.choices.model}",
            "+name=${hydra:job.name}",
            "+launch_mode=${hydra:mode}",
            "model=resnet18",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("choice: resnet18"), "{text}");
    assert!(text.contains("name: train"), "{text}");
    assert!(text.contains("launch_mode: RUN"), "{text}");
    let dirname = train(
        p.path(),
        &[
            "--cfg",
            "hydra",
            "model=resnet18",
            "seed=3",
            "hydra.run.dir=x",
        ],
    );
    assert!(
        stdout(&dirname).contains("override_dirname: model=resnet18,seed=3"),
        "{}",
        stdout(&dirname)
    );
    let num = train(
        p.path(),
        &["--cfg", "job", "--resolve", "+n=${hydra:job.num}"],
    );
    // A single run has no job number: `OmegaConf.select` under `${hydra:...}` reads the `???` as null.
    assert!(num.status.success(), "{}", stderr(&num));
    assert!(stdout(&num).contains("'n': null\n"), "{}", stdout(&num));
}
