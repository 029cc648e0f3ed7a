// runtime/cuda/cudnn_attention.hpp: attention on the tensor cores through
// cuDNN's fused scaled-dot-product attention (flash attention forward and
// backward), driven by the cuDNN frontend's C++ graph API (header-only,
// PyPI nvidia-cudnn-frontend, pinned in scripts/fetch-cudnn-frontend.sh).
//
// cuDNN is NOT linked: the frontend's dynamic-loading mode is used and
// libcudnn.so.9 is dlopen'ed at the first attention call, so the binaries run
// (with the reference kernel) on machines without cuDNN, and on the device
// machine they take cuDNN from the PyTorch environment's nvidia wheels
// (scripts/gpu-check.sh sets LD_LIBRARY_PATH).
//
// Covered: bf16 storage with fp32 softmax / accumulation, causal or full, GQA
// (kv_heads dividing heads), per-sequence valid lengths (cuDNN's padding mask;
// MoD predictor mode), lse saved as the natural-log stats the reference kernel
// uses.  Not covered, and run by the reference kernel instead (attention.cu):
// fp32 storage, d_head not a multiple of 8 or above 256, cuDNN < 9.0 or
// missing, and any shape cuDNN's check_support refuses.  The decision is cached
// per shape.  The backward is built deterministic where cuDNN supports it
// (the repeated-step determinism test), else cuDNN's default.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "attention.cuh"

namespace modar::gpu {

class CachingAllocator;

class CudnnAttention {
 public:
  explicit CudnnAttention(CachingAllocator& allocator);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Runs the op on cuDNN and returns true, or returns false (nothing was
  // launched) when the process-wide path setting or cuDNN's support says the
  // reference kernel must run.  With the path set to `cudnn`, an unsupported
  // call throws modar::BackendError naming the reason instead.
  bool forward(const AttentionLaunchParams& params, cudaStream_t stream);
  bool backward(const AttentionLaunchParams& params, cudaStream_t stream);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The reference kernel, counted for cuda_attention_counts().
void count_reference_attention(bool backward);

}  // namespace modar::gpu
