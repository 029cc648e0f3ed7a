// modar/planner.hpp: scaling laws, architecture priors, shape search and the
// isoFLOP- / wall-clock-optimal recommendations (docs/planner.md).
//
// The planner never counts a FLOP, a parameter, a byte or a second itself: every
// such number comes from cost_model.hpp (count_params, count_flops,
// estimate_memory, estimate).  What lives here is the loss model
//
//     L(N_f, D) = E + eps * A / N_f^alpha + B / D^beta,
//
// with N_f = ParamCounts::flop_active, the search over concrete shapes, and the
// selection rules.  Training FLOPs C = 3 * F_fwd(per token) * D (model FLOPs).
//
// The CLI (`modar optimal | sweep | fit`) and the Python bindings call exactly
// these functions; the JSON text the CLI prints is to_json(...) of the results.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "modar/base/run_control.hpp"
#include "modar/config.hpp"
#include "modar/cost_model.hpp"

namespace modar {

// ---- loss model and fits (planner/scaling_law.cpp) --------------------------

struct LossFitParams {
  double E = 0.0;
  double A = 0.0;
  double B = 0.0;
  double alpha = 0.0;
  double beta = 0.0;
};

struct LossFit {
  std::string name;    // "epoch", "hoffmann", or the file it was read from
  std::string source;  // citation or "modar fit <file>"
  LossFitParams params;
  std::optional<LossFitParams> standard_errors;  // bootstrap SE, when known
};

// Built-in fits: "epoch" (Besiroglu et al. 2024, the default) and "hoffmann"
// (Hoffmann et al. 2022, approach 3, as printed).
std::vector<std::string> builtin_fit_names();
// A built-in name, or a path to a fit TOML written by `modar fit`.  Throws
// ConfigError (unknown name) or FileError (missing / malformed file).
LossFit load_fit(const std::string& name_or_path);
LossFit parse_fit_toml(const std::string& toml_text, const std::string& source_name);
std::string to_toml(const LossFit& fit);
void save_fit_atomically(const LossFit& fit, const std::string& path);

// An efficiency prior outside [kEpsMin, kEpsMax] is refused (docs/planner.md
// "Architecture priors"): eps scales the parameter term A / N_f^alpha (MoD's
// the whole reducible loss).  Under the built-in fits a parameter-term eps
// below 0.25 moves the compute-optimal model to 50x or more the dense
// optimum's tokens per parameter (about 1000 at 1e20 FLOPs, twice the band
// the fits were made on), and a reducible-loss eps below 0.25 claims a
// quarter of the dense model's reducible loss at equal compute; above 1.5 an
// architecture would need 3x the dense model's parameters for its loss.  The
// published priors and their ranges lie in 0.68 .. 0.98.
constexpr double kEpsMin = 0.25;
constexpr double kEpsMax = 1.5;
// Budgets: finite and within these (beyond them no shape exists and
// products such as hours x FLOP/s would overflow; below one FLOP the closed
// form divides by zero).
constexpr double kMinTrainFlops = 1.0;
constexpr double kMaxTrainFlops = 1e35;
constexpr double kMaxGpuHours = 1e15;
constexpr double kMaxDays = 36525.0;  // a century of wall-clock

// E + eps * A / N_f^alpha + B / D^beta.
double predicted_loss(const LossFitParams& fit, double eps, double n_flop_active, double tokens);

// Multipliers of the two reducible terms: E + params A / N_f^alpha + data B / D^beta.
// A prior acting on the parameter term only is {eps, 1}; one acting on the
// whole reducible loss (MoD: docs/planner.md "Where the MoD prior acts") is
// {eps, eps}.
// `total` multiplies the whole predicted loss: a penalty on the objective
// itself (MoD's causal aux-loss router: 1.0025; docs/planner.md "Causal
// routing").
struct LossScale {
  double params = 1.0;
  double data = 1.0;
  double total = 1.0;
};
double predicted_loss(const LossFitParams& fit, LossScale scale, double n_flop_active,
                      double tokens);

// Hoffmann eq. 4 under C = 6 N D (docs/planner.md): G = (alpha eps A / (beta B))^(1/(alpha+beta)),
// N* = G (C/6)^(beta/(alpha+beta)), D* = (C/6)^(alpha/(alpha+beta)) / G.
struct ClosedFormOptimum {
  double G = 0.0;
  double n_opt = 0.0;
  double tokens_opt = 0.0;
  double loss = 0.0;
};
ClosedFormOptimum closed_form_optimum(const LossFitParams& fit, double train_flops,
                                      double eps = 1.0);
// The same with both terms scaled: G = (alpha s_p A / (beta s_d B))^(1/(alpha+beta)).
ClosedFormOptimum closed_form_optimum(const LossFitParams& fit, double train_flops,
                                      LossScale scale);
// The same for what a user asked (Python's modar.closed_form_optimum): flops
// required, fit default "epoch", eps default 1 on the parameter term; flops
// and eps checked as the planner's requests check them (kMaxTrainFlops,
// [kEpsMin, kEpsMax]).
struct ClosedFormRequest {
  std::optional<double> flops;
  std::optional<std::string> fit;
  std::optional<double> eps;
};
ClosedFormOptimum closed_form_optimum(const ClosedFormRequest& request);

// ---- architecture efficiency priors (planner/priors.cpp) --------------------

// eps for one architecture configuration under one fit.  known = false means no
// published prior exists: the planner then reports FLOPs, memory and time and
// marks the loss unknown (JSON null) instead of guessing.
// Where a prior's eps multiplies the loss: the parameter term only (DAR,
// experts: eps A / N_f^alpha) or the whole reducible loss (MoD: eps (A /
// N_f^alpha + B / D^beta), the routed model behaving as the baseline of equal
// forward FLOPs per token with its reducible loss scaled; docs/planner.md).
// Experts act on the data term (eps B / D^beta: figure 7's gain grows with the
// FLOPs per token at a fixed budget; docs/moe.md "Planner priors").
enum class PriorTerm { parameters, reducible, data };

struct EfficiencyPrior {
  bool known = false;
  double eps = 1.0;
  PriorTerm acts_on = PriorTerm::parameters;
  std::string key;         // "baseline", "mod", "dar", "mod+dar"
  std::string source;      // paper and figure / table, or "--eps override"
  std::string derivation;  // the arithmetic, one step per line
  // The range of eps its sources support (docs/planner.md "Uncertainty"): the
  // envelope of the figure-reading / printing precision (95 %), the spread of
  // its points, and the fit's E +- 1.96 standard errors when the fit has
  // them.  eps_low = eps = eps_high for the baseline and --eps overrides.
  double eps_low = 1.0;
  double eps_high = 1.0;
  std::string interval;  // how the range was derived, one step per line
  int64_t points = 0;    // published data points behind eps (0: definition / override)
  // Where the prior was measured (0 = not applicable): model sizes, in
  // `size_measure` ("params_total" or "non_embedding"), the training budgets
  // and the tokens per parameter of the measured runs.
  std::string size_measure;
  double measured_size_min = 0.0;
  double measured_size_max = 0.0;
  double measured_budget_min = 0.0;
  double measured_budget_max = 0.0;
  double measured_tokens_per_param = 0.0;
  // Relative penalty on the whole loss (LossScale::total = 1 + it): MoD
  // trained with the causal auxiliary BCE router (mod.causal_router =
  // aux_loss), MoD paper 3.5 "approximately 0.2-0.3%"; 0 otherwise.
  double loss_penalty = 0.0;
  // A second factor on the whole reducible loss, fixed (not part of the eps
  // range): staged MoDE's MoD prior beside its experts' data-term eps.
  double reducible_factor = 1.0;
  // A second factor on the parameter term, fixed (not part of the eps range):
  // the experts' figure-7 priors fit one factor on each reducible term (eps on
  // the data term, this on the parameter term; docs/moe.md).
  double params_factor = 1.0;
};

// `eps` placed where `prior` acts (its eps, eps_low or eps_high).
LossScale loss_scale(const EfficiencyPrior& prior, double eps);

// eps overrides: "mod=0.94,dar=0.97" -> {"mod": 0.94, "dar": 0.97}.  Keys are
// architecture names (baseline, mod, dar, mod+dar, attnres, moe, mode-staged,
// mode-integrated, each also +dar); values in [kEpsMin, kEpsMax] (below).
// Errors name the field `eps`.
using EpsOverrides = std::map<std::string, double>;
EpsOverrides parse_eps_overrides(const std::string& text);
// One override checked: a known key (check_eps_key) and a value inside the
// meaningful range; throws ConfigError "eps[mod] = 1e-300: ...".
void check_eps_key(const std::string& arch);
void check_eps_override(const std::string& arch, double eps);

// Prior for a concrete configuration: which architecture it is follows from
// config.mod / config.dar.  Published priors: MoD capacity 0.125 every 2 (MoD
// paper section 4.1, figure 4 minima); DAR n = 2, default retrieval (DAR paper
// table 3 text: -2.03 / -2.22 / -5.12 %).  Everything else is unknown unless
// overridden.
EfficiencyPrior efficiency_prior(const Config& config, const LossFit& fit,
                                 const EpsOverrides& overrides = {});
// The derivations of the two published priors under `fit` (for docs / output).
std::vector<EfficiencyPrior> published_priors(const LossFit& fit);

// ---- architectures -----------------------------------------------------------

struct ArchSpec {
  std::string name = "baseline";  // baseline | mod | dar | mod+dar
  ModConfig mod;                  // every = 0 for baseline / dar
  DarConfig dar;                  // variant none for baseline / mod
  MoeConfig moe;                  // experts = 0 unless moe / mode-* (docs/moe.md)
};
// Architecture names with experts: moe, mode-staged, mode-integrated (each
// also "+dar").  Whether a name carries MoD routing (mod, mod+dar,
// mode-staged[+dar]) or DAR (a "+dar" suffix or "dar").
bool arch_has_mod(const std::string& name);
bool arch_has_dar(const std::string& name);
std::vector<std::string> arch_names();
// Apply the MoD / DAR knobs to the architecture name; throws ConfigError on an
// unknown name (listing the allowed ones).
// The knobs' defaults: the MoD paper's best variant (12.5 %, every other
// layer) and the DAR paper's setting (blocks of 2 layers, 2 streams).
constexpr double kDefaultModCapacity = 0.125;
constexpr int64_t kDefaultModEvery = 2;
constexpr int64_t kDefaultDarBlockLayers = 2;
constexpr int64_t kDefaultDarStreams = 2;
ArchSpec make_arch(const std::string& name, double capacity = kDefaultModCapacity,
                   int64_t every = kDefaultModEvery,
                   int64_t dar_block_layers = kDefaultDarBlockLayers,
                   int64_t dar_streams = kDefaultDarStreams);

// The experts an architecture with experts is planned with.  Without moe.*
// settings (user.experts == 0): the architecture's (make_arch: 8 experts of
// the dense width, top-1, the MoD paper's figure-7 setting).  With them: the
// user's experts, top-k, expert and shared widths, shared experts and gate,
// layer pattern, capacity factor, loss coefficients and load imbalance; the
// architecture keeps its MoDE mode (integrated MoDE keeps 8 null experts and
// capacity factor 1 unless the user set them).  An architecture without
// experts keeps none.
MoeConfig planned_experts(const ArchSpec& arch, const MoeConfig& user);
// A one-line description of an architecture's experts for tables and notes
// ("64 x 1408, top-8, 2 shared"; "-" without experts).
std::string experts_summary(const Config& config);
// Refuse moe.* settings no planned architecture can use: user.experts > 0
// and none of `archs` has experts (ConfigError naming moe.experts and the
// request's architectures).
void check_experts_used(const MoeConfig& user, const std::vector<std::string>& archs);

// ---- shape search (planner/shape_search.cpp) ---------------------------------

struct ShapeSearchOptions {
  double aspect_min = 32.0;   // d_model / n_layers band; the MoD paper found depth
  double aspect_max = 128.0;  // better than width, so ties break toward depth
  int64_t d_model_multiple = 128;
  int64_t min_layers = 2;
  int64_t max_layers = 256;
  int64_t max_d_model = 32768;
  int64_t gqa_group = 1;  // query heads per KV head (1 = MHA)
  // Shapes whose N_f is within this relative distance of the closest one count
  // as "equally close"; among them the deepest wins.
  double depth_tolerance = 0.05;
};

struct Shape {
  int64_t n_layers = 0;
  int64_t d_model = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t d_head = 0;
  int64_t d_ff = 0;
  double aspect_ratio() const { return double(d_model) / double(n_layers); }
};

// d_head = 64 below d_model 2048, else 128; KV heads per gqa_group; d_ff the
// MLP kind's default.  Writes the shape into a copy of `base`.
Shape make_shape(int64_t n_layers, int64_t d_model, const ModelConfig& base,
                 const ShapeSearchOptions& options);
Config with_shape(const Config& base, const Shape& shape);

struct ShapeCandidate {
  Shape shape;
  ParamCounts params;
  double forward_flops_per_token = 0.0;
  double train_flops_per_token = 0.0;  // model FLOPs: forward + backward
};

// All shapes of `base`'s architecture whose N_f lies in [n_f_min, n_f_max],
// sorted by N_f.  Counts come from count_params / count_flops.
std::vector<ShapeCandidate> enumerate_shapes(const Config& base, double n_f_min, double n_f_max,
                                             const ShapeSearchOptions& options);
// The shape whose N_f is closest to target_n_f (in log distance), preferring
// depth among near-ties.  Throws ConfigError if no shape exists in the band.
ShapeCandidate closest_shape(const Config& base, double target_n_f,
                             const ShapeSearchOptions& options);
// The search space's own rules (0 < aspect_min <= aspect_max, d_model
// multiple of 64, 1 <= min_layers <= max_layers, gqa_group >= 1, ...);
// throws ConfigError naming the field.
void check_shape_search_options(const ShapeSearchOptions& options);
// Same, over an already enumerated (N_f-sorted) table.
const ShapeCandidate* closest_in_table(const std::vector<ShapeCandidate>& table, double target_n_f,
                                       double depth_tolerance);

// ---- requests: what the user said (planner/request.cpp) ----------------------
//
// The CLI and Python fill a request with exactly what the user gave (unset
// fields stay empty) and the library resolves it: resolve_planner_run(),
// resolve_optimal() and resolve_sweep() are the one place the planner's
// defaults are written and every value is checked.  Errors name the request's
// fields as `field = value: what is allowed` ("gpus = 0: must be >= 1"), the
// names Python's arguments carry too; the CLI renames those the user typed to
// their flags.

// What optimal and sweep share: the loss law, the hardware, the base
// configuration and the shape search.
struct PlannerRunRequest {
  std::optional<std::string> fit;        // built-in name or fit TOML path; default "epoch"
  EpsOverrides eps;                      // arch -> eps override, each in [kEpsMin, kEpsMax]
  std::optional<std::string> profile;    // name or TOML path; default default_profile_name()
  std::optional<int64_t> gpus;           // default 1; > 1: a layout search per shape
  std::optional<int64_t> gpus_per_node;  // cluster; default the profile's network (docs/cluster.md)
  // The base configuration (seq_len, vocab, MLP kind, micro-batch, global
  // batch, recompute, dtype, ...): the config library's defaults unless set.
  // Its [mod], [dar] and [moe] must stay off: the architecture knobs below
  // set them per architecture.
  Config base;
  // Dotted keys of `base` the user set (flags, --set, keyword arguments); a
  // key whose value differs from the default counts as set too.  On a
  // cluster a set train.micro_batch / train.recompute is kept fixed by the
  // layout search instead of searched.
  std::vector<std::string> base_keys;
  ShapeSearchOptions shapes;  // the shape search space (its defaults are the library's)
};

// The resolved PlannerRunRequest: the one planner-run struct optimal and
// sweep search with.
struct PlannerRun {
  LossFit fit;
  EpsOverrides eps;
  std::string profile_ref;  // as given (a name or a path), for configs
  DeviceProfile profile;
  int64_t gpus = 1;
  int64_t gpus_per_node = 0;  // 0: the profile's network
  // Validated; device.count = gpus, device.profile = profile_ref, [mod],
  // [dar], [moe] off; global_batch resolved (below).
  Config base;
  // The base's moe.* settings: the experts the architectures with experts
  // are planned with (planned_experts; off: the architectures' own).
  MoeConfig experts;
  ShapeSearchOptions shapes;
  // On a cluster: the layout search keeps these as the user set them.
  bool micro_batch_fixed = false;
  bool recompute_fixed = false;
  // Sequences per optimizer step: the user's train.global_batch; else
  // micro_batch x gpus on one device, the sequences of ~4M tokens on a
  // cluster (layout_global_batch).
  int64_t global_batch = 0;
};
PlannerRun resolve_planner_run(const PlannerRunRequest& request);
// "micro_batch x gpus on one device (8 at the defaults); the sequences of
// ~4M tokens on a cluster (2048 at seq_len 2048)": the global batch's
// default in words, for --help.
std::string global_batch_default_text(const Config& base);

// ---- recommendations (planner/optimal.cpp) -----------------------------------

struct OptimalRequest : PlannerRunRequest {
  // At least one budget.  With a FLOP and a wall-clock budget, the tighter
  // one decides the tokens; gpu_hours and days are the same budget in two
  // units (give one).
  std::optional<double> flops;      // training-FLOP budget C (model FLOPs)
  std::optional<double> gpu_hours;  // device-hours (all devices together) on `profile`
  std::optional<double> days;       // wall-clock days on `gpus` devices (= days x 24 x gpus GPU-hours)
  std::vector<std::string> arch;    // architectures; empty: the default four
  std::optional<double> capacity;   // MoD capacity; default 0.125
  std::optional<int64_t> every;     // MoD routes every N-th layer; default 2
  std::optional<int64_t> block_layers;  // DAR layers per block K; default 2 (1 = Full DAR)
  std::optional<int64_t> streams;       // DAR streams n; default 2
};

// Budgets as people write them (the CLI's --gpu-hours and --days, Python's
// days="2w"): gpu_hours "2e5", "86016", "200k", "1.5M"; days "14", "14d",
// "2w", "336h".  The number only; its range is resolve_optimal()'s.  Throws
// ConfigError naming the field, the value and the forms allowed, and pointing
// a duration given as GPU-hours ("2w") to days, GPU-hours given as days
// ("200k") to gpu_hours.  `names` are the words the message uses for the
// three fields (the CLI passes its flags).
struct BudgetFieldNames {
  std::string gpu_hours = "gpu_hours";
  std::string days = "days";
  std::string gpus = "gpus";
  std::string set = " = ";  // between a name and its value in advice ("days = 2w")
};
double parse_gpu_hours(const std::string& text, const BudgetFieldNames& names = {});
double parse_days(const std::string& text, const BudgetFieldNames& names = {});

// The resolved OptimalRequest.
struct OptimalSettings {
  PlannerRun run;
  std::optional<double> flops;
  std::optional<double> gpu_hours;  // the wall-clock budget in device-hours (from days too)
  std::optional<double> days;       // as given
  std::vector<ArchSpec> archs;      // validated, duplicates dropped, in the order given
  double capacity = 0.0;
  int64_t every = 0;
  int64_t block_layers = 0;
  int64_t streams = 0;
};
// Defaults and checks; a missing budget is optimal()'s error, so the default
// request resolves (the CLI's --help shows its values).
OptimalSettings resolve_optimal(const OptimalRequest& request);

// A number with the range its inputs support (docs/planner.md
// "Uncertainty"); low / high are nullopt when that end has no answer (e.g. no
// shape reaches parity at the prior's pessimistic end).
struct ValueRange {
  double value = 0.0;
  std::optional<double> low;
  std::optional<double> high;
};

// Something a user must know before trusting a recommendation (JSON
// `flags[]`).  Codes: tokens_per_param_outside_fit, prior_single_point,
// prior_outside_measured_sizes, prior_outside_measured_budgets,
// prior_outside_measured_tokens_per_param, parity_smaller_than_measured,
// parity_outside_support, op_time_extrapolated, mfu_beyond_published
// (docs/kernel_model.md "Trust"), memory_decided, no_fit.
struct PlannerFlag {
  std::string code;
  std::string message;
};

// Tokens per FLOP-active parameter the built-in fits were made on (the
// Chinchilla runs both re-analyse, 44M-16B parameters at 6e18-3e21 FLOPs span
// roughly this band); outside it a prediction is an extrapolation of the law.
constexpr double kFitTokensPerParamMin = 2.0;
constexpr double kFitTokensPerParamMax = 500.0;
// A prior measured at a fixed tokens-per-parameter ratio (DAR: 20) is flagged
// when applied beyond this factor either side of it.
constexpr double kPriorTokensPerParamFactor = 2.0;
// Predicted losses within this relative distance of the minimum are ties; the
// deepest shape among them wins (the MoD paper: depth beats width).
constexpr double kLossTieRelative = 1e-4;

struct Recommendation {
  std::string arch;
  std::string role;       // "isoflop_optimal" | "parity_fastest"
  std::string selection;  // how it was chosen, one line
  Config config;
  Shape shape;
  ParamCounts params;
  FlopCounts flops;
  double tokens = 0.0;
  double train_flops_total = 0.0;  // 3 * F_fwd * D (model FLOPs)
  double hardware_flops_total = 0.0;
  std::optional<double> loss;  // nullopt: no prior, loss unknown
  EfficiencyPrior prior;
  MemoryBreakdown memory;
  TimeEstimate time;
  double train_hours = 0.0;  // wall-clock on `gpus` devices
  // Ratios to the isoFLOP-optimal baseline (0 when there is no baseline).
  double ratio_params_total = 0.0;
  double ratio_params_flop_active = 0.0;
  double ratio_forward_flops = 0.0;
  double ratio_step_time = 0.0;
  double ratio_tokens = 0.0;
  double ratio_train_hours = 0.0;
  // The minimum of the architecture's isoFLOP curve (an isoflop_optimal under
  // a FLOP budget): the vertex of the parabola in log forward FLOPs per token
  // through the best shape of each depth near the argmin, as the MoD paper
  // locates its figure-4 optima (docs/planner.md "The isoFLOP curve's
  // minimum").  The shape grid is coarse near the optimum, so the recommended
  // shape can sit +-10 % from it.  nullopt: not fitted (other roles, a
  // wall-clock budget, a minimum at the search space's edge, no prior).
  std::optional<double> curve_forward_flops;
  double ratio_curve_forward_flops = 0.0;  // to the optimal baseline's curve minimum
  // Uncertainty from the prior (eps_low .. eps_high): the loss of this shape
  // at both ends, and where the same rule lands at both ends (N_f, total
  // parameters, tokens, step time relative to the optimal baseline).
  ValueRange eps_range;
  std::optional<ValueRange> loss_range;  // nullopt: loss unknown
  ValueRange n_flop_active_range;
  ValueRange params_total_range;
  ValueRange tokens_range;
  ValueRange step_time_ratio_range;
  ValueRange forward_flops_ratio_range;
  std::vector<PlannerFlag> flags;
};

// An architecture at exactly the optimal baseline's shape (the MoD paper's
// figure-3 comparison: same size, same FLOP budget).
struct SameShapeComparison {
  std::string arch;
  Shape shape;
  double tokens = 0.0;
  std::optional<ValueRange> loss;  // nullopt: no prior
  double baseline_loss = 0.0;
  double ratio_step_time = 0.0;
  double ratio_forward_flops = 0.0;
  bool fits = true;
};

struct OptimalResult {
  OptimalSettings settings;
  LossFit fit;
  std::string profile_name;
  std::vector<EfficiencyPrior> priors;  // one per requested architecture
  std::vector<Recommendation> recommendations;
  std::vector<std::string> notes;  // e.g. "mod+dar: no published prior ..."
  std::string conventions;
  std::vector<SameShapeComparison> same_shape;  // per non-baseline architecture
  int64_t candidates_evaluated = 0;  // shapes whose predicted loss was computed
  int64_t cost_evaluations = 0;      // shapes whose memory / step time was estimated
  int64_t layouts_evaluated = 0;     // parallel layouts tried (gpus > 1; docs/cluster.md)
  int64_t layouts_timed = 0;         // of them, lowered and timed (the rest: memory screen only)
};

// Throws ConfigError for bad budgets / names, FileError for bad files and
// Interrupted when `control` (or Ctrl-C) stops it; progress with an ETA
// through `control`.
OptimalResult optimal(const OptimalRequest& request, const RunControl& control = {});
std::string to_json(const OptimalResult& result);
std::string to_table(const OptimalResult& result);

// ---- memory advice (planner/memory_advice.cpp) ------------------------------------

// What would make a training step that does not fit its device memory fit:
// each change alone (micro-batch 1, selective / full recompute, a higher
// ZeRO stage; micro-batch 1 with full recompute when neither alone does) and
// the smallest doubling of the GPU count whose layout search fits, each with
// the peak per device it would need.  Only changes that fit are listed.
struct MemoryRemedy {
  std::string change;  // "train.micro_batch = 1 (now 8)", "gpus = 4 (TP 2 (SP) x PP 1 x DP 2, ...)"
  double peak_bytes = 0.0;
};
std::vector<MemoryRemedy> memory_remedies(const Config& config, const DeviceProfile& profile);
// One line: "peak 95.2 GiB > 80.0 GiB per device; would fit with
// train.micro_batch = 1 (now 8) (61.0 GiB) or gpus = 2 (...) (52.3 GiB)", or
// what the memory is made of when nothing helps; "" when it fits.
std::string memory_advice(const Config& config, const DeviceProfile& profile);

// ---- sweep (planner/sweep.cpp) -------------------------------------------------

struct SweepRequest : PlannerRunRequest {
  std::vector<double> flops;         // training-FLOP budgets (at least one)
  std::vector<std::string> arch;     // empty: baseline, mod
  std::vector<double> capacity;      // MoD capacities; empty: 0.125
  std::vector<int64_t> every;        // MoD routing frequencies; empty: 2
  std::vector<int64_t> block_layers;  // DAR layers per block; empty: 2
  std::vector<int64_t> streams;       // DAR streams; empty: 2
  std::optional<bool> with_time;     // memory and step time per candidate; default true
  std::optional<double> grid_step;   // relative N_f step of a curve's rows; default 1.05
  std::optional<double> grid_half_width;  // a curve spans N_f* / w .. N_f* x w; default 6
};

// The resolved SweepRequest.
struct SweepSettings {
  PlannerRun run;
  std::vector<double> flops;
  std::vector<ArchSpec> variants;  // arch x capacity x every x K x n, in that order
  bool with_time = true;
  double grid_step = 0.0;
  double grid_half_width = 0.0;
};
SweepSettings resolve_sweep(const SweepRequest& request);

// One row of a curve.  A curve (one budget x one architecture variant) has
// a row per N_f bin of ratio grid_step within grid_half_width of the curve's
// compute-optimal N_f*: the bin's shape with the lowest predicted loss among
// those that fit (the deepest of ties, as optimal breaks them; the closest
// to the bin's N_f when the loss is unknown), from the same search as
// optimal (planner/optimal_search.cpp).  Exactly one row per curve is
// `recommended`: optimal's isoFLOP-optimal shape for that budget and
// architecture (the star of modar.plot.isoflop_curves).
struct SweepRow {
  double budget_flops = 0.0;
  std::string arch;
  double capacity = 0.0;
  int64_t every = 0;
  int64_t block_layers = 0;
  int64_t streams = 0;
  int64_t experts = 0;  // moe / mode-*: E (0 without experts)
  int64_t top_k = 0;
  int64_t expert_ffn = 0;  // each expert's width at this shape
  Shape shape;
  ParamCounts params;
  double forward_flops_per_token = 0.0;
  double tokens = 0.0;
  std::optional<double> loss;
  double eps = 1.0;
  bool eps_known = false;
  bool has_time = false;    // step_s, tokens_per_s, train_hours
  bool has_memory = false;  // peak_memory_bytes (always with time; on one GPU also without)
  double peak_memory_bytes = 0.0;
  bool fits = true;         // some layout fits on a cluster
  double step_s = 0.0;
  double tokens_per_s = 0.0;
  double train_hours = 0.0;
  // gpus > 1 with time: the fastest layout that fits (else the least-memory
  // one, `fits` false), as `optimal --gpus` chooses it.
  bool has_layout = false;
  std::string layout;  // one-line summary (layout_summary)
  ParallelConfig parallel;
  int64_t data_parallel = 1;
  int64_t micro_batch = 1;
  Recompute recompute = Recompute::none;
  Config layout_config;      // the whole configuration of that layout (JSON "parallel")
  bool recommended = false;  // optimal's choice for this budget and architecture
};

struct SweepSummary {
  int64_t rows = 0;
  // One per curve without rows (its budget's compute-optimal N_f lies
  // outside the shape search), with the budgets that would give rows.
  std::vector<std::string> notes;
};
// Streams every row to `sink` (curve by curve: budget, then variant).
// Throws ConfigError (the first note) when no curve has a row.  Progress
// (curves, with an ETA) and Ctrl-C through `control`.
SweepSummary sweep(const SweepRequest& request, const std::function<void(const SweepRow&)>& sink,
                   const RunControl& control = {});
std::vector<SweepRow> sweep(const SweepRequest& request, const RunControl& control = {});
std::string sweep_csv_header();
std::string to_csv_line(const SweepRow& row);
std::string to_json_line(const SweepRow& row);

// ---- fitting a law to your own runs (planner/fit.cpp) ----------------------------

struct RunRecord {
  double n_flop_active = 0.0;
  double tokens = 0.0;
  double loss = 0.0;
  int64_t line = 0;  // 1-based line in the CSV
};

// Header row required; columns (case-insensitive, any order): `loss`, `D` (or
// `tokens`), and `N` (or `n_flop_active`, `params`) or `config` (a TOML path,
// relative to the CSV's folder, whose N_f comes from count_params).  Extra
// columns are ignored.  Throws FileError "<file>:<line>: ..." on malformed rows.
std::vector<RunRecord> parse_runs_csv(const std::string& text, const std::string& source_name,
                                      const std::string& base_dir = ".");
std::vector<RunRecord> load_runs_csv(const std::string& path);
// `count` runs drawn from a known law (tests, benchmarks): N_f log-uniform in
// [2e7, 1e9], D log-uniform in [2e9, 5e10], loss = predicted_loss(law, 1, N_f, D)
// x exp(noise_sigma x a standard normal), from a splitmix64 stream seeded by
// `seed`; line = index + 2 (as if read after a CSV header).
std::vector<RunRecord> runs_from_law(const LossFitParams& law, int64_t count, double noise_sigma,
                                     uint64_t seed);

// What the user said (`modar fit --delta --bootstrap --seed`, modar.fit());
// resolve_fit_options() applies the defaults and checks (errors name these
// fields).
struct FitRequest {
  std::optional<double> huber_delta;         // default 1e-3; finite, > 0
  std::optional<int64_t> bootstrap_samples;  // default 200; [0, 100000]
  std::optional<int64_t> seed;               // default 20240402; >= 0
};

// The resolved FitRequest.
struct FitOptions {
  double huber_delta = 1e-3;  // Hoffmann et al.'s delta, on log-loss residuals
  int bootstrap_samples = 200;  // [0, 100000]
  uint64_t seed = 20240402;
};
FitOptions resolve_fit_options(const FitRequest& request);

struct FitParamSummary {
  double estimate = 0.0;
  double standard_error = 0.0;  // bootstrap
  double ci_low = 0.0;          // 2.5 % bootstrap percentile
  double ci_high = 0.0;         // 97.5 %
};

struct FitResult {
  LossFit fit;
  FitParamSummary E, A, B, alpha, beta;
  double objective = 0.0;  // summed Huber loss at the optimum
  int64_t runs = 0;
  int64_t starts = 0;  // grid starting points tried
  int64_t bootstrap_samples = 0;
  double rms_log_residual = 0.0;
};

// Minimise sum_i Huber_delta(log L_hat(N_i, D_i) - log L_i) over
// (a = log A, b = log B, e = log E, alpha, beta) with BFGS from a grid of
// starting points (Hoffmann et al. 2022 appendix D.2; Besiroglu et al. 2024 sum
// rather than average the Huber loss).  Needs at least 5 runs.  Above 300
// runs the grid runs on a random 300-run subsample and the best 4 minima are
// refined on all runs (on 20,000 of them, then the best on all, above 20,000);
// above 2,000 runs the bootstrap is m-out-of-n (m = 2,000, deviations scaled
// by sqrt(m / n)).  Throws ConfigError when the
// optimum is not a plausible law (non-finite, alpha or beta outside (0, 3]:
// the checks of parse_fit_toml) and Interrupted on Ctrl-C (errors.hpp).
// Progress (BFGS starts, then bootstrap samples, with an ETA) and Ctrl-C
// through `control`.
FitResult fit_runs(const std::vector<RunRecord>& runs, const FitRequest& request = {},
                   const RunControl& control = {});
FitResult fit_runs(const std::vector<RunRecord>& runs, const FitOptions& options,
                   const RunControl& control = {});
std::string to_json(const FitResult& result);
std::string to_text(const FitResult& result);

// Write text to <path>.tmp.<pid>, then rename over <path> (no half-written
// file is ever left behind); throws FileError.
void save_text_atomically(const std::string& path, const std::string& text);

}  // namespace modar
