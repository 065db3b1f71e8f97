//! The command-line override grammar of Hydra 1.3 (`OverrideLexer.g4` / `OverrideParser.g4`), hand-written:
//! a longest-match lexer with ANTLR's tie-breaking, a recursive-descent parser, and the grammar functions
//! (casts, `choice`, `range`, `interval`, `sort`, `shuffle`, `glob`, `tag`). It knows nothing of composition.
//! It never panics: every index is checked, and bad input is a `ParseError` pointing at the column.
//!
//! Split as Hydra's `core/override_parser/` is: `lexer` (tokens), `parser` (the grammar's rules),
//! `functions` (`grammar_functions.py`), `text` (values back to override text and sweeps listed, as the
//! BasicSweeper needs them). This file holds what they produce: `Override`, `Element`, `Sweep`.

mod functions;
mod lexer;
mod parser;
mod text;

use crate::config::tree::{python_float_repr, KeyKind};
pub use parser::parse_override;
use std::fmt;

/// `key=v` Change, `+key=v` Add, `++key=v` ForceAdd, `~key[=v]` Delete.
#[derive(Debug, Clone, PartialEq)]
pub enum OverrideKind {
    Change,
    Add,
    ForceAdd,
    Delete,
}

/// `key_or_group[@package]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    pub key_or_group: String,
    pub package: Option<String>,
}

/// A parsed value.
#[derive(Debug, Clone, PartialEq)]
pub enum Element {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    /// `quote`: written bare, inside `'..'` or inside `".."` (Hydra writes a quoted value back with the
    /// quotes it was given). `${..}` stays in the text.
    Str {
        value: String,
        quote: Quote,
    },
    List(Vec<Element>),
    /// Insertion order kept; keys are unique as Python compares them (`1`, `1.0` and `true` are one key).
    Dict(Vec<(DictKey, Element)>),
}

/// How a string value was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quote {
    None,
    Single,
    Double,
}

/// A dict key, typed as Hydra types it (its `dictKey` rule goes through `_createPrimitive`): `{1: a}` has the
/// int key 1, `{1.5: a}` the float 1.5, `{true: a}` the bool, `{a b: 1}` the string `a b`. The grammar has no
/// quoted keys. A `null` key parses; OmegaConf refuses it when the override is applied.
#[derive(Debug, Clone, PartialEq)]
pub enum DictKey {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
}

impl From<&str> for DictKey {
    fn from(s: &str) -> Self {
        DictKey::Str(s.to_string())
    }
}

impl From<String> for DictKey {
    fn from(s: String) -> Self {
        DictKey::Str(s)
    }
}

impl DictKey {
    /// The key as its own element (a string key unquoted).
    pub fn to_element(&self) -> Element {
        match self {
            DictKey::Null => Element::Null,
            DictKey::Bool(b) => Element::Bool(*b),
            DictKey::Int(i) => Element::Int(*i),
            DictKey::Float(x) => Element::Float(*x),
            DictKey::Str(s) => Element::Str {
                value: s.clone(),
                quote: Quote::None,
            },
        }
    }

    /// The text a config map is keyed by and the key's type (`None` for a `null` key, which OmegaConf
    /// refuses: see [`Element::null_key`]).
    pub fn tree_key(&self) -> Option<(String, KeyKind)> {
        match self {
            DictKey::Null => None,
            DictKey::Bool(b) => Some((b.to_string(), KeyKind::Bool)),
            DictKey::Int(i) => Some((i.to_string(), KeyKind::Int)),
            DictKey::Float(x) => Some((python_float_repr(*x), KeyKind::Float)),
            DictKey::Str(s) => Some((s.clone(), KeyKind::Str)),
        }
    }

    /// Python's `==` between dict keys: numbers and bools compare by value (`1 == 1.0 == True`), strings by
    /// text, and a string never equals a number.
    pub fn same_key(&self, other: &DictKey) -> bool {
        fn number(k: &DictKey) -> Option<f64> {
            match k {
                DictKey::Bool(b) => Some(*b as i64 as f64),
                DictKey::Int(i) => Some(*i as f64),
                DictKey::Float(x) => Some(*x),
                _ => None,
            }
        }
        match (self, other) {
            (DictKey::Int(a), DictKey::Int(b)) => a == b,
            (DictKey::Str(a), DictKey::Str(b)) => a == b,
            (DictKey::Null, DictKey::Null) => true,
            _ => match (number(self), number(other)) {
                (Some(a), Some(b)) => a == b,
                _ => false,
            },
        }
    }
}

