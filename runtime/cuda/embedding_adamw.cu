// runtime/cuda/embedding_adamw.cu: token embedding lookup (and its scatter
// backward) and the AdamW update.
//
// Embedding: out[i, :] = table[tok_i, :]; backward dtable[tok_i, :] += dout[i, :]
// with atomicAdd (tokens repeat; bf16 atomics need sm_80+, which every
// architecture we build for has).  The summation order of repeated tokens is
// therefore not fixed: results agree with the CPU to rounding, not bitwise.
// AdamW (decoupled weight decay, bias correction):
//   g = grad_scale grad;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr (m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps) + wd p)
// Layout: flat arrays, one thread per element (grid-stride).
#include "check.hpp"
#include "common.cuh"
#include "embedding_adamw.cuh"

namespace modar::gpu {

namespace {

// Grid-stride over the rows x d elements of a lookup: visit(i, token, column)
// with the element's flat index, its row's token (not range-checked) and its
// column.
template <typename Visit>
__device__ __forceinline__ void for_each_lookup_element(const int32_t* tokens, int64_t rows,
                                                        int64_t d, Visit visit) {
  const int64_t total = rows * d;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / d;
    visit(i, static_cast<int64_t>(tokens[row]), i - row * d);
  }
}

template <typename S, typename T>
__global__ void embedding_forward_kernel(const S* table, const int32_t* tokens, T* out,
                                         int64_t rows, int64_t d, int64_t vocab) {
  for_each_lookup_element(tokens, rows, d, [&](int64_t i, int64_t token, int64_t column) {
    const bool valid = token >= 0 && token < vocab;  // not range-checked on the GPU: zero row
    store_float(out + i, valid ? load_float(table + token * d + column) : 0.0f);
  });
}

__device__ __forceinline__ void atomic_accumulate(float* target, float value) {
  atomicAdd(target, value);
}
__device__ __forceinline__ void atomic_accumulate(__nv_bfloat16* target, float value) {
  atomicAdd(target, __float2bfloat16(value));
}

template <typename S, typename T>
__global__ void embedding_backward_kernel(const S* dout, const int32_t* tokens, T* dtable,
                                          int64_t rows, int64_t d, int64_t vocab) {
  for_each_lookup_element(tokens, rows, d, [&](int64_t i, int64_t token, int64_t column) {
    if (token >= 0 && token < vocab) {  // out-of-range tokens are skipped
      atomic_accumulate(dtable + token * d + column, load_float(dout + i));
    }
  });
}

template <typename G, typename L>
__global__ void adamw_kernel(AdamWLaunchParams p) {
  const G* grads = static_cast<const G*>(p.grads);
  L* lowp = static_cast<L*>(p.params_lowp);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = p.grad_scale * load_float(grads + i);
    const float m = p.beta1 * p.m[i] + (1.0f - p.beta1) * g;
    const float v = p.beta2 * p.v[i] + (1.0f - p.beta2) * g * g;
    p.m[i] = m;
    p.v[i] = v;
    const float m_hat = m / p.bias_correction1;
    const float v_hat = v / p.bias_correction2;
    float param = p.params[i];
    param -= p.learning_rate * (m_hat / (sqrtf(v_hat) + p.epsilon) + p.weight_decay * param);
    p.params[i] = param;
    if (lowp != nullptr) {
      store_float(lowp + i, param);
    }
  }
}

}  // namespace

template <template <typename, typename> class Launch, typename... Args>
void dispatch_two(Elem first, Elem second, Args... args) {
  using bf16 = __nv_bfloat16;
  if (first == Elem::fp32 && second == Elem::fp32) {
    Launch<float, float>::run(args...);
  } else if (first == Elem::fp32) {
    Launch<float, bf16>::run(args...);
  } else if (second == Elem::fp32) {
    Launch<bf16, float>::run(args...);
  } else {
    Launch<bf16, bf16>::run(args...);
  }
}

template <typename S, typename T>
struct EmbeddingForward {
  static void run(const void* table, const int32_t* tokens, void* out, int64_t rows, int64_t d,
                  int64_t vocab, cudaStream_t stream) {
    embedding_forward_kernel<<<grid_stride_blocks(rows * d, kRowThreads), kRowThreads, 0, stream>>>(
        static_cast<const S*>(table), tokens, static_cast<T*>(out), rows, d, vocab);
  }
};

template <typename S, typename T>
struct EmbeddingBackward {
  static void run(const void* dout, const int32_t* tokens, void* dtable, int64_t rows, int64_t d,
                  int64_t vocab, cudaStream_t stream) {
    embedding_backward_kernel<<<grid_stride_blocks(rows * d, kRowThreads), kRowThreads, 0,
                                stream>>>(static_cast<const S*>(dout), tokens,
                                          static_cast<T*>(dtable), rows, d, vocab);
  }
};

template <typename G, typename L>
struct AdamW {
  static void run(const AdamWLaunchParams& p, cudaStream_t stream) {
    adamw_kernel<G, L><<<grid_stride_blocks(p.count, kRowThreads), kRowThreads, 0, stream>>>(p);
  }
};

void launch_embedding_forward(const void* table, Elem table_type, const int32_t* tokens, void* out,
                              Elem out_type, int64_t rows, int64_t d, int64_t vocab,
                              cudaStream_t stream) {
  if (rows * d == 0)
    return;
  dispatch_two<EmbeddingForward>(table_type, out_type, table, tokens, out, rows, d, vocab, stream);
  MODAR_CUDA_CHECK_LAUNCH();
}

void launch_embedding_backward(const void* dout, Elem dout_type, const int32_t* tokens,
                               void* dtable, Elem dtable_type, int64_t rows, int64_t d,
                               int64_t vocab, cudaStream_t stream) {
  if (rows * d == 0)
    return;
  dispatch_two<EmbeddingBackward>(dout_type, dtable_type, dout, tokens, dtable, rows, d, vocab,
                                  stream);
  MODAR_CUDA_CHECK_LAUNCH();
}

void launch_adamw(const AdamWLaunchParams& p, cudaStream_t stream) {
  MODAR_GPU_REQUIRE("adamw_update", p.bias_correction1 > 0.0f && p.bias_correction2 > 0.0f,
                    "bias corrections must be > 0 (step >= 1), got " +
                        std::to_string(p.bias_correction1) + " and " +
                        std::to_string(p.bias_correction2));
  if (p.count == 0)
    return;
  dispatch_two<AdamW>(p.grad_type, p.lowp_type, p, stream);
  MODAR_CUDA_CHECK_LAUNCH();
}

}  // namespace modar::gpu
