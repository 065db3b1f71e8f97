//! The fuzzers' corpus replayed, then mutated for a bounded time: every input the AFL++ runs kept
//! (`fuzz/corpus/<target>/`: the seeds, and each crash or hang they found, fixed since) goes through the
//! same target functions (`trainyard::config::fuzz_targets`), and then a few thousand inputs made from
//! them by byte flips, grammar tokens and splices. A panic, or one input taking over two seconds, fails
//! with the input shown (one that overflows the stack aborts the run: the input is then in
//! `$TMPDIR/trainyard-fuzz-<target>.last`). This is CI's short run; the long, coverage-guided runs are `fuzz/README.md`'s.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use trainyard::config::fuzz_targets;

const TOKENS: &[&str] = &[
    "${",
    "}",
    "${oc.env:",
    "${oc.select:",
    "${oc.decode:",
    "${now:",
    "${..",
    "${.",
    ":",
    "- ",
    "\n  ",
    "defaults:\n  - ",
    "_self_",
    "override ",
    "optional ",
    "@",
    "/",
    "# @package _global_\n",
    "???",
    "[",
    "]",
    "{",
    "}",
    ",",
    "'",
    "\"",
    "\\",
    "=",
    "+",
    "++",
    "~",
    "choice(",
    "range(",
    "glob(",
    "int(",
    "tag(",
    "&a ",
    "*a",
    "!!str ",
    "---\n",
    "|\n  ",
    ">-\n  ",
    "\t",
    "\0",
    "null",
    "1e9",
];

/// xorshift64*: a fixed stream of choices, so a failure repeats.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    files.iter().map(|f| std::fs::read(f).unwrap()).collect()
}

/// One input derived from the corpus: a few edits of one entry, or two spliced.
fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut data = seeds[rng.below(seeds.len())].clone();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(data.len() + 1);
        match rng.below(4) {
            0 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] ^= 1 << rng.below(8);
            }
            1 => {
                let token = TOKENS[rng.below(TOKENS.len())].as_bytes();
                data.splice(at..at, token.iter().copied());
            }
            2 if !data.is_empty() => {
                let end = (at + rng.below(8)).min(data.len());
                data.drain(at.min(end)..end);
            }
            _ => {
                let other = &seeds[rng.below(seeds.len())];
                let from = rng.below(other.len() + 1);
                data.splice(at..at, other[from..].iter().copied());
            }
        }
    }
    data
}

/// `run` on every corpus entry of `target`, then on mutants for `budget`; fails naming the input.
fn exercise(target: &str, budget: Duration, run: impl Fn(&[u8])) {
    let seeds = corpus(target);
    assert!(!seeds.is_empty(), "fuzz/corpus/{target} is empty");
    // A stack overflow aborts the process, past any catch: the input about to run is kept in a file,
    // which the abort leaves behind to show.
    let last = std::env::temp_dir().join(format!("trainyard-fuzz-{target}.last"));
    let check = |data: &[u8]| {
        std::fs::write(&last, data).unwrap();
        let started = Instant::now();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(data)));
        let shown = String::from_utf8_lossy(data);
        assert!(outcome.is_ok(), "{target}: panicked on {shown:?}");
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(2),
            "{target}: {took:?} on {shown:?}"
        );
    };
    for data in &seeds {
        check(data);
    }
    let mut rng = Rng(0x5EED_0000 ^ target.len() as u64);
    let started = Instant::now();
    let mut runs = 0;
    while started.elapsed() < budget {
        check(&mutate(&mut rng, &seeds));
        runs += 1;
    }
    let _ = std::fs::remove_file(&last);
    eprintln!("{target}: {} corpus inputs, {runs} mutants", seeds.len());
}

/// Mutants per target for this long: 3 s, or `TRAINYARD_FUZZ_SECONDS` (a longer local run).
fn budget() -> Duration {
    let seconds = std::env::var("TRAINYARD_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    Duration::from_secs(seconds)
}

#[test]
fn yaml_reader() {
    exercise("yaml", budget(), fuzz_targets::yaml);
}

#[test]
fn override_grammar() {
    exercise("overrides", budget(), fuzz_targets::overrides);
}

#[test]
fn interpolation() {
    exercise("interpolation", budget(), fuzz_targets::interpolation);
}

#[test]
fn defaults_list_composition() {
    exercise("defaults", budget(), fuzz_targets::defaults);
}
