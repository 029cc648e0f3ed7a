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
//  * ParallelTrainer  tensor x pipeline x data parallelism composed around
//    one model as Megatron-Core composes them: Megatron tensor-parallel
//    layers (with or without sequence parallelism), the layers cut into
//    chunks over the pipeline stages and run in the 1F1B or interleaved 1F1B
//    schedule, gradients reduced with ZeRO 0-2 over the data group.
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
  // Over some of a model's parameters (expert parallelism: the experts over
  // the expert-data group, the rest over the data group).
  ShardedOptimizer(Backend& backend, std::vector<Parameter*> params, MemoryTracker* tracker,
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
  std::vector<Parameter*> params_;
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

// ---- the objective across parts of a batch ---------------------------------------
//
// The single-process objective's cross-entropy is the mean over EVERY counted
// target (not -1) of the batch: (1 / N) sum_i l_i.  A trainer that cuts the
// batch into P parts (data ranks x micro-batches) and averages their
// gradients (grad scale 1 / P) must weigh part j's mean l_j = S_j / N_j by
// P N_j / N: then (1 / P) sum_j (P N_j / N) S_j / N_j = (1 / N) sum S_j.  The
// mean of the parts' means (weight 1) is that only when every part counts the
// same number of targets.  The layers' own terms (router, predictor, MoE)
// are means over rows, which every part has equally many of: weight 1.

// Targets that count (not -1) in an i32 tensor (host count).
int64_t counted_targets(Backend& backend, const TensorView& targets);
// The sum of counted_here over a group (one all-reduce when it has > 1 rank).
int64_t counted_targets_over(Backend& backend, Communicator& group, int64_t counted_here);
// P N_j / N (1 exactly when every part counts the same; 0 when N = 0).
double lm_loss_weight(int64_t counted_here, int64_t counted_total, int64_t parts);
// The batch's StepResult from each data rank's own (its rows' means): the
// cross-entropy weighted by lm_weight, every other term averaged over the ranks.
StepResult reduce_over_data(Backend& backend, Communicator& data, const StepResult& local,
                            double lm_weight);

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
  // expert_data_group / expert_params (expert parallelism): those parameters
  // (the rank's experts) are sharded over the expert-data group instead, the
  // ranks that hold the same experts.
  Zero3Optimizer(Model& model, Communicator& data_group, const AdamWParams& adamw,
                 Communicator* expert_data_group = nullptr,
                 const std::vector<Parameter*>& expert_params = {});
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
  int64_t unit_count() const { return static_cast<int64_t>(parts_.size()); }
  int64_t unit_numel(int64_t unit) const;        // parameters of the unit
  int64_t unit_shard_numel(int64_t unit) const;  // ceil(numel / dp)
  // The reduced (unscaled) gradient shard of a unit after the last backward.
  std::vector<double> shard_gradient(int64_t unit) const;

 private:
  struct Unit;
  void add_part(const std::string& name, Communicator& group,
                const std::vector<Parameter*>& params);
  void acquire_part(Unit& unit, bool values, bool grads);
  void release_part(Unit& unit);
  Model& model_;
  AdamWParams adamw_;
  int64_t step_ = 0;
  std::vector<std::unique_ptr<Unit>> units_;  // the sharded parts
  std::vector<std::vector<size_t>> parts_;    // per model unit: its parts in units_
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
// other gradient over the whole data group, with ZeRO 0-3 on each group.
class ExpertParallelTrainer {
 public:
  // Shards the model's experts (Model::moe_ffns) in place: ConfigError naming
  // parallel.expert / moe.experts unless expert divides dp and E.
  // zero_stage (parallel.zero): ZeRO 0-2 by two ShardedOptimizers (the
  // experts over the expert-data group, the rest over the data group), ZeRO 3
  // by a Zero3Optimizer whose units shard their experts over the expert-data
  // group and the rest over the data group.
  ExpertParallelTrainer(Model& model, Communicator& data_group, int64_t expert,
                        int64_t zero_stage = 0);
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
  Zero3Optimizer* zero3() { return zero3_.get(); }  // ZeRO 3, else nullptr

 private:
  class Exchange;
  Model& model_;
  Communicator& data_;
  std::unique_ptr<Communicator> expert_, expert_data_;
  ExpertTraffic traffic_;
  std::unique_ptr<Exchange> exchange_;
  std::vector<MoeFfn*> ffns_;
  std::vector<Parameter*> expert_params_;
  std::unique_ptr<ShardedOptimizer> dense_optimizer_, expert_optimizer_;
  std::unique_ptr<Zero3Optimizer> zero3_;
};

// ---- tensor x pipeline x data parallelism (Megatron-Core's composition) ------------

struct ParallelTrainerOptions {
  int64_t microbatches = 1;  // m: the rank's rows are cut into m equal micro-batches
  // parallel.virtual_stages: v chunks of layers per stage, chunk c on stage
  // c mod p (Megatron's interleaved placement), run in the interleaved 1F1B
  // schedule (m a multiple of p); v = 1: the 1F1B schedule.
  int64_t virtual_stages = 1;
  bool sequence_parallel = false;  // parallel.sequence_parallel (tensor > 1)
  int64_t zero_stage = 0;          // parallel.zero over the data group (0-2)
  // parallel.dar_bank_cache: a stage keeps the AttnRes / DAR bank entries it
  // held at the end of its previous chunk, so a boundary sends only the
  // entries since then (and a cut block's partial).  Without it every
  // boundary sends the whole bank.  Same bytes at v = 1 (no stage has held
  // anything before), as the planner models it.
  bool dar_bank_cache = true;
};

// One forward or backward pass of a stage: micro-batch and global chunk.
struct PipelinePass {
  bool forward = true;
  int64_t microbatch = 0;
  int64_t chunk = 0;  // global chunk c (on stage c mod p)
  bool operator==(const PipelinePass&) const = default;
};

// The model of `config` cut over the tensor, pipeline and data groups of
// `groups` as Megatron-Core composes them around one model:
//  * tensor (t > 1): each layer is its Megatron shard (heads / t, kv_heads /
//    t, d_ff / t: column-parallel Wq / Wk / Wv / W_in / W_gate / W_up,
//    row-parallel Wo / W_out; Shoeybi et al. 2019), a branch's partial
//    output and its input gradient all-reduced over the tensor group; with
//    sequence parallelism (Korthikanti et al. 2022) the residual stream, the
//    AttnRes / DAR reads and bank are sharded by position, each branch input
//    all-gathered and each output reduce-scattered.  MoD: router and top-k
//    replicated (SP: the b s logits all-gathered), the routed block's
//    collectives carry the b k routed rows.  t = 1: the single-process
//    model's own layers (MoE FFNs included).
//  * pipeline: p v contiguous chunks of layers, chunk c on stage c mod p
//    (embedding on the first, the LmHead on the last chunk; a tied embedding
//    lives on both ends and their gradients are summed), micro-batches in the
//    1F1B or interleaved 1F1B schedule, activations (AttnRes / DAR: the
//    history bank) and their gradients sent between stages; with t > 1 each
//    tensor rank sends 1 / t of a replicated boundary tensor and the
//    receiver all-gathers it (Megatron's scatter / gather).
//  * data: gradients reduced (ZeRO 0-2) over the data group.
// A step equals the single-process Model::train_step on the same global
// batch (tests/cpp/parallel).
class ParallelTrainer {
 public:
  // Builds this rank's part of the model with exactly the initial values
  // Model(backend, config, options) has (same seed; a tensor rank its shard).
  ParallelTrainer(Backend& backend, const Config& config, const ModelOptions& options,
                  ProcessGroups& groups, const ParallelTrainerOptions& parallel);
  ~ParallelTrainer();
  ParallelTrainer(const ParallelTrainer&) = delete;
  ParallelTrainer& operator=(const ParallelTrainer&) = delete;

  // tokens, targets: this data rank's rows (i32 [b / dp, s]), identical on
  // every stage and tensor rank (the first stage reads tokens, the last
  // targets).  Losses are the global-batch means on every rank; peak_bytes
  // is this rank's.
  StepResult train_step(const TensorView& tokens, const TensorView& targets);

  // This stage's first chunk of layers [first_layer, end_layer).
  int64_t first_layer() const;
  int64_t end_layer() const;
  ParameterSet& parameters() { return params_; }
  const MemoryTracker& memory() const { return tracker_; }
  // This stage's passes in the last step, in the order they ran.
  const std::vector<PipelinePass>& last_schedule() const { return schedule_; }

 private:
  struct Chunk;
  struct Micro;
  class Boundary;  // runtime/parallel/pipeline_boundary.cpp
  Context context() { return Context{backend_, &tracker_, options_.dtype}; }
  void check_layout() const;
  void build_layers(const Context& ctx, Rng& rng);
  void copy_reference_values();
  bool sequence_parallel() const;  // parallel.sequence_parallel with tensor > 1
  // The embedding's lookup and its backward (vocab-parallel at tensor > 1).
  Buffer embed(Micro& micro);
  void embed_backward(Micro& micro);
  // The micro-batches of a step: their rows and (last stage) the weight of
  // their mean cross-entropy.
  std::vector<Micro> make_micros(const TensorView& tokens, const TensorView& targets);
  // The schedule's passes and transfers, in this stage's order.
  void run_schedule(std::vector<Micro>& micros);
  // One micro-batch through one chunk (the embedding before the first, the
  // LmHead after the last).
  void forward(Micro& micro, const Chunk& chunk);
  void backward(Micro& micro, const Chunk& chunk);
  void head_forward(Micro& micro);
  Buffer head_backward(Micro& micro);
  LayerPass layer_pass(const Context& ctx, const Micro& micro) const;
  // After the schedule: gradients a tensor rank or a stage holds only a part
  // of, summed over the tensor / pipeline groups (norms, tied embedding, depth).
  void finish_gradients();

  Backend& backend_;
  Config config_;
  ModelOptions options_;
  ProcessGroups& groups_;
  ParallelTrainerOptions parallel_;
  MemoryTracker tracker_;
  ParameterSet params_;
  int64_t stage_ = 0, stages_ = 1, chunk_count_ = 1;
  Parameter* embedding_ = nullptr;  // first stage, and the last when tied
  // tensor > 1 and t | V: embedding and head split by vocabulary over the tensor group
  std::unique_ptr<ShardGroup> vocab_group_;
  std::vector<std::unique_ptr<StackLayer>> layers_;
  std::vector<Chunk> chunks_;               // this stage's, in order
  std::unique_ptr<DepthResidual> depth_;    // AttnRes / DAR: parameters replicated per stage
  std::vector<Parameter*> depth_params_;    // their gradients are summed over the stages
  std::unique_ptr<LmHead> head_;            // last stage
  std::vector<Parameter*> tensor_reduced_;  // gradients summed over the tensor group
  std::unique_ptr<Boundary> boundary_;
  std::unique_ptr<ShardedOptimizer> optimizer_;
  std::vector<PipelinePass> schedule_;
  Buffer positions_;
};

}  // namespace modar::runtime
