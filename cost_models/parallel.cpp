// Cluster-scale cost model (include/modar/parallel.hpp; derivations and
// sources in docs/cluster.md).
//
// Compute per rank: the configuration is lowered once as the tensor-parallel
// SHARD a rank executes (heads / t, KV heads / t, d_ff / t, vocab / t, d_head
// kept), so every GEMM and attention op has exactly the shape a Megatron
// column / row-parallel layer runs, timed by the same TimingModel.  Ops that
// work on full d_model rows (norms, residual adds, the MoD router, the
// AttnRes / DAR depth reads) run on all T tokens on every tensor rank
// (replicated work) unless sequence parallelism shards them by tokens (/ t).
// A second lowering with MoD switched off separates the time of a full layer
// from that of a routed layer, so stages can be balanced by time.
//
// Communication per micro-batch and layer (Megatron-LM, Narayanan et al. 2021
// and Korthikanti et al. 2022): 2 all-reduces forward + 2 backward of
// rows x d x B bytes (SP: 2 all-gathers + 2 reduce-scatters, same bytes), plus
// 2 forward again under full recompute; rows = b s for full layers and b k for
// MoD-routed ones.  MoD under SP: an all-gather of the fp32 router scores of
// the whole sequence (b s x 4 bytes) per routed layer.  Pipeline: one send of
// the activation (b s d B / t: Megatron's scatter/gather optimisation) per
// boundary forward and one back, plus the AttnRes / DAR history bank.
// Data parallel: one all-reduce of the fp32 gradients (ZeRO >= 1:
// reduce-scatter, then an all-gather of the updated bf16 weights; ZeRO 3:
// all-gathers of each layer's weights forward and backward per micro-batch).
#include "modar/parallel.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "attention_kernel.hpp"
#include "cost_model_internal.hpp"
#include "grad_accumulation.hpp"

namespace modar {

bool cluster_engaged(const Config& config) {
  return !config.parallel.is_default() || config.device.count > 1;
}

namespace {

bool starts_with(const char* text, const char* prefix) {
  return std::strncmp(text, prefix, std::strlen(prefix)) == 0;
}

// Time of one micro-batch's ops by where they run.
struct Buckets final : detail::OpConsumer {
  Buckets(const TimingModel& timing, double token_share, AttentionKernel kernel)
      : timing_(timing), share_(token_share), kernel_(kernel) {}
  void take(const OpRecord& op) override {
    if (op.shape.kind == OpKind::optimizer_update) {
      return;  // the optimizer runs on the sharded states (estimate_cluster)
    }
    TimingModel::Source source = TimingModel::Source::roofline;
    double seconds = detail::attention_kernel_time_s(op, timing_, kernel_, &source) *
                     static_cast<double>(op.multiplicity);
    const char* label = op.label;
    // Token-wise ops on full d_model rows: sharded by tokens under SP.
    const bool token_wise = starts_with(label, "attn.norm") || starts_with(label, "mlp.norm") ||
                            starts_with(label, "residual.") || starts_with(label, "final.norm") ||
                            starts_with(label, "dar.") || starts_with(label, "mod.router");
    if (token_wise) {
      seconds *= share_;
    }
    if (starts_with(label, "embedding") || starts_with(label, "dar.bank_init")) {
      first += seconds;
    } else if (starts_with(label, "final.norm") || starts_with(label, "head") ||
               starts_with(label, "loss.") || starts_with(label, "dar.output")) {
      last += seconds;
    } else if (starts_with(label, "dar.prefix")) {
      prefix += seconds;  // replaced by per-block times in estimate_cluster
    } else {
      layers += seconds;
      if (starts_with(label, "dar.")) {
        depth_reads += seconds;
      }
    }
    if (starts_with(label, "dar.")) {
      all_depth_reads += seconds;
    }
  }
  double first = 0, last = 0, prefix = 0, layers = 0, depth_reads = 0, all_depth_reads = 0;

