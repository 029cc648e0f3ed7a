// Tensor-parallel (Megatron) training step, with or without sequence
// parallelism (include/modar/runtime/parallel_steps.hpp).
//
// A rank's branch is the runtime's own AttentionBranch / MlpBranch built with
// the shard's shape (heads / t, kv_heads / t, d_ff / t): its first GEMMs are
// then exactly the column-parallel blocks and its last GEMM the row-parallel
// block, whose output is this rank's partial sum.  The parameters get the
// single-process model's initial values: a Model of the same seed is built
// once and each shard reads its rows / columns from it.
#include <algorithm>
#include <string>

#include "modar/errors.hpp"
#include "modar/runtime/parallel_steps.hpp"

namespace modar::runtime {

struct TensorParallelTrainer::Layer {
  std::unique_ptr<AttentionBranch> attention;
  std::unique_ptr<MlpBranch> mlp;
  AttentionBranch::Saved attn_saved;
  MlpBranch::Saved mlp_saved;
};

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Rank r's block of a [rows, cols] matrix: the rows (row-parallel) or the
// columns (column-parallel) whose count differs from the full matrix.
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

}  // namespace

TensorParallelTrainer::TensorParallelTrainer(Backend& backend, const Config& config,
                                             const ModelOptions& options, ProcessGroups& groups,
                                             const TensorOptions& tensor)
    : backend_(backend), config_(config), options_(options), groups_(groups), tensor_(tensor) {
  const ModelConfig& m = config.model;
  const int64_t t = groups.tensor->size();
  if (config.mod.enabled()) {
    throw ConfigError("mod.every = " + std::to_string(config.mod.every) +
                      ": the tensor-parallel trainer runs dense, AttnRes and DAR models only "
                      "(MoD routed layers under tensor parallelism are not implemented)");
  }
  if (groups.shape.pipeline != 1) {
    throw ConfigError("parallel.pipeline = " + std::to_string(groups.shape.pipeline) +
                      ": the tensor-parallel trainer runs pipeline = 1 only");
  }
  BranchShape shape = BranchShape::from(m);
  shape.rope_theta = options.rope_theta;
  if (shape.n_kv_heads % t != 0 || shape.d_ff % t != 0) {
    throw ConfigError("parallel.tensor = " + std::to_string(t) +
                      " must divide model.n_kv_heads = " + std::to_string(shape.n_kv_heads) +
                      " and model.d_ff = " + std::to_string(shape.d_ff));
  }
  if (tensor.sequence_parallel && m.seq_len % t != 0) {
    throw ConfigError("parallel.tensor = " + std::to_string(t) + " must divide model.seq_len = " +
                      std::to_string(m.seq_len) + " under parallel.sequence_parallel");
  }
  BranchShape local = shape;
  local.n_heads = shape.n_heads / t;
  local.n_kv_heads = shape.n_kv_heads / t;
  local.d_ff = shape.d_ff / t;

  const Context ctx = context();
  Rng rng(options.seed);  // draws are replaced by the reference values below
  const int64_t d = m.d_model;
  embedding_ = &params_.add(ctx, "embedding", {m.vocab_size, d}, options.dtype,
                            Init::constant_value(0), rng);
  for (int64_t l = 0; l < m.n_layers; ++l) {
    auto layer = std::make_unique<Layer>();
    const std::string prefix = "layer" + std::to_string(l);
    layer->attention = std::make_unique<AttentionBranch>(params_, ctx, prefix, local, rng, 0.02);
    layer->mlp = std::make_unique<MlpBranch>(params_, ctx, prefix, local, rng, 0.02);
    layers_.push_back(std::move(layer));
  }
  const size_t before_depth = params_.all().size();
  if (config.dar.enabled()) {
    depth_ = std::make_unique<DepthResidual>(params_, ctx, DepthOptions::from(config), d, rng);
  }
  const size_t after_depth = params_.all().size();
  final_norm_ = &params_.add(ctx, "final_norm", {d}, options.dtype, Init::constant_value(1.0), rng);
  if (!m.tie_embeddings) {
    head_ =
        &params_.add(ctx, "head", {d, m.vocab_size}, options.dtype, Init::constant_value(0), rng);
  }
  {
    Model reference(backend, config, options);
    for (const auto& p : params_.all()) {
      const Parameter* source = reference.parameters().find(p->name);
      if (source == nullptr) {
        throw ShapeError("tensor parallel: parameter " + p->name + " has no match in the model");
      }
      const std::vector<double> values =
          shard_of(download(backend, source->value), source->value.view().shape_vector(),
                   p->value.view().shape_vector(), groups.tensor->rank(), p->name);
      upload(backend, values, p->value);
      if (!p->master.empty()) {
        upload(backend, values, p->master);
      }
    }
  }
  // Gradients that are partial sums over the tensor ranks: the branch norms
  // (their input gradient is summed after the norm's backward), and under SP
  // the depth-residual parameters (each rank reads its own tokens).
  for (size_t i = 0; i < params_.all().size(); ++i) {
    Parameter* p = params_.all()[i].get();
    const bool norm = ends_with(p->name, ".attn_norm") || ends_with(p->name, ".mlp_norm");
    const bool depth = i >= before_depth && i < after_depth;
    if (norm || (depth && tensor.sequence_parallel)) {
      tensor_reduced_.push_back(p);
    }
  }
  optimizer_ = std::make_unique<ShardedOptimizer>(backend, params_, &tracker_, *groups.data,
                                                  tensor.zero_stage, options.adamw);
}

