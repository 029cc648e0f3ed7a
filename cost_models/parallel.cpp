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
// Data parallel: one all-reduce of the main gradients (fp32; fp16 for fp16
// training, as Megatron keeps them; ZeRO >= 1:
// reduce-scatter, then an all-gather of the updated bf16 weights; ZeRO 3:
// all-gathers of each layer's weights forward and backward per micro-batch).
#include "modar/parallel.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <vector>

#include "attention_kernel.hpp"
#include "grad_accumulation.hpp"
#include "cost_model_internal.hpp"

namespace modar {

bool cluster_engaged(const Config& config) {
  return !config.parallel.is_default() || config.device.count > 1;
}

namespace {

bool starts_with(const char* text, const char* prefix) {
  return std::strncmp(text, prefix, std::strlen(prefix)) == 0;
}

// Where an op record's time goes, from its label (Buckets::take).
struct LabelPlace {
  enum Part : uint8_t { layers, first, last, prefix };
  Part part = layers;
  bool token_wise = false;  // token-wise on full d_model rows: sharded by tokens under SP
  bool depth = false;       // a DAR depth op ("dar.")
};

LabelPlace label_place(const char* label) {
  LabelPlace place;
  place.token_wise = starts_with(label, "attn.norm") || starts_with(label, "mlp.norm") ||
                     starts_with(label, "residual.") || starts_with(label, "final.norm") ||
                     starts_with(label, "dar.") || starts_with(label, "mod.router") ||
                     starts_with(label, "moe.router") || starts_with(label, "moe.topk") ||
                     starts_with(label, "dropout.") || starts_with(label, "embedding.dropout");
  if (starts_with(label, "embedding") || starts_with(label, "dar.bank_init")) {
    place.part = LabelPlace::first;
  } else if (starts_with(label, "final.norm") || starts_with(label, "head") ||
             starts_with(label, "loss.") || starts_with(label, "dar.output")) {
    place.part = LabelPlace::last;
  } else if (starts_with(label, "dar.prefix")) {
    place.part = LabelPlace::prefix;
  }
  place.depth = starts_with(label, "dar.");
  return place;
}

// compute(label) memoised by the label's address (labels are static strings,
// ops.hpp; a slot holds one address, so a collision only recomputes): the
// layout search and the floors lower the same few dozen labels millions of
// times.  One table per (Place, compute) pair and thread.
template <typename Place, Place (*compute)(const char*)>
Place memoised_by_label(const char* label) {
  struct Slot {
    const char* label = nullptr;
    Place place;
  };
  constexpr size_t kSlots = 512;
  thread_local std::array<Slot, kSlots> slots{};
  Slot& slot = slots[(reinterpret_cast<uintptr_t>(label) >> 3) & (kSlots - 1)];
  if (slot.label != label) {
    slot.place = compute(label);
    slot.label = label;
  }
  return slot.place;
}

LabelPlace cached_label_place(const char* label) {
  return memoised_by_label<LabelPlace, label_place>(label);
}

// Time of one micro-batch's ops by where they run.
struct Buckets final : detail::OpConsumer {
  Buckets(const TimingModel& timing, double token_share, AttentionKernel kernel,
          bool attention_dropout)
      : timing_(timing), share_(token_share), kernel_(kernel), dropout_(attention_dropout) {}
  void take(const OpRecord& op) override {
    if (op.shape.kind == OpKind::optimizer_update) {
      return;  // the optimizer runs on the sharded states (estimate_cluster)
    }
    TimingModel::Source source = TimingModel::Source::roofline;
    double seconds = detail::attention_kernel_time_s(op, timing_, kernel_, dropout_, &source) *
                     static_cast<double>(op.multiplicity) * op.weight;
    const char* label = op.label;
    const LabelPlace place = cached_label_place(label);
    if (place.token_wise) {
      seconds *= share_;
    }
    switch (place.part) {
      case LabelPlace::first:
        first += seconds;
        break;
      case LabelPlace::last:
        last += seconds;
        break;
      case LabelPlace::prefix:
        prefix += seconds;  // replaced by per-block times in estimate_cluster
        break;
      case LabelPlace::layers:
        layers += seconds;
        if (place.depth) {
          depth_reads += seconds;
        }
        break;
    }
    if (place.depth) {
      all_depth_reads += seconds;
    }
    if (op.shape.kind == OpKind::gemm && op.pass != Pass::recompute) {
      add_linear_gemm(label, seconds);
    }
    if (op.shape.kind == OpKind::attention) {
      (op.pass == Pass::backward ? attention_backward : attention_forward) +=
          op.pass == Pass::recompute ? 0.0 : seconds;
    }
  }
  double first = 0, last = 0, prefix = 0, layers = 0, depth_reads = 0, all_depth_reads = 0;
  double attention_forward = 0, attention_backward = 0;  // the core attention ops
  RankCompute::LinearGemms forward, dgrad, wgrad;