 private:
  const TimingModel& timing_;
  double share_;
  AttentionKernel kernel_;
};

Config shard_config(const Config& config) {
  Config shard = config;
  const int64_t t = config.parallel.tensor;
  ModelConfig& m = shard.model;
  m.d_head = config.model.resolved_d_head();
  m.n_kv_heads = config.model.resolved_kv_heads() / t;
  m.n_heads = config.model.n_heads / t;
  m.d_ff = config.model.resolved_d_ff() / t;
  m.vocab_size = (config.model.vocab_size + t - 1) / t;
  if (config.moe.enabled()) {
    // Experts (docs/moe.md): expert widths split by t; the shard holds
    // moe.experts / EP experts (the lowering reads parallel.expert).
    shard.moe.expert_ffn = config.moe.resolved_expert_ffn(config.model) / t;
  }
  shard.parallel = ParallelConfig{};
  shard.parallel.expert = config.parallel.expert;
  shard.device.count = 1;
  shard.train.global_batch = 0;
  return shard;
}

struct Placement {
  NetLevel tensor, pipeline, data;
};

Placement place(int64_t t, int64_t p, int64_t d, int64_t gpus_per_node) {
  Placement out;
  out.tensor = t <= gpus_per_node ? NetLevel::intra_node : NetLevel::inter_node;
  out.pipeline = t * p <= gpus_per_node ? NetLevel::intra_node : NetLevel::inter_node;
  out.data = t * p * d <= gpus_per_node ? NetLevel::intra_node : NetLevel::inter_node;
  return out;
}

// Contiguous partition of `cost` into `parts` chunks minimising the largest
// chunk (binary search on the bound, greedy fill); every chunk >= 1 layer.
std::vector<int64_t> balanced_partition(const std::vector<double>& cost, int64_t parts) {
  const int64_t n = static_cast<int64_t>(cost.size());
  auto fill = [&](double bound, std::vector<int64_t>* sizes) {
    sizes->assign(static_cast<size_t>(parts), 0);
    int64_t chunk = 0;
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t remaining_layers = n - i;
      const int64_t remaining_chunks = parts - chunk;
      const bool must_close =
          (*sizes)[static_cast<size_t>(chunk)] > 0 &&
          (sum + cost[static_cast<size_t>(i)] > bound || remaining_layers < remaining_chunks);
      if (must_close && chunk + 1 < parts) {
        ++chunk;
        sum = 0.0;
      }
      sum += cost[static_cast<size_t>(i)];
      ++(*sizes)[static_cast<size_t>(chunk)];
      if (sum > bound * (1.0 + 1e-12) && (*sizes)[static_cast<size_t>(chunk)] > 1) {
        return false;
      }
      if (sum > bound * (1.0 + 1e-12) && chunk + 1 == parts) {
        return false;
      }
    }
    for (int64_t s : *sizes) {
      if (s == 0) {
        return false;
      }
    }
    return true;
  };
  double lo = *std::max_element(cost.begin(), cost.end());
  double hi = 0.0;
  for (double c : cost) {
    hi += c;
  }
  std::vector<int64_t> sizes, best;
  if (!fill(hi, &best)) {
    best.assign(static_cast<size_t>(parts), n / parts);
    for (int64_t i = 0; i < n % parts; ++i) {
      ++best[static_cast<size_t>(parts - 1 - i)];
    }
    return best;
  }
  for (int iteration = 0; iteration < 60 && hi - lo > 1e-9 * hi; ++iteration) {
    const double mid = 0.5 * (lo + hi);
    if (fill(mid, &sizes)) {
      hi = mid;
      best = sizes;
    } else {
      lo = mid;
    }
  }
  return best;
}

// Memory per device of one pipeline stage: the one formula behind
// estimate_cluster()'s per-stage memory and cluster_memory_bound().  A
// stage's memory is affine in its layer counts (full and MoD-routed) for a
// fixed end layer (the DAR bank it holds grows with it).
class StageMemoryModel {
 public:
  StageMemoryModel(const Config& config, const DeviceProfile& profile, const ParamCounts& params)
      : config_(config), model_(config.model) {
    const ParallelConfig& par = config.parallel;
    capacity_ = profile.ceilings.memory_bytes;
    t_ = par.tensor;
    p_ = par.pipeline;
    v_ = par.virtual_stages;
    dp_ = std::max<int64_t>(1, par.data(config.device.count));
    zero_ = par.zero;
    m_ = static_cast<double>(detail::accumulation_steps(config));
    const LayerCounts counts = layer_counts(config);
    B_ = static_cast<double>(dtype_bytes(config.train.dtype));
    b_ = static_cast<double>(config.train.micro_batch);
    s_ = static_cast<double>(model_.seq_len);
    d_ = static_cast<double>(model_.d_model);
    k_ = static_cast<double>(counts.routed_tokens_per_sequence);
    T_ = b_ * s_;
    token_share_ = par.sequence_parallel ? 1.0 / static_cast<double>(t_) : 1.0;
    recompute_ = config.train.recompute;
    L_ = model_.n_layers;
    depth_ = config.dar.enabled();
    K_ = config.dar.block_layers;
    n_streams_ = counts.dar_streams;
    entry_bytes_ = depth_ ? static_cast<double>(n_streams_) * T_ * (d_ * B_ + 4.0) : 0.0;
    embedding_params_ = static_cast<double>(model_.vocab_size) * d_;
    head_params_ = model_.tie_embeddings ? embedding_params_ : embedding_params_;
    // Routed experts are sharded by expert parallelism (their share per layer,
    // spread evenly over the layers); the rest is replicated over EP.
    ep_ = std::max<int64_t>(1, par.expert);
    expert_dp_ = std::max<int64_t>(1, dp_ / ep_);
    expert_per_layer_ = params.experts / static_cast<double>(L_);
    per_layer_params_ = (params.non_embedding - d_ - params.experts) / static_cast<double>(L_) +
                        expert_per_layer_ / static_cast<double>(ep_);
    layer_param_bytes_ = per_layer_params_ / static_cast<double>(t_) * B_;
    last_stage_ = (p_ * v_ - 1) % p_;
    optimizer_bytes_per_param_ = config.train.dtype != DType::fp32 ? 12.0 : 8.0;
  }

  int64_t last_stage() const { return last_stage_; }
  double layer_param_bytes() const { return layer_param_bytes_; }
  double entry_bytes() const { return entry_bytes_; }

  // Bank entries available after layer l (exclusive end): H_0 + completed
  // blocks (+ the partial of a block cut by the boundary).
  double bank_entries_at(int64_t boundary_layer) const {
    return 1.0 + static_cast<double>(boundary_layer / K_) + (boundary_layer % K_ != 0 ? 1.0 : 0.0);
  }

  // Parameters held per rank on stage i (before ZeRO sharding).
  double stage_params(int64_t i, int64_t layers) const {
    double stage_params = per_layer_params_ * static_cast<double>(layers);
    if (i == 0) {
      stage_params += embedding_params_;
    }
    if (i == last_stage_) {
      stage_params += (model_.tie_embeddings && p_ == 1 ? 0.0 : head_params_) + d_;
    }
    return stage_params / static_cast<double>(t_);
  }

  // The routed experts' parameters among stage_params() (this rank's EP shard).
  double expert_stage_params(int64_t layers) const {
    return expert_per_layer_ / static_cast<double>(ep_) * static_cast<double>(layers) /
           static_cast<double>(t_);
  }

