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

/// Parse one YAML document. An empty document is `None` (Hydra treats it as an empty config).
pub fn parse(text: &str, path: &str) -> Result<Option<Node>, YamlError> {
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
    };
    builder.document()
}

/// A collection whose start event has been read and whose end has not: what a syntax error is inside.
#[derive(Debug, Clone, Copy)]
struct Open {
    construct: Construct,
    line: usize,
    /// 1-based.
    col: usize,
    anchor: usize,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Construct {
    FlowSequence,
    FlowMapping,
    BlockSequence,
    BlockMapping,
}

impl Construct {
    /// The words the YAML scanner and parser (libyaml's, PyYAML's) use for it.
    fn name(self) -> &'static str {
        match self {
            Construct::FlowSequence => "flow sequence",
            Construct::FlowMapping => "flow mapping",
            Construct::BlockSequence => "block collection",
            Construct::BlockMapping => "block mapping",
        }
    }
    fn hint(self) -> &'static str {
        match self {
            Construct::FlowSequence => "is a closing ']' missing, or a ',' between items?",
            Construct::FlowMapping => "is a closing '}' missing, or a ',' between entries?",
            Construct::BlockSequence | Construct::BlockMapping => {
                "check the indentation of this line against the lines above it"
            }
        }
    }
}

/// One step of the key path to the node being built, for OmegaConf's `full_key` in messages.
enum PathPart {
    Key(String),
    Index(usize),
}

/// A typed key's value as Python's dict compares keys: `1`, `1.0` and `true` are the same key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum NumKey {
    Int(i128),
    Float(u64),
}

fn num_key(value: &Value) -> Option<NumKey> {
    Some(match value {
        Value::Int(i) => NumKey::Int(*i as i128),
        Value::Bool(b) => NumKey::Int(*b as i128),
        // PyYAML returns one shared NaN object, so two `.nan` keys are one key.
        Value::Float(x) if x.is_nan() => NumKey::Float(f64::NAN.to_bits()),
        Value::Float(x) if x.fract() == 0.0 && x.abs() < 1e38 => NumKey::Int(*x as i128),
        Value::Float(x) => NumKey::Float(x.to_bits()),
        _ => return None,
    })
}

fn kind_name(kind: KeyKind) -> &'static str {
    match kind {
        KeyKind::Str => "string",
        KeyKind::Int => "int",
        KeyKind::Float => "float",
        KeyKind::Bool => "bool",
    }
}

struct Builder<'a> {
    text: &'a str,
    events: Parser<'a, saphyr_parser::StrInput<'a>>,
    path: Arc<str>,
    /// Each anchored node and its size in nodes.
    anchors: HashMap<usize, (Node, usize)>,
    /// Nodes written out in the document (scalars and collections, not aliases).
    written: usize,
    /// Nodes in the tree so far, written or copied by aliases (sizes anchored nodes).
    made: usize,
    /// Nodes copied by aliases so far, against the alias budget.
    aliased: usize,
    /// Collections opened and not yet closed, innermost last.
    open: Vec<Open>,
    keys: Vec<PathPart>,
    /// Character index just past the last event read.
    last_end: usize,
    /// (character index, byte offset) of the last character looked up, to walk the text forward.
    cursor: (usize, usize),
}

impl<'a> Builder<'a> {
    fn error(&self, span: Span, message: impl Into<String>) -> YamlError {
        self.error_at(span.start.line(), span.start.col() + 1, message)
    }

    fn error_at(&self, line: usize, col: usize, message: impl Into<String>) -> YamlError {
        YamlError {
            path: self.path.to_string(),
            line,
            col,
            message: message.into(),
        }
    }

    fn location(&self, line: usize, col: usize) -> String {
        format!("{}:{line}:{col}", self.path)
    }

    fn next(&mut self) -> Result<(Event<'a>, Span), YamlError> {
        match self.events.next() {
            Some(Ok((event, span))) => {
                self.last_end = span.end.index();
                Ok((event, span))
            }
            Some(Err(e)) => Err(self.error_at(
                e.marker().line(),
                e.marker().col() + 1,
                self.syntax_context(e.info()),
            )),
            None => Err(self.error_at(0, 0, "unexpected end of YAML")),
        }
    }

