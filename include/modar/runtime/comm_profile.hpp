// modar/runtime/comm_profile.hpp: measure the collectives of a communicator
// (`modar profile --comm`, run under mpirun) and turn them into the [network]
// tables of a device profile (modar/profile.hpp), which the planner
// interpolates (cost_models/network.cpp, collective_time_s).
//
// Definitions are nccl-tests' (NVIDIA/nccl-tests doc/PERFORMANCE.md):
//   size        bytes of the full vector: all-reduce buffer, reduce-scatter
//               input, all-gather output, all-to-all buffer per rank, one
//               send of send/recv (the convention of collective_time_s);
//   algbw       size / time;
//   busbw       algbw x collective_bus_factor(kind, ranks): 2(p-1)/p for
//               all-reduce, (p-1)/p for reduce-scatter / all-gather /
//               all-to-all, 1 for send/recv (each rank sends to the next and
//               receives from the previous of its group, at once).
// How a point (kind, group size, size) is timed:
//   * the group is ranks [0, g) of node 0 (intra_node) or the first rank of
//     each of g nodes (inter_node: one rank per node, so the table is per NIC
//     as the planner reads it); the other ranks wait; groups are measured one
//     at a time, like nccl-tests;
//   * `warmup` untimed calls; one probe call sets `inner`, the calls per
//     sample, so that a sample lasts about `sample_s`;
//   * each sample: the group synchronises (device sync + barrier), times
//     `inner` back-to-back calls with the backend's timer (steady_clock on the
//     CPU, CUDA events on a GPU), and divides; the sample of the group is the
//     MAX over its ranks (a step waits for the slowest rank; nccl-tests
//     averages over ranks instead);
//   * samples until `budget_s` is spent (at least min_repeats, at most
//     max_repeats); the median is the time, (p90 - p10) / median the spread.
// That is the `hot` arrival (CommArrival::hot, the default on a GPU): every
// rank is already spinning in the collective when the next call starts.  A
// training step meets its collectives differently: the ranks arrive after a
// stretch of compute, and on a CPU host the early ones poll, yield and must be
// rescheduled when the last one arrives.  The `cold` arrival (the default on
// the CPU backend) measures that:
//   * each sample is ONE call: every member first spins `compute_before_s` of
//     its own thread CPU time (a step's compute between two calls; a busy
//     loop, so that it costs the same CPU work whatever the load), then reads
//     the steady clock (system-wide on Linux, so comparable across the
//     node's ranks), calls, and reads it again;
//   * the call's time is last_arrival_call_s: from the LAST member's arrival
//     (the latest start) to each member's end, the max over members: the
//     definition `modar validate --parallel` uses for a call's transfer
//     (validate_parallel.hpp), measured without a barrier before the call;
//     the starts and ends are exchanged after the call (all-gather);
//   * samples until `budget_s` of wall time is spent (bursts included); the
//     table's time is their mean (CommMeasurement::time_s).
// Buffers are filled with zeros (no denormals, sums stay finite).
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "modar/parallel.hpp"
#include "modar/profile.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/comm.hpp"

