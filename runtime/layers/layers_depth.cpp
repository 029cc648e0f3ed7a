// AttnRes (n = 1) and DAR (n >= 2) depth residuals, two-phase (docs/model.md AttnRes/DAR,
// docs/dar_math.md sections 1.4, 3.2, 4.2, 5).
//
// History bank, stream-major: bank[j][r] = H_r[j]  ([n][N+1][T][d]), with the
// key statistic rstd(H_r[j]) cached when the entry is written.  H_0[j] = the
// embedding for every stream; H_b = P^S of block b (block-local state, not a
// cumulative hidden state).
//
// Branch l = position i (0-based here) of block b:
//   phase 1 (once per block, per stream j, all S queries at once):
//       o[i][j], lse[i][j] = softmax_r(q'_{l,j} . k^(H_r[kappa j])) over H_r[nu j], r < b+1
//   phase 2 (i >= 1):  R_j = o + sigmoid(q' . k^(P[kappa j]) - lse) (P[nu j] - o)
//   n = 1:   h = R_0;                         P^i = P^{i-1} + y      (AttnRes)
//   n >= 2:  alpha, beta, M = heads(RMSNorm([R_0..R_{n-1}]));  h = sum_j alpha_j R_j
//            P^i = M P^{i-1} + beta (x) y  (i >= 1),  P^0 = beta (x) y
// Output: per stream a read over all N+1 entries with its own query, mixed by
// alpha_out (a coefficient head without transport; its beta is unused).
//
// modar's DAR coefficient parameterisation is its own reconstruction (the DAR
// paper's equations are not public; docs/model.md AttnRes/DAR follows mHC).  Initialisation:
// queries w = 0 (uniform depth weights), key norms gamma = 1, W ~ N(0, 0.02^2),
// scale = 1, alpha bias 0 (alpha = 1/2), transport bias rho_bias (rho = 0.98:
// near identity; n > 2: diagonal Sinkhorn logits = rho_bias, others 0) and
// SYMMETRY BREAKING in the write gates: stream j's beta bias is
// spread * (2 j / (n - 1) - 1), so for n = 2, beta = 2 sigmoid(-0.2) = 0.90 and
// 2 sigmoid(0.2) = 1.10.  Identical streams (H_0 is the same embedding in every
// stream) with zero queries and symmetric gates would stay identical forever
// (every M is doubly stochastic, so M maps equal streams to equal streams); the
// unequal gates plus the independent random W columns make the streams differ
// from the first write on.
//
// Backward stores, per branch: R, alpha, beta, M, the merge weights p, z_rstd,
// y (for d beta = <dP, y>) and P^{i-1} with its rstd (never recovered by
// inverting M, which is singular at rho = 1/2).
#include <cmath>

#include "modar/base/errors.hpp"
#include "modar/runtime/layers.hpp"

