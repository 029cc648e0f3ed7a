// runtime/cuda/loss.cuh: cross-entropy and BCE-with-logits.  Kernels: loss.cu.
#pragma once

#include "launch.hpp"

namespace modar::gpu {

struct CrossEntropyParams {
  const void* logits = nullptr;      // [rows, vocab]
  const int32_t* targets = nullptr;  // [rows], -1 = ignored
  float* loss = nullptr;             // [1] forward output or null (only lse)
  float* lse = nullptr;              // [rows] forward output, backward input
  void* dlogits = nullptr;           // [rows, vocab] +=  (backward)
  float dloss = 1.0f;                // backward
  float* row_scratch = nullptr;      // [rows] per-row losses (forward)
  float* count_scratch = nullptr;    // [1] number of rows with a target (backward)
  int64_t rows = 0;
  int64_t vocab = 0;
  Elem type = Elem::fp32;
};
void launch_cross_entropy_forward(const CrossEntropyParams& p, cudaStream_t stream);
void launch_cross_entropy_backward(const CrossEntropyParams& p, cudaStream_t stream);

// loss[0] = mean_i (max(x,0) - x y + log(1 + exp(-|x|)));  dlogits += dloss (sigmoid(x) - y) / rows
void launch_bce_with_logits_forward(const float* logits, const float* targets, float* loss,
                                    int64_t rows, cudaStream_t stream);
void launch_bce_with_logits_backward(float dloss, const float* logits, const float* targets,
                                     float* dlogits, int64_t rows, cudaStream_t stream);

}  // namespace modar::gpu
