// runtime/parallel/pipeline_internal.hpp (internal to runtime/parallel): what
// the ParallelTrainer's files share: a stage's chunk, one micro-batch in
// flight, the depth-state swap, and the boundary transfers
// (pipeline_boundary.cpp).
#pragma once

#include <memory>
#include <vector>

#include "modar/runtime/parallel_steps.hpp"
#include "tensor_parallel.hpp"

namespace modar::runtime {

// The first layer of chunk c when `layers` are cut into `chunks` contiguous
// chunks, the first (layers mod chunks) one layer longer (the planner's
// equal_chunks, cost_models/parallel.cpp).
inline int64_t chunk_first_layer(int64_t layers, int64_t chunks, int64_t c) {
  const int64_t base = layers / chunks, extra = layers % chunks;
  return c * base + (c < extra ? c : extra);
}

struct ParallelTrainer::Chunk {
  int64_t index = 0;                // global chunk c (on stage c mod p)
  int64_t first = 0, end = 0;       // layers [first, end)
  std::vector<StackLayer*> layers;  // owned by the trainer
};

struct ParallelTrainer::Micro {
  int64_t index = 0;
  TensorView tokens, targets;                   // [mb, s] rows of the step's batch
  std::vector<LayerStates> saved;               // per chunk of this stage: what its layers keep
  std::shared_ptr<DepthResidual::State> depth;  // this micro-batch's bank and saved reads
  // forward: the chunk input, then (in place) its output; after the last
  // chunk, the head's input ([mb, s / t, d] under SP)
  Buffer x;
  Buffer dx;          // backward: gradient w.r.t. the chunk output, then its input
  Buffer final_full;  // SP: the head's input gathered over the sequence
  LmHead::Saved head;
  VocabLookup lookup;      // the vocab-parallel embedding's (first chunk)
  double lm_loss = 0.0;    // mean cross-entropy of the micro-batch (last chunk)
  double lm_weight = 1.0;  // its weight in the objective (make_micros)
  LayerLosses losses;      // this stage's layers' terms
};

// Swaps a micro-batch's depth state into the stage's DepthResidual for the
// duration of a scope (1F1B holds several micro-batches in flight).
class DepthScope {
 public:
  DepthScope(DepthResidual* depth, std::shared_ptr<DepthResidual::State>& state)
      : depth_(depth), state_(state) {
    if (depth_ != nullptr) {
      depth_->put_state(std::move(state_));
    }
  }
  ~DepthScope() {
    if (depth_ != nullptr) {
      state_ = depth_->take_state();
    }
  }
  DepthScope(const DepthScope&) = delete;
  DepthScope& operator=(const DepthScope&) = delete;

 private:
  DepthResidual* depth_;
  std::shared_ptr<DepthResidual::State>& state_;
};

// The transfers across a chunk boundary, on the pipeline group: the
// activation [mb, s, d] (AttnRes / DAR: the bank entries the receiver lacks,
// with their key statistic, and a cut block's partial) forward, and its
// gradient backward.  Under tensor parallelism without SP the tensors are
// replicated over the tensor group: each tensor rank sends its 1 / t of them
// to the same tensor rank of the next stage, which all-gathers them
// (Megatron's scatter / gather); under SP each rank's shard goes whole.
class ParallelTrainer::Boundary {
 public:
  explicit Boundary(ParallelTrainer& trainer) : trainer_(trainer) {}
  void send_forward(Micro& micro, const Chunk& chunk);   // chunk's output -> chunk + 1
  void recv_forward(Micro& micro, const Chunk& chunk);   // chunk's input <- chunk - 1
  void send_backward(Micro& micro, const Chunk& chunk);  // chunk's input gradient -> chunk - 1
  void recv_backward(Micro& micro, const Chunk& chunk);  // chunk's output gradient <- chunk + 1

 private:
  // Point to point with the tensor group's scatter / gather.
  void send(const TensorView& buf, int peer);
  void recv(const TensorView& buf, int peer);
  bool split_over_tensor(const TensorView& buf) const;
  // AttnRes / DAR: what crosses the boundary after chunk c: the bank from
  // entry `from` to the entries complete at branch `end_branch`, and a cut
  // block's partial (k entries in all).
  struct BankSpan {
    int64_t end_branch = 0, from = 0, entries = 0;
  };
  BankSpan bank_span(int64_t c) const;
  // Entries the receiver of chunk c already holds (parallel.dar_bank_cache:
  // what it had at the end of its chunk c - p).
  int64_t bank_held_before(int64_t c) const;
  int64_t chunk_end_layer(int64_t c) const;
  int owner(int64_t c) const { return static_cast<int>(c % trainer_.stages_); }
  int64_t rows(const Micro& micro) const;  // tokens of the micro-batch on this rank

  ParallelTrainer& trainer_;
};

}  // namespace modar::runtime
