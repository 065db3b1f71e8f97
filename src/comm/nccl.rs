//! ProcessGroupNCCL for runs on CUDA (feature `torch`). The NCCL shim (`src/comm/nccl_shim.cpp`) is a
//! shared library of its own: it needs libtorch's CUDA library, which a CPU machine cannot load, so
//! `train` carries its bytes (built by build.rs where the CUDA and NCCL headers are; scripts/
//! install-libtorch.sh fetches them) and loads it from memory only when a run asks for NCCL, after
//! `cuda::load` has put libtorch_cuda.so in place. The backend it makes joins the Gloo group as
//! the backend for CUDA tensors (`c10d::ProcessGroup::gloo`).

use super::c10d::{c_string, NcclBackend, Store};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;
use std::time::Duration;

extern "C" {
    fn trainyard_store_intrusive(store: *mut c_void) -> *mut c_void;
    fn trainyard_backend_free(backend: *mut c_void);
}

/// The shim's bytes, when this build has them.
#[cfg(trainyard_nccl)]
const SHIM: Option<&[u8]> = Some(include_bytes!(concat!(
    env!("OUT_DIR"),
    "/libtrainyard_nccl.so"
)));
#[cfg(not(trainyard_nccl))]
const SHIM: Option<&[u8]> = None;

/// Was the NCCL shim built into this binary?
pub fn built() -> bool {
    SHIM.is_some()
}

type BackendNew = unsafe extern "C" fn(
    store: *mut c_void,
    prefix: *const c_char,
    rank: c_int,
    size: c_int,
    device: c_int,
    timeout_ms: i64,
) -> *mut c_void;
type LastError = unsafe extern "C" fn() -> *const c_char;

struct Shim {
    backend_new: BackendNew,
    last_error: LastError,
}

/// Write the shim into an anonymous in-memory file and open it (once per process). Its undefined symbols
/// resolve against the libtorch already loaded, libtorch_cuda.so included.
fn shim() -> anyhow::Result<&'static Shim> {
    static SHIM_LOADED: OnceLock<Result<Shim, String>> = OnceLock::new();
    SHIM_LOADED
        .get_or_init(|| {
            let bytes = SHIM.ok_or_else(|| {
                "this build has no NCCL shim: build.rs found no CUDA/NCCL headers (scripts/install-libtorch.sh \
                 fetches them; or point TRAINYARD_CUDA_HEADERS at a folder holding nvidia/cu13/include and \
                 nvidia/nccl/include) and rebuild"
                    .to_string()
            })?;
            crate::platform::cuda::load().map_err(|why| format!("libtorch's CUDA library did not load: {why}"))?;
            let path = in_memory_file("trainyard_nccl", bytes)?;
            let handle = crate::platform::cuda::open_library(&path, libc::RTLD_NOW | libc::RTLD_LOCAL)
                .map_err(|e| format!("loading the NCCL shim: {e}"))?;
            let symbol = |name: &CStr| -> Result<*mut c_void, String> {
                // SAFETY: a live handle and a NUL-terminated name.
                let f = unsafe { libc::dlsym(handle, name.as_ptr()) };
                if f.is_null() {
                    Err(format!("the NCCL shim lacks {name:?}"))
                } else {
                    Ok(f)
                }
            };
            // SAFETY: the symbols are the shim's extern "C" functions with exactly these signatures.
            Ok(unsafe {
                Shim {
                    backend_new: std::mem::transmute::<*mut c_void, BackendNew>(symbol(
                        c"trainyard_nccl_backend_new",
                    )?),
                    last_error: std::mem::transmute::<*mut c_void, LastError>(symbol(
                        c"trainyard_nccl_last_error",
                    )?),
                }
            })
        })
        .as_ref()
        .map_err(|e| anyhow::anyhow!("{e}"))
}

