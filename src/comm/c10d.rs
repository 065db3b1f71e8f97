//! libtorch's c10d from Rust (feature `torch`): the TCPStore that ranks rendezvous on, and a Gloo process
//! group whose collectives run on tch tensors in place (`src/comm/c10d_shim.cpp`). Every call can fail with
//! c10d's own message (a peer that died, a timeout); nothing here blocks longer than the timeouts given.

use super::collective::{through_host, Collective, ReduceOp};
use crate::tensor::Flat;
use anyhow::Context;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::time::Duration;
use tch::Tensor;

extern "C" {
    fn trainyard_c10d_last_error() -> *const c_char;
    fn trainyard_store_new(
        host: *const c_char,
        port: c_int,
        is_server: c_int,
        world: c_int,
        timeout_ms: i64,
    ) -> *mut c_void;
    fn trainyard_store_free(store: *mut c_void);
    fn trainyard_store_set(
        store: *mut c_void,
        key: *const c_char,
        data: *const u8,
        len: usize,
    ) -> c_int;
    fn trainyard_store_get(
        store: *mut c_void,
        key: *const c_char,
        data: *mut *mut u8,
        len: *mut usize,
    ) -> c_int;
    fn trainyard_store_add(
        store: *mut c_void,
        key: *const c_char,
        delta: i64,
        out: *mut i64,
    ) -> c_int;
    fn trainyard_store_check(store: *mut c_void, key: *const c_char, out: *mut c_int) -> c_int;
    fn trainyard_free(p: *mut c_void);
    fn trainyard_gloo_new(
        store: *mut c_void,
        prefix: *const c_char,
        rank: c_int,
        size: c_int,
        hostname: *const c_char,
        timeout_ms: i64,
        cuda_backend: *mut c_void,
    ) -> *mut c_void;
    fn trainyard_gloo_free(group: *mut c_void);
    fn trainyard_all_reduce(
        group: *mut c_void,
        tensors: *const *mut c_void,
        n: c_int,
        op: c_int,
    ) -> *mut c_void;
    fn trainyard_broadcast(group: *mut c_void, tensor: *mut c_void, root: c_int) -> *mut c_void;
    fn trainyard_all_gather(
        group: *mut c_void,
        output: *mut c_void,
        input: *mut c_void,
    ) -> *mut c_void;
    fn trainyard_reduce_scatter(
        group: *mut c_void,
        output: *mut c_void,
        input: *mut c_void,
        op: c_int,
    ) -> *mut c_void;
    fn trainyard_barrier(group: *mut c_void) -> *mut c_void;
    fn trainyard_sync_batch_norm(
        group: *mut c_void,
        input: *mut c_void,
        weight: *mut c_void,
        bias: *mut c_void,
        running_mean: *mut c_void,
        running_var: *mut c_void,
        momentum: f64,
        eps: f64,
    ) -> *mut c_void;
    fn trainyard_wait(pending: *mut c_void) -> c_int;
}

pub(super) fn last_error() -> String {
    // SAFETY: the shim returns a NUL-terminated thread-local string that lives until the next failure.
    unsafe { CStr::from_ptr(trainyard_c10d_last_error()) }
        .to_string_lossy()
        .trim()
        .to_string()
}

pub(super) fn check(status: c_int, what: &str) -> anyhow::Result<()> {
    if status == 0 {
        Ok(())
    } else {
        anyhow::bail!("{what}: {}", last_error())
    }
}

pub(super) fn c_string(s: &str) -> anyhow::Result<CString> {
    CString::new(s).with_context(|| format!("'{s}' contains a NUL byte"))
}

/// A ProcessGroupNCCL, not yet part of a group (`ProcessGroup::gloo` takes it in); made by `comm::nccl`,
/// which loads NCCL's shim.
pub struct NcclBackend {
    pub(super) ptr: *mut c_void,
}

/// The rendezvous point: rank 0 hosts it at `MASTER_ADDR:MASTER_PORT`, every rank connects to it.
pub struct Store {
    pub(super) ptr: *mut c_void,
}

// SAFETY: c10d's TCPStore client serialises its own socket use; the handle is only freed in Drop.
unsafe impl Send for Store {}
unsafe impl Sync for Store {}

