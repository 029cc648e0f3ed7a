// A whole small model's training step (include/modar/runtime/model.hpp).
#include "modar/runtime/model.hpp"

#include <cmath>

#include "modar/base/errors.hpp"

namespace modar::runtime {

struct Model::LayerSlot {
  std::unique_ptr<TransformerLayer> dense;
  std::unique_ptr<RoutedLayer> routed;
  // Saved activations of the current step (plain residual / depth residual).
  TransformerLayer::Saved dense_saved;
  RoutedLayer::Saved routed_saved;
  AttentionBranch::Saved attn_saved;
};

namespace {

void check_model_config(const Config& config) {
  const ModelConfig& m = config.model;
  auto require = [](bool ok, const std::string& what) {
    if (!ok) {
      throw ConfigError(what);
    }
  };
  require(m.d_model >= 2, "model.d_model = " + std::to_string(m.d_model) + ": must be >= 2");
  require(m.n_layers >= 1, "model.n_layers = " + std::to_string(m.n_layers) + ": must be >= 1");
  require(m.n_heads >= 1, "model.n_heads = " + std::to_string(m.n_heads) + ": must be >= 1");
  require(m.vocab_size >= 2,
          "model.vocab_size = " + std::to_string(m.vocab_size) + ": must be >= 2");
  require(m.resolved_d_head() % 2 == 0,
          "model.d_head = " + std::to_string(m.resolved_d_head()) + ": must be even (RoPE)");
  require(m.n_heads % m.resolved_kv_heads() == 0,
          "model.n_kv_heads = " + std::to_string(m.resolved_kv_heads()) +
              ": must divide model.n_heads = " + std::to_string(m.n_heads));
  if (config.dar.enabled()) {
    require(config.dar.block_layers >= 1,
            "dar.block_layers = " + std::to_string(config.dar.block_layers) + ": must be >= 1");
  }
}

}  // namespace

Model::Model(Backend& backend, const Config& config, const ModelOptions& options)
    : backend_(backend), config_(config), options_(options) {
  check_model_config(config);
  const ModelConfig& m = config.model;
  const Context ctx = context();
  Rng rng(options.seed);
  const int64_t d = m.d_model;
  embedding_ =
      &params_.add(ctx, "embedding", {m.vocab_size, d}, options.dtype, Init::normal_std(0.02), rng);
  auto close_unit = [this](const std::string& name) {
    const int64_t begin = units_.empty() ? 0 : units_.back().end;
    units_.push_back({name, begin, static_cast<int64_t>(params_.all().size())});
  };
  close_unit("embedding");
  BranchShape shape = BranchShape::from(m);
  shape.rope_theta = options.rope_theta;
  const double out_std = 0.02 / std::sqrt(2.0 * static_cast<double>(m.n_layers));
  RoutingOptions routing = RoutingOptions::from(config.mod);
  routing.aux_loss_weight = options.router_aux_loss_weight;
  routing.unit_gate = options.unit_router_gate;
  // [moe]: layer l's FFN is an MoE FFN iff moe.is_moe_layer(l); inside a MoD
  // routed block that is staged MoDE, with null experts integrated MoDE.
  const MoeOptions moe = MoeOptions::from(config.moe, m);
  for (int64_t l = 0; l < m.n_layers; ++l) {
    auto slot = std::make_unique<LayerSlot>();
    const std::string prefix = "layer" + std::to_string(l);
    const MoeOptions* layer_moe = config.moe.is_moe_layer(l) ? &moe : nullptr;
    if (config.mod.is_routed(l)) {
      slot->routed = std::make_unique<RoutedLayer>(params_, ctx, prefix, shape, routing, rng,
                                                   out_std, layer_moe);
    } else {
      slot->dense =
          std::make_unique<TransformerLayer>(params_, ctx, prefix, shape, rng, out_std, layer_moe);
    }
    layers_.push_back(std::move(slot));
    close_unit(prefix);
  }
  if (config.dar.enabled()) {
    depth_ = std::make_unique<DepthResidual>(params_, ctx, DepthOptions::from(config), d, rng);
    depth_unit_ = static_cast<int64_t>(units_.size());
    close_unit("depth");
  }
  final_norm_ = &params_.add(ctx, "final_norm", {d}, options.dtype, Init::constant_value(1.0), rng);
  if (!m.tie_embeddings) {
    head_ =
        &params_.add(ctx, "head", {d, m.vocab_size}, options.dtype, Init::normal_std(0.02), rng);
  }
  head_unit_ = static_cast<int64_t>(units_.size());
  close_unit("head");
}

Model::~Model() = default;

int64_t Model::routed_layers() const {
  int64_t count = 0;
  for (const auto& slot : layers_) {
    count += slot->routed ? 1 : 0;
  }
  return count;
}

std::vector<MoeFfn*> Model::moe_ffns() {
  std::vector<MoeFfn*> out;
  for (const auto& slot : layers_) {
    const MoeFfn* ffn = slot->dense ? slot->dense->moe() : slot->routed->core().moe();
    if (ffn != nullptr) {
      out.push_back(const_cast<MoeFfn*>(ffn));  // the model owns its layers
    }
  }
  return out;
}

Buffer Model::make_tokens(const std::vector<int32_t>& ids, int64_t batch, int64_t seq) const {
  const Context ctx{backend_, nullptr, options_.dtype};
  return ctx.indices({batch, seq}, ids);
}

std::vector<double> Model::last_logits() const {
  return download(backend_, last_logits_);
}

Model::DecodeState Model::begin_decode(int64_t max_tokens) const {
  if (depth_) {
    throw ConfigError(std::string("dar.variant = ") + to_string(config_.dar.variant) +
                      ": decoding is implemented for the plain residual only");
  }
  const Context ctx{backend_, nullptr, options_.dtype};
  DecodeState state;
  for (const auto& slot : layers_) {
    state.caches.push_back(slot->dense ? slot->dense->attention().make_cache(ctx, max_tokens)
                                       : slot->routed->make_cache(ctx, max_tokens));
  }
  return state;
}

std::vector<double> Model::decode_step(DecodeState& state, int32_t token) const {
  Backend& be = backend_;
  const Context ctx{backend_, nullptr, options_.dtype};
  const int64_t d = config_.model.d_model;
  const int32_t position = static_cast<int32_t>(state.position++);
  Buffer ids = ctx.indices({1, 1}, {token});
  Buffer x = ctx.make({1, 1, d});
  be.embedding_forward(embedding_->value, ids, x);
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (layers_[l]->dense) {
      layers_[l]->dense->decode_inplace(ctx, x, position, state.caches[l]);
    } else {
      layers_[l]->routed->decode_inplace(ctx, x, position, state.caches[l]);
    }
  }
  Buffer rstd = ctx.make({1}, ctx.stats());
  Buffer u = ctx.make({1, d});
  be.rmsnorm_forward(reshape(x, {1, d}), final_norm_->value, u, rstd, config_.model.norm_eps);
  Buffer logits = ctx.make({1, config_.model.vocab_size});
  if (head_ != nullptr) {
    be.gemm(u, false, head_->value, false, logits);
  } else {
    be.gemm(u, false, embedding_->value, true, logits);
  }
  return download(be, logits);
}

