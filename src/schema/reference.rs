//! The configuration reference (`train --info schema`): every key of the typed config with its type,
//! default, allowed values and meaning, generated from the schema's own types and doc comments
//! (`schemars`), so the guide's reference (`docs/src/reference.md`, checked by tests/docs.rs) cannot
//! drift from what the program accepts.

use serde_json::{Map, Value};

/// The reference as Markdown: one section per top-level key, a table of its keys (nested ones dotted).
pub fn reference_markdown() -> String {
    let schema = schemars::generate::SchemaSettings::draft2020_12()
        .into_generator()
        .into_root_schema_for::<super::Experiment>();
    let root = schema.as_value();
    let defs = root
        .get("$defs")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut out = String::from(
        "# Configuration reference\n\n\
         Every key of the typed config, as `train --info schema` prints it (generated from the schema's types \
         and doc comments; a test checks this page equals the program's output). A key without a default must \
         be set by a config group or an override. Lightning's `_target_` forms of callbacks, loggers and the \
         optimizer are translated to these keys first (see \"Coming from Lightning + Hydra\").\n",
    );
    let mut top = Vec::new();
    let Some(props) = root.get("properties").and_then(Value::as_object) else {
        return out;
    };
    for (key, prop) in props {
        match object_properties(prop, &defs) {
            Some(_) => {}
            None => top.push((key.clone(), prop.clone())),
        }
    }
    out.push_str("\n## Top level\n\n");
    table(&mut out, "", &top, &defs);
    for (key, prop) in props {
        let Some((description, children)) = object_properties(prop, &defs) else {
            continue;
        };
        out.push_str(&format!("\n## `{key}`\n\n"));
        if let Some(d) = description.or_else(|| describe(prop)) {
            out.push_str(&format!("{}\n\n", one_paragraph(&d)));
        }
        let mut rows = Vec::new();
        flatten(&format!("{key}."), &children, &defs, &mut rows);
        table(&mut out, "", &rows, &defs);
    }
    out
}

/// A property that is an object with properties of its own (after `$ref` and `null` unions): its
/// description and its properties.
fn object_properties(
    prop: &Value,
    defs: &Map<String, Value>,
) -> Option<(Option<String>, Map<String, Value>)> {
    let target = resolve(prop, defs);
    let props = target.get("properties")?.as_object()?.clone();
    Some((describe(&target), props))
}

/// `$ref` followed (also inside `allOf`/`anyOf` with `null`), keeping the referring node's description.
fn resolve(prop: &Value, defs: &Map<String, Value>) -> Value {
    let reference = prop.get("$ref").and_then(Value::as_str).or_else(|| {
        ["allOf", "anyOf", "oneOf"].iter().find_map(|k| {
            let list = prop.get(*k)?.as_array()?;
            let non_null: Vec<&Value> = list
                .iter()
                .filter(|v| v.get("type") != Some(&Value::from("null")))
                .collect();
            match non_null.as_slice() {
                [one] => one.get("$ref").and_then(Value::as_str),
                _ => None,
            }
        })
    });
    match reference
        .and_then(|r| r.strip_prefix("#/$defs/"))
        .and_then(|n| defs.get(n))
    {
        Some(def) => def.clone(),
        None => prop.clone(),
    }
}

/// Nested objects become dotted rows (`trainer.profiler.filename`); others are one row each.
fn flatten(
    prefix: &str,
    props: &Map<String, Value>,
    defs: &Map<String, Value>,
    rows: &mut Vec<(String, Value)>,
) {
    for (key, prop) in props {
        let path = format!("{prefix}{key}");
        match object_properties(prop, defs) {
            Some((_, children)) if !children.is_empty() && prefix.matches('.').count() < 2 => {
                rows.push((path.clone(), prop.clone()));
                flatten(&format!("{path}."), &children, defs, rows);
            }
            _ => rows.push((path, prop.clone())),
        }
    }
}

fn table(out: &mut String, _prefix: &str, rows: &[(String, Value)], defs: &Map<String, Value>) {
    out.push_str("| key | type | default | meaning |\n|---|---|---|---|\n");
    for (key, prop) in rows {
        let target = resolve(prop, defs);
        let meaning = describe(prop)
            .or_else(|| describe(&target))
            .map(|d| one_paragraph(&d))
            .unwrap_or_default();
        let default = prop
            .get("default")
            .map(|d| format!("`{}`", compact(d)))
            .unwrap_or_else(|| "—".into());
        out.push_str(&format!(
            "| `{key}` | {} | {default} | {} |\n",
            type_text(prop, defs).replace('|', "\\|"),
            meaning.replace('|', "\\|")
        ));
    }
}

/// A short type: `integer`, `string or null`, one of the allowed values (`single`, `ddp`, ...).
fn type_text(prop: &Value, defs: &Map<String, Value>) -> String {
    let target = resolve(prop, defs);
    if let Some(values) = target.get("enum").and_then(Value::as_array) {
        let mut text = values
            .iter()
            .filter(|v| !v.is_null())
            .map(|v| format!("`{}`", compact(v)))
            .collect::<Vec<_>>()
            .join(", ");
        if values.iter().any(Value::is_null) {
            text.push_str(" or null");
        }
        return text;
    }
    if let Some(c) = target.get("const") {
        return format!("`{}`", compact(c));
    }
    for k in ["anyOf", "oneOf"] {
        if let Some(list) = target.get(k).and_then(Value::as_array) {
            let parts: Vec<String> = list.iter().map(|v| type_text(v, defs)).collect();
            return dedup(parts).join(" or ");
        }
    }
    match target.get("type") {
        Some(Value::String(t)) if t == "array" => match target.get("items") {
            Some(items) => format!("list of {}", type_text(items, defs)),
            None => "list".into(),
        },
        Some(Value::String(t)) if t == "object" && target.get("properties").is_some() => {
            "map".into()
        }
        Some(Value::String(t)) if t == "object" => "map of any".into(),
        Some(Value::String(t)) => t.clone(),
        Some(Value::Array(ts)) => ts
            .iter()
            .map(|t| {
                let mut one = target.clone();
                one["type"] = t.clone();
                type_text(&one, defs)
            })
            .collect::<Vec<_>>()
            .join(" or "),
        _ => "any".into(),
    }
}

fn dedup(parts: Vec<String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for p in parts {
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

fn describe(node: &Value) -> Option<String> {
    node.get("description")
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// A doc comment's lines joined into one paragraph (the table cell).
fn one_paragraph(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A JSON value as YAML would show it inline.
fn compact(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_names_keys_their_types_defaults_and_meaning() {
        let md = reference_markdown();
        for wanted in [
            "## `trainer`",
            "| `trainer.strategy` | `single`, `dp`, `ddp`, `fsdp` |",
            "| `trainer.precision` |",
            "`16-mixed`",
            "| `seed` | integer |",
            "## `callbacks`",
            "| `callbacks.early_stopping.patience` |",
        ] {
            assert!(md.contains(wanted), "missing {wanted:?} in:\n{md}");
        }
    }
}
