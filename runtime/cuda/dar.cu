// runtime/cuda/dar.cu: DAR coefficient heads, stream mix, transport and gated
// write (docs/model.md AttnRes/DAR, docs/dar_math.md 3.2, 5.3).
//
// Coefficients, per token t (n streams, o = outputs):
//   z = [R_0; ...; R_{n-1}] * rstd_z,  rstd_z = (mean over n*d of R^2 + eps)^(-1/2)
//   u = z W  (W [n d, o]),  c_i = scale[group(i)] u_i + bias_i
//   alpha_j = sigmoid(c_j), beta_j = 2 sigmoid(c_{n+j}),
//   transport: n = 2: rho = sigmoid(c_{2n}), M = [[rho, 1-rho], [1-rho, rho]];
//              n > 2: M = Sinkhorn(exp(c_M)), c_M row-major n x n, each
//              iteration normalises rows then columns.
// Backward: dc_alpha = dalpha a (1 - a), dc_beta = dbeta b (1 - b/2),
//   n = 2: drho = dM00 + dM11 - dM01 - dM10, dc_rho = drho rho (1 - rho);
//   n > 2: the Sinkhorn normalisations are differentiated in reverse order
//   (row normalisation y = x / s: dx = (dy - <dy, y>) / s, same for columns),
//   each one's input replayed from exp(c).
//   dbias += dc, dscale_g += sum_{i in g} dc_i u_i, du = dc scale,
//   dW += z^T du (over tokens), dz = W du, dR = rstd (dz - z mean(dz z)).
// Mix: h[t] = sum_j alpha[t, j] R[j, t].  Write: out[j, t] = sum_k M[t, j, k]
//   P[k, t] + beta[t, j] y[t]; backward dP[k] += sum_j M[j, k] dout[j],
//   dM[j, k] += <dout[j], P[k]>, dbeta[j] += <dout[j], y>, dy += sum_j beta_j dout[j].
//
// Layout: streams-major [n][T][d]; per-token stats [T][n], [T][n][n].
// One block (kRowThreads) per token; the <= 24 per-token reductions are done
// together (block_sum_many).  The coefficient math of a token is done by
// thread 0 (at most 24 scalars and a 4 x 4 Sinkhorn).  Reductions over tokens
// (dW, dbias, dscale) go through fp32 per-token rows / per-split partials and
// a column sum: deterministic, no atomics.
#include "check.hpp"
#include "common.cuh"
#include "dar.cuh"