 private:
  // The tensor-parallel linears' GEMMs by pass ("attn.qkv", "attn.qkv.dgrad",
  // "attn.qkv.wgrad", ...; SwiGLU's fused gate and up count as up).
  struct LinearPlace {
    double RankCompute::LinearGemms::*field = nullptr;  // none: not such a linear
    RankCompute::LinearGemms Buckets::*pass = nullptr;  // forward, dgrad or wgrad
  };
  static LinearPlace linear_place(const char* label) {
    static const struct {
      const char* name;
      double RankCompute::LinearGemms::*field;
    } kLinears[] = {{"attn.qkv", &RankCompute::LinearGemms::qkv},
                    {"attn.out", &RankCompute::LinearGemms::out},
                    {"mlp.up", &RankCompute::LinearGemms::up},
                    {"mlp.gate_up", &RankCompute::LinearGemms::up},
                    {"mlp.down", &RankCompute::LinearGemms::down}};
    for (const auto& linear : kLinears) {
      const size_t n = std::strlen(linear.name);
      if (std::strncmp(label, linear.name, n) != 0) {
        continue;
      }
      const char* suffix = label + n;
      if (*suffix == '\0') {
        return {linear.field, &Buckets::forward};
      }
      if (std::strcmp(suffix, ".dgrad") == 0) {
        return {linear.field, &Buckets::dgrad};
      }
      if (std::strcmp(suffix, ".wgrad") == 0) {
        return {linear.field, &Buckets::wgrad};
      }
    }
    return {};
  }
  void add_linear_gemm(const char* label, double seconds) {
    const LinearPlace place = memoised_by_label<LinearPlace, linear_place>(label);
    if (place.field != nullptr) {
      (this->*place.pass).*place.field += seconds;
    }
  }
  const TimingModel& timing_;
  double share_;
  AttentionKernel kernel_;
  bool dropout_;
};

// The tokens of one sequence a context-parallel rank holds: s / c (two
// load-balanced chunks of s / 2c), and the MoD-routed ones among them.
int64_t rank_seq_len(const Config& config) {
  return config.model.seq_len / config.parallel.context;
}
int64_t rank_routed_tokens(const Config& config) {
  return config.mod.routed_tokens_per_sequence(rank_seq_len(config));
}

Config shard_config(const Config& config) {
  Config shard = config;
  const int64_t t = config.parallel.tensor;
  ModelConfig& m = shard.model;
  m.seq_len = rank_seq_len(config);  // CP: the rank's queries (ShardView: keys of the sequence)
  m.d_head = config.model.resolved_d_head();
  m.n_kv_heads = config.model.resolved_kv_heads() / t;
  m.n_heads = config.model.n_heads / t;
  m.d_ff = config.model.resolved_d_ff() / t;
  m.vocab_size = config.model.padded_vocab(t) / t;  // the rank's slice of the padded vocabulary
  m.make_vocab_size_divisible_by = 1;
  if (config.moe.enabled()) {
    // Experts (docs/moe.md): routed expert widths split by the expert tensor
    // size; the shard holds moe.experts / EP experts (the lowering reads
    // parallel.expert).
    shard.moe.expert_ffn =
        config.moe.resolved_expert_ffn(config.model) / config.parallel.resolved_expert_tensor();
    // The shared experts are dense FFNs: split by the tensor size.
    if (config.moe.shared_experts > 0) {
      shard.moe.shared_expert_ffn = config.moe.shared_ffn_total(config.model) /
                                    config.moe.shared_experts / config.parallel.tensor;
    }
  }
  shard.parallel = ParallelConfig{};
  shard.parallel.expert = config.parallel.expert;
  shard.device.count = 1;
  shard.train.global_batch = 0;
  return shard;
}

// The routed experts of one rank (docs/cluster.md "Expert parallelism"):
// under sequence parallelism (or without tensor parallelism) a rank
// dispatches its own T / t tokens and its expert-tensor group gathers etp
// ranks' slots (rows x etp / t); without SP every tensor rank holds all T
// tokens and etp = t (rows x 1).
detail::MoeRankShare moe_rank_share(const Config& config) {
  const ParallelConfig& par = config.parallel;
  const double t = static_cast<double>(par.tensor);
  const double etp = static_cast<double>(par.resolved_expert_tensor());
  detail::MoeRankShare share;
  share.tensor = t;
  share.expert_tensor = etp;
  share.expert_rows = (par.sequence_parallel || par.tensor == 1) ? etp / t : 1.0;
  return share;
}

detail::ShardView shard_view(const Config& config) {
  detail::ShardView view;
  view.context = config.parallel.context;
  if (config.moe.enabled()) {
    const ParallelConfig& par = config.parallel;
    if (par.sequence_parallel || par.tensor == 1) {
      view.expert_rows_numerator = par.resolved_expert_tensor();
      view.expert_rows_denominator = par.tensor;
    }
  }
  return view;
}

// rank = tensor + t (context + c (stage + p data)): a tensor group sits in a
// node first, then the context group, then the pipeline, then data replicas.
struct Placement {
  NetLevel tensor, context, pipeline, data;
};

Placement place(int64_t t, int64_t c, int64_t p, int64_t d, int64_t gpus_per_node) {
  const auto level = [&](int64_t span) {
    return span <= gpus_per_node ? NetLevel::intra_node : NetLevel::inter_node;
  };
  return {level(t), level(t * c), level(t * c * p), level(t * c * p * d)};
}

// A group of the expert layers (docs/cluster.md "Expert parallelism"):
// Megatron-Core folds a pipeline stage's tensor x context x data ranks, in
// the order tensor index + t (context index + c data index) ("folded index"
// f), into expert_tensor x expert x expert_data; with A = t c, f sits on rank
// f % A + A (stage + p (f / A)).  The
// group of `members` ranks `stride` apart in f (expert tensor: stride 1;
// expert: stride etp; expert data: stride etp x EP) is intra-node when its
// last member shares the first's node, and drives as many NICs as it has
// members in one node.
struct GroupPlace {
  NetLevel level = NetLevel::intra_node;
  int64_t per_node = 1;
};

GroupPlace folded_group(int64_t stride, int64_t members, int64_t t, int64_t c, int64_t p,
                        int64_t gpus_per_node) {
  const int64_t inner = t * c;
  const auto rank_of = [&](int64_t f) { return f % inner + inner * p * (f / inner); };
  GroupPlace out;
  if (members <= 1) {
    return out;
  }
  out.level = rank_of(stride * (members - 1)) < gpus_per_node ? NetLevel::intra_node
                                                               : NetLevel::inter_node;
  int64_t in_first_node = 0;
  while (in_first_node < members && rank_of(stride * in_first_node) < gpus_per_node) {
    ++in_first_node;
  }
  out.per_node = std::max<int64_t>(1, in_first_node);
  return out;
}

// Contiguous partition of `cost` into `parts` chunks minimising the largest
// chunk (binary search on the bound, greedy fill); every chunk >= 1 layer.
//
// The greedy fill's outcome depends on the bound only through its
// comparisons, so each fill also records the interval of bounds that take
// the same path (FillPath); a later bound of the binary search inside the
// interval of the last feasible or infeasible fill has that fill's outcome
// and needs no new fill.  The bisection's steps, its final bound and the
// split it returns are those of filling at every step (the planner's hot
// path: ~35 fills per partition before, a handful now).

// The bounds b that make a greedy fill take one recorded path: every close
// decided by a comparison had sum + layer > b (so b < close_below), every
// chunk that kept its layer had sum + layer <= b (b >= keep_at_least), every
// overflow check passed (kept_sum <= b (1 + 1e-12)) or, for an infeasible
// path that stopped at one, failed (failed_sum > b (1 + 1e-12)).
struct FillPath {
  double keep_at_least = -INFINITY;
  double close_below = INFINITY;
  double kept_sum = -INFINITY;
  double failed_sum = INFINITY;  // finite only on a path that failed there
  bool feasible = false;
  bool holds_for(double bound) const {
    const double limit = bound * (1.0 + 1e-12);
    return bound >= keep_at_least && bound < close_below && !(kept_sum > limit) &&
           (failed_sum == INFINITY || failed_sum > limit);
  }
};

// The greedy fill under `bound`: a chunk closes before the layer that would
// take it past the bound, or when the layers left are needed one per chunk
// left; infeasible when a chunk of several layers (or the last chunk) passes
// the bound.  The open chunk's size stays in a register until it closes.
FillPath greedy_fill(const double* costs, int64_t n, int64_t parts, double bound,
                     std::vector<int64_t>* sizes) {
  FillPath path;
  sizes->assign(static_cast<size_t>(parts), 0);
  int64_t* size = sizes->data();
  const double limit = bound * (1.0 + 1e-12);
  int64_t chunk = 0;
  int64_t in_chunk = 0;
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double layer = costs[i];
    if (in_chunk > 0 && chunk + 1 < parts) {
      const double grown = sum + layer;
      const bool forced = n - i < parts - chunk;  // decided whatever the bound
      const bool over = grown > bound;
      if (!forced) {
        if (over) {
          path.close_below = std::min(path.close_below, grown);
        } else {
          path.keep_at_least = std::max(path.keep_at_least, grown);
        }
      }
      if (over || forced) {
        size[chunk] = in_chunk;
        ++chunk;
        in_chunk = 0;
        sum = 0.0;
      }
    }
    sum += layer;
    ++in_chunk;
    if (in_chunk > 1 || chunk + 1 == parts) {
      if (sum > limit) {
        path.failed_sum = sum;
        return path;
      }
      path.kept_sum = std::max(path.kept_sum, sum);
    }
  }
  size[chunk] = in_chunk;
  path.feasible = chunk + 1 == parts;  // every chunk closed with >= 1 layer, the last has >= 1
  return path;
}

std::vector<int64_t> balanced_partition(const std::vector<double>& cost, int64_t parts) {
  const int64_t n = static_cast<int64_t>(cost.size());
  double lo = *std::max_element(cost.begin(), cost.end());
  double hi = 0.0;
  for (double c : cost) {
    hi += c;
  }
  std::vector<int64_t> sizes, best;
  FillPath feasible = greedy_fill(cost.data(), n, parts, hi, &best);
  if (!feasible.feasible) {
    best.assign(static_cast<size_t>(parts), n / parts);
    for (int64_t i = 0; i < n % parts; ++i) {
      ++best[static_cast<size_t>(parts - 1 - i)];
    }
    return best;
  }
  std::optional<FillPath> infeasible;
  for (int iteration = 0; iteration < 60 && hi - lo > 1e-9 * hi; ++iteration) {
    const double mid = 0.5 * (lo + hi);
    bool fits = false;
    if (feasible.holds_for(mid)) {
      fits = true;  // the split at hi, again
    } else if (!(infeasible && infeasible->holds_for(mid))) {
      const FillPath path = greedy_fill(cost.data(), n, parts, mid, &sizes);
      fits = path.feasible;
      if (fits) {
        feasible = path;
        best.swap(sizes);
      } else {
        infeasible = path;
      }
    }
    (fits ? hi : lo) = mid;
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
    // A context-parallel rank holds s / c tokens of each sequence.
    context_ = par.context;
    s_ = static_cast<double>(rank_seq_len(config));
    d_ = static_cast<double>(model_.d_model);
    k_ = static_cast<double>(rank_routed_tokens(config));
    T_ = b_ * s_;
    token_share_ = par.sequence_parallel ? 1.0 / static_cast<double>(t_) : 1.0;
    plan_ = detail::recompute_plan(config);
    L_ = model_.n_layers;
    depth_ = config.dar.enabled();
    K_ = config.dar.block_layers;
    n_streams_ = counts.dar_streams;
    entry_bytes_ = depth_ ? static_cast<double>(n_streams_) * T_ * (d_ * B_ + 4.0) : 0.0;
    embedding_params_ = static_cast<double>(model_.padded_vocab(t_)) * d_;
    head_params_ = model_.tie_embeddings ? embedding_params_ : embedding_params_;
    // Routed experts are sharded by expert parallelism and expert tensor
    // parallelism (their share per layer, spread evenly over the layers); the
    // rest by tensor parallelism.  ZeRO shards the experts over the
    // expert-data-parallel ranks (Megatron-Core's folding, docs/cluster.md).
    ep_ = std::max<int64_t>(1, par.expert);
    expert_tensor_ = std::max<int64_t>(1, par.resolved_expert_tensor());
    expert_dp_ = std::max<int64_t>(1, par.expert_data(config.device.count));
    moe_share_ = moe_rank_share(config);
    expert_per_layer_ = params.experts / static_cast<double>(L_);
    dense_per_layer_ = (params.non_embedding - d_ - params.experts) / static_cast<double>(L_);
    layer_param_bytes_ = (dense_per_layer_ / static_cast<double>(t_) +
                          expert_per_layer_ / static_cast<double>(ep_ * expert_tensor_)) *
                         B_;
    last_stage_ = (p_ * v_ - 1) % p_;
    optimizer_bytes_per_param_ = config.train.dtype != DType::fp32 ? 12.0 : 8.0;
    // Ring attention's transients: the K V block in hand and the one arriving
    // (forward), the block and its gradient both ways (backward): 4 blocks.
    if (context_ > 1) {
      cp_ring_bytes_ = 4.0 * b_ * s_ * 2.0 *
                       static_cast<double>(model_.resolved_kv_heads() / t_) *
                       static_cast<double>(model_.resolved_d_head()) * B_;
    }
  }

  int64_t last_stage() const { return last_stage_; }
  double layer_param_bytes() const { return layer_param_bytes_; }
  double entry_bytes() const { return entry_bytes_; }

  // Bank entries available after layer l (exclusive end): H_0 + completed
  // blocks (+ the partial of a block cut by the boundary).
  double bank_entries_at(int64_t boundary_layer) const {
    return 1.0 + static_cast<double>(boundary_layer / K_) +
           (boundary_layer % K_ != 0 ? 1.0 : 0.0);
  }

  // Parameters held per rank on stage i (before ZeRO sharding).
  double stage_params(int64_t i, int64_t layers) const {
    double dense = dense_per_layer_ * static_cast<double>(layers);
    if (i == 0) {
      dense += embedding_params_;
    }
    if (i == last_stage_) {
      dense += (model_.tie_embeddings && p_ == 1 ? 0.0 : head_params_) + d_;
    }
    return dense / static_cast<double>(t_) + expert_stage_params(layers);
  }

  // The routed experts' parameters among stage_params() (this rank's EP x
  // expert-TP shard).
  double expert_stage_params(int64_t layers) const {
    return expert_per_layer_ * static_cast<double>(layers) /
           static_cast<double>(ep_ * expert_tensor_);
  }

  // Stage i holding `layers` layers (`routed` of them MoD-routed; `moe_full`
  // full and `moe_routed` routed ones with an expert FFN, docs/moe.md), its
  // last chunk ending at layer `end_layer` (exclusive).
  MemoryBreakdown memory(int64_t i, int64_t layers, int64_t routed, int64_t end_layer,
                         int64_t moe_full = 0, int64_t moe_routed = 0) const {
    const double B = B_, b = b_, s = s_, d = d_, k = k_, T = T_, token_share = token_share_;
    const double params = stage_params(i, layers);
    MemoryBreakdown mem;
    mem.capacity = capacity_;
    // ZeRO shards over the data-parallel ranks with their context ranks.
    const double shard_dp = static_cast<double>(dp_ * context_);
    mem.weights = params * B / (zero_ == 3 ? shard_dp : 1.0);
    // ZeRO shards the dense part over dp, the expert shard over the
    // expert-data-parallel ranks.
    const double shard_edp = static_cast<double>(expert_dp_);
    const double expert_params = expert_stage_params(layers);
    const double dense_params = params - expert_params;
    mem.gradients = dense_params * kGradBytesPerParam / (zero_ >= 2 ? shard_dp : 1.0) +
                    expert_params * kGradBytesPerParam / (zero_ >= 2 ? shard_edp : 1.0);
    mem.optimizer =
        dense_params * optimizer_bytes_per_param_ / (zero_ >= 1 ? shard_dp : 1.0) +
        expert_params * optimizer_bytes_per_param_ / (zero_ >= 1 ? shard_edp : 1.0);
    // Activations per micro-batch (Korthikanti et al. 2022 structure applied to
    // modar's saved tensors, memory.cpp): the d_model-wide tensors (norm
    // inputs / outputs, layer inputs) are replicated over the tensor group
    // unless SP shards them; Q K V, attention output, MLP up / activation and
    // the softmax statistics are split by t.
    const auto [heads, kv, dh, dff, up, qkv] = detail::layer_widths(model_);
    const double tt = static_cast<double>(t_);
    // The one per-layer table of memory.cpp (layer_saved_bytes), held the
    // Korthikanti way by this rank.
    auto layer_saved = [&](double rows, double seq) {
      return detail::layer_saved_bytes(config_, rows, seq, detail::LayerShare{token_share, tt},
                                       plan_);
    };
    const double stage_full = static_cast<double>(layers - routed);
    const double stage_routed = static_cast<double>(routed);
    double activations = 0.0;
    double partials = 0.0;
    double branch_outputs = 0.0;
    if (plan_.full) {
      activations = static_cast<double>(layers) * B * T * d * token_share;
    } else {
      activations = stage_full * layer_saved(T, s) +
                    stage_routed * (layer_saved(b * k, k) + B * (T + b * k) * d * token_share);
      if (depth_) {
        // The stage's blocks spread evenly: layers / K of them.
        const detail::DarMergeSaved saved = detail::dar_merge_saved_bytes(
            static_cast<double>(layers), static_cast<double>(layers) / static_cast<double>(K_),
            n_streams_, T, d, B);
        partials = saved.partials * token_share;
        branch_outputs = saved.branch_outputs * token_share;
      }
    }
    // MoE layers (docs/moe.md): the expert slots' saved tensors.
    activations +=
        static_cast<double>(moe_full) * detail::moe_saved_extra_bytes(config_, T, moe_share_) +
        static_cast<double>(moe_routed) * detail::moe_saved_extra_bytes(config_, b * k, moe_share_);
    if (i == last_stage_) {
      activations += (2.0 * B * T * d + 8.0 * T) * token_share;
    }
    if (i == 0 && config_.train.hidden_dropout > 0.0) {
      activations += detail::kDropoutMaskBytes * T * d * token_share;  // the embedding dropout
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
    mem.dar_partials = partials * in_flight;
    mem.dar_branch_outputs = branch_outputs * in_flight;
    mem.router_buffers = stage_routed * (4.0 * T + 8.0 * b * k) * in_flight;
    // The router runs on the rank's tokens (T / t under SP).
    mem.router_buffers +=
        (static_cast<double>(moe_full) * detail::moe_buffer_bytes(config_, T * token_share) +
         static_cast<double>(moe_routed) * detail::moe_buffer_bytes(config_, b * k * token_share)) *
        in_flight;
    if (depth_) {
      // The bank this stage holds per micro-batch in flight: every entry up to
      // the end of its last chunk (received or produced here).
      mem.dar_bank = bank_entries_at(end_layer) * entry_bytes_ * token_share * in_flight;
      // The prefix kernels' retained outputs and kept packs, spread evenly
      // over the layers.
      const double layer_fraction = static_cast<double>(layers) / static_cast<double>(L_);
      mem.dar_retained =
          detail::dar_prefix_retained_bytes(config_, T) * token_share * layer_fraction * in_flight;
      mem.dar_packs =
          detail::dar_kept_packs_bytes(config_, T) * token_share * layer_fraction * in_flight;
    }
    // Transients: the head's logits (last stage), one layer's backward, and
    // under ZeRO 3 two gathered layers (current + prefetch).
    const double head_ws = i == last_stage_
                               ? T * static_cast<double>(model_.padded_vocab(t_)) / tt *
                                     (B + 4.0)
                               : 0.0;
    double layer_ws = 2.0 * B * T * d * token_share + B * T * std::max(up, qkv) / tt;
    // One layer's recomputed tensors through its backward: all of them under
    // full recompute, else what the recomputed modules dropped.
    layer_ws += detail::layer_saved_bytes(config_, T, s, detail::LayerShare{token_share, tt},
                                          detail::RecomputePlan{}) -
                (plan_.full ? 0.0 : layer_saved(T, s));
    if (zero_ == 3) {
      layer_ws += 2.0 * layer_param_bytes_;
    }
    layer_ws += cp_ring_bytes_;
    if (config_.moe.enabled()) {
      // A MoE layer's backward: the slots' gradients in and out, the widest slot tensor.
      const double slots = detail::moe_rank_slots(config_, T, moe_share_);
      const double ffn = static_cast<double>(config_.moe.resolved_expert_ffn(model_));
      const double expert_up = model_.gated_mlp() ? 2.0 * ffn : ffn;
      // The all-gather dispatcher holds the group's gathered tokens meanwhile.
      const double gathered =
          config_.moe.token_dispatcher == TokenDispatcher::allgather
              ? B * T * token_share * d * static_cast<double>(ep_ * expert_tensor_)
              : 0.0;
      layer_ws = std::max(layer_ws, 2.0 * B * T * d * token_share + 2.0 * B * slots * d +
                                        B * slots * expert_up / moe_share_.expert_tensor +
                                        gathered);
    }
    // A DAR block's backward on top (memory.cpp's formula, the whole bank's
    // gradient: an upper bound for a stage ending before the last block), by
    // tokens under SP like the depth reads.
    layer_ws += detail::dar_block_backward_bytes(config_, T) * token_share;
    mem.workspace = std::max(head_ws, layer_ws);
    mem.peak = detail::sum_of_parts(mem);  // no KV cache in training (0)
    mem.fits = mem.capacity <= 0.0 || mem.peak <= mem.capacity;
    return mem;
  }

  static constexpr double kGradBytesPerParam = detail::kMainGradBytesPerParam;

 private:
  const Config& config_;
  const ModelConfig& model_;
  double capacity_ = 0.0;
  int64_t t_ = 1, p_ = 1, v_ = 1, dp_ = 1, zero_ = 0, ep_ = 1, expert_tensor_ = 1,
          expert_dp_ = 1, context_ = 1;
  detail::MoeRankShare moe_share_;
  double expert_per_layer_ = 0.0, dense_per_layer_ = 0.0;
  double m_ = 1.0;
  double B_ = 2.0, b_ = 1.0, s_ = 1.0, d_ = 1.0, k_ = 0.0, T_ = 1.0, token_share_ = 1.0;
  detail::RecomputePlan plan_;
  int64_t L_ = 1;
  bool depth_ = false;
  int64_t K_ = 1, n_streams_ = 0;
  double entry_bytes_ = 0.0, embedding_params_ = 0.0, head_params_ = 0.0;
  double layer_param_bytes_ = 0.0;
  double cp_ring_bytes_ = 0.0;
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
  out.recompute_granularity = config.train.recompute_granularity;
  out.recompute_modules = config.train.recompute_modules;
  out.expert = config.parallel.expert;
  out.expert_tensor = config.parallel.resolved_expert_tensor();
  out.context = config.parallel.context;
  const int64_t t = config.parallel.tensor;
  const double token_share = out.sequence_parallel ? 1.0 / static_cast<double>(t) : 1.0;
  const int64_t L = config.model.n_layers;
  const LayerCounts counts = layer_counts(config);
  const Config shard = shard_config(config);
  const double shard_params = detail::closed_form_params(shard).total;
  const bool attention_dropout = config.train.attention_dropout > 0.0;
  Buckets real(timing, token_share, config.train.attention_kernel, attention_dropout);
  const detail::ShardView view = shard_view(config);
  detail::lower_streaming(shard, StepKind::train, shard_params, view, real);
  const double layers = static_cast<double>(L);
  double full_layer_s = real.layers / layers;
  double routed_layer_s = full_layer_s;
  const Buckets* full_layers = &real;
  Buckets plain(timing, token_share, config.train.attention_kernel, attention_dropout);
  out.full_attention_forward_s = real.attention_forward / layers;
  out.full_attention_backward_s = real.attention_backward / layers;
  out.routed_attention_forward_s = out.full_attention_forward_s;
  out.routed_attention_backward_s = out.full_attention_backward_s;
  if (counts.routed_layers > 0) {
    Config dense = shard;
    dense.mod.every = 0;
    detail::lower_streaming(dense, StepKind::train, shard_params, view, plain);
    full_layers = &plain;
    full_layer_s = plain.layers / layers;
    const double full = static_cast<double>(counts.full_layers);
    const double routed = static_cast<double>(counts.routed_layers);
    routed_layer_s = (real.layers - full_layer_s * full) / routed;
    out.full_attention_forward_s = plain.attention_forward / layers;
    out.full_attention_backward_s = plain.attention_backward / layers;
    out.routed_attention_forward_s =
        (real.attention_forward - out.full_attention_forward_s * full) / routed;
    out.routed_attention_backward_s =
        (real.attention_backward - out.full_attention_backward_s * full) / routed;
  }
  out.first_s = real.first;
  out.last_s = real.last;
  out.full_layer_s = full_layer_s;
  out.routed_layer_s = routed_layer_s;
  out.all_depth_reads_s = real.all_depth_reads;
  // The linears of a full layer (the dense lowering's, per layer).
  const auto per_layer = [&](RankCompute::LinearGemms gemms) {
    const double layers = static_cast<double>(L);
    return RankCompute::LinearGemms{gemms.qkv / layers, gemms.out / layers, gemms.up / layers,
                                    gemms.down / layers};
  };
  out.forward_gemms = per_layer(full_layers->forward);
  out.dgrad_gemms = per_layer(full_layers->dgrad);
  out.wgrad_gemms = per_layer(full_layers->wgrad);
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
        efficiency{kernel.collective_efficiency_intra_node, kernel.collective_efficiency_inter_node,
                   timing_in.shape_aware()},
        par(config_in.parallel),
        counts(layer_counts(config_in)),
        plan(detail::recompute_plan(config_in)),
        moe_share(moe_rank_share(config_in)) {
    const ModelConfig& model = config.model;
    t = par.tensor;
    cp = par.context;
    p = par.pipeline;
    v = par.virtual_stages;
    dp = std::max<int64_t>(1, par.data(config.device.count));
    ep = par.expert;
    etp = par.resolved_expert_tensor();
    expert_dp = std::max<int64_t>(1, par.expert_data(config.device.count));
    sp = par.sequence_parallel;
    chunks = p * v;
    gpus_per_node =
        config.cluster.gpus_per_node > 0 ? config.cluster.gpus_per_node : network.gpus_per_node;
    placement = place(t, cp, p, dp, gpus_per_node);
    // The gradients reduce over the data-parallel ranks with their context
    // ranks (Megatron-Core's data-parallel group with CP): dp x c ranks, c of
    // them in each t c block, one block per data index.  Ranks per node
    // (rank = tp + t (cp + c (stage + p dp_index))):
    grad_ranks = dp * cp;
    grad_level = dp > 1 ? placement.data : placement.context;
    dp_per_node = std::min<int64_t>(grad_ranks, t * cp * p < gpus_per_node
                                                    ? cp * (gpus_per_node / (t * cp * p))
                                                    : (t * cp <= gpus_per_node ? cp : 1));
    tp_per_node = std::min<int64_t>(t, gpus_per_node);
    // The expert layers' groups (Megatron-Core's folding, docs/cluster.md).
    ep_group = folded_group(etp, ep, t, cp, p, gpus_per_node);
    etp_group = folded_group(1, etp, t, cp, p, gpus_per_node);
    edp_group = folded_group(etp * ep, expert_dp, t, cp, p, gpus_per_node);
    gather_ranks = etp * ep;
    gather_group = folded_group(1, gather_ranks, t, cp, p, gpus_per_node);
    expert_sp_path = config.moe.enabled() && (sp || t == 1);
    allgather = config.moe.token_dispatcher == TokenDispatcher::allgather;
    m = static_cast<double>(detail::accumulation_steps(config));
    B = static_cast<double>(dtype_bytes(config.train.dtype));
    b = static_cast<double>(config.train.micro_batch);
    // A context-parallel rank holds s / c tokens of each sequence (k / c routed).
    s = static_cast<double>(rank_seq_len(config));
    d = static_cast<double>(model.d_model);
    k = static_cast<double>(rank_routed_tokens(config));
    T = b * s;
    fwd_passes = plan.full ? 2.0 : 1.0;  // forward re-run
    // The ring attention's sends run again with the core attention's recompute,
    // the expert dispatch with the MoE FFN's (Megatron's "moe" module).
    ring_passes = plan.full || plan.core_attention ? 2.0 : 1.0;
    moe_passes = plan.full || plan.moe ? 2.0 : 1.0;
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
  detail::RecomputePlan plan;
  detail::MoeRankShare moe_share;
  int64_t t = 1, cp = 1, p = 1, v = 1, dp = 1, ep = 1, etp = 1, expert_dp = 1, chunks = 1,
          gpus_per_node = 8, L = 1, K = 1, n_streams = 0, grad_ranks = 1, gather_ranks = 1;
  int64_t dp_per_node = 1, tp_per_node = 1;
  bool sp = false, depth = false, expert_sp_path = false, allgather = false;
  Placement placement{};
  NetLevel grad_level = NetLevel::intra_node;
  GroupPlace ep_group, etp_group, edp_group, gather_group;
  double m = 1, B = 2, b = 1, s = 1, d = 1, k = 0, T = 1, fwd_passes = 1, ring_passes = 1,
         moe_passes = 1, token_share = 1;
};

void fill_layout(const ClusterContext& c, ClusterEstimate& out) {
  out.tensor = c.t;
  out.pipeline = c.p;
  out.virtual_stages = c.v;
  out.data = c.dp;
  out.zero = c.par.zero;
  out.context = c.cp;
  out.expert = c.ep;
  out.expert_tensor = c.etp;
  out.expert_data = c.expert_dp;
  out.sequence_parallel = c.sp;
  out.micro_batch = c.config.train.micro_batch;
  out.micro_batches = static_cast<int64_t>(c.m);
  out.gpus_per_node = c.gpus_per_node;
  out.nodes = (c.config.device.count + c.gpus_per_node - 1) / c.gpus_per_node;
  out.tensor_level = c.placement.tensor;
  out.context_level = c.placement.context;
  out.pipeline_level = c.placement.pipeline;
  out.data_level = c.placement.data;
}

// Bytes of one expert all-to-all for `rows` tokens: the rank's expert slots
// x d x B (the busiest rank: x moe.load_imbalance); under SP a tensor rank
// dispatches only its share of the tokens.
double a2a_bytes(const ClusterContext& c, double rows) {
  return static_cast<double>(detail::moe_slots(c.config, std::llround(rows * c.token_share))) *
         c.d * c.B * c.config.moe.load_imbalance;
}

// Bytes of one expert-tensor all-gather (or reduce-scatter) of the slots the
// rank's ETP group gathers for `rows` tokens.
double etp_bytes(const ClusterContext& c, double rows) {
  return detail::moe_rank_slots(c.config, rows, c.moe_share) * c.d * c.B *
         c.config.moe.load_imbalance;
}

// moe.token_dispatcher = allgather (Megatron-Core's MoEAllGatherTokenDispatcher):
// the ETP x EP group all-gathers its ranks' tokens (d x B each, with their k
// weights and int64 expert indices).
double gather_bytes(const ClusterContext& c, double rows) {
  const double k_choices = static_cast<double>(c.config.moe.top_k);
  return std::round(rows * c.token_share) * static_cast<double>(c.gather_ranks) *
         (c.d * c.B + k_choices * (c.B + 8.0));
}

// Context parallelism (docs/cluster.md "Context parallelism"): ring attention
// passes each rank's K and V block (rows x 2 (G / t) d_h x B) around the c
// ranks of its context group: c - 1 sends forward, and c - 1 of the block
// and its gradient backward, each step overlapped with the attention of the
// block in hand (1 / c of the rank's attention); with the core attention's
// recompute the forward ring runs again.
struct RingTime {
  double exposed = 0.0, overlapped = 0.0, forward_one = 0.0, backward_one = 0.0, block = 0.0;
};

RingTime ring_time(const ClusterContext& c, double rows, double attention_forward_s,
                   double attention_backward_s) {
  RingTime ring;
  if (c.cp <= 1) {
    return ring;
  }
  const ModelConfig& model = c.config.model;
  ring.block = rows * 2.0 * static_cast<double>(model.resolved_kv_heads() / c.t) *
               static_cast<double>(model.resolved_d_head()) * c.B;
  const double steps = static_cast<double>(c.cp - 1);
  ring.forward_one = c.comm(Collective::send_recv, ring.block, 2, c.placement.context);
  ring.backward_one = c.comm(Collective::send_recv, 2.0 * ring.block, 2, c.placement.context);
  const double cp = static_cast<double>(c.cp);
  const double exposed_forward = std::max(0.0, ring.forward_one - attention_forward_s / cp);
  const double exposed_backward = std::max(0.0, ring.backward_one - attention_backward_s / cp);
  ring.exposed = steps * (c.ring_passes * exposed_forward + exposed_backward);
  ring.overlapped =
      steps * (c.ring_passes * ring.forward_one + ring.backward_one) - ring.exposed;
  return ring;
}

// Exposed communication of one layer per micro-batch, and of the model's ends.
struct LayerComm {
  double full_rows_bytes = 0, routed_rows_bytes = 0, score_bytes = 0, score_one_s = 0;
  int64_t score_group = 1;
  NetLevel score_level = NetLevel::intra_node;
  double tp_full_s = 0, tp_routed_s = 0, ep_full_s = 0, ep_routed_s = 0, tp_ends_s = 0;
  // Tensor-parallel time hidden behind GEMMs (parallel.tp_comm_overlap), per
  // layer and micro-batch, and the exposed share of each pass's collectives
  // (full layers: the records of `estimate --ops`).
  double tp_full_hidden_s = 0, tp_routed_hidden_s = 0;
  double tp_forward_exposed = 1.0, tp_backward_exposed = 1.0;
  RingTime ring_full, ring_routed;
};

// One layer's tensor-parallel collectives per micro-batch: 2 per forward pass
// and 2 in backward (SP: all-gather + reduce-scatter in place of each
// all-reduce), each exposed but for what parallel.tp_comm_overlap hides
// behind the GEMM it runs beside (Megatron-LM / Transformer Engine; docs/
// cluster.md "Overlap").  `gemm_scale` scales the full layer's GEMM times to
// this layer's rows (MoD-routed layers: k of s).
struct TpLayerTime {
  double exposed_s = 0, total_s = 0, forward_exposed = 1.0, backward_exposed = 1.0;
};

TpLayerTime tp_layer_time(const ClusterContext& c, const RankCompute& compute, double bytes,
                          double gemm_scale) {
  TpLayerTime out;
  if (c.t <= 1) {
    return out;
  }
  const NetLevel level = c.placement.tensor;
  const TpCommOverlap overlap = c.par.tp_comm_overlap;
  const RankCompute::LinearGemms& fwd = compute.forward_gemms;
  const RankCompute::LinearGemms& dgrad = compute.dgrad_gemms;
  const RankCompute::LinearGemms& wgrad = compute.wgrad_gemms;
  const auto exposed = [&](double comm_s, double gemm_s) {
    return std::max(0.0, comm_s - gemm_s * gemm_scale);
  };
  double forward = 0, backward = 0, pass_total = 0;
  if (!c.sp) {
    // All-reduces after the row-parallel out and down (forward, nothing to
    // hide behind) and of the column-parallel qkv and up inputs' gradients
    // (backward, beside their weight-gradient GEMMs).
    const double ar = c.comm(Collective::all_reduce, bytes, c.t, level, c.tp_per_node);
    pass_total = 2.0 * ar;
    forward = pass_total;
    backward = overlap == TpCommOverlap::none ? pass_total
                                              : exposed(ar, wgrad.qkv) + exposed(ar, wgrad.up);
  } else {
    const double ag = c.comm(Collective::all_gather, bytes, c.t, level, c.tp_per_node);
    const double rs = c.comm(Collective::reduce_scatter, bytes, c.t, level, c.tp_per_node);
    pass_total = 2.0 * (ag + rs);
    forward = pass_total;
    backward = overlap == TpCommOverlap::none
                   ? pass_total
                   : 2.0 * ag + exposed(rs, wgrad.qkv) + exposed(rs, wgrad.up);
    if (overlap == TpCommOverlap::full) {
      forward =
          exposed(ag, fwd.qkv) + exposed(ag, fwd.up) + exposed(rs, fwd.out) + exposed(rs, fwd.down);
      backward = exposed(ag, dgrad.out) + exposed(ag, dgrad.down) + exposed(rs, wgrad.qkv) +
                 exposed(rs, wgrad.up);
    }
  }
  out.total_s = (c.fwd_passes + 1.0) * pass_total;
  out.exposed_s = c.fwd_passes * forward + backward;
  out.forward_exposed = pass_total > 0 ? forward / pass_total : 1.0;
  out.backward_exposed = pass_total > 0 ? backward / pass_total : 1.0;
  return out;
}

LayerComm layer_comm(const ClusterContext& c, const RankCompute& compute) {
  LayerComm out;
  const int64_t t = c.t;
  const NetLevel level = c.placement.tensor;
  out.full_rows_bytes = c.T * c.d * c.B;
  out.routed_rows_bytes = c.b * c.k * c.d * c.B;
  // MoD's per-sequence top-k needs the router scores of the whole sequence:
  // an all-gather of b s fp32 scores per routed layer over the ranks holding
  // parts of it (the tensor group under SP, times the context group).
  out.score_group = (c.sp && t > 1 ? t : 1) * c.cp;
  out.score_level = c.cp > 1 ? c.placement.context : level;
  out.score_bytes = c.b * static_cast<double>(c.config.model.seq_len) * 4.0;
  out.score_one_s = c.comm(Collective::all_gather, out.score_bytes, out.score_group,
                           out.score_level, std::min<int64_t>(out.score_group, c.gpus_per_node));
  const double score_gather_s = out.score_group > 1 ? c.fwd_passes * out.score_one_s : 0.0;
  // Expert layers (docs/cluster.md "Expert parallelism"): per MoE layer and
  // micro-batch, beyond (or, for the FFN half under SP, instead of) the dense
  // layer's tensor collectives: the dispatch and combine all-to-alls over EP
  // forward and backward (+ forward again when the MoE FFN is recomputed),
  // and with an expert tensor size etp > 1 the slots' all-gather and
  // reduce-scatter over ETP (Megatron-Core's alltoall dispatcher); under SP
  // (or t = 1) these replace the FFN's all-gather / reduce-scatter of the
  // tokens; without SP (etp = t) the layer keeps its tensor all-reduces.  The
  // all-gather dispatcher gathers the ETP x EP group's tokens instead.
  const auto moe_comm_s = [&](double rows, double tp_layer_s) {
    if (!c.config.moe.enabled()) {
      return 0.0;
    }
    double seconds = c.expert_sp_path ? -tp_layer_s / 2.0 : 0.0;
    if (c.allgather) {
      if (c.gather_ranks > 1) {
        seconds += (c.moe_passes + 1.0) *
                   (c.comm(Collective::all_gather, gather_bytes(c, rows), c.gather_ranks,
                           c.gather_group.level, c.gather_group.per_node) +
                    c.comm(Collective::reduce_scatter, gather_bytes(c, rows), c.gather_ranks,
                           c.gather_group.level, c.gather_group.per_node));
      }
      return seconds;
    }
    if (c.ep > 1) {
      seconds += (c.moe_passes + 1.0) * 2.0 *
                 c.comm(Collective::all_to_all, a2a_bytes(c, rows), c.ep, c.ep_group.level,
                        c.ep_group.per_node);
    }
    if (c.expert_sp_path && c.etp > 1) {
      seconds += (c.moe_passes + 1.0) *
                 (c.comm(Collective::all_gather, etp_bytes(c, rows), c.etp, c.etp_group.level,
                         c.etp_group.per_node) +
                  c.comm(Collective::reduce_scatter, etp_bytes(c, rows), c.etp,
                         c.etp_group.level, c.etp_group.per_node));
    }
    return seconds;
  };
  const TpLayerTime full = tp_layer_time(c, compute, out.full_rows_bytes, 1.0);
  const TpLayerTime routed =
      tp_layer_time(c, compute, out.routed_rows_bytes, c.s > 0 ? c.k / c.s : 1.0);
  out.ep_full_s = moe_comm_s(c.T, full.exposed_s);
  out.ep_routed_s = moe_comm_s(c.b * c.k, routed.exposed_s);
  // Per layer on the critical path: the tensor collectives (less what
  // parallel.tp_comm_overlap hides) and the ring's exposed part.
  out.ring_full =
      ring_time(c, c.T, compute.full_attention_forward_s, compute.full_attention_backward_s);
  out.ring_routed = ring_time(c, c.b * c.k, compute.routed_attention_forward_s,
                              compute.routed_attention_backward_s);
  out.tp_full_s = full.exposed_s + out.ring_full.exposed;
  out.tp_routed_s = routed.exposed_s + score_gather_s + out.ring_routed.exposed;
  out.tp_full_hidden_s = full.total_s - full.exposed_s;
  out.tp_routed_hidden_s = routed.total_s - routed.exposed_s;
  out.tp_forward_exposed = full.forward_exposed;
  out.tp_backward_exposed = full.backward_exposed;
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
  const int64_t rank_tokens = c.config.train.micro_batch * rank_seq_len(c.config);
  const int64_t tokens = c.sp ? rank_tokens / c.t : rank_tokens;
  const OpShape shape =
      OpShape::of(DepthReadPrefixDims{.tokens = tokens,
                                      .sources = block,
                                      .queries = 2 * block_layers * c.n_streams,
                                      .width = model.d_model,
                                      .streams = c.n_streams,
                                      .variant = static_cast<int64_t>(c.config.dar.variant)},
                  c.config.train.dtype);
  // The paper's prefix kernels run at their own rate (lowering.cpp fill:
  // every dar.* record's OpRecord::memory_efficiency).
  const bool prefix = c.config.dar.kernel == DarKernel::prefix;
  const double efficiency = prefix ? c.config.dar.prefix_memory_efficiency : 0.0;
  TimingModel::Source source = TimingModel::Source::roofline;
  const auto time_s = [&](const OpShape& op, Pass pass) {
    return c.timing.at_memory_efficiency_s(c.timing.op_time_s(op, pass, &source), op.kind,
                                           efficiency);
  };
  double seconds = time_s(shape, Pass::forward) + time_s(shape, Pass::backward);
  if (prefix) {
    // The packs of the paper's prefix kernels (lowering.cpp depth_read):
    // forward, rebuilt in the backward unless kept, and their gradients
    // folded back.
    const double pack_passes = c.config.dar.packs_kept() ? 1.0 : 2.0;
    const int64_t rows = block * c.n_streams * tokens;
    const DType dtype = c.config.train.dtype;
    const OpShape keys = OpShape::of(RmsnormDims{.rows = rows, .width = model.d_model}, dtype);
    const OpShape values = OpShape::of(GatherDims{.rows = rows, .width = model.d_model}, dtype);
    const OpShape values_grad =
        OpShape::of(ScatterAddDims{.rows = rows, .width = model.d_model}, dtype);
    // The read's second operand, the value pack (lowering.cpp
    // dar.prefix.value_pack): read forward, read + gradient written backward.
    const int64_t elements = rows * model.d_model;
    const OpShape operand =
        OpShape::of(ElementwiseDims{.elements = elements, .inputs = 1, .outputs = 0}, dtype);
    const OpShape operand_grad =
        OpShape::of(ElementwiseDims{.elements = elements, .inputs = 1, .outputs = 1}, dtype);
    seconds += time_s(operand, Pass::forward) + time_s(operand_grad, Pass::backward);
    seconds += pack_passes * time_s(keys, Pass::forward) + time_s(keys, Pass::backward) +
               pack_passes * time_s(values, Pass::forward) + time_s(values_grad, Pass::backward);
  }
  return seconds;
}

// dar_prefix_s() memoised in `compute` (the shape and the compute's layout
// fix it; every layout sharing the compute reads the same blocks).
double block_prefix_s(const ClusterContext& c, const RankCompute& compute, int64_t block) {
  std::vector<double>& memo = compute.dar_prefix_block_s;
  const size_t at = static_cast<size_t>(block - 1);
  if (memo.size() <= at) {
    memo.resize(at + 1, NAN);
  }
  if (std::isnan(memo[at])) {
    memo[at] = dar_prefix_s(c, block);
  }
  return memo[at];
}

// Each layer's time per micro-batch on the critical path: its compute and
// exposed tensor / context / expert communication, a DAR block's prefix read
// on the block's first layer, and the model's ends on the first and last
// layer (what the pipeline partition balances).
std::vector<double> layer_costs(const ClusterContext& c, const RankCompute& compute,
                                const LayerComm& comm) {
  std::vector<double> partition_cost(static_cast<size_t>(c.L));
  for (int64_t l = 0; l < c.L; ++l) {
    const bool routed = c.config.mod.is_routed(l);
    double cost =
        routed ? compute.routed_layer_s + comm.tp_routed_s : compute.full_layer_s + comm.tp_full_s;
    if (c.config.moe.is_moe_layer(l)) {
      cost += routed ? comm.ep_routed_s : comm.ep_full_s;
    }
    if (c.depth && l % c.K == 0) {
      cost += block_prefix_s(c, compute, l / c.K + 1);
    }
    partition_cost[static_cast<size_t>(l)] = cost;
  }
  partition_cost.front() += compute.first_s + comm.tp_ends_s / 2.0;
  partition_cost.back() += compute.last_s + comm.tp_ends_s / 2.0;
  return partition_cost;
}

// The layers of each of the p v chunks: balanced by time (memoised in
// `compute`: the layer costs depend on the pipeline size through the expert
// groups' placement, so p keys the memo with the chunk count), or equal
// counts.
std::vector<int64_t> pipeline_chunks(const ClusterContext& c, const RankCompute& compute,
                                     const LayerComm& comm) {
  if (!c.par.balance_stages || c.chunks <= 1) {
    return equal_chunks(c.L, c.chunks);
  }
  for (const RankCompute::Split& split : compute.balanced_splits) {
    if (split.chunks == c.chunks && split.pipeline == c.p &&
        split.gpus_per_node == c.gpus_per_node && split.tp_comm_overlap == c.par.tp_comm_overlap) {
      return split.sizes;
    }
  }
  std::vector<int64_t> sizes = balanced_partition(layer_costs(c, compute, comm), c.chunks);
  compute.balanced_splits.push_back({c.chunks, c.p, c.gpus_per_node, c.par.tp_comm_overlap, sizes});
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
      out.overlapped_comm_s += c.m * (routed ? comm.tp_routed_hidden_s : comm.tp_full_hidden_s);
      if (c.config.moe.is_moe_layer(l)) {
        stage.exposed_comm_s += routed ? comm.ep_routed_s : comm.ep_full_s;
        stage.moe_layers_here += routed ? 0 : 1;
        stage.moe_routed_layers_here += routed ? 1 : 0;
      }
      stage.routed_layers += routed ? 1 : 0;
      if (c.depth && l % c.K == 0) {
        stage.compute_s += block_prefix_s(c, compute, l / c.K + 1);
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
    // Megatron-LM's scatter / gather (Narayanan et al. 2021, section 4.1):
    // without SP every tensor rank holds the whole activation, sends 1 / t of
    // it, and the receiving tensor group all-gathers the t pieces over NVLink
    // before using it (forward on the next stage, the gradient backward here).
    const double gather = c.t > 1 && !c.sp
                              ? c.comm(Collective::all_gather, send * static_cast<double>(c.t), c.t,
                                       c.placement.tensor, c.tp_per_node)
                              : 0.0;
    stage.exposed_comm_s += one + gather;
    out.stages[static_cast<size_t>((chunk + 1) % p)].exposed_comm_s += one + gather;
    out.comm.push_back({Collective::send_recv, "pp.activation", "pipeline", Pass::forward, 2,
                        c.placement.pipeline, send, 0.0, one, 1.0});
    if (gather > 0.0) {
      out.comm.push_back({Collective::all_gather, "pp.gather", "tensor", Pass::forward, c.t,
                          c.placement.tensor, send * static_cast<double>(c.t), 0.0, gather, 1.0});
    }
  }
  out.bank_send_bytes_uncached = uncached_bytes_total;
  out.bank_send_bytes_cached = cached_bytes_total;
  out.mod_score_gather_bytes =
      comm.score_group > 1 ? comm.score_bytes * static_cast<double>(c.counts.routed_layers) : 0.0;
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
  double grad_norm = 0.0;         // the slowest stage's norm pass + the norm's all-reduce
  double zero3_gather_one = 0.0;  // one layer's ZeRO-3 all-gather
};

// The exposed part of one stage's `reductions` gradient reductions per step
// (reduce_s each).  Each hides behind its micro-batch's compute (compute_s),
// the last behind the backward only (about 2/3 of forward + backward) and
// never its last bucket.  Under ZeRO 3 with overlapped gathers the
// reductions share the data-parallel channel with the layers' all-gathers
// (gathers_s per micro-batch, half of them in the backward): PyTorch FSDP
// issues both on one NCCL process group, which runs its collectives one
// after another (Zhao et al. 2023, arXiv 2304.11277, section 3.3, why FSDP
// prefetches the next all-gather ahead of the current reduce-scatter), and
// both cross the same links.  So a window hides the gathers first and the
// reduction only in what they leave of it; without gathers this is
// max(0, reduce_s - window).
double exposed_reduction_s(double reduce_s, double reductions, double compute_s, double gathers_s,
                           double last_bucket_share) {
  const auto beyond = [reduce_s](double window_s, double gathers_in_window_s) {
    return std::max(0.0, gathers_in_window_s + reduce_s - window_s) -
           std::max(0.0, gathers_in_window_s - window_s);
  };
  const double backward_s = compute_s * (2.0 / 3.0);
  return (reductions - 1.0) * beyond(compute_s, gathers_s) +
         std::max(beyond(backward_s, gathers_s / 2.0), last_bucket_share * reduce_s);
}

StepParts stage_data_parallel(const ClusterContext& c, const LayerComm& comm,
                              const StageMemoryModel& memory, ClusterEstimate& out) {
  const ParallelConfig& par = c.par;
  // The gradients (and ZeRO's shards) span the data-parallel ranks with
  // their context ranks.
  const int64_t dp = c.grad_ranks;
  const NetLevel data_level = c.grad_level;
  StepParts parts;
  if (par.zero == 3) {
    parts.zero3_gather_one =
        c.comm(Collective::all_gather, memory.layer_param_bytes(), dp, data_level, c.dp_per_node);
  }
  // The main gradients as reduced (memory keeps fp32: the fp16 path's copy
  // into fp32 exists at the optimizer step).
  const double grad_bytes_per_param = detail::main_grad_bytes_per_param(c.config);
  double worst_peak = -1.0;
  for (int64_t i = 0; i < c.p; ++i) {
    StageSummary& stage = out.stages[static_cast<size_t>(i)];
    stage.params = memory.stage_params(i, stage.layers);
    parts.overlapped += (comm.ring_full.overlapped *
                             static_cast<double>(stage.layers - stage.routed_layers) +
                         comm.ring_routed.overlapped * static_cast<double>(stage.routed_layers)) *
                        c.m;
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
    // shard's over the expert-data-parallel ranks holding the same experts).
    const double grad_bytes = stage.params * grad_bytes_per_param;
    const double expert_stage_params = memory.expert_stage_params(stage.layers);
    const double dense_stage_params = stage.params - expert_stage_params;
    const int64_t expert_dp = c.expert_dp;
    const Collective reduce = par.zero == 0 ? Collective::all_reduce : Collective::reduce_scatter;
    double reduce_s = 0.0, gather_s = 0.0;
    if (dp > 1) {
      reduce_s = c.comm(reduce, dense_stage_params * grad_bytes_per_param, dp, data_level,
                        c.dp_per_node);
      if (par.zero == 1 || par.zero == 2) {
        gather_s = c.comm(Collective::all_gather, dense_stage_params * c.B, dp, data_level,
                          c.dp_per_node);
      }
    }
    if (expert_dp > 1 && expert_stage_params > 0) {
      reduce_s += c.comm(reduce, expert_stage_params * grad_bytes_per_param, expert_dp,
                         c.edp_group.level, c.edp_group.per_node);
      if (par.zero == 1 || par.zero == 2) {
        gather_s += c.comm(Collective::all_gather, expert_stage_params * c.B, expert_dp,
                           c.edp_group.level, c.edp_group.per_node);
      }
    }
    // Megatron-Core buckets: max(40M, 1M x dp) parameters (dp: the gradient
    // group, with the context ranks); the last bucket reduces after the
    // backward ends.
    const double bucket_params = std::max(40e6, 1e6 * static_cast<double>(dp));
    const double last_bucket_share = std::min(1.0, bucket_params / std::max(stage.params, 1.0));
    // ZeRO 2 and 3 keep only their shard of the gradients, so every
    // micro-batch's backward reduce-scatters its gradients (DeepSpeed: "gradient
    // reduction is required after every backward because of gradient
    // partitioning", deepspeedai/DeepSpeed#2252); ZeRO 0 / 1 accumulate the
    // full gradients and reduce once per step.
    const double reductions = par.zero >= 2 ? c.m : 1.0;
    double exposed_reduce = reductions * reduce_s;
    if (par.overlap_grad_reduce) {
      // ZeRO 3's overlapped layer gathers ride the same data-parallel channel.
      const double gathers_s =
          par.zero == 3 && par.overlap_param_gather
              ? 2.0 * parts.zero3_gather_one * static_cast<double>(stage.layers)
              : 0.0;
      exposed_reduce =
          exposed_reduction_s(reduce_s, reductions, stage.compute_s, gathers_s, last_bucket_share);
    }
    double exposed_gather = gather_s;
    if (par.overlap_param_gather) {
      exposed_gather = last_bucket_share * gather_s;  // the first bucket before the forward
    }
    parts.overlapped += (reductions * reduce_s - exposed_reduce) + (gather_s - exposed_gather);
    parts.grad_exposed = std::max(parts.grad_exposed, exposed_reduce);
    parts.gather_exposed = std::max(parts.gather_exposed, exposed_gather);
    if (i == 0 && (dp > 1 || (expert_dp > 1 && expert_stage_params > 0))) {
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
    // The gradient norm over this rank's main gradients (ZeRO >= 1: its shard).
    parts.grad_norm = std::max(
        parts.grad_norm,
        detail::grad_norm_time_s(stage.params / static_cast<double>(par.zero >= 1 ? dp : 1),
                                 c.config, c.timing.rates()));
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

// The expert layers' communication records (the first stage's view, per step).
void add_expert_records(const ClusterContext& c, const StageSummary& first, ClusterEstimate& out) {
  if (!c.config.moe.enabled() || first.moe_layers_here <= 0) {
    return;
  }
  const double layers = static_cast<double>(first.moe_layers_here) * c.m;
  if (c.allgather) {
    if (c.gather_ranks <= 1) {
      return;
    }
    const double bytes = gather_bytes(c, c.T);
    const GroupPlace& g = c.gather_group;
    const double ag = c.comm(Collective::all_gather, bytes, c.gather_ranks, g.level, g.per_node);
    const double rs =
        c.comm(Collective::reduce_scatter, bytes, c.gather_ranks, g.level, g.per_node);
    for (const Pass pass : {Pass::forward, Pass::backward}) {
      const double count = pass == Pass::forward ? layers * c.moe_passes : layers;
      out.comm.push_back({Collective::all_gather, "ep.token_gather", "expert", pass,
                          c.gather_ranks, g.level, bytes, count, ag, 1.0});
      out.comm.push_back({Collective::reduce_scatter, "ep.token_gather", "expert", pass,
                          c.gather_ranks, g.level, bytes, count, rs, 1.0});
    }
    return;
  }
  if (c.ep > 1) {
    const double bytes = a2a_bytes(c, c.T);
    const GroupPlace& g = c.ep_group;
    const double one = c.comm(Collective::all_to_all, bytes, c.ep, g.level, g.per_node);
    out.comm.push_back({Collective::all_to_all, "ep.dispatch_combine", "expert", Pass::forward,
                        c.ep, g.level, bytes, 2.0 * layers * c.moe_passes, one, 1.0});
    out.comm.push_back({Collective::all_to_all, "ep.dispatch_combine", "expert", Pass::backward,
                        c.ep, g.level, bytes, 2.0 * layers, one, 1.0});
  }
  if (c.expert_sp_path && c.etp > 1) {
    const double bytes = etp_bytes(c, c.T);
    const GroupPlace& g = c.etp_group;
    const double ag = c.comm(Collective::all_gather, bytes, c.etp, g.level, g.per_node);
    const double rs = c.comm(Collective::reduce_scatter, bytes, c.etp, g.level, g.per_node);
    for (const Pass pass : {Pass::forward, Pass::backward}) {
      const double count = pass == Pass::forward ? layers * c.moe_passes : layers;
      out.comm.push_back({Collective::all_gather, "etp.slots", "expert_tensor", pass, c.etp,
                          g.level, bytes, count, ag, 1.0});
      out.comm.push_back({Collective::reduce_scatter, "etp.slots", "expert_tensor", pass, c.etp,
                          g.level, bytes, count, rs, 1.0});
    }
  }
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
                          bytes, per_pass * c.fwd_passes, ag, comm.tp_forward_exposed});
      out.comm.push_back({Collective::reduce_scatter, label, "tensor", Pass::forward, t,
                          tensor_level, bytes, per_pass * c.fwd_passes, rs,
                          comm.tp_forward_exposed});
      out.comm.push_back({Collective::all_gather, label, "tensor", Pass::backward, t, tensor_level,
                          bytes, per_pass, ag, comm.tp_backward_exposed});
      out.comm.push_back({Collective::reduce_scatter, label, "tensor", Pass::backward, t,
                          tensor_level, bytes, per_pass, rs, comm.tp_backward_exposed});
    } else {
      const double ar = c.comm(Collective::all_reduce, bytes, t, tensor_level, c.tp_per_node);
      out.comm.push_back({Collective::all_reduce, label, "tensor", Pass::forward, t, tensor_level,
                          bytes, per_pass * c.fwd_passes, ar, comm.tp_forward_exposed});
      out.comm.push_back({Collective::all_reduce, label, "tensor", Pass::backward, t, tensor_level,
                          bytes, per_pass, ar, comm.tp_backward_exposed});
    }
  };
  if (t > 1) {
    // MoE layers on the SP path keep only the attention's pair (the FFN's
    // tokens go through the expert dispatch instead).
    const double moe_half = c.expert_sp_path ? 0.5 : 0.0;
    add_tp("tp.layer", comm.full_rows_bytes,
           stage_full_layers - moe_half * static_cast<double>(first.moe_layers_here));
    add_tp("tp.routed_layer", comm.routed_rows_bytes,
           stage_routed_layers - moe_half * static_cast<double>(first.moe_routed_layers_here));
  }
  if (comm.score_group > 1 && stage_routed_layers > 0) {
    out.comm.push_back({Collective::all_gather, "tp.mod_router_scores",
                        c.cp > 1 ? "context" : "tensor", Pass::forward, comm.score_group,
                        comm.score_level, comm.score_bytes,
                        stage_routed_layers * c.m * c.fwd_passes, comm.score_one_s, 1.0});
  }
  if (c.cp > 1) {
    const auto add_ring = [&](const char* label, const RingTime& ring, double layers) {
      if (layers <= 0) {
        return;
      }
      const double steps = static_cast<double>(c.cp - 1) * layers * c.m;
      const double total = steps * (c.ring_passes * ring.forward_one + ring.backward_one);
      const double share = total > 0 ? ring.exposed * layers * c.m / total : 0.0;
      out.comm.push_back({Collective::send_recv, label, "context", Pass::forward, 2,
                          c.placement.context, ring.block, steps * c.ring_passes,
                          ring.forward_one, share});
      out.comm.push_back({Collective::send_recv, label, "context", Pass::backward, 2,
                          c.placement.context, 2.0 * ring.block, steps, ring.backward_one, share});
    };
    add_ring("cp.kv", comm.ring_full, stage_full_layers);
    add_ring("cp.kv_routed", comm.ring_routed, stage_routed_layers);
  }
  add_expert_records(c, first, out);
  if (c.par.zero == 3 && c.grad_ranks > 1) {
    out.comm.push_back({Collective::all_gather, "zero3.param_gather", "data", Pass::forward,
                        c.grad_ranks, c.grad_level, memory.layer_param_bytes(),
                        2.0 * static_cast<double>(first.layers) * c.m, zero3_gather_one,
                        c.par.overlap_param_gather ? 0.0 : 1.0});
  }
  // Pipeline sends (and their scatter / gather all-gathers) are listed once
  // per boundary; per step: forward and backward of m micro-batches.
  for (CommRecord& record : out.comm) {
    if (std::strncmp(record.label, "pp.", 3) == 0) {
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
  if (!compute.matches(config)) {
    throw std::logic_error("estimate_cluster: the rank compute was lowered for another layout");
  }
  const ClusterContext c(config, timing);
  ClusterEstimate out;
  fill_layout(c, out);
  out.dar_replicated_s = (c.t > 1 && !c.sp) ? compute.all_depth_reads_s * (1.0 - 1.0 / c.t) : 0.0;
  const LayerComm comm = layer_comm(c, compute);
  const std::vector<int64_t> chunk_sizes = pipeline_chunks(c, compute, comm);
  const StageMemoryModel memory(config, timing.profile(), base.params);
  assemble_stages(c, compute, comm, chunk_sizes, memory, out);
  const StepParts parts = stage_data_parallel(c, comm, memory, out);
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
  // The squared norms of every model-parallel rank (and, sharded, every
  // data-parallel one) summed by one 4-byte all-reduce (latency-bound).
  const int64_t norm_ranks = c.t * c.p * (c.par.zero >= 1 ? c.dp : 1);
  const NetLevel norm_level =
      norm_ranks <= c.gpus_per_node ? NetLevel::intra_node : NetLevel::inter_node;
  out.grad_norm_s = parts.grad_norm + c.comm(Collective::all_reduce, 4.0, norm_ranks, norm_level,
                                             std::min<int64_t>(norm_ranks, c.gpus_per_node));
  out.exposed_comm_s = c.m * slow.exposed_comm_s + parts.grad_exposed + parts.gather_exposed;
  out.overlapped_comm_s += parts.overlapped;
  out.step_overhead_s = c.kernel.step_overhead_s;
  out.step_s = ideal + out.bubble_s + parts.grad_exposed + parts.gather_exposed + parts.optimizer +
               out.grad_norm_s + out.step_overhead_s;
  return out;
}

double cluster_step_lower_bound(const Config& config, const TimingModel& timing,
                                const RankCompute& compute) {
  if (!compute.matches(config)) {
    throw std::logic_error(
        "cluster_step_lower_bound: the rank compute was lowered for another layout");
  }
  const ClusterContext c(config, timing);
  // The slowest stage holds at least the average share of the layers' time
  // (and every stage its host time per micro-batch); the step adds the
  // bubble of that and the host time per step.  What it leaves out (pipeline
  // sends, gradient accumulation, ZeRO-3 gathers, the data-parallel reduce
  // and the optimizer) is never negative.  The layers' sums are memoised in
  // `compute` (layouts differing in ZeRO, micro-batch count or interleaving
  // share them): all of them, and the ceil(L / p) cheapest (no stage holding
  // that many layers is faster).
  const int64_t most_layers = (c.L + c.p - 1) / c.p;  // some stage holds as many
  auto memo = std::find_if(compute.layer_cost_sums.begin(), compute.layer_cost_sums.end(),
                           [&c](const RankCompute::LayerCostSum& s) {
                             return s.pipeline == c.p && s.data == c.dp &&
                                    s.gpus_per_node == c.gpus_per_node &&
                                    s.tp_comm_overlap == c.par.tp_comm_overlap;
                           });
  if (memo == compute.layer_cost_sums.end()) {
    std::vector<double> costs = layer_costs(c, compute, layer_comm(c, compute));
    RankCompute::LayerCostSum sums{c.p, c.dp, c.gpus_per_node, c.par.tp_comm_overlap};
    sums.seconds = std::accumulate(costs.begin(), costs.end(), 0.0);
    std::nth_element(costs.begin(), costs.begin() + (most_layers - 1), costs.end());
    sums.cheapest_stage_s = std::accumulate(costs.begin(), costs.begin() + most_layers, 0.0);
    const StageMemoryModel memory(config, timing.profile(), detail::closed_form_params(config));
    sums.layer_param_bytes = memory.layer_param_bytes();
    sums.stage_dense_params = INFINITY;
    for (const int64_t stage : {int64_t{0}, std::min<int64_t>(1, c.p - 1), memory.last_stage()}) {
      sums.stage_dense_params =
          std::min(sums.stage_dense_params, memory.stage_params(stage, most_layers) -
                                                memory.expert_stage_params(most_layers));
    }
    compute.layer_cost_sums.push_back(sums);
    memo = compute.layer_cost_sums.end() - 1;
  }
  const double slowest = memo->seconds / static_cast<double>(c.p) + c.kernel.micro_batch_overhead_s;
  const double ideal = c.m * slowest;
  const double bubble =
      c.p > 1 ? ideal * static_cast<double>(c.p - 1) / (static_cast<double>(c.v) * c.m) : 0.0;
  const ParallelConfig& par = c.par;
  if (!par.overlap_grad_reduce || c.grad_ranks <= 1) {
    return ideal + bubble + c.kernel.step_overhead_s;
  }
  // The data-parallel gradient reduction overlapped with the backward
  // (stage_data_parallel, exposed_reduction_s): R reductions per step (r
  // each; the dense parameters', the experts' only add), R = m under ZeRO 2
  // and 3 (one per micro-batch), else 1, sharing the data-parallel channel
  // with ZeRO 3's overlapped layer gathers (G per micro-batch; else G = 0).
  // With W the stage's compute, X its exposed traffic (tensor, expert,
  // pipeline) and A its further time per micro-batch (gradient accumulation,
  // host), C = W + A, estimate_cluster's stage takes A + X + max(W, G) >=
  // X + max(C, G) per micro-batch; with each of the first R - 1 reductions'
  // exposed max(0, G + r - C) - max(0, G - C) that is X + max(C, G + r).
  // The last reduction hides behind the last backward (2C / 3, half of the
  // gathers in it): with its micro-batch X + max(C, C / 3 + G / 2 + r) if
  // G / 2 <= 2C / 3, else X + max(C, G) + r, which is no less.  The step
  // holds m of the slowest stage's micro-batches (no faster than this
  // stage's), the bubble and the largest stage's exposed reduction; the
  // terms are non-decreasing in C, X, G and r.  The stage: one holding
  // ceil(L / p) layers or more, X + C at least their cheapest costs + host,
  // its parameters at least a middle (or end) stage's of that many layers.
  // (The sizes come from the memo: a stage's parameters depend on the
  // pipeline size, its last stage p - 1 whatever the interleaving.)
  const double stage_s =
      (c.p == 1 ? memo->seconds : memo->cheapest_stage_s) + c.kernel.micro_batch_overhead_s;
  const double gathers = par.zero == 3 && par.overlap_param_gather
                             ? 2.0 * static_cast<double>(most_layers) *
                                   c.comm(Collective::all_gather, memo->layer_param_bytes,
                                          c.grad_ranks, c.grad_level, c.dp_per_node)
                             : 0.0;
  const double dense_params = memo->stage_dense_params;
  const double reduce = c.comm(par.zero == 0 ? Collective::all_reduce : Collective::reduce_scatter,
                               dense_params * detail::main_grad_bytes_per_param(config),
                               c.grad_ranks, c.grad_level, c.dp_per_node);
  const double reductions = par.zero >= 2 ? c.m : 1.0;
  const double channel = (c.m - reductions) * stage_s +
                         (reductions - 1.0) * std::max(stage_s, gathers + reduce) +
                         std::max(stage_s, stage_s / 3.0 + gathers / 2.0 + reduce);
  return std::max(ideal, channel) + bubble + c.kernel.step_overhead_s;
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
    const std::vector<int64_t> sizes = chunks == 1 ? std::vector<int64_t>{L} : equal_chunks(L, chunks);
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
      out.peak = std::max(out.peak, model.memory(i, layers[k], routed[k], end[k], moe_full[k],
                                                 moe_routed[k]).peak);
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
    bound = std::max(bound, a + std::min(c * static_cast<double>(v),
                                         c * static_cast<double>(most)));
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
