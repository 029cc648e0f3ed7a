// runtime/profiler_grid.cpp: which shapes the profiler times.
//
// TimingModel (cost_models/timing.cpp) interpolates log(time) multilinearly in
// log(dims) over a FULL tensor-product grid per (kind, pass, dtype,
// categorical dims), so every kind's grid here is a tensor product over the
// dims that vary; dims that are categorical (attention causal, DAR streams /
// variant / mode, elementwise arity) get one grid per value the lowering
// emits.  Values cover what lower() produces for the configurations a device
// of this kind is used for:
//   * CPU: small models (d 64 .. 1024, tokens 16 .. 4096, d_ff up to 4096,
//     vocab up to 16384), the range `modar validate` runs on; experts (MoE
//     ops: CPU only) 2 .. 8 groups, 256 .. 4096 expert rows;
//   * GPU: LLM shapes (tokens 256 .. 64K, d 512 .. 8192, d_ff up to 32K,
//     vocab 50K), axis steps of 4x (quick) or 2x (full).
// The lists are documented in docs/profiler.md; changing them changes which
// predictions interpolate and which extrapolate.
#include <array>
#include <string>
#include <vector>

#include "modar/config.hpp"
#include "modar/runtime/profiler.hpp"

namespace modar::runtime {
namespace {

using Axis = std::vector<int64_t>;

struct Axes {
  Axis gemm;           // m, n, k
  Axis tokens;         // rows of token-wise ops
  Axis width;          // d
  Axis attn_heads;     // H (= G, b = 1): b * H is what scales
  Axis attn_seq;       // s_q = s_k
  Axis attn_head_dim;  // d_h
  Axis rope_heads;     // H + G
  Axis topk_batch, topk_seq, topk_k;
  Axis depth_tokens, depth_sources, depth_queries_per_stream;
  Axis elements;  // elementwise
  Axis ce_rows, vocab;
  Axis params;
  // Experts (CPU only until the MoE CUDA kernels have run on a GPU).
  Axis expert_groups, expert_rows, expert_width, expert_choices, expert_k, expert_tokens;
};

Axis powers(int64_t first, int64_t last, int64_t factor) {
  Axis axis;
  for (int64_t v = first; v <= last; v *= factor) {
    axis.push_back(v);
  }
  return axis;
}

Axes axes_for(GridSize size, DeviceKind device) {
  const bool full = size == GridSize::full;
  Axes a;
  if (device == DeviceKind::cpu) {
    a.gemm = full ? powers(16, 8192, 2) : powers(16, 4096, 4);
    a.tokens = full ? powers(16, 16384, 2) : powers(16, 4096, 4);
    a.width = full ? powers(64, 2048, 2) : Axis{64, 256, 1024};
    a.attn_heads = full ? Axis{1, 2, 4, 8, 16, 32} : Axis{1, 4, 16};
    a.attn_seq = full ? powers(16, 4096, 2) : powers(16, 1024, 4);
    a.attn_head_dim = full ? Axis{16, 32, 64, 128} : Axis{32, 64};
    a.rope_heads = full ? powers(2, 64, 2) : Axis{2, 8, 32};
    a.topk_batch = full ? Axis{1, 4, 16} : Axis{1, 8};
    a.topk_seq = full ? powers(16, 4096, 2) : powers(64, 4096, 4);
    a.topk_k = full ? Axis{1, 4, 16} : Axis{2, 16, 64};
    a.depth_tokens = full ? powers(64, 8192, 2) : powers(64, 4096, 4);
    a.depth_sources = full ? Axis{1, 2, 4, 8, 16} : Axis{1, 3, 9};
    a.depth_queries_per_stream = full ? Axis{1, 2, 4, 8} : Axis{1, 4};
    a.elements = full ? powers(1024, 1 << 24, 2) : powers(4096, 1 << 24, 4);
    a.ce_rows = full ? powers(64, 8192, 2) : powers(64, 4096, 4);
    a.vocab = full ? powers(256, 32768, 2) : powers(256, 16384, 4);
    a.params = full ? powers(1 << 12, 1 << 26, 2) : powers(1 << 14, 1 << 24, 4);
    a.expert_groups = full ? Axis{2, 4, 8, 16, 64} : Axis{2, 8};
    a.expert_rows = full ? powers(64, 16384, 4) : Axis{256, 4096};
    a.expert_width = full ? powers(64, 4096, 4) : Axis{64, 256, 1024};
    a.expert_choices = full ? Axis{4, 16, 64, 256} : Axis{4, 16, 64};
    a.expert_k = full ? Axis{1, 2, 4} : Axis{1, 4};
    a.expert_tokens = full ? powers(64, 16384, 4) : Axis{64, 1024, 4096};
  } else {
    a.gemm = full ? powers(128, 65536, 2) : powers(256, 65536, 4);
    a.tokens = full ? powers(256, 65536, 2) : powers(256, 65536, 4);
    a.width = full ? powers(256, 16384, 2) : Axis{512, 2048, 8192};
    a.attn_heads = full ? powers(4, 256, 2) : Axis{4, 16, 64, 256};
    a.attn_seq = full ? powers(64, 16384, 2) : powers(64, 16384, 4);
    a.attn_head_dim = Axis{64, 128};
    a.rope_heads = full ? powers(4, 128, 2) : Axis{8, 32, 128};
    a.topk_batch = full ? Axis{1, 4, 16, 64} : Axis{1, 8, 64};
    a.topk_seq = full ? powers(256, 32768, 2) : powers(256, 16384, 4);
    a.topk_k = full ? Axis{16, 64, 256} : Axis{16, 256};
    a.depth_tokens = full ? powers(1024, 131072, 2) : powers(1024, 65536, 4);
    a.depth_sources = full ? Axis{1, 2, 4, 8, 16, 32} : Axis{1, 4, 16};
    a.depth_queries_per_stream = full ? Axis{1, 2, 4, 8} : Axis{1, 4};
    a.elements = full ? powers(1 << 16, 1 << 30, 2) : powers(1 << 16, 1 << 30, 4);
    a.ce_rows = full ? powers(256, 65536, 2) : powers(256, 65536, 4);
    a.vocab = full ? Axis{8192, 16384, 32768, 65536, 131072} : Axis{16384, 65536};
    a.params = full ? powers(1 << 20, 1 << 30, 2) : powers(1 << 20, 1 << 30, 4);
  }
  return a;
}

class GridBuilder {
 public:
  explicit GridBuilder(DType dtype) : dtype_(dtype) {}