  // Stage i holding `layers` layers (`routed` of them MoD-routed; `moe_full`
  // full and `moe_routed` routed ones with an expert FFN, docs/moe.md), its
  // last chunk ending at layer `end_layer` (exclusive).
  MemoryBreakdown memory(int64_t i, int64_t layers, int64_t routed, int64_t end_layer,
                         int64_t moe_full = 0, int64_t moe_routed = 0) const {
    const double B = B_, b = b_, s = s_, d = d_, k = k_, T = T_, token_share = token_share_;
    const Recompute recompute = recompute_;
    const double params = stage_params(i, layers);
    MemoryBreakdown mem;
    mem.capacity = capacity_;
    const double shard_dp = static_cast<double>(dp_);
    mem.weights = params * B / (zero_ == 3 ? shard_dp : 1.0);
    // ZeRO shards the replicated part over dp, the expert shard over dp / EP.
    const double shard_edp = static_cast<double>(expert_dp_);
    const double expert_params = expert_stage_params(layers);
    const double dense_params = params - expert_params;
    mem.gradients = dense_params * kGradBytesPerParam / (zero_ >= 2 ? shard_dp : 1.0) +
                    expert_params * kGradBytesPerParam / (zero_ >= 2 ? shard_edp : 1.0);
    mem.optimizer = dense_params * optimizer_bytes_per_param_ / (zero_ >= 1 ? shard_dp : 1.0) +
                    expert_params * optimizer_bytes_per_param_ / (zero_ >= 1 ? shard_edp : 1.0);
    // Activations per micro-batch (Korthikanti et al. 2022 structure applied to
    // modar's saved tensors, memory.cpp): the d_model-wide tensors (norm
    // inputs / outputs, layer inputs) are replicated over the tensor group
    // unless SP shards them; Q K V, attention output, MLP up / activation and
    // the softmax statistics are split by t.
    const double heads = static_cast<double>(model_.n_heads);
    const double kv = static_cast<double>(model_.resolved_kv_heads());
    const double dh = static_cast<double>(model_.resolved_d_head());
    const double dff = static_cast<double>(model_.resolved_d_ff());
    const double up = model_.gated_mlp() ? 2.0 * dff : dff;
    const double qkv = (heads + 2.0 * kv) * dh;
    const double tt = static_cast<double>(t_);
    auto layer_saved = [&](double rows, double seq) {
      const double replicated =
          (recompute == Recompute::selective ? 2.0 * d : 4.0 * d) * B * rows + 8.0 * rows;
      const double qk_norm_inputs =
          (model_.qk_norm != QkNorm::none && recompute != Recompute::selective) ? (heads + kv) * dh
                                                                                : 0.0;
      const double split = (qkv + qk_norm_inputs + heads * dh + up +
                            (recompute == Recompute::selective ? 0.0 : dff)) *
                               B * rows +
                           4.0 * b * heads * seq;
      // Unfused attention keeps the softmax output, the dropout output (B each)
      // and the 1-byte mask per score: Korthikanti's 5 a s^2 b (selective
      // recompute drops it).
      const double scores =
          config_.train.attention_kernel == AttentionKernel::unfused && recompute == Recompute::none
              ? (2.0 * B + 1.0) * b * heads * seq * seq
              : 0.0;
      return replicated * token_share + (split + scores) / tt;
    };
    const double stage_full = static_cast<double>(layers - routed);
    const double stage_routed = static_cast<double>(routed);
    double activations = 0.0;
    if (recompute == Recompute::full) {
      activations = static_cast<double>(layers) * B * T * d * token_share;
    } else {
      activations = stage_full * layer_saved(T, s) +
                    stage_routed * (layer_saved(b * k, k) + B * (T + b * k) * d * token_share);
      if (depth_) {
        const double stage_branches = 2.0 * static_cast<double>(layers);
        const double stage_blocks = static_cast<double>(layers) / static_cast<double>(K_);
        activations += (stage_branches - stage_blocks) * static_cast<double>(n_streams_) * T *
                       (d * B + 4.0) * token_share;
        if (n_streams_ >= 2) {
          activations += stage_branches * B * T * d * token_share;
        }
      }
    }
    // MoE layers (docs/moe.md): the expert slots' saved tensors.
    activations +=
        static_cast<double>(moe_full) * detail::moe_saved_extra_bytes(config_, T, tt) +
        static_cast<double>(moe_routed) * detail::moe_saved_extra_bytes(config_, b * k, tt);
    if (i == last_stage_) {
      activations += (2.0 * B * T * d + 8.0 * T) * token_share;
    }
    // Micro-batches in flight (Korthikanti et al. 2022, section 4.2.3):
    // 1F1B stage i holds p - i; interleaving adds (p - 1 - i) / v.
    double in_flight = static_cast<double>(p_ - i);
    if (v_ > 1) {
      in_flight += static_cast<double>(p_ - 1 - i) / static_cast<double>(v_);
    }
    in_flight = std::min(in_flight, m_);
    in_flight = std::max(in_flight, 1.0);
    mem.activations = activations * in_flight;
    mem.router_buffers = stage_routed * (4.0 * T + 8.0 * b * k) * in_flight;
    mem.router_buffers +=
        (static_cast<double>(moe_full) * detail::moe_buffer_bytes(config_, T) +
         static_cast<double>(moe_routed) * detail::moe_buffer_bytes(config_, b * k)) *
        in_flight;
    if (depth_) {
      // The bank this stage holds per micro-batch in flight: every entry up to
      // the end of its last chunk (received or produced here).
      mem.dar_bank = bank_entries_at(end_layer) * entry_bytes_ * token_share * in_flight;
    }
    // Transients: the head's logits (last stage), one layer's backward, and
    // under ZeRO 3 two gathered layers (current + prefetch).
    const double head_ws =
        i == last_stage_ ? T * std::ceil(static_cast<double>(model_.vocab_size) / tt) * (B + 4.0)
                         : 0.0;
    double layer_ws = 2.0 * B * T * d * token_share + B * T * std::max(up, qkv) / tt;
    if (recompute == Recompute::full) {
      layer_ws += layer_saved(T, s);
    }
    if (zero_ == 3) {
      layer_ws += 2.0 * layer_param_bytes_;
    }
    if (config_.moe.enabled()) {
      // A MoE layer's backward: the slots' gradients in and out, the widest slot tensor.
      const double slots = static_cast<double>(detail::moe_slots(config_, static_cast<int64_t>(T)));
      const double ffn = static_cast<double>(config_.moe.resolved_expert_ffn(model_));
      const double expert_up = model_.gated_mlp() ? 2.0 * ffn : ffn;
      layer_ws = std::max(layer_ws, 2.0 * B * T * d * token_share + 2.0 * B * slots * d +
                                        B * slots * expert_up / tt);
    }
    mem.workspace = std::max(head_ws, layer_ws);
    mem.peak = mem.weights + mem.gradients + mem.optimizer + mem.activations + mem.router_buffers +
               mem.dar_bank + mem.workspace;
    mem.fits = mem.capacity <= 0.0 || mem.peak <= mem.capacity;
    return mem;
  }

  static constexpr double kGradBytesPerParam = detail::kMainGradBytesPerParam;

 private:
  const Config& config_;
  const ModelConfig& model_;
  double capacity_ = 0.0;
  int64_t t_ = 1, p_ = 1, v_ = 1, dp_ = 1, zero_ = 0, ep_ = 1, expert_dp_ = 1;
  double expert_per_layer_ = 0.0;
  double m_ = 1.0;
  double B_ = 2.0, b_ = 1.0, s_ = 1.0, d_ = 1.0, k_ = 0.0, T_ = 1.0, token_share_ = 1.0;
  Recompute recompute_ = Recompute::none;
  int64_t L_ = 1;
  bool depth_ = false;
  int64_t K_ = 1, n_streams_ = 0;
  double entry_bytes_ = 0.0, embedding_params_ = 0.0, head_params_ = 0.0;
  double per_layer_params_ = 0.0, layer_param_bytes_ = 0.0;
  int64_t last_stage_ = 0;
  double optimizer_bytes_per_param_ = 12.0;
};

// Equal layer counts per chunk (balance_stages = false), the extra layers on
// the first chunks.
std::vector<int64_t> equal_chunks(int64_t layers, int64_t chunks) {
  std::vector<int64_t> sizes(static_cast<size_t>(chunks), layers / chunks);
  for (int64_t i = 0; i < layers % chunks; ++i) {
    ++sizes[static_cast<size_t>(i)];
  }
  return sizes;
}

}  // namespace

std::vector<int64_t> balance_pipeline_chunks(const std::vector<double>& layer_costs,
                                             int64_t chunks) {
  return balanced_partition(layer_costs, chunks);
}

