// runtime/calibration/validate_internal.hpp: the tracing Backend of `modar
// validate` (validate_trace.cpp) and the report JSON that validate and
// validate --parallel write alike; not a public interface.
#pragma once

#include <vector>

#include "modar/base/json.hpp"
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

// "key": {"median_abs_error": median, "max_abs_error": max, ...}: a
// validation report's error summary; more() writes the object's further
// fields.
template <class More>
void write_abs_errors_json(JsonWriter& json, const char* key, double median, double max,
                           More more) {
  json.key(key).begin_object();
  json.field("median_abs_error", median);
  json.field("max_abs_error", max);
  more();
  json.end_object();
}

// The memory error summary and the host's load averages of a validation
// report (a ValidationReport or a ParallelValidationReport).
template <class Report>
void write_memory_and_load_json(JsonWriter& json, const Report& report) {
  write_abs_errors_json(json, "memory", report.memory_median_abs_error, report.memory_max_abs_error,
                        [] {});
  json.field("load_average_before", report.load_average_before);
  json.field("load_average_after", report.load_average_after);
}

}  // namespace modar::runtime::validate_detail
