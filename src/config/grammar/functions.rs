//! The grammar functions (Hydra's `grammar_functions.py`): casts `int() float() str() bool()`, `choice`,
//! `range`, `interval`, `sort`, `shuffle`, `glob`, `tag`, with Python's argument binding and errors.

use super::*;

pub(super) const FUNCTIONS: &[&str] = &[
    "bool", "choice", "float", "glob", "int", "interval", "range", "shuffle", "sort", "str", "tag",
];

/// Why a grammar function refused its arguments; the first field is the Python exception name Hydra
/// reports (`ValueError`, `TypeError`, ...).
pub(super) struct FnError(pub(super) &'static str, pub(super) String);

pub(super) fn value_error<T>(msg: impl Into<String>) -> Result<T, FnError> {
    Err(FnError("ValueError", msg.into()))
}

pub(super) fn type_error<T>(msg: impl Into<String>) -> Result<T, FnError> {
    Err(FnError("TypeError", msg.into()))
}

/// The Python type name Hydra's messages use for a value.
pub(super) fn type_name(v: &Val) -> &'static str {
    match v {
        Val::Elem(Element::Null) => "NoneType",
        Val::Elem(Element::Bool(_)) => "bool",
        Val::Elem(Element::Int(_)) => "int",
        Val::Elem(Element::Float(_)) => "float",
        Val::Elem(Element::Str {
            quote: Quote::None, ..
        }) => "str",
        Val::Elem(Element::Str { .. }) => "QuotedString",
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
pub(super) enum ArgType {
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
pub(super) struct Signature {
    pub(super) var_args: Option<ArgType>,
    /// name, type, required (no default); parameters with a default accept `null` (Hydra's `Optional`).
    pub(super) params: &'static [(&'static str, ArgType, bool)],
}

pub(super) fn signature(name: &str) -> Option<Signature> {
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
pub(super) struct Bound {
    pub(super) var_args: Vec<Val>,
    /// One slot per named parameter; `None` when not given or given as `null` to an optional parameter.
    pub(super) named: Vec<Option<Val>>,
}

impl Bound {
    fn take(&mut self, i: usize) -> Option<Val> {
        self.named.get_mut(i).and_then(Option::take)
    }
}

pub(super) fn bind(
    sig: &Signature,
    args: Vec<Val>,
    kwargs: Vec<(String, Val)>,
) -> Result<Bound, FnError> {
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

pub(super) fn call_function(
    name: &str,
    args: Vec<Val>,
    kwargs: Vec<(String, Val)>,
) -> Result<Val, FnError> {
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
            quote: Quote::None,
        }),
        other => other,
    };
    let args: Vec<Val> = args.into_iter().map(unquote).collect();
    let kwargs: Vec<(String, Val)> = kwargs.into_iter().map(|(k, v)| (k, unquote(v))).collect();
    let b = bind(&sig, args, kwargs)?;
    match name {
        "int" | "float" | "str" | "bool" => cast_call(name, b),
        "choice" => choice_call(b),
        "range" => range_call(b),
        "interval" => interval_call(b),
        "tag" => tag_call(b),
        "shuffle" => shuffle_call(b),
        "sort" => sort_call(b),
        "glob" => glob_call(b),
        _ => Err(FnError(
            "HydraException",
            format!("Unknown function '{name}'"),
        )),
    }
}

/// `int()`, `float()`, `str()`, `bool()`: Python's casts of one value, a list, or a simple sweep.
fn cast_call(name: &str, mut b: Bound) -> Result<Val, FnError> {
    let value = match (b.var_args.len(), b.take(0)) {
        (n, Some(_)) if n > 0 => return type_error("cannot use both position and named arguments"),
        (_, Some(v)) => v,
        (0, None) => return type_error("No positional args or value specified"),
        (1, None) => b.var_args.pop().unwrap_or(Val::Elem(Element::Null)),
        (_, None) => Val::Sweep(Sweep::Choice {
            list: simple_choice(b.var_args)?,
            simple_form: true,
            shuffle: false,
            tags: Vec::new(),
        }),
    };
    cast(name, value)
}

