// What tch does not expose, reached through libtorch's C++ API: autocast for a given device type and
// dtype (tch's `autocast` is CUDA float16 only), `param.grad = None` (tch can only zero a gradient),
// `torch.cuda.set_device` and `torch.use_deterministic_algorithms`. Every entry point catches C++
// exceptions and reports them as a status, so nothing unwinds into Rust.
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace {
at::DeviceType device_type(int device) { return device == 1 ? at::kCUDA : at::kCPU; }
at::ScalarType scalar_type(int dtype) { return dtype == 1 ? at::kBFloat16 : at::kHalf; }
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

// Is torch.use_deterministic_algorithms on?
int trainyard_deterministic() { return at::globalContext().deterministicAlgorithms() ? 1 : 0; }

}  // extern "C"
