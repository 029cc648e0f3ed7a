// runtime/cuda/elementwise.cu: fill / convert, GELU (tanh approximation),
// SwiGLU, add, axpy, scale, mul.
//
// Math:
//   gelu(x)   = 0.5 x (1 + tanh(k (x + 0.044715 x^3))),  k = sqrt(2 / pi)
//   gelu'(x)  = 0.5 (1 + th) + 0.5 x (1 - th^2) k (1 + 3 * 0.044715 x^2)
//   silu(a)   = a sigmoid(a),  silu'(a) = sigmoid(a) (1 + a (1 - sigmoid(a)))
// Layout: flat arrays; one grid-stride loop per op, fp32 arithmetic.
#include "check.hpp"
#include "common.cuh"
#include "elementwise.cuh"

namespace modar::gpu {

namespace {

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluC = 0.044715f;

#define MODAR_GRID_STRIDE(i, count)                                                          \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (count); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

template <typename T>
__global__ void fill_kernel(T* dst, int64_t count, float value) {
  MODAR_GRID_STRIDE(i, count) {
    store_float(dst + i, value);
  }
}

__global__ void fill_int_kernel(int32_t* dst, int64_t count, int32_t value) {
  MODAR_GRID_STRIDE(i, count) {
    dst[i] = value;
  }
}

template <typename S, typename D>
__global__ void convert_kernel(const S* src, D* dst, int64_t count) {
  MODAR_GRID_STRIDE(i, count) {
    store_float(dst + i, load_float(src + i));
  }
}

template <typename T>
__global__ void activation_kernel(ActivationParams p) {
  const T* a = static_cast<const T*>(p.a);
  const T* b = static_cast<const T*>(p.b);
  const T* dout = static_cast<const T*>(p.dout);
  T* out = static_cast<T*>(p.out);
  T* out2 = static_cast<T*>(p.out2);
  MODAR_GRID_STRIDE(i, p.count) {
    const float x = load_float(a + i);
    switch (p.op) {
      case UnaryOp::gelu_forward: {
        const float th = tanhf(kGeluK * (x + kGeluC * x * x * x));
        store_float(out + i, 0.5f * x * (1.0f + th));
        break;
      }
      case UnaryOp::gelu_backward: {
        const float th = tanhf(kGeluK * (x + kGeluC * x * x * x));
        const float derivative = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kGeluK *
                                                          (1.0f + 3.0f * kGeluC * x * x);
        store_float(out + i, load_float(out + i) + load_float(dout + i) * derivative);
        break;
      }
      case UnaryOp::swiglu_forward: {
        store_float(out + i, x * sigmoid(x) * load_float(b + i));
        break;
      }
      case UnaryOp::swiglu_backward: {
        const float s = sigmoid(x);
        const float g = load_float(dout + i);
        if (out != nullptr) {
          store_float(out + i,
                      load_float(out + i) + g * load_float(b + i) * s * (1.0f + x * (1.0f - s)));
        }
        if (out2 != nullptr) {
          store_float(out2 + i, load_float(out2 + i) + g * x * s);
        }
        break;
      }
    }
  }
}

template <typename T>
__global__ void add_kernel(const T* a, const T* b, T* out, int64_t count) {
  MODAR_GRID_STRIDE(i, count) {
    store_float(out + i, load_float(a + i) + load_float(b + i));
  }
}

template <typename X, typename Y>
__global__ void axpy_kernel(float alpha, const X* x, Y* y, int64_t count) {
  MODAR_GRID_STRIDE(i, count) {
    store_float(y + i, load_float(y + i) + alpha * load_float(x + i));
  }
}

template <typename T>
__global__ void scale_kernel(T* x, float alpha, int64_t count) {
  MODAR_GRID_STRIDE(i, count) {
    store_float(x + i, load_float(x + i) * alpha);
  }
}

template <typename T>
__global__ void mul_forward_kernel(const T* a, const T* b, T* out, int64_t count) {
  MODAR_GRID_STRIDE(i, count) {
    store_float(out + i, load_float(a + i) * load_float(b + i));
  }
}

template <typename T>
__global__ void mul_backward_kernel(const T* dout, const T* a, const T* b, T* da, T* db,
                                    int64_t count) {
  MODAR_GRID_STRIDE(i, count) {
    const float g = load_float(dout + i);
    const float a_value = load_float(a + i);
    const float b_value = load_float(b + i);
    if (da != nullptr)
      store_float(da + i, load_float(da + i) + g * b_value);
    if (db != nullptr)
      store_float(db + i, load_float(db + i) + g * a_value);
  }
}

using bf16 = __nv_bfloat16;

}  // namespace

void launch_fill(void* dst, int64_t count, double value, Elem type, bool is_int32,
                 cudaStream_t stream) {
  if (count == 0)
    return;
  if (is_int32) {
    fill_int_kernel<<<grid_stride_blocks(count, kRowThreads), kRowThreads, 0, stream>>>(
        static_cast<int32_t*>(dst), count, static_cast<int32_t>(llround(value)));
  } else if (type == Elem::fp32) {
    fill_kernel<<<grid_stride_blocks(count, kRowThreads), kRowThreads, 0, stream>>>(
        static_cast<float*>(dst), count, static_cast<float>(value));
  } else {
    fill_kernel<<<grid_stride_blocks(count, kRowThreads), kRowThreads, 0, stream>>>(
        static_cast<bf16*>(dst), count, static_cast<float>(value));
  }
  MODAR_CUDA_CHECK_LAUNCH();
}

void launch_convert(const void* src, Elem src_type, void* dst, Elem dst_type, int64_t count,
                    cudaStream_t stream) {
  if (count == 0)
    return;
  const unsigned blocks = grid_stride_blocks(count, kRowThreads);
  if (src_type == Elem::fp32 && dst_type == Elem::bf16) {
    convert_kernel<<<blocks, kRowThreads, 0, stream>>>(static_cast<const float*>(src),
                                                       static_cast<bf16*>(dst), count);
  } else if (src_type == Elem::bf16 && dst_type == Elem::fp32) {
    convert_kernel<<<blocks, kRowThreads, 0, stream>>>(static_cast<const bf16*>(src),
                                                       static_cast<float*>(dst), count);
  } else {
    MODAR_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(count * elem_bytes(src_type)),
                                     cudaMemcpyDeviceToDevice, stream));
    return;
  }
  MODAR_CUDA_CHECK_LAUNCH();
}

