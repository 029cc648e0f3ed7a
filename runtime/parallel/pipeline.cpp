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
//
// AttnRes / DAR (docs/runtime_parallel.md): there is no residual stream to
// send; a boundary carries the history bank (entries with their key rstd,
// and a cut block's partial P as one more entry), and the backward returns
// the gradient of the same entries.  With parallel.dar_bank_cache a stage
// keeps the bank of a micro-batch across its chunks (virtual stages), the
// boundary sends only the entries it did not hold, and the gradient of a
// cached entry stays in the stage's bank gradient: it goes back with the
// boundary that first brought the entry (its chunks run backward in reverse,
// so every later use has added into it by then).  Each stage zeroes the
// gradient it sends back, so no entry's gradient is counted twice.
#include <algorithm>
#include <string>

#include "modar/base/errors.hpp"
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
  // per slot of this stage (plain residual: whole layers; depth residual:
  // the branches, as Model::run drives them)
  std::vector<TransformerLayer::Saved> dense_saved;
  std::vector<RoutedLayer::Saved> routed_saved;
  std::vector<AttentionBranch::Saved> attn_saved;
  std::shared_ptr<DepthResidual::State> depth;  // this micro-batch's bank and saved reads
  Buffer x;   // forward: the stage input, then (in place) its output; last chunk: the final input
  Buffer dx;  // backward: gradient w.r.t. the stage output, then its input
  // last stage: what the head's backward needs
  Buffer final_rstd, final_u, logits, lse;
  double lm_loss = 0.0, router_aux = 0.0, predictor = 0.0, predictor_accuracy = 0.0;
};

namespace {

int64_t chunk_begin(int64_t layers, int64_t chunks, int64_t chunk) {
  // Contiguous chunks, the first (layers mod chunks) one layer longer
  // (cost_models/parallel.cpp's equal_chunks).
  const int64_t base = layers / chunks, extra = layers % chunks;
  return chunk * base + std::min(chunk, extra);
}

// Swaps a micro-batch's depth state into the shared DepthResidual for the
// duration of a scope (1F1B holds several micro-batches in flight).
class DepthScope {
 public:
  DepthScope(DepthResidual* depth, std::shared_ptr<DepthResidual::State>& state)
      : depth_(depth), state_(state) {
    if (depth_ != nullptr) {
      depth_->put_state(std::move(state_));
    }
  }
  ~DepthScope() {
    if (depth_ != nullptr) {
      state_ = depth_->take_state();
    }
  }
  DepthScope(const DepthScope&) = delete;
  DepthScope& operator=(const DepthScope&) = delete;

 private:
  DepthResidual* depth_;
  std::shared_ptr<DepthResidual::State>& state_;
};

}  // namespace

