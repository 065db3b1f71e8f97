//! YAML in and out. Reading keeps the line and column of every value; plain scalars are typed with the
//! rules of OmegaConf's loader (PyYAML's YAML 1.1 resolvers, no timestamps, plus `1e3`-style floats) so a
//! file means here what it means under Hydra. Writing produces the block style `OmegaConf.to_yaml` prints.

use super::tree::{python_float_repr, Map, Node, Source, Value};
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

/// Parse one YAML document. An empty document is `None` (Hydra treats it as an empty config).
pub fn parse(text: &str, path: &str) -> Result<Option<Node>, YamlError> {
    let path: Arc<str> = Arc::from(path);
    let mut builder = Builder {
        events: Parser::new_from_str(text),
        path: path.clone(),
        anchors: HashMap::new(),
    };
    builder.document()
}

struct Builder<'a> {
    events: Parser<'a, saphyr_parser::StrInput<'a>>,
    path: Arc<str>,
    anchors: HashMap<usize, Node>,
}

impl<'a> Builder<'a> {
    fn error(&self, span: Span, message: impl Into<String>) -> YamlError {
        YamlError {
            path: self.path.to_string(),
            line: span.start.line(),
            col: span.start.col() + 1,
            message: message.into(),
        }
    }

    fn next(&mut self) -> Result<(Event<'a>, Span), YamlError> {
        match self.events.next() {
            Some(Ok(ev)) => Ok(ev),
            Some(Err(e)) => Err(YamlError {
                path: self.path.to_string(),
                line: e.marker().line(),
                col: e.marker().col() + 1,
                message: e.info().to_string(),
            }),
            None => Err(YamlError {
                path: self.path.to_string(),
                line: 0,
                col: 0,
                message: "unexpected end of YAML".into(),
            }),
        }
    }

    fn document(&mut self) -> Result<Option<Node>, YamlError> {
        let mut result = None;
        loop {
            let (event, span) = self.next()?;
            match event {
                Event::StreamStart | Event::DocumentEnd => {}
                Event::DocumentStart(_) => {
                    if result.is_some() {
                        return Err(self.error(
                            span,
                            "expected a single document in the stream but found another document",
                        ));
                    }
                    let (event, span) = self.next()?;
                    if matches!(event, Event::DocumentEnd) {
                        continue;
                    }
                    result = Some(self.node(event, span)?);
                }
                Event::StreamEnd => return Ok(result),
                _ => return Err(self.error(span, "unexpected YAML event")),
            }
        }
    }

    fn node(&mut self, event: Event<'a>, span: Span) -> Result<Node, YamlError> {
        let source = Source::file(&self.path, span.start.line(), span.start.col() + 1);
        match event {
            Event::Scalar(text, style, anchor, tag) => {
                let tag = tag.map(|t| format!("{}{}", t.handle, t.suffix));
                let value = self.scalar(&text, style, tag.as_deref(), span)?;
                let node = Node::new(value, source);
                self.remember(anchor, &node);
                Ok(node)
            }
            Event::Alias(id) => self
                .anchors
                .get(&id)
                .cloned()
                .ok_or_else(|| self.error(span, "found undefined alias")),
            Event::SequenceStart(anchor, _) => {
                let mut items = Vec::new();
                loop {
                    let (event, span) = self.next()?;
                    if matches!(event, Event::SequenceEnd) {
                        break;
                    }
                    items.push(self.node(event, span)?);
                }
                let node = Node::new(Value::List(items), source);
                self.remember(anchor, &node);
                Ok(node)
            }
            Event::MappingStart(anchor, _) => {
                let mut map = Map::new();
                let mut merges: Vec<Node> = Vec::new();
                loop {
                    let (event, key_span) = self.next()?;
                    if matches!(event, Event::MappingEnd) {
                        break;
                    }
                    let key_node = self.node(event, key_span)?;
                    let (event, value_span) = self.next()?;
                    let value = self.node(event, value_span)?;
                    let key = match &key_node.value {
                        Value::Str(s) if s == "<<" => {
                            merges.push(value);
                            continue;
                        }
                        Value::Str(s) => s.clone(),
                        Value::Int(i) => i.to_string(),
                        Value::Bool(b) => if *b { "true" } else { "false" }.to_string(),
                        Value::Float(x) => python_float_repr(*x),
                        Value::Null => "null".to_string(),
                        _ => {
                            return Err(self.error(key_span, "a mapping key must be a scalar"));
                        }
                    };
                    if map.contains_key(&key) {
                        return Err(self.error(key_span, format!("found duplicate key {key}")));
                    }
                    map.insert(key, value);
                }
                // `<<: *base` (YAML merge key): keys written here win over merged ones.
                for merge in merges {
                    let sources = match merge.value {
                        Value::List(items) => items,
                        other => vec![Node::new(other, merge.source)],
                    };
                    for src in sources {
                        if let Value::Map(m) = src.value {
                            for (k, v) in m {
                                map.entry(k).or_insert(v);
                            }
                        } else {
                            return Err(self.error(span, "a merge key (<<) needs a mapping"));
                        }
                    }
                }
                let node = Node::new(Value::Map(map), source);
                self.remember(anchor, &node);
                Ok(node)
            }
            _ => Err(self.error(span, "unexpected YAML event")),
        }
    }