TensorParallelTrainer::~TensorParallelTrainer() = default;

Buffer TensorParallelTrainer::gather_sequence(const TensorView& shard) {
  const Context ctx = context();
  const int64_t t = groups_.tensor->size();
  const int64_t b = shard.dim(0), chunk = shard.dim(1), d = shard.dim(2);
  Buffer stacked = ctx.make({t, b, chunk, d});
  groups_.tensor->all_gather(shard, stacked);
  Buffer full = ctx.make({b, chunk * t, d});
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t i = 0; i < b; ++i) {
      backend_.copy(select(select(stacked, r), i), slice(select(full, i), r * chunk, chunk));
    }
  }
  return full;
}

Buffer TensorParallelTrainer::scatter_sequence_sum(const TensorView& partial) {
  const Context ctx = context();
  const int64_t t = groups_.tensor->size();
  const int64_t b = partial.dim(0), chunk = partial.dim(1) / t, d = partial.dim(2);
  Buffer stacked = ctx.make({t, b, chunk, d});
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t i = 0; i < b; ++i) {
      backend_.copy(slice(select(partial, i), r * chunk, chunk), select(select(stacked, r), i));
    }
  }
  Buffer shard = ctx.make({b, chunk, d});
  groups_.tensor->reduce_scatter(stacked, shard);
  return shard;
}

Buffer TensorParallelTrainer::take_sequence_shard(const TensorView& full) {
  const Context ctx = context();
  const int64_t t = groups_.tensor->size(), r = groups_.tensor->rank();
  const int64_t b = full.dim(0), chunk = full.dim(1) / t, d = full.dim(2);
  Buffer shard = ctx.make({b, chunk, d});
  for (int64_t i = 0; i < b; ++i) {
    backend_.copy(slice(select(full, i), r * chunk, chunk), select(shard, i));
  }
  return shard;
}

Buffer TensorParallelTrainer::reduce_branch(Buffer partial) {
  if (tensor_.sequence_parallel) {
    return scatter_sequence_sum(partial);
  }
  groups_.tensor->all_reduce(partial, ReduceOp::sum);
  return partial;
}

