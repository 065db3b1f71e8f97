//! The command-line override grammar of Hydra 1.3 (`OverrideLexer.g4` / `OverrideParser.g4`), hand-written:
//! a longest-match lexer with ANTLR's tie-breaking, a recursive-descent parser, and the grammar functions
//! (casts, `choice`, `range`, `interval`, `sort`, `shuffle`, `glob`, `tag`). It knows nothing of composition.
//! It never panics: every index is checked, and bad input is a `ParseError` pointing at the column.

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
    /// `quoted`: written inside `'..'` or `".."` (then `quote` says which). `${..}` stays in the text.
    Str {
        value: String,
        quoted: bool,
    },
    List(Vec<Element>),
    /// Insertion order kept.
    Dict(Vec<(String, Element)>),
}

/// A number in a `range()`: ints stay ints so `range(1,4)` sweeps 1, 2, 3.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Num {
    Int(i64),
    Float(f64),
}

impl Num {
    fn as_f64(self) -> f64 {
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
    },
    Range {
        start: Num,
        stop: Num,
        step: Num,
        shuffle: bool,
    },
    Interval {
        start: f64,
        end: f64,
    },
    Glob {
        include: Vec<String>,
        exclude: Vec<String>,
    },
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

// ---------------------------------------------------------------------------------------------------------
// Lexer (value mode)

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tok {
    POpen,
    Comma,
    PClose,
    BracketOpen,
    BracketClose,
    BraceOpen,
    BraceClose,
    Colon,
    Equal,
    Float,
    Int,
    Bool,
    Null,
    UnquotedChar,
    Id,
    Esc,
    Ws,
    Quoted,
    Interpolation,
}

#[derive(Debug, Clone)]
struct Token {
    kind: Tok,
    text: String,
    /// column of the first char in the whole override line
    col: usize,
}

fn is_ws(c: char) -> bool {
    c == ' ' || c == '\t'
}

fn ws_len(s: &[char], i: usize) -> usize {
    s[i.min(s.len())..]
        .iter()
        .take_while(|c| is_ws(**c))
        .count()
}

fn digits_len(s: &[char], i: usize) -> usize {
    // DIGIT (('_')? DIGIT)*
    let mut j = i;
    if j >= s.len() || !s[j].is_ascii_digit() {
        return 0;
    }
    j += 1;
    loop {
        if j < s.len() && s[j].is_ascii_digit() {
            j += 1;
        } else if j + 1 < s.len() && s[j] == '_' && s[j + 1].is_ascii_digit() {
            j += 2;
        } else {
            break;
        }
    }
    j - i
}

/// INT_UNSIGNED: '0' | [1-9] (('_')? DIGIT)*
fn int_unsigned_len(s: &[char], i: usize) -> usize {
    match s.get(i) {
        Some('0') => 1,
        Some(c) if c.is_ascii_digit() => digits_len(s, i),
        _ => 0,
    }
}

fn point_float_len(s: &[char], i: usize) -> usize {
    // INT_UNSIGNED '.' | INT_UNSIGNED? '.' DIGIT (('_')? DIGIT)*
    let int_len = int_unsigned_len(s, i);
    let mut best = 0;
    let dot = i + int_len;
    if s.get(dot) == Some(&'.') {
        let frac = digits_len(s, dot + 1);
        if frac > 0 {
            best = int_len + 1 + frac;
        } else if int_len > 0 {
            best = int_len + 1;
        }
    }
    best
}

fn float_len(s: &[char], i: usize) -> usize {
    let sign = usize::from(matches!(s.get(i), Some('+' | '-')));
    let j = i + sign;
    let mut best = point_float_len(s, j);
    // EXPONENT_FLOAT: (INT_UNSIGNED | POINT_FLOAT) [eE] [+-]? DIGIT (('_')? DIGIT)*
    for mantissa in [int_unsigned_len(s, j), point_float_len(s, j)] {
        if mantissa == 0 {
            continue;
        }
        let e = j + mantissa;
        if matches!(s.get(e), Some('e' | 'E')) {
            let es = usize::from(matches!(s.get(e + 1), Some('+' | '-')));
            let d = digits_len(s, e + 1 + es);
            if d > 0 {
                best = best.max(mantissa + 1 + es + d);
            }
        }
    }
    let word: String = s[j.min(s.len())..(j + 3).min(s.len())]
        .iter()
        .collect::<String>()
        .to_ascii_lowercase();
    if word == "inf" || word == "nan" {
        best = best.max(3);
    }
    if best == 0 {
        0
    } else {
        sign + best
    }
}

fn int_len(s: &[char], i: usize) -> usize {
    let sign = usize::from(matches!(s.get(i), Some('+' | '-')));
    let n = int_unsigned_len(s, i + sign);
    if n == 0 {
        0
    } else {
        sign + n
    }
}

fn keyword_len(s: &[char], i: usize, word: &str) -> usize {
    let n = word.len();
    if i + n > s.len() {
        return 0;
    }
    let text: String = s[i..i + n].iter().collect();
    if text.eq_ignore_ascii_case(word) {
        n
    } else {
        0
    }
}

fn id_len(s: &[char], i: usize) -> usize {
    match s.get(i) {
        Some(c) if c.is_ascii_alphabetic() || *c == '_' => {
            1 + s[i + 1..]
                .iter()
                .take_while(|c| c.is_ascii_alphanumeric() || **c == '_' || **c == '-')
                .count()
        }
        _ => 0,
    }
}

fn esc_len(s: &[char], i: usize) -> usize {
    let mut j = i;
    while j + 1 < s.len() && s[j] == '\\' && "\\()[]{}:=, \t".contains(s[j + 1]) {
        j += 2;
    }
    j - i
}

fn quoted_len(s: &[char], i: usize) -> usize {
    // A quote, then the shortest run up to the same quote not preceded by an odd number of backslashes.
    let Some(&q) = s.get(i).filter(|c| **c == '\'' || **c == '"') else {
        return 0;
    };
    let mut j = i + 1;
    let mut backslashes = 0;
    while j < s.len() {
        let c = s[j];
        if c == q && backslashes % 2 == 0 {
            return j + 1 - i;
        }
        if c == '\\' {
            backslashes += 1;
        } else {
            backslashes = 0;
        }
        j += 1;
    }
    0
}

fn interpolation_len(s: &[char], i: usize) -> usize {
    // '${' ~('}')+ '}'
    if s.get(i) != Some(&'$') || s.get(i + 1) != Some(&'{') {
        return 0;
    }
    let mut j = i + 2;
    while j < s.len() && s[j] != '}' {
        j += 1;
    }
    if j < s.len() && j > i + 2 {
        j + 1 - i
    } else {
        0
    }
}

/// Tokenize the value part (after `=`), ANTLR-style: longest match, ties go to the earlier rule.
fn lex_value(s: &[char], offset: usize, input: &str) -> Result<Vec<Token>, ParseError> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let w = ws_len(s, i);
        let punct = |c: char, lead_ws: bool, trail_ws: bool| -> usize {
            let lead = if lead_ws { w } else { 0 };
            if s.get(i + lead) == Some(&c) {
                let trail = if trail_ws { ws_len(s, i + lead + 1) } else { 0 };
                lead + 1 + trail
            } else {
                0
            }
        };
        // In grammar order (ANTLR breaks ties by rule order).
        let candidates: [(Tok, usize); 19] = [
            (Tok::POpen, punct('(', true, true)),
            (Tok::Comma, punct(',', true, true)),
            (Tok::PClose, punct(')', true, false)),
            (Tok::BracketOpen, punct('[', false, true)),
            (Tok::BracketClose, punct(']', true, false)),
            (Tok::BraceOpen, punct('{', false, true)),
            (Tok::BraceClose, punct('}', true, false)),
            (Tok::Colon, punct(':', true, true)),
            (Tok::Equal, punct('=', true, true)),
            (Tok::Float, float_len(s, i)),
            (Tok::Int, int_len(s, i)),
            (
                Tok::Bool,
                keyword_len(s, i, "true").max(keyword_len(s, i, "false")),
            ),
            (Tok::Null, keyword_len(s, i, "null")),
            (
                Tok::UnquotedChar,
                usize::from(s.get(i).is_some_and(|c| "/-\\+.$%*@?|".contains(*c))),
            ),
            (Tok::Id, id_len(s, i)),
            (Tok::Esc, esc_len(s, i)),
            (Tok::Ws, w),
            (Tok::Quoted, quoted_len(s, i)),
            (Tok::Interpolation, interpolation_len(s, i)),
        ];
        let mut best: Option<(Tok, usize)> = None;
        for (kind, len) in candidates {
            if len > 0 && best.is_none_or(|(_, b)| len > b) {
                best = Some((kind, len));
            }
        }
        let Some((kind, len)) = best else {
            let c = s[i];
            let reason = match c {
                '\'' | '"' => format!("unterminated quoted string starting at {c}"),
                _ => format!("token recognition error at: '{c}'"),
            };
            return fail(input, offset + i, reason);
        };
        out.push(Token {
            kind,
            text: s[i..i + len].iter().collect(),
            col: offset + i,
        });
        i += len;
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------------------
// Parser

/// Parse one override as Hydra 1.3 would.
pub fn parse_override(input: &str) -> Result<Override, ParseError> {
    let chars: Vec<char> = input.chars().collect();
    let mut i = 0;
    let kind = match (chars.first(), chars.get(1)) {
        (Some('~'), _) => {
            i = 1;
            OverrideKind::Delete
        }
        (Some('+'), Some('+')) => {
            i = 2;
            OverrideKind::ForceAdd
        }
        (Some('+'), _) => {
            i = 1;
            OverrideKind::Add
        }
        _ => OverrideKind::Change,
    };
    let key_start = i;
    while i < chars.len() && chars[i] != '=' {
        i += 1;
    }
    let key_text: String = chars[key_start..i].iter().collect();
    let key = parse_key(&key_text, key_start, input)?;
    if i >= chars.len() {
        if kind == OverrideKind::Delete {
            return Ok(Override {
                kind,
                key,
                value: None,
                input: input.to_string(),
            });
        }
        return fail(input, chars.len(), "mismatched input '<EOF>' expecting '='");
    }
    // EQUAL: '=' WS?
    i += 1;
    i += ws_len(&chars, i);
    let tokens = lex_value(&chars[i..], i, input)?;
    let value = if tokens.is_empty() {
        // `key=` is the empty string
        Some(ParsedValue::Element(Element::Str {
            value: String::new(),
            quoted: false,
        }))
    } else {
        let mut p = Parser {
            tokens: &tokens,
            pos: 0,
            input,
            end_col: chars.len(),
        };
        let v = p.value()?;
        if p.pos < tokens.len() {
            let t = &tokens[p.pos];
            return fail(
                input,
                t.col,
                format!("extraneous input '{}' expecting <EOF>", t.text),
            );
        }
        Some(v)
    };
    Ok(Override {
        kind,
        key,
        value,
        input: input.to_string(),
    })
}

fn is_key_id(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == '$')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '$')
}

