// Layout search (include/modar/layout_search.hpp): per model shape, the
// fastest memory-feasible parallel layout on N GPUs.
#include "modar/layout_search.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "modar/base/errors.hpp"
#include "modar/parallel.hpp"

namespace modar {

std::string layout_summary(const Config& c) {
  const ParallelConfig& p = c.parallel;
  std::string out = "TP " + std::to_string(p.tensor) + (p.sequence_parallel ? " (SP)" : "");
  if (p.context > 1) {
    out += " x CP " + std::to_string(p.context);
  }
  out += " x PP " + std::to_string(p.pipeline);
  if (p.virtual_stages > 1) {
    out += " (v " + std::to_string(p.virtual_stages) + ")";
  }
  out += " x DP " + std::to_string(std::max<int64_t>(1, p.data(c.device.count)));
  if (p.expert > 1 || p.resolved_expert_tensor() != p.tensor) {
    out += ", EP " + std::to_string(p.expert);
    if (p.resolved_expert_tensor() != p.tensor) {
      out += " (expert TP " + std::to_string(p.resolved_expert_tensor()) + ")";
    }
  }
  out += ", ZeRO " + std::to_string(p.zero) + ", mb " + std::to_string(c.train.micro_batch) +
         ", recompute " + to_string(c.train.recompute);
  return out;
}

namespace {

std::vector<int64_t> divisors_up_to(int64_t n, int64_t limit) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= std::min(n, limit); ++d) {
    if (n % d == 0) {
      out.push_back(d);
    }
  }
  return out;
}

// "1, 2 or 4": the micro-batches a search tries, for its messages.
std::string micro_batch_list(const std::vector<int64_t>& sizes) {
  std::string text;
  for (size_t i = 0; i < sizes.size(); ++i) {
    text += (i == 0 ? "" : i + 1 == sizes.size() ? " or " : ", ") + std::to_string(sizes[i]);
  }
  return text;
}

// One point of the layout space before the recompute choice.
struct Candidate {
  int64_t t = 1, p = 1, v = 1, mb = 1, zero = 0;
  bool sp = false;
  int64_t cp = 1, ep = 1, etp = 0;  // etp 0: the tensor size
};

// Relative margin on a step-time lower bound (its sums run in another order
// than the estimate's).
constexpr double kBoundSlack = 1e-9;

// The layout space of one shape, in search order: model-parallel size t x p
// ascending, then v, micro-batch and ZeRO stage.
struct LayoutSpace {
  int64_t gpus = 1;
  int64_t per_node = 8;
  int64_t global = 1;  // sequences per optimizer step
  std::vector<Candidate> candidates;
  // Sizes left out, and why (once each; only when asked: `modar layout`
  // prints them, the planner's per-shape searches do not need the text).
  bool explain = false;
  std::vector<std::string> skipped;
  template <typename Why>
  void skip(const Why& why) {
    if (!explain) {
      return;
    }
    std::string text = why();
    if (std::find(skipped.begin(), skipped.end(), text) == skipped.end()) {
      skipped.push_back(std::move(text));
    }
  }
};

