//! The Rust half of `bench/search_bench.py`: trainyard's samplers (TPE univariate and multivariate,
//! random) on three test functions with the hyperparameter-search shape of lightning-hydra-template's
//! `mnist_optuna` (log-uniform, int, stepped and categorical parameters). One JSON line per study: the
//! best value so far after each trial. `--seeds S --trials T`.

use indexmap::IndexMap;
use std::f64::consts::PI;
use std::time::Instant;
use trainyard::search::tpe::TpeConfig;
use trainyard::search::{Choice, Direction, Distribution, Sampler, Study, TrialState};

fn float(low: f64, high: f64, log: bool, step: Option<f64>) -> Distribution {
    Distribution::Float {
        low,
        high,
        log,
        step,
    }
}

fn space(function: &str) -> IndexMap<String, Distribution> {
    let mut s = IndexMap::new();
    match function {
        "quadratic" => {
            s.insert("lr".into(), float(1e-5, 1e-1, true, None));
            s.insert(
                "batch_size".into(),
                Distribution::Int {
                    low: 16,
                    high: 512,
                    log: false,
                    step: 1,
                },
            );
            s.insert(
                "optimizer".into(),
                Distribution::Categorical {
                    choices: ["sgd", "adam", "adamw"]
                        .map(|c| Choice::Str(c.into()))
                        .to_vec(),
                },
            );
            s.insert("dropout".into(), float(0.0, 0.5, false, None));
        }
        "branin" => {
            s.insert("x1".into(), float(-5.0, 10.0, false, None));
            s.insert("x2".into(), float(0.0, 15.0, false, None));
        }
        _ => {
            for k in 1..=4 {
                s.insert(format!("x{k}"), float(0.0, 1.0, false, None));
            }
            s.insert("x5".into(), float(0.0, 1.0, false, Some(0.05)));
            s.insert("x6".into(), float(0.01, 1.0, true, None));
        }
    }
    s
}

fn num(p: &IndexMap<String, Choice>, k: &str) -> f64 {
    match &p[k] {
        Choice::Float(x) => *x,
        Choice::Int(i) => *i as f64,
        other => panic!("{k} is {other:?}"),
    }
}

fn evaluate(function: &str, p: &IndexMap<String, Choice>) -> f64 {
    match function {
        "quadratic" => {
            let (lr, bs, dropout) = (num(p, "lr"), num(p, "batch_size"), num(p, "dropout"));
            let opt = match &p["optimizer"] {
                Choice::Str(s) if s == "sgd" => 0.6,
                Choice::Str(s) if s == "adam" => 0.2,
                _ => 0.0,
            };
            (lr.log10() + 2.5).powi(2)
                + (bs.log2() - 6.5).powi(2) / 4.0
                + opt
                + 4.0 * (dropout - 0.15).powi(2)
                + 0.05 * (37.0 * lr.log10() + 11.0 * dropout + 0.3 * bs).sin()
        }
        "branin" => {
            let (x1, x2) = (num(p, "x1"), num(p, "x2"));
            let (b, c, t) = (5.1 / (4.0 * PI * PI), 5.0 / PI, 1.0 / (8.0 * PI));
            (x2 - b * x1 * x1 + c * x1 - 6.0).powi(2) + 10.0 * (1.0 - t) * x1.cos() + 10.0
        }
        _ => {
            let x: Vec<f64> = (1..=6).map(|k| num(p, &format!("x{k}"))).collect();
            hartmann6(&x)
        }
    }
}

fn hartmann6(x: &[f64]) -> f64 {
    const ALPHA: [f64; 4] = [1.0, 1.2, 3.0, 3.2];
    const A: [[f64; 6]; 4] = [
        [10.0, 3.0, 17.0, 3.5, 1.7, 8.0],
        [0.05, 10.0, 17.0, 0.1, 8.0, 14.0],
        [3.0, 3.5, 1.7, 10.0, 17.0, 8.0],
        [17.0, 8.0, 0.05, 10.0, 0.1, 14.0],
    ];
    const P: [[f64; 6]; 4] = [
        [1312.0, 1696.0, 5569.0, 124.0, 8283.0, 5886.0],
        [2329.0, 4135.0, 8307.0, 3736.0, 1004.0, 9991.0],
        [2348.0, 1451.0, 3522.0, 2883.0, 3047.0, 6650.0],
        [4047.0, 8828.0, 8732.0, 5743.0, 1091.0, 381.0],
    ];
    -(0..4)
        .map(|i| {
            let inner: f64 = (0..6)
                .map(|j| A[i][j] * (x[j] - P[i][j] * 1e-4).powi(2))
                .sum();
            ALPHA[i] * (-inner).exp()
        })
        .sum::<f64>()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (seeds, trials) = (arg("--seeds", 50), arg("--trials", 50));
    let q = IndexMap::from([
        ("lr".to_string(), Choice::Float(1e-3)),
        ("batch_size".to_string(), Choice::Int(64)),
        ("optimizer".to_string(), Choice::Str("adam".into())),
        ("dropout".to_string(), Choice::Float(0.1)),
    ]);
    assert!((evaluate("quadratic", &q) - 0.502744529254084).abs() < 1e-9);
    for function in ["quadratic", "branin", "hartmann6"] {
        for name in ["tpe", "tpe-mv", "random"] {
            for seed in 0..seeds {
                let seed_u = Some(seed as u64);
                let sampler = match name {
                    "tpe" => Sampler::Tpe {
                        seed: seed_u,
                        config: TpeConfig::default(),
                    },
                    "tpe-mv" => Sampler::Tpe {
                        seed: seed_u,
                        config: TpeConfig {
                            multivariate: true,
                            ..TpeConfig::default()
                        },
                    },
                    _ => Sampler::Random { seed: seed_u },
                };
                let started = Instant::now();
                let mut study = Study::new(space(function), Direction::Minimize);
                let mut best = Vec::with_capacity(trials);
                let mut so_far = f64::INFINITY;
                for t in 0..trials {
                    let params = sampler.sample(&study, t);
                    let value = evaluate(function, &params);
                    study.add_running(t, params);
                    let trial = study.trial_mut(t).expect("just added");
                    trial.state = TrialState::Complete;
                    trial.value = Some(value);
                    so_far = so_far.min(value);
                    best.push(so_far);
                }
                let line = serde_json::json!({
                    "function": function, "sampler": name, "seed": seed, "best": best,
                    "seconds": started.elapsed().as_secs_f64(),
                });
                println!("{line}");
            }
        }
    }
}