impl Element {
    /// Where a `null` dict key sits in this value, as OmegaConf's `full_key` names it when it refuses the key
    /// ("Incompatible key type 'NoneType'"), with `key` the override's key: `x` for `x={null: 1}`,
    /// `x.a` for `x={a: {null: 1}}`, and (OmegaConf's quirk) `x0` for `x=[{null: 1}]`.
    pub fn null_key(&self, key: &str) -> Option<String> {
        match self {
            Element::Dict(items) => {
                if items.iter().any(|(k, _)| *k == DictKey::Null) {
                    return Some(key.to_string());
                }
                items.iter().find_map(|(k, v)| {
                    let (text, _) = k.tree_key()?;
                    let child = if key.is_empty() {
                        text
                    } else {
                        format!("{key}.{text}")
                    };
                    v.null_key(&child)
                })
            }
            Element::List(items) => items.iter().enumerate().find_map(|(i, v)| match v {
                Element::Dict(entries) if entries.iter().any(|(k, _)| *k == DictKey::Null) => {
                    Some(format!("{key}{i}"))
                }
                _ => v.null_key(&format!("{key}[{i}]")),
            }),
            _ => None,
        }
    }
}

/// A number in a `range()`: ints stay ints so `range(1,4)` sweeps 1, 2, 3.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Num {
    Int(i64),
    Float(f64),
}

