// FlashAttention time from the FlashAttention papers' published figures
// (docs/kernel_model.md "Attention").
//
// rate = kernel.attention_efficiency x peak x H(d) x S(n) x C, backward at
// its own asymptote R x that, where
//   n    = key/value blocks of 128 each query block iterates: s_k / 128, or
//          for a causal mask the average (N + 1) / 2 over the N = s / 128
//          query blocks (block i reads i + 1 key blocks);
//   S(n) = 1 / (1 + (n0 / n)^p): the per-block fixed work (loading Q, the
//          final rescale, writing O) amortised over the key loop;
//   H(d) = (d / (d + d0)) / (128 / (128 + d0)): wider heads reuse each load
//          more (1 at head dim 128);
//   C    = causal ? N / (N + 1) x c_mask : 1: the diagonal blocks are computed
//          in full but half of them is masked (counted FLOPs are half the
//          square), and masking costs c_mask more.
// The constants are a least-squares fit (in log space) to FlashAttention-3's
// FP16 H100 figures (Shah et al. 2024, arXiv 2407.08608, figures 5 and 6:
// forward at head dims 64 / 128 / 256, causal and not, backward at 64 / 128,
// sequence 512 to 16k): forward rms error 5%, backward 0.6%.
// kernel.attention_efficiency sets the forward asymptote (head dim 128,
// no mask, long sequences) per device.
#include <algorithm>
#include <cmath>

#include "modar/kernel_model.hpp"

namespace modar {
namespace {

constexpr double kKeyBlock = 128.0;

struct PassShape {
  double asymptote;  // relative to the forward's (1)
  double d0, n0, p;
};
constexpr PassShape kForward = {1.0, 50.8, 2.23, 1.225};
constexpr PassShape kBackward = {0.874, 28.1, 3.31, 1.247};
constexpr double kCausalMaskFactor = 0.935;

// Each generation's forward asymptote relative to FlashAttention-2's on the
// same device class, and the generation the class's profiles time as
// "flash" (docs/kernel_model.md "Attention kernel generations"):
// - FlashAttention-2 is "around 2x faster than FlashAttention" (Dao 2023,
//   arXiv 2307.08691, section 4.1, A100): flash1 0.5.
// - The Triton FlashAttention kernel (flash_attn_triton.py, which MosaicML's
//   llm-foundry ran as attn_impl "triton"): "Overall Triton forward +
//   backward is slightly slower than CUDA forward + backward" (its header;
//   the CUDA version of the time: FlashAttention): FlashAttention's 0.5.
// - Hopper: "FlashAttention-2 achieves only 35% utilization on H100" (Shah
//   et al. 2024, arXiv 2407.08608), FlashAttention-3's fitted forward
//   asymptote 651.5 TFLOP/s of 989 (figure 5): flash3 651.5 / (0.35 x 989).
//   flash1 / triton keep the A100 ratio to FlashAttention-2 (no H100 figure).
struct GenerationRates {
  const char* device_class;
  AttentionKernel profile_kernel;         // what the class's profiles time as "flash"
  double flash1, flash2, flash3, triton;  // 0: not published / not available
};
constexpr double kFa3OverFa2Hopper = 651.5 / (0.35 * 989.0);
constexpr GenerationRates kGenerationRates[] = {
    {"a100", AttentionKernel::flash2, 0.5, 1.0, 0.0, 0.5},
    {"hopper", AttentionKernel::flash3, 0.5, 1.0, kFa3OverFa2Hopper, 0.5},
};

double relative_to_fa2(const GenerationRates& g, AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::flash1:
      return g.flash1;
    case AttentionKernel::flash2:
      return g.flash2;
    case AttentionKernel::flash3:
      return g.flash3;
    case AttentionKernel::triton:
      return g.triton;
    case AttentionKernel::flash:
    case AttentionKernel::unfused:
      break;
  }
  return 0.0;
}

const GenerationRates* generation_rates_of(const std::string& device_class) {
  for (const GenerationRates& g : kGenerationRates) {
    if (device_class == g.device_class) {
      return &g;
    }
  }
  return nullptr;
}

}  // namespace

double flash_generation_factor(const std::string& device_class, AttentionKernel kernel) {
  if (kernel == AttentionKernel::flash) {
    return 1.0;
  }
  const GenerationRates* g = generation_rates_of(device_class);
  if (g == nullptr) {
    return 0.0;
  }
  return relative_to_fa2(*g, kernel) / relative_to_fa2(*g, g->profile_kernel);
}

std::string flash_generations_of(const std::string& device_class) {
  std::string names;
  const GenerationRates* g = generation_rates_of(device_class);
  for (const AttentionKernel k : {AttentionKernel::flash1, AttentionKernel::flash2,
                                  AttentionKernel::flash3, AttentionKernel::triton}) {
    if (g != nullptr && relative_to_fa2(*g, k) > 0.0) {
      names += (names.empty() ? "\"" : ", \"") + std::string(to_string(k)) + "\"";
    }
  }
  return names;
}

double flash_attention_shape_factor(const AttentionShape& shape, Pass pass) {
  const PassShape& c = pass == Pass::backward ? kBackward : kForward;
  const double d = static_cast<double>(std::max<int64_t>(shape.d_head, 1));
  const double head = (d / (d + c.d0)) / (128.0 / (128.0 + c.d0));
  const double key_blocks = std::max(1.0, std::ceil(static_cast<double>(shape.s_k) / kKeyBlock));
  double blocks = key_blocks;
  double mask = 1.0;
  if (shape.causal) {
    const double query_blocks =
        std::max(1.0, std::ceil(static_cast<double>(shape.s_q) / kKeyBlock));
    blocks = (std::min(query_blocks, key_blocks) + 1.0) / 2.0 +
             std::max(0.0, key_blocks - query_blocks);  // a prefix of keys is seen in full
    mask = query_blocks / (query_blocks + 1.0) * kCausalMaskFactor;
  }
  const double sequence = 1.0 / (1.0 + std::pow(c.n0 / blocks, c.p));
  return c.asymptote * head * sequence * mask;
}

double flash_attention_time_s(const AttentionShape& shape, Pass pass, double executed_flops,
                              double bytes, const KernelRates& rates, double rate_factor) {
  const bool wide = shape.dtype == DType::fp32 || shape.dtype == DType::fp64;
  const double rate =
      wide ? rates.fp32_flops
           : rates.attention_flops * rate_factor * flash_attention_shape_factor(shape, pass);
  const double compute_s = rate > 0.0 ? executed_flops / rate : 0.0;
  const double memory_s = rates.bandwidth > 0.0 ? bytes / rates.bandwidth : 0.0;
  return std::max(compute_s, memory_s) + rates.launch_overhead_s;
}

}  // namespace modar