LayoutSpace layout_space(const Config& config, const TimingModel& timing,
                         const LayoutSearchOptions& options, bool explain = false) {
  if (options.gpus < 1) {
    throw ConfigError("gpus = " + std::to_string(options.gpus) + ": must be >= 1");
  }
  LayoutSpace space;
  space.explain = explain;
  space.gpus = options.gpus;
  const NetworkProfile& network = network_or_default(timing.profile());
  space.per_node = options.gpus_per_node > 0 ? options.gpus_per_node : network.gpus_per_node;
  const ModelConfig& m = config.model;
  const int64_t global = layout_global_batch(config, options);
  space.global = global;

  const LayoutDimensions& dims = options.dimensions;
  const MoeConfig& e = config.moe;
  // (t, c, p) by the model-parallel size t x p ascending (CP, like DP, holds
  // a share of the tokens; the planner's early stop counts t x p).
  struct Sizes {
    int64_t t, cp, p;
  };
  std::vector<Sizes> sizes;
  for (int64_t t : divisors_up_to(options.gpus, options.gpus)) {
    if (t > space.per_node) {
      space.skip([&] {
        return "TP " + std::to_string(t) + ": more than the " + std::to_string(space.per_node) +
               " GPUs of a node";
      });
      continue;
    }
    if (m.n_heads % t != 0 || m.resolved_kv_heads() % t != 0 || m.resolved_d_ff() % t != 0 ||
        m.seq_len % t != 0) {
      space.skip([&] {
        return "TP " + std::to_string(t) +
               ": does not divide the heads, KV heads, d_ff and seq_len";
      });
      continue;
    }
    for (int64_t cp : divisors_up_to(options.gpus / t, dims.context ? options.gpus : 1)) {
      if (cp > 1 && (m.seq_len % (2 * cp * t) != 0 || !is_fused(config.train.attention_kernel))) {
        continue;
      }
      for (int64_t p : divisors_up_to(options.gpus / (t * cp), m.n_layers)) {
        sizes.push_back({t, cp, p});
      }
    }
  }
  std::stable_sort(sizes.begin(), sizes.end(),
                   [](const Sizes& a, const Sizes& b) { return a.t * a.p < b.t * b.p; });
  for (const Sizes& size : sizes) {
    const int64_t t = size.t, cp = size.cp, p = size.p;
    const int64_t dp = options.gpus / (t * cp * p);
    // Expert layouts (Megatron-Core's folding of the stage's t x cp x dp
    // ranks): EP dividing the experts, expert TP = t or 1.
    std::vector<std::pair<int64_t, int64_t>> experts{{1, 0}};
    if (dims.expert && e.enabled()) {
      experts.clear();
      for (int64_t ep : divisors_up_to(e.experts, e.experts)) {
        for (int64_t etp : t > 1 ? std::vector<int64_t>{t, 1} : std::vector<int64_t>{1}) {
          if ((t * cp * dp) % (ep * etp) != 0 || e.resolved_expert_ffn(m) % etp != 0) {
            continue;
          }
          experts.emplace_back(ep, etp == t ? 0 : etp);
        }
      }
    }
    for (bool sp : {true, false}) {
      if ((t == 1 && sp) || (t > 1 && !sp && !dims.tensor_without_sequence)) {
        continue;  // SP needs t > 1; TP without SP only when asked
      }
      for (const auto& [ep, etp] : experts) {
        if (etp > 0 && t > 1 && !sp) {
          continue;  // expert TP apart from TP needs SP (Megatron-Core)
        }
        for (int64_t v : dims.virtual_stages) {
          if (v > 1 && (p == 1 || m.n_layers < v * p)) {
            continue;
          }
          for (int64_t mb : dims.micro_batches) {
            if (global % (mb * dp) != 0) {
              space.skip([&] {
                return "micro-batch " + std::to_string(mb) + " x data " + std::to_string(dp) +
                       " does not divide the global batch " + std::to_string(global);
              });
              continue;
            }
            for (int64_t zero : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{3}}) {
              const bool sharded = dp * cp > 1;
              if ((!sharded && zero > 0) ||
                  (sharded && zero == 0 && !dims.zero_zero_with_data)) {
                continue;
              }
              Candidate c{t, p, v, mb, zero};
              c.sp = sp && t > 1;
              c.cp = cp;
              c.ep = ep;
              c.etp = etp;
              space.candidates.push_back(c);
            }
          }
        }
      }
    }
  }
  if (space.candidates.empty()) {
    throw ConfigError("train.global_batch = " + std::to_string(global) + ": no layout of " +
                      std::to_string(options.gpus) + " GPUs splits it into micro-batches of " +
                      micro_batch_list(dims.micro_batches) +
                      " sequences per data-parallel rank; allowed: a multiple of "
                      "train.micro_batch x the data-parallel size");
  }
  return space;
}

// `c` (a copy of the shape's configuration) set to layout `l` with
// `recompute`: every field a layout sets is assigned, so reusing one copy
// for many layouts gives the configurations layout_config() would.
void set_layout(Config& c, const LayoutSpace& space, const Candidate& l, Recompute recompute) {
  c.device.count = space.gpus;
  c.cluster.gpus_per_node = space.per_node;
  c.cluster.nodes = 0;
  c.parallel = ParallelConfig{};
  c.parallel.tensor = l.t;
  c.parallel.sequence_parallel = l.sp;
  c.parallel.context = l.cp;
  c.parallel.expert = l.ep;
  c.parallel.expert_tensor = l.etp;
  c.parallel.pipeline = l.p;
  c.parallel.schedule = l.v > 1 ? PipelineSchedule::interleaved : PipelineSchedule::one_f_one_b;
  c.parallel.virtual_stages = l.v;
  c.parallel.zero = l.zero;
  c.train.micro_batch = l.mb;
  c.train.global_batch = space.global;
  c.train.recompute = recompute;
  c.train.recompute_granularity = RecomputeGranularity::none;  // modar's recompute is searched
}

