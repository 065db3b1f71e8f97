//! The override lexer in value mode (Hydra's `OverrideLexer.g4`): longest match, ties to the earlier rule.

use super::{fail, ParseError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tok {
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
pub(super) struct Token {
    pub(super) kind: Tok,
    pub(super) text: String,
    /// column of the first char in the whole override line
    pub(super) col: usize,
}

pub(super) fn is_ws(c: char) -> bool {
    c == ' ' || c == '\t'
}

pub(super) fn ws_len(s: &[char], i: usize) -> usize {
    s[i.min(s.len())..]
        .iter()
        .take_while(|c| is_ws(**c))
        .count()
}

pub(super) fn digits_len(s: &[char], i: usize) -> usize {
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
pub(super) fn int_unsigned_len(s: &[char], i: usize) -> usize {
    match s.get(i) {
        Some('0') => 1,
        Some(c) if c.is_ascii_digit() => digits_len(s, i),
        _ => 0,
    }
}

pub(super) fn point_float_len(s: &[char], i: usize) -> usize {
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

pub(super) fn float_len(s: &[char], i: usize) -> usize {
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

pub(super) fn int_len(s: &[char], i: usize) -> usize {
    let sign = usize::from(matches!(s.get(i), Some('+' | '-')));
    let n = int_unsigned_len(s, i + sign);
    if n == 0 {
        0
    } else {
        sign + n
    }
}

pub(super) fn keyword_len(s: &[char], i: usize, word: &str) -> usize {
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

pub(super) fn id_len(s: &[char], i: usize) -> usize {
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

pub(super) fn esc_len(s: &[char], i: usize) -> usize {
    let mut j = i;
    while j + 1 < s.len() && s[j] == '\\' && "\\()[]{}:=, \t".contains(s[j + 1]) {
        j += 2;
    }
    j - i
}

pub(super) fn quoted_len(s: &[char], i: usize) -> usize {
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

pub(super) fn interpolation_len(s: &[char], i: usize) -> usize {
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
pub(super) fn lex_value(s: &[char], offset: usize, input: &str) -> Result<Vec<Token>, ParseError> {
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