    /// A scanner or parser message with where the broken construct began, as PyYAML reports it ("while
    /// parsing a flow sequence in X, line 27, column 7 ... expected ',' or ']' ... line 28"): the position
    /// of the error itself is the `YamlError`'s line and column.
    fn syntax_context(&self, info: &str) -> String {
        for construct in [
            Construct::FlowSequence,
            Construct::FlowMapping,
            Construct::BlockSequence,
            Construct::BlockMapping,
        ] {
            let phrase = format!("while parsing a {}", construct.name());
            let Some(rest) = info.strip_prefix(phrase.as_str()) else {
                continue;
            };
            let Some(open) = self.open.iter().rev().find(|o| o.construct == construct) else {
                return info.to_string();
            };
            let rest = rest.trim_start_matches([',', ' ']);
            return format!(
                "{phrase} that began at {}, {rest} ({})",
                self.location(open.line, open.col),
                construct.hint()
            );
        }
        if let Some(rest) = info.strip_prefix("while scanning a quoted scalar") {
            if let Some((line, col)) = self.quote_start() {
                let rest = rest.trim_start_matches([',', ' ']);
                return format!(
                    "while scanning a quoted scalar that began at {}, {rest} (is its closing quote missing?)",
                    self.location(line, col)
                );
            }
            return info.to_string();
        }
        // Any other error inside an unclosed flow collection is most often that collection's doing.
        match self.open.iter().rev().find(|o| {
            matches!(
                o.construct,
                Construct::FlowSequence | Construct::FlowMapping
            )
        }) {
            Some(open) => format!(
                "{info}, while parsing a {} that began at {} ({})",
                open.construct.name(),
                self.location(open.line, open.col),
                open.construct.hint()
            ),
            None => info.to_string(),
        }
    }

    /// Line and 1-based column of the first quote after the last event read: the quoted scalar the scanner
    /// was inside when the text ran out.
    fn quote_start(&self) -> Option<(usize, usize)> {
        let (mut line, mut col) = (1, 1);
        for (i, c) in self.text.chars().enumerate() {
            if i >= self.last_end && (c == '\'' || c == '"') {
                return Some((line, col));
            }
            if c == '\n' {
                line += 1;
                col = 1;
            } else {
                col += 1;
            }
        }
        None
    }

    /// The character at a character index (events arrive in order, so the walk is forward).
    fn char_at(&mut self, index: usize) -> Option<char> {
        if index < self.cursor.0 {
            self.cursor = (0, 0);
        }
        let (mut i, mut byte) = self.cursor;
        while i < index {
            byte += self.text.get(byte..)?.chars().next()?.len_utf8();
            i += 1;
        }
        self.cursor = (i, byte);
        self.text.get(byte..)?.chars().next()
    }

    /// Record a collection's start; a flow collection's span ends just past its bracket.
    fn open(&mut self, span: Span, anchor: usize, mapping: bool) -> Result<(), YamlError> {
        if self.open.len() >= MAX_DEPTH {
            return Err(self.error(
                span,
                format!(
                    "collections nested more than {MAX_DEPTH} deep: flatten the structure of this file"
                ),
            ));
        }
        let bracket = span
            .end
            .index()
            .checked_sub(1)
            .and_then(|i| self.char_at(i));
        let (construct, line, col) = match bracket {
            Some('[') => (Construct::FlowSequence, span.end.line(), span.end.col()),
            Some('{') => (Construct::FlowMapping, span.end.line(), span.end.col()),
            _ => {
                let construct = if mapping {
                    Construct::BlockMapping
                } else {
                    Construct::BlockSequence
                };
                (construct, span.start.line(), span.start.col() + 1)
            }
        };
        self.open.push(Open {
            construct,
            line,
            col,
            anchor,
        });
        Ok(())
    }

