//! The writer: block-style YAML as `OmegaConf.to_yaml` prints it, quoting what would read back as another
//! type.

use super::scalars::*;
use super::*;

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

pub(super) fn write_block(out: &mut String, node: &Node, indent: usize) {
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

pub(super) fn write_child(out: &mut String, value: &Node, indent: usize, in_list: bool) {
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

pub(super) fn scalar_text(value: &Value) -> String {
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
pub(super) fn omegaconf_quotes(s: &str) -> bool {
    matches!(s, "y" | "Y" | "n" | "N") || python_int(s) || python_float(s)
}

/// Digits with single underscores between them, as Python's `int()` and `float()` take them.
pub(super) fn python_digits(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('_')
        && !s.ends_with('_')
        && !s.contains("__")
        && s.chars().all(|c| c.is_ascii_digit() || c == '_')
}

pub(super) fn python_int(s: &str) -> bool {
    python_digits(split_sign(s.trim()).1)
}

pub(super) fn python_float(s: &str) -> bool {
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
pub(super) fn is_timestamp(s: &str) -> bool {
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
