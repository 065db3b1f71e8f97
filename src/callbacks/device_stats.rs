//! DeviceStatsMonitor: a sampler thread records the process's CPU use and resident memory (from `/proc`) and,
//! when the run uses a GPU, its utilisation and memory through NVML. NVML is loaded at run time
//! (nvml-wrapper opens `libnvidia-ml.so.1` on first use), so the binary runs where there is no NVIDIA driver;
//! there the GPU fields are absent, never zero. The trainer reads per-epoch mean/max into its metrics and the
//! whole run's figures into `summary.json`.

use serde::Serialize;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Columns the monitor adds to metrics.csv and TensorBoard (per-epoch aggregates).
pub const COLUMNS: &[&str] = &[
    "device/cpu_percent_mean",
    "device/cpu_percent_max",
    "device/rss_bytes_max",
    "device/gpu_util_percent_mean",
    "device/gpu_memory_used_bytes_max",
];

#[derive(Debug, Clone, Copy, PartialEq)]
struct GpuSample {
    util_percent: f64,
    memory_used: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Sample {
    cpu_percent: f64,
    rss: u64,
    gpu: Option<GpuSample>,
}

/// The run's figures in `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceStatsSummary {
    pub samples: usize,
    pub sample_every_ms: u64,
    pub cpu_percent_mean: f64,
    pub cpu_percent_max: f64,
    pub rss_bytes_mean: u64,
    pub rss_bytes_max: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuSummary>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuSummary {
    pub index: u32,
    pub name: String,
    pub memory_total_bytes: u64,
    pub utilization_percent_mean: f64,
    pub utilization_percent_max: f64,
    pub memory_used_bytes_mean: u64,
    pub memory_used_bytes_peak: u64,
}

/// A GPU opened through NVML.
struct Gpu {
    nvml: nvml_wrapper::Nvml,
    index: u32,
    name: String,
    memory_total: u64,
}

impl Gpu {
    /// NVML's device `index`, or why it cannot be read (no driver, no such device).
    fn open(index: u32) -> Result<Gpu, String> {
        let nvml = nvml_wrapper::Nvml::init().map_err(|e| format!("NVML unavailable: {e}"))?;
        let (name, memory_total) = {
            let d = nvml
                .device_by_index(index)
                .map_err(|e| format!("GPU {index}: {e}"))?;
            (
                d.name().unwrap_or_else(|_| "unknown".into()),
                d.memory_info().map(|m| m.total).unwrap_or(0),
            )
        };
        Ok(Gpu {
            nvml,
            index,
            name,
            memory_total,
        })
    }

    fn sample(&self) -> Option<GpuSample> {
        let d = self.nvml.device_by_index(self.index).ok()?;
        Some(GpuSample {
            util_percent: d.utilization_rates().ok()?.gpu as f64,
            memory_used: d.memory_info().ok()?.used,
        })
    }

    /// A short `nvidia-smi`-like report of every GPU NVML sees.
    fn report(&self) -> String {
        use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
        let mut out = format!(
            "driver {}  NVML {}  CUDA {}\n{:<4} {:<28} {:>8} {:>20} {:>6} {:>8}\n",
            self.nvml.sys_driver_version().unwrap_or_default(),
            self.nvml.sys_nvml_version().unwrap_or_default(),
            self.nvml
                .sys_cuda_driver_version()
                .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10))
                .unwrap_or_default(),
            "gpu",
            "name",
            "util",
            "memory used / total",
            "temp",
            "power"
        );
        for i in 0..self.nvml.device_count().unwrap_or(0) {
            let Ok(d) = self.nvml.device_by_index(i) else {
                continue;
            };
            let mem = d.memory_info().ok();
            out += &format!(
                "{i:<4} {:<28} {:>7}% {:>9} / {:>8} {:>5}C {:>7}W\n",
                d.name().unwrap_or_default(),
                d.utilization_rates().map(|u| u.gpu).unwrap_or(0),
                mem.as_ref()
                    .map(|m| format!("{}MiB", m.used >> 20))
                    .unwrap_or_default(),
                mem.as_ref()
                    .map(|m| format!("{}MiB", m.total >> 20))
                    .unwrap_or_default(),
                d.temperature(TemperatureSensor::Gpu).unwrap_or(0),
                d.power_usage().map(|mw| mw / 1000).unwrap_or(0)
            );
        }
        out
    }
}