/// `bytes` as a file the dynamic loader can open, without touching the disk: a memfd, named by its
/// /proc/self/fd path (kept open for the life of the process).
fn in_memory_file(name: &str, bytes: &[u8]) -> Result<std::path::PathBuf, String> {
    use std::io::Write;
    use std::os::fd::FromRawFd;
    let c_name = c_string(name).map_err(|e| e.to_string())?;
    // SAFETY: a valid name; the returned descriptor is owned by the File below.
    let fd = unsafe { libc::memfd_create(c_name.as_ptr(), 0) };
    if fd < 0 {
        return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    file.write_all(bytes)
        .map_err(|e| format!("writing the NCCL shim to memory: {e}"))?;
    std::mem::forget(file); // the loader may map it again (a later dlopen of the same path)
    Ok(format!("/proc/self/fd/{fd}").into())
}

impl NcclBackend {
    /// ProcessGroupNCCL over `store` (keys under `prefix`) for CUDA device `device`, its collectives
    /// aborted by NCCL's watchdog after `timeout`. NCCL's communicator forms at the first collective.
    pub fn new(
        store: &Store,
        prefix: &str,
        rank: usize,
        world_size: usize,
        device: usize,
        timeout: Duration,
    ) -> anyhow::Result<NcclBackend> {
        let shim = shim()?;
        let prefix_c = c_string(prefix)?;
        // SAFETY: a live store; the shim copies what it keeps and returns null with a message on failure.
        let ptr = unsafe {
            (shim.backend_new)(
                trainyard_store_intrusive(store.ptr),
                prefix_c.as_ptr(),
                rank as c_int,
                world_size as c_int,
                device as c_int,
                timeout.as_millis() as i64,
            )
        };
        if ptr.is_null() {
            // SAFETY: the shim's thread-local message, NUL-terminated.
            let why = unsafe { CStr::from_ptr((shim.last_error)()) }.to_string_lossy();
            anyhow::bail!(
                "could not create ProcessGroupNCCL (rank {rank} of {world_size}, cuda:{device}): {}",
                why.trim()
            );
        }
        Ok(NcclBackend { ptr })
    }
}

impl Drop for NcclBackend {
    fn drop(&mut self) {
        // SAFETY: allocated by the shim, freed once; a group holds its own reference.
        unsafe { trainyard_backend_free(self.ptr) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_in_memory_open_as_a_library_path() {
        let path = in_memory_file("trainyard_test", b"not an ELF file").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"not an ELF file");
        let err = crate::platform::cuda::open_library(&path, libc::RTLD_NOW).unwrap_err();
        assert!(
            err.contains("invalid ELF header") || err.contains("too short"),
            "{err}"
        );
    }

    /// Where libtorch's CUDA library loads (a full PyTorch install on LD_LIBRARY_PATH) the embedded shim
    /// loads, resolves against it and reaches ProcessGroupNCCL's constructor, which on a machine without
    /// a GPU refuses with PyTorch's own message. On CUDA-less libtorch the reason is the CUDA library.
    #[test]
    fn the_shim_reaches_process_group_nccl_or_names_what_is_missing() {
        let port = crate::testing::loopback_port();
        let store = Store::connect("127.0.0.1", port, true, 1, Duration::from_secs(10)).unwrap();
        let made = NcclBackend::new(&store, "test/nccl", 0, 1, 0, Duration::from_secs(10));
        match (built(), crate::platform::cuda::load(), made) {
            (false, _, Err(e)) => assert!(e.to_string().contains("no NCCL shim"), "{e:#}"),
            (true, Err(_), Err(e)) => {
                assert!(e.to_string().contains("libtorch_cuda.so"), "{e:#}")
            }
            (true, Ok(_), Err(e)) if tch::Cuda::device_count() == 0 => {
                assert!(e.to_string().contains("no GPUs found"), "{e:#}")
            }
            (true, Ok(_), Ok(_)) => assert!(tch::Cuda::device_count() > 0),
            (built, loaded, made) => panic!(
                "built={built} cuda={loaded:?} made={:?}",
                made.map(|_| ()).map_err(|e| format!("{e:#}"))
            ),
        }
    }
}
