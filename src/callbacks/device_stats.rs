//! DeviceStatsMonitor: a sampler thread records the process's CPU use and resident memory (from `/proc`) and,
//! when the run uses a GPU, its utilisation and memory through NVML. NVML is loaded at run time
//! (nvml-wrapper opens `libnvidia-ml.so.1` on first use), so the binary runs where there is no NVIDIA driver;
//! there the GPU fields are absent, never zero. The trainer reads per-epoch mean/max into its metrics and the
//! whole run's figures into `summary.json`.

use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Columns the monitor adds to metrics.csv and TensorBoard (per-epoch aggregates). The GPU ones stay empty
/// on runs without a GPU.
pub const COLUMNS: &[&str] = &[
    "device/cpu_percent_mean",
    "device/cpu_percent_max",
    "device/rss_bytes_mean",
    "device/rss_bytes_max",
    "device/gpu_util_percent_mean",
    "device/gpu_util_percent_max",
    "device/gpu_memory_used_bytes_mean",
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

/// Means and maxima of a run of samples: one epoch's for metrics, the whole run's for `summary.json`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Aggregate {
    cpu_mean: f64,
    cpu_max: f64,
    rss_mean: u64,
    rss_max: u64,
    /// Over the samples that read the GPU; none when none did.
    gpu: Option<GpuAggregate>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct GpuAggregate {
    util_mean: f64,
    util_max: f64,
    memory_mean: u64,
    memory_max: u64,
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    sum / n.max(1) as f64
}

/// None for no samples.
fn aggregate(samples: &[Sample]) -> Option<Aggregate> {
    if samples.is_empty() {
        return None;
    }
    let gpu: Vec<GpuSample> = samples.iter().filter_map(|s| s.gpu).collect();
    Some(Aggregate {
        cpu_mean: mean(samples.iter().map(|s| s.cpu_percent)),
        cpu_max: samples.iter().map(|s| s.cpu_percent).fold(0.0, f64::max),
        rss_mean: mean(samples.iter().map(|s| s.rss as f64)) as u64,
        rss_max: samples.iter().map(|s| s.rss).max().unwrap_or(0),
        gpu: (!gpu.is_empty()).then(|| GpuAggregate {
            util_mean: mean(gpu.iter().map(|g| g.util_percent)),
            util_max: gpu.iter().map(|g| g.util_percent).fold(0.0, f64::max),
            memory_mean: mean(gpu.iter().map(|g| g.memory_used as f64)) as u64,
            memory_max: gpu.iter().map(|g| g.memory_used).max().unwrap_or(0),
        }),
    })
}

impl Aggregate {
    /// As metric columns (`COLUMNS`); GPU columns only when the GPU was read.
    fn columns(&self) -> Vec<(&'static str, f64)> {
        let mut out = vec![
            (COLUMNS[0], self.cpu_mean),
            (COLUMNS[1], self.cpu_max),
            (COLUMNS[2], self.rss_mean as f64),
            (COLUMNS[3], self.rss_max as f64),
        ];
        if let Some(g) = &self.gpu {
            out.extend([
                (COLUMNS[4], g.util_mean),
                (COLUMNS[5], g.util_max),
                (COLUMNS[6], g.memory_mean as f64),
                (COLUMNS[7], g.memory_max as f64),
            ]);
        }
        out
    }
}

/// The run's figures in `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuSummary {
    /// NVML's index of the GPU (PCI bus order, as `nvidia-smi` numbers them).
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_total_bytes: u64,
    pub utilization_percent_mean: f64,
    pub utilization_percent_max: f64,
    pub memory_used_bytes_mean: u64,
    pub memory_used_bytes_peak: u64,
}

/// Which NVML device a CUDA device is: NVML numbers every GPU of the machine, CUDA only those
/// `CUDA_VISIBLE_DEVICES` lets through, renumbered from 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvmlSelector {
    Index(u32),
    /// A `GPU-…` or `MIG-…` UUID, possibly a prefix (CUDA accepts any unique prefix).
    Uuid(String),
}

