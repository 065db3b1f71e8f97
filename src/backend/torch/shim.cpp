// What tch does not expose, reached through libtorch's C++ API: autocast for a given device type and
// dtype (tch's `autocast` is CUDA float16 only), and `param.grad = None` (tch can only zero a gradient). Every entry point catches C++ exceptions and reports them
// as a status, so nothing unwinds into Rust.
#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>

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

}  // extern "C"