namespace modar::runtime {

struct DepthResidual::BlockState {
  std::vector<Buffer> out, lse;    // per stream: [S_b, T, d], [S_b, T]
  std::vector<Buffer> dout, dlse;  // backward accumulators
};

struct DepthResidual::BranchState {
  Buffer retrieved;     // R [n, T, d]
  Buffer merge_weight;  // p [n, T] (i >= 1)
  Buffer alpha, beta, transport, z_rstd;
  Buffer h;  // mixed branch input [T, d] (n >= 2); freed at the write (f_l saves its own copy)
  Buffer y;  // branch output copy (n >= 2)
  Buffer partial_prev, partial_prev_rstd;  // P^{i-1} (i >= 1)
  Buffer out_lse;                          // output read: lse [n, T]
  Buffer dy, dbeta, dtransport;
};

namespace {

TensorView row(const TensorView& matrix, int64_t index) {
  // [rows, d] -> [d]
  return reshape(slice(matrix, index, 1), {matrix.dim(-1)});
}

}  // namespace

DepthResidual::DepthResidual(ParameterSet& params, const Context& ctx, const DepthOptions& options,
                             int64_t d, Rng& rng)
    : options_(options), roles_(StreamRoles::of(options.variant, options.streams)), d_(d) {
  const int64_t n = options.streams;
  if (n < 1 || (options.variant == DarVariant::attnres && n != 1) ||
      (options.variant != DarVariant::attnres && n < 2)) {
    throw ConfigError("dar.streams = " + std::to_string(n) +
                      ": attnres uses 1 stream, the DAR variants need >= 2");
  }
  if (options.branches_per_block < 1 || options.total_branches < 1) {
    throw ConfigError("dar.block_layers: branches per block and total branches must be >= 1, got " +
                      std::to_string(options.branches_per_block) + " and " +
                      std::to_string(options.total_branches));
  }
  const int64_t queries = options.total_branches + 1;
  const ScalarType stats = ctx.stats();
  query_ = &params.add(ctx, "depth.query", {n, queries, d}, stats, Init::constant_value(0.0), rng);
  key_norm_ =
      &params.add(ctx, "depth.key_norm", {n, queries, d}, stats, Init::constant_value(1.0), rng);
  if (n >= 2) {
    const int64_t transport = DarConfig::transport_params(n);
    for (int64_t l = 0; l <= options.total_branches; ++l) {
      const bool is_output = l == options.total_branches;
      const bool has_transport = !is_output && position_in_block(l) > 0;
      const int64_t outputs = 2 * n + (has_transport ? transport : 0);
      const std::string prefix = is_output ? "depth.out" : "depth.branch" + std::to_string(l);
      std::vector<double> bias(static_cast<size_t>(outputs), 0.0);
      for (int64_t j = 0; j < n; ++j) {
        bias[static_cast<size_t>(n + j)] =
            options.beta_bias_spread * (2.0 * static_cast<double>(j) / double(n - 1) - 1.0);
      }
      if (has_transport) {
        if (n == 2) {
          bias[static_cast<size_t>(2 * n)] = options.rho_bias;
        } else {
          for (int64_t j = 0; j < n; ++j) {
            bias[static_cast<size_t>(2 * n + j * n + j)] = options.rho_bias;
          }
        }
      }
      coef_weight_.push_back(&params.add(ctx, prefix + ".coef_weight", {n * d, outputs}, stats,
                                         Init::normal_std(options.coefficient_std), rng));
      coef_bias_.push_back(
          &params.add(ctx, prefix + ".coef_bias", {outputs}, stats, Init::from_values(bias), rng));
      coef_scale_.push_back(
          &params.add(ctx, prefix + ".coef_scale", {3}, stats, Init::constant_value(1.0), rng));
    }
  }
}

DepthResidual::~DepthResidual() = default;

int64_t DepthResidual::blocks() const {
  return (options_.total_branches + options_.branches_per_block - 1) / options_.branches_per_block;
}

int64_t DepthResidual::block_size(int64_t block) const {
  return std::min(options_.branches_per_block, options_.total_branches - first_branch(block));
}

TensorView DepthResidual::bank_stream(int j) const {
  return select(bank_, j);
}
TensorView DepthResidual::bank_rstd_stream(int j) const {
  return select(bank_rstd_, j);
}
TensorView DepthResidual::dbank_stream(int j) const {
  return select(dbank_, j);
}

void DepthResidual::begin(const Context& ctx, const TensorView& embedding, int64_t tokens) {
  Backend& be = ctx.backend;
  const int64_t n = options_.streams;
  tokens_ = tokens;
  const TensorView emb = reshape(embedding, {tokens, d_});
  bank_ = ctx.make({n, entries(), tokens, d_});
  bank_rstd_ = ctx.make({n, entries(), tokens}, ctx.stats());
  for (int j = 0; j < n; ++j) {
    be.copy(emb, select(bank_stream(j), 0));
    be.rmsnorm_forward(emb, TensorView{}, TensorView{}, select(bank_rstd_stream(j), 0),
                       options_.norm_eps);
  }
  start_step(ctx);
}

void DepthResidual::start_step(const Context& ctx) {
  folded_query_ = ctx.make(query_->value.view().shape_vector(), ctx.stats());
  ctx.backend.mul_forward(query_->value, key_norm_->value, folded_query_);
  block_states_.clear();
  block_states_.resize(static_cast<size_t>(blocks()));
  branch_states_.clear();
  branch_states_.resize(static_cast<size_t>(options_.total_branches));
  partial_.reset();
  partial_rstd_.reset();
  output_state_.reset();
}

void DepthResidual::start_block(const Context& ctx, int64_t block) {
  auto state = std::make_unique<BlockState>();
  prefix_forward(ctx, block, *state);
  block_states_[static_cast<size_t>(block)] = std::move(state);
}

void DepthResidual::prefix_forward(const Context& ctx, int64_t block, BlockState& state) {
  Backend& be = ctx.backend;
  const int64_t size = block_size(block), sources = block + 1;
  state.out.clear();
  state.lse.clear();
  for (int j = 0; j < options_.streams; ++j) {
    const int key = roles_.key_stream[static_cast<size_t>(j)];
    const int value = roles_.value_stream[static_cast<size_t>(j)];
    state.out.push_back(ctx.make({size, tokens_, d_}));
    state.lse.push_back(ctx.make({size, tokens_}, ctx.stats()));
    be.depth_read_prefix_forward(slice(bank_stream(key), 0, sources),
                                 slice(bank_rstd_stream(key), 0, sources),
                                 slice(bank_stream(value), 0, sources),
                                 slice(select(folded_query_, j), first_branch(block), size),
                                 state.out.back(), state.lse.back());
  }
}

TensorView DepthResidual::read(const Context& ctx, int64_t branch) {
  const int64_t n = options_.streams, block = block_of(branch), i = position_in_block(branch);
  if (i == 0 || !block_states_[static_cast<size_t>(block)]) {
    // (The second case: a pipeline segment starting inside the block.)
    start_block(ctx, block);
  }
  auto state = std::make_unique<BranchState>();
  state->retrieved = ctx.make({n, tokens_, d_});
  if (i > 0) {
    state->merge_weight = ctx.make({n, tokens_}, ctx.stats());
  }
  retrieve(ctx, branch, partial_, partial_rstd_, state->retrieved, state->merge_weight);
  const TensorView h = mix_retrieved(ctx, *state, branch, i > 0);
  branch_states_[static_cast<size_t>(branch)] = std::move(state);
  return h;
}

void DepthResidual::retrieve(const Context& ctx, int64_t branch, const TensorView& partial,
                             const TensorView& partial_rstd, const TensorView& retrieved,
                             const TensorView& merge_weight) const {
  Backend& be = ctx.backend;
  const int64_t block = block_of(branch), i = position_in_block(branch);
  const BlockState& bs = *block_states_[static_cast<size_t>(block)];
  for (int j = 0; j < options_.streams; ++j) {
    const size_t js = static_cast<size_t>(j);
    const int key = roles_.key_stream[js];
    const int value = roles_.value_stream[js];
    if (i == 0) {
      be.copy(select(bs.out[js], 0), select(retrieved, j));
    } else {
      be.depth_read_merge_forward(select(bs.out[js], i), select(bs.lse[js], i),
                                  select(partial, key), select(partial_rstd, key),
                                  select(partial, value), row(select(folded_query_, j), branch),
                                  select(retrieved, j), select(merge_weight, j));
    }
  }
}

TensorView DepthResidual::mix_retrieved(const Context& ctx, BranchState& state,
                                        int64_t coefficients, bool with_transport) {
  const int64_t n = options_.streams;
  if (n == 1) {
    return select(state.retrieved, 0);
  }
  state.alpha = ctx.make({tokens_, n}, ctx.stats());
  state.beta = ctx.make({tokens_, n}, ctx.stats());
  if (with_transport) {
    state.transport = ctx.make({tokens_, n, n}, ctx.stats());
  }
  state.z_rstd = ctx.make({tokens_}, ctx.stats());
  DarCoefficientParams params;
  params.eps = options_.norm_eps;
  const size_t l = static_cast<size_t>(coefficients);
  ctx.backend.dar_coefficients_forward(state.retrieved, coef_weight_[l]->value,
                                       coef_bias_[l]->value, coef_scale_[l]->value, state.alpha,
                                       state.beta, state.transport, state.z_rstd, params);
  state.h = ctx.make({tokens_, d_});
  ctx.backend.dar_mix_forward(state.retrieved, state.alpha, state.h);
  return state.h.view();
}

void DepthResidual::write(const Context& ctx, int64_t branch, const TensorView& y_in) {
  Backend& be = ctx.backend;
  const int64_t n = options_.streams, block = block_of(branch), i = position_in_block(branch);
  BranchState& state = *branch_states_[static_cast<size_t>(branch)];
  // The backward reads neither h (f_l keeps its own copy of its input) nor R
  // (recomputed from the phase-1 outputs and P^{i-1}, docs/dar_math.md 5.5).
  state.h.reset();
  state.retrieved.reset();
  const TensorView y = reshape(y_in, {tokens_, d_});
  Buffer next = ctx.make({n, tokens_, d_});
  if (n == 1) {
    if (i == 0) {
      be.copy(y, select(next, 0));
    } else {
      be.add(select(partial_, 0), y, select(next, 0));
    }
  } else {
    be.dar_write_forward(i > 0 ? state.transport.view() : TensorView{},
                         i > 0 ? partial_.view() : TensorView{}, state.beta, y, next);
    if (saving_) {
      state.y = ctx.copy_of(y);
    }
  }
  if (i > 0 && saving_) {
    state.partial_prev = std::move(partial_);
    state.partial_prev_rstd = std::move(partial_rstd_);
  }
  partial_ = std::move(next);
  partial_rstd_ = ctx.make({n, tokens_}, ctx.stats());
  for (int j = 0; j < n; ++j) {
    be.rmsnorm_forward(select(partial_, j), TensorView{}, TensorView{}, select(partial_rstd_, j),
                       options_.norm_eps);
  }
  if (i == block_size(block) - 1) {
    for (int j = 0; j < n; ++j) {
      be.copy(select(partial_, j), select(bank_stream(j), block + 1));
      be.copy(select(partial_rstd_, j), select(bank_rstd_stream(j), block + 1));
    }
    partial_.reset();
    partial_rstd_.reset();
    // Nothing of the block is kept: its phase-1 outputs (o-bar, lse) are
    // recomputed from the bank in backward (docs/dar_math.md 5.5).
    block_states_[static_cast<size_t>(block)].reset();
  } else if (branch == segment_end_ - 1) {
    // A pipeline segment ends inside the block: P goes to the next stage,
    // the phase-1 outputs are recomputed in backward as above.
    block_states_[static_cast<size_t>(block)].reset();
  }
  if (!saving_) {
    branch_states_[static_cast<size_t>(branch)].reset();
  }
}

Buffer DepthResidual::read_output(const Context& ctx) {
  Backend& be = ctx.backend;
  const int64_t n = options_.streams, last = options_.total_branches;
  auto state = std::make_unique<BranchState>();
  state->retrieved = ctx.make({n, tokens_, d_});
  state->out_lse = ctx.make({n, tokens_}, ctx.stats());
  for (int j = 0; j < n; ++j) {
    const int key = roles_.key_stream[static_cast<size_t>(j)];
    const int value = roles_.value_stream[static_cast<size_t>(j)];
    be.depth_read_prefix_forward(bank_stream(key), bank_rstd_stream(key), bank_stream(value),
                                 slice(select(folded_query_, j), last, 1),
                                 reshape(select(state->retrieved, j), {1, tokens_, d_}),
                                 reshape(select(state->out_lse, j), {1, tokens_}));
  }
  const TensorView h = mix_retrieved(ctx, *state, last, false);
  // The caller owns h: n = 1 copies R (the backward reads R), n >= 2 hands
  // over the mix, which the backward does not read.
  Buffer out = options_.streams == 1 ? ctx.copy_of(h) : std::move(state->h);
  output_state_ = std::move(state);
  return out;
}

// ---- backward ----------------------------------------------------------------------

void DepthResidual::begin_backward(const Context& ctx, const TensorView& dh_out_in) {
  Backend& be = ctx.backend;
  const int64_t n = options_.streams, last = options_.total_branches;
  if (!output_state_) {
    throw ShapeError("depth residual: backward without a saved forward");
  }
  BranchState& state = *output_state_;
  const TensorView dh_out = reshape(dh_out_in, {tokens_, d_});
  dbank_ = ctx.zeros({n, entries(), tokens_, d_});
  dfolded_query_ = ctx.zeros(folded_query_.view().shape_vector(), ctx.stats());
  Buffer dretrieved = ctx.zeros({n, tokens_, d_});
  if (n == 1) {
    be.axpy(1.0, dh_out, select(dretrieved, 0));
  } else {
    Buffer dalpha = ctx.zeros({tokens_, n}, ctx.stats());
    Buffer dbeta = ctx.zeros({tokens_, n}, ctx.stats());
    be.dar_mix_backward(dh_out, state.retrieved, state.alpha, dretrieved, dalpha);
    const size_t l = static_cast<size_t>(last);
    DarCoefficientParams params;
    params.eps = options_.norm_eps;
    be.dar_coefficients_backward(
        dalpha, dbeta, TensorView{}, state.retrieved, coef_weight_[l]->value, coef_bias_[l]->value,
        coef_scale_[l]->value, state.alpha, state.beta, TensorView{}, state.z_rstd, dretrieved,
        coef_weight_[l]->grad, coef_bias_[l]->grad, coef_scale_[l]->grad, params);
  }
  for (int j = 0; j < n; ++j) {
    const int key = roles_.key_stream[static_cast<size_t>(j)];
    const int value = roles_.value_stream[static_cast<size_t>(j)];
    be.depth_read_prefix_backward(
        reshape(select(dretrieved, j), {1, tokens_, d_}), TensorView{}, bank_stream(key),
        bank_rstd_stream(key), bank_stream(value), slice(select(folded_query_, j), last, 1),
        reshape(select(state.retrieved, j), {1, tokens_, d_}),
        reshape(select(state.out_lse, j), {1, tokens_}), dbank_stream(key), dbank_stream(value),
        slice(select(dfolded_query_, j), last, 1));
  }
  output_state_.reset();
  dpartial_.reset();
}

TensorView DepthResidual::write_backward(const Context& ctx, int64_t branch) {
  Backend& be = ctx.backend;
  const int64_t n = options_.streams, block = block_of(branch), i = position_in_block(branch);
  BranchState& state = *branch_states_[static_cast<size_t>(branch)];
  // The block's last branch, or (pipeline) the last branch of a segment that
  // ends inside the block: the block's phase 1 is recomputed from the bank.
  const bool block_starts_here = !block_states_[static_cast<size_t>(block)];
  if (block_starts_here) {
    auto recomputed = std::make_unique<BlockState>();
    prefix_forward(ctx, block, *recomputed);
    block_states_[static_cast<size_t>(block)] = std::move(recomputed);
  }
  BlockState& bs = *block_states_[static_cast<size_t>(block)];
  if (block_starts_here) {
    if (i == block_size(block) - 1) {
      // dP^S = d H_{block+1}, complete: every later read has been differentiated.
      dpartial_ = ctx.make({n, tokens_, d_});
      for (int j = 0; j < n; ++j) {
        be.copy(select(dbank_stream(j), block + 1), select(dpartial_, j));
      }
    } else if (dpartial_.empty()) {
      throw ShapeError("depth residual: branch " + std::to_string(branch) +
                       " ends a segment inside a block but no gradient of P was received");
    }
    for (int j = 0; j < n; ++j) {
      bs.dout.push_back(ctx.zeros(bs.out[static_cast<size_t>(j)].view().shape_vector()));
      bs.dlse.push_back(
          ctx.zeros(bs.lse[static_cast<size_t>(j)].view().shape_vector(), ctx.stats()));
    }
  }
  state.dy = ctx.zeros({tokens_, d_});
  if (n == 1) {
    // P^i = P^{i-1} + y: both get dP^i; dpartial_ stays dP^{i-1}.
    be.axpy(1.0, select(dpartial_, 0), state.dy);
    if (i == 0) {
      dpartial_.reset();
    }
  } else {
    Buffer dprev;
    if (i > 0) {
      dprev = ctx.zeros({n, tokens_, d_});
      state.dtransport = ctx.zeros({tokens_, n, n}, ctx.stats());
    }
    state.dbeta = ctx.zeros({tokens_, n}, ctx.stats());
    be.dar_write_backward(dpartial_, i > 0 ? state.transport.view() : TensorView{},
                          i > 0 ? state.partial_prev.view() : TensorView{}, state.beta, state.y,
                          state.dtransport, dprev, state.dbeta, state.dy);
    dpartial_ = std::move(dprev);
  }
  return state.dy.view();
}

void DepthResidual::read_backward(const Context& ctx, int64_t branch, const TensorView& dh_in) {
  Backend& be = ctx.backend;
  const int64_t n = options_.streams, block = block_of(branch), i = position_in_block(branch);
  BranchState& state = *branch_states_[static_cast<size_t>(branch)];
  BlockState& bs = *block_states_[static_cast<size_t>(block)];
  const TensorView dh = reshape(dh_in, {tokens_, d_});
  Buffer dretrieved = ctx.zeros({n, tokens_, d_});
  if (n == 1) {
    be.axpy(1.0, dh, select(dretrieved, 0));
  } else {
    // R again, bit for bit: the same merge of the same o-bar, lse and P^{i-1}.
    state.retrieved = ctx.make({n, tokens_, d_});
    Buffer merge_weight;
    if (i > 0) {
      merge_weight = ctx.make({n, tokens_}, ctx.stats());
    }
    retrieve(ctx, branch, state.partial_prev, state.partial_prev_rstd, state.retrieved,
             merge_weight);
    merge_weight.reset();
    Buffer dalpha = ctx.zeros({tokens_, n}, ctx.stats());
    be.dar_mix_backward(dh, state.retrieved, state.alpha, dretrieved, dalpha);
    const size_t l = static_cast<size_t>(branch);
    DarCoefficientParams params;
    params.eps = options_.norm_eps;
    be.dar_coefficients_backward(dalpha, state.dbeta, state.dtransport, state.retrieved,
                                 coef_weight_[l]->value, coef_bias_[l]->value,
                                 coef_scale_[l]->value, state.alpha, state.beta, state.transport,
                                 state.z_rstd, dretrieved, coef_weight_[l]->grad,
                                 coef_bias_[l]->grad, coef_scale_[l]->grad, params);
  }
  for (int j = 0; j < n; ++j) {
    const size_t js = static_cast<size_t>(j);
    const int key = roles_.key_stream[js];
    const int value = roles_.value_stream[js];
    if (i == 0) {
      be.axpy(1.0, select(dretrieved, j), select(bs.dout[js], 0));
    } else {
      // The key and value gradients may land on the same stream: the key part
      // goes through a temporary so the op's outputs never alias.
      Buffer dkeys = ctx.zeros({tokens_, d_});
      be.depth_read_merge_backward(
          select(dretrieved, j), select(bs.out[js], i), select(state.partial_prev, key),
          select(state.partial_prev_rstd, key), select(state.partial_prev, value),
          row(select(folded_query_, j), branch), select(state.merge_weight, j),
          select(bs.dout[js], i), select(bs.dlse[js], i), dkeys, select(dpartial_, value),
          row(select(dfolded_query_, j), branch));
      be.axpy(1.0, dkeys, select(dpartial_, key));
    }
  }
  branch_states_[static_cast<size_t>(branch)].reset();
  if (i == 0 || branch == segment_first_) {
    // (The second case: a pipeline segment starting inside the block; its
    // phase-1 backward covers its own positions, the rest have zero dout and
    // dlse.  dpartial_ is then d P received, which goes back to the stage
    // before.)
    prefix_backward(ctx, block);
    block_states_[static_cast<size_t>(block)].reset();
    if (i == 0) {
      dpartial_.reset();
    }
  }
}

void DepthResidual::prefix_backward(const Context& ctx, int64_t block) {
  Backend& be = ctx.backend;
  BlockState& bs = *block_states_[static_cast<size_t>(block)];
  const int64_t size = block_size(block), sources = block + 1;
  for (int j = 0; j < options_.streams; ++j) {
    const size_t js = static_cast<size_t>(j);
    const int key = roles_.key_stream[js];
    const int value = roles_.value_stream[js];
    be.depth_read_prefix_backward(
        bs.dout[js], bs.dlse[js], slice(bank_stream(key), 0, sources),
        slice(bank_rstd_stream(key), 0, sources), slice(bank_stream(value), 0, sources),
        slice(select(folded_query_, j), first_branch(block), size), bs.out[js], bs.lse[js],
        slice(dbank_stream(key), 0, sources), slice(dbank_stream(value), 0, sources),
        slice(select(dfolded_query_, j), first_branch(block), size));
  }
}

void DepthResidual::release() {
  bank_.reset();
  bank_rstd_.reset();
  dbank_.reset();
  folded_query_.reset();
  dfolded_query_.reset();
  partial_.reset();
  partial_rstd_.reset();
  dpartial_.reset();
  block_states_.clear();
  branch_states_.clear();
  output_state_.reset();
}

void DepthResidual::finish_backward(const Context& ctx, const TensorView& dembedding) {
  Backend& be = ctx.backend;
  if (!dembedding.empty()) {  // (empty on a pipeline stage without the embedding)
    const TensorView demb = reshape(dembedding, {tokens_, d_});
    for (int j = 0; j < options_.streams; ++j) {
      be.axpy(1.0, select(dbank_stream(j), 0), demb);
    }
  }
  be.mul_backward(dfolded_query_, query_->value, key_norm_->value, query_->grad, key_norm_->grad);
  dbank_.reset();
  dfolded_query_.reset();
  bank_.reset();
  bank_rstd_.reset();
  folded_query_.reset();
  block_states_.clear();
  branch_states_.clear();
}

// ---- pipeline stages --------------------------------------------------------------

struct DepthResidual::State {
  int64_t tokens = 0;
  bool saving = true;
  Buffer folded_query, dfolded_query, bank, bank_rstd, dbank, partial, partial_rstd, dpartial;
  std::vector<std::unique_ptr<BlockState>> block_states;
  std::vector<std::unique_ptr<BranchState>> branch_states;
  std::unique_ptr<BranchState> output_state;
};

std::shared_ptr<DepthResidual::State> DepthResidual::take_state() {
  auto state = std::make_shared<State>();
  state->tokens = tokens_;
  state->saving = saving_;
  state->folded_query = std::move(folded_query_);
  state->dfolded_query = std::move(dfolded_query_);
  state->bank = std::move(bank_);
  state->bank_rstd = std::move(bank_rstd_);
  state->dbank = std::move(dbank_);
  state->partial = std::move(partial_);
  state->partial_rstd = std::move(partial_rstd_);
  state->dpartial = std::move(dpartial_);
  state->block_states = std::move(block_states_);
  state->branch_states = std::move(branch_states_);
  state->output_state = std::move(output_state_);
  block_states_.clear();
  branch_states_.clear();
  return state;
}

void DepthResidual::put_state(std::shared_ptr<State> state) {
  if (!state) {
    release();
    return;
  }
  tokens_ = state->tokens;
  saving_ = state->saving;
  folded_query_ = std::move(state->folded_query);
  dfolded_query_ = std::move(state->dfolded_query);
  bank_ = std::move(state->bank);
  bank_rstd_ = std::move(state->bank_rstd);
  dbank_ = std::move(state->dbank);
  partial_ = std::move(state->partial);
  partial_rstd_ = std::move(state->partial_rstd);
  dpartial_ = std::move(state->dpartial);
  block_states_ = std::move(state->block_states);
  branch_states_ = std::move(state->branch_states);
  output_state_ = std::move(state->output_state);
}

void DepthResidual::set_segment(int64_t first_branch, int64_t end_branch) {
  if (first_branch < 0 || end_branch <= first_branch || end_branch > options_.total_branches) {
    throw ShapeError("depth residual: segment [" + std::to_string(first_branch) + ", " +
                     std::to_string(end_branch) + ") is not within the " +
                     std::to_string(options_.total_branches) + " branches");
  }
  segment_first_ = first_branch;
  segment_end_ = end_branch;
}

void DepthResidual::begin_received(const Context& ctx, int64_t tokens) {
  if (!bank_.empty()) {
    if (tokens != tokens_) {
      throw ShapeError("depth residual: the bank holds " + std::to_string(tokens_) +
                       " tokens, not " + std::to_string(tokens));
    }
    return;
  }
  tokens_ = tokens;
  bank_ = ctx.zeros({options_.streams, entries(), tokens, d_});
  bank_rstd_ = ctx.zeros({options_.streams, entries(), tokens}, ctx.stats());
  start_step(ctx);
}

namespace {

// What the boundary after `end_branch` carries from entry `from` on, for
// each of the n streams: `count` complete entries, and the cut block's
// partial P when `cut`.
struct BoundarySpan {
  int64_t n = 0, count = 0;
  bool cut = false;
};
BoundarySpan boundary_span(const DepthResidual& depth, int64_t streams, int64_t end_branch,
                           int64_t from, const char* what) {
  const int64_t complete = depth.complete_entries(end_branch);
  if (from < 0 || from > complete) {
    throw ShapeError(std::string("depth residual ") + what + ": entries from " +
                     std::to_string(from) + " of " + std::to_string(complete));
  }
  return {streams, complete - from, depth.cuts_block(end_branch)};
}

}  // namespace

DepthResidual::BoundaryBuffers DepthResidual::pack_boundary(const Context& ctx,
                                                            int64_t end_branch,
                                                            int64_t from) const {
  Backend& be = ctx.backend;
  const auto [n, count, cut] = boundary_span(*this, options_.streams, end_branch, from, "boundary");
  const int64_t k = count + (cut ? 1 : 0);
  BoundaryBuffers out;
  out.values = ctx.make({n, k, tokens_, d_});
  out.stats = ctx.make({n, k, tokens_}, ctx.stats());
  for (int j = 0; j < n && k > 0; ++j) {
    if (count > 0) {
      be.copy(slice(bank_stream(j), from, count), slice(select(out.values, j), 0, count));
      be.copy(slice(bank_rstd_stream(j), from, count), slice(select(out.stats, j), 0, count));
    }
    if (k > count) {
      be.copy(select(partial_, j), select(select(out.values, j), count));
      be.copy(select(partial_rstd_, j), select(select(out.stats, j), count));
    }
  }
  return out;
}

void DepthResidual::unpack_boundary(const Context& ctx, int64_t end_branch, int64_t from,
                                    const BoundaryBuffers& in) {
  Backend& be = ctx.backend;
  const auto [n, count, cut] = boundary_span(*this, options_.streams, end_branch, from, "boundary");
  if (cut) {
    partial_ = ctx.make({n, tokens_, d_});
    partial_rstd_ = ctx.make({n, tokens_}, ctx.stats());
  } else {
    partial_.reset();
    partial_rstd_.reset();
  }
  for (int j = 0; j < n; ++j) {
    if (count > 0) {
      be.copy(slice(select(in.values, j), 0, count), slice(bank_stream(j), from, count));
      be.copy(slice(select(in.stats, j), 0, count), slice(bank_rstd_stream(j), from, count));
    }
    if (cut) {
      be.copy(select(select(in.values, j), count), select(partial_, j));
      be.copy(select(select(in.stats, j), count), select(partial_rstd_, j));
    }
  }
}

void DepthResidual::begin_backward_received(const Context& ctx) {
  if (dbank_.empty()) {
    dbank_ = ctx.zeros({options_.streams, entries(), tokens_, d_});
    dfolded_query_ = ctx.zeros(folded_query_.view().shape_vector(), ctx.stats());
  }
  dpartial_.reset();
}

Buffer DepthResidual::pack_boundary_gradient(const Context& ctx, int64_t end_branch,
                                             int64_t from) {
  Backend& be = ctx.backend;
  const auto [n, count, cut] =
      boundary_span(*this, options_.streams, end_branch, from, "boundary gradient");
  if (cut && dpartial_.empty()) {
    throw ShapeError("depth residual: no gradient of the received P to send back");
  }
  Buffer out = ctx.make({n, count + (cut ? 1 : 0), tokens_, d_});
  for (int j = 0; j < n; ++j) {
    if (count > 0) {
      const TensorView sent = slice(dbank_stream(j), from, count);
      be.copy(sent, slice(select(out, j), 0, count));
      be.fill(sent, 0.0);
    }
    if (cut) {
      be.copy(select(dpartial_, j), select(select(out, j), count));
    }
  }
  dpartial_.reset();
  return out;
}

void DepthResidual::unpack_boundary_gradient(const Context& ctx, int64_t end_branch, int64_t from,
                                             const TensorView& dvalues) {
  Backend& be = ctx.backend;
  const auto [n, count, cut] =
      boundary_span(*this, options_.streams, end_branch, from, "boundary gradient");
  if (dbank_.empty()) {
    throw ShapeError("depth residual: a bank gradient arrived before begin_backward_received");
  }
  if (cut) {
    dpartial_ = ctx.make({n, tokens_, d_});
  }
  for (int j = 0; j < n; ++j) {
    if (count > 0) {
      be.axpy(1.0, slice(select(dvalues, j), 0, count), slice(dbank_stream(j), from, count));
    }
    if (cut) {
      be.copy(select(select(dvalues, j), count), select(dpartial_, j));
    }
  }
}

}  // namespace modar::runtime
