// `modar sweep`: the isoFLOP curves behind `modar optimal`, for notebooks that
// draw them like the MoD paper's figure 4: budget x architecture variant
// (capacity x every x K x n), each curve one row per N_f bin.
//
// The rows come from the same search as optimal (optimal_search.cpp): one
// evaluator and, per architecture variant, one lazily evaluated shape space
// kept over every budget (a shape's memory and step time do not depend on
// the budget: each is computed once).  Per bin the row is the shape optimal
// would prefer among the bin's (lowest predicted loss among those that fit,
// the deepest of ties), and each curve's `recommended` row is exactly
// optimal's isoFLOP-optimal answer for that budget and architecture.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "modar/base/errors.hpp"
#include "modar/base/json.hpp"
#include "modar/base/text.hpp"
#include "modar/layout_search.hpp"
#include "modar/planner.hpp"
#include "optimal_internal.hpp"
#include "optimal_search.hpp"
#include "planner_internal.hpp"

namespace modar {

namespace {

using detail::ArchSpace;
using detail::Evaluator;
using detail::Point;

// One architecture variant over all budgets.
struct VariantSpace {
  ArchSpec arch;
  Config arch_base;
  EfficiencyPrior prior;
  std::unique_ptr<ArchSpace> space;
};

// The bin's row: the lowest predicted loss among the bin's shapes that fit
// (all of them when none fits), the deepest within kLossTieRelative.
int best_in_bin(ArchSpace& space, const std::vector<int>& bin, double eps) {
  Evaluator& evaluator = space.evaluator();
  std::vector<std::pair<double, int>> by_loss;
  for (const int i : bin) {
    by_loss.emplace_back(space.loss(space.points()[static_cast<size_t>(i)], eps), i);
  }
  std::sort(by_loss.begin(), by_loss.end());
  double reference = by_loss.front().first;
  bool any_fits = false;
  for (const auto& [loss, i] : by_loss) {
    if (evaluator.fits(space.arch_base(), space.points()[static_cast<size_t>(i)],
                       space.computes())) {
      reference = loss;
      any_fits = true;
      break;
    }
  }
  int chosen = -1;
  for (const auto& [loss, i] : by_loss) {
    if (loss > reference * (1.0 + kLossTieRelative)) {
      break;
    }
    Point& point = space.points()[static_cast<size_t>(i)];
    if (any_fits && !evaluator.fits(space.arch_base(), point, space.computes())) {
      continue;
    }
    if (chosen < 0 || point.candidate.shape.n_layers >
                          space.points()[static_cast<size_t>(chosen)].candidate.shape.n_layers) {
      chosen = i;
    }
  }
  return chosen;
}

// The bin's row without a loss (no prior): the shape closest to the bin's
// N_f, the deepest within the search's depth tolerance.
int closest_in_bin(ArchSpace& space, const std::vector<int>& bin, double target,
                   double depth_tolerance) {
  double best = INFINITY;
  for (const int i : bin) {
    best = std::min(
        best, std::abs(std::log(
                  space.points()[static_cast<size_t>(i)].candidate.params.flop_active / target)));
  }
  const double band = std::max(best, std::log1p(depth_tolerance));
  int chosen = -1;
  for (const int i : bin) {
    const ShapeCandidate& c = space.points()[static_cast<size_t>(i)].candidate;
    if (std::abs(std::log(c.params.flop_active / target)) > band) {
      continue;
    }
    if (chosen < 0 ||
        c.shape.n_layers > space.points()[static_cast<size_t>(chosen)].candidate.shape.n_layers) {
      chosen = i;
    }
  }
  return chosen;
}

// The rows of one curve (point indices, by N_f): one per non-empty bin of
// ratio `step` around `centre` within `half_width`, with the recommended
// point in place of its bin's choice.
std::vector<int> curve_rows(ArchSpace& space, const EfficiencyPrior& prior, double centre,
                            const SweepSettings& settings, int recommended) {
  const double log_step = std::log(settings.grid_step);
  const int64_t half_bins =
      static_cast<int64_t>(std::ceil(std::log(settings.grid_half_width) / log_step));
  const double low = centre * std::exp((-double(half_bins) - 0.5) * log_step);
  const double high = centre * std::exp((double(half_bins) + 0.5) * log_step);
  space.cover(low, high);
  std::vector<std::vector<int>> bins(static_cast<size_t>(2 * half_bins + 1));
  for (const int i : space.by_n_f()) {
    const double n = space.points()[static_cast<size_t>(i)].candidate.params.flop_active;
    if (n < low || n >= high) {
      continue;
    }
    const auto bin = static_cast<int64_t>(std::floor(std::log(n / low) / log_step));
    bins[static_cast<size_t>(std::clamp<int64_t>(bin, 0, 2 * half_bins))].push_back(i);
  }
  std::vector<int> rows;
  bool placed = false;
  for (size_t b = 0; b < bins.size(); ++b) {
    const std::vector<int>& bin = bins[b];
    if (bin.empty()) {
      continue;
    }
    const bool holds_recommended = std::find(bin.begin(), bin.end(), recommended) != bin.end();
    if (holds_recommended) {
      rows.push_back(recommended);
      placed = true;
    } else if (prior.known) {
      rows.push_back(best_in_bin(space, bin, prior.eps));
    } else {
      const double target = centre * std::exp((double(b) - double(half_bins)) * log_step);
      rows.push_back(closest_in_bin(space, bin, target, settings.run.shapes.depth_tolerance));
    }
  }
  if (!placed && recommended >= 0) {
    rows.push_back(recommended);  // memory pushed optimal's choice outside the curve's window
  }
  std::stable_sort(rows.begin(), rows.end(), [&](int l, int r) {
    return space.points()[static_cast<size_t>(l)].candidate.params.flop_active <
           space.points()[static_cast<size_t>(r)].candidate.params.flop_active;
  });
  return rows;
}

SweepRow make_row(const SweepSettings& settings, double budget, const VariantSpace& variant,
                  ArchSpace& space, Point& point, bool recommended) {
  Evaluator& evaluator = space.evaluator();
  const ArchSpec& arch = variant.arch;
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
          ? arch.moe.resolved_expert_ffn(with_shape(space.arch_base(), point.candidate.shape).model)
          : 0;
  row.shape = point.candidate.shape;
  row.params = point.candidate.params;
  row.forward_flops_per_token = point.candidate.forward_flops_per_token;
  row.tokens = evaluator.tokens_for(space.arch_base(), point);
  row.eps = variant.prior.eps;
  row.eps_known = variant.prior.known;
  if (variant.prior.known) {
    row.loss = space.loss(point, variant.prior.eps);
  }
  row.recommended = recommended;
  row.fits = evaluator.fits(space.arch_base(), point, space.computes());
  if (point.memory) {
    row.has_memory = true;
    row.peak_memory_bytes = point.memory->peak;
  }
  if (settings.with_time) {
    const Estimate& est = evaluator.cost_of(space.arch_base(), point);
    row.has_time = true;
    row.has_memory = true;
    row.peak_memory_bytes = est.memory.peak;
    row.fits = est.memory.fits;
    row.step_s = est.time.step_s;
    row.tokens_per_s = est.time.tokens_per_s;
    row.train_hours = est.time.tokens_per_s > 0 ? row.tokens / est.time.tokens_per_s / 3600.0 : 0;
    if (point.layout) {
      // Cluster: the layout search of `optimal --gpus` (planner/layout_search.cpp).
      const Config& layout = *point.layout;
      row.has_layout = true;
      row.layout = layout_summary(layout);
      row.parallel = layout.parallel;
      row.data_parallel = layout.parallel.data(layout.device.count);
      row.micro_batch = layout.train.micro_batch;
      row.recompute = layout.train.recompute;
      row.layout_config = layout;
    }
  }
  return row;
}

// Why a curve has no rows: its budget's compute-optimal N_f lies outside
// the shapes of its architecture.
std::string empty_curve_note(double budget, const VariantSpace& variant,
                             const detail::SearchRange& range) {
  std::string what = "flops = " + format_number(budget) + " (arch " + variant.arch.name;
  if (variant.arch.mod.enabled()) {
    what += ", every " + std::to_string(variant.arch.mod.every);
  }
  if (variant.arch.dar.enabled()) {
    what += ", block_layers " + std::to_string(variant.arch.dar.block_layers);
  }
  return what + "): no row: the compute-optimal N_f " + format_sci(range.n_opt, 2) + " lies " +
         (range.too_small() ? "below the smallest shape's " + format_sci(range.smallest, 2)
                            : "above the largest shape's " + format_sci(range.largest, 2)) +
         "; allowed: budgets of about " + format_sci(range.min_flops, 1) + " .. " +
         format_sci(range.max_flops, 1) + " FLOPs";
}

}  // namespace

SweepSummary sweep(const SweepRequest& request, const std::function<void(const SweepRow&)>& sink,
                   const RunControl& control) {
  const SweepSettings settings = resolve_sweep(request);
  const PlannerRun& run = settings.run;
  const LossFitParams& law = run.fit.params;
  RunReporter reporter(control, "sweep", "curves",
                       static_cast<int64_t>(settings.flops.size() * settings.variants.size()));
  Evaluator evaluator(run, detail::Budget{settings.flops.front(), std::nullopt});
  evaluator.set_reporter(&reporter);
  std::vector<VariantSpace> variants;
  bool unknown_prior = false;
  for (const ArchSpec& arch : settings.variants) {
    VariantSpace variant{arch, detail::arch_config(run.base, arch), {}, nullptr};
    variant.prior = efficiency_prior(variant.arch_base, run.fit, run.eps);
    variant.space =
        std::make_unique<ArchSpace>(variant.arch_base, run.shapes, evaluator, variant.prior);
    unknown_prior = unknown_prior || !variant.prior.known;
    variants.push_back(std::move(variant));
  }
  // The unknown-prior rule matches the optimal baseline's FLOPs per token.
  const Config baseline_base = detail::arch_config(run.base, make_arch("baseline"));
  const EfficiencyPrior baseline_prior = efficiency_prior(baseline_base, run.fit, run.eps);
  const double baseline_eps = baseline_prior.eps;
  ArchSpace baseline_space(baseline_base, run.shapes, evaluator, baseline_prior);

  SweepSummary summary;
  for (const double budget : settings.flops) {
    evaluator.set_budget(detail::Budget{budget, std::nullopt});
    baseline_space.forget_tokens();
    std::optional<ShapeCandidate> baseline;  // the optimal baseline at this budget
    if (unknown_prior) {
      const detail::SearchRange range =
          detail::search_range(baseline_base, run.shapes, law, baseline_space.scale(baseline_eps),
                               budget);
      if (!range.too_small() && !range.too_large()) {
        const int index = detail::isoflop_argmin(baseline_space, baseline_eps, budget).index;
        if (index >= 0) {
          baseline = baseline_space.points()[static_cast<size_t>(index)].candidate;
        }
      }
    }
    for (VariantSpace& variant : variants) {
      ArchSpace& space = *variant.space;
      space.forget_tokens();
      reporter.set_stage("flops " + format_number(budget) + ", " + variant.arch.name);
      const double eps = variant.prior.known ? variant.prior.eps : 1.0;
      const detail::SearchRange range =
          detail::search_range(variant.arch_base, run.shapes, law, space.scale(eps), budget);
      int recommended = -1;
      if (!range.too_small() && !range.too_large()) {
        if (variant.prior.known) {
          recommended = detail::isoflop_argmin(space, eps, budget).index;
        } else if (baseline) {
          recommended = detail::flops_match(space, baseline->forward_flops_per_token,
                                            baseline->params.flop_active);
        }
      }
      if (recommended < 0) {
        summary.notes.push_back(empty_curve_note(budget, variant, range));
        reporter.advance();
        continue;
      }
      for (const int i : curve_rows(space, variant.prior, range.n_opt, settings, recommended)) {
        sink(make_row(settings, budget, variant, space, space.points()[static_cast<size_t>(i)],
                      i == recommended));
        ++summary.rows;
      }
      reporter.advance();
    }
  }
  reporter.finish();
  if (summary.rows == 0) {
    throw ConfigError(
        summary.notes.front() +
        (summary.notes.size() > 1
             ? " (and " + std::to_string(summary.notes.size() - 1) + " more empty curves)"
             : std::string()));
  }
  return summary;
}

std::vector<SweepRow> sweep(const SweepRequest& request, const RunControl& control) {
  std::vector<SweepRow> rows;
  sweep(
      request, [&](const SweepRow& row) { rows.push_back(row); }, control);
  return rows;
}

std::string sweep_csv_header() {
  return "budget_flops,arch,capacity,every,block_layers,streams,experts,top_k,expert_ffn,"
         "n_layers,d_model,n_heads,"
         "n_kv_heads,d_head,d_ff,aspect_ratio,params_total,params_non_embedding,"
         "params_flop_active,forward_flops_per_token,tokens,eps,loss,recommended,"
         "peak_memory_bytes,fits,step_s,tokens_per_s,train_hours,tensor,sequence_parallel,"
         "pipeline,virtual_stages,data,zero,micro_batch,recompute";
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
  out += row.recommended ? "true," : "false,";
  out += row.has_memory ? format_number(row.peak_memory_bytes) + "," : ",";
  out += row.fits ? "true," : "false,";
  if (row.has_time) {
    num(row.step_s);
    num(row.tokens_per_s);
    out += format_number(row.train_hours);
  } else {
    out += ",,";
  }
  // The layout (gpus > 1; empty cells on one device).
  if (row.has_layout) {
    for (const int64_t v :
         {row.parallel.tensor, int64_t{-1}, row.parallel.pipeline, row.parallel.virtual_stages,
          row.data_parallel, row.parallel.zero, row.micro_batch}) {
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
  json.field("recommended", row.recommended);
  if (row.has_memory) {
    json.field("peak_memory_bytes", row.peak_memory_bytes);
  }
  json.field("fits", row.fits);
  if (row.has_time) {
    json.field("step_s", row.step_s).field("tokens_per_s", row.tokens_per_s);
    json.field("train_hours", row.train_hours);
  }
  if (row.has_layout) {
    json.field("layout", row.layout);
    detail::write_planned_parallel_json(json, row.layout_config);
  }
  json.end_object();
  return json.str();
}

}  // namespace modar
