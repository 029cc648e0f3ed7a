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

}  // namespace

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
                              double bytes, const KernelRates& rates) {
  const bool wide = shape.dtype == DType::fp32 || shape.dtype == DType::fp64;
  const double rate =
      wide ? rates.fp32_flops : rates.attention_flops * flash_attention_shape_factor(shape, pass);
  const double compute_s = rate > 0.0 ? executed_flops / rate : 0.0;
  const double memory_s = rates.bandwidth > 0.0 ? bytes / rates.bandwidth : 0.0;
  return std::max(compute_s, memory_s) + rates.launch_overhead_s;
}

}  // namespace modar
