// The Mixture-of-Depths routed layer (docs/model.md MoD, MoD paper section 3).
//
// Training, per sequence of s tokens with k = clamp(round(c s), 1, s):
//   r = x w_r                         router logits [b, s] (statistics dtype)
//   idx = topk(r, k)                  ascending, ties toward the lower position
//   X~ = x[idx]  (b x k x d)          RoPE positions = idx (ORIGINAL positions)
//   delta = a + m  on X~              the layer's branches, causal among the k
//   x[idx] += g(r[idx]) delta         g(r) = r (paper eq. 1) or sigmoid(r)
// Backward: d delta = g dx[idx];  d r = g'(r) <dx[idx], delta>  (the router's
// only gradient; top-k itself is not differentiated);  dx += gather^T(dX~).
//
// Causal routing for decoding (paper 3.5), both trained by BCE against the
// top-k mask (1 for selected tokens):
//   aux_loss   the router logits themselves; weight `aux_loss_weight` in the loss
//   predictor  logits = gelu(sg(x) P_in) . p_out  (stop-gradient input: the
//              LM gradient never sees it, and it never changes the LM)
// Decode routes a token iff sigmoid(logit) > 0.5, i.e. logit > 0.
#include <algorithm>
#include <cmath>

#include "modar/base/errors.hpp"
#include "modar/runtime/layers.hpp"

