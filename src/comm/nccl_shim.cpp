// PyTorch's ProcessGroupNCCL behind a C ABI, built as a shared library of its own (build.rs) and embedded
// in `train`, which loads it only for a run on CUDA with the NCCL backend (src/comm/nccl.rs). It needs
// libtorch_cuda.so, whose CUDA and NCCL libraries a CPU machine lacks: linking it into `train` would
// stop `train` from starting there. The backend it returns joins the Gloo group's ProcessGroup front as
// the backend for CUDA tensors (c10d_shim.cpp), as torch.distributed's "cpu:gloo,cuda:nccl" does.
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <chrono>
#include <string>

namespace {
thread_local std::string last_error;
}

extern "C" {

// The message of the last failed call on this thread.
const char* trainyard_nccl_last_error() { return last_error.c_str(); }

// A ProcessGroupNCCL over `store` (an `intrusive_ptr<c10d::Store>*`, keys under `prefix`) for CUDA
// device `device`, whose collectives time out after timeout_ms (the watchdog then aborts them). Returns
// a heap `intrusive_ptr<c10d::Backend>*`, or null with the message kept.
void* trainyard_nccl_backend_new(void* store, const char* prefix, int rank, int size, int device,
                                 int64_t timeout_ms) {
  try {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(
        prefix, *static_cast<c10::intrusive_ptr<c10d::Store>*>(store));
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = std::chrono::milliseconds(timeout_ms);
    opts->group_name = prefix;
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, rank, size, opts);
    // The run's device is current from here on (NCCL's streams and communicator are made on it).
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
    return new c10::intrusive_ptr<c10d::Backend>(pg);
  } catch (const c10::Error& e) {
    last_error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "unknown C++ exception";
  }
  return nullptr;
}

}  // extern "C"
