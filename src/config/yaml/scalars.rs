//! Plain scalars typed as OmegaConf's loader types them (PyYAML's YAML 1.1 resolvers, no timestamps, plus
//! `1e3`-style floats), and the `# @package` header.

use super::*;

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

pub(super) fn parse_bool(text: &str) -> Option<bool> {
    match text {
        "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => Some(true),
        "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => Some(false),
        _ => None,
    }
}

pub(super) fn split_sign(text: &str) -> (bool, &str) {
    match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    }
}

pub(super) fn all_digits(s: &str, radix: u32) -> bool {
    !s.is_empty() && s.chars().all(|c| c == '_' || c.is_digit(radix))
}

/// PyYAML 1.1 ints: decimal with `_`, `0b`, `0x`, leading-zero octal, and sexagesimal `1:30`.
pub(super) fn parse_int(text: &str) -> Option<i64> {
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
pub(super) fn is_pyyaml_float(text: &str) -> bool {
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
pub(super) fn is_omegaconf_exp_float(text: &str) -> bool {
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

pub(super) fn all_digits_nonempty_start(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_digit()) && all_digits(s, 10)
}

pub(super) fn split_exponent(s: &str) -> (&str, Option<&str>) {
    match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    }
}

pub(super) fn parse_float(text: &str) -> Option<f64> {
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
