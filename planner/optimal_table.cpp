// `modar optimal`'s table: one column per recommendation, one row per
// quantity, then the flags, the same-shape comparison, the priors with their
// derivations, the notes, the conventions and the search space.
#include <algorithm>
#include <cstdio>

#include "modar/base/text.hpp"
#include "modar/planner.hpp"
#include "optimal_internal.hpp"

namespace modar {

namespace {

// "low-high" of a range, each end with `format`; "-" for a missing end.
template <typename Format>
std::string range_text(const ValueRange& range, Format format) {
  if (range.low && range.high && *range.low == range.value && *range.high == range.value) {
    return "same";
  }
  const auto end = [&](const std::optional<double>& v) {
    return v ? format(*v) : std::string("?");
  };
  return end(range.low) + ".." + end(range.high);
}

// "%.2g": the eps ranges of the table.
std::string short_sci(double value) { return format_general(value, 2); }

using TableRows = std::vector<std::pair<std::string, std::vector<std::string>>>;

// The budget and the loss model.
std::string table_header(const OptimalResult& result) {
  const OptimalSettings& settings = result.settings;
  std::string out;
  out += "budget: ";
  if (settings.flops) {
    out += format_sci(*settings.flops, 2) + " training FLOPs";
  }
  if (settings.gpu_hours) {
    out +=
        std::string(settings.flops ? ", " : "") + format_number(*settings.gpu_hours) + " GPU-hours";
    if (settings.days) {
      out += " (" + format_number(*settings.days) + " days)";
    }
  }
  out += " on " + std::to_string(settings.run.gpus) + " x " + result.profile_name + "\n";
  const LossFitParams& p = result.fit.params;
  out += "loss model: L = E + eps*A/N_f^alpha + B/D^beta (MoD: E + eps*(A/N_f^alpha + "
         "B/D^beta); experts: E + eps_p*A/N_f^alpha + eps*B/D^beta, eps_p fixed with eps), fit '" +
         result.fit.name + "' (E " +
         format_number(p.E) + ", A " + format_number(p.A) + ", B " + format_number(p.B) +
         ", alpha " + format_number(p.alpha) + ", beta " + format_number(p.beta) + ")\n\n";
  return out;
}

// One row per quantity, one cell per recommendation.
TableRows recommendation_rows(const OptimalResult& result) {
  const int64_t gpus = result.settings.run.gpus;
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
  add("aspect d/L", [](const Recommendation& r) { return format_fixed(r.shape.aspect_ratio(), 1); });
  add("MoD c / every", [](const Recommendation& r) {
    return r.config.mod.enabled()
               ? format_fixed(r.config.mod.capacity, 3) + " / " + std::to_string(r.config.mod.every)
               : std::string("-");
  });
  add("DAR K / n", [](const Recommendation& r) {
    return r.config.dar.enabled() ? std::to_string(r.config.dar.block_layers) + " / " +
                                        std::to_string(r.config.dar.resolved_streams())
                                  : std::string("-");
  });
  if (std::any_of(recs.begin(), recs.end(),
                  [](const Recommendation& r) { return r.config.moe.enabled(); })) {
    add("experts E x width, top-k",
        [](const Recommendation& r) { return experts_summary(r.config); });
  }
  add("params total", [](const Recommendation& r) { return format_sci(r.params.total, 2); });
  add("params FLOP-active N_f", [](const Recommendation& r) { return format_sci(r.params.flop_active, 2); });
  add("  range (eps)",
      [](const Recommendation& r) { return range_text(r.n_flop_active_range, short_sci); });
  add("tokens D", [](const Recommendation& r) { return format_sci(r.tokens, 2); });
  add("  range (eps)",
      [](const Recommendation& r) { return range_text(r.tokens_range, short_sci); });
  add("tokens / N_f",
      [](const Recommendation& r) { return format_fixed(r.tokens / r.params.flop_active, 1); });
  add("fwd FLOPs / token", [](const Recommendation& r) { return format_sci(r.flops.forward_per_token, 2); });
  add("training FLOPs", [](const Recommendation& r) { return format_sci(r.train_flops_total, 2); });
  add("eps", [](const Recommendation& r) {
    return r.prior.known ? format_fixed(r.prior.eps, 4) : std::string("unknown");
  });
  add("  range", [](const Recommendation& r) {
    return r.prior.known ? range_text(r.eps_range, [](double v) { return format_fixed(v, 3); })
                         : std::string("-");
  });
  add("predicted loss",
      [](const Recommendation& r) { return r.loss ? format_fixed(*r.loss, 4) : std::string("unknown"); });
  add("  range (eps)", [](const Recommendation& r) {
    return r.loss_range ? range_text(*r.loss_range, [](double v) { return format_fixed(v, 3); })
                        : std::string("-");
  });
  if (gpus > 1) {
    // The layout in short rows (the one-line summary is in the note and JSON).
    add("layout TP x PP x DP", [](const Recommendation& r) {
      const ParallelConfig& p = r.config.parallel;
      return std::to_string(p.tensor) + " x " + std::to_string(p.pipeline) + " x " +
             std::to_string(std::max<int64_t>(1, p.data(r.config.device.count)));
    });
    add("  SP / v", [](const Recommendation& r) {
      const ParallelConfig& p = r.config.parallel;
      return std::string(p.sequence_parallel ? "SP" : "-") + " / " +
             std::to_string(p.virtual_stages);
    });
    add("  ZeRO / mb / recompute", [](const Recommendation& r) {
      return std::to_string(r.config.parallel.zero) + " / " +
             std::to_string(r.config.train.micro_batch) + " / " +
             to_string(r.config.train.recompute);
    });
  }
  add("peak memory / device", [](const Recommendation& r) {
    return format_fixed(r.memory.peak / (1024.0 * 1024.0 * 1024.0), 1) + " GiB" +
           (r.memory.fits ? "" : " NO FIT (see note)");
  });
  add("step time", [](const Recommendation& r) {
    return format_fixed(r.time.step_s * 1e3, 1) + " ms" + (r.time.extrapolated ? "*" : "");
  });
  add("tokens / s", [](const Recommendation& r) { return format_sci(r.time.tokens_per_s, 2); });
  add("MFU", [](const Recommendation& r) { return format_fixed(100 * r.time.mfu, 1) + "%"; });
  add("  full attention square", [](const Recommendation& r) {
    return format_fixed(100 * r.time.mfu_full_attention, 1) + "%";
  });
  add("wall-clock", [](const Recommendation& r) { return format_fixed(r.train_hours, 1) + " h"; });
  add("  days", [](const Recommendation& r) { return format_fixed(r.train_hours / 24.0, 2); });
  add("GPU-hours", [gpus](const Recommendation& r) { return format_sci(r.train_hours * double(gpus), 2); });
  add("x params (vs baseline)",
      [](const Recommendation& r) { return format_fixed(r.ratio_params_total, 2); });
  add("x fwd FLOPs / token",
      [](const Recommendation& r) { return format_fixed(r.ratio_forward_flops, 2); });
  add("  curve minimum", [](const Recommendation& r) {
    return r.curve_forward_flops ? format_fixed(r.ratio_curve_forward_flops, 2) : std::string("-");
  });
  add("x wall-clock to train",
      [](const Recommendation& r) { return format_fixed(r.ratio_train_hours, 2); });
  add("x time per step", [](const Recommendation& r) { return format_fixed(r.ratio_step_time, 2); });
  add("  range (eps)", [](const Recommendation& r) {
    return range_text(r.step_time_ratio_range, [](double v) { return format_fixed(v, 2); });
  });
  return rows;
}

// The "flags" row (one [n] per flag) and the lines [n] explaining each.
std::vector<std::string> add_flag_rows(const std::vector<Recommendation>& recs, TableRows& rows) {
  std::vector<std::string> flag_lines;
  std::vector<std::string> cells;
  for (const Recommendation& rec : recs) {
    std::string cell;
    for (const PlannerFlag& flag : rec.flags) {
      // Appended piece by piece: one long chain trips GCC 12's false -Wrestrict.
      std::string line = "[";
      line += std::to_string(flag_lines.size() + 1);
      line += "] ";
      line += rec.arch;
      line += rec.role == "isoflop_optimal" ? " optimal: " : " parity-fastest: ";
      line += flag.code;
      line += ": ";
      line += flag.message;
      flag_lines.push_back(line);
      if (!cell.empty()) {
        cell += ",";
      }
      cell += std::to_string(flag_lines.size());
    }
    cells.push_back(cell.empty() ? "-" : "[" + cell + "]");
  }
  rows.emplace_back("flags", cells);
  return flag_lines;
}

// The rows, labels left-aligned and cells right-aligned.
std::string render_rows(const TableRows& rows, size_t columns) {
  std::string out;
  size_t label_width = 0;
  std::vector<size_t> widths(columns, 0);
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
  return out;
}

// Legend, flags, same-shape comparison, priors, notes, conventions, search space.
std::string table_footer(const OptimalResult& result, const std::vector<std::string>& flag_lines) {
  const ShapeSearchOptions& shapes = result.settings.run.shapes;
  const std::vector<Recommendation>& recs = result.recommendations;
  std::string out;
  const bool starred = std::any_of(recs.begin(), recs.end(),
                                   [](const Recommendation& r) { return r.time.extrapolated; });
  out += std::string("\n(") +
         (starred ? "* = some op time extrapolated outside the profile's measured grid; " : "") +
         "ranges: the rule re-run at both ends of the prior's eps range; x wall-clock to train "
         "counts every token the budget buys, x time per step one optimizer step)\n";
  if (!flag_lines.empty()) {
    out += "\nflags:\n";
    for (const std::string& line : flag_lines) {
      out += "  " + line + "\n";
    }
  }
  if (!result.same_shape.empty()) {
    out += "\nsame shape as the optimal baseline (" + std::to_string(recs.front().shape.n_layers) +
           " x " + std::to_string(recs.front().shape.d_model) + ", same FLOP budget):\n";
    for (const SameShapeComparison& same : result.same_shape) {
      out += "  " + same.arch + ": loss " +
             (same.loss ? format_fixed(same.loss->value, 4) + " (" +
                              range_text(*same.loss, [](double v) { return format_fixed(v, 4); }) + ")"
                        : std::string("unknown")) +
             " vs baseline " + format_fixed(same.baseline_loss, 4) + ", x fwd FLOPs/token " +
             format_fixed(same.ratio_forward_flops, 2) + ", x step time " +
             format_fixed(same.ratio_step_time, 2) + (same.fits ? "" : " (NO FIT)") + "\n";
    }
  }
  out += "\npriors:\n";
  for (const EfficiencyPrior& prior : result.priors) {
    out += "  " + prior.key + ": " +
           (prior.known ? "eps = " + format_fixed(prior.eps, 4) : std::string("unknown")) + " -- " +
           prior.source + "\n";
    if (prior.key != "baseline") {
      std::string indented = "    ";
      const std::string text =
          prior.interval.empty() ? prior.derivation : prior.derivation + "\n" + prior.interval;
      for (const char c : text) {
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
  out += "search: every shape with " + std::to_string(shapes.min_layers) + "-" +
         std::to_string(shapes.max_layers) + " layers, d_model a multiple of " +
         std::to_string(shapes.d_model_multiple) + " (d_head 64 below 2048, else 128), " +
         "aspect d/L in [" + format_number(shapes.aspect_min) + ", " +
         format_number(shapes.aspect_max) + "]; losses within " +
         format_number(100 * kLossTieRelative) + "% tie, deepest wins; " +
         std::to_string(result.candidates_evaluated) +
         " shapes scored (the rest provably worse), " + std::to_string(result.cost_evaluations) +
         " timed\n";
  return out;
}

}  // namespace

std::string to_table(const OptimalResult& result) {
  TableRows rows = recommendation_rows(result);
  const std::vector<std::string> flag_lines = add_flag_rows(result.recommendations, rows);
  return table_header(result) + render_rows(rows, result.recommendations.size()) +
         table_footer(result, flag_lines);
}

}  // namespace modar
