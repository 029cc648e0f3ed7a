// runtime/layers/moe_ffn.cpp: the Mixture-of-Experts FFN (MoeFfn, layers.hpp).
//
// Forward, T tokens (rows of x), E real + N null experts, top-k:
//   u = RMSNorm(x) g                      (the dense MLP's pre-norm)
//   l = u W_r  [T, E + N]                 (gemm, statistics dtype)
//   p, idx, gates = route(l)              (softmax, top-k, optional renormalisation)
//   counts, slots = dispatch(idx, C)      (C = ceil(cf T k / E), 0 = dropless)
//   X = permute(u)  [R, d]                (rows grouped by expert; R = sum counts)
//   H = act(X W_in[e]) (GELU) | silu(X W_gate[e]) * (X W_up[e]) (SwiGLU)
//   Y = H W_out[e]  [R, d]                (grouped GEMMs)
//   y = combine(Y, gates) + Shared(u)     (null / dropped assignments add 0)
// Objective terms: aux_loss_coef * aux + z_loss_coef * z (moe_aux_loss_*),
// whose gradients enter the router logits in backward.
// With E = 1, top-1, no shared expert: p = 1 exactly, every token keeps row
// t, and each grouped GEMM is the gemm op on the same [T, .] operands, so the
// layer reproduces the dense MlpBranch bit for bit (tests/cpp/runtime/
// test_layers_moe.cpp).
#include <algorithm>
#include <cmath>

#include "modar/base/errors.hpp"
#include "modar/runtime/layers.hpp"

