//! The defaults list: which config files make up the composed config, in which order, under which package.
//! A faithful port of Hydra 1.3's `defaults_list.py`: the list is resolved into a tree (overrides from the
//! command line first, `override` entries of nested configs next), then flattened depth-first.

//!
//! Split as Hydra's code is: `element` (the entries, `default_element.py`), `overrides` (command-line and
//! `override` choices), `walker` (building the tree); this file the tree, its flattening and rendering.

// The entries of a defaults list live beside this module: the repository parses them too.
use super::default_entry as element;
mod overrides;
mod walker;

pub use element::{
    check_option_names, parse_defaults_list, split_group, Entry, GroupValue, InputDefault,
};
pub use overrides::GroupOverrides;

use super::errors::ConfigError;
use super::repository::Repository;
use super::tree::Source;
use indexmap::IndexMap;
use std::collections::{BTreeSet, HashMap};
use walker::{result_default, Walker};

/// A node of the defaults tree: an entry and, when it is a config with its own defaults list, its children.
#[derive(Debug, Clone)]
pub struct TreeNode {
    pub node: InputDefault,
    pub children: Option<Vec<Child>>,
}

#[derive(Debug, Clone)]
pub enum Child {
    Leaf(InputDefault),
    Tree(TreeNode),
}

/// One config to merge, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct ResultDefault {
    pub config_path: String,
    pub parent: Option<String>,
    pub package: String,
    pub is_self: bool,
    pub primary: bool,
    pub override_key: Option<String>,
}

/// The flattened defaults list and the tree it came from.
#[derive(Debug)]
pub struct DefaultsList {
    pub defaults: Vec<ResultDefault>,
    pub tree: TreeNode,
    pub known_choices: IndexMap<String, Option<String>>,
    /// Options of an optional entry (`optional local: default`, `optional group1: [a, b]`) the command
    /// line named that do not exist: dropped as Hydra drops them, and worth a warning.
    pub dropped_options: Vec<String>,
}

impl DefaultsList {
    /// One warning per dropped option of an optional entry, with the group's options.
    pub fn dropped_warnings(&self, repo: &Repository) -> Vec<String> {
        self.dropped_options
            .iter()
            .map(|path| {
                let group = path.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
                format!(
                    "warning: '{path}' does not exist; it is left out of the optional group '{group}' \
                     as Hydra leaves it out (options: {})",
                    repo.group_options(group).join(", ")
                )
            })
            .collect()
    }
}

/// Build the defaults list of `config_name` under the group overrides (Hydra's `create_defaults_list`).
/// With `prepend_hydra`, Hydra's own `hydra/config` comes first under a virtual root, as under Hydra; the
/// primary config is walked before it, so its `override hydra/...` entries steer Hydra's groups.
pub fn create_defaults_list(
    repo: &Repository,
    config_name: &str,
    mut overrides: GroupOverrides,
    skip_missing: bool,
    prepend_hydra: bool,
) -> Result<DefaultsList, ConfigError> {
    let mut primary = InputDefault::config(config_name, None, Source::Internal);
    primary.primary = true;
    let root = TreeNode {
        node: primary,
        children: None,
    };
    let mut walker = Walker {
        repo,
        overrides: &mut overrides,
        skip_missing,
        dropped_options: Vec::new(),
        expanding: Vec::new(),
    };
    let primary_tree = walker.create_tree(root, true, false, None)?;
    let tree = if prepend_hydra {
        let mut hydra = InputDefault::config(HYDRA_CONFIG, None, Source::Internal);
        hydra.update_parent("", "");
        let hydra_tree = walker.create_tree(
            TreeNode {
                node: hydra,
                children: None,
            },
            false,
            false,
            None,
        )?;
        TreeNode {
            node: InputDefault::config(VIRTUAL_ROOT, None, Source::Internal),
            children: Some(vec![Child::Tree(hydra_tree), Child::Tree(primary_tree)]),
        }
    } else {
        primary_tree
    };
    let dropped_options = std::mem::take(&mut walker.dropped_options);
    let mut defaults = Vec::new();
    tree_to_list(&tree, None, &mut defaults);
    ensure_no_duplicates(&defaults)?;
    overrides.ensure_overrides_used()?;
    overrides.ensure_deletions_used()?;
    Ok(DefaultsList {
        defaults,
        tree,
        known_choices: overrides.known_choices,
        dropped_options,
    })
}

/// Hydra's own config, composed under every primary config (its `HydraConf` and defaults list).
pub const HYDRA_CONFIG: &str = "hydra/config";
/// The label of the root that holds `hydra/config` and the primary config side by side.
const VIRTUAL_ROOT: &str = "<root>";

fn tree_to_list(tree: &TreeNode, parent: Option<&TreeNode>, out: &mut Vec<ResultDefault>) {
    fn visit(owner: Option<&TreeNode>, node: &InputDefault, out: &mut Vec<ResultDefault>) {
        if node.deleted || node.is_missing() {
            return;
        }
        if let Some(rd) = result_default(owner, node) {
            out.push(rd);
        }
    }
    match &tree.children {
        None => visit(parent, &tree.node, out),
        Some(children) if children.is_empty() => visit(parent, &tree.node, out),
        Some(children) => {
            for child in children {
                match child {
                    Child::Leaf(d) => visit(Some(tree), d, out),
                    Child::Tree(t) => tree_to_list(t, Some(tree), out),
                }
            }
        }
    }
}

fn ensure_no_duplicates(list: &[ResultDefault]) -> Result<(), ConfigError> {
    let mut seen = BTreeSet::new();
    for item in list.iter().filter(|i| !i.is_self) {
        if let Some(key) = &item.override_key {
            if !seen.insert(key.clone()) {
                return Err(ConfigError::composition(format!(
                    "{key} appears more than once in the final defaults list"
                )));
            }
        }
    }
    Ok(())
}

/// Render the tree the way `--info defaults-tree` shows it.
pub fn render_tree(tree: &TreeNode) -> String {
    fn go(node: &TreeNode, depth: usize, out: &mut String) {
        out.push_str(&format!("{}{}\n", "  ".repeat(depth), label(&node.node)));
        for child in node.children.iter().flatten() {
            match child {
                Child::Leaf(d) => {
                    out.push_str(&format!("{}{}\n", "  ".repeat(depth + 1), label(d)))
                }
                Child::Tree(t) => go(t, depth + 1, out),
            }
        }
    }
    fn label(d: &InputDefault) -> String {
        let mut s = if d.is_self() {
            "_self_".to_string()
        } else {
            d.describe()
        };
        if d.deleted {
            s.push_str(" (deleted)");
        }
        if d.optional {
            s = format!("optional {s}");
        }
        s
    }
    let mut out = String::new();
    go(tree, 0, &mut out);
    out
}
