// runtime/cuda/cudnn_attention.cpp: see cudnn_attention.hpp.
#include "cudnn_attention.hpp"

#include <dlfcn.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>

#include "attention_epilogue.cuh"
#include "caching_allocator.hpp"
#include "check.hpp"
#include "modar/base/errors.hpp"
#include "modar/runtime/cuda_backend.hpp"

#if MODAR_HAVE_CUDNN_FRONTEND
#include <cudnn_frontend.h>
// The frontend's dynamic-loading mode resolves every cuDNN symbol through
// this handle (set by cudnn_library() below).
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend
#endif

namespace modar::runtime {
namespace {

std::atomic<int> g_path{-1};
std::atomic<int64_t> g_cudnn_forward{0}, g_cudnn_backward{0};
std::atomic<int64_t> g_reference_forward{0}, g_reference_backward{0};
std::mutex g_reason_mutex;
std::string g_last_fallback;  // why the last reference call did not use cuDNN

CudaAttentionPath path_from_environment() {
  const char* value = std::getenv("MODAR_CUDA_ATTENTION");
  if (value == nullptr || std::strcmp(value, "") == 0 || std::strcmp(value, "auto") == 0) {
    return CudaAttentionPath::automatic;
  }
  if (std::strcmp(value, "cudnn") == 0) return CudaAttentionPath::cudnn;
  if (std::strcmp(value, "reference") == 0) return CudaAttentionPath::reference;
  throw BackendError(std::string("MODAR_CUDA_ATTENTION: '") + value +
                     "' is not one of auto, cudnn, reference");
}

}  // namespace

void set_cuda_attention_path(CudaAttentionPath path) {
  g_path.store(static_cast<int>(path));
}

CudaAttentionPath cuda_attention_path() {
  int value = g_path.load();
  if (value < 0) {
    value = static_cast<int>(path_from_environment());
    g_path.store(value);
  }
  return static_cast<CudaAttentionPath>(value);
}

CudaAttentionCounts cuda_attention_counts() {
  CudaAttentionCounts counts;
  counts.cudnn_forward = g_cudnn_forward.load();
  counts.cudnn_backward = g_cudnn_backward.load();
  counts.reference_forward = g_reference_forward.load();
  counts.reference_backward = g_reference_backward.load();
  return counts;
}

}  // namespace modar::runtime

