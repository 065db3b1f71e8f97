// What tch does not expose of a TorchScript module: its buffers (BatchNorm running statistics), which a
// checkpoint keeps beside the parameters under their state_dict() names. Kept apart from shim.cpp so the
// JIT headers are compiled once, here. Catches every C++ exception and reports a status.
#include <torch/csrc/jit/api/module.h>

extern "C" {

// Calls f(data, name, new at::Tensor*) for each buffer of `module`, recursively, in state_dict order.
// 0 on success.
int trainyard_jit_named_buffers(void* module, void* data, void (*f)(void*, const char*, void*)) {
  try {
    auto* m = static_cast<torch::jit::Module*>(module);
    for (const auto& b : m->named_buffers(/*recurse=*/true)) {
      f(data, b.name.c_str(), new at::Tensor(b.value));
    }
    return 0;
  } catch (...) {
    return 1;
  }
}

}  // extern "C"