Config layout_config(const Config& config, const LayoutSpace& space, const Candidate& l,
                     Recompute recompute) {
  Config c = config;
  set_layout(c, space, l, recompute);
  return c;
}

// Full estimates of the layouts of one shape.  What does not depend on the
// whole layout is computed once: the single-device estimate (FLOPs) per
// (micro-batch, recompute, data-parallel size) and the rank's lowered
// compute per (tensor size, micro-batch, recompute).
class LayoutEstimator {
 public:
  // `shared`: the bounds' rank computes come from it (lowered at
  // `shared_layers` layers), else from this estimator's own.
  explicit LayoutEstimator(const TimingModel& timing,
                           std::shared_ptr<LayoutCache> shared = nullptr,
                           int64_t shared_layers = 0)
      : timing_(timing), shared_(std::move(shared)), shared_layers_(shared_layers) {}

  // A lower bound on the step time of `c`'s layout under any recompute
  // choice (cluster_step_lower_bound of the layout with recompute none).
  double step_lower_bound(const Config& c) {
    if (c.train.recompute == Recompute::none) {
      return cluster_step_lower_bound(c, timing_, bound_compute_for(c));
    }
    Config lightest = c;
    lightest.train.recompute = Recompute::none;
    return cluster_step_lower_bound(lightest, timing_, bound_compute_for(lightest));
  }

  // The single-device estimate of `c` and its cluster estimate.
  const Estimate& estimate(const Config& c, std::shared_ptr<ClusterEstimate>* cluster) {
    const int64_t dp = c.parallel.data(c.device.count);
    const Estimate* single = nullptr;
    for (const Single& entry : singles_) {
      if (entry.mb == c.train.micro_batch && entry.recompute == c.train.recompute &&
          entry.dp == dp && entry.tensor == c.parallel.tensor) {
        single = &entry.estimate;
        break;
      }
    }
    if (single == nullptr) {
      singles_.push_back({c.train.micro_batch, c.train.recompute, dp, c.parallel.tensor,
                          Estimate{}});
      estimate_into(c, timing_, StepKind::train, scratch_, singles_.back().estimate);
      single = &singles_.back().estimate;
    }
    *cluster =
        std::make_shared<ClusterEstimate>(estimate_cluster(c, timing_, *single, compute_for(c)));
    ++timed_;
    return *single;
  }
  int64_t timed() const { return timed_; }

 private:
  // The rank's lowered compute for `c` (tensor size, SP, micro-batch,
  // recompute, context and expert layout), lowered once.
  const RankCompute& compute_for(const Config& c) {
    for (const RankCompute& entry : computes_) {
      if (entry.matches(c)) {
        return entry;
      }
    }
    computes_.push_back(rank_compute(c, timing_));
    return computes_.back();
  }

  // The rank compute the step bounds of `c` read: the shared lowering (a
  // copy: its memos of layer sums depend on this shape's depth), or
  // compute_for().
  const RankCompute& bound_compute_for(const Config& c) {
    if (shared_ == nullptr) {
      return compute_for(c);
    }
    for (const RankCompute& entry : bound_computes_) {
      if (entry.matches(c)) {
        return entry;
      }
    }
    bound_computes_.push_back(shared_->lowered(c, shared_layers_, timing_));
    return bound_computes_.back();
  }

  // The single-device estimate (FLOPs per token and per step): the same for
  // every layout of one micro-batch, recompute, data-parallel size (the
  // step's micro-batches) and tensor size (the padded vocabulary).
  struct Single {
    int64_t mb;
    Recompute recompute;
    int64_t dp;
    int64_t tensor;
    Estimate estimate;
  };
  const TimingModel& timing_;
  std::shared_ptr<LayoutCache> shared_;
  int64_t shared_layers_ = 0;
  std::deque<Single> singles_;        // stable addresses
  std::deque<RankCompute> computes_;
  std::deque<RankCompute> bound_computes_;  // with shared_: copies of its lowerings
  OpList scratch_;
  int64_t timed_ = 0;
};

