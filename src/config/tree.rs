//! The value tree. Every node remembers where it was written (a file and line, or the override that set it),
//! so any later error — a bad type, a missing interpolation key, an unknown key — can point at its origin.
//!
//! Merge semantics are OmegaConf's (what Hydra uses): dicts merge key by key, everything else replaces.

use indexmap::IndexMap;
use std::fmt;
use std::sync::Arc;

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Source {
    /// A YAML file, 1-based line and column.
    File {
        path: Arc<str>,
        line: usize,
        col: usize,
    },
    /// A command-line override, as typed.
    Override(Arc<str>),
    /// An environment variable (`TRAIN_...` layer or `oc.env`).
    Env(Arc<str>),
    /// Created by the engine itself (containers made to hold a package, for example).
    #[default]
    Internal,
}

impl Source {
    pub fn file(path: &Arc<str>, line: usize, col: usize) -> Self {
        Source::File {
            path: path.clone(),
            line,
            col,
        }
    }
    pub fn is_internal(&self) -> bool {
        matches!(self, Source::Internal)
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::File { path, line, col } => write!(f, "{path}:{line}:{col}"),
            Source::Override(text) => write!(f, "override '{text}'"),
            Source::Env(name) => write!(f, "environment variable {name}"),
            Source::Internal => write!(f, "<composed>"),
        }
    }
}

/// A mapping, keyed by each key's text (so `map.get("a")` and dotted paths work whatever the key's type).
/// The type the key was written with is kept on the child node ([`Node::key_kind`]).
pub type Map = IndexMap<String, Node>;

/// The YAML type of the key a node sits under in its parent mapping. OmegaConf keeps dict keys typed:
/// `{123: 1}` has the int key 123 and prints `123: 1`, `{'123': 1}` has the string key '123' and prints
/// `'123': 1`. trainyard keys its maps by the key's text; the type travels with the child node, as
/// OmegaConf keeps a node's key in the node's own metadata, and only the writers (`to_yaml`,
/// `display_python`) read it. Two keys whose text is the same but whose types differ (`1` and `'1'`) cannot
/// both be kept: the YAML reader refuses them, OmegaConf would keep both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KeyKind {
    #[default]
    Str,
    Int,
    Float,
    Bool,
}

impl KeyKind {
    /// A scalar's text as a key (ints in decimal, floats as Python's `repr`, bools as `true`/`false`) and its
    /// key type. `None` for what cannot be a key: null (OmegaConf: "Incompatible key type 'NoneType'") and
    /// containers (PyYAML: "found unhashable key").
    pub fn key_of(value: &Value) -> Option<(String, KeyKind)> {
        Some(match value {
            Value::Str(s) => (s.clone(), KeyKind::Str),
            Value::Missing => ("???".to_string(), KeyKind::Str),
            Value::Int(i) => (i.to_string(), KeyKind::Int),
            Value::Float(x) => (python_float_repr(*x), KeyKind::Float),
            Value::Bool(b) => (if *b { "true" } else { "false" }.to_string(), KeyKind::Bool),
            Value::Null | Value::List(_) | Value::Map(_) => return None,
        })
    }

    /// The key back as the typed scalar it was written as; `None` when the text does not read as that type
    /// (the key was renamed, or a node moved under another key), which is then treated as a string.
    pub fn typed(self, key: &str) -> Option<Value> {
        match self {
            KeyKind::Str => None,
            KeyKind::Int => key.parse::<i64>().ok().map(Value::Int),
            KeyKind::Float => match key {
                "inf" => Some(f64::INFINITY),
                "-inf" => Some(f64::NEG_INFINITY),
                "nan" => Some(f64::NAN),
                _ if key.contains(['.', 'e']) => key.parse::<f64>().ok(),
                _ => None,
            }
            .map(Value::Float),
            KeyKind::Bool => match key {
                "true" => Some(Value::Bool(true)),
                "false" => Some(Value::Bool(false)),
                _ => None,
            },
        }
    }
}

