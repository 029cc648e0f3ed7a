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

namespace modar::runtime {
namespace {

// One CPU backend shared by the forwarding test doubles below.
Backend* cpu_backend_storage() {
  static std::unique_ptr<Backend> backend = make_cpu_backend();
  return backend.get();
}

// Counts the ops executed through it (by OpId), forwarding them to the CPU.
class CountingBackend final : public ForwardingBackend {
 public:
  CountingBackend() : ForwardingBackend(*cpu_backend_storage()) {}
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
  Backend& cpu = *cpu_backend_storage();
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

// A small shape per vocabulary kind (ops.hpp's dims), for running benches.
std::vector<OpShape> small_shapes(OpKind kind) {
  auto make = [kind](std::array<int64_t, 7> dims) {
    OpShape shape;
    shape.kind = kind;
    shape.dtype = DType::fp32;
    shape.dims = dims;
    return shape;
  };
  switch (kind) {
    case OpKind::gemm:
      return {make({8, 8, 8, 1, 0, 0, 0})};
    case OpKind::attention:
      return {make({1, 2, 1, 8, 8, 8, 1})};
    case OpKind::rmsnorm:
    case OpKind::router:
    case OpKind::gather:
    case OpKind::scatter_add:
    case OpKind::embedding:
      return {make({8, 8, 0, 0, 0, 0, 0})};
    case OpKind::rope:
      return {make({8, 3, 8, 0, 0, 0, 0})};
    case OpKind::topk:
      return {make({2, 8, 4, 0, 0, 0, 0})};
    case OpKind::depth_read_prefix:
      return {make({8, 3, 4, 8, 2, static_cast<int64_t>(DarVariant::dar), 0})};
    case OpKind::depth_read_merge:
      return {make({8, 2, 8, static_cast<int64_t>(DarVariant::dar), 0, 0, 0})};
    case OpKind::dar_coefficients:
      return {make({8, 2, 8, 5, 0, 0, 0})};
    case OpKind::dar_write:
      return {make({8, 2, 8, 1, 1, 0, 0}), make({8, 1, 8, 1, 0, 0, 0}),
              make({8, 2, 8, 2, 0, 0, 0})};
    case OpKind::elementwise:
      // 1 input: GELU; 2 inputs: add; backward 2 outputs: SwiGLU, else GELU.
      return {make({64, 1, 1, 0, 0, 0, 0}), make({64, 2, 1, 0, 0, 0, 0}),
              make({64, 2, 2, 0, 0, 0, 0})};
    case OpKind::cross_entropy:
      return {make({8, 16, 0, 0, 0, 0, 0})};
    case OpKind::optimizer_update:
      return {make({64, 0, 0, 0, 0, 0, 0})};
    case OpKind::expert_gemm:
      return {make({3, 10, 8, 6, 1500, 0, 0}), make({3, 10, 8, 6, 1000, 1, 0})};
    case OpKind::moe_topk:
      return {make({8, 6, 2, 0, 0, 0, 0})};
    case OpKind::permute:
      return {make({16, 8, 8, 0, 0, 0, 0})};
    case OpKind::unpermute:
      return {make({16, 8, 8, 2, 0, 0, 0})};
  }
  return {};
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