fn is_int_unsigned(s: &str) -> bool {
    s == "0"
        || (s.starts_with(|c: char| ('1'..='9').contains(&c))
            && s.chars().all(|c| c.is_ascii_digit() || c == '_')
            && !s.contains("__")
            && !s.ends_with('_'))
}

fn parse_key(text: &str, offset: usize, input: &str) -> Result<Key, ParseError> {
    let (group, package) = match text.find('@') {
        Some(at) => (&text[..at], Some(&text[at + 1..])),
        None => (text, None),
    };
    let valid_path = |s: &str| -> bool {
        if s.contains('/') {
            // ID (SLASH ID)+
            s.split('/')
                .all(|p| !p.is_empty() && !p.contains('$') && is_key_id(p))
        } else {
            !s.is_empty()
                && s.split('.')
                    .all(|p| is_key_id(p) || (is_int_unsigned(p) && s.contains('.')))
        }
    };
    if !valid_path(group) {
        let bad = group
            .char_indices()
            .find(|(_, c)| !(c.is_ascii_alphanumeric() || "_-$./".contains(*c)))
            .map(|(i, _)| i)
            .unwrap_or(0);
        let reason = if group.is_empty() {
            "missing key before '='".to_string()
        } else {
            format!("invalid key '{group}': keys are dotted names like a.b.c, groups like a/b")
        };
        return fail(input, offset + bad, reason);
    }
    if let Some(pkg) = package {
        if !(pkg.is_empty() || pkg.split('.').all(|p| is_key_id(p) || is_int_unsigned(p))) {
            return fail(
                input,
                offset + group.len() + 1,
                format!("invalid package '{pkg}'"),
            );
        }
    }
    Ok(Key {
        key_or_group: group.to_string(),
        package: package.map(str::to_string),
    })
}

/// What an expression evaluates to before it lands in an override: a plain element or a sweep.
#[derive(Debug, Clone, PartialEq)]
enum Val {
    Elem(Element),
    Sweep(Sweep),
}

