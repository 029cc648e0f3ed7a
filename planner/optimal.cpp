// `modar optimal`: for a FLOP budget (or a wall-clock budget on a profiled
// device) the isoFLOP-optimal configuration per architecture and, for
// architectures with an efficiency prior, the fastest-stepping configuration
// whose predicted loss matches the optimal baseline (SPEC section 4).
//
// Along the isoFLOP curve D = C / F_train(per token) with F_train from
// count_flops (= 3 F_fwd); under a wall-clock budget D = hours * 3600 *
// tokens/s from the cost model on the profile, so step time decides.  Every
// candidate is a concrete shape from the shape search; nothing is continuous.
#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "modar/errors.hpp"
#include "modar/layout_search.hpp"
#include "modar/planner.hpp"
#include "planner_internal.hpp"
#include "planner_text.hpp"

namespace modar {

namespace {

// Rough MFU used only to centre the search grid of a wall-clock budget (the
// grid is widened when the optimum lands on its edge, so this never decides).
constexpr double kGridCentreMfu = 0.4;

struct Point {
  ShapeCandidate candidate;
  Config config;
  double tokens = 0.0;
  std::optional<double> loss;
  std::optional<Estimate> estimate;
};

struct Budget {
  std::optional<double> train_flops;
  std::optional<double> gpu_hours;
  int64_t gpus = 1;
  int64_t gpus_per_node = 0;  // 0: the profile's network
};

class Evaluator {
 public:
  Evaluator(const Budget& budget, const DeviceProfile& profile, const LossFit& fit)
      : budget_(budget), profile_(profile), timing_(profile), fit_(fit) {}

  const Estimate& estimate_of(Point& point) {
    if (!point.estimate) {
      // Points come from the shape search, which validated their configs.
      point.estimate.emplace();
      if (budget_.gpus > 1) {
        // Cluster (planner/layout_search.cpp): the fastest layout that fits.
        LayoutSearchOptions options;
        options.gpus = budget_.gpus;
        options.gpus_per_node = budget_.gpus_per_node;
        LayoutSearchResult layout = search_layout(point.config, timing_, options);
        point.config = layout.config;
        *point.estimate = std::move(layout.estimate);
        layouts_evaluated_ += layout.evaluated;
        return *point.estimate;
      }
      estimate_into(point.config, timing_, StepKind::train, scratch_, *point.estimate);
    }
    return *point.estimate;
  }

  // Tokens the budget buys for this configuration.
  double tokens_for(Point& point) {
    double tokens = INFINITY;
    if (budget_.train_flops) {
      tokens = *budget_.train_flops / point.candidate.train_flops_per_token;
    }
    if (budget_.gpu_hours) {
      const double wall_s = *budget_.gpu_hours / double(budget_.gpus) * 3600.0;
      tokens = std::min(tokens, wall_s * estimate_of(point).time.tokens_per_s);
    }
    return tokens;
  }

  std::vector<Point> curve(const Config& arch_base, const EfficiencyPrior& prior, double centre_n_f,
                           double half_width, double step, const ShapeSearchOptions& options) {
    std::vector<Point> points;
    for (const ShapeCandidate& candidate :
         detail::canonical_curve(arch_base, centre_n_f, half_width, step, options)) {
      Point point;
      point.candidate = candidate;
      point.config = with_shape(arch_base, candidate.shape);
      point.tokens = tokens_for(point);
      if (prior.known) {
        point.loss =
            predicted_loss(fit_.params, prior.eps, candidate.params.flop_active, point.tokens);
      }
      points.push_back(std::move(point));
      ++evaluated_;
    }
    return points;
  }

  int64_t evaluated() const { return evaluated_; }
  int64_t layouts_evaluated() const { return layouts_evaluated_; }

