// runtime/parallel/tensor_parallel.cpp: a layer's Megatron tensor-parallel
// shard, with or without sequence parallelism (tensor_parallel.hpp), as the
// ParallelTrainer's layer when parallel.tensor > 1.
//
// A rank's branch is the runtime's own AttentionBranch / MlpBranch built with
// the shard's shape (heads / t, kv_heads / t, d_ff / t): its first GEMMs are
// then exactly the column-parallel blocks and its last GEMM the row-parallel
// block, whose output is this rank's partial sum.  The trainer gives the
// parameters the single-process model's initial values (each shard its rows /
// columns of the same tensors).
#include "tensor_parallel.hpp"

#include <stdexcept>
#include <string>

#include "modar/base/errors.hpp"
#include "modar/runtime/parallel_steps.hpp"

namespace modar::runtime {

// ---- sequence shards -------------------------------------------------------------

Buffer gather_sequence(const Context& ctx, Communicator& tensor, const TensorView& shard) {
  const int64_t t = tensor.size();
  const int64_t b = shard.dim(0), chunk = shard.dim(1), d = shard.dim(2);
  Buffer stacked = ctx.make({t, b, chunk, d});
  tensor.all_gather(shard, stacked);
  Buffer full = ctx.make({b, chunk * t, d});
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t i = 0; i < b; ++i) {
      ctx.backend.copy(select(select(stacked, r), i), slice(select(full, i), r * chunk, chunk));
    }
  }
  return full;
}

Buffer scatter_sequence_sum(const Context& ctx, Communicator& tensor, const TensorView& partial) {
  const int64_t t = tensor.size();
  const int64_t b = partial.dim(0), chunk = partial.dim(1) / t, d = partial.dim(2);
  Buffer stacked = ctx.make({t, b, chunk, d});
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t i = 0; i < b; ++i) {
      ctx.backend.copy(slice(select(partial, i), r * chunk, chunk), select(select(stacked, r), i));
    }
  }
  Buffer shard = ctx.make({b, chunk, d});
  tensor.reduce_scatter(stacked, shard);
  return shard;
}

Buffer take_sequence_shard(const Context& ctx, Communicator& tensor, const TensorView& full) {
  const int64_t t = tensor.size(), r = tensor.rank();
  const int64_t b = full.dim(0), chunk = full.dim(1) / t, d = full.dim(2);
  Buffer shard = ctx.make({b, chunk, d});
  for (int64_t i = 0; i < b; ++i) {
    ctx.backend.copy(slice(select(full, i), r * chunk, chunk), select(shard, i));
  }
  return shard;
}

// ---- the vocab-parallel embedding --------------------------------------------------

Buffer vocab_parallel_embedding(const Context& ctx, Communicator& tensor, const Parameter& table,
                                int64_t begin, const TensorView& tokens, bool sequence_parallel,
                                VocabLookup& lookup) {
  Backend& be = ctx.backend;
  const int64_t rows = table.value.dim(0), d = table.value.dim(1);
  const int64_t b = tokens.dim(0), s = tokens.dim(1);
  std::vector<int32_t> ids;
  std::vector<double> mask;
  for (const double token : download(be, tokens)) {
    const auto row = static_cast<int64_t>(token) - begin;
    const bool here = row >= 0 && row < rows;
    ids.push_back(here ? static_cast<int32_t>(row) : 0);
    mask.insert(mask.end(), static_cast<size_t>(d), here ? 1.0 : 0.0);
  }
  lookup.ids = ctx.indices({b, s}, ids);
  lookup.mask = ctx.make({b, s, d});
  upload(be, mask, lookup.mask);
  Buffer looked = ctx.make({b, s, d});
  be.embedding_forward(table.value, lookup.ids, looked);
  Buffer partial = ctx.make({b, s, d});
  be.mul_forward(looked, lookup.mask, partial);
  looked.reset();
  if (sequence_parallel) {
    return scatter_sequence_sum(ctx, tensor, partial);
  }
  tensor.all_reduce(partial, ReduceOp::sum);
  return partial;
}