// The search's result from one layout's estimates.
void fill(LayoutSearchResult& out, const Config& c, const Estimate& single,
          const std::shared_ptr<ClusterEstimate>& cluster, const TimingModel& timing) {
  const StageSummary& busiest = cluster->stages[static_cast<size_t>(cluster->busiest_stage)];
  out.config = c;
  out.estimate = single;
  out.estimate.memory = busiest.memory;
  TimeEstimate& time = out.estimate.time;
  time.step_s = cluster->step_s;
  time.optimizer_s = cluster->optimizer_s;
  time.accumulation_steps = cluster->micro_batches;
  const double peak_flops =
      timing.profile().ceilings.peak_flops(c.train.dtype) * double(c.device.count);
  time.tokens_per_s = out.estimate.flops.tokens_per_step / time.step_s;
  set_utilization(timing.profile(), out.estimate.flops, peak_flops, time);
  out.estimate.conventions = cluster_conventions(single.conventions, *cluster);
  out.estimate.cluster = cluster;
  out.fits = busiest.memory.fits;
}

}  // namespace

int64_t layout_global_batch(const Config& config, const LayoutSearchOptions& options) {
  int64_t global = options.global_batch > 0 ? options.global_batch : config.train.global_batch;
  if (global <= 0) {
    const int64_t target = std::max<int64_t>(1, (int64_t{1} << 22) / config.model.seq_len);
    global = 1;
    while (global < target) {
      global *= 2;
    }
  }
  return global;
}

struct LayoutCache::Impl {
  // What a rank compute of one architecture base's configurations depends
  // on: the shape (its depth as shared_layers()) and RankCompute::matches().
  struct Key {
    int64_t layers, d_model, n_heads, n_kv_heads, d_head, d_ff, seq_len, vocab_size;
    int64_t tensor, micro_batch, expert, expert_tensor, context;
    bool sequence_parallel;
    Recompute recompute;
    RecomputeGranularity granularity;
    std::string modules;
    auto operator<=>(const Key&) const = default;
  };
  std::map<Key, RankCompute> entries;
  // The layout spaces by what layout_space() reads of a shape (the rest of
  // the configuration is the architecture base's): its depth and which
  // tensor sizes (dividing the GPUs, at most a node's) divide its heads, KV heads and d_ff
  // (bit t of `divides`), and with experts the expert width (bit t of
  // `expert_divides`).  Nodes of 64 GPUs or more: no sharing.
  struct SpaceKey {
    int64_t layers;
    uint64_t divides, expert_divides;
    auto operator<=>(const SpaceKey&) const = default;
  };
  std::map<SpaceKey, std::shared_ptr<const LayoutSpace>> spaces;
  std::shared_ptr<const LayoutSpace> space(const Config& config, const TimingModel& timing,
                                           const LayoutSearchOptions& options) {
    const int64_t per_node = options.gpus_per_node > 0
                                 ? options.gpus_per_node
                                 : network_or_default(timing.profile()).gpus_per_node;
    if (per_node >= 64) {
      return std::make_shared<const LayoutSpace>(layout_space(config, timing, options));
    }
    const ModelConfig& m = config.model;
    SpaceKey key{m.n_layers, 0, 0};
    const bool experts = config.moe.enabled();
    const int64_t expert_ffn = experts ? config.moe.resolved_expert_ffn(m) : 0;
    const int64_t heads = m.n_heads, kv_heads = m.resolved_kv_heads(), d_ff = m.resolved_d_ff();
    for (int64_t t = 1; t <= per_node; ++t) {
      if (options.gpus % t != 0) {
        continue;  // not a tensor size of this space
      }
      if (heads % t == 0 && kv_heads % t == 0 && d_ff % t == 0) {
        key.divides |= uint64_t{1} << t;
      }
      if (experts && expert_ffn % t == 0) {
        key.expert_divides |= uint64_t{1} << t;
      }
    }
    std::shared_ptr<const LayoutSpace>& entry = spaces[key];
    if (entry == nullptr) {
      entry = std::make_shared<const LayoutSpace>(layout_space(config, timing, options));
    }
    return entry;
  }
};

