// PyTorch's c10d reached from Rust: the TCPStore rendezvous, ProcessGroupGloo's collectives (and
// ProcessGroupNCCL's for CUDA tensors, from nccl_shim.cpp when a run uses NCCL) and DDP's
// Reducer (gradients all-reduced bucket by bucket during the backward pass), through a C ABI. Tensors arrive as tch's `C_tensor`, which is an `at::Tensor*`, so nothing is copied. Every entry
// point catches C++ exceptions, keeps the message for trainyard_c10d_last_error, and returns a status (or a
// null handle), so nothing unwinds into Rust.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace {
thread_local std::string last_error;

template <typename F>
int guarded(F&& f) {
  try {
    f();
    return 0;
  } catch (const c10::Error& e) {
    last_error = e.what_without_backtrace();  // PyTorch's message, without its C++ frames
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "unknown C++ exception";
  }
  return 1;
}

struct Store {
  c10::intrusive_ptr<c10d::Store> store;
};

struct Group {
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  // ProcessGroupNCCL (nccl_shim.cpp) for CUDA tensors when the run uses NCCL, else null: Gloo then
  // takes CUDA tensors too, through host copies.
  c10::intrusive_ptr<c10d::Backend> cuda;
  // The same backends behind the ProcessGroup front that DDP's Reducer talks to (as torch.distributed
  // registers them), so both issue their collectives in one sequence.
  c10::intrusive_ptr<c10d::ProcessGroup> front;

  // The backend for a collective on `t`: NCCL for CUDA tensors when there is one, else Gloo.
  c10d::Backend& backend_for(const at::Tensor& t) const {
    if (cuda && t.is_cuda()) return *cuda;
    return *pg;
  }
};

struct Pending {
  c10::intrusive_ptr<c10d::Work> work;
};

c10d::ReduceOp reduce_op(int op) {
  switch (op) {
    case 1:
      return c10d::ReduceOp::MAX;
    case 2:
      return c10d::ReduceOp::MIN;
    default:
      return c10d::ReduceOp::SUM;
  }
}

std::chrono::milliseconds ms(int64_t v) { return std::chrono::milliseconds(v); }

// Sum `t` (a contiguous float tensor, on the host or a GPU) over every rank in place, waiting for the
// result: NCCL for CUDA tensors when the group has it, else Gloo.
void all_reduce_sum(Group& g, at::Tensor& t) {
  std::vector<at::Tensor> list{t};
  g.backend_for(t).allreduce(list)->wait();
}