namespace modar::gpu {

namespace {

constexpr int kMaxN = kDarMaxStreams;
constexpr int kMaxOut = kDarMaxOutputs;

__device__ __forceinline__ int coefficient_group(int i, int n) {
  return i < n ? 0 : (i < 2 * n ? 1 : 2);
}

// exp(c - max(c)), as the CPU backend: the shift cancels in the
// normalisations, and (as on the CPU) its gradient is taken as zero.
__device__ void sinkhorn_start(const float* c, int n, int iterations, float* m) {
  float max_logit = c[0];
  for (int e = 1; e < n * n; ++e)
    max_logit = fmaxf(max_logit, c[e]);
  for (int e = 0; e < n * n; ++e)
    m[e] = expf(c[e] - max_logit);
}

__device__ void normalise_rows(float* m, int n) {
  for (int i = 0; i < n; ++i) {
    float sum = 0.0f;
    for (int j = 0; j < n; ++j)
      sum += m[i * n + j];
    for (int j = 0; j < n; ++j)
      m[i * n + j] /= sum;
  }
}

__device__ void normalise_columns(float* m, int n) {
  for (int j = 0; j < n; ++j) {
    float sum = 0.0f;
    for (int i = 0; i < n; ++i)
      sum += m[i * n + j];
    for (int i = 0; i < n; ++i)
      m[i * n + j] /= sum;
  }
}

// State after `half_steps` normalisations (row, column, row, ...) of exp(c).
__device__ void sinkhorn_state(const float* c, int n, int iterations, int half_steps, float* m) {
  sinkhorn_start(c, n, iterations, m);
  for (int step = 0; step < half_steps; ++step) {
    if (step % 2 == 0) {
      normalise_rows(m, n);
    } else {
      normalise_columns(m, n);
    }
  }
}

// Gradient of c given dM (single thread).  The iterations are replayed from
// the start for every reverse step (O(iterations^2) tiny n x n work) so that
// no per-thread history array is needed: a history would put kilobytes of
// local memory on every thread of the launch.
__device__ void sinkhorn_backward(const float* c, int n, int iterations, const float* dm,
                                  float* dc) {
  float grad[kMaxN * kMaxN];
  float x[kMaxN * kMaxN];
  float y[kMaxN * kMaxN];
  for (int e = 0; e < n * n; ++e)
    grad[e] = dm[e];
  for (int step = 2 * iterations - 1; step >= 0; --step) {
    sinkhorn_state(c, n, iterations, step, x);  // input of this normalisation
    for (int e = 0; e < n * n; ++e)
      y[e] = x[e];
    const bool rows = step % 2 == 0;
    if (rows) {
      normalise_rows(y, n);
    } else {
      normalise_columns(y, n);
    }
    // y = x / s over each row (or column): dx = (dy - <dy, y>) / s
    for (int a = 0; a < n; ++a) {
      float sum = 0.0f;
      float dot = 0.0f;
      for (int b = 0; b < n; ++b) {
        const int e = rows ? a * n + b : b * n + a;
        sum += x[e];
        dot += grad[e] * y[e];
      }
      for (int b = 0; b < n; ++b) {
        const int e = rows ? a * n + b : b * n + a;
        grad[e] = (grad[e] - dot) / sum;
      }
    }
  }
  sinkhorn_start(c, n, iterations, x);
  for (int e = 0; e < n * n; ++e)
    dc[e] = grad[e] * x[e];  // d exp(c) = exp(c) dc
}

// Per token: rstd_z and u = z W, summed over the block.  Returns rstd_z; u in
// every thread.  With use_saved_rstd (backward) z uses the saved z_rstd, as
// the CPU backend does.
template <typename T>
__device__ float coefficient_projection(const DarCoefficientLaunchParams& p, int64_t t,
                                        float (&u)[kMaxOut], float* scratch_many, float* scratch,
                                        bool use_saved_rstd) {
  const T* retrieved = static_cast<const T*>(p.retrieved);
  const int outputs = static_cast<int>(p.outputs);
  float sum_sq = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxOut; ++i)
    u[i] = 0.0f;
  for (int64_t jc = threadIdx.x; jc < p.streams * p.d; jc += blockDim.x) {
    const int64_t j = jc / p.d;
    const int64_t c = jc - j * p.d;
    const float r = load_float(retrieved + (j * p.tokens + t) * p.d + c);
    sum_sq += r * r;
    const float* w_row = p.weight + jc * p.outputs;
#pragma unroll
    for (int i = 0; i < kMaxOut; ++i) {
      if (i < outputs)
        u[i] += r * w_row[i];
    }
  }
  sum_sq = block_sum(sum_sq, scratch);
  const float rstd =
      use_saved_rstd ? p.z_rstd[t] : rsqrtf(sum_sq / static_cast<float>(p.streams * p.d) + p.eps);
  block_sum_many(u, outputs, scratch_many);
#pragma unroll
  for (int i = 0; i < kMaxOut; ++i)
    u[i] *= rstd;  // z W = rstd (R W)
  return rstd;
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    coefficients_forward_kernel(DarCoefficientLaunchParams p) {
  __shared__ float scratch[32];
  __shared__ float scratch_many[32 * kMaxOut];
  const int64_t t = blockIdx.x;
  float u[kMaxOut];
  const float rstd = coefficient_projection<T>(p, t, u, scratch_many, scratch, false);
  if (threadIdx.x != 0) {
    return;
  }
  const int n = static_cast<int>(p.streams);
  float c[kMaxOut];
#pragma unroll
  for (int i = 0; i < kMaxOut; ++i) {
    c[i] = i < p.outputs ? p.scale[coefficient_group(i, n)] * u[i] + p.bias[i] : 0.0f;
  }
  p.z_rstd[t] = rstd;
  for (int j = 0; j < n; ++j) {
    p.alpha[t * n + j] = sigmoid(c[j]);
    p.beta[t * n + j] = 2.0f * sigmoid(c[n + j]);
  }
  if (p.transport != nullptr) {
    float* m = p.transport + t * n * n;
    if (n == 2) {
      const float rho = sigmoid(c[2 * n]);
      m[0] = rho;
      m[1] = 1.0f - rho;
      m[2] = 1.0f - rho;
      m[3] = rho;
    } else {
      float local[kMaxN * kMaxN];
      sinkhorn_start(c + 2 * n, n, p.sinkhorn_iterations, local);
      for (int it = 0; it < p.sinkhorn_iterations; ++it) {
        normalise_rows(local, n);
        normalise_columns(local, n);
      }
      for (int e = 0; e < n * n; ++e)
        m[e] = local[e];
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    coefficients_backward_kernel(DarCoefficientLaunchParams p) {
  __shared__ float scratch[32];
  __shared__ float scratch_many[32 * kMaxOut];
  __shared__ float du_shared[kMaxOut];
  __shared__ float dz_dot_shared;
  const int64_t t = blockIdx.x;
  const int n = static_cast<int>(p.streams);
  const int outputs = static_cast<int>(p.outputs);
  float u[kMaxOut];
  const float rstd = coefficient_projection<T>(p, t, u, scratch_many, scratch, true);
  if (threadIdx.x == 0) {
    float dc[kMaxOut];
    for (int i = 0; i < kMaxOut; ++i)
      dc[i] = 0.0f;
    for (int j = 0; j < n; ++j) {
      const float a = p.alpha[t * n + j];
      const float b = p.beta[t * n + j];
      dc[j] = p.dalpha != nullptr ? p.dalpha[t * n + j] * a * (1.0f - a) : 0.0f;
      dc[n + j] = p.dbeta != nullptr ? p.dbeta[t * n + j] * b * (1.0f - 0.5f * b) : 0.0f;
    }
    if (outputs > 2 * n && p.dtransport != nullptr) {
      const float* dm = p.dtransport + t * n * n;
      if (n == 2) {
        const float rho = p.transport[t * n * n];
        dc[2 * n] = (dm[0] + dm[3] - dm[1] - dm[2]) * rho * (1.0f - rho);
      } else {
        float c_m[kMaxN * kMaxN];
        for (int e = 0; e < n * n; ++e) {
          c_m[e] = p.scale[2] * u[2 * n + e] + p.bias[2 * n + e];
        }
        sinkhorn_backward(c_m, n, p.sinkhorn_iterations, dm, dc + 2 * n);
      }
    }
    float group_sums[3] = {0.0f, 0.0f, 0.0f};
    for (int i = 0; i < outputs; ++i) {
      const int g = coefficient_group(i, n);
      group_sums[g] += dc[i] * u[i];
      du_shared[i] = dc[i] * p.scale[g];
      p.token_dc[t * outputs + i] = dc[i];
    }
    for (int g = 0; g < 3; ++g)
      p.token_dscale[t * 3 + g] = group_sums[g];
  }
  __syncthreads();
  if (p.dretrieved == nullptr) {
    return;  // uniform
  }
  // dz = W du;  dR = rstd (dz - z mean(dz z)),  z = R rstd.
  const T* retrieved = static_cast<const T*>(p.retrieved);
  T* dretrieved = static_cast<T*>(p.dretrieved);
  float dot = 0.0f;
  for (int64_t jc = threadIdx.x; jc < p.streams * p.d; jc += blockDim.x) {
    const int64_t j = jc / p.d;
    const int64_t c = jc - j * p.d;
    const float* w_row = p.weight + jc * p.outputs;
    float dz = 0.0f;
    for (int i = 0; i < outputs; ++i)
      dz += w_row[i] * du_shared[i];
    dot += dz * load_float(retrieved + (j * p.tokens + t) * p.d + c) * rstd;
  }
  dot = block_sum(dot, scratch);
  if (threadIdx.x == 0)
    dz_dot_shared = dot;
  __syncthreads();
  const float mean_dot = dz_dot_shared / static_cast<float>(p.streams * p.d);
  for (int64_t jc = threadIdx.x; jc < p.streams * p.d; jc += blockDim.x) {
    const int64_t j = jc / p.d;
    const int64_t c = jc - j * p.d;
    const int64_t index = (j * p.tokens + t) * p.d + c;
    const float* w_row = p.weight + jc * p.outputs;
    float dz = 0.0f;
    for (int i = 0; i < outputs; ++i)
      dz += w_row[i] * du_shared[i];
    const float z = load_float(retrieved + index) * rstd;
    store_float(dretrieved + index, load_float(dretrieved + index) + rstd * (dz - z * mean_dot));
  }
}

// partial[split][jc * outputs + i] = sum_t z[j, t, c] du[t, i] over the split's tokens,
// du = dc * scale[group]; one thread per row jc of W.
template <typename T>
__global__ void coefficients_dweight_partial_kernel(DarCoefficientLaunchParams p) {
  const int64_t jc = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int n = static_cast<int>(p.streams);
  const int outputs = static_cast<int>(p.outputs);
  if (jc >= p.streams * p.d) {
    return;
  }
  const int64_t j = jc / p.d;
  const int64_t c = jc - j * p.d;
  const int64_t per_split = ceil_div(p.tokens, gridDim.y);
  const int64_t begin = blockIdx.y * per_split;
  const int64_t end = min(p.tokens, begin + per_split);
  const T* retrieved = static_cast<const T*>(p.retrieved);
  float scales[kMaxOut];
  float acc[kMaxOut];
#pragma unroll
  for (int i = 0; i < kMaxOut; ++i) {
    scales[i] = i < outputs ? p.scale[coefficient_group(i, n)] : 0.0f;
    acc[i] = 0.0f;
  }
  for (int64_t t = begin; t < end; ++t) {
    const float z = load_float(retrieved + (j * p.tokens + t) * p.d + c) * p.z_rstd[t];
#pragma unroll
    for (int i = 0; i < kMaxOut; ++i) {
      if (i < outputs)
        acc[i] += z * p.token_dc[t * outputs + i] * scales[i];
    }
  }
  float* out = p.partial + (blockIdx.y * p.streams * p.d + jc) * p.outputs;
#pragma unroll
  for (int i = 0; i < kMaxOut; ++i) {
    if (i < outputs)
      out[i] = acc[i];
  }
}

// out[c] += sum_rows matrix[row, c]  (small column counts: one thread per column)
__global__ void column_sum_kernel(const float* matrix, int64_t rows, int64_t columns, float* out) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= columns) {
    return;
  }
  float sum = 0.0f;
  for (int64_t row = 0; row < rows; ++row)
    sum += matrix[row * columns + c];
  out[c] += sum;
}

template <typename T>
__global__ void mix_forward_kernel(DarMixParams p) {
  const int64_t total = p.tokens * p.d;
  const T* retrieved = static_cast<const T*>(p.retrieved);
  T* out = static_cast<T*>(p.out);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / p.d;
    float sum = 0.0f;
    for (int64_t j = 0; j < p.streams; ++j) {
      sum += p.alpha[t * p.streams + j] * load_float(retrieved + j * total + i);
    }
    store_float(out + i, sum);
  }
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads) mix_backward_kernel(DarMixParams p) {
  __shared__ float scratch_many[32 * kMaxN];
  const int64_t t = blockIdx.x;
  const int64_t total = p.tokens * p.d;
  const int n = static_cast<int>(p.streams);
  const T* retrieved = static_cast<const T*>(p.retrieved);
  const T* dout = static_cast<const T*>(p.dout) + t * p.d;
  T* dretrieved = static_cast<T*>(p.dretrieved);
  float dots[kMaxN];
#pragma unroll
  for (int j = 0; j < kMaxN; ++j)
    dots[j] = 0.0f;
  for (int64_t c = threadIdx.x; c < p.d; c += blockDim.x) {
    const float g = load_float(dout + c);
#pragma unroll
    for (int j = 0; j < kMaxN; ++j) {
      if (j < n) {
        const int64_t index = j * total + t * p.d + c;
        dots[j] += g * load_float(retrieved + index);
        if (dretrieved != nullptr) {
          store_float(dretrieved + index, load_float(dretrieved + index) + p.alpha[t * n + j] * g);
        }
      }
    }
  }
  if (p.dalpha != nullptr) {
    block_sum_many(dots, n, scratch_many);
    if (threadIdx.x == 0) {
      for (int j = 0; j < n; ++j)
        p.dalpha[t * n + j] += dots[j];
    }
  }
}

template <typename T>
__global__ void write_forward_kernel(DarWriteParams p) {
  const int64_t plane = p.tokens * p.d;
  const int64_t total = p.streams * plane;
  const int n = static_cast<int>(p.streams);
  const T* partial = static_cast<const T*>(p.partial);
  const T* y = static_cast<const T*>(p.y);
  T* out = static_cast<T*>(p.out);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = i / plane;
    const int64_t tc = i - j * plane;
    const int64_t t = tc / p.d;
    float value = 0.0f;
    if (partial != nullptr) {
      const float* m_row = p.transport + (t * n + j) * n;
      for (int k = 0; k < n; ++k)
        value += m_row[k] * load_float(partial + k * plane + tc);
    }
    if (y != nullptr) {
      value += p.beta[t * n + j] * load_float(y + tc);
    }
    store_float(out + i, value);
  }
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads) write_backward_kernel(DarWriteParams p) {
  constexpr int kMaxDots = kMaxN * kMaxN + kMaxN;
  __shared__ float scratch_many[32 * kMaxDots];
  const int64_t t = blockIdx.x;
  const int64_t plane = p.tokens * p.d;
  const int n = static_cast<int>(p.streams);
  const T* partial = static_cast<const T*>(p.partial);
  const T* y = static_cast<const T*>(p.y);
  const T* dout = static_cast<const T*>(p.dout);
  T* dpartial = static_cast<T*>(p.dpartial);
  T* dy = static_cast<T*>(p.dy);
  const float* m = p.transport != nullptr ? p.transport + t * n * n : nullptr;
  // dots[j * kMaxN + k] = <dout[j], P[k]>, dots[kMaxN * kMaxN + j] = <dout[j], y>
  float dots[kMaxDots];
#pragma unroll
  for (int i = 0; i < kMaxDots; ++i)
    dots[i] = 0.0f;
  for (int64_t c = threadIdx.x; c < p.d; c += blockDim.x) {
    const int64_t tc = t * p.d + c;
    float g[kMaxN];
    float dy_sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxN; ++j) {
      g[j] = j < n ? load_float(dout + j * plane + tc) : 0.0f;
      if (j < n && y != nullptr)
        dy_sum += p.beta[t * n + j] * g[j];
    }
#pragma unroll
    for (int k = 0; k < kMaxN; ++k) {
      if (k < n && partial != nullptr) {
        const float pk = load_float(partial + k * plane + tc);
        float dp = 0.0f;
#pragma unroll
        for (int j = 0; j < kMaxN; ++j) {
          if (j < n) {
            dots[j * kMaxN + k] += g[j] * pk;
            dp += m[j * n + k] * g[j];
          }
        }
        if (dpartial != nullptr) {
          store_float(dpartial + k * plane + tc, load_float(dpartial + k * plane + tc) + dp);
        }
      }
    }
    if (y != nullptr) {
      const float y_c = load_float(y + tc);
#pragma unroll
      for (int j = 0; j < kMaxN; ++j) {
        if (j < n)
          dots[kMaxN * kMaxN + j] += g[j] * y_c;
      }
      if (dy != nullptr) {
        store_float(dy + tc, load_float(dy + tc) + dy_sum);
      }
    }
  }
  // Entries j * kMaxN + k (< kMaxN * kMaxN) and kMaxN * kMaxN + j: reduce them all.
  block_sum_many(dots, kMaxDots, scratch_many);
  if (threadIdx.x == 0) {
    for (int j = 0; j < n; ++j) {
      if (p.dtransport != nullptr && partial != nullptr) {
        for (int k = 0; k < n; ++k)
          p.dtransport[(t * n + j) * n + k] += dots[j * kMaxN + k];
      }
      if (p.dbeta != nullptr && y != nullptr)
        p.dbeta[t * n + j] += dots[kMaxN * kMaxN + j];
    }
  }
}

