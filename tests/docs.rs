//! What people read stays true to the repository: every relative link in README.md and the guide
//! (`docs/src/`) reaches a file or folder that exists, every guide page is in the book's SUMMARY.md, and
//! README stays within a screenful or two.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The guide's pages and README.
fn pages() -> Vec<PathBuf> {
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root().join("docs/src"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.push(root().join("README.md"));
    pages.sort();
    pages
}

/// The `](target)` links of a markdown text (outside code spans), with their line numbers.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let mut in_fence = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        // Drop code spans: a `](` inside backticks is text, not a link.
        let plain: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, part)| part)
            .collect();
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            found.push((n + 1, after[..end].to_string()));
            rest = &after[end..];
        }
    }
    found
}

#[test]
fn every_relative_link_reaches_a_file() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with('#') || target.starts_with("mailto:") {
                continue;
            }
            let path = target.split('#').next().unwrap();
            let resolved = page.parent().unwrap_or(Path::new(".")).join(path);
            if !resolved.exists() {
                broken.push(format!("{}:{line}: {target}", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_guide_page_is_in_the_summary() {
    let summary = std::fs::read_to_string(root().join("docs/src/SUMMARY.md")).unwrap();
    let listed: Vec<String> = links(&summary).into_iter().map(|(_, t)| t).collect();
    for page in pages() {
        let name = page.file_name().unwrap().to_string_lossy().into_owned();
        if page.parent() == Some(root().as_path()) || name == "SUMMARY.md" {
            continue;
        }
        assert!(
            listed.contains(&name),
            "docs/src/{name} is not in SUMMARY.md"
        );
    }
}

#[test]
fn readme_fits_a_screenful_or_two() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 150,
        "README.md has {lines} lines; move detail to the guide (docs/src/)"
    );
    // Its first code block is the two commands CI and a newcomer run.
    let first = readme.split("```sh").nth(1).unwrap();
    assert!(
        first.contains("cargo run --release -- experiment=quickstart"),
        "{first}"
    );
    assert!(first.contains("cargo test"), "{first}");
}

/// The guide's configuration reference is what the binary prints (`train --info schema`, generated from
/// the schema's types and doc comments): a key added, renamed or documented differently shows here.
#[test]
fn the_config_reference_is_what_the_binary_prints() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_train"))
        .args(["--info", "schema"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8(out.stdout).unwrap();
    let committed = std::fs::read_to_string(root().join("docs/src/reference.md")).unwrap();
    assert!(
        printed == committed,
        "docs/src/reference.md differs from `train --info schema`; regenerate it with\n    \
         cargo run -q -- --info schema > docs/src/reference.md"
    );
    for key in [
        "trainer.max_epochs",
        "data.batch_size",
        "callbacks.model_checkpoint.monitor",
    ] {
        assert!(
            committed.contains(&format!("| `{key}` |")),
            "no row for {key}"
        );
    }
}

/// The shell blocks of the guide and README marked runnable (```` ```sh runnable ````), each with the line
/// its fence opens on.
fn runnable_blocks() -> Vec<(String, usize, String)> {
    let mut blocks = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let mut open: Option<(usize, String)> = None;
        for (n, line) in text.lines().enumerate() {
            let fence = line.trim_start().starts_with("```");
            match (&mut open, fence) {
                (None, true) if line.trim() == "```sh runnable" => {
                    open = Some((n + 1, String::new()))
                }
                (Some(_), true) => {
                    let (at, body) = open.take().unwrap();
                    let name = page.strip_prefix(root()).unwrap().display().to_string();
                    blocks.push((name, at, body));
                }
                (Some((_, body)), false) => {
                    body.push_str(line);
                    body.push('\n');
                }
                _ => {}
            }
        }
    }
    blocks
}

/// Every runnable example works as written: run with bash (`set -euo pipefail`) in an empty folder (the
/// binary carries its configs), with this build's `train` first on PATH.
#[test]
fn the_runnable_examples_run() {
    let blocks = runnable_blocks();
    assert!(!blocks.is_empty(), "no ```sh runnable block in the guide");
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_train")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for (page, line, body) in blocks {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new("bash")
            .args(["-c", &format!("set -euo pipefail\n{body}")])
            .current_dir(dir.path())
            .env("PATH", &path)
            .env_remove("TRAIN_CONFIG_PATH")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{page}:{line}: the example failed ({}):\n{body}\n--- stdout\n{}\n--- stderr\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
