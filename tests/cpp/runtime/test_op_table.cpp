// tests/cpp/runtime/test_op_table.cpp: the op table (op_args.hpp) against the
// profiler and validate's tracing: every runtime op that the table says the
// profiler times is executed by the profiler's bench of its (kind, pass), and
// a bench of (kind, pass) executes only ops of that vocabulary kind.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "modar/base/errors.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/forwarding_backend.hpp"
#include "modar/runtime/profiler.hpp"
#include "test_ops_util.hpp"

namespace modar::runtime {
namespace {

// Counts the ops executed through it (by OpId), forwarding them to the CPU.
class CountingBackend final : public ForwardingBackend {
 public:
  CountingBackend() : ForwardingBackend(testing::cpu()) {}
  std::array<int64_t, kOpCount> counts{};

 protected:
  void execute(const OpArgs& call, const OpGeometry&) override {
    ++counts[static_cast<size_t>(op_id(call))];
    inner().run(call);
  }
};

TEST(OpTable, RowsAreInOpIdOrderWithUniqueNames) {
  std::set<std::string> names;
  for (size_t i = 0; i < kOpCount; ++i) {
    EXPECT_EQ(static_cast<size_t>(kOpTable[i].id), i);
    EXPECT_TRUE(names.insert(kOpTable[i].name).second) << kOpTable[i].name;
    OpId parsed{};
    ASSERT_TRUE(parse_op_id(kOpTable[i].name, &parsed));
    EXPECT_EQ(parsed, kOpTable[i].id);
  }
  OpId ignored{};
  EXPECT_FALSE(parse_op_id("no_such_op", &ignored));
  // The variant's alternative is the row (index 0 is "no op").
  EXPECT_EQ(op_id(OpArgs{GemmArgs{}}), OpId::gemm);
  EXPECT_EQ(op_id(OpArgs{AdamwUpdateArgs{}}), OpId::adamw_update);
  EXPECT_STREQ(op_info(OpId::gather_rows_backward).name, "gather_rows_backward");
  // The vocabulary mapping of the routed ops (cost_models/lowering.cpp's labels).
  EXPECT_EQ(op_info(OpId::gather_rows_backward).kind, OpKind::scatter_add);
  EXPECT_EQ(op_info(OpId::scatter_add_scaled_backward).kind, OpKind::gather);
  EXPECT_EQ(op_info(OpId::dar_mix_forward).kind, OpKind::dar_coefficients);
  EXPECT_FALSE(op_info(OpId::copy).in_vocabulary);
}

// check() returns the resolved geometry: a GEMM's m, n, k, batch by hand.
TEST(OpTable, CheckResolvesTheGemmGeometry) {
  Backend& cpu = testing::cpu();
  // Batched, op(A) = A^T: A [3, 5, 4] -> op(A) [4, 5]; B [3, 5, 6]... k = 5.
  Tensor a(cpu, {3, 5, 4}, ScalarType::fp32), b(cpu, {3, 5, 6}, ScalarType::fp32),
      c(cpu, {3, 4, 6}, ScalarType::fp32);
  OpGeometry g = check(DeviceKind::cpu, GemmArgs{a.view(), true, b.view(), false, c.view()});
  EXPECT_EQ(g.dims[0], 4);  // m
  EXPECT_EQ(g.dims[1], 6);  // n
  EXPECT_EQ(g.dims[2], 5);  // k
  EXPECT_EQ(g.dims[3], 3);  // batch
  EXPECT_EQ(g.dtype, ScalarType::fp32);
  // Flattened leading dims, op(B) = B^T: x [2, 3, 4] W^T with W [7, 4] -> [6, 7].
  Tensor x(cpu, {2, 3, 4}, ScalarType::fp64), w(cpu, {7, 4}, ScalarType::fp64),
      y(cpu, {2, 3, 7}, ScalarType::fp64);
  g = check(DeviceKind::cpu, GemmArgs{x.view(), false, w.view(), true, y.view()});
  EXPECT_EQ(g.dims[0], 6);
  EXPECT_EQ(g.dims[1], 7);
  EXPECT_EQ(g.dims[2], 4);
  EXPECT_EQ(g.dims[3], 1);
  EXPECT_THROW(check(DeviceKind::cpu, GemmArgs{x.view(), false, w.view(), false, y.view()}),
               ShapeError);
}

TEST(OpTable, EveryVocabularyKindHasARuntimeOp) {
  std::set<OpKind> kinds;
  for (const OpInfo& info : kOpTable) {
    if (info.in_vocabulary)
      kinds.insert(info.kind);
  }
  EXPECT_EQ(kinds.size(), static_cast<size_t>(kOpKindCount));
}

// Small shapes per vocabulary kind, for running benches: one overload per
// dims struct (a new kind without one fails to compile).
std::vector<GemmDims> small(GemmDims) {
  return {{.m = 8, .n = 8, .k = 8, .batch = 1}};
}
std::vector<AttentionDims> small(AttentionDims) {
  return {{.sequences = 1,
           .heads = 2,
           .kv_heads = 1,
           .query_len = 8,
           .key_len = 8,
           .head_dim = 8,
           .causal = 1}};
}
std::vector<RmsnormDims> small(RmsnormDims) {
  return {{.rows = 8, .width = 8}};
}
std::vector<RouterDims> small(RouterDims) {
  return {{.rows = 8, .width = 8}};
}
std::vector<GatherDims> small(GatherDims) {
  return {{.rows = 8, .width = 8}};
}
std::vector<ScatterAddDims> small(ScatterAddDims) {
  return {{.rows = 8, .width = 8}};
}
std::vector<EmbeddingDims> small(EmbeddingDims) {
  return {{.rows = 8, .width = 8}};
}
std::vector<RopeDims> small(RopeDims) {
  return {{.rows = 8, .heads = 3, .head_dim = 8}};
}
std::vector<TopkDims> small(TopkDims) {
  return {{.sequences = 2, .seq_len = 8, .k = 4}};
}
constexpr int64_t kDar = static_cast<int64_t>(DarVariant::dar);
std::vector<DepthReadPrefixDims> small(DepthReadPrefixDims) {
  return {{.tokens = 8, .sources = 3, .queries = 4, .width = 8, .streams = 2, .variant = kDar}};
}
std::vector<DepthReadMergeDims> small(DepthReadMergeDims) {
  return {{.tokens = 8, .streams = 2, .width = 8, .variant = kDar}};
}
std::vector<DarCoefficientsDims> small(DarCoefficientsDims) {
  return {{.tokens = 8, .streams = 2, .width = 8, .outputs = 5}};
}
std::vector<DarWriteDims> small(DarWriteDims) {
  return {{.tokens = 8, .streams = 2, .width = 8, .mode = 1, .emit_rstd = 1},
          {.tokens = 8, .streams = 1, .width = 8, .mode = 1, .emit_rstd = 0},
          {.tokens = 8, .streams = 2, .width = 8, .mode = 2, .emit_rstd = 0}};
}
std::vector<ElementwiseDims> small(ElementwiseDims) {
  // 1 input: GELU; 2 inputs: add; backward 2 outputs: SwiGLU, else GELU.
  return {{.elements = 64, .inputs = 1, .outputs = 1},
          {.elements = 64, .inputs = 2, .outputs = 1},
          {.elements = 64, .inputs = 2, .outputs = 2}};
}
std::vector<CrossEntropyDims> small(CrossEntropyDims) {
  return {{.rows = 8, .vocab = 16}};
}
std::vector<OptimizerUpdateDims> small(OptimizerUpdateDims) {
  return {{.params = 64}};
}
std::vector<ExpertGemmDims> small(ExpertGemmDims) {
  return {{.groups = 3, .rows = 10, .n = 8, .k = 6, .imbalance_permille = 1500, .ragged_inner = 0},
          {.groups = 3, .rows = 10, .n = 8, .k = 6, .imbalance_permille = 1000, .ragged_inner = 1}};
}
std::vector<MoeTopkDims> small(MoeTopkDims) {
  return {{.rows = 8, .choices = 6, .k = 2}};
}
std::vector<PermuteDims> small(PermuteDims) {
  return {{.slots = 16, .width = 8, .rows = 8}};
}
std::vector<UnpermuteDims> small(UnpermuteDims) {
  return {{.slots = 16, .width = 8, .rows = 8, .k = 2}};
}

std::vector<OpShape> small_shapes(OpKind kind) {
  OpShape any;
  any.kind = kind;
  return visit_dims(any, [](const auto& dims) {
    std::vector<OpShape> shapes;
    for (const auto& small_dims : small(dims)) {
      shapes.push_back(OpShape::of(small_dims, DType::fp32));
    }
    return shapes;
  });
}

// The ops a bench of (kind, pass) executes, over its small shapes.
std::set<OpId> bench_ops(OpKind kind, Pass pass) {
  TimingOptions timing;
  timing.budget_s = 1e-3;
  timing.min_repeats = 1;
  timing.max_repeats = 1;
  timing.min_sample_s = 0.0;
  timing.max_copies = 1;
  std::set<OpId> executed;
  for (const OpShape& shape : small_shapes(kind)) {
    CountingBackend backend;
    const OpTiming timed = measure_op(backend, shape, pass, timing);
    EXPECT_FALSE(timed.skipped) << describe(shape, pass) << ": " << timed.skip_reason;
    for (size_t i = 0; i < kOpCount; ++i) {
      if (backend.counts[i] > 0)
        executed.insert(static_cast<OpId>(i));
    }
  }
  return executed;
}

TEST(OpTable, ProfiledOpsAreExecutedByTheirBench) {
  std::map<std::pair<OpKind, Pass>, std::set<OpId>> cache;
  for (const OpInfo& info : kOpTable) {
    if (!info.profiled)
      continue;
    // The profiler times GEMMs only forward (a dgrad / wgrad is a GEMM).
    const std::pair<OpKind, Pass> key{info.kind, info.pass};
    if (cache.count(key) == 0)
      cache[key] = bench_ops(info.kind, info.pass);
    EXPECT_EQ(cache[key].count(info.id), 1u)
        << info.name << ": the table says the profiler's " << to_string(info.kind) << " "
        << to_string(info.pass) << " bench times it, but that bench does not execute it";
  }
}

// A bench runs only ops of its own kind, except dar_write's bench, which also
// runs the bank init (copy), the n = 1 write (add / axpy) and the block-end
// key statistics (an rstd-only rmsnorm) that the lowering counts as dar_write.
TEST(OpTable, BenchesRunOnlyTheirKind) {
  for (int k = 0; k < kOpKindCount; ++k) {
    const OpKind kind = static_cast<OpKind>(k);
    if (kind == OpKind::dar_write)
      continue;
    for (Pass pass : {Pass::forward, Pass::backward}) {
      if (kind == OpKind::gemm && pass == Pass::backward)
        continue;
      if ((kind == OpKind::topk || kind == OpKind::optimizer_update) && pass == Pass::backward)
        continue;
      for (OpId id : bench_ops(kind, pass)) {
        const OpInfo& info = op_info(id);
        EXPECT_TRUE(info.in_vocabulary && info.kind == kind)
            << to_string(kind) << " " << to_string(pass) << " bench runs " << info.name
            << " (table kind " << to_string(info.kind) << ")";
      }
    }
  }
}

}  // namespace
}  // namespace modar::runtime