void check_streams(const char* op, int64_t streams) {
  MODAR_GPU_REQUIRE(op, streams >= 1 && streams <= kDarMaxStreams,
                    "streams must be in [1, " + std::to_string(kDarMaxStreams) +
                        "] on the CUDA backend, got " + std::to_string(streams));
}

void check_coefficients(const char* op, const DarCoefficientLaunchParams& p) {
  check_streams(op, p.streams);
  MODAR_GPU_REQUIRE(op, p.outputs >= 2 * p.streams && p.outputs <= kDarMaxOutputs,
                    "outputs must be in [2n, " + std::to_string(kDarMaxOutputs) + "], got " +
                        std::to_string(p.outputs));
  MODAR_GPU_REQUIRE(
      op, p.sinkhorn_iterations >= 0 && p.sinkhorn_iterations <= kDarMaxSinkhornIterations,
      "sinkhorn_iterations must be in [0, " + std::to_string(kDarMaxSinkhornIterations) +
          "], got " + std::to_string(p.sinkhorn_iterations));
}

}  // namespace

void launch_dar_coefficients_forward(const DarCoefficientLaunchParams& p, cudaStream_t stream) {
  check_coefficients("dar_coefficients_forward", p);
  if (p.tokens == 0)
    return;
  const unsigned blocks = one_block_per_row("dar_coefficients_forward", "tokens", p.tokens);
  launch_typed(p.type, [&](auto tag) {
    coefficients_forward_kernel<decltype(tag)><<<blocks, kRowThreads, 0, stream>>>(p);
  });
}

