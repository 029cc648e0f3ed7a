// GEMM time on a GPU from published facts (docs/kernel_model.md "GEMM").
//
// A cuBLAS-class GEMM splits C[m, n] into tiles of tm x tn, one thread block
// (CTA) per tile, one CTA of these tile sizes resident per SM; the tiles run
// in waves of `sm_count` (NVIDIA, "Matrix Multiplication Background User's
// Guide", sections 2.3 "Typical tile dimensions in cuBLAS", 3.1 tile
// quantization, 3.2 wave quantization).  One tile's time is its padded work
// 2 tm tn k / (the SM's share of the large-GEMM rate x the tile's relative
// rate).  The library picks the fastest of the tile shapes of kGemmTiles,
// each optionally split along k (split-K: more, thinner tiles for a short,
// wide problem, paid for by writing and reading fp32 partial sums).  The
// memory-bound regime is the minimum bytes at the memory-bound bandwidth;
// the op takes the larger of the two, plus one launch (two with split-K).
//
// On a perfectly quantized large GEMM the model returns 2 m n k / (gemm
// efficiency x peak): the maximum achievable matmul FLOPS is the asymptote.
// kernel.gemm_quantization scales the loss above it (docs/kernel_model.md).
#include <algorithm>
#include <cmath>

#include "modar/kernel_model.hpp"

namespace modar {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

GemmTiming gpu_gemm_time(const GemmShape& shape, const KernelRates& rates) {
  GemmTiming best;
  const int64_t m = std::max<int64_t>(shape.m, 1), n = std::max<int64_t>(shape.n, 1),
                k = std::max<int64_t>(shape.k, 1), batch = std::max<int64_t>(shape.batch, 1);
  const bool wide = shape.dtype == DType::fp32 || shape.dtype == DType::fp64;
  const double element_bytes = static_cast<double>(dtype_bytes(shape.dtype));
  const double rate = wide ? rates.fp32_flops : rates.gemm_flops;
  const int64_t sms = std::max<int64_t>(rates.params.sm_count, 1);
  const double sm_rate = rate / static_cast<double>(sms);
  const double md = static_cast<double>(m), nd = static_cast<double>(n),
               kd = static_cast<double>(k), bd = static_cast<double>(batch);
  const double bytes = element_bytes * (md * kd + kd * nd + md * nd) * bd;
  best.memory_s = rates.bandwidth > 0.0 ? bytes / rates.bandwidth : 0.0;
  best.compute_s = -1.0;
  for (const GemmTile& tile : kGemmTiles) {
    const int64_t tiles_mn = ceil_div(m, tile.m) * ceil_div(n, tile.n) * batch;
    for (const int64_t split : kSplitK) {
      if (split > 1 && k / split < kSplitKMinDepth) {
        break;  // slices thinner than this are not worth their partial sums
      }
      const int64_t depth = ceil_div(ceil_div(k, split), kGemmTileK) * kGemmTileK;
      const int64_t tiles = tiles_mn * split;
      const int64_t waves = ceil_div(tiles, sms);
      const double tile_s = 2.0 * static_cast<double>(tile.m) * static_cast<double>(tile.n) *
                            static_cast<double>(depth) / (sm_rate * tile.relative_rate);
      double compute_s = static_cast<double>(waves) * tile_s;
      if (split > 1) {
        // fp32 partial sums written and read back once each, plus a launch.
        const double partial_bytes = 8.0 * static_cast<double>(split) * md * nd * bd;
        compute_s += partial_bytes / rates.bandwidth + rates.launch_overhead_s;
      }
      if (best.compute_s < 0.0 || compute_s < best.compute_s) {
        best.compute_s = compute_s;
        best.tile_m = tile.m;
        best.tile_n = tile.n;
        best.split_k = split;
        best.tiles = tiles;
        best.waves = waves;
      }
    }
  }
  // kernel.gemm_quantization q: the GEMM pays q of the modelled quantization
  // loss (its compute above the asymptote's 2 m n k / rate); q = 1 (unset)
  // leaves the model as it is.
  const double paid = rates.params.gemm_quantization < 0.0 ? 1.0 : rates.params.gemm_quantization;
  if (paid < 1.0) {
    const double asymptote_s = 2.0 * md * nd * kd * bd / rate;
    best.compute_s = asymptote_s + paid * std::max(0.0, best.compute_s - asymptote_s);
  }
  best.memory_bound = best.memory_s > best.compute_s;
  best.seconds = std::max(best.compute_s, best.memory_s) + rates.launch_overhead_s;
  return best;
}

double memory_op_time_s(double bytes, MemoryFamily family, const KernelRates& rates) {
  const double bandwidth = rates.bandwidth_of(family);
  return (bandwidth > 0.0 ? bytes / bandwidth : 0.0) + rates.launch_overhead_s;
}

}  // namespace modar
