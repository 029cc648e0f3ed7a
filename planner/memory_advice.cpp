// What would make a training step that does not fit its device memory fit
// (include/modar/planner.hpp, "memory advice"): the changes a user can make
// (a smaller micro-batch, activation recomputation, a higher ZeRO stage,
// more GPUs), each estimated by the cost model, with the peak per device it
// would need.  `modar estimate` prints it under DOES NOT FIT; `modar optimal`
// in the note of an architecture no shape of which fits.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "modar/base/errors.hpp"
#include "modar/base/text.hpp"
#include "modar/layout_search.hpp"
#include "modar/planner.hpp"
#include "optimal_internal.hpp"

namespace modar {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// More GPUs are tried in doublings up to this count.
constexpr int64_t kMaxAdvisedGpus = 16384;

std::string gib(double bytes) {
  return format_fixed(bytes / kGiB, 1) + " GiB";
}

// The peak per device of `config` (nullopt: the change is not a valid
// configuration, e.g. a ZeRO stage without data parallelism).
std::optional<MemoryBreakdown> memory_of(const Config& config, const DeviceProfile& profile) {
  try {
    return estimate(config, profile, StepKind::train).memory;
  } catch (const ConfigError&) {
    return std::nullopt;
  }
}

// Sequences per optimizer step of `config` (its global batch, resolved).
int64_t sequences_per_step(const Config& config) {
  return config.train.global_batch > 0
             ? config.train.global_batch
             : config.train.micro_batch * std::max<int64_t>(1, config.parallel.data(config.device.count));
}

}  // namespace

std::vector<MemoryRemedy> memory_remedies(const Config& config, const DeviceProfile& profile) {
  std::vector<MemoryRemedy> remedies;
  const auto consider = [&](const std::string& change, const Config& changed) {
    if (const auto memory = memory_of(changed, profile); memory && memory->fits) {
      remedies.push_back({change, memory->peak});
    }
  };
  const TrainConfig& train = config.train;
  if (train.micro_batch > 1) {
    Config c = config;
    c.train.micro_batch = 1;
    consider("train.micro_batch = 1 (now " + std::to_string(train.micro_batch) + ")", c);
  }
  for (const Recompute mode : {Recompute::selective, Recompute::full}) {
    if (mode > train.recompute) {
      Config c = config;
      c.train.recompute = mode;
      consider(std::string("train.recompute = ") + to_string(mode) + " (now " +
                   to_string(train.recompute) + ")",
               c);
    }
  }
  if (train.micro_batch > 1 && train.recompute != Recompute::full && remedies.empty()) {
    Config c = config;
    c.train.micro_batch = 1;
    c.train.recompute = Recompute::full;
    consider("train.micro_batch = 1 with train.recompute = full", c);
  }
  if (config.parallel.data(config.device.count) > 1) {
    for (int64_t zero = config.parallel.zero + 1; zero <= 3; ++zero) {
      Config c = config;
      c.parallel.zero = zero;
      consider("parallel.zero = " + std::to_string(zero) + " (now " +
                   std::to_string(config.parallel.zero) + ")",
               c);
    }
  }
  // More GPUs: the smallest doubling whose layout search (the same training
  // step: its global batch, micro-batch and recompute searched) fits.
  const TimingModel timing(profile);
  LayoutSearchOptions options;
  options.global_batch = sequences_per_step(config);
  for (int64_t gpus = std::max<int64_t>(2, 2 * config.device.count); gpus <= kMaxAdvisedGpus;
       gpus *= 2) {
    options.gpus = gpus;
    Config c = config;
    c.device.count = gpus;
    c.parallel = ParallelConfig{};
    try {
      if (!layout_fits(c, timing, options).fits) {
        continue;
      }
      const LayoutSearchResult layout = search_layout(c, timing, options);
      remedies.push_back({"gpus = " + std::to_string(gpus) + " (" + layout.summary + ")",
                          layout.estimate.memory.peak});
    } catch (const ConfigError&) {
      continue;  // no layout of this many GPUs splits the step
    }
    break;
  }
  return remedies;
}

std::string memory_advice(const Config& config, const DeviceProfile& profile) {
  const std::optional<MemoryBreakdown> now = memory_of(config, profile);
  if (!now || now->fits) {
    return "";
  }
  std::string text = "peak " + gib(now->peak) + " > " + gib(now->capacity) + " per device";
  const std::vector<MemoryRemedy> remedies = memory_remedies(config, profile);
  if (!remedies.empty()) {
    text += "; would fit with ";
    for (size_t i = 0; i < remedies.size(); ++i) {
      text += (i == 0 ? "" : (i + 1 == remedies.size() ? " or " : ", ")) + remedies[i].change +
              " (" + gib(remedies[i].peak_bytes) + ")";
    }
    return text;
  }
  const double state = now->weights + now->gradients + now->optimizer;
  text += " (weights, gradients and optimizer " + gib(state) + ", activations " +
          gib(now->activations) + ", workspace " + gib(now->workspace) +
          " incl. the logits); no smaller micro-batch, recompute, ZeRO stage or up to " +
          std::to_string(kMaxAdvisedGpus) + " GPUs fits";
  return text + (state > now->capacity
                     ? ": a device with more memory (another profile) is needed"
                     : ": a shorter model.seq_len or a device with more memory would help");
}

}  // namespace modar