struct Parser<'a> {
    tokens: &'a [Token],
    pos: usize,
    input: &'a str,
    end_col: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<Tok> {
        self.tokens.get(self.pos).map(|t| t.kind)
    }
    fn col(&self) -> usize {
        self.tokens
            .get(self.pos)
            .map(|t| t.col)
            .unwrap_or(self.end_col)
    }
    fn found(&self) -> String {
        self.tokens
            .get(self.pos)
            .map(|t| format!("'{}'", t.text))
            .unwrap_or_else(|| "'<EOF>'".to_string())
    }
    fn expect(&mut self, kind: Tok, what: &str) -> Result<(), ParseError> {
        if self.peek() == Some(kind) {
            self.pos += 1;
            Ok(())
        } else {
            fail(
                self.input,
                self.col(),
                format!("missing {what} at {}", self.found()),
            )
        }
    }

    /// value: element | element (COMMA element)+
    fn value(&mut self) -> Result<ParsedValue, ParseError> {
        let first = self.element()?;
        if self.peek() != Some(Tok::Comma) {
            return Ok(match first {
                Val::Elem(e) => ParsedValue::Element(e),
                Val::Sweep(s) => ParsedValue::Sweep(s),
            });
        }
        let mut list = vec![self.plain(first)?];
        while self.peek() == Some(Tok::Comma) {
            self.pos += 1;
            let v = self.element()?;
            list.push(self.plain(v)?);
        }
        Ok(ParsedValue::Sweep(Sweep::Choice {
            list,
            simple_form: true,
            shuffle: false,
        }))
    }

    fn plain(&self, v: Val) -> Result<Element, ParseError> {
        match v {
            Val::Elem(e) => Ok(e),
            Val::Sweep(_) => fail(
                self.input,
                self.col(),
                "a sweep cannot be nested inside a list of values",
            ),
        }
    }

    fn element(&mut self) -> Result<Val, ParseError> {
        match self.peek() {
            Some(Tok::BracketOpen) => self.list().map(Val::Elem),
            Some(Tok::BraceOpen) => self.dict().map(Val::Elem),
            Some(Tok::Id) if self.tokens.get(self.pos + 1).map(|t| t.kind) == Some(Tok::POpen) => {
                self.function()
            }
            Some(Tok::Quoted) => {
                let t = &self.tokens[self.pos];
                self.pos += 1;
                let value = unescape_quoted(&t.text);
                Ok(Val::Elem(Element::Str {
                    value,
                    quoted: true,
                }))
            }
            Some(
                Tok::Id
                | Tok::Null
                | Tok::Int
                | Tok::Float
                | Tok::Bool
                | Tok::Interpolation
                | Tok::UnquotedChar
                | Tok::Colon
                | Tok::Esc
                | Tok::Ws,
            ) => self.primitive(true).map(Val::Elem),
            _ => fail(
                self.input,
                self.col(),
                format!("mismatched input {} expecting a value", self.found()),
            ),
        }
    }

    /// primitive: (ID | NULL | INT | FLOAT | BOOL | INTERPOLATION | UNQUOTED_CHAR | COLON | ESC | WS)+
    fn primitive(&mut self, allow_colon: bool) -> Result<Element, ParseError> {
        let start = self.pos;
        while let Some(k) = self.peek() {
            let ok = matches!(
                k,
                Tok::Id
                    | Tok::Null
                    | Tok::Int
                    | Tok::Float
                    | Tok::Bool
                    | Tok::UnquotedChar
                    | Tok::Esc
                    | Tok::Ws
            ) || (allow_colon && matches!(k, Tok::Colon | Tok::Interpolation));
            // A function call inside a primitive run is not a primitive.
            if !ok
                || (k == Tok::Id
                    && self.pos > start
                    && self.tokens.get(self.pos + 1).map(|t| t.kind) == Some(Tok::POpen))
            {
                break;
            }
            self.pos += 1;
        }
        let toks = &self.tokens[start..self.pos];
        let mut first = 0;
        let mut last = toks.len();
        if toks.first().is_some_and(|t| t.kind == Tok::Ws) {
            if toks.len() == 1 {
                return fail(
                    self.input,
                    toks[0].col,
                    "Trying to parse a primitive that is all whitespaces",
                );
            }
            first = 1;
        }
        if last > first && toks[last - 1].kind == Tok::Ws {
            last -= 1;
        }
        let inner = &toks[first..last];
        if inner.len() == 1 {
            let t = &inner[0];
            return Ok(match t.kind {
                Tok::Int => Element::Int(match t.text.replace('_', "").parse::<i64>() {
                    Ok(v) => v,
                    Err(_) => {
                        return fail(
                            self.input,
                            t.col,
                            format!("integer out of range: {}", t.text),
                        )
                    }
                }),
                Tok::Float => Element::Float(parse_float_token(&t.text)),
                Tok::Null => Element::Null,
                Tok::Bool => Element::Bool(t.text.eq_ignore_ascii_case("true")),
                Tok::Esc => Element::Str {
                    value: unescape_esc(&t.text),
                    quoted: false,
                },
                _ => Element::Str {
                    value: t.text.clone(),
                    quoted: false,
                },
            });
        }
        let value: String = inner
            .iter()
            .map(|t| {
                if t.kind == Tok::Esc {
                    unescape_esc(&t.text)
                } else {
                    t.text.clone()
                }
            })
            .collect();
        Ok(Element::Str {
            value,
            quoted: false,
        })
    }

    fn list(&mut self) -> Result<Element, ParseError> {
        self.expect(Tok::BracketOpen, "'['")?;
        let mut items = Vec::new();
        if self.peek() != Some(Tok::BracketClose) {
            loop {
                let v = self.element()?;
                items.push(self.plain(v)?);
                if self.peek() == Some(Tok::Comma) {
                    self.pos += 1;
                    continue;
                }
                break;
            }
        }
        if self.peek() != Some(Tok::BracketClose) {
            return fail(
                self.input,
                self.col(),
                format!("missing ']' at {}", self.found()),
            );
        }
        self.pos += 1;
        Ok(Element::List(items))
    }

    fn dict(&mut self) -> Result<Element, ParseError> {
        self.expect(Tok::BraceOpen, "'{'")?;
        let mut items: Vec<(String, Element)> = Vec::new();
        if self.peek() != Some(Tok::BraceClose) {
            loop {
                let key_col = self.col();
                let key = self.primitive(false)?;
                let key = match key {
                    Element::Str { value, .. } => value,
                    other => other.to_override_string(),
                };
                if key.is_empty() {
                    return fail(self.input, key_col, "missing dictionary key");
                }
                self.expect(Tok::Colon, "':'")?;
                let v = self.element()?;
                let v = self.plain(v)?;
                if let Some(slot) = items.iter_mut().find(|(k, _)| *k == key) {
                    slot.1 = v;
                } else {
                    items.push((key, v));
                }
                if self.peek() == Some(Tok::Comma) {
                    self.pos += 1;
                    continue;
                }
                break;
            }
        }
        if self.peek() != Some(Tok::BraceClose) {
            return fail(
                self.input,
                self.col(),
                format!("missing '}}' at {}", self.found()),
            );
        }
        self.pos += 1;
        Ok(Element::Dict(items))
    }

    /// function: ID POPEN (argName? element (COMMA argName? element)*)? PCLOSE
    fn function(&mut self) -> Result<Val, ParseError> {
        let name_tok = self.tokens[self.pos].clone();
        self.pos += 2; // ID POPEN
        let mut args: Vec<Val> = Vec::new();
        let mut kwargs: Vec<(String, Val)> = Vec::new();
        if self.peek() != Some(Tok::PClose) {
            loop {
                let named = self.peek() == Some(Tok::Id)
                    && self.tokens.get(self.pos + 1).map(|t| t.kind) == Some(Tok::Equal);
                if named {
                    let name = self.tokens[self.pos].text.clone();
                    self.pos += 2;
                    let v = self.element()?;
                    kwargs.push((name, v));
                } else {
                    if !kwargs.is_empty() {
                        return fail(
                            self.input,
                            self.col(),
                            "positional argument follows keyword argument",
                        );
                    }
                    args.push(self.element()?);
                }
                if self.peek() == Some(Tok::Comma) {
                    self.pos += 1;
                    continue;
                }
                break;
            }
        }
        if self.peek() != Some(Tok::PClose) {
            return fail(
                self.input,
                self.col(),
                format!("missing ')' at {}", self.found()),
            );
        }
        self.pos += 1;
        let end_col = self
            .pos
            .checked_sub(1)
            .and_then(|i| self.tokens.get(i))
            .map_or(self.end_col, |t| t.col + t.text.chars().count());
        call_function(&name_tok.text, args, kwargs).or_else(|FnError(kind, reason)| {
            let text: String = self
                .input
                .chars()
                .skip(name_tok.col)
                .take(end_col.saturating_sub(name_tok.col))
                .collect();
            fail(
                self.input,
                name_tok.col,
                format!("{kind} while evaluating '{text}': {reason}"),
            )
        })
    }
}

fn parse_float_token(text: &str) -> f64 {
    let t = text.replace('_', "").to_ascii_lowercase();
    let (neg, body) = match t.strip_prefix('-') {
        Some(b) => (true, b.to_string()),
        None => (false, t.trim_start_matches('+').to_string()),
    };
    let v = match body.as_str() {
        "inf" => f64::INFINITY,
        "nan" => f64::NAN,
        b => b.parse::<f64>().unwrap_or(f64::NAN),
    };
    if neg {
        -v
    } else {
        v
    }
}

/// `\,` → `,`: ESC tokens are pairs, keep every second char.
fn unescape_esc(text: &str) -> String {
    text.chars().skip(1).step_by(2).collect()
}

/// Hydra's quoted-string unescaping: only backslashes that precede a quote are escapes.
fn unescape_quoted(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    if chars.len() < 2 {
        return String::new();
    }
    let q = chars[0];
    let body = &chars[1..chars.len() - 1];
    let mut out = String::new();
    let mut i = 0;
    while i < body.len() {
        if body[i] == '\\' {
            let run = body[i..].iter().take_while(|c| **c == '\\').count();
            let next = body.get(i + run);
            if next == Some(&q) || next.is_none() {
                // a run of backslashes before a quote (or the closing quote): halve them; odd → escaped quote
                out.extend(std::iter::repeat_n('\\', run / 2));
                if next == Some(&q) && run % 2 == 1 {
                    out.push(q);
                    i += run + 1;
                    continue;
                }
                i += run;
                continue;
            }
            out.extend(std::iter::repeat_n('\\', run));
            i += run;
            continue;
        }
        out.push(body[i]);
        i += 1;
    }
    out
}

