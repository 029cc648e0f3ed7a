// runtime/parallel/pipeline.cpp: the ParallelTrainer (include/modar/runtime/parallel_steps.hpp),
// tensor x pipeline x data parallelism composed around one model.
//
// A rank holds its stage's chunks of layers: the single-process model's own
// layers (ModelLayer) at tensor = 1, their Megatron shards
// (TensorParallelLayer, tensor_parallel.cpp) at tensor > 1; the embedding on
// the first stage, the LmHead on the last; every parameter takes the
// single-process model's initial value (a Model of the same seed is built
// once and read by name; a tensor rank takes its rows / columns).  The
// micro-batches run in Megatron's 1F1B or interleaved 1F1B order, with the
// sends and receives placed so that blocking calls cannot deadlock
// (pipeline_schedule.hpp).  The boundaries are pipeline_boundary.cpp's.
#include <algorithm>
#include <string>

#include "modar/base/errors.hpp"
#include "modar/runtime/parallel_steps.hpp"
#include "pipeline_internal.hpp"
#include "pipeline_schedule.hpp"
#include "tensor_parallel.hpp"

namespace modar::runtime {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Tensor rank `rank`'s block of a [rows, cols] matrix: the rows
// (row-parallel) or the columns (column-parallel) whose count differs from
// the full matrix; the whole tensor when the shapes agree.
std::vector<double> shard_of(const std::vector<double>& full,
                             const std::vector<int64_t>& full_shape,
                             const std::vector<int64_t>& shape, int64_t rank,
                             const std::string& name) {
  if (full_shape == shape) {
    return full;
  }
  if (full_shape.size() != 2 || shape.size() != 2) {
    throw ShapeError("tensor parallel: parameter " + name + " cannot be sharded");
  }
  std::vector<double> out;
  out.reserve(static_cast<size_t>(shape[0] * shape[1]));
  const int64_t row0 = shape[0] != full_shape[0] ? rank * shape[0] : 0;
  const int64_t col0 = shape[1] != full_shape[1] ? rank * shape[1] : 0;
  for (int64_t i = 0; i < shape[0]; ++i) {
    for (int64_t j = 0; j < shape[1]; ++j) {
      out.push_back(full[static_cast<size_t>((row0 + i) * full_shape[1] + col0 + j)]);
    }
  }
  return out;
}

int64_t count_layers(const Config& config, bool (*is)(const Config&, int64_t)) {
  int64_t count = 0;
  for (int64_t l = 0; l < config.model.n_layers; ++l) {
    count += is(config, l) ? 1 : 0;
  }
  return count;
}

}  // namespace

// ---- construction -----------------------------------------------------------------

ParallelTrainer::ParallelTrainer(Backend& backend, const Config& config,
                                 const ModelOptions& options, ProcessGroups& groups,
                                 const ParallelTrainerOptions& parallel)
    : backend_(backend), config_(config), options_(options), groups_(groups), parallel_(parallel) {
  stages_ = groups.pipeline->size();
  stage_ = groups.pipeline->rank();
  chunk_count_ = stages_ * parallel.virtual_stages;
  check_layout();
  const ModelConfig& m = config.model;
  const bool first = stage_ == 0, last = stage_ == (chunk_count_ - 1) % stages_;
  const Context ctx = context();
  Rng rng(options.seed);  // draws are replaced by the reference values below
  const int64_t t = groups.tensor->size();
  if (t > 1 && m.vocab_size % t == 0) {
    // Megatron's vocab-parallel embedding and output layer (t | V; otherwise
    // both stay whole: padding the vocabulary would change the model).
    vocab_group_ = std::make_unique<TensorShardGroup>(*groups.tensor);
  }
  if (first || (last && m.tie_embeddings)) {
    const int64_t rows = vocab_group_ ? m.vocab_size / t : m.vocab_size;
    embedding_ = &params_.add(ctx, "embedding", {rows, m.d_model}, options.dtype,
                              Init::constant_value(0), rng);
  }
  build_layers(ctx, rng);
  if (config.dar.enabled()) {
    // Every stage holds all the depth parameters (queries, key norms,
    // coefficient heads: O(L n d) + O(L n^2 d) elements) and uses its own
    // branches' rows; a stage's gradient is exactly zero elsewhere, so their
    // sum over the pipeline group is the model's gradient.
    const size_t before = params_.all().size();
    depth_ =
        std::make_unique<DepthResidual>(params_, ctx, DepthOptions::from(config), m.d_model, rng);
    for (size_t i = before; i < params_.all().size(); ++i) {
      depth_params_.push_back(params_.all()[i].get());
    }
  }
  if (last) {
    head_ = std::make_unique<LmHead>(params_, ctx, m.d_model, m.vocab_size, m.norm_eps,
                                     m.tie_embeddings ? embedding_ : nullptr,
                                     Init::constant_value(0), rng, vocab_group_.get());
  }
  copy_reference_values();
  // Partial sums over the tensor ranks: the branch norms (their input
  // gradient is summed after the norm's backward), and under SP the depth,
  // router and predictor parameters (each rank its own tokens).
  const bool sp = sequence_parallel();
  for (const auto& p : params_.all()) {
    const bool norm = ends_with(p->name, ".attn_norm") || ends_with(p->name, ".mlp_norm");
    const bool depth =
        std::find(depth_params_.begin(), depth_params_.end(), p.get()) != depth_params_.end();
    const bool router = ends_with(p->name, ".router") || ends_with(p->name, ".predictor_in") ||
                        ends_with(p->name, ".predictor_out");
    if (groups.tensor->size() > 1 && (norm || ((depth || router) && sp))) {
      tensor_reduced_.push_back(p.get());
    }
  }
  boundary_ = std::make_unique<Boundary>(*this);
  optimizer_ = std::make_unique<ShardedOptimizer>(backend, params_, &tracker_, *groups.data,
                                                  parallel.zero_stage, options.adamw);
}

