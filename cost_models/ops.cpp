// Names of the op vocabulary (modar/ops.hpp).  These strings are the keys of
// device profiles and of the JSON output: changing one breaks old profiles.
#include "modar/ops.hpp"

#include <algorithm>
#include <cmath>

namespace modar {

const char* to_string(OpKind kind) {
  switch (kind) {
    case OpKind::gemm:
      return "gemm";
    case OpKind::attention:
      return "attention";
    case OpKind::rmsnorm:
      return "rmsnorm";
    case OpKind::rope:
      return "rope";
    case OpKind::router:
      return "router";
    case OpKind::topk:
      return "topk";
    case OpKind::gather:
      return "gather";
    case OpKind::scatter_add:
      return "scatter_add";
    case OpKind::depth_read_prefix:
      return "depth_read_prefix";
    case OpKind::depth_read_merge:
      return "depth_read_merge";
    case OpKind::dar_coefficients:
      return "dar_coefficients";
    case OpKind::dar_write:
      return "dar_write";
    case OpKind::elementwise:
      return "elementwise";
    case OpKind::cross_entropy:
      return "cross_entropy";
    case OpKind::embedding:
      return "embedding";
    case OpKind::optimizer_update:
      return "optimizer_update";
    case OpKind::expert_gemm:
      return "expert_gemm";
    case OpKind::moe_topk:
      return "moe_topk";
    case OpKind::permute:
      return "permute";
    case OpKind::unpermute:
      return "unpermute";
  }
  return "unknown";
}

bool parse_op_kind(const std::string& name, OpKind* kind) {
  for (int i = 0; i < kOpKindCount; ++i) {
    if (name == to_string(static_cast<OpKind>(i))) {
      *kind = static_cast<OpKind>(i);
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

int op_dims_count(OpKind kind) {
  switch (kind) {
    case OpKind::gemm:
      return 4;
    case OpKind::attention:
      return 7;
    case OpKind::rmsnorm:
      return 2;
    case OpKind::rope:
      return 3;
    case OpKind::router:
      return 2;
    case OpKind::topk:
      return 3;
    case OpKind::gather:
      return 2;
    case OpKind::scatter_add:
      return 2;
    case OpKind::depth_read_prefix:
      return 6;
    case OpKind::depth_read_merge:
      return 4;
    case OpKind::dar_coefficients:
      return 4;
    case OpKind::dar_write:
      return 5;
    case OpKind::elementwise:
      return 3;
    case OpKind::cross_entropy:
      return 2;
    case OpKind::embedding:
      return 2;
    case OpKind::optimizer_update:
      return 1;
    case OpKind::expert_gemm:
      return 6;
    case OpKind::moe_topk:
      return 3;
    case OpKind::permute:
      return 3;
    case OpKind::unpermute:
      return 4;
  }
  return 7;
}

OpShape expert_gemm_timing_shape(const OpShape& expert_gemm) {
  const auto& x = expert_gemm.dims;
  const int64_t groups = std::max<int64_t>(x[0], 1);
  const double imbalance = x[4] > 0 ? static_cast<double>(x[4]) / 1000.0 : 1.0;
  const double mean_rows = static_cast<double>(x[1]) / static_cast<double>(groups);
  const int64_t busiest = static_cast<int64_t>(std::ceil(mean_rows * imbalance - 1e-9));
  OpShape gemm;
  gemm.kind = OpKind::gemm;
  gemm.dtype = expert_gemm.dtype;
  if (x[5] == 0) {
    gemm.dims = {busiest, x[2], x[3], groups, 0, 0, 0};
  } else {
    gemm.dims = {x[2], x[3], busiest, groups, 0, 0, 0};
  }
  return gemm;
}

const char* to_string(Pass pass) {
  switch (pass) {
    case Pass::forward:
      return "forward";
    case Pass::backward:
      return "backward";
    case Pass::recompute:
      return "recompute";
  }
  return "unknown";
}

}  // namespace modar