/// A config value. Strings that contain `${` are interpolations, resolved later by `interpolate`.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    /// OmegaConf's `???`: must be set before it is read.
    Missing,
    List(Vec<Node>),
    Map(Map),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub value: Value,
    pub source: Source,
    /// The type of the key this node sits under in its parent mapping (`Str` for list items and the root).
    pub key_kind: KeyKind,
}

impl Node {
    pub fn new(value: Value, source: Source) -> Self {
        Node {
            value,
            source,
            key_kind: KeyKind::Str,
        }
    }
    /// This node, to be placed under a key of type `kind`.
    pub fn keyed(mut self, kind: KeyKind) -> Self {
        self.key_kind = kind;
        self
    }
    pub fn map(source: Source) -> Self {
        Node::new(Value::Map(Map::new()), source)
    }
    pub fn empty_map() -> Self {
        Node::map(Source::Internal)
    }
    pub fn as_map(&self) -> Option<&Map> {
        match &self.value {
            Value::Map(m) => Some(m),
            _ => None,
        }
    }
    pub fn as_map_mut(&mut self) -> Option<&mut Map> {
        match &mut self.value {
            Value::Map(m) => Some(m),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
    pub fn is_missing(&self) -> bool {
        matches!(self.value, Value::Missing)
    }
    pub fn is_interpolation(&self) -> bool {
        matches!(&self.value, Value::Str(s) if s.contains("${"))
    }
    pub fn type_name(&self) -> &'static str {
        self.value.type_name()
    }

    /// Look up a dotted path (`a.b.0.c`); list elements are addressed by index.
    pub fn get(&self, path: &str) -> Option<&Node> {
        if path.is_empty() {
            return Some(self);
        }
        let mut node = self;
        for part in split_key(path) {
            node = node.child(part)?;
        }
        Some(node)
    }

    pub fn get_mut(&mut self, path: &str) -> Option<&mut Node> {
        if path.is_empty() {
            return Some(self);
        }
        let mut node = self;
        for part in split_key(path) {
            node = node.child_mut(part)?;
        }
        Some(node)
    }

    pub fn child(&self, key: &str) -> Option<&Node> {
        match &self.value {
            Value::Map(m) => m.get(key),
            Value::List(l) => key.parse::<usize>().ok().and_then(|i| l.get(i)),
            _ => None,
        }
    }

    pub fn child_mut(&mut self, key: &str) -> Option<&mut Node> {
        match &mut self.value {
            Value::Map(m) => m.get_mut(key),
            Value::List(l) => key.parse::<usize>().ok().and_then(|i| l.get_mut(i)),
            _ => None,
        }
    }

    /// OmegaConf merge of `src` into `self`: maps merge recursively, anything else replaces.
    /// A `???` in `src` does not erase a value already present (OmegaConf keeps the destination).
    pub fn merge(&mut self, src: Node) {
        if matches!(src.value, Value::Missing) && !self.is_missing() {
            // OmegaConf: merging MISSING onto a set value keeps the value.
            return;
        }
        match (&mut self.value, src.value) {
            (Value::Map(dst), Value::Map(src_map)) => {
                for (key, value) in src_map {
                    match dst.get_mut(&key) {
                        Some(existing) => existing.merge(value),
                        None => {
                            dst.insert(key, value);
                        }
                    }
                }
            }
            (_, value) => {
                self.value = value;
                self.source = src.source;
            }
        }
    }

    /// Like `merge`, but refuses what OmegaConf refuses: a dict onto a list or a list onto a dict.
    /// The error names the dotted key where the two met.
    pub fn try_merge(&mut self, src: Node) -> Result<(), String> {
        if let Some(key) = merge_conflict(self, &src, String::new()) {
            let (d, s) = (
                self.get(&key).map(|n| n.type_name()),
                src.get(&key).map(|n| n.type_name()),
            );
            let name = |t: Option<&str>| {
                if t == Some("list") {
                    "ListConfig"
                } else {
                    "DictConfig"
                }
            };
            return Err(format!(
                "Cannot merge {} with {}\n    full_key: {key}",
                name(s),
                name(d)
            ));
        }
        self.merge(src);
        Ok(())
    }

    /// Sort-free walk over every leaf and container, with its dotted path.
    pub fn walk<'a>(&'a self, path: &mut String, visit: &mut dyn FnMut(&str, &'a Node)) {
        visit(path, self);
        let children: Box<dyn Iterator<Item = (String, &Node)>> = match &self.value {
            Value::Map(m) => Box::new(m.iter().map(|(k, v)| (k.clone(), v))),
            Value::List(l) => Box::new(l.iter().enumerate().map(|(i, v)| (i.to_string(), v))),
            _ => return,
        };
        for (key, child) in children {
            let len = path.len();
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(&key);
            child.walk(path, visit);
            path.truncate(len);
        }
    }

    /// Every dotted key path in the tree (containers included), for did-you-mean suggestions and completion.
    pub fn all_paths(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut path = String::new();
        self.walk(&mut path, &mut |p, _| {
            if !p.is_empty() {
                out.push(p.to_string())
            }
        });
        out
    }

    /// Wrap this node so it sits at `package` (`a.b` → `{a: {b: self}}`).
    pub fn wrap_in_package(self, package: &str) -> Node {
        if package.is_empty() {
            return self;
        }
        let mut node = self;
        for part in package.rsplit('.') {
            let mut map = Map::new();
            map.insert(part.to_string(), node.keyed(KeyKind::Str));
            node = Node::new(Value::Map(map), Source::Internal);
        }
        node
    }

    /// Convert to JSON, keeping interpolations as strings and `???` as the string `"???"`.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match &self.value {
            Value::Null => J::Null,
            Value::Bool(b) => J::Bool(*b),
            Value::Int(i) => J::from(*i),
            Value::Float(x) => serde_json::Number::from_f64(*x)
                .map(J::Number)
                .unwrap_or_else(|| {
                    let text = if x.is_nan() {
                        "nan"
                    } else if *x > 0.0 {
                        "inf"
                    } else {
                        "-inf"
                    };
                    serde_json::json!({ "$float": text })
                }),
            Value::Str(s) => J::String(s.clone()),
            Value::Missing => J::String("???".into()),
            Value::List(l) => J::Array(l.iter().map(Node::to_json).collect()),
            Value::Map(m) => J::Object(m.iter().map(|(k, v)| (k.clone(), v.to_json())).collect()),
        }
    }
}

