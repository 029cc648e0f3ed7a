// runtime/parallel/pipeline_schedule.cpp: the 1F1B and interleaved 1F1B
// orders of a pipeline stage's passes and the deadlock-free placement of its
// sends and receives (pipeline_schedule.hpp explains both).
#include "pipeline_schedule.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>

#include "modar/base/errors.hpp"

namespace modar::runtime::pipeline {

namespace {

// The forward table of the interleaved schedule (Megatron's
// get_schedule_table with groups of p micro-batches): entry k = (micro-batch,
// this stage's chunk k').
std::vector<std::pair<int64_t, int64_t>> forward_table(int64_t stages, int64_t virtual_stages,
                                                       int64_t microbatches) {
  std::vector<std::pair<int64_t, int64_t>> table;
  for (int64_t group = 0; group < microbatches; group += stages) {
    const int64_t group_end = std::min(microbatches, group + stages);
    for (int64_t k = 0; k < virtual_stages; ++k) {
      for (int64_t mb = group; mb < group_end; ++mb) {
        table.emplace_back(mb, k);
      }
    }
  }
  return table;
}

}  // namespace

std::vector<PipelinePass> compute_order(int64_t stages, int64_t virtual_stages,
                                        int64_t microbatches, int64_t stage) {
  const int64_t p = stages, v = virtual_stages, m = microbatches;
  if (v > 1 && m % p != 0) {
    throw ConfigError("pipeline microbatches = " + std::to_string(m) +
                      " must be a multiple of parallel.pipeline = " + std::to_string(p) +
                      " with parallel.virtual_stages = " + std::to_string(v) +
                      " (the interleaved schedule runs micro-batches in groups of p)");
  }
  const int64_t total = m * v;
  const std::vector<std::pair<int64_t, int64_t>> table = forward_table(p, v, m);
  auto pass = [&](int64_t k, bool forward) {
    const auto [mb, chunk] = table[static_cast<size_t>(k)];
    const int64_t local = forward ? chunk : v - 1 - chunk;
    return PipelinePass{forward, mb, local * p + stage};
  };
  const int64_t warmup =
      std::min(total, v == 1 ? p - stage - 1 : 2 * (p - stage - 1) + (v - 1) * p);
  std::vector<PipelinePass> order;
  for (int64_t k = 0; k < warmup; ++k) {
    order.push_back(pass(k, true));
  }
  for (int64_t k = 0; k < total - warmup; ++k) {
    order.push_back(pass(warmup + k, true));
    order.push_back(pass(k, false));
  }
  for (int64_t k = total - warmup; k < total; ++k) {
    order.push_back(pass(k, false));
  }
  return order;
}

std::vector<Step> stage_steps(int64_t stages, int64_t virtual_stages, int64_t microbatches,
                              int64_t stage) {
  const int64_t p = stages, chunks = stages * virtual_stages;
  std::vector<std::vector<PipelinePass>> orders;
  for (int64_t s = 0; s < p; ++s) {
    orders.push_back(compute_order(stages, virtual_stages, microbatches, s));
  }
  // Finish times of the passes placed so far, by (forward, micro-batch, chunk).
  std::map<std::tuple<bool, int64_t, int64_t>, double> finished;
  auto done = [&](bool forward, int64_t mb, int64_t chunk, double* at) {
    const auto it = finished.find({forward, mb, chunk});
    if (it == finished.end()) {
      return false;
    }
    *at = std::max(*at, it->second);
    return true;
  };
  // A pass may start once the passes it reads are placed: the forward of the
  // chunk before (its input), the backward of the chunk after (its output
  // gradient; the last chunk: its own forward).
  auto ready = [&](const PipelinePass& pass, double* start) {
    if (pass.forward) {
      return pass.chunk == 0 || done(true, pass.microbatch, pass.chunk - 1, start);
    }
    return pass.chunk == chunks - 1 ? done(true, pass.microbatch, pass.chunk, start)
                                    : done(false, pass.microbatch, pass.chunk + 1, start);
  };
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<double> free_at(static_cast<size_t>(p), 0.0);
  std::vector<Step> mine;
  for (;;) {
    int64_t pick = -1;
    double pick_start = 0.0;
    for (int64_t s = 0; s < p; ++s) {
      const auto& order = orders[static_cast<size_t>(s)];
      if (next[static_cast<size_t>(s)] == order.size()) {
        continue;
      }
      double start = free_at[static_cast<size_t>(s)];
      if (ready(order[next[static_cast<size_t>(s)]], &start) && (pick < 0 || start < pick_start)) {
        pick = s;
        pick_start = start;
      }
    }
    if (pick < 0) {
      break;
    }
    const PipelinePass pass = orders[static_cast<size_t>(pick)][next[static_cast<size_t>(pick)]++];
    const double end = pick_start + (pass.forward ? 1.0 : 2.0);
    free_at[static_cast<size_t>(pick)] = end;
    finished[{pass.forward, pass.microbatch, pass.chunk}] = end;
    if (pick == stage) {
      mine.push_back(
          {pass.forward ? Step::Kind::forward : Step::Kind::backward, pass.microbatch, pass.chunk});
    }
    // The transfer this pass produces, on its sender and its receiver.
    const int64_t to = pass.forward ? pass.chunk + 1 : pass.chunk - 1;
    if (p > 1 && to >= 0 && to < chunks) {
      if (pick == stage) {
        mine.push_back({pass.forward ? Step::Kind::send_forward : Step::Kind::send_backward,
                        pass.microbatch, pass.chunk});
      }
      if (to % p == stage) {
        mine.push_back({pass.forward ? Step::Kind::recv_forward : Step::Kind::recv_backward,
                        pass.microbatch, to});
      }
    }
  }
  for (int64_t s = 0; s < p; ++s) {
    if (next[static_cast<size_t>(s)] != orders[static_cast<size_t>(s)].size()) {
      throw std::logic_error("pipeline schedule: stage " + std::to_string(s) +
                             " waits on a pass that never runs (the order has a cycle)");
    }
  }
  return mine;
}

}  // namespace modar::runtime::pipeline