// ---------------------------------------------------------------------------------------------------------
// Grammar functions

const FUNCTIONS: &[&str] = &[
    "bool", "choice", "float", "glob", "int", "interval", "range", "shuffle", "sort", "str", "tag",
];

/// Why a grammar function refused its arguments; the first field is the Python exception name Hydra
/// reports (`ValueError`, `TypeError`, ...).
struct FnError(&'static str, String);

fn value_error<T>(msg: impl Into<String>) -> Result<T, FnError> {
    Err(FnError("ValueError", msg.into()))
}

fn type_error<T>(msg: impl Into<String>) -> Result<T, FnError> {
    Err(FnError("TypeError", msg.into()))
}

/// The Python type name Hydra's messages use for a value.
fn type_name(v: &Val) -> &'static str {
    match v {
        Val::Elem(Element::Null) => "NoneType",
        Val::Elem(Element::Bool(_)) => "bool",
        Val::Elem(Element::Int(_)) => "int",
        Val::Elem(Element::Float(_)) => "float",
        Val::Elem(Element::Str { quoted: false, .. }) => "str",
        Val::Elem(Element::Str { quoted: true, .. }) => "QuotedString",
        Val::Elem(Element::List(_)) => "list",
        Val::Elem(Element::Dict(_)) => "dict",
        Val::Sweep(Sweep::Choice { .. }) => "ChoiceSweep",
        Val::Sweep(Sweep::Range { .. }) => "RangeSweep",
        Val::Sweep(Sweep::Interval { .. }) => "IntervalSweep",
        Val::Sweep(Sweep::Glob { .. }) => "Glob",
    }
}

/// The argument types of the grammar functions' signatures (Hydra checks them before calling).
#[derive(Clone, Copy)]
enum ArgType {
    /// `CastType`: anything.
    Any,
    /// `Union[int, float]` (a bool is an int).
    Number,
    /// `Union[str, int, float, bool, dict, list]` plus the sweeps listed.
    Element {
        choice: bool,
        range: bool,
    },
    /// `Union[ChoiceSweep, RangeSweep]`
    SortableSweep,
    /// `Union[str, Sweep]`
    StrOrSweep,
    /// `Sweep`
    AnySweep,
    /// `List[Any]`
    List,
    Bool,
    /// `Union[List[str], str]`
    Patterns,
}

impl ArgType {
    fn accepts(self, v: &Val) -> bool {
        let is_element = matches!(v, Val::Elem(e) if !matches!(e, Element::Null));
        match self {
            ArgType::Any => true,
            ArgType::Number => matches!(
                v,
                Val::Elem(Element::Int(_) | Element::Float(_) | Element::Bool(_))
            ),
            ArgType::Element { choice, range } => {
                is_element
                    || (choice && matches!(v, Val::Sweep(Sweep::Choice { .. })))
                    || (range && matches!(v, Val::Sweep(Sweep::Range { .. })))
            }
            ArgType::SortableSweep => {
                matches!(v, Val::Sweep(Sweep::Choice { .. } | Sweep::Range { .. }))
            }
            ArgType::StrOrSweep => matches!(v, Val::Elem(Element::Str { .. }) | Val::Sweep(_)),
            ArgType::AnySweep => matches!(v, Val::Sweep(_)),
            ArgType::List => matches!(v, Val::Elem(Element::List(_))),
            ArgType::Bool => matches!(v, Val::Elem(Element::Bool(_))),
            ArgType::Patterns => {
                matches!(v, Val::Elem(Element::Str { .. } | Element::List(_)))
            }
        }
    }

    fn python(self) -> &'static str {
        match self {
            ArgType::Any => "Any",
            ArgType::Number => "Union[int, float]",
            ArgType::Element { .. } => "Union[str, int, float, bool, Dict, List, Sweep]",
            ArgType::SortableSweep => "Union[ChoiceSweep, RangeSweep]",
            ArgType::StrOrSweep => "Union[str, Sweep]",
            ArgType::AnySweep => "Sweep",
            ArgType::List => "List[Any]",
            ArgType::Bool => "bool",
            ArgType::Patterns => "Union[List[str], str]",
        }
    }
}

/// A function's signature: `*args` (if any) and its named parameters, in order.
struct Signature {
    var_args: Option<ArgType>,
    /// name, type, required (no default); parameters with a default accept `null` (Hydra's `Optional`).
    params: &'static [(&'static str, ArgType, bool)],
}

fn signature(name: &str) -> Option<Signature> {
    const ELEM_OR_SWEEP: ArgType = ArgType::Element {
        choice: true,
        range: true,
    };
    let (var_args, params): (Option<ArgType>, &'static [(&'static str, ArgType, bool)]) = match name
    {
        "int" | "float" | "str" | "bool" => (Some(ArgType::Any), &[("value", ArgType::Any, false)]),
        "choice" => (
            Some(ArgType::Element {
                choice: true,
                range: false,
            }),
            &[],
        ),
        "range" => (
            None,
            &[
                ("start", ArgType::Number, true),
                ("stop", ArgType::Number, false),
                ("step", ArgType::Number, false),
            ],
        ),
        "interval" => (
            None,
            &[
                ("start", ArgType::Number, true),
                ("end", ArgType::Number, true),
            ],
        ),
        "tag" => (
            Some(ArgType::StrOrSweep),
            &[("sweep", ArgType::AnySweep, false)],
        ),
        "shuffle" => (
            Some(ELEM_OR_SWEEP),
            &[
                ("sweep", ArgType::SortableSweep, false),
                ("list", ArgType::List, false),
            ],
        ),
        "sort" => (
            Some(ELEM_OR_SWEEP),
            &[
                ("sweep", ArgType::SortableSweep, false),
                ("list", ArgType::List, false),
                ("reverse", ArgType::Bool, false),
            ],
        ),
        "glob" => (
            None,
            &[
                ("include", ArgType::Patterns, true),
                ("exclude", ArgType::Patterns, false),
            ],
        ),
        _ => return None,
    };
    Some(Signature { var_args, params })
}

/// Arguments bound to a signature, as Python's `inspect.Signature.bind` does.
struct Bound {
    var_args: Vec<Val>,
    /// One slot per named parameter; `None` when not given or given as `null` to an optional parameter.
    named: Vec<Option<Val>>,
}

impl Bound {
    fn take(&mut self, i: usize) -> Option<Val> {
        self.named.get_mut(i).and_then(Option::take)
    }
}