namespace modar::runtime {

enum class CommArrival { automatic, hot, cold };  // automatic: cold on the CPU, hot on a GPU
const char* to_string(CommArrival arrival);

// What a caller asks of `profile --comm`: every setting optional (unset =
// the default for the backend and world, filled in by
// resolve_comm_profile_options, the ONE owner of these defaults).
struct CommProfileRequest {
  std::vector<Collective> kinds;       // empty: all five
  std::vector<int> group_sizes;        // empty: 2, 4, 8, ... <= the level's ranks, and that count
  std::optional<int64_t> min_bytes;    // 1 KiB
  std::optional<int64_t> max_bytes;    // 16 MiB on the CPU, 1 GiB on a GPU
  std::optional<double> size_factor;   // x4 on the CPU, x2 on a GPU
  std::optional<ScalarType> dtype;     // fp32
  std::optional<int> warmup;           // 5 untimed calls per point (nccl-tests -w 5)
  std::optional<int> min_repeats;      // 5
  std::optional<int> max_repeats;      // 50
  std::optional<double> budget_s;      // per point: 0.2 s on the CPU (1 s cold), 0.1 s on a GPU
  std::optional<double> sample_s;      // one sample: 2 ms on the CPU, 1 ms on a GPU (hot)
  std::optional<CommArrival> arrival;  // cold on the CPU, hot on a GPU; cold: cpu backend only
  std::optional<double> compute_before_s;  // cold: CPU time spun before each call; 2 ms
  FILE* progress = nullptr;                // one line per point (rank 0 only)
};

// The settings a run uses: a request resolved for one backend and world.
struct CommProfileOptions {
  std::vector<Collective> kinds;
  std::vector<int> group_sizes;  // empty: 2, 4, 8, ... <= the level's ranks, and that count
  int64_t min_bytes = 0;
  int64_t max_bytes = 0;
  double size_factor = 0.0;
  ScalarType dtype = ScalarType::fp32;
  int warmup = 0;
  int min_repeats = 0;
  int max_repeats = 0;
  double budget_s = 0.0;
  double sample_s = 0.0;
  CommArrival arrival = CommArrival::cold;  // hot or cold (never automatic once resolved)
  double compute_before_s = 0.0;
  FILE* progress = nullptr;
};

// The request resolved for this backend's device and a world of world_size
// ranks: the defaults above filled in, every field checked (ConfigError
// "comm_profile.FIELD = VALUE: what is allowed").
CommProfileOptions resolve_comm_profile_options(const CommProfileRequest& request,
                                                DeviceKind device, int world_size);

// The cold arrival's time of one call (comm_profile.hpp, above): member r
// entered the call at starts_s[r] and left it at ends_s[r] (one clock);
// returns max over r of (ends_s[r] - max over q of starts_s[q]), at least 0.
// ConfigError when the vectors are empty or differ in length.
double last_arrival_call_s(const std::vector<double>& starts_s, const std::vector<double>& ends_s);

struct CommMeasurement {
  Collective kind = Collective::all_reduce;
  NetLevel level = NetLevel::intra_node;
  int ranks = 2;
  int64_t bytes = 0;
  // The time the tables hold: hot, the median of the samples; cold, their
  // MEAN (a cold call is bimodal on a loaded host, ~0.1 ms when the group's
  // ranks are running and a scheduler period when one must be woken; a
  // step's many calls add up to the mean, and the median flips between the
  // modes from one run to the next).
  double time_s = 0.0;
  double median_s = 0.0;
  double p10_s = 0.0;
  double p90_s = 0.0;
  int repeats = 0;
  int inner = 0;  // calls per sample
  double algbw() const { return time_s > 0 ? static_cast<double>(bytes) / time_s : 0.0; }
  double busbw() const { return algbw() * collective_bus_factor(kind, ranks); }
  double spread() const { return median_s > 0 ? (p90_s - p10_s) / median_s : 0.0; }
};

struct CommProfileResult {
  std::vector<CommMeasurement> measurements;
  int world_size = 1;
  int ranks_per_node = 1;
  int nodes = 1;
  bool inter_node_measured = false;
  // The levels measured: tables per (kind, group size), bus_bandwidth = the
  // all-reduce busbw at the largest size and group, latency_s = the smallest
  // all-reduce time / its 2 ceil(log2 p) steps.
  NetworkLevel intra_node;
  NetworkLevel inter_node;
  std::map<std::string, std::string> provenance;  // network_* keys
};

// Collective over `world` (every rank calls it; the result is the same on
// every rank).  `backend` owns the buffers (its device must be world's).
// Throws ConfigError when the world has one rank ("run under mpirun"),
// Interrupted on Ctrl-C (every rank stops at the same point).
CommProfileResult run_comm_profile(Backend& backend, Communicator& world,
                                   const CommProfileRequest& request);

// `base` with its [network] replaced by the measured levels (the level not
// measured is kept from base, or, without one, copied from the measured level
// and named so), gpus_per_node = ranks per node, provenance network_* added.
DeviceProfile with_measured_network(const DeviceProfile& base, const CommProfileResult& result);

// nccl-tests-like table: one line per point (kind, level, ranks, bytes, time,
// spread, algbw, busbw).
std::string comm_profile_table(const CommProfileResult& result);

}  // namespace modar::runtime
