// modar/runtime/parallel_steps.hpp: training steps of the reference runtime
// across processes, on the communicator of comm.hpp (MPI on the CPU backend).
// docs/runtime_parallel.md describes the layouts and what is checked.
//
//  * Process groups from the [parallel] layout: world rank
//        rank = tensor + t * (stage + p * data)
//    (tensor fastest, as cost_models/parallel.cpp places a tensor group inside
//    a node), split into the tensor, pipeline and data-parallel groups.
//  * ShardedOptimizer  the data-parallel gradient reduction and AdamW over any
//    ParameterSet: ZeRO stage 0 (all-reduce of the gradients in 25 MiB buckets, full optimizer
//    state on every rank), 1 (all-reduce, each rank updates and keeps the
//    AdamW state of its 1/dp shard of the flattened parameters, all-gather of
//    the parameters), 2 (reduce-scatter of the gradients into the shard, same
//    update and all-gather).
//  * DataParallelTrainer  a whole Model replicated on the data group, each
//    rank stepping on its rows of the global batch; with ZeRO 3 the Model's
//    parameter units sharded by a Zero3Optimizer (gathered per unit right
//    before use, gradients reduce-scattered per unit after its backward).
//  * ExpertParallelTrainer  the experts of every MoE layer split over expert
//    groups carved out of the data group, tokens exchanged by all-to-all.
//  * PipelineTrainer  the model cut into p contiguous stages of layers
//    (embedding on the first, final norm + head + loss on the last; a tied
//    embedding lives on both and their gradients are summed), microbatches
//    run in the 1F1B schedule, activations and their gradients sent between
//    neighbouring stages; combines with data parallelism (and ZeRO) over the
//    data group.
//
// Every trainer averages the per-microbatch / per-rank mean losses and
// gradients, so a step on P processes is the single-process step on the same
// global batch up to the rounding of the sums (tests/cpp/parallel).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "modar/config.hpp"
#include "modar/runtime/comm.hpp"
#include "modar/runtime/layers.hpp"
#include "modar/runtime/model.hpp"

namespace modar::runtime {

// ---- process groups ----------------------------------------------------------

struct LayoutShape {
  int64_t tensor = 1, pipeline = 1, data = 1;
  int64_t world() const { return tensor * pipeline * data; }
};
struct LayoutCoordinates {
  int64_t tensor = 0, stage = 0, data = 0;
};
// The layout of `layout` on `world_size` processes: data = world / (t p).
// ConfigError naming parallel.tensor / parallel.pipeline when t p does not
// divide the process count, or for layouts the runtime does not run.
LayoutShape layout_shape(const ParallelConfig& layout, int64_t world_size);
LayoutCoordinates layout_coordinates(const LayoutShape& shape, int64_t rank);
int64_t layout_rank(const LayoutShape& shape, const LayoutCoordinates& at);

struct ProcessGroups {
  LayoutShape shape;
  LayoutCoordinates at;
  std::unique_ptr<Communicator> tensor;    // same (stage, data), ordered by tensor rank
  std::unique_ptr<Communicator> pipeline;  // same (tensor, data), ordered by stage
  std::unique_ptr<Communicator> data;      // same (tensor, stage), ordered by data rank
};
// Collective over `world` (every rank must call it).
ProcessGroups make_process_groups(Communicator& world, const ParallelConfig& layout);

// ---- data parallelism and ZeRO -------------------------------------------------

class ShardedOptimizer {
 public:
  // zero_stage 0, 1 or 2 (ConfigError otherwise: parallel.zero).  Stage 0
  // all-reduces the gradients in buckets of at most 25 MiB (DDP's default).  With a
  // stage >= 1 the parameters' own AdamW moments are released and this
  // object holds the shard's master copy and moments instead (counted by
  // `tracker`).
  ShardedOptimizer(Backend& backend, ParameterSet& params, MemoryTracker* tracker,
                   Communicator& data_group, int64_t zero_stage, const AdamWParams& adamw);
  ~ShardedOptimizer();
  ShardedOptimizer(const ShardedOptimizer&) = delete;
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;