StepResult TensorParallelTrainer::train_step(const TensorView& tokens, const TensorView& targets) {
  if (tokens.rank != 2 || targets.rank != 2 || tokens.shape != targets.shape ||
      tokens.dtype != ScalarType::i32 || targets.dtype != ScalarType::i32) {
    throw ShapeError("tensor-parallel step: tokens " + tokens.describe() + " and targets " +
                     targets.describe() + " must both be i32 [b, s]");
  }
  Backend& be = backend_;
  const Context ctx = context();
  const ModelConfig& m = config_.model;
  const bool sp = tensor_.sequence_parallel;
  const int64_t t = groups_.tensor->size();
  const int64_t batch = tokens.dim(0), seq = tokens.dim(1), d = m.d_model, rows = batch * seq;
  if (sp && seq % t != 0) {
    throw ShapeError("tensor-parallel step: sequence length " + std::to_string(seq) +
                     " is not a multiple of parallel.tensor = " + std::to_string(t));
  }
  const int64_t local_seq = sp ? seq / t : seq;
  tracker_.reset_peak();
  params_.zero_grads(be);

  // ---- forward: the residual stream is [b, s, d] replicated, or its [b, s / t, d] shard ----
  Buffer embedded = ctx.make({batch, seq, d});
  be.embedding_forward(embedding_->value, tokens, embedded);
  Buffer x = sp ? take_sequence_shard(embedded) : std::move(embedded);
  embedded.reset();
  std::vector<int32_t> position_values(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) {
    position_values[static_cast<size_t>(i)] = static_cast<int32_t>(i % seq);
  }
  Buffer positions = ctx.indices({batch, seq}, position_values);
  // A branch on the whole sequence: input gathered under SP, output reduced.
  auto branch_forward = [&](Layer& layer, int branch, const TensorView& h) {
    Buffer gathered = sp ? gather_sequence(h) : Buffer{};
    const TensorView input = sp ? gathered.view() : h;
    Buffer y = branch == 0 ? layer.attention->forward(ctx, input, positions, TensorView{},
                                                      &layer.attn_saved)
                           : layer.mlp->forward(ctx, input, &layer.mlp_saved);
    return reduce_branch(std::move(y));
  };
  // dh of a branch from dy (both local): dy gathered under SP, dh reduced.
  auto branch_backward = [&](Layer& layer, int branch, const TensorView& dy) {
    Buffer gathered = sp ? gather_sequence(dy) : Buffer{};
    const TensorView grad = sp ? gathered.view() : dy;
    Buffer dh = ctx.zeros({batch, seq, d});
    if (branch == 0) {
      layer.attention->backward(ctx, grad, layer.attn_saved, dh);
    } else {
      layer.mlp->backward(ctx, grad, layer.mlp_saved, dh);
    }
    gathered.reset();
    return reduce_branch(std::move(dh));
  };

  Buffer final_input;
  if (!depth_) {
    for (auto& layer : layers_) {
      // a = Attn(x), m = MLP(x + a), x += a + m (TransformerLayer's order).
      Buffer a = branch_forward(*layer, 0, x);
      Buffer x_mid = ctx.make(x.view().shape_vector());
      be.add(x, a, x_mid);
      Buffer mlp_out = branch_forward(*layer, 1, x_mid);
      x_mid.reset();
      be.add(a, mlp_out, a);
      be.add(x, a, x);
    }
    final_input = std::move(x);
  } else {
    const int64_t local_tokens = batch * local_seq;
    depth_->set_saving(true);
    depth_->begin(ctx, x, local_tokens);
    for (size_t l = 0; l < layers_.size(); ++l) {
      for (int branch = 0; branch < 2; ++branch) {
        const int64_t index = 2 * static_cast<int64_t>(l) + branch;
        const TensorView h = reshape(depth_->read(ctx, index), {batch, local_seq, d});
        Buffer y = branch_forward(*layers_[l], branch, h);
        depth_->write(ctx, index, y);
      }
    }
    final_input = depth_->read_output(ctx);
    x.reset();
  }
  // Head and loss replicated on every tensor rank, on the whole sequence.
  Buffer final_full = sp ? gather_sequence(reshape(final_input, {batch, local_seq, d})) : Buffer{};
  const TensorView final_view = sp ? final_full.view() : reshape(final_input, {batch, seq, d});
  Buffer final_rstd = ctx.make({rows}, ctx.stats());
  Buffer final_u = ctx.make({batch, seq, d});
  be.rmsnorm_forward(final_view, final_norm_->value, final_u, final_rstd, m.norm_eps);
  Buffer logits = ctx.make({rows, m.vocab_size});
  const TensorView u_rows = reshape(final_u, {rows, d});
  if (head_ != nullptr) {
    be.gemm(u_rows, false, head_->value, false, logits);
  } else {
    be.gemm(u_rows, false, embedding_->value, true, logits);
  }
  Buffer loss = ctx.make({1}, ctx.stats());
  Buffer lse = ctx.make({rows}, ctx.stats());
  const TensorView target_rows = reshape(targets, {rows});
  be.cross_entropy_forward(logits, target_rows, loss, lse);
  StepResult local;
  local.lm_loss = download(be, loss)[0];
  local.loss = local.lm_loss;

  // ---- backward ----
  Buffer dlogits = ctx.zeros({rows, m.vocab_size});
  be.cross_entropy_backward(1.0, logits, target_rows, lse, dlogits);
  logits.reset();
  Buffer du = ctx.make({rows, d});
  if (head_ != nullptr) {
    be.gemm(dlogits, false, head_->value, true, du);
    be.gemm(u_rows, true, dlogits, false, head_->grad, 1.0, 1.0);
  } else {
    be.gemm(dlogits, false, embedding_->value, false, du);
    be.gemm(dlogits, true, u_rows, false, embedding_->grad, 1.0, 1.0);
  }
  dlogits.reset();
  Buffer dfinal = ctx.zeros({batch, seq, d});
  be.rmsnorm_backward(reshape(du, {batch, seq, d}), final_view, final_norm_->value, final_rstd,
                      dfinal, final_norm_->grad);
  du.reset();
  final_u.reset();
  final_full.reset();
  final_input.reset();
  Buffer dx = sp ? take_sequence_shard(dfinal) : std::move(dfinal);
  dfinal.reset();
  if (!depth_) {
    for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) {
      // TransformerLayer::backward_inplace: dx += J^T dx, the MLP path first.
      Layer& layer = **it;
      Buffer dx_mid = branch_backward(layer, 1, dx);
      Buffer da = ctx.copy_of(dx);
      be.axpy(1.0, dx_mid, da);
      Buffer dx_attn = branch_backward(layer, 0, da);
      be.axpy(1.0, dx_attn, dx_mid);  // J^T dx, formed first and added once
      be.axpy(1.0, dx_mid, dx);
    }
  } else {
    depth_->begin_backward(ctx, dx);
    be.fill(dx, 0.0);  // reused below as d embedding (this rank's tokens)
    for (int64_t l = static_cast<int64_t>(layers_.size()) - 1; l >= 0; --l) {
      for (int branch = 1; branch >= 0; --branch) {
        const int64_t index = 2 * l + branch;
        const TensorView dy = reshape(depth_->write_backward(ctx, index), {batch, local_seq, d});
        Buffer dh = branch_backward(*layers_[static_cast<size_t>(l)], branch, dy);
        depth_->read_backward(ctx, index, dh);
      }
    }
    depth_->finish_backward(ctx, dx);
  }
  Buffer dembedded = sp ? gather_sequence(dx) : std::move(dx);
  be.embedding_backward(dembedded, tokens, embedding_->grad);
  dembedded.reset();
  for (Parameter* p : tensor_reduced_) {
    groups_.tensor->all_reduce(p->grad, ReduceOp::sum);
  }
  const double ranks = static_cast<double>(groups_.data->size());
  optimizer_->step(1.0 / ranks);
  const std::vector<double> sums = all_reduce_sum(be, *groups_.data, {local.lm_loss});
  StepResult result;
  result.lm_loss = sums[0] / ranks;
  result.loss = result.lm_loss;
  result.peak_bytes = tracker_.peak_bytes();
  return result;
}

}  // namespace modar::runtime