namespace modar::runtime {
namespace {

MoeConfig to_config(const MoeOptions& options) {
  return {.experts = options.experts,
          .top_k = options.top_k,
          .capacity_factor = options.capacity_factor,
          .mode = options.null_experts > 0 ? MoeMode::integrated : MoeMode::none,
          .null_experts = options.null_experts};
}

}  // namespace

int64_t MoeOptions::capacity(int64_t tokens) const {
  return to_config(*this).expert_capacity(tokens);
}

MoeOptions MoeOptions::from(const MoeConfig& moe, const ModelConfig& model) {
  MoeOptions options;
  options.experts = moe.experts;
  options.top_k = moe.top_k;
  options.expert_ffn = moe.resolved_expert_ffn(model);
  options.shared_experts = moe.shared_experts;
  options.shared_expert_ffn =
      moe.shared_expert_ffn > 0 ? moe.shared_expert_ffn : options.expert_ffn;
  if (moe.shared_expert_gate) {
    throw ConfigError(
        "moe.shared_expert_gate = true: the reference runtime's shared experts have no gate "
        "(planned by the cost model only)");
  }
  options.capacity_factor = moe.capacity_factor;
  options.aux_loss_coef = moe.aux_loss_coef;
  options.z_loss_coef = moe.z_loss_coef;
  options.null_experts = moe.mode == MoeMode::integrated ? moe.null_experts : 0;
  options.renormalize = true;
  return options;
}

MoeFfn::MoeFfn(ParameterSet& params, const Context& ctx, const std::string& prefix,
               const BranchShape& shape, const MoeOptions& moe, Rng& rng, double out_std)
    : shape_(shape),
      moe_(moe),
      width_(moe.expert_ffn > 0 ? moe.expert_ffn : shape.d_ff),
      local_experts_(moe.experts) {
  if (moe.experts < 1) {
    throw ConfigError("moe.experts = " + std::to_string(moe.experts) + ": must be >= 1");
  }
  if (moe.null_experts < 0) {
    throw ConfigError("moe.null_experts = " + std::to_string(moe.null_experts) +
                      ": must be >= 0");
  }
  if (moe.top_k < 1 || moe.top_k > moe.total_experts()) {
    throw ConfigError("moe.top_k = " + std::to_string(moe.top_k) + ": must be in [1, " +
                      std::to_string(moe.total_experts()) + "] (experts + null_experts)");
  }
  if (moe.shared_experts < 0) {
    throw ConfigError("moe.shared_experts = " + std::to_string(moe.shared_experts) +
                      ": must be >= 0");
  }
  if (!(moe.capacity_factor >= 0.0) || !(moe.aux_loss_coef >= 0.0) || !(moe.z_loss_coef >= 0.0)) {
    throw ConfigError("moe.capacity_factor, moe.aux_loss_coef and moe.z_loss_coef must be >= 0");
  }
  const int64_t d = shape.d_model, f = width_, e = moe.experts;
  norm_ = &params.add(ctx, prefix + ".mlp_norm", {d}, ctx.dtype, Init::constant_value(1.0), rng);
  router_ = &params.add(ctx, prefix + ".moe_router", {d, moe.total_experts()}, ctx.dtype,
                        Init::normal_std(0.02), rng);
  if (shape.mlp == MlpKind::gelu) {
    w_in_ = &params.add(ctx, prefix + ".experts.w_in", {e, d, f}, ctx.dtype, Init::normal_std(0.02),
                        rng);
  } else {
    w_gate_ = &params.add(ctx, prefix + ".experts.w_gate", {e, d, f}, ctx.dtype,
                          Init::normal_std(0.02), rng);
    w_up_ = &params.add(ctx, prefix + ".experts.w_up", {e, d, f}, ctx.dtype,
                        Init::normal_std(0.02), rng);
  }
  w_out_ = &params.add(ctx, prefix + ".experts.w_out", {e, f, d}, ctx.dtype,
                       Init::normal_std(out_std), rng);
  if (moe.shared_experts > 0) {
    const int64_t fs = moe.shared_width(f);
    if (shape.mlp == MlpKind::gelu) {
      s_in_ = &params.add(ctx, prefix + ".shared.w_in", {d, fs}, ctx.dtype, Init::normal_std(0.02),
                          rng);
    } else {
      s_gate_ = &params.add(ctx, prefix + ".shared.w_gate", {d, fs}, ctx.dtype,
                            Init::normal_std(0.02), rng);
      s_up_ = &params.add(ctx, prefix + ".shared.w_up", {d, fs}, ctx.dtype, Init::normal_std(0.02),
                          rng);
    }
    s_out_ = &params.add(ctx, prefix + ".shared.w_out", {fs, d}, ctx.dtype,
                         Init::normal_std(out_std), rng);
  }
}

std::vector<Parameter*> MoeFfn::expert_parameters() const {
  std::vector<Parameter*> out;
  for (Parameter* p : {w_in_, w_gate_, w_up_, w_out_}) {
    if (p != nullptr) {
      out.push_back(p);
    }
  }
  return out;
}

void MoeFfn::shard_experts(const Context& ctx, int rank, int size) {
  if (size < 1 || moe_.experts % size != 0 || local_experts_ != moe_.experts) {
    throw ConfigError("moe.experts = " + std::to_string(moe_.experts) +
                      " must be a multiple of parallel.expert = " + std::to_string(size));
  }
  local_experts_ = moe_.experts / size;
  for (Parameter* p : expert_parameters()) {
    std::vector<int64_t> shape = p->value.view().shape_vector();
    const int64_t per_expert = p->value.numel() / shape[0];
    shape[0] = local_experts_;
    auto keep = [&](Buffer& full) {
      if (full.empty()) {
        return;
      }
      Buffer part = ctx.make(shape, full.dtype());
      ctx.backend.copy(slice(reshape(full, {full.numel()}), rank * local_experts_ * per_expert,
                             local_experts_ * per_expert),
                       reshape(part, {part.numel()}));
      full = std::move(part);
    };
    keep(p->value);
    keep(p->grad);
    keep(p->master);
    keep(p->adam_m);
    keep(p->adam_v);
  }
}

std::vector<int64_t> MoeFfn::group_dispatch(const Context& ctx, const TensorView& indices,
                                            const TensorView& counts,
                                            const TensorView& slots) const {
  const int64_t tokens = indices.dim(0), k = moe_.top_k, e_count = moe_.experts;
  const std::vector<double> idx = download(ctx.backend, indices);
  // Assignments of this rank per (expert, choice j), then every rank's.
  std::vector<int64_t> mine(static_cast<size_t>(1 + e_count * k), 0);
  mine[0] = tokens;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const auto e = static_cast<int64_t>(idx[static_cast<size_t>(t * k + j)]);
      if (e < e_count) {
        ++mine[static_cast<size_t>(1 + e * k + j)];
      }
    }
  }
  const std::vector<int64_t> all = exchange_->all_gather_counts(mine);
  const int64_t ranks = exchange_->size(), me = exchange_->rank(), width = 1 + e_count * k;
  int64_t group_tokens = 0;
  for (int64_t r = 0; r < ranks; ++r) {
    group_tokens += all[static_cast<size_t>(r * width)];
  }
  const bool capped = moe_.capacity_factor > 0.0;
  const int64_t capacity = capped ? moe_.capacity(group_tokens) : 0;
  // keep[e][j]: this rank's first keep assignments of (e, j) survive; the
  // single-process priority is j-major, then token order (ranks in order).
  std::vector<int64_t> keep(static_cast<size_t>(e_count * k), 0), kept(static_cast<size_t>(e_count), 0);
  for (int64_t e = 0; e < e_count; ++e) {
    int64_t before = 0;
    for (int64_t j = 0; j < k; ++j) {
      const size_t at = static_cast<size_t>(1 + e * k + j);
      int64_t earlier_ranks = 0, all_ranks = 0;
      for (int64_t r = 0; r < ranks; ++r) {
        const int64_t c = all[static_cast<size_t>(r * width) + at];
        all_ranks += c;
        earlier_ranks += r < me ? c : 0;
      }
      const int64_t own = mine[at];
      const int64_t room =
          capped ? std::max<int64_t>(0, capacity - before - earlier_ranks) : own;
      keep[static_cast<size_t>(e * k + j)] = std::min(own, room);
      kept[static_cast<size_t>(e)] += keep[static_cast<size_t>(e * k + j)];
      before += all_ranks;
    }
  }
  std::vector<int64_t> next(static_cast<size_t>(e_count), 0), used(keep.size(), 0);
  for (int64_t e = 1; e < e_count; ++e) {
    next[static_cast<size_t>(e)] = next[static_cast<size_t>(e - 1)] + kept[static_cast<size_t>(e - 1)];
  }
  std::vector<int32_t> slot_values(static_cast<size_t>(tokens * k), -1);
  for (int64_t j = 0; j < k; ++j) {
    for (int64_t t = 0; t < tokens; ++t) {
      const auto e = static_cast<int64_t>(idx[static_cast<size_t>(t * k + j)]);
      if (e >= e_count) {
        continue;  // a null expert
      }
      const size_t ej = static_cast<size_t>(e * k + j);
      if (used[ej] < keep[ej]) {
        ++used[ej];
        slot_values[static_cast<size_t>(t * k + j)] =
            static_cast<int32_t>(next[static_cast<size_t>(e)]++);
      }
    }
  }
  ctx.backend.copy_from_host(slot_values.data(), slots);
  const std::vector<int32_t> count_values(kept.begin(), kept.end());
  ctx.backend.copy_from_host(count_values.data(), counts);
  return kept;
}