  // After the backward(s): reduce the gradients over the data group, AdamW
  // with the gradients multiplied by `grad_scale` (1 / (ranks x microbatches)
  // turns summed means into the global mean) and, ZeRO >= 1, all-gather the
  // updated parameters into every rank's values.
  void step(double grad_scale);

  int64_t zero_stage() const { return zero_; }
  int64_t flat_numel() const { return flat_numel_; }    // all parameters, padded to dp
  int64_t shard_numel() const { return shard_numel_; }  // this rank's optimizer shard
  // The reduced (unscaled) gradient of this rank's shard after the last step
  // (ZeRO >= 1), or empty.
  std::vector<double> shard_gradient() const;

 private:
  void flatten_grads(const TensorView& flat);
  void scatter_params(const TensorView& flat);
  void all_reduce_grads_in_buckets();

  Backend& backend_;
  ParameterSet& params_;
  MemoryTracker* tracker_;
  Communicator& data_;
  int64_t zero_ = 0;
  AdamWParams adamw_;
  int64_t step_ = 0;
  ScalarType optimizer_type_ = ScalarType::fp32;
  std::vector<int64_t> offsets_;  // flat offset of each parameter
  int64_t flat_numel_ = 0, shard_numel_ = 0;
  Buffer shard_master_, shard_m_, shard_v_, shard_grad_;
};

// Sums a few host doubles over a group (on `backend`, in fp64).
std::vector<double> all_reduce_sum(Backend& backend, Communicator& group,
                                   const std::vector<double>& values);

// ZeRO stage 3 (Rajbhandari et al. 2020) over the data group, on the Model's
// parameter units (model.hpp ParameterUnitHooks): each unit (embedding, each
// layer, the depth residual, final norm + head) is flattened, padded to a
// multiple of dp and cut into dp shards; this rank keeps only its shard of
// every unit (master values and AdamW moments; the full values, gradients and
// moments of the Model are released).  Model::run acquires a unit right
// before its use: an all-gather of the shards into freshly allocated
// Parameter::value buffers, released right after the unit's forward, gathered
// again for its backward; after the unit's backward its gradients are
// reduce-scattered into this rank's shard and freed (per unit, so per layer).
// Parameter values must not be bf16 with an fp32 master (ConfigError:
// train.dtype).  The model's hooks point here while this object lives.
class Zero3Optimizer final : public ParameterUnitHooks {
 public:
  Zero3Optimizer(Model& model, Communicator& data_group, const AdamWParams& adamw);
  ~Zero3Optimizer() override;
  Zero3Optimizer(const Zero3Optimizer&) = delete;
  Zero3Optimizer& operator=(const Zero3Optimizer&) = delete;

  void acquire(int64_t unit, bool values, bool grads) override;
  void release(int64_t unit) override;
  // After the backward: AdamW on every unit's shard with the reduced
  // gradients multiplied by grad_scale (nothing is gathered here: the next
  // forward gathers the updated shards).
  void step(double grad_scale);

  struct Traffic {  // message bytes as the planner counts them (the full gathered /
                    // reduced buffer, padding included), and calls
    int64_t all_gather_bytes = 0, all_gather_calls = 0;
    int64_t reduce_scatter_bytes = 0, reduce_scatter_calls = 0;
    int64_t layer_gather_bytes = 0;  // the part of all_gather_bytes for "layer<l>" units
  };
  const Traffic& traffic() const { return traffic_; }
  void reset_traffic() { traffic_ = Traffic{}; }
  // Parameter bytes on this rank: the shards' master values plus the values
  // of the units gathered at the moment (peak since the last step began).
  const MemoryTracker& parameter_memory() const { return parameter_memory_; }
  void reset_parameter_peak() { parameter_memory_.reset_peak(); }
  int64_t unit_count() const { return static_cast<int64_t>(units_.size()); }
  int64_t unit_numel(int64_t unit) const;        // parameters of the unit
  int64_t unit_shard_numel(int64_t unit) const;  // ceil(numel / dp)
  // The reduced (unscaled) gradient shard of a unit after the last backward.
  std::vector<double> shard_gradient(int64_t unit) const;