namespace modar::gpu {
namespace {

struct CudnnLibrary {
  bool loaded = false;
  std::string status;
};

#if MODAR_HAVE_CUDNN_FRONTEND
std::string version_string(size_t v) {  // 91300 -> "9.13.0"
  return std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." +
         std::to_string(v % 100);
}
#endif

// dlopen libcudnn.so.9 once per process.
const CudnnLibrary& cudnn_library() {
  static const CudnnLibrary library = [] {
    CudnnLibrary l;
#if MODAR_HAVE_CUDNN_FRONTEND
    dlerror();
    void* handle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
    if (handle == nullptr) {
      const char* error = dlerror();
      l.status = std::string("cuDNN not found (") + (error ? error : "dlopen failed") + ")";
      return l;
    }
    cudnn_frontend::cudnn_dlhandle = handle;
    size_t version = 0;
    try {
      version = cudnn_frontend::detail::get_backend_version();
    } catch (const std::exception& e) {
      l.status = std::string("cuDNN unusable: ") + e.what();
      return l;
    }
    if (version < 90000) {
      l.status = "cuDNN " + version_string(version) + " is older than 9.0";
      return l;
    }
    l.loaded = true;
    l.status = "cuDNN " + version_string(version) + " (frontend " +
               std::to_string(CUDNN_FRONTEND_MAJOR_VERSION) + "." +
               std::to_string(CUDNN_FRONTEND_MINOR_VERSION) + "." +
               std::to_string(CUDNN_FRONTEND_PATCH_VERSION) + ")";
#else
    l.status =
        "built without the cuDNN frontend headers (run scripts/fetch-cudnn-frontend.sh and "
        "reconfigure)";
#endif
    return l;
  }();
  return library;
}

void note_fallback(const std::string& reason) {
  std::lock_guard<std::mutex> lock(runtime::g_reason_mutex);
  runtime::g_last_fallback = reason;
}

bool aligned16(const void* p) {
  return p == nullptr || (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// Why cuDNN cannot take these params ("" when it may).
std::string static_reason(const AttentionLaunchParams& p) {
  if (p.type != Elem::bf16) return "fp32 storage (cuDNN SDPA is bf16 / fp16 only)";
  if (p.d_head % 8 != 0 || p.d_head > 256) {
    return "d_head " + std::to_string(p.d_head) + " (cuDNN needs a multiple of 8, at most 256)";
  }
  if (p.kv_heads <= 0 || p.heads % p.kv_heads != 0) return "heads not a multiple of kv_heads";
  if (!aligned16(p.q) || !aligned16(p.k) || !aligned16(p.v) || !aligned16(p.out) ||
      !aligned16(p.dout) || !aligned16(p.dq) || !aligned16(p.dk) || !aligned16(p.dv)) {
    return "a tensor is not 16-byte aligned";
  }
  return "";
}

// True when cuDNN runs the call (reason empty and the path allows it); false
// for the reference kernel.  Throws when the path is `cudnn` and the reason
// says cuDNN cannot run it.
bool decide(const std::string& reason, bool backward) {
  const runtime::CudaAttentionPath path = runtime::cuda_attention_path();
  if (path == runtime::CudaAttentionPath::reference) return false;
  if (reason.empty()) return true;
  if (path == runtime::CudaAttentionPath::cudnn) {
    throw BackendError(std::string("attention_") + (backward ? "backward" : "forward") +
                       ": the cuDNN path is required (MODAR_CUDA_ATTENTION=cudnn) but " + reason);
  }
  note_fallback(reason);
  return false;
}

// Stream-ordered temporaries from the caching allocator, freed on scope exit
// (safe without a sync: every user is queued on the same stream first).
struct Scratch {
  CachingAllocator& allocator;
  void* pointer = nullptr;
  Scratch(CachingAllocator& a, size_t bytes) : allocator(a) {
    if (bytes > 0) pointer = allocator.allocate(bytes);
  }
  ~Scratch() { allocator.deallocate(pointer); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
};

}  // namespace

void count_reference_attention(bool backward) {
  (backward ? runtime::g_reference_backward : runtime::g_reference_forward).fetch_add(1);
}

namespace {

// True (and counted) when the process-wide path setting is `reference`.
bool reference_path_chosen(bool backward) {
  if (runtime::cuda_attention_path() != runtime::CudaAttentionPath::reference) return false;
  count_reference_attention(backward);
  return true;
}

// Why cuDNN cannot run the call, known before any plan: the params or the
// library ("" when it may).
std::string reason_before_plan(const AttentionLaunchParams& p) {
  std::string reason = static_reason(p);
  const CudnnLibrary& library = cudnn_library();
  if (reason.empty() && !library.loaded) reason = library.status;
  return reason;
}

}  // namespace

#if MODAR_HAVE_CUDNN_FRONTEND
namespace fe = cudnn_frontend;

namespace {

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kSeqQ, kSeqKv, kDo, kDq, kDk, kDv };

struct PlanKey {
  bool backward;
  int64_t batch, seq, heads, kv_heads, d_head;
  bool causal, ragged;
  uint32_t scale_bits;
  bool operator<(const PlanKey& o) const {
    return std::tie(backward, batch, seq, heads, kv_heads, d_head, causal, ragged, scale_bits) <
           std::tie(o.backward, o.batch, o.seq, o.heads, o.kv_heads, o.d_head, o.causal,
                    o.ragged, o.scale_bits);
  }
};

struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace_bytes = 0;
  bool supported = false;
  bool deterministic = false;
  std::string reason;
};

std::vector<int64_t> bshd_dims(int64_t b, int64_t h, int64_t s, int64_t d) {
  return {b, h, s, d};
}
// Our tensors are [b, s, h, d] row-major; cuDNN's logical order is (b, h, s, d).
std::vector<int64_t> bshd_strides(int64_t h, int64_t s, int64_t d) {
  return {s * h * d, d, h * d, 1};
}

}  // namespace
#endif

struct CudnnAttention::Impl {
  explicit Impl(CachingAllocator& a) : allocator(a) {}
  ~Impl() {
#if MODAR_HAVE_CUDNN_FRONTEND
    plans.clear();
    if (handle != nullptr) {
      fe::detail::destroy_handle(handle);
    }
#endif
  }
  CachingAllocator& allocator;
#if MODAR_HAVE_CUDNN_FRONTEND
  cudnnHandle_t handle = nullptr;
  std::string handle_error;
  std::map<PlanKey, Plan> plans;

