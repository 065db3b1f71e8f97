//! `trainer.profiler`: Lightning's `profiler="simple"` (or its `SimpleProfiler` arguments as a map).

use crate::config::errors::did_you_mean;
use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};

/// Lightning's SimpleProfiler: how long each action of the loop took, reported when training ends.
/// `profiler: simple`, or `profiler: {name: simple, filename: perf, dirpath: null, extended: true}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProfilerConfig {
    /// Always `simple` (the only profiler here); kept so the map form reads as Lightning's string.
    pub name: String,
    /// Where the report file goes (relative to the run directory); unset: the run directory.
    pub dirpath: Option<String>,
    /// With a filename the report is written to `<dirpath>/fit-<filename>.txt` (rank suffix `-<rank>`
    /// when there are several); without one it is printed (rank 0 only), as Lightning does.
    pub filename: Option<String>,
    /// Calls and the share of the whole run per action, besides the mean and total.
    pub extended: bool,
}

const KEYS: [&str; 4] = ["name", "dirpath", "filename", "extended"];

/// Lightning's other profilers, and why they are not here.
fn not_available(name: &str) -> Option<&'static str> {
    match name {
        "advanced" => {
            Some("Lightning's AdvancedProfiler runs Python's cProfile; there is no Python here")
        }
        "pytorch" => Some("Lightning's PyTorchProfiler traces PyTorch's operators from Python"),
        "xla" => Some("XLA (TPU) is not supported"),
        _ => None,
    }
}

fn named(name: &str) -> Result<String, String> {
    if name == "simple" {
        return Ok(name.to_string());
    }
    if let Some(why) = not_available(name) {
        return Err(format!(
            "profiler '{name}' is not available: {why}; use 'simple' (each action's mean and total \
             time) or null"
        ));
    }
    let hint = did_you_mean(name, ["simple"])
        .map(|s| format!(" (did you mean '{s}'?)"))
        .unwrap_or_default();
    Err(format!(
        "unknown profiler '{name}'{hint}; expected 'simple' or null"
    ))
}

impl<'de> Deserialize<'de> for ProfilerConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = |v: Option<&serde_json::Value>, key: &str| -> Result<Option<String>, D::Error> {
            match v {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
                Some(other) => Err(de::Error::custom(format!(
                    "profiler.{key} must be a string, got {other}"
                ))),
            }
        };
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(name) => Ok(ProfilerConfig {
                name: named(&name).map_err(de::Error::custom)?,
                dirpath: None,
                filename: None,
                extended: true,
            }),
            serde_json::Value::Object(map) => {
                if let Some(unknown) = map.keys().find(|k| !KEYS.contains(&k.as_str())) {
                    let hint = did_you_mean(unknown, KEYS)
                        .map(|s| format!(" (did you mean '{s}'?)"))
                        .unwrap_or_default();
                    return Err(de::Error::custom(format!(
                        "unknown profiler setting '{unknown}'{hint}; known: {}",
                        KEYS.join(", ")
                    )));
                }
                let name = text(map.get("name"), "name")?.unwrap_or_else(|| "simple".into());
                let extended = match map.get("extended") {
                    None | Some(serde_json::Value::Null) => true,
                    Some(serde_json::Value::Bool(b)) => *b,
                    Some(other) => {
                        return Err(de::Error::custom(format!(
                            "profiler.extended must be true or false, got {other}"
                        )))
                    }
                };
                Ok(ProfilerConfig {
                    name: named(&name).map_err(de::Error::custom)?,
                    dirpath: text(map.get("dirpath"), "dirpath")?,
                    filename: text(map.get("filename"), "filename")?,
                    extended,
                })
            }
            other => Err(de::Error::custom(format!(
                "profiler must be 'simple', a map of SimpleProfiler's settings or null, got {other}"
            ))),
        }
    }
}

impl schemars::JsonSchema for ProfilerConfig {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ProfilerConfig".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "Lightning's SimpleProfiler: `simple`, or {name: simple, dirpath, filename, extended}.",
            "anyOf": [
                {"const": "simple"},
                {"type": "object", "properties": {
                    "name": {"const": "simple"},
                    "dirpath": {"type": ["string", "null"]},
                    "filename": {"type": ["string", "null"]},
                    "extended": {"type": "boolean", "default": true}
                }}
            ]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `profiler`'s value, written as JSON (what figment hands over).
    fn parse(value: &str) -> Result<Option<ProfilerConfig>, String> {
        #[derive(Deserialize)]
        struct T {
            profiler: Option<ProfilerConfig>,
        }
        serde_json::from_str::<T>(&format!("{{\"profiler\": {value}}}"))
            .map(|t| t.profiler)
            .map_err(|e| e.to_string())
    }

    #[rstest::rstest]
    #[case::off("null", None)]
    #[case::named(r#""simple""#, Some((None, true)))]
    #[case::map(r#"{"filename": "perf", "extended": false}"#, Some((Some("perf"), false)))]
    #[case::map_named(r#"{"name": "simple", "filename": "perf"}"#, Some((Some("perf"), true)))]
    fn reads(#[case] value: &str, #[case] want: Option<(Option<&str>, bool)>) {
        let got = parse(value).unwrap();
        assert_eq!(
            got.as_ref().map(|p| (p.filename.as_deref(), p.extended)),
            want
        );
    }

    #[rstest::rstest]
    #[case::advanced(r#""advanced""#, "cProfile")]
    #[case::pytorch(r#""pytorch""#, "not available")]
    #[case::typo(r#""simpel""#, "did you mean 'simple'?")]
    #[case::unknown_key(r#"{"filenme": "x"}"#, "did you mean 'filename'?")]
    #[case::bad_extended(r#"{"extended": 3}"#, "true or false")]
    #[case::number("3", "'simple', a map")]
    fn refuses(#[case] value: &str, #[case] expected: &str) {
        let err = parse(value).unwrap_err();
        assert!(err.contains(expected), "{err}");
    }
}