struct LayoutCacheAccess {
  static LayoutCache::Impl& impl(LayoutCache& cache) { return *cache.impl_; }
};

namespace {
// `config`'s layout space: the cache's shared one, or (no cache) its own.
std::shared_ptr<const LayoutSpace> shared_or_own_space(LayoutCache* shared, const Config& config,
                                                       const TimingModel& timing,
                                                       const LayoutSearchOptions& options) {
  if (shared != nullptr) {
    return LayoutCacheAccess::impl(*shared).space(config, timing, options);
  }
  return std::make_shared<const LayoutSpace>(layout_space(config, timing, options));
}
}  // namespace

LayoutCache::LayoutCache() : impl_(std::make_unique<Impl>()) {}
LayoutCache::~LayoutCache() = default;

int64_t LayoutCache::lowerings() const {
  return static_cast<int64_t>(impl_->entries.size());
}

int64_t LayoutCache::shared_layers(const Config& config) {
  const int64_t layers = config.model.n_layers;
  if (config.dar.enabled() || config.moe.enabled()) {
    return layers;
  }
  const LayerCounts counts = layer_counts(config);
  Config fewer = config;
  for (int64_t l = 1; l < layers; ++l) {
    fewer.model.n_layers = l;
    const LayerCounts kinds = layer_counts(fewer);
    if ((kinds.full_layers > 0) == (counts.full_layers > 0) &&
        (kinds.routed_layers > 0) == (counts.routed_layers > 0)) {
      return l;
    }
  }
  return layers;
}

const RankCompute& LayoutCache::lowered(const Config& config, int64_t layers,
                                             const TimingModel& timing) {
  const ModelConfig& m = config.model;
  const ParallelConfig& par = config.parallel;
  Impl::Key key{layers,
                m.d_model,
                m.n_heads,
                m.n_kv_heads,
                m.d_head,
                m.d_ff,
                m.seq_len,
                m.vocab_size,
                par.tensor,
                config.train.micro_batch,
                par.expert,
                par.resolved_expert_tensor(),
                par.context,
                par.sequence_parallel,
                config.train.recompute,
                config.train.recompute_granularity,
                config.train.recompute_modules};
  auto found = impl_->entries.find(key);
  if (found == impl_->entries.end()) {
    Config shallow = config;
    shallow.model.n_layers = layers;
    found = impl_->entries.emplace(std::move(key), rank_compute(shallow, timing)).first;
  }
  return found->second;
}

// One shape's layout space with its lowered computes, shared by the step
// floor and the search.
struct ShapeLayouts::State {
  State(const Config& config_in, const TimingModel& timing_in,
        const LayoutSearchOptions& options_in, const std::shared_ptr<LayoutCache>& shared)
      : config(config_in),
        timing(timing_in),
        options(options_in),
        space_owner(shared_or_own_space(shared.get(), config_in, timing_in, options_in)),
        space(*space_owner),
        estimator(timing_in, shared,
                  shared != nullptr ? LayoutCache::shared_layers(config_in) : 0) {}
  Config config;
  const TimingModel& timing;
  LayoutSearchOptions options;
  std::shared_ptr<const LayoutSpace> space_owner;  // shared by the shapes with the same space
  const LayoutSpace& space;
  LayoutEstimator estimator;
};

ShapeLayouts::ShapeLayouts(const Config& config, const TimingModel& timing,
                           const LayoutSearchOptions& options,
                           std::shared_ptr<LayoutCache> shared)
    : state_(std::make_unique<State>(config, timing, options, shared)) {}

ShapeLayouts::~ShapeLayouts() = default;

double ShapeLayouts::tokens_per_step() const {
  return static_cast<double>(state_->space.global) *
         static_cast<double>(state_->config.model.seq_len);
}

