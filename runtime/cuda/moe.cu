// runtime/cuda/moe.cu: the Mixture-of-Experts ops on the GPU, with the
// semantics of runtime/cpu/moe.cpp (the reference; its header comment has the
// math).  Layout: tokens are rows; logits / probs [T, E] and gates [T, k] fp32;
// indices / slots [T, k] i32; expert rows [R, d] in Elem storage.
//
// Router ops: one thread per token (E and k are small: tens of experts, k <= 8
// in the papers); top-k by repeated selection, ties to the lower expert, NaN
// last, exactly the CPU comparator.  Loss ops: one block, fixed summation
// order (deterministic), double sums like the CPU.  Dispatch: one thread, a
// sequential scan (the keep/drop priority is serial by definition).  Row ops:
// one block per token or per assignment, threads over d; slots are distinct
// (dispatch), so no atomics.  Index values are not range-checked on the GPU
// (the CPU backend throws for them): an out-of-range slot or expert index is
// treated as dropped, so no kernel reads or writes out of bounds.
#include <cmath>

#include "check.hpp"
#include "common.cuh"
#include "moe.cuh"

namespace modar::gpu {
namespace {

constexpr int kLossThreads = 256;

__device__ __forceinline__ float order_key(float logit) {
  return isnan(logit) ? -INFINITY : logit;
}

__device__ float row_logsumexp(const float* l, int64_t experts) {
  float m = -INFINITY;
  for (int64_t e = 0; e < experts; ++e)
    m = fmaxf(m, l[e]);
  float sum = 0.0f;
  for (int64_t e = 0; e < experts; ++e)
    sum += expf(l[e] - m);
  return m + logf(sum);
}

__global__ void route_forward_kernel(MoeRouteParams p, const float* logits, float* probs,
                                     int32_t* indices, float* gates) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < p.tokens;
       t += stride) {
    const float* l = logits + t * p.experts;
    float* pr = probs + t * p.experts;
    float m = -INFINITY;
    for (int64_t e = 0; e < p.experts; ++e)
      m = fmaxf(m, l[e]);
    float sum = 0.0f;
    for (int64_t e = 0; e < p.experts; ++e) {
      pr[e] = expf(l[e] - m);
      sum += pr[e];
    }
    for (int64_t e = 0; e < p.experts; ++e)
      pr[e] /= sum;
    int32_t* idx = indices + t * p.k;
    float* g = gates + t * p.k;
    float gate_sum = 0.0f;
    for (int64_t j = 0; j < p.k; ++j) {
      int64_t best = -1;
      float best_key = 0.0f;
      for (int64_t e = 0; e < p.experts; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i)
          taken = taken || idx[i] == e;
        const float key = order_key(l[e]);
        if (!taken && (best < 0 || key > best_key)) {
          best = e;
          best_key = key;
        }
      }
      idx[j] = static_cast<int32_t>(best);
      g[j] = pr[best];
      gate_sum += g[j];
    }
    if (p.renormalize) {
      for (int64_t j = 0; j < p.k; ++j)
        g[j] /= gate_sum;
    }
  }
}

__global__ void route_backward_kernel(MoeRouteParams p, const float* dgates, const float* probs,
                                      const int32_t* indices, const float* gates, float* dlogits) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < p.tokens;
       t += stride) {
    const float* pr = probs + t * p.experts;
    const int32_t* idx = indices + t * p.k;
    const float* g = gates + t * p.k;
    const float* dg = dgates + t * p.k;
    float sum = 0.0f, inner = 0.0f;
    if (p.renormalize) {
      for (int64_t j = 0; j < p.k; ++j) {
        sum += pr[idx[j]];
        inner += dg[j] * g[j];
      }
    }
    // dp is nonzero only at the chosen experts (distinct by construction).
    auto dp_at = [&](int64_t e) {
      for (int64_t j = 0; j < p.k; ++j) {
        if (idx[j] == e)
          return p.renormalize ? (dg[j] - inner) / sum : dg[j];
      }
      return 0.0f;
    };
    float soft_inner = 0.0f;
    for (int64_t e = 0; e < p.experts; ++e)
      soft_inner += pr[e] * dp_at(e);
    float* dl = dlogits + t * p.experts;
    for (int64_t e = 0; e < p.experts; ++e)
      dl[e] += pr[e] * (dp_at(e) - soft_inner);
  }
}

// Block sum of doubles over kLossThreads threads, fixed tree order.
__device__ double block_sum_double(double v, double* scratch) {
  scratch[threadIdx.x] = v;
  __syncthreads();
  for (int half = kLossThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half)
      scratch[threadIdx.x] += scratch[threadIdx.x + half];
    __syncthreads();
  }
  const double total = scratch[0];
  __syncthreads();
  return total;
}

