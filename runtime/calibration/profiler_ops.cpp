// runtime/profiler_ops.cpp: what the profiler executes for one OpShape in one
// pass: the samples (modar/runtime/op_samples.hpp, the one recipe per runtime
// op that the op harness tests) of the Backend calls the runtime's layers make
// for that op of the lowering (cost_models/lowering.cpp), at the kind's dims:
//
//   gemm             C[m,n] = A[m,k] B[k,n] (batched when batch > 1).  The
//                    timing model times a GEMM the same in every pass (a
//                    dgrad / wgrad is a GEMM), so only the forward is profiled.
//   attention        attention_forward / _backward (s_q must equal s_k).
//   rmsnorm, rope, router, cross_entropy, embedding: the op's _forward /
//                    _backward (embedding table: kEmbeddingTableRows rows).
//   topk             topk over [b, s] logits (forward only).
//   gather           forward: gather_rows_forward of `rows` rows out of
//                    2*rows; backward (the backward of the routed scatter, as
//                    the lowering labels it): scatter_add_scaled_backward.
//   scatter_add      forward: scatter_add_scaled_forward; backward (of the
//                    gather): gather_rows_backward.
//   depth_read_prefix  n calls (one per output stream), queries / n each.
//   depth_read_merge n calls (one per stream).
//   dar_coefficients dar_coefficients + dar_mix (backward: both backwards).
//   dar_write        n >= 2: dar_write (transport = mode 1), bank init
//                    (mode 2): n copies; emit_rstd: n rstd-only rmsnorms.
//                    n == 1: P = y (copy) / P += y (add).
//   elementwise      forward: 1 input GELU, 2+ inputs (inputs - 1) adds;
//                    backward: 2 outputs SwiGLU backward, else GELU backward.
//   optimizer_update adamw_update over `params` fp32 master weights.
//   expert_gemm      one grouped_gemm over G experts and M rows (the busiest
//                    expert ceil(M / G x imbalance) rows); ragged_inner = the
//                    weight-gradient form.  Both passes run the same call.
//   moe_topk         forward: moe_route_forward + moe_aux_loss_forward +
//                    moe_dispatch; backward: the route and loss backwards.
//   permute          moe_permute_forward / _backward (k = ceil(slots / rows)).
//   unpermute        moe_unpermute_forward / _backward (the gated combine).
//
// A call per stream reads its own copy of its tensors (the variants' sharing
// of key and value streams is not modelled: the bytes each call reads are the
// same).  Backward samples run their forward first (untimed), so the saved
// state (lse, rstd, partial weights) is consistent.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "modar/base/errors.hpp"
#include "modar/runtime/profiler.hpp"
#include "profiler_internal.hpp"