/// The NVML device behind CUDA device `ordinal` given `CUDA_VISIBLE_DEVICES` (`None`: unset). The variable
/// is read as CUDA reads it: comma-separated indices or UUIDs, the list ending at the first entry that is
/// neither (so `0,-1,1` is just `0`). Without it CUDA's ordinal is taken as NVML's index, which holds when
/// `CUDA_DEVICE_ORDER=PCI_BUS_ID` or the GPUs are all of one kind (CUDA's default order puts the fastest first).
fn nvml_selector(ordinal: u32, visible: Option<&str>) -> Result<NvmlSelector, String> {
    let Some(visible) = visible else {
        return Ok(NvmlSelector::Index(ordinal));
    };
    let mut devices = Vec::new();
    for entry in visible.split(',').map(str::trim) {
        let device = if !entry.is_empty() && entry.bytes().all(|b| b.is_ascii_digit()) {
            match entry.parse() {
                Ok(i) => NvmlSelector::Index(i),
                Err(_) => break,
            }
        } else if entry.starts_with("GPU-") || entry.starts_with("MIG-") {
            NvmlSelector::Uuid(entry.to_string())
        } else {
            break;
        };
        devices.push(device);
    }
    devices.into_iter().nth(ordinal as usize).ok_or_else(|| {
        format!(
            "CUDA device {ordinal} is not among CUDA_VISIBLE_DEVICES='{visible}' (it makes the listed \
             GPUs devices 0, 1, …; the list ends at the first entry that is not an index or a GPU-/MIG- UUID)"
        )
    })
}

/// A GPU opened through NVML.
struct Gpu {
    nvml: nvml_wrapper::Nvml,
    index: u32,
    uuid: String,
    name: String,
    memory_total: u64,
}

impl Gpu {
    /// The NVML device behind CUDA device `ordinal`, or why it cannot be read (no driver, no such device).
    fn open(ordinal: u32) -> Result<Gpu, String> {
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        let selector = nvml_selector(ordinal, visible.as_deref())?;
        let nvml = nvml_wrapper::Nvml::init().map_err(|e| format!("NVML unavailable: {e}"))?;
        let (index, uuid, name, memory_total) = {
            let d = match &selector {
                NvmlSelector::Index(i) => nvml
                    .device_by_index(*i)
                    .map_err(|e| format!("NVML device {i}: {e}"))?,
                NvmlSelector::Uuid(u) => Self::by_uuid_prefix(&nvml, u)?,
            };
            (
                d.index().unwrap_or(u32::MAX),
                d.uuid()
                    .map_err(|e| format!("{selector:?}: no UUID: {e}"))?,
                d.name().unwrap_or_else(|_| "unknown".into()),
                d.memory_info().map(|m| m.total).unwrap_or(0),
            )
        };
        Ok(Gpu {
            nvml,
            index,
            uuid,
            name,
            memory_total,
        })
    }

