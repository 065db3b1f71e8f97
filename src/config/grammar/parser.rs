//! The override parser (Hydra's `OverrideParser.g4`), recursive descent over the lexer's tokens: key,
//! package, value, lists, dicts and grammar function calls.

use super::functions::*;
use super::lexer::*;
use super::*;

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
            quote: Quote::None,
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

pub(super) fn is_key_id(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == '$')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '$')
}

pub(super) fn is_int_unsigned(s: &str) -> bool {
    s == "0"
        || (s.starts_with(|c: char| ('1'..='9').contains(&c))
            && s.chars().all(|c| c.is_ascii_digit() || c == '_')
            && !s.contains("__")
            && !s.ends_with('_'))
}

pub(super) fn parse_key(text: &str, offset: usize, input: &str) -> Result<Key, ParseError> {
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

pub(super) struct Parser<'a> {
    pub(super) tokens: &'a [Token],
    pub(super) pos: usize,
    pub(super) input: &'a str,
    pub(super) end_col: usize,
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
            tags: Vec::new(),
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
                let quote = match t.text.starts_with('"') {
                    true => Quote::Double,
                    false => Quote::Single,
                };
                Ok(Val::Elem(Element::Str { value, quote }))
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
                    quote: Quote::None,
                },
                _ => Element::Str {
                    value: t.text.clone(),
                    quote: Quote::None,
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
            quote: Quote::None,
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
        let mut items: Vec<(DictKey, Element)> = Vec::new();
        if self.peek() != Some(Tok::BraceClose) {
            loop {
                let key_col = self.col();
                // Typed as Hydra's `_createPrimitive` types a key: `{1: a}` has the int key 1.
                let key = match self.primitive(false)? {
                    Element::Null => DictKey::Null,
                    Element::Bool(b) => DictKey::Bool(b),
                    Element::Int(i) => DictKey::Int(i),
                    Element::Float(x) => DictKey::Float(x),
                    Element::Str { value, .. } if value.is_empty() => {
                        return fail(self.input, key_col, "missing dictionary key");
                    }
                    Element::Str { value, .. } => DictKey::Str(value),
                    other => DictKey::Str(other.to_override_string()),
                };
                self.expect(Tok::Colon, "':'")?;
                let v = self.element()?;
                let v = self.plain(v)?;
                // A later duplicate replaces the value and keeps the first key, as a Python dict does.
                if let Some(slot) = items.iter_mut().find(|(k, _)| k.same_key(&key)) {
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

pub(super) fn parse_float_token(text: &str) -> f64 {
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
pub(super) fn unescape_esc(text: &str) -> String {
    text.chars().skip(1).step_by(2).collect()
}

/// Hydra's quoted-string unescaping: only backslashes that precede a quote are escapes.
pub(super) fn unescape_quoted(text: &str) -> String {
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