fn bind(sig: &Signature, args: Vec<Val>, kwargs: Vec<(String, Val)>) -> Result<Bound, FnError> {
    let mut bound = Bound {
        var_args: Vec::new(),
        named: vec![None; sig.params.len()],
    };
    let mut by_position = vec![false; sig.params.len()];
    let mut positional = args.into_iter();
    if let Some(ty) = sig.var_args {
        for (i, v) in positional.by_ref().enumerate() {
            if !ty.accepts(&v) {
                return type_error(format!(
                    "mismatch type argument args[{i}]: {} is incompatible with {}",
                    type_name(&v),
                    ty.python()
                ));
            }
            bound.var_args.push(v);
        }
    }
    for (slot, v) in positional.enumerate() {
        if slot >= sig.params.len() {
            return type_error("too many positional arguments");
        }
        bound.named[slot] = Some(v);
        by_position[slot] = true;
    }
    // Python keeps the last of repeated keyword arguments.
    for (key, v) in kwargs {
        let Some(slot) = sig.params.iter().position(|(p, _, _)| *p == key) else {
            return type_error(format!("got an unexpected keyword argument '{key}'"));
        };
        if by_position[slot] {
            return type_error(format!("multiple values for argument '{key}'"));
        }
        bound.named[slot] = Some(v);
    }
    for (slot, (param, ty, required)) in sig.params.iter().enumerate() {
        match bound.named[slot].take() {
            None if *required => {
                return type_error(format!("missing a required argument: '{param}'"));
            }
            None => {}
            Some(Val::Elem(Element::Null)) if !*required && !matches!(ty, ArgType::Any) => {}
            Some(v) if ty.accepts(&v) => bound.named[slot] = Some(v),
            Some(v) => {
                return type_error(format!(
                    "mismatch type argument {param}: {} is incompatible with {}",
                    type_name(&v),
                    ty.python()
                ));
            }
        }
    }
    Ok(bound)
}

fn call_function(name: &str, args: Vec<Val>, kwargs: Vec<(String, Val)>) -> Result<Val, FnError> {
    let Some(sig) = signature(name) else {
        return Err(FnError(
            "HydraException",
            format!(
                "Unknown function '{name}'\nAvailable: {}",
                FUNCTIONS.join(",")
            ),
        ));
    };
    // Hydra unquotes top-level string arguments (not those nested in lists or dicts).
    let unquote = |v: Val| match v {
        Val::Elem(Element::Str { value, .. }) => Val::Elem(Element::Str {
            value,
            quoted: false,
        }),
        other => other,
    };
    let args: Vec<Val> = args.into_iter().map(unquote).collect();
    let kwargs: Vec<(String, Val)> = kwargs.into_iter().map(|(k, v)| (k, unquote(v))).collect();
    let mut b = bind(&sig, args, kwargs)?;
    match name {
        "int" | "float" | "str" | "bool" => {
            let value = match (b.var_args.len(), b.take(0)) {
                (n, Some(_)) if n > 0 => {
                    return type_error("cannot use both position and named arguments")
                }
                (_, Some(v)) => v,
                (0, None) => return type_error("No positional args or value specified"),
                (1, None) => b.var_args.pop().unwrap_or(Val::Elem(Element::Null)),
                (_, None) => Val::Sweep(Sweep::Choice {
                    list: simple_choice(b.var_args)?,
                    simple_form: true,
                    shuffle: false,
                }),
            };
            cast(name, value)
        }
        "choice" => {
            let args = b.var_args;
            if args.is_empty() {
                return value_error("empty choice is not legal");
            }
            if let [Val::Sweep(Sweep::Choice {
                list,
                simple_form,
                shuffle,
            })] = args.as_slice()
            {
                if !*simple_form {
                    return value_error("nesting choices is not supported");
                }
                return Ok(Val::Sweep(Sweep::Choice {
                    list: list.clone(),
                    simple_form: false,
                    shuffle: *shuffle,
                }));
            }
            Ok(Val::Sweep(Sweep::Choice {
                list: simple_choice(args)?,
                simple_form: false,
                shuffle: false,
            }))
        }
        "range" => {
            let num = |v: Val| match v {
                Val::Elem(Element::Int(i)) => Num::Int(i),
                Val::Elem(Element::Bool(x)) => Num::Int(i64::from(x)),
                Val::Elem(Element::Float(x)) => Num::Float(x),
                _ => Num::Int(0), // excluded by the signature
            };
            let first = b.take(0).map(num).unwrap_or(Num::Int(0));
            let (start, stop) = match b.take(1).map(num) {
                Some(stop) => (first, stop),
                None => (Num::Int(0), first),
            };
            let step = b.take(2).map(num).unwrap_or(Num::Int(1));
            Ok(Val::Sweep(Sweep::Range {
                start,
                stop,
                step,
                shuffle: false,
            }))
        }
        "interval" => {
            let f = |v: Option<Val>| match v {
                Some(Val::Elem(Element::Int(i))) => i as f64,
                Some(Val::Elem(Element::Bool(x))) => f64::from(u8::from(x)),
                Some(Val::Elem(Element::Float(x))) => x,
                _ => 0.0, // excluded by the signature
            };
            let start = f(b.take(0));
            let end = f(b.take(1));
            Ok(Val::Sweep(Sweep::Interval { start, end }))
        }
        "tag" => {
            let mut all = std::mem::take(&mut b.var_args);
            if let Some(s) = b.take(0) {
                if all.is_empty() {
                    return value_error("Not enough arguments to tag, must take at least a sweep");
                }
                all.push(s);
            }
            match all.pop() {
                Some(Val::Sweep(s)) => {
                    if let Some(t) = all.iter().find(|t| !matches!(t, Val::Elem(Element::Str { .. }))) {
                        return value_error(format!(
                            "tag arguments type must be string, got {}",
                            type_name(t)
                        ));
                    }
                    Ok(Val::Sweep(s))
                }
                Some(_) => value_error(
                    "Last argument to tag() must be a choice(), range() or interval(), got NoneType",
                ),
                None => value_error("Not enough arguments to tag, must take at least a sweep"),
            }
        }
        "shuffle" => {
            let mut args = std::mem::take(&mut b.var_args);
            let single = match (b.take(1), b.take(0)) {
                (Some(list), _) => list,
                (None, Some(sweep)) => sweep,
                (None, None) if args.len() == 1 => args.pop().unwrap_or(Val::Elem(Element::Null)),
                (None, None) => {
                    return Ok(Val::Sweep(Sweep::Choice {
                        list: simple_choice(args)?,
                        simple_form: true,
                        shuffle: true,
                    }))
                }
            };
            Ok(match single {
                Val::Sweep(Sweep::Choice {
                    list, simple_form, ..
                }) => Val::Sweep(Sweep::Choice {
                    list,
                    simple_form,
                    shuffle: true,
                }),
                Val::Sweep(Sweep::Range {
                    start, stop, step, ..
                }) => Val::Sweep(Sweep::Range {
                    start,
                    stop,
                    step,
                    shuffle: true,
                }),
                Val::Elem(Element::List(mut l)) => {
                    permute(&mut l);
                    Val::Elem(Element::List(l))
                }
                Val::Elem(e) => Val::Elem(Element::List(vec![e])),
                Val::Sweep(_) => return type_error("shuffle() does not support interval or glob"),
            })
        }
        "sort" => {
            let reverse = matches!(b.take(2), Some(Val::Elem(Element::Bool(true))));
            let mut args = std::mem::take(&mut b.var_args);
            let single = match (b.take(1), b.take(0)) {
                (Some(list), _) => list,
                (None, Some(sweep)) => sweep,
                (None, None) if args.len() == 1 => args.pop().unwrap_or(Val::Elem(Element::Null)),
                (None, None) => {
                    if args.iter().any(|a| {
                        !matches!(
                            a,
                            Val::Elem(
                                Element::Int(_)
                                    | Element::Float(_)
                                    | Element::Bool(_)
                                    | Element::Str { .. }
                            )
                        )
                    }) {
                        return type_error(
                            "Invalid arguments: sort() takes primitives, a list or a sweep",
                        );
                    }
                    if args.is_empty() {
                        return value_error("empty sort input");
                    }
                    Val::Sweep(Sweep::Choice {
                        list: simple_choice(args)?,
                        simple_form: true,
                        shuffle: false,
                    })
                }
            };
            match single {
                Val::Sweep(Sweep::Choice {
                    list,
                    simple_form,
                    shuffle,
                }) => Ok(Val::Sweep(Sweep::Choice {
                    list: py_sorted(list, reverse)?,
                    simple_form,
                    shuffle,
                })),
                Val::Sweep(Sweep::Range {
                    start,
                    stop,
                    step,
                    shuffle,
                }) => {
                    let flip = if reverse {
                        start.as_f64() < stop.as_f64()
                    } else {
                        start.as_f64() > stop.as_f64()
                    };
                    if !flip {
                        return Ok(Val::Sweep(Sweep::Range {
                            start,
                            stop,
                            step,
                            shuffle,
                        }));
                    }
                    // Hydra flips the direction, shifting start/stop by one step.
                    let abs_step = match step {
                        Num::Int(i) => Num::Int(i.saturating_abs()),
                        Num::Float(x) => Num::Float(x.abs()),
                    };
                    let shift = |a: Num| match (a, abs_step) {
                        (Num::Int(x), Num::Int(y)) => Num::Int(if reverse {
                            x.saturating_sub(y)
                        } else {
                            x.saturating_add(y)
                        }),
                        _ if reverse => Num::Float(a.as_f64() - abs_step.as_f64()),
                        _ => Num::Float(a.as_f64() + abs_step.as_f64()),
                    };
                    let neg_step = match step {
                        Num::Int(i) => Num::Int(i.saturating_neg()),
                        Num::Float(x) => Num::Float(-x),
                    };
                    Ok(Val::Sweep(Sweep::Range {
                        start: shift(stop),
                        stop: shift(start),
                        step: neg_step,
                        shuffle,
                    }))
                }
                Val::Elem(Element::List(l)) => Ok(Val::Elem(Element::List(py_sorted(l, reverse)?))),
                Val::Elem(e) => Ok(Val::Elem(e)),
                Val::Sweep(_) => type_error("sort() does not support interval or glob"),
            }
        }
        "glob" => {
            let strings = |v: Option<Val>| -> Result<Vec<String>, FnError> {
                match v {
                    None => Ok(vec![]),
                    Some(Val::Elem(Element::Str { value, .. })) => Ok(vec![value]),
                    Some(Val::Elem(Element::List(l))) => l
                        .into_iter()
                        .map(|e| match e {
                            Element::Str { value, .. } => Ok(value),
                            other => type_error(format!(
                                "glob() patterns must be strings, got {}",
                                other.to_override_string()
                            )),
                        })
                        .collect(),
                    Some(other) => type_error(format!(
                        "glob() patterns must be strings, got {}",
                        type_name(&other)
                    )),
                }
            };
            let include = strings(b.take(0))?;
            let exclude = strings(b.take(1))?;
            Ok(Val::Sweep(Sweep::Glob { include, exclude }))
        }
        _ => Err(FnError(
            "HydraException",
            format!("Unknown function '{name}'"),
        )),
    }
}

