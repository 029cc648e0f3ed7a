// runtime/calibration/validate_trace.cpp: a Backend that forwards every op to
// another backend and counts what was executed, mapped to the op vocabulary
// (ops.hpp) by the op table (op_args.hpp: the `kind` column), so `modar
// validate` can compare the runtime's executed op list with lower().
// copy / fill / convert (not in the vocabulary) are counted as calls only.
#include <chrono>

#include "validate_internal.hpp"

namespace modar::runtime::validate_detail {

// Each recorded vocabulary op is timed on its own (synchronised before and
// after), so the traced step also gives the measured time per op kind.
void TracingBackend::execute(const OpArgs& call, const OpGeometry& geometry) {
  const OpInfo& info = op_info(op_id(call));
  if (!recording_) {
    inner().run(call);
    return;
  }
  ++executed_.calls;
  if (!info.in_vocabulary) {
    inner().run(call);
    return;
  }
  const size_t kind = static_cast<size_t>(info.kind);
  ++executed_.calls_by_kind[kind];
  if (info.kind == OpKind::gemm) {
    const GemmDims gemm = geometry.as<GemmDims>();
    gemm_shapes_.push_back(OpShape::of(gemm, dtype_));
    ++executed_.gemm_calls;
    executed_.gemm_flops += 2.0 * static_cast<double>(gemm.m) * static_cast<double>(gemm.n) *
                            static_cast<double>(gemm.k) * static_cast<double>(gemm.batch);
  }
  inner().synchronize();
  const auto start = std::chrono::steady_clock::now();
  inner().run(call);
  inner().synchronize();
  executed_.measured_by_kind_s[kind] +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace modar::runtime::validate_detail