  bool ensure_handle() {
    if (handle != nullptr) return true;
    if (!handle_error.empty()) return false;
    try {
      const cudnnStatus_t status = fe::detail::create_handle(&handle);
      if (status != CUDNN_STATUS_SUCCESS) {
        handle = nullptr;
        handle_error = "cudnnCreate failed with status " + std::to_string(status);
      }
    } catch (const std::exception& e) {
      handle = nullptr;
      handle_error = std::string("cudnnCreate: ") + e.what();
    }
    return handle != nullptr;
  }

  static bool good(fe::error_t status, const char* stage, Plan& plan) {
    if (status.is_good()) return true;
    plan.reason = std::string(stage) + ": " + status.get_message();
    return false;
  }

  void build(const PlanKey& key, float scale, bool deterministic, Plan& plan) {
    const int64_t b = key.batch, s = key.seq, h = key.heads, g = key.kv_heads, d = key.d_head;
    auto graph = std::make_shared<fe::graph::Graph>();
    graph->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto tensor = [&](const char* name, int64_t uid, int64_t heads) {
      return graph->tensor(fe::graph::Tensor_attributes()
                               .set_name(name)
                               .set_uid(uid)
                               .set_dim(bshd_dims(b, heads, s, d))
                               .set_stride(bshd_strides(heads, s, d)));
    };
    auto q = tensor("Q", kQ, h);
    auto k = tensor("K", kK, g);
    auto v = tensor("V", kV, g);
    std::shared_ptr<fe::graph::Tensor_attributes> seq_q, seq_kv;
    if (key.ragged) {
      auto lengths = [&](const char* name, int64_t uid) {
        return graph->tensor(fe::graph::Tensor_attributes()
                                 .set_name(name)
                                 .set_uid(uid)
                                 .set_dim({b, 1, 1, 1})
                                 .set_stride({1, 1, 1, 1})
                                 .set_data_type(fe::DataType_t::INT32));
      };
      seq_q = lengths("seq_q", kSeqQ);
      seq_kv = lengths("seq_kv", kSeqKv);
    }
    if (!key.backward) {
      auto options = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true);
      options.set_attn_scale(scale);
      if (key.causal) options.set_causal_mask(true);
      if (key.ragged) options.set_padding_mask(true).set_seq_len_q(seq_q).set_seq_len_kv(seq_kv);
      auto [o, stats] = graph->sdpa(q, k, v, options);
      o->set_output(true).set_uid(kO).set_dim(bshd_dims(b, h, s, d)).set_stride(
          bshd_strides(h, s, d));
      stats->set_output(true)
          .set_uid(kStats)
          .set_data_type(fe::DataType_t::FLOAT)
          .set_dim({b, h, s, 1})
          .set_stride({h * s, s, 1, 1});
    } else {
      auto o = tensor("O", kO, h);
      auto dout = tensor("dO", kDo, h);
      auto stats = graph->tensor(fe::graph::Tensor_attributes()
                                     .set_name("stats")
                                     .set_uid(kStats)
                                     .set_dim({b, h, s, 1})
                                     .set_stride({h * s, s, 1, 1})
                                     .set_data_type(fe::DataType_t::FLOAT));
      auto options = fe::graph::SDPA_backward_attributes().set_name("sdpa_backward");
      options.set_attn_scale(scale);
      if (key.causal) options.set_causal_mask(true);
      if (key.ragged) options.set_padding_mask(true).set_seq_len_q(seq_q).set_seq_len_kv(seq_kv);
      if (deterministic) options.set_deterministic_algorithm(true);
      auto [dq, dk, dv] = graph->sdpa_backward(q, k, v, o, dout, stats, options);
      dq->set_output(true).set_uid(kDq).set_dim(bshd_dims(b, h, s, d)).set_stride(
          bshd_strides(h, s, d));
      dk->set_output(true).set_uid(kDk).set_dim(bshd_dims(b, g, s, d)).set_stride(
          bshd_strides(g, s, d));
      dv->set_output(true).set_uid(kDv).set_dim(bshd_dims(b, g, s, d)).set_stride(
          bshd_strides(g, s, d));
    }
    if (!good(graph->validate(), "validate", plan)) return;
    if (!good(graph->build_operation_graph(handle), "build_operation_graph", plan)) return;
    if (!good(graph->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans",
              plan)) {
      return;
    }
    if (!good(graph->check_support(handle), "check_support", plan)) return;
    if (!good(graph->build_plans(handle), "build_plans", plan)) return;
    int64_t workspace = 0;
    if (!good(graph->get_workspace_size(workspace), "get_workspace_size", plan)) return;
    plan.graph = graph;
    plan.workspace_bytes = workspace;
    plan.supported = true;
    plan.deterministic = deterministic;
    plan.reason.clear();
  }

