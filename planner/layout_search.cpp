// Layout search (include/modar/layout_search.hpp): per model shape, the
// fastest memory-feasible parallel layout on N GPUs.
#include "modar/layout_search.hpp"

#include <algorithm>
#include <cmath>
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

}  // namespace

LayoutSearchResult search_layout(const Config& config, const TimingModel& timing,
                                 const LayoutSearchOptions& options) {
  if (options.gpus < 1) {
    throw ConfigError("--gpus " + std::to_string(options.gpus) + ": must be >= 1");
  }
  const NetworkProfile& network = network_or_default(timing.profile());
  const int64_t per_node =
      options.gpus_per_node > 0 ? options.gpus_per_node : network.gpus_per_node;
  const ModelConfig& m = config.model;
  int64_t global = options.global_batch > 0 ? options.global_batch : config.train.global_batch;
  if (global <= 0) {
    const int64_t target = std::max<int64_t>(1, (int64_t{1} << 22) / m.seq_len);
    global = 1;
    while (global < target) {
      global *= 2;
    }
  }

  LayoutSearchResult best;
  double best_step = INFINITY;
  double least_memory = INFINITY;
  LayoutSearchResult least;
  int64_t first_fit_size = 0;

  const std::vector<int64_t> tensors = divisors_up_to(options.gpus, per_node);
  std::vector<std::pair<int64_t, int64_t>> sizes;  // (t, p) by t x p ascending
  for (int64_t t : tensors) {
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

  Estimate single;  // FLOPs of the shape at a (micro-batch, recompute)
  OpList scratch;
  for (const auto& [t, p] : sizes) {
    if (first_fit_size > 0 && t * p > 4 * first_fit_size) {
      break;
    }
    const int64_t dp = options.gpus / (t * p);
    for (int64_t v : {int64_t{1}, int64_t{2}}) {
      if (v == 2 && (p == 1 || m.n_layers < 2 * p)) {
        continue;
      }
      for (int64_t mb : {int64_t{1}, int64_t{2}, int64_t{4}}) {
        if (global % (mb * dp) != 0) {
          continue;
        }
        for (int64_t zero : {int64_t{0}, int64_t{1}, int64_t{3}}) {
          if ((dp == 1) != (zero == 0)) {
            continue;
          }
          for (Recompute recompute : {Recompute::none, Recompute::selective, Recompute::full}) {
            Config c = config;
            c.device.count = options.gpus;
            c.cluster.gpus_per_node = per_node;
            c.cluster.nodes = 0;
            c.parallel = ParallelConfig{};
            c.parallel.tensor = t;
            c.parallel.sequence_parallel = t > 1;
            c.parallel.pipeline = p;
            c.parallel.schedule =
                v > 1 ? PipelineSchedule::interleaved : PipelineSchedule::one_f_one_b;
            c.parallel.virtual_stages = v;
            c.parallel.zero = zero;
            c.train.micro_batch = mb;
            c.train.global_batch = global;
            c.train.recompute = recompute;
            estimate_into(c, timing, StepKind::train, scratch, single);
            auto cluster =
                std::make_shared<ClusterEstimate>(estimate_cluster(c, timing, single));
            ++best.evaluated;
            const StageSummary& busiest =
                cluster->stages[static_cast<size_t>(cluster->busiest_stage)];
            const double peak = busiest.memory.peak;
            const bool fits = busiest.memory.fits;
            auto fill = [&](LayoutSearchResult& out) {
              out.config = c;
              out.estimate = single;
              out.estimate.memory = busiest.memory;
              TimeEstimate& time = out.estimate.time;
              time.step_s = cluster->step_s;
              time.optimizer_s = cluster->optimizer_s;
              time.accumulation_steps = cluster->micro_batches;
              const double peak_flops =
                  timing.profile().ceilings.peak_flops(c.train.dtype) * double(options.gpus);
              time.tokens_per_s = out.estimate.flops.tokens_per_step / time.step_s;
              time.mfu = out.estimate.flops.train_per_step / (time.step_s * peak_flops);
              time.hfu = out.estimate.flops.hardware_per_step / (time.step_s * peak_flops);
              out.estimate.cluster = cluster;
              out.fits = fits;
            };
            if (fits) {
              if (first_fit_size == 0) {
                first_fit_size = t * p;
              }
              if (cluster->step_s < best_step) {
                best_step = cluster->step_s;
                fill(best);
              }
              break;  // more recompute: only slower
            }
            if (peak < least_memory) {
              least_memory = peak;
              fill(least);
            }
          }
        }
      }
    }
  }
  if (!std::isfinite(best_step)) {
    least.evaluated = best.evaluated;
    least.summary = layout_summary(least.config) + " (NO layout fits)";
    return least;
  }
  best.summary = layout_summary(best.config);
  return best;
}

}  // namespace modar
