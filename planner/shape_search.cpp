// Shape search: concrete (n_layers, d_model, heads, d_ff) shapes for a target
// number of FLOP-active parameters.  N_f of each shape comes from
// count_params (for MoD it depends on capacity and routing frequency, so the
// actual count is used, never a formula of our own).
//
// Rules (docs/planner.md): d_model a multiple of 128; d_head 64 below d_model
// 2048, else 128; KV heads from the GQA group; d_ff the MLP kind's default;
// aspect ratio d_model / n_layers within [aspect_min, aspect_max].  Among
// shapes equally close to the target (within depth_tolerance) the deepest
// wins: the MoD paper found adding depth better than adding width.
#include <algorithm>
#include <cmath>

#include "modar/base/errors.hpp"
#include "modar/base/interrupt.hpp"
#include "modar/base/text.hpp"
#include "modar/planner.hpp"

namespace modar {

namespace {

// Bounds of the search space a request may set: the shape's d_model and
// depth stay where the config validator accepts a model (d_model <= 2^24).
constexpr int64_t kMaxSearchDModel = int64_t{1} << 24;
constexpr int64_t kMaxSearchLayers = 1 << 16;

int64_t round_up(int64_t value, int64_t multiple) {
  return ((value + multiple - 1) / multiple) * multiple;
}

}  // namespace

void check_shape_search_options(const ShapeSearchOptions& o) {
  if (!std::isfinite(o.aspect_min) || !(o.aspect_min > 0)) {
    throw ConfigError("aspect_min = " + format_number(o.aspect_min) +
                      ": must be a finite number > 0 (d_model / n_layers)");
  }
  if (!std::isfinite(o.aspect_max) || !(o.aspect_max >= o.aspect_min)) {
    throw ConfigError("aspect_max = " + format_number(o.aspect_max) +
                      ": must be a finite number >= aspect_min = " + format_number(o.aspect_min));
  }
  if (o.d_model_multiple < 64 || o.d_model_multiple % 64 != 0 || o.d_model_multiple > o.max_d_model) {
    throw ConfigError("d_model_multiple = " + std::to_string(o.d_model_multiple) +
                      ": must be a positive multiple of 64, at most max_d_model = " +
                      std::to_string(o.max_d_model));
  }
  if (o.max_d_model > kMaxSearchDModel) {
    throw ConfigError("max_d_model = " + std::to_string(o.max_d_model) + ": must be <= " +
                      std::to_string(kMaxSearchDModel));
  }
  if (o.min_layers < 1 || o.max_layers < o.min_layers || o.max_layers > kMaxSearchLayers) {
    throw ConfigError("layers [min_layers, max_layers] = [" + std::to_string(o.min_layers) + ", " +
                      std::to_string(o.max_layers) + "]: need 1 <= min_layers <= max_layers <= " +
                      std::to_string(kMaxSearchLayers));
  }
  if (o.gqa_group < 1 || o.gqa_group > kMaxSearchDModel) {
    throw ConfigError("gqa_group = " + std::to_string(o.gqa_group) +
                      ": must be an integer in [1, " + std::to_string(kMaxSearchDModel) +
                      "] (query heads per KV head)");
  }
  if (!std::isfinite(o.depth_tolerance) || o.depth_tolerance < 0 || o.depth_tolerance > 1) {
    throw ConfigError("depth_tolerance = " + format_number(o.depth_tolerance) +
                      ": must be in [0, 1]");
  }
}

Shape make_shape(int64_t n_layers, int64_t d_model, const ModelConfig& base,
                 const ShapeSearchOptions& options) {
  Shape shape;
  shape.n_layers = n_layers;
  shape.d_model = d_model;
  shape.d_head = d_model < 2048 ? 64 : 128;
  shape.n_heads = d_model / shape.d_head;
  // Largest divisor of n_heads not above n_heads / gqa_group.
  int64_t kv = std::max<int64_t>(1, shape.n_heads / options.gqa_group);
  while (shape.n_heads % kv != 0) {
    --kv;
  }
  shape.n_kv_heads = kv;
  ModelConfig model = base;
  model.d_model = d_model;
  model.d_ff = 0;
  shape.d_ff = model.resolved_d_ff();
  return shape;
}

Config with_shape(const Config& base, const Shape& shape) {
  Config config = base;
  config.model.n_layers = shape.n_layers;
  config.model.d_model = shape.d_model;
  config.model.n_heads = shape.n_heads;
  config.model.n_kv_heads = shape.n_kv_heads;
  config.model.d_head = shape.d_head;
  config.model.d_ff = shape.d_ff;
  return config;
}

std::vector<ShapeCandidate> enumerate_shapes(const Config& base, double n_f_min, double n_f_max,
                                             const ShapeSearchOptions& options) {
  check_shape_search_options(options);
  std::vector<ShapeCandidate> table;
  const int64_t step = options.d_model_multiple;
  const auto evaluate = [&](int64_t layers, int64_t d_model) {
    ShapeCandidate candidate;
    candidate.shape = make_shape(layers, d_model, base.model, options);
    const Config config = with_shape(base, candidate.shape);
    const ParamAndFlopCounts counts = count_params_and_flops(config);
    candidate.params = counts.params;
    candidate.forward_flops_per_token = counts.flops.forward_per_token;
    candidate.train_flops_per_token = counts.flops.train_per_token;
    return candidate;
  };
  // A DAR block needs K layers and MoD routing needs at least `every` layers.
  int64_t first_layers = options.min_layers;
  if (base.dar.enabled()) {
    first_layers = std::max(first_layers, base.dar.block_layers);
  }
  if (base.mod.enabled()) {
    first_layers = std::max(first_layers, base.mod.every);
  }
  // Aspect products are clamped to the d_model range before the integer cast
  // (--aspect-max 1e20 would otherwise overflow int64_t: undefined behaviour).
  const double d_cap = static_cast<double>(options.max_d_model + step);
  for (int64_t layers = first_layers; layers <= options.max_layers; ++layers) {
    throw_if_interrupted("the shape search");
    const double layers_d = static_cast<double>(layers);
    const int64_t d_low = std::max(
        step, round_up(static_cast<int64_t>(std::ceil(std::min(options.aspect_min * layers_d, d_cap))),
                       step));
    const int64_t d_high = std::min(
        options.max_d_model,
        (static_cast<int64_t>(std::floor(std::min(options.aspect_max * layers_d, d_cap))) / step) *
            step);
    if (d_high < d_low) {
      continue;
    }
    // N_f grows with d_model at fixed depth: bisect for the first d in range.
    int64_t lo = d_low / step;
    int64_t hi = d_high / step;
    if (evaluate(layers, hi * step).params.flop_active < n_f_min) {
      continue;
    }
    ShapeCandidate first = evaluate(layers, lo * step);
    if (first.params.flop_active > n_f_max) {
      // The narrowest allowed shape at this depth is already too big, and the
      // narrowest shape only grows with depth: no deeper shape can fit.
      break;
    }
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (evaluate(layers, mid * step).params.flop_active < n_f_min) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    for (int64_t units = lo; units * step <= d_high; ++units) {
      ShapeCandidate candidate = evaluate(layers, units * step);
      if (candidate.params.flop_active > n_f_max) {
        break;
      }
      table.push_back(candidate);
    }
  }
  std::sort(table.begin(), table.end(), [](const ShapeCandidate& l, const ShapeCandidate& r) {
    return l.params.flop_active < r.params.flop_active;
  });
  return table;
}

const ShapeCandidate* closest_in_table(const std::vector<ShapeCandidate>& table, double target_n_f,
                                       double depth_tolerance) {
  if (table.empty()) {
    return nullptr;
  }
  const auto by_n_f = [](const ShapeCandidate& c, double value) {
    return c.params.flop_active < value;
  };
  const auto it = std::lower_bound(table.begin(), table.end(), target_n_f, by_n_f);
  // Closest in log distance.
  double best_distance = INFINITY;
  if (it != table.end()) {
    best_distance = std::abs(std::log(it->params.flop_active / target_n_f));
  }
  if (it != table.begin()) {
    best_distance =
        std::min(best_distance, std::abs(std::log(std::prev(it)->params.flop_active / target_n_f)));
  }
  // Every shape within the tolerance of the target (or, when none is that
  // close, as close as the closest one) is a near-tie; the deepest wins, then
  // the one closest to the target.
  const double band = std::max(best_distance, std::log1p(depth_tolerance));
  const double low_n_f = target_n_f * std::exp(-band);
  const double high_n_f = target_n_f * std::exp(band);
  const ShapeCandidate* chosen = nullptr;
  for (auto scan = std::lower_bound(table.begin(), table.end(), low_n_f, by_n_f);
       scan != table.end() && scan->params.flop_active <= high_n_f; ++scan) {
    if (chosen == nullptr || scan->shape.n_layers > chosen->shape.n_layers ||
        (scan->shape.n_layers == chosen->shape.n_layers &&
         std::abs(std::log(scan->params.flop_active / target_n_f)) <
             std::abs(std::log(chosen->params.flop_active / target_n_f)))) {
      chosen = &*scan;
    }
  }
  return chosen;
}

ShapeCandidate closest_shape(const Config& base, double target_n_f,
                             const ShapeSearchOptions& options) {
  if (!std::isfinite(target_n_f) || target_n_f <= 0) {
    throw ConfigError("target N_f = " + format_number(target_n_f) +
                      ": must be a positive finite number");
  }
  // A window of +-2x around the target always contains the closest shape
  // unless the target lies outside every shape, which the empty check catches.
  for (double window = 2.0; window <= 64.0; window *= 4.0) {
    const std::vector<ShapeCandidate> table =
        enumerate_shapes(base, target_n_f / window, target_n_f * window, options);
    if (const ShapeCandidate* chosen =
            closest_in_table(table, target_n_f, options.depth_tolerance)) {
      return *chosen;
    }
  }
  throw ConfigError("target N_f = " + format_number(target_n_f) +
                    ": no shape within a factor 64 in the aspect band [" +
                    format_number(options.aspect_min) + ", " + format_number(options.aspect_max) +
                    "] and " + std::to_string(options.min_layers) + ".." +
                    std::to_string(options.max_layers) + " layers");
}

}  // namespace modar