void vocab_parallel_embedding_backward(const Context& ctx, Parameter& table, const TensorView& dx,
                                       const VocabLookup& lookup) {
  Buffer masked = ctx.make(dx.shape_vector());
  ctx.backend.mul_forward(dx, lookup.mask, masked);
  ctx.backend.embedding_backward(masked, lookup.ids, table.grad);
}

// ---- the layer ---------------------------------------------------------------------

struct TensorParallelLayer::State final : StackLayer::Saved {
  AttentionBranch::Saved attention;
  MlpBranch::Saved mlp;
  // MoD (router and predictor replicated on every tensor rank)
  Buffer x;        // router input (this rank's tokens)
  Buffer logits;   // [b, s_local] this rank's router logits
  Buffer indices;  // [b, k] top-k positions in the whole sequence
  Buffer local;    // [b, k] the same positions in this rank's tokens, -1 elsewhere (SP)
  Buffer mask;     // [b, s_local] top-k mask (causal router)
  Buffer pred_hidden_pre, pred_hidden, pred_logits;
  Buffer delta;          // plain residual: [b, k, d]
  Buffer branch_out[2];  // depth residual: f(X~) of each branch
  Buffer dlogits;        // [b, s_local]
};

TensorParallelLayer::State& TensorParallelLayer::state_of(Saved* saved) {
  if (saved == nullptr) {
    throw std::logic_error("tensor-parallel layer: training passes only (no saved state given)");
  }
  return static_cast<State&>(*saved);
}

TensorParallelLayer::TensorParallelLayer(ParameterSet& params, const Context& ctx,
                                         const Config& config, const ModelOptions& options,
                                         int64_t layer, Communicator& tensor,
                                         bool sequence_parallel, Rng& rng)
    : tensor_(tensor), sp_(sequence_parallel) {
  const ModelConfig& m = config.model;
  const int64_t t = tensor.size(), d = m.d_model;
  routing_ = RoutingOptions::from(config.mod);
  routing_.aux_loss_weight = options.router_aux_loss_weight;
  routing_.unit_gate = options.unit_router_gate;
  BranchShape local = BranchShape::from(m);
  local.rope_theta = options.rope_theta;
  local.n_heads /= t;
  local.n_kv_heads /= t;
  local.d_ff /= t;
  const std::string prefix = "layer" + std::to_string(layer);
  // Values are replaced by the single-process model's (the trainer copies them).
  attention_ = std::make_unique<AttentionBranch>(params, ctx, prefix, local, rng, 0.02);
  mlp_ = std::make_unique<MlpBranch>(params, ctx, prefix, local, rng, 0.02);
  if (config.mod.is_routed(layer)) {
    routed_ = true;
    router_ = &params.add(ctx, prefix + ".router", {d}, ctx.dtype, Init::constant_value(0), rng);
    if (routing_.causal == CausalRouter::predictor) {
      pred_in_ = &params.add(ctx, prefix + ".predictor_in", {d, routing_.predictor_hidden},
                             ctx.dtype, Init::constant_value(0), rng);
      pred_out_ = &params.add(ctx, prefix + ".predictor_out", {routing_.predictor_hidden},
                              ctx.dtype, Init::constant_value(0), rng);
    }
  }
}

TensorParallelLayer::~TensorParallelLayer() = default;

std::unique_ptr<StackLayer::Saved> TensorParallelLayer::make_saved() const {
  return std::make_unique<State>();
}

TensorView TensorParallelLayer::routed_index(const State& st) const {
  return sp_ ? st.local.view() : st.indices.view();
}

Buffer TensorParallelLayer::shard_forward(const Context& ctx, State& st, int branch,
                                          const TensorView& input, bool sharded,
                                          const TensorView& positions) {
  Buffer gathered = sharded ? gather_sequence(ctx, tensor_, input) : Buffer{};
  const TensorView whole = sharded ? gathered.view() : input;
  Buffer y = branch == 0 ? attention_->forward(ctx, whole, positions, TensorView{}, &st.attention)
                         : mlp_->forward(ctx, whole, &st.mlp);
  if (sharded) {
    return scatter_sequence_sum(ctx, tensor_, y);
  }
  tensor_.all_reduce(y, ReduceOp::sum);
  return y;
}