  template <class Dims>
  void add(const Dims& dims, bool with_backward) {
    add_pass(dims, Pass::forward);
    if (with_backward) {
      add_pass(dims, Pass::backward);
    }
  }
  template <class Dims>
  void add_pass(const Dims& dims, Pass pass) {
    ProfilePoint point;
    point.shape = OpShape::of(dims, dtype_);
    point.pass = pass;
    points_.push_back(point);
  }
  std::vector<ProfilePoint> take() { return std::move(points_); }

 private:
  DType dtype_;
  std::vector<ProfilePoint> points_;
};

// Every combination of the axes' values, the first axis outermost (the order
// nested loops over them would give): each kind's tensor-product grid.
template <class... AxisLists>
std::vector<std::array<int64_t, sizeof...(AxisLists)>> product(const AxisLists&... axes) {
  std::vector<std::array<int64_t, sizeof...(AxisLists)>> points(1);
  size_t position = 0;
  const auto extend = [&](const Axis& axis) {
    std::vector<std::array<int64_t, sizeof...(AxisLists)>> longer;
    longer.reserve(points.size() * axis.size());
    for (const auto& point : points)
      for (int64_t value : axis) {
        longer.push_back(point);
        longer.back()[position] = value;
      }
    points = std::move(longer);
    ++position;
  };
  (extend(axes), ...);
  return points;
}

}  // namespace

const char* to_string(GridSize size) {
  return size == GridSize::quick ? "quick" : "full";
}

std::vector<ProfilePoint> profile_grid(GridSize size, DeviceKind device, DType dtype) {
  const Axes a = axes_for(size, device);
  GridBuilder grid(dtype);
  // GEMM: timed the same in every pass, so forward only (m, n, k; batch 1).
  for (const auto& [m, n, k] : product(a.gemm, a.gemm, a.gemm))
    grid.add(GemmDims{.m = m, .n = n, .k = k, .batch = 1}, false);
  // Attention: causal, s_q = s_k, MHA (G = H), one sequence: TimingModel
  // scales by b * H (see docs/profiler.md).
  for (const auto& [heads, s, dh] : product(a.attn_heads, a.attn_seq, a.attn_head_dim))
    grid.add(AttentionDims{.sequences = 1,
                           .heads = heads,
                           .kv_heads = heads,
                           .query_len = s,
                           .key_len = s,
                           .head_dim = dh,
                           .causal = 1},
             true);
  for (const auto& [rows, d] : product(a.tokens, a.width)) {
    grid.add(RmsnormDims{.rows = rows, .width = d}, true);
    grid.add(RouterDims{.rows = rows, .width = d}, true);
    grid.add(GatherDims{.rows = rows, .width = d}, true);
    grid.add(ScatterAddDims{.rows = rows, .width = d}, true);
    grid.add(EmbeddingDims{.rows = rows, .width = d}, true);
  }
  for (const auto& [rows, heads, dh] : product(a.tokens, a.rope_heads, a.attn_head_dim))
    grid.add(RopeDims{.rows = rows, .heads = heads, .head_dim = dh}, true);
  for (const auto& [b, s, k] : product(a.topk_batch, a.topk_seq, a.topk_k))
    grid.add(TopkDims{.sequences = b, .seq_len = s, .k = k}, false);
  // Depth reads: AttnRes (n = 1) and DAR (n = 2, default variant).
  const int64_t attnres = static_cast<int64_t>(DarVariant::attnres);
  const int64_t dar = static_cast<int64_t>(DarVariant::dar);
  for (const auto& [n, variant] : {std::pair<int64_t, int64_t>{1, attnres}, {2, dar}}) {
    for (const auto& [T, sources, q, d] :
         product(a.depth_tokens, a.depth_sources, a.depth_queries_per_stream, a.width))
      grid.add(DepthReadPrefixDims{.tokens = T,
                                   .sources = sources,
                                   .queries = q * n,
                                   .width = d,
                                   .streams = n,
                                   .variant = variant},
               true);
    for (const auto& [T, d] : product(a.depth_tokens, a.width)) {
      grid.add(DepthReadMergeDims{.tokens = T, .streams = n, .width = d, .variant = variant}, true);
      if (n >= 2) {
        grid.add(DarCoefficientsDims{.tokens = T, .streams = n, .width = d, .outputs = 2 * n},
                 true);
        grid.add(DarCoefficientsDims{.tokens = T,
                                     .streams = n,
                                     .width = d,
                                     .outputs = 2 * n + DarConfig::transport_params(n)},
                 true);
      }
      grid.add(DarWriteDims{.tokens = T, .streams = n, .width = d, .mode = 2, .emit_rstd = 1},
               true);  // bank init
      grid.add(DarWriteDims{.tokens = T, .streams = n, .width = d, .mode = 0, .emit_rstd = 0},
               true);  // first branch of a block
      grid.add(DarWriteDims{.tokens = T, .streams = n, .width = d, .mode = 1, .emit_rstd = 0},
               true);  // middle branch
      grid.add(DarWriteDims{.tokens = T, .streams = n, .width = d, .mode = 1, .emit_rstd = 1},
               true);  // last branch (+ entry rstd)
    }
  }
  // Elementwise, by (inputs, outputs) as the lowering emits them.
  for (int64_t e : a.elements) {
    grid.add_pass(ElementwiseDims{.elements = e, .inputs = 1, .outputs = 1},
                  Pass::forward);  // GELU
    grid.add_pass(ElementwiseDims{.elements = e, .inputs = 2, .outputs = 1},
                  Pass::forward);  // residual add / SwiGLU
    grid.add_pass(ElementwiseDims{.elements = e, .inputs = 2, .outputs = 1},
                  Pass::backward);  // GELU backward
    grid.add_pass(ElementwiseDims{.elements = e, .inputs = 3, .outputs = 2},
                  Pass::backward);  // SwiGLU backward
    grid.add_pass(ElementwiseDims{.elements = e, .inputs = 1, .outputs = 1},
                  Pass::backward);  // predictor activation
  }
  for (const auto& [rows, vocab] : product(a.ce_rows, a.vocab))
    grid.add(CrossEntropyDims{.rows = rows, .vocab = vocab}, true);
  for (int64_t p : a.params)
    grid.add(OptimizerUpdateDims{.params = p}, false);
  // Experts: grouped GEMMs in both passes (the lowering labels dgrad / wgrad
  // backward) at balanced load (imbalance 1000 permille) for both forms; the
  // router top-k over rows x choices x k; the permutations over slots x d x
  // rows (x k).  Empty on the GPU until the MoE CUDA kernels (moe.cu) have
  // passed the op harness on one.
  for (const auto& [ragged, groups, rows, n, k] :
       product(Axis{0, 1}, a.expert_groups, a.expert_rows, a.expert_width, a.expert_width))
    grid.add(ExpertGemmDims{.groups = groups,
                            .rows = rows,
                            .n = n,
                            .k = k,
                            .imbalance_permille = 1000,
                            .ragged_inner = ragged},
             true);
  for (const auto& [rows, choices, k] : product(a.expert_tokens, a.expert_choices, a.expert_k))
    grid.add(MoeTopkDims{.rows = rows, .choices = choices, .k = k}, true);
  for (const auto& [slots, d, rows] : product(a.expert_tokens, a.width, a.expert_tokens)) {
    grid.add(PermuteDims{.slots = slots, .width = d, .rows = rows}, true);
    for (int64_t k : a.expert_k)
      grid.add(UnpermuteDims{.slots = slots, .width = d, .rows = rows, .k = k}, true);
  }
  return grid.take();
}

}  // namespace modar::runtime
