//! What the fuzzers feed untrusted text to (`fuzz/`, AFL++ through the `afl` crate), and what
//! `tests/fuzz_corpus.rs` replays their corpus through: the YAML reader, the override grammar,
//! interpolation, and a defaults-list composition over a small conf tree made from the input. Each takes
//! any bytes and must return, with a value or an error, never panic or hang.

use super::compose::RunMode;
use super::conf_files::ConfFiles;
use super::hydra::{compose_with_hydra, parse_overrides};
use super::interpolate::{resolve_all, ResolveContext};
use super::repository::{Repository, SearchRoot};
use std::path::Path;

/// The input as text (the parsers take `&str`; invalid UTF-8 is the caller's to refuse, as `train` does
/// when it reads a file).
fn text(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}

/// A resolver context that reads nothing from the process: the same input resolves the same way.
fn context() -> ResolveContext {
    ResolveContext {
        now: chrono::DateTime::parse_from_rfc3339("2026-01-02T03:04:05+00:00").expect("a date"),
        env: [("HOME".to_string(), "/home/fuzz".to_string())].into(),
        hydra: None,
    }
}

/// A YAML document, as a config file is read.
pub fn yaml(data: &[u8]) {
    if let Some(text) = text(data) {
        let _ = super::yaml::parse(text, "fuzz.yaml");
    }
}

/// Each line a command-line override (`key=value`, `+k=v`, `~k`, sweeps, functions).
pub fn overrides(data: &[u8]) {
    if let Some(text) = text(data) {
        let lines: Vec<String> = text.lines().map(String::from).collect();
        let _ = parse_overrides(&lines);
    }
}

/// A YAML document whose `${...}` interpolations are resolved (OmegaConf's semantics: keys, relative
/// keys, resolvers, nesting, cycles).
pub fn interpolation(data: &[u8]) {
    let Some(text) = text(data) else {
        return;
    };
    if let Ok(Some(node)) = super::yaml::parse(text, "fuzz.yaml") {
        let _ = resolve_all(&node, &context());
    }
}

/// The conf tree a defaults-list input describes: its parts, split at NUL bytes, are `train.yaml`,
/// `model/a.yaml`, `model/b.yaml`, `data/x.yaml`, then the overrides (a line each); composed as `train`
/// from memory (`ConfFiles::Memory`: the repository reads it as it reads a directory), with Hydra's own
/// configs around it, and resolved.
pub fn defaults(data: &[u8]) {
    let Some(text) = text(data) else {
        return;
    };
    let root = Path::new("/fuzz/conf");
    let mut parts = text.split('\0');
    let files = ["train.yaml", "model/a.yaml", "model/b.yaml", "data/x.yaml"]
        .into_iter()
        .map(|file| {
            (
                root.join(file),
                parts.next().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let lines: Vec<String> = parts
        .next()
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect();
    let Ok(overrides) = parse_overrides(&lines) else {
        return;
    };
    let repo = Repository::in_memory(
        vec![SearchRoot {
            dir: root.to_path_buf(),
            mount: String::new(),
            provider: "main".into(),
        }],
        ConfFiles::Memory(files),
    );
    if let Ok(composed) = compose_with_hydra(&repo, "train", &overrides, RunMode::Run) {
        let _ = resolve_all(&composed.config, &context());
    }
}
