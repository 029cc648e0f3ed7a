// runtime/profiler_ops.cpp: how the profiler executes one OpShape in one pass.
//
// Each (kind, pass) maps to the Backend calls the runtime's layers make for
// that op of the lowering (cost_models/lowering.cpp), with the dims meaning
// what ops.hpp says:
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
//   dar_write        n >= 2: dar_write (transport = dims[3] == 1), bank init
//                    (dims[3] == 2): n copies; emit_rstd: n rstd-only rmsnorms.
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
// Backward benches run the forward once per tensor copy first (untimed), so
// the saved state (lse, rstd, partial weights) is consistent.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "modar/errors.hpp"
#include "modar/runtime/profiler.hpp"
#include "profiler_internal.hpp"

namespace modar::runtime::profiler_detail {
namespace {

constexpr int64_t kEmbeddingTableRows = 4096;

// Deterministic fast generator for the fills (xorshift64*).
class FillRng {
 public:
  explicit FillRng(uint64_t seed) : state_(seed | 1ULL) {}
  uint64_t next() {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return state_ * 0x2545F4914F6CDD1DULL;
  }
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }

 private:
  uint64_t state_;
};

}  // namespace

TensorSpec data(std::vector<int64_t> shape, ScalarType type, Fill fill, int64_t limit) {
  return TensorSpec{std::move(shape), type, fill, limit};
}

int64_t spec_bytes(const TensorSpec& spec) {
  int64_t count = 1;
  for (int64_t d : spec.shape) {
    count *= d;
  }
  return count * scalar_bytes(spec.type);
}

namespace {

// Values of one element of a fill (index fills depend on the flat index i).
double fill_value(const TensorSpec& spec, int64_t i, int64_t width, FillRng& rng) {
  switch (spec.fill) {
    case Fill::uniform:
      return 2.0 * rng.uniform() - 1.0;
    case Fill::positive:
      return 0.5 + rng.uniform();
    case Fill::small_positive:
      return 0.01 + 0.01 * rng.uniform();
    case Fill::below:
      return static_cast<double>(rng.next() % static_cast<uint64_t>(spec.limit));
    case Fill::modulo:
      return static_cast<double>(i % spec.limit);
    case Fill::every_other:
      // Row-wise ascending distinct indices into 2 * width source rows.
      return static_cast<double>(2 * (i % width) + static_cast<int64_t>(rng.next() & 1ULL));
  }
  return 0.0;
}

void encode(ScalarType type, double value, unsigned char* out) {
  switch (type) {
    case ScalarType::fp64: {
      std::memcpy(out, &value, sizeof(double));
      break;
    }
    case ScalarType::fp32: {
      const float v = static_cast<float>(value);
      std::memcpy(out, &v, sizeof(float));
      break;
    }
    case ScalarType::bf16: {
      const uint16_t v = float_to_bf16(static_cast<float>(value));
      std::memcpy(out, &v, sizeof(uint16_t));
      break;
    }
    case ScalarType::i32: {
      const int32_t v = static_cast<int32_t>(value);
      std::memcpy(out, &v, sizeof(int32_t));
      break;
    }
  }
}

// Value fills of large tensors repeat a random block of this many elements
// (the host never holds a multi-GiB staging buffer; values stay random).
constexpr int64_t kFillBlockElements = int64_t{1} << 22;

}  // namespace

void fill_tensor(Backend& backend, const TensorView& view, const TensorSpec& spec, uint64_t seed) {
  FillRng rng(seed);
  const int64_t count = view.numel();
  const int64_t element_bytes = scalar_bytes(view.dtype);
  const bool index_fill = spec.fill == Fill::modulo || spec.fill == Fill::every_other;
  const int64_t block = index_fill ? count : std::min(count, kFillBlockElements);
  const int64_t width = view.dim(-1);
  std::vector<unsigned char> host(static_cast<size_t>(block * element_bytes));
  for (int64_t i = 0; i < block; ++i) {
    encode(view.dtype, fill_value(spec, i, width, rng), host.data() + i * element_bytes);
  }
  for (int64_t offset = 0; offset < count; offset += block) {
    const int64_t n = std::min(block, count - offset);
    const TensorView part =
        make_view(static_cast<unsigned char*>(view.data) + offset * element_bytes, view.dtype,
                  view.device, {n});
    backend.copy_from_host(host.data(), part);
  }
}

