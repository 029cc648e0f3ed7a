// How far to trust a recommendation of `modar optimal`: its numbers against
// the optimal baseline, the eps ranges, the flags (extrapolation, a prior used
// outside where it was measured, memory deciding) and the notes.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "modar/base/text.hpp"
#include "modar/layout_search.hpp"
#include "optimal_internal.hpp"

namespace modar::detail {

Recommendation make_recommendation(const std::string& arch, const std::string& role,
                                   const std::string& selection, ArchSpace& space, Point& point,
                                   const EfficiencyPrior& prior) {
  Evaluator& evaluator = space.evaluator();
  Recommendation rec;
  rec.arch = arch;
  rec.role = role;
  rec.selection = selection;
  rec.config = with_shape(space.arch_base(), point.candidate.shape);
  rec.shape = point.candidate.shape;
  const Estimate& est = evaluator.cost_of(space.arch_base(), point);
  if (point.layout) {
    rec.config = *point.layout;  // with the chosen layout on a cluster
  }
  rec.params = est.params;
  rec.flops = est.flops;
  rec.tokens = evaluator.tokens_for(space.arch_base(), point);
  rec.train_flops_total = point.candidate.train_flops_per_token * rec.tokens;
  const double hardware_ratio =
      est.flops.train_per_step > 0 ? est.flops.hardware_per_step / est.flops.train_per_step : 1.0;
  rec.hardware_flops_total = rec.train_flops_total * hardware_ratio;
  if (prior.known) {
    rec.loss = space.loss(point, prior.eps);
    rec.loss_range = ValueRange{*rec.loss, space.loss(point, prior.eps_low),
                                space.loss(point, prior.eps_high)};
  }
  rec.prior = prior;
  rec.eps_range = prior.known ? ValueRange{prior.eps, prior.eps_low, prior.eps_high}
                              : ValueRange{1.0, std::nullopt, std::nullopt};
  rec.memory = est.memory;
  rec.time = est.time;
  rec.train_hours = est.time.tokens_per_s > 0 ? rec.tokens / est.time.tokens_per_s / 3600.0 : 0;
  return rec;
}

void set_ratios(Recommendation& rec, const Recommendation& baseline) {
  const auto ratio = [](double a, double b) { return b != 0 ? a / b : 0.0; };
  rec.ratio_params_total = ratio(rec.params.total, baseline.params.total);
  rec.ratio_params_flop_active = ratio(rec.params.flop_active, baseline.params.flop_active);
  rec.ratio_forward_flops = ratio(rec.flops.forward_per_token, baseline.flops.forward_per_token);
  rec.ratio_step_time = ratio(rec.time.step_s, baseline.time.step_s);
  rec.ratio_tokens = ratio(rec.tokens, baseline.tokens);
  rec.ratio_train_hours = ratio(rec.train_hours, baseline.train_hours);
}

// Where the rule lands at both ends of the prior's range: N_f, total
// parameters, tokens, step time relative to the baseline's.
void set_ranges(Recommendation& rec, ArchSpace& space, int low_index, int high_index,
                double baseline_step_s, double baseline_forward_flops) {
  const auto value_at = [&](int index, auto get) -> std::optional<double> {
    if (index < 0) {
      return std::nullopt;
    }
    return get(space.points()[static_cast<size_t>(index)]);
  };
  // low / high: the smaller and the larger of the values at the two ends
  // (and this one); null where the eps_high end has no answer (no shape
  // reaches parity there), since the range is then open on that side.
  const auto fill = [&](ValueRange& range, double value, auto get) {
    range.value = value;
    const std::optional<double> at_low = value_at(low_index, get);
    const std::optional<double> at_high = value_at(high_index, get);
    if (at_low && at_high) {
      range.low = std::min({value, *at_low, *at_high});
      range.high = std::max({value, *at_low, *at_high});
    } else {
      range.low = at_low ? std::optional<double>(std::min(value, *at_low)) : std::nullopt;
      range.high = at_high ? std::optional<double>(std::max(value, *at_high)) : std::nullopt;
    }
  };
  fill(rec.n_flop_active_range, rec.params.flop_active,
       [](Point& p) { return p.candidate.params.flop_active; });
  fill(rec.params_total_range, rec.params.total,
       [](Point& p) { return p.candidate.params.total; });
  fill(rec.tokens_range, rec.tokens,
       [&](Point& p) { return space.evaluator().tokens_for(space.arch_base(), p); });
  fill(rec.forward_flops_ratio_range, rec.ratio_forward_flops, [&](Point& p) {
    return p.candidate.forward_flops_per_token / baseline_forward_flops;
  });
  fill(rec.step_time_ratio_range, rec.ratio_step_time, [&](Point& p) {
    return baseline_step_s > 0
               ? space.evaluator().cost_of(space.arch_base(), p).time.step_s / baseline_step_s
               : 0.0;
  });
}

void add_flag(Recommendation& rec, const std::string& code, const std::string& message) {
  rec.flags.push_back({code, message});
}

// Flags that depend only on the recommendation and its prior.
void flag_trust(Recommendation& rec) {
  const EfficiencyPrior& prior = rec.prior;
  const double tokens_per_param = rec.tokens / rec.params.flop_active;
  if (tokens_per_param < kFitTokensPerParamMin || tokens_per_param > kFitTokensPerParamMax) {
    add_flag(rec, "tokens_per_param_outside_fit",
             format_fixed(tokens_per_param, 0) + " tokens per FLOP-active parameter, outside the " +
                 format_number(kFitTokensPerParamMin) + ".." +
                 format_number(kFitTokensPerParamMax) +
                 " band the fits were made on: the loss law is extrapolated");
  }
  if (prior.known && prior.points == 1) {
    add_flag(rec, "prior_single_point",
             "eps " + format_fixed(prior.eps, 4) + " rests on a single published point; range " +
                 format_fixed(prior.eps_low, 4) + ".." + format_fixed(prior.eps_high, 4));
  }
  if (prior.known && prior.measured_size_max > 0) {
    const double size = prior_size(prior, rec.params);
    const std::string measure =
        prior.size_measure == "non_embedding" ? "non-vocab parameters" : "parameters";
    if (size < prior.measured_size_min * (1 - 1e-9) || size > prior.measured_size_max * (1 + 1e-9)) {
      add_flag(rec, "prior_outside_measured_sizes",
               format_sci(size, 2) + " " + measure + ", outside the " + format_sci(prior.measured_size_min, 1) +
                   (prior.measured_size_max > prior.measured_size_min
                        ? ".." + format_sci(prior.measured_size_max, 1)
                        : std::string()) +
                   " the prior was measured at");
    }
  }
  if (prior.known && prior.measured_budget_max > 0 &&
      (rec.train_flops_total < prior.measured_budget_min * (1 - 1e-9) ||
       rec.train_flops_total > prior.measured_budget_max * (1 + 1e-9))) {
    add_flag(rec, "prior_outside_measured_budgets",
             "training FLOPs " + format_sci(rec.train_flops_total, 1) + ", outside the " +
                 format_sci(prior.measured_budget_min, 1) + ".." + format_sci(prior.measured_budget_max, 1) +
                 " budgets the prior was measured at");
  }
  if (prior.known && prior.measured_tokens_per_param > 0 &&
      (tokens_per_param > prior.measured_tokens_per_param * kPriorTokensPerParamFactor ||
       tokens_per_param < prior.measured_tokens_per_param / kPriorTokensPerParamFactor)) {
    add_flag(rec, "prior_outside_measured_tokens_per_param",
             format_fixed(tokens_per_param, 0) + " tokens per parameter; the prior was measured at " +
                 format_number(prior.measured_tokens_per_param));
  }
  if (rec.time.extrapolated) {
    add_flag(rec, "op_time_extrapolated",
             std::to_string(rec.time.ops_extrapolated) +
                 " op records timed outside the profile's measured grid (fitted efficiency x "
                 "roofline)");
  }
  if (rec.time.mfu_beyond_published) {
    add_flag(rec, "mfu_beyond_published",
             "MFU " + format_fixed(100.0 * rec.time.mfu_as_published, 1) + "% (" +
                 rec.time.published_mfu_attention_flops +
                 " attention, as the published figure counts; MFU " +
                 format_fixed(100.0 * rec.time.mfu, 1) +
                 "% as counted here) is above the best published for this device class (" +
                 format_fixed(100.0 * rec.time.published_mfu, 1) +
                 "%: " + rec.time.published_mfu_source + "): the predicted speed is optimistic");
  }
  if (!rec.memory.fits) {
    add_flag(rec, "no_fit",
             "peak " + format_fixed(rec.memory.peak / (1024.0 * 1024.0 * 1024.0), 1) + " GiB > " +
                 format_fixed(rec.memory.capacity / (1024.0 * 1024.0 * 1024.0), 1) +
                 " GiB device memory: no shape of the search space fits; not recommended");
  }
}

std::string space_text(const ShapeSearchOptions& o) {
  return std::to_string(o.min_layers) + "-" + std::to_string(o.max_layers) +
         " layers, d_model a multiple of " + std::to_string(o.d_model_multiple) + " up to " +
         std::to_string(o.max_d_model) + ", aspect d/L in [" + format_number(o.aspect_min) +
         ", " + format_number(o.aspect_max) + "]";
}

// Loss-optimal (scaling law alone) vs the recommended model that fits: say so,
// and which constraint binds, when they differ (never shrink silently).
void append_fit_notes(OptimalResult& result, const LossFitParams& law, double centre_flops) {
  const OptimalSettings& settings = result.settings;
  if (!settings.flops || result.recommendations.empty()) {
    return;
  }
  const std::string gpus = std::to_string(settings.run.gpus) + " GPU(s)";
  const ClosedFormOptimum dense = closed_form_optimum(law, centre_flops);
  for (const Recommendation& rec : result.recommendations) {
    if (rec.arch != "baseline" || rec.role != "isoflop_optimal") {
      continue;
    }
    const double ratio = rec.params.flop_active / dense.n_opt;
    std::string note = "loss-optimal baseline (closed form, scaling law alone): N_f " +
                       format_sci(dense.n_opt, 2) + ", D " + format_sci(dense.tokens_opt, 2) + "; recommended: N_f " +
                       format_sci(rec.params.flop_active, 2) + " (" + format_fixed(ratio, 2) + "x)";
    if (!rec.memory.fits) {
      note += "; it does NOT fit " + gpus + ": device memory binds (see the advice above)";
    } else if (ratio < 0.8) {
      note += ": the loss-optimal model does not fit " + gpus +
              " (device memory binds); this is the best model that fits";
    } else {
      note += ": fits " + gpus;
      if (settings.run.gpus > 1) {
        note += " with layout " + layout_summary(rec.config);
      }
    }
    result.notes.push_back(note);
  }
}

std::string memory_text(const PlannerRun& run) {
  const double gib = run.profile.ceilings.memory_bytes / (1024.0 * 1024.0 * 1024.0);
  if (run.gpus == 1) {
    return "device memory (" + format_fixed(gib, 1) + " GiB, micro-batch " +
           std::to_string(run.base.train.micro_batch) + ", recompute " +
           to_string(run.base.train.recompute) + ")";
  }
  return "device memory (" + format_fixed(gib, 1) + " GiB per GPU; micro-batch " +
         (run.micro_batch_fixed ? std::to_string(run.base.train.micro_batch)
                                : std::string("1, 2 or 4")) +
         ", recompute " +
         (run.recompute_fixed ? std::string(to_string(run.base.train.recompute))
                              : std::string("the least that fits")) +
         " per layout, global batch " + std::to_string(run.global_batch) + " sequences)";
}

}  // namespace modar::detail