    /// The one device whose UUID starts with `prefix` (a whole UUID included; MIG UUIDs go to NVML as is).
    fn by_uuid_prefix<'n>(
        nvml: &'n nvml_wrapper::Nvml,
        prefix: &str,
    ) -> Result<nvml_wrapper::Device<'n>, String> {
        if let Ok(d) = nvml.device_by_uuid(prefix) {
            return Ok(d);
        }
        let count = nvml.device_count().map_err(|e| format!("NVML: {e}"))?;
        let mut found = (0..count)
            .filter_map(|i| nvml.device_by_index(i).ok())
            .filter(|d| d.uuid().is_ok_and(|u| u.starts_with(prefix)));
        match (found.next(), found.next()) {
            (Some(d), None) => Ok(d),
            (None, _) => Err(format!("no GPU has a UUID starting with {prefix}")),
            (Some(_), Some(_)) => Err(format!("several GPUs have UUIDs starting with {prefix}")),
        }
    }

    fn sample(&self) -> Option<GpuSample> {
        let d = self.nvml.device_by_uuid(self.uuid.as_str()).ok()?;
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

/// What `summary.json` names the monitored GPU by.
#[derive(Debug, Clone, PartialEq)]
struct GpuInfo {
    index: u32,
    uuid: String,
    name: String,
    memory_total: u64,
}

/// The running monitor.
pub struct DeviceStatsMonitor {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Option<Gpu>>>,
    samples: Arc<Mutex<Vec<Sample>>>,
    epoch_from: usize,
    every: Duration,
    gpu_info: Option<GpuInfo>,
}

impl DeviceStatsMonitor {
    /// Start sampling every `every`; `cuda_device` is the run's CUDA device ordinal, if it uses a GPU
    /// (mapped to NVML through `CUDA_VISIBLE_DEVICES`, see `nvml_selector`). A GPU that cannot be opened is
    /// reported once in the log and left out.
    pub fn start(every: Duration, cuda_device: Option<u32>) -> DeviceStatsMonitor {
        let gpu = cuda_device.and_then(|i| match Gpu::open(i) {
            Ok(g) => Some(g),
            Err(why) => {
                tracing::warn!("device stats: no GPU figures ({why})");
                None
            }
        });
        let gpu_info = gpu.as_ref().map(|g| GpuInfo {
            index: g.index,
            uuid: g.uuid.clone(),
            name: g.name.clone(),
            memory_total: g.memory_total,
        });
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
        aggregate(epoch).map(|a| a.columns()).unwrap_or_default()
    }

    /// Stop sampling; the whole run's figures (none if nothing was sampled), and `nvidia-smi.txt` in
    /// `run_dir` when a GPU was monitored.
    pub fn finish(mut self, run_dir: &Path) -> Option<DeviceStatsSummary> {
        self.stop.store(true, Ordering::Relaxed);
        let gpu = self.thread.take().and_then(|t| t.join().ok()).flatten();
        if let Some(g) = &gpu {
            if let Err(e) = crate::storage::records::write_atomic(
                &run_dir.join("nvidia-smi.txt"),
                g.report().as_bytes(),
            ) {
                tracing::warn!("device stats: could not write nvidia-smi.txt: {e}");
            }
        }
        let samples = self.samples.lock().map(|s| s.clone()).unwrap_or_default();
        summarize(&samples, self.every, self.gpu_info.as_ref())
    }
}

/// The whole run's figures; the GPU part only when `gpu` was opened and read at least once.
fn summarize(
    samples: &[Sample],
    every: Duration,
    gpu: Option<&GpuInfo>,
) -> Option<DeviceStatsSummary> {
    let a = aggregate(samples)?;
    Some(DeviceStatsSummary {
        samples: samples.len(),
        sample_every_ms: every.as_millis() as u64,
        cpu_percent_mean: a.cpu_mean,
        cpu_percent_max: a.cpu_max,
        rss_bytes_mean: a.rss_mean,
        rss_bytes_max: a.rss_max,
        gpu: gpu.zip(a.gpu).map(|(info, g)| GpuSummary {
            index: info.index,
            uuid: info.uuid.clone(),
            name: info.name.clone(),
            memory_total_bytes: info.memory_total,
            utilization_percent_mean: g.util_mean,
            utilization_percent_max: g.util_max,
            memory_used_bytes_mean: g.memory_mean,
            memory_used_bytes_peak: g.memory_max,
        }),
    })
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
        assert_eq!(names, &COLUMNS[..4]);
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

    fn sample(cpu: f64, rss: u64, gpu: Option<(f64, u64)>) -> Sample {
        Sample {
            cpu_percent: cpu,
            rss,
            gpu: gpu.map(|(util_percent, memory_used)| GpuSample {
                util_percent,
                memory_used,
            }),
        }
    }

    /// Per-epoch columns and the run's summary: means and maxima of CPU, RSS and, when the GPU was read,
    /// its utilisation and memory; without GPU samples the GPU columns and fields are absent, not zero.
    #[rstest::rstest]
    #[case::cpu_only(
        vec![sample(50.0, 100, None), sample(150.0, 300, None)],
        vec![100.0, 150.0, 200.0, 300.0],
    )]
    #[case::with_gpu(
        vec![sample(50.0, 100, Some((10.0, 1000))), sample(150.0, 300, Some((90.0, 3000))), sample(100.0, 200, None)],
        vec![100.0, 150.0, 200.0, 300.0, 50.0, 90.0, 2000.0, 3000.0],
    )]
    fn aggregates(#[case] samples: Vec<Sample>, #[case] want: Vec<f64>) {
        let cols = aggregate(&samples).unwrap().columns();
        let names: Vec<&str> = cols.iter().map(|c| c.0).collect();
        assert_eq!(names, &COLUMNS[..want.len()]);
        let values: Vec<f64> = cols.iter().map(|c| c.1).collect();
        assert_eq!(values, want);
        let info = GpuInfo {
            index: 3,
            uuid: "GPU-abc".into(),
            name: "H100".into(),
            memory_total: 80 << 30,
        };
        let s = summarize(&samples, Duration::from_millis(500), Some(&info)).unwrap();
        assert_eq!((s.rss_bytes_mean, s.rss_bytes_max), (200, 300));
        let json = serde_json::to_value(&s).unwrap();
        match want.len() {
            4 => assert!(json.get("gpu").is_none(), "{json}"),
            _ => {
                let g = &json["gpu"];
                assert_eq!(g["utilization_percent_max"], 90.0);
                assert_eq!(g["memory_used_bytes_mean"], 2000);
                assert_eq!(g["memory_used_bytes_peak"], 3000);
                assert_eq!(g["uuid"], "GPU-abc");
            }
        }
        assert!(aggregate(&[]).is_none());
    }

    /// CUDA_VISIBLE_DEVICES as CUDA reads it, to the NVML device of a CUDA ordinal.
    #[rstest::rstest]
    #[case(0, None, Ok(NvmlSelector::Index(0)))]
    #[case(2, None, Ok(NvmlSelector::Index(2)))]
    #[case(0, Some("1,3"), Ok(NvmlSelector::Index(1)))]
    #[case(1, Some("1, 3"), Ok(NvmlSelector::Index(3)))]
    #[case(0, Some("GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"), Ok(NvmlSelector::Uuid("GPU-8932f937-d72c-4106-c12f-20bd9faed9f6".into())))]
    #[case(1, Some("3,GPU-8932f937"), Ok(NvmlSelector::Uuid("GPU-8932f937".into())))]
    #[case(0, Some("MIG-5c8a8d5e-1c4b-5d2f-9f2a-0e6b1c2d3e4f"), Ok(NvmlSelector::Uuid("MIG-5c8a8d5e-1c4b-5d2f-9f2a-0e6b1c2d3e4f".into())))]
    // The list ends at the first entry that is neither an index nor a UUID.
    #[case(
        1,
        Some("0,-1,1"),
        Err("CUDA device 1 is not among CUDA_VISIBLE_DEVICES='0,-1,1'")
    )]
    #[case(0, Some(""), Err("CUDA device 0 is not among CUDA_VISIBLE_DEVICES=''"))]
    #[case(2, Some("0,1"), Err("CUDA device 2 is not among"))]
    fn cuda_visible_devices_to_nvml(
        #[case] ordinal: u32,
        #[case] visible: Option<&str>,
        #[case] want: Result<NvmlSelector, &str>,
    ) {
        match (nvml_selector(ordinal, visible), want) {
            (Ok(got), Ok(want)) => assert_eq!(got, want),
            (Err(got), Err(want)) => assert!(got.starts_with(want), "{got}"),
            (got, want) => panic!("{got:?} vs {want:?}"),
        }
    }
}