RankCompute rank_compute(const Config& config, const TimingModel& timing) {
  RankCompute out;
  out.tensor = config.parallel.tensor;
  out.sequence_parallel = config.parallel.sequence_parallel;
  out.micro_batch = config.train.micro_batch;
  out.recompute = config.train.recompute;
  const int64_t t = config.parallel.tensor;
  const double token_share = out.sequence_parallel ? 1.0 / static_cast<double>(t) : 1.0;
  const int64_t L = config.model.n_layers;
  const LayerCounts counts = layer_counts(config);
  const Config shard = shard_config(config);
  const double shard_params = detail::closed_form_params(shard).total;
  Buckets real(timing, token_share, config.train.attention_kernel);
  detail::lower_streaming(shard, StepKind::train, shard_params, real);
  double full_layer_s = real.layers / static_cast<double>(L);
  double routed_layer_s = full_layer_s;
  if (counts.routed_layers > 0) {
    Config dense = shard;
    dense.mod.every = 0;
    Buckets plain(timing, token_share, config.train.attention_kernel);
    detail::lower_streaming(dense, StepKind::train, shard_params, plain);
    full_layer_s = plain.layers / static_cast<double>(L);
    routed_layer_s = (real.layers - full_layer_s * static_cast<double>(counts.full_layers)) /
                     static_cast<double>(counts.routed_layers);
  }
  out.first_s = real.first;
  out.last_s = real.last;
  out.full_layer_s = full_layer_s;
  out.routed_layer_s = routed_layer_s;
  out.all_depth_reads_s = real.all_depth_reads;
  return out;
}

namespace {

// What every part of one cluster estimate reads (docs/cluster.md): the layout,
// its network levels and the shapes of one micro-batch.
struct ClusterContext {
  ClusterContext(const Config& config_in, const TimingModel& timing_in)
      : config(config_in),
        timing(timing_in),
        network(network_or_default(timing_in.profile())),
        kernel(timing_in.rates().params),
        efficiency{kernel.collective_efficiency_intra_node,
                   kernel.collective_efficiency_inter_node},
        par(config_in.parallel),
        counts(layer_counts(config_in)) {
    const ModelConfig& model = config.model;
    t = par.tensor;
    p = par.pipeline;
    v = par.virtual_stages;
    dp = std::max<int64_t>(1, par.data(config.device.count));
    ep = par.expert;
    sp = par.sequence_parallel;
    chunks = p * v;
    gpus_per_node =
        config.cluster.gpus_per_node > 0 ? config.cluster.gpus_per_node : network.gpus_per_node;
    placement = place(t, p, dp, gpus_per_node);
    // Ranks of each group per node (rank = tp + t (stage + p dp_index)).
    dp_per_node = t * p < gpus_per_node ? std::min<int64_t>(dp, gpus_per_node / (t * p)) : 1;
    tp_per_node = std::min<int64_t>(t, gpus_per_node);
    ep_per_node = t * p < gpus_per_node ? std::min<int64_t>(ep, gpus_per_node / (t * p)) : 1;
    expert_level = t * p * ep <= gpus_per_node ? NetLevel::intra_node : NetLevel::inter_node;
    m = static_cast<double>(detail::accumulation_steps(config));
    B = static_cast<double>(dtype_bytes(config.train.dtype));
    b = static_cast<double>(config.train.micro_batch);
    s = static_cast<double>(model.seq_len);
    d = static_cast<double>(model.d_model);
    k = static_cast<double>(counts.routed_tokens_per_sequence);
    T = b * s;
    recompute = config.train.recompute;
    fwd_passes = recompute == Recompute::full ? 2.0 : 1.0;  // forward re-run
    token_share = sp ? 1.0 / static_cast<double>(t) : 1.0;
    L = model.n_layers;
    depth = config.dar.enabled();
    K = config.dar.block_layers;
    n_streams = counts.dar_streams;
  }
  // One collective at the profile's collective efficiencies.
  double comm(Collective kind, double bytes, int64_t ranks, NetLevel level,
              int64_t members_per_node = 1) const {
    return collective_time_s(network, kind, bytes, ranks, level, members_per_node, efficiency);
  }

