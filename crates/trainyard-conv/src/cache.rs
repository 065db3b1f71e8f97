//! The L1 data cache of a core, which every blocking in this crate is a fraction of: the gather's weight
//! slice, the weight gradient's pixel runs and partial sums, the GEMM's packed B panel. The fractions were
//! measured on a 48 KiB L1 (Intel Sapphire Rapids); an AMD Zen 3 or Zen 4 core has 32 KiB, where the same
//! byte counts would spill into L2 on every tile. oneDNN sizes its blocking from CPUID's cache leaves the
//! same way.
//!
//! Read once per process from CPUID (leaf 4 on Intel, 0x8000_001D or 0x8000_0005 on AMD), or set before the
//! first kernel runs with `set_l1d_bytes` (benchmarks that model a smaller core, tests).

use std::sync::OnceLock;

/// What a CPU that names no L1 data cache (or a non-x86 one) is taken to have: the smallest of the x86
/// cores this crate targets, so blocks are never too large for it.
pub const FALLBACK_BYTES: usize = 32 * 1024;
/// The range the blockings' fractions were measured over (16 KiB: old Atoms; 64 KiB: above every current
/// x86 core); a size reported outside it is clamped.
const MIN_BYTES: usize = 16 * 1024;
const MAX_BYTES: usize = 64 * 1024;

static L1D: OnceLock<usize> = OnceLock::new();

/// The L1 data cache per core the kernels block for, in bytes.
pub fn l1d_bytes() -> usize {
    *L1D.get_or_init(|| {
        detected_l1d_bytes()
            .unwrap_or(FALLBACK_BYTES)
            .clamp(MIN_BYTES, MAX_BYTES)
    })
}

/// Makes the kernels block for an L1 of `bytes` (clamped to 16-64 KiB) instead of the detected one.
/// Only before the first kernel has run: after it, returns the size already in use as the error.
pub fn set_l1d_bytes(bytes: usize) -> Result<(), usize> {
    L1D.set(bytes.clamp(MIN_BYTES, MAX_BYTES))
        .map_err(|_| l1d_bytes())
}

/// A cache size as `TRAINYARD_CONV_L1D` gives it: bytes (`32768`) or KiB (`32K`, `32KiB`); `None` for
/// anything else, or zero.
pub fn parse_size(text: &str) -> Option<usize> {
    let t = text.trim();
    let (digits, scale) = match t.strip_suffix("KiB").or_else(|| t.strip_suffix(['K', 'k'])) {
        Some(kib) => (kib, 1024),
        None => (t, 1),
    };
    digits
        .trim()
        .parse::<usize>()
        .ok()
        .filter(|&n| n > 0)
        .and_then(|n| n.checked_mul(scale))
}

/// The per-core L1 data cache CPUID reports, in bytes; `None` where it reports none.
pub fn detected_l1d_bytes() -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        let cpuid = raw_cpuid::CpuId::new();
        let from_leaves = cpuid.get_cache_parameters().and_then(|mut caches| {
            caches
                .find(|c| c.level() == 1 && c.cache_type() == raw_cpuid::CacheType::Data)
                .map(|c| {
                    c.associativity()
                        * c.physical_line_partitions()
                        * c.coherency_line_size()
                        * c.sets()
                })
        });
        // Older AMD cores without the topology extensions give the size in KiB in 0x8000_0005.
        let from_amd_leaf = || {
            cpuid
                .get_l1_cache_and_tlb_info()
                .map(|l1| usize::from(l1.dcache_size()) * 1024)
        };
        from_leaves
            .filter(|&b| b > 0)
            .or_else(from_amd_leaf)
            .filter(|&b| b > 0)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// The byte budgets of the blockings for an L1 of `l1` bytes (the fractions measured at 48 KiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Budget {
    l1: usize,
}

impl Budget {
    /// The process's budgets (`l1d_bytes`).
    pub(crate) fn current() -> Budget {
        Budget::for_l1(l1d_bytes())
    }

    pub(crate) fn for_l1(l1: usize) -> Budget {
        Budget { l1 }
    }

    /// Packed B a GEMM reduction slice keeps hot across its row tiles: half of L1, the rest for A's rows
    /// and the tile of C (two thirds measured 5% slower on the ViT-Tiny products, a third 3%).
    pub(crate) fn gemm_panel(self) -> usize {
        self.l1 / 2
    }

    /// Weights a gather keeps hot across its pixel tiles: two thirds of L1, the rest for the inputs.
    pub(crate) fn gather_weights(self) -> usize {
        self.l1 * 2 / 3
    }

    /// Input and gradient bytes of a weight-gradient pixel run: a third of L1, so every tile of a task
    /// finds the run there; the rest holds the tiles' accumulators and the next run.
    pub(crate) fn weight_run(self) -> usize {
        self.l1 / 3
    }

    /// Partial sums a weight-gradient task keeps for its block pairs, loaded and stored around every pixel
    /// run: two thirds of L1 (eight times as much, 256 KiB within L2, cut the traffic of the 32 px layers
    /// further but slowed the 4 px ones on AVX-512 by 5-15%).
    pub(crate) fn weight_sums(self) -> usize {
        self.l1 * 2 / 3
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_bytes_or_kib() {
        let cases = [
            ("32K", Some(32768)),
            ("48KiB", Some(49152)),
            ("32768", Some(32768)),
            (" 32k ", Some(32768)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_size(text), want, "{text:?}");
        }
        for bad in ["", "K", "32M", "-1", "0", "thirty-two"] {
            assert_eq!(parse_size(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn budgets_are_the_measured_fractions_of_l1() {
        // At 48 KiB, the byte counts the kernels were tuned with.
        let b = Budget::for_l1(48 * 1024);
        assert_eq!(
            (
                b.gemm_panel(),
                b.gather_weights(),
                b.weight_run(),
                b.weight_sums()
            ),
            (24 * 1024, 32 * 1024, 16 * 1024, 32 * 1024)
        );
        // A 32 KiB core gets blocks that still fit it.
        let b = Budget::for_l1(32 * 1024);
        assert!(b.gemm_panel() + b.weight_run() <= 32 * 1024);
        assert!(b.gather_weights() < 32 * 1024 && b.weight_sums() < 32 * 1024);
    }

    /// CPUID's answer against the kernel's own account of the cache (Linux's sysfs reads the same leaves,
    /// but parses them separately), where both exist.
    #[test]
    fn detected_l1_matches_the_kernels_account() {
        let Some(detected) = detected_l1d_bytes() else {
            return;
        };
        assert!(
            (8 * 1024..=1024 * 1024).contains(&detected),
            "{detected} bytes"
        );
        let Ok(entries) = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache") else {
            return;
        };
        let read = |dir: &std::path::Path, f: &str| {
            std::fs::read_to_string(dir.join(f))
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        for dir in entries.flatten().map(|e| e.path()) {
            if read(&dir, "level") == "1" && read(&dir, "type") == "Data" {
                let size = read(&dir, "size");
                let kib: usize = size.trim_end_matches('K').parse().expect("sysfs size in K");
                assert_eq!(detected, kib * 1024, "sysfs says {size}");
            }
        }
    }
}
