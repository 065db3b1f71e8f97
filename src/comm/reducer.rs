//! DDP's gradient averaging overlapped with the backward pass (feature `torch`): libtorch's own
//! `c10d::Reducer`, the engine under `torch.nn.parallel.DistributedDataParallel`. It hooks every
//! parameter's gradient accumulator; in a backward pass it was armed for, each bucket of gradients
//! (`trainer.ddp.bucket_cap_mb`) is all-reduced as soon as its last gradient is ready, while autograd
//! goes on computing the earlier layers, and the averaged gradients are in `.grad` when `backward`
//! returns. Unarmed backward passes (the first micro-batches of gradient accumulation, DDP's
//! `no_sync`) only accumulate locally.

use super::buckets::GradSync;
use super::c10d::{c_string, check, last_error, ProcessGroup};
use std::ffi::{c_char, c_int, c_void};
use tch::Tensor;

extern "C" {
    fn trainyard_reducer_new(
        group: *mut c_void,
        params: *const *mut c_void,
        names: *const *const c_char,
        n: c_int,
        bucket_cap: i64,
        find_unused: c_int,
        gradient_as_bucket_view: c_int,
    ) -> *mut c_void;
    fn trainyard_reducer_free(reducer: *mut c_void);
    fn trainyard_reducer_prepare_forward(reducer: *mut c_void) -> c_int;
    fn trainyard_reducer_prepare_backward(
        reducer: *mut c_void,
        outputs: *const *mut c_void,
        n: c_int,
    ) -> c_int;
    fn trainyard_reducer_check_finalized(reducer: *mut c_void) -> c_int;
}

/// A live reducer over one model's parameters. The parameter tensors must stay the ones it was built
/// with (it holds their gradient accumulators): an engine that replaces its parameters drops it first.
pub struct Reducer {
    ptr: *mut c_void,
    find_unused_parameters: bool,
}

// SAFETY: the reducer is driven from the thread that runs forward and backward; its hooks run on the
// autograd engine's thread for that backward pass, which c10d synchronises with its own mutex.
unsafe impl Send for Reducer {}

impl Reducer {
    /// Hook `params` (named, in the order the model defines them) to all-reduce over `group`.
    pub fn new(
        group: &ProcessGroup,
        params: &[(&str, &Tensor)],
        options: GradSync,
    ) -> anyhow::Result<Reducer> {
        let names: Vec<std::ffi::CString> = params
            .iter()
            .map(|(n, _)| c_string(n))
            .collect::<anyhow::Result<_>>()?;
        let name_ptrs: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
        let tensor_ptrs: Vec<*mut c_void> = params
            .iter()
            .map(|(_, t)| t.as_ptr() as *mut c_void)
            .collect();
        // SAFETY: live tensors and names for the call; the shim copies what it keeps (tensor handles
        // share storage) and returns null on failure with the message kept.
        let ptr = unsafe {
            trainyard_reducer_new(
                group.ptr,
                tensor_ptrs.as_ptr(),
                name_ptrs.as_ptr(),
                params.len() as c_int,
                options.bucket_cap_bytes as i64,
                c_int::from(options.find_unused_parameters),
                c_int::from(options.gradient_as_bucket_view),
            )
        };
        anyhow::ensure!(
            !ptr.is_null(),
            "DDP: could not build the gradient reducer: {}",
            last_error()
        );
        Ok(Reducer {
            ptr,
            find_unused_parameters: options.find_unused_parameters,
        })
    }

    /// Before the forward pass of a micro-batch whose backward pass reduces (every rank at the same
    /// point: the first call after the first reduced backward pass rebuilds the buckets in the order
    /// gradients became ready, with a broadcast from rank 0).
    pub fn prepare_forward(&mut self) -> anyhow::Result<()> {
        // SAFETY: a live reducer.
        check(
            unsafe { trainyard_reducer_prepare_forward(self.ptr) },
            "DDP: preparing the gradient buckets",
        )
    }

