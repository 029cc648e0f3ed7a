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

#include "modar/base/errors.hpp"
#include "modar/runtime/parallel_steps.hpp"

namespace modar::runtime {

struct TensorParallelTrainer::Layer {
  std::unique_ptr<AttentionBranch> attention;
  std::unique_ptr<MlpBranch> mlp;
  AttentionBranch::Saved attn_saved;
  MlpBranch::Saved mlp_saved;
  // MoD (router and predictor replicated on every tensor rank)
  bool routed = false;
  Parameter* router = nullptr;
  Parameter *pred_in = nullptr, *pred_out = nullptr;
  struct Routing {
    Buffer x;        // router input (this rank's tokens)
    Buffer logits;   // [b, s_local] this rank's router logits
    Buffer indices;  // [b, k] top-k positions in the whole sequence
    Buffer local;    // [b, k] the same positions in this rank's tokens, -1 elsewhere
    Buffer mask;     // [b, s_local] top-k mask (causal router)
    Buffer pred_hidden_pre, pred_hidden, pred_logits;
    Buffer delta;          // plain residual: [b, k, d]
    Buffer branch_out[2];  // depth residual: f(X~) of each branch
    Buffer dlogits;        // [b, s_local]
  } routing;
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
  routing_ = RoutingOptions::from(config.mod);
  routing_.aux_loss_weight = options.router_aux_loss_weight;
  routing_.unit_gate = options.unit_router_gate;
  if (config.mod.enabled() && routing_.unit_gate) {
    throw ConfigError(
        "mod: the unit router gate is an identity-check mode of the single-process "
        "model; the tensor-parallel trainer runs g(r) = mod.router_scale");
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
  if (tensor.sequence_parallel && config.mod.enabled() &&
      config.mod.routed_tokens_per_sequence(m.seq_len) > m.seq_len / t) {
    // Each rank gathers / scatters its routed rows with the backend's
    // [b, k] <-> [b, s / t] row ops, which need k <= s / t.
    throw ConfigError("mod.capacity = " + std::to_string(config.mod.capacity) + " routes " +
                      std::to_string(config.mod.routed_tokens_per_sequence(m.seq_len)) +
                      " tokens of model.seq_len = " + std::to_string(m.seq_len) +
                      ", more than a sequence-parallel shard holds (seq_len / parallel.tensor = " +
                      std::to_string(m.seq_len / t) + ")");
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
    if (config.mod.is_routed(l)) {
      layer->routed = true;
      layer->router =
          &params_.add(ctx, prefix + ".router", {d}, options.dtype, Init::constant_value(0), rng);
      if (routing_.causal == CausalRouter::predictor) {
        layer->pred_in = &params_.add(ctx, prefix + ".predictor_in", {d, routing_.predictor_hidden},
                                      options.dtype, Init::constant_value(0), rng);
        layer->pred_out = &params_.add(ctx, prefix + ".predictor_out", {routing_.predictor_hidden},
                                       options.dtype, Init::constant_value(0), rng);
      }
    }
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
  // the depth-residual, router and predictor parameters (each rank its own
  // tokens).
  for (size_t i = 0; i < params_.all().size(); ++i) {
    Parameter* p = params_.all()[i].get();
    const bool norm = ends_with(p->name, ".attn_norm") || ends_with(p->name, ".mlp_norm");
    const bool depth = i >= before_depth && i < after_depth;
    const bool router = ends_with(p->name, ".router") || ends_with(p->name, ".predictor_in") ||
                        ends_with(p->name, ".predictor_out");
    if (norm || ((depth || router) && tensor.sequence_parallel)) {
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

Buffer TensorParallelTrainer::branch_forward(Layer& layer, int branch, const TensorView& input,
                                             bool sharded, const TensorView& positions) {
  const Context ctx = context();
  Buffer gathered = sharded ? gather_sequence(input) : Buffer{};
  const TensorView whole = sharded ? gathered.view() : input;
  Buffer y = branch == 0
                 ? layer.attention->forward(ctx, whole, positions, TensorView{}, &layer.attn_saved)
                 : layer.mlp->forward(ctx, whole, &layer.mlp_saved);
  if (sharded) {
    return scatter_sequence_sum(y);
  }
  groups_.tensor->all_reduce(y, ReduceOp::sum);
  return y;
}

Buffer TensorParallelTrainer::branch_backward(Layer& layer, int branch, const TensorView& dy,
                                              bool sharded) {
  const Context ctx = context();
  Buffer gathered = sharded ? gather_sequence(dy) : Buffer{};
  const TensorView grad = sharded ? gathered.view() : dy;
  Buffer dh = ctx.zeros(grad.shape_vector());
  if (branch == 0) {
    layer.attention->backward(ctx, grad, layer.attn_saved, dh);
  } else {
    layer.mlp->backward(ctx, grad, layer.mlp_saved, dh);
  }
  gathered.reset();
  if (sharded) {
    return scatter_sequence_sum(dh);
  }
  groups_.tensor->all_reduce(dh, ReduceOp::sum);
  return dh;
}

Buffer TensorParallelTrainer::delta_forward(Layer& layer, const TensorView& x, bool sharded,
                                            const TensorView& positions) {
  // a = Attn(x), m = MLP(x + a), delta = a + m (TransformerLayer's order).
  Buffer a = branch_forward(layer, 0, x, sharded, positions);
  Buffer x_mid = context().make(x.shape_vector());
  backend_.add(x, a, x_mid);
  Buffer m = branch_forward(layer, 1, x_mid, sharded, positions);
  x_mid.reset();
  backend_.add(a, m, a);
  return a;
}

Buffer TensorParallelTrainer::delta_backward(Layer& layer, const TensorView& ddelta, bool sharded) {
  // J^T ddelta: the MLP path first; da = ddelta + d(x + a).
  Buffer dx_mid = branch_backward(layer, 1, ddelta, sharded);
  Buffer da = context().copy_of(ddelta);
  backend_.axpy(1.0, dx_mid, da);
  Buffer dx_attn = branch_backward(layer, 0, da, sharded);
  backend_.axpy(1.0, dx_attn, dx_mid);
  return dx_mid;
}

RoutedLayer::Losses TensorParallelTrainer::route(Layer& layer, const TensorView& x) {
  Backend& be = backend_;
  const Context ctx = context();
  const bool sp = tensor_.sequence_parallel;
  const int64_t t = sp ? groups_.tensor->size() : 1, r = sp ? groups_.tensor->rank() : 0;
  const int64_t batch = x.dim(0), local_seq = x.dim(1), seq = local_seq * t;
  Layer::Routing& st = layer.routing;
  st = Layer::Routing{};
  st.x = ctx.copy_of(x);
  st.logits = ctx.make({batch, local_seq}, ctx.stats());
  be.router_forward(x, layer.router->value, st.logits);
  // Top-k over the whole sequence: under SP the b s logits are all-gathered.
  Buffer gathered_logits;
  TensorView logits = st.logits;
  if (sp) {
    Buffer stacked = ctx.make({t, batch, local_seq}, ctx.stats());
    groups_.tensor->all_gather(st.logits, stacked);
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
    be.gemm(x, false, layer.pred_in->value, false, st.pred_hidden_pre);
    st.pred_hidden = ctx.make(hidden_shape);
    be.gelu_forward(st.pred_hidden_pre, st.pred_hidden);
    st.pred_logits = ctx.make({batch * local_seq}, ctx.stats());
    be.router_forward(st.pred_hidden, layer.pred_out->value, st.pred_logits);
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
    values = all_reduce_sum(be, *groups_.tensor, values);
    for (double& v : values) {
      v /= static_cast<double>(t);
    }
  }
  losses.router_aux = values[0];
  losses.predictor = values[1];
  losses.predictor_accuracy = values[2];
  return losses;
}

void TensorParallelTrainer::route_backward(Layer& layer, const TensorView& dx) {
  Backend& be = backend_;
  const Context ctx = context();
  Layer::Routing& st = layer.routing;
  // Each rank's BCE is a mean over its 1 / t of the tokens.
  const double share =
      tensor_.sequence_parallel ? 1.0 / static_cast<double>(groups_.tensor->size()) : 1.0;
  if (routing_.causal == CausalRouter::aux_loss) {
    be.bce_with_logits_backward(routing_.aux_loss_weight * share, st.logits, st.mask, st.dlogits);
  }
  be.router_backward(st.dlogits, st.x, layer.router->value, dx, layer.router->grad);
  if (routing_.causal == CausalRouter::predictor) {
    Buffer dpred = ctx.zeros(st.pred_logits.view().shape_vector(), ctx.stats());
    be.bce_with_logits_backward(share, st.pred_logits, reshape(st.mask, {st.mask.numel()}), dpred);
    Buffer dhidden = ctx.zeros(st.pred_hidden.view().shape_vector());
    be.router_backward(dpred, st.pred_hidden, layer.pred_out->value, dhidden, layer.pred_out->grad);
    Buffer dpre = ctx.zeros(st.pred_hidden_pre.view().shape_vector());
    be.gelu_backward(dhidden, st.pred_hidden_pre, dpre);
    be.gemm(st.x, true, dpre, false, layer.pred_in->grad, 1.0, 1.0);  // stop-gradient input
  }
  st = Layer::Routing{};
}

Buffer TensorParallelTrainer::gather_routed(Layer& layer, const TensorView& x) {
  Layer::Routing& st = layer.routing;
  const bool sp = tensor_.sequence_parallel;
  Buffer gathered = context().make({x.dim(0), st.indices.dim(1), x.dim(2)});
  backend_.gather_rows_forward(x, sp ? st.local.view() : st.indices.view(), gathered);
  if (sp) {
    groups_.tensor->all_reduce(gathered, ReduceOp::sum);  // one owner per row, zeros elsewhere
  }
  return gathered;
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
  Buffer final_input;
  StepResult local;
  int64_t routed_count = 0;
  auto add_losses = [&](const RoutedLayer::Losses& losses) {
    local.router_aux += losses.router_aux;
    local.predictor += losses.predictor;
    local.predictor_accuracy += losses.predictor_accuracy;
    ++routed_count;
  };
  if (!depth_) {
    for (auto& layer : layers_) {
      if (!layer->routed) {
        Buffer delta = delta_forward(*layer, x, sp, positions);
        be.add(x, delta, x);
        continue;
      }
      // MoD: x[idx] += g(r) delta(X~); the routed block's collectives carry b k rows.
      add_losses(route(*layer, x));
      Layer::Routing& st = layer->routing;
      Buffer gathered = gather_routed(*layer, x);
      st.delta = delta_forward(*layer, gathered, false, st.indices);
      gathered.reset();
      be.scatter_add_scaled_forward(x, sp ? st.local.view() : st.indices.view(), st.logits,
                                    st.delta, routing_.gate);
    }
    final_input = std::move(x);
  } else {
    const int64_t local_tokens = batch * local_seq;
    depth_->set_saving(true);
    depth_->begin(ctx, x, local_tokens);
    for (size_t l = 0; l < layers_.size(); ++l) {
      Layer& layer = *layers_[l];
      for (int branch = 0; branch < 2; ++branch) {
        const int64_t index = 2 * static_cast<int64_t>(l) + branch;
        const TensorView h = reshape(depth_->read(ctx, index), {batch, local_seq, d});
        Buffer y;
        if (!layer.routed) {
          y = branch_forward(layer, branch, h, sp, positions);
        } else {
          // Routed branch: the attention branch's input routes, both branches
          // run on the same tokens; y = g(r) f(h~) at the routed tokens.
          if (branch == 0) {
            add_losses(route(layer, h));
          }
          Layer::Routing& st = layer.routing;
          Buffer gathered = gather_routed(layer, h);
          st.branch_out[branch] = branch_forward(layer, branch, gathered, false, st.indices);
          y = ctx.zeros({batch, local_seq, d});
          be.scatter_add_scaled_forward(y, sp ? st.local.view() : st.indices.view(), st.logits,
                                        st.branch_out[branch], routing_.gate);
        }
        depth_->write(ctx, index, y);
      }
    }
    final_input = depth_->read_output(ctx);
    x.reset();
  }
  if (routed_count > 0) {
    local.router_aux /= static_cast<double>(routed_count);
    local.predictor /= static_cast<double>(routed_count);
    local.predictor_accuracy /= static_cast<double>(routed_count);
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
  local.lm_loss = download(be, loss)[0];
  const double aux_weight =
      config_.mod.causal_router == CausalRouter::aux_loss ? options_.router_aux_loss_weight : 0.0;
  local.loss =
      local.lm_loss + aux_weight * local.router_aux * routed_count + local.predictor * routed_count;

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
      Layer& layer = **it;
      if (!layer.routed) {
        Buffer dx_delta = delta_backward(layer, dx, sp);  // formed first and added once
        be.axpy(1.0, dx_delta, dx);
        continue;
      }
      Layer::Routing& st = layer.routing;
      const TensorView index = sp ? st.local.view() : st.indices.view();
      Buffer ddelta = ctx.zeros(st.delta.view().shape_vector());
      st.dlogits = ctx.zeros(st.logits.view().shape_vector(), ctx.stats());
      be.scatter_add_scaled_backward(dx, index, st.logits, st.delta, routing_.gate, ddelta,
                                     st.dlogits);
      if (sp) {
        groups_.tensor->all_reduce(ddelta, ReduceOp::sum);  // each row from its owner
      }
      Buffer dgathered = delta_backward(layer, ddelta, false);
      ddelta.reset();
      be.gather_rows_backward(dgathered, index, dx);
      dgathered.reset();
      route_backward(layer, dx);
    }
  } else {
    depth_->begin_backward(ctx, dx);
    be.fill(dx, 0.0);  // reused below as d embedding (this rank's tokens)
    for (int64_t l = static_cast<int64_t>(layers_.size()) - 1; l >= 0; --l) {
      Layer& layer = *layers_[static_cast<size_t>(l)];
      for (int branch = 1; branch >= 0; --branch) {
        const int64_t index = 2 * l + branch;
        const TensorView dy = reshape(depth_->write_backward(ctx, index), {batch, local_seq, d});
        if (!layer.routed) {
          Buffer dh = branch_backward(layer, branch, dy, sp);
          depth_->read_backward(ctx, index, dh);
          continue;
        }
        Layer::Routing& st = layer.routing;
        const TensorView rows_index = sp ? st.local.view() : st.indices.view();
        if (st.dlogits.empty()) {
          st.dlogits = ctx.zeros(st.logits.view().shape_vector(), ctx.stats());
        }
        Buffer& out = st.branch_out[branch];
        Buffer dout = ctx.zeros(out.view().shape_vector());
        be.scatter_add_scaled_backward(dy, rows_index, st.logits, out, routing_.gate, dout,
                                       st.dlogits);
        if (sp) {
          groups_.tensor->all_reduce(dout, ReduceOp::sum);
        }
        Buffer dgathered = branch_backward(layer, branch, dout, false);
        out.reset();
        Buffer dh = ctx.zeros({batch, local_seq, d});
        be.gather_rows_backward(dgathered, rows_index, dh);
        if (branch == 0) {
          route_backward(layer, dh);
        }
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
  const std::vector<double> sums = all_reduce_sum(
      be, *groups_.data,
      {local.loss, local.lm_loss, local.router_aux, local.predictor, local.predictor_accuracy});
  StepResult result;
  result.loss = sums[0] / ranks;
  result.lm_loss = sums[1] / ranks;
  result.router_aux = sums[2] / ranks;
  result.predictor = sums[3] / ranks;
  result.predictor_accuracy = sums[4] / ranks;
  result.peak_bytes = tracker_.peak_bytes();
  return result;
}

}  // namespace modar::runtime
