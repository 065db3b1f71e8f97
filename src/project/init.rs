//! `train init [DIR] [--crate]`: a new project on top of trainyard's shipped groups. A primary config
//! (`conf/train.yaml`, whose defaults name the built-in groups), one experiment, a `justfile` with the
//! train/sweep/logbook recipes, a `.gitignore` and a short README; with `--crate`, a Cargo package as
//! well, whose `main` is trainyard's `train` with the crate's own model registered (the own-model page's
//! layout). Nothing is downloaded, and no existing file is overwritten: every file it would write is
//! checked first, and any that exists stops it, naming them all.

use super::shipped::shipped;
use anyhow::Context;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// `train init`'s command line.
#[derive(Debug, clap::Parser)]
#[command(
    name = "train init",
    about = "Write a new project in DIR (default: the current directory): conf/train.yaml on top of \
             trainyard's built-in groups, an experiment, a justfile, .gitignore and a README; with --crate \
             also a Cargo package with a registered model of its own. Never overwrites a file.",
    max_term_width = 110
)]
pub struct InitCli {
    /// The project's folder (created if missing).
    #[arg(value_name = "DIR", default_value = ".")]
    pub dir: PathBuf,

    /// Also write a Cargo package (Cargo.toml, src/main.rs, src/model.rs, build.rs) whose `train` has a
    /// model of this project's own registered, the default of its `model` group.
    #[arg(long = "crate")]
    pub with_crate: bool,

    /// The project's name (task name, package name). Default: the folder's name.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,

    /// With --crate: depend on trainyard at this path instead of the released version (a clone of its
    /// repository, for working against unreleased changes).
    #[arg(long = "trainyard-path", value_name = "PATH")]
    pub trainyard_path: Option<PathBuf>,
}

/// `train init ...` (the arguments after `init`).
pub fn run(args: &[OsString]) -> anyhow::Result<ExitCode> {
    use clap::Parser;
    let cli = match InitCli::try_parse_from(
        std::iter::once(OsString::from("train init")).chain(args.iter().cloned()),
    ) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return Ok(ExitCode::from(if e.use_stderr() { 2 } else { 0 }));
        }
    };
    let written = init(&cli)?;
    let dir = &cli.dir;
    println!("Wrote a new project in {}:", dir.display());
    for file in &written {
        println!("  {}", file.display());
    }
    let cd = if dir == Path::new(".") {
        String::new()
    } else {
        format!("cd {} && ", dir.display())
    };
    if cli.with_crate {
        println!("Train it: {cd}cargo run --release -- experiment=example");
    } else {
        println!("Train it: {cd}train experiment=example");
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes the project's files; returns their paths relative to its folder.
pub fn init(cli: &InitCli) -> anyhow::Result<Vec<PathBuf>> {
    let name = match &cli.name {
        Some(n) => n.clone(),
        None => folder_name(&cli.dir)?,
    };
    let files = project_files(&name, cli)?;
    let existing: Vec<String> = files
        .iter()
        .filter(|(rel, _)| cli.dir.join(rel).exists())
        .map(|(rel, _)| rel.display().to_string())
        .collect();
    if !existing.is_empty() {
        anyhow::bail!(
            "train init: {} already exist{} in {}: {}\n    train init never overwrites a file; pick an \
             empty folder (`train init NEW_DIR`), or move these away first",
            if existing.len() == 1 { "a file it would write" } else { "files it would write" },
            if existing.len() == 1 { "s" } else { "" },
            cli.dir.display(),
            existing.join(", ")
        );
    }
    let mut written = Vec::with_capacity(files.len());
    for (rel, text) in files {
        let path = cli.dir.join(&rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("train init: could not create {}", parent.display()))?;
        }
        crate::storage::records::write_atomic(&path, text.as_bytes())
            .with_context(|| format!("train init: could not write {}", path.display()))?;
        written.push(rel);
    }
    Ok(written)
}