void launch_dar_coefficients_backward(const DarCoefficientLaunchParams& p, cudaStream_t stream) {
  check_coefficients("dar_coefficients_backward", p);
  MODAR_GPU_REQUIRE("dar_coefficients_backward",
                    p.token_dc != nullptr && p.token_dscale != nullptr &&
                        (p.dweight == nullptr || p.partial != nullptr),
                    "missing scratch buffers");
  if (p.tokens == 0)
    return;
  const unsigned blocks = one_block_per_row("dar_coefficients_backward", "tokens", p.tokens);
  launch_typed(p.type, [&](auto tag) {
    coefficients_backward_kernel<decltype(tag)><<<blocks, kRowThreads, 0, stream>>>(p);
  });
  if (p.dbias != nullptr) {
    column_sum_kernel<<<static_cast<unsigned>(ceil_div(p.outputs, kRowThreads)), kRowThreads, 0,
                        stream>>>(p.token_dc, p.tokens, p.outputs, p.dbias);
    MODAR_CUDA_CHECK_LAUNCH();
  }
  if (p.dscale != nullptr) {
    column_sum_kernel<<<1, kRowThreads, 0, stream>>>(p.token_dscale, p.tokens, 3, p.dscale);
    MODAR_CUDA_CHECK_LAUNCH();
  }
  if (p.dweight != nullptr) {
    const dim3 grid(static_cast<unsigned>(ceil_div(p.streams * p.d, kRowThreads)), kReduceSplits);
    launch_typed(p.type, [&](auto tag) {
      coefficients_dweight_partial_kernel<decltype(tag)><<<grid, kRowThreads, 0, stream>>>(p);
    });
    launch_reduce_partials(p.partial, kReduceSplits, p.streams * p.d * p.outputs, p.dweight,
                           Elem::fp32, stream);
  }
}