namespace {

using Views = std::vector<TensorView>;
const TensorView kNone{};

[[noreturn]] void unsupported(const OpShape& shape, Pass pass, const std::string& why) {
  throw ShapeError("profiler: " + describe(shape, pass) + ": " + why);
}

constexpr Fill U = Fill::uniform;
constexpr Fill P = Fill::positive;

// What a kind's bench depends on besides its dims.
struct BenchInputs {
  BenchInputs(const OpShape& bench_shape, Pass bench_pass)
      : shape(bench_shape),
        pass(bench_pass),
        backward(bench_pass == Pass::backward),
        dtype(scalar_type(bench_shape.dtype)),
        stats_dtype(stats_type(dtype)) {}
  [[noreturn]] void unsupported(const std::string& why) const {
    ::modar::runtime::profiler_detail::unsupported(shape, pass, why);
  }
  const OpShape& shape;
  Pass pass;
  bool backward;
  ScalarType dtype;        // of the data
  ScalarType stats_dtype;  // of the statistics (lse, rstd, logits)
};

// Stream roles of SPEC 1.2 by DarVariant value (dims carry int(DarVariant)).
int key_stream(int64_t variant, int j, int n) {
  if (n <= 1)
    return 0;
  switch (static_cast<DarVariant>(variant)) {
    case DarVariant::dar:
      return (j + 1) % n;
    case DarVariant::fixedkv:
      return 0;
    default:
      return j;  // attnres, selfkv, crossv
  }
}
// Rows per expert of an expert_gemm bench: the busiest expert
// min(M, ceil(M / G x imbalance)) rows (imbalance in permille, <= 1000 =
// balanced), the rest spread evenly over the other experts.
std::vector<double> expert_gemm_rows(int64_t groups, int64_t rows, int64_t imbalance_permille) {
  const double imbalance = std::max(1.0, static_cast<double>(imbalance_permille) / 1000.0);
  std::vector<double> counts(static_cast<size_t>(groups), 0.0);
  const int64_t busiest = std::min<int64_t>(
      rows, static_cast<int64_t>(std::ceil(static_cast<double>(rows) /
                                            static_cast<double>(groups) * imbalance - 1e-9)));
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

int value_stream(int64_t variant, int j, int n) {
  if (n <= 1)
    return 0;
  switch (static_cast<DarVariant>(variant)) {
    case DarVariant::fixedkv:
      return 1;
    case DarVariant::crossv:
      return (j + 1) % n;
    default:
      return j;
  }
}

BenchSpec bench_spec(const GemmDims& x, const BenchInputs& in) {
  const ScalarType dt = in.dtype;
  BenchSpec spec;
  auto& t = spec.tensors;
  const int64_t m = x.m, n = x.n, k = x.k, batch = std::max<int64_t>(x.batch, 1);
  if (m < 1 || n < 1 || k < 1)
    in.unsupported("m, n, k must be >= 1");
  if (batch > 1) {
    t = {data({batch, m, k}, dt, U), data({batch, k, n}, dt, U), data({batch, m, n}, dt, U)};
  } else {
    t = {data({m, k}, dt, U), data({k, n}, dt, U), data({m, n}, dt, U)};
  }
  spec.run = [](Backend& be, const Views& v) { be.gemm(v[0], false, v[1], false, v[2]); };
  return spec;
}

BenchSpec bench_spec(const AttentionDims& x, const BenchInputs& in) {
  const ScalarType dt = in.dtype;
  const ScalarType st = in.stats_dtype;
  const bool backward = in.backward;
  BenchSpec spec;
  auto& t = spec.tensors;
  const int64_t b = x.sequences, H = x.heads, G = x.kv_heads, s_q = x.query_len, s_k = x.key_len,
                dh = x.head_dim;
  if (s_q != s_k) {
    in.unsupported("the runtime's attention needs s_q == s_k (decode is not profiled)");
  }
  AttentionParams params;
  params.causal = x.causal != 0;
  // 0 q, 1 k, 2 v, 3 out, 4 lse, [5 dout, 6 dq, 7 dk, 8 dv]
  t = {data({b, s_q, H, dh}, dt, U), data({b, s_k, G, dh}, dt, U), data({b, s_k, G, dh}, dt, U),
       data({b, s_q, H, dh}, dt, U), data({b, H, s_q}, st, U)};
  auto forward = [params](Backend& be, const Views& v) {
    be.attention_forward(v[0], v[1], v[2], kNone, v[3], v[4], params);
  };
  if (!backward) {
    spec.run = forward;
  } else {
    t.push_back(data({b, s_q, H, dh}, dt, U));
    t.push_back(data({b, s_q, H, dh}, dt, U));
    t.push_back(data({b, s_k, G, dh}, dt, U));
    t.push_back(data({b, s_k, G, dh}, dt, U));
    spec.setup = forward;
    spec.run = [params](Backend& be, const Views& v) {
      be.attention_backward(v[5], v[0], v[1], v[2], kNone, v[3], v[4], v[6], v[7], v[8], params);
    };
  }
  return spec;
}

BenchSpec bench_spec(const RmsnormDims& x, const BenchInputs& in) {
  const ScalarType dt = in.dtype;
  const ScalarType st = in.stats_dtype;
  const bool backward = in.backward;
  BenchSpec spec;
  auto& t = spec.tensors;
  const int64_t rows = x.rows, d = x.width;
  // 0 x, 1 w, 2 out, 3 rstd, [4 dout, 5 dx, 6 dw]
  t = {data({rows, d}, dt, U), data({d}, dt, P), data({rows, d}, dt, U), data({rows}, st, P)};
  auto forward = [](Backend& be, const Views& v) {
    be.rmsnorm_forward(v[0], v[1], v[2], v[3], 1e-6);
  };
  if (!backward) {
    spec.run = forward;
  } else {
    t.push_back(data({rows, d}, dt, U));
    t.push_back(data({rows, d}, dt, U));
    t.push_back(data({d}, dt, U));
    spec.setup = forward;
    spec.run = [](Backend& be, const Views& v) {
      be.rmsnorm_backward(v[4], v[0], v[1], v[3], v[5], v[6]);
    };
  }
  return spec;
}

BenchSpec bench_spec(const RopeDims& x, const BenchInputs& in) {
  const ScalarType dt = in.dtype;
  const bool backward = in.backward;
  BenchSpec spec;
  auto& t = spec.tensors;
  const int64_t rows = x.rows, heads = x.heads, dh = x.head_dim;
  // 0 x / dout, 1 positions, 2 out / dx
  t = {data({rows, heads, dh}, dt, U), data({rows}, ScalarType::i32, Fill::modulo, 4096),
       data({rows, heads, dh}, dt, U)};
  if (!backward) {
    spec.run = [](Backend& be, const Views& v) { be.rope_forward(v[0], v[1], v[2], {}); };
  } else {
    spec.run = [](Backend& be, const Views& v) { be.rope_backward(v[0], v[1], v[2], {}); };
  }
  return spec;
}

BenchSpec bench_spec(const RouterDims& x, const BenchInputs& in) {
  const ScalarType dt = in.dtype;
  const ScalarType st = in.stats_dtype;
  const bool backward = in.backward;
  BenchSpec spec;
  auto& t = spec.tensors;
  const int64_t rows = x.rows, d = x.width;
  // 0 x, 1 w, 2 logits, [3 dlogits, 4 dx, 5 dw]
  t = {data({rows, d}, dt, U), data({d}, dt, U), data({rows}, st, U)};
  if (!backward) {
    spec.run = [](Backend& be, const Views& v) { be.router_forward(v[0], v[1], v[2]); };
  } else {
    t.push_back(data({rows}, st, U));
    t.push_back(data({rows, d}, dt, U));
    t.push_back(data({d}, dt, U));
    spec.run = [](Backend& be, const Views& v) {
      be.router_backward(v[3], v[0], v[1], v[4], v[5]);
    };
  }
  return spec;
}

BenchSpec bench_spec(const TopkDims& x, const BenchInputs& in) {
  const ScalarType st = in.stats_dtype;
  BenchSpec spec;
  auto& t = spec.tensors;
  const int64_t b = x.sequences, s = x.seq_len, k = x.k;
  if (k < 1 || k > s)
    in.unsupported("k must be in [1, s]");
  t = {data({b, s}, st, U), data({b, k}, ScalarType::i32, Fill::modulo, s)};
  spec.run = [](Backend& be, const Views& v) { be.topk(v[0], v[1]); };
  return spec;
}

// The routed rows' moves: gather forward and scatter_add backward run
// gather_rows (`gather_rows`), scatter_add forward and gather backward the
// scaled scatter.
BenchSpec routed_rows_bench(int64_t rows, int64_t d, bool gather_rows, const BenchInputs& in) {
  const ScalarType dt = in.dtype;
  const ScalarType st = in.stats_dtype;
  const bool backward = in.backward;
  BenchSpec spec;
  auto& t = spec.tensors;
  const int64_t source = 2 * rows;
  if (gather_rows) {
    // gather forward / scatter_add backward: out[j] (+)= x[idx[j]]
    // 0 x [1, 2 rows, d], 1 idx [1, rows], 2 out [1, rows, d]
    t = {data({1, source, d}, dt, U), data({1, rows}, ScalarType::i32, Fill::every_other),
         data({1, rows, d}, dt, U)};
    if (!backward) {
      spec.run = [](Backend& be, const Views& v) { be.gather_rows_forward(v[0], v[1], v[2]); };
    } else {
      spec.run = [](Backend& be, const Views& v) { be.gather_rows_backward(v[2], v[1], v[0]); };
    }
  } else {
    // scatter_add forward / gather backward (the routed scatter's backward)
    // 0 x [1, 2 rows, d], 1 idx, 2 logits [1, 2 rows], 3 delta [1, rows, d],
    // [4 ddelta, 5 dlogits]
    t = {data({1, source, d}, dt, U), data({1, rows}, ScalarType::i32, Fill::every_other),
         data({1, source}, st, U), data({1, rows, d}, dt, U)};
    if (!backward) {
      spec.run = [](Backend& be, const Views& v) {
        be.scatter_add_scaled_forward(v[0], v[1], v[2], v[3], RouterScale::linear);
      };
    } else {
      t.push_back(data({1, rows, d}, dt, U));
      t.push_back(data({1, source}, st, U));
      spec.run = [](Backend& be, const Views& v) {
        be.scatter_add_scaled_backward(v[0], v[1], v[2], v[3], RouterScale::linear, v[4], v[5]);
      };
    }
  }
  return spec;
}

BenchSpec bench_spec(const GatherDims& x, const BenchInputs& in) {
  return routed_rows_bench(x.rows, x.width, !in.backward, in);
}

BenchSpec bench_spec(const ScatterAddDims& x, const BenchInputs& in) {
  return routed_rows_bench(x.rows, x.width, in.backward, in);
}

BenchSpec bench_spec(const DepthReadPrefixDims& x, const BenchInputs& in) {
  const ScalarType dt = in.dtype;
  const ScalarType st = in.stats_dtype;
  const bool backward = in.backward;
  BenchSpec spec;
  auto& t = spec.tensors;
  const int64_t T = x.tokens, sources = x.sources, queries = x.queries, d = x.width;
  const int n = static_cast<int>(std::max<int64_t>(x.streams, 1));
  const int64_t variant = x.variant;
  if (queries % n != 0)
    in.unsupported("queries must be a multiple of n");
  const int64_t q = queries / n;
  // 0 bank [n, R, T, d], 1 rstd [n, R, T], 2 queries [n, Q, d], 3 out [n, Q, T, d],
  // 4 lse [n, Q, T], [5 dout, 6 dbank, 7 dqueries]
  t = {data({n, sources, T, d}, dt, U), data({n, sources, T}, st, P), data({n, q, d}, st, U),
       data({n, q, T, d}, dt, U), data({n, q, T}, st, U)};
  auto forward = [n, variant](Backend& be, const Views& v) {
    for (int j = 0; j < n; ++j) {
      const int kj = key_stream(variant, j, n), vj = value_stream(variant, j, n);
      be.depth_read_prefix_forward(select(v[0], kj), select(v[1], kj), select(v[0], vj),
                                   select(v[2], j), select(v[3], j), select(v[4], j));
    }
  };
  if (!backward) {
    spec.run = forward;
  } else {
    t.push_back(data({n, q, T, d}, dt, U));
    t.push_back(data({n, sources, T, d}, dt, U));
    t.push_back(data({n, q, d}, st, U));
    spec.setup = forward;
    spec.run = [n, variant](Backend& be, const Views& v) {
      for (int j = 0; j < n; ++j) {
        const int kj = key_stream(variant, j, n), vj = value_stream(variant, j, n);
        be.depth_read_prefix_backward(select(v[5], j), kNone, select(v[0], kj), select(v[1], kj),
                                      select(v[0], vj), select(v[2], j), select(v[3], j),
                                      select(v[4], j), select(v[6], kj), select(v[6], vj),
                                      select(v[7], j));
      }
    };
  }
  return spec;
}

BenchSpec bench_spec(const DepthReadMergeDims& x, const BenchInputs& in) {
  const ScalarType dt = in.dtype;
  const ScalarType st = in.stats_dtype;
  const bool backward = in.backward;
  BenchSpec spec;
  auto& t = spec.tensors;
  const int64_t T = x.tokens, d = x.width;
  const int n = static_cast<int>(std::max<int64_t>(x.streams, 1));
  const int64_t variant = x.variant;
  // 0 prefix_out [n,T,d], 1 prefix_lse [n,T], 2 partial [n,T,d], 3 partial_rstd [n,T],
  // 4 query [n,d], 5 out [n,T,d], 6 weight [n,T],
  // [7 dout, 8 dprefix_out, 9 dprefix_lse, 10 dpartial_keys, 11 dpartial_values, 12 dquery]
  t = {data({n, T, d}, dt, U), data({n, T}, st, U),    data({n, T, d}, dt, U), data({n, T}, st, P),
       data({n, d}, st, U),    data({n, T, d}, dt, U), data({n, T}, st, P)};
  auto forward = [n, variant](Backend& be, const Views& v) {
    for (int j = 0; j < n; ++j) {
      const int kj = key_stream(variant, j, n), vj = value_stream(variant, j, n);
      be.depth_read_merge_forward(select(v[0], j), select(v[1], j), select(v[2], kj),
                                  select(v[3], kj), select(v[2], vj), select(v[4], j),
                                  select(v[5], j), select(v[6], j));
    }
  };
  if (!backward) {
    spec.run = forward;
  } else {
    t.push_back(data({n, T, d}, dt, U));
    t.push_back(data({n, T, d}, dt, U));
    t.push_back(data({n, T}, st, U));
    t.push_back(data({n, T, d}, dt, U));
    t.push_back(data({n, T, d}, dt, U));
    t.push_back(data({n, d}, st, U));
    spec.setup = forward;
    spec.run = [n, variant](Backend& be, const Views& v) {
      for (int j = 0; j < n; ++j) {
        const int kj = key_stream(variant, j, n), vj = value_stream(variant, j, n);
        be.depth_read_merge_backward(select(v[7], j), select(v[0], j), select(v[2], kj),
                                     select(v[3], kj), select(v[2], vj), select(v[4], j),
                                     select(v[6], j), select(v[8], j), select(v[9], j),
                                     select(v[10], kj), select(v[11], vj), select(v[12], j));
      }
    };
  }
  return spec;
}

BenchSpec bench_spec(const DarCoefficientsDims& x, const BenchInputs& in) {
  const ScalarType dt = in.dtype;
  const ScalarType st = in.stats_dtype;
  const bool backward = in.backward;
  BenchSpec spec;
  auto& t = spec.tensors;
  const int64_t T = x.tokens, n = x.streams, d = x.width, outputs = x.outputs;
  if (n < 2)
    in.unsupported("dar_coefficients needs n >= 2 streams");
  const bool transport = outputs > 2 * n;
  // 0 retrieved [n,T,d], 1 weight [n d, outputs], 2 bias, 3 scale [3], 4 alpha [T,n],
  // 5 beta [T,n], 6 transport [T,n,n] (or [1] unused), 7 z_rstd [T], 8 mixed [T,d],
  // [9 dmixed, 10 dretrieved, 11 dalpha, 12 dbeta, 13 dtransport, 14 dweight, 15 dbias,
  //  16 dscale]
  t = {data({n, T, d}, dt, U),
       data({n * d, outputs}, st, Fill::small_positive),
       data({outputs}, st, U),
       data({3}, st, P),
       data({T, n}, st, P),
       data({T, n}, st, P),
       data(transport ? std::vector<int64_t>{T, n, n} : std::vector<int64_t>{1}, st, P),
       data({T}, st, P),
       data({T, d}, dt, U)};
  auto forward = [transport](Backend& be, const Views& v) {
    be.dar_coefficients_forward(v[0], v[1], v[2], v[3], v[4], v[5], transport ? v[6] : kNone, v[7],
                                {});
    be.dar_mix_forward(v[0], v[4], v[8]);
  };
  if (!backward) {
    spec.run = forward;
  } else {
    t.push_back(data({T, d}, dt, U));
    t.push_back(data({n, T, d}, dt, U));
    t.push_back(data({T, n}, st, U));
    t.push_back(data({T, n}, st, U));
    t.push_back(data(transport ? std::vector<int64_t>{T, n, n} : std::vector<int64_t>{1}, st, U));
    t.push_back(data({n * d, outputs}, st, U));
    t.push_back(data({outputs}, st, U));
    t.push_back(data({3}, st, U));
    spec.setup = forward;
    spec.run = [transport](Backend& be, const Views& v) {
      be.dar_mix_backward(v[9], v[0], v[4], v[10], v[11]);
      be.dar_coefficients_backward(v[11], v[12], transport ? v[13] : kNone, v[0], v[1], v[2], v[3],
                                   v[4], v[5], transport ? v[6] : kNone, v[7], v[10], v[14], v[15],
                                   v[16], {});
    };
  }
  return spec;
}

BenchSpec bench_spec(const DarWriteDims& x, const BenchInputs& in) {
  const ScalarType dt = in.dtype;
  const ScalarType st = in.stats_dtype;
  const bool backward = in.backward;
  BenchSpec spec;
  auto& t = spec.tensors;
  const int64_t T = x.tokens, d = x.width, mode = x.mode;
  const int n = static_cast<int>(std::max<int64_t>(x.streams, 1));
  const bool emit_rstd = x.emit_rstd != 0;
  if (mode < 0 || mode > 2)
    in.unsupported("mode must be 0, 1 or 2");
  // 0 y [T,d], 1 partial [n,T,d], 2 out [n,T,d], 3 beta [T,n], 4 transport [T,n,n],
  // 5 rstd [n,T], [6 dout [n,T,d], 7 dy [T,d], 8 dpartial, 9 dbeta, 10 dtransport]
  t = {data({T, d}, dt, U), data({n, T, d}, dt, U), data({n, T, d}, dt, U),
       data({T, n}, st, P), data({T, n, n}, st, P), data({n, T}, st, P)};
  if (backward) {
    t.push_back(data({n, T, d}, dt, U));
    t.push_back(data({T, d}, dt, U));
    t.push_back(data({n, T, d}, dt, U));
    t.push_back(data({T, n}, st, U));
    t.push_back(data({T, n, n}, st, U));
  }
  spec.run = [n, mode, emit_rstd, backward](Backend& be, const Views& v) {
    if (!backward) {
      if (mode == 2) {
        for (int j = 0; j < n; ++j)
          be.copy(v[0], reshape(select(v[2], j), {v[0].dim(0), v[0].dim(1)}));
      } else if (n == 1) {
        const TensorView out = reshape(select(v[2], 0), {v[0].dim(0), v[0].dim(1)});
        if (mode == 0) {
          be.copy(v[0], out);
        } else {
          be.add(reshape(select(v[1], 0), {v[0].dim(0), v[0].dim(1)}), v[0], out);
        }
      } else {
        be.dar_write_forward(mode == 1 ? v[4] : kNone, mode == 1 ? v[1] : kNone, v[3], v[0], v[2]);
      }
      if (emit_rstd) {
        for (int j = 0; j < n; ++j)
          be.rmsnorm_forward(select(v[2], j), kNone, kNone, select(v[5], j), 1e-6);
      }
      return;
    }
    if (mode == 2 || n == 1) {
      // Bank init / plain add: the gradient of y is the sum of the stream gradients.
      for (int j = 0; j < n; ++j) {
        be.axpy(1.0, reshape(select(v[6], j), {v[0].dim(0), v[0].dim(1)}), v[7]);
      }
      return;
    }
    be.dar_write_backward(v[6], mode == 1 ? v[4] : kNone, mode == 1 ? v[1] : kNone, v[3], v[0],
                          mode == 1 ? v[10] : kNone, mode == 1 ? v[8] : kNone, v[9], v[7]);
  };
  return spec;
}

BenchSpec bench_spec(const ElementwiseDims& x, const BenchInputs& in) {
  const ScalarType dt = in.dtype;
  const bool backward = in.backward;
  BenchSpec spec;
  auto& t = spec.tensors;
  const int64_t elements = x.elements, inputs = std::max<int64_t>(x.inputs, 1), outputs = x.outputs;
  if (!backward) {
    if (inputs == 1) {
      t = {data({elements}, dt, U), data({elements}, dt, U)};
      spec.run = [](Backend& be, const Views& v) { be.gelu_forward(v[0], v[1]); };
    } else {
      for (int64_t i = 0; i < inputs + 1; ++i)
        t.push_back(data({elements}, dt, U));
      spec.run = [inputs](Backend& be, const Views& v) {
        const TensorView& out = v[static_cast<size_t>(inputs)];
        be.add(v[0], v[1], out);
        for (int64_t i = 2; i < inputs; ++i)
          be.add(out, v[static_cast<size_t>(i)], out);
      };
    }
  } else if (outputs >= 2) {
    // 0 dout, 1 gate, 2 up, 3 dgate, 4 dup
    for (int i = 0; i < 5; ++i)
      t.push_back(data({elements}, dt, U));
    spec.run = [](Backend& be, const Views& v) {
      be.swiglu_backward(v[0], v[1], v[2], v[3], v[4]);
    };
  } else {
    // 0 dout, 1 x, 2 dx
    for (int i = 0; i < 3; ++i)
      t.push_back(data({elements}, dt, U));
    spec.run = [](Backend& be, const Views& v) { be.gelu_backward(v[0], v[1], v[2]); };
  }
  return spec;
}

BenchSpec bench_spec(const CrossEntropyDims& x, const BenchInputs& in) {
  const ScalarType dt = in.dtype;
  const ScalarType st = in.stats_dtype;
  const bool backward = in.backward;
  BenchSpec spec;
  auto& t = spec.tensors;
  const int64_t rows = x.rows, vocab = x.vocab;
  // 0 logits, 1 targets, 2 loss, 3 lse, [4 dlogits]
  t = {data({rows, vocab}, dt, U), data({rows}, ScalarType::i32, Fill::below, vocab),
       data({1}, st, U), data({rows}, st, U)};
  auto forward = [](Backend& be, const Views& v) {
    be.cross_entropy_forward(v[0], v[1], v[2], v[3]);
  };
  if (!backward) {
    spec.run = forward;
  } else {
    t.push_back(data({rows, vocab}, dt, U));
    spec.setup = forward;
    spec.run = [](Backend& be, const Views& v) {
      be.cross_entropy_backward(1.0, v[0], v[1], v[3], v[4]);
    };
  }
  return spec;
}

BenchSpec bench_spec(const EmbeddingDims& x, const BenchInputs& in) {
  const ScalarType dt = in.dtype;
  const bool backward = in.backward;
  BenchSpec spec;
  auto& t = spec.tensors;
  const int64_t rows = x.rows, d = x.width;
  // 0 table, 1 tokens, 2 out / dout
  t = {data({kEmbeddingTableRows, d}, dt, U),
       data({rows}, ScalarType::i32, Fill::below, kEmbeddingTableRows), data({rows, d}, dt, U)};
  if (!backward) {
    spec.run = [](Backend& be, const Views& v) { be.embedding_forward(v[0], v[1], v[2]); };
  } else {
    spec.run = [](Backend& be, const Views& v) { be.embedding_backward(v[2], v[1], v[0]); };
  }
  return spec;
}

BenchSpec bench_spec(const ExpertGemmDims& x, const BenchInputs& in) {
  const ScalarType dt = in.dtype;
  BenchSpec spec;
  auto& t = spec.tensors;
  // One grouped_gemm over G experts and M rows in all, split by
  // expert_gemm_rows (the busiest expert ceil(M / G x imbalance) rows):
  //   ragged_inner 0: C[M, n] = A[M, k] B_g[k, n];
  //   ragged_inner 1 (weight gradient): C_g[n, k] = A_g[m_g, n]^T B_g[m_g, k].
  const int64_t groups = x.groups, rows = x.rows, n = x.n, k = x.k;
  if (groups < 1 || rows < 1 || n < 1 || k < 1)
    in.unsupported("G, M, n, k must be >= 1");
  const std::vector<double> counts = expert_gemm_rows(groups, rows, x.imbalance_permille);
  // 0 counts, 1 A, 2 B, 3 C
  if (x.ragged_inner == 0) {
    t = {data({groups}, ScalarType::i32, Fill::modulo, 1), data({rows, k}, dt, U),
         data({groups, k, n}, dt, U), data({rows, n}, dt, U)};
    spec.run = [](Backend& be, const Views& v) {
      be.grouped_gemm(v[1], false, v[2], false, v[3], v[0]);
    };
  } else {
    t = {data({groups}, ScalarType::i32, Fill::modulo, 1), data({rows, n}, dt, U),
         data({rows, k}, dt, U), data({groups, n, k}, dt, U)};
    spec.run = [](Backend& be, const Views& v) {
      be.grouped_gemm(v[1], true, v[2], false, v[3], v[0], 1.0, 1.0);
    };
  }
  spec.setup = [counts](Backend& be, const Views& v) { upload(be, counts, v[0]); };
  return spec;
}

BenchSpec bench_spec(const MoeTopkDims& x, const BenchInputs& in) {
  const ScalarType st = in.stats_dtype;
  const bool backward = in.backward;
  BenchSpec spec;
  auto& t = spec.tensors;
  // Router softmax + top-k + gates and the load-balancing / z losses over
  // `choices` experts; backward: their backwards into the logits.
  const int64_t rows = x.rows, choices = x.choices, k = x.k;
  if (rows < 1 || k < 1 || k > choices)
    in.unsupported("needs rows >= 1 and k in [1, choices]");
  // 0 logits, 1 probs, 2 indices, 3 gates, 4 loss, 5 dgates, 6 dlogits,
  // 7 counts, 8 slots (forward: the dispatch of the chosen experts)
  t = {data({rows, choices}, st, U), data({rows, choices}, st, P),
       data({rows, k}, ScalarType::i32, Fill::modulo, k), data({rows, k}, st, P), data({2}, st, U)};
  auto forward = [](Backend& be, const Views& v) {
    be.moe_route_forward(v[0], v[1], v[2], v[3], MoeRouteParams{});
    be.moe_aux_loss_forward(v[0], v[1], v[2], v[4]);
  };
  auto forward_and_dispatch = [forward](Backend& be, const Views& v) {
    forward(be, v);
    be.moe_dispatch(v[2], v[7], v[8], 0);
  };
  t.push_back(data({rows, k}, st, U));
  t.push_back(data({rows, choices}, st, U));
  t.push_back(data({choices}, ScalarType::i32, Fill::modulo, 1));
  t.push_back(data({rows, k}, ScalarType::i32, Fill::modulo, 1));
  if (!backward) {
    spec.run = forward_and_dispatch;
  } else {
    spec.setup = forward;
    spec.run = [](Backend& be, const Views& v) {
      be.moe_route_backward(v[5], v[1], v[2], v[3], v[6], MoeRouteParams{});
      be.moe_aux_loss_backward(0.01, 0.001, v[0], v[1], v[2], v[6]);
    };
  }
  return spec;
}

// The expert permutations: `slots` expert rows of width d for `rows` tokens
// with k choices each.
BenchSpec expert_rows_bench(int64_t slots, int64_t d, int64_t rows, int64_t k, bool permute,
                            const BenchInputs& in) {
  const ScalarType dt = in.dtype;
  const ScalarType st = in.stats_dtype;
  const bool backward = in.backward;
  BenchSpec spec;
  auto& t = spec.tensors;
  // `slots` expert rows of width d for `rows` tokens with k choices each
  // (permute: k = ceil(slots / rows)); assignment t k + j goes to row
  // t k + j while that is < slots, the rest are dropped (-1): the slot map
  // is uploaded in the untimed setup.
  if (slots < 1 || rows < 1 || d < 1 || k < 1)
    in.unsupported("needs slots, d, rows, k >= 1");
  // 0 slot map [rows, k], 1 tokens [rows, d], 2 expert rows [slots, d], 3 gates,
  // 4 gradient of the gates, 5 gradient of the expert rows
  t = {data({rows, k}, ScalarType::i32, Fill::modulo, slots),
       data({rows, d}, dt, U),
       data({slots, d}, dt, U),
       data({rows, k}, st, P),
       data({rows, k}, st, U),
       data({slots, d}, dt, U)};
  std::vector<double> slot_map(static_cast<size_t>(rows * k));
  for (size_t i = 0; i < slot_map.size(); ++i) {
    slot_map[i] = static_cast<int64_t>(i) < slots ? static_cast<double>(i) : -1.0;
  }
  spec.setup = [slot_map](Backend& be, const Views& v) { upload(be, slot_map, v[0]); };
  if (permute) {
    if (!backward) {
      spec.run = [](Backend& be, const Views& v) { be.moe_permute_forward(v[1], v[0], v[2]); };
    } else {
      spec.run = [](Backend& be, const Views& v) { be.moe_permute_backward(v[2], v[0], v[1]); };
    }
  } else if (!backward) {
    spec.run = [](Backend& be, const Views& v) {
      be.moe_unpermute_forward(v[2], v[0], v[3], v[1]);
    };
  } else {
    spec.run = [](Backend& be, const Views& v) {
      be.moe_unpermute_backward(v[1], v[2], v[0], v[3], v[5], v[4]);
    };
  }
  return spec;
}

BenchSpec bench_spec(const PermuteDims& x, const BenchInputs& in) {
  // k = ceil(slots / rows).
  const int64_t rows = std::max<int64_t>(x.rows, 1);
  return expert_rows_bench(x.slots, x.width, x.rows, (x.slots + rows - 1) / rows, true, in);
}

BenchSpec bench_spec(const UnpermuteDims& x, const BenchInputs& in) {
  return expert_rows_bench(x.slots, x.width, x.rows, x.k, false, in);
}

BenchSpec bench_spec(const OptimizerUpdateDims& x, const BenchInputs& in) {
  const ScalarType dt = in.dtype;
  BenchSpec spec;
  auto& t = spec.tensors;
  const int64_t params = x.params;
  const bool low_precision = dt == ScalarType::bf16;
  const ScalarType master = dt == ScalarType::fp64 ? ScalarType::fp64 : ScalarType::fp32;
  // 0 params, 1 grads, 2 m, 3 v, 4 params_lowp
  t = {data({params}, master, U), data({params}, dt, U), data({params}, master, U),
       data({params}, master, Fill::small_positive)};
  if (low_precision)
    t.push_back(data({params}, dt, U));
  spec.run = [low_precision](Backend& be, const Views& v) {
    AdamWParams hyper;
    hyper.learning_rate = 1e-6;
    be.adamw_update(v[0], v[1], v[2], v[3], hyper, low_precision ? v[4] : kNone);
  };
  return spec;
}

}  // namespace

BenchSpec bench_spec(const OpShape& shape, Pass pass) {
  for (int i = 0; i < op_dims_count(shape.kind); ++i) {
    if (shape.dims[static_cast<size_t>(i)] < 0) {
      unsupported(shape, pass, "negative dimension");
    }
  }
  const BenchInputs in{shape, pass};
  return visit_dims(shape, [&](const auto& dims) { return bench_spec(dims, in); });
}

}  // namespace modar::runtime::profiler_detail