  Plan& plan_for(const AttentionLaunchParams& p, bool backward) {
    uint32_t scale_bits = 0;
    std::memcpy(&scale_bits, &p.softmax_scale, sizeof(scale_bits));
    const PlanKey key{backward, p.batch,  p.seq, p.heads, p.kv_heads, p.d_head, p.causal,
                      p.valid_lengths != nullptr, scale_bits};
    auto found = plans.find(key);
    if (found != plans.end()) return found->second;
    Plan& plan = plans[key];
    try {
      // The backward: deterministic first (repeated steps give identical
      // gradients), cuDNN's default algorithm where that is unsupported.
      build(key, p.softmax_scale, backward, plan);
      if (!plan.supported && backward) {
        const std::string deterministic_reason = plan.reason;
        build(key, p.softmax_scale, false, plan);
        if (!plan.supported) plan.reason += " (deterministic: " + deterministic_reason + ")";
      }
    } catch (const std::exception& e) {
      plan.supported = false;
      plan.graph.reset();
      plan.reason = std::string("cuDNN frontend: ") + e.what();
    }
    return plan;
  }

  // The plan cuDNN runs the call with, given the reason found before any
  // plan ("" = none); nullptr: the reference kernel runs (counted).  Throws
  // when the path is `cudnn` and cuDNN cannot run the call.
  Plan* plan_or_reference(const AttentionLaunchParams& p, bool backward, std::string reason) {
    Plan* plan = nullptr;
    if (reason.empty() && !ensure_handle()) reason = handle_error;
    if (reason.empty()) {
      plan = &plan_for(p, backward);
      if (!plan->supported) {
        reason = std::string("cuDNN SDPA ") + (backward ? "backward" : "forward") +
                 " unsupported: " + plan->reason;
      }
    }
    if (!decide(reason, backward)) {
      count_reference_attention(backward);
      return nullptr;
    }
    return plan;
  }

