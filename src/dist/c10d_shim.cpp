// PyTorch's c10d reached from Rust: the TCPStore rendezvous and ProcessGroupGloo's collectives, through a
// C ABI. Tensors arrive as tch's `C_tensor`, which is an `at::Tensor*`, so nothing is copied. Every entry
// point catches C++ exceptions, keeps the message for trainyard_c10d_last_error, and returns a status (or a
// null handle), so nothing unwinds into Rust.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

namespace {
thread_local std::string last_error;

template <typename F>
int guarded(F&& f) {
  try {
    f();
    return 0;
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
}  // namespace

extern "C" {

// The message of the last failed call on this thread (valid until the next failure).
const char* trainyard_c10d_last_error() { return last_error.c_str(); }

// Connect to (or, with is_server, host) the TCPStore at host:port. `world` is the number of clients that
// will connect; the server waits for them up to timeout_ms.
void* trainyard_store_new(const char* host, int port, int is_server, int world, int64_t timeout_ms) {
  Store* out = nullptr;
  guarded([&] {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<std::uint16_t>(port);
    opts.isServer = is_server != 0;
    opts.numWorkers = static_cast<std::size_t>(world);
    opts.waitWorkers = true;
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

// A Gloo process group over the store (keys under `prefix`), bound to the interface that reaches
// `hostname` (this node's address), with a timeout for every collective.
void* trainyard_gloo_new(void* store, const char* prefix, int rank, int size, const char* hostname,
                         int64_t timeout_ms) {
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
    out = new Group{pg};
  });
  return out;
}

void trainyard_gloo_free(void* group) { delete static_cast<Group*>(group); }

// Start an all-reduce of `n` tensors in place (op 0 sum, 1 max, 2 min). Returns a pending handle.
void* trainyard_all_reduce(void* group, at::Tensor** tensors, int n, int op) {
  Pending* out = nullptr;
  guarded([&] {
    std::vector<at::Tensor> list;
    for (int i = 0; i < n; ++i) list.push_back(*tensors[i]);
    c10d::AllreduceOptions opts;
    opts.reduceOp = reduce_op(op);
    out = new Pending{static_cast<Group*>(group)->pg->allreduce(list, opts)};
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
    out = new Pending{static_cast<Group*>(group)->pg->broadcast(list, opts)};
  });
  return out;
}

// Start an all-gather: `output` (world × input's numel, flat) receives every rank's `input`, in rank order.
void* trainyard_all_gather(void* group, at::Tensor* output, at::Tensor* input) {
  Pending* out = nullptr;
  guarded([&] {
    out = new Pending{static_cast<Group*>(group)->pg->_allgather_base(*output, *input)};
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
    out = new Pending{static_cast<Group*>(group)->pg->_reduce_scatter_base(*output, *input, opts)};
  });
  return out;
}

void* trainyard_barrier(void* group) {
  Pending* out = nullptr;
  guarded([&] { out = new Pending{static_cast<Group*>(group)->pg->barrier()}; });
  return out;
}

// Wait for a pending collective (the group's timeout applies) and free the handle, success or not.
int trainyard_wait(void* pending) {
  auto* p = static_cast<Pending*>(pending);
  int status = guarded([&] {
    if (!p->work->wait()) {
      throw std::runtime_error("the collective was aborted");
    }
    if (!p->work->isSuccess()) {
      auto e = p->work->exception();
      if (e) std::rethrow_exception(e);
    }
  });
  delete p;
  return status;
}

}  // extern "C"