impl Num {
    pub fn as_f64(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Float(x) => x,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Sweep {
    /// `a,b,c` (simple_form) or `choice(a,b)`.
    Choice {
        list: Vec<Element>,
        simple_form: bool,
        shuffle: bool,
        tags: Vec<String>,
    },
    Range {
        start: Num,
        stop: Num,
        step: Num,
        shuffle: bool,
        tags: Vec<String>,
    },
    /// `interval(a, b)`: floats, or ints after `int(...)` (search sweepers tell them apart).
    Interval {
        start: Num,
        end: Num,
        tags: Vec<String>,
    },
    Glob {
        include: Vec<String>,
        exclude: Vec<String>,
    },
}

impl Sweep {
    /// The sweep with `tag(...)`'s tags (Hydra keeps them through casts, sort and shuffle).
    pub fn with_tags(self, new: Vec<String>) -> Sweep {
        match self {
            Sweep::Choice {
                list,
                simple_form,
                shuffle,
                ..
            } => Sweep::Choice {
                list,
                simple_form,
                shuffle,
                tags: new,
            },
            Sweep::Range {
                start,
                stop,
                step,
                shuffle,
                ..
            } => Sweep::Range {
                start,
                stop,
                step,
                shuffle,
                tags: new,
            },
            Sweep::Interval { start, end, .. } => Sweep::Interval {
                start,
                end,
                tags: new,
            },
            glob @ Sweep::Glob { .. } => glob,
        }
    }

    /// The tags given with `tag(...)`.
    pub fn tags(&self) -> &[String] {
        match self {
            Sweep::Choice { tags, .. }
            | Sweep::Range { tags, .. }
            | Sweep::Interval { tags, .. } => tags,
            Sweep::Glob { .. } => &[],
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum ParsedValue {
    Element(Element),
    Sweep(Sweep),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    pub kind: OverrideKind,
    pub key: Key,
    /// `None` for `~key` without a value.
    pub value: Option<ParsedValue>,
    /// What the user typed.
    pub input: String,
}

impl Override {
    pub fn is_sweep(&self) -> bool {
        matches!(self.value, Some(ParsedValue::Sweep(_)))
    }
}

/// An override that does not parse: Hydra's first line, then the reason and a caret under the column.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ParseError {
    pub message: String,
    pub column: usize,
}

fn fail<T>(input: &str, column: usize, reason: impl fmt::Display) -> Result<T, ParseError> {
    let caret_pad: String = input
        .chars()
        .take(column)
        .map(|c| if c == '\t' { '\t' } else { ' ' })
        .collect();
    Err(ParseError {
        message: format!(
            "Error parsing override '{input}'\n{reason}\n    {input}\n    {caret_pad}^"
        ),
        column,
    })
}

/// What an expression evaluates to before it lands in an override: a plain element or a sweep (what the
/// parser and the grammar's functions exchange).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Val {
    Elem(Element),
    Sweep(Sweep),
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn s(v: &str) -> Element {
        Element::Str {
            value: v.into(),
            quote: Quote::None,
        }
    }
    fn q(v: &str) -> Element {
        Element::Str {
            value: v.into(),
            quote: Quote::Single,
        }
    }
    fn value(text: &str) -> ParsedValue {
        parse_override(&format!("k={text}")).unwrap().value.unwrap()
    }
    fn elem(text: &str) -> Element {
        match value(text) {
            ParsedValue::Element(e) => e,
            other => panic!("{text} is not an element: {other:?}"),
        }
    }

    #[rstest]
    #[case("1", Element::Int(1))]
    #[case("-1", Element::Int(-1))]
    #[case("+5", Element::Int(5))]
    #[case("1_000", Element::Int(1000))]
    #[case("1.5", Element::Float(1.5))]
    #[case("1.", Element::Float(1.0))]
    #[case(".5", Element::Float(0.5))]
    #[case("1e-3", Element::Float(0.001))]
    #[case("-10e3", Element::Float(-10000.0))]
    #[case("1_000.5", Element::Float(1000.5))]
    #[case("inf", Element::Float(f64::INFINITY))]
    #[case("-inf", Element::Float(f64::NEG_INFINITY))]
    #[case("true", Element::Bool(true))]
    #[case("TrUe", Element::Bool(true))]
    #[case("false", Element::Bool(false))]
    #[case("null", Element::Null)]
    #[case("NULL", Element::Null)]
    #[case("abc", s("abc"))]
    #[case("foo-bar_10", s("foo-bar_10"))]
    #[case("a b c", s("a b c"))]
    #[case("  a b  ", s("a b"))]
    #[case("1abc", s("1abc"))]
    #[case("true_x", s("true_x"))]
    #[case("/path/to/file.txt", s("/path/to/file.txt"))]
    #[case("${a.b}", s("${a.b}"))]
    #[case("x_${a}_y", s("x_${a}_y"))]
    #[case("${oc.env:USER,me}", s("${oc.env:USER,me}"))]
    #[case("a:b", s("a:b"))]
    #[case("http://x.com:8080", s("http://x.com:8080"))]
    #[case("\\,", s(","))]
    #[case("a\\,b", s("a,b"))]
    #[case("a\\ b", s("a b"))]
    #[case("\\(x\\)", s("(x)"))]
    #[case("\\\\", s("\\"))]
    #[case("'a,b'", q("a,b"))]
    #[case("\"hello world\"", Element::Str { value: "hello world".into(), quote: Quote::Double })]
    #[case("'1'", q("1"))]
    #[case("'${x}'", q("${x}"))]
    #[case("'abc\\'def'", q("abc'def"))]
    #[case("'abc\\\\'", q("abc\\"))]
    #[case("'a\\b'", q("a\\b"))]
    #[case("''", q(""))]
    #[case("[]", Element::List(vec![]))]
    #[case("[1,2,3]", Element::List(vec![Element::Int(1), Element::Int(2), Element::Int(3)]))]
    #[case("[a, [b]]", Element::List(vec![s("a"), Element::List(vec![s("b")])]))]
    #[case("[ 'a,b' , c ]", Element::List(vec![q("a,b"), s("c")]))]
    #[case("{}", Element::Dict(vec![]))]
    #[case("{a: 1, b: {c: 2}}", Element::Dict(vec![("a".into(), Element::Int(1)), ("b".into(), Element::Dict(vec![("c".into(), Element::Int(2))]))]))]
    #[case("{a:1,a:2}", Element::Dict(vec![("a".into(), Element::Int(2))]))]
    #[case("{1: a}", Element::Dict(vec![(DictKey::Int(1), s("a"))]))]
    #[case("{1.5: a, TRUE: b, null: c}", Element::Dict(vec![(DictKey::Float(1.5), s("a")), (DictKey::Bool(true), s("b")), (DictKey::Null, s("c"))]))]
    #[case("{1: a, 1.0: b, true: c}", Element::Dict(vec![(DictKey::Int(1), s("c"))]))]
    #[case("{a b : 1, 0x10: 2}", Element::Dict(vec![("a b".into(), Element::Int(1)), ("0x10".into(), Element::Int(2))]))]
    #[case("int(3.7)", Element::Int(3))]
    #[case("int('10')", Element::Int(10))]
    #[case("float(1)", Element::Float(1.0))]
    #[case("str(1)", s("1"))]
    #[case("str(true)", s("true"))]
    #[case("str(1.5)", s("1.5"))]
    #[case("bool(1)", Element::Bool(true))]
    #[case("bool('FALSE')", Element::Bool(false))]
    #[case("int([1.5, 2.5])", Element::List(vec![Element::Int(1), Element::Int(2)]))]
    #[case("float({a: 1})", Element::Dict(vec![("a".into(), Element::Float(1.0))]))]
    #[case("sort([3,1,2])", Element::List(vec![Element::Int(1), Element::Int(2), Element::Int(3)]))]
    #[case("sort([a,c,b], reverse=true)", Element::List(vec![s("c"), s("b"), s("a")]))]
    #[case("int(value=5)", Element::Int(5))]
    #[case("", s(""))]
    fn elements(#[case] text: &str, #[case] expected: Element) {
        assert_eq!(elem(text), expected, "parsing {text:?}");
    }

    #[rstest]
    #[case("a,b,c", vec![s("a"), s("b"), s("c")])]
    #[case("1, 2 ,3", vec![Element::Int(1), Element::Int(2), Element::Int(3)])]
    #[case("choice(a,b)", vec![s("a"), s("b")])]
    #[case("choice(a)", vec![s("a")])]
    #[case("range(1,4)", vec![Element::Int(1), Element::Int(2), Element::Int(3)])]
    #[case("range(3)", vec![Element::Int(0), Element::Int(1), Element::Int(2)])]
    #[case("range(start=1,stop=3)", vec![Element::Int(1), Element::Int(2)])]
    #[case("range(5,1,-2)", vec![Element::Int(5), Element::Int(3)])]
    #[case("range(0,1,0.25)", vec![Element::Float(0.0), Element::Float(0.25), Element::Float(0.5), Element::Float(0.75)])]
    #[case("sort(3,1,2)", vec![Element::Int(1), Element::Int(2), Element::Int(3)])]
    #[case("sort(choice(b,a), reverse=true)", vec![s("b"), s("a")])]
    #[case("sort(range(1,4), reverse=true)", vec![Element::Int(3), Element::Int(2), Element::Int(1)])]
    #[case("int(1.5,2.5)", vec![Element::Int(1), Element::Int(2)])]
    #[case("str(choice(1,2))", vec![s("1"), s("2")])]
    #[case("float(range(1,3))", vec![Element::Float(1.0), Element::Float(2.0)])]
    #[case("tag(a,b,choice(x,y))", vec![s("x"), s("y")])]
    #[case("[1,2],[3]", vec![Element::List(vec![Element::Int(1), Element::Int(2)]), Element::List(vec![Element::Int(3)])])]
    fn sweeps(#[case] text: &str, #[case] expected: Vec<Element>) {
        match value(text) {
            ParsedValue::Sweep(sw) => assert_eq!(sw.discrete_values().unwrap(), expected, "{text}"),
            other => panic!("{text} is not a sweep: {other:?}"),
        }
    }

    #[test]
    fn shuffle_is_a_permutation() {
        match value("shuffle(1,2,3,4,5)") {
            ParsedValue::Sweep(sw) => {
                let mut v: Vec<i64> = sw
                    .discrete_values()
                    .unwrap()
                    .into_iter()
                    .map(|e| if let Element::Int(i) = e { i } else { 0 })
                    .collect();
                v.sort();
                assert_eq!(v, vec![1, 2, 3, 4, 5]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[rstest]
    #[case("a=1", OverrideKind::Change, "a", None, true)]
    #[case("a.b.c=1", OverrideKind::Change, "a.b.c", None, true)]
    #[case("+a=1", OverrideKind::Add, "a", None, true)]
    #[case("++a=1", OverrideKind::ForceAdd, "a", None, true)]
    #[case("~a", OverrideKind::Delete, "a", None, false)]
    #[case("~a=1", OverrideKind::Delete, "a", None, true)]
    #[case("~a=", OverrideKind::Delete, "a", None, true)]
    #[case("db@backup=mysql", OverrideKind::Change, "db", Some("backup"), true)]
    #[case(
        "hydra/launcher=basic",
        OverrideKind::Change,
        "hydra/launcher",
        None,
        true
    )]
    #[case("db@=mysql", OverrideKind::Change, "db", Some(""), true)]
    #[case("list.0=x", OverrideKind::Change, "list.0", None, true)]
    #[case("$foo=1", OverrideKind::Change, "$foo", None, true)]
    #[case("a-b_c=1", OverrideKind::Change, "a-b_c", None, true)]
    fn keys(
        #[case] text: &str,
        #[case] kind: OverrideKind,
        #[case] key: &str,
        #[case] package: Option<&str>,
        #[case] has_value: bool,
    ) {
        let o = parse_override(text).unwrap();
        assert_eq!(o.kind, kind);
        assert_eq!(o.key.key_or_group, key);
        assert_eq!(o.key.package.as_deref(), package);
        assert_eq!(o.value.is_some(), has_value);
        assert_eq!(o.input, text);
    }

    #[rstest]
    #[case("a=[1", "missing ']'")]
    #[case("a={a:1", "missing '}'")]
    #[case("a=1)", "extraneous input ')'")]
    #[case("=1", "missing key")]
    #[case("a..b=1", "invalid key")]
    #[case("a", "expecting '='")]
    #[case("+a", "expecting '='")]
    #[case("a=foo(1)", "Unknown function 'foo'")]
    #[case("a=int(abc)", "invalid literal for int()")]
    #[case("a=bool(2x)", "Cannot cast '2x' to bool")]
    #[case("a='abc", "unterminated quoted string")]
    #[case("a=choice()", "empty choice is not legal")]
    #[case("a=[1,2", "missing ']'")]
    #[case("a=range(a,b)", "str is incompatible with Union[int, float]")]
    #[case("a/b.c=1", "invalid key")]
    #[case("a=1,", "expecting a value")]
    #[case("a= ", "")]
    #[case("a={'1': 2}", "missing dictionary key")]
    fn errors(#[case] text: &str, #[case] reason: &str) {
        match parse_override(text) {
            Err(e) => {
                assert!(
                    e.message
                        .starts_with(&format!("Error parsing override '{text}'")),
                    "{}",
                    e.message
                );
                assert!(e.message.contains(reason), "{text}: {}", e.message);
            }
            Ok(o) if reason.is_empty() => assert_eq!(o.value, Some(ParsedValue::Element(s("")))),
            Ok(o) => panic!("{text} parsed: {o:?}"),
        }
    }

    #[rstest]
    #[case(s("a b"), "a\\ b")]
    #[case(s("a,b"), "a\\,b")]
    #[case(q("it's"), "'it\\'s'")]
    #[case(Element::Bool(true), "True")]
    #[case(Element::Float(1e-5), "1e-05")]
    #[case(Element::Float(2.0), "2.0")]
    #[case(Element::List(vec![Element::Int(1), s("x")]), "[1,x]")]
    #[case(Element::Dict(vec![("a".into(), Element::Int(1))]), "{a:1}")]
    #[case(Element::Dict(vec![(DictKey::Int(1), s("a")), (DictKey::Bool(true), Element::Null), (DictKey::Float(1.5), q("x y"))]), "{1:a,True:null,1.5:'x y'}")]
    #[case(Element::Null, "null")]
    fn override_strings(#[case] e: Element, #[case] expected: &str) {
        assert_eq!(e.to_override_string(), expected);
    }

    #[rstest]
    #[case("*", &["a", "b"], &[], &["a", "b"])]
    #[case("resnet*", &["mlp", "resnet18", "resnet50"], &[], &["resnet18", "resnet50"])]
    #[case("*", &["mlp", "resnet18", "resnet50"], &["*50"], &["mlp", "resnet18"])]
    #[case("r?s*", &["res", "rxs", "ab"], &[], &["res", "rxs"])]
    #[case("[ab]*", &["apple", "banana", "cherry"], &[], &["apple", "banana"])]
    fn globs(
        #[case] pattern: &str,
        #[case] names: &[&str],
        #[case] exclude: &[&str],
        #[case] expected: &[&str],
    ) {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let exclude: Vec<String> = exclude.iter().map(|s| s.to_string()).collect();
        assert_eq!(
            Sweep::glob_filter(&[pattern.to_string()], &exclude, &names),
            expected
        );
    }

    #[test]
    fn glob_with_keywords() {
        match value("glob(include=[a*,b*],exclude=ab*)") {
            ParsedValue::Sweep(Sweep::Glob { include, exclude }) => {
                assert_eq!(include, vec!["a*", "b*"]);
                assert_eq!(exclude, vec!["ab*"]);
            }
            other => panic!("{other:?}"),
        }
    }
}