__global__ void __launch_bounds__(kLossThreads)
    aux_loss_forward_kernel(MoeRouteParams p, const float* logits, const float* probs,
                            const int32_t* indices, float* loss) {
  __shared__ double scratch[kLossThreads];
  const int64_t assignments = p.tokens * p.k;
  double aux = 0.0;
  for (int64_t e = threadIdx.x; e < p.experts; e += blockDim.x) {
    double count = 0.0, mean_p = 0.0;
    for (int64_t i = 0; i < assignments; ++i)
      count += indices[i] == e ? 1.0 : 0.0;
    for (int64_t t = 0; t < p.tokens; ++t)
      mean_p += static_cast<double>(probs[t * p.experts + e]);
    aux += (count / static_cast<double>(assignments)) * (mean_p / static_cast<double>(p.tokens));
  }
  double z = 0.0;
  for (int64_t t = threadIdx.x; t < p.tokens; t += blockDim.x) {
    const double lse = static_cast<double>(row_logsumexp(logits + t * p.experts, p.experts));
    z += lse * lse;
  }
  aux = block_sum_double(aux, scratch);
  z = block_sum_double(z, scratch);
  if (threadIdx.x == 0) {
    loss[0] = static_cast<float>(static_cast<double>(p.experts) * aux);
    loss[1] = static_cast<float>(z / static_cast<double>(p.tokens));
  }
}

__global__ void expert_counts_kernel(MoeRouteParams p, const int32_t* indices, float* counts) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t assignments = p.tokens * p.k;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < p.experts;
       e += stride) {
    float count = 0.0f;
    for (int64_t i = 0; i < assignments; ++i)
      count += indices[i] == e ? 1.0f : 0.0f;
    counts[e] = count;
  }
}

__global__ void aux_loss_backward_kernel(MoeRouteParams p, float per_assignment, float dz_scale,
                                         const float* logits, const float* probs,
                                         const float* counts, float* dlogits) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < p.tokens;
       t += stride) {
    const float* pr = probs + t * p.experts;
    float* dl = dlogits + t * p.experts;
    if (per_assignment != 0.0f) {
      // d aux / d p_te = E f_e / T, the same for every token.
      float inner = 0.0f;
      for (int64_t e = 0; e < p.experts; ++e)
        inner += pr[e] * counts[e] * per_assignment;
      for (int64_t e = 0; e < p.experts; ++e)
        dl[e] += pr[e] * (counts[e] * per_assignment - inner);
    }
    if (dz_scale != 0.0f) {
      const float scale = dz_scale * row_logsumexp(logits + t * p.experts, p.experts);
      for (int64_t e = 0; e < p.experts; ++e)
        dl[e] += scale * pr[e];
    }
  }
}

__global__ void dispatch_kernel(int64_t tokens, int64_t k, int64_t experts, int64_t capacity,
                                const int32_t* indices, int32_t* counts, int32_t* slots,
                                int32_t* cursor) {
  for (int64_t e = 0; e < experts; ++e)
    counts[e] = 0;
  for (int64_t j = 0; j < k; ++j) {
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t e = indices[t * k + j];
      const bool kept = e >= 0 && e < experts && (capacity == 0 || counts[e] < capacity);
      if (kept)
        ++counts[e];
      slots[t * k + j] = kept ? 0 : -1;
    }
  }
  int32_t offset = 0;
  for (int64_t e = 0; e < experts; ++e) {
    cursor[e] = offset;
    offset += counts[e];
  }
  for (int64_t i = 0; i < tokens * k; ++i) {
    if (slots[i] == 0)
      slots[i] = cursor[indices[i]]++;
  }
}