impl Store {
    /// Host (`is_server`) or join the store (a client retries until `timeout`); every later `get` waits
    /// up to `timeout` for its key. The host does not wait for the clients: `rendezvous::arrive` counts
    /// them, and names the ones that do not come.
    pub fn connect(
        host: &str,
        port: u16,
        is_server: bool,
        world: usize,
        timeout: Duration,
    ) -> anyhow::Result<Store> {
        let host_c = c_string(host)?;
        // SAFETY: valid C string; the shim returns null on failure and keeps the message.
        let ptr = unsafe {
            trainyard_store_new(
                host_c.as_ptr(),
                c_int::from(port),
                c_int::from(is_server),
                world as c_int,
                timeout.as_millis() as i64,
            )
        };
        if ptr.is_null() {
            anyhow::bail!(
                "rendezvous at {host}:{port} failed{}: {}",
                if is_server {
                    " (hosting the store)"
                } else {
                    ""
                },
                last_error()
            );
        }
        Ok(Store { ptr })
    }

    pub fn set(&self, key: &str, value: &[u8]) -> anyhow::Result<()> {
        let key_c = c_string(key)?;
        // SAFETY: pointers valid for the call.
        check(
            unsafe { trainyard_store_set(self.ptr, key_c.as_ptr(), value.as_ptr(), value.len()) },
            &format!("store set '{key}'"),
        )
    }

    /// The value at `key`, waiting for it up to the store's timeout.
    pub fn get(&self, key: &str) -> anyhow::Result<Vec<u8>> {
        let key_c = c_string(key)?;
        let mut data: *mut u8 = std::ptr::null_mut();
        let mut len = 0usize;
        // SAFETY: the shim mallocs `len` bytes into `data` on success; we copy then free them.
        unsafe {
            check(
                trainyard_store_get(self.ptr, key_c.as_ptr(), &mut data, &mut len),
                &format!("store get '{key}'"),
            )?;
            let out = std::slice::from_raw_parts(data, len).to_vec();
            trainyard_free(data.cast());
            Ok(out)
        }
    }

    /// Whether `key` is set now (no waiting).
    pub fn check(&self, key: &str) -> anyhow::Result<bool> {
        let key_c = c_string(key)?;
        let mut out: c_int = 0;
        // SAFETY: pointers valid for the call.
        check(
            unsafe { trainyard_store_check(self.ptr, key_c.as_ptr(), &mut out) },
            &format!("store check '{key}'"),
        )?;
        Ok(out != 0)
    }

    /// Atomically add to a counter; returns the new value.
    pub fn add(&self, key: &str, delta: i64) -> anyhow::Result<i64> {
        let key_c = c_string(key)?;
        let mut out = 0i64;
        // SAFETY: pointers valid for the call.
        check(
            unsafe { trainyard_store_add(self.ptr, key_c.as_ptr(), delta, &mut out) },
            &format!("store add '{key}'"),
        )?;
        Ok(out)
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // SAFETY: allocated by trainyard_store_new, freed once.
        unsafe { trainyard_store_free(self.ptr) }
    }
}

/// The ranks of one run: Gloo for host tensors, and for CUDA tensors NCCL when the group was formed
/// with it (else Gloo too).
pub struct ProcessGroup {
    pub(super) ptr: *mut c_void,
    rank: usize,
    world_size: usize,
    /// CUDA tensors go to NCCL (else to Gloo).
    nccl: bool,
}

// SAFETY: used from one thread at a time by the trainer; Gloo runs its own worker threads internally.
unsafe impl Send for ProcessGroup {}
unsafe impl Sync for ProcessGroup {}

/// A collective in flight; `wait` finishes it (and reports a failure: a dead peer, a timeout).
#[must_use = "a collective must be waited for"]
pub struct Pending<'a> {
    ptr: *mut c_void,
    what: &'static str,
    /// The tensors the collective reads and writes stay borrowed until it is waited for.
    _tensors: std::marker::PhantomData<&'a Tensor>,
}

impl Pending<'_> {
    /// After another collective failed, do not wait for this one too (each wait could last the whole
    /// collective timeout): let it go. The shim's handle keeps the tensors' storage alive.
    pub fn abandon(mut self) {
        self.ptr = std::ptr::null_mut();
    }

    pub fn wait(mut self) -> anyhow::Result<()> {
        let ptr = std::mem::replace(&mut self.ptr, std::ptr::null_mut());
        // SAFETY: a live handle from the shim; trainyard_wait frees it.
        check(unsafe { trainyard_wait(ptr) }, self.what)
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: a live handle nobody waited for: wait (ignoring the outcome) so it is freed.
            unsafe { trainyard_wait(self.ptr) };
        }
    }
}

