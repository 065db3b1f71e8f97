//! Property tests of the override grammar: it never panics, whatever the input, and what the sweeper prints
//! for a value parses back to the same value. Case counts are bounded so this runs in seconds in CI
//! (`PROPTEST_CASES` raises them).

use proptest::prelude::*;
use trainyard::config::grammar::{parse_override, DictKey, Element, ParsedValue, Quote};

/// Strings made mostly of the characters the grammar gives meaning to.
fn grammar_soup() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            Just("=".to_string()),
            Just("+".to_string()),
            Just("~".to_string()),
            Just("@".to_string()),
            Just("[".to_string()),
            Just("]".to_string()),
            Just("{".to_string()),
            Just("}".to_string()),
            Just(",".to_string()),
            Just("(".to_string()),
            Just(")".to_string()),
            Just("'".to_string()),
            Just("\"".to_string()),
            Just("\\".to_string()),
            Just("${".to_string()),
            Just(":".to_string()),
            Just(" ".to_string()),
            Just(".".to_string()),
            Just("/".to_string()),
            Just("a".to_string()),
            Just("1".to_string()),
            Just("1e".to_string()),
            Just("-".to_string()),
            Just("_".to_string()),
            Just("choice(".to_string()),
            Just("range(".to_string()),
            Just("int(".to_string()),
            Just("sort(".to_string()),
            Just("glob(".to_string()),
            Just("null".to_string()),
            Just("true".to_string()),
            Just("inf".to_string()),
            Just("é".to_string()),
            "[a-z0-9]{1,3}",
        ],
        0..24,
    )
    .prop_map(|parts| parts.concat())
}

fn leaf() -> impl Strategy<Value = Element> {
    prop_oneof![
        Just(Element::Null),
        any::<bool>().prop_map(Element::Bool),
        any::<i64>().prop_map(Element::Int),
        (-1e12f64..1e12).prop_map(Element::Float),
        "[a-zA-Z_][a-zA-Z0-9_ ,:=()\\[\\]{}-]{0,8}[a-zA-Z0-9_]".prop_map(|value| Element::Str {
            value,
            quote: Quote::None
        }),
        "[a-zA-Z0-9 ,'\"\\\\]{0,10}".prop_map(|value| Element::Str {
            value,
            quote: Quote::Single
        }),
    ]
}

/// Dict keys keep their type (`{1: a}` has the int key 1), so generate typed keys too.
fn dict_key() -> impl Strategy<Value = DictKey> {
    prop_oneof![
        "[a-z][a-z0-9_]{0,5}".prop_map(DictKey::Str),
        any::<i64>().prop_map(DictKey::Int),
        any::<bool>().prop_map(DictKey::Bool),
        (-1e12f64..1e12).prop_map(DictKey::Float),
    ]
}

fn element() -> impl Strategy<Value = Element> {
    leaf().prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Element::List),
            proptest::collection::vec((dict_key(), inner), 0..4).prop_map(|items| {
                // Dict keys are unique as Python compares them (a later duplicate replaces an earlier one).
                let mut kept: Vec<(DictKey, Element)> = Vec::new();
                for (k, v) in items {
                    if !kept.iter().any(|(seen, _)| seen.same_key(&k)) {
                        kept.push((k, v));
                    }
                }
                Element::Dict(kept)
            }),
        ]
    })
}

/// Python prints `True`; Hydra parses it back case-insensitively. Unquoted strings that look like other
/// types come back typed, as in Hydra, so compare modulo that.
fn same(a: &Element, b: &Element) -> bool {
    match (a, b) {
        // `k=[nAn]` is a float list in Hydra too: an unquoted string may come back typed, at any depth.
        (
            Element::Str {
                quote: Quote::None, ..
            },
            back,
        ) if !matches!(back, Element::Str { .. }) => true,
        (Element::Float(x), Element::Float(y)) => x == y || (x.is_nan() && y.is_nan()),
        (Element::List(x), Element::List(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
        }
        (Element::Dict(x), Element::Dict(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|((ka, va), (kb, vb))| same_key(ka, kb) && same(va, vb))
        }
        _ => a == b,
    }
}

/// As `same` for keys: an unquoted string key that reads back as a number, bool or null is Hydra's doing.
fn same_key(a: &DictKey, b: &DictKey) -> bool {
    a == b || (matches!(a, DictKey::Str(_)) && !matches!(b, DictKey::Str(_)))
}

/// 3000 cases in CI's time; `PROPTEST_CASES=1000000` for a longer local search.
fn config() -> ProptestConfig {
    let mut config = ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = 3000;
    }
    config
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn never_panics_on_arbitrary_text(s in "\\PC{0,40}") {
        let _ = parse_override(&s);
        let _ = parse_override(&format!("k={s}"));
    }

    #[test]
    fn never_panics_on_grammar_soup(s in grammar_soup()) {
        let _ = parse_override(&s);
        if let Ok(o) = parse_override(&format!("key={s}")) {
            if let Some(ParsedValue::Sweep(sw)) = &o.value {
                let _ = sw.discrete_values();
            }
        }
    }

    #[test]
    fn printed_values_parse_back(e in element()) {
        let text = format!("k={}", e.to_override_string());
        let parsed = parse_override(&text).map_err(|err| TestCaseError::fail(format!("{text}: {err}")))?;
        match parsed.value {
            Some(ParsedValue::Element(back)) => {
                prop_assert!(same(&e, &back), "{text}: {e:?} != {back:?}");
            }
            other => prop_assert!(false, "{text} parsed as {other:?}"),
        }
    }
}

/// The case CI's random search found once: an unquoted `nAn` nested in a list reads back as Hydra's float NaN.
#[test]
fn a_nested_unquoted_nan_reads_back_as_a_float() {
    let e = Element::List(vec![Element::Str {
        value: "nAn".into(),
        quote: Quote::None,
    }]);
    let text = format!("k={}", e.to_override_string());
    match parse_override(&text).unwrap().value {
        Some(ParsedValue::Element(back)) => {
            assert!(
                matches!(&back, Element::List(items) if matches!(items[..], [Element::Float(x)] if x.is_nan()))
            );
            assert!(same(&e, &back), "{text}: {e:?} != {back:?}");
        }
        other => panic!("{text} parsed as {other:?}"),
    }
}
