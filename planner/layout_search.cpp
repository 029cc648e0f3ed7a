// Layout search (include/modar/layout_search.hpp): per model shape, the
// fastest memory-feasible parallel layout on N GPUs.
#include "modar/layout_search.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <memory>
#include <vector>

#include "modar/errors.hpp"
#include "modar/parallel.hpp"

namespace modar {

std::string layout_summary(const Config& c) {
  const ParallelConfig& p = c.parallel;
  std::string out = "TP " + std::to_string(p.tensor) + (p.sequence_parallel ? " (SP)" : "") +
                    " x PP " + std::to_string(p.pipeline);
  if (p.virtual_stages > 1) {
    out += " (v " + std::to_string(p.virtual_stages) + ")";
  }
  out += " x DP " + std::to_string(std::max<int64_t>(1, p.data(c.device.count))) + ", ZeRO " +
         std::to_string(p.zero) + ", mb " + std::to_string(c.train.micro_batch) + ", recompute " +
         to_string(c.train.recompute);
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

// One point of the layout space before the recompute choice.
struct Candidate {
  int64_t t = 1, p = 1, v = 1, mb = 1, zero = 0;
};

// The recompute modes tried per layout, cheapest first (the user's alone when fixed).
std::vector<Recompute> recomputes(const LayoutSearchOptions& options) {
  if (options.recompute) {
    return {*options.recompute};
  }
  return {Recompute::none, Recompute::selective, Recompute::full};
}

// The layout space of one shape, in search order: model-parallel size t x p
// ascending, then v, micro-batch and ZeRO stage.
struct LayoutSpace {
  int64_t gpus = 1;
  int64_t per_node = 8;
  int64_t global = 1;  // sequences per optimizer step
  std::vector<Candidate> candidates;
};

LayoutSpace layout_space(const Config& config, const TimingModel& timing,
                         const LayoutSearchOptions& options) {
  if (options.gpus < 1) {
    throw ConfigError("gpus = " + std::to_string(options.gpus) + ": must be >= 1");
  }
  LayoutSpace space;
  space.gpus = options.gpus;
  const NetworkProfile& network = network_or_default(timing.profile());
  space.per_node = options.gpus_per_node > 0 ? options.gpus_per_node : network.gpus_per_node;
  const ModelConfig& m = config.model;
  const int64_t global = layout_global_batch(config, options);
  space.global = global;

  std::vector<std::pair<int64_t, int64_t>> sizes;  // (t, p) by t x p ascending
  for (int64_t t : divisors_up_to(options.gpus, space.per_node)) {
    if (m.n_heads % t != 0 || m.resolved_kv_heads() % t != 0 || m.resolved_d_ff() % t != 0 ||
        m.seq_len % t != 0) {
      continue;
    }
    for (int64_t p : divisors_up_to(options.gpus / t, m.n_layers)) {
      sizes.emplace_back(t, p);
    }
  }
  std::stable_sort(sizes.begin(), sizes.end(), [](const auto& a, const auto& b) {
    return a.first * a.second < b.first * b.second;
  });
  for (const auto& [t, p] : sizes) {
    const int64_t dp = options.gpus / (t * p);
    for (int64_t v : {int64_t{1}, int64_t{2}}) {
      if (v == 2 && (p == 1 || m.n_layers < 2 * p)) {
        continue;
      }
      for (int64_t mb : options.micro_batch > 0 ? std::vector<int64_t>{options.micro_batch}
                                                 : std::vector<int64_t>{1, 2, 4}) {
        if (global % (mb * dp) != 0) {
          continue;
        }
        for (int64_t zero : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{3}}) {
          if ((dp == 1) != (zero == 0)) {
            continue;
          }
          space.candidates.push_back({t, p, v, mb, zero});
        }
      }
    }
  }
  if (space.candidates.empty()) {
    throw ConfigError("train.global_batch = " + std::to_string(global) + ": no layout of " +
                      std::to_string(options.gpus) + " GPUs splits it into micro-batches of " +
                      (options.micro_batch > 0 ? std::to_string(options.micro_batch)
                                               : std::string("1, 2 or 4")) +
                      " sequences per data-parallel rank; allowed: a multiple of "
                      "train.micro_batch x the data-parallel size");
  }
  return space;
}

Config layout_config(const Config& config, const LayoutSpace& space, const Candidate& l,
                     Recompute recompute) {
  Config c = config;
  c.device.count = space.gpus;
  c.cluster.gpus_per_node = space.per_node;
  c.cluster.nodes = 0;
  c.parallel = ParallelConfig{};
  c.parallel.tensor = l.t;
  c.parallel.sequence_parallel = l.t > 1;
  c.parallel.pipeline = l.p;
  c.parallel.schedule = l.v > 1 ? PipelineSchedule::interleaved : PipelineSchedule::one_f_one_b;
  c.parallel.virtual_stages = l.v;
  c.parallel.zero = l.zero;
  c.train.micro_batch = l.mb;
  c.train.global_batch = space.global;
  c.train.recompute = recompute;
  return c;
}

// Full estimates of the layouts of one shape.  What does not depend on the
// whole layout is computed once: the single-device estimate (FLOPs) per
// (micro-batch, recompute, data-parallel size) and the rank's lowered
// compute per (tensor size, micro-batch, recompute).
class LayoutEstimator {
 public:
  explicit LayoutEstimator(const TimingModel& timing) : timing_(timing) {}

