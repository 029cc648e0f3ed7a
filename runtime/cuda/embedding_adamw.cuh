// runtime/cuda/embedding_adamw.cuh: token embedding and the AdamW update.
// Kernels: embedding_adamw.cu.
#pragma once

#include "launch.hpp"

namespace modar::gpu {

// out[i] = table[tokens[i]];  table [vocab, d]; table and out may differ in type.
// Tokens outside [0, vocab) give a zero row (forward) / are skipped (backward).
void launch_embedding_forward(const void* table, Elem table_type, const int32_t* tokens, void* out,
                              Elem out_type, int64_t rows, int64_t d, int64_t vocab,
                              cudaStream_t stream);
// dtable[tokens[i]] += dout[i]  (atomic adds: repeated tokens collide)
void launch_embedding_backward(const void* dout, Elem dout_type, const int32_t* tokens,
                               void* dtable, Elem dtable_type, int64_t rows, int64_t d,
                               int64_t vocab, cudaStream_t stream);

struct AdamWLaunchParams {
  float* params = nullptr;      // fp32 master weights
  const void* grads = nullptr;  // Elem
  float* m = nullptr;
  float* v = nullptr;
  void* params_lowp = nullptr;  // null or a copy of the updated params (Elem lowp_type)
  int64_t count = 0;
  float learning_rate = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float epsilon = 1e-8f;
  float weight_decay = 0.0f;
  float bias_correction1 = 1.0f;  // 1 - beta1^t (computed in fp64 on the host)
  float bias_correction2 = 1.0f;  // 1 - beta2^t
  float grad_scale = 1.0f;
  Elem grad_type = Elem::fp32;
  Elem lowp_type = Elem::bf16;
};
void launch_adamw(const AdamWLaunchParams& p, cudaStream_t stream);

}  // namespace modar::gpu
