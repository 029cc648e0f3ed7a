// Names of the op vocabulary (modar/ops.hpp) and the expert GEMM's timing
// stand-in.  Kind names come from MODAR_OP_KINDS; they and the pass names are
// the keys of device profiles and of the JSON output: changing one breaks old
// profiles.
#include "modar/ops.hpp"

#include <algorithm>
#include <cmath>

#include "modar/base/enum_names.hpp"

namespace modar {

bool parse_op_kind(const std::string& name, OpKind* kind) {
  for (const OpKindInfo& info : kOpKindTable) {
    if (name == info.name) {
      *kind = info.kind;
      return true;
    }
  }
  return false;
}

bool parse_pass(const std::string& name, Pass* pass) {
  for (Pass candidate : {Pass::forward, Pass::backward, Pass::recompute}) {
    if (name == to_string(candidate)) {
      *pass = candidate;
      return true;
    }
  }
  return false;
}

GemmDims expert_gemm_timing_dims(const ExpertGemmDims& expert_gemm) {
  const int64_t groups = std::max<int64_t>(expert_gemm.groups, 1);
  const double imbalance = expert_gemm.imbalance_permille > 0
                               ? static_cast<double>(expert_gemm.imbalance_permille) / 1000.0
                               : 1.0;
  const double mean_rows = static_cast<double>(expert_gemm.rows) / static_cast<double>(groups);
  const int64_t busiest = static_cast<int64_t>(std::ceil(mean_rows * imbalance - 1e-9));
  if (expert_gemm.ragged_inner == 0) {
    return GemmDims{.m = busiest, .n = expert_gemm.n, .k = expert_gemm.k, .batch = groups};
  }
  return GemmDims{.m = expert_gemm.n, .n = expert_gemm.k, .k = busiest, .batch = groups};
}

constexpr const char* kPassNames[] = {"forward", "backward", "recompute"};
const char* to_string(Pass v) {
  return name_of(kPassNames, v);
}

}  // namespace modar
