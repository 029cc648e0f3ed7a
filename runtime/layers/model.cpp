// A whole small model's training step (include/modar/runtime/model.hpp).
#include "modar/runtime/model.hpp"

#include <cmath>

#include "modar/base/errors.hpp"

namespace modar::runtime {

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
  for (int64_t l = 0; l < m.n_layers; ++l) {
    layers_.push_back(std::make_unique<ModelLayer>(params_, ctx, config, options, l, rng));
    stack_.push_back(layers_.back().get());
    saved_.push_back(layers_.back()->make_saved());
    close_unit("layer" + std::to_string(l));
  }
  if (config.dar.enabled()) {
    depth_ = std::make_unique<DepthResidual>(params_, ctx, DepthOptions::from(config), d, rng);
    depth_unit_ = static_cast<int64_t>(units_.size());
    close_unit("depth");
  }
  head_ = std::make_unique<LmHead>(params_, ctx, d, m.vocab_size, m.norm_eps,
                                   m.tie_embeddings ? embedding_ : nullptr, Init::normal_std(0.02),
                                   rng);
  head_unit_ = static_cast<int64_t>(units_.size());
  close_unit("head");
}

Model::~Model() = default;

int64_t Model::routed_layers() const {
  int64_t count = 0;
  for (const auto& layer : layers_) {
    count += layer->routed() != nullptr ? 1 : 0;
  }
  return count;
}

int64_t Model::moe_layers() const {
  int64_t count = 0;
  for (const auto& layer : layers_) {
    count += layer->moe() != nullptr ? 1 : 0;
  }
  return count;
}

std::vector<MoeFfn*> Model::moe_ffns() {
  std::vector<MoeFfn*> out;
  for (const auto& layer : layers_) {
    if (layer->moe() != nullptr) {
      out.push_back(const_cast<MoeFfn*>(layer->moe()));  // the model owns its layers
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
  for (const auto& layer : layers_) {
    state.caches.push_back(layer->dense() ? layer->dense()->attention().make_cache(ctx, max_tokens)
                                          : layer->routed()->make_cache(ctx, max_tokens));
  }
  return state;
}

std::vector<double> Model::decode_step(DecodeState& state, int32_t token) const {
  const Context ctx{backend_, nullptr, options_.dtype};
  const int64_t d = config_.model.d_model;
  const int32_t position = static_cast<int32_t>(state.position++);
  Buffer ids = ctx.indices({1, 1}, {token});
  Buffer x = ctx.make({1, 1, d});
  backend_.embedding_forward(embedding_->value, ids, x);
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (layers_[l]->dense() != nullptr) {
      layers_[l]->dense()->decode_inplace(ctx, x, position, state.caches[l]);
    } else {
      layers_[l]->routed()->decode_inplace(ctx, x, position, state.caches[l]);
    }
  }
  return download(backend_, head_->logits(ctx, x));
}

StepResult Model::forward_backward(const TensorView& tokens, const TensorView& targets,
                                   double lm_loss_weight) {
  tracker_.reset_peak();
  StepResult result = run(tokens, targets, true, lm_loss_weight);
  result.peak_bytes = tracker_.peak_bytes();
  return result;
}

StepResult Model::evaluate(const TensorView& tokens, const TensorView& targets) {
  tracker_.reset_peak();
  StepResult result = run(tokens, targets, false, 1.0);
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
  StepResult result = run(tokens, targets, true, 1.0);
  optimizer_step();
  result.peak_bytes = tracker_.peak_bytes();
  return result;
}

Buffer Model::layers_forward_pass(Buffer x, const LayerPass& pass, bool with_backward,
                                  LayerLosses& losses) {
  LayerStates* saved = with_backward ? &saved_ : nullptr;
  if (!depth_) {
    layers_forward(pass, stack_, 0, x, saved, losses);
    return x;
  }
  const Context& ctx = pass.ctx;
  depth_->set_saving(with_backward);
  acquire(depth_unit_, true, false);  // every branch reads it: held around all of them
  depth_->begin(ctx, x, x.numel() / config_.model.d_model);
  layers_forward(pass, stack_, 0, x, saved, losses);
  Buffer final_input = depth_->read_output(ctx);  // [T, d]
  release(depth_unit_);
  x.reset();
  if (!with_backward) {
    depth_->release();
  }
  return final_input;
}

void Model::layers_backward_pass(const TensorView& dx, const LayerPass& pass) {
  if (!depth_) {
    layers_backward(pass, stack_, 0, dx, saved_);
    return;
  }
  acquire(depth_unit_, true, true);  // and through its block-prefix recompute
  depth_->begin_backward(pass.ctx, dx);
  backend_.fill(dx, 0.0);  // reused below as d embedding
  layers_backward(pass, stack_, 0, dx, saved_);
  depth_->finish_backward(pass.ctx, dx);
  release(depth_unit_);
}

StepResult Model::run(const TensorView& tokens, const TensorView& targets, bool with_backward,
                      double lm_loss_weight) {
  const Context ctx = context();
  const ModelConfig& m = config_.model;
  if (tokens.rank != 2 || targets.rank != 2 || tokens.shape != targets.shape ||
      tokens.dtype != ScalarType::i32 || targets.dtype != ScalarType::i32) {
    throw ShapeError("model step: tokens " + tokens.describe() + " and targets " +
                     targets.describe() + " must both be i32 [b, s]");
  }
  const int64_t batch = tokens.dim(0), seq = tokens.dim(1), d = m.d_model;
  if (with_backward && hooks_ == nullptr) {
    params_.zero_grads(backend_);
  }
  const bool tied = head_->head() == nullptr;

  // ---- forward ----
  Buffer x = ctx.make({batch, seq, d});
  acquire(kEmbeddingUnit, true, false);
  backend_.embedding_forward(embedding_->value, tokens, x);
  release(kEmbeddingUnit);
  const Buffer positions = sequence_positions(ctx, batch, seq);
  const LayerPass pass{ctx, positions, {batch, seq, d}, depth_.get(), hooks_, layer_unit0_};
  LayerLosses losses;
  Buffer final_input = layers_forward_pass(std::move(x), pass, with_backward, losses);

  LmHead::Saved head;
  head.keep_logits = true;                // last_logits()
  head.logits = std::move(last_logits_);  // freed once the new logits exist
  acquire(head_unit_, true, false);
  if (tied) {
    acquire(kEmbeddingUnit, true, false);
  }
  const double lm_loss = head_->forward(ctx, reshape(final_input, {batch, seq, d}), targets, head);
  StepResult result = step_result(lm_loss, losses, routed_layers(), moe_layers(),
                                  router_aux_weight(config_, options_));
  if (!with_backward) {
    last_logits_ = std::move(head.logits);
    release(head_unit_);
    if (tied) {
      release(kEmbeddingUnit);
    }
    return result;
  }

  // ---- backward ----
  acquire(head_unit_, true, true);
  if (tied) {
    acquire(kEmbeddingUnit, true, true);  // held to the embedding's backward
  }
  Buffer dx = head_->backward(ctx, lm_loss_weight, head);
  last_logits_ = std::move(head.logits);
  release(head_unit_);
  final_input.reset();
  layers_backward_pass(dx, pass);
  if (!tied) {
    acquire(kEmbeddingUnit, false, true);
  }
  backend_.embedding_backward(dx, tokens, embedding_->grad);
  release(kEmbeddingUnit);
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
