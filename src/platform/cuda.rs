//! libtorch's CUDA half, `libtorch_cuda.so`, loaded when a run first asks about CUDA instead of being
//! linked. The wheel's CUDA library needs cuBLAS, cuDNN and NCCL, which a CPU machine does not have: a
//! `train` linked against it would not even start there (and the linker drops it anyway, since no symbol
//! of it is referenced, which left `tch::Cuda::is_available()` false on every GPU machine). It is opened
//! with `RTLD_GLOBAL` from the folder `libtorch_cpu.so` was loaded from, as `import torch` does; its static
//! initialisers register CUDA with libtorch's dispatcher, after which tch's CUDA calls work.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The folder of a loaded shared library whose file name is `file_name`, found among the objects the
/// dynamic loader has mapped into this process.
pub(crate) fn loaded_library_dir(file_name: &str) -> Option<PathBuf> {
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        out: *mut c_void,
    ) -> c_int {
        // SAFETY: the loader passes a valid `info`; `out` is the Vec handed to dl_iterate_phdr below.
        let (name, found) = unsafe { ((*info).dlpi_name, &mut *out.cast::<Vec<PathBuf>>()) };
        if !name.is_null() {
            // SAFETY: dlpi_name is a NUL-terminated path (empty for the executable itself).
            let path = unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned();
            if !path.is_empty() {
                found.push(PathBuf::from(path));
            }
        }
        0
    }
    let mut loaded: Vec<PathBuf> = Vec::new();
    // SAFETY: the callback only reads the entries and pushes into `loaded`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut loaded as *mut Vec<PathBuf>).cast()) };
    loaded
        .into_iter()
        .find(|p| p.file_name().is_some_and(|n| n == file_name))
        .and_then(|p| p.parent().map(Path::to_path_buf))
}

/// `dlopen(path, flags)`; the loader's own message on failure. The handle is never closed: what it
/// registers with libtorch must stay.
pub(crate) fn open_library(path: &Path, flags: c_int) -> Result<*mut c_void, String> {
    let c_path = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| format!("{} contains a NUL byte", path.display()))?;
    // SAFETY: a valid C string; dlerror's message is copied before any other dl* call on this thread.
    unsafe {
        let handle = libc::dlopen(c_path.as_ptr(), flags);
        if handle.is_null() {
            let err: *const c_char = libc::dlerror();
            return Err(if err.is_null() {
                format!("{}: dlopen failed", path.display())
            } else {
                CStr::from_ptr(err).to_string_lossy().into_owned()
            });
        }
        Ok(handle)
    }
}

/// Load `libtorch_cuda.so` once; the outcome (its path, or why not) is kept for the process.
pub fn load() -> Result<&'static Path, &'static str> {
    static LOADED: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let dir = loaded_library_dir("libtorch_cpu.so")
                .ok_or_else(|| "libtorch_cpu.so is not loaded in this process".to_string())?;
            let path = dir.join("libtorch_cuda.so");
            if !path.exists() {
                return Err(format!(
                    "{} does not exist (a CPU-only libtorch)",
                    path.display()
                ));
            }
            open_library(&path, libc::RTLD_NOW | libc::RTLD_GLOBAL)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            tracing::debug!("loaded {}", path.display());
            Ok(path)
        })
        .as_ref()
        .map(PathBuf::as_path)
        .map_err(String::as_str)
}

/// Can libtorch run on a CUDA device here (its CUDA library loads and a driver sees a GPU)?
pub fn is_available() -> bool {
    load().is_ok() && tch::Cuda::is_available()
}

/// The CUDA devices libtorch sees (0 where its CUDA library cannot load).
pub fn device_count() -> usize {
    if load().is_err() {
        return 0;
    }
    tch::Cuda::device_count().max(0) as usize
}

extern "C" {
    fn trainyard_cuda_set_device(index: c_int) -> c_int;
}