    /// OmegaConf's `full_key` of the mapping being built (with its quirk: the dict at `a[0]` is `a0`).
    fn full_key(&self) -> String {
        let mut out = String::new();
        for (i, part) in self.keys.iter().enumerate() {
            match part {
                PathPart::Key(k) => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(k);
                }
                PathPart::Index(j) if i + 1 == self.keys.len() => out.push_str(&j.to_string()),
                PathPart::Index(j) => out.push_str(&format!("[{j}]")),
            }
        }
        out
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
                    (self.written, self.made, self.aliased) = (0, 0, 0);
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
                self.written += 1;
                self.made += 1;
                let tag = tag.map(|t| format!("{}{}", t.handle, t.suffix));
                let value = self.scalar(&text, style, tag.as_deref(), span)?;
                let node = Node::new(value, source);
                self.remember(anchor, &node, 1);
                Ok(node)
            }
            Event::Alias(id) => self.alias(id, span),
            Event::SequenceStart(anchor, _) => {
                let before = self.made;
                self.written += 1;
                self.made += 1;
                self.open(span, anchor, false)?;
                let mut items = Vec::new();
                loop {
                    let (event, span) = self.next()?;
                    if matches!(event, Event::SequenceEnd) {
                        break;
                    }
                    self.keys.push(PathPart::Index(items.len()));
                    let item = self.node(event, span)?;
                    self.keys.pop();
                    items.push(item);
                }
                self.open.pop();
                let node = Node::new(Value::List(items), source);
                self.remember(anchor, &node, self.made - before);
                Ok(node)
            }
            Event::MappingStart(anchor, _) => {
                let before = self.made;
                self.written += 1;
                self.made += 1;
                self.open(span, anchor, true)?;
                let map = self.mapping(span)?;
                self.open.pop();
                let node = Node::new(Value::Map(map), source);
                self.remember(anchor, &node, self.made - before);
                Ok(node)
            }
            _ => Err(self.error(span, "unexpected YAML event")),
        }
    }

    /// The entries of a mapping whose start event was just read, up to its end event.
    fn mapping(&mut self, span: Span) -> Result<Map, YamlError> {
        let mut map = Map::new();
        // Where each key was written, for duplicate-key messages.
        let mut written_at: HashMap<String, (usize, usize)> = HashMap::new();
        // Typed keys by value, to find `1` after `1.0` or `true`.
        let mut typed: HashMap<NumKey, String> = HashMap::new();
        let mut merges: Vec<(Node, Span)> = Vec::new();
        loop {
            let (event, key_span) = self.next()?;
            if matches!(event, Event::MappingEnd) {
                break;
            }
            // `<<` is a merge key only when plain (PyYAML resolves it to the merge tag).
            let is_merge =
                matches!(&event, Event::Scalar(t, ScalarStyle::Plain, _, None) if t == "<<");
            let key_node = self.node(event, key_span)?;
            let key = if is_merge {
                None
            } else {
                Some(self.key(&key_node, key_span)?)
            };
            let label = key.as_ref().map_or("<<", |(k, _)| k.as_str()).to_string();
            self.keys.push(PathPart::Key(label));
            let (event, value_span) = self.next()?;
            let value = self.node(event, value_span)?;
            self.keys.pop();
            let Some((key, kind)) = key else {
                merges.push((value, value_span));
                continue;
            };
            let here = (key_span.start.line(), key_span.start.col() + 1);
            let number = kind.typed(&key).as_ref().and_then(num_key);
            // A typed key equal to an earlier one as Python compares them (1 == 1.0 == true): the later
            // value replaces the earlier and the first key stays, as in the dict PyYAML builds.
            if let Some(first) = number.and_then(|n| typed.get(&n)) {
                if let Some(slot) = map.get_mut(first) {
                    let kind = slot.key_kind;
                    *slot = value.keyed(kind);
                    continue;
                }
            }
            if let Some(existing) = map.get(&key) {
                let (line, col) = written_at.get(&key).copied().unwrap_or((0, 0));
                let first = self.location(line, col);
                let message = if existing.key_kind == KeyKind::Str && kind == KeyKind::Str {
                    format!("found duplicate key {key}, first written at {first}")
                } else {
                    let show = |kind: KeyKind| match kind {
                        KeyKind::Str => format!("'{key}'"),
                        _ => key.clone(),
                    };
                    format!(
                        "found the {} key {} and the {} key {} (first written at {first}): OmegaConf keeps both, \
                         trainyard compares keys by their text and cannot; rename one of them",
                        kind_name(existing.key_kind),
                        show(existing.key_kind),
                        kind_name(kind),
                        show(kind),
                    )
                };
                return Err(self.error(key_span, message));
            }
            if let Some(n) = number {
                typed.insert(n, key.clone());
            }
            written_at.insert(key.clone(), here);
            map.insert(key, value.keyed(kind));
        }
        if merges.is_empty() {
            return Ok(map);
        }
        // `<<: *base` (YAML merge key), as PyYAML flattens it: merged keys come first, in the order of the
        // merged mappings, the first mapping to name a key wins, and keys written here win over all of them.
        let mut merged = Map::new();
        for (merge, merge_span) in merges {
            let sources = match merge.value {
                Value::List(items) => items,
                other => vec![Node::new(other, merge.source)],
            };
            for src in sources {
                let Value::Map(m) = src.value else {
                    return Err(self.error(
                        merge_span,
                        format!(
                            "while constructing the mapping that began at {}, expected a mapping or list of \
                             mappings for merging (<<), but found a {}",
                            self.location(span.start.line(), span.start.col() + 1),
                            src.value.type_name()
                        ),
                    ));
                };
                for (k, v) in m {
                    merged.entry(k).or_insert(v);
                }
            }
        }
        for (k, v) in map {
            merged.insert(k, v);
        }
        Ok(merged)
    }

    /// A key node as the text the map is keyed by and the type it was written as.
    fn key(&self, key: &Node, span: Span) -> Result<(String, KeyKind), YamlError> {
        match KeyKind::key_of(&key.value) {
            Some(key) => Ok(key),
            None if matches!(key.value, Value::Null) => Err(self.error(
                span,
                format!(
                    "Incompatible key type 'NoneType'\n    full_key: {}\n    object_type=dict\n    \
                     (a mapping key cannot be null; to use the word as a key, quote it: 'null')",
                    self.full_key()
                ),
            )),
            None => Err(self.error(
                span,
                "found unhashable key: a mapping key must be a scalar, not a list or mapping",
            )),
        }
    }

    /// A copy of an anchored node, counted against the alias budget.
    fn alias(&mut self, id: usize, span: Span) -> Result<Node, YamlError> {
        let Some((node, size)) = self.anchors.get(&id) else {
            let message = if self.open.iter().any(|o| o.anchor == id) {
                "found a recursive alias: an anchor's node cannot contain an alias to itself"
            } else {
                "found undefined alias"
            };
            return Err(self.error(span, message));
        };
        let budget = ALIAS_NODE_BUDGET.max(ALIAS_NODES_PER_WRITTEN_NODE * self.written);
        self.aliased = self.aliased.saturating_add(*size);
        if self.aliased > budget {
            return Err(self.error(
                span,
                format!(
                    "alias expansion exceeds {budget} nodes: a YAML alias bomb? Aliases (*name) copy their \
                     anchor's whole node, and here they nest so deep that the document would grow beyond \
                     {budget} nodes; write the repeated values out, or alias fewer levels of aliases"
                ),
            ));
        }
        self.made += size;
        Ok(node.clone())
    }

    fn remember(&mut self, anchor: usize, node: &Node, size: usize) {
        if anchor != 0 {
            self.anchors.insert(anchor, (node.clone(), size));
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
                out.push_str(&key_text(key, value.key_kind));
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

/// A mapping key as `OmegaConf.to_yaml` prints it: a typed key plain (`123:`, `1.5:`, `.inf:`, `true:`), a
/// string key quoted where plain text would read back as another type (`'123':`).
pub fn key_text(key: &str, kind: KeyKind) -> String {
    match kind.typed(key) {
        Some(typed) => scalar_text(&typed),
        None => quote_if_needed(key),
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
    let plain_changes_type = !matches!(resolve_plain(s), Value::Str(_))
        || omegaconf_quotes(s)
        || is_timestamp(s)
        // PyYAML's resolvers for `=` (value) and `<<` (merge), and document markers.
        || matches!(s, "=" | "<<")
        || s.starts_with("---")
        || s.starts_with("...");
    let first = s.chars().next();
    // `-`, `?` and `:` start a plain scalar unless a space (or the end) follows.
    let indicator_then_space =
        matches!(first, Some('-' | '?' | ':')) && matches!(s[1..].chars().next(), None | Some(' '));
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
    ) && (!matches!(first, Some('-' | '?' | ':')) || indicator_then_space);
    let bad_inside = s.contains(": ") || s.contains(" #") || s.ends_with(' ') || s.ends_with(':');
    if plain_changes_type || bad_start || bad_inside {
        format!("'{}'", s.replace('\'', "''"))
    } else {
        s.to_string()
    }
}

/// OmegaConf's dumper quotes a string that its `yaml_is_bool`, Python's `int()` or Python's `float()` accepts
/// (`'y'`, `'inf'`, `'09'`, `'-.5'`), though PyYAML would read some of them back as strings.
fn omegaconf_quotes(s: &str) -> bool {
    matches!(s, "y" | "Y" | "n" | "N") || python_int(s) || python_float(s)
}

/// Digits with single underscores between them, as Python's `int()` and `float()` take them.
fn python_digits(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('_')
        && !s.ends_with('_')
        && !s.contains("__")
        && s.chars().all(|c| c.is_ascii_digit() || c == '_')
}

fn python_int(s: &str) -> bool {
    python_digits(split_sign(s.trim()).1)
}

fn python_float(s: &str) -> bool {
    let body = split_sign(s.trim()).1.to_ascii_lowercase();
    if matches!(body.as_str(), "inf" | "infinity" | "nan") {
        return true;
    }
    let (mantissa, exponent) = split_exponent(&body);
    if exponent.is_some_and(|e| !python_digits(split_sign(e).1)) {
        return false;
    }
    match mantissa.split_once('.') {
        Some((int, frac)) => {
            (int.is_empty() || python_digits(int))
                && (frac.is_empty() || python_digits(frac))
                && !(int.is_empty() && frac.is_empty())
        }
        None => python_digits(mantissa),
    }
}

/// PyYAML's timestamp resolver (`2024-01-01`, `2024-1-1 10:00:00.5 +01:00`): such strings are quoted.
fn is_timestamp(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    // Up to `max` digits (at least `min`) at `i`.
    let digits = |i: &mut usize, min: usize, max: usize| {
        let start = *i;
        while *i < b.len() && *i - start < max && b[*i].is_ascii_digit() {
            *i += 1;
        }
        *i - start >= min
    };
    let dash = |i: &mut usize| {
        let ok = b.get(*i) == Some(&b'-');
        *i += ok as usize;
        ok
    };
    let date_only = b.len() == 10
        && digits(&mut i, 4, 4)
        && dash(&mut i)
        && digits(&mut i, 2, 2)
        && dash(&mut i)
        && digits(&mut i, 2, 2);
    if date_only {
        return true;
    }
    i = 0;
    if !(digits(&mut i, 4, 4) && dash(&mut i) && digits(&mut i, 1, 2) && dash(&mut i)) {
        return false;
    }
    if !digits(&mut i, 1, 2) {
        return false;
    }
    match b.get(i) {
        Some(b'T' | b't') => i += 1,
        Some(b' ' | b'\t') => {
            while matches!(b.get(i), Some(b' ' | b'\t')) {
                i += 1;
            }
        }
        _ => return false,
    }
    let colon = |i: &mut usize| {
        let ok = b.get(*i) == Some(&b':');
        *i += ok as usize;
        ok
    };
    if !(digits(&mut i, 1, 2) && colon(&mut i) && digits(&mut i, 2, 2) && colon(&mut i)) {
        return false;
    }
    if !digits(&mut i, 2, 2) {
        return false;
    }
    if b.get(i) == Some(&b'.') {
        i += 1;
        digits(&mut i, 0, usize::MAX);
    }
    while matches!(b.get(i), Some(b' ' | b'\t')) {
        i += 1;
    }
    match b.get(i) {
        None => true,
        Some(b'Z') => i + 1 == b.len(),
        Some(b'+' | b'-') => {
            i += 1;
            if !digits(&mut i, 1, 2) {
                return false;
            }
            if b.get(i) == Some(&b':') {
                i += 1;
                if !digits(&mut i, 2, 2) {
                    return false;
                }
            }
            i == b.len()
        }
        _ => false,
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
    /// Nine levels, each nine aliases of the level before ("billion laughs"): 387 million nodes if expanded.
    fn alias_bomb(mappings: bool) -> String {
        let mut text = format!("a: &a [{}]\n", vec!["\"lol\""; 9].join(", "));
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
            vec!["*a"; 9].join(", ")
        );
        let node = parse(&text, "f").unwrap().unwrap();
        assert_eq!(node.get("b.8.14999").unwrap().value, Value::Int(14999));
        // Eleven are more than ten times the file's own nodes.
        let text = format!(
            "a: &a [{}]\nb: [{}]\n",
            items.join(", "),
            vec!["*a"; 11].join(", ")
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
    #[case::unclosed_in_list("a:\n  - [1, 2\n  - 3\n", 3, "flow sequence that began at f.yaml:2:5")]
    #[case::unclosed_quote("a: 'abc\nb: 1\n", 3, "quoted scalar that began at f.yaml:1:4")]
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
    #[case("{'a': 1, a: 2}", 1, "found duplicate key a, first written at f:1:2")]
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