__device__ __forceinline__ bool valid_slot(const MoeRowsParams& p, int64_t slot) {
  return slot >= 0 && slot < p.rows;
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    permute_forward_kernel(MoeRowsParams p, const T* x, T* out) {
  const int64_t assignment = blockIdx.x;  // t * k + j
  const int64_t slot = p.slots[assignment];
  if (!valid_slot(p, slot))
    return;
  const T* src = x + (assignment / p.k) * p.d;
  T* dst = out + slot * p.d;
  for (int64_t c = threadIdx.x; c < p.d; c += blockDim.x)
    dst[c] = src[c];
}

// dst[t] = (accumulate ? dst[t] : 0) + sum_j weight_j rows[slot_j], in fp32,
// stored once (the CPU's fp32 staging for bf16).
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    gather_slots_kernel(MoeRowsParams p, const T* rows, const float* weights, bool accumulate,
                        T* dst) {
  const int64_t t = blockIdx.x;
  const int32_t* slots = p.slots + t * p.k;
  T* out = dst + t * p.d;
  for (int64_t c = threadIdx.x; c < p.d; c += blockDim.x) {
    float acc = accumulate ? load_float(out + c) : 0.0f;
    for (int64_t j = 0; j < p.k; ++j) {
      const int64_t slot = slots[j];
      if (valid_slot(p, slot)) {
        const float w = weights != nullptr ? weights[t * p.k + j] : 1.0f;
        acc += w * load_float(rows + slot * p.d + c);
      }
    }
    store_float(out + c, acc);
  }
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    unpermute_backward_kernel(MoeRowsParams p, const T* dout, const T* y, const float* gates, T* dy,
                              float* dgates) {
  __shared__ float scratch[32];
  const int64_t assignment = blockIdx.x;
  const int64_t slot = p.slots[assignment];
  if (!valid_slot(p, slot))
    return;
  const T* g_out = dout + (assignment / p.k) * p.d;
  const float gate = gates[assignment];
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < p.d; c += blockDim.x) {
    const float g = load_float(g_out + c);
    if (dy != nullptr) {
      T* target = dy + slot * p.d + c;
      store_float(target, load_float(target) + gate * g);
    }
    if (dgates != nullptr)
      dot += g * load_float(y + slot * p.d + c);
  }
  if (dgates != nullptr) {
    dot = block_sum(dot, scratch);
    if (threadIdx.x == 0)
      dgates[assignment] += dot;
  }
}

void check_route(const char* op, const MoeRouteParams& p) {
  MODAR_GPU_REQUIRE(
      op, p.tokens >= 0 && p.experts > 0 && p.k >= 1 && p.k <= p.experts,
      "need tokens >= 0 and 1 <= k <= experts, got tokens = " + std::to_string(p.tokens) +
          ", experts = " + std::to_string(p.experts) + ", k = " + std::to_string(p.k));
}

unsigned check_rows(const char* op, const MoeRowsParams& p, int64_t blocks) {
  MODAR_GPU_REQUIRE(op, p.tokens >= 0 && p.k >= 1 && p.d > 0 && p.rows >= 0,
                    "need tokens, rows >= 0, k >= 1 and d > 0, got tokens = " +
                        std::to_string(p.tokens) + ", k = " + std::to_string(p.k) +
                        ", d = " + std::to_string(p.d) + ", rows = " + std::to_string(p.rows));
  return one_block_per_row(op, "tokens (or tokens * k)", blocks);
}

// Launch `kernel<float>` or `kernel<__nv_bfloat16>` by the rows' storage type.
template <template <typename> class Launch, typename... Args>
void by_type(Elem type, Args&&... args) {
  if (type == Elem::fp32)
    Launch<float>::run(args...);
  else
    Launch<__nv_bfloat16>::run(args...);
}

template <typename T>
struct PermuteForward {
  static void run(unsigned blocks, const MoeRowsParams& p, const void* x, void* out,
                  cudaStream_t stream) {
    permute_forward_kernel<<<blocks, kRowThreads, 0, stream>>>(p, static_cast<const T*>(x),
                                                               static_cast<T*>(out));
  }
};

template <typename T>
struct GatherSlots {
  static void run(unsigned blocks, const MoeRowsParams& p, const void* rows, const float* weights,
                  bool accumulate, void* dst, cudaStream_t stream) {
    gather_slots_kernel<<<blocks, kRowThreads, 0, stream>>>(p, static_cast<const T*>(rows), weights,
                                                            accumulate, static_cast<T*>(dst));
  }
};

template <typename T>
struct UnpermuteBackward {
  static void run(unsigned blocks, const MoeRowsParams& p, const void* dout, const void* y,
                  const float* gates, void* dy, float* dgates, cudaStream_t stream) {
    unpermute_backward_kernel<<<blocks, kRowThreads, 0, stream>>>(p, static_cast<const T*>(dout),
                                                                  static_cast<const T*>(y), gates,
                                                                  static_cast<T*>(dy), dgates);
  }
};

}  // namespace

void launch_moe_route_forward(const MoeRouteParams& p, const float* logits, float* probs,
                              int32_t* indices, float* gates, cudaStream_t stream) {
  check_route("moe_route_forward", p);
  if (p.tokens == 0)
    return;
  route_forward_kernel<<<grid_stride_blocks(p.tokens, kRowThreads), kRowThreads, 0, stream>>>(
      p, logits, probs, indices, gates);
  MODAR_CUDA_CHECK_LAUNCH();
}

void launch_moe_route_backward(const MoeRouteParams& p, const float* dgates, const float* probs,
                               const int32_t* indices, const float* gates, float* dlogits,
                               cudaStream_t stream) {
  check_route("moe_route_backward", p);
  if (p.tokens == 0)
    return;
  route_backward_kernel<<<grid_stride_blocks(p.tokens, kRowThreads), kRowThreads, 0, stream>>>(
      p, dgates, probs, indices, gates, dlogits);
  MODAR_CUDA_CHECK_LAUNCH();
}