/// `choice(...)`: an explicit sweep over the values.
fn choice_call(b: Bound) -> Result<Val, FnError> {
    let args = b.var_args;
    if args.is_empty() {
        return value_error("empty choice is not legal");
    }
    if let [Val::Sweep(Sweep::Choice {
        list,
        simple_form,
        shuffle,
        tags,
    })] = args.as_slice()
    {
        if !*simple_form {
            return value_error("nesting choices is not supported");
        }
        return Ok(Val::Sweep(Sweep::Choice {
            list: list.clone(),
            simple_form: false,
            shuffle: *shuffle,
            tags: tags.clone(),
        }));
    }
    Ok(Val::Sweep(Sweep::Choice {
        list: simple_choice(args)?,
        simple_form: false,
        shuffle: false,
        tags: Vec::new(),
    }))
}

/// `range(start, stop, step)`: Python's range as a sweep (ints stay ints).
fn range_call(mut b: Bound) -> Result<Val, FnError> {
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
        tags: Vec::new(),
    }))
}

/// `interval(start, end)`: a continuous range (for search sweepers).
fn interval_call(mut b: Bound) -> Result<Val, FnError> {
    // Hydra's interval() makes floats of both ends; `int(interval(...))` makes ints of them.
    let f = |v: Option<Val>| match v {
        Some(Val::Elem(Element::Int(i))) => Num::Float(i as f64),
        Some(Val::Elem(Element::Bool(x))) => Num::Float(f64::from(u8::from(x))),
        Some(Val::Elem(Element::Float(x))) => Num::Float(x),
        _ => Num::Float(0.0), // excluded by the signature
    };
    let start = f(b.take(0));
    let end = f(b.take(1));
    Ok(Val::Sweep(Sweep::Interval {
        start,
        end,
        tags: Vec::new(),
    }))
}

/// `tag(t1, ..., sweep)`: tags on a sweep (string tags).
fn tag_call(mut b: Bound) -> Result<Val, FnError> {
    let mut all = std::mem::take(&mut b.var_args);
    if let Some(s) = b.take(0) {
        if all.is_empty() {
            return value_error("Not enough arguments to tag, must take at least a sweep");
        }
        all.push(s);
    }
    match all.pop() {
        Some(Val::Sweep(s)) => {
            if let Some(t) = all
                .iter()
                .find(|t| !matches!(t, Val::Elem(Element::Str { .. })))
            {
                return value_error(format!(
                    "tag arguments type must be string, got {}",
                    type_name(t)
                ));
            }
            let tags = all
                .into_iter()
                .filter_map(|t| match t {
                    Val::Elem(Element::Str { value, .. }) => Some(value),
                    _ => None,
                })
                .collect();
            Ok(Val::Sweep(s.with_tags(tags)))
        }
        Some(_) => value_error(
            "Last argument to tag() must be a choice(), range() or interval(), got NoneType",
        ),
        None => value_error("Not enough arguments to tag, must take at least a sweep"),
    }
}

/// `shuffle(...)`: a sweep or list in random order.
fn shuffle_call(mut b: Bound) -> Result<Val, FnError> {
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
                tags: Vec::new(),
            }))
        }
    };
    Ok(match single {
        Val::Sweep(Sweep::Choice {
            list,
            simple_form,
            tags,
            ..
        }) => Val::Sweep(Sweep::Choice {
            list,
            simple_form,
            shuffle: true,
            tags,
        }),
        Val::Sweep(Sweep::Range {
            start,
            stop,
            step,
            tags,
            ..
        }) => Val::Sweep(Sweep::Range {
            start,
            stop,
            step,
            shuffle: true,
            tags,
        }),
        Val::Elem(Element::List(mut l)) => {
            permute(&mut l);
            Val::Elem(Element::List(l))
        }
        Val::Elem(e) => Val::Elem(Element::List(vec![e])),
        Val::Sweep(_) => return type_error("shuffle() does not support interval or glob"),
    })
}

