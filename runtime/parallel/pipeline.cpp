// Pipeline-parallel training step, 1F1B schedule (include/modar/runtime/parallel_steps.hpp).
//
// The stage's layers are the runtime's own TransformerLayer / RoutedLayer,
// built under the same names as Model builds them and given Model's initial
// values (a Model of the same seed is built once and read by name), so the
// pipeline and the single-process model start from the same numbers.
//
// Schedule (Narayanan et al. 2021, PipeDream-Flush / Megatron 1F1B), stage s
// of p, m microbatches:  w = min(p - s - 1, m) warm-up forwards, then m - w
// pairs (forward, backward), then w backwards.  Communication between stages
// s and s + 1 is blocking send / recv; where both directions are exchanged at
// one point, the lower stage sends first and the higher receives first, so no
// two neighbours ever both send (no deadlock even with synchronous sends).
#include <algorithm>
#include <string>

#include "modar/errors.hpp"
#include "modar/runtime/parallel_steps.hpp"

namespace modar::runtime {

struct PipelineTrainer::Slot {
  int64_t layer = 0;
  std::unique_ptr<TransformerLayer> dense;
  std::unique_ptr<RoutedLayer> routed;
};

struct PipelineTrainer::Micro {
  int64_t index = 0;
  TensorView tokens, targets;  // [mb, s] rows of the step's batch
  std::vector<TransformerLayer::Saved> dense_saved;
  std::vector<RoutedLayer::Saved> routed_saved;
  Buffer x;   // forward: the stage input, then (in place) its output
  Buffer dx;  // backward: gradient w.r.t. the stage output, then its input
  // last stage: what the head's backward needs
  Buffer final_rstd, final_u, logits, lse;
  double lm_loss = 0.0, router_aux = 0.0, predictor = 0.0, predictor_accuracy = 0.0;
};

namespace {

int64_t stage_begin(int64_t layers, int64_t stages, int64_t stage) {
  // Contiguous stages, the first (layers mod stages) one layer longer.
  const int64_t base = layers / stages, extra = layers % stages;
  return stage * base + std::min(stage, extra);
}

}  // namespace

PipelineTrainer::PipelineTrainer(Backend& backend, const Config& config,
                                 const ModelOptions& options, ProcessGroups& groups,
                                 const PipelineOptions& pipeline)
    : backend_(backend), config_(config), options_(options), groups_(groups), pipeline_(pipeline) {
  if (config.dar.enabled()) {
    throw ConfigError(std::string("dar.variant = ") + to_string(config.dar.variant) +
                      ": the pipeline trainer runs plain-residual models only (AttnRes / DAR "
                      "history banks across stages are not implemented)");
  }
  if (groups.shape.tensor != 1) {
    throw ConfigError("parallel.tensor = " + std::to_string(groups.shape.tensor) +
                      ": the pipeline trainer runs tensor = 1 only");
  }
  if (pipeline.microbatches < 1) {
    throw ConfigError("pipeline microbatches = " + std::to_string(pipeline.microbatches) +
                      ": must be >= 1");
  }
  const ModelConfig& m = config.model;
  stages_ = groups.pipeline->size();
  stage_ = groups.pipeline->rank();
  if (m.n_layers < stages_) {
    throw ConfigError("model.n_layers = " + std::to_string(m.n_layers) + " is fewer than the " +
                      std::to_string(stages_) + " pipeline stages (parallel.pipeline)");
  }
  first_layer_ = stage_begin(m.n_layers, stages_, stage_);
  end_layer_ = stage_begin(m.n_layers, stages_, stage_ + 1);
  const bool first = stage_ == 0, last = stage_ == stages_ - 1;

  const Context ctx = context();
  Rng rng(options.seed);  // draws are replaced by the reference values below
  const int64_t d = m.d_model;
  if (first || (last && m.tie_embeddings)) {
    embedding_ = &params_.add(ctx, "embedding", {m.vocab_size, d}, options.dtype,
                              Init::constant_value(0), rng);
  }
  BranchShape shape = BranchShape::from(m);
  shape.rope_theta = options.rope_theta;
  RoutingOptions routing = RoutingOptions::from(config.mod);
  routing.aux_loss_weight = options.router_aux_loss_weight;
  routing.unit_gate = options.unit_router_gate;
  for (int64_t l = first_layer_; l < end_layer_; ++l) {
    auto slot = std::make_unique<Slot>();
    slot->layer = l;
    const std::string prefix = "layer" + std::to_string(l);
    if (config.mod.is_routed(l)) {
      slot->routed = std::make_unique<RoutedLayer>(params_, ctx, prefix, shape, routing, rng, 0.02);
    } else {
      slot->dense = std::make_unique<TransformerLayer>(params_, ctx, prefix, shape, rng, 0.02);
    }
    layers_.push_back(std::move(slot));
  }
  if (last) {
    final_norm_ =
        &params_.add(ctx, "final_norm", {d}, options.dtype, Init::constant_value(1.0), rng);
    if (!m.tie_embeddings) {
      head_ =
          &params_.add(ctx, "head", {d, m.vocab_size}, options.dtype, Init::constant_value(0), rng);
    }
  }
  {
    // The single-process model's initial values, by parameter name.
    Model reference(backend, config, options);
    for (const auto& p : params_.all()) {
      const Parameter* source = reference.parameters().find(p->name);
      if (source == nullptr || source->value.numel() != p->value.numel()) {
        throw ShapeError("pipeline stage: parameter " + p->name + " has no match in the model");
      }
      backend.copy(source->value, p->value);
      if (!p->master.empty()) {
        backend.copy(source->master, p->master);
      }
    }
  }
  optimizer_ = std::make_unique<ShardedOptimizer>(backend, params_, &tracker_, *groups.data,
                                                  pipeline.zero_stage, options.adamw);
}

PipelineTrainer::~PipelineTrainer() = default;

void PipelineTrainer::forward(Micro& mu) {
  Backend& be = backend_;
  const Context ctx = context();
  const ModelConfig& m = config_.model;
  const int64_t mb = mu.tokens.dim(0), seq = mu.tokens.dim(1), d = m.d_model, rows = mb * seq;
  if (stage_ == 0) {
    mu.x = ctx.make({mb, seq, d});
    be.embedding_forward(embedding_->value, mu.tokens, mu.x);
  }
  mu.dense_saved.resize(layers_.size());
  mu.routed_saved.resize(layers_.size());
  for (size_t i = 0; i < layers_.size(); ++i) {
    Slot& slot = *layers_[i];
    if (slot.dense) {
      slot.dense->forward_inplace(ctx, mu.x, positions_, &mu.dense_saved[i]);
    } else {
      const RoutedLayer::Losses losses =
          slot.routed->forward_inplace(ctx, mu.x, &mu.routed_saved[i]);
      mu.router_aux += losses.router_aux;
      mu.predictor += losses.predictor;
      mu.predictor_accuracy += losses.predictor_accuracy;
    }
  }
  if (stage_ != stages_ - 1) {
    return;  // the schedule sends mu.x on
  }
  // The head and the loss (Model::run's, on this microbatch).
  mu.final_rstd = ctx.make({rows}, ctx.stats());
  mu.final_u = ctx.make({mb, seq, d});
  be.rmsnorm_forward(mu.x, final_norm_->value, mu.final_u, mu.final_rstd, m.norm_eps);
  mu.logits = ctx.make({rows, m.vocab_size});
  const TensorView u_rows = reshape(mu.final_u, {rows, d});
  if (head_ != nullptr) {
    be.gemm(u_rows, false, head_->value, false, mu.logits);
  } else {
    be.gemm(u_rows, false, embedding_->value, true, mu.logits);
  }
  Buffer loss = ctx.make({1}, ctx.stats());
  mu.lse = ctx.make({rows}, ctx.stats());
  be.cross_entropy_forward(mu.logits, reshape(mu.targets, {rows}), loss, mu.lse);
  mu.lm_loss = download(be, loss)[0];
}

void PipelineTrainer::backward(Micro& mu) {
  Backend& be = backend_;
  const Context ctx = context();
  const ModelConfig& m = config_.model;
  const int64_t mb = mu.tokens.dim(0), seq = mu.tokens.dim(1), d = m.d_model, rows = mb * seq;
  if (stage_ == stages_ - 1) {
    // Each microbatch's mean loss with weight 1; the optimizer's grad_scale
    // 1 / (m dp) makes the mean over the global batch.
    Buffer dlogits = ctx.zeros({rows, m.vocab_size});
    be.cross_entropy_backward(1.0, mu.logits, reshape(mu.targets, {rows}), mu.lse, dlogits);
    mu.logits.reset();
    const TensorView u_rows = reshape(mu.final_u, {rows, d});
    Buffer du = ctx.make({rows, d});
    if (head_ != nullptr) {
      be.gemm(dlogits, false, head_->value, true, du);
      be.gemm(u_rows, true, dlogits, false, head_->grad, 1.0, 1.0);
    } else {
      be.gemm(dlogits, false, embedding_->value, false, du);
      be.gemm(dlogits, true, u_rows, false, embedding_->grad, 1.0, 1.0);
    }
    dlogits.reset();
    mu.dx = ctx.zeros({mb, seq, d});
    be.rmsnorm_backward(reshape(du, {mb, seq, d}), mu.x, final_norm_->value, mu.final_rstd, mu.dx,
                        final_norm_->grad);
    mu.final_u.reset();
    mu.final_rstd.reset();
    mu.lse.reset();
  }
  mu.x.reset();
  for (size_t i = layers_.size(); i-- > 0;) {
    Slot& slot = *layers_[i];
    if (slot.dense) {
      slot.dense->backward_inplace(ctx, mu.dx, mu.dense_saved[i]);
    } else {
      slot.routed->backward_inplace(ctx, mu.dx, mu.routed_saved[i]);
    }
  }
  mu.dense_saved.clear();
  mu.routed_saved.clear();
  if (stage_ == 0) {
    be.embedding_backward(mu.dx, mu.tokens, embedding_->grad);
    mu.dx.reset();
  }
}

StepResult PipelineTrainer::train_step(const TensorView& tokens, const TensorView& targets) {
  if (tokens.rank != 2 || targets.rank != 2 || tokens.shape != targets.shape ||
      tokens.dtype != ScalarType::i32 || targets.dtype != ScalarType::i32) {
    throw ShapeError("pipeline step: tokens " + tokens.describe() + " and targets " +
                     targets.describe() + " must both be i32 [b, s]");
  }
  const int64_t micro_count = pipeline_.microbatches;
  const int64_t batch = tokens.dim(0), seq = tokens.dim(1), d = config_.model.d_model;
  if (batch % micro_count != 0) {
    throw ConfigError("pipeline microbatches = " + std::to_string(micro_count) +
                      " must divide the rank's " + std::to_string(batch) + " sequences");
  }
  const int64_t mb = batch / micro_count;
  Communicator& pipe = *groups_.pipeline;
  const bool first = stage_ == 0, last = stage_ == stages_ - 1;
  const int prev = static_cast<int>(stage_ - 1), next = static_cast<int>(stage_ + 1);
  const Context ctx = context();

  tracker_.reset_peak();
  params_.zero_grads(backend_);
  schedule_.clear();
  {
    std::vector<int32_t> values(static_cast<size_t>(mb * seq));
    for (size_t i = 0; i < values.size(); ++i) {
      values[i] = static_cast<int32_t>(static_cast<int64_t>(i) % seq);
    }
    positions_ = ctx.indices({mb, seq}, values);
  }
  std::vector<Micro> micros(static_cast<size_t>(micro_count));
  for (int64_t i = 0; i < micro_count; ++i) {
    micros[i].index = i;
    micros[i].tokens = slice(tokens, i * mb, mb);
    micros[i].targets = slice(targets, i * mb, mb);
  }
  double lm_sum = 0.0, aux_sum = 0.0, pred_sum = 0.0, acc_sum = 0.0;

  auto recv_forward = [&](Micro& mu) {
    if (!first) {
      mu.x = ctx.make({mb, seq, d});
      pipe.recv(mu.x, prev);
    }
  };
  auto run_forward = [&](Micro& mu) {
    forward(mu);
    schedule_.push_back(mu.index);
    lm_sum += mu.lm_loss;
    aux_sum += mu.router_aux;
    pred_sum += mu.predictor;
    acc_sum += mu.predictor_accuracy;
  };
  auto run_backward = [&](Micro& mu) {
    backward(mu);
    schedule_.push_back(-mu.index - 1);
  };
  // The stage output goes on and is no longer needed here.
  auto send_forward = [&](Micro& mu) {
    if (!last) {
      pipe.send(mu.x, next);
      mu.x.reset();
    }
  };
  auto recv_backward = [&](Micro& mu) {
    if (!last) {
      mu.dx = ctx.make({mb, seq, d});
      pipe.recv(mu.dx, next);
    }
  };
  auto send_backward = [&](Micro& mu) {
    if (!first) {
      pipe.send(mu.dx, prev);
      mu.dx.reset();
    }
  };
  // With stage s + 1: the lower stage sends first.
  auto send_forward_recv_backward = [&](Micro& out, Micro& in) {
    send_forward(out);
    recv_backward(in);
  };
  // With stage s - 1: the higher stage receives first.
  auto send_backward_recv_forward = [&](Micro& out, Micro& in) {
    recv_forward(in);
    send_backward(out);
  };

  const int64_t warmup = std::min(stages_ - stage_ - 1, micro_count);
  const int64_t steady = micro_count - warmup;
  int64_t next_forward = 0, next_backward = 0;
  for (int64_t i = 0; i < warmup; ++i) {
    Micro& mu = micros[next_forward++];
    recv_forward(mu);
    run_forward(mu);
    send_forward(mu);
  }
  if (steady > 0) {
    recv_forward(micros[next_forward]);
  }
  for (int64_t i = 0; i < steady; ++i) {
    Micro& fwd = micros[next_forward++];
    run_forward(fwd);
    Micro& bwd = micros[next_backward++];
    send_forward_recv_backward(fwd, bwd);
    run_backward(bwd);
    if (i == steady - 1) {
      send_backward(bwd);
    } else {
      send_backward_recv_forward(bwd, micros[next_forward]);
    }
  }
  for (int64_t i = 0; i < warmup; ++i) {
    Micro& mu = micros[next_backward++];
    recv_backward(mu);
    run_backward(mu);
    send_backward(mu);
  }
  micros.clear();
  positions_.reset();

  // A tied embedding lives on the first and the last stage: both get the sum
  // of the two gradients (a + b = b + a exactly, so the copies stay equal).
  if (config_.model.tie_embeddings && stages_ > 1 && (first || last)) {
    Buffer other = ctx.make(embedding_->grad.view().shape_vector(), embedding_->grad.dtype());
    const int peer = first ? static_cast<int>(stages_ - 1) : 0;
    if (first) {
      pipe.send(embedding_->grad, peer);
      pipe.recv(other, peer);
    } else {
      pipe.recv(other, peer);
      pipe.send(embedding_->grad, peer);
    }
    backend_.axpy(1.0, other, embedding_->grad);
  }
  const double ranks = static_cast<double>(groups_.data->size());
  optimizer_->step(1.0 / (ranks * static_cast<double>(micro_count)));

  // Losses: sums over the stages (each its own routed layers), means over the
  // microbatches and the data-parallel ranks; Model::run's formula.
  int64_t routed = 0;
  for (const auto& slot : layers_) {
    routed += slot->routed ? 1 : 0;
  }
  std::vector<double> sums = all_reduce_sum(
      backend_, pipe, {lm_sum, aux_sum, pred_sum, acc_sum, static_cast<double>(routed)});
  const double total_routed = sums[4];
  sums.pop_back();
  sums = all_reduce_sum(backend_, *groups_.data, sums);
  const double scale = 1.0 / (ranks * static_cast<double>(micro_count));
  StepResult result;
  result.lm_loss = sums[0] * scale;
  const double aux_total = sums[1] * scale, pred_total = sums[2] * scale;
  if (total_routed > 0) {
    result.router_aux = aux_total / total_routed;
    result.predictor = pred_total / total_routed;
    result.predictor_accuracy = sums[3] * scale / total_routed;
  }
  const double aux_weight =
      config_.mod.causal_router == CausalRouter::aux_loss ? options_.router_aux_loss_weight : 0.0;
  result.loss = result.lm_loss + aux_weight * aux_total + pred_total;
  result.peak_bytes = tracker_.peak_bytes();
  return result;
}

}  // namespace modar::runtime
