//! A search's part of its sweep section: the study's trials (values, state, the best so far) from its
//! journal, and a plot of value against trial with the best so far.

use super::{svg, Page};
use crate::search::journal::{Journal, StudyHeader, SWEEP_POINTER};
use crate::search::{Choice, Direction, Study, TrialState};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The study of the search in `sweep_dir`, when the sweep is one.
fn study_of(sweep_dir: &Path) -> anyhow::Result<Option<(StudyHeader, Study)>> {
    let Ok(text) = std::fs::read_to_string(sweep_dir.join(SWEEP_POINTER)) else {
        return Ok(None);
    };
    Journal::at(&PathBuf::from(text.trim())).load()
}

/// A sampled value for the table: floats to 4 significant digits (the best's line keeps them whole).
fn short(value: &Choice) -> String {
    match value {
        Choice::Float(x) if *x != 0.0 && !(1e-2..1e4).contains(&x.abs()) => format!("{x:.3e}"),
        Choice::Float(x) => {
            let s = format!("{x:.4}");
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        }
        other => other.to_string(),
    }
}

impl Page {
    /// The trials table and plot, when `sweep_dir` holds a search.
    pub(super) fn search(&mut self, sweep_dir: &Path, name: &str) -> anyhow::Result<()> {
        let Some((header, study)) = study_of(sweep_dir)? else {
            return Ok(());
        };
        let dir = header.direction;
        let way = match dir {
            Direction::Minimize => "minimize",
            Direction::Maximize => "maximize",
        };
        let _ = writeln!(
            self.md,
            "### Search: study `{}`, {way} `{}`\n",
            header.study_name, header.metric
        );
        let keys: Vec<&String> = header.space.keys().collect();
        let mut head = vec!["trial".to_string()];
        head.extend(keys.iter().map(|k| format!("`{k}`")));
        head.extend(["state", "value", "best so far"].map(String::from));
        let _ = writeln!(self.md, "| {} |", head.join(" | "));
        let _ = writeln!(self.md, "|{}", "---|".repeat(head.len()));
        let mut best: Option<f64> = None;
        let (mut dots, mut steps) = (Vec::new(), Vec::new());
        for t in &study.trials {
            if let (TrialState::Complete, Some(v)) = (t.state, t.value) {
                if best.is_none_or(|b| dir.better(v, b)) {
                    best = Some(v);
                }
            }
            let x = t.number as f64;
            match (t.state, t.value) {
                (TrialState::Complete, Some(v)) => dots.push((x, v, false)),
                (TrialState::Pruned, Some(v)) => dots.push((x, v, true)),
                _ => {}
            }
            if let Some(b) = best {
                steps.push((x, b));
            }
            let mut cells = vec![t.number.to_string()];
            cells.extend(
                keys.iter()
                    .map(|k| t.params.get(*k).map(short).unwrap_or_else(|| "–".into())),
            );
            let state = match t.state {
                TrialState::Complete => "complete".to_string(),
                TrialState::Pruned => match t.last_intermediate() {
                    Some((step, _)) => format!("pruned after epoch {}", step + 1),
                    None => "pruned".into(),
                },
                TrialState::Fail => "FAILED".into(),
                TrialState::Running => "running / unfinished".into(),
            };
            let value = t
                .value
                .map(|v| format!("{v:.4}"))
                .unwrap_or_else(|| "–".into());
            let so_far = best
                .map(|v| format!("{v:.4}"))
                .unwrap_or_else(|| "–".into());
            cells.extend([state, value, so_far]);
            let _ = writeln!(self.md, "| {} |", cells.join(" | "));
        }
        let _ = writeln!(self.md);
        if let Some(b) = study.best_trial() {
            let params: Vec<String> = b.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(
                self.md,
                "- Best {}: **{:.4}**, trial {} ({})\n",
                header.metric,
                b.value.unwrap_or(f64::NAN),
                b.number,
                params.join(" ")
            );
        }
        let title = format!("search {name}: {} by trial", header.metric);
        self.figure(
            &format!("search-{name}-trials"),
            &title,
            svg::trials_chart(&title, &header.metric, &dots, &steps),
        )
    }
}
