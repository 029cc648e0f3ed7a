// modar/runtime/op_samples.hpp: ONE recipe per runtime op for "a valid call of
// op X at these sizes" (ggml's test-backend-ops: one test case, several modes).
//
// A sample is the tensors a call needs (shape and role: which dtype, which
// values), the calls it makes and the tensors the op writes.  A backward op's
// sample first runs its forward (so the saved state is consistent): the LAST
// call is the op the sample is named after, the ones before it are its setup.
// Its users:
//   * the op harness (tests/cpp/runtime/test_op_harness.cpp): values and
//     gradients of every backend against the fp64 CPU reference, NaN-poisoned
//     outputs, and the performance mode (every op timed at a base size);
//   * the profiler's benches (runtime/calibration/profiler_ops.cpp): each
//     (vocabulary kind, pass) is one or more samples at the kind's dims, its
//     setup calls untimed, its last calls timed.
// The recipes are generated from MODAR_RUNTIME_OPS: a row without a recipe
// does not link (runtime/core/op_sample_recipes*.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "modar/runtime/backend.hpp"

namespace modar::runtime {

// What a sample tensor holds: its dtype (relative to the data dtype of the
// run) and its values.  Float values are bf16-representable, so every dtype
// computes the same function of the same numbers.
enum class SampleRole : uint8_t {
  data,            // data dtype, U(-1, 1)
  positive,        // data dtype, U(0.5, 1.5)
  stats,           // stats_type(data), U(-1, 1)
  stats_positive,  // stats_type(data), U(0.5, 1.5)
  stats_unit,      // stats_type(data), U(0, 1) (BCE targets)
  stats_small,     // stats_type(data), U(0.01, 0.02) (coefficient weights: sigmoids unsaturated)
  master,          // fp64 for fp64 data, else fp32; U(-1, 1)
  master_small,    // as master, U(0.01, 0.02) (AdamW's second moment)
  lowp,            // data dtype where it differs from master, else the tensor is absent
  fp32,            // fp32 whatever the data dtype, U(-1, 1)
  index,           // i32 uniform in [0, limit)
  sorted,          // i32 rows of ascending distinct positions 2 j + {0, 1}
  sorted_ragged,   // as sorted, the last third of every odd row unused (-1)
  given,           // i32 the listed values
};

// How an op uses a tensor before it runs.
enum class SampleUse : uint8_t {
  input,        // read (values of the role)
  accumulated,  // the op adds into it (every gradient a backward writes): starts at zero
  written,      // the op overwrites every element: starts at zero, or NaN when poisoned
};

struct SampleTensor {
  std::vector<int64_t> shape;
  SampleRole role = SampleRole::data;
  SampleUse use = SampleUse::input;
  int64_t limit = 0;           // index: values in [0, limit)
  std::vector<double> values;  // given
};

// The sizes a recipe reads (each recipe reads the ones its op has; the
// defaults are the harness's small case).
struct SampleSizes {
  int64_t rows = 6;   // tokens / rows: the size the harness's performance mode scales
  int64_t batch = 2;  // sequences (RoPE, attention, top-k, routed rows, embedding)
  int64_t width = 8;  // row width (hidden size)
  // GEMM: A [rows, inner] B [inner, cols]; matrices > 1: that many of them (batched).
  int64_t inner = 12;
  int64_t cols = 5;
  int64_t matrices = 1;
  // Attention and RoPE: [batch, rows, heads, head_dim] (keys and values kv_heads).
  int64_t heads = 2;
  int64_t kv_heads = 1;
  int64_t head_dim = 8;
  bool causal = true;
  int64_t max_position = 64;  // RoPE positions in [0, max_position)
  int64_t candidates = 0;     // top-k: scores per sequence (0: 2 x rows); rows = k
  int64_t vocab = 16;         // cross-entropy classes
  int64_t table_rows = 32;    // embedding table rows
  // Depth reads and DAR.
  int64_t sources = 3;                      // prefix read: stored blocks
  int64_t queries = 2;                      // prefix read: queries of the call
  int64_t streams = 2;                      // DAR streams n
  bool transport = true;                    // DAR with the transport matrix
  bool rstd_only = false;                   // rmsnorm_forward: the rstd only (no weight, no output)
  RouterScale gate = RouterScale::sigmoid;  // scatter_add_scaled_forward's gate
  // Ragged inputs: cross-entropy rows ignored (target -1, every fifth row),
  // routed-row slots unused (-1, the last third of every odd sequence).
  bool ragged = false;
  // Mixture of Experts.
  int64_t experts = 8;        // router columns
  int64_t local_experts = 6;  // the dispatch's experts (the others are another rank's)
  int64_t top_k = 2;
  int64_t capacity = 2;                 // dispatch: rows per expert (0: dropless)
  int64_t expert_rows = 0;              // permute / unpermute: expert rows (0: rows x top_k); the
                                        // assignments beyond them are dropped
  std::vector<double> group_rows = {};  // grouped GEMM: rows per group (empty: n/3, 0, the rest)
  bool ragged_inner = false;            // grouped GEMM's weight-gradient form
};

struct OpSample {
  std::vector<SampleTensor> tensors;
  // The calls on the sample's tensors (views in the order of `tensors`; an
  // absent tensor is an empty view).  The last one is the op.
  std::function<std::vector<OpArgs>(const std::vector<TensorView>&)> calls;
  std::vector<int> outputs;  // the tensors the op writes (compared by the harness)
};

// The recipe of `op` at `sizes`.
OpSample op_sample(OpId op, const SampleSizes& sizes = {});

// The dtype of a role for data dtype `data`; none when the tensor is absent
// (lowp for fp32 / fp64 data).
std::optional<ScalarType> sample_dtype(SampleRole role, ScalarType data);
int64_t sample_tensor_bytes(const SampleTensor& tensor, ScalarType data);

// How the outputs start.
enum class SampleFill : uint8_t {
  reference,  // accumulated and written outputs start at zero
  poisoned,   // written outputs start as NaN (float) / -2^30 (i32): an element the op
              // never writes shows
  timing,     // outputs hold random values too (the profiler: no zero data)
};
// Fills one tensor of a sample; `seed` picks the values (the same seed gives
// the same values in every dtype).  Large tensors repeat a random block of
// 2^22 elements (the host never stages a multi-GiB buffer).
void fill_sample_tensor(Backend& backend, const TensorView& view, const SampleTensor& tensor,
                        SampleFill fill, uint64_t seed);

// The sample's tensors allocated on `backend` and filled (tensor i with seed
// seed + 7919 i), absent ones as empty tensors / views.
struct SampleTensors {
  std::vector<Tensor> tensors;
  std::vector<TensorView> views;
};
SampleTensors make_sample_tensors(Backend& backend, const OpSample& sample, ScalarType data,
                                  SampleFill fill, uint64_t seed = 1000);

}  // namespace modar::runtime