    /// After that forward pass, before backward: arm the hooks. With `find_unused_parameters`, the
    /// graph from `outputs` is searched and parameters it does not reach count as ready (zero).
    pub fn prepare_backward(&mut self, outputs: &[&Tensor]) -> anyhow::Result<()> {
        let ptrs: Vec<*mut c_void> = if self.find_unused_parameters {
            outputs.iter().map(|t| t.as_ptr() as *mut c_void).collect()
        } else {
            Vec::new()
        };
        // SAFETY: live reducer and tensors for the call.
        check(
            unsafe {
                trainyard_reducer_prepare_backward(self.ptr, ptrs.as_ptr(), ptrs.len() as c_int)
            },
            "DDP: arming the gradient reduction",
        )
    }

    /// After an armed backward pass: fails with DDP's own message when some bucket never got all its
    /// gradients (a parameter that took no part in the loss, without `find_unused_parameters`).
    pub fn check_finalized(&mut self) -> anyhow::Result<()> {
        // SAFETY: a live reducer.
        check(
            unsafe { trainyard_reducer_check_finalized(self.ptr) },
            "DDP: the gradient reduction did not finish",
        )
    }
}

impl Drop for Reducer {
    fn drop(&mut self) {
        // SAFETY: allocated by trainyard_reducer_new, freed once (the shim removes its hooks).
        unsafe { trainyard_reducer_free(self.ptr) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two ranks over a real Gloo group; `b` takes part in the loss on the ranks listed in `b_used_on`.
    /// Returns each rank's (a.grad, b.grad) after one armed backward pass with find_unused_parameters.
    fn grads_with_b_used_on(b_used_on: &'static [usize]) -> Vec<(Tensor, Option<Tensor>)> {
        crate::testing::on_two_ranks(|rank, group| {
            let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0]).set_requires_grad(true);
            let b = Tensor::from_slice(&[4.0f32, 5.0]).set_requires_grad(true);
            let mut reducer = Reducer::new(
                group,
                &[("a", &a), ("b", &b)],
                GradSync {
                    bucket_cap_bytes: 25 << 20,
                    find_unused_parameters: true,
                    gradient_as_bucket_view: false,
                },
            )
            .unwrap();
            reducer.prepare_forward().unwrap();
            let x = Tensor::from_slice(&[1.0f32, 10.0, 100.0]) * (rank as f64 + 1.0);
            let a_part = (&a * &x).sum(tch::Kind::Float);
            let loss = if b_used_on.contains(&rank) {
                let y = Tensor::from_slice(&[2.0f32, 3.0]) * (rank as f64 + 1.0);
                a_part + (&b * &y).sum(tch::Kind::Float)
            } else {
                a_part
            };
            reducer.prepare_backward(&[&loss]).unwrap();
            loss.backward();
            reducer.check_finalized().unwrap();
            let b_grad = b.grad();
            (a.grad(), b_grad.defined().then_some(b_grad))
        })
    }

    fn values(t: &Tensor) -> Vec<f32> {
        Vec::<f32>::try_from(t).unwrap()
    }

    /// A parameter unused on one rank counts as a zero gradient there: every rank ends with the mean
    /// of (rank 0's gradient, 0), as PyTorch's DDP gives with find_unused_parameters=True.
    #[test]
    fn a_parameter_unused_on_one_rank_averages_with_zero_there() {
        for (rank, (a, b)) in grads_with_b_used_on(&[0]).iter().enumerate() {
            // a: mean of x on rank 0 (1, 10, 100) and rank 1 (2, 20, 200).
            assert_eq!(values(a), [1.5, 15.0, 150.0], "rank {rank}");
            // b: rank 0's y (2, 3) and rank 1's zero, averaged.
            let b = b.as_ref().expect("b has a gradient on every rank");
            assert_eq!(values(b), [1.0, 1.5], "rank {rank}");
        }
    }

    /// A parameter no rank used keeps no gradient anywhere (no momentum or weight decay moves it).
    #[test]
    fn a_parameter_unused_on_every_rank_keeps_no_gradient() {
        for (rank, (a, b)) in grads_with_b_used_on(&[]).iter().enumerate() {
            assert_eq!(values(a), [1.5, 15.0, 150.0], "rank {rank}");
            assert!(
                b.is_none(),
                "rank {rank}: b got {:?}",
                b.as_ref().map(values)
            );
        }
    }
}