// SyncBatchNorm (PyTorch's torch.nn.SyncBatchNorm, for an (N, C, ...) input): the batch statistics are
// those of the whole global batch, and so is the backward's reduction, so N ranks with batches of B
// normalise exactly as one process with a batch of N x B. Statistics run in float32 on the input's
// device, whatever its dtype; parameter gradients are this rank's (DDP averages them).
struct SyncBatchNorm : public torch::autograd::Function<SyncBatchNorm> {
  static std::vector<int64_t> reduce_dims(const at::Tensor& x) {
    std::vector<int64_t> dims{0};
    for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
    return dims;
  }
  static std::vector<int64_t> channel_view(const at::Tensor& x) {
    std::vector<int64_t> shape(x.dim(), 1);
    shape[1] = x.size(1);
    return shape;
  }

  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const at::Tensor& weight, const at::Tensor& bias,
                            at::Tensor running_mean, at::Tensor running_var, double momentum,
                            double eps, int64_t group) {
    auto& g = *reinterpret_cast<Group*>(group);
    auto x = input.to(at::kFloat).contiguous();
    const int64_t channels = x.size(1);
    const auto dims = reduce_dims(x);
    const auto view = channel_view(x);
    // Pass 1: the global count and sum give the global mean.
    auto sums = at::cat({x.sum(dims), at::full({1}, double(x.numel() / channels), x.options())});
    all_reduce_sum(g, sums);
    const double count = sums[channels].item<double>();
    auto mean = sums.narrow(0, 0, channels) / count;
    // Pass 2: squared deviations from the global mean give the global (biased) variance.
    auto centered = x - mean.view(view);
    auto squares = (centered * centered).sum(dims).contiguous();
    all_reduce_sum(g, squares);
    auto var = squares / count;
    auto invstd = (var + eps).rsqrt();
    if (running_mean.defined()) {
      running_mean.mul_(1.0 - momentum).add_(mean.to(running_mean.scalar_type()), momentum);
      auto unbiased = var * (count / std::max(count - 1.0, 1.0));
      running_var.mul_(1.0 - momentum).add_(unbiased.to(running_var.scalar_type()), momentum);
    }
    ctx->save_for_backward({x, weight, mean, invstd});
    ctx->saved_data["count"] = count;
    ctx->saved_data["group"] = group;
    auto scale = (invstd * weight.to(at::kFloat)).view(view);
    auto out = centered * scale + bias.to(at::kFloat).view(view);
    return out.to(input.scalar_type());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto x = saved[0], weight = saved[1], mean = saved[2], invstd = saved[3];
    const double count = ctx->saved_data["count"].toDouble();
    auto& g = *reinterpret_cast<Group*>(ctx->saved_data["group"].toInt());
    const int64_t channels = x.size(1);
    const auto dims = reduce_dims(x);
    const auto view = channel_view(x);
    auto dy = grads[0].to(at::kFloat).contiguous();
    auto xhat = (x - mean.view(view)) * invstd.view(view);
    auto sum_dy = dy.sum(dims);
    auto sum_dy_xhat = (dy * xhat).sum(dims);
    auto global = at::cat({sum_dy, sum_dy_xhat}).contiguous();
    all_reduce_sum(g, global);
    auto mean_dy = (global.narrow(0, 0, channels) / count).view(view);
    auto mean_dy_xhat = (global.narrow(0, channels, channels) / count).view(view);
    auto dx = (weight.to(at::kFloat) * invstd).view(view) * (dy - mean_dy - xhat * mean_dy_xhat);
    return {dx.to(grads[0].scalar_type()), sum_dy_xhat.to(weight.scalar_type()),
            sum_dy.to(weight.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};
}  // namespace

extern "C" {

// The message of the last failed call on this thread (valid until the next failure).
const char* trainyard_c10d_last_error() { return last_error.c_str(); }

// Connect to (or, with is_server, host) the TCPStore at host:port. `world` is the number of clients that
// will connect; the server does not wait for them (the caller counts arrivals and names the missing).
void* trainyard_store_new(const char* host, int port, int is_server, int world, int64_t timeout_ms) {
  Store* out = nullptr;
  guarded([&] {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<std::uint16_t>(port);
    opts.isServer = is_server != 0;
    opts.numWorkers = static_cast<std::size_t>(world);
    opts.waitWorkers = false;
    opts.timeout = ms(timeout_ms);
    auto store = c10::make_intrusive<c10d::TCPStore>(std::string(host), opts);
    out = new Store{store};
  });
  return out;
}

void trainyard_store_free(void* store) { delete static_cast<Store*>(store); }

int trainyard_store_set(void* store, const char* key, const uint8_t* data, size_t len) {
  return guarded([&] {
    std::vector<uint8_t> value(data, data + len);
    static_cast<Store*>(store)->store->set(key, value);
  });
}

// Waits for `key` (up to the store's timeout). The value is malloc'ed; free it with trainyard_free.
int trainyard_store_get(void* store, const char* key, uint8_t** data, size_t* len) {
  return guarded([&] {
    auto value = static_cast<Store*>(store)->store->get(key);
    *len = value.size();
    *data = static_cast<uint8_t*>(std::malloc(value.size() > 0 ? value.size() : 1));
    if (!value.empty()) std::memcpy(*data, value.data(), value.size());
  });
}

// Atomically add `delta` to the integer at `key`; returns the new value in *out.
int trainyard_store_add(void* store, const char* key, int64_t delta, int64_t* out) {
  return guarded([&] { *out = static_cast<Store*>(store)->store->add(key, delta); });
}

// Does `key` exist right now (no waiting)?
int trainyard_store_check(void* store, const char* key, int* out) {
  return guarded([&] { *out = static_cast<Store*>(store)->store->check({key}) ? 1 : 0; });
}

void trainyard_free(void* p) { std::free(p); }

// The store's `intrusive_ptr<c10d::Store>*`, for the NCCL shim (which builds its backend over it).
void* trainyard_store_intrusive(void* store) { return &static_cast<Store*>(store)->store; }

// Free an `intrusive_ptr<c10d::Backend>*` from the NCCL shim (a group keeps its own reference).
void trainyard_backend_free(void* backend) {
  delete static_cast<c10::intrusive_ptr<c10d::Backend>*>(backend);
}

// A Gloo process group over the store (keys under `prefix`), bound to the interface that reaches
// `hostname` (this node's address), with a timeout for every collective. `cuda_backend` (an
// `intrusive_ptr<c10d::Backend>*` from the NCCL shim, or null) takes the collectives on CUDA tensors.
void* trainyard_gloo_new(void* store, const char* prefix, int rank, int size, const char* hostname,
                         int64_t timeout_ms, void* cuda_backend) {
  Group* out = nullptr;
  guarded([&] {
    auto prefixed =
        c10::make_intrusive<c10d::PrefixStore>(prefix, static_cast<Store*>(store)->store);
    auto opts = c10d::ProcessGroupGloo::Options::create(ms(timeout_ms));
    if (hostname != nullptr && std::strlen(hostname) > 0) {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(hostname));
    } else {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size, opts);
    auto front = c10::make_intrusive<c10d::ProcessGroup>(prefixed, rank, size);
    const auto gloo = c10d::ProcessGroup::BackendType::GLOO;
    front->setDefaultBackend(gloo);
    front->setBackend(c10::DeviceType::CPU, gloo, pg);
    c10::intrusive_ptr<c10d::Backend> cuda;
    if (cuda_backend != nullptr) {
      cuda = *static_cast<c10::intrusive_ptr<c10d::Backend>*>(cuda_backend);
      front->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, cuda);
    } else {
      front->setBackend(c10::DeviceType::CUDA, gloo, pg);
    }
    front->setGroupName(prefix);
    out = new Group{pg, cuda, front};
  });
  return out;
}