/// `sort(..., reverse=...)`: a sweep or list in Python's order.
fn sort_call(mut b: Bound) -> Result<Val, FnError> {
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
                return type_error("Invalid arguments: sort() takes primitives, a list or a sweep");
            }
            if args.is_empty() {
                return value_error("empty sort input");
            }
            Val::Sweep(Sweep::Choice {
                list: simple_choice(args)?,
                simple_form: true,
                shuffle: false,
                tags: Vec::new(),
            })
        }
    };
    match single {
        Val::Sweep(Sweep::Choice {
            list,
            simple_form,
            shuffle,
            tags,
        }) => Ok(Val::Sweep(Sweep::Choice {
            list: py_sorted(list, reverse)?,
            simple_form,
            shuffle,
            tags,
        })),
        Val::Sweep(Sweep::Range {
            start,
            stop,
            step,
            shuffle,
            tags,
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
                    tags,
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
                tags,
            }))
        }
        Val::Elem(Element::List(l)) => Ok(Val::Elem(Element::List(py_sorted(l, reverse)?))),
        Val::Elem(e) => Ok(Val::Elem(e)),
        Val::Sweep(_) => type_error("sort() does not support interval or glob"),
    }
}

/// `glob(include, exclude)`: the options of a group that match shell patterns.
fn glob_call(mut b: Bound) -> Result<Val, FnError> {
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

pub(super) fn simple_choice(args: Vec<Val>) -> Result<Vec<Element>, FnError> {
    args.into_iter()
        .map(|a| match a {
            Val::Elem(e) => Ok(e),
            Val::Sweep(_) => type_error("a sweep cannot be an element of another sweep"),
        })
        .collect()
}

pub(super) fn cast(name: &str, value: Val) -> Result<Val, FnError> {
    // Like Hydra, a cast sweep loses its shuffle flag.
    match value {
        Val::Elem(e) => cast_element(name, e).map(Val::Elem),
        Val::Sweep(Sweep::Choice {
            list,
            simple_form,
            tags,
            ..
        }) => Ok(Val::Sweep(Sweep::Choice {
            list: list
                .into_iter()
                .map(|e| cast_element(name, e))
                .collect::<Result<_, _>>()?,
            simple_form,
            shuffle: false,
            tags,
        })),
        Val::Sweep(Sweep::Range {
            start,
            stop,
            step,
            tags,
            ..
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
                tags,
            }))
        }
        Val::Sweep(Sweep::Interval { start, end, tags }) => match name {
            "int" => Ok(Val::Sweep(Sweep::Interval {
                start: Num::Int(float_to_int(start.as_f64())?),
                end: Num::Int(float_to_int(end.as_f64())?),
                tags,
            })),
            "float" => Ok(Val::Sweep(Sweep::Interval {
                start: Num::Float(start.as_f64()),
                end: Num::Float(end.as_f64()),
                tags,
            })),
            _ => value_error(format!("Intervals cannot be cast to {name}")),
        },
        Val::Sweep(Sweep::Glob { .. }) => type_error(format!("glob() cannot be cast to {name}")),
    }
}

/// Python's `int(float)`.
pub(super) fn float_to_int(x: f64) -> Result<i64, FnError> {
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
pub(super) fn python_underscores(text: &str) -> Option<String> {
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
pub(super) fn python_int(text: &str) -> Option<i64> {
    let t = python_underscores(text.trim())?;
    let digits = t.strip_prefix(['+', '-']).unwrap_or(&t);
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    t.parse::<i64>().ok()
}

/// Python's `float(str)`.
pub(super) fn python_float(text: &str) -> Option<f64> {
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
pub(super) fn cast_element(name: &str, e: Element) -> Result<Element, FnError> {
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
                quote: Quote::None,
            },
            _ => Element::Bool(i != 0),
        }),
        Element::Float(x) => Ok(match name {
            "int" => Element::Int(float_to_int(x)?),
            "float" => Element::Float(x),
            "str" => Element::Str {
                value: crate::config::tree::python_float_repr(x),
                quote: Quote::None,
            },
            _ => Element::Bool(x != 0.0),
        }),
        Element::Bool(b) => Ok(match name {
            "int" => Element::Int(i64::from(b)),
            "float" => Element::Float(f64::from(u8::from(b))),
            "str" => Element::Str {
                value: b.to_string(),
                quote: Quote::None,
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
                quote: Quote::None,
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
pub(super) fn py_cmp(a: &Element, b: &Element) -> Result<std::cmp::Ordering, FnError> {
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
                quote: Quote::None,
            },
            Element::Str {
                value: y,
                quote: Quote::None,
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
pub(super) fn py_sorted(list: Vec<Element>, reverse: bool) -> Result<Vec<Element>, FnError> {
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
pub(super) fn permute<T>(items: &mut [T]) {
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