 private:
  struct Unit;
  Model& model_;
  Communicator& data_;
  AdamWParams adamw_;
  int64_t step_ = 0;
  std::vector<std::unique_ptr<Unit>> units_;
  Traffic traffic_;
  MemoryTracker parameter_memory_;
};

// A Model replicated over the data group: each rank runs forward / backward on
// its own rows of the global batch, then the ShardedOptimizer step (ZeRO 0-2),
// or with zero_stage 3 the Model's parameters sharded by a Zero3Optimizer.
class DataParallelTrainer {
 public:
  DataParallelTrainer(Model& model, Communicator& data_group, int64_t zero_stage);
  ~DataParallelTrainer();
  // tokens, targets: this rank's rows (i32 [b / dp, s]; every rank the same b / dp).
  // The returned losses are the global-batch means (identical on every rank);
  // peak_bytes is this rank's.
  StepResult train_step(const TensorView& tokens, const TensorView& targets);
  ShardedOptimizer& optimizer();  // ZeRO 0-2 (std::logic_error under ZeRO 3)
  Zero3Optimizer& zero3();        // ZeRO 3 (std::logic_error otherwise)

 private:
  Model& model_;
  Communicator& data_;
  std::unique_ptr<ShardedOptimizer> optimizer_;
  std::unique_ptr<Zero3Optimizer> zero3_;
};

// ---- expert parallelism ------------------------------------------------------------

// Bytes moved by the expert exchanges of an ExpertParallelTrainer (this rank).
struct ExpertTraffic {
  int64_t all_to_all_calls = 0;  // dispatch + combine, forward and backward
  int64_t all_to_all_bytes = 0;  // message bytes: the whole padded send buffer
  int64_t payload_bytes = 0;     // the rows actually sent (self included), no padding
  int64_t count_bytes = 0;       // the counts exchanges before them
};

// Expert parallelism (Lepikhin et al. 2020, as Megatron-Core carves it out
// of the data group): the data group's ranks in blocks of `expert`
// consecutive ranks form the expert groups; the E experts of every MoE layer
// are split over an expert group (E / expert consecutive experts per rank).
// Each rank routes its own tokens, exchanges the per-expert counts
// (all-to-all), sends the rows to the experts' ranks (all-to-all, equal
// chunks padded to the group's largest block), runs its experts, and sends
// the outputs back (all-to-all) to combine; the backward runs the same two
// exchanges on the gradients.  Expert weights' gradients are summed over the
// expert-data group (the dp / expert ranks holding the same experts), every
// other gradient over the whole data group; AdamW on every rank (ZeRO 0).
class ExpertParallelTrainer {
 public:
  // Shards the model's experts (Model::moe_ffns) in place: ConfigError naming
  // parallel.expert / moe.experts unless expert divides dp and E.
  ExpertParallelTrainer(Model& model, Communicator& data_group, int64_t expert);
  ~ExpertParallelTrainer();
  ExpertParallelTrainer(const ExpertParallelTrainer&) = delete;
  ExpertParallelTrainer& operator=(const ExpertParallelTrainer&) = delete;

  // tokens, targets: this data rank's rows.  Losses: global-batch means.
  StepResult train_step(const TensorView& tokens, const TensorView& targets);
  Communicator& expert_group() { return *expert_; }
  Communicator& expert_data_group() { return *expert_data_; }
  const ExpertTraffic& traffic() const { return traffic_; }
  void reset_traffic() { traffic_ = ExpertTraffic{}; }
  bool is_expert_parameter(const Parameter* p) const;