fn simple_choice(args: Vec<Val>) -> Result<Vec<Element>, FnError> {
    args.into_iter()
        .map(|a| match a {
            Val::Elem(e) => Ok(e),
            Val::Sweep(_) => type_error("a sweep cannot be an element of another sweep"),
        })
        .collect()
}

fn cast(name: &str, value: Val) -> Result<Val, FnError> {
    // Like Hydra, a cast sweep loses its shuffle flag.
    match value {
        Val::Elem(e) => cast_element(name, e).map(Val::Elem),
        Val::Sweep(Sweep::Choice {
            list, simple_form, ..
        }) => Ok(Val::Sweep(Sweep::Choice {
            list: list
                .into_iter()
                .map(|e| cast_element(name, e))
                .collect::<Result<_, _>>()?,
            simple_form,
            shuffle: false,
        })),
        Val::Sweep(Sweep::Range {
            start, stop, step, ..
        }) => {
            let f = |n: Num| -> Result<Num, FnError> {
                match (name, n) {
                    ("int", Num::Int(i)) => Ok(Num::Int(i)),
                    ("int", Num::Float(x)) => float_to_int(x).map(Num::Int),
                    ("float", n) => Ok(Num::Float(n.as_f64())),
                    _ => value_error("Range can only be cast to int or float"),
                }
            };
            Ok(Val::Sweep(Sweep::Range {
                start: f(start)?,
                stop: f(stop)?,
                step: f(step)?,
                shuffle: false,
            }))
        }
        Val::Sweep(Sweep::Interval { start, end }) => match name {
            // `+ 0.0` turns int(-0.5) into 0, not -0.
            "int" => Ok(Val::Sweep(Sweep::Interval {
                start: float_to_int(start)? as f64 + 0.0,
                end: float_to_int(end)? as f64 + 0.0,
            })),
            "float" => Ok(Val::Sweep(Sweep::Interval { start, end })),
            _ => value_error(format!("Intervals cannot be cast to {name}")),
        },
        Val::Sweep(Sweep::Glob { .. }) => type_error(format!("glob() cannot be cast to {name}")),
    }
}

/// Python's `int(float)`.
fn float_to_int(x: f64) -> Result<i64, FnError> {
    if x.is_nan() {
        return value_error("cannot convert float NaN to integer");
    }
    if x.is_infinite() {
        return Err(FnError(
            "OverflowError",
            "cannot convert float infinity to integer".into(),
        ));
    }
    let t = x.trunc();
    if !(-(i64::MAX as f64)..(i64::MAX as f64)).contains(&t) {
        return Err(FnError(
            "OverflowError",
            format!("integer out of range: {t}"),
        ));
    }
    Ok(t as i64)
}

/// Strip Python's digit-group underscores (`1_000`), which are legal only between two digits.
fn python_underscores(text: &str) -> Option<String> {
    let chars: Vec<char> = text.chars().collect();
    for (i, c) in chars.iter().enumerate() {
        if *c == '_' {
            let before = i.checked_sub(1).and_then(|j| chars.get(j));
            let after = chars.get(i + 1);
            if !(before.is_some_and(char::is_ascii_digit)
                && after.is_some_and(char::is_ascii_digit))
            {
                return None;
            }
        }
    }
    Some(text.replace('_', ""))
}

/// Python's `int(str)` (base 10).
fn python_int(text: &str) -> Option<i64> {
    let t = python_underscores(text.trim())?;
    let digits = t.strip_prefix(['+', '-']).unwrap_or(&t);
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    t.parse::<i64>().ok()
}

/// Python's `float(str)`.
fn python_float(text: &str) -> Option<f64> {
    let t = python_underscores(text.trim())?;
    let body = t
        .strip_prefix(['+', '-'])
        .unwrap_or(&t)
        .to_ascii_lowercase();
    let special = matches!(body.as_str(), "inf" | "infinity" | "nan");
    let numeric = !body.is_empty()
        && body
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | '+' | '-'))
        && body.chars().any(|c| c.is_ascii_digit());
    if !(special || numeric) {
        return None;
    }
    t.parse::<f64>().ok()
}

