// Memory per device over one step (docs/cost_model.md; Korthikanti et al. 2022, Table 2).
//
// Training (bytes; B = bytes per element of train.dtype, T = micro_batch x
// seq_len, R = micro_batch x k for routed layers):
//   weights      P x B
//   gradients    P x 4                 (fp32 gradient accumulation, Megatron main_grad)
//   optimizer    P x 12 (bf16/fp16: fp32 master + m + v) or P x 8 (fp32: m + v)
//   activations  saved for backward, per layer with rows r (r = T, or R routed):
//                  none:      B r (4d + (H+2G)d_h + H d_h + u + d_ff) + 8 r + 4 b H s_eff
//                  selective: B r (2d + (H+2G)d_h + H d_h + u)        + 8 r + 4 b H s_eff
//                  full:      B T d (the layer input only)
//                where u = d_ff (GELU) or 2 d_ff (SwiGLU); the elements are: norm
//                inputs and outputs of both branches (4d), Q K V, the attention
//                output, the up projection, the activation output; 8 r = two fp32
//                rstd; 4 b H s_eff = the fp32 softmax log-sum-exp (FlashAttention
//                stores no s x s matrix).  Selective recompute re-runs the norms
//                and the activation.  Routed layers also keep their input x (B T d,
//                for the router gradient) and delta (B R d, for dg).  Plus the
//                head's final-norm input and output (2 B T d + 4 T) and token ids.
//                AttnRes / DAR: R and the phase-1 outputs are recomputed from
//                the bank and the lse (dar.kernel = fused; prefix: dar_retained).
//   dar_partials P^{i-1} and its fp32 rstd for each branch at block position
//                i >= 2, per stream ((2L - N) n T (d B + 4); docs/dar_math.md 5.5).
//   dar_branch_outputs  DAR only: each branch's output y (2 L B T d) for d beta.
//   router_buffers  per routed layer fp32 logits (4 T), int32 index + fp32 g (8 R),
//                predictor hidden activations (B T hidden).
//   dar_bank     (N+1) n T d B bank + (N+1) n T 4 rstd + fp32 scalars per token
//                for each of the 2L + 1 reads (branches and output): lse (n), and
//                for DAR alpha, beta and the coefficient-head rstd (2n + 1), plus
//                the transport parameters m at the 2L - N branches with i >= 1
//                (docs/dar_math.md 4.4, 5.5).
//   dar_retained dar.kernel = prefix (the DAR paper's prefix kernels, docs/moe.md):
//                fp32 logits and shifted scores (2 x 4 B per query-source pair and
//                stream) and the retrieved state of each of the 2L + 1 reads' n
//                queries (n T d B each; AttnRes: 2L - N, its first-in-block
//                and output reads' states are the saved branch / final-norm
//                inputs), kept instead of recomputed; its block
//                backward holds the rebuilt packed keys and values of <= N
//                sources and their gradients (4 N n T d B; 2 N n T d B when the
//                packs are kept) and no recomputed retrieved states (workspace).
//   dar_packs    dar.kernel = prefix with the packs kept (DarConfig::packs_kept;
//                dar.packs = paper: AttnRes): every read's packed normalised
//                keys and values, 2 (N (N+1)/2 + N + 1) n T d B (docs/moe.md).
//   workspace    the largest transient alive while every saved activation is:
//                max(head: T V (B + 4) logits and fp32 loss gradient,
//                    one layer's backward: 2 B T d residual gradients + the widest
//                    intermediate gradient + recomputed activations of one layer
//                    (full: all of them; selective: norms and activation) + DAR's
//                    block backward: the bank gradient (N+1) n T d B, the block's
//                    d o-bar and d lse S n T (d B + 4), its recomputed phase-1
//                    outputs S n T d B, dP^i and dP^{i-1}, one branch's R and dR
//                    (4 n T d B); docs/dar_math.md 5.4).
//   peak         weights + gradients + optimizer + activations + router_buffers +
//                dar_bank + dar_partials + dar_branch_outputs + dar_retained + dar_packs +
//                workspace.  Every
//                saved activation is alive from the forward/backward boundary (the head's
//                transients) to the backward of the last layer / DAR block (that layer's
//                transients), so the step's peak is at one of the two; the max picks it.
// Experts (docs/model.md experts), per MoE layer on r rows with S = moe_slots(r) expert
// slots, u_e = expert up width (SwiGLU 2 f_e), f_e = moe.expert_ffn:
//   activations  the dense FFN's (u + d_ff) B r are replaced by the slots'
//                permuted input and expert output (2 d), up output (u_e) and
//                activation output (f_e; selective: recomputed) B S, plus the
//                shared experts' up and activation outputs on r rows;
//   router_buffers  fp32 router probabilities (4 r (E + Z), for the aux and
//                z losses), int32 index + fp32 gate per choice (8 r k) and the
//                permutation map (4 S);
//   workspace    a layer's backward also holds the slots' gradients in and out
//                (2 B S d) and the widest slot intermediate (B S u_e).
// Under expert parallelism (parallel.cpp) the weights, gradients and
// optimizer states of the routed experts are divided by EP.
// Decode: weights, the KV cache (2 G d_h B per cached token per layer; routed
// layers cache only their k routed tokens per sequence), the bank of the
// current token, and one layer's activations plus fp32 logits as workspace.
#include <algorithm>

