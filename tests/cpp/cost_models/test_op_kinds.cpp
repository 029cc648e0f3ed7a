// tests/cpp/cost_models/test_op_kinds.cpp: the op-kind table (MODAR_OP_KINDS in
// modar/ops.hpp) against the interface it must keep: the kind names and dims
// order that profiles store (profiles/README.md's table, written out here by
// hand), the counted set (the FLOP-counting conventions of docs/cost_model.md),
// the categorical dims of the timing model, and the typed dims <-> OpShape
// conversion.
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "modar/ops.hpp"

namespace modar {
namespace {

struct KindRow {
  const char* name;
  std::vector<std::string> dims;  // in profile order
  std::set<int> categorical;      // indices of the categorical dims
  bool counted;
};

// profiles/README.md "Op kinds and their dims", in OpKind order (profiles name
// kinds by string; the order is the enum's, appended only).
const std::vector<KindRow>& readme_rows() {
  static const std::vector<KindRow> rows = {
      {"gemm", {"m", "n", "k", "batch"}, {}, true},
      {"attention",
       {"sequences", "heads", "kv_heads", "query_len", "key_len", "head_dim", "causal"},
       {6},
       true},
      {"rmsnorm", {"rows", "width"}, {}, false},
      {"rope", {"rows", "heads", "head_dim"}, {}, false},
      {"router", {"rows", "width"}, {}, true},
      {"topk", {"sequences", "seq_len", "k"}, {}, false},
      {"gather", {"rows", "width"}, {}, false},
      {"scatter_add", {"rows", "width"}, {}, false},
      {"depth_read_prefix",
       {"tokens", "sources", "queries", "width", "streams", "variant"},
       {4, 5},
       true},
      {"depth_read_merge", {"tokens", "streams", "width", "variant"}, {1, 3}, true},
      {"dar_coefficients", {"tokens", "streams", "width", "outputs"}, {1, 3}, true},
      {"dar_write", {"tokens", "streams", "width", "mode", "emit_rstd"}, {1, 3, 4}, true},
      {"elementwise", {"elements", "inputs", "outputs"}, {1, 2}, false},
      {"cross_entropy", {"rows", "vocab"}, {}, false},
      {"embedding", {"rows", "width"}, {}, false},
      {"optimizer_update", {"params"}, {}, false},
      {"expert_gemm",
       {"groups", "rows", "n", "k", "imbalance_permille", "ragged_inner"},
       {5},
       true},
      {"moe_topk", {"rows", "choices", "k"}, {}, false},
      {"permute", {"slots", "width", "rows"}, {}, false},
      {"unpermute", {"slots", "width", "rows", "k"}, {}, false},
  };
  return rows;
}

TEST(OpKinds, TableMatchesTheProfileInterface) {
  const auto& rows = readme_rows();
  ASSERT_EQ(static_cast<size_t>(kOpKindCount), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const OpKindInfo& info = kOpKindTable[i];
    EXPECT_EQ(static_cast<size_t>(info.kind), i);
    EXPECT_STREQ(info.name, rows[i].name);
    EXPECT_STREQ(to_string(info.kind), rows[i].name);
    OpKind parsed{};
    ASSERT_TRUE(parse_op_kind(rows[i].name, &parsed)) << rows[i].name;
    EXPECT_EQ(parsed, info.kind);
    ASSERT_EQ(op_dims_count(info.kind), static_cast<int>(rows[i].dims.size())) << rows[i].name;
    for (int d = 0; d < info.dims_count; ++d) {
      EXPECT_EQ(info.dims[d].name, rows[i].dims[static_cast<size_t>(d)]) << rows[i].name;
      EXPECT_EQ(info.dims[d].role == DimRole::category, rows[i].categorical.count(d) == 1)
          << rows[i].name << " dim " << d;
    }
    EXPECT_EQ(is_counted_kind(info.kind), rows[i].counted) << rows[i].name;
  }
  OpKind ignored{};
  EXPECT_FALSE(parse_op_kind("conv", &ignored));
  EXPECT_EQ(kMaxOpDims, 7u);
}

TEST(OpKinds, TimingRules) {
  // A dgrad / wgrad GEMM is a GEMM: one measurement for every pass.
  EXPECT_EQ(op_kind_info(OpKind::gemm).timing, OpTiming::any_pass);
  EXPECT_EQ(op_kind_info(OpKind::expert_gemm).timing, OpTiming::per_pass_else_gemm);
  for (const OpKindInfo& info : kOpKindTable) {
    if (info.kind != OpKind::gemm && info.kind != OpKind::expert_gemm) {
      EXPECT_EQ(info.timing, OpTiming::per_pass) << info.name;
    }
  }
}

TEST(OpKinds, TypedDimsConvertInProfileOrder) {
  const OpShape shape = OpShape::of(AttentionDims{.sequences = 2,
                                                  .heads = 16,
                                                  .kv_heads = 4,
                                                  .query_len = 1024,
                                                  .key_len = 2048,
                                                  .head_dim = 128,
                                                  .causal = 1},
                                    DType::fp32);
  EXPECT_EQ(shape.kind, OpKind::attention);
  EXPECT_EQ(shape.dtype, DType::fp32);
  const OpDimsArray expected{2, 16, 4, 1024, 2048, 128, 1};
  EXPECT_EQ(shape.dims, expected);
  const AttentionDims back = shape.as<AttentionDims>();
  EXPECT_EQ(back.kv_heads, 4);
  EXPECT_EQ(back.key_len, 2048);
  // Unused trailing dims are 0.
  const OpShape norm = OpShape::of(RmsnormDims{.rows = 3, .width = 5}, DType::bf16);
  const OpDimsArray norm_dims{3, 5, 0, 0, 0, 0, 0};
  EXPECT_EQ(norm.dims, norm_dims);
  EXPECT_THROW(norm.as<GemmDims>(), std::logic_error);
  // visit_dims hands the kind's own struct.
  const int64_t imbalance = visit_dims(
      OpShape::of(
          ExpertGemmDims{.groups = 8, .rows = 64, .n = 4, .k = 2, .imbalance_permille = 1250},
          DType::bf16),
      [](const auto& dims) -> int64_t {
        if constexpr (std::is_same_v<std::decay_t<decltype(dims)>, ExpertGemmDims>) {
          return dims.imbalance_permille;
        } else {
          return -1;
        }
      });
  EXPECT_EQ(imbalance, 1250);
}

}  // namespace
}  // namespace modar