ParallelTrainer::~ParallelTrainer() = default;

void ParallelTrainer::check_layout() const {
  const ModelConfig& m = config_.model;
  const int64_t t = groups_.tensor->size(), v = parallel_.virtual_stages;
  if (parallel_.microbatches < 1) {
    throw ConfigError("pipeline microbatches = " + std::to_string(parallel_.microbatches) +
                      ": must be >= 1");
  }
  if (v < 1 || (v > 1 && stages_ < 2)) {
    throw ConfigError("parallel.virtual_stages = " + std::to_string(v) +
                      ": must be >= 1, and 1 when parallel.pipeline = 1");
  }
  if (m.n_layers < chunk_count_) {
    throw ConfigError("model.n_layers = " + std::to_string(m.n_layers) + " is fewer than the " +
                      std::to_string(chunk_count_) +
                      " pipeline chunks (parallel.pipeline x parallel.virtual_stages)");
  }
  pipeline::compute_order(stages_, v, parallel_.microbatches, stage_);  // Megatron's limits
  if (t == 1) {
    return;
  }
  if (config_.mod.enabled() && options_.unit_router_gate) {
    throw ConfigError(
        "mod: the unit router gate is an identity-check mode of the single-process "
        "model; the tensor-parallel layer runs g(r) = mod.router_scale");
  }
  if (config_.moe.enabled()) {
    throw ConfigError("moe.experts = " + std::to_string(config_.moe.experts) +
                      ": the tensor-parallel layer shards dense MLPs only (parallel.tensor = " +
                      std::to_string(t) + "; expert tensor parallelism is not implemented)");
  }
  const BranchShape shape = BranchShape::from(m);
  if (shape.n_kv_heads % t != 0 || shape.d_ff % t != 0) {
    throw ConfigError("parallel.tensor = " + std::to_string(t) +
                      " must divide model.n_kv_heads = " + std::to_string(shape.n_kv_heads) +
                      " and model.d_ff = " + std::to_string(shape.d_ff));
  }
  if (!parallel_.sequence_parallel) {
    return;
  }
  if (m.seq_len % t != 0) {
    throw ConfigError("parallel.tensor = " + std::to_string(t) + " must divide model.seq_len = " +
                      std::to_string(m.seq_len) + " under parallel.sequence_parallel");
  }
  const int64_t k = config_.mod.routed_tokens_per_sequence(m.seq_len);
  if (config_.mod.enabled() && k > m.seq_len / t) {
    // Each rank gathers / scatters its routed rows with the backend's
    // [b, k] <-> [b, s / t] row ops, which need k <= s / t.
    throw ConfigError("mod.capacity = " + std::to_string(config_.mod.capacity) + " routes " +
                      std::to_string(k) +
                      " tokens of model.seq_len = " + std::to_string(m.seq_len) +
                      ", more than a sequence-parallel shard holds (seq_len / parallel.tensor = " +
                      std::to_string(m.seq_len / t) + ")");
  }
}