 private:
  class Exchange;
  Model& model_;
  Communicator& data_;
  std::unique_ptr<Communicator> expert_, expert_data_;
  ExpertTraffic traffic_;
  std::unique_ptr<Exchange> exchange_;
  std::vector<MoeFfn*> ffns_;
  std::vector<Parameter*> expert_params_;
  int64_t step_ = 0;
};

// ---- pipeline parallelism (1F1B) -------------------------------------------------

struct PipelineOptions {
  int64_t microbatches = 1;  // m: the rank's rows are cut into m equal microbatches
  int64_t zero_stage = 0;    // over the data group
  // parallel.virtual_stages: v chunks of layers per stage, chunk c on stage
  // c mod p (Megatron's interleaved placement).  v > 1 runs micro-batch by
  // micro-batch through all chunks (no overlap: the interleaved 1F1B
  // schedule is not implemented), v = 1 the 1F1B schedule.
  int64_t virtual_stages = 1;
  // parallel.dar_bank_cache: a stage keeps the AttnRes / DAR bank entries it
  // held at the end of its previous chunk, so a boundary sends only the
  // entries since then (and a cut block's partial).  Without it every
  // boundary sends the whole bank.  Same bytes at v = 1 (no stage has held
  // anything before), as the planner models it.
  bool dar_bank_cache = true;
};

class PipelineTrainer {
 public:
  // Builds this stage's part of the model of `config` with exactly the
  // initial values Model(backend, config, options) has (same seed).
  // groups.pipeline orders the stages; groups.data reduces the gradients.
  PipelineTrainer(Backend& backend, const Config& config, const ModelOptions& options,
                  ProcessGroups& groups, const PipelineOptions& pipeline);
  ~PipelineTrainer();
  PipelineTrainer(const PipelineTrainer&) = delete;
  PipelineTrainer& operator=(const PipelineTrainer&) = delete;

  // tokens, targets: this data rank's rows, identical on every stage (only
  // the first stage reads tokens, only the last targets).  Losses are the
  // global-batch means on every rank; peak_bytes is this rank's.
  StepResult train_step(const TensorView& tokens, const TensorView& targets);

  // This stage's first chunk of layers [first_layer, end_layer).
  int64_t first_layer() const { return first_layer_; }
  int64_t end_layer() const { return end_layer_; }
  ParameterSet& parameters() { return params_; }
  const MemoryTracker& memory() const { return tracker_; }
  // The order of this stage's forward (+mb) and backward (-mb - 1) passes in
  // the last step (the 1F1B schedule, checked by the tests; one entry per
  // chunk when v > 1).
  const std::vector<int64_t>& last_schedule() const { return schedule_; }

 private:
  struct Slot;
  struct Micro;
  struct Chunk {
    int64_t index = 0;               // global chunk c (on stage c mod p)
    int64_t first = 0, end = 0;      // layers [first, end)
    size_t slot_begin = 0, slot_end = 0;  // into layers_
  };
  Context context() { return Context{backend_, &tracker_, options_.dtype}; }
  void forward(Micro& micro, const Chunk& chunk);
  void backward(Micro& micro, const Chunk& chunk);
  // AttnRes / DAR: entries the receiver of global chunk `c` already holds
  // (parallel.dar_bank_cache: what it had at the end of its chunk c - p).
  int64_t bank_held_before(int64_t c) const;
  int64_t chunk_end_layer(int64_t c) const;

