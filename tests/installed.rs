//! trainyard as an installed tool: the `train` binary copied alone into an empty folder (where this
//! process may, a mount namespace hides the repository from it) runs the quick start, a sweep and the
//! logbook on its built-in configs; `train init` makes a project that trains; a project's own file wins
//! over the built-in one of the same name, and `--info defaults` and `--help` say whose each is; every
//! subcommand answers `--help`; bad input (a missing `-cp`, `init` over a project) gets one clear error.

mod common;

use common::TRAIN;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

fn ok(out: &Output) -> String {
    let (o, e) = text(out);
    assert!(out.status.success(), "{o}\n{e}");
    o
}

/// `train` copied into `dir/bin/`, as an install puts it. `cp` writes the copy in its own process: had
/// this one written it, a process another test thread forks meanwhile would inherit the open file until its
/// exec, and running the copy then fails with "Text file busy" (ETXTBSY).
fn installed_copy(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let copy = bin.join("train");
    let status = Command::new("cp").arg(TRAIN).arg(&copy).status().unwrap();
    assert!(status.success(), "cp {TRAIN} {}", copy.display());
    copy
}

/// Runs `train args` in `cwd` with no project in the environment.
fn run(train: &Path, cwd: &Path, args: &[&str]) -> Output {
    Command::new(train)
        .args(args)
        .current_dir(cwd)
        .env_remove("TRAIN_CONFIG_PATH")
        .output()
        .unwrap()
}

