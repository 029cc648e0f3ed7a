// `modar sweep`: every candidate the planner evaluates, for notebooks that
// draw isoFLOP curves like the MoD paper's figure 4: budget x architecture x
// (capacity x every) x (K x n) x shape on the isoFLOP curve.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "modar/base/errors.hpp"
#include "modar/base/interrupt.hpp"
#include "modar/base/json.hpp"
#include "modar/base/text.hpp"
#include "modar/layout_search.hpp"
#include "modar/planner.hpp"
#include "planner_internal.hpp"

namespace modar {

int64_t sweep(const SweepRequest& request, const std::function<void(const SweepRow&)>& sink) {
  if (request.budgets_flops.empty()) {
    throw ConfigError(
        "--flops: no budget; allowed: one or more positive FLOP budgets, "
        "comma-separated");
  }
  for (const double budget : request.budgets_flops) {
    detail::check_budget("--flops", budget);
  }
  if (request.archs.empty()) {
    throw ConfigError("--arch: empty; allowed: baseline, mod, dar, mod+dar");
  }
  if (request.gpus < 1) {
    throw ConfigError("--gpus " + std::to_string(request.gpus) + ": must be >= 1");
  }
  if (!(request.grid_step > 1.0) || !(request.grid_half_width > 1.0)) {
    throw ConfigError("grid step / half width: must be > 1");
  }
  for (const std::string& name : request.archs) {
    make_arch(name);  // validates the name
  }
  const LossFit fit = load_fit(request.fit);
  std::optional<DeviceProfile> profile;
  std::optional<TimingModel> timing;  // the profile pre-indexed once for every candidate
  if (request.with_time) {
    profile = load_profile(request.profile);
    timing.emplace(*profile);
  }
  OpList scratch;
  Estimate est;
  Config base = request.base;
  base.device.count = request.gpus;
  base.device.profile = request.profile;
  // MoD is set per architecture; how it samples causally stays the user's.
  const ModConfig routing = base.mod;
  base.mod = ModConfig{};
  base.mod.causal_router = routing.causal_router;
  base.mod.predictor_hidden = routing.predictor_hidden;
  base.dar = DarConfig{};
  base.moe = MoeConfig{};
  validate(base);

  // Expand the architecture knobs (experts: the user's moe.* settings).
  check_experts_used(request.base.moe, request.archs);
  std::vector<ArchSpec> variants;
  for (const std::string& name : request.archs) {
    const bool mod = arch_has_mod(name);
    const bool dar = arch_has_dar(name);
    const std::vector<double> capacities = mod ? request.capacities : std::vector<double>{1.0};
    const std::vector<int64_t> everys = mod ? request.everys : std::vector<int64_t>{0};
    const std::vector<int64_t> blocks = dar ? request.block_layers : std::vector<int64_t>{0};
    const std::vector<int64_t> streams = dar ? request.streams : std::vector<int64_t>{0};
    for (const double c : capacities) {
      for (const int64_t e : everys) {
        for (const int64_t k : blocks) {
          for (const int64_t n : streams) {
            ArchSpec variant =
                make_arch(name, mod ? c : 0.125, mod ? e : 2, dar ? k : 2, dar ? n : 2);
            variant.moe = planned_experts(variant, request.base.moe);
            variants.push_back(variant);
          }
        }
      }
    }
  }

  // Per architecture variant: the config, the prior and the curve centre of
  // every budget, and ONE shape table for all budgets when their windows
  // overlap enough (the enumeration is most of a sweep's work); the curves are
  // then picked from it exactly as from per-budget tables.
  struct VariantPlan {
    Config arch_base;
    EfficiencyPrior prior;
    std::vector<double> centres;  // per budget
    std::vector<ShapeCandidate> shared_table;
    bool shared = false;
  };
  std::vector<ClosedFormOptimum> dense_optima;
  for (const double budget : request.budgets_flops) {
    dense_optima.push_back(closed_form_optimum(fit.params, budget));
  }
  std::vector<VariantPlan> plans;
  plans.reserve(variants.size());
  const auto poll = [&request]() {
    if (request.poll) {
      request.poll();
    }
  };
  for (const ArchSpec& arch : variants) {
    poll();
    VariantPlan plan;
    plan.arch_base = detail::arch_config(base, arch);
    plan.prior = efficiency_prior(plan.arch_base, fit, request.eps_overrides);
    double low = INFINITY, high = 0.0, windows_log_width = 0.0;
    for (size_t b = 0; b < request.budgets_flops.size(); ++b) {
      const double centre = plan.prior.known
                                ? closed_form_optimum(fit.params, request.budgets_flops[b],
                                                      loss_scale(plan.prior, plan.prior.eps))
                                      .n_opt
                                : dense_optima[b].n_opt;
      plan.centres.push_back(centre);
      const detail::NfWindow window =
          detail::canonical_curve_window(centre, request.grid_half_width);
      low = std::min(low, window.low);
      high = std::max(high, window.high);
      windows_log_width += std::log(window.high / window.low);
    }
    plan.shared = request.budgets_flops.size() > 1 && std::log(high / low) <= windows_log_width;
    if (plan.shared) {
      plan.shared_table = enumerate_shapes(plan.arch_base, low, high, request.shapes);
    }
    plans.push_back(std::move(plan));
  }

  int64_t rows = 0;
  for (size_t b = 0; b < request.budgets_flops.size(); ++b) {
    const double budget = request.budgets_flops[b];
    for (size_t v = 0; v < variants.size(); ++v) {
      const ArchSpec& arch = variants[v];
      const VariantPlan& plan = plans[v];
      const Config& arch_base = plan.arch_base;
      const EfficiencyPrior& prior = plan.prior;
      const double centre = plan.centres[b];
      poll();
      const std::vector<ShapeCandidate> curve =
          plan.shared ? detail::canonical_curve_from_table(plan.shared_table, centre,
                                                           request.grid_half_width,
                                                           request.grid_step, request.shapes)
                      : detail::canonical_curve(arch_base, centre, request.grid_half_width,
                                                request.grid_step, request.shapes);
      for (const ShapeCandidate& candidate : curve) {
        throw_if_interrupted("the sweep");  // between candidates, not only between rows
        poll();
        SweepRow row;
        row.budget_flops = budget;
        row.arch = arch.name;
        row.capacity = arch.mod.enabled() ? arch.mod.capacity : 1.0;
        row.every = arch.mod.every;
        row.block_layers = arch.dar.enabled() ? arch.dar.block_layers : 0;
        row.streams = arch.dar.resolved_streams();
        row.experts = arch.moe.experts;
        row.top_k = arch.moe.enabled() ? arch.moe.top_k : 0;
        row.expert_ffn =
            arch.moe.enabled()
                ? arch.moe.resolved_expert_ffn(with_shape(arch_base, candidate.shape).model)
                : 0;
        row.shape = candidate.shape;
        row.params = candidate.params;
        row.forward_flops_per_token = candidate.forward_flops_per_token;
        row.tokens = budget / candidate.train_flops_per_token;
        row.eps = prior.eps;
        row.eps_known = prior.known;
        if (prior.known) {
          row.loss = predicted_loss(fit.params, loss_scale(prior, prior.eps),
                                    candidate.params.flop_active, row.tokens);
        }
        if (profile && request.gpus > 1) {
          // Cluster: the layout search of `optimal --gpus` (planner/layout_search.cpp).
          LayoutSearchOptions options;
          options.gpus = request.gpus;
          options.gpus_per_node = request.gpus_per_node;
          LayoutSearchResult found =
              search_layout(with_shape(arch_base, candidate.shape), *timing, options);
          est = std::move(found.estimate);
          row.has_layout = true;
          row.layout = std::move(found.summary);
          row.parallel = found.config.parallel;
          row.data_parallel = found.config.parallel.data(found.config.device.count);
          row.micro_batch = found.config.train.micro_batch;
          row.recompute = found.config.train.recompute;
        } else if (profile) {
          // The candidate's config was validated by the shape search.
          estimate_into(with_shape(arch_base, candidate.shape), *timing, StepKind::train, scratch,
                        est);
        }
        if (profile) {
          row.has_time = true;
          row.peak_memory_bytes = est.memory.peak;
          row.fits = est.memory.fits;
          row.step_s = est.time.step_s;
          row.tokens_per_s = est.time.tokens_per_s;
          row.train_hours =
              est.time.tokens_per_s > 0 ? row.tokens / est.time.tokens_per_s / 3600.0 : 0;
        }
        sink(row);
        ++rows;
      }
    }
  }
  return rows;
}

std::vector<SweepRow> sweep(const SweepRequest& request) {
  std::vector<SweepRow> rows;
  sweep(request, [&](const SweepRow& row) { rows.push_back(row); });
  return rows;
}

std::string sweep_csv_header() {
  return "budget_flops,arch,capacity,every,block_layers,streams,experts,top_k,expert_ffn,"
         "n_layers,d_model,n_heads,"
         "n_kv_heads,d_head,d_ff,aspect_ratio,params_total,params_non_embedding,"
         "params_flop_active,forward_flops_per_token,tokens,eps,loss,peak_memory_bytes,fits,"
         "step_s,tokens_per_s,train_hours,tensor,sequence_parallel,pipeline,virtual_stages,"
         "data,zero,micro_batch,recompute";
}

std::string to_csv_line(const SweepRow& row) {
  std::string out;
  const auto num = [&](double v) { out += format_number(v) + ","; };
  const auto integer = [&](int64_t v) { out += std::to_string(v) + ","; };
  num(row.budget_flops);
  out += row.arch + ",";
  num(row.capacity);
  integer(row.every);
  integer(row.block_layers);
  integer(row.streams);
  integer(row.experts);  // 0 without experts
  integer(row.top_k);
  integer(row.expert_ffn);
  integer(row.shape.n_layers);
  integer(row.shape.d_model);
  integer(row.shape.n_heads);
  integer(row.shape.n_kv_heads);
  integer(row.shape.d_head);
  integer(row.shape.d_ff);
  num(row.shape.aspect_ratio());
  num(row.params.total);
  num(row.params.non_embedding);
  num(row.params.flop_active);
  num(row.forward_flops_per_token);
  num(row.tokens);
  out += row.eps_known ? format_number(row.eps) + "," : ",";  // empty cell = unknown
  out += row.loss ? format_number(*row.loss) + "," : ",";
  if (row.has_time) {
    num(row.peak_memory_bytes);
    out += row.fits ? "true," : "false,";
    num(row.step_s);
    num(row.tokens_per_s);
    out += format_number(row.train_hours);
  } else {
    out += ",,,,";
  }
  // The layout (gpus > 1; empty cells on one device).
  if (row.has_layout) {
    for (const int64_t v : {row.parallel.tensor, int64_t{-1}, row.parallel.pipeline,
                            row.parallel.virtual_stages, row.data_parallel, row.parallel.zero,
                            row.micro_batch}) {
      out += ',';
      out += v < 0 ? (row.parallel.sequence_parallel ? "true" : "false") : std::to_string(v);
    }
    out += ',';
    out += to_string(row.recompute);
  } else {
    out += ",,,,,,,,";
  }
  return out;
}

std::string to_json_line(const SweepRow& row) {
  JsonWriter json(0);
  json.begin_object();
  json.field("budget_flops", row.budget_flops).field("arch", row.arch);
  json.field("capacity", row.capacity).field("every", row.every);
  json.field("block_layers", row.block_layers).field("streams", row.streams);
  json.field("experts", row.experts).field("top_k", row.top_k);
  json.field("expert_ffn", row.expert_ffn);
  json.field("n_layers", row.shape.n_layers).field("d_model", row.shape.d_model);
  json.field("n_heads", row.shape.n_heads).field("n_kv_heads", row.shape.n_kv_heads);
  json.field("d_head", row.shape.d_head).field("d_ff", row.shape.d_ff);
  json.field("aspect_ratio", row.shape.aspect_ratio());
  json.field("params_total", row.params.total);
  json.field("params_non_embedding", row.params.non_embedding);
  json.field("params_flop_active", row.params.flop_active);
  json.field("forward_flops_per_token", row.forward_flops_per_token);
  json.field("tokens", row.tokens);
  json_optional(json, "eps", row.eps_known ? std::optional<double>(row.eps) : std::nullopt);
  json_optional(json, "loss", row.loss);
  if (row.has_time) {
    json.field("peak_memory_bytes", row.peak_memory_bytes).field("fits", row.fits);
    json.field("step_s", row.step_s).field("tokens_per_s", row.tokens_per_s);
    json.field("train_hours", row.train_hours);
  }
  if (row.has_layout) {
    json.field("layout", row.layout);
    json.key("parallel").begin_object();
    json.field("tensor", row.parallel.tensor);
    json.field("sequence_parallel", row.parallel.sequence_parallel);
    json.field("pipeline", row.parallel.pipeline);
    json.field("virtual_stages", row.parallel.virtual_stages);
    json.field("data", row.data_parallel).field("zero", row.parallel.zero);
    json.field("micro_batch", row.micro_batch);
    json.field("recompute", to_string(row.recompute));
    json.end_object();
  }
  json.end_object();
  return json.str();
}

}  // namespace modar