/// `torch.cuda.set_device(index)` for the calling thread.
pub fn set_current_device(index: usize) -> anyhow::Result<()> {
    // SAFETY: plain C ABI; the shim catches every C++ exception and reports a status.
    let status = unsafe { trainyard_cuda_set_device(index as c_int) };
    anyhow::ensure!(
        status == 0,
        "could not make cuda:{index} the current CUDA device"
    );
    Ok(())
}

extern "C" {
    fn trainyard_cuda_memory(index: c_int, allocated: *mut i64, peak_allocated: *mut i64) -> c_int;
    fn trainyard_cuda_reset_peak(index: c_int) -> c_int;
}

/// One device's caching-allocator figures, as `torch.cuda.memory_allocated` and `max_memory_allocated`
/// give them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryStats {
    pub allocated: u64,
    pub peak_allocated: u64,
}

/// The caching allocator's figures for `cuda:index`.
pub fn memory_stats(index: usize) -> anyhow::Result<MemoryStats> {
    let (mut allocated, mut peak) = (0i64, 0i64);
    // SAFETY: plain C ABI writing two integers; the shim catches every C++ exception.
    let status = unsafe { trainyard_cuda_memory(index as c_int, &mut allocated, &mut peak) };
    anyhow::ensure!(
        status == 0,
        "could not read cuda:{index}'s memory statistics (is libtorch's CUDA library loaded?)"
    );
    Ok(MemoryStats {
        allocated: allocated.max(0) as u64,
        peak_allocated: peak.max(0) as u64,
    })
}

/// `torch.cuda.reset_peak_memory_stats(index)`: the peak restarts from what is allocated now.
pub fn reset_peak(index: usize) -> anyhow::Result<()> {
    // SAFETY: plain C ABI; the shim catches every C++ exception.
    let status = unsafe { trainyard_cuda_reset_peak(index as c_int) };
    anyhow::ensure!(
        status == 0,
        "could not reset cuda:{index}'s peak memory statistic"
    );
    Ok(())
}

/// Why CUDA is not usable, with what to do about it (for errors that name the setting that asked for it).
pub fn why_unavailable() -> String {
    match load() {
        Err(why) => format!(
            "libtorch's CUDA library did not load ({why}). The libtorch from scripts/install-libtorch.sh \
             carries no CUDA libraries; on a GPU machine install PyTorch 2.11 with its CUDA dependencies \
             (pip install torch==2.11.0) and build with LIBTORCH_USE_PYTORCH=1, or run with \
             LD_LIBRARY_PATH=<site-packages>/torch/lib"
        ),
        Ok(path) => format!(
            "libtorch's CUDA library is loaded ({}) but sees no CUDA device (no NVIDIA driver, or \
             CUDA_VISIBLE_DEVICES hides every GPU)",
            path.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libtorch_cpu_is_found_among_the_loaded_libraries() {
        let _ = tch::Tensor::zeros([1], tch::kind::FLOAT_CPU); // libtorch is mapped by now
        let dir = loaded_library_dir("libtorch_cpu.so").expect("libtorch_cpu.so is loaded");
        assert!(dir.join("libtorch_cpu.so").is_file(), "{}", dir.display());
        assert_eq!(loaded_library_dir("libnot_a_library.so"), None);
    }

    /// Either the CUDA library loads (a full PyTorch install) and then tch agrees with us on the device
    /// count, or the reason names the library and is kept.
    #[test]
    fn cuda_loads_or_says_which_library_is_missing() {
        match load() {
            Ok(path) => {
                assert!(path.ends_with("libtorch_cuda.so"));
                assert_eq!(device_count(), tch::Cuda::device_count().max(0) as usize);
            }
            Err(why) => {
                assert!(why.contains("libtorch_cuda.so"), "{why}");
                assert_eq!(device_count(), 0);
                assert!(!is_available());
                assert!(why_unavailable().contains("LIBTORCH_USE_PYTORCH=1"));
            }
        }
    }

    #[test]
    fn a_library_that_does_not_exist_gives_the_loaders_message() {
        let err = open_library(Path::new("/nonexistent/libx.so"), libc::RTLD_NOW).unwrap_err();
        assert!(err.contains("/nonexistent/libx.so"), "{err}");
    }
}