void launch_dar_mix_forward(const DarMixParams& p, cudaStream_t stream) {
  check_streams("dar_mix_forward", p.streams);
  if (p.tokens * p.d == 0)
    return;
  launch_typed(p.type, [&](auto tag) {
    mix_forward_kernel<decltype(tag)>
        <<<grid_stride_blocks(p.tokens * p.d, kRowThreads), kRowThreads, 0, stream>>>(p);
  });
}

void launch_dar_mix_backward(const DarMixParams& p, cudaStream_t stream) {
  check_streams("dar_mix_backward", p.streams);
  if (p.tokens == 0 || (p.dretrieved == nullptr && p.dalpha == nullptr))
    return;
  const unsigned blocks = one_block_per_row("dar_mix_backward", "tokens", p.tokens);
  launch_typed(p.type, [&](auto tag) {
    mix_backward_kernel<decltype(tag)><<<blocks, kRowThreads, 0, stream>>>(p);
  });
}

void launch_dar_write_forward(const DarWriteParams& p, cudaStream_t stream) {
  check_streams("dar_write_forward", p.streams);
  MODAR_GPU_REQUIRE("dar_write_forward", (p.transport == nullptr) == (p.partial == nullptr),
                    "transport and partial must be given together");
  MODAR_GPU_REQUIRE("dar_write_forward", (p.beta == nullptr) == (p.y == nullptr),
                    "beta and y must be given together");
  const int64_t total = p.streams * p.tokens * p.d;
  if (total == 0)
    return;
  launch_typed(p.type, [&](auto tag) {
    write_forward_kernel<decltype(tag)>
        <<<grid_stride_blocks(total, kRowThreads), kRowThreads, 0, stream>>>(p);
  });
}

void launch_dar_write_backward(const DarWriteParams& p, cudaStream_t stream) {
  check_streams("dar_write_backward", p.streams);
  MODAR_GPU_REQUIRE("dar_write_backward", (p.transport == nullptr) == (p.partial == nullptr),
                    "transport and partial must be given together");
  MODAR_GPU_REQUIRE("dar_write_backward", (p.beta == nullptr) == (p.y == nullptr),
                    "beta and y must be given together");
  if (p.tokens == 0)
    return;
  const unsigned blocks = one_block_per_row("dar_write_backward", "tokens", p.tokens);
  launch_typed(p.type, [&](auto tag) {
    write_backward_kernel<decltype(tag)><<<blocks, kRowThreads, 0, stream>>>(p);
  });
}

}  // namespace modar::gpu