    fn remember(&mut self, anchor: usize, node: &Node) {
        if anchor != 0 {
            self.anchors.insert(anchor, node.clone());
        }
    }

    fn scalar(
        &self,
        text: &str,
        style: ScalarStyle,
        tag: Option<&str>,
        span: Span,
    ) -> Result<Value, YamlError> {
        let missing_or_str = |s: &str| {
            if s == "???" {
                Value::Missing
            } else {
                Value::Str(s.to_string())
            }
        };
        if let Some(tag) = tag {
            let suffix = tag
                .trim_start_matches("tag:yaml.org,2002:")
                .trim_start_matches("!!");
            return match suffix {
                "str" => Ok(missing_or_str(text)),
                "int" => parse_int(text)
                    .map(Value::Int)
                    .ok_or_else(|| self.error(span, format!("'{text}' is not an int"))),
                "float" => parse_float(text)
                    .or_else(|| parse_int(text).map(|i| i as f64))
                    .map(Value::Float)
                    .ok_or_else(|| self.error(span, format!("'{text}' is not a float"))),
                "bool" => parse_bool(text)
                    .map(Value::Bool)
                    .ok_or_else(|| self.error(span, format!("'{text}' is not a bool"))),
                "null" => Ok(Value::Null),
                other => Err(self.error(
                    span,
                    format!("could not determine a constructor for the tag '{other}'"),
                )),
            };
        }
        if style != ScalarStyle::Plain {
            return Ok(missing_or_str(text));
        }
        Ok(resolve_plain(text))
    }
}

/// Type a plain (unquoted) scalar the way OmegaConf's YAML loader does.
pub fn resolve_plain(text: &str) -> Value {
    if matches!(text, "" | "~" | "null" | "Null" | "NULL") {
        return Value::Null;
    }
    if let Some(b) = parse_bool(text) {
        return Value::Bool(b);
    }
    if is_pyyaml_float(text) || is_omegaconf_exp_float(text) {
        if let Some(x) = parse_float(text) {
            return Value::Float(x);
        }
    }
    if let Some(i) = parse_int(text) {
        return Value::Int(i);
    }
    if text == "???" {
        return Value::Missing;
    }
    Value::Str(text.to_string())
}

fn parse_bool(text: &str) -> Option<bool> {
    match text {
        "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => Some(true),
        "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => Some(false),
        _ => None,
    }
}

fn split_sign(text: &str) -> (bool, &str) {
    match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    }
}

fn all_digits(s: &str, radix: u32) -> bool {
    !s.is_empty() && s.chars().all(|c| c == '_' || c.is_digit(radix))
}

/// PyYAML 1.1 ints: decimal with `_`, `0b`, `0x`, leading-zero octal, and sexagesimal `1:30`.
fn parse_int(text: &str) -> Option<i64> {
    let (negative, body) = split_sign(text);
    let magnitude: i64 = if let Some(bin) = body.strip_prefix("0b") {
        if !all_digits(bin, 2) {
            return None;
        }
        i64::from_str_radix(&bin.replace('_', ""), 2).ok()?
    } else if let Some(hex) = body.strip_prefix("0x") {
        if !all_digits(hex, 16) {
            return None;
        }
        i64::from_str_radix(&hex.replace('_', ""), 16).ok()?
    } else if body.len() > 1 && body.starts_with('0') {
        if !all_digits(body, 8) {
            return None;
        }
        i64::from_str_radix(&body.replace('_', ""), 8).ok()?
    } else if body == "0" {
        0
    } else if body.contains(':') {
        let mut parts = body.split(':');
        let first = parts.next()?;
        if !first.starts_with(|c: char| ('1'..='9').contains(&c)) || !all_digits(first, 10) {
            return None;
        }
        let mut total: i64 = first.replace('_', "").parse().ok()?;
        for part in parts {
            if part.is_empty() || part.len() > 2 || !part.chars().all(|c| c.is_ascii_digit()) {
                return None;
            }
            let v: i64 = part.parse().ok()?;
            if v > 59 {
                return None;
            }
            total = total.checked_mul(60)?.checked_add(v)?;
        }
        total
    } else {
        if !body.starts_with(|c: char| ('1'..='9').contains(&c)) || !all_digits(body, 10) {
            return None;
        }
        body.replace('_', "").parse().ok()?
    };
    Some(if negative { -magnitude } else { magnitude })
}