double ShapeLayouts::step_floor_s() {
  // The search's answer is the fastest layout that fits, or (nothing fits)
  // the one with the least memory.  A layout the memory screen
  // (cluster_memory_bound) rules out under every recompute cannot be the
  // first kind.  Once the screen proves that some layout fits, the answer is
  // the first kind: the floor is the least step-time bound (with recompute
  // none: more recompute only adds ops) over the layouts it leaves.  Without
  // that proof the least-memory layout may be the answer: every layout's
  // bound.  A layout is screened only when its bound could lower the floor.
  // (The bound at the first recompute an exact screen leaves is tighter, but
  // its further lowerings cost more than the shapes it rules out save.)
  State& s = *state_;
  const DeviceProfile& profile = s.timing.profile();
  // One configuration, set to each layout in turn (no copy per layout).
  Config scratch = s.config;
  const auto config_of = [&s, &scratch](const Candidate& l, Recompute recompute) -> const Config& {
    set_layout(scratch, s.space, l, recompute);
    return scratch;
  };
  // The bound depends on the ZeRO stage (the space's innermost dimension)
  // only through ZeRO 3's data-parallel channel: bounds are kept per run of
  // candidates differing only in ZeRO, for ZeRO 0-2 and for ZeRO 3.
  const Candidate* run = nullptr;
  double run_bounds[2];
  const auto bound_of = [&](const Candidate& l) {
    if (run == nullptr || run->t != l.t || run->p != l.p || run->v != l.v || run->mb != l.mb ||
        run->sp != l.sp || run->cp != l.cp || run->ep != l.ep || run->etp != l.etp) {
      run = &l;
      run_bounds[0] = run_bounds[1] = NAN;
    }
    double& bound = run_bounds[l.zero == 3 ? 1 : 0];
    if (std::isnan(bound)) {
      bound = s.estimator.step_lower_bound(config_of(l, Recompute::none));
    }
    return bound;
  };
  double every_floor_s = INFINITY;    // every layout, any recompute
  double fitting_floor_s = INFINITY;  // the layouts the screen leaves
  bool some_layout_fits = false;
  int64_t proven_size = 0;  // t x p of the first layout proven to fit
  std::vector<const Candidate*> unscreened;
  for (const Candidate& l : s.space.candidates) {
    if (proven_size > 0 && l.t * l.p > 4 * proven_size) {
      break;  // the search stops before (its first fit is no larger)
    }
    const double lightest_s = bound_of(l);
    every_floor_s = std::min(every_floor_s, lightest_s);
    if (lightest_s >= fitting_floor_s) {
      unscreened.push_back(&l);  // cannot lower the floor; may still prove a fit
      continue;
    }
    for (Recompute recompute : s.options.dimensions.recomputes) {
      const ClusterMemoryBound memory = cluster_memory_bound(config_of(l, recompute), profile);
      if (memory.may_fit()) {
        if (!some_layout_fits && memory.fits()) {
          some_layout_fits = true;
          proven_size = l.t * l.p;
        }
        fitting_floor_s = std::min(fitting_floor_s, lightest_s);
        break;
      }
    }
  }
  for (size_t i = 0; i < unscreened.size() && !some_layout_fits; ++i) {
    for (Recompute recompute : s.options.dimensions.recomputes) {
      const ClusterMemoryBound memory =
          cluster_memory_bound(config_of(*unscreened[i], recompute), profile);
      if (memory.may_fit()) {
        some_layout_fits = memory.fits();
        break;
      }
    }
  }
  return (some_layout_fits ? fitting_floor_s : every_floor_s) * (1.0 - kBoundSlack);
}

LayoutSearchResult search_layout(const Config& config, const TimingModel& timing,
                                 const LayoutSearchOptions& options) {
  return ShapeLayouts(config, timing, options).search();
}