/// The folder's own name, as a project name (`.` is the current directory's).
fn folder_name(dir: &Path) -> anyhow::Result<String> {
    let abs = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        std::env::current_dir()?.join(dir)
    };
    let name = abs
        .components()
        .rev()
        .find_map(|c| match c {
            std::path::Component::Normal(n) => Some(n.to_string_lossy().to_string()),
            _ => None,
        })
        .unwrap_or_else(|| "project".into());
    Ok(name)
}

/// `name` as a Cargo package and Rust path segment: lower case, `_` for anything else.
fn crate_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    if !out.starts_with(|c: char| c.is_ascii_alphabetic()) {
        out.insert_str(0, "p_");
    }
    out
}

/// Every file of the project: its path relative to the folder, and its text.
fn project_files(name: &str, cli: &InitCli) -> anyhow::Result<Vec<(PathBuf, String)>> {
    let krate = crate_name(name);
    let model = if cli.with_crate { "net" } else { "cnn" };
    let mut files = vec![
        ("conf/train.yaml".into(), primary_config(&krate, model)?),
        ("experiments/example.yaml".into(), experiment(model)),
        ("justfile".into(), justfile(cli.with_crate)),
        (".gitignore".into(), gitignore(cli.with_crate)),
        ("README.md".into(), readme(name, cli.with_crate)),
    ];
    if cli.with_crate {
        let dependency = match &cli.trainyard_path {
            Some(p) => {
                let abs = std::fs::canonicalize(p)
                    .with_context(|| format!("--trainyard-path {}: no such folder", p.display()))?;
                anyhow::ensure!(
                    abs.join("Cargo.toml").is_file(),
                    "--trainyard-path {}: no Cargo.toml there (it names a clone of trainyard's repository)",
                    p.display()
                );
                format!("{{ path = {:?} }}", abs.display().to_string())
            }
            None => format!("{:?}", env!("CARGO_PKG_VERSION")),
        };
        files.extend([
            ("Cargo.toml".into(), cargo_toml(&krate, &dependency)),
            ("build.rs".into(), BUILD_RS.to_string()),
            ("src/main.rs".into(), main_rs(name)),
            ("src/model.rs".into(), model_rs(&krate)),
            ("conf/model/net.yaml".into(), model_yaml(&krate)),
        ]);
    }
    Ok(files)
}