// Free a group; an NCCL backend is shut down first (its communicators and watchdog), as
// torch.distributed.destroy_process_group does, instead of being torn down by its destructor.
void trainyard_gloo_free(void* group) {
  auto* g = static_cast<Group*>(group);
  if (g->cuda) guarded([&] { g->cuda->shutdown(); });
  delete g;
}

// Start an all-reduce of `n` tensors in place (op 0 sum, 1 max, 2 min). Returns a pending handle.
void* trainyard_all_reduce(void* group, at::Tensor** tensors, int n, int op) {
  Pending* out = nullptr;
  guarded([&] {
    std::vector<at::Tensor> list;
    for (int i = 0; i < n; ++i) list.push_back(*tensors[i]);
    c10d::AllreduceOptions opts;
    opts.reduceOp = reduce_op(op);
    out = new Pending{static_cast<Group*>(group)->backend_for(list.at(0)).allreduce(list, opts)};
  });
  return out;
}

// Start a broadcast of `tensor` from `root`, in place.
void* trainyard_broadcast(void* group, at::Tensor* tensor, int root) {
  Pending* out = nullptr;
  guarded([&] {
    std::vector<at::Tensor> list{*tensor};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    out = new Pending{static_cast<Group*>(group)->backend_for(*tensor).broadcast(list, opts)};
  });
  return out;
}

// Start an all-gather: `output` (world × input's numel, flat) receives every rank's `input`, in rank order.
void* trainyard_all_gather(void* group, at::Tensor* output, at::Tensor* input) {
  Pending* out = nullptr;
  guarded([&] {
    out = new Pending{
        static_cast<Group*>(group)->backend_for(*input)._allgather_base(*output, *input)};
  });
  return out;
}

// Start a reduce-scatter: `input` (world × output's numel, flat) is reduced across ranks and rank r keeps
// chunk r in `output`.
void* trainyard_reduce_scatter(void* group, at::Tensor* output, at::Tensor* input, int op) {
  Pending* out = nullptr;
  guarded([&] {
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = reduce_op(op);
    out = new Pending{
        static_cast<Group*>(group)->backend_for(*input)._reduce_scatter_base(*output, *input, opts)};
  });
  return out;
}

void* trainyard_barrier(void* group) {
  Pending* out = nullptr;
  guarded([&] { out = new Pending{static_cast<Group*>(group)->pg->barrier()}; });
  return out;
}