 private:
  Budget budget_;
  const DeviceProfile& profile_;
  const TimingModel timing_;  // the profile pre-indexed once for every point
  OpList scratch_;
  const LossFit& fit_;
  int64_t evaluated_ = 0;
  int64_t layouts_evaluated_ = 0;
};

struct ArchSolution {
  std::vector<Point> points;
  int optimum = -1;
  int parity = -1;
  std::string optimum_selection;
  std::string parity_selection;
};

// Predicted losses closer than this (relative) are a tie: far below what any
// fit resolves (Epoch's E alone has a standard error of 0.03), and the
// isoFLOP curve is flat enough near its minimum that the discrete argmin
// would otherwise jump between shapes on attention-FLOP and rounding noise.
constexpr double kLossTieRelative = 5e-4;

// The isoFLOP optimum among points that fit in memory: fit loss = a + b x +
// c x^2 (x = log N_f) to the points within a factor 3 of the lowest-loss one
// (Chinchilla's approach 2) and, among the points tied with the lowest loss,
// take the one nearest the parabola's vertex.  *fits is false when no point
// fits (then the choice is made over all points).  -1 for an empty curve.
int isoflop_optimum(std::vector<Point>& points, Evaluator& evaluator, bool* fits) {
  std::vector<int> eligible;
  for (size_t i = 0; i < points.size(); ++i) {
    if (evaluator.estimate_of(points[i]).memory.fits) {
      eligible.push_back(static_cast<int>(i));
    }
  }
  *fits = !eligible.empty();
  if (eligible.empty()) {
    eligible.resize(points.size());
    std::iota(eligible.begin(), eligible.end(), 0);
  }
  if (eligible.empty()) {
    return -1;
  }
  const auto x_of = [&](int i) { return std::log(points[i].candidate.params.flop_active); };
  const int lowest = *std::min_element(eligible.begin(), eligible.end(), [&](int l, int r) {
    return *points[l].loss < *points[r].loss;
  });
  // Least-squares parabola through the neighbourhood of the lowest point.
  Eigen::Matrix3d normal = Eigen::Matrix3d::Zero();
  Eigen::Vector3d rhs = Eigen::Vector3d::Zero();
  int used = 0;
  for (const int i : eligible) {
    const double x = x_of(i) - x_of(lowest);
    if (std::abs(x) > std::log(3.0)) {
      continue;
    }
    const Eigen::Vector3d basis(1.0, x, x * x);
    normal += basis * basis.transpose();
    rhs += basis * *points[i].loss;
    ++used;
  }
  double vertex = 0.0;  // relative to x_of(lowest)
  if (used >= 3) {
    const Eigen::Vector3d coefficients = normal.ldlt().solve(rhs);
    if (coefficients[2] > 0) {
      vertex =
          std::clamp(-coefficients[1] / (2.0 * coefficients[2]), -std::log(3.0), std::log(3.0));
    }
  }
  const double tie_loss = *points[lowest].loss * (1.0 + kLossTieRelative);
  int chosen = lowest;
  for (const int i : eligible) {
    if (*points[i].loss <= tie_loss && std::abs(x_of(i) - x_of(lowest) - vertex) <
                                           std::abs(x_of(chosen) - x_of(lowest) - vertex)) {
      chosen = i;
    }
  }
  return chosen;
}

Recommendation make_recommendation(const std::string& arch, const std::string& role,
                                   const std::string& selection, Point& point,
                                   const EfficiencyPrior& prior, Evaluator& evaluator) {
  Recommendation rec;
  rec.arch = arch;
  rec.role = role;
  rec.selection = selection;
  rec.config = point.config;
  rec.shape = point.candidate.shape;
  const Estimate& est = evaluator.estimate_of(point);
  rec.config = point.config;  // with the chosen layout on a cluster
  rec.params = est.params;
  rec.flops = est.flops;
  rec.tokens = point.tokens;
  rec.train_flops_total = point.candidate.train_flops_per_token * point.tokens;
  const double hardware_ratio =
      est.flops.train_per_step > 0 ? est.flops.hardware_per_step / est.flops.train_per_step : 1.0;
  rec.hardware_flops_total = rec.train_flops_total * hardware_ratio;
  rec.loss = point.loss;
  rec.prior = prior;
  rec.memory = est.memory;
  rec.time = est.time;
  rec.train_hours = est.time.tokens_per_s > 0 ? point.tokens / est.time.tokens_per_s / 3600.0 : 0;
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

std::string fixed(double value, int digits) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", digits, value);
  return buffer;
}

std::string sci(double value, int digits = 3) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*e", digits - 1, value);
  return buffer;
}

// Loss-optimal (scaling law alone) vs the recommended model that fits: say so,
// and which constraint binds, when they differ (never shrink silently).
void append_fit_notes(OptimalResult& result, const LossFitParams& law, double centre_flops,
                      const OptimalRequest& request) {
  if (!request.train_flops || result.recommendations.empty()) {
    return;
  }
  const ClosedFormOptimum dense = closed_form_optimum(law, centre_flops);
  for (const Recommendation& rec : result.recommendations) {
    if (rec.arch != "baseline" || rec.role != "isoflop_optimal") {
      continue;
    }
    const double ratio = rec.params.flop_active / dense.n_opt;
    std::string note = "loss-optimal baseline (closed form, scaling law alone): N_f " +
                       sci(dense.n_opt) + ", D " + sci(dense.tokens_opt) + "; recommended: N_f " +
                       sci(rec.params.flop_active) + " (" + fixed(ratio, 2) + "x)";
    if (!rec.memory.fits) {
      note += "; it does NOT fit " + std::to_string(request.gpus) +
              " GPU(s): device memory binds (add --gpus, or see the layout)";
    } else if (ratio < 0.8) {
      note += ": the loss-optimal model does not fit " + std::to_string(request.gpus) +
              " GPU(s) (device memory binds); this is the best model that fits";
    } else {
      note += ": fits " + std::to_string(request.gpus) + " GPU(s)";
      if (request.gpus > 1) {
        note += " with layout " + layout_summary(rec.config);
      }
    }
    result.notes.push_back(note);
  }
}

}  // namespace