  const Config& config;
  const TimingModel& timing;
  const NetworkProfile& network;
  const KernelParams& kernel;
  CollectiveEfficiency efficiency;
  const ParallelConfig& par;
  LayerCounts counts;
  int64_t t = 1, p = 1, v = 1, dp = 1, ep = 1, chunks = 1, gpus_per_node = 8, L = 1, K = 1,
          n_streams = 0;
  int64_t dp_per_node = 1, tp_per_node = 1, ep_per_node = 1;
  bool sp = false, depth = false;
  Placement placement{};
  NetLevel expert_level = NetLevel::intra_node;
  double m = 1, B = 2, b = 1, s = 1, d = 1, k = 0, T = 1, fwd_passes = 1, token_share = 1;
  Recompute recompute = Recompute::none;
};

void fill_layout(const ClusterContext& c, ClusterEstimate& out) {
  out.tensor = c.t;
  out.pipeline = c.p;
  out.virtual_stages = c.v;
  out.data = c.dp;
  out.zero = c.par.zero;
  out.sequence_parallel = c.sp;
  out.micro_batch = c.config.train.micro_batch;
  out.micro_batches = static_cast<int64_t>(c.m);
  out.gpus_per_node = c.gpus_per_node;
  out.nodes = (c.config.device.count + c.gpus_per_node - 1) / c.gpus_per_node;
  out.tensor_level = c.placement.tensor;
  out.pipeline_level = c.placement.pipeline;
  out.data_level = c.placement.data;
}

// Bytes of one expert all-to-all for `rows` tokens: the rank's expert slots
// x d x B (the busiest rank: x moe.load_imbalance), under SP its token share.
double a2a_bytes(const ClusterContext& c, double rows) {
  return static_cast<double>(detail::moe_slots(c.config, static_cast<int64_t>(rows))) * c.d * c.B *
         c.config.moe.load_imbalance * c.token_share;
}

// Exposed communication of one layer per micro-batch, and of the model's ends.
struct LayerComm {
  double full_rows_bytes = 0, routed_rows_bytes = 0, score_bytes = 0;
  double tp_full_s = 0, tp_routed_s = 0, ep_full_s = 0, ep_routed_s = 0, tp_ends_s = 0;
};

LayerComm layer_comm(const ClusterContext& c) {
  LayerComm out;
  const int64_t t = c.t;
  const NetLevel level = c.placement.tensor;
  out.full_rows_bytes = c.T * c.d * c.B;
  out.routed_rows_bytes = c.b * c.k * c.d * c.B;
  out.score_bytes = c.b * c.s * 4.0;
  // Tensor parallelism: per layer 2 collectives per forward pass and 2 in
  // backward (SP: all-gather + reduce-scatter in place of each all-reduce).
  const auto tp_time = [&](double bytes) {
    if (t <= 1) {
      return 0.0;
    }
    if (c.sp) {
      return (c.fwd_passes + 1.0) * 2.0 *
             (c.comm(Collective::all_gather, bytes, t, level, c.tp_per_node) +
              c.comm(Collective::reduce_scatter, bytes, t, level, c.tp_per_node));
    }
    return (c.fwd_passes + 1.0) * 2.0 *
           c.comm(Collective::all_reduce, bytes, t, level, c.tp_per_node);
  };
  // MoD under SP: the router scores of the whole sequence, per routed layer.
  const double score_gather_s =
      (c.sp && t > 1)
          ? c.fwd_passes * c.comm(Collective::all_gather, out.score_bytes, t, level, c.tp_per_node)
          : 0.0;
  // Expert parallelism (docs/moe.md): per MoE layer and micro-batch two
  // all-to-alls forward (dispatch, combine) and two backward (+ two forward
  // again under full recompute), over the EP group carved out of the
  // data-parallel ranks (EP neighbours are t x p ranks apart).
  const auto ep_time = [&](double rows) {
    if (c.ep <= 1 || !c.config.moe.enabled()) {
      return 0.0;
    }
    return (c.fwd_passes + 1.0) * 2.0 *
           c.comm(Collective::all_to_all, a2a_bytes(c, rows), c.ep, c.expert_level, c.ep_per_node);
  };
  out.ep_full_s = ep_time(c.T);
  out.ep_routed_s = ep_time(c.b * c.k);
  out.tp_full_s = tp_time(out.full_rows_bytes);
  out.tp_routed_s = tp_time(out.routed_rows_bytes) + score_gather_s;
  // Embedding (vocab-parallel lookup: all-reduce forward) and head (input
  // gradient all-reduce backward); SP: all-gather / reduce-scatter instead.
  if (t > 1) {
    out.tp_ends_s = c.sp ? c.comm(Collective::reduce_scatter, out.full_rows_bytes, t, level) +
                               c.comm(Collective::all_gather, out.full_rows_bytes, t, level)
                         : c.comm(Collective::all_reduce, out.full_rows_bytes, t, level);
  }
  return out;
}

// The DAR prefix read of block j (sources H_0..H_{j-1}), forward + backward.
double dar_prefix_s(const ClusterContext& c, int64_t block) {
  if (!c.depth) {
    return 0.0;
  }
  const ModelConfig& model = c.config.model;
  const int64_t block_layers = std::min<int64_t>(c.K, c.L - (block - 1) * c.K);
  const int64_t tokens = c.sp ? c.config.train.micro_batch * model.seq_len / c.t
                              : c.config.train.micro_batch * model.seq_len;
  const OpShape shape =
      OpShape::of(DepthReadPrefixDims{.tokens = tokens,
                                      .sources = block,
                                      .queries = 2 * block_layers * c.n_streams,
                                      .width = model.d_model,
                                      .streams = c.n_streams,
                                      .variant = static_cast<int64_t>(c.config.dar.variant)},
                  c.config.train.dtype);
  TimingModel::Source source = TimingModel::Source::roofline;
  return c.timing.op_time_s(shape, Pass::forward, &source) +
         c.timing.op_time_s(shape, Pass::backward, &source);
}

// The layers of each of the p v chunks: balanced by time (memoised in
// `compute`), or equal counts.
std::vector<int64_t> pipeline_chunks(const ClusterContext& c, const RankCompute& compute,
                                     const LayerComm& comm) {
  if (!c.par.balance_stages || c.chunks <= 1) {
    return equal_chunks(c.L, c.chunks);
  }
  for (const RankCompute::Split& split : compute.balanced_splits) {
    if (split.chunks == c.chunks && split.gpus_per_node == c.gpus_per_node) {
      return split.sizes;
    }
  }
  std::vector<double> partition_cost(static_cast<size_t>(c.L));
  for (int64_t l = 0; l < c.L; ++l) {
    const bool routed = c.config.mod.is_routed(l);
    double cost =
        routed ? compute.routed_layer_s + comm.tp_routed_s : compute.full_layer_s + comm.tp_full_s;
    if (c.config.moe.is_moe_layer(l)) {
      cost += routed ? comm.ep_routed_s : comm.ep_full_s;
    }
    if (c.depth && l % c.K == 0) {
      cost += dar_prefix_s(c, l / c.K + 1);
    }
    partition_cost[static_cast<size_t>(l)] = cost;
  }
  partition_cost.front() += compute.first_s + comm.tp_ends_s / 2.0;
  partition_cost.back() += compute.last_s + comm.tp_ends_s / 2.0;
  std::vector<int64_t> sizes = balanced_partition(partition_cost, c.chunks);
  compute.balanced_splits.push_back({c.chunks, c.gpus_per_node, sizes});
  return sizes;
}

// The stages from the chunks: each stage's layers, compute and exposed
// TP / EP communication per micro-batch, the pipeline sends at every chunk
// boundary (the activation, or for AttnRes / DAR the history bank), and the
// ends (embedding on the first stage, head and loss on the last).
void assemble_stages(const ClusterContext& c, const RankCompute& compute, const LayerComm& comm,
                     const std::vector<int64_t>& chunk_sizes, const StageMemoryModel& memory,
                     ClusterEstimate& out) {
  const int64_t p = c.p;
  const double entry_bytes = memory.entry_bytes();
  const double activation_send_bytes = c.T * c.d * c.B / static_cast<double>(c.t);
  out.stages.assign(static_cast<size_t>(p), StageSummary{});
  int64_t layer = 0;
  double cached_bytes_total = 0.0, uncached_bytes_total = 0.0;
  std::vector<int64_t> chunk_first(static_cast<size_t>(c.chunks));
  for (int64_t chunk = 0; chunk < c.chunks; ++chunk) {
    chunk_first[static_cast<size_t>(chunk)] = layer;
    StageSummary& stage = out.stages[static_cast<size_t>(chunk % p)];
    const int64_t size = chunk_sizes[static_cast<size_t>(chunk)];
    stage.chunk_first_layer.push_back(layer);
    stage.chunk_layers.push_back(size);
    for (int64_t l = layer; l < layer + size; ++l) {
      const bool routed = c.config.mod.is_routed(l);
      stage.compute_s += routed ? compute.routed_layer_s : compute.full_layer_s;
      stage.exposed_comm_s += routed ? comm.tp_routed_s : comm.tp_full_s;
      if (c.config.moe.is_moe_layer(l)) {
        stage.exposed_comm_s += routed ? comm.ep_routed_s : comm.ep_full_s;
        stage.moe_layers_here += routed ? 0 : 1;
        stage.moe_routed_layers_here += routed ? 1 : 0;
      }
      stage.routed_layers += routed ? 1 : 0;
      if (c.depth && l % c.K == 0) {
        stage.compute_s += dar_prefix_s(c, l / c.K + 1);
      }
    }
    stage.layers += size;
    layer += size;
    if (chunk + 1 == c.chunks || p == 1) {
      continue;  // no boundary after the last chunk
    }
    double bank = 0.0, bank_cached = 0.0;
    if (c.depth) {
      // Each tensor rank sends 1 / t of the bank, as of the activation: its
      // own tokens' entries under SP, else its piece of the replicated bank
      // (Megatron's scatter / gather; runtime/parallel/pipeline_boundary.cpp).
      const double rank_entry_bytes = entry_bytes / static_cast<double>(c.t);
      bank = memory.bank_entries_at(layer) * rank_entry_bytes;
      // Cached: the receiving rank already holds what it had at the end of its
      // previous chunk (chunk + 1 - p); it needs only the entries since then
      // (the partial of a cut block is always new).
      const int64_t previous = chunk + 1 - p;
      double held = 0.0;
      if (c.par.dar_bank_cache && previous >= 0) {
        const int64_t end =
            chunk_first[static_cast<size_t>(previous)] + chunk_sizes[static_cast<size_t>(previous)];
        held = 1.0 + static_cast<double>(end / c.K);
      }
      bank_cached = bank - held * rank_entry_bytes;
      uncached_bytes_total += bank;
      cached_bytes_total += bank_cached;
    }
    // A depth-residual model sends the bank alone: the next layer's input is
    // a read of it (H_0, the completed blocks and a cut block's partial), so
    // no residual stream crosses (runtime/parallel/pipeline.cpp alike).
    const double bank_sent = c.par.dar_bank_cache ? bank_cached : bank;
    const double send = c.depth ? bank_sent : activation_send_bytes;
    stage.send_bytes += send;
    stage.bank_send_bytes += bank_sent;
    // Forward send out of this chunk and the gradient coming back (same size).
    const double one = c.comm(Collective::send_recv, send, 2, c.placement.pipeline);
    stage.exposed_comm_s += one;
    out.stages[static_cast<size_t>((chunk + 1) % p)].exposed_comm_s += one;
    out.comm.push_back({Collective::send_recv, "pp.activation", "pipeline", Pass::forward, 2,
                        c.placement.pipeline, send, 0.0, one, 1.0});
  }
  out.bank_send_bytes_uncached = uncached_bytes_total;
  out.bank_send_bytes_cached = cached_bytes_total;
  out.mod_score_gather_bytes =
      (c.sp && c.t > 1) ? comm.score_bytes * static_cast<double>(c.counts.routed_layers) : 0.0;
  StageSummary& last = out.stages[static_cast<size_t>((c.chunks - 1) % p)];
  out.stages.front().compute_s += compute.first_s;
  out.stages.front().exposed_comm_s += comm.tp_ends_s / 2.0;
  last.compute_s += compute.last_s;
  last.exposed_comm_s += comm.tp_ends_s / 2.0;
}

// Per stage: ZeRO-3 gathers, the unfused gradient accumulation and host time
// per micro-batch, the data-parallel gradient reduction and ZeRO 1 / 2
// parameter gather (what of them the backward hides), the (sharded) optimizer
// step and the memory per device.
struct StepParts {
  double slowest = 0.0;  // the slowest stage's time per micro-batch
  double grad_exposed = 0.0, gather_exposed = 0.0, optimizer = 0.0, overlapped = 0.0;
  double zero3_gather_one = 0.0;  // one layer's ZeRO-3 all-gather
};

StepParts stage_data_parallel(const ClusterContext& c, const StageMemoryModel& memory,
                              ClusterEstimate& out) {
  const ParallelConfig& par = c.par;
  const int64_t dp = c.dp;
  const NetLevel data_level = c.placement.data;
  StepParts parts;
  if (par.zero == 3) {
    parts.zero3_gather_one =
        c.comm(Collective::all_gather, memory.layer_param_bytes(), dp, data_level, c.dp_per_node);
  }
  const double grad_bytes_per_param = StageMemoryModel::kGradBytesPerParam;
  double worst_peak = -1.0;
  for (int64_t i = 0; i < c.p; ++i) {
    StageSummary& stage = out.stages[static_cast<size_t>(i)];
    stage.params = memory.stage_params(i, stage.layers);
    if (par.zero == 3) {
      const double per_layer_gather = 2.0 * parts.zero3_gather_one;  // forward and backward
      const double per_layer_compute = stage.layers > 0 ? stage.compute_s / stage.layers : 0.0;
      const double exposed_per_layer = par.overlap_param_gather
                                           ? std::max(0.0, per_layer_gather - per_layer_compute)
                                           : per_layer_gather;
      stage.exposed_comm_s += exposed_per_layer * static_cast<double>(stage.layers);
      parts.overlapped +=
          (per_layer_gather - exposed_per_layer) * static_cast<double>(stage.layers) * c.m;
    }
    // train.grad_accumulation = unfused: every micro-batch's backward adds the
    // rank's gradients into the main-gradient buffer (ZeRO 2 / 3: its shard).
    stage.compute_s += detail::grad_accumulation_time_s(
        stage.params / static_cast<double>(par.zero >= 2 ? dp : 1), c.config, c.timing.rates());
    // Host time per micro-batch (kernel.micro_batch_overhead_s): every stage
    // waits for its host once per micro-batch.
    stage.compute_s += c.kernel.micro_batch_overhead_s;
    const double stage_s = stage.compute_s + stage.exposed_comm_s;
    if (stage_s > parts.slowest) {
      parts.slowest = stage_s;
      out.slowest_stage = i;
    }
    // Data-parallel gradient reduction of this rank's parameters (the expert
    // shard's over the dp / EP ranks holding the same experts).
    const double grad_bytes = stage.params * grad_bytes_per_param;
    const double expert_stage_params = memory.expert_stage_params(stage.layers);
    const int64_t expert_dp = dp / std::max<int64_t>(par.expert, 1);
    double reduce_s = 0.0, gather_s = 0.0;
    if (dp > 1) {
      const Collective reduce = par.zero == 0 ? Collective::all_reduce : Collective::reduce_scatter;
      reduce_s = c.comm(reduce, (stage.params - expert_stage_params) * grad_bytes_per_param, dp,
                        data_level, c.dp_per_node);
      if (expert_dp > 1 && expert_stage_params > 0) {
        reduce_s += c.comm(reduce, expert_stage_params * grad_bytes_per_param, expert_dp,
                           data_level, c.dp_per_node);
      }
      if (par.zero == 1 || par.zero == 2) {
        gather_s =
            c.comm(Collective::all_gather, stage.params * c.B, dp, data_level, c.dp_per_node);
      }
    }
    // Megatron-Core buckets: max(40M, 1M x dp) parameters; the last bucket
    // reduces after the backward ends.
    const double bucket_params = std::max(40e6, 1e6 * static_cast<double>(dp));
    const double last_bucket_share = std::min(1.0, bucket_params / std::max(stage.params, 1.0));
    const double backward_s = stage.compute_s * (2.0 / 3.0);  // backward ~ 2/3 of fwd + bwd
    // ZeRO 2 and 3 keep only their shard of the gradients, so every
    // micro-batch's backward reduce-scatters its gradients (DeepSpeed: "gradient
    // reduction is required after every backward because of gradient
    // partitioning", deepspeedai/DeepSpeed#2252); ZeRO 0 / 1 accumulate the
    // full gradients and reduce once per step.  Each reduction hides behind
    // its micro-batch's backward and, but for the last, the next micro-batch.
    const double reductions = par.zero >= 2 ? c.m : 1.0;
    double exposed_reduce = reductions * reduce_s;
    if (par.overlap_grad_reduce) {
      exposed_reduce = (reductions - 1.0) * std::max(0.0, reduce_s - stage.compute_s) +
                       std::max(reduce_s - backward_s, last_bucket_share * reduce_s);
    }
    double exposed_gather = gather_s;
    if (par.overlap_param_gather) {
      exposed_gather = last_bucket_share * gather_s;  // the first bucket before the forward
    }
    parts.overlapped += (reductions * reduce_s - exposed_reduce) + (gather_s - exposed_gather);
    parts.grad_exposed = std::max(parts.grad_exposed, exposed_reduce);
    parts.gather_exposed = std::max(parts.gather_exposed, exposed_gather);
    if (i == 0 && dp > 1) {
      out.comm.push_back({par.zero == 0 ? Collective::all_reduce : Collective::reduce_scatter,
                          "dp.grad", "data", Pass::backward, dp, data_level, grad_bytes, reductions,
                          reduce_s, reduce_s > 0 ? exposed_reduce / (reductions * reduce_s) : 0.0});
      if (gather_s > 0) {
        out.comm.push_back({Collective::all_gather, "dp.param_gather", "data", Pass::forward, dp,
                            data_level, stage.params * c.B, 1.0, gather_s,
                            exposed_gather / gather_s});
      }
    }
    // The optimizer on this rank's (ZeRO-sharded) states.
    const OpShape update = OpShape::of(
        OptimizerUpdateDims{.params = static_cast<int64_t>(std::ceil(
                                stage.params / static_cast<double>(par.zero >= 1 ? dp : 1)))},
        c.config.train.dtype);
    TimingModel::Source source = TimingModel::Source::roofline;
    parts.optimizer = std::max(parts.optimizer, c.timing.op_time_s(update, Pass::forward, &source));
    // Memory per device on this stage.
    stage.memory = memory.memory(i, stage.layers, stage.routed_layers,
                                 stage.chunk_first_layer.back() + stage.chunk_layers.back(),
                                 stage.moe_layers_here, stage.moe_routed_layers_here);
    if (stage.memory.peak > worst_peak) {
      worst_peak = stage.memory.peak;
      out.busiest_stage = i;
    }
  }
  return parts;
}

// The communication records of the first stage's view, per step (`estimate
// --ops`, JSON parallel.comm); the data-parallel and pipeline ones are added
// where they are timed.
void add_comm_records(const ClusterContext& c, const LayerComm& comm,
                      const StageMemoryModel& memory, double zero3_gather_one,
                      ClusterEstimate& out) {
  const int64_t t = c.t;
  const NetLevel tensor_level = c.placement.tensor;
  const StageSummary& first = out.stages.front();
  const double stage_full_layers = static_cast<double>(first.layers - first.routed_layers);
  const double stage_routed_layers = static_cast<double>(first.routed_layers);
  const auto add_tp = [&](const char* label, double bytes, double layers_count) {
    if (layers_count <= 0) {
      return;
    }
    const double per_pass = 2.0 * layers_count * c.m;
    if (c.sp) {
      const double ag = c.comm(Collective::all_gather, bytes, t, tensor_level, c.tp_per_node);
      const double rs = c.comm(Collective::reduce_scatter, bytes, t, tensor_level, c.tp_per_node);
      out.comm.push_back({Collective::all_gather, label, "tensor", Pass::forward, t, tensor_level,
                          bytes, per_pass * c.fwd_passes, ag, 1.0});
      out.comm.push_back({Collective::reduce_scatter, label, "tensor", Pass::forward, t,
                          tensor_level, bytes, per_pass * c.fwd_passes, rs, 1.0});
      out.comm.push_back({Collective::all_gather, label, "tensor", Pass::backward, t, tensor_level,
                          bytes, per_pass, ag, 1.0});
      out.comm.push_back({Collective::reduce_scatter, label, "tensor", Pass::backward, t,
                          tensor_level, bytes, per_pass, rs, 1.0});
    } else {
      const double ar = c.comm(Collective::all_reduce, bytes, t, tensor_level, c.tp_per_node);
      out.comm.push_back({Collective::all_reduce, label, "tensor", Pass::forward, t, tensor_level,
                          bytes, per_pass * c.fwd_passes, ar, 1.0});
      out.comm.push_back({Collective::all_reduce, label, "tensor", Pass::backward, t, tensor_level,
                          bytes, per_pass, ar, 1.0});
    }
  };
  if (t > 1) {
    add_tp("tp.layer", comm.full_rows_bytes, stage_full_layers);
    add_tp("tp.routed_layer", comm.routed_rows_bytes, stage_routed_layers);
    if (c.sp && stage_routed_layers > 0) {
      out.comm.push_back({Collective::all_gather, "tp.mod_router_scores", "tensor", Pass::forward,
                          t, tensor_level, comm.score_bytes,
                          stage_routed_layers * c.m * c.fwd_passes,
                          c.comm(Collective::all_gather, comm.score_bytes, t, tensor_level), 1.0});
    }
  }
  if (c.ep > 1 && c.config.moe.enabled() &&
      first.moe_layers_here + first.moe_routed_layers_here > 0) {
    const double count = 2.0 * static_cast<double>(first.moe_layers_here) * c.m;
    const double bytes = a2a_bytes(c, c.T);
    const double one = c.comm(Collective::all_to_all, bytes, c.ep, c.expert_level, c.ep_per_node);
    out.comm.push_back({Collective::all_to_all, "ep.dispatch_combine", "expert", Pass::forward,
                        c.ep, c.expert_level, bytes, count * c.fwd_passes, one, 1.0});
    out.comm.push_back({Collective::all_to_all, "ep.dispatch_combine", "expert", Pass::backward,
                        c.ep, c.expert_level, bytes, count, one, 1.0});
  }
  if (c.par.zero == 3 && c.dp > 1) {
    out.comm.push_back({Collective::all_gather, "zero3.param_gather", "data", Pass::forward, c.dp,
                        c.placement.data, memory.layer_param_bytes(),
                        2.0 * static_cast<double>(first.layers) * c.m, zero3_gather_one,
                        c.par.overlap_param_gather ? 0.0 : 1.0});
  }
  // Pipeline sends are listed once per boundary; per step: forward and
  // backward of m micro-batches.
  for (CommRecord& record : out.comm) {
    if (std::strcmp(record.group, "pipeline") == 0) {
      record.count = 2.0 * c.m;
    }
  }
}

}  // namespace

