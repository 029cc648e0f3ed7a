// runtime/cuda/gather_scatter.cu: MoD gather of routed rows and the scaled
// scatter-add of the block's delta into the residual (docs/model.md MoD steps 3 and 5).
//
// Layout: x [batch, seq_len, d], packed rows [batch, k, d], indices [batch, k]
// (ascending original positions, -1 = unused slot of a ragged selection).
// One block per packed row (batch * k blocks), threads stride over d.  Within a
// sequence the indices are distinct (top-k output), so scatters never collide
// and no atomics are needed.  Index values are not range-checked on the GPU
// (the CPU backend throws for them); a position outside [0, seq_len) is
// treated like -1, so it cannot read or write out of bounds.
//   forward  x[p] += g(r_p) delta_j                       (only the delta is scaled)
//   backward ddelta_j += g(r_p) dx[p],  dr_p += g'(r_p) <dx[p], delta_j>
// with g(r) = r (g' = 1) or g = sigmoid (g' = g (1 - g)).
#include "check.hpp"
#include "common.cuh"
#include "gather_scatter.cuh"

namespace modar::gpu {

namespace {

struct GateValue {
  float g;
  float g_prime;
};

__device__ __forceinline__ GateValue gate_of(float r, GateKind gate) {
  if (gate == GateKind::linear) {
    return {r, 1.0f};
  }
  const float s = sigmoid(r);
  return {s, s * (1.0f - s)};
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    gather_forward_kernel(RoutedRowsParams p, const T* x, T* out) {
  const int64_t packed_row = blockIdx.x;  // b * k + j
  const int64_t b = packed_row / p.k;
  const int32_t position = p.indices[packed_row];
  T* out_row = out + packed_row * p.d;
  if (position < 0 || position >= p.seq_len) {
    for (int64_t c = threadIdx.x; c < p.d; c += blockDim.x) {
      store_float(out_row + c, 0.0f);
    }
    return;
  }
  const T* x_row = x + (b * p.seq_len + position) * p.d;
  for (int64_t c = threadIdx.x; c < p.d; c += blockDim.x) {
    out_row[c] = x_row[c];
  }
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    gather_backward_kernel(RoutedRowsParams p, const T* dout, T* dx) {
  const int64_t packed_row = blockIdx.x;
  const int64_t b = packed_row / p.k;
  const int32_t position = p.indices[packed_row];
  if (position < 0 || position >= p.seq_len) {
    return;
  }
  const T* dout_row = dout + packed_row * p.d;
  T* dx_row = dx + (b * p.seq_len + position) * p.d;
  for (int64_t c = threadIdx.x; c < p.d; c += blockDim.x) {
    store_float(dx_row + c, load_float(dx_row + c) + load_float(dout_row + c));
  }
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    scatter_forward_kernel(RoutedRowsParams p, T* x, const float* router_logits, const T* delta,
                           GateKind gate) {
  const int64_t packed_row = blockIdx.x;
  const int64_t b = packed_row / p.k;
  const int32_t position = p.indices[packed_row];
  if (position < 0 || position >= p.seq_len) {
    return;
  }
  const int64_t token = b * p.seq_len + position;
  const float g = gate_of(router_logits[token], gate).g;
  const T* delta_row = delta + packed_row * p.d;
  T* x_row = x + token * p.d;
  for (int64_t c = threadIdx.x; c < p.d; c += blockDim.x) {
    store_float(x_row + c, load_float(x_row + c) + g * load_float(delta_row + c));
  }
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    scatter_backward_kernel(RoutedRowsParams p, const T* dx, const float* router_logits,
                            const T* delta, GateKind gate, T* ddelta, float* drouter_logits) {
  __shared__ float scratch[32];
  const int64_t packed_row = blockIdx.x;
  const int64_t b = packed_row / p.k;
  const int32_t position = p.indices[packed_row];
  if (position < 0 || position >= p.seq_len) {
    return;  // uniform over the block
  }
  const int64_t token = b * p.seq_len + position;
  const GateValue gv = gate_of(router_logits[token], gate);
  const T* dx_row = dx + token * p.d;
  const T* delta_row = delta + packed_row * p.d;
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < p.d; c += blockDim.x) {
    const float dx_value = load_float(dx_row + c);
    dot += dx_value * load_float(delta_row + c);
    if (ddelta != nullptr) {
      T* target = ddelta + packed_row * p.d + c;
      store_float(target, load_float(target) + gv.g * dx_value);
    }
  }
  if (drouter_logits != nullptr) {
    dot = block_sum(dot, scratch);  // drouter_logits is uniform: all threads reach it
    if (threadIdx.x == 0) {
      drouter_logits[token] += gv.g_prime * dot;
    }
  }
}

unsigned check_rows(const char* op, const RoutedRowsParams& p) {
  MODAR_GPU_REQUIRE(
      op, p.batch >= 0 && p.k >= 0 && p.d > 0 && p.seq_len > 0,
      "need batch, k >= 0 and d, seq_len > 0, got batch = " + std::to_string(p.batch) +
          ", k = " + std::to_string(p.k) + ", d = " + std::to_string(p.d) +
          ", seq_len = " + std::to_string(p.seq_len));
  return one_block_per_row(op, "batch * k", p.batch * p.k);
}

}  // namespace

void launch_gather_rows_forward(const RoutedRowsParams& p, const void* x, void* out,
                                cudaStream_t stream) {
  const unsigned blocks = check_rows("gather_rows_forward", p);
  if (blocks == 0)
    return;
  launch_typed(p.type, [&](auto tag) {
    using T = decltype(tag);
    gather_forward_kernel<<<blocks, kRowThreads, 0, stream>>>(p, static_cast<const T*>(x),
                                                              static_cast<T*>(out));
  });
}

void launch_gather_rows_backward(const RoutedRowsParams& p, const void* dout, void* dx,
                                 cudaStream_t stream) {
  const unsigned blocks = check_rows("gather_rows_backward", p);
  if (blocks == 0)
    return;
  launch_typed(p.type, [&](auto tag) {
    using T = decltype(tag);
    gather_backward_kernel<<<blocks, kRowThreads, 0, stream>>>(p, static_cast<const T*>(dout),
                                                               static_cast<T*>(dx));
  });
}

void launch_scatter_add_scaled_forward(const RoutedRowsParams& p, void* x,
                                       const float* router_logits, const void* delta, GateKind gate,
                                       cudaStream_t stream) {
  const unsigned blocks = check_rows("scatter_add_scaled_forward", p);
  if (blocks == 0)
    return;
  launch_typed(p.type, [&](auto tag) {
    using T = decltype(tag);
    scatter_forward_kernel<<<blocks, kRowThreads, 0, stream>>>(p, static_cast<T*>(x), router_logits,
                                                               static_cast<const T*>(delta), gate);
  });
}

void launch_scatter_add_scaled_backward(const RoutedRowsParams& p, const void* dx,
                                        const float* router_logits, const void* delta,
                                        GateKind gate, void* ddelta, float* drouter_logits,
                                        cudaStream_t stream) {
  const unsigned blocks = check_rows("scatter_add_scaled_backward", p);
  if (blocks == 0 || (ddelta == nullptr && drouter_logits == nullptr))
    return;
  launch_typed(p.type, [&](auto tag) {
    using T = decltype(tag);
    scatter_backward_kernel<<<blocks, kRowThreads, 0, stream>>>(
        p, static_cast<const T*>(dx), router_logits, static_cast<const T*>(delta), gate,
        static_cast<T*>(ddelta), drouter_logits);
  });
}

}  // namespace modar::gpu