OptimalResult optimal(const OptimalRequest& request) {
  detail::check_budget("--flops", request.train_flops);
  detail::check_budget("--gpu-hours", request.gpu_hours);
  if (!request.train_flops && !request.gpu_hours) {
    throw ConfigError(
        "no budget: give --flops C (training FLOPs) and/or --gpu-hours H "
        "(device-hours on --profile)");
  }
  if (request.gpus < 1) {
    throw ConfigError("--gpus " + std::to_string(request.gpus) + ": must be >= 1");
  }
  if (!(request.grid_step > 1.0) || !(request.grid_half_width > 1.0)) {
    throw ConfigError("grid step / half width: must be > 1");
  }
  if (request.archs.empty()) {
    throw ConfigError("--arch: empty; allowed: baseline, mod, dar, mod+dar");
  }
  std::vector<ArchSpec> archs;
  for (const std::string& name : request.archs) {
    ArchSpec arch = make_arch(name, request.capacity, request.every, request.dar_block_layers,
                              request.dar_streams);
    const bool duplicate =
        std::any_of(archs.begin(), archs.end(), [&](const ArchSpec& a) { return a.name == name; });
    if (!duplicate) {
      archs.push_back(arch);
    }
  }

  OptimalResult result;
  result.request = request;
  result.fit = load_fit(request.fit);
  const DeviceProfile profile = load_profile(request.profile);
  result.profile_name = profile.name;

  Config base = request.base;
  base.device.count = request.gpus;
  base.device.profile = request.profile;
  base.mod = ModConfig{};
  base.dar = DarConfig{};
  validate(base);

  const Budget budget{request.train_flops, request.gpu_hours, request.gpus,
                      request.gpus_per_node};
  Evaluator evaluator(budget, profile, result.fit);
  const LossFitParams& law = result.fit.params;

  // Centre of the search grid: the dense closed form at the FLOP budget (or
  // at the FLOPs the device-hours buy at a typical MFU).
  double centre_flops = INFINITY;
  if (request.train_flops) {
    centre_flops = *request.train_flops;
  }
  if (request.gpu_hours) {
    centre_flops = std::min(centre_flops, *request.gpu_hours * 3600.0 *
                                              profile.ceilings.peak_flops_bf16 * kGridCentreMfu);
  }
  const ClosedFormOptimum dense = closed_form_optimum(law, centre_flops);
  const double smallest = detail::smallest_shape_n_f(base, request.shapes);
  const double largest = detail::largest_shape_n_f(base, request.shapes);
  const double exponent = (law.alpha + law.beta) / law.beta;
  if (dense.n_opt < smallest) {
    const double minimum_flops = 6.0 * std::pow(smallest / dense.G, exponent);
    const std::string what = request.train_flops
                                 ? "--flops " + format_number(*request.train_flops)
                                 : "--gpu-hours " + format_number(*request.gpu_hours);
    throw ConfigError(
        what + ": too small for any shape: the compute-optimal N_f is " + sci(dense.n_opt) +
        " but the smallest shape (" + std::to_string(request.shapes.min_layers) +
        " layers, d_model " + std::to_string(request.shapes.d_model_multiple) + "+) has N_f " +
        sci(smallest) + "; allowed: a budget of at least ~" +
        (request.train_flops
             ? sci(minimum_flops, 2) + " FLOPs"
             : sci(minimum_flops / (3600.0 * profile.ceilings.peak_flops_bf16 * kGridCentreMfu),
                   2) +
                   " GPU-hours"));
  }
  if (dense.n_opt > largest) {
    const double maximum_flops = 6.0 * std::pow(largest / dense.G, exponent);
    throw ConfigError("budget " + sci(centre_flops) +
                      " FLOPs: too large for the shape search: the compute-optimal N_f " +
                      sci(dense.n_opt) + " exceeds the largest shape's (" +
                      std::to_string(request.shapes.max_layers) + " layers) " + sci(largest) +
                      "; allowed: a budget of at most ~" + sci(maximum_flops, 2) + " FLOPs");
  }

  const auto solve = [&](const ArchSpec& arch, const EfficiencyPrior& prior,
                         const Point* baseline_optimum) {
    const Config arch_base = detail::arch_config(base, arch);
    ArchSolution solution;
    const double centre =
        prior.known ? closed_form_optimum(law, centre_flops, prior.eps).n_opt : dense.n_opt;
    double half_width = request.grid_half_width;
    for (int attempt = 0; attempt < 4; ++attempt, half_width *= 2.0) {
      solution.points =
          evaluator.curve(arch_base, prior, centre, half_width, request.grid_step, request.shapes);
      if (solution.points.empty()) {
        throw ConfigError("no shape in the aspect band [" +
                          format_number(request.shapes.aspect_min) + ", " +
                          format_number(request.shapes.aspect_max) + "] near N_f " + sci(centre) +
                          " for " + arch.name);
      }
      if (!prior.known) {
        break;
      }
      bool fits = true;
      solution.optimum = isoflop_optimum(solution.points, evaluator, &fits);
      solution.optimum_selection =
          fits ? "lowest predicted loss on the isoFLOP curve among shapes that fit (ties within "
                 "0.05% go to the shape nearest the curve's parabolic vertex)"
               : "lowest predicted loss; NO shape fits the device memory (not recommended)";
      const bool at_edge =
          solution.optimum == 0 || solution.optimum == static_cast<int>(solution.points.size()) - 1;
      if (!at_edge) {
        break;
      }
    }
    if (!prior.known) {
      // No loss prior: the MoD paper's rule (section 4.1) -- the optimal
      // variant uses as many forward FLOPs per token as the optimal baseline.
      const double target = baseline_optimum->candidate.forward_flops_per_token;
      double best = INFINITY;
      for (size_t i = 0; i < solution.points.size(); ++i) {
        Point& point = solution.points[i];
        const double distance =
            std::abs(std::log(point.candidate.forward_flops_per_token / target));
        if (distance < best && evaluator.estimate_of(point).memory.fits) {
          best = distance;
          solution.optimum = static_cast<int>(i);
        }
      }
      if (solution.optimum < 0) {
        solution.optimum = 0;
      }
      solution.optimum_selection =
          "loss unknown (no prior): shape with the optimal baseline's forward FLOPs per token "
          "(MoD paper section 4.1 rule)";
      return solution;
    }
    if (baseline_optimum != nullptr && arch.name != "baseline") {
      const double parity_loss = *baseline_optimum->loss;
      double fastest = INFINITY;
      for (size_t i = 0; i < solution.points.size(); ++i) {
        Point& point = solution.points[i];
        if (*point.loss > parity_loss * (1.0 + 1e-12)) {
          continue;
        }
        const Estimate& est = evaluator.estimate_of(point);
        if (est.memory.fits && est.time.step_s < fastest) {
          fastest = est.time.step_s;
          solution.parity = static_cast<int>(i);
        }
      }
      solution.parity_selection =
          "fastest step among shapes whose predicted loss <= the optimal baseline's";
    }
    return solution;
  };

  // The baseline is always solved: it is the reference of every ratio and of
  // the parity rule.
  const ArchSpec baseline_arch = make_arch("baseline");
  const EfficiencyPrior baseline_prior =
      efficiency_prior(detail::arch_config(base, baseline_arch), result.fit, request.eps_overrides);
  ArchSolution baseline = solve(baseline_arch, baseline_prior, nullptr);
  Point& baseline_point = baseline.points[static_cast<size_t>(baseline.optimum)];
  if (baseline_point.tokens < detail::tokens_per_step(baseline_point.config)) {
    throw ConfigError("budget too small: the optimal baseline gets " + sci(baseline_point.tokens) +
                      " tokens, less than one optimizer step (" +
                      sci(detail::tokens_per_step(baseline_point.config)) + " tokens)");
  }
  Recommendation baseline_rec =
      make_recommendation("baseline", "isoflop_optimal", baseline.optimum_selection, baseline_point,
                          baseline_prior, evaluator);
  set_ratios(baseline_rec, baseline_rec);
  result.conventions = evaluator.estimate_of(baseline_point).conventions;

  for (const ArchSpec& arch : archs) {
    const EfficiencyPrior prior =
        efficiency_prior(detail::arch_config(base, arch), result.fit, request.eps_overrides);
    result.priors.push_back(prior);
    if (arch.name == "baseline") {
      result.recommendations.push_back(baseline_rec);
      if (!baseline_rec.memory.fits) {
        result.notes.push_back("baseline: no shape fits the device memory at micro-batch " +
                               std::to_string(base.train.micro_batch) +
                               "; lower --micro-batch, enable --recompute or add --gpus");
      }
      continue;
    }
    ArchSolution solution = solve(arch, prior, &baseline_point);
    Point& optimum = solution.points[static_cast<size_t>(solution.optimum)];
    Recommendation rec = make_recommendation(arch.name, "isoflop_optimal",
                                             solution.optimum_selection, optimum, prior, evaluator);
    set_ratios(rec, baseline_rec);
    result.recommendations.push_back(rec);
    if (!prior.known) {
      result.notes.push_back(arch.name +
                             ": no published prior, loss not predicted; shape chosen with the "
                             "optimal baseline's forward FLOPs per token; --eps " +
                             arch.name + "=V predicts it");
    } else if (solution.parity >= 0) {
      Recommendation parity = make_recommendation(
          arch.name, "parity_fastest", solution.parity_selection,
          solution.points[static_cast<size_t>(solution.parity)], prior, evaluator);
      set_ratios(parity, baseline_rec);
      result.recommendations.push_back(parity);
    } else {
      result.notes.push_back(arch.name +
                             ": no shape that fits reaches the optimal baseline's predicted loss");
    }
  }
  const bool dar_requested =
      std::any_of(archs.begin(), archs.end(), [](const ArchSpec& a) { return a.dar.enabled(); });
  if (dar_requested && !request.gpu_hours) {
    result.notes.push_back(
        "DAR costs time and memory, not FLOPs: under a FLOP budget it looks "
        "free; compare under a wall-clock budget (--gpu-hours) for its price");
  }
  if (request.gpu_hours) {
    result.notes.push_back(
        "wall-clock budget: tokens = gpu_hours / gpus * 3600 * tokens/s of "
        "each configuration on profile " +
        profile.name + (request.train_flops ? " (capped by the FLOP budget)" : ""));
  }
  result.candidates_evaluated = evaluator.evaluated();
  result.layouts_evaluated = evaluator.layouts_evaluated();
  append_fit_notes(result, law, centre_flops, request);
  return result;
}