/// PyYAML's float resolver: needs a dot, or is `.inf`/`.nan`.
fn is_pyyaml_float(text: &str) -> bool {
    let (_, body) = split_sign(text);
    if matches!(body, ".inf" | ".Inf" | ".INF") {
        return true;
    }
    if matches!(text, ".nan" | ".NaN" | ".NAN") {
        return true;
    }
    if let Some(rest) = text.strip_prefix('.') {
        // `.5`, `.5e+3` (no sign allowed before the dot in this form)
        let (digits, exp) = split_exponent(rest);
        return all_digits_nonempty_start(digits)
            && exp.is_none_or(|e| {
                e.starts_with(['+', '-'])
                    && e.len() > 1
                    && e[1..].chars().all(|c| c.is_ascii_digit())
            });
    }
    let Some((int_part, frac)) = body.split_once('.') else {
        return false;
    };
    if int_part.contains(':') {
        return false; // sexagesimal floats are rare enough to treat as strings
    }
    let (frac_digits, exp) = split_exponent(frac);
    all_digits_nonempty_start(int_part)
        && frac_digits.chars().all(|c| c.is_ascii_digit() || c == '_')
        && exp.is_none_or(|e| {
            let e = e.strip_prefix(['+', '-']).unwrap_or(e);
            !e.is_empty() && e.chars().all(|c| c.is_ascii_digit())
        })
}

/// OmegaConf's addition: `1e3`, `-2E-5` (exponent without a dot).
fn is_omegaconf_exp_float(text: &str) -> bool {
    let (_, body) = split_sign(text);
    let (mantissa, exp) = split_exponent(body);
    match exp {
        Some(e) => {
            let e = e.strip_prefix(['+', '-']).unwrap_or(e);
            all_digits_nonempty_start(mantissa)
                && !e.is_empty()
                && e.chars().all(|c| c.is_ascii_digit())
        }
        None => false,
    }
}

fn all_digits_nonempty_start(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_digit()) && all_digits(s, 10)
}

fn split_exponent(s: &str) -> (&str, Option<&str>) {
    match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    }
}

fn parse_float(text: &str) -> Option<f64> {
    let cleaned = text.replace('_', "").to_ascii_lowercase();
    let (negative, body) = split_sign(&cleaned);
    let magnitude = match body {
        ".inf" => f64::INFINITY,
        ".nan" => f64::NAN,
        _ => body.parse::<f64>().ok()?,
    };
    Some(if negative { -magnitude } else { magnitude })
}

/// Read the `# @package x` header the way Hydra does: leading comment lines only.
pub fn package_header(text: &str) -> Result<Option<String>, String> {
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let Some(comment) = line.strip_prefix('#') else {
            break;
        };
        let comment = comment.trim_start_matches('#').trim();
        if !comment.starts_with('@') {
            break;
        }
        let parts: Vec<&str> = comment.split(' ').filter(|s| !s.is_empty()).collect();
        if parts.len() < 2 {
            return Err(format!(
                "Expected header format: KEY VALUE, got '{comment}'"
            ));
        }
        if parts.len() > 2 {
            return Err(format!("Too many components in '{comment}'"));
        }
        if parts[0] == "@package" {
            return Ok(Some(parts[1].to_string()));
        }
    }
    Ok(None)
}