StepResult Model::forward_backward(const TensorView& tokens, const TensorView& targets) {
  tracker_.reset_peak();
  StepResult result = run(tokens, targets, true);
  result.peak_bytes = tracker_.peak_bytes();
  return result;
}

StepResult Model::evaluate(const TensorView& tokens, const TensorView& targets) {
  tracker_.reset_peak();
  StepResult result = run(tokens, targets, false);
  result.peak_bytes = tracker_.peak_bytes();
  return result;
}

void Model::optimizer_step() {
  if (hooks_ != nullptr) {
    throw ConfigError(
        "parallel.zero = 3: the model's parameters are sharded; the sharded optimizer steps them");
  }
  AdamWParams hyper = options_.adamw;
  hyper.step = ++step_;
  params_.adamw_step(backend_, hyper);
}

StepResult Model::train_step(const TensorView& tokens, const TensorView& targets) {
  tracker_.reset_peak();
  StepResult result = run(tokens, targets, true);
  optimizer_step();
  result.peak_bytes = tracker_.peak_bytes();
  return result;
}

StepResult Model::run(const TensorView& tokens, const TensorView& targets, bool with_backward) {
  Backend& be = backend_;
  const Context ctx = context();
  const ModelConfig& m = config_.model;
  if (tokens.rank != 2 || targets.rank != 2 || tokens.shape != targets.shape ||
      tokens.dtype != ScalarType::i32 || targets.dtype != ScalarType::i32) {
    throw ShapeError("model step: tokens " + tokens.describe() + " and targets " +
                     targets.describe() + " must both be i32 [b, s]");
  }
  const int64_t batch = tokens.dim(0), seq = tokens.dim(1), d = m.d_model, rows = batch * seq;
  if (with_backward && hooks_ == nullptr) {
    params_.zero_grads(be);
  }
  // ZeRO-3 (ParameterUnitHooks): a unit's values / gradients around its use.
  auto acquire = [this](int64_t unit, bool values, bool grads) {
    if (hooks_ != nullptr && unit >= 0) {
      hooks_->acquire(unit, values, grads);
    }
  };
  auto release = [this](int64_t unit) {
    if (hooks_ != nullptr && unit >= 0) {
      hooks_->release(unit);
    }
  };
  const int64_t embedding_unit = 0;
  const bool tied = head_ == nullptr;
  StepResult result;
  int64_t routed_count = 0;
  auto add_losses = [&](const RoutedLayer::Losses& losses) {
    result.router_aux += losses.router_aux;
    result.predictor += losses.predictor;
    result.predictor_accuracy += losses.predictor_accuracy;
    ++routed_count;
  };
  // MoE layers (after each layer's forward, from what it saved for backward).
  int64_t moe_count = 0;
  double moe_weighted = 0.0;
  auto add_moe = [&](const TransformerLayer& layer) {
    if (layer.moe() == nullptr) {
      return;
    }
    const MoeFfn::Stats& stats = layer.moe()->last_stats();
    result.moe_aux_loss += stats.aux_loss;
    result.moe_z_loss += stats.z_loss;
    result.moe_dropped += stats.dropped;
    result.moe_null += stats.null_assignments;
    moe_weighted += layer.moe()->options().aux_loss_coef * stats.aux_loss +
                    layer.moe()->options().z_loss_coef * stats.z_loss;
    ++moe_count;
  };

  // ---- forward ----
  Buffer x = ctx.make({batch, seq, d});
  acquire(embedding_unit, true, false);
  be.embedding_forward(embedding_->value, tokens, x);
  release(embedding_unit);
  std::vector<int32_t> position_values(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) {
    position_values[static_cast<size_t>(i)] = static_cast<int32_t>(i % seq);
  }
  Buffer positions = ctx.indices({batch, seq}, position_values);

  Buffer final_input;  // [b, s, d]: the residual stream, or the depth output read
  if (!depth_) {
    for (size_t l = 0; l < layers_.size(); ++l) {
      LayerSlot* slot = layers_[l].get();
      const int64_t unit = layer_unit0_ + static_cast<int64_t>(l);
      acquire(unit, true, false);
      if (slot->dense) {
        slot->dense->forward_inplace(ctx, x, positions,
                                     with_backward ? &slot->dense_saved : nullptr);
        add_moe(*slot->dense);
      } else {
        add_losses(
            slot->routed->forward_inplace(ctx, x, with_backward ? &slot->routed_saved : nullptr));
        add_moe(slot->routed->core());
      }
      release(unit);
    }
    final_input = std::move(x);
  } else {
    depth_->set_saving(with_backward);
    acquire(depth_unit_, true, false);
    depth_->begin(ctx, x, rows);
    for (size_t l = 0; l < layers_.size(); ++l) {
      LayerSlot& slot = *layers_[l];
      const int64_t unit = layer_unit0_ + static_cast<int64_t>(l);
      acquire(unit, true, false);
      const int64_t attn_branch = 2 * static_cast<int64_t>(l);
      for (int branch = 0; branch < 2; ++branch) {
        const TensorView h = reshape(depth_->read(ctx, attn_branch + branch), {batch, seq, d});
        Buffer y;
        if (slot.routed) {
          RoutedLayer::Losses losses;
          y = slot.routed->branch_forward(ctx, branch, h, slot.routed_saved, &losses);
          if (branch == 0) {
            add_losses(losses);
          } else {
            add_moe(slot.routed->core());
          }
        } else if (branch == 0) {
          y = slot.dense->attention().forward(ctx, h, positions, TensorView{},
                                              with_backward ? &slot.attn_saved : nullptr);
        } else {
          y = slot.dense->ffn_forward(ctx, h, with_backward ? &slot.dense_saved : nullptr);
          add_moe(*slot.dense);
        }
        depth_->write(ctx, attn_branch + branch, y);
      }
      release(unit);
    }
    final_input = depth_->read_output(ctx);  // [T, d]
    release(depth_unit_);
    x.reset();
    if (!with_backward) {
      depth_->release();
    }
  }
  if (routed_count > 0) {
    result.router_aux /= static_cast<double>(routed_count);
    result.predictor /= static_cast<double>(routed_count);
    result.predictor_accuracy /= static_cast<double>(routed_count);
  }

  const TensorView final_view = reshape(final_input, {batch, seq, d});
  Buffer final_rstd = ctx.make({rows}, ctx.stats());
  Buffer final_u = ctx.make({batch, seq, d});
  acquire(head_unit_, true, false);
  if (tied) {
    acquire(embedding_unit, true, false);
  }
  be.rmsnorm_forward(final_view, final_norm_->value, final_u, final_rstd, m.norm_eps);
  last_logits_ = ctx.make({rows, m.vocab_size});
  const TensorView u_rows = reshape(final_u, {rows, d});
  if (head_ != nullptr) {
    be.gemm(u_rows, false, head_->value, false, last_logits_);
  } else {
    be.gemm(u_rows, false, embedding_->value, true, last_logits_);
  }
  Buffer loss = ctx.make({1}, ctx.stats());
  Buffer lse = ctx.make({rows}, ctx.stats());
  const TensorView target_rows = reshape(targets, {rows});
  be.cross_entropy_forward(last_logits_, target_rows, loss, lse);
  result.lm_loss = download(be, loss)[0];
  const double aux_weight =
      config_.mod.causal_router == CausalRouter::aux_loss ? options_.router_aux_loss_weight : 0.0;
  result.loss = result.lm_loss + aux_weight * result.router_aux * routed_count +
                result.predictor * routed_count + moe_weighted;
  if (moe_count > 0) {
    result.moe_aux_loss /= static_cast<double>(moe_count);
    result.moe_z_loss /= static_cast<double>(moe_count);
  }
  if (!with_backward) {
    release(head_unit_);
    if (tied) {
      release(embedding_unit);
    }
    return result;
  }

  // ---- backward ----
  acquire(head_unit_, true, true);
  if (tied) {
    acquire(embedding_unit, true, true);  // held to the embedding's backward
  }
  Buffer dlogits = ctx.zeros({rows, m.vocab_size});
  be.cross_entropy_backward(1.0, last_logits_, target_rows, lse, dlogits);
  Buffer du = ctx.make({rows, d});
  if (head_ != nullptr) {
    be.gemm(dlogits, false, head_->value, true, du);
    be.gemm(u_rows, true, dlogits, false, head_->grad, 1.0, 1.0);
  } else {
    be.gemm(dlogits, false, embedding_->value, false, du);
    be.gemm(dlogits, true, u_rows, false, embedding_->grad, 1.0, 1.0);
  }
  dlogits.reset();
  Buffer dx = ctx.zeros({batch, seq, d});
  be.rmsnorm_backward(reshape(du, {batch, seq, d}), final_view, final_norm_->value, final_rstd, dx,
                      final_norm_->grad);
  release(head_unit_);
  du.reset();
  final_u.reset();
  final_input.reset();
  if (!depth_) {
    for (int64_t l = static_cast<int64_t>(layers_.size()) - 1; l >= 0; --l) {
      LayerSlot& slot = *layers_[static_cast<size_t>(l)];
      acquire(layer_unit0_ + l, true, true);
      if (slot.dense) {
        slot.dense->backward_inplace(ctx, dx, slot.dense_saved);
      } else {
        slot.routed->backward_inplace(ctx, dx, slot.routed_saved);
      }
      release(layer_unit0_ + l);
    }
  } else {
    acquire(depth_unit_, true, true);
    depth_->begin_backward(ctx, dx);
    be.fill(dx, 0.0);  // reused below as d embedding
    for (int64_t l = static_cast<int64_t>(layers_.size()) - 1; l >= 0; --l) {
      LayerSlot& slot = *layers_[static_cast<size_t>(l)];
      acquire(layer_unit0_ + l, true, true);
      for (int branch = 1; branch >= 0; --branch) {
        const int64_t index = 2 * l + branch;
        const TensorView dy = reshape(depth_->write_backward(ctx, index), {batch, seq, d});
        Buffer dh = ctx.zeros({batch, seq, d});
        if (slot.routed) {
          slot.routed->branch_backward(ctx, branch, dy, slot.routed_saved, dh);
        } else if (branch == 0) {
          slot.dense->attention().backward(ctx, dy, slot.attn_saved, dh);
        } else {
          slot.dense->ffn_backward(ctx, dy, slot.dense_saved, dh);
        }
        depth_->read_backward(ctx, index, dh);
      }
      release(layer_unit0_ + l);
    }
    depth_->finish_backward(ctx, dx);
    release(depth_unit_);
  }
  if (!tied) {
    acquire(embedding_unit, false, true);
  }
  be.embedding_backward(dx, tokens, embedding_->grad);
  release(embedding_unit);
  return result;
}