  Backend& backend_;
  Config config_;
  ModelOptions options_;
  ProcessGroups& groups_;
  PipelineOptions pipeline_;
  MemoryTracker tracker_;
  ParameterSet params_;
  int64_t stage_ = 0, stages_ = 1;
  int64_t first_layer_ = 0, end_layer_ = 0;
  Parameter* embedding_ = nullptr;  // first stage, and the last when tied
  Parameter* final_norm_ = nullptr;
  Parameter* head_ = nullptr;
  std::vector<std::unique_ptr<Slot>> layers_;
  std::vector<Chunk> chunks_;                // this stage's, in order
  std::unique_ptr<DepthResidual> depth_;     // AttnRes / DAR: parameters replicated per stage
  std::vector<Parameter*> depth_params_;     // their gradients are summed over the stages
  std::unique_ptr<ShardedOptimizer> optimizer_;
  std::vector<int64_t> schedule_;
  Buffer positions_;
};

// ---- tensor parallelism (Megatron), with or without sequence parallelism ----------

struct TensorOptions {
  bool sequence_parallel = false;  // parallel.sequence_parallel
  int64_t zero_stage = 0;          // over the data group
};

// Megatron-LM's tensor-parallel layer (Shoeybi et al. 2019) on the runtime's
// branches: each tensor rank holds heads / t query heads and kv_heads / t kv
// heads (Wq, Wk, Wv column-parallel, Wo row-parallel) and d_ff / t of the MLP
// (W_in / W_gate / W_up column-parallel, W_out row-parallel); a branch's
// partial output is all-reduced over the tensor group, and so is the partial
// gradient of its input in the backward.  With sequence parallelism
// (Korthikanti et al. 2022) the residual stream, the depth reads of AttnRes /
// DAR and their bank are sharded by sequence position: each branch input is
// all-gathered and each branch output (and input gradient) reduce-scattered.
// The branch's RMSNorm sits inside the branch here, after the gather (it runs
// on the full sequence on every rank), and its weight's gradient is
// all-reduced over the tensor group.  Embedding, final norm and head are
// replicated.  MoD routed layers: router and top-k replicated (SP: each rank
// scores its tokens and the b s logits are all-gathered, docs/cluster.md), the
// routed block's collectives carry the b k routed rows (SP: X~ assembled by an
// all-reduce of each rank's own rows).  Dense, MoD, AttnRes, DAR, MoD + DAR.
class TensorParallelTrainer {
 public:
  TensorParallelTrainer(Backend& backend, const Config& config, const ModelOptions& options,
                        ProcessGroups& groups, const TensorOptions& tensor);
  ~TensorParallelTrainer();
  TensorParallelTrainer(const TensorParallelTrainer&) = delete;
  TensorParallelTrainer& operator=(const TensorParallelTrainer&) = delete;

  // tokens, targets: this data rank's rows, the same on every tensor rank.
  StepResult train_step(const TensorView& tokens, const TensorView& targets);

  ParameterSet& parameters() { return params_; }
  const MemoryTracker& memory() const { return tracker_; }

 private:
  struct Layer;
  Context context() { return Context{backend_, &tracker_, options_.dtype}; }
  // [b, s / t, d] shards <-> [b, s, d] (sequence parallelism).
  Buffer gather_sequence(const TensorView& shard);
  Buffer scatter_sequence_sum(const TensorView& partial);
  Buffer take_sequence_shard(const TensorView& full);
  // Branch `branch` of `layer` (0 attention, 1 MLP) on `input` ([b, s / t, d]
  // shard when `sharded`: gathered first, output reduce-scattered; else whole,
  // output all-reduced), and its backward (returns d input, same layout).
  Buffer branch_forward(Layer& layer, int branch, const TensorView& input, bool sharded,
                        const TensorView& positions);
  Buffer branch_backward(Layer& layer, int branch, const TensorView& dy, bool sharded);
  // delta = a + m of TransformerLayer, and J^T ddelta.
  Buffer delta_forward(Layer& layer, const TensorView& x, bool sharded,
                       const TensorView& positions);
  Buffer delta_backward(Layer& layer, const TensorView& ddelta, bool sharded);
  // MoD: router logits (of this rank's tokens under SP), top-k over the whole
  // sequence (SP: the logits all-gathered), this rank's index map and the
  // causal-router losses (means over the whole batch).
  RoutedLayer::Losses route(Layer& layer, const TensorView& x);
  void route_backward(Layer& layer, const TensorView& dx);
  // X~ [b, k, d] on every tensor rank (SP: each rank's routed rows summed).
  Buffer gather_routed(Layer& layer, const TensorView& x);

  Backend& backend_;
  Config config_;
  ModelOptions options_;
  ProcessGroups& groups_;
  TensorOptions tensor_;
  RoutingOptions routing_;
  MemoryTracker tracker_;
  ParameterSet params_;
  Parameter* embedding_ = nullptr;
  Parameter* final_norm_ = nullptr;
  Parameter* head_ = nullptr;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::unique_ptr<DepthResidual> depth_;
  std::vector<Parameter*> tensor_reduced_;  // gradients summed over the tensor group
  std::unique_ptr<ShardedOptimizer> optimizer_;
};

}  // namespace modar::runtime