impl Value {
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Missing => "missing",
            Value::List(_) => "list",
            Value::Map(_) => "dict",
        }
    }

    /// The value as OmegaConf prints it inside messages (`str(value)` in Python).
    pub fn display_python(&self) -> String {
        match self {
            Value::Null => "None".into(),
            Value::Bool(true) => "True".into(),
            Value::Bool(false) => "False".into(),
            Value::Int(i) => i.to_string(),
            Value::Float(x) => python_float_repr(*x),
            Value::Str(s) => s.clone(),
            Value::Missing => "???".into(),
            Value::List(l) => {
                let items: Vec<String> = l.iter().map(|n| n.value.repr_python()).collect();
                format!("[{}]", items.join(", "))
            }
            Value::Map(m) => {
                let items: Vec<String> = m
                    .iter()
                    .map(|(k, v)| {
                        let key = match v.key_kind.typed(k) {
                            Some(typed) => typed.repr_python(),
                            None => format!("'{k}'"),
                        };
                        format!("{key}: {}", v.value.repr_python())
                    })
                    .collect();
                format!("{{{}}}", items.join(", "))
            }
        }
    }

    /// Python `repr()` of the value (strings quoted).
    pub fn repr_python(&self) -> String {
        match self {
            Value::Str(s) => format!("'{s}'"),
            Value::Missing => "'???'".into(),
            other => other.display_python(),
        }
    }
}