void ParallelTrainer::build_layers(const Context& ctx, Rng& rng) {
  const int64_t layers = config_.model.n_layers;
  const bool tensor_parallel = groups_.tensor->size() > 1;
  for (int64_t k = 0; k < parallel_.virtual_stages; ++k) {
    Chunk chunk;
    chunk.index = k * stages_ + stage_;
    chunk.first = chunk_first_layer(layers, chunk_count_, chunk.index);
    chunk.end = chunk_first_layer(layers, chunk_count_, chunk.index + 1);
    for (int64_t l = chunk.first; l < chunk.end; ++l) {
      if (tensor_parallel) {
        layers_.push_back(std::make_unique<TensorParallelLayer>(
            params_, ctx, config_, options_, l, *groups_.tensor, parallel_.sequence_parallel, rng));
      } else {
        layers_.push_back(std::make_unique<ModelLayer>(params_, ctx, config_, options_, l, rng));
      }
      chunk.layers.push_back(layers_.back().get());
    }
    chunks_.push_back(std::move(chunk));
  }
}

void ParallelTrainer::copy_reference_values() {
  // The single-process model's initial values, by parameter name (a tensor
  // rank's shard: its rows or columns).
  Model reference(backend_, config_, options_);
  const int64_t rank = groups_.tensor->rank();
  for (const auto& p : params_.all()) {
    const Parameter* source = reference.parameters().find(p->name);
    if (source == nullptr) {
      throw ShapeError("parallel trainer: parameter " + p->name + " has no match in the model");
    }
    const std::vector<int64_t> shape = p->value.view().shape_vector();
    const std::vector<int64_t> full = source->value.view().shape_vector();
    upload(backend_, shard_of(download(backend_, source->value), full, shape, rank, p->name),
           p->value);
    if (!p->master.empty()) {
      upload(backend_, shard_of(download(backend_, source->master), full, shape, rank, p->name),
             p->master);
    }
  }
}

int64_t ParallelTrainer::first_layer() const {
  return chunks_.front().first;
}

int64_t ParallelTrainer::end_layer() const {
  return chunks_.front().end;
}

bool ParallelTrainer::sequence_parallel() const {
  return parallel_.sequence_parallel && groups_.tensor->size() > 1;
}

// ---- one micro-batch through one chunk ------------------------------------------------

LayerPass ParallelTrainer::layer_pass(const Context& ctx, const Micro& mu) const {
  const int64_t seq = mu.tokens.dim(1);
  const int64_t local_seq = sequence_parallel() ? seq / groups_.tensor->size() : seq;
  return LayerPass{
      ctx, positions_, {mu.tokens.dim(0), local_seq, config_.model.d_model}, depth_.get()};
}

void ParallelTrainer::forward(Micro& mu, const Chunk& chunk) {
  const Context ctx = context();
  const LayerPass pass = layer_pass(ctx, mu);
  const bool first_chunk = chunk.index == 0, last_chunk = chunk.index == chunk_count_ - 1;
  if (first_chunk) {
    mu.x = embed(mu);
  }
  LayerStates& saved = mu.saved[static_cast<size_t>(chunk.index / stages_)];
  for (StackLayer* layer : chunk.layers) {
    saved.push_back(layer->make_saved());
  }
  if (!depth_) {
    layers_forward(pass, chunk.layers, chunk.first, mu.x, &saved, mu.losses);
  } else {
    // The bank arrived with the boundary (or starts from the embedding here).
    DepthScope scope(depth_.get(), mu.depth);
    depth_->set_segment(2 * chunk.first, 2 * chunk.end);
    depth_->set_saving(true);
    if (first_chunk) {
      depth_->begin(ctx, mu.x, mu.x.numel() / config_.model.d_model);
      mu.x.reset();
    }
    layers_forward(pass, chunk.layers, chunk.first, TensorView{}, &saved, mu.losses);
    if (last_chunk) {
      mu.x = depth_->read_output(ctx);  // [T, d]
    }
  }
  if (last_chunk) {
    head_forward(mu);
  }
  // Otherwise the schedule sends mu.x (or the bank) on.
}

void ParallelTrainer::head_forward(Micro& mu) {
  const Context ctx = context();
  const std::vector<int64_t>& shape = layer_pass(ctx, mu).shape;
  const TensorView final_input = reshape(mu.x, shape);
  if (sequence_parallel()) {
    mu.final_full = gather_sequence(ctx, *groups_.tensor, final_input);
  }
  mu.lm_loss = head_->forward(ctx, sequence_parallel() ? mu.final_full.view() : final_input,
                              mu.targets, mu.head);
}

