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
    fn to_element(self) -> Element {
        match self {
            Num::Int(i) => Element::Int(i),
            Num::Float(x) => Element::Float(x),
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
        call_function(&name_tok.text, args, kwargs)
            .or_else(|reason| fail(self.input, name_tok.col, reason))
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

fn call_function(name: &str, args: Vec<Val>, kwargs: Vec<(String, Val)>) -> Result<Val, String> {
    let kw = |key: &str| {
        kwargs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    for (k, _) in &kwargs {
        let allowed: &[&str] = match name {
            "int" | "float" | "str" | "bool" => &["value"],
            "range" => &["start", "stop", "step"],
            "interval" => &["start", "end"],
            "sort" => &["sweep", "list", "reverse"],
            "shuffle" => &["sweep", "list"],
            "glob" => &["include", "exclude"],
            "tag" => &["sweep"],
            _ => &[],
        };
        if !allowed.contains(&k.as_str()) {
            return Err(format!("{name}() got an unexpected keyword argument '{k}'"));
        }
    }
    match name {
        "int" | "float" | "str" | "bool" => {
            let value = normalize_cast(args, kw("value"))?;
            cast(name, value)
        }
        "choice" => {
            if args.is_empty() {
                return Err("empty choice is not legal".into());
            }
            if args.len() == 1 {
                if let Val::Sweep(Sweep::Choice {
                    list,
                    simple_form,
                    shuffle,
                }) = &args[0]
                {
                    if *simple_form {
                        return Ok(Val::Sweep(Sweep::Choice {
                            list: list.clone(),
                            simple_form: false,
                            shuffle: *shuffle,
                        }));
                    }
                    return Err("nesting choices is not supported".into());
                }
            }
            let list = args
                .into_iter()
                .map(|a| match a {
                    Val::Elem(e) => Ok(e),
                    Val::Sweep(_) => Err("nesting choices is not supported".to_string()),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Val::Sweep(Sweep::Choice {
                list,
                simple_form: false,
                shuffle: false,
            }))
        }
        "range" => {
            let mut positional = args.into_iter();
            let mut get = |key: &str| kw(key).or_else(|| positional.next());
            let a = get("start");
            let b = get("stop");
            let c = get("step");
            let num = |v: Option<Val>, what: &str| -> Result<Option<Num>, String> {
                match v {
                    None => Ok(None),
                    Some(Val::Elem(Element::Int(i))) => Ok(Some(Num::Int(i))),
                    Some(Val::Elem(Element::Float(x))) => Ok(Some(Num::Float(x))),
                    Some(other) => Err(format!(
                        "range() {what} must be a number, got {}",
                        describe(&other)
                    )),
                }
            };
            let (start, stop) = match (num(a, "start")?, num(b, "stop")?) {
                (Some(s), Some(e)) => (s, e),
                (Some(s), None) => (Num::Int(0), s),
                _ => return Err("range() missing required argument 'start'".into()),
            };
            let step = num(c, "step")?.unwrap_or(Num::Int(1));
            if step.as_f64() == 0.0 {
                return Err("range() arg 3 must not be zero".into());
            }
            Ok(Val::Sweep(Sweep::Range {
                start,
                stop,
                step,
                shuffle: false,
            }))
        }
        "interval" => {
            let mut positional = args.into_iter();
            let mut get = |key: &str| kw(key).or_else(|| positional.next());
            let f = |v: Option<Val>| -> Result<f64, String> {
                match v {
                    Some(Val::Elem(Element::Int(i))) => Ok(i as f64),
                    Some(Val::Elem(Element::Float(x))) => Ok(x),
                    Some(other) => Err(format!(
                        "interval() needs numbers, got {}",
                        describe(&other)
                    )),
                    None => Err("interval() needs a start and an end".into()),
                }
            };
            let start = f(get("start"))?;
            let end = f(get("end"))?;
            Ok(Val::Sweep(Sweep::Interval { start, end }))
        }
        "tag" => {
            let mut all = args;
            if let Some(s) = kw("sweep") {
                all.push(s);
            }
            match all.pop() {
                Some(Val::Sweep(s)) => {
                    for t in &all {
                        if !matches!(t, Val::Elem(Element::Str { .. })) {
                            return Err(format!(
                                "tag arguments type must be string, got {}",
                                describe(t)
                            ));
                        }
                    }
                    Ok(Val::Sweep(s))
                }
                Some(other) => Err(format!(
                    "Last argument to tag() must be a choice(), range() or interval(), got {}",
                    describe(&other)
                )),
                None => Err("Not enough arguments to tag, must take at least a sweep".into()),
            }
        }
        "shuffle" => {
            let target = kw("sweep").or_else(|| kw("list"));
            let arg = match (target, args.len()) {
                (Some(t), _) => t,
                (None, 1) => args.into_iter().next().unwrap_or(Val::Elem(Element::Null)),
                (None, _) => {
                    let list = simple_choice(args)?;
                    return Ok(Val::Sweep(Sweep::Choice {
                        list,
                        simple_form: true,
                        shuffle: true,
                    }));
                }
            };
            Ok(match arg {
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
                Val::Sweep(_) => return Err("shuffle() does not support interval or glob".into()),
            })
        }
        "sort" => {
            let reverse = match kw("reverse") {
                None => false,
                Some(Val::Elem(Element::Bool(b))) => b,
                Some(other) => {
                    return Err(format!(
                        "sort() reverse must be a bool, got {}",
                        describe(&other)
                    ))
                }
            };
            let target = kw("sweep").or_else(|| kw("list"));
            let arg = match (target, args.len()) {
                (Some(t), _) => t,
                (None, 0) => return Err("empty sort input".into()),
                (None, 1) => args.into_iter().next().unwrap_or(Val::Elem(Element::Null)),
                (None, _) => {
                    for a in &args {
                        if !matches!(
                            a,
                            Val::Elem(
                                Element::Int(_)
                                    | Element::Float(_)
                                    | Element::Bool(_)
                                    | Element::Str { .. }
                            )
                        ) {
                            return Err(
                                "Invalid arguments: sort() takes primitives, a list or a sweep"
                                    .into(),
                            );
                        }
                    }
                    Val::Sweep(Sweep::Choice {
                        list: simple_choice(args)?,
                        simple_form: true,
                        shuffle: false,
                    })
                }
            };
            match arg {
                Val::Sweep(Sweep::Choice {
                    mut list,
                    simple_form,
                    shuffle,
                }) => {
                    sort_elements(&mut list, reverse)?;
                    Ok(Val::Sweep(Sweep::Choice {
                        list,
                        simple_form,
                        shuffle,
                    }))
                }
                Val::Sweep(Sweep::Range {
                    start,
                    stop,
                    step,
                    shuffle,
                }) => {
                    let ascending = start.as_f64() <= stop.as_f64();
                    if ascending != reverse {
                        return Ok(Val::Sweep(Sweep::Range {
                            start,
                            stop,
                            step,
                            shuffle,
                        }));
                    }
                    // Flip the direction the way Hydra does (start/stop shifted by one step).
                    let abs = |n: Num| match n {
                        Num::Int(i) => Num::Int(i.abs()),
                        Num::Float(x) => Num::Float(x.abs()),
                    };
                    let add = |a: Num, b: Num, sign: f64| match (a, b) {
                        (Num::Int(x), Num::Int(y)) => Num::Int(x + (sign as i64) * y),
                        _ => Num::Float(a.as_f64() + sign * b.as_f64()),
                    };
                    let neg = |n: Num| match n {
                        Num::Int(i) => Num::Int(-i),
                        Num::Float(x) => Num::Float(-x),
                    };
                    let sign = if reverse { -1.0 } else { 1.0 };
                    Ok(Val::Sweep(Sweep::Range {
                        start: add(stop, abs(step), sign),
                        stop: add(start, abs(step), sign),
                        step: neg(step),
                        shuffle,
                    }))
                }
                Val::Elem(Element::List(mut l)) => {
                    sort_elements(&mut l, reverse)?;
                    Ok(Val::Elem(Element::List(l)))
                }
                Val::Elem(e) => Ok(Val::Elem(e)),
                Val::Sweep(_) => Err("sort() does not support interval or glob".into()),
            }
        }
        "glob" => {
            let mut positional = args.into_iter();
            let include = kw("include").or_else(|| positional.next());
            let exclude = kw("exclude").or_else(|| positional.next());
            let strings = |v: Option<Val>| -> Result<Vec<String>, String> {
                match v {
                    None | Some(Val::Elem(Element::Null)) => Ok(vec![]),
                    Some(Val::Elem(Element::Str { value, .. })) => Ok(vec![value]),
                    Some(Val::Elem(Element::List(l))) => l
                        .into_iter()
                        .map(|e| match e {
                            Element::Str { value, .. } => Ok(value),
                            other => Err(format!(
                                "glob() patterns must be strings, got {}",
                                other.to_override_string()
                            )),
                        })
                        .collect(),
                    Some(other) => Err(format!(
                        "glob() patterns must be strings, got {}",
                        describe(&other)
                    )),
                }
            };
            let include = strings(include)?;
            if include.is_empty() {
                return Err("glob() missing required argument 'include'".into());
            }
            Ok(Val::Sweep(Sweep::Glob {
                include,
                exclude: strings(exclude)?,
            }))
        }
        other => Err(format!(
            "Unknown function '{other}'\nAvailable: {}",
            FUNCTIONS.join(", ")
        )),
    }
}

fn describe(v: &Val) -> String {
    match v {
        Val::Elem(e) => e.to_override_string(),
        Val::Sweep(_) => "a sweep".into(),
    }
}

fn simple_choice(args: Vec<Val>) -> Result<Vec<Element>, String> {
    args.into_iter()
        .map(|a| match a {
            Val::Elem(e) => Ok(e),
            Val::Sweep(_) => Err("a sweep cannot be an element of another sweep".to_string()),
        })
        .collect()
}

fn normalize_cast(args: Vec<Val>, value: Option<Val>) -> Result<Val, String> {
    match (args.len(), value) {
        (n, Some(_)) if n > 0 => Err("cannot use both position and named arguments".into()),
        (_, Some(v)) => Ok(v),
        (0, None) => Err("No positional args or value specified".into()),
        (1, None) => Ok(args.into_iter().next().unwrap_or(Val::Elem(Element::Null))),
        (_, None) => Ok(Val::Sweep(Sweep::Choice {
            list: simple_choice(args)?,
            simple_form: true,
            shuffle: false,
        })),
    }
}

fn cast(name: &str, value: Val) -> Result<Val, String> {
    match value {
        Val::Elem(e) => cast_element(name, e).map(Val::Elem),
        Val::Sweep(Sweep::Choice {
            list,
            simple_form,
            shuffle,
        }) => Ok(Val::Sweep(Sweep::Choice {
            list: list
                .into_iter()
                .map(|e| cast_element(name, e))
                .collect::<Result<_, _>>()?,
            simple_form,
            shuffle,
        })),
        Val::Sweep(Sweep::Range {
            start,
            stop,
            step,
            shuffle,
        }) => {
            let f = |n: Num| -> Result<Num, String> {
                match name {
                    "int" => Ok(Num::Int(n.as_f64().trunc() as i64)),
                    "float" => Ok(Num::Float(n.as_f64())),
                    _ => Err("Range can only be cast to int or float".into()),
                }
            };
            Ok(Val::Sweep(Sweep::Range {
                start: f(start)?,
                stop: f(stop)?,
                step: f(step)?,
                shuffle,
            }))
        }
        Val::Sweep(Sweep::Interval { start, end }) => match name {
            "int" => Ok(Val::Sweep(Sweep::Interval {
                start: start.trunc(),
                end: end.trunc(),
            })),
            "float" => Ok(Val::Sweep(Sweep::Interval { start, end })),
            _ => Err(format!("Intervals cannot be cast to {name}")),
        },
        Val::Sweep(Sweep::Glob { .. }) => Err(format!("glob() cannot be cast to {name}")),
    }
}

/// Python's `int()`/`float()`/`str()`/`bool()` as Hydra applies them (recursing into lists and dict values).
fn cast_element(name: &str, e: Element) -> Result<Element, String> {
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
        Element::Null => Err(format!("{name}() cannot cast null")),
        e => match name {
            "int" => match e {
                Element::Int(i) => Ok(Element::Int(i)),
                Element::Float(x) if x.is_finite() => Ok(Element::Int(x.trunc() as i64)),
                Element::Float(x) => Err(format!(
                    "cannot convert float {} to integer",
                    crate::config::tree::python_float_repr(x)
                )),
                Element::Bool(b) => Ok(Element::Int(i64::from(b))),
                Element::Str { value, .. } => value
                    .trim()
                    .replace('_', "")
                    .parse::<i64>()
                    .map(Element::Int)
                    .map_err(|_| format!("invalid literal for int() with base 10: '{value}'")),
                _ => unreachable!("containers handled above"),
            },
            "float" => match e {
                Element::Int(i) => Ok(Element::Float(i as f64)),
                Element::Float(x) => Ok(Element::Float(x)),
                Element::Bool(b) => Ok(Element::Float(if b { 1.0 } else { 0.0 })),
                Element::Str { value, .. } => {
                    let t = value.trim().to_ascii_lowercase();
                    let parsed = match t.as_str() {
                        "inf" | "+inf" | "infinity" => Some(f64::INFINITY),
                        "-inf" | "-infinity" => Some(f64::NEG_INFINITY),
                        "nan" | "+nan" | "-nan" => Some(f64::NAN),
                        _ => t.replace('_', "").parse::<f64>().ok(),
                    };
                    parsed
                        .map(Element::Float)
                        .ok_or_else(|| format!("could not convert string to float: '{value}'"))
                }
                _ => unreachable!("containers handled above"),
            },
            "str" => Ok(Element::Str {
                value: match e {
                    Element::Int(i) => i.to_string(),
                    Element::Float(x) => crate::config::tree::python_float_repr(x),
                    Element::Bool(b) => b.to_string(),
                    Element::Str { value, .. } => value,
                    _ => unreachable!("containers handled above"),
                },
                quoted: false,
            }),
            _ => match e {
                Element::Bool(b) => Ok(Element::Bool(b)),
                Element::Int(i) => Ok(Element::Bool(i != 0)),
                Element::Float(x) => Ok(Element::Bool(x != 0.0)),
                Element::Str { value, .. } => match value.to_ascii_lowercase().as_str() {
                    "true" => Ok(Element::Bool(true)),
                    "false" => Ok(Element::Bool(false)),
                    _ => Err(format!("Cannot cast '{value}' to bool")),
                },
                _ => unreachable!("containers handled above"),
            },
        },
    }
}

fn sort_elements(list: &mut [Element], reverse: bool) -> Result<(), String> {
    let all_numbers = list
        .iter()
        .all(|e| matches!(e, Element::Int(_) | Element::Float(_) | Element::Bool(_)));
    let all_strings = list.iter().all(|e| matches!(e, Element::Str { .. }));
    if all_numbers {
        let key = |e: &Element| match e {
            Element::Int(i) => *i as f64,
            Element::Float(x) => *x,
            Element::Bool(b) => f64::from(u8::from(*b)),
            _ => 0.0,
        };
        list.sort_by(|a, b| {
            key(a)
                .partial_cmp(&key(b))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
    } else if all_strings {
        let key = |e: &Element| match e {
            Element::Str { value, .. } => value.clone(),
            _ => String::new(),
        };
        list.sort_by_key(key);
    } else {
        return Err("'<' not supported between the values given to sort()".into());
    }
    if reverse {
        list.reverse();
    }
    Ok(())
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
                    (Num::Int(a), Num::Int(b), Num::Int(s)) => {
                        let mut v = *a;
                        while (*s > 0 && v < *b) || (*s < 0 && v > *b) {
                            out.push(Element::Int(v));
                            if out.len() > 1_000_000 {
                                return Err(err("range() yields more than a million values"));
                            }
                            v += s;
                        }
                    }
                    _ => {
                        // Hydra's FloatRange accumulates (start += step), so do we.
                        let (mut v, b, s) = (start.as_f64(), stop.as_f64(), step.as_f64());
                        while (s > 0.0 && v < b) || (s < 0.0 && v > b) {
                            out.push(Num::Float(v).to_element());
                            if out.len() > 1_000_000 {
                                return Err(err("range() yields more than a million values"));
                            }
                            v += s;
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
    #[case("a=range(a,b)", "must be a number")]
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
