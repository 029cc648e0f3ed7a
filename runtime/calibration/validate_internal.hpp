// runtime/calibration/validate_internal.hpp: the tracing Backend of `modar
// validate` (validate_trace.cpp); not a public interface.
#pragma once

#include <vector>

#include "modar/runtime/forwarding_backend.hpp"
#include "modar/runtime/validate.hpp"

namespace modar::runtime::validate_detail {

// Forwards every call to `inner` (memory, copies, timers, every op) and, while
// recording, counts the executed ops by their vocabulary kind (the op table,
// op_args.hpp), times each one, and keeps the GEMM shapes.
class TracingBackend final : public ForwardingBackend {
 public:
  TracingBackend(Backend& inner, DType dtype) : ForwardingBackend(inner), dtype_(dtype) {}

  void start_recording() {
    recording_ = true;
    executed_ = ExecutedOps{};
    gemm_shapes_.clear();
  }
  void stop_recording() { recording_ = false; }
  const ExecutedOps& executed() const { return executed_; }
  const std::vector<OpShape>& gemm_shapes() const { return gemm_shapes_; }

 protected:
  void execute(const OpArgs& call, const OpGeometry& geometry) override;

 private:
  DType dtype_;
  bool recording_ = false;
  ExecutedOps executed_;
  std::vector<OpShape> gemm_shapes_;
};

}  // namespace modar::runtime::validate_detail