Buffer TensorParallelLayer::shard_backward(const Context& ctx, State& st, int branch,
                                           const TensorView& dy, bool sharded) {
  Buffer gathered = sharded ? gather_sequence(ctx, tensor_, dy) : Buffer{};
  const TensorView grad = sharded ? gathered.view() : dy;
  Buffer dh = ctx.zeros(grad.shape_vector());
  if (branch == 0) {
    attention_->backward(ctx, grad, st.attention, dh);
  } else {
    mlp_->backward(ctx, grad, st.mlp, dh);
  }
  gathered.reset();
  if (sharded) {
    return scatter_sequence_sum(ctx, tensor_, dh);
  }
  tensor_.all_reduce(dh, ReduceOp::sum);
  return dh;
}

Buffer TensorParallelLayer::delta_forward(const Context& ctx, State& st, const TensorView& x,
                                          bool sharded, const TensorView& positions) {
  // a = Attn(x), m = MLP(x + a), delta = a + m (TransformerLayer's order).
  Buffer a = shard_forward(ctx, st, 0, x, sharded, positions);
  Buffer x_mid = ctx.make(x.shape_vector());
  ctx.backend.add(x, a, x_mid);
  Buffer m = shard_forward(ctx, st, 1, x_mid, sharded, positions);
  x_mid.reset();
  ctx.backend.add(a, m, a);
  return a;
}

Buffer TensorParallelLayer::delta_backward(const Context& ctx, State& st, const TensorView& ddelta,
                                           bool sharded) {
  // J^T ddelta: the MLP path first; da = ddelta + d(x + a).
  Buffer dx_mid = shard_backward(ctx, st, 1, ddelta, sharded);
  Buffer da = ctx.copy_of(ddelta);
  ctx.backend.axpy(1.0, dx_mid, da);
  Buffer dx_attn = shard_backward(ctx, st, 0, da, sharded);
  ctx.backend.axpy(1.0, dx_attn, dx_mid);
  return dx_mid;
}

Buffer TensorParallelLayer::gather_routed(const Context& ctx, State& st, const TensorView& x) {
  Buffer gathered = ctx.make({x.dim(0), st.indices.dim(1), x.dim(2)});
  ctx.backend.gather_rows_forward(x, routed_index(st), gathered);
  if (sp_) {
    tensor_.all_reduce(gathered, ReduceOp::sum);  // one owner per row, zeros elsewhere
  }
  return gathered;
}

void TensorParallelLayer::forward_inplace(const Context& ctx, const TensorView& x,
                                          const TensorView& positions, Saved* saved,
                                          LayerLosses& losses) {
  State& st = state_of(saved);
  if (!routed_) {
    Buffer delta = delta_forward(ctx, st, x, sp_, positions);
    ctx.backend.add(x, delta, x);
    return;
  }
  // MoD: x[idx] += g(r) delta(X~); the routed block's collectives carry b k rows.
  losses.add(route(ctx, st, x));
  Buffer gathered = gather_routed(ctx, st, x);
  st.delta = delta_forward(ctx, st, gathered, false, st.indices);
  gathered.reset();
  ctx.backend.scatter_add_scaled_forward(x, routed_index(st), st.logits, st.delta, routing_.gate);
}

void TensorParallelLayer::backward_inplace(const Context& ctx, const TensorView& dx, Saved& saved) {
  State& st = state_of(&saved);
  if (!routed_) {
    Buffer dx_delta = delta_backward(ctx, st, dx, sp_);  // formed first and added once
    ctx.backend.axpy(1.0, dx_delta, dx);
    return;
  }
  Buffer ddelta = ctx.zeros(st.delta.view().shape_vector());
  st.dlogits = ctx.zeros(st.logits.view().shape_vector(), ctx.stats());
  ctx.backend.scatter_add_scaled_backward(dx, routed_index(st), st.logits, st.delta, routing_.gate,
                                          ddelta, st.dlogits);
  if (sp_) {
    tensor_.all_reduce(ddelta, ReduceOp::sum);  // each row from its owner
  }
  Buffer dgathered = delta_backward(ctx, st, ddelta, false);
  ddelta.reset();
  ctx.backend.gather_rows_backward(dgathered, routed_index(st), dx);
  dgathered.reset();
  route_backward(ctx, st, dx);
}

