// modar/runtime/grouped_gemm_split.hpp: the grouped GEMM of the MoE layers as
// one plain GEMM per expert on its row range, shared by the backends that
// have no fused grouped kernel (cpu, cuda).  `counts` are on the host, each
// in [0, rows] (the caller checks them with its own messages).
//   forward / input grad (transpose_a false): c[rows_e] = a[rows_e] op(b[e])
//   weight grad          (transpose_a true):  c[e]      = a[rows_e]^T b[rows_e]
// An expert with no rows leaves its weight gradient c[e] at beta c[e].
#pragma once

#include <cstdint>
#include <string>

#include "modar/base/errors.hpp"
#include "modar/runtime/op_args.hpp"
#include "modar/runtime/tensor.hpp"

namespace modar::runtime::detail {

template <class Gemm, class Fill, class Scale>
void split_grouped_gemm(const GroupedGemmArgs& call, const int32_t* counts, Gemm&& gemm,
                        Fill&& fill, Scale&& scale) {
  const int64_t experts = call.counts.dim(0), rows = call.a.dim(0);
  int64_t total = 0;
  for (int64_t e = 0; e < experts; ++e)
    total += counts[e];
  if (total > rows) {
    throw ShapeError("grouped_gemm: counts sum to " + std::to_string(total) + " rows; a has " +
                     std::to_string(rows));
  }
  int64_t offset = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t count = counts[e];
    if (!call.transpose_a) {
      if (count > 0) {
        gemm(GemmArgs{slice(call.a, offset, count), false, select(call.b, e), call.transpose_b,
                      slice(call.c, offset, count), call.alpha, call.beta});
      }
    } else if (count > 0) {
      gemm(GemmArgs{slice(call.a, offset, count), true, slice(call.b, offset, count), false,
                    select(call.c, e), call.alpha, call.beta});
    } else if (call.beta == 0.0) {
      fill(FillArgs{select(call.c, e), 0.0});
    } else if (call.beta != 1.0) {
      scale(ScaleArgs{select(call.c, e), call.beta});
    }
    offset += count;
  }
}

}  // namespace modar::runtime::detail