  // Runs `plan` on `stream` over the tensors of `pack` (with the clamped
  // lengths of ragged batches, when given).
  void execute(Plan& plan, std::unordered_map<int64_t, void*>& pack, int32_t* clamped,
               void* workspace, bool backward, cudaStream_t stream) {
    const std::string op = backward ? "attention_backward" : "attention_forward";
    if (clamped != nullptr) {
      pack[kSeqQ] = clamped;
      pack[kSeqKv] = clamped;
    }
    if (fe::detail::set_stream(handle, stream) != CUDNN_STATUS_SUCCESS) {
      throw BackendError(op + ": cudnnSetStream failed");
    }
    fe::error_t status = plan.graph->execute(handle, pack, workspace);
    if (!status.is_good()) {
      throw BackendError(op + ": cuDNN SDPA execute failed: " + status.get_message());
    }
  }
#endif
};

CudnnAttention::CudnnAttention(CachingAllocator& allocator)
    : impl_(std::make_unique<Impl>(allocator)) {}

CudnnAttention::~CudnnAttention() = default;

bool CudnnAttention::forward(const AttentionLaunchParams& p, cudaStream_t stream) {
  if (reference_path_chosen(false)) return false;
  const std::string reason = reason_before_plan(p);
#if MODAR_HAVE_CUDNN_FRONTEND
  Impl& m = *impl_;
  Plan* plan = m.plan_or_reference(p, false, reason);
  if (plan == nullptr) return false;
  Scratch lengths(m.allocator, p.valid_lengths ? sizeof(int32_t) * p.batch : 0);
  Scratch workspace(m.allocator, static_cast<size_t>(plan->workspace_bytes));
  int32_t* clamped = static_cast<int32_t*>(lengths.pointer);
  if (clamped != nullptr) launch_clamp_lengths(p.valid_lengths, clamped, p.batch, p.seq, stream);
  std::unordered_map<int64_t, void*> pack = {{kQ, const_cast<void*>(p.q)},
                                             {kK, const_cast<void*>(p.k)},
                                             {kV, const_cast<void*>(p.v)},
                                             {kO, p.out},
                                             {kStats, p.lse}};
  m.execute(*plan, pack, clamped, workspace.pointer, false, stream);
  if (clamped != nullptr) {
    launch_zero_padded_rows(p.out, p.lse, clamped, p.batch, p.seq, p.heads, p.heads * p.d_head,
                            stream);
  }
  runtime::g_cudnn_forward.fetch_add(1);
  return true;
#else
  decide(reason, false);
  count_reference_attention(false);
  return false;
#endif
}

bool CudnnAttention::backward(const AttentionLaunchParams& p, cudaStream_t stream) {
  if (reference_path_chosen(true)) return false;
  const std::string reason = reason_before_plan(p);
#if MODAR_HAVE_CUDNN_FRONTEND
  Impl& m = *impl_;
  Plan* plan = m.plan_or_reference(p, true, reason);
  if (plan == nullptr) return false;
  const size_t q_bytes = sizeof(uint16_t) * p.batch * p.seq * p.heads * p.d_head;
  const size_t kv_bytes = sizeof(uint16_t) * p.batch * p.seq * p.kv_heads * p.d_head;
  // cuDNN overwrites its gradients; the Backend contract accumulates.
  Scratch dq(m.allocator, q_bytes), dk(m.allocator, kv_bytes), dv(m.allocator, kv_bytes);
  Scratch lengths(m.allocator, p.valid_lengths ? sizeof(int32_t) * p.batch : 0);
  Scratch workspace(m.allocator, static_cast<size_t>(plan->workspace_bytes));
  int32_t* clamped = static_cast<int32_t*>(lengths.pointer);
  if (clamped != nullptr) launch_clamp_lengths(p.valid_lengths, clamped, p.batch, p.seq, stream);
  std::unordered_map<int64_t, void*> pack = {
      {kQ, const_cast<void*>(p.q)},     {kK, const_cast<void*>(p.k)},
      {kV, const_cast<void*>(p.v)},     {kO, p.out},
      {kDo, const_cast<void*>(p.dout)}, {kStats, p.lse},
      {kDq, dq.pointer},                {kDk, dk.pointer},
      {kDv, dv.pointer}};
  m.execute(*plan, pack, clamped, workspace.pointer, true, stream);
  launch_accumulate_rows(p.dq, dq.pointer, clamped, p.batch, p.seq, p.heads * p.d_head, stream);
  launch_accumulate_rows(p.dk, dk.pointer, clamped, p.batch, p.seq, p.kv_heads * p.d_head, stream);
  launch_accumulate_rows(p.dv, dv.pointer, clamped, p.batch, p.seq, p.kv_heads * p.d_head, stream);
  runtime::g_cudnn_backward.fetch_add(1);
  return true;
#else
  decide(reason, true);
  count_reference_attention(true);
  return false;
#endif
}

}  // namespace modar::gpu

namespace modar::runtime {

std::string cuda_attention_report() {
  const CudaAttentionPath path = cuda_attention_path();
  const char* path_name = path == CudaAttentionPath::automatic ? "auto"
                          : path == CudaAttentionPath::cudnn   ? "cudnn"
                                                               : "reference";
  const CudaAttentionCounts c = cuda_attention_counts();
  std::string line = std::string("attention path ") + path_name + "; " +
                     gpu::cudnn_library().status + "; calls: cudnn " +
                     std::to_string(c.cudnn_forward) + " fwd / " +
                     std::to_string(c.cudnn_backward) + " bwd, reference " +
                     std::to_string(c.reference_forward) + " fwd / " +
                     std::to_string(c.reference_backward) + " bwd";
  std::lock_guard<std::mutex> lock(g_reason_mutex);
  if (!g_last_fallback.empty()) line += "; last fallback: " + g_last_fallback;
  return line;
}

}  // namespace modar::runtime
