// modar/config_enums.hpp: the enums of the configuration vocabulary (MLP kind,
// router scale, DAR variant, dtype, ...) and their names, apart from the
// configuration structs (config.hpp) so that the runtime's core headers
// (tensor, op table, backend) and the op vocabulary (ops.hpp) need only these.
// The names are those of TOML / CLI / JSON; to_string and dtype_bytes are
// defined with the config reader (cost_models/config.cpp).
#pragma once

#include <cstdint>

namespace modar {

// gelu: y = W2 gelu(W1 x) (GPT-2 / GPT-NeoX); swiglu: y = W2 (silu(Wg x) * (Wu x))
// (LLaMA); geglu: y = W2 (gelu(Wg x) * (Wu x)) (Gemma).  The gated kinds have
// three matrices and share their default width (8d/3 rounded up to 64).
enum class MlpKind { gelu, swiglu, geglu };
// Normalisation of queries and keys before RoPE (Qwen3, OLMoE, Megatron
// --qk-layernorm): none; head = one RMSNorm over d_head shared by every head
// (Qwen3, Megatron); projection = one RMSNorm over the whole Q and K
// projections (OLMoE).  Parameters only differ (d_head vs the projection
// width); the cost is the same rows x width normalisation either way.
enum class QkNorm { none, head, projection };
enum class RouterScale { linear, sigmoid };  // g(r) = r  |  g(r) = sigmoid(r)
enum class CausalRouter { none, aux_loss, predictor };
enum class DarVariant { none, attnres, dar, selfkv, fixedkv, crossv };
// How the depth reads are implemented (time and memory, not the maths;
// docs/moe.md "The DAR paper's implementation"): fused = modar's kernels
// (each read loads the raw bank once for keys and values, the backward
// recomputes the retrieved states from the bank and the saved log-partition);
// prefix = the DAR paper's Triton prefix-kernel family (packed normalised key
// views and values, logits / shifted scores / retrieved states kept for the
// backward, the packs rebuilt from the raw bank in the backward).
enum class DarKernel { fused, prefix };
// Whether dar.kernel = prefix keeps the packed key views and values of every
// read for the backward (docs/moe.md "Which packs are kept"): kept, rebuilt
// from the raw bank in the backward, or paper = as the DAR paper's Table 5
// runs read: the AttnRes arm (attention-style kernels following Kimi's, which
// keep their packed inputs) keeps them, the DAR family ("reconstructs packed
// v and normalized k from the raw H_r states") rebuilds them.
enum class DarPacks { paper, kept, rebuilt };
enum class MoeMode { none, staged, integrated };  // MoDE (docs/moe.md)
// Where an expert's routing weight (gate) multiplies (docs/moe.md "Routing
// weights"): activation = inside the expert's activation before its down
// projection (Megatron-Core's TEGroupedMLP, weighted SwiGLU; nothing more
// saved than the weight); output = on the expert's output in the combine
// (GShard; modar's reference runtime: the output is saved for the weight's
// gradient); input = on the expert's input (Megatron-Core
// moe_apply_probs_on_input, top-1 only: the unscaled input is saved too).
enum class RouterWeights { activation, output, input };
// How tokens reach their experts under expert parallelism: alltoall (the
// rank's slots, Megatron-Core's default) or allgather (every token of the
// expert-tensor x expert group gathered, each rank keeps its experts').
enum class TokenDispatcher { alltoall, allgather };
enum class DType { fp32, bf16, fp16, fp64 };
enum class Optimizer { adamw };
enum class Recompute { none, selective, full };
// Megatron-LM's --recompute-granularity (train.recompute_granularity), beside
// modar's own train.recompute: selective re-runs train.recompute_modules
// (Megatron's default "core_attn" only), full every layer (uniform, one layer
// per checkpoint).  docs/cluster.md "Recompute".
enum class RecomputeGranularity { none, selective, full };
enum class AttentionFlops { causal, full, flash };  // counting conventions (docs/cost_model.md)
// The attention kernel a training step runs (time and memory, not counting):
// flash = FlashAttention (default); unfused = scores materialised in HBM
// (Megatron-LM before FlashAttention: batched GEMMs + fused softmax + dropout).
// flash: the FlashAttention generation the profile's attention rate
// describes; flash1 / flash2 / flash3 / triton: a named generation at its
// published rate (docs/kernel_model.md "Attention kernel generations");
// unfused: materialised scores.
enum class AttentionKernel { flash, unfused, flash1, flash2, flash3, triton };
inline constexpr bool is_fused(AttentionKernel v) {
  return v != AttentionKernel::unfused;
}
// How each micro-batch's weight gradients reach the main-gradient buffer:
// fused = the wgrad GEMM accumulates into it (beta = 1; Megatron-Core / TE
// gradient_accumulation_fusion, default); unfused = the GEMM writes a fresh
// gradient that a separate kernel adds in (Megatron-LM 2021 DDP param hook,
// main_grad.add_(grad)): a read-modify-write of the buffer per micro-batch.
enum class GradAccumulation { fused, unfused };
// The main gradients' dtype, as accumulated and data-parallel reduced
// (train.grad_reduce_in_fp32; docs/cluster.md "Main gradients"), named
// "auto", "true", "false" in TOML / CLI / JSON: by_dtype ("auto") = Megatron's
// default, fp32 but for fp16 training (its DDP buffer has the parameters'
// dtype unless --accumulate-allreduce-grads-in-fp32, which bf16 forces);
// fp32 ("true") = --accumulate-allreduce-grads-in-fp32; param_dtype ("false")
// = the parameters' dtype (fp16's default; bf16 with --grad-reduce-in-bf16).
enum class GradReduceInFp32 { by_dtype, fp32, param_dtype };
// What of the tensor-parallel collectives runs concurrently with GEMMs
// (docs/cluster.md "Overlap"): none (Megatron-LM 2021), backward (the input-
// gradient all-reduce / reduce-scatter of each column-parallel linear beside
// its weight-gradient GEMM: Megatron-LM's default since 2022), full
// (Transformer Engine's --tp-comm-overlap: every all-gather / reduce-scatter
// beside the GEMM it feeds or follows; needs sequence parallelism).
enum class TpCommOverlap { none, backward, full };
enum class PipelineSchedule { one_f_one_b, interleaved };

// enum <-> string, the names used in TOML / CLI / JSON.
const char* to_string(MlpKind v);
const char* to_string(QkNorm v);
const char* to_string(RouterScale v);
const char* to_string(CausalRouter v);
const char* to_string(DarVariant v);
const char* to_string(DarKernel v);
const char* to_string(DarPacks v);
const char* to_string(MoeMode v);
const char* to_string(DType v);
const char* to_string(Optimizer v);
const char* to_string(Recompute v);
const char* to_string(RecomputeGranularity v);
const char* to_string(AttentionFlops v);
const char* to_string(PipelineSchedule v);
const char* to_string(AttentionKernel v);
const char* to_string(GradAccumulation v);
const char* to_string(GradReduceInFp32 v);
const char* to_string(TpCommOverlap v);
const char* to_string(RouterWeights v);
const char* to_string(TokenDispatcher v);
int64_t dtype_bytes(DType v);

}  // namespace modar
