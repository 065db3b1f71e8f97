//! Looking without running: `--cfg job|hydra|all` (the composed config, optionally resolved and cut to a
//! package), `--info` (search path, defaults tree and list, config), `--help`'s list of config groups, and
//! shell completion (`--shell-completion`, `--complete WORD`).

use crate::cli::{CfgKind, InfoKind, Shell};
use crate::config::compose::RunMode;
use crate::config::errors::ConfigError;
use crate::config::grammar::Override;
use crate::config::hydra::{compose_with_hydra, split_hydra};
use crate::config::interpolate::{resolve_leaving_missing, ResolveContext};
use crate::config::repository::{OptionOrigin, Repository};
use crate::config::tree::Node;
use crate::config::{defaults, yaml};
use crate::project::Setup;

/// What `--cfg` prints: which part, resolved or not, cut to a package or not.
#[derive(Debug, Clone)]
pub struct CfgPrint {
    pub kind: CfgKind,
    pub resolve: bool,
    pub package: Option<String>,
}

/// `--cfg job|hydra|all` as Hydra's `show_cfg` prints it. With `--resolve`, `ctx.hydra` is the `hydra`
/// node `${hydra:...}` reads: a placed job's (a sweep's job) or, when the caller has none, the node as
/// composed (no run directory yet: `${hydra:runtime.output_dir}` is null, as under Hydra).
pub fn print_cfg(print: &CfgPrint, full: &Node, ctx: &ResolveContext) -> Result<(), ConfigError> {
    let kind = print.kind;
    let (job, hydra) = split_hydra(full.clone());
    let mut ctx = ctx.clone();
    if ctx.hydra.is_none() {
        ctx.hydra = Some(hydra.clone());
    }
    let mut node = match kind {
        CfgKind::Job => job,
        CfgKind::Hydra => {
            let mut m = Node::empty_map();
            if let Some(map) = m.as_map_mut() {
                map.insert("hydra".into(), hydra);
            }
            m
        }
        CfgKind::All => full.clone(),
    };
    if print.resolve {
        node = resolve_leaving_missing(&node, &ctx)?;
    }
    if let Some(key) = &print.package {
        node = node.get(key).cloned().ok_or_else(|| {
            ConfigError::composition(format!("--package: no key '{key}' in the composed config"))
        })?;
        let mut wrapped = Node::empty_map();
        if let Some(map) = wrapped.as_map_mut() {
            map.insert(key.clone(), node);
        }
        node = wrapped;
    }
    print!("{}", yaml::to_yaml(&node));
    Ok(())
}

pub fn print_info(
    setup: &Setup,
    overrides: &[Override],
    kind: InfoKind,
    multirun: bool,
) -> Result<(), ConfigError> {
    let all = kind == InfoKind::All;
    if all || kind == InfoKind::Searchpath {
        println!(
            "Config search path\n------------------\n{}\n",
            setup.repo.describe()
        );
    }
    let mode = if multirun {
        RunMode::Multirun
    } else {
        RunMode::Run
    };
    let composed = compose_with_hydra(&setup.repo, &setup.config_name, overrides, mode)?;
    if all || kind == InfoKind::DefaultsTree {
        println!(
            "Defaults Tree\n-------------\n{}",
            defaults::render_tree(&composed.defaults.tree)
        );
    }
    if all || kind == InfoKind::Defaults {
        println!("Defaults List\n-------------");
        // Hydra's three columns, and the file each config was read from: a project's own file, or a
        // built-in one (`pkg://...`) where the project has none of that name.
        println!(
            "| {:<40} | {:<24} | {:<24} | Source",
            "Config path", "Package", "Parent"
        );
        for d in &composed.defaults.defaults {
            let source = match setup.repo.load(&d.config_path) {
                Ok(Some(loaded)) => crate::config::repository::display_path(&loaded.file),
                _ => String::new(),
            };
            println!(
                "| {:<40} | {:<24} | {:<24} | {source}",
                d.config_path,
                d.package,
                d.parent.clone().unwrap_or_default()
            );
        }
        println!();
    }
    if all || kind == InfoKind::Config {
        let (job, _) = split_hydra(composed.config);
        println!("Config\n------\n{}", yaml::to_yaml(&job));
    }
    Ok(())
}

/// One line per group, `  group: a, b*, c**` (`*` the user's own option, `**` the user's in place of a
/// built-in); whether any option was marked.
fn list_options(repo: &Repository, groups: &[String], out: &mut String) -> bool {
    let mut marked = false;
    for g in groups {
        let options: Vec<String> = repo
            .group_option_origins(g)
            .into_iter()
            .filter(|(o, _)| !(g == "hydra" && o == "config"))
            .map(|(o, origin)| {
                let mark = match origin {
                    OptionOrigin::Builtin => "",
                    OptionOrigin::User => "*",
                    OptionOrigin::UserShadowing => "**",
                };
                marked |= !mark.is_empty();
                format!("{o}{mark}")
            })
            .collect();
        if !options.is_empty() {
            out.push_str(&format!("  {g}: {}\n", options.join(", ")));
        }
    }
    marked
}