Buffer ParallelTrainer::head_backward(Micro& mu) {
  const Context ctx = context();
  Buffer dfinal = head_->backward(ctx, mu.lm_weight, mu.head);
  mu.head = LmHead::Saved{};
  if (!sequence_parallel()) {
    return dfinal;
  }
  mu.final_full.reset();
  return take_sequence_shard(ctx, *groups_.tensor, dfinal);
}

void ParallelTrainer::backward(Micro& mu, const Chunk& chunk) {
  const Context ctx = context();
  const LayerPass pass = layer_pass(ctx, mu);
  const bool first_chunk = chunk.index == 0, last_chunk = chunk.index == chunk_count_ - 1;
  if (last_chunk) {
    mu.dx = head_backward(mu);
  }
  mu.x.reset();
  LayerStates& saved = mu.saved[static_cast<size_t>(chunk.index / stages_)];
  if (!depth_) {
    layers_backward(pass, chunk.layers, chunk.first, mu.dx, saved);
  } else {
    DepthScope scope(depth_.get(), mu.depth);
    depth_->set_segment(2 * chunk.first, 2 * chunk.end);
    if (last_chunk) {
      depth_->begin_backward(ctx, mu.dx);
      mu.dx.reset();
    }
    layers_backward(pass, chunk.layers, chunk.first, TensorView{}, saved);
    if (first_chunk) {
      mu.dx = ctx.zeros(pass.shape);
      depth_->finish_backward(ctx, mu.dx);
    }
  }
  saved.clear();
  if (first_chunk) {
    embed_backward(mu);
  }
}

Buffer ParallelTrainer::embed(Micro& mu) {
  const Context ctx = context();
  if (vocab_group_) {
    const int64_t begin = groups_.tensor->rank() * embedding_->value.dim(0);
    return vocab_parallel_embedding(ctx, *groups_.tensor, *embedding_, begin, mu.tokens,
                                    sequence_parallel(), mu.lookup);
  }
  Buffer embedded = ctx.make({mu.tokens.dim(0), mu.tokens.dim(1), config_.model.d_model});
  backend_.embedding_forward(embedding_->value, mu.tokens, embedded);
  return sequence_parallel() ? take_sequence_shard(ctx, *groups_.tensor, embedded)
                             : std::move(embedded);
}

void ParallelTrainer::embed_backward(Micro& mu) {
  const Context ctx = context();
  Buffer gathered = sequence_parallel() ? gather_sequence(ctx, *groups_.tensor, mu.dx) : Buffer{};
  const TensorView dx = sequence_parallel() ? gathered.view() : mu.dx.view();
  if (vocab_group_) {
    vocab_parallel_embedding_backward(ctx, *embedding_, dx, mu.lookup);
    mu.lookup = VocabLookup{};
  } else {
    backend_.embedding_backward(dx, mu.tokens, embedding_->grad);
  }
  mu.dx.reset();
}

// ---- the step -------------------------------------------------------------------------

std::vector<ParallelTrainer::Micro> ParallelTrainer::make_micros(const TensorView& tokens,
                                                                 const TensorView& targets) {
  const int64_t count = parallel_.microbatches, mb = tokens.dim(0) / count;
  std::vector<Micro> micros(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    Micro& mu = micros[static_cast<size_t>(i)];
    mu.index = i;
    mu.tokens = slice(tokens, i * mb, mb);
    mu.targets = slice(targets, i * mb, mb);
    mu.saved.resize(static_cast<size_t>(parallel_.virtual_stages));
  }
  if (head_) {
    // The weight of each micro-batch's mean cross-entropy: its share of the
    // batch's counted targets (parallel_steps.hpp, "the objective across parts").
    std::vector<int64_t> counted;
    int64_t here = 0;
    for (const Micro& mu : micros) {
      counted.push_back(counted_targets(backend_, mu.targets));
      here += counted.back();
    }
    const int64_t total = counted_targets_over(backend_, *groups_.data, here);
    const int64_t parts = count * groups_.data->size();
    for (size_t i = 0; i < micros.size(); ++i) {
      micros[i].lm_weight = lm_loss_weight(counted[i], total, parts);
    }
  }
  return micros;
}

