//! Lightning's SimpleProfiler (`trainer.profiler: simple`): the wall time of each action of the loop
//! (fetching a batch, the strategy's forward/backward and optimizer step, validation, logging,
//! checkpoints), reported when training ends as Lightning's table: mean, calls, total and share of the
//! whole run, sorted by total. On a GPU the times are the host's, as Lightning's are: a step that ends by
//! reading its loss includes the device's work, an asynchronous launch does not.

use crate::schema::ProfilerConfig;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// One action's figures, as `summary.json` records them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ActionTime {
    pub action: String,
    pub calls: u64,
    pub total_s: f64,
    pub mean_s: f64,
}

/// Times actions when on; when off, `record` does nothing (the loop calls it either way).
pub struct Profiler {
    config: Option<ProfilerConfig>,
    started: Instant,
    /// Action → (calls, seconds).
    actions: BTreeMap<String, (u64, f64)>,
}

impl Profiler {
    /// `started`: when the run began (the report's total is measured from here).
    pub fn new(config: Option<&ProfilerConfig>, started: Instant) -> Self {
        Profiler {
            config: config.cloned(),
            started,
            actions: BTreeMap::new(),
        }
    }

    /// One call of `action`, which began at `since` and ends now.
    pub fn record(&mut self, action: &str, since: Instant) {
        if self.config.is_none() {
            return;
        }
        let seconds = since.elapsed().as_secs_f64();
        match self.actions.get_mut(action) {
            Some((calls, total)) => {
                *calls += 1;
                *total += seconds;
            }
            None => {
                self.actions.insert(action.to_string(), (1, seconds));
            }
        }
    }

    /// Every action, the longest in total first (`None` when off).
    pub fn actions(&self) -> Option<Vec<ActionTime>> {
        self.config.as_ref()?;
        let mut all: Vec<ActionTime> = self
            .actions
            .iter()
            .map(|(action, &(calls, total_s))| ActionTime {
                action: action.clone(),
                calls,
                total_s,
                mean_s: total_s / calls.max(1) as f64,
            })
            .collect();
        all.sort_by(|a, b| b.total_s.total_cmp(&a.total_s));
        Some(all)
    }

    /// Lightning's report: printed on rank 0, or written to `<dirpath>/fit-<filename>[-<rank>].txt`
    /// (relative to the run directory) when a filename is set. Returns the file written, if any.
    pub fn report(
        &self,
        output_dir: &Path,
        rank: Option<usize>,
    ) -> anyhow::Result<Option<PathBuf>> {
        let (Some(config), Some(actions)) = (&self.config, self.actions()) else {
            return Ok(None);
        };
        let text = table(
            &actions,
            self.started.elapsed().as_secs_f64(),
            config.extended,
        );
        let Some(filename) = &config.filename else {
            if rank.unwrap_or(0) == 0 {
                tracing::info!("FIT Profiler Report\n{text}");
            }
            return Ok(None);
        };
        let dir = match &config.dirpath {
            Some(d) => output_dir.join(d),
            None => output_dir.to_path_buf(),
        };
        std::fs::create_dir_all(&dir)?;
        let suffix = rank.map(|r| format!("-{r}")).unwrap_or_default();
        let path = dir.join(format!("fit-{filename}{suffix}.txt"));
        crate::storage::records::write_atomic(
            &path,
            format!("FIT Profiler Report\n{text}").as_bytes(),
        )?;
        Ok(Some(path))
    }
}