/// Print a tree as block-style YAML, as `OmegaConf.to_yaml` does (keys in order, `${..}` kept).
pub fn to_yaml(node: &Node) -> String {
    let mut out = String::new();
    match &node.value {
        Value::Map(m) if m.is_empty() => out.push_str("{}\n"),
        Value::List(l) if l.is_empty() => out.push_str("[]\n"),
        Value::Map(_) | Value::List(_) => write_block(&mut out, node, 0),
        _ => {
            out.push_str(&scalar_text(&node.value));
            out.push('\n');
        }
    }
    out
}

fn write_block(out: &mut String, node: &Node, indent: usize) {
    let pad = " ".repeat(indent);
    match &node.value {
        Value::Map(m) => {
            for (key, value) in m {
                out.push_str(&pad);
                out.push_str(&quote_if_needed(key));
                out.push(':');
                write_child(out, value, indent, false);
            }
        }
        Value::List(l) => {
            for item in l {
                out.push_str(&pad);
                out.push('-');
                write_child(out, item, indent, true);
            }
        }
        _ => {}
    }
}

fn write_child(out: &mut String, value: &Node, indent: usize, in_list: bool) {
    match &value.value {
        Value::Map(m) if !m.is_empty() => {
            if in_list {
                // `- a: 1` then siblings aligned under `a`
                let mut nested = String::new();
                write_block(&mut nested, value, indent + 2);
                out.push(' ');
                out.push_str(nested.trim_start());
            } else {
                out.push('\n');
                write_block(out, value, indent + 2);
            }
        }
        Value::List(l) if !l.is_empty() => {
            if in_list {
                let mut nested = String::new();
                write_block(&mut nested, value, indent + 2);
                out.push(' ');
                out.push_str(nested.trim_start());
            } else {
                // PyYAML's default: sequences inside mappings are not indented.
                out.push('\n');
                write_block(out, value, indent);
            }
        }
        _ => {
            out.push(' ');
            out.push_str(&scalar_text(&value.value));
            out.push('\n');
        }
    }
}

fn scalar_text(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Int(i) => i.to_string(),
        Value::Float(x) if x.is_nan() => ".nan".into(),
        Value::Float(x) if x.is_infinite() => if *x > 0.0 { ".inf" } else { "-.inf" }.into(),
        Value::Float(x) => {
            let s = python_float_repr(*x);
            // PyYAML writes 1e-05 as 1.0e-05 so it reads back as a float.
            if s.contains('e') && !s.contains('.') {
                s.replacen('e', ".0e", 1)
            } else {
                s
            }
        }
        Value::Str(s) => quote_if_needed(s),
        Value::Missing => "???".into(),
        Value::Map(_) => "{}".into(),
        Value::List(_) => "[]".into(),
    }
}

/// Quote a string when leaving it plain would change its meaning or break the YAML.
pub fn quote_if_needed(s: &str) -> String {
    let needs_double = s.chars().any(|c| c.is_control());
    if needs_double {
        let escaped: String = s
            .chars()
            .map(|c| match c {
                '\n' => "\\n".to_string(),
                '\t' => "\\t".to_string(),
                '"' => "\\\"".to_string(),
                '\\' => "\\\\".to_string(),
                c if c.is_control() => format!("\\x{:02x}", c as u32),
                c => c.to_string(),
            })
            .collect();
        return format!("\"{escaped}\"");
    }
    let plain_changes_type = !matches!(resolve_plain(s), Value::Str(_));
    let first = s.chars().next();
    let bad_start = matches!(
        first,
        None | Some(
            '-' | '?'
                | ':'
                | ','
                | '['
                | ']'
                | '{'
                | '}'
                | '#'
                | '&'
                | '*'
                | '!'
                | '|'
                | '>'
                | '\''
                | '"'
                | '%'
                | '@'
                | '`'
                | ' '
        )
    ) && !(first == Some('-') && s.len() > 1 && !s[1..].starts_with(' '));
    let bad_inside = s.contains(": ") || s.contains(" #") || s.ends_with(' ') || s.ends_with(':');
    if plain_changes_type || bad_start || bad_inside {
        format!("'{}'", s.replace('\'', "''"))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

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
        let text = "a: 1\nb:\n  c: '1'\n  d:\n  - x\n  - y: 2\n    z: 3\ne: ${a}\nf: null\ng: 1.0e-05\nh: ''\ni: ???\n";
        let node = parse(text, "f").unwrap().unwrap();
        let printed = to_yaml(&node);
        assert_eq!(printed, text);
        let again = parse(&printed, "f").unwrap().unwrap();
        assert_eq!(again.to_json(), node.to_json());
    }
}