StepResult measure_training_step(Backend& backend, const Config& config, int warmup,
                                 uint64_t seed) {
  ModelOptions options;
  options.dtype = scalar_type(config.train.dtype);
  options.seed = seed;
  const int64_t batch = config.train.micro_batch, seq = config.model.seq_len;
  if (batch < 1 || seq < 1) {
    throw ConfigError("train.micro_batch = " + std::to_string(batch) +
                      ", model.seq_len = " + std::to_string(seq) + ": both must be >= 1");
  }
  Model model(backend, config, options);
  const int64_t vocab = config.model.vocab_size;
  std::vector<int32_t> ids(static_cast<size_t>(batch * seq + 1));
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int32_t>((i * 7919 + 13) % static_cast<size_t>(vocab));
  }
  Buffer tokens = model.make_tokens(std::vector<int32_t>(ids.begin(), ids.end() - 1), batch, seq);
  Buffer targets = model.make_tokens(std::vector<int32_t>(ids.begin() + 1, ids.end()), batch, seq);
  for (int i = 0; i < warmup; ++i) {
    model.train_step(tokens, targets);
  }
  backend.synchronize();
  std::unique_ptr<Timer> timer = backend.make_timer();
  timer->start();
  StepResult result = model.train_step(tokens, targets);
  timer->stop();
  result.step_s = timer->elapsed_s();
  return result;
}

}  // namespace modar::runtime
