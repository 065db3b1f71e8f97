// What tch does not expose, reached through libtorch's C++ API: autocast for a given device type and
// dtype (tch's `autocast` is CUDA float16 only), `param.grad = None` (tch can only zero a gradient),
// `torch.cuda.set_device`, `torch.use_deterministic_algorithms`, the multi-tensor (`_foreach_*`)
// optimizer and GradScaler kernels (tch binds no op that takes a list of tensors) and the CUDA caching
// allocator's statistics. Every entry point catches C++ exceptions and reports them as a status, so
// nothing unwinds into Rust.
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/_foreach_div.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_sqrt.h>
#include <ATen/ops/_foreach_sub.h>
#include <ATen/ops/bernoulli.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mul.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstdint>
#include <mutex>
#include <vector>

namespace {
at::DeviceType device_type(int device) { return device == 1 ? at::kCUDA : at::kCPU; }
at::ScalarType scalar_type(int dtype) { return dtype == 1 ? at::kBFloat16 : at::kHalf; }

// A list of tch handles (`torch::Tensor*`) as the tensors themselves (shallow: same storage).
std::vector<at::Tensor> tensors(at::Tensor* const* handles, int64_t n) {
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (int64_t i = 0; i < n; ++i) out.push_back(*handles[i]);
  return out;
}

// x·k as a new list or, on the CPU, written into `scratch` (tensors of x's shapes whose values are no
// longer needed): a fresh list of parameter-sized tensors costs the CPU page-faulting allocations every
// step (ResNet-18's SGD step took 3x PyTorch's). The same products either way: the CPU's multi-tensor
// multiply is this per-tensor one.
std::vector<at::Tensor> scaled(const std::vector<at::Tensor>& x, double k, std::vector<at::Tensor>& scratch) {
  if (x.empty() || !x[0].is_cpu()) return at::_foreach_mul(x, k);
  for (size_t i = 0; i < x.size(); ++i) at::mul_out(scratch[i], x[i], k);
  return scratch;
}

// L2 weight decay into the gradients, as `optim` takes it: g += p·wd, the product rounded first.
void add_weight_decay(std::vector<at::Tensor>& g, const std::vector<at::Tensor>& p, double wd) {
  at::_foreach_add_(g, wd != 1.0 ? at::_foreach_mul(p, wd) : p);
}
}  // namespace

extern "C" {

// Enter an autocast region: device 0 = CPU, 1 = CUDA; dtype 0 = float16, 1 = bfloat16.
// Writes the previous state to *prev_enabled / *prev_dtype for trainyard_autocast_exit. 0 on success.
int trainyard_autocast_enter(int device, int dtype, int* prev_enabled, int* prev_dtype) {
  try {
    auto dev = device_type(device);
    *prev_enabled = at::autocast::is_autocast_enabled(dev) ? 1 : 0;
    *prev_dtype = static_cast<int>(at::autocast::get_autocast_dtype(dev));
    at::autocast::set_autocast_dtype(dev, scalar_type(dtype));
    at::autocast::set_autocast_enabled(dev, true);
    at::autocast::increment_nesting();
    return 0;
  } catch (...) {
    return 1;
  }
}

// Leave the region entered last: the cast-weight cache is cleared when the outermost region ends.
int trainyard_autocast_exit(int device, int prev_enabled, int prev_dtype) {
  try {
    auto dev = device_type(device);
    if (at::autocast::decrement_nesting() == 0) {
      at::autocast::clear_cache();
    }
    at::autocast::set_autocast_enabled(dev, prev_enabled != 0);
    at::autocast::set_autocast_dtype(dev, static_cast<at::ScalarType>(prev_dtype));
    return 0;
  } catch (...) {
    return 1;
  }
}

// `t.grad = None`, as `zero_grad(set_to_none=True)`: the next backward hands its gradient buffer over
// instead of adding it into a zeroed one (a fill and an extra read-add-write per step saved). `t` is a
// tch tensor handle (a `torch::Tensor*`). 0 on success.
int trainyard_grad_reset(at::Tensor* t) {
  try {
    t->mutable_grad().reset();
    return 0;
  } catch (...) {
    return 1;
  }
}

// `t.grad = g` (a gradient handed back after DDP averaged it): `g` must have `t`'s shape. Both are tch
// tensor handles. 0 on success.
int trainyard_grad_set(at::Tensor* t, const at::Tensor* g) {
  try {
    if (g->sizes() != t->sizes()) return 1;
    t->mutable_grad() = *g;
    return 0;
  } catch (...) {
    return 1;
  }
}

// torch.cuda.set_device(index) for this thread, without linking CUDA: through the device guard that
// libtorch_cuda.so registers when it is loaded. 0 on success.
int trainyard_cuda_set_device(int index) {
  try {
    c10::impl::getDeviceGuardImpl(at::kCUDA)->setDevice(
        at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index)));
    return 0;
  } catch (...) {
    return 1;
  }
}