std::string to_json(const OptimalResult& result) {
  const OptimalRequest& request = result.request;
  JsonWriter json;
  json.begin_object();
  json.key("budget").begin_object();
  json_optional(json, "train_flops", request.train_flops);
  json_optional(json, "gpu_hours", request.gpu_hours);
  json.field("gpus", request.gpus);
  json.field("profile", result.profile_name);
  json.end_object();
  json.key("fit").begin_object();
  json.field("name", result.fit.name).field("source", result.fit.source);
  json.field("E", result.fit.params.E).field("A", result.fit.params.A);
  json.field("B", result.fit.params.B).field("alpha", result.fit.params.alpha);
  json.field("beta", result.fit.params.beta);
  json.end_object();
  json.field("loss_model",
             "L = E + eps * A / N_f^alpha + B / D^beta; N_f = FLOP-active "
             "parameters; D = tokens; C = F_train_per_token * D = 3 F_fwd D");
  json.key("eps").begin_object();
  for (const EfficiencyPrior& prior : result.priors) {
    if (prior.known) {
      json.field(prior.key, prior.eps);
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
    json.field("source", prior.source).field("derivation", prior.derivation);
    json.end_object();
  }
  json.end_array();
  json.field("conventions", result.conventions);
  json.key("shape_search").begin_object();
  json.field("aspect_min", request.shapes.aspect_min);
  json.field("aspect_max", request.shapes.aspect_max);
  json.field("d_model_multiple", request.shapes.d_model_multiple);
  json.field("gqa_group", request.shapes.gqa_group);
  json.field("seq_len", request.base.model.seq_len);
  json.field("micro_batch", request.base.train.micro_batch);
  json.field("recompute", to_string(request.base.train.recompute));
  json.end_object();
  json.field("candidates_evaluated", result.candidates_evaluated);
  json.key("recommendations").begin_array();
  for (const Recommendation& rec : result.recommendations) {
    json.begin_object();
    json.field("arch", rec.arch).field("role", rec.role).field("selection", rec.selection);
    json.key("shape").begin_object();
    json.field("n_layers", rec.shape.n_layers).field("d_model", rec.shape.d_model);
    json.field("n_heads", rec.shape.n_heads).field("n_kv_heads", rec.shape.n_kv_heads);
    json.field("d_head", rec.shape.d_head).field("d_ff", rec.shape.d_ff);
    json.field("aspect_ratio", rec.shape.aspect_ratio());
    json.end_object();
    json.field("layout", layout_summary(rec.config));
    json.key("parallel").begin_object();
    json.field("tensor", rec.config.parallel.tensor);
    json.field("sequence_parallel", rec.config.parallel.sequence_parallel);
    json.field("pipeline", rec.config.parallel.pipeline);
    json.field("virtual_stages", rec.config.parallel.virtual_stages);
    json.field("data", std::max<int64_t>(1, rec.config.parallel.data(rec.config.device.count)));
    json.field("zero", rec.config.parallel.zero);
    json.field("micro_batch", rec.config.train.micro_batch);
    json.field("global_batch", rec.config.train.global_batch);
    json.field("recompute", to_string(rec.config.train.recompute));
    json.end_object();
    json.key("mod").begin_object();
    json.field("capacity", rec.config.mod.enabled() ? rec.config.mod.capacity : 1.0);
    json.field("every", rec.config.mod.every);
    json.end_object();
    json.key("dar").begin_object();
    json.field("variant", to_string(rec.config.dar.variant));
    json.field("block_layers", rec.config.dar.enabled() ? rec.config.dar.block_layers : 0);
    json.field("streams", rec.config.dar.resolved_streams());
    json.end_object();
    json.key("params").begin_object();
    json.field("total", rec.params.total).field("non_embedding", rec.params.non_embedding);
    json.field("flop_active", rec.params.flop_active);
    json.end_object();
    json.field("tokens", rec.tokens);
    json.field("tokens_per_param", rec.tokens / rec.params.flop_active);
    json.key("flops").begin_object();
    json.field("forward_per_token", rec.flops.forward_per_token);
    json.field("train_per_token", rec.flops.train_per_token);
    json.field("train_total", rec.train_flops_total);
    json.field("hardware_total", rec.hardware_flops_total);
    json.end_object();
    json_optional(json, "loss", rec.loss);
    json_optional(json, "eps",
                  rec.prior.known ? std::optional<double>(rec.prior.eps) : std::nullopt);
    json.key("memory").begin_object();
    json.field("peak_bytes", rec.memory.peak).field("fits", rec.memory.fits);
    json.field("weights_bytes", rec.memory.weights);
    json.field("gradients_bytes", rec.memory.gradients);
    json.field("optimizer_bytes", rec.memory.optimizer);
    json.field("activations_bytes", rec.memory.activations);
    json.field("dar_bank_bytes", rec.memory.dar_bank);
    json.end_object();
    json.key("time").begin_object();
    json.field("step_s", rec.time.step_s).field("tokens_per_s", rec.time.tokens_per_s);
    json.field("mfu", rec.time.mfu).field("hfu", rec.time.hfu);
    json.field("train_hours", rec.train_hours);
    json.field("gpu_hours", rec.train_hours * double(request.gpus));
    json.field("extrapolated", rec.time.extrapolated);
    json.end_object();
    json.key("ratios_to_baseline").begin_object();
    json.field("params_total", rec.ratio_params_total);
    json.field("params_flop_active", rec.ratio_params_flop_active);
    json.field("forward_flops_per_token", rec.ratio_forward_flops);
    json.field("step_time", rec.ratio_step_time);
    json.field("tokens", rec.ratio_tokens);
    json.field("train_hours", rec.ratio_train_hours);
    json.end_object();
    json.end_object();
  }
  json.end_array();
  json.key("notes").begin_array();
  for (const std::string& note : result.notes) {
    json.value(note);
  }
  json.end_array();
  json.end_object();
  return json.str();
}

std::string to_table(const OptimalResult& result) {
  const OptimalRequest& request = result.request;
  std::string out;
  out += "budget: ";
  if (request.train_flops) {
    out += sci(*request.train_flops) + " training FLOPs";
  }
  if (request.gpu_hours) {
    out += std::string(request.train_flops ? ", " : "") + format_number(*request.gpu_hours) +
           " GPU-hours";
  }
  out += " on " + std::to_string(request.gpus) + " x " + result.profile_name + "\n";
  const LossFitParams& p = result.fit.params;
  out += "loss model: L = E + eps*A/N_f^alpha + B/D^beta, fit '" + result.fit.name + "' (E " +
         format_number(p.E) + ", A " + format_number(p.A) + ", B " + format_number(p.B) +
         ", alpha " + format_number(p.alpha) + ", beta " + format_number(p.beta) + ")\n\n";

  const std::vector<Recommendation>& recs = result.recommendations;
  std::vector<std::pair<std::string, std::vector<std::string>>> rows;
  const auto add = [&](const std::string& label, auto cell) {
    std::vector<std::string> cells;
    for (const Recommendation& rec : recs) {
      cells.push_back(cell(rec));
    }
    rows.emplace_back(label, cells);
  };
  add("architecture", [](const Recommendation& r) { return r.arch; });
  add("role", [](const Recommendation& r) {
    return std::string(r.role == "isoflop_optimal" ? "optimal" : "parity-fastest");
  });
  add("layers x d_model", [](const Recommendation& r) {
    return std::to_string(r.shape.n_layers) + " x " + std::to_string(r.shape.d_model);
  });
  add("heads / kv / d_head", [](const Recommendation& r) {
    return std::to_string(r.shape.n_heads) + "/" + std::to_string(r.shape.n_kv_heads) + "/" +
           std::to_string(r.shape.d_head);
  });
  add("d_ff", [](const Recommendation& r) { return std::to_string(r.shape.d_ff); });
  add("aspect d/L", [](const Recommendation& r) { return fixed(r.shape.aspect_ratio(), 1); });
  add("MoD c / every", [](const Recommendation& r) {
    return r.config.mod.enabled()
               ? fixed(r.config.mod.capacity, 3) + " / " + std::to_string(r.config.mod.every)
               : std::string("-");
  });
  add("DAR K / n", [](const Recommendation& r) {
    return r.config.dar.enabled() ? std::to_string(r.config.dar.block_layers) + " / " +
                                        std::to_string(r.config.dar.resolved_streams())
                                  : std::string("-");
  });
  add("params total", [](const Recommendation& r) { return sci(r.params.total); });
  add("params FLOP-active N_f", [](const Recommendation& r) { return sci(r.params.flop_active); });
  add("tokens D", [](const Recommendation& r) { return sci(r.tokens); });
  add("tokens / N_f",
      [](const Recommendation& r) { return fixed(r.tokens / r.params.flop_active, 1); });
  add("fwd FLOPs / token", [](const Recommendation& r) { return sci(r.flops.forward_per_token); });
  add("training FLOPs", [](const Recommendation& r) { return sci(r.train_flops_total); });
  add("eps", [](const Recommendation& r) {
    return r.prior.known ? fixed(r.prior.eps, 4) : std::string("unknown");
  });
  add("predicted loss",
      [](const Recommendation& r) { return r.loss ? fixed(*r.loss, 4) : std::string("unknown"); });
  if (request.gpus > 1) {
    add("layout", [](const Recommendation& r) { return layout_summary(r.config); });
  }
  add("peak memory / device", [](const Recommendation& r) {
    return fixed(r.memory.peak / (1024.0 * 1024.0 * 1024.0), 1) + " GiB" +
           (r.memory.fits ? "" : " NO FIT");
  });
  add("step time", [](const Recommendation& r) {
    return fixed(r.time.step_s * 1e3, 1) + " ms" + (r.time.extrapolated ? "*" : "");
  });
  add("tokens / s", [](const Recommendation& r) { return sci(r.time.tokens_per_s); });
  add("MFU", [](const Recommendation& r) { return fixed(100 * r.time.mfu, 1) + "%"; });
  add("wall-clock", [](const Recommendation& r) { return fixed(r.train_hours, 1) + " h"; });
  add("x params (vs baseline)",
      [](const Recommendation& r) { return fixed(r.ratio_params_total, 2); });
  add("x fwd FLOPs / token",
      [](const Recommendation& r) { return fixed(r.ratio_forward_flops, 2); });
  add("x step time", [](const Recommendation& r) { return fixed(r.ratio_step_time, 2); });
  add("x wall-clock", [](const Recommendation& r) { return fixed(r.ratio_train_hours, 2); });

  size_t label_width = 0;
  std::vector<size_t> widths(recs.size(), 0);
  for (const auto& [label, cells] : rows) {
    label_width = std::max(label_width, label.size());
    for (size_t i = 0; i < cells.size(); ++i) {
      widths[i] = std::max(widths[i], cells[i].size());
    }
  }
  for (const auto& [label, cells] : rows) {
    std::string line = label + std::string(label_width - label.size(), ' ');
    for (size_t i = 0; i < cells.size(); ++i) {
      line += "  " + std::string(widths[i] - cells[i].size(), ' ') + cells[i];
    }
    out += line + "\n";
  }
  out += "\n(* = some op time extrapolated outside the profile's measured grid)\n";
  out += "\npriors:\n";
  for (const EfficiencyPrior& prior : result.priors) {
    out += "  " + prior.key + ": " +
           (prior.known ? "eps = " + fixed(prior.eps, 4) : std::string("unknown")) + " -- " +
           prior.source + "\n";
    if (prior.key != "baseline") {
      std::string indented = "    ";
      for (const char c : prior.derivation) {
        indented += c;
        if (c == '\n') {
          indented += "    ";
        }
      }
      out += indented + "\n";
    }
  }
  for (const std::string& note : result.notes) {
    out += "note: " + note + "\n";
  }
  // Wrap the conventions at 100 columns, continuation lines indented.
  std::string line = "conventions:";
  for (const std::string& word : split_trimmed(result.conventions, ' ')) {
    if (line.size() + 1 + word.size() > 100) {
      out += line + "\n";
      line = "  ";
    }
    line += (line == "  " ? "" : " ") + word;
  }
  out += line + "\n";
  out += "search: d_model multiple of " + std::to_string(request.shapes.d_model_multiple) +
         ", d_head 64 (d < 2048) or 128, aspect d/L in [" +
         format_number(request.shapes.aspect_min) + ", " +
         format_number(request.shapes.aspect_max) + "], deeper shape wins near-ties; " +
         std::to_string(result.candidates_evaluated) + " candidates on the isoFLOP curves\n";
  return out;
}

}  // namespace modar