void launch_activation(const ActivationParams& p, cudaStream_t stream) {
  if (p.count == 0)
    return;
  launch_typed(p.type, [&](auto tag) {
    activation_kernel<decltype(tag)>
        <<<grid_stride_blocks(p.count, kRowThreads), kRowThreads, 0, stream>>>(p);
  });
}

void launch_add(const void* a, const void* b, void* out, int64_t count, Elem type,
                cudaStream_t stream) {
  if (count == 0)
    return;
  launch_typed(type, [&](auto tag) {
    using T = decltype(tag);
    add_kernel<<<grid_stride_blocks(count, kRowThreads), kRowThreads, 0, stream>>>(
        static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), count);
  });
}

void launch_axpy(float alpha, const void* x, Elem x_type, void* y, Elem y_type, int64_t count,
                 cudaStream_t stream) {
  if (count == 0)
    return;
  const unsigned blocks = grid_stride_blocks(count, kRowThreads);
  if (x_type == Elem::fp32 && y_type == Elem::fp32) {
    axpy_kernel<<<blocks, kRowThreads, 0, stream>>>(alpha, static_cast<const float*>(x),
                                                    static_cast<float*>(y), count);
  } else if (x_type == Elem::fp32) {
    axpy_kernel<<<blocks, kRowThreads, 0, stream>>>(alpha, static_cast<const float*>(x),
                                                    static_cast<bf16*>(y), count);
  } else if (y_type == Elem::fp32) {
    axpy_kernel<<<blocks, kRowThreads, 0, stream>>>(alpha, static_cast<const bf16*>(x),
                                                    static_cast<float*>(y), count);
  } else {
    axpy_kernel<<<blocks, kRowThreads, 0, stream>>>(alpha, static_cast<const bf16*>(x),
                                                    static_cast<bf16*>(y), count);
  }
  MODAR_CUDA_CHECK_LAUNCH();
}

void launch_scale(void* x, float alpha, int64_t count, Elem type, cudaStream_t stream) {
  if (count == 0)
    return;
  launch_typed(type, [&](auto tag) {
    scale_kernel<<<grid_stride_blocks(count, kRowThreads), kRowThreads, 0, stream>>>(
        static_cast<decltype(tag)*>(x), alpha, count);
  });
}

void launch_mul_forward(const void* a, const void* b, void* out, int64_t count, Elem type,
                        cudaStream_t stream) {
  if (count == 0)
    return;
  launch_typed(type, [&](auto tag) {
    using T = decltype(tag);
    mul_forward_kernel<<<grid_stride_blocks(count, kRowThreads), kRowThreads, 0, stream>>>(
        static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), count);
  });
}

void launch_mul_backward(const void* dout, const void* a, const void* b, void* da, void* db,
                         int64_t count, Elem type, cudaStream_t stream) {
  if (count == 0 || (da == nullptr && db == nullptr))
    return;
  launch_typed(type, [&](auto tag) {
    using T = decltype(tag);
    mul_backward_kernel<<<grid_stride_blocks(count, kRowThreads), kRowThreads, 0, stream>>>(
        static_cast<const T*>(dout), static_cast<const T*>(a), static_cast<const T*>(b),
        static_cast<T*>(da), static_cast<T*>(db), count);
  });
}

}  // namespace modar::gpu