/// The `--help` footer: every config group and its options.
/// `plugins`: what runs a sweep here (the sweepers' and launchers' names, from their registries; the app
/// passes them, as nothing that runs is named here).
pub fn groups_help(repo: &Repository, plugins: &[(&str, &str, Vec<&str>)]) -> String {
    let mut out = String::new();
    let mut stack: Vec<String> = repo.list_groups("");
    stack.sort();
    let mut groups = Vec::new();
    while let Some(g) = stack.pop() {
        for sub in repo.list_groups(&g) {
            stack.push(format!("{g}/{sub}"));
        }
        groups.push(g);
    }
    groups.sort();
    // As Hydra's help does: the application's groups, then Hydra's own (`hydra/...`; `hydra/config` is
    // Hydra's node itself, not a choice).
    let (hydra, app): (Vec<String>, Vec<String>) = groups
        .into_iter()
        .partition(|g| g == "hydra" || g.starts_with("hydra/"));
    let mut apps = String::new();
    let marked = list_options(repo, &app, &mut apps);
    out.push_str("Config groups (override with GROUP=OPTION");
    out.push_str(if marked {
        "; * this project's own, ** this project's in place of the built-in of that name, \
         the others built into trainyard):\n"
    } else {
        "):\n"
    });
    out.push_str(&apps);
    out.push_str("\nHydra's own groups (override with hydra/GROUP=OPTION, or `override hydra/GROUP: OPTION`):\n");
    list_options(repo, &hydra, &mut out);
    let registered = [
        ("Models", "model", crate::registry::model_targets()),
        ("Datasets", "data", crate::registry::dataset_targets()),
        ("Losses", "loss", crate::registry::loss_targets()),
        (
            "Optimizers",
            "optimizer",
            crate::registry::optimizer_targets(),
        ),
        (
            "Schedules",
            "scheduler",
            crate::registry::schedule_targets(),
        ),
        (
            "Loggers",
            "logger.<name>",
            crate::registry::logger_targets(),
        ),
        (
            "Callbacks",
            "callbacks.<name>",
            crate::registry::callback_targets(),
        ),
    ];
    for (what, key, names) in registered {
        if !names.is_empty() {
            out.push_str(&format!(
                "\n{what} this program registered ({key}: {{_target_: NAME, ...}}): {}\n",
                names.join(", ")
            ));
        }
    }
    for (what, group, names) in plugins {
        out.push_str(&format!(
            "\n{what} this program runs ({group}=NAME): {}",
            names.join(", ")
        ));
    }
    out.push_str("\n\nPrint the composed config with --cfg job; sweep with -m key=a,b.");
    out
}

/// Candidates for the word being completed: `group=`, `group=option`, `key.path=`.
pub fn complete(setup: &Setup, word: &str) -> Vec<String> {
    let prefix: String = word
        .chars()
        .take_while(|c| matches!(c, '+' | '~'))
        .collect();
    let body = &word[prefix.len()..];
    if let Some((key, partial)) = body.split_once('=') {
        if setup.repo.group_exists(key) {
            return setup
                .repo
                .group_options(key)
                .into_iter()
                .filter(|o| o.starts_with(partial))
                .map(|o| format!("{prefix}{key}={o}"))
                .collect();
        }
        return Vec::new();
    }
    let mut out: Vec<String> = Vec::new();
    let mut groups = setup.repo.list_groups("");
    groups.sort();
    for g in groups {
        out.push(format!("{prefix}{g}="));
    }
    if let Ok(composed) =
        compose_with_hydra(&setup.repo, &setup.config_name, &[], RunMode::Multirun)
    {
        let (job, _) = split_hydra(composed.config);
        for p in job.all_paths() {
            out.push(format!("{prefix}{p}="));
        }
    }
    out.retain(|c| c.starts_with(word));
    out.sort();
    out.dedup();
    out
}

pub fn completion_script(shell: Shell) -> String {
    match shell {
        Shell::Bash => r#"# bash completion for train: eval "$(train --shell-completion bash)"
_train_complete() {
    local cur="${COMP_WORDS[COMP_CWORD]}"
    COMPREPLY=($(train --complete "$cur" 2>/dev/null))
    compopt -o nospace 2>/dev/null
}
complete -F _train_complete train
"#
        .into(),
        Shell::Zsh => r#"# zsh completion for train: eval "$(train --shell-completion zsh)"
_train() {
    local -a candidates
    candidates=(${(f)"$(train --complete "${words[CURRENT]}" 2>/dev/null)"})
    compadd -S '' -- $candidates
}
compdef _train train
"#
        .into(),
        Shell::Fish => r#"# fish completion for train: train --shell-completion fish | source
complete -c train -f -a '(train --complete (commandline -ct) 2>/dev/null)'
"#
        .into(),
    }
}
