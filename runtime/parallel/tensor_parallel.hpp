// runtime/parallel/tensor_parallel.hpp (internal to runtime/parallel): a
// layer's Megatron tensor-parallel shard as a StackLayer, and the sequence
// shard <-> whole sequence moves of sequence parallelism.
#pragma once

#include <memory>

#include "modar/runtime/comm.hpp"
#include "modar/runtime/model.hpp"

namespace modar::runtime {

// [b, s / t, d] shards <-> [b, s, d] over the tensor group (sequence
// parallelism): all-gather, reduce-scatter of a partial sum, and this rank's
// block of a whole tensor (no communication).
Buffer gather_sequence(const Context& ctx, Communicator& tensor, const TensorView& shard);
Buffer scatter_sequence_sum(const Context& ctx, Communicator& tensor, const TensorView& partial);
Buffer take_sequence_shard(const Context& ctx, Communicator& tensor, const TensorView& full);

// A ShardGroup (layers.hpp) on a tensor group's communicator.
class TensorShardGroup final : public ShardGroup {
 public:
  explicit TensorShardGroup(Communicator& group) : group_(group) {}
  int size() const override { return group_.size(); }
  int rank() const override { return group_.rank(); }
  void all_reduce_sum(const TensorView& buf) override { group_.all_reduce(buf, ReduceOp::sum); }
  void all_gather(const TensorView& in, const TensorView& out) override {
    group_.all_gather(in, out);
  }

 private:
  Communicator& group_;
};

// Megatron's vocab-parallel embedding: this rank holds the rows [begin, begin
// + V / t) of the table; a token outside them looks up zeros, and the ranks'
// lookups are summed over the tensor group (all-reduce; under SP
// reduce-scattered into this rank's [b, s / t, d] shard).  The backward takes
// the whole [b, s, d] gradient (SP: gathered first) into this rank's rows.
struct VocabLookup {
  Buffer ids;   // i32 [b, s]: the token's row here, 0 when it lies elsewhere
  Buffer mask;  // [b, s, d]: 1 where the token's row is here, else 0
};
Buffer vocab_parallel_embedding(const Context& ctx, Communicator& tensor, const Parameter& table,
                                int64_t begin, const TensorView& tokens, bool sequence_parallel,
                                VocabLookup& lookup);
void vocab_parallel_embedding_backward(const Context& ctx, Parameter& table, const TensorView& dx,
                                       const VocabLookup& lookup);

// Layer l of `config` on tensor rank r of t: the runtime's own
// AttentionBranch / MlpBranch built with the shard's shape (heads / t,
// kv_heads / t, d_ff / t), so that Wq, Wk, Wv (W_in, W_gate, W_up) are
// Megatron's column-parallel blocks and Wo (W_out) the row-parallel block
// whose output is this rank's partial sum.  Without SP a branch's output is
// all-reduced over the tensor group, and so is its input gradient; with SP
// the branch input is all-gathered and its output (and input gradient)
// reduce-scattered.  The branch's RMSNorm runs inside the branch on the whole
// sequence, so its weight's gradient is a partial sum (reduced by the
// trainer).  MoD: router and top-k replicated (SP: each rank scores its own
// tokens and the b s logits are all-gathered); the routed block's
// collectives carry the b k routed rows (SP: X~ assembled by an all-reduce of
// each rank's own rows).  The causal-router BCE terms are means over the
// rank's rows under SP: their gradients are scaled by 1 / t and the router
// and predictor gradients summed by the trainer.
class TensorParallelLayer final : public StackLayer {
 public:
  TensorParallelLayer(ParameterSet& params, const Context& ctx, const Config& config,
                      const ModelOptions& options, int64_t layer, Communicator& tensor,
                      bool sequence_parallel, Rng& rng);
  ~TensorParallelLayer() override;
  std::unique_ptr<Saved> make_saved() const override;
  void forward_inplace(const Context& ctx, const TensorView& x, const TensorView& positions,
                       Saved* saved, LayerLosses& losses) override;
  void backward_inplace(const Context& ctx, const TensorView& dx, Saved& saved) override;
  Buffer branch_forward(const Context& ctx, int branch, const TensorView& h,
                        const TensorView& positions, Saved* saved, LayerLosses& losses) override;
  Buffer branch_backward(const Context& ctx, int branch, const TensorView& dy,
                         Saved& saved) override;

 private:
  struct State;
  static State& state_of(Saved* saved);  // training passes only
  // Branch `branch` on `input` ([b, s / t, d] shard when `sharded`: gathered
  // first, output reduce-scattered; else whole, output all-reduced), and its
  // backward (returns d input, same layout).
  Buffer shard_forward(const Context& ctx, State& st, int branch, const TensorView& input,
                       bool sharded, const TensorView& positions);
  Buffer shard_backward(const Context& ctx, State& st, int branch, const TensorView& dy,
                        bool sharded);
  // delta = a + m of TransformerLayer, and J^T ddelta.
  Buffer delta_forward(const Context& ctx, State& st, const TensorView& x, bool sharded,
                       const TensorView& positions);
  Buffer delta_backward(const Context& ctx, State& st, const TensorView& ddelta, bool sharded);
  // MoD: router logits (of this rank's tokens under SP), top-k over the whole
  // sequence (SP: the logits all-gathered), this rank's index map and the
  // causal-router losses (means over the whole batch).
  RoutedLayer::Losses route(const Context& ctx, State& st, const TensorView& x);
  void route_backward(const Context& ctx, State& st, const TensorView& dx);
  // X~ [b, k, d] on every tensor rank (SP: each rank's routed rows summed).
  Buffer gather_routed(const Context& ctx, State& st, const TensorView& x);
  TensorView routed_index(const State& st) const;

  Communicator& tensor_;
  bool sp_ = false;
  RoutingOptions routing_;
  bool routed_ = false;
  std::unique_ptr<AttentionBranch> attention_;
  std::unique_ptr<MlpBranch> mlp_;
  Parameter* router_ = nullptr;
  Parameter *pred_in_ = nullptr, *pred_out_ = nullptr;
};

}  // namespace modar::runtime
