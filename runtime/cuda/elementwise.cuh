// runtime/cuda/elementwise.cuh: fill / convert, GELU, SwiGLU, add, axpy,
// scale, mul.  Kernels: elementwise.cu.
#pragma once

#include "launch.hpp"

namespace modar::gpu {

// dst[i] = value; dst is fp32, bf16 or (is_int32) int32.
void launch_fill(void* dst, int64_t count, double value, Elem type, bool is_int32,
                 cudaStream_t stream);
// dst[i] = src[i] converted (RNE for fp32 -> bf16).
void launch_convert(const void* src, Elem src_type, void* dst, Elem dst_type, int64_t count,
                    cudaStream_t stream);

enum class UnaryOp : uint8_t { gelu_forward, gelu_backward, swiglu_forward, swiglu_backward };

// gelu_forward:    out = gelu(a)
// gelu_backward:   out += dout * gelu'(a)                      (b unused)
// swiglu_forward:  out = silu(a) * b                           (a = gate, b = up)
// swiglu_backward: out += dout * b * silu'(a), out2 += dout * silu(a)   (either may be null)
struct ActivationParams {
  UnaryOp op = UnaryOp::gelu_forward;
  const void* a = nullptr;
  const void* b = nullptr;
  const void* dout = nullptr;
  void* out = nullptr;
  void* out2 = nullptr;
  int64_t count = 0;
  Elem type = Elem::fp32;
};
void launch_activation(const ActivationParams& params, cudaStream_t stream);

// out = a + b (out may alias a or b)
void launch_add(const void* a, const void* b, void* out, int64_t count, Elem type,
                cudaStream_t stream);
// y += alpha x (x, y may differ in type)
void launch_axpy(float alpha, const void* x, Elem x_type, void* y, Elem y_type, int64_t count,
                 cudaStream_t stream);
// x *= alpha
void launch_scale(void* x, float alpha, int64_t count, Elem type, cudaStream_t stream);
// forward: out = a * b.  backward: da += dout * b, db += dout * a (either may be null).
void launch_mul_forward(const void* a, const void* b, void* out, int64_t count, Elem type,
                        cudaStream_t stream);
void launch_mul_backward(const void* dout, const void* a, const void* b, void* da, void* db,
                         int64_t count, Elem type, cudaStream_t stream);

}  // namespace modar::gpu
