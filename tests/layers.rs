//! The layering of `src/`, checked: each layer uses the ones below it and never names the ones that
//! drive it (`docs/src/source-map.md`). A `use crate::…` or `crate::…::` path to a layer above is an
//! error naming the file and line, so an import circle cannot come back unnoticed.

use std::path::{Path, PathBuf};

/// (files under this path, the modules they must not name, why).
const RULES: &[(&str, &[&str], &str)] = &[
    (
        "src/tensor",
        &[
            "comm", "model", "optim", "backend", "strategy", "plan", "trainer", "job", "launch", "sweep",
            "config", "schema", "data",
        ],
        "the bottom layer: tensors only",
    ),
    (
        "src/comm",
        &[
            "model", "optim", "backend", "strategy", "plan", "trainer", "job", "launch", "sweep",
        ],
        "the communication layer names neither engines nor strategies",
    ),
    (
        "src/model",
        &["comm", "backend", "strategy", "plan", "trainer", "job", "launch", "sweep"],
        "the model zoo is described once, below every backend",
    ),
    (
        "src/optim",
        &["comm", "backend", "strategy", "plan", "trainer", "job", "launch", "sweep"],
        "the optimizer rules are below every backend",
    ),
    (
        "src/backend",
        &[
            "strategy",
            "plan",
            "trainer",
            "job", "launch", "sweep",
            "app",
            "introspect",
        ],
        "an engine never names a strategy (or what drives strategies)",
    ),
    (
        "src/backend/candle",
        &["backend::torch"],
        "the backends never import each other",
    ),
    (
        "src/backend/torch",
        &["backend::candle"],
        "the backends never import each other",
    ),
    (
        "src/strategy",
        &["plan::LoopPlan", "trainer", "job", "launch", "sweep", "app", "introspect"],
        "a strategy never names the loop that drives it",
    ),
    (
        "src/plan.rs",
        &["strategy", "trainer", "job", "launch", "sweep", "app"],
        "the plan is made before anything runs",
    ),
    (
        "src/trainer",
        &["job", "launch", "sweep", "app", "introspect"],
        "the loop never names the launcher that starts it",
    ),
    (
        "src/metrics",
        &[
            "comm", "model", "optim", "backend", "strategy", "plan", "trainer", "job", "launch",
            "sweep", "data", "schema", "config", "app",
        ],
        "metrics are pure: host arrays in, values out; the trainer combines their states over the ranks",
    ),
    (
        "src/registry",
        &[
            "tensor", "comm", "model", "optim", "backend", "strategy", "plan", "trainer",
            "job", "launch", "sweep", "data", "schema", "config", "app",
        ],
        "the registry only maps names to a crate's constructors: everything reads it, it reads nothing",
    ),
    (
        "src/search",
        &[
            "tensor", "comm", "model", "optim", "backend", "strategy", "plan", "trainer",
            "job", "launch", "sweep", "data", "schema", "config",
        ],
        "the search engine (samplers, study, pruner) is pure: the sweeper drives it",
    ),
    (
        "src/sweep",
        &["app", "introspect"],
        "a sweeper never names the app that drives it, nor the printing beside it",
    ),
    (
        "src/launch",
        &["sweep", "app", "introspect"],
        "a launcher runs what a sweeper chose and never names the sweeper",
    ),
    (
        "src/job",
        &["launch", "sweep", "app", "introspect"],
        "a job runs the same whichever sweeper chose it and whichever launcher started it",
    ),
    (
        "src/introspect.rs",
        &["job", "launch", "sweep", "app"],
        "looking without running names nothing that runs",
    ),
    (
        "src/storage",
        &["strategy", "plan", "trainer", "job", "launch", "sweep", "app", "introspect"],
        "a run's records and checkpoints are written by the layers above; storage names none of them",
    ),
    (
        "src/platform",
        &[
            "strategy", "plan", "trainer", "job", "launch", "sweep", "app", "introspect", "storage",
        ],
        "the platform (devices, memory, randomness, signals) is below everything that runs",
    ),
    (
        "src/config",
        &[
            "tensor", "comm", "model", "optim", "backend", "strategy", "plan", "trainer",
            "job", "launch", "sweep", "data", "schema",
        ],
        "the config engine knows nothing of machine learning",
    ),
];

fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_file() {
        out.push(path.to_path_buf());
        return;
    }
    for entry in std::fs::read_dir(path).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The lines of `text` that name `crate::<module>` (in a `use` or a path).
fn naming(text: &str, module: &str) -> Vec<(usize, String)> {
    let needle = format!("crate::{module}");
    text.lines()
        .enumerate()
        .filter(|(_, line)| {
            let code = line.split("//").next().unwrap_or("");
            code.match_indices(&needle).any(|(at, _)| {
                let next = code[at + needle.len()..].chars().next();
                !next.is_some_and(|c| c.is_alphanumeric() || c == '_')
            })
        })
        .map(|(n, line)| (n + 1, line.trim().to_string()))
        .collect()
}

#[test]
fn no_layer_names_the_layers_above_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut problems = Vec::new();
    let mut checked = 0;
    for (under, forbidden, why) in RULES {
        let mut files = Vec::new();
        rust_files(&root.join(under), &mut files);
        assert!(!files.is_empty(), "{under}: no source files");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            checked += 1;
            for module in *forbidden {
                for (line, code) in naming(&text, module) {
                    problems.push(format!(
                        "{}:{line}: names crate::{module} ({why}): {code}",
                        file.strip_prefix(root).unwrap().display()
                    ));
                }
            }
        }
    }
    assert!(checked > 40, "only {checked} files checked");
    assert!(
        problems.is_empty(),
        "layering broken:\n{}",
        problems.join("\n")
    );
}

