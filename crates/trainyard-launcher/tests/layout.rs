//! The launcher in the layouts pip installs it into: `<prefix>/bin/train` with trainyard's build in
//! `<prefix>/lib/python3.X/site-packages/trainyard_torch/libexec/train` (here a script that prints what it
//! was given), beside a `torch` of the right release, of another one, or in another site-packages.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const LAUNCHER: &str = env!("CARGO_BIN_EXE_train");

/// A prefix with the launcher in `bin/` and the package in `lib/python3.11/site-packages`.
fn prefix(root: &Path) -> PathBuf {
    let site = root.join("lib/python3.11/site-packages");
    let libexec = site.join("trainyard_torch/libexec");
    std::fs::create_dir_all(&libexec).unwrap();
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::copy(LAUNCHER, root.join("bin/train")).unwrap();
    let program = libexec.join("train");
    std::fs::write(
        &program,
        "#!/bin/sh\necho \"ran: $*\"\necho \"LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}\"\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    site
}

fn torch(site: &Path, version: &str) {
    std::fs::create_dir_all(site.join("torch/lib")).unwrap();
    std::fs::create_dir_all(site.join(format!("torch-{version}.dist-info"))).unwrap();
}

fn run(root: &Path, args: &[&str]) -> Output {
    Command::new(root.join("bin/train"))
        .args(args)
        .env_remove("LD_LIBRARY_PATH")
        // No python3 to ask: only what is on disk counts.
        .env("PATH", "/nonexistent")
        .output()
        .unwrap()
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn the_right_torch_beside_it_runs_the_program_with_the_arguments() {
    let tmp = tempfile::tempdir().unwrap();
    let site = prefix(tmp.path());
    torch(&site, "2.11.0");
    let out = run(tmp.path(), &["experiment=quickstart", "backend=tch"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("ran: experiment=quickstart backend=tch"),
        "{stdout}"
    );
    // Found through the program's RUNPATH: nothing is set for the loader.
    assert!(stdout.contains("LD_LIBRARY_PATH=\n"), "{stdout}");
}

#[test]
fn another_torch_release_is_refused_naming_both_versions() {
    let tmp = tempfile::tempdir().unwrap();
    let site = prefix(tmp.path());
    torch(&site, "2.10.0");
    let out = run(tmp.path(), &["experiment=quickstart"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stdout.is_empty(), "the program must not run: {stdout}");
    assert!(
        stderr.contains("built against PyTorch 2.11")
            && stderr.contains("has torch 2.10.0")
            && stderr.contains("pip install torch==2.11.*"),
        "{stderr}"
    );
}

#[test]
fn no_torch_is_one_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    prefix(tmp.path());
    let out = run(tmp.path(), &[]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("not installed in this environment") && stderr.contains("torch==2.11.*"),
        "{stderr}"
    );
}

#[test]
fn torch_in_another_site_packages_is_named_to_the_loader() {
    let tmp = tempfile::tempdir().unwrap();
    prefix(tmp.path());
    // A second interpreter's folder of the same prefix holds torch (as a system torch beside a user install).
    let other = tmp.path().join("lib/python3.12/site-packages");
    torch(&other, "2.11.0+cpu");
    let out = run(tmp.path(), &["-m", "a=1,2"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("ran: -m a=1,2"), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "LD_LIBRARY_PATH={}",
            other.join("torch/lib").display()
        )),
        "{stdout}"
    );
}