PipelineTrainer::PipelineTrainer(Backend& backend, const Config& config,
                                 const ModelOptions& options, ProcessGroups& groups,
                                 const PipelineOptions& pipeline)
    : backend_(backend), config_(config), options_(options), groups_(groups), pipeline_(pipeline) {
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
  const int64_t v = pipeline.virtual_stages;
  if (v < 1 || (v > 1 && stages_ < 2)) {
    throw ConfigError("parallel.virtual_stages = " + std::to_string(v) +
                      ": must be >= 1, and 1 when parallel.pipeline = 1");
  }
  const int64_t chunk_count = stages_ * v;
  if (m.n_layers < chunk_count) {
    throw ConfigError("model.n_layers = " + std::to_string(m.n_layers) + " is fewer than the " +
                      std::to_string(chunk_count) +
                      " pipeline chunks (parallel.pipeline x parallel.virtual_stages)");
  }
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
  for (int64_t k = 0; k < v; ++k) {
    Chunk chunk;
    chunk.index = k * stages_ + stage_;
    chunk.first = chunk_begin(m.n_layers, chunk_count, chunk.index);
    chunk.end = chunk_begin(m.n_layers, chunk_count, chunk.index + 1);
    chunk.slot_begin = layers_.size();
    for (int64_t l = chunk.first; l < chunk.end; ++l) {
      auto slot = std::make_unique<Slot>();
      slot->layer = l;
      const std::string prefix = "layer" + std::to_string(l);
      if (config.mod.is_routed(l)) {
        slot->routed =
            std::make_unique<RoutedLayer>(params_, ctx, prefix, shape, routing, rng, 0.02);
      } else {
        slot->dense = std::make_unique<TransformerLayer>(params_, ctx, prefix, shape, rng, 0.02);
      }
      layers_.push_back(std::move(slot));
    }
    chunk.slot_end = layers_.size();
    chunks_.push_back(chunk);
  }
  first_layer_ = chunks_.front().first;
  end_layer_ = chunks_.front().end;
  if (config.dar.enabled()) {
    // Every stage holds all the depth parameters (queries, key norms,
    // coefficient heads: O(L n d) + O(L n^2 d) elements) and uses its own
    // branches' rows; a stage's gradient is exactly zero elsewhere, so their
    // sum over the pipeline group is the model's gradient.
    const size_t before = params_.all().size();
    depth_ = std::make_unique<DepthResidual>(params_, ctx, DepthOptions::from(config), d, rng);
    for (size_t i = before; i < params_.all().size(); ++i) {
      depth_params_.push_back(params_.all()[i].get());
    }
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

int64_t PipelineTrainer::chunk_end_layer(int64_t c) const {
  return chunk_begin(config_.model.n_layers, stages_ * pipeline_.virtual_stages, c + 1);
}

int64_t PipelineTrainer::bank_held_before(int64_t c) const {
  // The receiver of chunk c held its chunk c - p's bank: every complete entry
  // up to that chunk's end (its partial, if cut, has changed since).
  if (!pipeline_.dar_bank_cache || c - stages_ < 0) {
    return 0;
  }
  return depth_->complete_entries(2 * chunk_end_layer(c - stages_));
}

void PipelineTrainer::forward(Micro& mu, const Chunk& chunk) {
  Backend& be = backend_;
  const Context ctx = context();
  const ModelConfig& m = config_.model;
  const int64_t mb = mu.tokens.dim(0), seq = mu.tokens.dim(1), d = m.d_model, rows = mb * seq;
  const int64_t chunk_count = stages_ * pipeline_.virtual_stages;
  const bool first_chunk = chunk.index == 0, last_chunk = chunk.index == chunk_count - 1;
  if (first_chunk) {
    mu.x = ctx.make({mb, seq, d});
    be.embedding_forward(embedding_->value, mu.tokens, mu.x);
  }
  mu.dense_saved.resize(layers_.size());
  mu.routed_saved.resize(layers_.size());
  mu.attn_saved.resize(layers_.size());
  auto add_losses = [&](const RoutedLayer::Losses& losses) {
    mu.router_aux += losses.router_aux;
    mu.predictor += losses.predictor;
    mu.predictor_accuracy += losses.predictor_accuracy;
  };
  if (!depth_) {
    for (size_t i = chunk.slot_begin; i < chunk.slot_end; ++i) {
      Slot& slot = *layers_[i];
      if (slot.dense) {
        slot.dense->forward_inplace(ctx, mu.x, positions_, &mu.dense_saved[i]);
      } else {
        add_losses(slot.routed->forward_inplace(ctx, mu.x, &mu.routed_saved[i]));
      }
    }
  } else {
    // Model::run's depth-residual loop over this chunk's branches; the bank
    // arrived with the boundary (or starts from the embedding here).
    DepthScope scope(depth_.get(), mu.depth);
    depth_->set_segment(2 * chunk.first, 2 * chunk.end);
    depth_->set_saving(true);
    if (first_chunk) {
      depth_->begin(ctx, mu.x, rows);
      mu.x.reset();
    }
    for (size_t i = chunk.slot_begin; i < chunk.slot_end; ++i) {
      Slot& slot = *layers_[i];
      for (int branch = 0; branch < 2; ++branch) {
        const int64_t index = 2 * slot.layer + branch;
        const TensorView h = reshape(depth_->read(ctx, index), {mb, seq, d});
        Buffer y;
        if (slot.routed) {
          RoutedLayer::Losses losses;
          y = slot.routed->branch_forward(ctx, branch, h, mu.routed_saved[i], &losses);
          if (branch == 0) {
            add_losses(losses);
          }
        } else if (branch == 0) {
          y = slot.dense->attention().forward(ctx, h, positions_, TensorView{}, &mu.attn_saved[i]);
        } else {
          y = slot.dense->ffn_forward(ctx, h, &mu.dense_saved[i]);
        }
        depth_->write(ctx, index, y);
      }
    }
    if (last_chunk) {
      mu.x = depth_->read_output(ctx);  // [T, d]
    }
  }
  if (!last_chunk) {
    return;  // the schedule sends mu.x (or the bank) on
  }
  // The head and the loss (Model::run's, on this microbatch).
  const TensorView final_input = reshape(mu.x, {mb, seq, d});
  mu.final_rstd = ctx.make({rows}, ctx.stats());
  mu.final_u = ctx.make({mb, seq, d});
  be.rmsnorm_forward(final_input, final_norm_->value, mu.final_u, mu.final_rstd, m.norm_eps);
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

void PipelineTrainer::backward(Micro& mu, const Chunk& chunk) {
  Backend& be = backend_;
  const Context ctx = context();
  const ModelConfig& m = config_.model;
  const int64_t mb = mu.tokens.dim(0), seq = mu.tokens.dim(1), d = m.d_model, rows = mb * seq;
  const int64_t chunk_count = stages_ * pipeline_.virtual_stages;
  const bool first_chunk = chunk.index == 0, last_chunk = chunk.index == chunk_count - 1;
  if (last_chunk) {
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
    be.rmsnorm_backward(reshape(du, {mb, seq, d}), reshape(mu.x, {mb, seq, d}),
                        final_norm_->value, mu.final_rstd, mu.dx, final_norm_->grad);
    mu.final_u.reset();
    mu.final_rstd.reset();
    mu.lse.reset();
  }
  mu.x.reset();
  if (!depth_) {
    for (size_t i = chunk.slot_end; i-- > chunk.slot_begin;) {
      Slot& slot = *layers_[i];
      if (slot.dense) {
        slot.dense->backward_inplace(ctx, mu.dx, mu.dense_saved[i]);
      } else {
        slot.routed->backward_inplace(ctx, mu.dx, mu.routed_saved[i]);
      }
    }
  } else {
    DepthScope scope(depth_.get(), mu.depth);
    depth_->set_segment(2 * chunk.first, 2 * chunk.end);
    if (last_chunk) {
      depth_->begin_backward(ctx, mu.dx);
      mu.dx.reset();
    }
    for (size_t i = chunk.slot_end; i-- > chunk.slot_begin;) {
      Slot& slot = *layers_[i];
      for (int branch = 1; branch >= 0; --branch) {
        const int64_t index = 2 * slot.layer + branch;
        const TensorView dy = reshape(depth_->write_backward(ctx, index), {mb, seq, d});
        Buffer dh = ctx.zeros({mb, seq, d});
        if (slot.routed) {
          slot.routed->branch_backward(ctx, branch, dy, mu.routed_saved[i], dh);
        } else if (branch == 0) {
          slot.dense->attention().backward(ctx, dy, mu.attn_saved[i], dh);
        } else {
          slot.dense->ffn_backward(ctx, dy, mu.dense_saved[i], dh);
        }
        depth_->read_backward(ctx, index, dh);
      }
    }
    if (first_chunk) {
      mu.dx = ctx.zeros({mb, seq, d});
      depth_->finish_backward(ctx, mu.dx);
    }
  }
  if (first_chunk) {
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

  const int64_t chunk_count = stages_ * pipeline_.virtual_stages;
  const int64_t rows = mb * seq;
  auto owner = [&](int64_t c) { return static_cast<int>(c % stages_); };
  // AttnRes / DAR: what crosses the boundary after chunk c (the bank from
  // entry `from`, and a cut block's partial), on the state of `mu`.
  auto boundary = [&](int64_t c, int64_t& end_branch, int64_t& from, int64_t& k) {
    end_branch = 2 * chunk_end_layer(c);
    from = bank_held_before(c + 1);
    k = depth_->complete_entries(end_branch) - from + (depth_->cuts_block(end_branch) ? 1 : 0);
  };
  auto recv_forward = [&](Micro& mu, const Chunk& chunk) {
    if (chunk.index == 0) {
      return;
    }
    const int peer = owner(chunk.index - 1);
    if (!depth_) {
      mu.x = ctx.make({mb, seq, d});
      pipe.recv(mu.x, peer);
      return;
    }
    int64_t end_branch = 0, from = 0, k = 0;
    boundary(chunk.index - 1, end_branch, from, k);
    DepthScope scope(depth_.get(), mu.depth);
    depth_->begin_received(ctx, rows);
    if (k > 0) {
      const int64_t n = depth_->options().streams;
      DepthResidual::BoundaryBuffers in;
      in.values = ctx.make({n, k, rows, d});
      in.stats = ctx.make({n, k, rows}, ctx.stats());
      pipe.recv(in.values, peer);
      pipe.recv(in.stats, peer);
      depth_->unpack_boundary(ctx, end_branch, from, in);
    }
  };
  auto send_forward = [&](Micro& mu, const Chunk& chunk) {
    if (chunk.index == chunk_count - 1) {
      return;
    }
    const int peer = owner(chunk.index + 1);
    if (!depth_) {
      pipe.send(mu.x, peer);
      mu.x.reset();  // the stage output goes on and is no longer needed here
      return;
    }
    int64_t end_branch = 0, from = 0, k = 0;
    boundary(chunk.index, end_branch, from, k);
    if (k > 0) {
      DepthScope scope(depth_.get(), mu.depth);
      const DepthResidual::BoundaryBuffers out = depth_->pack_boundary(ctx, end_branch, from);
      pipe.send(out.values, peer);
      pipe.send(out.stats, peer);
    }
  };
  auto recv_backward = [&](Micro& mu, const Chunk& chunk) {
    if (chunk.index == chunk_count - 1) {
      return;
    }
    const int peer = owner(chunk.index + 1);
    if (!depth_) {
      mu.dx = ctx.make({mb, seq, d});
      pipe.recv(mu.dx, peer);
      return;
    }
    int64_t end_branch = 0, from = 0, k = 0;
    boundary(chunk.index, end_branch, from, k);
    DepthScope scope(depth_.get(), mu.depth);
    depth_->begin_backward_received(ctx);
    if (k > 0) {
      Buffer dvalues = ctx.make({depth_->options().streams, k, rows, d});
      pipe.recv(dvalues, peer);
      depth_->unpack_boundary_gradient(ctx, end_branch, from, dvalues);
    }
  };
  auto send_backward = [&](Micro& mu, const Chunk& chunk) {
    if (chunk.index == 0) {
      return;
    }
    const int peer = owner(chunk.index - 1);
    if (!depth_) {
      pipe.send(mu.dx, peer);
      mu.dx.reset();
      return;
    }
    int64_t end_branch = 0, from = 0, k = 0;
    boundary(chunk.index - 1, end_branch, from, k);
    DepthScope scope(depth_.get(), mu.depth);
    if (k > 0) {
      const Buffer dvalues = depth_->pack_boundary_gradient(ctx, end_branch, from);
      pipe.send(dvalues, peer);
    }
    if (&chunk == &chunks_.front()) {
      // This micro-batch is done here: the depth queries' gradients.
      depth_->finish_backward(ctx, TensorView{});
    }
  };
  auto run_forward = [&](Micro& mu, const Chunk& chunk) {
    forward(mu, chunk);
    schedule_.push_back(mu.index);
    if (chunk.index == chunk_count - 1) {
      lm_sum += mu.lm_loss;
    }
  };
  auto run_backward = [&](Micro& mu, const Chunk& chunk) {
    backward(mu, chunk);
    schedule_.push_back(-mu.index - 1);
  };

  if (pipeline_.virtual_stages == 1) {
    // 1F1B.  With stage s + 1 the lower stage sends first; with stage s - 1
    // the higher stage receives first.
    const Chunk& chunk = chunks_.front();
    const int64_t warmup = std::min(stages_ - stage_ - 1, micro_count);
    const int64_t steady = micro_count - warmup;
    int64_t next_forward = 0, next_backward = 0;
    for (int64_t i = 0; i < warmup; ++i) {
      Micro& mu = micros[next_forward++];
      recv_forward(mu, chunk);
      run_forward(mu, chunk);
      send_forward(mu, chunk);
    }
    if (steady > 0) {
      recv_forward(micros[next_forward], chunk);
    }
    for (int64_t i = 0; i < steady; ++i) {
      Micro& fwd = micros[next_forward++];
      run_forward(fwd, chunk);
      Micro& bwd = micros[next_backward++];
      send_forward(fwd, chunk);
      recv_backward(bwd, chunk);
      run_backward(bwd, chunk);
      if (i == steady - 1) {
        send_backward(bwd, chunk);
      } else {
        recv_forward(micros[next_forward], chunk);
        send_backward(bwd, chunk);
      }
    }
    for (int64_t i = 0; i < warmup; ++i) {
      Micro& mu = micros[next_backward++];
      recv_backward(mu, chunk);
      run_backward(mu, chunk);
      send_backward(mu, chunk);
    }
  } else {
    // Virtual stages: each micro-batch runs through all chunks in order and
    // back before the next one starts.  Every send is matched by the very
    // next operation of the receiving stage, so there is no deadlock (and no
    // overlap: this is for the equality and the bytes, not for speed).
    for (Micro& mu : micros) {
      for (int64_t c = 0; c < chunk_count; ++c) {
        if (owner(c) != stage_) {
          continue;
        }
        const Chunk& chunk = chunks_[static_cast<size_t>(c / stages_)];
        recv_forward(mu, chunk);
        run_forward(mu, chunk);
        send_forward(mu, chunk);
      }
      for (int64_t c = chunk_count; c-- > 0;) {
        if (owner(c) != stage_) {
          continue;
        }
        const Chunk& chunk = chunks_[static_cast<size_t>(c / stages_)];
        recv_backward(mu, chunk);
        run_backward(mu, chunk);
        send_backward(mu, chunk);
      }
    }
  }
  for (const Micro& mu : micros) {
    aux_sum += mu.router_aux;
    pred_sum += mu.predictor;
    acc_sum += mu.predictor_accuracy;
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
  // The depth parameters: each stage's gradient is exactly zero outside its
  // own branches, so the sum is the model's gradient on every stage.
  if (stages_ > 1) {
    for (Parameter* p : depth_params_) {
      pipe.all_reduce(p->grad);
    }
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