/// The check itself finds what it must: a path to a forbidden module, not a longer name or a comment.
#[test]
fn the_check_sees_paths_not_prefixes_or_comments() {
    let text =
        "use crate::strategy::Ranks;\n// crate::strategy in a comment\nuse crate::strategyx;\n";
    assert_eq!(naming(text, "strategy").len(), 1);
    assert_eq!(naming("let x = crate::trainer::fit();", "trainer")[0].0, 1);
}

/// `app` turns the command line into plans once; nothing below it reads the parsed command line itself.
#[test]
fn nothing_below_app_reads_the_command_line() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    let mut found = Vec::new();
    for file in files {
        let name = file.strip_prefix(root).unwrap().display().to_string();
        if ["src/app.rs", "src/cli.rs", "src/main.rs"].contains(&name.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if code
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .any(|word| word == "Cli")
            {
                found.push(format!("{name}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "cli::Cli below app:\n{}",
        found.join("\n")
    );
}

/// Every `src/` module path (`job::run`, `config::defaults`) and its file.
fn modules(root: &Path) -> Vec<(String, PathBuf)> {
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    files
        .into_iter()
        .filter_map(|f| {
            let rel = f.strip_prefix(root.join("src")).ok()?.with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if parts.last().is_some_and(|p| p == "mod") {
                parts.pop();
            }
            let path = parts.join("::");
            (!["lib", "main"].contains(&path.as_str())).then_some((path, f))
        })
        .collect()
}

/// The modules a file's code (tests and comments aside) names, through `crate::` and `super::` paths,
/// resolved to the longest known module; its own ancestors and descendants left out.
fn named_modules(
    module: &str,
    text: &str,
    known: &std::collections::HashSet<String>,
) -> Vec<String> {
    let code: String = text
        .split("#[cfg(test)]")
        .next()
        .unwrap_or("")
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let parent: Vec<&str> = module.split("::").collect();
    let parent = &parent[..parent.len().saturating_sub(1)];
    let mut out = Vec::new();
    for (prefix, base) in [("crate::", Vec::new()), ("super::", parent.to_vec())] {
        for (at, _) in code.match_indices(prefix) {
            if code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let rest = &code[at + prefix.len()..];
            let path: Vec<&str> = rest
                .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .next()
                .unwrap_or("")
                .split("::")
                .filter(|p| !p.is_empty())
                .collect();
            let full: Vec<&str> = base.iter().copied().chain(path).collect();
            let target = (1..=full.len())
                .rev()
                .map(|k| full[..k].join("::"))
                .find(|m| known.contains(m));
            if let Some(target) = target {
                let related = target == module
                    || module.starts_with(&format!("{target}::"))
                    || target.starts_with(&format!("{module}::"));
                if !related {
                    out.push(target);
                }
            }
        }
    }
    out
}

/// No import circle among `src/`'s modules: a module never names one that names it back, directly or
/// through others (a module and its own submodules aside).
#[test]
fn no_import_circles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mods = modules(root);
    let known: std::collections::HashSet<String> = mods.iter().map(|(m, _)| m.clone()).collect();
    let mut edges: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    for (module, file) in &mods {
        let text = std::fs::read_to_string(file).unwrap();
        edges
            .entry(module.clone())
            .or_default()
            .extend(named_modules(module, &text, &known));
    }
    // A circle: a module reachable from one it names.
    let reaches = |from: &str, to: &str| -> bool {
        let mut seen = std::collections::HashSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(m) = todo.pop() {
            if m == to {
                return true;
            }
            if seen.insert(m.clone()) {
                todo.extend(edges.get(&m).into_iter().flatten().cloned());
            }
        }
        false
    };
    let mut circles = Vec::new();
    for (module, named) in &edges {
        for other in named {
            if reaches(other, module) {
                circles.push(format!("{module} -> {other} -> ... -> {module}"));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
    assert!(edges.len() > 100, "only {} modules read", edges.len());
}

/// The source map (`docs/src/source-map.md`) has a row for every module at the top of `src/`, so a new
/// folder cannot appear without a line saying what it owns, and a moved one cannot leave a stale row.
#[test]
fn the_source_map_matches_the_tree() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let map = std::fs::read_to_string(root.join("docs/src/source-map.md")).unwrap();
    let rows: Vec<String> = map
        .lines()
        .filter(|l| l.starts_with("| `"))
        .flat_map(|l| {
            let first = l.split(" | ").next().unwrap_or("");
            first
                .split('`')
                .skip(1)
                .step_by(2)
                .map(|name| {
                    name.trim_end_matches('/')
                        .trim_end_matches(".rs")
                        .to_string()
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let mut tree = Vec::new();
    for entry in std::fs::read_dir(root.join("src")).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let module = name.trim_end_matches(".rs").to_string();
        if !["lib", "testing"].contains(&module.as_str()) && !tree.contains(&module) {
            tree.push(module);
        }
    }
    let missing: Vec<&String> = tree.iter().filter(|m| !rows.contains(m)).collect();
    let stale: Vec<&String> = rows.iter().filter(|r| !tree.contains(r)).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "source map: no row for {missing:?}; rows for modules that are gone: {stale:?}"
    );
}