// Lightning's `deterministic`: torch.use_deterministic_algorithms(on) and cudnn.deterministic = on (with
// cuDNN's benchmark off when on). Process-wide. 0 on success.
int trainyard_set_deterministic(int on) {
  try {
    at::globalContext().setDeterministicAlgorithms(on != 0, /*warn_only=*/false);
    at::globalContext().setDeterministicCuDNN(on != 0);
    if (on != 0) at::globalContext().setBenchmarkCuDNN(false);
    return 0;
  } catch (...) {
    return 1;
  }
}

// One SGD step over n parameters with the multi-tensor kernels (PyTorch's `foreach=True` SGD): a few
// launches for the whole model instead of a few per parameter. The same operations in the same order
// as `optim`'s SGD rule (what `fused_optim` tests against), each rounded as there (a product is taken before it is added,
// never fused), so the numbers match it bit for bit. `grads` are scratch (overwritten); `bufs` are the
// momentum buffers (null when momentum is 0): updated when `update_bufs`, else new ones that become a
// copy of the (weight-decayed) gradient, as PyTorch's first step makes them. 0 on success.
int trainyard_sgd_foreach(at::Tensor* const* params, at::Tensor* const* grads, at::Tensor* const* bufs,
                          int64_t n, double lr, double momentum, double weight_decay, int nesterov,
                          int update_bufs) {
  try {
    at::NoGradGuard no_grad;
    auto p = tensors(params, n);
    auto g = tensors(grads, n);
    if (weight_decay != 0.0) add_weight_decay(g, p, weight_decay);
    if (momentum != 0.0) {
      auto b = tensors(bufs, n);
      if (update_bufs != 0) {
        if (momentum != 1.0) at::_foreach_mul_(b, momentum);
        at::_foreach_add_(b, g);
      } else {
        at::_foreach_copy_(b, g);
      }
      if (nesterov != 0) {
        at::_foreach_add_(g, momentum != 1.0 ? at::_foreach_mul(b, momentum) : b);
        if (lr != 1.0) at::_foreach_mul_(g, lr);
      } else {
        // The gradients are scratch once the buffers hold them.
        at::_foreach_sub_(p, lr != 1.0 ? scaled(b, lr, g) : b);
        return 0;
      }
    } else if (lr != 1.0) {
      at::_foreach_mul_(g, lr);
    }
    at::_foreach_sub_(p, g);
    return 0;
  } catch (...) {
    return 1;
  }
}

// One Adam/AdamW step over n parameters with the multi-tensor kernels: the operations and roundings of
// `optim`'s Adam rule, in its order (a product by 1 is exact, so the copies it makes for
// k = 1 are products here). `exp_avg`/`exp_avg_sq` are updated when `update_state`, else new buffers that
// the step fills (PyTorch's first step). `decoupled`: AdamW's decay of the parameter. `bc1`/`bc2`: the
// bias corrections 1 − β^t. `grads` are scratch. 0 on success.
int trainyard_adam_foreach(at::Tensor* const* params, at::Tensor* const* grads, at::Tensor* const* exp_avg,
                           at::Tensor* const* exp_avg_sq, int64_t n, double lr, double beta1, double beta2,
                           double eps, double weight_decay, int decoupled, double bc1, double bc2,
                           int update_state) {
  try {
    at::NoGradGuard no_grad;
    auto p = tensors(params, n);
    auto g = tensors(grads, n);
    auto m = tensors(exp_avg, n);
    auto v = tensors(exp_avg_sq, n);
    if (weight_decay != 0.0) {
      if (decoupled != 0) {
        const double keep = 1.0 - lr * weight_decay;
        if (keep != 1.0) at::_foreach_mul_(p, keep);
      } else {
        add_weight_decay(g, p, weight_decay);
      }
    }
    // m ← m·β1 + g·(1−β1)
    auto tmp = at::_foreach_mul(g, 1.0 - beta1);
    if (update_state != 0) {
      if (beta1 != 1.0) at::_foreach_mul_(m, beta1);
      at::_foreach_add_(m, tmp);
    } else {
      at::_foreach_copy_(m, tmp);
    }
    // v ← v·β2 + g²·(1−β2)
    auto sq = at::_foreach_mul(g, g);
    if (1.0 - beta2 != 1.0) at::_foreach_mul_(sq, 1.0 - beta2);
    if (update_state != 0) {
      if (beta2 != 1.0) at::_foreach_mul_(v, beta2);
      at::_foreach_add_(v, sq);
    } else {
      at::_foreach_copy_(v, sq);
    }
    // p ← p − (m / (√(v/bc2) + eps))·(lr/bc1)
    auto den = at::_foreach_mul(v, 1.0 / bc2);
    at::_foreach_sqrt_(den);
    if (eps != 0.0) at::_foreach_add_(den, eps);
    auto step = at::_foreach_div(m, den);
    if (lr / bc1 != 1.0) at::_foreach_mul_(step, lr / bc1);
    at::_foreach_sub_(p, step);
    return 0;
  } catch (...) {
    return 1;
  }
}

