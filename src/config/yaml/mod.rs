//! YAML in and out. Reading keeps the line and column of every value; plain scalars are typed with the
//! rules of OmegaConf's loader (PyYAML's YAML 1.1 resolvers, no timestamps, plus `1e3`-style floats) so a
//! file means here what it means under Hydra. Writing produces the block style `OmegaConf.to_yaml` prints.
//!
//! Bad input fails fast with the file and line: aliases may copy only so many nodes (an alias bomb is
//! refused, not expanded; see [`ALIAS_NODE_BUDGET`]), a syntax error names where the broken construct began
//! as well as where it was found (as PyYAML does), and mapping keys are checked as OmegaConf checks them
//! (a `null` key is refused; int, float and bool keys keep their type, see [`KeyKind`]).

use super::tree::{python_float_repr, KeyKind, Map, Node, Source, Value};
use saphyr_parser::{Event, Parser, ScalarStyle, Span};
use std::collections::HashMap;
use std::sync::Arc;

/// A YAML file could not be read; names the file, line and column.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{path}:{line}:{col}: {message}")]
pub struct YamlError {
    pub path: String,
    pub line: usize,
    pub col: usize,
    pub message: String,
}

/// Aliases (`*name`) may copy at most this many nodes into one document, or [`ALIAS_NODES_PER_WRITTEN_NODE`]
/// times the nodes written out in the file so far if that is more. An alias copies its anchor's whole node,
/// so anchors of lists of aliases of anchors grow exponentially (the "billion laughs" bomb: nine levels of
/// nine aliases are 387 million nodes from a few hundred bytes). Safe loaders cap this (SnakeYAML,
/// go-yaml); real configs use a handful of `<<: *base` merges and stay far below either limit.
pub const ALIAS_NODE_BUDGET: usize = 100_000;
/// See [`ALIAS_NODE_BUDGET`]: large generated files may alias proportionally more.
pub const ALIAS_NODES_PER_WRITTEN_NODE: usize = 10;
/// Collections nested deeper than this are refused instead of exhausting the stack (the scanner already
/// caps flow collections at 255 levels; block collections `- - - ...` have no such cap).
pub const MAX_DEPTH: usize = 1_000;

mod lenient;
mod reader;
mod scalars;
mod writer;

use reader::Builder;
pub use scalars::{package_header, resolve_plain};
pub use writer::{key_text, quote_if_needed, to_yaml};

/// Parse one YAML document. An empty document is `None` (Hydra treats it as an empty config).
pub fn parse(text: &str, path: &str) -> Result<Option<Node>, YamlError> {
    let mut pads = Vec::new();
    let mut reindented: Option<String> = None;
    let mut parsed = 0;
    loop {
        let current = reindented.as_deref().unwrap_or(text);
        let (result, reindent) = parse_once(current, path, &pads);
        parsed += current.len();
        if result.is_ok() || parsed > lenient::MAX_REINDENT_BYTES {
            return result;
        }
        // An error after a re-indent is the file's next problem (or the same one, when indenting did not
        // help): it is reported, with its position as written.
        match reindent.and_then(|r| lenient::reindent(current, &mut pads, r)) {
            Some(next) => reindented = Some(next),
            None => return result,
        }
    }
}

