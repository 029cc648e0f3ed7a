// runtime/layers/lm_head.cpp: the language-model head (include/modar/runtime/layers.hpp):
// final RMSNorm, the head GEMM and the cross-entropy, forward and backward.
//
// Layout: x [T, d] (any leading shape with d last), u = RMSNorm(x) [T, d],
// logits [T, V] = u W with W the untied head [d, V] or the tied embedding
// E [V, d] transposed (logits = u E^T).  Backward, with g = weight x
// d(mean loss) / d logits (the cross-entropy op's gradient scaled by weight):
//   du = g W^T  (tied: g E),   dW += u^T g  (tied: dE += g^T u),
//   dx = RMSNorm backward of du;  d final_norm += its weight gradient.
// Buffers are allocated in the order the single-process model always has
// (rstd, u, logits, lse; then dlogits, du, dx), so its peak bytes are unchanged.
//
// Vocab-parallel (Megatron's vocab-parallel cross-entropy, on the backend's
// ops): rank r's logits z [T, V / t] cover the vocabulary [b, b + V / t).
//   lse_i = log sum_r exp(lse_i^r)   (each rank's lse of its columns, all-gathered),
//   z_i[y_i] from the rank holding y_i (a gather of its column, zeros
//   elsewhere, all-reduced), loss = mean_i (lse_i - z_i[y_i]).
// Gradient g = weight / N (softmax(z) - onehot(y)) on this rank's columns:
// the cross-entropy op gives it for the rows whose target is here; for the
// others the op is run with column 0 as their target (softmax - e_0) and a
// second call with an infinite lse adds e_0 back (softmax 0, - (- e_0)).
// du = g W^T is a sum over the vocabulary: all-reduced over the group.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "modar/base/errors.hpp"
#include "modar/runtime/layers.hpp"