Buffer MoeFfn::experts_forward(const Context& ctx, const TensorView& rows, const TensorView& counts,
                               Saved* saved) const {
  Backend& be = ctx.backend;
  const int64_t r = rows.dim(0), f = width_;
  Buffer hidden = ctx.make({r, f});
  Buffer pre, gate, up;
  if (shape_.mlp == MlpKind::gelu) {
    pre = ctx.make({r, f});
    be.grouped_gemm(rows, false, w_in_->value, false, pre, counts);
    be.gelu_forward(pre, hidden);
  } else {
    gate = ctx.make({r, f});
    up = ctx.make({r, f});
    be.grouped_gemm(rows, false, w_gate_->value, false, gate, counts);
    be.grouped_gemm(rows, false, w_up_->value, false, up, counts);
    be.swiglu_forward(gate, up, hidden);
  }
  Buffer out = ctx.make({r, shape_.d_model});
  be.grouped_gemm(hidden, false, w_out_->value, false, out, counts);
  if (saved != nullptr) {
    saved->pre = std::move(pre);
    saved->gate = std::move(gate);
    saved->up = std::move(up);
    saved->hidden = std::move(hidden);
  }
  return out;
}

Buffer MoeFfn::forward(const Context& ctx, const TensorView& x, Saved* saved, Stats* stats) const {
  Backend& be = ctx.backend;
  const int64_t d = shape_.d_model, tokens = x.rows(), k = moe_.top_k;
  const int64_t total = moe_.total_experts();
  const TensorView x2 = reshape(x, {tokens, d});
  Buffer rstd = ctx.make({tokens}, ctx.stats());
  Buffer u = ctx.make({tokens, d});
  be.rmsnorm_forward(x2, norm_->value, u, rstd, shape_.norm_eps);
  Buffer logits = ctx.make({tokens, total}, ctx.stats());
  be.gemm(u, false, router_->value, false, logits);
  Buffer probs = ctx.make({tokens, total}, ctx.stats());
  Buffer indices = ctx.make({tokens, k}, ScalarType::i32);
  Buffer gates = ctx.make({tokens, k}, ctx.stats());
  be.moe_route_forward(logits, probs, indices, gates, MoeRouteParams{moe_.renormalize});
  Buffer counts = ctx.make({moe_.experts}, ScalarType::i32);
  Buffer slots = ctx.make({tokens, k}, ScalarType::i32);
  std::vector<int64_t> expert_counts;
  if (exchange_ == nullptr) {
    be.moe_dispatch(indices, counts, slots, moe_.capacity(tokens));
    for (double c : download(be, counts)) {
      expert_counts.push_back(static_cast<int64_t>(c));
    }
  } else {
    expert_counts = group_dispatch(ctx, indices, counts, slots);
  }
  int64_t kept = 0;
  for (int64_t c : expert_counts) {
    kept += c;
  }
  {
    Stats& st = last_stats_;
    st = Stats{};
    st.assignments = tokens * k;
    if (moe_.null_experts > 0) {
      const std::vector<double> idx = download(be, indices);
      for (double e : idx) {
        st.null_assignments += e >= static_cast<double>(moe_.experts) ? 1 : 0;
      }
    }
    st.dropped = st.assignments - st.null_assignments - kept;
    if (moe_.aux_loss_coef > 0.0 || moe_.z_loss_coef > 0.0) {
      Buffer loss = ctx.make({2}, ctx.stats());
      be.moe_aux_loss_forward(logits, probs, indices, loss);
      const std::vector<double> l = download(be, loss);
      st.aux_loss = l[0];
      st.z_loss = l[1];
    }
    if (stats != nullptr) {
      *stats = st;
    }
  }
  Buffer y_buffer = ctx.make(x.shape_vector());
  const TensorView y = reshape(y_buffer, {tokens, d});
  Buffer rows, expert_out;
  ExpertExchange::Plan plan;
  int64_t local_rows = 0;
  if (exchange_ != nullptr) {
    // Expert parallelism: every rank of the group joins the exchanges, rows or not.
    if (kept > 0) {
      rows = ctx.make({kept, d});
      be.moe_permute_forward(u, slots, rows);
    }
    plan = exchange_->plan(expert_counts);
    Buffer local = exchange_->dispatch(ctx, rows, d, plan);
    rows.reset();
    std::vector<int32_t> local_counts(static_cast<size_t>(local_experts_), 0);
    for (int64_t s = 0; s < exchange_->size(); ++s) {
      for (int64_t e = 0; e < local_experts_; ++e) {
        const int64_t c = plan.recv[static_cast<size_t>(s * local_experts_ + e)];
        local_counts[static_cast<size_t>(e)] += static_cast<int32_t>(c);
        local_rows += c;
      }
    }
    counts = ctx.make({local_experts_}, ScalarType::i32);
    be.copy_from_host(local_counts.data(), counts);
    Buffer local_out;
    if (local_rows > 0) {
      local_out = experts_forward(ctx, local, counts, saved);
    }
    expert_out = exchange_->combine(ctx, local_out, d, plan);
    rows = std::move(local);
    if (kept > 0) {
      be.moe_unpermute_forward(expert_out, slots, gates, y);
    } else {
      be.fill(y, 0.0);
    }
  } else if (kept > 0) {
    rows = ctx.make({kept, d});
    be.moe_permute_forward(u, slots, rows);
    expert_out = experts_forward(ctx, rows, counts, saved);
    be.moe_unpermute_forward(expert_out, slots, gates, y);
  } else {
    be.fill(y, 0.0);
  }
  if (s_out_ != nullptr) {
    const int64_t fs = moe_.shared_width(width_);
    Buffer hidden = ctx.make({tokens, fs});
    Buffer pre, gate, up;
    if (shape_.mlp == MlpKind::gelu) {
      pre = ctx.make({tokens, fs});
      be.gemm(u, false, s_in_->value, false, pre);
      be.gelu_forward(pre, hidden);
    } else {
      gate = ctx.make({tokens, fs});
      up = ctx.make({tokens, fs});
      be.gemm(u, false, s_gate_->value, false, gate);
      be.gemm(u, false, s_up_->value, false, up);
      be.swiglu_forward(gate, up, hidden);
    }
    be.gemm(hidden, false, s_out_->value, false, y, 1.0, 1.0);
    if (saved != nullptr) {
      saved->shared_pre = std::move(pre);
      saved->shared_gate = std::move(gate);
      saved->shared_up = std::move(up);
      saved->shared_hidden = std::move(hidden);
    }
  }
  if (saved != nullptr) {
    saved->x = ctx.copy_of(x2);
    saved->rstd = std::move(rstd);
    saved->u = std::move(u);
    saved->logits = std::move(logits);
    saved->probs = std::move(probs);
    saved->indices = std::move(indices);
    saved->gates = std::move(gates);
    saved->counts = std::move(counts);
    saved->slots = std::move(slots);
    saved->rows = std::move(rows);
    saved->expert_out = std::move(expert_out);
    saved->kept_rows = kept;
    saved->plan = std::move(plan);
    saved->local_rows = local_rows;
  }
  return y_buffer;
}