LayoutSearchResult ShapeLayouts::search() {
  const Config& config = state_->config;
  const TimingModel& timing = state_->timing;
  const LayoutSearchOptions& options = state_->options;
  const LayoutSpace& space = state_->space;
  LayoutEstimator& estimator = state_->estimator;
  const DeviceProfile& profile = timing.profile();
  LayoutSearchResult best;
  double best_step = INFINITY;
  int64_t first_fit_size = 0;
  int64_t evaluated = 0;

  // The fastest layout that fits: per candidate the least recompute that fits
  // (more recompute is only slower).  A layout the memory screen rules out is
  // not timed: it would not fit.  Once one fits, a candidate whose step-time
  // lower bound (any recompute) cannot beat the fastest is skipped whole: it
  // could not be chosen, fitting or not (options.prune).
  Config trial = config;  // set to each layout in turn (set_layout)
  for (const Candidate& l : space.candidates) {
    if (first_fit_size > 0 && l.t * l.p > 4 * first_fit_size) {
      break;
    }
    if (options.prune && std::isfinite(best_step)) {
      set_layout(trial, space, l, Recompute::none);
      if (estimator.step_lower_bound(trial) * (1.0 - kBoundSlack) >= best_step) {
        ++evaluated;
        continue;
      }
    }
    for (Recompute recompute : options.dimensions.recomputes) {
      set_layout(trial, space, l, recompute);
      ++evaluated;
      if (!cluster_memory_bound(trial, profile).may_fit()) {
        continue;
      }
      std::shared_ptr<ClusterEstimate> cluster;
      const Estimate& single = estimator.estimate(trial, &cluster);
      const StageSummary& busiest = cluster->stages[static_cast<size_t>(cluster->busiest_stage)];
      if (!busiest.memory.fits) {
        continue;
      }
      if (first_fit_size == 0) {
        first_fit_size = l.t * l.p;
      }
      if (cluster->step_s < best_step) {
        best_step = cluster->step_s;
        fill(best, trial, single, cluster, timing);
      }
      break;
    }
  }
  if (std::isfinite(best_step)) {
    best.evaluated = evaluated;
    best.timed = estimator.timed();
    best.summary = layout_summary(best.config);
    return best;
  }

  // Nothing fits: the layout with the least memory per device (every layout
  // estimated in full).
  LayoutSearchResult least;
  double least_memory = INFINITY;
  for (const Candidate& l : space.candidates) {
    for (Recompute recompute : options.dimensions.recomputes) {
      const Config c = layout_config(config, space, l, recompute);
      ++evaluated;
      std::shared_ptr<ClusterEstimate> cluster;
      const Estimate& single = estimator.estimate(c, &cluster);
      const double peak =
          cluster->stages[static_cast<size_t>(cluster->busiest_stage)].memory.peak;
      if (peak < least_memory) {
        least_memory = peak;
        fill(least, c, single, cluster, timing);
      }
    }
  }
  least.evaluated = evaluated;
  least.timed = estimator.timed();
  least.summary = layout_summary(least.config) + " (NO layout fits)";
  return least;
}

LayoutFeasibility layout_fits(const Config& config, const TimingModel& timing,
                              const LayoutSearchOptions& options,
                              const std::shared_ptr<LayoutCache>& shared) {
  const std::shared_ptr<const LayoutSpace> space_owner =
      shared_or_own_space(shared.get(), config, timing, options);
  const LayoutSpace& space = *space_owner;
  const DeviceProfile& profile = timing.profile();
  LayoutFeasibility out;
  // Exact screens first (cheap); layouts only a full estimate can decide
  // afterwards, in search order.
  std::vector<Config> undecided;
  for (const Candidate& l : space.candidates) {
    for (Recompute recompute : options.dimensions.recomputes) {
      Config c = layout_config(config, space, l, recompute);
      const ClusterMemoryBound bound = cluster_memory_bound(c, profile);
      ++out.screened;
      if (bound.fits()) {
        out.fits = true;
        return out;
      }
      if (bound.may_fit()) {
        undecided.push_back(std::move(c));
      }
    }
  }
  LayoutEstimator estimator(timing);
  for (const Config& c : undecided) {
    std::shared_ptr<ClusterEstimate> cluster;
    estimator.estimate(c, &cluster);
    ++out.timed;
    if (cluster->stages[static_cast<size_t>(cluster->busiest_stage)].memory.fits) {
      out.fits = true;
      return out;
    }
  }
  return out;
}

LayoutDimensions layout_ranking_dimensions() {
  LayoutDimensions dims;
  dims.tensor_without_sequence = true;
  dims.context = true;
  dims.expert = true;
  dims.zero_zero_with_data = true;
  dims.micro_batches = {1, 2, 4, 8};
  dims.virtual_stages = {1, 2, 4};
  return dims;
}