#include "cost_model_internal.hpp"

namespace modar {
namespace detail {

double saved_bytes_per_score(const Config& config) {
  const double B = static_cast<double>(dtype_bytes(config.train.dtype));
  return config.train.attention_dropout > 0.0 ? 2.0 * B + kDropoutMaskBytes : B;
}

double hidden_dropout_mask_bytes_per_row(const Config& config) {
  return config.train.hidden_dropout > 0.0
             ? 2.0 * kDropoutMaskBytes * static_cast<double>(config.model.d_model)
             : 0.0;
}

double layer_saved_bytes(const Config& config, double rows, double sequence_len,
                         const LayerShare& share, const RecomputePlan& plan) {
  const ModelConfig& m = config.model;
  const double B = static_cast<double>(dtype_bytes(config.train.dtype));
  const double b = static_cast<double>(config.train.micro_batch);
  const double d = static_cast<double>(m.d_model);
  const auto [heads, kv_heads, d_head, d_ff, up, qkv] = layer_widths(m);
  // QK-norm: the normalised Q and K are what attention reads; the norm's
  // backward also needs its inputs (dropped when the norms are recomputed).
  const double qk_norm_inputs = m.qk_norm != QkNorm::none ? (heads + kv_heads) * d_head : 0.0;
  const bool unfused = config.train.attention_kernel == AttentionKernel::unfused;
  // Whole d_model rows: the norms' inputs (and outputs unless recomputed),
  // their fp32 rstd, the hidden-dropout masks.
  const double replicated = (plan.norms ? 2.0 : 4.0) * d * B * rows + 8.0 * rows +
                            hidden_dropout_mask_bytes_per_row(config) * rows;
  // Split by the tensor size: Q K V (and the QK-norm inputs), the attention
  // output, the MLP's up projection and activation output (each dropped when
  // its module is recomputed), the softmax statistics (FlashAttention's fp32
  // log-sum-exp) or the unfused kernel's saved scores (dropped with core
  // attention).
  double split = (qkv + (plan.norms ? 0.0 : qk_norm_inputs) + heads * d_head +
                  (plan.mlp ? 0.0 : up) + (plan.mlp_activation ? 0.0 : d_ff)) *
                 B * rows;
  if (!plan.core_attention) {
    split += unfused ? saved_bytes_per_score(config) * b * heads * sequence_len * sequence_len
                     : 4.0 * b * heads * sequence_len;
  }
  return replicated * share.tokens + split / share.tensor;
}

double dar_prefix_retained_bytes(const Config& config, double tokens) {
  if (!config.dar.enabled() || config.dar.kernel != DarKernel::prefix) {
    return 0.0;
  }
  const LayerCounts counts = layer_counts(config);
  const int64_t layers = config.model.n_layers;
  const int64_t K = config.dar.block_layers;
  const int64_t N = counts.dar_blocks;
  const double n = static_cast<double>(counts.dar_streams);
  const double B = static_cast<double>(dtype_bytes(config.train.dtype));
  const double width = static_cast<double>(config.model.d_model);
  // (query, source) pairs per stream: block b's phase-1 read has 2 K_b
  // queries over b sources (H_0..H_{b-1}); every branch at block position
  // i >= 2 merges one partial; the output read has one query over N + 1.
  double pairs = 0.0;
  for (int64_t b = 1; b <= N; ++b) {
    const int64_t block_layers = std::min<int64_t>(K, layers - (b - 1) * K);
    pairs += 2.0 * static_cast<double>(block_layers * b);
  }
  pairs += static_cast<double>(2 * layers - N) + static_cast<double>(N + 1);
  // Logits and shifted scores (fp32) per pair and stream; the retrieved
  // state (activation dtype) of each phase-1 query and of the output read.
  // With one stream (AttnRes) the retrieved state of a block's first branch
  // and of the output read IS the branch input / the final norm's input
  // (h = o-bar, no merge, no stream mix), which the branch already saves
  // (activations): those N + 1 are not kept twice.  With n >= 2 the branch
  // input is the alpha-mix of the streams, a separate tensor.
  const double logits = 2.0 * 4.0 * pairs * n * tokens;
  const int64_t retrieved_reads = 2 * layers + 1 - (counts.dar_streams == 1 ? N + 1 : 0);
  const double retrieved = static_cast<double>(retrieved_reads) * n * tokens * width * B;
  return logits + retrieved;
}

namespace {

// The sizes the depth-read memory terms are written in: N blocks, n streams,
// B bytes per activation element, the width d.
struct DarSizes {
  double N, n, B, width;
};

DarSizes dar_sizes(const Config& config) {
  const LayerCounts counts = layer_counts(config);
  return {static_cast<double>(counts.dar_blocks), static_cast<double>(counts.dar_streams),
          static_cast<double>(dtype_bytes(config.train.dtype)),
          static_cast<double>(config.model.d_model)};
}

}  // namespace

double dar_block_backward_bytes(const Config& config, double tokens) {
  if (!config.dar.enabled()) {
    return 0.0;
  }
  const auto [N, n, B, width] = dar_sizes(config);
  const double T = tokens;
  // The backward of a block (docs/dar_math.md 5.4) holds: the bank gradient dH
  // ((N+1) n T d), the block's phase-1 gradients d o-bar and d lse (S n T (d B
  // + 4), consumed by the prefix backward after the block), its phase-1
  // outputs o-bar recomputed from the bank and the saved lse (S n T d),
  // dP^i and dP^{i-1} (2 n T d), and one branch's recomputed R and dR
  // (2 n T d).  This exceeds the forward's transients (the live partial and
  // one block's phase-1 outputs).
  const double branches_per_block = static_cast<double>(config.dar.branches_per_block());
  double bytes = (N + 1.0) * n * T * width * B +
                 branches_per_block * n * T * (2.0 * width * B + 4.0) + 4.0 * n * T * width * B;
  if (config.dar.kernel == DarKernel::prefix) {
    // The paper's prefix kernels keep the retrieved states (no recompute:
    // S n T d fewer), rebuild the packed keys and values of the block's
    // sources (at most N entries) and hold their gradients: 4 N n T d.
    // Kept packs (dar_packs) are not rebuilt: only their gradients.
    const double pack_tensors = config.dar.packs_kept() ? 2.0 : 4.0;
    bytes += pack_tensors * N * n * T * width * B - branches_per_block * n * T * width * B;
  }
  return bytes;
}

double dar_kept_packs_bytes(const Config& config, double tokens) {
  if (!config.dar.packs_kept()) {
    return 0.0;
  }
  const auto [N, n, B, width] = dar_sizes(config);
  // Entries packed per stream (lowering.cpp depth_read): block b's prefix
  // read packs H_0..H_{b-1} (N (N + 1) / 2 over the blocks), the output read
  // H_0..H_N; each as a normalised key view and a value, n T d each.
  const double entries = N * (N + 1.0) / 2.0 + N + 1.0;
  return 2.0 * entries * n * tokens * width * B;
}

DarMergeSaved dar_merge_saved_bytes(double layers, double blocks, int64_t streams, double tokens,
                                    double width, double dtype_bytes) {
  // P^{i-1} and its fp32 rstd for every branch at block position i >= 2
  // (the merge backward reads the partial's keys and values; docs/dar_math.md 5.5
  // stores it rather than inverting M).  DAR also keeps each branch's
  // output y for d beta = <dP, y>; AttnRes has no beta and needs no y.
  DarMergeSaved saved;
  const double branches_after_first = 2.0 * layers - blocks;
  saved.partials =
      branches_after_first * static_cast<double>(streams) * tokens * (width * dtype_bytes + 4.0);
  if (streams >= 2) {
    saved.branch_outputs = 2.0 * layers * dtype_bytes * tokens * width;
  }
  return saved;
}

MemoryBreakdown memory_from_params(const Config& config, double total_params,
                                   double device_memory_bytes, StepKind step) {
  const ModelConfig& m = config.model;
  const LayerCounts counts = layer_counts(config);
  const double B = static_cast<double>(dtype_bytes(config.train.dtype));
  const double width = static_cast<double>(m.d_model);
  const auto [heads, kv_heads, d_head, d_ff, up_width, qkv_width] = layer_widths(m);
  const double vocab = static_cast<double>(m.padded_vocab(config.parallel.tensor));
  const double b = static_cast<double>(config.train.micro_batch);
  const double s = static_cast<double>(m.seq_len);
  const double k = static_cast<double>(counts.routed_tokens_per_sequence);
  const double full_layers = static_cast<double>(counts.full_layers);
  const double routed_layers = static_cast<double>(counts.routed_layers);
  const double layers = static_cast<double>(m.n_layers);
  const double n = static_cast<double>(counts.dar_streams);
  const double blocks = static_cast<double>(counts.dar_blocks);
  const bool depth_reads = config.dar.enabled();

  MemoryBreakdown mem;
  mem.capacity = device_memory_bytes;
  mem.weights = total_params * B;

  if (step == StepKind::decode) {
    const double cache_per_token = 2.0 * kv_heads * d_head * B;
    mem.kv_cache = cache_per_token * b * (full_layers * s + routed_layers * k);
    if (depth_reads) {
      mem.dar_bank = (blocks + 1.0) * n * b * (width * B + 4.0);
    }
    mem.router_buffers = routed_layers * b * 8.0;
    mem.workspace = b * vocab * 4.0 + b * B * (4.0 * width + qkv_width + up_width + d_ff);
  } else {
    const double T = b * s;
    const double R = b * k;
    const bool low_precision = config.train.dtype != DType::fp32;
    mem.gradients = total_params * 4.0;
    mem.optimizer = total_params * (low_precision ? 12.0 : 8.0);

    const RecomputePlan plan = recompute_plan(config);
    auto layer_saved = [&](double rows, double sequence_len) {
      return layer_saved_bytes(config, rows, sequence_len, LayerShare{}, plan);
    };
    // MoE layers: what they save beyond (or instead of) the dense FFN's.
    const double moe_full = static_cast<double>(counts.moe_full_layers);
    const double moe_routed = static_cast<double>(counts.moe_routed_layers);
    const MoeConfig& e = config.moe;
    const double expert_ffn = e.enabled() ? static_cast<double>(e.resolved_expert_ffn(m)) : 0.0;
    const double expert_up = m.gated_mlp() ? 2.0 * expert_ffn : expert_ffn;
    auto moe_extra = [&](double rows) {
      return moe_saved_extra_bytes(config, rows, MoeRankShare{});
    };
    double activations = 0.0;
    if (plan.full) {
      activations += layers * B * T * width;
    } else {
      activations += full_layers * layer_saved(T, s);
      activations += routed_layers * (layer_saved(R, k) + B * T * width + B * R * width);
      if (e.enabled()) {
        activations += moe_full * moe_extra(T) + moe_routed * moe_extra(R);
      }
      if (depth_reads) {
        const DarMergeSaved saved =
            dar_merge_saved_bytes(layers, blocks, counts.dar_streams, T, width, B);
        mem.dar_partials = saved.partials;
        mem.dar_branch_outputs = saved.branch_outputs;
      }
    }
    activations += 2.0 * B * T * width + 4.0 * T + 4.0 * T;  // final norm in/out, rstd, token ids
    if (config.train.hidden_dropout > 0.0) {
      activations += T * width;  // the embedding dropout's 1-byte mask
    }
    mem.activations = activations;

    mem.router_buffers = routed_layers * (4.0 * T + 8.0 * R);
    auto moe_buffers = [&](double rows) { return moe_buffer_bytes(config, rows); };
    if (e.enabled()) {
      mem.router_buffers += moe_full * moe_buffers(T) + moe_routed * moe_buffers(R);
    }
    if (config.mod.causal_router == CausalRouter::predictor && !plan.full) {
      mem.router_buffers +=
          routed_layers * B * T * static_cast<double>(config.mod.predictor_hidden);
    }

    double dar_transient = 0.0;
    if (depth_reads) {
      // fp32 scalars per token: every read (2L branch reads + the output read)
      // keeps its lse per stream; DAR reads also keep alpha, beta and the
      // coefficient head's input rstd (2n + 1), and branches at position i >= 1
      // their transport parameters m.
      const double reads = 2.0 * layers + 1.0;
      double scalars_per_token = reads * n;
      if (counts.dar_streams >= 2) {
        const double transport =
            static_cast<double>(DarConfig::transport_params(counts.dar_streams));
        scalars_per_token += reads * (2.0 * n + 1.0) + (2.0 * layers - blocks) * transport;
      }
      mem.dar_bank = (blocks + 1.0) * n * T * (width * B + 4.0) + 4.0 * T * scalars_per_token;
      dar_transient = dar_block_backward_bytes(config, T);
      if (config.dar.kernel == DarKernel::prefix) {
        mem.dar_retained = dar_prefix_retained_bytes(config, T);
        mem.dar_packs = dar_kept_packs_bytes(config, T);
      }
    }

    const double head_workspace = T * vocab * (B + 4.0);
    double layer_workspace = 2.0 * B * T * width + B * T * std::max(up_width, qkv_width);
    // One layer's recomputed tensors, alive through its backward: all of them
    // under full recompute, else what the recomputed modules dropped.
    layer_workspace += layer_saved_bytes(config, T, s, LayerShare{}, RecomputePlan{}) -
                       (plan.full ? 0.0 : layer_saved(T, s));
    if (e.enabled()) {
      const double slots = static_cast<double>(moe_slots(config, static_cast<int64_t>(T)));
      layer_workspace = std::max(layer_workspace,
                                 2.0 * B * T * width + 2.0 * B * slots * width +
                                     B * std::max(slots * expert_up, T * qkv_width));
    }
    layer_workspace += dar_transient;
    mem.workspace = std::max(head_workspace, layer_workspace);
  }
  mem.peak = detail::sum_of_parts(mem);
  mem.fits = device_memory_bytes <= 0.0 || mem.peak <= device_memory_bytes;
  return mem;
}

}  // namespace detail

MemoryBreakdown estimate_memory(const Config& config, const DeviceProfile& profile, StepKind step) {
  validate(config);
  return detail::memory_from_params(config, detail::closed_form_params(config).total,
                                    profile.ceilings.memory_bytes, step);
}

}  // namespace modar
