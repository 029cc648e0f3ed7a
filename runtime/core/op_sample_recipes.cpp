// runtime/core/op_sample_recipes.cpp: the sample recipes of the memory, GEMM,
// normalisation, RoPE, attention, MoD routing, elementwise, loss, embedding
// and optimizer ops (op_samples.hpp; depth reads, DAR and MoE are in
// op_sample_recipes_depth_moe.cpp).  Each names its tensors by index and its
// calls by field (designated initializers).
#include "op_sample_recipes.hpp"

namespace modar::runtime::sample_recipes {

// ---- memory ------------------------------------------------------------------------

OpSample copy(const SampleSizes& s) {
  OpSample r;
  const int src = add(r, in({s.rows, s.width})), dst = add(r, out({s.rows, s.width}));
  r.calls = [=](const Views& v) { return Calls{CopyArgs{.src = v[src], .dst = v[dst]}}; };
  r.outputs = {dst};
  return r;
}

OpSample fill(const SampleSizes& s) {
  OpSample r;
  const int dst = add(r, out({s.rows, s.width}));
  r.calls = [=](const Views& v) { return Calls{FillArgs{.dst = v[dst], .value = 0.75}}; };
  r.outputs = {dst};
  return r;
}

OpSample convert(const SampleSizes& s) {
  OpSample r;
  const int src = add(r, in({s.rows, s.width}));
  const int dst = add(r, out({s.rows, s.width}, SampleRole::fp32));
  r.calls = [=](const Views& v) { return Calls{ConvertArgs{.src = v[src], .dst = v[dst]}}; };
  r.outputs = {dst};
  return r;
}

// ---- GEMM, normalisation, RoPE, attention ------------------------------------------

OpSample gemm(const SampleSizes& s) {
  OpSample r;
  auto batched = [&s](Shape shape) {
    if (s.matrices > 1)
      shape.insert(shape.begin(), s.matrices);
    return shape;
  };
  const int a = add(r, in(batched({s.rows, s.inner}))), b = add(r, in(batched({s.inner, s.cols})));
  const int c = add(r, out(batched({s.rows, s.cols})));
  r.calls = [=](const Views& v) { return Calls{GemmArgs{.a = v[a], .b = v[b], .c = v[c]}}; };
  r.outputs = {c};
  return r;
}

struct RmsnormTensors {
  int x, weight, out, rstd;
};
RmsnormTensors rmsnorm_tensors(OpSample& r, const SampleSizes& s) {
  RmsnormTensors t{};
  t.x = add(r, in({s.rows, s.width}));
  t.weight = s.rstd_only ? -1 : add(r, in({s.width}, SampleRole::positive));
  t.out = s.rstd_only ? -1 : add(r, out({s.rows, s.width}));
  t.rstd = add(r, out({s.rows}, kStats));
  return t;
}
RmsnormForwardArgs rmsnorm_call(const RmsnormTensors& t, const Views& v) {
  return {.x = v[t.x], .weight = at(v, t.weight), .out = at(v, t.out), .rstd = v[t.rstd]};
}

OpSample rmsnorm_forward(const SampleSizes& s) {
  OpSample r;
  const RmsnormTensors t = rmsnorm_tensors(r, s);
  r.calls = [=](const Views& v) { return Calls{rmsnorm_call(t, v)}; };
  r.outputs = s.rstd_only ? std::vector<int>{t.rstd} : std::vector<int>{t.out, t.rstd};
  return r;
}

OpSample rmsnorm_backward(const SampleSizes& s) {
  OpSample r;
  SampleSizes full = s;
  full.rstd_only = false;
  const RmsnormTensors t = rmsnorm_tensors(r, full);
  const int dout = add(r, in({s.rows, s.width})), dx = add(r, acc({s.rows, s.width}));
  const int dweight = add(r, acc({s.width}));
  r.calls = [=](const Views& v) {
    return Calls{rmsnorm_call(t, v), RmsnormBackwardArgs{.dout = v[dout],
                                                         .x = v[t.x],
                                                         .weight = v[t.weight],
                                                         .rstd = v[t.rstd],
                                                         .dx = v[dx],
                                                         .dweight = v[dweight]}};
  };
  r.outputs = {dx, dweight};
  return r;
}

OpSample rope_forward(const SampleSizes& s) {
  OpSample r;
  const Shape shape{s.batch, s.rows, s.heads, s.head_dim};
  const int x = add(r, in(shape)), positions = add(r, index({s.batch, s.rows}, s.max_position));
  const int y = add(r, out(shape));
  r.calls = [=](const Views& v) {
    return Calls{RopeForwardArgs{.x = v[x], .positions = v[positions], .out = v[y]}};
  };
  r.outputs = {y};
  return r;
}

OpSample rope_backward(const SampleSizes& s) {
  OpSample r;
  const Shape shape{s.batch, s.rows, s.heads, s.head_dim};
  const int dout = add(r, in(shape)), positions = add(r, index({s.batch, s.rows}, s.max_position));
  const int dx = add(r, acc(shape));
  r.calls = [=](const Views& v) {
    return Calls{RopeBackwardArgs{.dout = v[dout], .positions = v[positions], .dx = v[dx]}};
  };
  r.outputs = {dx};
  return r;
}

struct AttentionTensors {
  int q, k, v, out, lse;
};
AttentionTensors attention_tensors(OpSample& r, const SampleSizes& s) {
  const Shape queries{s.batch, s.rows, s.heads, s.head_dim};
  const Shape keys{s.batch, s.rows, s.kv_heads, s.head_dim};
  AttentionTensors t{};
  t.q = add(r, in(queries));
  t.k = add(r, in(keys));
  t.v = add(r, in(keys));
  t.out = add(r, out(queries));
  t.lse = add(r, out({s.batch, s.heads, s.rows}, kStats));
  return t;
}
AttentionForwardArgs attention_call(const AttentionTensors& t, const Views& v, bool causal) {
  return {.q = v[t.q],
          .k = v[t.k],
          .v = v[t.v],
          .valid_lengths = {},
          .out = v[t.out],
          .lse = v[t.lse],
          .params = AttentionParams{.causal = causal}};
}

OpSample attention_forward(const SampleSizes& s) {
  OpSample r;
  const AttentionTensors t = attention_tensors(r, s);
  r.calls = [=, causal = s.causal](const Views& v) { return Calls{attention_call(t, v, causal)}; };
  r.outputs = {t.out, t.lse};
  return r;
}

OpSample attention_backward(const SampleSizes& s) {
  OpSample r;
  const AttentionTensors t = attention_tensors(r, s);
  const Shape queries{s.batch, s.rows, s.heads, s.head_dim};
  const Shape keys{s.batch, s.rows, s.kv_heads, s.head_dim};
  const int dout = add(r, in(queries)), dq = add(r, acc(queries));
  const int dk = add(r, acc(keys)), dv = add(r, acc(keys));
  r.calls = [=, causal = s.causal](const Views& v) {
    return Calls{attention_call(t, v, causal),
                 AttentionBackwardArgs{.dout = v[dout],
                                       .q = v[t.q],
                                       .k = v[t.k],
                                       .v = v[t.v],
                                       .valid_lengths = {},
                                       .out = v[t.out],
                                       .lse = v[t.lse],
                                       .dq = v[dq],
                                       .dk = v[dk],
                                       .dv = v[dv],
                                       .params = AttentionParams{.causal = causal}}};
  };
  r.outputs = {dq, dk, dv};
  return r;
}

// ---- MoD routing -------------------------------------------------------------------

OpSample router_forward(const SampleSizes& s) {
  OpSample r;
  const int x = add(r, in({s.rows, s.width})), w = add(r, in({s.width}));
  const int logits = add(r, out({s.rows}, kStats));
  r.calls = [=](const Views& v) {
    return Calls{RouterForwardArgs{.x = v[x], .w = v[w], .logits = v[logits]}};
  };
  r.outputs = {logits};
  return r;
}

OpSample router_backward(const SampleSizes& s) {
  OpSample r;
  const int dlogits = add(r, in({s.rows}, kStats)), x = add(r, in({s.rows, s.width}));
  const int w = add(r, in({s.width})), dx = add(r, acc({s.rows, s.width}));
  const int dw = add(r, acc({s.width}));
  r.calls = [=](const Views& v) {
    return Calls{
        RouterBackwardArgs{.dlogits = v[dlogits], .x = v[x], .w = v[w], .dx = v[dx], .dw = v[dw]}};
  };
  r.outputs = {dx, dw};
  return r;
}

OpSample topk(const SampleSizes& s) {
  OpSample r;
  const int64_t candidates = s.candidates > 0 ? s.candidates : 2 * s.rows;
  const int logits = add(r, in({s.batch, candidates}, kStats));
  const int indices = add(r, index_out({s.batch, s.rows}));
  r.calls = [=](const Views& v) {
    return Calls{TopkArgs{.logits = v[logits], .indices = v[indices]}};
  };
  r.outputs = {indices};
  return r;
}

// Row 0 keeps all `rows` positions, row 1 none, the others one.
OpSample topk_ragged(const SampleSizes& s) {
  OpSample r;
  std::vector<double> counts(static_cast<size_t>(s.batch), 1.0);
  counts[0] = static_cast<double>(s.rows);
  if (s.batch > 1)
    counts[1] = 0.0;
  const int logits = add(r, in({s.batch, 2 * s.rows}, kStats));
  const int count = add(r, given({s.batch}, counts));
  const int indices = add(r, index_out({s.batch, s.rows}));
  r.calls = [=](const Views& v) {
    return Calls{TopkRaggedArgs{.logits = v[logits], .counts = v[count], .indices = v[indices]}};
  };
  r.outputs = {indices};
  return r;
}

// Two positions per row, -1 marking "none" in every other row.
OpSample topk_mask(const SampleSizes& s) {
  OpSample r;
  std::vector<double> positions;
  for (int64_t row = 0; row < s.batch; ++row) {
    positions.push_back(row % 2 == 0 ? 0.0 : 1.0);
    positions.push_back(row % 2 == 0 ? 2.0 : -1.0);
  }
  const int indices = add(r, given({s.batch, 2}, positions));
  const int mask = add(r, out({s.batch, s.rows + 3}));
  r.calls = [=](const Views& v) {
    return Calls{TopkMaskArgs{.indices = v[indices], .mask = v[mask]}};
  };
  r.outputs = {mask};
  return r;
}

// Routed rows: `rows` of 2 x rows source rows per sequence.
OpSample gather_rows_forward(const SampleSizes& s) {
  OpSample r;
  const int x = add(r, in({s.batch, 2 * s.rows, s.width}));
  const int indices = add(r, sorted({s.batch, s.rows}, s.ragged));
  const int y = add(r, out({s.batch, s.rows, s.width}));
  r.calls = [=](const Views& v) {
    return Calls{GatherRowsForwardArgs{.x = v[x], .indices = v[indices], .out = v[y]}};
  };
  r.outputs = {y};
  return r;
}

OpSample gather_rows_backward(const SampleSizes& s) {
  OpSample r;
  const int dout = add(r, in({s.batch, s.rows, s.width}));
  const int indices = add(r, sorted({s.batch, s.rows}, s.ragged));
  const int dx = add(r, acc({s.batch, 2 * s.rows, s.width}));
  r.calls = [=](const Views& v) {
    return Calls{GatherRowsBackwardArgs{.dout = v[dout], .indices = v[indices], .dx = v[dx]}};
  };
  r.outputs = {dx};
  return r;
}

OpSample scatter_add_scaled_forward(const SampleSizes& s) {
  OpSample r;
  const int x = add(r, in({s.batch, 2 * s.rows, s.width}));
  const int indices = add(r, sorted({s.batch, s.rows}, s.ragged));
  const int logits = add(r, in({s.batch, 2 * s.rows}, kStats));
  const int delta = add(r, in({s.batch, s.rows, s.width}));
  r.calls = [=, gate = s.gate](const Views& v) {
    return Calls{ScatterAddScaledForwardArgs{.x = v[x],
                                             .indices = v[indices],
                                             .router_logits = v[logits],
                                             .delta = v[delta],
                                             .gate = gate}};
  };
  r.outputs = {x};
  return r;
}

OpSample scatter_add_scaled_backward(const SampleSizes& s) {
  OpSample r;
  const int dx = add(r, in({s.batch, 2 * s.rows, s.width}));
  const int indices = add(r, sorted({s.batch, s.rows}, s.ragged));
  const int logits = add(r, in({s.batch, 2 * s.rows}, kStats));
  const int delta = add(r, in({s.batch, s.rows, s.width}));
  const int ddelta = add(r, acc({s.batch, s.rows, s.width}));
  const int dlogits = add(r, acc({s.batch, 2 * s.rows}, kStats));
  r.calls = [=](const Views& v) {
    return Calls{ScatterAddScaledBackwardArgs{.dx = v[dx],
                                              .indices = v[indices],
                                              .router_logits = v[logits],
                                              .delta = v[delta],
                                              .gate = RouterScale::linear,
                                              .ddelta = v[ddelta],
                                              .drouter_logits = v[dlogits]}};
  };
  r.outputs = {ddelta, dlogits};
  return r;
}

// ---- elementwise -------------------------------------------------------------------

// One input, one output.
template <class Args>
OpSample unary(const SampleSizes& s) {
  OpSample r;
  const int x = add(r, in({s.rows, s.width})), y = add(r, out({s.rows, s.width}));
  r.calls = [=](const Views& v) { return Calls{Args{v[x], v[y]}}; };
  r.outputs = {y};
  return r;
}
// Two inputs, one output (`a`, `b`, `out` in this order in Args).
template <class Args>
OpSample binary(const SampleSizes& s) {
  OpSample r;
  const int a = add(r, in({s.rows, s.width})), b = add(r, in({s.rows, s.width}));
  const int y = add(r, out({s.rows, s.width}));
  r.calls = [=](const Views& v) { return Calls{Args{v[a], v[b], v[y]}}; };
  r.outputs = {y};
  return r;
}
// dout and two inputs, two gradients (added into, as every backward does).
template <class Args>
OpSample binary_backward(const SampleSizes& s) {
  OpSample r;
  const int dout = add(r, in({s.rows, s.width}));
  const int a = add(r, in({s.rows, s.width})), b = add(r, in({s.rows, s.width}));
  const int da = add(r, acc({s.rows, s.width})), db = add(r, acc({s.rows, s.width}));
  r.calls = [=](const Views& v) { return Calls{Args{v[dout], v[a], v[b], v[da], v[db]}}; };
  r.outputs = {da, db};
  return r;
}

OpSample gelu_forward(const SampleSizes& s) {
  return unary<GeluForwardArgs>(s);
}
OpSample gelu_backward(const SampleSizes& s) {
  OpSample r;
  const int dout = add(r, in({s.rows, s.width})), x = add(r, in({s.rows, s.width}));
  const int dx = add(r, acc({s.rows, s.width}));
  r.calls = [=](const Views& v) {
    return Calls{GeluBackwardArgs{.dout = v[dout], .x = v[x], .dx = v[dx]}};
  };
  r.outputs = {dx};
  return r;
}
OpSample swiglu_forward(const SampleSizes& s) {
  return binary<SwigluForwardArgs>(s);
}
OpSample swiglu_backward(const SampleSizes& s) {
  return binary_backward<SwigluBackwardArgs>(s);
}
OpSample add(const SampleSizes& s) {
  return binary<AddArgs>(s);
}
OpSample mul_forward(const SampleSizes& s) {
  return binary<MulForwardArgs>(s);
}
OpSample mul_backward(const SampleSizes& s) {
  return binary_backward<MulBackwardArgs>(s);
}

OpSample axpy(const SampleSizes& s) {
  OpSample r;
  const int x = add(r, in({s.rows, s.width})), y = add(r, in({s.rows, s.width}));
  r.calls = [=](const Views& v) { return Calls{AxpyArgs{.alpha = 0.5, .x = v[x], .y = v[y]}}; };
  r.outputs = {y};
  return r;
}

OpSample scale(const SampleSizes& s) {
  OpSample r;
  const int x = add(r, in({s.rows, s.width}));
  r.calls = [=](const Views& v) { return Calls{ScaleArgs{.x = v[x], .alpha = -1.5}}; };
  r.outputs = {x};
  return r;
}

// ---- losses, embedding, optimizer --------------------------------------------------

struct CrossEntropyTensors {
  int logits, targets, loss, lse;
};
CrossEntropyTensors cross_entropy_tensors(OpSample& r, const SampleSizes& s) {
  CrossEntropyTensors t{};
  t.logits = add(r, in({s.rows, s.vocab}));
  if (s.ragged) {
    std::vector<double> targets(static_cast<size_t>(s.rows));
    for (int64_t i = 0; i < s.rows; ++i)
      targets[static_cast<size_t>(i)] =
          i % 5 == 3 ? -1.0 : static_cast<double>((7919 * i) % s.vocab);
    t.targets = add(r, given({s.rows}, std::move(targets)));
  } else {
    t.targets = add(r, index({s.rows}, s.vocab));
  }
  t.loss = add(r, out({1}, kStats));
  t.lse = add(r, out({s.rows}, kStats));
  return t;
}
CrossEntropyForwardArgs cross_entropy_call(const CrossEntropyTensors& t, const Views& v) {
  return {.logits = v[t.logits], .targets = v[t.targets], .loss = v[t.loss], .lse = v[t.lse]};
}

OpSample cross_entropy_forward(const SampleSizes& s) {
  OpSample r;
  const CrossEntropyTensors t = cross_entropy_tensors(r, s);
  r.calls = [=](const Views& v) { return Calls{cross_entropy_call(t, v)}; };
  r.outputs = {t.loss, t.lse};
  return r;
}

OpSample cross_entropy_backward(const SampleSizes& s) {
  OpSample r;
  const CrossEntropyTensors t = cross_entropy_tensors(r, s);
  const int dlogits = add(r, acc({s.rows, s.vocab}));
  r.calls = [=](const Views& v) {
    return Calls{cross_entropy_call(t, v), CrossEntropyBackwardArgs{.dloss = 2.0,
                                                                    .logits = v[t.logits],
                                                                    .targets = v[t.targets],
                                                                    .lse = v[t.lse],
                                                                    .dlogits = v[dlogits]}};
  };
  r.outputs = {dlogits};
  return r;
}

OpSample bce_with_logits_forward(const SampleSizes& s) {
  OpSample r;
  const int logits = add(r, in({2 * s.rows}, kStats));
  const int targets = add(r, in({2 * s.rows}, SampleRole::stats_unit));
  const int loss = add(r, out({1}, kStats));
  r.calls = [=](const Views& v) {
    return Calls{
        BceWithLogitsForwardArgs{.logits = v[logits], .targets = v[targets], .loss = v[loss]}};
  };
  r.outputs = {loss};
  return r;
}

OpSample bce_with_logits_backward(const SampleSizes& s) {
  OpSample r;
  const int logits = add(r, in({2 * s.rows}, kStats));
  const int targets = add(r, in({2 * s.rows}, SampleRole::stats_unit));
  const int dlogits = add(r, acc({2 * s.rows}, kStats));
  r.calls = [=](const Views& v) {
    return Calls{BceWithLogitsBackwardArgs{
        .dloss = 1.0, .logits = v[logits], .targets = v[targets], .dlogits = v[dlogits]}};
  };
  r.outputs = {dlogits};
  return r;
}

OpSample embedding_forward(const SampleSizes& s) {
  OpSample r;
  const int table = add(r, in({s.table_rows, s.width}));
  const int tokens = add(r, index({s.batch, s.rows}, s.table_rows));
  const int y = add(r, out({s.batch, s.rows, s.width}));
  r.calls = [=](const Views& v) {
    return Calls{EmbeddingForwardArgs{.table = v[table], .tokens = v[tokens], .out = v[y]}};
  };
  r.outputs = {y};
  return r;
}

OpSample embedding_backward(const SampleSizes& s) {
  OpSample r;
  const int dout = add(r, in({s.batch, s.rows, s.width}));
  const int tokens = add(r, index({s.batch, s.rows}, s.table_rows));
  const int dtable = add(r, acc({s.table_rows, s.width}));
  r.calls = [=](const Views& v) {
    return Calls{EmbeddingBackwardArgs{.dout = v[dout], .tokens = v[tokens], .dtable = v[dtable]}};
  };
  r.outputs = {dtable};
  return r;
}

// rows x width parameters; the low-precision copy only where the data dtype
// differs from the fp32 / fp64 master.
OpSample adamw_update(const SampleSizes& s) {
  OpSample r;
  const Shape shape{s.rows * s.width};
  const int params = add(r, in(shape, SampleRole::master)), grads = add(r, in(shape));
  const int m = add(r, in(shape, SampleRole::master));
  const int second = add(r, in(shape, SampleRole::master_small));
  const int lowp = add(r, out(shape, SampleRole::lowp));
  r.calls = [=](const Views& v) {
    AdamWParams hyper;
    hyper.learning_rate = 0.01;
    hyper.weight_decay = 0.1;
    hyper.step = 3;
    return Calls{AdamwUpdateArgs{.params = v[params],
                                 .grads = v[grads],
                                 .m = v[m],
                                 .v = v[second],
                                 .hyper = hyper,
                                 .params_lowp = v[lowp]}};
  };
  r.outputs = {params, m, second};
  return r;
}

}  // namespace modar::runtime::sample_recipes