Buffer TensorParallelLayer::branch_forward(const Context& ctx, int branch, const TensorView& h,
                                           const TensorView& positions, Saved* saved,
                                           LayerLosses& losses) {
  State& st = state_of(saved);
  if (!routed_) {
    return shard_forward(ctx, st, branch, h, sp_, positions);
  }
  // Routed branch: the attention branch's input routes, both branches run on
  // the same tokens; y = g(r) f(h~) at the routed tokens.
  if (branch == 0) {
    losses.add(route(ctx, st, h));
  }
  Buffer gathered = gather_routed(ctx, st, h);
  st.branch_out[branch] = shard_forward(ctx, st, branch, gathered, false, st.indices);
  Buffer y = ctx.zeros(h.shape_vector());
  ctx.backend.scatter_add_scaled_forward(y, routed_index(st), st.logits, st.branch_out[branch],
                                         routing_.gate);
  return y;
}

Buffer TensorParallelLayer::branch_backward(const Context& ctx, int branch, const TensorView& dy,
                                            Saved& saved) {
  State& st = state_of(&saved);
  if (!routed_) {
    return shard_backward(ctx, st, branch, dy, sp_);
  }
  if (st.dlogits.empty()) {
    st.dlogits = ctx.zeros(st.logits.view().shape_vector(), ctx.stats());
  }
  Buffer& out = st.branch_out[branch];
  Buffer dout = ctx.zeros(out.view().shape_vector());
  ctx.backend.scatter_add_scaled_backward(dy, routed_index(st), st.logits, out, routing_.gate, dout,
                                          st.dlogits);
  if (sp_) {
    tensor_.all_reduce(dout, ReduceOp::sum);
  }
  Buffer dgathered = shard_backward(ctx, st, branch, dout, false);
  out.reset();
  Buffer dh = ctx.zeros(dy.shape_vector());
  ctx.backend.gather_rows_backward(dgathered, routed_index(st), dh);
  if (branch == 0) {
    route_backward(ctx, st, dh);
  }
  return dh;
}