void MoeFfn::backward(const Context& ctx, const TensorView& dy_in, Saved& saved,
                      const TensorView& dx) const {
  Backend& be = ctx.backend;
  const int64_t d = shape_.d_model, tokens = saved.u.dim(0), f = width_;
  const TensorView dy = reshape(dy_in, {tokens, d});
  Buffer du = ctx.zeros({tokens, d});
  Buffer dgates = ctx.zeros(saved.gates.view().shape_vector(), ctx.stats());
  if (saved.kept_rows > 0 || exchange_ != nullptr) {
    // Under expert parallelism the expert gradients travel to the experts'
    // ranks and the rows' gradients back (every rank joins both exchanges).
    Buffer dexpert;
    if (saved.kept_rows > 0) {
      dexpert = ctx.zeros({saved.kept_rows, d});
      be.moe_unpermute_backward(dy, saved.expert_out, saved.slots, saved.gates, dexpert, dgates);
    }
    int64_t r = saved.kept_rows;
    if (exchange_ != nullptr) {
      Buffer local = exchange_->dispatch(ctx, dexpert, d, saved.plan);
      dexpert = std::move(local);
      r = saved.local_rows;
    }
    Buffer drows;
    if (r > 0) {
    Buffer dhidden = ctx.make({r, f});
    be.grouped_gemm(dexpert, false, w_out_->value, true, dhidden, saved.counts);
    be.grouped_gemm(saved.hidden, true, dexpert, false, w_out_->grad, saved.counts, 1.0, 1.0);
    dexpert.reset();
    drows = ctx.make({r, d});
    if (shape_.mlp == MlpKind::gelu) {
      Buffer dpre = ctx.zeros({r, f});
      be.gelu_backward(dhidden, saved.pre, dpre);
      be.grouped_gemm(dpre, false, w_in_->value, true, drows, saved.counts);
      be.grouped_gemm(saved.rows, true, dpre, false, w_in_->grad, saved.counts, 1.0, 1.0);
    } else {
      Buffer dgate = ctx.zeros({r, f});
      Buffer dup = ctx.zeros({r, f});
      be.swiglu_backward(dhidden, saved.gate, saved.up, dgate, dup);
      be.grouped_gemm(dgate, false, w_gate_->value, true, drows, saved.counts);
      be.grouped_gemm(dup, false, w_up_->value, true, drows, saved.counts, 1.0, 1.0);
      be.grouped_gemm(saved.rows, true, dgate, false, w_gate_->grad, saved.counts, 1.0, 1.0);
      be.grouped_gemm(saved.rows, true, dup, false, w_up_->grad, saved.counts, 1.0, 1.0);
    }
    }
    if (exchange_ != nullptr) {
      Buffer back = exchange_->combine(ctx, drows, d, saved.plan);
      drows = std::move(back);
    }
    if (saved.kept_rows > 0) {
      be.moe_permute_backward(drows, saved.slots, du);
    }
  }
  if (s_out_ != nullptr) {
    const int64_t fs = moe_.shared_width(f);
    Buffer dhidden = ctx.make({tokens, fs});
    be.gemm(dy, false, s_out_->value, true, dhidden);
    be.gemm(saved.shared_hidden, true, dy, false, s_out_->grad, 1.0, 1.0);
    if (shape_.mlp == MlpKind::gelu) {
      Buffer dpre = ctx.zeros({tokens, fs});
      be.gelu_backward(dhidden, saved.shared_pre, dpre);
      be.gemm(dpre, false, s_in_->value, true, du, 1.0, 1.0);
      be.gemm(saved.u, true, dpre, false, s_in_->grad, 1.0, 1.0);
    } else {
      Buffer dgate = ctx.zeros({tokens, fs});
      Buffer dup = ctx.zeros({tokens, fs});
      be.swiglu_backward(dhidden, saved.shared_gate, saved.shared_up, dgate, dup);
      be.gemm(dgate, false, s_gate_->value, true, du, 1.0, 1.0);
      be.gemm(dup, false, s_up_->value, true, du, 1.0, 1.0);
      be.gemm(saved.u, true, dgate, false, s_gate_->grad, 1.0, 1.0);
      be.gemm(saved.u, true, dup, false, s_up_->grad, 1.0, 1.0);
    }
  }
  // Router: through the gates, plus the weighted auxiliary and z losses.
  Buffer dlogits = ctx.zeros(saved.logits.view().shape_vector(), ctx.stats());
  be.moe_route_backward(dgates, saved.probs, saved.indices, saved.gates, dlogits,
                        MoeRouteParams{moe_.renormalize});
  if (moe_.aux_loss_coef > 0.0 || moe_.z_loss_coef > 0.0) {
    be.moe_aux_loss_backward(moe_.aux_loss_coef, moe_.z_loss_coef, saved.logits, saved.probs,
                             saved.indices, dlogits);
  }
  // The router GEMMs read dlogits in the data dtype (a bf16 model's logits are fp32).
  Buffer dlogits_data;
  TensorView dl = dlogits.view();
  if (ctx.dtype != ctx.stats()) {
    dlogits_data = ctx.make(saved.logits.view().shape_vector());
    be.convert(dlogits, dlogits_data);
    dl = dlogits_data.view();
  }
  be.gemm(dl, false, router_->value, true, du, 1.0, 1.0);
  be.gemm(saved.u, true, dl, false, router_->grad, 1.0, 1.0);
  be.rmsnorm_backward(du, saved.x, norm_->value, saved.rstd, reshape(dx, {tokens, d}),
                      norm_->grad);
  saved = Saved{};
}

}  // namespace modar::runtime