ClusterEstimate estimate_cluster(const Config& config, const TimingModel& timing,
                                 const Estimate& base) {
  return estimate_cluster(config, timing, base, rank_compute(config, timing));
}

ClusterEstimate estimate_cluster(const Config& config, const TimingModel& timing,
                                 const Estimate& base, const RankCompute& compute) {
  if (compute.tensor != config.parallel.tensor ||
      compute.sequence_parallel != config.parallel.sequence_parallel ||
      compute.micro_batch != config.train.micro_batch ||
      compute.recompute != config.train.recompute) {
    throw std::logic_error("estimate_cluster: the rank compute was lowered for another layout");
  }
  const ClusterContext c(config, timing);
  ClusterEstimate out;
  fill_layout(c, out);
  out.dar_replicated_s = (c.t > 1 && !c.sp) ? compute.all_depth_reads_s * (1.0 - 1.0 / c.t) : 0.0;
  const LayerComm comm = layer_comm(c);
  const std::vector<int64_t> chunk_sizes = pipeline_chunks(c, compute, comm);
  const StageMemoryModel memory(config, timing.profile(), base.params);
  assemble_stages(c, compute, comm, chunk_sizes, memory, out);
  const StepParts parts = stage_data_parallel(c, memory, out);
  add_comm_records(c, comm, memory, parts.zero3_gather_one, out);

  // The step: m micro-batches of the slowest stage, the bubble (p - 1) / (v m)
  // of that, what the backward does not hide of the data-parallel traffic,
  // the optimizer and the host time per step.
  const StageSummary& slow = out.stages[static_cast<size_t>(out.slowest_stage)];
  const double ideal = c.m * parts.slowest;
  out.compute_s = c.m * slow.compute_s;
  out.bubble_s =
      c.p > 1 ? ideal * static_cast<double>(c.p - 1) / (static_cast<double>(c.v) * c.m) : 0.0;
  out.grad_reduce_exposed_s = parts.grad_exposed;
  out.param_gather_exposed_s = parts.gather_exposed;
  out.optimizer_s = parts.optimizer;
  out.exposed_comm_s = c.m * slow.exposed_comm_s + parts.grad_exposed + parts.gather_exposed;
  out.overlapped_comm_s = parts.overlapped;
  out.step_overhead_s = c.kernel.step_overhead_s;
  out.step_s = ideal + out.bubble_s + parts.grad_exposed + parts.gather_exposed + parts.optimizer +
               out.step_overhead_s;
  return out;
}

