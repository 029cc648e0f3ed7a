// modar/runtime/validate_parallel.hpp: `modar validate --parallel`, measured vs
// predicted step time and per-rank peak memory of the multi-process training
// steps (parallel_steps.hpp) under mpirun, with compute and communication
// reported separately.  docs/profiler.md "Multi-process validation".
//
// Measurement (honest on a machine whose cores the ranks oversubscribe):
//   * every communicator call of the trainers goes through a timing decorator
//     (TimingCommunicator, a Communicator over the real one; no trainer
//     changes): it records the call's wall start and end (steady_clock, one
//     clock for every process of the node) and the process CPU time
//     (CLOCK_PROCESS_CPUTIME_ID) before and after it;
//   * compute = the process CPU time OUTSIDE the communicator calls (one
//     thread per rank): what the rank's own work costs, whatever the OS gave
//     to the other ranks meanwhile;
//   * transfer = the wall time of a call from the moment its LAST participant
//     arrived (the other ranks of a collective, the peer of a send / recv) to
//     its end on this rank: the communication itself, measured like the
//     `[network]` tables of `modar profile --comm` (wall time, same ranks);
//   * wait = the time a rank would idle in a call until its partners arrive
//     (load imbalance, the pipeline bubble).  Under oversubscription the
//     measured wall wait is mostly the OS running other ranks, so it is NOT
//     used: the step is REPLAYED (replay_timeline) with each rank's compute
//     segments (CPU time) and each call's transfer time, as if every rank had
//     its own core, and the replay's waits are reported;
//   * step = the replayed step (the slowest rank's end); per rank
//     compute + comm (= transfer + wait) = its end, exactly.  The table
//     reports the BUSIEST rank (the largest compute; the planner's compute
//     is the slowest stage's): its compute, and comm = step - compute = its
//     transfer + wait (+ any idle after its last call until the slowest
//     rank ends).
// The raw wall step (oversubscribed) is reported beside it.
//
// Prediction: estimate(config, profile) with the case's [parallel] layout
// (the cluster model, modar/parallel.hpp) on the profile's compute
// measurements and [network] tables; no overlap (overlap_grad_reduce /
// overlap_param_gather = false: the runtime's collectives block), stages
// split by layer count (balance_stages = false, as ParallelTrainer does).
// predicted compute = cluster compute_s + optimizer_s; predicted comm =
// exposed_comm_s + bubble_s.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "modar/config.hpp"
#include "modar/profile.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/comm.hpp"