namespace {

// What keeps a layout from fitting: the peak over the device memory and the
// largest part of it.
std::string binding_constraint(const MemoryBreakdown& m) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  const MemoryPart& largest = *std::max_element(
      std::begin(kMemoryParts), std::end(kMemoryParts),
      [&](const MemoryPart& a, const MemoryPart& b) { return m.*a.bytes < m.*b.bytes; });
  char text[256];
  std::snprintf(text, sizeof text,
                "memory: %.2f GiB per device > %.2f GiB (+%.2f GiB); largest part %s %.1f GiB",
                m.peak / kGiB, m.capacity / kGiB, (m.peak - m.capacity) / kGiB, largest.label,
                m.*largest.bytes / kGiB);
  return text;
}

// One layout of the ranking, estimated in full; a combination the
// configuration rules refuse is reported in `out.skipped` (once).
void rank_layout(const Config& c, LayoutEstimator& estimator, double peak_flops,
                 LayoutRanking& out) {
  try {
    validate(c);
  } catch (const ConfigError& e) {
    out.skipped.push_back(layout_summary(c) + ": " + e.what());
    return;
  }
  std::shared_ptr<ClusterEstimate> cluster;
  const Estimate& single = estimator.estimate(c, &cluster);
  RankedLayout row;
  row.config = c;
  row.summary = layout_summary(c);
  row.memory = cluster->stages[static_cast<size_t>(cluster->busiest_stage)].memory;
  row.fits = row.memory.fits;
  row.step_s = cluster->step_s;
  row.tokens_per_s = row.step_s > 0 ? single.flops.tokens_per_step / row.step_s : 0.0;
  row.mfu = row.step_s > 0 && peak_flops > 0
                ? single.flops.train_per_step / (row.step_s * peak_flops)
                : 0.0;
  row.compute_s = cluster->compute_s;
  row.exposed_comm_s = cluster->exposed_comm_s;
  row.bubble_s = cluster->bubble_s;
  if (!row.fits) {
    row.binding = binding_constraint(row.memory);
  }
  (row.fits ? out.fitting : out.not_fitting).push_back(std::move(row));
}

}  // namespace

LayoutRanking rank_layouts(const Config& config, const TimingModel& timing,
                           const LayoutSearchOptions& options, const RunControl& control) {
  if (options.gpus < 1) {
    throw ConfigError("gpus = " + std::to_string(options.gpus) + ": must be >= 1");
  }
  if (options.global_batch < 0) {
    throw ConfigError("global_batch = " + std::to_string(options.global_batch) +
                      ": must be >= 0 (0: train.global_batch, else ~4M tokens)");
  }
  const LayoutSpace space = layout_space(config, timing, options, /*explain=*/true);
  const DeviceProfile& profile = timing.profile();
  LayoutRanking out;
  out.gpus = space.gpus;
  out.gpus_per_node = space.per_node;
  out.global_batch = space.global;
  out.global_batch_source =
      options.global_batch > 0
          ? "requested"
          : (config.train.global_batch > 0
                 ? "train.global_batch"
                 : "default: 2^22 / seq_len sequences rounded up to a power of two (~4M tokens)");
  out.tokens_per_step = static_cast<double>(space.global) * static_cast<double>(config.model.seq_len);
  out.device_memory_bytes = profile.ceilings.memory_bytes;
  out.profile_name = profile.name;
  out.skipped = space.skipped;
  LayoutEstimator estimator(timing);
  const double peak_flops = profile.ceilings.peak_flops(config.train.dtype) *
                            static_cast<double>(space.gpus);
  RunReporter reporter(
      control, "layout", "layouts",
      static_cast<int64_t>(space.candidates.size() * options.dimensions.recomputes.size()));
  for (const Candidate& l : space.candidates) {
    for (Recompute recompute : options.dimensions.recomputes) {
      reporter.check();
      ++out.considered;
      rank_layout(layout_config(config, space, l, recompute), estimator, peak_flops, out);
      reporter.advance();
    }
  }
  std::stable_sort(out.fitting.begin(), out.fitting.end(),
                   [](const RankedLayout& a, const RankedLayout& b) { return a.step_s < b.step_s; });
  std::stable_sort(out.not_fitting.begin(), out.not_fitting.end(),
                   [](const RankedLayout& a, const RankedLayout& b) {
                     return a.memory.peak < b.memory.peak;
                   });
  reporter.finish();
  return out;
}

}  // namespace modar
