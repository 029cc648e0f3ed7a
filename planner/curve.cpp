#include <algorithm>
#include <cmath>

#include "modar/base/errors.hpp"
#include "modar/base/text.hpp"
#include "planner_internal.hpp"

namespace modar::detail {

void check_budget(const char* flag, const std::optional<double>& value) {
  if (!value) {
    return;
  }
  if (!std::isfinite(*value) || *value <= 0) {
    throw ConfigError(std::string(flag) + " " + format_number(*value) +
                      ": must be a positive finite number");
  }
}

Config arch_config(const Config& base, const ArchSpec& arch) {
  Config config = base;
  config.mod = arch.mod;
  if (arch.mod.enabled()) {
    // How the routed model samples causally is the user's (mod.causal_router,
    // mod.predictor_hidden): it changes the step (the predictor's MLP) and the
    // loss (the aux-loss router's penalty).
    config.mod.causal_router = base.mod.causal_router;
    config.mod.predictor_hidden = base.mod.predictor_hidden;
  }
  config.dar = arch.dar;
  config.moe = arch.moe;
  return config;
}

NfWindow canonical_curve_window(double center_n_f, double half_width) {
  const double margin = 1.1;
  return {center_n_f / (half_width * margin), center_n_f * half_width * margin};
}

std::vector<ShapeCandidate> canonical_curve(const Config& arch_base, double center_n_f,
                                            double half_width, double step,
                                            const ShapeSearchOptions& options) {
  const NfWindow window = canonical_curve_window(center_n_f, half_width);
  return canonical_curve_from_table(enumerate_shapes(arch_base, window.low, window.high, options),
                                    center_n_f, half_width, step, options);
}

std::vector<ShapeCandidate> canonical_curve_from_table(const std::vector<ShapeCandidate>& all,
                                                       double center_n_f, double half_width,
                                                       double step,
                                                       const ShapeSearchOptions& options) {
  // The shapes enumerate_shapes(window) returns: N_f in [low, high] (N_f
  // grows with width and depth), in the same sorted order.
  const NfWindow window = canonical_curve_window(center_n_f, half_width);
  std::vector<ShapeCandidate> table;
  for (const ShapeCandidate& candidate : all) {
    if (candidate.params.flop_active >= window.low && candidate.params.flop_active <= window.high) {
      table.push_back(candidate);
    }
  }
  std::vector<ShapeCandidate> curve;
  const double log_step = std::log(step);
  const int64_t half_points = static_cast<int64_t>(std::ceil(std::log(half_width) / log_step));
  for (int64_t i = -half_points; i <= half_points; ++i) {
    const double target = center_n_f * std::exp(double(i) * log_step);
    const ShapeCandidate* chosen = closest_in_table(table, target, options.depth_tolerance);
    if (chosen == nullptr) {
      continue;
    }
    const bool duplicate = std::any_of(curve.begin(), curve.end(), [&](const ShapeCandidate& c) {
      return c.shape.n_layers == chosen->shape.n_layers && c.shape.d_model == chosen->shape.d_model;
    });
    if (!duplicate) {
      curve.push_back(*chosen);
    }
  }
  std::sort(curve.begin(), curve.end(), [](const ShapeCandidate& l, const ShapeCandidate& r) {
    return l.params.flop_active < r.params.flop_active;
  });
  return curve;
}

double smallest_shape_n_f(const Config& arch_base, const ShapeSearchOptions& options) {
  int64_t layers = options.min_layers;
  if (arch_base.dar.enabled()) {
    layers = std::max(layers, arch_base.dar.block_layers);
  }
  if (arch_base.mod.enabled()) {
    layers = std::max(layers, arch_base.mod.every);
  }
  const int64_t step = options.d_model_multiple;
  // (aspect x layers clamped before the integer cast: --aspect-min 1e20 must not overflow)
  const double d_cap = static_cast<double>(options.max_d_model + step);
  const int64_t d_model = std::max<int64_t>(
      step, ((static_cast<int64_t>(std::ceil(std::min(options.aspect_min * double(layers), d_cap))) +
              step - 1) /
             step) *
                step);
  return count_params(with_shape(arch_base, make_shape(layers, d_model, arch_base.model, options)))
      .flop_active;
}

double largest_shape_n_f(const Config& arch_base, const ShapeSearchOptions& options) {
  const int64_t layers = options.max_layers;
  const int64_t step = options.d_model_multiple;
  const double d_cap = static_cast<double>(options.max_d_model + step);  // no int64 overflow
  const int64_t d_model = std::max<int64_t>(
      step, std::min<int64_t>(
                options.max_d_model,
                (static_cast<int64_t>(std::min(options.aspect_max * double(layers), d_cap)) / step) *
                    step));
  return count_params(with_shape(arch_base, make_shape(layers, d_model, arch_base.model, options)))
      .flop_active;
}

double tokens_per_step(const Config& config) {
  const int64_t sequences = config.train.global_batch > 0
                                ? config.train.global_batch
                                : config.train.micro_batch * config.device.count;
  return double(sequences) * double(config.model.seq_len);
}

}  // namespace modar::detail