bool ClusterMemoryBound::may_fit() const {
  if (capacity <= 0.0) {
    return true;
  }
  // A lower bound is assembled from the affine parts of the stage formula:
  // allow for their rounding (never reject what the exact formula accepts).
  return peak <= (exact ? capacity : capacity * (1.0 + 1e-9));
}

ClusterMemoryBound cluster_memory_bound(const Config& config, const DeviceProfile& profile) {
  const ParallelConfig& par = config.parallel;
  const int64_t p = par.pipeline;
  const int64_t v = par.virtual_stages;
  const int64_t L = config.model.n_layers;
  const int64_t chunks = p * v;
  const StageMemoryModel model(config, profile, detail::closed_form_params(config));
  ClusterMemoryBound out;
  out.capacity = profile.ceilings.memory_bytes;
  if (chunks == 1 || !par.balance_stages) {
    // The partition does not depend on time: the stages exactly as
    // estimate_cluster() builds them.
    const std::vector<int64_t> sizes =
        chunks == 1 ? std::vector<int64_t>{L} : equal_chunks(L, chunks);
    std::vector<int64_t> layers(static_cast<size_t>(p), 0), routed(static_cast<size_t>(p), 0),
        end(static_cast<size_t>(p), 0), moe_full(static_cast<size_t>(p), 0),
        moe_routed(static_cast<size_t>(p), 0);
    int64_t layer = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      const size_t stage = static_cast<size_t>(c % p);
      for (int64_t l = layer; l < layer + sizes[static_cast<size_t>(c)]; ++l) {
        routed[stage] += config.mod.is_routed(l) ? 1 : 0;
        if (config.moe.is_moe_layer(l)) {
          (config.mod.is_routed(l) ? moe_routed : moe_full)[stage] += 1;
        }
      }
      layers[stage] += sizes[static_cast<size_t>(c)];
      layer += sizes[static_cast<size_t>(c)];
      end[stage] = layer;
    }
    out.peak = -1.0;
    for (int64_t i = 0; i < p; ++i) {
      const size_t k = static_cast<size_t>(i);
      out.peak = std::max(
          out.peak, model.memory(i, layers[k], routed[k], end[k], moe_full[k], moe_routed[k]).peak);
    }
    out.exact = true;
    return out;
  }
  // Time-balanced stages: the split is unknown without timing.  Stage i's
  // peak is a_i + c_i l_i at least, with l_i >= v its layers, c_i the cheaper
  // of a full and a routed layer and a_i its memory without layers at the
  // smallest end layer its last chunk can have (the DAR bank grows with it;
  // the last stage always ends at L).  Over every split with sum l_i = L:
  //   max_i peak_i >= max_i (a_i + c_i v)  and  >= X = (L + sum a_i / c_i) / sum 1 / c_i
  // (if every stage stayed below X, the layers would not add up to L).
  double bound = 0.0;
  double sum_inverse = 0.0, sum_ratio = 0.0;
  bool all_positive = true;
  for (int64_t i = 0; i < p; ++i) {
    const int64_t last_chunk = (v - 1) * p + i;
    const int64_t end_min = i == model.last_stage() ? L : last_chunk + 1;
    const double a = model.memory(i, 0, 0, end_min).peak;
    // The cheapest layer there is (full or routed, with or without experts).
    const bool any_routed = layer_counts(config).routed_layers > 0;
    const bool any_moe = config.moe.enabled();
    double one_layer = model.memory(i, 1, 0, end_min).peak;
    if (any_routed) {
      one_layer = std::min(one_layer, model.memory(i, 1, 1, end_min).peak);
    }
    if (any_moe) {
      one_layer = std::min(one_layer, model.memory(i, 1, 0, end_min, 1, 0).peak);
      if (any_routed) {
        one_layer = std::min(one_layer, model.memory(i, 1, 1, end_min, 0, 1).peak);
      }
    }
    const double c = one_layer - a;
    const int64_t most = L - (p - 1) * v;  // the other stages hold >= v each
    bound =
        std::max(bound, a + std::min(c * static_cast<double>(v), c * static_cast<double>(most)));
    if (c > 0.0) {
      sum_inverse += 1.0 / c;
      sum_ratio += a / c;
    } else {
      all_positive = false;
    }
  }
  if (all_positive && sum_inverse > 0.0) {
    bound = std::max(bound, (static_cast<double>(L) + sum_ratio) / sum_inverse);
  }
  out.peak = bound;
  out.exact = false;
  return out;
}

}  // namespace modar
