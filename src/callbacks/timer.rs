//! Timer (Lightning's): stop training once `callbacks.timer.max_time` has passed since training started.
//! With `interval: step` (Lightning's default) the time is checked after every optimizer step, so a long
//! epoch is cut short; with `interval: epoch` only at epoch ends. The trainer asks and stops; this module
//! only keeps time and says why.

use crate::schema::Interval;
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// `DD:HH:MM:SS` (Lightning's Timer format) in seconds; each field a non-negative number.
fn parse_max_time(text: &str) -> anyhow::Result<f64> {
    let parts: Vec<&str> = text.split(':').collect();
    anyhow::ensure!(
        parts.len() == 4,
        "callbacks.timer.max_time='{text}': expected DD:HH:MM:SS, e.g. callbacks.timer.max_time=00:12:00:00 \
         for 12 hours"
    );
    let mut secs = 0.0;
    for (part, unit) in parts.iter().zip([86400.0, 3600.0, 60.0, 1.0]) {
        let v: f64 = part
            .trim()
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "callbacks.timer.max_time='{text}': '{part}' is not a non-negative number \
                     (DD:HH:MM:SS, e.g. 00:12:00:00)"
                )
            })?;
        secs += v * unit;
    }
    Ok(secs)
}

/// What `summary.json` records about the timer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimerSummary {
    pub max_time: String,
    pub max_time_s: f64,
    /// Training time the timer measured (from the start of the training loop to the end of the run).
    pub elapsed_s: f64,
    /// Whether the timer stopped the run.
    pub stopped: bool,
}

/// The running timer.
#[derive(Debug, Clone)]
pub struct Timer {
    max_time: String,
    limit_s: f64,
    interval: Interval,
    started: Instant,
    stopped_at: Option<f64>,
}

impl Timer {
    /// The timer the config asks for, if any; a bad `max_time` is an error naming the key.
    pub fn from_config(cfg: Option<&crate::schema::Timer>) -> anyhow::Result<Option<Timer>> {
        cfg.map(|c| {
            Ok(Timer {
                max_time: c.max_time.clone(),
                limit_s: parse_max_time(&c.max_time)?,
                interval: c.interval,
                started: Instant::now(),
                stopped_at: None,
            })
        })
        .transpose()
    }

    /// Count from now: the training loop starts (set-up before it is not training time).
    pub fn start(&mut self) {
        self.started = Instant::now();
    }

    pub fn elapsed_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Whether time is up, as `agree` settles it across processes (on one process `Ok`; with several
    /// ranks, "any rank is out of time", so all stop at the same step as Lightning's broadcast makes them).
    /// Every rank must call this at the same points: `agree` is a collective.
    fn check(&mut self, agree: impl FnOnce(bool) -> anyhow::Result<bool>) -> anyhow::Result<bool> {
        let here = self.stopped_at.is_some() || self.elapsed_s() >= self.limit_s;
        if agree(here)? && self.stopped_at.is_none() {
            self.stopped_at = Some(self.elapsed_s());
        }
        Ok(self.stopped_at.is_some())
    }

    /// After an optimizer step: whether to stop now (only with `interval: step`).
    pub fn stop_after_step(
        &mut self,
        agree: impl FnOnce(bool) -> anyhow::Result<bool>,
    ) -> anyhow::Result<bool> {
        Ok(self.interval == Interval::Step && self.check(agree)?)
    }

    /// At an epoch's end: the run's status when it stops here. Checked in both modes: once time is up, an
    /// epoch's end is a better place to stop than one step into the next epoch.
    pub fn stop_at_epoch_end(
        &mut self,
        agree: impl FnOnce(bool) -> anyhow::Result<bool>,
    ) -> anyhow::Result<Option<String>> {
        Ok(self.check(agree)?.then(|| {
            format!(
                "stopped by the timer after {:.1}s (callbacks.timer.max_time={}, checked every {})",
                self.stopped_at.unwrap_or_default(),
                self.max_time,
                match self.interval {
                    Interval::Step => "step",
                    Interval::Epoch => "epoch",
                }
            )
        }))
    }

    pub fn summary(&self) -> TimerSummary {
        TimerSummary {
            max_time: self.max_time.clone(),
            max_time_s: self.limit_s,
            elapsed_s: self.elapsed_s(),
            stopped: self.stopped_at.is_some(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rstest::rstest]
    #[case("00:00:00:01", Ok(1.0))]
    #[case("01:02:03:04", Ok(86400.0 + 7200.0 + 180.0 + 4.0))]
    #[case("00:00:00:0.5", Ok(0.5))]
    #[case("00:12:00", Err("expected DD:HH:MM:SS"))]
    #[case("00:00:-1:00", Err("'-1' is not a non-negative number"))]
    #[case("00:00:xx:00", Err("'xx' is not a non-negative number"))]
    fn max_time(#[case] text: &str, #[case] want: Result<f64, &str>) {
        match (parse_max_time(text), want) {
            (Ok(got), Ok(want)) => assert_eq!(got, want),
            (Err(e), Err(want)) => {
                let e = e.to_string();
                assert!(
                    e.contains(want) && e.contains("callbacks.timer.max_time"),
                    "{e}"
                );
            }
            (got, want) => panic!("{got:?} vs {want:?}"),
        }
    }

    fn timer(max_time: &str, interval: Interval) -> Timer {
        let cfg = crate::schema::Timer {
            max_time: max_time.into(),
            interval,
        };
        Timer::from_config(Some(&cfg)).unwrap().unwrap()
    }

    /// Step mode stops after a step once time is up; epoch mode only at epoch ends; neither before.
    #[rstest::rstest]
    #[case(Interval::Step, true)]
    #[case(Interval::Epoch, false)]
    fn stops_when_time_is_up(#[case] interval: Interval, #[case] mid_epoch: bool) {
        let mut t = timer("00:00:00:0.05", interval);
        t.start();
        assert!(!t.stop_after_step(Ok).unwrap() && t.stop_at_epoch_end(Ok).unwrap().is_none());
        std::thread::sleep(std::time::Duration::from_millis(60));
        assert_eq!(t.stop_after_step(Ok).unwrap(), mid_epoch);
        let status = t.stop_at_epoch_end(Ok).unwrap().unwrap();
        assert!(
            status.starts_with("stopped by the timer after 0."),
            "{status}"
        );
        let s = t.summary();
        assert!(
            s.stopped && s.elapsed_s >= 0.05 && s.max_time_s == 0.05,
            "{s:?}"
        );
        assert!(!timer("00:01:00:00", interval).summary().stopped);
    }

    /// Another rank out of time stops this one too (and is recorded as the timer stopping it); an error of
    /// the agreement is the caller's.
    #[test]
    fn ranks_agree() {
        let mut t = timer("00:01:00:00", Interval::Step);
        assert!(!t.stop_after_step(Ok).unwrap());
        assert!(t.stop_after_step(|_| Ok(true)).unwrap());
        assert!(t.summary().stopped);
        let mut t = timer("00:01:00:00", Interval::Step);
        let err = t
            .stop_after_step(|_| anyhow::bail!("peer gone"))
            .unwrap_err();
        assert_eq!(err.to_string(), "peer gone");
    }
}
