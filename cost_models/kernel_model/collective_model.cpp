// The time of one collective from the bus bandwidth of its network level,
// the way NCCL itself predicts it (docs/kernel_model.md "Collectives").
//
// NCCL picks, per call, the fastest of its algorithms (ring; tree for
// all-reduce) and protocols (LL, LL128, Simple) by its own cost model,
// time = latency + bytes / algorithm bandwidth (NVIDIA/nccl,
// src/graph/tuning.cc, NCCL 2.8-2.10 / 2021):
//   - latency = a base per (algorithm, protocol) + per ring step the hardware
//     latency of the link it crosses (NVLink inside a node, the network
//     between nodes); a ring takes 2 (p - 1) steps for all-reduce and p - 1
//     for reduce-scatter / all-gather, 2 (nodes - 1) resp. nodes - 1 of them
//     between nodes; a tree 2 ((ranks per node - 1) intra + log2(nodes) inter);
//   - bandwidth = the bus bandwidth x the protocol's share (LL 1/4 for
//     all-reduce or across nodes, else 1/3; LL128 0.92; Simple 1), divided by
//     the bus factor of the collective (ring; the tree's algorithm bandwidth
//     is 0.9 x busbw x 0.5);
//   - corrections NCCL applies: LL's intra-node step latency x 1.8 across
//     nodes, the ring Simple all-reduce's "plateau" latency x 1.9 across nodes
//     for messages of at least ranks / 16 x 64 KiB.
// So small messages are latency-bound (LL), mid-size ones ride LL128 and
// large ones reach the bus bandwidth, the curve nccl-tests shows.  The
// profile's per-level latency_s is the ring Simple step latency; the other
// protocols' step latencies keep NCCL's ratios to it.
// All-to-all (NCCL: grouped send / recv to every peer at once) and send /
// recv take one step.
#include <algorithm>
#include <cmath>

#include "modar/parallel.hpp"

namespace modar {
namespace {

enum Protocol { kLL = 0, kLL128 = 1, kSimple = 2 };

// Microseconds, NCCL src/graph/tuning.cc (baseLat, hwLat).
constexpr double kRingBaseLatency_us[3] = {3.6, 10.0, 8.4};
constexpr double kTreeBaseLatency_us[3] = {4.4, 4.4, 0.0};
constexpr double kNvlinkRingStep_us[3] = {0.47, 1.9, 3.4};
constexpr double kNvlinkTreeStep_us[3] = {0.52, 1.2, 28.0};
constexpr double kNetRingStep_us[3] = {2.7, 4.0, 9.6};
constexpr double kNetTreeStep_us[3] = {5.0, 8.5, 50.0};
// The ring Simple step latencies the profile's latency_s replaces.
constexpr double kNvlinkReference_s = 3.4e-6;
constexpr double kNetReference_s = 9.6e-6;

}  // namespace

double nccl_collective_time_s(Collective kind, double bytes, int64_t ranks, int64_t nodes,
                              double bus_bandwidth, double intra_step_latency_s,
                              double inter_step_latency_s) {
  if (ranks <= 1 || bytes <= 0.0 || bus_bandwidth <= 0.0) {
    return 0.0;
  }
  nodes = std::clamp<int64_t>(nodes, 1, ranks);
  const double n = static_cast<double>(ranks);
  const double node_count = static_cast<double>(nodes);
  const bool all_reduce = kind == Collective::all_reduce;
  const bool one_step = kind == Collective::send_recv || kind == Collective::all_to_all;
  const double steps = all_reduce ? 2.0 * (n - 1.0) : one_step ? 1.0 : n - 1.0;
  const double inter_steps = all_reduce ? 2.0 * (node_count - 1.0)
                             : one_step ? (nodes > 1 ? 1.0 : 0.0)
                                        : node_count - 1.0;
  const double intra_scale = intra_step_latency_s / kNvlinkReference_s;
  const double inter_scale = inter_step_latency_s / kNetReference_s;
  const double factor = collective_bus_factor(kind, ranks);
  const bool multi_node = nodes > 1;
  double best = -1.0;
  for (int p = kLL; p <= kSimple; ++p) {
    double bandwidth = bus_bandwidth;
    if (p == kLL) {
      bandwidth *= (multi_node || all_reduce) ? 1.0 / 4.0 : 1.0 / 3.0;
    } else if (p == kLL128) {
      bandwidth *= 0.92;
    }
    const double intra_step_us =
        kNvlinkRingStep_us[p] * intra_scale * (multi_node && p == kLL ? 1.8 : 1.0);
    double latency_us = kRingBaseLatency_us[p] + (steps - inter_steps) * intra_step_us +
                        inter_steps * kNetRingStep_us[p] * inter_scale;
    if (all_reduce && p == kSimple && multi_node && bytes >= n / 16.0 * 65536.0) {
      latency_us *= 1.9;  // NCCL's "plateau effect of ring"
    }
    const double ring_s = latency_us * 1e-6 + bytes * factor / bandwidth;
    best = best < 0.0 ? ring_s : std::min(best, ring_s);
    if (all_reduce) {
      double tree_bandwidth = 0.9 * bus_bandwidth;
      if (p == kLL) {
        tree_bandwidth *= 1.0 / 3.8;
      } else if (p == kLL128) {
        tree_bandwidth *= multi_node ? 0.915 : 7.0 / 9.0;
      }
      const double ranks_per_node = std::ceil(n / node_count);
      const double tree_latency_us =
          kTreeBaseLatency_us[p] + 2.0 * ((ranks_per_node - 1.0) * kNvlinkTreeStep_us[p] *
                                              intra_scale * (multi_node && p == kLL ? 1.8 : 1.0) +
                                          std::log2(node_count) * kNetTreeStep_us[p] * inter_scale);
      best = std::min(best, tree_latency_us * 1e-6 + bytes / (0.5 * tree_bandwidth));
    }
  }
  return best;
}

}  // namespace modar