fn pending<'a>(ptr: *mut c_void, what: &'static str) -> anyhow::Result<Pending<'a>> {
    if ptr.is_null() {
        anyhow::bail!("{what}: {}", last_error());
    }
    Ok(Pending {
        ptr,
        what,
        _tensors: std::marker::PhantomData,
    })
}

fn tensor_ptr(t: &Tensor) -> *mut c_void {
    t.as_ptr() as *mut c_void
}

impl ProcessGroup {
    /// Join the Gloo group `name` over `store`, using the network interface that reaches `hostname`
    /// (this node's address as the other nodes see it; empty = this machine's hostname). With `nccl`,
    /// collectives on CUDA tensors (and DDP's reducer on CUDA) go to NCCL, host buffers still to Gloo.
    pub fn gloo(
        store: &Store,
        name: &str,
        rank: usize,
        world_size: usize,
        hostname: &str,
        timeout: Duration,
        nccl: Option<NcclBackend>,
    ) -> anyhow::Result<ProcessGroup> {
        let prefix = c_string(name)?;
        let host = c_string(hostname)?;
        // SAFETY: valid pointers; the group keeps its own reference to the store.
        let ptr = unsafe {
            trainyard_gloo_new(
                store.ptr,
                prefix.as_ptr(),
                rank as c_int,
                world_size as c_int,
                host.as_ptr(),
                timeout.as_millis() as i64,
                nccl.as_ref().map_or(std::ptr::null_mut(), |b| b.ptr),
            )
        };
        let with_nccl = nccl.is_some();
        if ptr.is_null() {
            anyhow::bail!(
                "could not form the Gloo group (rank {rank} of {world_size}): {}",
                last_error()
            );
        }
        Ok(ProcessGroup {
            ptr,
            rank,
            world_size,
            nccl: with_nccl,
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Does a collective on tensors of `device` run where they are: host tensors on Gloo, CUDA tensors
    /// on NCCL? (Gloo's gather and reduce-scatter take host tensors only.)
    pub fn runs_on(&self, device: tch::Device) -> bool {
        device == tch::Device::Cpu || self.nccl
    }

    /// Start reducing `tensors` in place across ranks (contiguous CPU tensors).
    pub fn all_reduce<'a>(
        &self,
        tensors: &[&'a Tensor],
        op: ReduceOp,
    ) -> anyhow::Result<Pending<'a>> {
        let ptrs: Vec<*mut c_void> = tensors.iter().map(|t| tensor_ptr(t)).collect();
        // SAFETY: the tensors outlive the wait (callers hold them until `Pending::wait`).
        pending(
            unsafe {
                trainyard_all_reduce(self.ptr, ptrs.as_ptr(), ptrs.len() as c_int, op as c_int)
            },
            "all_reduce",
        )
    }

    pub fn broadcast<'a>(&self, tensor: &'a Tensor, root: usize) -> anyhow::Result<Pending<'a>> {
        // SAFETY: as above.
        pending(
            unsafe { trainyard_broadcast(self.ptr, tensor_ptr(tensor), root as c_int) },
            "broadcast",
        )
    }

    /// `output` (flat, world × input.numel()) receives every rank's `input` in rank order.
    pub fn all_gather<'a>(
        &self,
        output: &'a Tensor,
        input: &'a Tensor,
    ) -> anyhow::Result<Pending<'a>> {
        // SAFETY: as above.
        pending(
            unsafe { trainyard_all_gather(self.ptr, tensor_ptr(output), tensor_ptr(input)) },
            "all_gather",
        )
    }

    /// `input` (flat, world × output.numel()) is reduced across ranks; this rank keeps its chunk.
    pub fn reduce_scatter<'a>(
        &self,
        output: &'a Tensor,
        input: &'a Tensor,
        op: ReduceOp,
    ) -> anyhow::Result<Pending<'a>> {
        // SAFETY: as above.
        pending(
            unsafe {
                trainyard_reduce_scatter(
                    self.ptr,
                    tensor_ptr(output),
                    tensor_ptr(input),
                    op as c_int,
                )
            },
            "reduce_scatter",
        )
    }
}