namespace modar::runtime {

RoutedLayer::RoutedLayer(ParameterSet& params, const Context& ctx, const std::string& prefix,
                         const BranchShape& shape, const RoutingOptions& routing, Rng& rng,
                         double out_std, const MoeOptions* moe)
    : routing_(routing), shape_(shape), core_(params, ctx, prefix, shape, rng, out_std, moe) {
  if (!(routing.capacity > 0.0 && routing.capacity <= 1.0)) {
    throw ConfigError("mod.capacity = " + std::to_string(routing.capacity) + ": must be in (0, 1]");
  }
  router_ =
      &params.add(ctx, prefix + ".router", {shape.d_model}, ctx.dtype, Init::normal_std(0.02), rng);
  if (routing.causal == CausalRouter::predictor) {
    if (routing.predictor_hidden < 1) {
      throw ConfigError("mod.predictor_hidden = " + std::to_string(routing.predictor_hidden) +
                        ": must be >= 1");
    }
    pred_in_ = &params.add(ctx, prefix + ".predictor_in", {shape.d_model, routing.predictor_hidden},
                           ctx.dtype, Init::normal_std(0.02), rng);
    pred_out_ =
        &params.add(ctx, prefix + ".predictor_out", {routing.predictor_hidden}, ctx.dtype,
                    Init::normal_std(1.0 / std::sqrt(double(routing.predictor_hidden))), rng);
  }
}

int64_t RoutedLayer::routed_tokens(int64_t seq_len) const {
  ModConfig mod;
  mod.capacity = routing_.capacity;
  return mod.routed_tokens_per_sequence(seq_len);
}

Buffer RoutedLayer::predictor_logits(const Context& ctx, const TensorView& x, Saved* saved) const {
  Backend& be = ctx.backend;
  std::vector<int64_t> hidden_shape = x.shape_vector();
  hidden_shape.back() = routing_.predictor_hidden;
  Buffer pre = ctx.make(hidden_shape);
  be.gemm(x, false, pred_in_->value, false, pre);
  Buffer hidden = ctx.make(hidden_shape);
  be.gelu_forward(pre, hidden);
  Buffer logits = ctx.make({x.rows()}, ctx.stats());
  be.router_forward(hidden, pred_out_->value, logits);
  if (saved != nullptr) {
    saved->pred_hidden_pre = std::move(pre);
    saved->pred_hidden = std::move(hidden);
  }
  return logits;
}

void RoutedLayer::predictor_backward(const Context& ctx, const TensorView& dlogits,
                                     Saved& saved) const {
  Backend& be = ctx.backend;
  Buffer dhidden = ctx.zeros(saved.pred_hidden.view().shape_vector());
  // dx of the predictor is not computed: its input is stop-gradient.
  be.router_backward(dlogits, saved.pred_hidden, pred_out_->value, dhidden, pred_out_->grad);
  Buffer dpre = ctx.zeros(saved.pred_hidden_pre.view().shape_vector());
  be.gelu_backward(dhidden, saved.pred_hidden_pre, dpre);
  be.gemm(saved.x, true, dpre, false, pred_in_->grad, 1.0, 1.0);
}

RoutedLayer::Losses RoutedLayer::route(const Context& ctx, const TensorView& x, Saved& st,
                                       const Selection* forced) const {
  Backend& be = ctx.backend;
  if (x.rank != 3) {
    throw ShapeError("routed layer: x is " + x.describe() + "; expected [b, s, d]");
  }
  const int64_t batch = x.dim(0), seq = x.dim(1);
  st.x = ctx.copy_of(x);  // router input, kept before any in-place update
  st.logits = ctx.make({batch, seq}, ctx.stats());
  be.router_forward(x, router_->value, st.logits);

  if (forced != nullptr) {
    if (static_cast<int64_t>(forced->positions.size()) != batch) {
      throw ShapeError("routed layer: forced selection has " +
                       std::to_string(forced->positions.size()) + " sequences; x has " +
                       std::to_string(batch));
    }
    int64_t k = 1;
    for (const auto& seq_positions : forced->positions) {
      k = std::max<int64_t>(k, static_cast<int64_t>(seq_positions.size()));
    }
    std::vector<int32_t> idx(static_cast<size_t>(batch * k), -1), pos(idx.size(), 0),
        counts(static_cast<size_t>(batch), 0);
    for (int64_t i = 0; i < batch; ++i) {
      const auto& p = forced->positions[static_cast<size_t>(i)];
      counts[static_cast<size_t>(i)] = static_cast<int32_t>(p.size());
      for (size_t j = 0; j < p.size(); ++j) {
        if (p[j] < 0 || p[j] >= seq || (j > 0 && p[j] <= p[j - 1])) {
          throw ShapeError("routed layer: forced positions of sequence " + std::to_string(i) +
                           " must be ascending and in [0, " + std::to_string(seq) + ")");
        }
        idx[static_cast<size_t>(i * k) + j] = p[j];
        pos[static_cast<size_t>(i * k) + j] = p[j];
      }
    }
    st.indices = ctx.indices({batch, k}, idx);
    st.positions = ctx.indices({batch, k}, pos);
    st.counts = ctx.indices({batch}, counts);
  } else {
    st.indices = ctx.make({batch, routed_tokens(seq)}, ScalarType::i32);
    be.topk(st.logits, st.indices);
  }
  if (routing_.unit_gate) {
    st.gate_input = ctx.make({batch, seq}, ctx.stats());
    be.fill(st.gate_input, 1.0);
  }

  Losses losses;
  if (routing_.causal != CausalRouter::none && forced == nullptr) {
    st.mask = ctx.zeros({batch, seq}, ctx.stats());
    be.topk_mask(st.indices, st.mask);
    Buffer loss = ctx.make({1}, ctx.stats());
    be.bce_with_logits_forward(st.logits, st.mask, loss);
    losses.router_aux = download(be, loss)[0];
    if (routing_.causal == CausalRouter::predictor) {
      st.pred_logits = predictor_logits(ctx, x, &st);
      be.bce_with_logits_forward(st.pred_logits, reshape(st.mask, {batch * seq}), loss);
      losses.predictor = download(be, loss)[0];
      const std::vector<double> logits = download(be, st.pred_logits);
      const std::vector<double> mask = download(be, st.mask);
      int64_t correct = 0;
      for (size_t i = 0; i < logits.size(); ++i) {
        correct += ((logits[i] > 0.0) == (mask[i] > 0.5)) ? 1 : 0;
      }
      losses.predictor_accuracy = static_cast<double>(correct) / static_cast<double>(logits.size());
    }
  }
  return losses;
}

void RoutedLayer::route_backward(const Context& ctx, const TensorView& dlogits, Saved& st,
                                 const TensorView& dx) const {
  Backend& be = ctx.backend;
  const bool has_mask = !st.mask.empty();
  const bool aux = has_mask && routing_.causal == CausalRouter::aux_loss;
  if (aux) {
    be.bce_with_logits_backward(routing_.aux_loss_weight, st.logits, st.mask, dlogits);
  }
  if (!routing_.unit_gate || aux) {
    be.router_backward(dlogits, st.x, router_->value, dx, router_->grad);
  }
  if (has_mask && routing_.causal == CausalRouter::predictor) {
    Buffer dpred = ctx.zeros(st.pred_logits.view().shape_vector(), ctx.stats());
    be.bce_with_logits_backward(1.0, st.pred_logits, reshape(st.mask, {st.mask.numel()}), dpred);
    predictor_backward(ctx, dpred, st);
  }
}

RoutedLayer::Losses RoutedLayer::forward_inplace(const Context& ctx, const TensorView& x,
                                                 Saved* saved, const Selection* forced) const {
  Backend& be = ctx.backend;
  Saved local;
  Saved& st = saved != nullptr ? *saved : local;
  st = Saved{};
  const Losses losses = route(ctx, x, st, forced);
  Buffer gathered = ctx.make({x.dim(0), st.indices.dim(1), x.dim(2)});
  be.gather_rows_forward(x, st.indices, gathered);
  st.delta = core_.delta_forward(ctx, gathered, positions_of(st), st.counts,
                                 saved != nullptr ? &st.core : nullptr);
  gathered.reset();
  be.scatter_add_scaled_forward(x, st.indices, gate_input_of(st), st.delta, routing_.gate);
  return losses;
}

void RoutedLayer::backward_inplace(const Context& ctx, const TensorView& dx, Saved& st) const {
  Backend& be = ctx.backend;
  Buffer ddelta = ctx.zeros(st.delta.view().shape_vector());
  Buffer dlogits = ctx.zeros(st.logits.view().shape_vector(), ctx.stats());
  be.scatter_add_scaled_backward(dx, st.indices, gate_input_of(st), st.delta, routing_.gate, ddelta,
                                 routing_.unit_gate ? TensorView{} : dlogits.view());
  Buffer dgathered = ctx.zeros(st.delta.view().shape_vector());
  core_.delta_backward(ctx, ddelta, st.core, dgathered);
  ddelta.reset();
  be.gather_rows_backward(dgathered, st.indices, dx);
  dgathered.reset();
  route_backward(ctx, dlogits, st, dx);
  st = Saved{};
}

Buffer RoutedLayer::branch_forward(const Context& ctx, int branch, const TensorView& h, Saved& st,
                                   Losses* losses) const {
  Backend& be = ctx.backend;
  if (branch == 0) {
    st = Saved{};
    const Losses routed = route(ctx, h, st, nullptr);
    if (losses != nullptr) {
      *losses = routed;
    }
  }
  Buffer gathered = ctx.make({h.dim(0), st.indices.dim(1), h.dim(2)});
  be.gather_rows_forward(h, st.indices, gathered);
  Buffer& out = st.branch_out[branch];
  if (branch == 0) {
    out = core_.attention().forward(ctx, gathered, positions_of(st), st.counts, &st.core.attn);
  } else {
    out = core_.ffn_forward(ctx, gathered, &st.core);
  }
  Buffer y = ctx.zeros(h.shape_vector());
  be.scatter_add_scaled_forward(y, st.indices, gate_input_of(st), out, routing_.gate);
  return y;
}

void RoutedLayer::branch_backward(const Context& ctx, int branch, const TensorView& dy, Saved& st,
                                  const TensorView& dh) const {
  Backend& be = ctx.backend;
  if (st.dlogits.empty()) {
    st.dlogits = ctx.zeros(st.logits.view().shape_vector(), ctx.stats());
  }
  Buffer& out = st.branch_out[branch];
  Buffer dout = ctx.zeros(out.view().shape_vector());
  be.scatter_add_scaled_backward(dy, st.indices, gate_input_of(st), out, routing_.gate, dout,
                                 routing_.unit_gate ? TensorView{} : st.dlogits.view());
  Buffer dgathered = ctx.zeros(out.view().shape_vector());
  if (branch == 0) {
    core_.attention().backward(ctx, dout, st.core.attn, dgathered);
  } else {
    core_.ffn_backward(ctx, dout, st.core, dgathered);
  }
  out.reset();
  be.gather_rows_backward(dgathered, st.indices, dh);
  if (branch == 0) {
    route_backward(ctx, st.dlogits, st, dh);
    st = Saved{};
  }
}

bool RoutedLayer::decode_inplace(const Context& ctx, const TensorView& x, int32_t position,
                                 KvCache& cache) const {
  Backend& be = ctx.backend;
  Buffer logit = ctx.make({1, 1}, ctx.stats());
  be.router_forward(x, router_->value, logit);
  double decision = 0.0;
  if (routing_.causal == CausalRouter::predictor) {
    decision = download(be, predictor_logits(ctx, x, nullptr))[0];
  } else {
    decision = download(be, logit)[0];
  }
  if (!(decision > 0.0)) {  // sigmoid(logit) > 0.5  <=>  logit > 0
    return false;
  }
  Buffer a = core_.attention().decode(ctx, x, position, cache);
  Buffer x_mid = ctx.make(x.shape_vector());
  be.add(x, a, x_mid);
  Buffer m = core_.ffn_forward(ctx, x_mid, nullptr);
  be.add(a, m, a);
  Buffer index = ctx.indices({1, 1}, {0});
  if (routing_.unit_gate) {
    be.fill(logit, 1.0);
  }
  be.scatter_add_scaled_forward(x, index, logit, a, routing_.gate);
  return true;
}

}  // namespace modar::runtime
