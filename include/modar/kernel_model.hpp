// modar/kernel_model.hpp: the shape-aware GPU kernel model.
//
// The datasheet path of a GPU profile (one with kernel.sm_count > 0): the time
// of one op from published hardware facts and the named [kernel] parameters,
// shape by shape, instead of one roofline ceiling for every shape.  Every
// constant and its source: docs/kernel_model.md.  The TimingModel
// (cost_model.hpp) calls these for the op kinds a profile did not measure.
//
//   GEMM       tile and wave quantization over the tile shapes a cuBLAS-class
//              library picks (the fastest of them, with split-K), the device's
//              SM count, the large-GEMM ceiling (kernel.gemm_efficiency x
//              peak) as the asymptote; the memory-bound regime of skinny
//              GEMMs by their bytes; a launch cost per kernel.
//   attention  FlashAttention: the rate at head dim 128 and long sequences
//              (kernel.attention_efficiency x peak) times the papers' measured
//              shape factors (sequence length, head dim, causal masking);
//              materialised scores: batched GEMMs plus the softmax / dropout
//              passes (cost_models/attention_kernel.hpp).
//   memory     bytes / (the op family's fraction x HBM bandwidth) + launch.
#pragma once

#include <cstdint>
#include <string>

#include "modar/cost_model.hpp"

namespace modar {

// One GEMM C[m, n] = A[m, k] B[k, n], `batch` independent copies in one
// launch (a batched or grouped GEMM), 16-bit or fp32 operands.
struct GemmShape {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  DType dtype = DType::bf16;
};

// What the GEMM model decided, for reports and tests.
struct GemmTiming {
  double seconds = 0.0;    // the op's time (launches included)
  double compute_s = 0.0;  // waves x one tile's time (+ the split-K reduction)
  double memory_s = 0.0;   // minimum bytes / bandwidth
  int64_t tile_m = 0, tile_n = 0, split_k = 1;
  int64_t tiles = 0, waves = 0;
  bool memory_bound = false;
};

// The tile shapes of the model with their throughput relative to the largest
// (docs/kernel_model.md "GEMM").
struct GemmTile {
  int64_t m = 0, n = 0;
  double relative_rate = 1.0;
};
inline constexpr GemmTile kGemmTiles[] = {
    {256, 128, 1.00}, {128, 256, 1.00}, {128, 128, 0.92}, {256, 64, 0.88},
    {64, 256, 0.88},  {128, 64, 0.80},  {64, 128, 0.80},  {64, 64, 0.65},
};
inline constexpr int64_t kGemmTileK = 32;        // k step of a tile (k is padded to it)
inline constexpr int64_t kSplitKMinDepth = 256;  // least k per split-K slice
inline constexpr int64_t kSplitK[] = {1, 2, 3, 4, 6, 8, 12, 16};  // slices tried

GemmTiming gpu_gemm_time(const GemmShape& shape, const KernelRates& rates);

// FlashAttention forward or backward of one attention op (dims of ops.hpp),
// executed FLOPs by the flash convention.
struct AttentionShape {
  int64_t batch = 1, heads = 1, kv_heads = 1, s_q = 1, s_k = 1, d_head = 64;
  bool causal = true;
  DType dtype = DType::bf16;
};
// The fraction of kernel.attention_efficiency x peak a flash kernel reaches
// at this shape in this pass (1 at head dim 128, non-causal, long sequence,
// forward; the backward's own asymptote below it).
double flash_attention_shape_factor(const AttentionShape& shape, Pass pass);
// Time of `executed_flops` (FlashAttention's count: op_cost with
// AttentionFlops::flash) and `bytes` at that rate / the memory-bound
// bandwidth, whichever is slower, plus a launch.
// rate_factor scales the profile's attention rate (a FlashAttention
// generation other than the profile's own: flash_generation_factor).
double flash_attention_time_s(const AttentionShape& shape, Pass pass, double executed_flops,
                              double bytes, const KernelRates& rates, double rate_factor = 1.0);

// The rate of the FlashAttention generation `kernel` (train.attention_kernel)
// relative to the one a profile of `device_class` times as "flash"
// (FlashAttention-3 on "hopper", FlashAttention-2 on "a100"), from the
// published figures (docs/kernel_model.md "Attention kernel generations"):
// 1 for AttentionKernel::flash; 0 where no figure is published for the class
// (an unknown class; FlashAttention-3 off Hopper) or for unfused.
double flash_generation_factor(const std::string& device_class, AttentionKernel kernel);
// The generations a class has (for messages): "flash1", "flash2", ...
std::string flash_generations_of(const std::string& device_class);

// A memory-bound op of `bytes` in `family`: bytes / bandwidth + launch.
double memory_op_time_s(double bytes, MemoryFamily family, const KernelRates& rates);

}  // namespace modar