impl ProcessGroup {
    /// SyncBatchNorm in training mode (an autograd function of the shim's: the forward's statistics and
    /// the backward's sums are reduced over this group); the running statistics are updated in place.
    #[allow(clippy::too_many_arguments)]
    pub fn sync_batch_norm(
        &self,
        input: &Tensor,
        weight: &Tensor,
        bias: &Tensor,
        running_mean: &Tensor,
        running_var: &Tensor,
        momentum: f64,
        eps: f64,
    ) -> anyhow::Result<Tensor> {
        // SAFETY: live tensors and group; the shim returns a new tensor the caller owns, or null.
        let out = unsafe {
            trainyard_sync_batch_norm(
                self.ptr,
                tensor_ptr(input),
                tensor_ptr(weight),
                tensor_ptr(bias),
                tensor_ptr(running_mean),
                tensor_ptr(running_var),
                momentum,
                eps,
            )
        };
        if out.is_null() {
            anyhow::bail!("SyncBatchNorm failed: {}", last_error());
        }
        // SAFETY: a heap `at::Tensor*` from the shim, owned from here on.
        Ok(unsafe { Tensor::from_ptr(out.cast()) })
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // SAFETY: allocated by trainyard_gloo_new, freed once.
        unsafe { trainyard_gloo_free(self.ptr) }
    }
}

/// A host slice seen as a CPU tensor, without a copy (valid while the slice is borrowed).
fn borrow_f32(data: &mut [f32]) -> Tensor {
    // SAFETY: the tensor aliases `data`, which the caller keeps borrowed until the collective is waited for.
    unsafe {
        Tensor::from_blob(
            data.as_mut_ptr() as *const u8,
            &[data.len() as i64],
            &[1],
            tch::Kind::Float,
            tch::Device::Cpu,
        )
    }
}

fn borrow_f64(data: &mut [f64]) -> Tensor {
    // SAFETY: as `borrow_f32`.
    unsafe {
        Tensor::from_blob(
            data.as_mut_ptr() as *const u8,
            &[data.len() as i64],
            &[1],
            tch::Kind::Double,
            tch::Device::Cpu,
        )
    }
}