fn merge_conflict(dst: &Node, src: &Node, path: String) -> Option<String> {
    match (&dst.value, &src.value) {
        (Value::Map(_), Value::List(_)) | (Value::List(_), Value::Map(_)) => Some(path),
        (Value::Map(d), Value::Map(s)) => s.iter().find_map(|(k, v)| {
            let child = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            d.get(k)
                .and_then(|existing| merge_conflict(existing, v, child))
        }),
        _ => None,
    }
}

/// Python's `repr(float)`: shortest round-trip digits, `1.0` not `1`, exponent form like `1e-05`.
pub fn python_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if x == 0.0 {
        return if x.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    let exp = x.abs().log10().floor() as i32;
    if (-4..16).contains(&exp) {
        let s = format!("{x}");
        if s.contains('.') || s.contains('e') {
            s
        } else {
            format!("{s}.0")
        }
    } else {
        // Rust's `{:e}` gives `1e-5` / `1.5e20`; Python writes `1e-05` / `1.5e+20`.
        let s = format!("{x:e}");
        let (mantissa, exponent) = s.split_once('e').unwrap_or((&s, "0"));
        let (sign, digits) = match exponent.strip_prefix('-') {
            Some(d) => ('-', d),
            None => ('+', exponent),
        };
        format!("{mantissa}e{sign}{digits:0>2}")
    }
}

/// Split a dotted key into parts. `a.b` → [a, b]. Brackets (`a[0]`) are accepted as OmegaConf does.
pub fn split_key(key: &str) -> Vec<&str> {
    key.split(['.', '[', ']'])
        .filter(|s| !s.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn leaf(v: Value) -> Node {
        Node::new(v, Source::Internal)
    }
    fn map(items: Vec<(&str, Node)>) -> Node {
        Node::new(
            Value::Map(items.into_iter().map(|(k, v)| (k.to_string(), v)).collect()),
            Source::Internal,
        )
    }

    #[test]
    fn merge_dicts_recursively_and_replaces_lists() {
        let mut dst = map(vec![
            (
                "a",
                map(vec![("x", leaf(Value::Int(1))), ("y", leaf(Value::Int(2)))]),
            ),
            (
                "l",
                leaf(Value::List(vec![leaf(Value::Int(1)), leaf(Value::Int(2))])),
            ),
        ]);
        let src = map(vec![
            ("a", map(vec![("y", leaf(Value::Int(3)))])),
            ("l", leaf(Value::List(vec![leaf(Value::Int(9))]))),
        ]);
        dst.merge(src);
        assert_eq!(dst.get("a.x").unwrap().value, Value::Int(1));
        assert_eq!(dst.get("a.y").unwrap().value, Value::Int(3));
        assert_eq!(
            dst.get("l").unwrap().value,
            Value::List(vec![leaf(Value::Int(9))])
        );
        assert_eq!(dst.get("l.0").unwrap().value, Value::Int(9));
    }

    #[test]
    fn missing_does_not_erase() {
        let mut dst = map(vec![("a", leaf(Value::Int(1)))]);
        dst.merge(map(vec![("a", leaf(Value::Missing))]));
        assert_eq!(dst.get("a").unwrap().value, Value::Int(1));
    }

    #[rstest]
    #[case(1.0, "1.0")]
    #[case(0.1, "0.1")]
    #[case(1e-5, "1e-05")]
    #[case(1.5e20, "1.5e+20")]
    #[case(1e16, "1e+16")]
    #[case(123456.5, "123456.5")]
    #[case(-2.5, "-2.5")]
    #[case(f64::INFINITY, "inf")]
    fn python_float_formatting(#[case] x: f64, #[case] expected: &str) {
        assert_eq!(python_float_repr(x), expected);
    }

    #[test]
    fn wrap_in_package_nests() {
        let node = leaf(Value::Int(1)).wrap_in_package("a.b");
        assert_eq!(node.get("a.b").unwrap().value, Value::Int(1));
    }
}