namespace modar::runtime {

// ---- the replay (exposed for its tests) ---------------------------------------

// One communicator call of one rank, in call order.
struct TimelineCall {
  // Collectives: every member's k-th collective on a communicator is the same
  // call; `group` names the communicator (the same id on every member) and
  // `members` its world ranks.  Point to point: send_to / recv_from are
  // world ranks (-1: none; send_recv has both), matched with the partner's
  // call of the same (group, sender, receiver, sequence).
  int64_t group = 0;
  bool collective = true;
  int64_t sequence = 0;  // collectives: k on the group; p2p: see send_sequence
  std::vector<int> members;
  int send_to = -1, recv_from = -1;
  int64_t send_sequence = 0, recv_sequence = 0;  // k-th send to / recv from that peer on the group
  double compute_before_s = 0.0;  // CPU time since the previous call (or the step's start)
  double wall_start_s = 0.0, wall_end_s = 0.0;  // steady clock, comparable across the node's ranks
};
struct RankTimeline {
  std::vector<TimelineCall> calls;
  double compute_after_s = 0.0;  // CPU time after the last call
};
struct ReplayedRank {
  double compute_s = 0.0;   // sum of the CPU-time segments
  double transfer_s = 0.0;  // sum over calls of wall end - the last participant's wall start
  double wait_s = 0.0;      // idle in calls until the partners arrived (replayed)
  double end_s = 0.0;       // compute + transfer + wait
  std::vector<double> call_comm_s;  // per call: its end - this rank's arrival (transfer + wait)
};
// Replays one step on dedicated cores: a rank's clock advances by its
// compute segments; a call completes at the latest arrival of its
// participants plus its own transfer time.  Throws std::runtime_error when a
// call has no partner (mismatched timelines).
std::vector<ReplayedRank> replay_timeline(const std::vector<RankTimeline>& ranks);

// ---- cases --------------------------------------------------------------------

struct ParallelValidationCase {
  std::string name;          // "dp2-zero1-dense", "tp2-sp-dp2-moddar", ...
  std::string model;         // "dense" | "mod" | "moddar"
  std::string trainer;       // "data" | "tensor" | "pipeline"
  int64_t microbatches = 1;  // pipeline: m
  // The whole case: model, global batch, [parallel] (tensor, sequence
  // parallelism, pipeline, zero), device.count = the ranks; what the
  // planner estimates.
  Config config;
};
// The cases for `world` ranks (2 or 4; others: ConfigError naming the rank
// count).  quick: the dense model only.
std::vector<ParallelValidationCase> parallel_validation_cases(int world, bool quick);

struct ParallelValidationOptions {
  bool quick = false;
  int warmup_steps = 2;
  int rounds = 7;
  uint64_t seed = 1;
  std::vector<std::string> only;  // case names to run (empty: all); unknown: ConfigError
  std::FILE* progress = nullptr;  // rank 0's progress lines
};

struct ParallelCaseResult {
  ParallelValidationCase validation_case;
  int64_t rounds = 0;
  // measured, the round whose replayed step is the median: step = the
  // slowest rank's end; compute, transfer of the busiest rank (largest
  // compute); comm = step - compute; wait = comm - transfer.
  double step_s = 0.0;
  int busiest_rank = 0;
  double compute_s = 0.0, comm_s = 0.0, transfer_s = 0.0, wait_s = 0.0;
  double step_spread = 0.0;  // (p90 - p10) / median of the replayed steps
  double wall_step_s = 0.0;  // median raw wall step (oversubscribed), slowest rank
  double wall_comm_s = 0.0;  // its wall time inside communicator calls (that rank, median)
  std::vector<double> rank_compute_s, rank_comm_s, rank_end_s;  // the median round, per rank
  std::vector<double> rank_peak_bytes;                          // per rank
  std::vector<double> rank_predicted_peak_bytes;                // its stage's prediction
  int64_t calls_per_step = 0;  // communicator calls of the busiest rank
  // Communication by process group ("tensor", "pipeline", "data", "world"):
  // measured = the busiest rank's transfer + wait in the median round (and
  // "idle at the end" until the slowest rank ends);
  // predicted = the planner's comm records (count x time x exposed share) of
  // that group, the bubble under "pipeline bubble".
  std::vector<std::pair<std::string, double>> comm_by_group_s, predicted_comm_by_group_s;
  // predicted
  double predicted_step_s = 0.0;
  double predicted_compute_s = 0.0;  // cluster compute_s + optimizer_s
  double predicted_comm_s = 0.0;     // exposed_comm_s + bubble_s
  double predicted_bubble_s = 0.0;
  double step_error = 0.0, compute_error = 0.0, comm_error = 0.0;
  double peak_bytes = 0.0, predicted_peak_bytes = 0.0, memory_error = 0.0;  // max over ranks
};

struct ParallelValidationReport {
  std::string profile_name;
  std::string engine;  // the communicator's engine
  int world = 1;
  int logical_cpus = 0;
  std::vector<ParallelCaseResult> cases;
  double step_median_abs_error = 0.0, step_max_abs_error = 0.0;
  double compute_median_abs_error = 0.0, comm_median_abs_error = 0.0;
  double memory_median_abs_error = 0.0, memory_max_abs_error = 0.0;
  std::string load_average_before, load_average_after;
  std::string network;  // the profile's network provenance, in words
  std::string method;
};

// Collective over `world` (every rank calls it with the same options); the
// report is complete on rank 0 (other ranks: their own part only).
ParallelValidationReport run_parallel_validation(Backend& backend, Communicator& world,
                                                 const DeviceProfile& profile,
                                                 const ParallelValidationOptions& options);

std::string parallel_validation_text(const ParallelValidationReport& report);
std::string parallel_validation_json(const ParallelValidationReport& report);

}  // namespace modar::runtime