impl Collective for ProcessGroup {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world_size
    }
    fn all_reduce_f32(&self, data: &mut [f32], op: ReduceOp) -> anyhow::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let t = borrow_f32(data);
        let done = self.all_reduce(&[&t], op)?.wait();
        done
    }
    fn all_reduce_f64(&self, data: &mut [f64], op: ReduceOp) -> anyhow::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let t = borrow_f64(data);
        let done = self.all_reduce(&[&t], op)?.wait();
        done
    }
    fn broadcast_f32(&self, data: &mut [f32], root: usize) -> anyhow::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let t = borrow_f32(data);
        let done = self.broadcast(&t, root)?.wait();
        done
    }
    fn all_gather_f32(&self, input: &[f32], output: &mut [f32]) -> anyhow::Result<()> {
        anyhow::ensure!(
            output.len() == input.len() * self.world_size,
            "all_gather: output holds {} values, expected {} ranks × {}",
            output.len(),
            self.world_size,
            input.len()
        );
        if input.is_empty() {
            return Ok(());
        }
        // c10d writes nothing into its input; the copy keeps the borrow rules simple (a shard is small).
        let mut shard = input.to_vec();
        let (src, dst) = (borrow_f32(&mut shard), borrow_f32(output));
        let done = self.all_gather(&dst, &src)?.wait();
        done
    }
    fn reduce_scatter_f32(&self, input: &mut [f32], output: &mut [f32]) -> anyhow::Result<()> {
        anyhow::ensure!(
            input.len() == output.len() * self.world_size,
            "reduce_scatter: input holds {} values, expected {} ranks × {}",
            input.len(),
            self.world_size,
            output.len()
        );
        if output.is_empty() {
            return Ok(());
        }
        let (src, dst) = (borrow_f32(input), borrow_f32(output));
        let done = self.reduce_scatter(&dst, &src, ReduceOp::Sum)?.wait();
        done
    }
    fn barrier(&self) -> anyhow::Result<()> {
        // SAFETY: a live group.
        pending(unsafe { trainyard_barrier(self.ptr) }, "barrier")?.wait()
    }
    fn gather_flat(&self, shard: &Flat) -> anyhow::Result<Flat> {
        let Some(t) = self.on_device(shard) else {
            return through_host::gather(self, shard);
        };
        let full = Tensor::f_empty(
            [t.numel() as i64 * self.world_size as i64],
            (t.kind(), t.device()),
        )?;
        self.all_gather(&full, t)?.wait()?;
        Ok(Flat::Tch(full))
    }
    fn reduce_scatter_flat(&self, full: Flat) -> anyhow::Result<Flat> {
        let Some(t) = self.on_device(&full) else {
            return through_host::reduce_scatter(self, full);
        };
        let n = t.numel() / self.world_size;
        anyhow::ensure!(
            n * self.world_size == t.numel(),
            "reduce_scatter: {} values do not split into {} equal chunks",
            t.numel(),
            self.world_size
        );
        let mine = Tensor::f_empty([n as i64], (t.kind(), t.device()))?;
        self.reduce_scatter(&mine, t, ReduceOp::Sum)?.wait()?;
        Ok(Flat::Tch(mine))
    }
    fn all_reduce_flat(&self, flat: Flat) -> anyhow::Result<Flat> {
        let Some(t) = self.on_device(&flat) else {
            return through_host::all_reduce(self, flat);
        };
        self.all_reduce(&[t], ReduceOp::Sum)?.wait()?;
        Ok(flat)
    }
    /// Every buffer's all-reduce is started before the first is waited for, so flattening the next
    /// bucket overlaps with the reduction of the last. Device tensors stay where they are (NCCL for
    /// CUDA where the group has it; Gloo copies CUDA tensors through the host itself).
    fn average_flats(&self, mut flats: Vec<Flat>) -> anyhow::Result<Vec<Flat>> {
        let reduced = (|| -> anyhow::Result<()> {
            let tensors: Vec<Tensor> = flats
                .iter_mut()
                .filter(|f| !f.is_empty())
                .map(|f| match f {
                    Flat::Tch(t) => t.shallow_clone(),
                    Flat::Host(v) => borrow_f32(v),
                })
                .collect();
            let mut in_flight = Vec::with_capacity(tensors.len());
            for t in &tensors {
                in_flight.push(self.all_reduce(&[t], ReduceOp::Sum)?);
            }
            let mut pending = in_flight.into_iter();
            while let Some(work) = pending.next() {
                if let Err(e) = work.wait() {
                    // A peer is gone: do not sit through the timeout once per remaining bucket.
                    pending.for_each(|w| w.abandon());
                    return Err(e);
                }
            }
            Ok(())
        })();
        if let Err(e) = reduced {
            // Abandoned collectives may still write into host buffers they borrowed: those stay
            // allocated (the run is ending with this error).
            std::mem::forget(flats);
            return Err(e);
        }
        for f in &mut flats {
            f.divide_in_place(self.world_size as f64)?;
        }
        Ok(flats)
    }
}

impl ProcessGroup {
    /// The c10d group under `comm`, when it is one (for engines that hand their tensors to libtorch's own
    /// reducer or SyncBatchNorm).
    pub fn of(comm: &dyn Collective) -> Option<&ProcessGroup> {
        (comm as &dyn std::any::Any).downcast_ref::<ProcessGroup>()
    }