// SyncBatchNorm in training mode over `group` (see SyncBatchNorm above); updates the running statistics
// in place. Returns a new tensor, or null on failure (a peer gone: the collective's message is kept).
at::Tensor* trainyard_sync_batch_norm(void* group, at::Tensor* input, at::Tensor* weight,
                                      at::Tensor* bias, at::Tensor* running_mean,
                                      at::Tensor* running_var, double momentum, double eps) {
  at::Tensor* out = nullptr;
  guarded([&] {
    out = new at::Tensor(SyncBatchNorm::apply(*input, *weight, *bias, *running_mean, *running_var,
                                              momentum, eps, reinterpret_cast<int64_t>(group)));
  });
  return out;
}

// DDP's Reducer over `group` for `n` parameters (leaf tensors that require grad, in the order the
// model defines them; names for its messages). Buckets are assigned as torch.nn.parallel.
// DistributedDataParallel assigns them: without find_unused, one bucket until the first backward pass
// has shown the order gradients become ready, then buckets of `bucket_cap` bytes in that order (the
// first one small); with find_unused, buckets of `bucket_cap` bytes in reverse definition order.
void* trainyard_reducer_new(void* group, at::Tensor** params, const char** names, int n,
                            int64_t bucket_cap, int find_unused, int gradient_as_bucket_view) {
  c10d::Reducer* out = nullptr;
  guarded([&] {
    std::vector<at::Tensor> list;
    std::unordered_map<size_t, std::string> param_names;
    for (int i = 0; i < n; ++i) {
      list.push_back(*params[i]);
      param_names[static_cast<size_t>(i)] = names[i];
    }
    const int64_t first_cap =
        bucket_cap == c10d::kDefaultBucketBytesCap ? c10d::kDefaultFirstBucketBytes : bucket_cap;
    std::vector<size_t> limits;
    if (find_unused != 0) {
      limits = {static_cast<size_t>(first_cap), static_cast<size_t>(bucket_cap)};
    } else {
      limits = {std::numeric_limits<size_t>::max()};
    }
    std::vector<bool> sparse(list.size(), false);
    auto assignment = c10d::compute_bucket_assignment_by_size(list, limits, sparse);
    auto buckets = std::get<0>(assignment);
    // Gradients become ready last layer first.
    std::reverse(buckets.begin(), buckets.end());
    out = new c10d::Reducer(list, buckets, static_cast<Group*>(group)->front, sparse, bucket_cap,
                            find_unused != 0, gradient_as_bucket_view != 0, param_names, first_cap,
                            /*skip_all_reduce_unused_params=*/false,
                            /*use_python_reducer=*/false, /*bucket_bytes_cap_list=*/{});
  });
  return out;
}

void trainyard_reducer_free(void* reducer) {
  guarded([&] { delete static_cast<c10d::Reducer*>(reducer); });
}

// Before a forward pass whose backward pass reduces: rebuild the buckets in the order the first
// backward pass produced gradients (once; a broadcast from rank 0), and start the iteration's timer.
int trainyard_reducer_prepare_forward(void* reducer) {
  return guarded([&] {
    auto* r = static_cast<c10d::Reducer*>(reducer);
    r->prepare_for_forward();
    r->rebuild_buckets();
  });
}

// After that forward pass: the next backward pass reduces, each bucket as soon as its gradients are
// ready; with find_unused, parameters not reached from `outputs` are marked ready (as zero) at once.
int trainyard_reducer_prepare_backward(void* reducer, at::Tensor** outputs, int n) {
  return guarded([&] {
    std::vector<at::Tensor> list;
    for (int i = 0; i < n; ++i) list.push_back(*outputs[i]);
    static_cast<c10d::Reducer*>(reducer)->prepare_for_backward(list);
  });
}

// Fails (with DDP's message) when the last armed backward pass did not reduce every bucket.
int trainyard_reducer_check_finalized(void* reducer) {
  return guarded([&] { static_cast<c10d::Reducer*>(reducer)->check_finalized(); });
}

// Wait for a pending collective (the group's timeout applies) and free the handle, success or not.
int trainyard_wait(void* pending) {
  auto* p = static_cast<Pending*>(pending);
  int status = guarded([&] {
    if (!p->work->wait()) {
      throw std::runtime_error("the collective was aborted");
    }
    // wait() rethrows a failure; exception() covers work that records one without throwing. Not
    // isSuccess(): NCCL's work throws "deprecated" from it.
    if (auto e = p->work->exception()) std::rethrow_exception(e);
  });
  delete p;
  return status;
}

}  // extern "C"
