// Names of the op vocabulary (modar/ops.hpp).  These strings are the keys of
// device profiles and of the JSON output: changing one breaks old profiles.
#include "modar/ops.hpp"

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
  }
  return 7;
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
