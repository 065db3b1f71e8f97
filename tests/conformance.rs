//! Conformance with Hydra 1.3: every case in tests/conformance/expected/*.json was produced by running
//! hydra-core 1.3.2 on the same config tree (bench/hydra_oracle.py). We must compose the same config,
//! resolve the same values, choose the same options, launch the same sweep jobs, and fail where Hydra
//! fails with a message that starts the way Hydra's does.

use rstest::rstest;
use serde_json::Value as J;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use trainyard::config::compose::RunMode;
use trainyard::config::errors::ConfigError;
use trainyard::config::hydra::{compose_with_hydra, parse_overrides, split_hydra};
use trainyard::config::interpolate::{resolve_all, ResolveContext};
use trainyard::config::repository::{Repository, SearchRoot};
use trainyard::config::sweep;

fn repo_for(tree: &str) -> Repository {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/conformance/trees")
        .join(tree);
    Repository::new(vec![SearchRoot {
        dir,
        mount: String::new(),
        provider: "main".into(),
    }])
}

fn context(case: &J) -> ResolveContext {
    let mut ctx = ResolveContext::from_process();
    if let Some(env) = case.get("env").and_then(J::as_object) {
        for (k, v) in env {
            ctx.env
                .insert(k.clone(), v.as_str().unwrap_or_default().to_string());
        }
    }
    ctx
}

/// Hydra appends its search path to missing-config errors; the part before it is what must match.
fn essential(message: &str) -> String {
    let cut = message
        .find("\nConfig search path")
        .unwrap_or(message.len());
    message[..cut].trim().to_string()
}

fn check_error(name: &str, ours: &ConfigError, expect: &J) {
    let theirs = essential(expect["error"].as_str().unwrap_or_default());
    let ours_text = ours.to_string();
    // Our messages add provenance and hints after Hydra's text; the first line must be Hydra's.
    let their_first = theirs.lines().next().unwrap_or_default();
    assert!(
        ours_text.contains(their_first),
        "case {name}: error differs\n  hydra: {theirs}\n  ours:  {ours_text}"
    );
}

fn run_case(case: &J) {
    let name = case["name"].as_str().unwrap();
    let tree = case["tree"].as_str().unwrap();
    let config_name = case["config_name"].as_str().unwrap();
    let mode = case["mode"].as_str().unwrap_or("compose");
    let texts: Vec<String> = case["overrides"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let expect = &case["expect"];
    let repo = repo_for(tree);
    let ctx = context(case);

    let overrides = match parse_overrides(&texts) {
        Ok(o) => o,
        Err(e) => {
            assert!(
                expect.get("error").is_some(),
                "case {name}: we failed to parse: {e}"
            );
            return;
        }
    };
    let run_mode = if mode == "multirun" {
        RunMode::Multirun
    } else {
        RunMode::Run
    };
    let composed = compose_with_hydra(&repo, config_name, &overrides, run_mode);

    if mode == "multirun" {
        let result = composed.and_then(|master| {
            let params: Vec<String> =
                match master.config.get("hydra.sweeper.params").map(|n| &n.value) {
                    Some(trainyard::config::tree::Value::Map(m)) => m
                        .iter()
                        .map(|(k, v)| {
                            format!(
                                "{k}={}",
                                v.as_str()
                                    .map(str::to_string)
                                    .unwrap_or_else(|| v.value.display_python())
                            )
                        })
                        .collect(),
                    _ => vec![],
                };
            sweep::expand(&repo, &params, &overrides)
        });
        match (result, expect.get("jobs")) {
            (Ok(jobs), Some(expected)) => {
                let expected: Vec<Vec<String>> = serde_json::from_value(expected.clone()).unwrap();
                assert_eq!(jobs, expected, "case {name}: sweep jobs differ");
            }
            (Err(e), None) => check_error(name, &e, expect),
            (Ok(jobs), None) => panic!(
                "case {name}: hydra failed ({}) but we launched {jobs:?}",
                expect["error"]
            ),
            (Err(e), Some(_)) => panic!("case {name}: hydra swept but we failed: {e}"),
        }
        return;
    }

    match (composed, expect.get("config")) {
        (Ok(composed), Some(expected)) => {
            let (job, _) = split_hydra(composed.config);
            assert_eq!(
                &job.to_json(),
                expected,
                "case {name}: composed config differs"
            );
            if let Some(choices) = expect.get("choices").and_then(J::as_object) {
                let ours: HashMap<String, J> = composed
                    .choices
                    .iter()
                    .filter(|(k, _)| !k.starts_with("hydra/"))
                    .map(|(k, v)| (k.clone(), v.clone().map(J::String).unwrap_or(J::Null)))
                    .collect();
                let theirs: HashMap<String, J> = choices
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                assert_eq!(ours, theirs, "case {name}: group choices differ");
            }
            let resolved = resolve_all(&job, &ctx);
            match (resolved, expect.get("resolved").filter(|v| !v.is_null())) {
                (Ok(r), Some(expected)) => assert_eq!(
                    &r.to_json(),
                    expected,
                    "case {name}: resolved config differs"
                ),
                (Err(e), None) => {
                    let theirs = expect["resolve_error"].as_str().unwrap_or_default();
                    assert!(!theirs.is_empty(), "case {name}: we failed to resolve: {e}");
                    let first = theirs.lines().next().unwrap_or_default();
                    assert!(
                        e.to_string().contains(first),
                        "case {name}: resolve error differs\n  hydra: {theirs}\n  ours:  {e}"
                    );
                }
                (Ok(r), None) => {
                    if let Some(err) = expect["resolve_error"].as_str() {
                        panic!(
                            "case {name}: hydra failed to resolve ({err}) but we got {}",
                            r.to_json()
                        );
                    }
                }
                (Err(e), Some(_)) => panic!("case {name}: hydra resolved but we failed: {e}"),
            }
        }
        (Err(e), None) => check_error(name, &e, expect),
        (Ok(c), None) => panic!(
            "case {name}: hydra failed with {} but we composed {}",
            expect["error"],
            split_hydra(c.config).0.to_json()
        ),
        (Err(e), Some(_)) => panic!("case {name}: hydra composed but we failed: {e}"),
    }
}

#[rstest]
fn hydra_conformance(#[files("tests/conformance/expected/*.json")] path: PathBuf) {
    let text = std::fs::read_to_string(&path).unwrap();
    let case: J = serde_json::from_str(&text).unwrap();
    run_case(&case);
}