/// CPU seconds (user + system) this process has used, from `/proc/self/stat`.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) start at field 3; utime is 14, stime 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf only reads a constant of the running system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some(ticks / if hz > 0 { hz as f64 } else { 100.0 })
}

/// Resident memory of this process, from `/proc/self/statm`.
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * if page > 0 { page as u64 } else { 4096 })
}

/// The running monitor.
pub struct DeviceStatsMonitor {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Option<Gpu>>>,
    samples: Arc<Mutex<Vec<Sample>>>,
    epoch_from: usize,
    every: Duration,
    gpu_info: Option<(u32, String, u64)>,
}

impl DeviceStatsMonitor {
    /// Start sampling every `every`; `gpu` is the NVML index of the run's GPU, if it uses one. A GPU that
    /// cannot be opened is reported once in the log and left out.
    pub fn start(every: Duration, gpu: Option<u32>) -> DeviceStatsMonitor {
        let gpu = gpu.and_then(|i| match Gpu::open(i) {
            Ok(g) => Some(g),
            Err(why) => {
                tracing::warn!("device stats: no GPU figures ({why})");
                None
            }
        });
        let gpu_info = gpu
            .as_ref()
            .map(|g| (g.index, g.name.clone(), g.memory_total));
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let (stop_t, samples_t) = (stop.clone(), samples.clone());
        let thread = std::thread::Builder::new()
            .name("device-stats".into())
            .spawn(move || {
                let mut last = (Instant::now(), cpu_seconds().unwrap_or(0.0));
                while !stop_t.load(Ordering::Relaxed) {
                    std::thread::sleep(every);
                    let (now, cpu) = (Instant::now(), cpu_seconds().unwrap_or(0.0));
                    let wall = now.duration_since(last.0).as_secs_f64().max(1e-9);
                    let sample = Sample {
                        cpu_percent: 100.0 * (cpu - last.1) / wall,
                        rss: rss_bytes().unwrap_or(0),
                        gpu: gpu.as_ref().and_then(Gpu::sample),
                    };
                    last = (now, cpu);
                    if let Ok(mut s) = samples_t.lock() {
                        s.push(sample);
                    }
                }
                gpu
            })
            .ok();
        DeviceStatsMonitor {
            stop,
            thread,
            samples,
            epoch_from: 0,
            every,
            gpu_info,
        }
    }

    /// Mean/max since the previous call (one epoch), as metric columns. Empty when no sample was taken yet.
    pub fn epoch_metrics(&mut self) -> Vec<(&'static str, f64)> {
        let samples = self.samples.lock().map(|s| s.clone()).unwrap_or_default();
        let epoch = &samples[self.epoch_from.min(samples.len())..];
        self.epoch_from = samples.len();
        if epoch.is_empty() {
            return Vec::new();
        }
        let n = epoch.len() as f64;
        let mut out = vec![
            (
                COLUMNS[0],
                epoch.iter().map(|s| s.cpu_percent).sum::<f64>() / n,
            ),
            (
                COLUMNS[1],
                epoch.iter().map(|s| s.cpu_percent).fold(0.0, f64::max),
            ),
            (
                COLUMNS[2],
                epoch.iter().map(|s| s.rss).max().unwrap_or(0) as f64,
            ),
        ];
        let gpu: Vec<GpuSample> = epoch.iter().filter_map(|s| s.gpu).collect();
        if !gpu.is_empty() {
            out.push((
                COLUMNS[3],
                gpu.iter().map(|g| g.util_percent).sum::<f64>() / gpu.len() as f64,
            ));
            out.push((
                COLUMNS[4],
                gpu.iter().map(|g| g.memory_used).max().unwrap_or(0) as f64,
            ));
        }
        out
    }