void ParallelTrainer::run_schedule(std::vector<Micro>& micros) {
  using pipeline::Step;
  for (const Step& step :
       pipeline::stage_steps(stages_, parallel_.virtual_stages, parallel_.microbatches, stage_)) {
    Micro& mu = micros[static_cast<size_t>(step.microbatch)];
    const Chunk& chunk = chunks_[static_cast<size_t>(step.chunk / stages_)];
    switch (step.kind) {
      case Step::Kind::forward:
        forward(mu, chunk);
        schedule_.push_back({true, mu.index, chunk.index});
        break;
      case Step::Kind::backward:
        backward(mu, chunk);
        schedule_.push_back({false, mu.index, chunk.index});
        break;
      case Step::Kind::send_forward:
        boundary_->send_forward(mu, chunk);
        break;
      case Step::Kind::recv_forward:
        boundary_->recv_forward(mu, chunk);
        break;
      case Step::Kind::send_backward:
        boundary_->send_backward(mu, chunk);
        break;
      case Step::Kind::recv_backward:
        boundary_->recv_backward(mu, chunk);
        break;
    }
  }
}

void ParallelTrainer::finish_gradients() {
  for (Parameter* p : tensor_reduced_) {
    groups_.tensor->all_reduce(p->grad, ReduceOp::sum);
  }
  if (stages_ == 1) {
    return;
  }
  Communicator& pipe = *groups_.pipeline;
  // A tied embedding lives on the first and the last stage: both get the sum
  // of the two gradients (a + b = b + a exactly, so the copies stay equal).
  const bool first = stage_ == 0, last = head_ != nullptr;
  if (config_.model.tie_embeddings && (first || last)) {
    Buffer other = context().make(embedding_->grad.view().shape_vector(), embedding_->grad.dtype());
    const int peer = first ? static_cast<int>((chunk_count_ - 1) % stages_) : 0;
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
  for (Parameter* p : depth_params_) {
    pipe.all_reduce(p->grad);
  }
}

StepResult ParallelTrainer::train_step(const TensorView& tokens, const TensorView& targets) {
  if (tokens.rank != 2 || targets.rank != 2 || tokens.shape != targets.shape ||
      tokens.dtype != ScalarType::i32 || targets.dtype != ScalarType::i32) {
    throw ShapeError("parallel step: tokens " + tokens.describe() + " and targets " +
                     targets.describe() + " must both be i32 [b, s]");
  }
  const int64_t micro_count = parallel_.microbatches, seq = tokens.dim(1);
  if (tokens.dim(0) % micro_count != 0) {
    throw ConfigError("pipeline microbatches = " + std::to_string(micro_count) +
                      " must divide the rank's " + std::to_string(tokens.dim(0)) + " sequences");
  }
  if (sequence_parallel() && seq % groups_.tensor->size() != 0) {
    throw ShapeError(
        "parallel step: sequence length " + std::to_string(seq) +
        " is not a multiple of parallel.tensor = " + std::to_string(groups_.tensor->size()));
  }
  tracker_.reset_peak();
  params_.zero_grads(backend_);
  schedule_.clear();
  positions_ = sequence_positions(context(), tokens.dim(0) / micro_count, seq);
  std::vector<Micro> micros = make_micros(tokens, targets);
  run_schedule(micros);
  // This stage's loss terms: the cross-entropy (last stage) weighted by each
  // micro-batch's share, and its own layers' terms.
  double lm = 0.0;
  LayerLosses layers;
  for (const Micro& mu : micros) {
    lm += head_ ? mu.lm_loss * mu.lm_weight : 0.0;
    layers.add(mu.losses);
  }
  micros.clear();
  positions_.reset();

  finish_gradients();
  const double parts = static_cast<double>(groups_.data->size() * micro_count);
  optimizer_->step(1.0 / parts);

  // Sums over the stages (each its own layers) and the data ranks; means
  // over the parts (micro-batches x data ranks).
  std::vector<double> sums = layers.values();
  sums.push_back(lm);
  sums = all_reduce_sum(backend_, *groups_.pipeline, sums);
  sums = all_reduce_sum(backend_, *groups_.data, sums);
  const double lm_loss = sums.back() / parts;
  sums.pop_back();
  layers = LayerLosses::from_values(sums);
  layers.scale(1.0 / parts);
  StepResult result = step_result(
      lm_loss, layers,
      count_layers(config_, [](const Config& c, int64_t l) { return c.mod.is_routed(l); }),
      count_layers(config_, [](const Config& c, int64_t l) { return c.moe.is_moe_layer(l); }),
      router_aux_weight(config_, options_));
  result.peak_bytes = tracker_.peak_bytes();
  return result;
}

}  // namespace modar::runtime
