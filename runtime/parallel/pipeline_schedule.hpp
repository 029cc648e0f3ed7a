// runtime/parallel/pipeline_schedule.hpp (internal to runtime/parallel): the
// order in which a pipeline stage runs its passes, and where its sends and
// receives go so that blocking point-to-point calls cannot deadlock.
//
// Compute order: Megatron-Core's schedules (Narayanan et al. 2021).  With C =
// p v chunks (chunk c on stage c mod p, this stage's k-th chunk is c = k p +
// stage), m micro-batches and T = m v passes of each kind per stage:
//   * v = 1, 1F1B: w = min(p - s - 1, m) warm-up forwards, then m - w pairs
//     (forward, backward), then w backwards;
//   * v > 1, interleaved 1F1B (m a multiple of p): the forward table visits
//     micro-batches in groups of p: for each group, for each of the stage's
//     chunks in order, the group's micro-batches in order; backward k runs the
//     table's k-th micro-batch on the mirrored chunk (v - 1 - k).  Warm-up
//     w = min(T, 2 (p - s - 1) + (v - 1) p) forwards, then T - w pairs
//     (forward w + k, backward k), then the remaining backwards.
//
// Communication: every rank builds the same global sequence of all stages'
// passes (a list schedule: each stage's passes in its own order, each pass
// after the passes it needs, earliest simulated start first, forward 1 and
// backward 2 time units).  A boundary's transfer is placed right after the
// pass that produces it, on both its sender and its receiver.  Each stage
// then runs its own subsequence with blocking calls: the first transfer not
// yet done has both its ranks done with everything before it in the global
// sequence, so it completes; by induction every call does (no deadlock, even
// with synchronous sends).
#pragma once

#include <cstdint>
#include <vector>

#include "modar/runtime/parallel_steps.hpp"

namespace modar::runtime::pipeline {

struct Step {
  enum class Kind { forward, backward, send_forward, recv_forward, send_backward, recv_backward };
  Kind kind = Kind::forward;
  int64_t microbatch = 0;
  // forward / backward: the chunk computed.  send_forward: the chunk whose
  // output leaves (to chunk + 1); recv_forward: the chunk whose input arrives;
  // send_backward: the chunk whose input gradient leaves (to chunk - 1);
  // recv_backward: the chunk whose output gradient arrives.  Global chunk ids.
  int64_t chunk = 0;
};

// Megatron's order of stage `stage`'s passes (global chunk ids).  Throws
// ConfigError (microbatches, parallel.virtual_stages) where Megatron refuses
// the layout: v > 1 needs m to be a multiple of p.
std::vector<PipelinePass> compute_order(int64_t stages, int64_t virtual_stages,
                                        int64_t microbatches, int64_t stage);

// The stage's passes with its sends and receives, deadlock-free (above).
std::vector<Step> stage_steps(int64_t stages, int64_t virtual_stages, int64_t microbatches,
                              int64_t stage);

}  // namespace modar::runtime::pipeline