// `t *= k` for each of n tensors (one multi-tensor launch). 0 on success.
int trainyard_foreach_mul_(at::Tensor* const* ts, int64_t n, double k) {
  try {
    at::NoGradGuard no_grad;
    auto list = tensors(ts, n);
    at::_foreach_mul_(list, k);
    return 0;
  } catch (...) {
    return 1;
  }
}

// GradScaler.unscale_: each gradient ×inv_scale in place, found_inf set to 1 where any is inf or NaN, in
// one multi-tensor launch (`_amp_foreach_non_finite_check_and_unscale_`). 0 on success.
int trainyard_amp_unscale_foreach(at::Tensor* const* grads, int64_t n, at::Tensor* found_inf,
                                  const at::Tensor* inv_scale) {
  try {
    at::NoGradGuard no_grad;
    auto list = tensors(grads, n);
    at::_amp_foreach_non_finite_check_and_unscale_(list, *found_inf, *inv_scale);
    return 0;
  } catch (...) {
    return 1;
  }
}

// torch.cuda.memory_allocated / max_memory_allocated of device `index`, from the
// caching allocator libtorch_cuda.so registered (no CUDA linked here). Before the first CUDA tensor the
// allocator is not set up (it refuses every device): then nothing has been allocated, all zero. 0 on
// success.
int trainyard_cuda_memory(int index, int64_t* allocated, int64_t* peak_allocated) {
  try {
    auto* allocator = c10::getDeviceAllocator(at::kCUDA);
    if (!allocator->initialized()) {
      *allocated = *peak_allocated = 0;
      return 0;
    }
    auto stats = allocator->getDeviceStats(static_cast<c10::DeviceIndex>(index));
    const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    *allocated = stats.allocated_bytes[all].current;
    *peak_allocated = stats.allocated_bytes[all].peak;
    return 0;
  } catch (...) {
    return 1;
  }
}

// torch.cuda.reset_peak_memory_stats(index); nothing to reset before the allocator is set up. 0 on
// success.
int trainyard_cuda_reset_peak(int index) {
  try {
    auto* allocator = c10::getDeviceAllocator(at::kCUDA);
    if (allocator->initialized()) {
      allocator->resetPeakStats(static_cast<c10::DeviceIndex>(index));
    }
    return 0;
  } catch (...) {
    return 1;
  }
}

// Dropout on the tensor's own device: a keep-mask drawn by a private copy of that device's generator,
// seeded with `seed` (so each call is reproducible, and threads driving different replicas do not reseed
// each other's), scaled by 1/(1-p) as the host masks are, times x. Writes a new tch handle to *out.
// 0 on success.
int trainyard_dropout(const at::Tensor* x, double p, uint64_t seed, at::Tensor** out) {
  try {
    auto gen = at::globalContext().defaultGenerator(x->device()).clone();
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_current_seed(seed);
    }
    const double keep = 1.0 - p;
    auto mask = at::empty_like(*x).bernoulli_(keep, gen);
    mask.mul_(static_cast<float>(1.0 / keep));
    *out = new at::Tensor(x->mul(mask));
    return 0;
  } catch (...) {
    return 1;
  }
}

// x copied into pinned (page-locked) host memory for the current accelerator, as `x.pin_memory()` does
// in PyTorch. tch's binding always passes a device, which PyTorch 2.11 deprecates with a warning printed
// on every call (two lines a batch). Writes a new tch handle to *out; 0 on success.
int trainyard_pin_memory(const at::Tensor* x, at::Tensor** out) {
  try {
    *out = new at::Tensor(x->pin_memory());
    return 0;
  } catch (...) {
    return 1;
  }
}

// Is torch.use_deterministic_algorithms on?
int trainyard_deterministic() { return at::globalContext().deterministicAlgorithms() ? 1 : 0; }

}  // extern "C"
