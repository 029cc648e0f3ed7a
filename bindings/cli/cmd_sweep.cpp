// `modar sweep`: every candidate on the isoFLOP curves (budget x architecture x
// capacity x every x K x n x shape) as CSV (default) or JSON lines.
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <tuple>

#include "cli_util.hpp"
#include "commands.hpp"
#include "modar/base/errors.hpp"
#include "modar/base/files.hpp"
#include "modar/base/text.hpp"
#include "modar/planner.hpp"
#include "planner_cli.hpp"

namespace modar::cli {

namespace {

// One isoFLOP curve of a sweep: budget x architecture variant (streams do not
// change which shapes exist, so they are not part of the key).
struct CurveKey {
  double budget = 0.0;
  std::string arch;
  double capacity = 1.0;
  int64_t every = 0;
  int64_t block_layers = 0;
  bool operator<(const CurveKey& o) const {
    return std::tie(budget, arch, capacity, every, block_layers) <
           std::tie(o.budget, o.arch, o.capacity, o.every, o.block_layers);
  }
};

ArchSpec arch_of(const CurveKey& curve, const SweepRequest& request) {
  return make_arch(curve.arch, curve.every > 0 ? curve.capacity : 0.125,
                   curve.every > 0 ? curve.every : 2,
                   curve.block_layers > 0 ? curve.block_layers : 2,
                   request.streams.empty() ? 2 : request.streams.front());
}

std::vector<CurveKey> requested_curves(const SweepRequest& request) {
  std::vector<CurveKey> curves;
  for (const double budget : request.budgets_flops) {
    for (const std::string& name : request.archs) {
      const bool mod = arch_has_mod(name);
      const bool dar = arch_has_dar(name);
      for (const double c : mod ? request.capacities : std::vector<double>{1.0}) {
        for (const int64_t e : mod ? request.everys : std::vector<int64_t>{0}) {
          for (const int64_t k : dar ? request.block_layers : std::vector<int64_t>{0}) {
            const ArchSpec arch = make_arch(name, mod ? c : 0.125, mod ? e : 2, dar ? k : 2, 2);
            // The same fields the sweep writes into its rows.
            curves.push_back(CurveKey{budget, name, arch.mod.enabled() ? arch.mod.capacity : 1.0,
                                      arch.mod.every,
                                      arch.dar.enabled() ? arch.dar.block_layers : 0});
          }
        }
      }
    }
  }
  return curves;
}

// Why a curve has no candidate, with the budgets that would give it rows.
std::string explain_empty_curve(const SweepRequest& request, const CurveKey& curve) {
  std::string what = "--flops " + format_number(curve.budget) + " (arch " + curve.arch;
  if (curve.every > 0) {
    what += ", every " + std::to_string(curve.every);
  }
  if (curve.block_layers > 0) {
    what += ", block-layers " + std::to_string(curve.block_layers);
  }
  what += ")";
  Config arch_base = request.base;
  const ArchSpec arch = arch_of(curve, request);
  arch_base.mod = arch.mod;
  arch_base.dar = arch.dar;
  arch_base.moe = arch.moe;
  const std::vector<ShapeCandidate> all =
      enumerate_shapes(arch_base, 0.0, std::numeric_limits<double>::max(), request.shapes);
  const ShapeSearchOptions& o = request.shapes;
  const std::string space = "n_layers <= " + std::to_string(o.max_layers) + ", d_model <= " +
                            std::to_string(o.max_d_model) + ", d_model / n_layers in [" +
                            format_number(o.aspect_min) + ", " + format_number(o.aspect_max) + "]";
  if (all.empty()) {
    return what + ": no candidate: the shape search (" + space + ") has no shape for it";
  }
  const LossFit fit = load_fit(request.fit);
  const EfficiencyPrior prior = efficiency_prior(arch_base, fit, request.eps_overrides);
  const LossScale scale = loss_scale(prior, prior.known ? prior.eps : 1.0);
  const auto centre = [&](double budget) {
    return closed_form_optimum(fit.params, budget, scale).n_opt;
  };
  // The curve spans N_f* / w .. N_f* x w around its compute-optimal N_f*
  // (w = grid half width x 1.1): solve N_f*(C) for the two ends by bisection.
  const double w = request.grid_half_width * 1.1;
  const double n_low = all.front().params.flop_active;
  const double n_high = all.back().params.flop_active;
  const auto budget_for = [&](double n_target) {
    double lo = 0.0, hi = 60.0;  // log10 FLOPs
    for (int i = 0; i < 200; ++i) {
      const double mid = 0.5 * (lo + hi);
      (centre(std::pow(10.0, mid)) < n_target ? lo : hi) = mid;
    }
    return std::pow(10.0, 0.5 * (lo + hi));
  };
  char line[600];
  std::snprintf(line, sizeof line,
                ": no candidate: the curve's compute-optimal N_f* = %.3g lies too far from the "
                "shapes the search allows (%s: N_f in [%.3g, %.3g]); budgets of about "
                "[%.2g, %.2g] FLOPs give rows",
                centre(curve.budget), space.c_str(), n_low, n_high, budget_for(n_low / w),
                budget_for(n_high * w));
  return what + line;
}

}  // namespace

int cmd_sweep(const Args& args) {
  std::vector<FlagSpec> flags = {
      {"--flops", true, false, "C1,C2,...", "training-FLOP budgets"},
      {"--arch", true, false, "LIST", "baseline,mod,dar,mod+dar (default baseline,mod)"},
      {"--capacity", true, false, "LIST", "MoD capacities (default 0.125)"},
      {"--every", true, false, "LIST", "MoD routing frequencies (default 2)"},
      {"--block-layers", true, false, "LIST", "DAR layers per block (default 2)"},
      {"--streams", true, false, "LIST", "DAR streams (default 2)"},
      {"--no-time", false, false, "", "skip per-candidate memory and step time (faster)"},
      {"--gpus-per-node", true, false, "G",
       "cluster (--gpus > 1): GPUs per node (default: the profile's network, 8)"},
      {"--jsonl", false, false, "", "JSON lines instead of CSV"},
      {"--output", true, false, "PATH", "write to PATH (atomically) instead of stdout"},
  };
  for (FlagSpec& flag : planner_common_flags()) {
    if (flag.name != "--json") {
      flags.push_back(flag);
    }
  }
  if (wants_help(args)) {
    std::fputs(usage_text("sweep", "--flops C1,C2,... [options]", flags,
                          "Every evaluated candidate, for isoFLOP curves like the MoD paper's "
                          "figure 4.  Empty eps / loss cells: no prior (loss unknown).")
                   .c_str(),
               stdout);
    return 0;
  }
  const ParsedArgs parsed = parse_args(args, flags, "sweep", 0, 0);
  const bool jsonl = parsed.has("--jsonl");
  const auto output = parsed.value("--output");
  std::string buffer;
  std::vector<std::string> notes;
  if (output) {
    check_output_path("--output", *output, "", "");  // a directory: refused before the work
  }
  with_typed_flags(parsed, planner_flag_keys(), [&] {
    SweepRequest request;
    const auto flops = parsed.value("--flops");
    if (!flops) {
      throw ConfigError("--flops: missing; allowed: one or more FLOP budgets, e.g. --flops 1e19,1e20");
    }
    request.budgets_flops = parse_positive_double_list("--flops", *flops);
    if (const auto v = parsed.value("--arch")) {
      request.archs = parse_list("--arch", *v);
    }
    if (const auto v = parsed.value("--capacity")) {
      request.capacities = parse_positive_double_list("--capacity", *v);
    }
    request.shapes = planner_shape_options(parsed);
    if (const auto v = parsed.value("--every")) {
      request.everys = parse_positive_int_list("--every", *v);
      for (const int64_t every : request.everys) {
        check_depth_knob("--every", every, request.shapes, "MoD routing every N-th layer");
      }
    }
    if (const auto v = parsed.value("--block-layers")) {
      request.block_layers = parse_positive_int_list("--block-layers", *v);
      for (const int64_t k : request.block_layers) {
        check_depth_knob("--block-layers", k, request.shapes, "a DAR block of K layers");
      }
    }
    if (const auto v = parsed.value("--streams")) {
      request.streams = parse_positive_int_list("--streams", *v);
    }
    request.with_time = !parsed.has("--no-time");
    parse_planner_run_flags(parsed, request);

    if (!jsonl) {
      buffer = sweep_csv_header() + "\n";
    }
    // Rows are formatted as they come; stdout is written once at the end so a
    // failing or interrupted sweep prints one line and no partial table.
    std::map<CurveKey, int64_t> rows_per_curve;
    {
      const InterruptScope ctrl_c;  // Ctrl-C: the sweep stops at its next check, exit 130
      sweep(request, [&](const SweepRow& row) {
        buffer += (jsonl ? to_json_line(row) : to_csv_line(row)) + "\n";
        ++rows_per_curve[CurveKey{row.budget_flops, row.arch, row.capacity, row.every,
                                  row.block_layers}];
      });
    }
    // A curve without a row: say why instead of printing a silent empty table.
    for (const CurveKey& curve : requested_curves(request)) {
      if (rows_per_curve.count(curve) == 0) {
        notes.push_back(explain_empty_curve(request, curve));
      }
    }
    if (!notes.empty() && rows_per_curve.empty()) {
      throw ConfigError(notes.front() +
                        (notes.size() > 1
                             ? " (and " + std::to_string(notes.size() - 1) + " more empty curves)"
                             : std::string()));
    }
  });
  for (size_t i = 0; i < notes.size() && i < 20; ++i) {
    std::fprintf(stderr, "modar sweep: note: %s\n", notes[i].c_str());
  }
  if (output) {
    write_file_atomically(*output, buffer, "sweep output");
  } else {
    std::fputs(buffer.c_str(), stdout);
  }
  return 0;
}

}  // namespace modar::cli