    /// Stop sampling; the whole run's figures (none if nothing was sampled), and `nvidia-smi.txt` in
    /// `run_dir` when a GPU was monitored.
    pub fn finish(mut self, run_dir: &Path) -> Option<DeviceStatsSummary> {
        self.stop.store(true, Ordering::Relaxed);
        let gpu = self.thread.take().and_then(|t| t.join().ok()).flatten();
        if let Some(g) = &gpu {
            if let Err(e) =
                crate::records::write_atomic(&run_dir.join("nvidia-smi.txt"), g.report().as_bytes())
            {
                tracing::warn!("device stats: could not write nvidia-smi.txt: {e}");
            }
        }
        let samples = self.samples.lock().map(|s| s.clone()).unwrap_or_default();
        if samples.is_empty() {
            return None;
        }
        let n = samples.len() as f64;
        let gpu_samples: Vec<GpuSample> = samples.iter().filter_map(|s| s.gpu).collect();
        let gpu = self
            .gpu_info
            .as_ref()
            .filter(|_| !gpu_samples.is_empty())
            .map(|(index, name, total)| {
                let m = gpu_samples.len() as f64;
                GpuSummary {
                    index: *index,
                    name: name.clone(),
                    memory_total_bytes: *total,
                    utilization_percent_mean: gpu_samples
                        .iter()
                        .map(|g| g.util_percent)
                        .sum::<f64>()
                        / m,
                    utilization_percent_max: gpu_samples
                        .iter()
                        .map(|g| g.util_percent)
                        .fold(0.0, f64::max),
                    memory_used_bytes_mean: (gpu_samples
                        .iter()
                        .map(|g| g.memory_used as f64)
                        .sum::<f64>()
                        / m) as u64,
                    memory_used_bytes_peak: gpu_samples
                        .iter()
                        .map(|g| g.memory_used)
                        .max()
                        .unwrap_or(0),
                }
            });
        Some(DeviceStatsSummary {
            samples: samples.len(),
            sample_every_ms: self.every.as_millis() as u64,
            cpu_percent_mean: samples.iter().map(|s| s.cpu_percent).sum::<f64>() / n,
            cpu_percent_max: samples.iter().map(|s| s.cpu_percent).fold(0.0, f64::max),
            rss_bytes_mean: (samples.iter().map(|s| s.rss as f64).sum::<f64>() / n) as u64,
            rss_bytes_max: samples.iter().map(|s| s.rss).max().unwrap_or(0),
            gpu,
        })
    }
}

impl Drop for DeviceStatsMonitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_cpu_and_memory_and_leaves_gpu_out_without_one() {
        let mut m = DeviceStatsMonitor::start(Duration::from_millis(10), None);
        let busy = Instant::now();
        let mut x = 0u64;
        while busy.elapsed() < Duration::from_millis(150) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let epoch = m.epoch_metrics();
        let names: Vec<&str> = epoch.iter().map(|(k, _)| *k).collect();
        assert_eq!(names, &COLUMNS[..3]);
        let cpu = epoch[0].1;
        assert!(cpu > 20.0, "a busy thread should show CPU use: {cpu}");
        let dir = tempfile::tempdir().unwrap();
        let s = m.finish(dir.path()).unwrap();
        assert!(s.samples >= 5 && s.rss_bytes_max > 1 << 20, "{s:?}");
        assert!(s.gpu.is_none());
        let json = serde_json::to_value(&s).unwrap();
        assert!(json.get("gpu").is_none(), "GPU fields absent, not zero");
        assert!(!dir.path().join("nvidia-smi.txt").exists());
    }

    #[test]
    fn a_gpu_that_cannot_be_opened_is_left_out() {
        // On machines without the NVIDIA driver NVML fails to load; with one, index 4096 does not exist.
        let m = DeviceStatsMonitor::start(Duration::from_millis(5), Some(4096));
        std::thread::sleep(Duration::from_millis(30));
        let dir = tempfile::tempdir().unwrap();
        let s = m.finish(dir.path()).unwrap();
        assert!(s.gpu.is_none());
    }
}
