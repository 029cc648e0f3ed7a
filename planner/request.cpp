// The planner's requests resolved (include/modar/planner.hpp, "requests"):
// the one place the defaults of optimal and sweep are written and every
// value the user gave is checked, so that the CLI and Python only pass what
// the user said and cannot drift apart.  Errors name request fields
// ("gpus = 0: must be >= 1") and config fields, never CLI flags.
#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "modar/base/errors.hpp"
#include "modar/base/text.hpp"
#include "modar/layout_search.hpp"
#include "modar/planner.hpp"
#include "planner_internal.hpp"

namespace modar {

namespace {

// The defaults of the requests (documented at each field).
constexpr const char* kDefaultFit = "epoch";
constexpr int64_t kDefaultGpus = 1;
constexpr double kDefaultGridStep = 1.05;
constexpr double kDefaultGridHalfWidth = 6.0;
// A sweep's grid: finer than 0.1 % or a window wider than 1000x either side
// is no isoFLOP curve any more (and its row count explodes).
constexpr double kMinGridStep = 1.001;
constexpr double kMaxGridStep = 10.0;
constexpr double kMaxGridHalfWidth = 1000.0;

std::vector<std::string> default_optimal_archs() {
  return {"baseline", "mod", "dar", "mod+dar"};
}

std::vector<std::string> default_sweep_archs() {
  return {"baseline", "mod"};
}

// `field = value: must be ...` for a budget (positive, finite, in (least, most]).
void check_budget_value(const char* field, const char* unit, double value, double least,
                        double most) {
  if (!std::isfinite(value) || !(value > 0) || value < least || value > most) {
    throw ConfigError(std::string(field) + " = " + format_number(value) +
                      ": must be a positive finite number of " + unit +
                      (least > 0 ? " >= " + format_number(least) + " and" : std::string()) +
                      " <= " + format_number(most));
  }
}

// A ConfigError from validating a configuration the request built, with the
// config keys that came from request fields named as those fields.
void validate_naming_request_fields(const Config& config,
                                    const std::vector<std::pair<std::string, std::string>>& names) {
  try {
    validate(config);
  } catch (const ConfigError& e) {
    std::string message = e.what();
    for (const auto& [key, field] : names) {
      for (size_t at = message.find(key); at != std::string::npos;
           at = message.find(key, at + field.size())) {
        message.replace(at, key.size(), field);
      }
    }
    throw ConfigError(message);
  }
}

// Keys of `base` the user set: the ones named, and every one whose value is
// not the default's.
std::set<std::string> keys_set(const Config& base, const std::vector<std::string>& named) {
  std::set<std::string> set(named.begin(), named.end());
  const auto values = config_values(base);
  const auto defaults = config_values(Config{});
  for (size_t i = 0; i < values.size() && i < defaults.size(); ++i) {
    if (values[i].second != defaults[i].second) {
      set.insert(values[i].first);
    }
  }
  return set;
}

// The base configuration may not describe an architecture of its own: the
// knobs set it per architecture (silently dropping a [mod] would answer a
// question the user did not ask).  Its [moe] is allowed: the experts of the
// architectures that have them (PlannerRun::experts).
void check_base_has_no_architecture(const Config& base) {
  if (base.mod.enabled()) {
    throw ConfigError("base mod.every = " + std::to_string(base.mod.every) +
                      ": the planner sets MoD per architecture; allowed: a base configuration "
                      "without [mod] (choose arch = mod with capacity and every)");
  }
  if (base.dar.enabled()) {
    throw ConfigError(std::string("base dar.variant = \"") + to_string(base.dar.variant) +
                      "\": the planner sets DAR per architecture; allowed: a base configuration "
                      "without [dar] (choose arch = dar with block_layers and streams)");
  }
}

// An architecture knob the user gave that no requested architecture uses is
// refused rather than ignored.
void check_knob_used(const char* field, bool given, bool used,
                     const std::vector<std::string>& archs, const char* needs) {
  if (!given || used) {
    return;
  }
  std::string list;
  for (const std::string& a : archs) {
    list += (list.empty() ? "" : ", ") + a;
  }
  throw ConfigError(std::string(field) + ": no requested architecture (arch = " + list +
                    ") uses it; allowed: with an architecture that has " + needs);
}

// MoD routing every N-th layer and a DAR block of K layers need that many
// layers: refuse values the shape search's depth range can never hold.
void check_depth_knob(const char* field, int64_t value, const ShapeSearchOptions& shapes,
                      const char* what) {
  if (value > shapes.max_layers) {
    throw ConfigError(
        std::string(field) + " = " + std::to_string(value) + ": " + what + " needs at least " +
        std::to_string(value) +
        " layers, but the shape search stops at n_layers = " + std::to_string(shapes.max_layers) +
        "; allowed: " + field + " in [1, " + std::to_string(shapes.max_layers) + "]");
  }
}

bool any_of_archs(const std::vector<std::string>& archs, bool (*has)(const std::string&)) {
  return std::any_of(archs.begin(), archs.end(), has);
}

// `text` as a number followed by one of `units` (suffix -> multiplier; ""
// for a bare number); nullopt when it is not of that form.
std::optional<double> number_with_unit(const std::string& text,
                                       const std::vector<std::pair<std::string, double>>& units) {
  std::string trimmed = text;
  trimmed.erase(0, trimmed.find_first_not_of(" \t"));
  trimmed.erase(trimmed.find_last_not_of(" \t") + 1);
  for (const auto& [suffix, multiplier] : units) {
    if (trimmed.size() <= suffix.size() ||
        trimmed.compare(trimmed.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    std::string number = trimmed.substr(0, trimmed.size() - suffix.size());
    number.erase(number.find_last_not_of(" \t") + 1);
    double value = 0.0;
    if (parse_finite_number_text(number, &value)) {
      return value * multiplier;
    }
  }
  double value = 0.0;
  if (parse_finite_number_text(trimmed, &value)) {
    return value;
  }
  return std::nullopt;
}

}  // namespace

namespace {

const std::vector<std::pair<std::string, double>>& gpu_hour_units() {
  static const std::vector<std::pair<std::string, double>> units = {
      {"k", 1e3}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}};
  return units;
}

const std::vector<std::pair<std::string, double>>& day_units() {
  static const std::vector<std::pair<std::string, double>> units = {
      {"days", 1.0}, {"day", 1.0},          {"d", 1.0},           {"weeks", 7.0},   {"week", 7.0},
      {"w", 7.0},    {"hours", 1.0 / 24.0}, {"hour", 1.0 / 24.0}, {"h", 1.0 / 24.0}};
  return units;
}

}  // namespace

double parse_gpu_hours(const std::string& text, const BudgetFieldNames& names) {
  if (const auto value = number_with_unit(text, gpu_hour_units())) {
    return *value;
  }
  const std::string shown = shown_value(text);
  const std::string hint = number_with_unit(text, day_units())
                               ? "; " + shown + " is a wall-clock duration: give " + names.days +
                                     names.set + shown + " with " + names.gpus + names.set + "N"
                               : "";
  throw ConfigError(names.gpu_hours + " = " + shown +
                    ": not a number of GPU-hours; allowed: the GPU-hours of all GPUs together, a "
                    "number with an optional k, M or G (2e5, 86016, 200k)" +
                    hint);
}

double parse_days(const std::string& text, const BudgetFieldNames& names) {
  if (const auto value = number_with_unit(text, day_units())) {
    return *value;
  }
  const std::string shown = shown_value(text);
  const std::string hint =
      number_with_unit(text, gpu_hour_units())
          ? "; " + shown + " reads as GPU-hours: give " + names.gpu_hours + names.set + shown
          : "";
  throw ConfigError(names.days + " = " + shown +
                    ": not a wall-clock duration; allowed: days (14 or 14d), weeks (2w) or hours "
                    "(336h)" +
                    hint);
}

PlannerRun resolve_planner_run(const PlannerRunRequest& request) {
  PlannerRun run;
  run.fit = load_fit(request.fit.value_or(kDefaultFit));
  for (const auto& [arch, eps] : request.eps) {
    check_eps_key(arch);
    check_eps_override(arch, eps);
  }
  run.eps = request.eps;
  check_shape_search_options(request.shapes);
  run.shapes = request.shapes;

  const std::set<std::string> given = keys_set(request.base, request.base_keys);
  Config base = request.base;
  check_base_has_no_architecture(base);
  // moe.* in the base: the experts of the architectures that have them.
  run.experts = base.moe;
  base.moe = MoeConfig{};
  // The base's [device] / [cluster] are the user's too: honoured as the
  // defaults of gpus, profile and gpus_per_node; contradicting them is refused.
  const auto from_base = [&](const char* field, const std::optional<int64_t>& asked,
                             const char* key, int64_t base_value) -> std::optional<int64_t> {
    if (given.count(key) == 0) {
      return asked;
    }
    if (asked && *asked != base_value) {
      throw ConfigError(std::string(field) + " = " + std::to_string(*asked) +
                        ": the base "
                        "configuration sets " +
                        key + " = " + std::to_string(base_value) +
                        "; allowed: one of them, or the same value");
    }
    return base_value;
  };
  run.gpus =
      from_base("gpus", request.gpus, "device.count", base.device.count).value_or(kDefaultGpus);
  if (run.gpus < 1) {
    throw ConfigError("gpus = " + std::to_string(run.gpus) + ": must be >= 1");
  }
  const std::optional<int64_t> per_node = from_base(
      "gpus_per_node", request.gpus_per_node, "cluster.gpus_per_node", base.cluster.gpus_per_node);
  if (per_node) {
    if (*per_node < 1) {
      throw ConfigError("gpus_per_node = " + std::to_string(*per_node) + ": must be >= 1");
    }
    if (run.gpus == 1) {
      throw ConfigError("gpus_per_node = " + std::to_string(*per_node) +
                        ": only used on a cluster; allowed: with gpus > 1");
    }
    run.gpus_per_node = *per_node;
  }
  if (request.profile) {
    run.profile_ref = *request.profile;
    if (given.count("device.profile") != 0 && base.device.profile != *request.profile) {
      throw ConfigError("profile = \"" + shown_value(*request.profile) +
                        "\": the base configuration sets device.profile = \"" +
                        shown_value(base.device.profile) + "\"; allowed: one of them");
    }
  } else {
    run.profile_ref = base.device.profile;  // the config's default is default_profile_name()
  }
  run.profile = load_profile(run.profile_ref);

  const bool cluster = run.gpus > 1;
  if (cluster && !base.parallel.is_default()) {
    throw ConfigError("base [parallel]: on a cluster (gpus = " + std::to_string(run.gpus) +
                      ") the layout search chooses the parallel layout; allowed: a base "
                      "configuration without [parallel]");
  }
  run.micro_batch_fixed = given.count("train.micro_batch") != 0;
  run.recompute_fixed = given.count("train.recompute") != 0;
  base.device.profile = run.profile_ref;
  base.cluster.gpus_per_node = run.gpus_per_node;
  // One device: the configuration as given.  A cluster: the model's fields
  // are validated on one device (micro-batch 1 unless fixed), the layout
  // search checks the rest per layout.
  Config check = base;
  check.device.count = cluster ? 1 : run.gpus;
  check.cluster = ClusterConfig{};
  if (cluster && !run.micro_batch_fixed) {
    check.train.micro_batch = 1;
  }
  const std::vector<std::pair<std::string, std::string>> request_fields = {
      {"device.count", "gpus"}, {"cluster.gpus_per_node", "gpus_per_node"}};
  validate_naming_request_fields(check, request_fields);
  if (cluster) {
    // The device count and the nodes (their bounds), the batch left to the layouts.
    Config devices = check;
    devices.device.count = run.gpus;
    devices.cluster.gpus_per_node = run.gpus_per_node;
    devices.train.global_batch = 0;
    validate_naming_request_fields(devices, request_fields);
  }
  base.device.count = run.gpus;
  if (cluster) {
    // The step every layout splits (the layout search's global batch); the
    // shapes' own configs leave it to the layouts.
    run.global_batch = layout_global_batch(base, LayoutSearchOptions{});
    base.train.global_batch = 0;
  } else {
    run.global_batch =
        base.train.global_batch > 0 ? base.train.global_batch : base.train.micro_batch;
  }
  run.base = base;
  return run;
}

std::string global_batch_default_text(const Config& base) {
  Config cluster = base;
  cluster.train.global_batch = 0;
  return "micro_batch x gpus on one GPU (" + std::to_string(base.train.micro_batch) +
         " at the defaults); on a cluster the sequences of ~4M tokens (" +
         std::to_string(layout_global_batch(cluster, LayoutSearchOptions{})) + " at seq_len " +
         std::to_string(base.model.seq_len) + ")";
}

OptimalSettings resolve_optimal(const OptimalRequest& request) {
  OptimalSettings settings;
  settings.run = resolve_planner_run(request);
  const PlannerRun& run = settings.run;
  if (request.flops) {
    check_budget_value("flops", "FLOPs", *request.flops, kMinTrainFlops, kMaxTrainFlops);
    settings.flops = request.flops;
  }
  if (request.gpu_hours && request.days) {
    throw ConfigError("gpu_hours = " + format_number(*request.gpu_hours) +
                      " and days = " + format_number(*request.days) +
                      ": both are the wall-clock budget; allowed: one of them");
  }
  if (request.gpu_hours) {
    check_budget_value("gpu_hours", "GPU-hours", *request.gpu_hours, 0.0, kMaxGpuHours);
    settings.gpu_hours = request.gpu_hours;
  }
  if (request.days) {
    check_budget_value("days", "days", *request.days, 0.0, kMaxDays);
    settings.days = request.days;
    settings.gpu_hours = *request.days * 24.0 * double(run.gpus);
  }
  const std::vector<std::string> names =
      request.arch.empty() ? default_optimal_archs() : request.arch;
  const bool mod = any_of_archs(names, arch_has_mod);
  const bool dar = any_of_archs(names, arch_has_dar);
  check_knob_used("capacity", request.capacity.has_value(), mod, names, "MoD (mod, mod+dar, ...)");
  check_knob_used("every", request.every.has_value(), mod, names, "MoD (mod, mod+dar, ...)");
  check_knob_used("block_layers", request.block_layers.has_value(), dar, names,
                  "DAR (dar, mod+dar, ...)");
  check_knob_used("streams", request.streams.has_value(), dar, names, "DAR (dar, mod+dar, ...)");
  settings.capacity = request.capacity.value_or(kDefaultModCapacity);
  settings.every = request.every.value_or(kDefaultModEvery);
  settings.block_layers = request.block_layers.value_or(kDefaultDarBlockLayers);
  settings.streams = request.streams.value_or(kDefaultDarStreams);
  check_experts_used(run.experts, names);
  for (const std::string& name : names) {
    ArchSpec arch =
        make_arch(name, settings.capacity, settings.every, settings.block_layers, settings.streams);
    arch.moe = planned_experts(arch, run.experts);  // the user's moe.* settings
    const bool duplicate = std::any_of(settings.archs.begin(), settings.archs.end(),
                                       [&](const ArchSpec& a) { return a.name == name; });
    if (!duplicate) {
      settings.archs.push_back(arch);
    }
  }
  if (mod) {
    check_depth_knob("every", settings.every, run.shapes, "MoD routing every N-th layer");
  }
  if (dar) {
    check_depth_knob("block_layers", settings.block_layers, run.shapes, "a DAR block of K layers");
  }
  return settings;
}

SweepSettings resolve_sweep(const SweepRequest& request) {
  SweepSettings settings;
  settings.run = resolve_planner_run(request);
  const PlannerRun& run = settings.run;
  if (request.flops.empty()) {
    throw ConfigError("flops: no budget; allowed: one or more training-FLOP budgets");
  }
  for (const double budget : request.flops) {
    check_budget_value("flops", "FLOPs", budget, kMinTrainFlops, kMaxTrainFlops);
  }
  settings.flops = request.flops;
  const std::vector<std::string> names =
      request.arch.empty() ? default_sweep_archs() : request.arch;
  const bool mod = any_of_archs(names, arch_has_mod);
  const bool dar = any_of_archs(names, arch_has_dar);
  check_knob_used("capacity", !request.capacity.empty(), mod, names, "MoD (mod, mod+dar, ...)");
  check_knob_used("every", !request.every.empty(), mod, names, "MoD (mod, mod+dar, ...)");
  check_knob_used("block_layers", !request.block_layers.empty(), dar, names,
                  "DAR (dar, mod+dar, ...)");
  check_knob_used("streams", !request.streams.empty(), dar, names, "DAR (dar, mod+dar, ...)");
  const auto or_default = [](const auto& values, auto fallback) {
    using T = typename std::decay_t<decltype(values)>::value_type;
    return values.empty() ? std::vector<T>{static_cast<T>(fallback)} : values;
  };
  const std::vector<double> capacities = or_default(request.capacity, kDefaultModCapacity);
  const std::vector<int64_t> everys = or_default(request.every, kDefaultModEvery);
  const std::vector<int64_t> blocks = or_default(request.block_layers, kDefaultDarBlockLayers);
  const std::vector<int64_t> streams = or_default(request.streams, kDefaultDarStreams);
  if (mod) {
    for (const int64_t every : everys) {
      check_depth_knob("every", every, run.shapes, "MoD routing every N-th layer");
    }
  }
  if (dar) {
    for (const int64_t k : blocks) {
      check_depth_knob("block_layers", k, run.shapes, "a DAR block of K layers");
    }
  }
  check_experts_used(run.experts, names);
  for (const std::string& name : names) {
    const bool has_mod = arch_has_mod(name);
    const bool has_dar = arch_has_dar(name);
    for (const double c : has_mod ? capacities : std::vector<double>{kDefaultModCapacity}) {
      for (const int64_t e : has_mod ? everys : std::vector<int64_t>{kDefaultModEvery}) {
        for (const int64_t k : has_dar ? blocks : std::vector<int64_t>{kDefaultDarBlockLayers}) {
          for (const int64_t n : has_dar ? streams : std::vector<int64_t>{kDefaultDarStreams}) {
            ArchSpec variant = make_arch(name, c, e, k, n);
            variant.moe = planned_experts(variant, run.experts);  // the user's moe.* settings
            settings.variants.push_back(variant);
          }
        }
      }
    }
  }
  settings.with_time = request.with_time.value_or(true);
  settings.grid_step = request.grid_step.value_or(kDefaultGridStep);
  settings.grid_half_width = request.grid_half_width.value_or(kDefaultGridHalfWidth);
  if (!std::isfinite(settings.grid_step) || settings.grid_step < kMinGridStep ||
      settings.grid_step > kMaxGridStep) {
    throw ConfigError("grid_step = " + format_number(settings.grid_step) + ": must be in [" +
                      format_number(kMinGridStep) + ", " + format_number(kMaxGridStep) +
                      "] (the ratio of consecutive N_f targets of a curve)");
  }
  if (!std::isfinite(settings.grid_half_width) || !(settings.grid_half_width > 1.0) ||
      settings.grid_half_width > kMaxGridHalfWidth) {
    throw ConfigError("grid_half_width = " + format_number(settings.grid_half_width) +
                      ": must be in (1, " + format_number(kMaxGridHalfWidth) +
                      "] (a curve spans N_f* / w .. N_f* x w)");
  }
  return settings;
}

}  // namespace modar