/// Python's `int()`/`float()`/`str()`/`bool()` as Hydra applies them (recursing into lists and dict values).
fn cast_element(name: &str, e: Element) -> Result<Element, FnError> {
    match e {
        Element::List(items) => Ok(Element::List(
            items
                .into_iter()
                .map(|i| cast_element(name, i))
                .collect::<Result<_, _>>()?,
        )),
        Element::Dict(items) => Ok(Element::Dict(
            items
                .into_iter()
                .map(|(k, v)| cast_element(name, v).map(|v| (k, v)))
                .collect::<Result<_, _>>()?,
        )),
        Element::Null if name == "bool" => Ok(Element::Bool(false)),
        Element::Null => Err(FnError(
            "AssertionError",
            format!("{name}() cannot cast null"),
        )),
        Element::Int(i) => Ok(match name {
            "int" => Element::Int(i),
            "float" => Element::Float(i as f64),
            "str" => Element::Str {
                value: i.to_string(),
                quoted: false,
            },
            _ => Element::Bool(i != 0),
        }),
        Element::Float(x) => Ok(match name {
            "int" => Element::Int(float_to_int(x)?),
            "float" => Element::Float(x),
            "str" => Element::Str {
                value: crate::config::tree::python_float_repr(x),
                quoted: false,
            },
            _ => Element::Bool(x != 0.0),
        }),
        Element::Bool(b) => Ok(match name {
            "int" => Element::Int(i64::from(b)),
            "float" => Element::Float(f64::from(u8::from(b))),
            "str" => Element::Str {
                value: b.to_string(),
                quoted: false,
            },
            _ => Element::Bool(b),
        }),
        Element::Str { value, .. } => match name {
            "int" => match python_int(&value) {
                Some(i) => Ok(Element::Int(i)),
                None => value_error(format!("invalid literal for int() with base 10: '{value}'")),
            },
            "float" => match python_float(&value) {
                Some(x) => Ok(Element::Float(x)),
                None => value_error(format!("could not convert string to float: '{value}'")),
            },
            "str" => Ok(Element::Str {
                value,
                quoted: false,
            }),
            _ => match value.to_ascii_lowercase().as_str() {
                "true" => Ok(Element::Bool(true)),
                "false" => Ok(Element::Bool(false)),
                _ => value_error(format!("Cannot cast '{value}' to bool")),
            },
        },
    }
}

/// Python's `<` between two parsed values, where it is defined.
fn py_cmp(a: &Element, b: &Element) -> Result<std::cmp::Ordering, FnError> {
    use std::cmp::Ordering;
    let num = |e: &Element| match e {
        Element::Int(i) => Some(*i as f64),
        Element::Float(x) => Some(*x),
        Element::Bool(b) => Some(f64::from(u8::from(*b))),
        _ => None,
    };
    match (a, b) {
        (Element::Int(x), Element::Int(y)) => Ok(x.cmp(y)),
        (
            Element::Str {
                value: x,
                quoted: false,
            },
            Element::Str {
                value: y,
                quoted: false,
            },
        ) => Ok(x.cmp(y)),
        (Element::List(x), Element::List(y)) => {
            for (p, q) in x.iter().zip(y) {
                match py_cmp(p, q)? {
                    Ordering::Equal => {}
                    other => return Ok(other),
                }
            }
            Ok(x.len().cmp(&y.len()))
        }
        _ => match (num(a), num(b)) {
            // NaN compares false both ways in Python; treat it as equal (stable).
            (Some(x), Some(y)) => Ok(x.partial_cmp(&y).unwrap_or(Ordering::Equal)),
            _ => type_error(format!(
                "'<' not supported between instances of '{}' and '{}'",
                type_name(&Val::Elem(a.clone())),
                type_name(&Val::Elem(b.clone()))
            )),
        },
    }
}

/// Python's `sorted(list, reverse=...)`: stable in both directions; incomparable values are an error.
fn py_sorted(list: Vec<Element>, reverse: bool) -> Result<Vec<Element>, FnError> {
    // Stable insertion sort with a fallible comparison (the lists are command-line sized).
    let mut out: Vec<Element> = Vec::with_capacity(list.len());
    for item in list {
        let mut at = out.len();
        while at > 0 {
            let ord = py_cmp(&out[at - 1], &item)?;
            let after = if reverse {
                ord != std::cmp::Ordering::Less
            } else {
                ord != std::cmp::Ordering::Greater
            };
            if after {
                break;
            }
            at -= 1;
        }
        out.insert(at, item);
    }
    Ok(out)
}

