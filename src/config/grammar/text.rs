//! Parsed values back to text, as Hydra's BasicSweeper writes each job's overrides (escaping, quoting), and
//! a sweep's values listed (ranges in Python's decimal arithmetic, globs matched shell-style).

use super::functions::permute;
use super::*;

/// Hydra's `escape_special_characters`: backslash before `\()[]{}:=, \t`.
pub(super) fn escape_special(s: &str) -> String {
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
                quote: Quote::None,
            } => escape_special(value),
            Element::Str { value, quote } => with_quotes(value, *quote),
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
                    .map(|(k, v)| format!(
                        "{}:{}",
                        k.to_element().to_override_string(),
                        v.to_override_string()
                    ))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        }
    }
}

/// Re-quote a string with the quotes it was written in, escaping them and the backslashes that precede
/// them (Hydra's `QuotedString.with_quotes`).
pub(super) fn with_quotes(text: &str, quote: Quote) -> String {
    let q = match quote {
        Quote::Double => '"',
        _ => '\'',
    };
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
                ..
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
pub(super) struct Dec {
    pub(super) neg: bool,
    /// Most significant first; empty is zero.
    pub(super) digits: Vec<u8>,
    /// value = digits * 10^exp
    pub(super) exp: i64,
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
pub(super) fn fnmatch(pattern: &str, name: &str) -> bool {
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
