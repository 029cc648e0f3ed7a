// modar/parallel.hpp: cluster-scale cost model (tensor, sequence, pipeline and
// data parallelism with ZeRO), its communication records and per-device
// memory.  Formulas and sources: docs/cluster.md.
//
// Placement: rank = tensor_index + t * (stage + p * data_index), so tensor
// groups sit inside a node first, then pipeline stages, then data replicas.
// A group whose ranks span nodes runs at the inter-node level (the slowest
// level bounds it).
//
// Step time = m x (slowest stage's time per micro-batch: compute + exposed
// tensor-parallel and pipeline communication) + bubble + unhidden
// data-parallel gradient reduction + the sharded optimizer step (+ unhidden
// ZeRO parameter gathers), with the bubble (p - 1) / (v m) of the ideal
// m x slowest stage (1F1B: v = 1).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "modar/config.hpp"
#include "modar/cost_model.hpp"
#include "modar/profile.hpp"

namespace modar {

enum class NetLevel : uint8_t { intra_node, inter_node };
const char* to_string(NetLevel level);

// Bus-bandwidth factor of a collective over p ranks (nccl-tests convention):
// all-reduce 2(p-1)/p, reduce-scatter / all-gather / all-to-all (p-1)/p,
// send/recv 1; 0 for p = 1.
double collective_bus_factor(Collective kind, int64_t ranks);
// Seconds for one collective of `bytes` (the full vector: all-reduce input,
// all-gather output, reduce-scatter input, one send) over `ranks` ranks at
// `level`: a measured table of the level when one covers the size (log-log
// interpolation; of the tables of this kind, the one measured at the group
// size nearest `ranks`, rescaled to `ranks` by the bus factor), else NCCL's
// own cost model (nccl_collective_time_s below: ring / tree, LL / LL128 /
// Simple, latency per step and bus bandwidth).  0 for ranks <= 1 or bytes <= 0.
// At the inter-node level a group with `members_per_node` ranks in each node
// drives that many NICs at once (NCCL builds one ring per NIC), so its bus
// bandwidth is members_per_node x the per-NIC figure, capped by the node's
// intra-node bus bandwidth, and it spans ceil(ranks / members_per_node) nodes.
// `efficiency` scales each level's bus bandwidth on the formula path
// (kernel.collective_efficiency_*; measured tables are taken as measured).
// `nccl_protocols` picks the formula: NCCL's protocol model (GPU profiles:
// kernel.sm_count set) or latency x ceil(log2 p) steps + factor x bytes /
// bus bandwidth (other networks, e.g. MPI between CPU ranks).
struct CollectiveEfficiency {
  double intra_node = 1.0;
  double inter_node = 1.0;
  bool nccl_protocols = true;
};
double collective_time_s(const NetworkProfile& network, Collective kind, double bytes,
                         int64_t ranks, NetLevel level, int64_t members_per_node = 1,
                         const CollectiveEfficiency& efficiency = {});
// The formula path of collective_time_s: NCCL's own cost model (ring and
// tree, protocols LL / LL128 / Simple; cost_models/kernel_model/
// collective_model.cpp, docs/kernel_model.md "Collectives") for a group of
// `ranks` over `nodes` nodes at `bus_bandwidth` (bytes/s), with the ring
// Simple step latency inside a node and between nodes.
double nccl_collective_time_s(Collective kind, double bytes, int64_t ranks, int64_t nodes,
                              double bus_bandwidth, double intra_step_latency_s,
                              double inter_step_latency_s);
// The network of a profile, or the documented default when the profile has
// no [network] section (8 GPUs per node; see docs/cluster.md).
const NetworkProfile& network_or_default(const DeviceProfile& profile);

// One communication op of a step (the cluster's part of the op vocabulary).
struct CommRecord {
  Collective kind = Collective::all_reduce;
  const char* label = "";  // "tp.attn.all_reduce", "dp.grad.reduce_scatter", ...
  const char* group = "";  // "tensor", "pipeline", "data"
  Pass pass = Pass::forward;
  int64_t ranks = 1;
  NetLevel level = NetLevel::intra_node;
  double bytes = 0.0;           // per collective (see collective_time_s)
  double count = 0.0;           // collectives per step per device (busiest stage)
  double time_s = 0.0;          // one collective
  double exposed_fraction = 1;  // share of count x time_s on the critical path
};

struct StageSummary {
  int64_t layers = 0;         // transformer layers on this stage (all its chunks)
  int64_t routed_layers = 0;  // MoD-routed among them
  int64_t moe_layers_here = 0;         // MoE layers among the full layers (docs/moe.md)
  int64_t moe_routed_layers_here = 0;  // MoE layers among the routed ones (staged MoDE)
  std::vector<int64_t> chunk_first_layer;  // per virtual chunk on this stage
  std::vector<int64_t> chunk_layers;
  double compute_s = 0.0;      // per micro-batch: fwd + bwd (+ recompute), this rank's share
  double exposed_comm_s = 0.0; // per micro-batch: TP collectives + pipeline sends (+ ZeRO-3)
  double send_bytes = 0.0;     // per micro-batch, forward activation send(s) out of the stage
  double bank_send_bytes = 0.0;  // the DAR/AttnRes bank part of send_bytes
  double params = 0.0;           // parameters held per rank before ZeRO sharding
  MemoryBreakdown memory;        // per device on this stage
};

struct ClusterEstimate {
  // layout
  int64_t tensor = 1, pipeline = 1, virtual_stages = 1, data = 1, zero = 0;
  int64_t expert = 1, expert_tensor = 1, expert_data = 1;  // the expert layers' folding
  bool sequence_parallel = false;
  int64_t micro_batch = 1;
  int64_t micro_batches = 1;  // m: micro-batches per pipeline per step
  int64_t gpus_per_node = 8, nodes = 1;
  int64_t context = 1;  // CP: ring attention over c ranks holding s / c tokens each
  NetLevel tensor_level = NetLevel::intra_node, context_level = NetLevel::intra_node,
           pipeline_level = NetLevel::intra_node,
           data_level = NetLevel::intra_node;
  std::vector<StageSummary> stages;
  std::vector<CommRecord> comm;
  // time (seconds per optimizer step)
  double compute_s = 0.0;            // m x the slowest stage's compute
  double exposed_comm_s = 0.0;       // communication on the critical path
  double overlapped_comm_s = 0.0;    // communication hidden behind compute
  double bubble_s = 0.0;             // (p - 1) / (v m) of the ideal pipeline time
  double grad_reduce_exposed_s = 0.0;  // DP gradient reduction not hidden by the backward
  double param_gather_exposed_s = 0.0; // ZeRO 1/2 parameter all-gather after the update
  double optimizer_s = 0.0;          // AdamW on the (sharded) states
  double grad_norm_s = 0.0;  // gradient norm over the (sharded) main gradients + its all-reduce
  double step_overhead_s = 0.0;      // host time per step (kernel.step_overhead_s)
  double step_s = 0.0;
  int64_t slowest_stage = 0;
  int64_t busiest_stage = 0;  // the stage with the largest peak memory
  // AttnRes / DAR across stages (per micro-batch, forward; backward returns the same)
  double bank_send_bytes_uncached = 0.0;  // every boundary re-sends all earlier blocks
  double bank_send_bytes_cached = 0.0;    // receiving ranks cache earlier blocks
  double dar_replicated_s = 0.0;  // depth-read work every tensor rank repeats (no SP), per mb
  double mod_score_gather_bytes = 0.0;  // router scores all-gathered per micro-batch (SP)
};

// Is the cluster model used for this configuration?  Any non-default
// [parallel] setting or device.count > 1.
bool cluster_engaged(const Config& config);

// The lowered compute of one tensor-parallel rank per micro-batch (the costly
// part of estimate_cluster: two lowerings of the shard).  It depends on the
// model, the tensor size and SP, the expert layout (EP, expert tensor size),
// the micro-batch, recompute, dtype and attention kernel only, so a layout search reuses it across pipeline,
// data-parallel and ZeRO choices.
struct RankCompute {
  int64_t tensor = 1;
  bool sequence_parallel = false;
  int64_t micro_batch = 1;
  Recompute recompute = Recompute::none;
  RecomputeGranularity recompute_granularity = RecomputeGranularity::none;
  std::string recompute_modules;
  int64_t expert = 1, expert_tensor = 1;  // EP and the resolved expert tensor size
  int64_t context = 1;                    // CP
  // Lowered for a configuration of this tensor size, SP, micro-batch,
  // recompute and expert layout (the shape is the caller's to keep).
  bool matches(const Config& config) const {
    return tensor == config.parallel.tensor &&
           sequence_parallel == config.parallel.sequence_parallel &&
           micro_batch == config.train.micro_batch && recompute == config.train.recompute &&
           recompute_granularity == config.train.recompute_granularity &&
           recompute_modules == config.train.recompute_modules &&
           expert == config.parallel.expert &&
           expert_tensor == config.parallel.resolved_expert_tensor() &&
           context == config.parallel.context;
  }
  double first_s = 0.0;            // embedding (+ the DAR bank init): the first stage
  double last_s = 0.0;             // final norm, head, loss (+ DAR output read): the last stage
  double full_layer_s = 0.0;       // one full layer, forward + backward (+ recompute)
  double routed_layer_s = 0.0;     // one MoD-routed layer
  double all_depth_reads_s = 0.0;  // every AttnRes / DAR op of the step
  // Per full layer and micro-batch, the GEMM time of each tensor-parallel
  // linear (column-parallel qkv and MLP up, row-parallel attention out and
  // MLP down) by pass: what parallel.tp_comm_overlap lets a collective hide
  // behind (docs/cluster.md "Overlap").
  struct LinearGemms {
    double qkv = 0.0, out = 0.0, up = 0.0, down = 0.0;
  };
  LinearGemms forward_gemms, dgrad_gemms, wgrad_gemms;
  // The core attention of one full / MoD-routed layer, forward and backward
  // (context parallelism hides its ring exchange behind them).
  double full_attention_forward_s = 0.0, full_attention_backward_s = 0.0;
  double routed_attention_forward_s = 0.0, routed_attention_backward_s = 0.0;
  // Memo of estimate_cluster's time-balanced chunk sizes: they depend on this
  // compute, the tensor group's collectives (GPUs per node, what
  // parallel.tp_comm_overlap hides), the chunk count and the pipeline size
  // only, so layouts differing in data parallelism or ZeRO share them.
  struct Split {
    int64_t chunks = 0, pipeline = 0, gpus_per_node = 0;
    TpCommOverlap tp_comm_overlap = TpCommOverlap::backward;
    std::vector<int64_t> sizes;
  };
  mutable std::vector<Split> balanced_splits;
  // Memo of the sum of the layer costs per micro-batch that
  // cluster_step_lower_bound() spreads over the stages, and of the
  // ceil(L / p) cheapest (the least a stage that holds that many takes):
  // keyed like the splits, by the pipeline and data-parallel sizes (the
  // groups' placement).
  struct LayerCostSum {
    int64_t pipeline = 0, data = 0, gpus_per_node = 0;
    TpCommOverlap tp_comm_overlap = TpCommOverlap::backward;
    double seconds = 0.0;
    double cheapest_stage_s = 0.0;
    // The data-parallel channel's sizes (they depend on the pipeline size,
    // not on the micro-batch count, interleaving or ZeRO): one layer's
    // parameter bytes per rank and the least dense parameters of a stage of
    // ceil(L / p) layers.
    double layer_param_bytes = 0.0;
    double stage_dense_params = 0.0;
  };
  mutable std::vector<LayerCostSum> layer_cost_sums;
  // Memo of each DAR block's prefix read, forward + backward (index block -
  // 1; NaN until timed): it depends on this compute and the shape only.
  mutable std::vector<double> dar_prefix_block_s;
};
RankCompute rank_compute(const Config& config, const TimingModel& timing);

// The cluster estimate of a validated configuration.  `base` is the
// configuration's single-device Estimate (its FLOPs are reused).
ClusterEstimate estimate_cluster(const Config& config, const TimingModel& timing,
                                 const Estimate& base);
// The same with the rank's compute already lowered (rank_compute() of a
// configuration with the same shape, tensor size, SP, micro-batch and
// recompute; anything else throws std::logic_error).
ClusterEstimate estimate_cluster(const Config& config, const TimingModel& timing,
                                 const Estimate& base, const RankCompute& compute);
// A lower bound on estimate_cluster(config, ...).step_s, without the
// pipeline partition or the memory: m micro-batches of the average stage's
// layer time (the slowest stage is no faster), the bubble of that and the
// host time; everything left out is a non-negative addition.  With the
// gradient reduction overlapped, the data-parallel channel too: a stage
// holding ceil(L / p) layers or more waits for what the backward does not
// hide of its reductions (one per micro-batch under ZeRO 2 and 3) and of
// ZeRO 3's layer gathers sharing the channel.  The layout search skips
// layouts whose bound cannot beat the fastest found.  More
// recompute only adds ops and forward passes, so a layout's bound with
// recompute none bounds it under every recompute choice.
double cluster_step_lower_bound(const Config& config, const TimingModel& timing,
                                const RankCompute& compute);

// Per-device memory of a layout WITHOUT lowering or timing the step (the
// layout search's feasibility screen; docs/cluster.md "Memory screen").  The
// same per-stage formula as estimate_cluster.  Exact when the stage partition
// does not depend on predicted time (one chunk per pipeline, or
// balance_stages = false); otherwise a lower bound over every split of the
// layers into p v non-empty chunks, so that may_fit() is never false for a
// layout whose estimate_cluster() fits.
struct ClusterMemoryBound {
  double peak = 0.0;      // bytes per device on the busiest stage: exact, or a lower bound
  double capacity = 0.0;  // device memory (0: unlimited)
  bool exact = false;
  bool may_fit() const;   // false: estimate_cluster() of this layout does not fit
  bool fits() const { return exact && may_fit(); }  // estimate_cluster() fits
};
ClusterMemoryBound cluster_memory_bound(const Config& config, const DeviceProfile& profile);

// Contiguous split of per-layer costs into `chunks` non-empty chunks that
// minimises the largest chunk's cost (the pipeline's bottleneck); returns the
// layer count of each chunk.  Used for time-balanced stages.
std::vector<int64_t> balance_pipeline_chunks(const std::vector<double>& layer_costs,
                                             int64_t chunks);

}  // namespace modar