void launch_moe_aux_loss_forward(const MoeRouteParams& p, const float* logits, const float* probs,
                                 const int32_t* indices, float* loss, cudaStream_t stream) {
  check_route("moe_aux_loss_forward", p);
  MODAR_GPU_REQUIRE("moe_aux_loss_forward", p.tokens > 0,
                    "need tokens > 0, got " + std::to_string(p.tokens));
  aux_loss_forward_kernel<<<1, kLossThreads, 0, stream>>>(p, logits, probs, indices, loss);
  MODAR_CUDA_CHECK_LAUNCH();
}

void launch_moe_aux_loss_backward(const MoeRouteParams& p, double daux, double dz,
                                  const float* logits, const float* probs, const int32_t* indices,
                                  float* dlogits, float* counts_scratch, cudaStream_t stream) {
  check_route("moe_aux_loss_backward", p);
  if (p.tokens == 0 || (daux == 0.0 && dz == 0.0))
    return;
  const double tokens = static_cast<double>(p.tokens);
  const float per_assignment = static_cast<float>(daux * static_cast<double>(p.experts) /
                                                  (tokens * static_cast<double>(p.k) * tokens));
  const float dz_scale = static_cast<float>(2.0 * dz / tokens);
  expert_counts_kernel<<<grid_stride_blocks(p.experts, kRowThreads), kRowThreads, 0, stream>>>(
      p, indices, counts_scratch);
  MODAR_CUDA_CHECK_LAUNCH();
  aux_loss_backward_kernel<<<grid_stride_blocks(p.tokens, kRowThreads), kRowThreads, 0, stream>>>(
      p, per_assignment, dz_scale, logits, probs, counts_scratch, dlogits);
  MODAR_CUDA_CHECK_LAUNCH();
}

void launch_moe_dispatch(int64_t tokens, int64_t k, int64_t experts, int64_t capacity,
                         const int32_t* indices, int32_t* counts, int32_t* slots,
                         int32_t* cursor_scratch, cudaStream_t stream) {
  MODAR_GPU_REQUIRE(
      "moe_dispatch", tokens >= 0 && k >= 1 && experts >= 1 && capacity >= 0,
      "need tokens, capacity >= 0 and k, experts >= 1, got tokens = " + std::to_string(tokens) +
          ", k = " + std::to_string(k) + ", experts = " + std::to_string(experts) +
          ", capacity = " + std::to_string(capacity));
  dispatch_kernel<<<1, 1, 0, stream>>>(tokens, k, experts, capacity, indices, counts, slots,
                                       cursor_scratch);
  MODAR_CUDA_CHECK_LAUNCH();
}

void launch_moe_permute_forward(const MoeRowsParams& p, const void* x, void* out,
                                cudaStream_t stream) {
  const unsigned blocks = check_rows("moe_permute_forward", p, p.tokens * p.k);
  // Rows that no slot names are zero.
  MODAR_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(p.rows * p.d * elem_bytes(p.type)),
                                   stream));
  if (blocks == 0)
    return;
  by_type<PermuteForward>(p.type, blocks, p, x, out, stream);
  MODAR_CUDA_CHECK_LAUNCH();
}

void launch_moe_permute_backward(const MoeRowsParams& p, const void* dout, void* dx,
                                 cudaStream_t stream) {
  const unsigned blocks = check_rows("moe_permute_backward", p, p.tokens);
  if (blocks == 0)
    return;
  by_type<GatherSlots>(p.type, blocks, p, dout, static_cast<const float*>(nullptr), true, dx,
                       stream);
  MODAR_CUDA_CHECK_LAUNCH();
}

void launch_moe_unpermute_forward(const MoeRowsParams& p, const void* y, const float* gates,
                                  void* out, cudaStream_t stream) {
  const unsigned blocks = check_rows("moe_unpermute_forward", p, p.tokens);
  if (blocks == 0)
    return;
  by_type<GatherSlots>(p.type, blocks, p, y, gates, false, out, stream);
  MODAR_CUDA_CHECK_LAUNCH();
}

void launch_moe_unpermute_backward(const MoeRowsParams& p, const void* dout, const void* y,
                                   const float* gates, void* dy, float* dgates,
                                   cudaStream_t stream) {
  const unsigned blocks = check_rows("moe_unpermute_backward", p, p.tokens * p.k);
  if (blocks == 0 || (dy == nullptr && dgates == nullptr))
    return;
  by_type<UnpermuteBackward>(p.type, blocks, p, dout, y, gates, dy, dgates, stream);
  MODAR_CUDA_CHECK_LAUNCH();
}

}  // namespace modar::gpu