/// The shipped primary config with this project's task name and model, and a header saying where the
/// groups come from.
fn primary_config(krate: &str, model: &str) -> anyhow::Result<String> {
    let shipped = shipped("train").context("the shipped primary config is missing")?;
    let body: String = shipped
        .text
        .lines()
        .skip_while(|l| l.starts_with('#'))
        .map(|l| match l {
            "task_name: train" => format!("task_name: {krate}"),
            "  - model: cnn" => format!("  - model: {model}"),
            other => other.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    Ok(format!(
        "# Every run starts here. The groups below are trainyard's built-in ones (`train --help` lists \
         them,\n# `train --info searchpath` shows where they come from); a file of this project's \
         conf/<group>/<option>.yaml\n# adds an option, or replaces the built-in one of the same name. \
         Experiments live in experiments/.\n{body}\n"
    ))
}

fn experiment(model: &str) -> String {
    let model_keys = if model == "cnn" {
        "model:\n  channels: [16, 32, 64]\n"
    } else {
        ""
    };
    format!(
        "# @package _global_\n\
         # `train experiment=example`: a small {model} on generated images, on the CPU, in seconds. Copy \
         this file\n# to start another experiment; point `data` at your own (`data=cifar10 \
         data.root=...`, `train --help`).\n\
         defaults:\n  - override /model: {model}\n  - override /data: synthetic\n  - override /optimizer: adam\n  \
         - override /scheduler: onecycle\n\n\
         task_name: example\ntags: [example]\n{model_keys}\
         data:\n  batch_size: 64\n  train_size: 2048\n  val_size: 512\n\
         optimizer:\n  lr: 0.003\n\
         trainer:\n  accelerator: cpu\n  max_epochs: 2\n"
    )
}

fn justfile(with_crate: bool) -> String {
    let train = if with_crate {
        "cargo run --release --quiet --"
    } else {
        "train"
    };
    format!(
        "# Everyday commands (`just --list`). `train` is trainyard's binary{}.\n\n\
         # Train with overrides: `just train experiment=example trainer.max_epochs=5`\n\
         train *ARGS:\n    {train} {{{{ARGS}}}}\n\n\
         # A named sweep of the `sweep` group (trainyard's lr and batch_size, or conf/sweep/NAME.yaml): `just sweep lr`\n\
         sweep NAME *ARGS:\n    {train} -m sweep={{{{NAME}}}} {{{{ARGS}}}}\n\n\
         # logs/logbook.md: the runs compared, plots, sweep sections\n\
         logbook *ARGS:\n    {train} logbook {{{{ARGS}}}}\n",
        if with_crate {
            ", built from this crate"
        } else {
            " (pip install trainyard, or cargo install trainyard)"
        }
    )
}

fn gitignore(with_crate: bool) -> String {
    let mut out = String::from("# Run outputs: checkpoints, logs, metrics, the logbook.\nlogs/\n");
    if with_crate {
        out.push_str("target/\n");
    }
    out
}

fn readme(name: &str, with_crate: bool) -> String {
    let run = if with_crate {
        "cargo run --release -- experiment=example"
    } else {
        "train experiment=example"
    };
    format!(
        "# {name}\n\nExperiments declared in YAML and run by trainyard's \
         `train`.\n\n```sh\n{run}          # train the example experiment\n\
         just sweep lr                          # a sweep over learning rates\n\
         just logbook                           # logs/logbook.md: every run compared\n```\n\n\
         - `conf/train.yaml`: the primary config; its defaults name trainyard's built-in groups (`train --help` \
         lists them with this project's own).\n\
         - `experiments/`: one file per experiment (`experiment=NAME`).\n\
         - `logs/`: what runs write (not versioned).\n{}",
        if with_crate {
            "- `src/model.rs`: this project's own network, registered under the `_target_` of \
             `conf/model/net.yaml`.\n"
        } else {
            ""
        }
    )
}

fn cargo_toml(krate: &str, dependency: &str) -> String {
    format!(
        "[package]\nname = \"{krate}\"\nversion = \"0.1.0\"\nedition = \"2021\"\npublish = false\n\n\
         # `cargo run --release -- OVERRIDES` is `train` with this crate's model registered.\n\
         [[bin]]\nname = \"train\"\npath = \"src/main.rs\"\n\n\
         [dependencies]\ntrainyard = {dependency}\ncandle-core = \"0.11\"\ncandle-nn = \"0.11\"\n\
         serde = {{ version = \"1\", features = [\"derive\"] }}\nanyhow = \"1\"\n\n\
         [features]\n# libtorch's backend (`backend=tch`) and c10d's collectives (`trainer=ddp`).\n\
         torch = [\"trainyard/torch\"]\n\n\
         # Dependencies optimised in debug builds too: tests train small models.\n\
         [profile.dev.package.\"*\"]\nopt-level = 3\n"
    )
}

/// Links libtorch's folder into the binary (`--features torch`), as trainyard's own build does.
const BUILD_RS: &str = "//! With `--features torch`: an rpath to libtorch's `lib/` (`LIBTORCH=<dir>`, as trainyard's build finds \
it),\n//! so this crate's `train` runs without LD_LIBRARY_PATH.\nfn main() {\n    \
println!(\"cargo:rerun-if-env-changed=LIBTORCH\");\n    \
if std::env::var_os(\"CARGO_FEATURE_TORCH\").is_none() {\n        return;\n    }\n    \
if let Ok(dir) = std::env::var(\"LIBTORCH\") {\n        \
println!(\"cargo:rustc-link-arg=-Wl,-rpath,{}/lib\", dir);\n    }\n}\n";

fn main_rs(name: &str) -> String {
    format!(
        "//! {name}: trainyard's whole `train` command line, with this crate's own model registered \
         (src/model.rs).\n\nmod model;\n\ntrainyard::main!();\n"
    )
}

fn model_rs(krate: &str) -> String {
    format!(
        r#"//! This project's own network, built by the constructor registered under the `_target_` that
//! conf/model/net.yaml names; the node's other keys are its arguments (`NetArgs`: a key it does not take
//! is an error naming the file and line).

use candle_core::{{Result, Tensor, D}};
use candle_nn::{{Conv2d, Conv2dConfig, Linear, Module, VarBuilder}};
use trainyard::registry::{{CandleModel, ModelContext}};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NetArgs {{
    /// Channels of the convolution.
    width: usize,
}}

/// conv-relu, global average pooling, a linear head.
struct Net {{
    conv: Conv2d,
    head: Linear,
}}

fn net(args: NetArgs, vb: VarBuilder, ctx: &ModelContext) -> anyhow::Result<Net> {{
    let same = Conv2dConfig {{
        padding: 1,
        ..Default::default()
    }};
    Ok(Net {{
        conv: candle_nn::conv2d(ctx.channels, args.width, 3, same, vb.pp("conv"))?,
        head: candle_nn::linear(args.width, ctx.num_classes, vb.pp("head"))?,
    }})
}}

impl CandleModel for Net {{
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {{
        let h = self.conv.forward(x)?.relu()?;
        self.head.forward(&h.mean(D::Minus1)?.mean(D::Minus1)?)
    }}
}}

trainyard::register_candle_model!("{krate}.models.Net", net);
"#
    )
}

fn model_yaml(krate: &str) -> String {
    format!(
        "# This project's network (src/model.rs), built by the constructor registered under this \
         _target_;\n# the other keys are its arguments.\n_target_: {krate}.models.Net\nwidth: 16\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(dir: &Path, with_crate: bool) -> InitCli {
        InitCli {
            dir: dir.to_path_buf(),
            with_crate,
            name: None,
            trainyard_path: None,
        }
    }

    #[test]
    fn writes_a_project_and_refuses_to_overwrite_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("My Project");
        let written = init(&cli(&dir, false)).unwrap();
        assert_eq!(written.len(), 5);
        let primary = std::fs::read_to_string(dir.join("conf/train.yaml")).unwrap();
        assert!(primary.contains("task_name: my_project"), "{primary}");
        assert!(primary.contains("  - trainer: default"), "{primary}");
        assert_eq!(
            std::fs::read_to_string(dir.join(".gitignore")).unwrap(),
            "# Run outputs: checkpoints, logs, metrics, the logbook.\nlogs/\n"
        );
        let err = init(&cli(&dir, true)).unwrap_err().to_string();
        for name in ["conf/train.yaml", "justfile", "README.md", ".gitignore"] {
            assert!(err.contains(name), "{err}");
        }
        // Nothing of the crate was written: the check comes first.
        assert!(!dir.join("Cargo.toml").exists());
    }

    #[test]
    fn a_crate_names_its_model_after_the_package() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("9lives");
        init(&cli(&dir, true)).unwrap();
        let model = std::fs::read_to_string(dir.join("conf/model/net.yaml")).unwrap();
        assert!(model.contains("_target_: p_9lives.models.Net"), "{model}");
        let cargo = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        assert!(cargo.contains("name = \"p_9lives\""), "{cargo}");
        assert!(
            cargo.contains(&format!("trainyard = \"{}\"", env!("CARGO_PKG_VERSION"))),
            "{cargo}"
        );
        let primary = std::fs::read_to_string(dir.join("conf/train.yaml")).unwrap();
        assert!(primary.contains("  - model: net"), "{primary}");
    }
}