/// Shuffle in place (xorshift seeded from the clock: Hydra's shuffle is unseeded too).
fn permute<T>(items: &mut [T]) {
    let mut state = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0x9E37_79B9_7F4A_7C15)
        | 1;
    for i in (1..items.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let j = (state % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
}

// ---------------------------------------------------------------------------------------------------------
// Back to text (BasicSweeper's job overrides)

/// Hydra's `escape_special_characters`: backslash before `\()[]{}:=, \t`.
fn escape_special(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\()[]{}:=, \t".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl Element {
    /// The text Hydra's BasicSweeper puts in a job override for this value.
    pub fn to_override_string(&self) -> String {
        match self {
            Element::Null => "null".into(),
            Element::Bool(true) => "True".into(),
            Element::Bool(false) => "False".into(),
            Element::Int(i) => i.to_string(),
            Element::Float(x) => crate::config::tree::python_float_repr(*x),
            Element::Str {
                value,
                quoted: true,
            } => with_quotes(value),
            Element::Str {
                value,
                quoted: false,
            } => escape_special(value),
            Element::List(items) => {
                format!(
                    "[{}]",
                    items
                        .iter()
                        .map(Element::to_override_string)
                        .collect::<Vec<_>>()
                        .join(",")
                )
            }
            Element::Dict(items) => format!(
                "{{{}}}",
                items
                    .iter()
                    .map(|(k, v)| format!("{}:{}", escape_special(k), v.to_override_string()))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        }
    }
}

/// Re-quote a string (single quotes), escaping quotes and the backslashes that precede them.
fn with_quotes(text: &str) -> String {
    let q = '\'';
    let mut out = String::from(q);
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '\\' {
            let run = chars[i..].iter().take_while(|c| **c == '\\').count();
            let next = chars.get(i + run);
            // Backslashes before a quote (or the end) must be doubled to stay literal.
            let double = next.is_none() || next == Some(&q);
            out.extend(std::iter::repeat_n(
                '\\',
                if double { run * 2 } else { run },
            ));
            i += run;
            continue;
        }
        if chars[i] == q {
            out.push('\\');
        }
        out.push(chars[i]);
        i += 1;
    }
    out.push(q);
    out
}

impl Sweep {
    /// The values in sweep order (range expanded; sort/shuffle applied). Glob and interval need context.
    pub fn discrete_values(&self) -> Result<Vec<Element>, ParseError> {
        let err = |m: &str| ParseError {
            message: m.to_string(),
            column: 0,
        };
        match self {
            Sweep::Choice { list, shuffle, .. } => {
                let mut l = list.clone();
                if *shuffle {
                    permute(&mut l);
                }
                Ok(l)
            }
            Sweep::Range {
                start,
                stop,
                step,
                shuffle,
            } => {
                let mut out = Vec::new();
                match (start, stop, step) {
                    (Num::Int(_), Num::Int(_), Num::Int(0)) => {
                        return Err(err("range() arg 3 must not be zero"));
                    }
                    (Num::Int(a), Num::Int(b), Num::Int(s)) => {
                        let mut v = *a;
                        while (*s > 0 && v < *b) || (*s < 0 && v > *b) {
                            out.push(Element::Int(v));
                            if out.len() > 1_000_000 {
                                return Err(err("range() yields more than a million values"));
                            }
                            match v.checked_add(*s) {
                                Some(next) => v = next,
                                None => break,
                            }
                        }
                    }
                    _ => {
                        // Hydra's FloatRange accumulates in `decimal.Decimal` (exact start, 28 digits).
                        let (a, b, s) = (start.as_f64(), stop.as_f64(), step.as_f64());
                        if !(a.is_finite() && b.is_finite() && s.is_finite()) || s == 0.0 {
                            return Err(err(&format!(
                                "Invalid range values (start:{a}, stop:{b}, step:{s})"
                            )));
                        }
                        let (stop, step) = (Dec::from_f64(b), Dec::from_f64(s));
                        let mut v = Dec::from_f64(a);
                        let up = s > 0.0;
                        loop {
                            let ord = v.cmp_exact(&stop);
                            let more = if up {
                                ord == std::cmp::Ordering::Less
                            } else {
                                ord == std::cmp::Ordering::Greater
                            };
                            if !more {
                                break;
                            }
                            out.push(Element::Float(v.to_f64()));
                            if out.len() > 1_000_000 {
                                return Err(err("range() yields more than a million values"));
                            }
                            v = v.add(&step).rounded(28);
                        }
                    }
                }
                if *shuffle {
                    permute(&mut out);
                }
                Ok(out)
            }
            Sweep::Interval { .. } => Err(err(
                "BasicSweeper does not support sweep type : INTERVAL_SWEEP",
            )),
            Sweep::Glob { .. } => Err(err(
                "glob() can only sweep over the options of a config group",
            )),
        }
    }

    /// fnmatch-style filtering of group options (Hydra's `Glob.filter`), keeping `names` order.
    pub fn glob_filter(include: &[String], exclude: &[String], names: &[String]) -> Vec<String> {
        names
            .iter()
            .filter(|n| {
                include.iter().any(|p| fnmatch(p, n)) && !exclude.iter().any(|p| fnmatch(p, n))
            })
            .cloned()
            .collect()
    }
}

/// Just enough of Python's `decimal.Decimal` for Hydra's float ranges: exact conversion from `f64`,
/// exact addition and comparison, and rounding to a precision (half-even, as the default context).
#[derive(Debug, Clone)]
struct Dec {
    neg: bool,
    /// Most significant first; empty is zero.
    digits: Vec<u8>,
    /// value = digits * 10^exp
    exp: i64,
}

impl Dec {
    fn from_f64(x: f64) -> Dec {
        let bits = x.to_bits();
        let neg = bits >> 63 == 1;
        let exp_bits = ((bits >> 52) & 0x7ff) as i64;
        let frac = bits & ((1u64 << 52) - 1);
        let (mant, e2) = if exp_bits == 0 {
            (frac, -1074)
        } else {
            (frac | (1u64 << 52), exp_bits - 1075)
        };
        let mut digits: Vec<u8> = mant.to_string().bytes().map(|b| b - b'0').collect();
        let (factor, times) = if e2 >= 0 { (2, e2) } else { (5, -e2) };
        for _ in 0..times {
            let mut carry = 0u8;
            for d in digits.iter_mut().rev() {
                let v = *d * factor + carry;
                *d = v % 10;
                carry = v / 10;
            }
            if carry > 0 {
                digits.insert(0, carry);
            }
        }
        Dec {
            neg,
            digits,
            exp: e2.min(0),
        }
        .normalized()
    }

    fn normalized(mut self) -> Dec {
        let lead = self.digits.iter().take_while(|d| **d == 0).count();
        self.digits.drain(..lead);
        while self.digits.last() == Some(&0) {
            self.digits.pop();
            self.exp += 1;
        }
        if self.digits.is_empty() {
            self.neg = false;
            self.exp = 0;
        }
        self
    }

    /// The magnitude's digits scaled to exponent `exp` (which must not exceed `self.exp`), `len` long.
    fn aligned(&self, exp: i64, len: usize) -> Vec<u8> {
        let shift = usize::try_from(self.exp - exp).unwrap_or(0);
        let mut v = vec![0u8; len.saturating_sub(self.digits.len() + shift)];
        v.extend_from_slice(&self.digits);
        v.extend(std::iter::repeat_n(0, shift));
        v
    }

    fn add(&self, other: &Dec) -> Dec {
        if self.digits.is_empty() {
            return other.clone();
        }
        if other.digits.is_empty() {
            return self.clone();
        }
        let exp = self.exp.min(other.exp);
        let width = |d: &Dec| d.digits.len() + usize::try_from(d.exp - exp).unwrap_or(0);
        let len = width(self).max(width(other)) + 1;
        let (a, b) = (self.aligned(exp, len), other.aligned(exp, len));
        let (neg, digits) = if self.neg == other.neg {
            let mut out = vec![0u8; len];
            let mut carry = 0;
            for i in (0..len).rev() {
                let v = a[i] + b[i] + carry;
                out[i] = v % 10;
                carry = v / 10;
            }
            (self.neg, out)
        } else {
            // Subtract the smaller magnitude from the larger.
            let (big, small, neg) = if a >= b {
                (a, b, self.neg)
            } else {
                (b, a, other.neg)
            };
            let mut out = vec![0u8; len];
            let mut borrow = 0i8;
            for i in (0..len).rev() {
                let mut v = big[i] as i8 - small[i] as i8 - borrow;
                borrow = i8::from(v < 0);
                if v < 0 {
                    v += 10;
                }
                out[i] = v as u8;
            }
            (neg, out)
        };
        Dec { neg, digits, exp }.normalized()
    }

    fn rounded(mut self, precision: usize) -> Dec {
        if self.digits.len() <= precision {
            return self;
        }
        let drop = self.digits.len() - precision;
        let tail = self.digits.split_off(precision);
        let first = tail.first().copied().unwrap_or(0);
        let rest_nonzero = tail.iter().skip(1).any(|d| *d != 0);
        let last_odd = self.digits.last().is_some_and(|d| d % 2 == 1);
        self.exp += drop as i64;
        if first > 5 || (first == 5 && (rest_nonzero || last_odd)) {
            let mut i = self.digits.len();
            loop {
                if i == 0 {
                    self.digits.insert(0, 1);
                    break;
                }
                i -= 1;
                if self.digits[i] == 9 {
                    self.digits[i] = 0;
                } else {
                    self.digits[i] += 1;
                    break;
                }
            }
        }
        self.normalized()
    }

    fn cmp_exact(&self, other: &Dec) -> std::cmp::Ordering {
        let diff = self.add(&Dec {
            neg: !other.neg,
            digits: other.digits.clone(),
            exp: other.exp,
        });
        match (diff.digits.is_empty(), diff.neg) {
            (true, _) => std::cmp::Ordering::Equal,
            (false, true) => std::cmp::Ordering::Less,
            (false, false) => std::cmp::Ordering::Greater,
        }
    }

    fn to_f64(&self) -> f64 {
        if self.digits.is_empty() {
            return if self.neg { -0.0 } else { 0.0 };
        }
        let digits: String = self.digits.iter().map(|d| char::from(b'0' + d)).collect();
        let sign = if self.neg { "-" } else { "" };
        format!("{sign}{digits}e{}", self.exp)
            .parse()
            .unwrap_or(f64::NAN)
    }
}

/// Shell-style pattern match: `*`, `?`, `[seq]`, `[!seq]`.
fn fnmatch(pattern: &str, name: &str) -> bool {
    fn go(p: &[char], n: &[char]) -> bool {
        match p.first() {
            None => n.is_empty(),
            Some('*') => (0..=n.len()).any(|k| go(&p[1..], &n[k..])),
            Some('?') => !n.is_empty() && go(&p[1..], &n[1..]),
            Some('[') => {
                let Some(close) = p.iter().skip(1).position(|c| *c == ']').map(|i| i + 1) else {
                    return n.first() == Some(&'[') && go(&p[1..], &n[1..]);
                };
                let Some(&c) = n.first() else { return false };
                let set = &p[1..close];
                let (negate, set) = match set.first() {
                    Some('!') => (true, &set[1..]),
                    _ => (false, set),
                };
                let mut hit = false;
                let mut i = 0;
                while i < set.len() {
                    if i + 2 < set.len() && set[i + 1] == '-' {
                        hit |= set[i] <= c && c <= set[i + 2];
                        i += 3;
                    } else {
                        hit |= set[i] == c;
                        i += 1;
                    }
                }
                hit != negate && go(&p[close + 1..], &n[1..])
            }
            Some(&c) => n.first() == Some(&c) && go(&p[1..], &n[1..]),
        }
    }
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    go(&p, &n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn s(v: &str) -> Element {
        Element::Str {
            value: v.into(),
            quoted: false,
        }
    }
    fn q(v: &str) -> Element {
        Element::Str {
            value: v.into(),
            quoted: true,
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
    #[case("\"hello world\"", q("hello world"))]
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
