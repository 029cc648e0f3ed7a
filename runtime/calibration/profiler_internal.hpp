// runtime/profiler_internal.hpp: pieces of the profiler shared by its source
// files (runtime/profiler*.cpp) and its tests; not a public interface.
#pragma once

#include <vector>

#include "modar/ops.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/op_samples.hpp"

namespace modar::runtime::profiler_detail {

// What one (shape, pass) runs: the samples (op_samples.hpp) of the runtime
// ops the layers make for that op of the lowering, at the kind's dims.  Each
// sample's setup calls (a backward's forward) run untimed, its last call is
// timed; the samples' tensors are allocated side by side.
struct BenchSpec {
  ScalarType dtype = ScalarType::fp32;  // the data dtype of the shape
  std::vector<OpSample> parts;
};
// Throws ShapeError for shapes the runtime cannot execute.
BenchSpec bench_spec(const OpShape& shape, Pass pass);

// Every part's tensors, in order (the views of a copy follow this order).
std::vector<SampleTensor> bench_tensors(const BenchSpec& spec);
int64_t bench_bytes(const BenchSpec& spec);
// The calls of one copy of the tensors: the untimed setup and the timed ones.
struct BenchCalls {
  std::vector<OpArgs> setup;
  std::vector<OpArgs> timed;
};
BenchCalls bench_calls(const BenchSpec& spec, const std::vector<TensorView>& views);

}  // namespace modar::runtime::profiler_detail