/// The table, as Lightning's SimpleProfiler prints it (`extended`: calls and percentage columns too).
fn table(actions: &[ActionTime], total: f64, extended: bool) -> String {
    let width = actions
        .iter()
        .map(|a| a.action.len())
        .chain(["Action".len()])
        .max()
        .unwrap_or(6);
    let columns: &[&str] = match extended {
        true => &[
            "Mean duration (s)",
            "Num calls",
            "Total time (s)",
            "Percentage %",
        ],
        false => &["Mean duration (s)", "Total time (s)"],
    };
    let row = |name: &str, cells: &[String]| {
        let mut line = format!("|  {name:<width$}");
        for cell in cells {
            let _ = write!(line, "\t|  {cell:<16}");
        }
        line + "\t|\n"
    };
    let header = row(
        "Action",
        &columns.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
    );
    let rule = "-".repeat(header.len() + 8) + "\n";
    let mut out = format!("\n{rule}{header}{rule}");
    if extended {
        let calls: u64 = actions.iter().map(|a| a.calls).sum();
        out += &row(
            "Total",
            &[
                "-".into(),
                calls.to_string(),
                format!("{total:.5}"),
                "100 %".into(),
            ],
        );
        out += &rule;
    }
    for a in actions {
        let cells = match extended {
            true => vec![
                format!("{:.5}", a.mean_s),
                a.calls.to_string(),
                format!("{:.5}", a.total_s),
                format!("{:.3}", 100.0 * a.total_s / total.max(1e-12)),
            ],
            false => vec![format!("{:.5}", a.mean_s), format!("{:.5}", a.total_s)],
        };
        out += &row(&a.action, &cells);
    }
    out + &rule
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn config(filename: Option<&str>, extended: bool) -> ProfilerConfig {
        ProfilerConfig {
            name: "simple".into(),
            dirpath: None,
            filename: filename.map(str::to_string),
            extended,
        }
    }

    #[test]
    fn off_records_nothing() {
        let mut p = Profiler::new(None, Instant::now());
        p.record("run_training_batch", Instant::now());
        assert_eq!(p.actions(), None);
    }

    #[test]
    fn counts_calls_and_sorts_by_total() {
        let mut p = Profiler::new(Some(&config(None, true)), Instant::now());
        for _ in 0..3 {
            let t = Instant::now();
            std::thread::sleep(Duration::from_millis(2));
            p.record("short", t);
        }
        let t = Instant::now();
        std::thread::sleep(Duration::from_millis(20));
        p.record("long", t);
        let actions = p.actions().unwrap();
        assert_eq!(actions[0].action, "long");
        assert_eq!((actions[1].action.as_str(), actions[1].calls), ("short", 3));
        assert!(
            actions[1].total_s >= 0.006 && actions[0].total_s >= 0.02,
            "{actions:?}"
        );
        assert!((actions[1].mean_s * 3.0 - actions[1].total_s).abs() < 1e-12);
    }

    #[rstest::rstest]
    #[case::extended(true, &["Num calls", "Percentage %", "|  Total", "|  optimizer_step"])]
    #[case::short(false, &["Mean duration (s)", "|  optimizer_step"])]
    fn table_has_lightnings_columns(#[case] extended: bool, #[case] expected: &[&str]) {
        let actions = [ActionTime {
            action: "optimizer_step".into(),
            calls: 4,
            total_s: 0.5,
            mean_s: 0.125,
        }];
        let text = table(&actions, 1.0, extended);
        for e in expected {
            assert!(text.contains(e), "{e} in\n{text}");
        }
        assert_eq!(text.contains("Num calls"), extended, "{text}");
        if extended {
            assert!(text.contains("50.000"), "share of the total: {text}");
        }
    }

    #[rstest::rstest]
    #[case::one_process(None, "fit-perf.txt")]
    #[case::rank_two(Some(2), "fit-perf-2.txt")]
    fn writes_the_file_lightning_names(#[case] rank: Option<usize>, #[case] name: &str) {
        let dir = tempfile::tempdir().unwrap();
        let mut p = Profiler::new(Some(&config(Some("perf"), true)), Instant::now());
        p.record("run_training_epoch", Instant::now());
        let path = p.report(dir.path(), rank).unwrap().unwrap();
        assert_eq!(path, dir.path().join(name));
        let text = std::fs::read_to_string(path).unwrap();
        assert!(text.starts_with("FIT Profiler Report"), "{text}");
        assert!(text.contains("run_training_epoch"), "{text}");
    }
}
