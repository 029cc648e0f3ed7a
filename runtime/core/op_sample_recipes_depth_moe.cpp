// runtime/core/op_sample_recipes_depth_moe.cpp: the sample recipes of the
// depth reads, the DAR head and the Mixture-of-Experts ops (op_samples.hpp).
// One call per sample: a DAR layer's n streams are n samples (the profiler
// composes them).
#include <algorithm>
#include <numeric>

#include "op_sample_recipes.hpp"

namespace modar::runtime::sample_recipes {

// ---- depth reads -------------------------------------------------------------------

// Prefix read: `queries` queries over `sources` stored blocks of `rows` tokens.
struct PrefixTensors {
  int keys, key_rstd, values, queries, out, lse;
};
PrefixTensors prefix_tensors(OpSample& r, const SampleSizes& s) {
  PrefixTensors t{};
  t.keys = add(r, in({s.sources, s.rows, s.width}));
  t.key_rstd = add(r, in({s.sources, s.rows}, kStatsPositive));
  t.values = add(r, in({s.sources, s.rows, s.width}));
  t.queries = add(r, in({s.queries, s.width}, kStats));
  t.out = add(r, out({s.queries, s.rows, s.width}));
  t.lse = add(r, out({s.queries, s.rows}, kStats));
  return t;
}
DepthReadPrefixForwardArgs prefix_call(const PrefixTensors& t, const Views& v) {
  return {.keys = v[t.keys],
          .key_rstd = v[t.key_rstd],
          .values = v[t.values],
          .queries = v[t.queries],
          .out = v[t.out],
          .lse = v[t.lse]};
}

OpSample depth_read_prefix_forward(const SampleSizes& s) {
  OpSample r;
  const PrefixTensors t = prefix_tensors(r, s);
  r.calls = [=](const Views& v) { return Calls{prefix_call(t, v)}; };
  r.outputs = {t.out, t.lse};
  return r;
}

OpSample depth_read_prefix_backward(const SampleSizes& s) {
  OpSample r;
  const PrefixTensors t = prefix_tensors(r, s);
  const int dout = add(r, in({s.queries, s.rows, s.width}));
  const int dlse = add(r, in({s.queries, s.rows}, kStats));
  const int dkeys = add(r, acc({s.sources, s.rows, s.width}));
  const int dvalues = add(r, acc({s.sources, s.rows, s.width}));
  const int dqueries = add(r, acc({s.queries, s.width}, kStats));
  r.calls = [=](const Views& v) {
    return Calls{prefix_call(t, v), DepthReadPrefixBackwardArgs{.dout = v[dout],
                                                                .dlse = v[dlse],
                                                                .keys = v[t.keys],
                                                                .key_rstd = v[t.key_rstd],
                                                                .values = v[t.values],
                                                                .queries = v[t.queries],
                                                                .out = v[t.out],
                                                                .lse = v[t.lse],
                                                                .dkeys = v[dkeys],
                                                                .dvalues = v[dvalues],
                                                                .dqueries = v[dqueries]}};
  };
  r.outputs = {dkeys, dvalues, dqueries};
  return r;
}

// Merge of the prefix read with the block's partial sum, for `rows` tokens.
struct MergeTensors {
  int prefix_out, prefix_lse, partial_keys, partial_key_rstd, partial_values, query, out, weight;
};
MergeTensors merge_tensors(OpSample& r, const SampleSizes& s) {
  MergeTensors t{};
  t.prefix_out = add(r, in({s.rows, s.width}));
  t.prefix_lse = add(r, in({s.rows}, kStats));
  t.partial_keys = add(r, in({s.rows, s.width}));
  t.partial_key_rstd = add(r, in({s.rows}, kStatsPositive));
  t.partial_values = add(r, in({s.rows, s.width}));
  t.query = add(r, in({s.width}, kStats));
  t.out = add(r, out({s.rows, s.width}));
  t.weight = add(r, out({s.rows}, kStats));
  return t;
}
DepthReadMergeForwardArgs merge_call(const MergeTensors& t, const Views& v) {
  return {.prefix_out = v[t.prefix_out],
          .prefix_lse = v[t.prefix_lse],
          .partial_keys = v[t.partial_keys],
          .partial_key_rstd = v[t.partial_key_rstd],
          .partial_values = v[t.partial_values],
          .query = v[t.query],
          .out = v[t.out],
          .partial_weight = v[t.weight]};
}

OpSample depth_read_merge_forward(const SampleSizes& s) {
  OpSample r;
  const MergeTensors t = merge_tensors(r, s);
  r.calls = [=](const Views& v) { return Calls{merge_call(t, v)}; };
  r.outputs = {t.out, t.weight};
  return r;
}

OpSample depth_read_merge_backward(const SampleSizes& s) {
  OpSample r;
  const MergeTensors t = merge_tensors(r, s);
  const int dout = add(r, in({s.rows, s.width}));
  const int dprefix_out = add(r, acc({s.rows, s.width}));
  const int dprefix_lse = add(r, acc({s.rows}, kStats));
  const int dpartial_keys = add(r, acc({s.rows, s.width}));
  const int dpartial_values = add(r, acc({s.rows, s.width}));
  const int dquery = add(r, acc({s.width}, kStats));
  r.calls = [=](const Views& v) {
    return Calls{merge_call(t, v),
                 DepthReadMergeBackwardArgs{.dout = v[dout],
                                            .prefix_out = v[t.prefix_out],
                                            .partial_keys = v[t.partial_keys],
                                            .partial_key_rstd = v[t.partial_key_rstd],
                                            .partial_values = v[t.partial_values],
                                            .query = v[t.query],
                                            .partial_weight = v[t.weight],
                                            .dprefix_out = v[dprefix_out],
                                            .dprefix_lse = v[dprefix_lse],
                                            .dpartial_keys = v[dpartial_keys],
                                            .dpartial_values = v[dpartial_values],
                                            .dquery = v[dquery]}};
  };
  r.outputs = {dprefix_out, dprefix_lse, dpartial_keys, dpartial_values, dquery};
  return r;
}

// ---- the DAR head: n = streams, `rows` tokens --------------------------------------

// The head's outputs: alpha and beta (n each) and the transport's logits (one
// for n = 2, n x n for Sinkhorn's n > 2).
int64_t coefficient_outputs(const SampleSizes& s) {
  const int64_t n = s.streams;
  return 2 * n + (s.transport ? (n == 2 ? 1 : n * n) : 0);
}

struct CoefficientTensors {
  int retrieved, weight, bias, scale, alpha, beta, transport, z_rstd;  // transport -1: none
};
CoefficientTensors coefficient_tensors(OpSample& r, const SampleSizes& s) {
  const int64_t n = s.streams;
  const int64_t outputs = coefficient_outputs(s);
  CoefficientTensors t{};
  t.retrieved = add(r, in({n, s.rows, s.width}));
  t.weight = add(r, in({n * s.width, outputs}, SampleRole::stats_small));
  t.bias = add(r, in({outputs}, kStats));
  t.scale = add(r, in({3}, kStatsPositive));
  t.alpha = add(r, out({s.rows, n}, kStats));
  t.beta = add(r, out({s.rows, n}, kStats));
  t.transport = s.transport ? add(r, out({s.rows, n, n}, kStats)) : -1;
  t.z_rstd = add(r, out({s.rows}, kStats));
  return t;
}
DarCoefficientsForwardArgs coefficient_call(const CoefficientTensors& t, const Views& v) {
  return {.retrieved = v[t.retrieved],
          .weight = v[t.weight],
          .bias = v[t.bias],
          .scale = v[t.scale],
          .alpha = v[t.alpha],
          .beta = v[t.beta],
          .transport = at(v, t.transport),
          .z_rstd = v[t.z_rstd]};
}

OpSample dar_coefficients_forward(const SampleSizes& s) {
  OpSample r;
  const CoefficientTensors t = coefficient_tensors(r, s);
  r.calls = [=](const Views& v) { return Calls{coefficient_call(t, v)}; };
  r.outputs = {t.alpha, t.beta, t.z_rstd};
  if (t.transport >= 0)
    r.outputs.push_back(t.transport);
  return r;
}

OpSample dar_coefficients_backward(const SampleSizes& s) {
  OpSample r;
  const int64_t n = s.streams;
  const int64_t outputs = coefficient_outputs(s);
  const CoefficientTensors t = coefficient_tensors(r, s);
  const int dalpha = add(r, in({s.rows, n}, kStats)), dbeta = add(r, in({s.rows, n}, kStats));
  const int dtransport = s.transport ? add(r, in({s.rows, n, n}, kStats)) : -1;
  const int dretrieved = add(r, acc({n, s.rows, s.width}));
  const int dweight = add(r, acc({n * s.width, outputs}, kStats));
  const int dbias = add(r, acc({outputs}, kStats)), dscale = add(r, acc({3}, kStats));
  r.calls = [=](const Views& v) {
    return Calls{coefficient_call(t, v),
                 DarCoefficientsBackwardArgs{.dalpha = v[dalpha],
                                             .dbeta = v[dbeta],
                                             .dtransport = at(v, dtransport),
                                             .retrieved = v[t.retrieved],
                                             .weight = v[t.weight],
                                             .bias = v[t.bias],
                                             .scale = v[t.scale],
                                             .alpha = v[t.alpha],
                                             .beta = v[t.beta],
                                             .transport = at(v, t.transport),
                                             .z_rstd = v[t.z_rstd],
                                             .dretrieved = v[dretrieved],
                                             .dweight = v[dweight],
                                             .dbias = v[dbias],
                                             .dscale = v[dscale]}};
  };
  r.outputs = {dretrieved, dweight, dbias, dscale};
  return r;
}

OpSample dar_mix_forward(const SampleSizes& s) {
  OpSample r;
  const int retrieved = add(r, in({s.streams, s.rows, s.width}));
  const int alpha = add(r, in({s.rows, s.streams}, kStats));
  const int y = add(r, out({s.rows, s.width}));
  r.calls = [=](const Views& v) {
    return Calls{DarMixForwardArgs{.retrieved = v[retrieved], .alpha = v[alpha], .out = v[y]}};
  };
  r.outputs = {y};
  return r;
}

OpSample dar_mix_backward(const SampleSizes& s) {
  OpSample r;
  const int dout = add(r, in({s.rows, s.width}));
  const int retrieved = add(r, in({s.streams, s.rows, s.width}));
  const int alpha = add(r, in({s.rows, s.streams}, kStats));
  const int dretrieved = add(r, acc({s.streams, s.rows, s.width}));
  const int dalpha = add(r, acc({s.rows, s.streams}, kStats));
  r.calls = [=](const Views& v) {
    return Calls{DarMixBackwardArgs{.dout = v[dout],
                                    .retrieved = v[retrieved],
                                    .alpha = v[alpha],
                                    .dretrieved = v[dretrieved],
                                    .dalpha = v[dalpha]}};
  };
  r.outputs = {dretrieved, dalpha};
  return r;
}

// The write of a block's output into the n streams (with the transport of the
// partial sums when `transport`).
struct WriteTensors {
  int transport, partial, beta, y;  // transport, partial -1: none
};
WriteTensors write_tensors(OpSample& r, const SampleSizes& s) {
  const int64_t n = s.streams;
  WriteTensors t{};
  t.transport = s.transport ? add(r, in({s.rows, n, n}, kStats)) : -1;
  t.partial = s.transport ? add(r, in({n, s.rows, s.width})) : -1;
  t.beta = add(r, in({s.rows, n}, kStats));
  t.y = add(r, in({s.rows, s.width}));
  return t;
}

OpSample dar_write_forward(const SampleSizes& s) {
  OpSample r;
  const WriteTensors t = write_tensors(r, s);
  const int y = add(r, out({s.streams, s.rows, s.width}));
  r.calls = [=](const Views& v) {
    return Calls{DarWriteForwardArgs{.transport = at(v, t.transport),
                                     .partial = at(v, t.partial),
                                     .beta = v[t.beta],
                                     .y = v[t.y],
                                     .out = v[y]}};
  };
  r.outputs = {y};
  return r;
}

OpSample dar_write_backward(const SampleSizes& s) {
  OpSample r;
  const int64_t n = s.streams;
  const int dout = add(r, in({n, s.rows, s.width}));
  const WriteTensors t = write_tensors(r, s);
  const int dtransport = s.transport ? add(r, acc({s.rows, n, n}, kStats)) : -1;
  const int dpartial = s.transport ? add(r, acc({n, s.rows, s.width})) : -1;
  const int dbeta = add(r, acc({s.rows, n}, kStats)), dy = add(r, acc({s.rows, s.width}));
  r.calls = [=](const Views& v) {
    return Calls{DarWriteBackwardArgs{.dout = v[dout],
                                      .transport = at(v, t.transport),
                                      .partial = at(v, t.partial),
                                      .beta = v[t.beta],
                                      .y = v[t.y],
                                      .dtransport = at(v, dtransport),
                                      .dpartial = at(v, dpartial),
                                      .dbeta = v[dbeta],
                                      .dy = v[dy]}};
  };
  r.outputs = {dbeta, dy};
  if (s.transport) {
    r.outputs.push_back(dtransport);
    r.outputs.push_back(dpartial);
  }
  return r;
}

// ---- Mixture of Experts: `rows` tokens, `experts` router columns, top_k -------------

struct RouteTensors {
  int logits, probs, indices, gates;
};
RouteTensors route_tensors(OpSample& r, const SampleSizes& s) {
  RouteTensors t{};
  t.logits = add(r, in({s.rows, s.experts}, kStats));
  t.probs = add(r, out({s.rows, s.experts}, kStats));
  t.indices = add(r, index_out({s.rows, s.top_k}));
  t.gates = add(r, out({s.rows, s.top_k}, kStats));
  return t;
}
MoeRouteForwardArgs route_call(const RouteTensors& t, const Views& v, MoeRouteParams params) {
  return {.logits = v[t.logits],
          .probs = v[t.probs],
          .indices = v[t.indices],
          .gates = v[t.gates],
          .params = params};
}

OpSample moe_route_forward(const SampleSizes& s) {
  OpSample r;
  const RouteTensors t = route_tensors(r, s);
  r.calls = [=](const Views& v) { return Calls{route_call(t, v, {.renormalize = true})}; };
  r.outputs = {t.probs, t.indices, t.gates};
  return r;
}

OpSample moe_route_backward(const SampleSizes& s) {
  OpSample r;
  const RouteTensors t = route_tensors(r, s);
  const int dgates = add(r, in({s.rows, s.top_k}, kStats));
  const int dlogits = add(r, acc({s.rows, s.experts}, kStats));
  r.calls = [=](const Views& v) {
    const MoeRouteParams params{.renormalize = true};
    return Calls{route_call(t, v, params), MoeRouteBackwardArgs{.dgates = v[dgates],
                                                                .probs = v[t.probs],
                                                                .indices = v[t.indices],
                                                                .gates = v[t.gates],
                                                                .dlogits = v[dlogits],
                                                                .params = params}};
  };
  r.outputs = {dlogits};
  return r;
}

OpSample moe_aux_loss_forward(const SampleSizes& s) {
  OpSample r;
  const RouteTensors t = route_tensors(r, s);
  const int loss = add(r, out({2}, kStats));
  r.calls = [=](const Views& v) {
    return Calls{
        route_call(t, v, {}),
        MoeAuxLossForwardArgs{
            .logits = v[t.logits], .probs = v[t.probs], .indices = v[t.indices], .loss = v[loss]}};
  };
  r.outputs = {loss};
  return r;
}

OpSample moe_aux_loss_backward(const SampleSizes& s) {
  OpSample r;
  const RouteTensors t = route_tensors(r, s);
  const int dlogits = add(r, acc({s.rows, s.experts}, kStats));
  r.calls = [=](const Views& v) {
    return Calls{route_call(t, v, {}), MoeAuxLossBackwardArgs{.daux = 1.5,
                                                              .dz = 0.5,
                                                              .logits = v[t.logits],
                                                              .probs = v[t.probs],
                                                              .indices = v[t.indices],
                                                              .dlogits = v[dlogits]}};
  };
  r.outputs = {dlogits};
  return r;
}

OpSample moe_dispatch(const SampleSizes& s) {
  OpSample r;
  const int indices = add(r, index({s.rows, s.top_k}, s.experts));
  const int counts = add(r, index_out({s.local_experts}));
  const int slots = add(r, index_out({s.rows, s.top_k}));
  r.calls = [=, capacity = s.capacity](const Views& v) {
    return Calls{MoeDispatchArgs{
        .indices = v[indices], .counts = v[counts], .slots = v[slots], .capacity = capacity}};
  };
  r.outputs = {counts, slots};
  return r;
}

// The slot map of the permutations: assignment i (token i / k, choice i % k)
// goes to expert row (7 i + 3) mod (rows k) with the stride coprime to rows k
// (a permutation, as a dispatch sorted by expert scatters a token's choices);
// rows >= expert_rows are dropped (-1).
int64_t expert_rows(const SampleSizes& s) {
  return s.expert_rows > 0 ? s.expert_rows : s.rows * s.top_k;
}
SampleTensor slot_map(const SampleSizes& s) {
  const int64_t assignments = s.rows * s.top_k;
  int64_t stride = 7;
  while (std::gcd(stride, assignments) != 1)
    ++stride;
  std::vector<double> slots(static_cast<size_t>(assignments));
  for (int64_t i = 0; i < assignments; ++i) {
    const int64_t row = (stride * i + 3) % assignments;
    slots[static_cast<size_t>(i)] = row < expert_rows(s) ? static_cast<double>(row) : -1.0;
  }
  return given({s.rows, s.top_k}, std::move(slots));
}

OpSample moe_permute_forward(const SampleSizes& s) {
  OpSample r;
  const int x = add(r, in({s.rows, s.width})), slots = add(r, slot_map(s));
  const int y = add(r, out({expert_rows(s), s.width}));
  r.calls = [=](const Views& v) {
    return Calls{MoePermuteForwardArgs{.x = v[x], .slots = v[slots], .out = v[y]}};
  };
  r.outputs = {y};
  return r;
}

OpSample moe_permute_backward(const SampleSizes& s) {
  OpSample r;
  const int dout = add(r, in({expert_rows(s), s.width})), slots = add(r, slot_map(s));
  const int dx = add(r, acc({s.rows, s.width}));
  r.calls = [=](const Views& v) {
    return Calls{MoePermuteBackwardArgs{.dout = v[dout], .slots = v[slots], .dx = v[dx]}};
  };
  r.outputs = {dx};
  return r;
}

OpSample moe_unpermute_forward(const SampleSizes& s) {
  OpSample r;
  const int y = add(r, in({expert_rows(s), s.width})), slots = add(r, slot_map(s));
  const int gates = add(r, in({s.rows, s.top_k}, kStats));
  const int combined = add(r, out({s.rows, s.width}));
  r.calls = [=](const Views& v) {
    return Calls{MoeUnpermuteForwardArgs{
        .y = v[y], .slots = v[slots], .gates = v[gates], .out = v[combined]}};
  };
  r.outputs = {combined};
  return r;
}

OpSample moe_unpermute_backward(const SampleSizes& s) {
  OpSample r;
  const int dout = add(r, in({s.rows, s.width}));
  const int y = add(r, in({expert_rows(s), s.width})), slots = add(r, slot_map(s));
  const int gates = add(r, in({s.rows, s.top_k}, kStats));
  const int dy = add(r, acc({expert_rows(s), s.width}));
  const int dgates = add(r, acc({s.rows, s.top_k}, kStats));
  r.calls = [=](const Views& v) {
    return Calls{MoeUnpermuteBackwardArgs{.dout = v[dout],
                                          .y = v[y],
                                          .slots = v[slots],
                                          .gates = v[gates],
                                          .dy = v[dy],
                                          .dgates = v[dgates]}};
  };
  r.outputs = {dy, dgates};
  return r;
}

// The expert GEMM over the groups' rows (group_rows; default 3 groups, the
// middle one empty).  ragged_inner: the weight-gradient form
// C_g[cols, inner] += A_g[m_g, cols]^T B_g[m_g, inner].
OpSample grouped_gemm(const SampleSizes& s) {
  OpSample r;
  std::vector<double> group_rows = s.group_rows;
  if (group_rows.empty()) {
    const double first = static_cast<double>(s.rows / 3);
    group_rows = {first, 0.0, static_cast<double>(s.rows) - first};
  }
  const int64_t groups = static_cast<int64_t>(group_rows.size());
  const int counts = add(r, given({groups}, group_rows));
  if (!s.ragged_inner) {
    const int a = add(r, in({s.rows, s.inner})), b = add(r, in({groups, s.inner, s.cols}));
    const int c = add(r, out({s.rows, s.cols}));
    r.calls = [=](const Views& v) {
      return Calls{GroupedGemmArgs{.a = v[a], .b = v[b], .c = v[c], .counts = v[counts]}};
    };
    r.outputs = {c};
    return r;
  }
  const int a = add(r, in({s.rows, s.cols})), b = add(r, in({s.rows, s.inner}));
  const int c = add(r, acc({groups, s.cols, s.inner}));
  r.calls = [=](const Views& v) {
    return Calls{GroupedGemmArgs{.a = v[a],
                                 .transpose_a = true,
                                 .b = v[b],
                                 .c = v[c],
                                 .counts = v[counts],
                                 .alpha = 1.0,
                                 .beta = 1.0}};
  };
  r.outputs = {c};
  return r;
}

}  // namespace modar::runtime::sample_recipes