    /// `flat` as a tensor a collective can take where it is: a tensor on a device this group serves.
    fn on_device<'f>(&self, flat: &'f Flat) -> Option<&'f Tensor> {
        match flat {
            Flat::Tch(t) if self.runs_on(t.device()) => Some(t),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_rank_group() -> (Store, ProcessGroup) {
        let port = crate::testing::loopback_port();
        let timeout = Duration::from_secs(10);
        let store = Store::connect("127.0.0.1", port, true, 1, timeout).unwrap();
        let group = ProcessGroup::gloo(&store, "test", 0, 1, "127.0.0.1", timeout, None).unwrap();
        (store, group)
    }

    /// Two ranks with half a batch each normalise, and back-propagate, exactly as one BatchNorm over the
    /// whole batch: each rank's input gradient is its half of the whole-batch one, and the parameter
    /// gradients sum to the whole-batch ones.
    #[test]
    fn sync_batch_norm_on_two_ranks_is_batch_norm_over_both_halves() {
        tch::manual_seed(0);
        let x = Tensor::randn([8, 3, 2, 5], (tch::Kind::Float, tch::Device::Cpu));
        let probe = Tensor::randn([8, 3, 2, 5], (tch::Kind::Float, tch::Device::Cpu));
        let run = |x: Tensor, probe: Tensor, group: Option<&ProcessGroup>| {
            let x = x.set_requires_grad(true);
            let w = Tensor::from_slice(&[1.0f32, 2.0, 0.5]).set_requires_grad(true);
            let b = Tensor::from_slice(&[0.0f32, 1.0, -1.0]).set_requires_grad(true);
            let (rm, rv) = (
                Tensor::zeros([3], tch::kind::FLOAT_CPU),
                Tensor::ones([3], tch::kind::FLOAT_CPU),
            );
            let y = match group {
                Some(g) => g.sync_batch_norm(&x, &w, &b, &rm, &rv, 0.1, 1e-5).unwrap(),
                None => x.batch_norm(
                    Some(&w),
                    Some(&b),
                    Some(&rm),
                    Some(&rv),
                    true,
                    0.1,
                    1e-5,
                    false,
                ),
            };
            (&y * &probe).sum(tch::Kind::Float).backward();
            vec![y.detach(), rm, rv, x.grad(), w.grad(), b.grad()]
        };
        let whole = run(x.copy(), probe.copy(), None);
        // Tensors are not Sync: each rank rebuilds its half from host copies.
        let host = |t: &Tensor| Vec::<f32>::try_from(t.flatten(0, -1)).unwrap();
        let (x_host, probe_host) = (host(&x), host(&probe));
        let halves: Vec<Vec<Tensor>> = crate::testing::on_two_ranks(|rank, group| {
            let half = |v: &[f32]| {
                Tensor::from_slice(v)
                    .reshape([8, 3, 2, 5])
                    .narrow(0, rank as i64 * 4, 4)
                    .copy()
            };
            run(half(&x_host), half(&probe_host), Some(group))
        });
        let close = |a: &Tensor, b: &Tensor, what: &str| {
            let diff = (a - b).abs().max().double_value(&[]);
            assert!(diff < 1e-5, "{what} differs by {diff}");
        };
        for (i, what) in [(0, "output"), (3, "input gradient")] {
            close(
                &Tensor::cat(&[&halves[0][i], &halves[1][i]], 0),
                &whole[i],
                what,
            );
        }
        for (i, what) in [(1, "running mean"), (2, "running var")] {
            close(&halves[0][i], &whole[i], what);
            close(&halves[1][i], &whole[i], what);
        }
        for (i, what) in [(4, "weight gradient"), (5, "bias gradient")] {
            close(&(&halves[0][i] + &halves[1][i]), &whole[i], what);
        }
    }

    /// On one rank, SyncBatchNorm is BatchNorm: the same output, running statistics and gradients as
    /// libtorch's own batch_norm.
    #[test]
    fn sync_batch_norm_on_one_rank_is_batch_norm() {
        let (_store, group) = one_rank_group();
        tch::manual_seed(0);
        let x = Tensor::randn([6, 3, 4, 5], (tch::Kind::Float, tch::Device::Cpu));
        let probe = Tensor::randn([6, 3, 4, 5], (tch::Kind::Float, tch::Device::Cpu));
        let run = |sync: bool| {
            let x = x.copy().set_requires_grad(true);
            let w = Tensor::from_slice(&[1.0f32, 2.0, 0.5]).set_requires_grad(true);
            let b = Tensor::from_slice(&[0.0f32, 1.0, -1.0]).set_requires_grad(true);
            let (rm, rv) = (
                Tensor::zeros([3], tch::kind::FLOAT_CPU),
                Tensor::ones([3], tch::kind::FLOAT_CPU),
            );
            let y = if sync {
                group
                    .sync_batch_norm(&x, &w, &b, &rm, &rv, 0.1, 1e-5)
                    .unwrap()
            } else {
                x.batch_norm(
                    Some(&w),
                    Some(&b),
                    Some(&rm),
                    Some(&rv),
                    true,
                    0.1,
                    1e-5,
                    false,
                )
            };
            (&y * &probe).sum(tch::Kind::Float).backward();
            [y, rm, rv, x.grad(), w.grad(), b.grad()]
        };
        let (ours, theirs) = (run(true), run(false));
        for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            let diff = (a - b).abs().max().double_value(&[]);
            assert!(diff < 1e-5, "output {i} differs by {diff}");
        }
    }
}
