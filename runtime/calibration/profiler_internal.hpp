// runtime/profiler_internal.hpp: pieces of the profiler shared by its source
// files (runtime/profiler*.cpp) and its tests; not a public interface.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "modar/ops.hpp"
#include "modar/runtime/backend.hpp"

namespace modar::runtime::profiler_detail {

// How a tensor of a bench is filled (never zeros: docs/profiler.md timing rules).
enum class Fill : uint8_t {
  uniform,         // U(-1, 1)
  positive,        // U(0.5, 1.5): rstd, AdamW v, gates
  small_positive,  // U(0.01, 0.02): coefficient weights (keeps sigmoids unsaturated)
  below,           // integers uniform in [0, limit): token ids, targets
  modulo,          // i % limit: positions
  every_other,     // per row ascending distinct 2 j + {0, 1}: gather / scatter indices
};

struct TensorSpec {
  std::vector<int64_t> shape;
  ScalarType type = ScalarType::fp32;
  Fill fill = Fill::uniform;
  int64_t limit = 0;
};
TensorSpec data(std::vector<int64_t> shape, ScalarType type, Fill fill, int64_t limit = 0);
int64_t spec_bytes(const TensorSpec& spec);

// What one (shape, pass) needs: its tensors, an optional untimed setup (the
// forward that produces the saved state of a backward), and the timed call.
struct BenchSpec {
  std::vector<TensorSpec> tensors;
  std::function<void(Backend&, const std::vector<TensorView>&)> setup;
  std::function<void(Backend&, const std::vector<TensorView>&)> run;
};
// Throws ShapeError for shapes the runtime cannot execute.
BenchSpec bench_spec(const OpShape& shape, Pass pass);

void fill_tensor(Backend& backend, const TensorView& view, const TensorSpec& spec, uint64_t seed);

}  // namespace modar::runtime::profiler_detail