namespace modar::runtime::profiler_detail {
namespace {

constexpr int64_t kEmbeddingTableRows = 4096;

[[noreturn]] void unsupported(const OpShape& shape, Pass pass, const std::string& why) {
  throw ShapeError("profiler: " + describe(shape, pass) + ": " + why);
}

// What a kind's bench depends on besides its dims.
struct BenchInputs {
  const OpShape& shape;
  Pass pass;
  bool backward() const { return pass == Pass::backward; }
  [[noreturn]] void unsupported(const std::string& why) const {
    ::modar::runtime::profiler_detail::unsupported(shape, pass, why);
  }
  // The forward or the backward op by pass.
  OpId by_pass(OpId forward, OpId backward_op) const { return backward() ? backward_op : forward; }
};

std::vector<OpSample> one(OpId op, const SampleSizes& sizes) {
  return {op_sample(op, sizes)};
}
std::vector<OpSample> repeated(OpId op, const SampleSizes& sizes, int64_t count) {
  std::vector<OpSample> parts;
  for (int64_t i = 0; i < count; ++i)
    parts.push_back(op_sample(op, sizes));
  return parts;
}

// Rows per expert of an expert_gemm bench: the busiest expert
// min(M, ceil(M / G x imbalance)) rows (imbalance in permille, <= 1000 =
// balanced), the rest spread evenly over the other experts.
std::vector<double> expert_gemm_rows(int64_t groups, int64_t rows, int64_t imbalance_permille) {
  const double imbalance = std::max(1.0, static_cast<double>(imbalance_permille) / 1000.0);
  std::vector<double> counts(static_cast<size_t>(groups), 0.0);
  const int64_t busiest = std::min<int64_t>(
      rows, static_cast<int64_t>(std::ceil(
                static_cast<double>(rows) / static_cast<double>(groups) * imbalance - 1e-9)));
  counts[0] = static_cast<double>(busiest);
  int64_t left = rows - busiest;
  for (int64_t g = 1; g < groups; ++g) {
    const int64_t share = left / (groups - g);
    counts[static_cast<size_t>(g)] = static_cast<double>(share);
    left -= share;
  }
  counts[0] += static_cast<double>(left);  // G = 1, or rounding
  return counts;
}

std::vector<OpSample> bench(const GemmDims& x, const BenchInputs& in) {
  if (x.m < 1 || x.n < 1 || x.k < 1)
    in.unsupported("m, n, k must be >= 1");
  return one(OpId::gemm, {.rows = x.m, .inner = x.k, .cols = x.n, .matrices = x.batch});
}

std::vector<OpSample> bench(const AttentionDims& x, const BenchInputs& in) {
  if (x.query_len != x.key_len)
    in.unsupported("the runtime's attention needs s_q == s_k (decode is not profiled)");
  return one(in.by_pass(OpId::attention_forward, OpId::attention_backward),
             {.rows = x.query_len,
              .batch = x.sequences,
              .heads = x.heads,
              .kv_heads = x.kv_heads,
              .head_dim = x.head_dim,
              .causal = x.causal != 0});
}

std::vector<OpSample> bench(const RmsnormDims& x, const BenchInputs& in) {
  return one(in.by_pass(OpId::rmsnorm_forward, OpId::rmsnorm_backward),
             {.rows = x.rows, .width = x.width});
}

std::vector<OpSample> bench(const RopeDims& x, const BenchInputs& in) {
  return one(in.by_pass(OpId::rope_forward, OpId::rope_backward),
             {.rows = x.rows, .batch = 1, .heads = x.heads, .head_dim = x.head_dim});
}

std::vector<OpSample> bench(const RouterDims& x, const BenchInputs& in) {
  return one(in.by_pass(OpId::router_forward, OpId::router_backward),
             {.rows = x.rows, .width = x.width});
}

std::vector<OpSample> bench(const TopkDims& x, const BenchInputs& in) {
  if (x.k < 1 || x.k > x.seq_len)
    in.unsupported("k must be in [1, s]");
  return one(OpId::topk, {.rows = x.k, .batch = x.sequences, .candidates = x.seq_len});
}

// The routed rows' moves: gather forward and scatter_add backward run
// gather_rows, scatter_add forward and gather backward the scaled scatter.
std::vector<OpSample> bench(const GatherDims& x, const BenchInputs& in) {
  return one(in.by_pass(OpId::gather_rows_forward, OpId::scatter_add_scaled_backward),
             {.rows = x.rows, .batch = 1, .width = x.width});
}

std::vector<OpSample> bench(const ScatterAddDims& x, const BenchInputs& in) {
  return one(in.by_pass(OpId::scatter_add_scaled_forward, OpId::gather_rows_backward),
             {.rows = x.rows, .batch = 1, .width = x.width, .gate = RouterScale::linear});
}

int64_t stream_count(int64_t streams) {
  return std::max<int64_t>(streams, 1);
}

std::vector<OpSample> bench(const DepthReadPrefixDims& x, const BenchInputs& in) {
  const int64_t n = stream_count(x.streams);
  if (x.queries % n != 0)
    in.unsupported("queries must be a multiple of n");
  return repeated(
      in.by_pass(OpId::depth_read_prefix_forward, OpId::depth_read_prefix_backward),
      {.rows = x.tokens, .width = x.width, .sources = x.sources, .queries = x.queries / n}, n);
}

std::vector<OpSample> bench(const DepthReadMergeDims& x, const BenchInputs& in) {
  return repeated(in.by_pass(OpId::depth_read_merge_forward, OpId::depth_read_merge_backward),
                  {.rows = x.tokens, .width = x.width}, stream_count(x.streams));
}

std::vector<OpSample> bench(const DarCoefficientsDims& x, const BenchInputs& in) {
  if (x.streams < 2)
    in.unsupported("dar_coefficients needs n >= 2 streams");
  const SampleSizes sizes{.rows = x.tokens,
                          .width = x.width,
                          .streams = x.streams,
                          .transport = x.outputs > 2 * x.streams};
  if (!in.backward())
    return {op_sample(OpId::dar_coefficients_forward, sizes),
            op_sample(OpId::dar_mix_forward, sizes)};
  return {op_sample(OpId::dar_mix_backward, sizes),
          op_sample(OpId::dar_coefficients_backward, sizes)};
}

std::vector<OpSample> bench(const DarWriteDims& x, const BenchInputs& in) {
  if (x.mode < 0 || x.mode > 2)
    in.unsupported("mode must be 0, 1 or 2");
  const int64_t n = stream_count(x.streams);
  const SampleSizes stream{.rows = x.tokens, .width = x.width};
  std::vector<OpSample> parts;
  if (in.backward()) {
    // Bank init / plain add: the gradient of y is the sum of the stream gradients.
    if (x.mode == 2 || n == 1)
      return repeated(OpId::axpy, stream, n);
    return one(OpId::dar_write_backward,
               {.rows = x.tokens, .width = x.width, .streams = n, .transport = x.mode == 1});
  }
  if (x.mode == 2) {
    parts = repeated(OpId::copy, stream, n);
  } else if (n == 1) {
    parts = one(x.mode == 0 ? OpId::copy : OpId::add, stream);
  } else {
    parts = one(OpId::dar_write_forward,
                {.rows = x.tokens, .width = x.width, .streams = n, .transport = x.mode == 1});
  }
  if (x.emit_rstd != 0) {
    SampleSizes rstd = stream;
    rstd.rstd_only = true;
    for (OpSample& part : repeated(OpId::rmsnorm_forward, rstd, n))
      parts.push_back(std::move(part));
  }
  return parts;
}

std::vector<OpSample> bench(const ElementwiseDims& x, const BenchInputs& in) {
  const SampleSizes flat{.rows = x.elements, .width = 1};
  const int64_t inputs = std::max<int64_t>(x.inputs, 1);
  if (in.backward())
    return one(x.outputs >= 2 ? OpId::swiglu_backward : OpId::gelu_backward, flat);
  if (inputs == 1)
    return one(OpId::gelu_forward, flat);
  return repeated(OpId::add, flat, inputs - 1);
}

std::vector<OpSample> bench(const CrossEntropyDims& x, const BenchInputs& in) {
  return one(in.by_pass(OpId::cross_entropy_forward, OpId::cross_entropy_backward),
             {.rows = x.rows, .vocab = x.vocab});
}

std::vector<OpSample> bench(const EmbeddingDims& x, const BenchInputs& in) {
  return one(in.by_pass(OpId::embedding_forward, OpId::embedding_backward),
             {.rows = x.rows, .batch = 1, .width = x.width, .table_rows = kEmbeddingTableRows});
}

// One grouped_gemm over G experts and M rows in all, split by
// expert_gemm_rows (the busiest expert ceil(M / G x imbalance) rows):
//   ragged_inner 0: C[M, n] = A[M, k] B_g[k, n];
//   ragged_inner 1 (weight gradient): C_g[n, k] = A_g[m_g, n]^T B_g[m_g, k].
std::vector<OpSample> bench(const ExpertGemmDims& x, const BenchInputs& in) {
  if (x.groups < 1 || x.rows < 1 || x.n < 1 || x.k < 1)
    in.unsupported("G, M, n, k must be >= 1");
  SampleSizes sizes{.rows = x.rows, .inner = x.k, .cols = x.n};
  sizes.group_rows = expert_gemm_rows(x.groups, x.rows, x.imbalance_permille);
  sizes.ragged_inner = x.ragged_inner != 0;
  return one(OpId::grouped_gemm, sizes);
}

// Router softmax + top-k + gates and the load-balancing / z losses over
// `choices` experts, and the dispatch of the chosen ones (dropless);
// backward: their backwards into the logits.
std::vector<OpSample> bench(const MoeTopkDims& x, const BenchInputs& in) {
  if (x.rows < 1 || x.k < 1 || x.k > x.choices)
    in.unsupported("needs rows >= 1 and k in [1, choices]");
  const SampleSizes sizes{.rows = x.rows,
                          .experts = x.choices,
                          .local_experts = x.choices,
                          .top_k = x.k,
                          .capacity = 0};
  if (in.backward())
    return {op_sample(OpId::moe_route_backward, sizes),
            op_sample(OpId::moe_aux_loss_backward, sizes)};
  return {op_sample(OpId::moe_route_forward, sizes), op_sample(OpId::moe_aux_loss_forward, sizes),
          op_sample(OpId::moe_dispatch, sizes)};
}

// The expert permutations: `slots` expert rows of width d for `rows` tokens
// with k choices each; the assignments beyond `slots` are dropped.
std::vector<OpSample> expert_rows_bench(int64_t slots, int64_t d, int64_t rows, int64_t k, OpId op,
                                        const BenchInputs& in) {
  if (slots < 1 || rows < 1 || d < 1 || k < 1)
    in.unsupported("needs slots, d, rows, k >= 1");
  return one(op, {.rows = rows, .width = d, .top_k = k, .expert_rows = slots});
}

std::vector<OpSample> bench(const PermuteDims& x, const BenchInputs& in) {
  // k = ceil(slots / rows).
  const int64_t rows = std::max<int64_t>(x.rows, 1);
  return expert_rows_bench(x.slots, x.width, x.rows, (x.slots + rows - 1) / rows,
                           in.by_pass(OpId::moe_permute_forward, OpId::moe_permute_backward), in);
}

std::vector<OpSample> bench(const UnpermuteDims& x, const BenchInputs& in) {
  return expert_rows_bench(x.slots, x.width, x.rows, x.k,
                           in.by_pass(OpId::moe_unpermute_forward, OpId::moe_unpermute_backward),
                           in);
}

std::vector<OpSample> bench(const OptimizerUpdateDims& x, const BenchInputs&) {
  return one(OpId::adamw_update, {.rows = x.params, .width = 1});
}

}  // namespace

BenchSpec bench_spec(const OpShape& shape, Pass pass) {
  for (int i = 0; i < op_dims_count(shape.kind); ++i) {
    if (shape.dims[static_cast<size_t>(i)] < 0) {
      unsupported(shape, pass, "negative dimension");
    }
  }
  const BenchInputs in{shape, pass};
  BenchSpec spec;
  spec.dtype = scalar_type(shape.dtype);
  spec.parts = visit_dims(shape, [&](const auto& dims) { return bench(dims, in); });
  return spec;
}

std::vector<SampleTensor> bench_tensors(const BenchSpec& spec) {
  std::vector<SampleTensor> tensors;
  for (const OpSample& part : spec.parts)
    tensors.insert(tensors.end(), part.tensors.begin(), part.tensors.end());
  return tensors;
}

int64_t bench_bytes(const BenchSpec& spec) {
  int64_t bytes = 0;
  for (const SampleTensor& tensor : bench_tensors(spec))
    bytes += sample_tensor_bytes(tensor, spec.dtype);
  return bytes;
}

BenchCalls bench_calls(const BenchSpec& spec, const std::vector<TensorView>& views) {
  BenchCalls calls;
  size_t first = 0;
  for (const OpSample& part : spec.parts) {
    const std::vector<TensorView> part_views(
        views.begin() + static_cast<ptrdiff_t>(first),
        views.begin() + static_cast<ptrdiff_t>(first + part.tensors.size()));
    first += part.tensors.size();
    std::vector<OpArgs> part_calls = part.calls(part_views);
    calls.timed.push_back(part_calls.back());
    part_calls.pop_back();
    calls.setup.insert(calls.setup.end(), part_calls.begin(), part_calls.end());
  }
  return calls;
}

}  // namespace modar::runtime::profiler_detail