/// Whether this process may hide the repository with `unshare --mount` (root, with util-linux).
fn can_hide_repository() -> bool {
    Command::new("unshare")
        .args(["--mount", "true"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs the shell `script` in `cwd`, with the repository mounted over by an empty tmpfs where this process
/// may: nothing of it (conf/, experiments/, target/) can be read then.
fn run_hidden(cwd: &Path, script: &str) -> Output {
    let repo = env!("CARGO_MANIFEST_DIR");
    if can_hide_repository() {
        let hidden = format!("mount -t tmpfs none '{repo}' && test ! -e '{repo}/conf' && {script}");
        Command::new("unshare")
            .args(["--mount", "sh", "-c", &hidden])
            .current_dir(cwd)
            .env_remove("TRAIN_CONFIG_PATH")
            .output()
            .unwrap()
    } else {
        eprintln!("(cannot unshare a mount namespace here: the repository stays visible)");
        Command::new("sh")
            .args(["-c", script])
            .current_dir(cwd)
            .env_remove("TRAIN_CONFIG_PATH")
            .output()
            .unwrap()
    }
}

const SMALL: &str = "trainer.max_epochs=1 data.train_size=256 data.val_size=64 data.batch_size=64";

#[test]
fn the_binary_alone_runs_the_quick_start_a_sweep_and_the_logbook() {
    let tmp = tempfile::tempdir().unwrap();
    let train = installed_copy(tmp.path());
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let script = format!(
        "{t} experiment=quickstart {SMALL} && {t} -m sweep=lr experiment=quickstart {SMALL} && {t} logbook",
        t = train.display()
    );
    let out = run_hidden(&work, &script);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("quickstart: completed after 1 epochs"),
        "{stdout}"
    );
    assert!(stdout.contains("0 of 4 jobs failed"), "{stdout}");
    // Said once per command (the quick start, the sweep), not by each of the sweep's jobs.
    assert_eq!(stderr.matches("No project here").count(), 2, "{stderr}");
    let runs = std::fs::read_dir(work.join("logs/quickstart/runs"))
        .unwrap()
        .count();
    assert_eq!(runs, 1);
    let logbook = std::fs::read_to_string(work.join("logs/logbook.md")).unwrap();
    assert!(logbook.contains("sweep_lr"), "{logbook}");
}

#[test]
fn train_init_makes_a_project_that_trains_and_is_never_overwritten() {
    let tmp = tempfile::tempdir().unwrap();
    let train = installed_copy(tmp.path());
    let out = run(&train, tmp.path(), &["init", "proj"]);
    let stdout = ok(&out);
    assert!(stdout.contains("conf/train.yaml"), "{stdout}");
    let proj = tmp.path().join("proj");
    let args: Vec<&str> = ["experiment=example"]
        .into_iter()
        .chain(SMALL.split(' '))
        .collect();
    let stdout = ok(&run(&train, &proj, &args));
    assert!(
        stdout.contains("example: completed after 1 epochs"),
        "{stdout}"
    );
    assert!(
        std::fs::read_dir(proj.join("logs/example/runs"))
            .unwrap()
            .count()
            == 1
    );
    // Inside the project now: a second init names what it would overwrite and writes nothing.
    let before = std::fs::read_to_string(proj.join("conf/train.yaml")).unwrap();
    let out = run(&train, &proj, &["init"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for name in [
        "conf/train.yaml",
        "experiments/example.yaml",
        "justfile",
        ".gitignore",
    ] {
        assert!(stderr.contains(name), "{stderr}");
    }
    assert!(stderr.contains("never overwrites"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(proj.join("conf/train.yaml")).unwrap(),
        before
    );
}

#[test]
fn a_project_file_wins_over_the_built_in_of_its_name() {
    let tmp = tempfile::tempdir().unwrap();
    ok(&run(Path::new(TRAIN), tmp.path(), &["init", "."]));
    std::fs::create_dir_all(tmp.path().join("conf/model")).unwrap();
    std::fs::write(
        tmp.path().join("conf/model/cnn.yaml"),
        "name: cnn\nchannels: [8]\n",
    )
    .unwrap();
    std::fs::write(
        tmp.path().join("conf/model/tiny.yaml"),
        "name: mlp\nhidden: [4]\n",
    )
    .unwrap();
    let cfg = ok(&run(
        Path::new(TRAIN),
        tmp.path(),
        &["--cfg", "job", "-p", "model"],
    ));
    assert!(cfg.contains("channels:\n  - 8\n"), "{cfg}");
    let info = ok(&run(Path::new(TRAIN), tmp.path(), &["--info", "defaults"]));
    let row = |config: &str| {
        info.lines()
            .find(|l| l.starts_with(&format!("| {config} ")))
            .unwrap_or_else(|| panic!("no {config} row in\n{info}"))
            .to_string()
    };
    assert!(row("model/cnn").ends_with("conf/model/cnn.yaml"), "{info}");
    assert!(
        row("trainer/default").ends_with("pkg://trainyard.conf/trainer/default.yaml"),
        "{info}"
    );
    let search = ok(&run(
        Path::new(TRAIN),
        tmp.path(),
        &["--info", "searchpath"],
    ));
    let main = search.find("provider=main").expect(&search);
    let shipped = search
        .find("provider=trainyard, path=pkg://trainyard.conf")
        .expect(&search);
    assert!(
        main < shipped,
        "the project's directory comes first:\n{search}"
    );
    let help = ok(&run(Path::new(TRAIN), tmp.path(), &["--help"]));
    let models = help
        .lines()
        .find(|l| l.trim_start().starts_with("model: "))
        .expect(&help);
    assert!(
        models.contains("cnn**") && models.contains("tiny*") && models.contains(" resnet18,"),
        "{models}"
    );
    // `hydra.searchpath` naming the shipped package is accepted (it is on the path already).
    let cfg = ok(&run(
        Path::new(TRAIN),
        tmp.path(),
        &[
            "--cfg",
            "job",
            "-p",
            "task_name",
            "hydra.searchpath=[pkg://trainyard.conf]",
        ],
    ));
    assert!(cfg.contains("task_name:"), "{cfg}");
}

#[test]
fn bad_config_locations_get_one_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let out = run(
        Path::new(TRAIN),
        tmp.path(),
        &["-cp", "nowhere", "--cfg", "job"],
    );
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("Primary config directory not found") && stderr.contains("nowhere"),
        "{stderr}"
    );
    assert_eq!(
        stderr.lines().filter(|l| l.starts_with("Error")).count(),
        1,
        "{stderr}"
    );
    std::fs::create_dir_all(tmp.path().join("cfgs")).unwrap();
    let out = run(
        Path::new(TRAIN),
        tmp.path(),
        &["-cp", "cfgs", "--cfg", "job"],
    );
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("Cannot find primary config 'train'"),
        "{stderr}"
    );
}

#[test]
fn every_command_answers_help() {
    let tmp = tempfile::tempdir().unwrap();
    let help = ok(&run(Path::new(TRAIN), tmp.path(), &["--help"]));
    for command in [
        "train eval",
        "train init",
        "train logbook",
        "train pack",
        "train export",
    ] {
        assert!(help.contains(command), "{command} missing from\n{help}");
    }
    for (command, says) in [
        ("eval", "Test the model of a checkpoint"),
        ("init", "Write a new project"),
        ("logbook", "markdown logbook"),
        ("pack", "WebDataset shards"),
        ("export", "load_state_dict(strict=True)"),
    ] {
        for flag in ["--help", "-h"] {
            let out = ok(&run(Path::new(TRAIN), tmp.path(), &[command, flag]));
            assert!(out.contains(says), "train {command} {flag}:\n{out}");
        }
    }
    // Nothing was run or written by asking.
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
}