namespace modar::runtime {

LmHead::LmHead(ParameterSet& params, const Context& ctx, int64_t d_model, int64_t vocab,
               double norm_eps, Parameter* tied_embedding, const Init& head_init, Rng& rng,
               ShardGroup* vocab_group)
    : d_(d_model),
      vocab_(vocab),
      local_vocab_(vocab),
      norm_eps_(norm_eps),
      tied_(tied_embedding),
      group_(vocab_group) {
  if (group_ != nullptr) {
    if (vocab % group_->size() != 0) {
      throw ConfigError("model.vocab_size = " + std::to_string(vocab) +
                        " must be a multiple of parallel.tensor = " +
                        std::to_string(group_->size()) + " for a vocab-parallel head");
    }
    local_vocab_ = vocab / group_->size();
    vocab_begin_ = group_->rank() * local_vocab_;
  }
  final_norm_ =
      &params.add(ctx, "final_norm", {d_model}, ctx.dtype, Init::constant_value(1.0), rng);
  if (tied_ == nullptr) {
    head_ = &params.add(ctx, "head", {d_model, local_vocab_}, ctx.dtype, head_init, rng);
  }
}

void LmHead::project(Backend& backend, const TensorView& u_rows, const TensorView& logits) const {
  if (head_ != nullptr) {
    backend.gemm(u_rows, false, head_->value, false, logits);
  } else {
    backend.gemm(u_rows, false, tied_->value, true, logits);
  }
}

double LmHead::forward(const Context& ctx, const TensorView& x, const TensorView& targets,
                       Saved& saved) const {
  Backend& be = ctx.backend;
  const int64_t rows = x.numel() / d_;
  saved.x = x;
  saved.targets = reshape(targets, {rows});
  saved.rstd = ctx.make({rows}, ctx.stats());
  saved.u = ctx.make(x.shape_vector());
  be.rmsnorm_forward(x, final_norm_->value, saved.u, saved.rstd, norm_eps_);
  // Assigned over what the caller left in saved.logits (the model's previous
  // logits are freed here, after the new ones exist, as they always were).
  saved.logits = ctx.make({rows, local_vocab_});
  project(be, reshape(saved.u, {rows, d_}), saved.logits);
  if (group_ != nullptr) {
    return split_cross_entropy(ctx, saved);
  }
  Buffer loss = ctx.make({1}, ctx.stats());
  saved.lse = ctx.make({rows}, ctx.stats());
  be.cross_entropy_forward(saved.logits, saved.targets, loss, saved.lse);
  return download(be, loss)[0];
}

Buffer LmHead::backward(const Context& ctx, double weight, Saved& saved) const {
  Backend& be = ctx.backend;
  const int64_t rows = saved.logits.dim(0);
  Buffer dlogits = ctx.zeros({rows, local_vocab_});
  if (group_ != nullptr) {
    split_cross_entropy_backward(ctx, weight, saved, dlogits);
  } else {
    be.cross_entropy_backward(weight, saved.logits, saved.targets, saved.lse, dlogits);
  }
  if (!saved.keep_logits) {
    saved.logits.reset();
  }
  const TensorView u_rows = reshape(saved.u, {rows, d_});
  Buffer du = ctx.make({rows, d_});
  if (head_ != nullptr) {
    be.gemm(dlogits, false, head_->value, true, du);
    be.gemm(u_rows, true, dlogits, false, head_->grad, 1.0, 1.0);
  } else {
    be.gemm(dlogits, false, tied_->value, false, du);
    be.gemm(dlogits, true, u_rows, false, tied_->grad, 1.0, 1.0);
  }
  dlogits.reset();
  if (group_ != nullptr) {
    group_->all_reduce_sum(du);  // a sum over the whole vocabulary
  }
  Buffer dx = ctx.zeros(saved.x.shape_vector());
  be.rmsnorm_backward(reshape(du, saved.x.shape_vector()), saved.x, final_norm_->value, saved.rstd,
                      dx, final_norm_->grad);
  du.reset();
  saved.u.reset();
  return dx;
}

Buffer LmHead::logits(const Context& ctx, const TensorView& x) const {
  if (group_ != nullptr) {
    throw std::logic_error("LmHead::logits: the whole vocabulary only (decoding)");
  }
  const int64_t rows = x.numel() / d_;
  Buffer rstd = ctx.make({rows}, ctx.stats());
  Buffer u = ctx.make({rows, d_});
  ctx.backend.rmsnorm_forward(reshape(x, {rows, d_}), final_norm_->value, u, rstd, norm_eps_);
  Buffer out = ctx.make({rows, vocab_});
  project(ctx.backend, u, out);
  return out;
}

double LmHead::split_cross_entropy(const Context& ctx, Saved& saved) const {
  Backend& be = ctx.backend;
  const int64_t rows = saved.logits.dim(0), t = group_->size();
  // Each row's target among this rank's columns.
  std::vector<int32_t> local(static_cast<size_t>(rows), -1), elsewhere(local), column(local);
  saved.counted = saved.elsewhere = 0;
  const std::vector<double> targets = download(be, saved.targets);
  for (size_t i = 0; i < targets.size(); ++i) {
    const auto y = static_cast<int64_t>(targets[i]);
    if (y < 0) {
      continue;
    }
    ++saved.counted;
    if (y >= vocab_begin_ && y < vocab_begin_ + local_vocab_) {
      local[i] = column[i] = static_cast<int32_t>(y - vocab_begin_);
    } else {
      local[i] = elsewhere[i] = 0;
      ++saved.elsewhere;
    }
  }
  saved.local_targets = ctx.indices({rows}, local);
  saved.elsewhere_targets = ctx.indices({rows}, elsewhere);
  // The log-sum-exp of every rank's columns (the op's own loss is unused).
  Buffer unused = ctx.make({1}, ctx.stats());
  Buffer mine = ctx.make({rows}, ctx.stats());
  be.cross_entropy_forward(saved.logits, saved.local_targets, unused, mine);
  Buffer all = ctx.make({t, rows}, ctx.stats());
  group_->all_gather(mine, all);
  // The target's logit from the rank that holds it.
  Buffer index = ctx.indices({rows, 1}, column);
  Buffer picked = ctx.make({rows, 1, 1});
  be.gather_rows_forward(reshape(saved.logits, {rows, local_vocab_, 1}), index, picked);
  group_->all_reduce_sum(picked);
  const std::vector<double> lse_parts = download(be, all), target_logit = download(be, picked);
  std::vector<double> lse(static_cast<size_t>(rows));
  double total = 0.0;
  for (int64_t i = 0; i < rows; ++i) {
    double top = lse_parts[static_cast<size_t>(i)];
    for (int64_t r = 1; r < t; ++r) {
      top = std::max(top, lse_parts[static_cast<size_t>(r * rows + i)]);
    }
    double sum = 0.0;
    for (int64_t r = 0; r < t; ++r) {
      sum += std::exp(lse_parts[static_cast<size_t>(r * rows + i)] - top);
    }
    lse[static_cast<size_t>(i)] = top + std::log(sum);
    if (targets[static_cast<size_t>(i)] >= 0.0) {
      total += lse[static_cast<size_t>(i)] - target_logit[static_cast<size_t>(i)];
    }
  }
  saved.lse = ctx.make({rows}, ctx.stats());
  upload(be, lse, saved.lse);
  return saved.counted > 0 ? total / static_cast<double>(saved.counted) : 0.0;
}

void LmHead::split_cross_entropy_backward(const Context& ctx, double weight, Saved& saved,
                                          const TensorView& dlogits) const {
  Backend& be = ctx.backend;
  // weight / N (softmax - onehot), the rows whose target lies elsewhere at
  // column 0 for now ...
  be.cross_entropy_backward(weight, saved.logits, saved.local_targets, saved.lse, dlogits);
  if (saved.elsewhere == 0) {
    return;
  }
  // ... and their e_0 added back: an infinite lse makes the softmax term 0,
  // the op subtracts its factor at the target: factor = - weight / N.
  Buffer infinite = ctx.make({saved.logits.dim(0)}, ctx.stats());
  be.fill(infinite, 1e30);
  const double elsewhere = static_cast<double>(saved.elsewhere);
  be.cross_entropy_backward(-weight * elsewhere / static_cast<double>(saved.counted), saved.logits,
                            saved.elsewhere_targets, infinite, dlogits);
}

}  // namespace modar::runtime
