// The two pre-norm branches and the dense transformer layer.
//
//   attention:  u = RMSNorm(x) g;  q = rope(u Wq, pos), k = rope(u Wk, pos), v = u Wv
//               o = causal GQA attention(q, k, v);  y = o Wo
//   MLP:        u = RMSNorm(x) g;  GELU:   y = gelu(u W_in) W_out
//                                  SwiGLU: y = (silu(u W_gate) * (u W_up)) W_out
//   layer:      a = attn(x), m = mlp(x + a), delta = a + m, out = x + delta
//
// Layout: activations [b, s, d] row-major; q/k/v [b, s, heads, d_h] (the GEMM
// writes them as [b, s, heads * d_h]).  Weights are [in, out].  Each branch
// keeps what its backward needs in a Saved struct (its input is COPIED: the
// residual stream is updated in place afterwards).
#include <cmath>

#include "modar/base/errors.hpp"
#include "modar/runtime/layers.hpp"

namespace modar::runtime {
namespace {

std::vector<int64_t> with_last(const TensorView& x, int64_t last) {
  std::vector<int64_t> shape = x.shape_vector();
  shape.back() = last;
  return shape;
}

std::vector<int64_t> heads_shape(const TensorView& x, int64_t heads, int64_t d_head) {
  std::vector<int64_t> shape = x.shape_vector();
  shape.back() = heads;
  shape.push_back(d_head);
  return shape;
}

// [.., heads, d_h] -> [.., heads * d_h] (what the GEMM sees).
TensorView merge_heads(const TensorView& t) {
  std::vector<int64_t> shape = t.shape_vector();
  const int64_t d_head = shape.back();
  shape.pop_back();
  shape.back() *= d_head;
  return reshape(t, shape);
}

// The attention branch's first half at `positions`: u = RMSNorm(x) g (with
// its rstd), q = rope(u Wq), k = rope(u Wk), v = u Wv ([.., heads, d_h]).
struct QkvProjection {
  Buffer rstd, u, q, k, v;
};
QkvProjection project_qkv(const Context& ctx, const TensorView& x, const TensorView& positions,
                          const BranchShape& shape, const Parameter& norm, const Parameter& wq,
                          const Parameter& wk, const Parameter& wv) {
  Backend& be = ctx.backend;
  QkvProjection p;
  p.rstd = ctx.make({x.rows()}, ctx.stats());
  p.u = ctx.make(x.shape_vector());
  be.rmsnorm_forward(x, norm.value, p.u, p.rstd, shape.norm_eps);
  p.q = ctx.make(heads_shape(x, shape.n_heads, shape.d_head));
  p.k = ctx.make(heads_shape(x, shape.n_kv_heads, shape.d_head));
  p.v = ctx.make(heads_shape(x, shape.n_kv_heads, shape.d_head));
  be.gemm(p.u, false, wq.value, false, merge_heads(p.q));
  be.gemm(p.u, false, wk.value, false, merge_heads(p.k));
  be.gemm(p.u, false, wv.value, false, merge_heads(p.v));
  RopeParams rope;
  rope.theta_base = shape.rope_theta;
  be.rope_forward(p.q, positions, p.q, rope);
  be.rope_forward(p.k, positions, p.k, rope);
  return p;
}

}  // namespace

// ---- attention branch --------------------------------------------------------------

AttentionBranch::AttentionBranch(ParameterSet& params, const Context& ctx,
                                 const std::string& prefix, const BranchShape& shape, Rng& rng,
                                 double out_std)
    : shape_(shape) {
  const int64_t d = shape.d_model, q_width = shape.n_heads * shape.d_head,
                kv_width = shape.n_kv_heads * shape.d_head;
  if (shape.n_heads % shape.n_kv_heads != 0 || shape.d_head % 2 != 0) {
    throw ShapeError("attention: n_heads = " + std::to_string(shape.n_heads) +
                     ", n_kv_heads = " + std::to_string(shape.n_kv_heads) +
                     ", d_head = " + std::to_string(shape.d_head) +
                     ": n_heads must be a multiple of n_kv_heads and d_head even");
  }
  norm_ = &params.add(ctx, prefix + ".attn_norm", {d}, ctx.dtype, Init::constant_value(1.0), rng);
  wq_ = &params.add(ctx, prefix + ".wq", {d, q_width}, ctx.dtype, Init::normal_std(0.02), rng);
  wk_ = &params.add(ctx, prefix + ".wk", {d, kv_width}, ctx.dtype, Init::normal_std(0.02), rng);
  wv_ = &params.add(ctx, prefix + ".wv", {d, kv_width}, ctx.dtype, Init::normal_std(0.02), rng);
  wo_ = &params.add(ctx, prefix + ".wo", {q_width, d}, ctx.dtype, Init::normal_std(out_std), rng);
}

Buffer AttentionBranch::forward(const Context& ctx, const TensorView& x,
                                const TensorView& positions, const TensorView& valid_lengths,
                                Saved* saved) const {
  Backend& be = ctx.backend;
  const int64_t heads = shape_.n_heads, d_head = shape_.d_head;
  auto [rstd, u, q, k, v] = project_qkv(ctx, x, positions, shape_, *norm_, *wq_, *wk_, *wv_);
  Buffer o = ctx.make(heads_shape(x, heads, d_head));
  Buffer lse = ctx.make({x.dim(0), heads, x.dim(1)}, ctx.stats());
  be.attention_forward(q, k, v, valid_lengths, o, lse, AttentionParams{});
  Buffer y = ctx.make(x.shape_vector());
  be.gemm(merge_heads(o), false, wo_->value, false, y);
  if (saved != nullptr) {
    saved->x = ctx.copy_of(x);
    saved->rstd = std::move(rstd);
    saved->u = std::move(u);
    saved->q = std::move(q);
    saved->k = std::move(k);
    saved->v = std::move(v);
    saved->o = std::move(o);
    saved->lse = std::move(lse);
    saved->positions = positions;
    saved->valid_lengths = valid_lengths;
  }
  return y;
}

void AttentionBranch::backward(const Context& ctx, const TensorView& dy, Saved& saved,
                               const TensorView& dx) const {
  Backend& be = ctx.backend;
  Buffer d_o = ctx.make(saved.o.view().shape_vector());
  be.gemm(dy, false, wo_->value, true, merge_heads(d_o));
  be.gemm(merge_heads(saved.o), true, dy, false, wo_->grad, 1.0, 1.0);
  Buffer dq = ctx.zeros(saved.q.view().shape_vector());
  Buffer dk = ctx.zeros(saved.k.view().shape_vector());
  Buffer dv = ctx.zeros(saved.v.view().shape_vector());
  be.attention_backward(d_o, saved.q, saved.k, saved.v, saved.valid_lengths, saved.o, saved.lse, dq,
                        dk, dv, AttentionParams{});
  d_o.reset();
  RopeParams rope;
  rope.theta_base = shape_.rope_theta;
  Buffer dq_pre = ctx.zeros(dq.view().shape_vector());
  Buffer dk_pre = ctx.zeros(dk.view().shape_vector());
  be.rope_backward(dq, saved.positions, dq_pre, rope);
  be.rope_backward(dk, saved.positions, dk_pre, rope);
  dq.reset();
  dk.reset();
  Buffer du = ctx.make(saved.u.view().shape_vector());
  be.gemm(merge_heads(dq_pre), false, wq_->value, true, du);
  be.gemm(merge_heads(dk_pre), false, wk_->value, true, du, 1.0, 1.0);
  be.gemm(merge_heads(dv), false, wv_->value, true, du, 1.0, 1.0);
  be.gemm(saved.u, true, merge_heads(dq_pre), false, wq_->grad, 1.0, 1.0);
  be.gemm(saved.u, true, merge_heads(dk_pre), false, wk_->grad, 1.0, 1.0);
  be.gemm(saved.u, true, merge_heads(dv), false, wv_->grad, 1.0, 1.0);
  be.rmsnorm_backward(du, saved.x, norm_->value, saved.rstd, dx, norm_->grad);
  saved = Saved{};
}

KvCache AttentionBranch::make_cache(const Context& ctx, int64_t capacity) const {
  KvCache cache;
  cache.keys = ctx.zeros({shape_.n_kv_heads, capacity, shape_.d_head});
  cache.values = ctx.zeros({shape_.n_kv_heads, capacity, shape_.d_head});
  cache.capacity = capacity;
  return cache;
}

Buffer AttentionBranch::decode(const Context& ctx, const TensorView& x, int32_t position,
                               KvCache& cache) const {
  Backend& be = ctx.backend;
  const int64_t heads = shape_.n_heads, kv_heads = shape_.n_kv_heads, d_head = shape_.d_head;
  const int64_t group = heads / kv_heads;
  if (x.rank != 3 || x.dim(0) != 1 || x.dim(1) != 1) {
    throw ShapeError("attention decode: x is " + x.describe() + "; expected [1, 1, d]");
  }
  if (cache.count >= cache.capacity) {
    throw ShapeError("attention decode: KV cache full (capacity " + std::to_string(cache.capacity) +
                     ")");
  }
  Buffer pos = ctx.indices({1, 1}, {position});
  const QkvProjection qkv = project_qkv(ctx, x, pos, shape_, *norm_, *wq_, *wk_, *wv_);
  const Buffer& q = qkv.q;
  const Buffer& k = qkv.k;
  const Buffer& v = qkv.v;
  const TensorView k_rows = reshape(k, {kv_heads, d_head});
  const TensorView v_rows = reshape(v, {kv_heads, d_head});
  for (int64_t g = 0; g < kv_heads; ++g) {
    be.copy(slice(k_rows, g, 1), slice(select(cache.keys, g), cache.count, 1));
    be.copy(slice(v_rows, g, 1), slice(select(cache.values, g), cache.count, 1));
  }
  ++cache.count;
  // One query token against the R cached keys of each kv head: the depth-read
  // prefix op IS softmax(q . k_r * c) v_r over r, with c = 1/sqrt(d_h) passed
  // as the key "rstd" (queries [group, d_h], keys [R, 1, d_h]).
  const int64_t cached = cache.count;
  Buffer q_stats = ctx.make({heads, d_head}, ctx.stats());
  be.convert(reshape(q, {heads, d_head}), q_stats);
  Buffer scale = ctx.make({cached, 1}, ctx.stats());
  be.fill(scale, 1.0 / std::sqrt(static_cast<double>(d_head)));
  Buffer o = ctx.make({heads, 1, d_head});
  Buffer lse = ctx.make({group, 1}, ctx.stats());
  for (int64_t g = 0; g < kv_heads; ++g) {
    const TensorView keys = reshape(slice(select(cache.keys, g), 0, cached), {cached, 1, d_head});
    const TensorView values =
        reshape(slice(select(cache.values, g), 0, cached), {cached, 1, d_head});
    be.depth_read_prefix_forward(keys, scale, values, slice(q_stats, g * group, group),
                                 slice(o, g * group, group), lse);
  }
  Buffer y = ctx.make(x.shape_vector());
  be.gemm(reshape(o, {1, 1, heads * d_head}), false, wo_->value, false, y);
  return y;
}

// ---- MLP branch ------------------------------------------------------------------------

MlpBranch::MlpBranch(ParameterSet& params, const Context& ctx, const std::string& prefix,
                     const BranchShape& shape, Rng& rng, double out_std)
    : shape_(shape), w_in_(nullptr), w_gate_(nullptr), w_up_(nullptr) {
  const int64_t d = shape.d_model, f = shape.d_ff;
  norm_ = &params.add(ctx, prefix + ".mlp_norm", {d}, ctx.dtype, Init::constant_value(1.0), rng);
  if (shape.mlp == MlpKind::gelu) {
    w_in_ = &params.add(ctx, prefix + ".w_in", {d, f}, ctx.dtype, Init::normal_std(0.02), rng);
  } else {
    w_gate_ = &params.add(ctx, prefix + ".w_gate", {d, f}, ctx.dtype, Init::normal_std(0.02), rng);
    w_up_ = &params.add(ctx, prefix + ".w_up", {d, f}, ctx.dtype, Init::normal_std(0.02), rng);
  }
  w_out_ = &params.add(ctx, prefix + ".w_out", {f, d}, ctx.dtype, Init::normal_std(out_std), rng);
}

Buffer MlpBranch::forward(const Context& ctx, const TensorView& x, Saved* saved) const {
  Backend& be = ctx.backend;
  const int64_t f = shape_.d_ff;
  Buffer rstd = ctx.make({x.rows()}, ctx.stats());
  Buffer u = ctx.make(x.shape_vector());
  be.rmsnorm_forward(x, norm_->value, u, rstd, shape_.norm_eps);
  Buffer hidden = ctx.make(with_last(x, f));
  Buffer pre, gate, up;
  if (shape_.mlp == MlpKind::gelu) {
    pre = ctx.make(with_last(x, f));
    be.gemm(u, false, w_in_->value, false, pre);
    be.gelu_forward(pre, hidden);
  } else {
    gate = ctx.make(with_last(x, f));
    up = ctx.make(with_last(x, f));
    be.gemm(u, false, w_gate_->value, false, gate);
    be.gemm(u, false, w_up_->value, false, up);
    be.swiglu_forward(gate, up, hidden);
  }
  Buffer y = ctx.make(x.shape_vector());
  be.gemm(hidden, false, w_out_->value, false, y);
  if (saved != nullptr) {
    saved->x = ctx.copy_of(x);
    saved->rstd = std::move(rstd);
    saved->u = std::move(u);
    saved->pre = std::move(pre);
    saved->gate = std::move(gate);
    saved->up = std::move(up);
    saved->hidden = std::move(hidden);
  }
  return y;
}

void MlpBranch::backward(const Context& ctx, const TensorView& dy, Saved& saved,
                         const TensorView& dx) const {
  Backend& be = ctx.backend;
  Buffer dhidden = ctx.make(saved.hidden.view().shape_vector());
  be.gemm(dy, false, w_out_->value, true, dhidden);
  be.gemm(saved.hidden, true, dy, false, w_out_->grad, 1.0, 1.0);
  Buffer du = ctx.make(saved.u.view().shape_vector());
  if (shape_.mlp == MlpKind::gelu) {
    Buffer dpre = ctx.zeros(saved.pre.view().shape_vector());
    be.gelu_backward(dhidden, saved.pre, dpre);
    be.gemm(dpre, false, w_in_->value, true, du);
    be.gemm(saved.u, true, dpre, false, w_in_->grad, 1.0, 1.0);
  } else {
    Buffer dgate = ctx.zeros(saved.gate.view().shape_vector());
    Buffer dup = ctx.zeros(saved.up.view().shape_vector());
    be.swiglu_backward(dhidden, saved.gate, saved.up, dgate, dup);
    be.gemm(dgate, false, w_gate_->value, true, du);
    be.gemm(dup, false, w_up_->value, true, du, 1.0, 1.0);
    be.gemm(saved.u, true, dgate, false, w_gate_->grad, 1.0, 1.0);
    be.gemm(saved.u, true, dup, false, w_up_->grad, 1.0, 1.0);
  }
  be.rmsnorm_backward(du, saved.x, norm_->value, saved.rstd, dx, norm_->grad);
  saved = Saved{};
}

// ---- transformer layer --------------------------------------------------------------

TransformerLayer::TransformerLayer(ParameterSet& params, const Context& ctx,
                                   const std::string& prefix, const BranchShape& shape, Rng& rng,
                                   double out_std, const MoeOptions* moe)
    : attention_(params, ctx, prefix, shape, rng, out_std) {
  if (moe != nullptr) {
    moe_ = std::make_unique<MoeFfn>(params, ctx, prefix, shape, *moe, rng, out_std);
  } else {
    mlp_ = std::make_unique<MlpBranch>(params, ctx, prefix, shape, rng, out_std);
  }
}

Buffer TransformerLayer::ffn_forward(const Context& ctx, const TensorView& x, Saved* saved) const {
  if (moe_ != nullptr) {
    return moe_->forward(ctx, x, saved != nullptr ? &saved->moe : nullptr,
                         saved != nullptr ? &saved->moe_stats : nullptr);
  }
  return mlp_->forward(ctx, x, saved != nullptr ? &saved->mlp : nullptr);
}

void TransformerLayer::ffn_backward(const Context& ctx, const TensorView& dy, Saved& saved,
                                    const TensorView& dx) const {
  if (moe_ != nullptr) {
    moe_->backward(ctx, dy, saved.moe, dx);
  } else {
    mlp_->backward(ctx, dy, saved.mlp, dx);
  }
}

Buffer TransformerLayer::delta_forward(const Context& ctx, const TensorView& x,
                                       const TensorView& positions, const TensorView& valid_lengths,
                                       Saved* saved) const {
  Backend& be = ctx.backend;
  Buffer a = attention_.forward(ctx, x, positions, valid_lengths,
                                saved != nullptr ? &saved->attn : nullptr);
  Buffer x_mid = ctx.make(x.shape_vector());
  be.add(x, a, x_mid);
  Buffer m = ffn_forward(ctx, x_mid, saved);
  be.add(a, m, a);  // delta = a + m, in a's storage
  return a;
}

void TransformerLayer::delta_backward(const Context& ctx, const TensorView& ddelta, Saved& saved,
                                      const TensorView& dx) const {
  Backend& be = ctx.backend;
  // d a = ddelta + d(x + a) from the MLP path; d x gets the MLP path too.
  Buffer dx_mid = ctx.zeros(ddelta.shape_vector());
  ffn_backward(ctx, ddelta, saved, dx_mid);
  Buffer da = ctx.copy_of(ddelta);
  be.axpy(1.0, dx_mid, da);
  be.axpy(1.0, dx_mid, dx);
  dx_mid.reset();
  attention_.backward(ctx, da, saved.attn, dx);
}

void TransformerLayer::forward_inplace(const Context& ctx, const TensorView& x,
                                       const TensorView& positions, Saved* saved) const {
  Buffer delta = delta_forward(ctx, x, positions, TensorView{}, saved);
  ctx.backend.add(x, delta, x);
}

void TransformerLayer::backward_inplace(const Context& ctx, const TensorView& dx,
                                        Saved& saved) const {
  // out = x + delta(x): d x = d out + J^T d out.  J^T d out is formed first
  // and added once (the mirror of the forward), so the routed layer at
  // capacity 1 reproduces these numbers bit for bit.
  Buffer dx_delta = ctx.zeros(dx.shape_vector());
  delta_backward(ctx, dx, saved, dx_delta);
  ctx.backend.axpy(1.0, dx_delta, dx);
}

void TransformerLayer::decode_inplace(const Context& ctx, const TensorView& x, int32_t position,
                                      KvCache& cache) const {
  Backend& be = ctx.backend;
  Buffer a = attention_.decode(ctx, x, position, cache);
  Buffer x_mid = ctx.make(x.shape_vector());
  be.add(x, a, x_mid);
  Buffer m = ffn_forward(ctx, x_mid, nullptr);
  be.add(a, m, a);
  be.add(x, a, x);
}

}  // namespace modar::runtime