  // The single-device estimate of `c` and its cluster estimate.
  const Estimate& estimate(const Config& c, std::shared_ptr<ClusterEstimate>* cluster) {
    const int64_t dp = c.parallel.data(c.device.count);
    const Estimate* single = nullptr;
    for (const Single& entry : singles_) {
      if (entry.mb == c.train.micro_batch && entry.recompute == c.train.recompute &&
          entry.dp == dp) {
        single = &entry.estimate;
        break;
      }
    }
    if (single == nullptr) {
      singles_.push_back({c.train.micro_batch, c.train.recompute, dp, Estimate{}});
      estimate_into(c, timing_, StepKind::train, scratch_, singles_.back().estimate);
      single = &singles_.back().estimate;
    }
    const RankCompute* compute = nullptr;
    for (const RankCompute& entry : computes_) {
      if (entry.tensor == c.parallel.tensor &&
          entry.sequence_parallel == c.parallel.sequence_parallel &&
          entry.micro_batch == c.train.micro_batch && entry.recompute == c.train.recompute) {
        compute = &entry;
        break;
      }
    }
    if (compute == nullptr) {
      computes_.push_back(rank_compute(c, timing_));
      compute = &computes_.back();
    }
    *cluster = std::make_shared<ClusterEstimate>(estimate_cluster(c, timing_, *single, *compute));
    ++timed_;
    return *single;
  }
  int64_t timed() const { return timed_; }

 private:
  struct Single {
    int64_t mb;
    Recompute recompute;
    int64_t dp;
    Estimate estimate;
  };
  const TimingModel& timing_;
  std::deque<Single> singles_;        // stable addresses
  std::deque<RankCompute> computes_;
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
  time.mfu = out.estimate.flops.train_per_step / (time.step_s * peak_flops);
  time.hfu = out.estimate.flops.hardware_per_step / (time.step_s * peak_flops);
  flag_published_mfu(timing.profile(), time);
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

LayoutSearchResult search_layout(const Config& config, const TimingModel& timing,
                                 const LayoutSearchOptions& options) {
  const LayoutSpace space = layout_space(config, timing, options);
  const DeviceProfile& profile = timing.profile();
  LayoutEstimator estimator(timing);
  LayoutSearchResult best;
  double best_step = INFINITY;
  int64_t first_fit_size = 0;
  int64_t evaluated = 0;

  // The fastest layout that fits: per candidate the least recompute that fits
  // (more recompute is only slower).  A layout the memory screen rules out is
  // not timed: it would not fit.
  for (const Candidate& l : space.candidates) {
    if (first_fit_size > 0 && l.t * l.p > 4 * first_fit_size) {
      break;
    }
    for (Recompute recompute : recomputes(options)) {
      const Config c = layout_config(config, space, l, recompute);
      ++evaluated;
      if (!cluster_memory_bound(c, profile).may_fit()) {
        continue;
      }
      std::shared_ptr<ClusterEstimate> cluster;
      const Estimate& single = estimator.estimate(c, &cluster);
      const StageSummary& busiest = cluster->stages[static_cast<size_t>(cluster->busiest_stage)];
      if (!busiest.memory.fits) {
        continue;
      }
      if (first_fit_size == 0) {
        first_fit_size = l.t * l.p;
      }
      if (cluster->step_s < best_step) {
        best_step = cluster->step_s;
        fill(best, c, single, cluster, timing);
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
    for (Recompute recompute : recomputes(options)) {
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
                              const LayoutSearchOptions& options) {
  const LayoutSpace space = layout_space(config, timing, options);
  const DeviceProfile& profile = timing.profile();
  LayoutFeasibility out;
  // Exact screens first (cheap); layouts only a full estimate can decide
  // afterwards, in search order.
  std::vector<Config> undecided;
  for (const Candidate& l : space.candidates) {
    for (Recompute recompute : recomputes(options)) {
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

}  // namespace modar
