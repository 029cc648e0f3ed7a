// runtime/cuda/loss.cu: cross-entropy over the vocabulary and BCE-with-logits
// (the MoD auxiliary router / predictor loss).
//
// Cross-entropy, rows with target >= 0 (count = their number):
//   lse_i = log sum_v exp(logit_iv),  loss = (1 / count) sum_i (lse_i - logit_i,target)
//   dlogit_iv += dloss (softmax_iv - [v == target]) / count
// (ignored rows, target < 0 or >= vocab: lse is still written, no loss, no
// gradient; count = 0 -> loss 0).  Targets are data the CUDA backend does not
// range-check (the CPU backend does), so an out-of-range target is ignored
// rather than read out of bounds.
// One block per row (two passes over the vocabulary: max, then sum of exp);
// the mean is a single-block reduction over the per-row losses, in a fixed
// order (deterministic).
// BCE: loss = mean_i (max(x,0) - x y + log1p(exp(-|x|))), dx += dloss (sigmoid(x) - y) / rows.
#include "check.hpp"
#include "common.cuh"
#include "loss.cuh"

namespace modar::gpu {

namespace {

constexpr int kReduceThreads = 1024;

__device__ __forceinline__ bool counted_target(int32_t target, int64_t vocab) {
  return target >= 0 && target < vocab;
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads) cross_entropy_rows_kernel(CrossEntropyParams p) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* logits = static_cast<const T*>(p.logits) + row * p.vocab;
  float row_max = -__builtin_huge_valf();
  for (int64_t v = threadIdx.x; v < p.vocab; v += blockDim.x) {
    row_max = fmaxf(row_max, load_float(logits + v));
  }
  row_max = block_max(row_max, scratch);
  float sum = 0.0f;
  for (int64_t v = threadIdx.x; v < p.vocab; v += blockDim.x) {
    sum += expf(load_float(logits + v) - row_max);
  }
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) {
    const float lse = row_max + logf(sum);
    p.lse[row] = lse;
    const int32_t target = p.targets[row];
    p.row_scratch[row] = counted_target(target, p.vocab) ? lse - load_float(logits + target) : 0.0f;
  }
}

// Single block: loss[0] = sum(row losses) / count(counted targets).
__global__ void __launch_bounds__(kReduceThreads)
    cross_entropy_mean_kernel(const float* row_losses, const int32_t* targets, int64_t rows,
                              int64_t vocab, float* loss) {
  __shared__ float scratch[32];
  float sum = 0.0f;
  float count = 0.0f;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
    sum += row_losses[i];
    count += counted_target(targets[i], vocab) ? 1.0f : 0.0f;
  }
  sum = block_sum(sum, scratch);
  count = block_sum(count, scratch);
  if (threadIdx.x == 0) {
    loss[0] = count > 0.0f ? sum / count : 0.0f;
  }
}

__global__ void __launch_bounds__(kReduceThreads)
    count_targets_kernel(const int32_t* targets, int64_t rows, int64_t vocab, float* count) {
  __shared__ float scratch[32];
  float local = 0.0f;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
    local += counted_target(targets[i], vocab) ? 1.0f : 0.0f;
  }
  local = block_sum(local, scratch);
  if (threadIdx.x == 0) {
    count[0] = local;
  }
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads) cross_entropy_backward_kernel(CrossEntropyParams p) {
  const int64_t row = blockIdx.x;
  const int32_t target = p.targets[row];
  if (!counted_target(target, p.vocab)) {
    return;
  }
  const float scale = p.dloss / p.count_scratch[0];
  const float lse = p.lse[row];
  const T* logits = static_cast<const T*>(p.logits) + row * p.vocab;
  T* dlogits = static_cast<T*>(p.dlogits) + row * p.vocab;
  for (int64_t v = threadIdx.x; v < p.vocab; v += blockDim.x) {
    const float softmax = expf(load_float(logits + v) - lse);
    const float grad = scale * (softmax - (v == target ? 1.0f : 0.0f));
    store_float(dlogits + v, load_float(dlogits + v) + grad);
  }
}

