// Names of the op vocabulary (modar/ops.hpp).  These strings are the keys of
// device profiles and of the JSON output: changing one breaks old profiles.
#include "modar/ops.hpp"

namespace modar {

const char* to_string(OpKind kind) {
  switch (kind) {
    case OpKind::gemm: return "gemm";
    case OpKind::attention: return "attention";
    case OpKind::rmsnorm: return "rmsnorm";
    case OpKind::rope: return "rope";
    case OpKind::router: return "router";
    case OpKind::topk: return "topk";
    case OpKind::gather: return "gather";
    case OpKind::scatter_add: return "scatter_add";
    case OpKind::depth_read_prefix: return "depth_read_prefix";
    case OpKind::depth_read_merge: return "depth_read_merge";
    case OpKind::dar_coefficients: return "dar_coefficients";
    case OpKind::dar_write: return "dar_write";
    case OpKind::elementwise: return "elementwise";
    case OpKind::cross_entropy: return "cross_entropy";
    case OpKind::embedding: return "embedding";
    case OpKind::optimizer_update: return "optimizer_update";
  }
  return "unknown";
}

const char* to_string(Pass pass) {
  switch (pass) {
    case Pass::forward: return "forward";
    case Pass::backward: return "backward";
    case Pass::recompute: return "recompute";
  }
  return "unknown";
}

}  // namespace modar