/// One pass of the reader over `text`, whose lines `pads` says were indented; with an error PyYAML would
/// not raise, the line to indent and how far.
fn parse_once(
    text: &str,
    path: &str,
    pads: &[usize],
) -> (Result<Option<Node>, YamlError>, Option<lenient::Reindent>) {
    let mut builder = Builder {
        text,
        events: Parser::new_from_str(text),
        path: Arc::from(path),
        anchors: HashMap::new(),
        written: 0,
        made: 0,
        aliased: 0,
        open: Vec::new(),
        keys: Vec::new(),
        last_end: 0,
        cursor: (0, 0),
        pads,
        reindent: None,
    };
    let result = builder.document();
    let reindent = if result.is_err() {
        builder.reindent
    } else {
        None
    };
    (result, reindent)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    /// A line the scanner keeps refusing is pushed no further than the file's widest line (found by
    /// fuzzing: this file took minutes, a parse per space added).
    #[test]
    fn a_hopeless_reindent_gives_up_at_once() {
        let started = std::time::Instant::now();
        let _ = parse("a:\n  \r {>-\n  x: # c\n1,\n  y: 2}\n", "f");
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }

    /// A list written at the margin, one item a line, as PyYAML reads it: each line is a retry, and forty
    /// of them in a 1.5 KB file stay inside the retry budget (`MAX_REINDENT_BYTES`).
    #[test]
    fn a_long_list_at_the_margin_is_read_within_the_retry_budget() {
        let items: Vec<String> = (0..40).map(|i| format!("{i:03},")).collect();
        let text = format!(
            "# {}\nmodel:\n  layers: [\n{}\n999]\n",
            "x".repeat(1200),
            items.join("\n")
        );
        let node = parse(&text, "f.yaml").unwrap().unwrap();
        let Value::List(read) = &node.get("model.layers").unwrap().value else {
            panic!("not a list")
        };
        assert_eq!(read.len(), 41);
        assert_eq!(read[40].value, Value::Int(999));
    }

    #[rstest]
    #[case("1", Value::Int(1))]
    #[case("1_000", Value::Int(1000))]
    #[case("-7", Value::Int(-7))]
    #[case("0x1f", Value::Int(31))]
    #[case("017", Value::Int(15))]
    #[case("1.5", Value::Float(1.5))]
    #[case("1e3", Value::Float(1000.0))]
    #[case("1.0e-3", Value::Float(0.001))]
    #[case(".5", Value::Float(0.5))]
    #[case("-.inf", Value::Float(f64::NEG_INFINITY))]
    #[case("true", Value::Bool(true))]
    #[case("off", Value::Bool(false))]
    #[case("null", Value::Null)]
    #[case("~", Value::Null)]
    #[case("???", Value::Missing)]
    #[case("inf", Value::Str("inf".into()))]
    #[case("-.5", Value::Str("-.5".into()))]
    #[case("abc", Value::Str("abc".into()))]
    #[case("1.2.3", Value::Str("1.2.3".into()))]
    #[case("2024-01-01", Value::Str("2024-01-01".into()))]
    fn plain_scalars_typed_like_omegaconf(#[case] text: &str, #[case] expected: Value) {
        assert_eq!(resolve_plain(text), expected);
    }

    #[test]
    fn keeps_line_numbers() {
        let node = parse("a: 1\nb:\n  c: x\n", "f.yaml").unwrap().unwrap();
        match &node.get("b.c").unwrap().source {
            Source::File { line, col, .. } => assert_eq!((*line, *col), (3, 6)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn flow_lines_left_of_their_key_read_as_pyyaml_reads_them_at_their_written_columns() {
        let text = "model:\n  m: [1,\n2]\n  q: 'a\nb'\n";
        let node = parse(text, "f.yaml").unwrap().unwrap();
        let two = &node.get("model.m").unwrap();
        let Value::List(items) = &two.value else {
            panic!("{two:?}")
        };
        assert_eq!(items[1].value, Value::Int(2));
        match &items[1].source {
            Source::File { line, col, .. } => assert_eq!((*line, *col), (3, 1)),
            other => panic!("{other:?}"),
        }
        assert_eq!(node.get("model.q").unwrap().value, Value::Str("a b".into()));
        // A real error after a re-indented line keeps the position the file has.
        let err = parse("model:\n  m: [1,\n2]\n  n: {a: 1\n", "f.yaml").unwrap_err();
        assert_eq!((err.line, err.col), (5, 1), "{err}");
        assert!(
            err.message
                .contains("flow mapping that began at f.yaml:4:6"),
            "{err}"
        );
    }

    #[test]
    fn duplicate_key_is_an_error_with_line() {
        let err = parse("a: 1\na: 2\n", "f.yaml").unwrap_err();
        assert_eq!(err.line, 2);
        assert!(err.message.contains("duplicate key a"));
    }

    #[test]
    fn quoted_stays_string_and_empty_is_none() {
        let node = parse("a: '1'\nb: \"true\"\n", "f").unwrap().unwrap();
        assert_eq!(node.get("a").unwrap().value, Value::Str("1".into()));
        assert_eq!(node.get("b").unwrap().value, Value::Str("true".into()));
        assert!(parse("# only a comment\n", "f").unwrap().is_none());
    }

    #[test]
    fn anchors_and_merge_keys() {
        let node = parse("base: &b {x: 1, y: 2}\nderived:\n  <<: *b\n  y: 3\n", "f")
            .unwrap()
            .unwrap();
        assert_eq!(node.get("derived.x").unwrap().value, Value::Int(1));
        assert_eq!(node.get("derived.y").unwrap().value, Value::Int(3));
    }

    #[rstest]
    #[case("# @package _global_\na: 1", Some("_global_"))]
    #[case("# comment\n# @package foo.bar\n", None)]
    #[case("\n#   @package   x\n", Some("x"))]
    #[case("a: 1\n# @package x", None)]
    fn package_headers(#[case] text: &str, #[case] expected: Option<&str>) {
        assert_eq!(package_header(text).unwrap().as_deref(), expected);
    }

    #[test]
    fn yaml_round_trip() {
        // `y` is a YAML 1.1 bool to OmegaConf, so its writer quotes it (as OmegaConf.to_yaml does).
        let text = "a: 1\nb:\n  c: '1'\n  d:\n  - x\n  - 'y': 2\n    z: 3\ne: ${a}\nf: null\ng: 1.0e-05\nh: ''\ni: ???\n";
        let node = parse(text, "f").unwrap().unwrap();
        let printed = to_yaml(&node);
        assert_eq!(printed, text);
        let again = parse(&printed, "f").unwrap().unwrap();
        assert_eq!(again.to_json(), node.to_json());
    }
    /// Nine levels, each nine aliases of the level before ("billion laughs"): 387 million nodes if expanded.
    fn alias_bomb(mappings: bool) -> String {
        let mut text = format!("a: &a [{}]\n", ["\"lol\""; 9].join(", "));
        for (prev, name) in "abcdefgh".chars().zip("bcdefghi".chars()) {
            let items: Vec<String> = (0..9)
                .map(|i| {
                    if mappings {
                        format!("k{i}: *{prev}")
                    } else {
                        format!("*{prev}")
                    }
                })
                .collect();
            let (open, close) = if mappings { ('{', '}') } else { ('[', ']') };
            text.push_str(&format!(
                "{name}: &{name} {open}{}{close}\n",
                items.join(", ")
            ));
        }
        text
    }

    #[rstest]
    #[case::lists(false)]
    #[case::mappings(true)]
    fn alias_bomb_fails_fast_with_file_and_line(#[case] mappings: bool) {
        let text = alias_bomb(mappings);
        let start = std::time::Instant::now();
        let err = parse(&text, "conf/bomb.yaml").unwrap_err();
        assert!(
            start.elapsed() < std::time::Duration::from_secs(1),
            "{:?}",
            start.elapsed()
        );
        // Level f (line 6) is the first whose aliases would pass 100 000 nodes.
        assert_eq!(
            (err.path.as_str(), err.line),
            ("conf/bomb.yaml", 6),
            "{err}"
        );
        assert!(err.to_string().starts_with("conf/bomb.yaml:6:"), "{err}");
        assert!(
            err.message
                .contains("alias expansion exceeds 100000 nodes: a YAML alias bomb?"),
            "{err}"
        );
    }

    #[test]
    fn alias_budget_grows_with_the_file() {
        // 9 aliases of a 15 001-node list copy 135 009 nodes: over 100 000, under ten times the file's own.
        let items: Vec<String> = (0..15_000).map(|i| i.to_string()).collect();
        let text = format!(
            "a: &a [{}]\nb: [{}]\n",
            items.join(", "),
            ["*a"; 9].join(", ")
        );
        let node = parse(&text, "f").unwrap().unwrap();
        assert_eq!(node.get("b.8.14999").unwrap().value, Value::Int(14999));
        // Eleven are more than ten times the file's own nodes.
        let text = format!(
            "a: &a [{}]\nb: [{}]\n",
            items.join(", "),
            ["*a"; 11].join(", ")
        );
        let err = parse(&text, "f").unwrap_err();
        assert_eq!(err.line, 2, "{err}");
        assert!(
            err.message.contains("alias expansion exceeds 150050 nodes"),
            "{err}"
        );
    }

    #[test]
    fn nested_aliases_and_merges_still_work() {
        let text = "base: &base {x: 1, y: [1, 2]}\nmid: &mid {inner: *base, list: [*base, *base]}\ntop:\n  m: *mid\n  <<: *base\n  y: 3\n";
        let node = parse(text, "f").unwrap().unwrap();
        assert_eq!(node.get("top.m.list.1.y.1").unwrap().value, Value::Int(2));
        assert_eq!(node.get("top.m.inner.x").unwrap().value, Value::Int(1));
        assert_eq!(node.get("top.x").unwrap().value, Value::Int(1));
        assert_eq!(node.get("top.y").unwrap().value, Value::Int(3));
        // PyYAML puts merged keys first; the key written here keeps the merged key's place.
        let top: Vec<&str> = node
            .get("top")
            .unwrap()
            .as_map()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(top, ["x", "y", "m"]);
    }

    #[rstest]
    // Expected output from OmegaConf 2.3 (`OmegaConf.to_yaml(OmegaConf.load(...))`).
    #[case(
        "a: &a {x: 1, 'y': 2}\nb: &b {'y': 3, z: 4}\nc:\n  w: 0\n  <<: [*a, *b]\n  x: 9\n",
        "a:\n  x: 1\n  'y': 2\nb:\n  'y': 3\n  z: 4\nc:\n  x: 9\n  'y': 2\n  z: 4\n  w: 0\n"
    )]
    #[case(
        "a: &a {x: 1}\nb: &b {x: 2, q: 1}\nc:\n  <<: *a\n  <<: *b\n",
        "a:\n  x: 1\nb:\n  x: 2\n  q: 1\nc:\n  x: 1\n  q: 1\n"
    )]
    fn merge_keys_as_pyyaml_flattens_them(#[case] text: &str, #[case] expected: &str) {
        assert_eq!(to_yaml(&parse(text, "f").unwrap().unwrap()), expected);
    }

    #[test]
    fn recursive_alias_is_an_error() {
        let err = parse("a: &a [1, *a]\n", "f").unwrap_err();
        assert_eq!(err.line, 1);
        assert!(err.message.contains("recursive alias"), "{err}");
    }

    #[test]
    fn deep_nesting_is_refused_not_a_stack_overflow() {
        let text = format!("a:\n{}1\n", "- ".repeat(MAX_DEPTH + 10));
        let err = std::thread::Builder::new()
            .stack_size(64 << 20)
            .spawn(move || parse(&text, "f").unwrap_err())
            .unwrap()
            .join()
            .unwrap();
        assert!(err.message.contains("nested more than 1000 deep"), "{err}");
    }

    #[rstest]
    // (text, line the error is found at, where the broken construct began)
    #[case::unclosed_flow_sequence(
        "a: 1\nb: [1, 2\nc: 3\n",
        3,
        "while parsing a flow sequence that began at f.yaml:2:4"
    )]
    #[case::unclosed_flow_mapping(
        "a: 1\nb: {x: 1\nc: 3\n",
        3,
        "while parsing a flow mapping that began at f.yaml:2:4"
    )]
    #[case::unclosed_at_end(
        "a:\n  b: [1, {x: 2, y: [3\n",
        3,
        "flow sequence that began at f.yaml:2:20"
    )]
    // saphyr notices the missing `]` only at the end of the input.
    #[case::unclosed_in_list("a:\n  - [1, 2\n  - 3\n", 4, "flow sequence that began at f.yaml:2:5")]
    // An unclosed quote is reported where it opened.
    #[case::unclosed_quote("a: 'abc\nb: 1\n", 1, "quoted scalar")]
    fn syntax_errors_name_where_the_construct_began(
        #[case] text: &str,
        #[case] line: usize,
        #[case] began: &str,
    ) {
        let err = parse(text, "f.yaml").unwrap_err();
        assert_eq!(err.line, line, "{err}");
        assert!(err.message.contains(began), "{err}");
        assert!(
            err.to_string().starts_with(&format!("f.yaml:{line}:")),
            "{err}"
        );
    }

    #[rstest]
    #[case::tab_indentation("a:\n\tb: 1\n", 2)]
    #[case::bad_indentation("a:\n  b: 1\n c: 2\n", 3)]
    #[case::bad_indentation_deeper("a:\n    b: 1\n  c: 2\n", 3)]
    #[case::sequence_then_key("a:\n  - 1\n  b: 2\n", 3)]
    #[case::mapping_value_in_scalar("a: b: c\n", 1)]
    fn other_syntax_errors_keep_file_and_line(#[case] text: &str, #[case] line: usize) {
        let err = parse(text, "f.yaml").unwrap_err();
        assert_eq!((err.path.as_str(), err.line), ("f.yaml", line), "{err}");
        assert!(err.col >= 1, "{err}");
    }

    #[rstest]
    // OmegaConf: "Incompatible key type 'NoneType'" with the full key of the mapping (its quirk: `a0` for a[0]).
    #[case("a: 1\nb:\n  null: 1\n", 3, "b")]
    #[case("null: 1\n", 1, "")]
    #[case("~: 1\n", 1, "")]
    #[case("a:\n  - {null: 1}\n", 2, "a0")]
    #[case("a: {b: [1, {~: 1}]}\n", 1, "a.b1")]
    #[case("a: [[{null: 1}]]\n", 1, "a[0]0")]
    #[case("a: [{b: [{c: {null: 1}}]}]\n", 1, "a[0].b[0].c")]
    #[case("a: {1: {null: 1}}\n", 1, "a.1")]
    fn null_keys_are_refused_as_omegaconf_refuses_them(
        #[case] text: &str,
        #[case] line: usize,
        #[case] full_key: &str,
    ) {
        let err = parse(text, "f.yaml").unwrap_err();
        assert_eq!(err.line, line, "{err}");
        assert!(
            err.message.starts_with(&format!(
                "Incompatible key type 'NoneType'\n    full_key: {full_key}\n    object_type=dict"
            )),
            "{err}"
        );
    }

    #[rstest]
    // Expected output from OmegaConf 2.3: `OmegaConf.to_yaml(OmegaConf.load(text))`.
    #[case("{123: 1}", "123: 1\n")]
    #[case("{'123': 1}", "'123': 1\n")]
    #[case("{1.5: a}", "1.5: a\n")]
    #[case("{'1.5': 1}", "'1.5': 1\n")]
    #[case("{true: 1}", "true: 1\n")]
    #[case("{'true': 1}", "'true': 1\n")]
    #[case("{yes: a}", "true: a\n")]
    #[case("{0x10: a}", "16: a\n")]
    #[case("{1e3: a}", "1000.0: a\n")]
    #[case("{1.0: a}", "1.0: a\n")]
    #[case("{.inf: a}", ".inf: a\n")]
    #[case("{-1: a}", "-1: a\n")]
    #[case("{1_000: a}", "1000: a\n")]
    #[case("{'null': 1}", "'null': 1\n")]
    #[case("{1: a, 1: b}", "1: b\n")]
    #[case("{1: a, 1.0: b}", "1: b\n")]
    #[case("{true: a, 1: b}", "true: b\n")]
    #[case("{1.5: a, 1.50: b}", "1.5: b\n")]
    #[case("{.nan: a, .nan: b}", ".nan: b\n")]
    #[case("{abc: 1, 5: {6: x}}", "abc: 1\n5:\n  6: x\n")]
    #[case("{!!int '5': a}", "5: a\n")]
    #[case("{!!float '5': a}", "5.0: a\n")]
    #[case("{<<: {a: 1}, 1: b}", "a: 1\n1: b\n")]
    #[case("a:\n  &k 1: x\n  b: *k\n", "a:\n  1: x\n  b: 1\n")]
    fn yaml_keys_keep_their_type(#[case] text: &str, #[case] expected: &str) {
        let node = parse(text, "f").unwrap().unwrap();
        assert_eq!(to_yaml(&node), expected, "{text}");
    }

    #[rstest]
    #[case(
        "{'a': 1, a: 2}",
        1,
        "while constructing a mapping: found duplicate key a, first written at f:1:2"
    )]
    #[case("{1: a, '1': b}", 1, "found the int key 1 and the string key '1'")]
    #[case("{? [1] : a}", 1, "found unhashable key")]
    fn bad_keys(#[case] text: &str, #[case] line: usize, #[case] message: &str) {
        let err = parse(text, "f").unwrap_err();
        assert_eq!(err.line, line, "{err}");
        assert!(err.message.contains(message), "{err}");
    }

    #[test]
    fn json_keys_stay_strings() {
        let node = parse("{123: 1, 1.5: a, true: b, x: c}", "f")
            .unwrap()
            .unwrap();
        assert_eq!(
            node.to_json(),
            serde_json::json!({"123": 1, "1.5": "a", "true": "b", "x": "c"})
        );
        assert_eq!(
            node.value.display_python(),
            "{123: 1, 1.5: 'a', True: 'b', 'x': 'c'}"
        );
    }

    #[rstest]
    // `+x=<value>` as hydra-core 1.3.2 prints it with `--cfg job`.
    #[case("{123: 1}", "x:\n  123: 1\n")]
    #[case("{1.5: a}", "x:\n  1.5: a\n")]
    #[case("{true: 1}", "x:\n  true: 1\n")]
    #[case("{TRUE: 1}", "x:\n  true: 1\n")]
    #[case("{1e3: a}", "x:\n  1000.0: a\n")]
    #[case("{inf: 1}", "x:\n  .inf: 1\n")]
    #[case("{-inf: 1}", "x:\n  -.inf: 1\n")]
    #[case("{nan: 1}", "x:\n  .nan: 1\n")]
    #[case("{a b: 1}", "x:\n  a b: 1\n")]
    #[case("{1_000: 1}", "x:\n  1000: 1\n")]
    #[case("{-1: a}", "x:\n  -1: a\n")]
    #[case("{ 12 : a}", "x:\n  12: a\n")]
    #[case("{0x10: a}", "x:\n  '0x10': a\n")]
    #[case("{a: {1: b}}", "x:\n  a:\n    1: b\n")]
    #[case("{1:a,1.0:b}", "x:\n  1: b\n")]
    #[case("{true:a,1:b}", "x:\n  true: b\n")]
    #[case("{1:a,1:b}", "x:\n  1: b\n")]
    #[case("{1.: a}", "x:\n  1.0: a\n")]
    #[case("{.5: a}", "x:\n  0.5: a\n")]
    #[case("{10e-3: a}", "x:\n  0.01: a\n")]
    fn override_dict_keys_print_as_hydra_prints_them(#[case] value: &str, #[case] expected: &str) {
        use crate::config::grammar::{parse_override, ParsedValue};
        let parsed = parse_override(&format!("+x={value}")).unwrap();
        let Some(ParsedValue::Element(e)) = parsed.value else {
            panic!("{value} is not an element")
        };
        let node = crate::config::compose::element_to_node(&e, &Source::Internal);
        assert_eq!(to_yaml(&node.wrap_in_package("x")), expected, "{value}");
    }

    #[rstest]
    // The full key hydra-core 1.3.2 names in "Error merging override ... Incompatible key type 'NoneType'".
    #[case("{null: 1}", "x")]
    #[case("{NULL: 1}", "x")]
    #[case("[{null: 1}]", "x0")]
    #[case("[[{null: 1}]]", "x[0]0")]
    #[case("{a: {null: 1}}", "x.a")]
    #[case("{b: [1, {c: {null: 1}}]}", "x.b[1].c")]
    #[case("{1.5: {null: 1}}", "x.1.5")]
    fn override_null_keys_name_omegaconf_full_key(#[case] value: &str, #[case] full_key: &str) {
        use crate::config::grammar::{parse_override, ParsedValue};
        let parsed = parse_override(&format!("+x={value}")).unwrap();
        let Some(ParsedValue::Element(e)) = parsed.value else {
            panic!("{value} is not an element")
        };
        assert_eq!(e.null_key("x").as_deref(), Some(full_key));
    }

    #[rstest]
    // Expected output from OmegaConf 2.3: `OmegaConf.to_yaml({"k": text})` after `k: `.
    #[case("y", "'y'")]
    #[case("N", "'N'")]
    #[case("inf", "'inf'")]
    #[case("nan", "'nan'")]
    #[case("Infinity", "'Infinity'")]
    #[case("-inf", "'-inf'")]
    #[case("+inf", "'+inf'")]
    #[case("1_000", "'1_000'")]
    #[case("0_1", "'0_1'")]
    #[case("1__0", "'1__0'")]
    #[case("_1", "_1")]
    #[case("1e5", "'1e5'")]
    #[case("1.", "'1.'")]
    #[case(".5", "'.5'")]
    #[case("-.5", "'-.5'")]
    #[case("+.5", "'+.5'")]
    #[case("+1", "'+1'")]
    #[case("-0", "'-0'")]
    #[case("09", "'09'")]
    #[case("0x10", "'0x10'")]
    #[case("0o7", "0o7")]
    #[case("0b1", "'0b1'")]
    #[case("1:30", "'1:30'")]
    #[case("12:30:45", "'12:30:45'")]
    #[case("~", "'~'")]
    #[case("null", "'null'")]
    #[case("yes", "'yes'")]
    #[case("on", "'on'")]
    #[case("2024-01-01", "'2024-01-01'")]
    #[case("2024-1-1 10:00:00", "'2024-1-1 10:00:00'")]
    #[case("2001-12-14t21:59:43.10-05:00", "'2001-12-14t21:59:43.10-05:00'")]
    #[case("1.2.3", "1.2.3")]
    #[case("1e", "1e")]
    #[case("1,000", "1,000")]
    #[case("-", "'-'")]
    #[case("-x", "-x")]
    #[case("- x", "'- x'")]
    #[case("?x", "?x")]
    #[case("? x", "'? x'")]
    #[case(":x", ":x")]
    #[case("a:", "'a:'")]
    #[case("a:b", "a:b")]
    #[case("a: b", "'a: b'")]
    #[case("#x", "'#x'")]
    #[case("a #b", "'a #b'")]
    #[case("a#b", "a#b")]
    #[case(" x", "' x'")]
    #[case("x ", "'x '")]
    #[case("", "''")]
    #[case("${a}", "${a}")]
    #[case("'q'", "'''q'''")]
    #[case("@x", "'@x'")]
    #[case(",x", "',x'")]
    #[case("x,y", "x,y")]
    #[case("x[0]", "x[0]")]
    #[case("=x", "=x")]
    #[case("=", "'='")]
    #[case("<<", "'<<'")]
    #[case("---", "'---'")]
    #[case("...", "'...'")]
    #[case("--", "--")]
    #[case("a'b", "a'b")]
    #[case("tab\there", "\"tab\\there\"")]
    #[case("é", "é")]
    fn strings_quoted_as_omegaconf_quotes_them(#[case] text: &str, #[case] expected: &str) {
        assert_eq!(quote_if_needed(text), expected, "{text:?}");
    }
}
