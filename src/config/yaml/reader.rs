//! The reader: saphyr-parser events built into a `Node` tree with sources, aliases capped, keys checked,
//! and syntax errors placed in the construct they broke.

use super::scalars::*;
use super::*;

/// A collection whose start event has been read and whose end has not: what a syntax error is inside.
#[derive(Debug, Clone, Copy)]
pub(super) struct Open {
    construct: Construct,
    line: usize,
    /// 1-based.
    col: usize,
    anchor: usize,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Construct {
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
pub(super) enum PathPart {
    Key(String),
    Index(usize),
}

/// A typed key's value as Python's dict compares keys: `1`, `1.0` and `true` are the same key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum NumKey {
    Int(i128),
    Float(u64),
}

pub(super) fn num_key(value: &Value) -> Option<NumKey> {
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

pub(super) fn kind_name(kind: KeyKind) -> &'static str {
    match kind {
        KeyKind::Str => "string",
        KeyKind::Int => "int",
        KeyKind::Float => "float",
        KeyKind::Bool => "bool",
    }
}

pub(super) struct Builder<'a> {
    pub(super) text: &'a str,
    pub(super) events: Parser<'a, saphyr_parser::StrInput<'a>>,
    pub(super) path: Arc<str>,
    /// Each anchored node and its size in nodes.
    pub(super) anchors: HashMap<usize, (Node, usize)>,
    /// Nodes written out in the document (scalars and collections, not aliases).
    pub(super) written: usize,
    /// Nodes in the tree so far, written or copied by aliases (sizes anchored nodes).
    pub(super) made: usize,
    /// Nodes copied by aliases so far, against the alias budget.
    pub(super) aliased: usize,
    /// Collections opened and not yet closed, innermost last.
    pub(super) open: Vec<Open>,
    pub(super) keys: Vec<PathPart>,
    /// Character index just past the last event read.
    pub(super) last_end: usize,
    /// (character index, byte offset) of the last character looked up, to walk the text forward.
    pub(super) cursor: (usize, usize),
    /// Spaces added in front of each line (0-based) by [`super::lenient`]; positions are reported as written.
    pub(super) pads: &'a [usize],
    /// After an indentation error PyYAML would not raise: what to indent for the YAML 1.2 scanner.
    pub(super) reindent: Option<super::lenient::Reindent>,
}

impl<'a> Builder<'a> {
    fn error(&self, span: Span, message: impl Into<String>) -> YamlError {
        self.error_at(span.start.line(), span.start.col() + 1, message)
    }

    fn error_at(&self, line: usize, col: usize, message: impl Into<String>) -> YamlError {
        YamlError {
            path: self.path.to_string(),
            line,
            col: self.written_col(line, col),
            message: message.into(),
        }
    }

    fn location(&self, line: usize, col: usize) -> String {
        format!("{}:{line}:{}", self.path, self.written_col(line, col))
    }

    /// A 1-based column of the (possibly re-indented) text as the file has it.
    fn written_col(&self, line: usize, col: usize) -> usize {
        let pad = line
            .checked_sub(1)
            .and_then(|i| self.pads.get(i))
            .copied()
            .unwrap_or(0);
        col.saturating_sub(pad).max(1)
    }

    fn next(&mut self) -> Result<(Event<'a>, Span), YamlError> {
        match self.events.next() {
            Some(Ok((event, span))) => {
                self.last_end = span.end.index();
                Ok((event, span))
            }
            Some(Err(e)) => {
                self.reindent =
                    self.lenient_indentation(e.info(), e.marker().line(), e.marker().col() + 1);
                Err(self.error_at(
                    e.marker().line(),
                    e.marker().col() + 1,
                    self.syntax_context(e.info()),
                ))
            }
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

    /// An indentation error inside a flow collection or a quoted scalar, where PyYAML does not look at
    /// indentation (the scanner reports the first at the offending line, the second at the opening quote).
    fn lenient_indentation(
        &self,
        info: &str,
        line: usize,
        col: usize,
    ) -> Option<super::lenient::Reindent> {
        use super::lenient::Reindent;
        if !info.starts_with("invalid indentation") {
            return None;
        }
        if info.contains("quoted scalar") {
            return Some(Reindent::QuotedScalar { line, col });
        }
        let flow = self.open.iter().rev().find(|o| {
            matches!(
                o.construct,
                Construct::FlowSequence | Construct::FlowMapping
            )
        });
        match flow {
            Some(open) => Some(Reindent::FlowLine {
                line,
                col: Some(open.col + 1),
            }),
            // The scanner can be ahead of the events: the collection is not open here yet.
            None if info.contains("flow construct") => Some(Reindent::FlowLine { line, col: None }),
            None => None,
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

    pub(super) fn document(&mut self) -> Result<Option<Node>, YamlError> {
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
        let line = span.start.line();
        let source = Source::file(
            &self.path,
            line,
            self.written_col(line, span.start.col() + 1),
        );
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
                    // PyYAML's (and so Hydra's) first line, then where.
                    format!("while constructing a mapping: found duplicate key {key}, first written at {first}")
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