__device__ __forceinline__ float bce_term(float x, float y) {
  return fmaxf(x, 0.0f) - x * y + log1pf(expf(-fabsf(x)));
}

__global__ void __launch_bounds__(kReduceThreads)
    bce_forward_kernel(const float* logits, const float* targets, float* loss, int64_t rows) {
  __shared__ float scratch[32];
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
    sum += bce_term(logits[i], targets[i]);
  }
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) {
    loss[0] = sum / static_cast<float>(rows);
  }
}

__global__ void bce_backward_kernel(float scale, const float* logits, const float* targets,
                                    float* dlogits, int64_t rows) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < rows;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dlogits[i] += scale * (sigmoid(logits[i]) - targets[i]);
  }
}

}  // namespace

void launch_cross_entropy_forward(const CrossEntropyParams& p, cudaStream_t stream) {
  MODAR_GPU_REQUIRE("cross_entropy_forward", p.vocab > 0 && p.row_scratch != nullptr,
                    "need vocab > 0 and the row scratch, got vocab = " + std::to_string(p.vocab));
  if (p.rows == 0) {
    if (p.loss != nullptr) {
      MODAR_CUDA_CHECK(cudaMemsetAsync(p.loss, 0, sizeof(float), stream));
    }
    return;
  }
  const unsigned blocks = one_block_per_row("cross_entropy_forward", "rows", p.rows);
  launch_typed(p.type, [&](auto tag) {
    cross_entropy_rows_kernel<decltype(tag)><<<blocks, kRowThreads, 0, stream>>>(p);
  });
  if (p.loss != nullptr) {
    cross_entropy_mean_kernel<<<1, kReduceThreads, 0, stream>>>(p.row_scratch, p.targets, p.rows,
                                                                p.vocab, p.loss);
    MODAR_CUDA_CHECK_LAUNCH();
  }
}

void launch_cross_entropy_backward(const CrossEntropyParams& p, cudaStream_t stream) {
  MODAR_GPU_REQUIRE("cross_entropy_backward", p.vocab > 0 && p.count_scratch != nullptr,
                    "need vocab > 0 and the count scratch, got vocab = " + std::to_string(p.vocab));
  if (p.rows == 0)
    return;
  const unsigned blocks = one_block_per_row("cross_entropy_backward", "rows", p.rows);
  count_targets_kernel<<<1, kReduceThreads, 0, stream>>>(p.targets, p.rows, p.vocab,
                                                         p.count_scratch);
  MODAR_CUDA_CHECK_LAUNCH();
  launch_typed(p.type, [&](auto tag) {
    cross_entropy_backward_kernel<decltype(tag)><<<blocks, kRowThreads, 0, stream>>>(p);
  });
}

void launch_bce_with_logits_forward(const float* logits, const float* targets, float* loss,
                                    int64_t rows, cudaStream_t stream) {
  MODAR_GPU_REQUIRE("bce_with_logits_forward", rows > 0,
                    "need rows > 0, got " + std::to_string(rows));
  bce_forward_kernel<<<1, kReduceThreads, 0, stream>>>(logits, targets, loss, rows);
  MODAR_CUDA_CHECK_LAUNCH();
}

void launch_bce_with_logits_backward(float dloss, const float* logits, const float* targets,
                                     float* dlogits, int64_t rows, cudaStream_t stream) {
  MODAR_GPU_REQUIRE("bce_with_logits_backward", rows > 0,
                    "need rows > 0, got " + std::to_string(rows));
  bce_backward_kernel<<<grid_stride_blocks(rows, kRowThreads), kRowThreads, 0, stream>>>(
      dloss / static_cast<float>(rows), logits, targets, dlogits, rows);
  MODAR_CUDA_CHECK_LAUNCH();
}

}  // namespace modar::gpu