RoutedLayer::Losses TensorParallelLayer::route(const Context& ctx, State& st, const TensorView& x) {
  Backend& be = ctx.backend;
  const bool sp = sp_;
  const int64_t t = sp ? tensor_.size() : 1, r = sp ? tensor_.rank() : 0;
  const int64_t batch = x.dim(0), local_seq = x.dim(1), seq = local_seq * t;
  st.x = ctx.copy_of(x);
  st.logits = ctx.make({batch, local_seq}, ctx.stats());
  be.router_forward(x, router_->value, st.logits);
  // Top-k over the whole sequence: under SP the b s logits are all-gathered.
  Buffer gathered_logits;
  TensorView logits = st.logits;
  if (sp) {
    Buffer stacked = ctx.make({t, batch, local_seq}, ctx.stats());
    tensor_.all_gather(st.logits, stacked);
    gathered_logits = ctx.make({batch, seq}, ctx.stats());
    for (int64_t q = 0; q < t; ++q) {
      for (int64_t i = 0; i < batch; ++i) {
        be.copy(select(select(stacked, q), i),
                slice(select(gathered_logits, i), q * local_seq, local_seq));
      }
    }
    logits = gathered_logits;
  }
  ModConfig mod;
  mod.capacity = routing_.capacity;
  const int64_t k = mod.routed_tokens_per_sequence(seq);
  st.indices = ctx.make({batch, k}, ScalarType::i32);
  be.topk(logits, st.indices);
  if (sp) {
    std::vector<int32_t> local;
    for (double p : download(be, st.indices)) {
      const int64_t q = static_cast<int64_t>(p) - r * local_seq;
      local.push_back(q >= 0 && q < local_seq ? static_cast<int32_t>(q) : -1);
    }
    st.local = ctx.indices({batch, k}, local);
  }
  RoutedLayer::Losses losses;
  if (routing_.causal == CausalRouter::none) {
    return losses;
  }
  // The causal-router BCE terms on this rank's tokens: means over the whole
  // batch are the tensor ranks' means averaged (SP).
  Buffer mask = ctx.zeros({batch, seq}, ctx.stats());
  be.topk_mask(st.indices, mask);
  if (sp) {
    st.mask = ctx.make({batch, local_seq}, ctx.stats());
    for (int64_t i = 0; i < batch; ++i) {
      be.copy(slice(select(mask, i), r * local_seq, local_seq), select(st.mask, i));
    }
  } else {
    st.mask = std::move(mask);
  }
  Buffer loss = ctx.make({1}, ctx.stats());
  be.bce_with_logits_forward(st.logits, st.mask, loss);
  std::vector<double> values = {download(be, loss)[0], 0.0, 0.0};
  if (routing_.causal == CausalRouter::predictor) {
    std::vector<int64_t> hidden_shape = {batch, local_seq, routing_.predictor_hidden};
    st.pred_hidden_pre = ctx.make(hidden_shape);
    be.gemm(x, false, pred_in_->value, false, st.pred_hidden_pre);
    st.pred_hidden = ctx.make(hidden_shape);
    be.gelu_forward(st.pred_hidden_pre, st.pred_hidden);
    st.pred_logits = ctx.make({batch * local_seq}, ctx.stats());
    be.router_forward(st.pred_hidden, pred_out_->value, st.pred_logits);
    be.bce_with_logits_forward(st.pred_logits, reshape(st.mask, {batch * local_seq}), loss);
    values[1] = download(be, loss)[0];
    const std::vector<double> pred = download(be, st.pred_logits);
    const std::vector<double> mask = download(be, st.mask);
    int64_t correct = 0;
    for (size_t i = 0; i < pred.size(); ++i) {
      correct += ((pred[i] > 0.0) == (mask[i] > 0.5)) ? 1 : 0;
    }
    values[2] = static_cast<double>(correct) / static_cast<double>(pred.size());
  }
  if (sp) {
    values = all_reduce_sum(be, tensor_, values);
    for (double& v : values) {
      v /= static_cast<double>(t);
    }
  }
  losses.router_aux = values[0];
  losses.predictor = values[1];
  losses.predictor_accuracy = values[2];
  return losses;
}

void TensorParallelLayer::route_backward(const Context& ctx, State& st, const TensorView& dx) {
  Backend& be = ctx.backend;
  // Each rank's BCE is a mean over its 1 / t of the tokens.
  const double share = sp_ ? 1.0 / static_cast<double>(tensor_.size()) : 1.0;
  if (routing_.causal == CausalRouter::aux_loss) {
    be.bce_with_logits_backward(routing_.aux_loss_weight * share, st.logits, st.mask, st.dlogits);
  }
  be.router_backward(st.dlogits, st.x, router_->value, dx, router_->grad);
  if (routing_.causal == CausalRouter::predictor) {
    Buffer dpred = ctx.zeros(st.pred_logits.view().shape_vector(), ctx.stats());
    be.bce_with_logits_backward(share, st.pred_logits, reshape(st.mask, {st.mask.numel()}), dpred);
    Buffer dhidden = ctx.zeros(st.pred_hidden.view().shape_vector());
    be.router_backward(dpred, st.pred_hidden, pred_out_->value, dhidden, pred_out_->grad);
    Buffer dpre = ctx.zeros(st.pred_hidden_pre.view().shape_vector());
    be.gelu_backward(dhidden, st.pred_hidden_pre, dpre);
    be.gemm(st.x, true, dpre, false, pred_in_->grad, 1.0, 1.0);  // stop-gradient input
  }
  // The selection and the router's saved state are done with.
  st.x.reset();
  st.logits.reset();
  st.indices.reset();
  st.local.reset();
  st.mask.reset();
  st.pred_hidden_pre.reset();
  st.pred_hidden.reset();
  st.pred_logits.reset();
  st.delta.reset();
  st.dlogits.reset();
}

}  // namespace modar::runtime
