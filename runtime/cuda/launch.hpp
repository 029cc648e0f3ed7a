// runtime/cuda/launch.hpp: what the host side of every kernel family shares.
//
// The *.cuh headers of this folder declare POD params structs and launchers
// only; they are included by host code compiled with the C++ compiler
// (cuda_backend.cpp), so they contain no device code.  Kernels and their
// explicit instantiations live in the matching *.cu file.
//
// Element types: activations are fp32 or bf16 (Elem); statistics (rstd, lse,
// logits, coefficients, optimizer state) are always fp32 on the GPU.  fp64 is
// a CPU-only reference precision and is rejected by the backend before any
// launcher is reached.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace modar::gpu {

enum class Elem : uint8_t { fp32, bf16 };

inline int64_t elem_bytes(Elem type) {
  return type == Elem::fp32 ? 4 : 2;
}

// Threads per block of the row-wise kernels (one block per row / token).
inline constexpr int kRowThreads = 256;

// Partial-sum reductions over rows (weight gradients of norms, router, depth
// queries): a kernel writes partial[split][columns] in fp32, then
// launch_reduce_partials adds the column sums into `out` (+=).  Deterministic:
// fixed split count, fixed summation order.
inline constexpr int kReduceSplits = 64;

// out[c] += sum_s partial[s * columns + c]  (out: Elem storage)
void launch_reduce_partials(const float* partial, int splits, int64_t columns, void* out,
                            Elem out_type, cudaStream_t stream);

// The most blocks of `threads` threads that a grid-stride launch uses: the
// device's multiprocessors x (2048 / threads) (one wave of resident blocks,
// read once from the current device), or the test override
// (set_grid_stride_block_cap; 0 restores the default).
int64_t grid_stride_block_cap(int threads);
void set_grid_stride_block_cap(int64_t blocks);

}  // namespace modar::gpu
