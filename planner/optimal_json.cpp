// `modar optimal --json`: the result of optimal() as one JSON document (the
// document Python's OptimalResult.to_dict() holds).
#include "modar/base/json.hpp"
#include "modar/base/text.hpp"
#include "modar/estimate_json.hpp"
#include "modar/layout_search.hpp"
#include "modar/planner.hpp"
#include "planner_internal.hpp"

namespace modar {

void detail::write_planned_parallel_json(JsonWriter& json, const Config& layout) {
  json.key("parallel").begin_object();
  write_parallel_layout_json(json, parallel_layout_json(layout));
  json.field("global_batch", layout.train.global_batch);
  json.field("recompute", to_string(layout.train.recompute));
  json.end_object();
}

namespace {

void json_range(JsonWriter& json, const char* key, const ValueRange& range) {
  json.key(key).begin_object();
  json.field("value", range.value);
  json_optional(json, "low", range.low);
  json_optional(json, "high", range.high);
  json.end_object();
}

// One element of "recommendations".
void write_recommendation_json(JsonWriter& json, const Recommendation& rec,
                               const OptimalSettings& settings) {
  json.begin_object();
  json.field("arch", rec.arch).field("role", rec.role).field("selection", rec.selection);
  json.key("shape").begin_object();
  json.field("n_layers", rec.shape.n_layers).field("d_model", rec.shape.d_model);
  json.field("n_heads", rec.shape.n_heads).field("n_kv_heads", rec.shape.n_kv_heads);
  json.field("d_head", rec.shape.d_head).field("d_ff", rec.shape.d_ff);
  json.field("aspect_ratio", rec.shape.aspect_ratio());
  json.end_object();
  json.field("layout", layout_summary(rec.config));
  // The whole configuration ({dotted key: value}): what `modar export` reads.
  json.key("config").begin_object();
  for (const auto& [key, literal] : config_values(rec.config)) {
    json.key(key).raw(literal);
  }
  json.end_object();
  detail::write_planned_parallel_json(json, rec.config);
  json.key("mod").begin_object();
  json.field("capacity", rec.config.mod.enabled() ? rec.config.mod.capacity : 1.0);
  json.field("every", rec.config.mod.every);
  json.end_object();
  json.key("moe").begin_object();
  json.field("experts", rec.config.moe.experts).field("top_k", rec.config.moe.top_k);
  json.field("expert_ffn", rec.config.moe.enabled()
                               ? rec.config.moe.resolved_expert_ffn(rec.config.model)
                               : int64_t{0});
  json.field("shared_experts", rec.config.moe.shared_experts);
  json.end_object();
  json.key("dar").begin_object();
  json.field("variant", to_string(rec.config.dar.variant));
  json.field("block_layers", rec.config.dar.enabled() ? rec.config.dar.block_layers : 0);
  json.field("streams", rec.config.dar.resolved_streams());
  json.end_object();
  write_params_json(json, rec.params);
  json.field("tokens", rec.tokens);
  json.field("tokens_per_param", rec.tokens / rec.params.flop_active);
  json.key("flops").begin_object();
  json.field("forward_per_token", rec.flops.forward_per_token);
  json.field("train_per_token", rec.flops.train_per_token);
  json.field("train_total", rec.train_flops_total);
  json.field("hardware_total", rec.hardware_flops_total);
  json.end_object();
  json_optional(json, "loss", rec.loss);
  json_optional(json, "eps", rec.prior.known ? std::optional<double>(rec.prior.eps) : std::nullopt);
  json.key("memory").begin_object();
  json.field("peak_bytes", rec.memory.peak).field("fits", rec.memory.fits);
  write_memory_parts_json(json, rec.memory, "_bytes");
  json.end_object();
  json.key("time").begin_object();
  write_time_rates_json(json, rec.time);
  json.field("train_hours", rec.train_hours);
  json.field("gpu_hours", rec.train_hours * double(settings.run.gpus));
  json.field("days", rec.train_hours / 24.0);
  json.field("extrapolated", rec.time.extrapolated);
  json.end_object();
  json.key("ratios_to_baseline").begin_object();
  json.field("params_total", rec.ratio_params_total);
  json.field("params_flop_active", rec.ratio_params_flop_active);
  json.field("forward_flops_per_token", rec.ratio_forward_flops);
  json.field("step_time", rec.ratio_step_time);
  json.field("tokens", rec.ratio_tokens);
  json.field("train_hours", rec.ratio_train_hours);
  json_optional(json, "curve_forward_flops_per_token",
                rec.curve_forward_flops ? std::optional<double>(rec.ratio_curve_forward_flops)
                                        : std::nullopt);
  json.end_object();
  json_optional(json, "curve_forward_flops_per_token", rec.curve_forward_flops);
  json.key("ranges").begin_object();
  json_range(json, "eps", rec.eps_range);
  if (rec.loss_range) {
    json_range(json, "loss", *rec.loss_range);
  } else {
    json.key("loss").null();
  }
  json_range(json, "n_flop_active", rec.n_flop_active_range);
  json_range(json, "params_total", rec.params_total_range);
  json_range(json, "tokens", rec.tokens_range);
  json_range(json, "step_time_ratio", rec.step_time_ratio_range);
  json_range(json, "forward_flops_ratio", rec.forward_flops_ratio_range);
  json.end_object();
  json.key("flags").begin_array();
  for (const PlannerFlag& flag : rec.flags) {
    json.begin_object().field("code", flag.code).field("message", flag.message).end_object();
  }
  json.end_array();
  json.end_object();
}

}  // namespace

std::string to_json(const OptimalResult& result) {
  const OptimalSettings& settings = result.settings;
  const PlannerRun& run = settings.run;
  JsonWriter json;
  json.begin_object();
  json.key("budget").begin_object();
  json_optional(json, "train_flops", settings.flops);
  json_optional(json, "gpu_hours", settings.gpu_hours);
  json_optional(json, "days", settings.days);
  json.field("gpus", run.gpus);
  json.field("profile", result.profile_name);
  json.end_object();
  json.key("fit").begin_object();
  json.field("name", result.fit.name).field("source", result.fit.source);
  json.field("E", result.fit.params.E).field("A", result.fit.params.A);
  json.field("B", result.fit.params.B).field("alpha", result.fit.params.alpha);
  json.field("beta", result.fit.params.beta);
  json.end_object();
  json.field("loss_model",
             "L = E + eps * A / N_f^alpha + B / D^beta (MoD: E + eps * (A / N_f^alpha + "
             "B / D^beta); experts: E + A / N_f^alpha + eps * B / D^beta; x 1.0025 with "
             "mod.causal_router = aux_loss); N_f = FLOP-active parameters; D = tokens; C = "
             "F_train_per_token * D = 3 F_fwd D");
  json.key("eps").begin_object();
  for (const EfficiencyPrior& prior : result.priors) {
    if (prior.known) {
      json.field(prior.key, prior.eps);
    } else {
      json.key(prior.key).null();
    }
  }
  json.end_object();
  json.key("eps_range").begin_object();
  for (const EfficiencyPrior& prior : result.priors) {
    if (prior.known) {
      json_range(json, prior.key.c_str(), ValueRange{prior.eps, prior.eps_low, prior.eps_high});
    } else {
      json.key(prior.key).null();
    }
  }
  json.end_object();
  json.key("priors").begin_array();
  for (const EfficiencyPrior& prior : result.priors) {
    json.begin_object();
    json.field("arch", prior.key).field("known", prior.known);
    json_optional(json, "eps", prior.known ? std::optional<double>(prior.eps) : std::nullopt);
    json_optional(json, "eps_low",
                  prior.known ? std::optional<double>(prior.eps_low) : std::nullopt);
    json_optional(json, "eps_high",
                  prior.known ? std::optional<double>(prior.eps_high) : std::nullopt);
    json.field("points", prior.points);
    json.key("measured").begin_object();
    json.field("size_measure", prior.size_measure);
    json.field("size_min", prior.measured_size_min).field("size_max", prior.measured_size_max);
    json.field("budget_min", prior.measured_budget_min);
    json.field("budget_max", prior.measured_budget_max);
    json.field("tokens_per_param", prior.measured_tokens_per_param);
    json.end_object();
    json.field("source", prior.source).field("derivation", prior.derivation);
    json.field("interval", prior.interval);
    json.end_object();
  }
  json.end_array();
  json.field("conventions", result.conventions);
  json.key("shape_search").begin_object();
  json.field("aspect_min", run.shapes.aspect_min);
  json.field("aspect_max", run.shapes.aspect_max);
  json.field("d_model_multiple", run.shapes.d_model_multiple);
  json.field("gqa_group", run.shapes.gqa_group);
  json.field("seq_len", run.base.model.seq_len);
  json.field("micro_batch", run.base.train.micro_batch);
  json.field("recompute", to_string(run.base.train.recompute));
  json.field("global_batch", run.global_batch);
  json.field("micro_batch_fixed", run.micro_batch_fixed);
  json.field("recompute_fixed", run.recompute_fixed);
  json.field("max_layers", run.shapes.max_layers);
  json.field("max_d_model", run.shapes.max_d_model);
  json.field("loss_tie_relative", kLossTieRelative);
  json.key("fit_tokens_per_param").begin_array();
  json.value(kFitTokensPerParamMin).value(kFitTokensPerParamMax);
  json.end_array();
  json.end_object();
  json.field("candidates_evaluated", result.candidates_evaluated);
  json.field("cost_evaluations", result.cost_evaluations);
  json.key("recommendations").begin_array();
  for (const Recommendation& rec : result.recommendations) {
    write_recommendation_json(json, rec, settings);
  }
  json.end_array();
  json.key("same_shape").begin_array();
  for (const SameShapeComparison& same : result.same_shape) {
    json.begin_object();
    json.field("arch", same.arch);
    json.field("n_layers", same.shape.n_layers).field("d_model", same.shape.d_model);
    json.field("tokens", same.tokens);
    if (same.loss) {
      json_range(json, "loss", *same.loss);
    } else {
      json.key("loss").null();
    }
    json.field("baseline_loss", same.baseline_loss);
    json.field("step_time_ratio", same.ratio_step_time);
    json.field("forward_flops_ratio", same.ratio_forward_flops);
    json.field("fits", same.fits);
    json.end_object();
  }
  json.end_array();
  json.field("notes", result.notes);
  json.end_object();
  return json.str();
}

}  // namespace modar
