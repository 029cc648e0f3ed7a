// Cluster model (modar/parallel.hpp, docs/cluster.md): collective times, the
// bytes of each collective, per-device memory and the pipeline bubble of
// small layouts (TP 2, PP 2, DP 2, ZeRO 1 and 3), derived by hand from the
// formulas in docs/cluster.md; and the MoD / DAR cluster effects.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>

#include "../common/config_cases.hpp"
#include "../common/roofline_profile.hpp"
#include "modar/base/errors.hpp"
#include "modar/cost_model.hpp"
#include "modar/parallel.hpp"

namespace modar {
namespace {

// d = 256, L = 8, H = 4 (d_h 64), GELU d_ff 1024, V = 1024 untied, s = 128,
// b = 2 (T = 256), bf16 (B = 2).
Config small() {
  Config c;
  c.model = {.d_model = 256, .n_layers = 8, .n_heads = 4, .vocab_size = 1024, .seq_len = 128};
  c.train.micro_batch = 2;
  c.device.profile = "a100-80gb-dgx";
  return c;
}

// The by-hand tests below derive the plain roofline and collective formulas
// of docs/cluster.md: the A100 on that path (common/roofline_profile.hpp).
const DeviceProfile& a100() {
  static const DeviceProfile profile = a100_roofline_profile();
  return profile;
}

const CommRecord* find_comm(const ClusterEstimate& c, const char* label, Collective kind,
                            Pass pass) {
  for (const CommRecord& op : c.comm) {
    if (std::strcmp(op.label, label) == 0 && op.kind == kind && op.pass == pass) {
      return &op;
    }
  }
  return nullptr;
}

// The one record of that label, kind and pass; a test failure (the
// exception gtest reports) when there is none.
const CommRecord& comm_record(const ClusterEstimate& c, const char* label, Collective kind,
                              Pass pass) {
  const CommRecord* op = find_comm(c, label, kind, pass);
  if (op == nullptr) {
    throw std::runtime_error(std::string("no ") + label + " " + to_string(kind) + " in the " +
                             to_string(pass) + " pass");
  }
  return *op;
}

void expect_relative(double actual, double expected, double tolerance = 1e-9) {
  EXPECT_NEAR(actual, expected, tolerance * std::max(1.0, std::fabs(expected)))
      << "expected " << expected;
}

TEST(Cluster, ProfilesCarryTheirNetworks) {
  const DeviceProfile p = load_profile("a100-80gb-dgx");
  ASSERT_TRUE(p.network.present);
  EXPECT_EQ(p.network.gpus_per_node, 8);
  EXPECT_EQ(p.network.intra_node.bus_bandwidth, 232.5e9);
  EXPECT_EQ(p.network.inter_node.bus_bandwidth, 21.5e9);
  EXPECT_EQ(p.ceilings.peak_flops_bf16, 312e12);
  for (const char* name : {"h100-80gb-dgx", "h800-80gb-hgx", "h200"}) {
    const DeviceProfile other = load_profile(name);
    EXPECT_TRUE(other.network.present) << name;
    EXPECT_FALSE(other.measured) << name;
  }
  // H800: reduced NVLink, below H100's.
  EXPECT_LT(load_profile("h800-80gb-hgx").network.intra_node.bus_bandwidth,
            load_profile("h100-80gb-dgx").network.intra_node.bus_bandwidth);
  // Round trip through TOML keeps the network.
  const DeviceProfile again = parse_profile_toml(to_toml(p), "round trip");
  EXPECT_EQ(again.network.inter_node.bus_bandwidth, 21.5e9);
  EXPECT_EQ(again.network.intra_node.latency_s, 3.4e-6);  // NCCL's ring Simple NVLink step
}

// The plain formula (profiles without kernel.sm_count, e.g. MPI between CPU
// ranks): latency x ceil(log2 p) steps (x2 all-reduce) + factor x bytes / busbw.
constexpr CollectiveEfficiency kPlainFormula{1.0, 1.0, false};

TEST(Cluster, CollectiveTimesByHand) {
  const NetworkProfile& net = a100().network;
  EXPECT_DOUBLE_EQ(collective_bus_factor(Collective::all_reduce, 8), 2.0 * 7.0 / 8.0);
  EXPECT_DOUBLE_EQ(collective_bus_factor(Collective::all_gather, 4), 3.0 / 4.0);
  EXPECT_DOUBLE_EQ(collective_bus_factor(Collective::send_recv, 2), 1.0);
  EXPECT_EQ(collective_time_s(net, Collective::all_reduce, 1e9, 1, NetLevel::intra_node), 0.0);
  // all-reduce of 1 GB over 8 NVSwitch ranks: 2 ceil(log2 8) = 6 latency steps.
  expect_relative(collective_time_s(net, Collective::all_reduce, 1e9, 8, NetLevel::intra_node, 1,
                                    kPlainFormula),
                  6 * 2e-6 + 1.75 * 1e9 / 232.5e9);
  // reduce-scatter over 64 ranks across nodes, one rank per node: one NIC.
  expect_relative(collective_time_s(net, Collective::reduce_scatter, 4e8, 64, NetLevel::inter_node,
                                    1, kPlainFormula),
                  6 * 4e-6 + (63.0 / 64.0) * 4e8 / 21.5e9);
  // 4 ranks per node drive 4 NICs; 16 per node would be capped by NVLink.
  expect_relative(collective_time_s(net, Collective::all_gather, 4e8, 64, NetLevel::inter_node, 4,
                                    kPlainFormula),
                  6 * 4e-6 + (63.0 / 64.0) * 4e8 / (4 * 21.5e9));
  expect_relative(collective_time_s(net, Collective::all_gather, 4e8, 64, NetLevel::inter_node, 16,
                                    kPlainFormula),
                  6 * 4e-6 + (63.0 / 64.0) * 4e8 / 232.5e9);
}

// A GPU profile's collectives follow NCCL's own cost model (docs/
// kernel_model.md "Collectives": NVIDIA/nccl src/graph/tuning.cc), derived
// here by hand from its table for the embedded A100 (busbw 232.5 GB/s NVLink,
// 21.5 GB/s per HDR NIC, ring Simple steps 3.4 us / 9.6 us, so NCCL's own
// step latencies unscaled): the fastest of ring / tree x LL / LL128 / Simple.
TEST(Cluster, CollectivesFollowNcclsCostModel) {
  const NetworkProfile& net = load_profile("a100-80gb-dgx-datasheet").network;
  // 100 KB all-reduce on the 8 GPUs of a node: latency-bound, ring LL:
  // 3.6 + 14 x 0.47 us, at a quarter of the bus bandwidth (the tree LL
  // 4.4 + 2 x 7 x 0.52 us + 1e5 / (0.5 x 0.9 x 232.5e9 / 3.8) is slower).
  const double small_s = (3.6 + 14 * 0.47) * 1e-6 + 1.75 * 1e5 / (232.5e9 / 4.0);
  expect_relative(collective_time_s(net, Collective::all_reduce, 1e5, 8, NetLevel::intra_node),
                  small_s);
  EXPECT_NEAR(1.75 * 1e5 / small_s / 1e9, 13.27, 0.01);  // the busbw nccl-tests would print
  // 1 GB: bandwidth-bound, ring Simple 8.4 + 14 x 3.4 us at the full busbw.
  const double large_s = (8.4 + 14 * 3.4) * 1e-6 + 1.75 * 1e9 / 232.5e9;
  expect_relative(collective_time_s(net, Collective::all_reduce, 1e9, 8, NetLevel::intra_node),
                  large_s);
  // 400 MB reduce-scatter over 64 nodes, one rank (NIC) each: ring Simple,
  // 63 network steps of 9.6 us.
  expect_relative(collective_time_s(net, Collective::reduce_scatter, 4e8, 64, NetLevel::inter_node),
                  (8.4 + 63 * 9.6) * 1e-6 + (63.0 / 64.0) * 4e8 / 21.5e9);
  // 100 MB all-reduce over 2 nodes of 8 (8 NICs: 172 GB/s): ring LL128
  // (10 + 28 x 1.9 + 2 x 4.0 us, 0.92 busbw) beats ring Simple (whose
  // latency NCCL raises x 1.9 across nodes) and both trees.
  const double bus = 8 * 21.5e9;
  const double ll128 = (10.0 + 28 * 1.9 + 2 * 4.0) * 1e-6 + (30.0 / 16.0) * 1e8 / (0.92 * bus);
  const double simple = 1.9 * (8.4 + 28 * 3.4 + 2 * 9.6) * 1e-6 + (30.0 / 16.0) * 1e8 / bus;
  ASSERT_LT(ll128, simple);
  expect_relative(collective_time_s(net, Collective::all_reduce, 1e8, 16, NetLevel::inter_node, 8),
                  ll128);
  // collective efficiency scales the bus bandwidth the protocols share.
  const CollectiveEfficiency half{0.5, 1.0};
  expect_relative(
      collective_time_s(net, Collective::all_reduce, 1e9, 8, NetLevel::intra_node, 1, half),
      (8.4 + 14 * 3.4) * 1e-6 + 1.75 * 1e9 / (0.5 * 232.5e9));
}

TEST(Cluster, MeasuredTableReplacesTheFormulaInsideItsRange) {
  DeviceProfile p = a100();
  CollectiveTable table;
  table.kind = Collective::all_reduce;
  table.ranks = 8;
  table.sizes_bytes = {1e6, 1e8};
  table.times_s = {1e-4, 1e-3};
  p.network.intra_node.tables.push_back(table);
  // log-log midpoint of the table: sqrt(1e6 1e8) = 1e7 bytes -> sqrt(1e-4 1e-3) s.
  expect_relative(collective_time_s(p.network, Collective::all_reduce, 1e7, 8,
                                    NetLevel::intra_node),
                  std::sqrt(1e-4 * 1e-3));
  // Another group size: the same bus bandwidth, time scaled by the bus factor.
  expect_relative(collective_time_s(p.network, Collective::all_reduce, 1e8, 2,
                                    NetLevel::intra_node),
                  1e-3 * (2.0 * 1.0 / 2.0) / (2.0 * 7.0 / 8.0));
  // Outside the range: the formula.
  expect_relative(collective_time_s(p.network, Collective::all_reduce, 1e9, 8, NetLevel::intra_node,
                                    1, kPlainFormula),
                  6 * 2e-6 + 1.75 * 1e9 / 232.5e9);
  // The table round-trips through TOML.
  const DeviceProfile again = parse_profile_toml(to_toml(p), "round trip");
  ASSERT_EQ(again.network.intra_node.tables.size(), 1u);
  EXPECT_EQ(again.network.intra_node.tables[0].times_s[1], 1e-3);
}

TEST(Cluster, NetworkSectionErrorsNameTheField) {
  const std::string head =
      "name = \"x\"\n[ceilings]\npeak_flops_bf16 = 1e12\npeak_flops_fp32 = 1e12\n"
      "memory_bandwidth = 1e12\nmemory_bytes = 1e9\n";
  auto error_of = [&](const std::string& network) {
    try {
      parse_profile_toml(head + network, "p.toml");
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string levels =
      "[network.intra_node]\nbus_bandwidth = 1e11\n[network.inter_node]\nbus_bandwidth = 1e10\n";
  EXPECT_EQ(error_of("[network]\ngpus_per_node = 8\n" + levels), "no error");
  // A root value that is not a table (written before [ceilings], so it stays at the root).
  try {
    parse_profile_toml("network = 1\n" + head, "p.toml");
    ADD_FAILURE() << "network = 1 accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "p.toml: network = 1: must be a table [network]");
  }
  EXPECT_EQ(error_of("[network]\ngpus_per_node = 0\n" + levels),
            "p.toml: network.gpus_per_node = 0: must be an integer in [1, 1024]");
  EXPECT_EQ(error_of("[network]\n[network.intra_node]\nbus_bandwidth = 1e11\n"),
            "p.toml: [network.inter_node] is missing (required when [network] is present)");
  EXPECT_EQ(error_of("[network]\n[network.intra_node]\nbus_bandwidth = -1\n"
                     "[network.inter_node]\nbus_bandwidth = 1e10\n"),
            "p.toml: network.intra_node.bus_bandwidth = -1: must be > 0 (bytes/s)");
  EXPECT_EQ(error_of("[network]\n[network.intra_node]\nbus_bandwith = 1e11\n"
                     "[network.inter_node]\nbus_bandwidth = 1e10\n"),
            "p.toml: unknown key 'network.intra_node.bus_bandwith'; allowed: name, "
            "bus_bandwidth, link_bandwidth, latency_s, [[collectives]]");
  EXPECT_EQ(error_of(levels + "[[network.inter_node.collectives]]\nkind = \"allreduce\"\n"
                              "ranks = 8\nsizes_bytes = [1.0]\ntimes_s = [1.0]\n"),
            "p.toml: network.inter_node.collectives[0].kind = \"allreduce\": must be "
            "\"all_reduce\", \"reduce_scatter\", \"all_gather\", \"all_to_all\" or \"send_recv\"");
  EXPECT_EQ(error_of(levels + "[[network.inter_node.collectives]]\nkind = \"all_reduce\"\n"
                              "ranks = 8\nsizes_bytes = [2.0, 1.0]\ntimes_s = [1.0, 2.0]\n"),
            "p.toml: network.inter_node.collectives[0].sizes_bytes = 1: must be strictly "
            "ascending");
}

TEST(Cluster, ParallelConfigValidation) {
  // The [[parallel]] rows of tests/data/config_errors.toml, on small().
  for (const auto& row : modar_test::config_case_errors("parallel", small()))
    EXPECT_EQ(row.actual, row.expected) << row.where;
  // TOML round trip keeps the new sections.
  Config c = small();
  apply_override(c, "parallel.tensor=2");
  apply_override(c, "parallel.sequence_parallel=true");
  apply_override(c, "device.count=2");
  apply_override(c, "cluster.gpus_per_node=4");
  const Config again = parse_config_toml(to_toml(c));
  EXPECT_EQ(again.parallel.tensor, 2);
  EXPECT_TRUE(again.parallel.sequence_parallel);
  EXPECT_EQ(again.cluster.gpus_per_node, 4);
}

TEST(Cluster, DefaultsLeaveTheSingleDeviceEstimateAlone) {
  const Config c = small();
  EXPECT_FALSE(cluster_engaged(c));
  const Estimate e = estimate(c, a100());
  EXPECT_EQ(e.cluster, nullptr);
}

// TP 2: Megatron's 2 all-reduces forward + 2 backward per layer of b s d B
// bytes; per-device activations split as in Korthikanti et al. 2022.
TEST(Cluster, TensorParallelTwoByHand) {
  Config c = small();
  c.parallel.tensor = 2;
  c.device.count = 2;
  const Estimate e = estimate(c, a100());
  ASSERT_NE(e.cluster, nullptr);
  const ClusterEstimate& k = *e.cluster;
  EXPECT_EQ(k.data, 1);
  EXPECT_EQ(k.tensor_level, NetLevel::intra_node);
  const double T = 2.0 * 128.0, d = 256.0, B = 2.0;
  const CommRecord& fwd = comm_record(k, "tp.layer", Collective::all_reduce, Pass::forward);
  const CommRecord& bwd = comm_record(k, "tp.layer", Collective::all_reduce, Pass::backward);
  EXPECT_EQ(fwd.bytes, T * d * B);
  EXPECT_EQ(fwd.count, 2.0 * 8.0);  // 2 per layer x 8 layers x 1 micro-batch
  EXPECT_EQ(bwd.count, 2.0 * 8.0);
  expect_relative(fwd.time_s, 2 * 2e-6 + 1.0 * T * d * B / 232.5e9);
  // Weights / gradients / optimizer: all parameters / 2 (t = 2, p = 1).
  const double P = e.params.total;
  expect_relative(e.memory.weights, P / 2 * B);
  expect_relative(e.memory.gradients, P / 2 * 4);
  expect_relative(e.memory.optimizer, P / 2 * 12);
  // Activations per layer: replicated 4 d B T + 8 T (norm in/out, rstd);
  // split (Q K V 3 d + attention out d + up 4d + GELU out 4d) B T + 4 b H s
  // (lse) over t = 2; plus the head's 2 B T d + 8 T.
  const double per_layer = 4 * d * B * T + 8 * T + ((3 * d + d + 4 * d + 4 * d) * B * T +
                                                     4 * 2.0 * 4.0 * 128.0) / 2.0;
  expect_relative(e.memory.activations, 8 * per_layer + 2 * B * T * d + 8 * T);
  // Sequence parallelism: the same bytes as RS + AG, replicated parts / t.
  c.parallel.sequence_parallel = true;
  const Estimate s = estimate(c, a100());
  const CommRecord& rs =
      comm_record(*s.cluster, "tp.layer", Collective::reduce_scatter, Pass::forward);
  EXPECT_EQ(rs.bytes, T * d * B);
  const double per_layer_sp = (4 * d * B * T + 8 * T) / 2.0 +
                              ((3 * d + d + 4 * d + 4 * d) * B * T + 4 * 2.0 * 4.0 * 128.0) / 2.0;
  expect_relative(s.memory.activations, 8 * per_layer_sp + (2 * B * T * d + 8 * T) / 2.0);
}

// DP 2 with ZeRO 0 / 1 / 3: gradient all-reduce (reduce-scatter) of 4 P bytes,
// states divided over the data-parallel group.
TEST(Cluster, DataParallelAndZeroByHand) {
  Config c = small();
  c.device.count = 2;
  const Estimate e0 = estimate(c, a100());
  const double P = e0.params.total;
  const CommRecord& ar =
      comm_record(*e0.cluster, "dp.grad", Collective::all_reduce, Pass::backward);
  expect_relative(ar.bytes, 4 * P);
  EXPECT_EQ(ar.ranks, 2);
  expect_relative(e0.memory.optimizer, 12 * P);
  // Plain data parallelism: the per-device memory items equal one device's.
  Config one = small();
  const MemoryBreakdown single = estimate_memory(one, a100());
  expect_relative(e0.memory.weights, single.weights);
  expect_relative(e0.memory.activations, single.activations);
  expect_relative(e0.memory.router_buffers, single.router_buffers);

  c.parallel.zero = 1;
  const Estimate e1 = estimate(c, a100());
  const CommRecord& rs =
      comm_record(*e1.cluster, "dp.grad", Collective::reduce_scatter, Pass::backward);
  const CommRecord& ag =
      comm_record(*e1.cluster, "dp.param_gather", Collective::all_gather, Pass::forward);
  expect_relative(rs.bytes, 4 * P);
  expect_relative(ag.bytes, 2 * P);
  expect_relative(e1.memory.optimizer, 12 * P / 2);
  expect_relative(e1.memory.gradients, 4 * P);
  expect_relative(e1.memory.weights, 2 * P);

  c.parallel.zero = 3;
  const Estimate e3 = estimate(c, a100());
  expect_relative(e3.memory.optimizer, 12 * P / 2);
  expect_relative(e3.memory.gradients, 4 * P / 2);
  expect_relative(e3.memory.weights, 2 * P / 2);
  const CommRecord& gather =
      comm_record(*e3.cluster, "zero3.param_gather", Collective::all_gather, Pass::forward);
  // One layer's weights in bf16, gathered forward and backward for 8 layers.
  const double layer_params = (e3.params.non_embedding - 256.0) / 8.0;
  expect_relative(gather.bytes, layer_params * 2);
  EXPECT_EQ(gather.count, 2.0 * 8.0);
  // The reduction is overlapped with the backward except the last bucket
  // (all of it here: the model is smaller than one 40M-parameter bucket).
  c.parallel.zero = 0;
  c.parallel.overlap_grad_reduce = false;
  const Estimate no_overlap = estimate(c, a100());
  expect_relative(no_overlap.cluster->grad_reduce_exposed_s, ar.time_s);
}

// DP 4 with ZeRO 2 (by hand): bf16 weights 2 P replicated, fp32 gradients
// 4 P / 4 and AdamW states 12 P / 4 sharded, activations as on one device;
// a reduce-scatter of the 4 P gradient bytes after EVERY micro-batch's
// backward (a rank keeps only its gradient shard), an all-gather of the 2 P
// updated weights per step.  ZeRO 1 reduces once per step.
TEST(Cluster, ZeroTwoByHand) {
  Config c = small();
  c.device.count = 4;
  c.train.global_batch = 16;  // micro-batch 2 x DP 4 x m = 2
  c.parallel = {.zero = 2, .overlap_grad_reduce = false};
  const Estimate e2 = estimate(c, a100());
  const double P = e2.params.total;
  EXPECT_EQ(e2.cluster->micro_batches, 2);
  expect_relative(e2.memory.weights, 2 * P);
  expect_relative(e2.memory.gradients, 4 * P / 4);
  expect_relative(e2.memory.optimizer, 12 * P / 4);
  const MemoryBreakdown single = estimate_memory(small(), a100());
  expect_relative(e2.memory.activations, single.activations);
  const CommRecord& rs =
      comm_record(*e2.cluster, "dp.grad", Collective::reduce_scatter, Pass::backward);
  const CommRecord& ag =
      comm_record(*e2.cluster, "dp.param_gather", Collective::all_gather, Pass::forward);
  expect_relative(rs.bytes, 4 * P);
  EXPECT_EQ(rs.count, 2.0);
  EXPECT_EQ(rs.ranks, 4);
  expect_relative(ag.bytes, 2 * P);
  EXPECT_EQ(ag.count, 1.0);
  // Ring reduce-scatter inside one node: 3/4 x 4 P / busbw + 2 latency steps.
  const NetworkProfile& net = network_or_default(a100());
  const double rs_s = 0.75 * 4 * P / net.intra_node.bus_bandwidth + 2 * net.intra_node.latency_s;
  expect_relative(rs.time_s, rs_s, 1e-9);
  expect_relative(e2.cluster->grad_reduce_exposed_s, 2 * rs_s, 1e-9);  // not overlapped
  // ZeRO 1: the same bytes, once per step, and unsharded gradients.
  c.parallel.zero = 1;
  const Estimate e1 = estimate(c, a100());
  expect_relative(e1.memory.gradients, 4 * P);
  expect_relative(e1.cluster->grad_reduce_exposed_s, rs_s, 1e-9);
  EXPECT_NEAR(e2.memory.peak, e1.memory.peak - 4 * P * 3 / 4, 1e-6 * e1.memory.peak);
}

// PyTorch FSDP FULL_SHARD (ZeRO 3) with gradient accumulation and activation
// checkpointing, by hand (docs/cluster.md; Zhao et al. 2023, PyTorch FSDP):
// DP 4, micro-batch 2, global batch 24, so m = 3 micro-batches per step.  Per
// micro-batch each layer's weights are all-gathered before its forward and
// again before its backward (the checkpointed recompute uses the backward's
// gather, not a third), and the gradients are reduce-scattered after every
// micro-batch's backward, in bf16 here (FSDP MixedPrecision reduce_dtype
// bf16 = modar's grad_reduce_in_fp32 = false).  small(): one layer holds
// 4 d^2 (attention) + 2 x d x 4d (GELU MLP) + 2 d (two norms) = 786944
// parameters; the model 8 x 786944 + 2 x V d (embedding, untied head) + d
// (final norm) = 6820096.  Plain ring formula inside a node of 4:
// (3/4) x bytes / 232.5 GB/s + ceil(log2 4) = 2 latency steps of 2 us.
TEST(Cluster, FsdpFullShardPerMicroBatchByHand) {
  Config c = small();
  c.device.count = 4;
  c.train.global_batch = 24;
  c.train.recompute = Recompute::full;
  c.train.grad_reduce_in_fp32 = GradReduceInFp32::param_dtype;
  c.parallel = {.zero = 3, .overlap_grad_reduce = false, .overlap_param_gather = false};
  const Estimate e = estimate(c, a100());
  const double layer_params = 4.0 * 256 * 256 + 2.0 * 256 * 1024 + 2.0 * 256;
  const double P = 8.0 * layer_params + 2.0 * 1024 * 256 + 256;
  ASSERT_EQ(layer_params, 786944.0);
  expect_relative(e.params.total, P);
  EXPECT_EQ(e.cluster->micro_batches, 3);
  // A missing record fails the test and reads as zero bytes and count.
  const auto record = [](const Estimate& est, const char* label, Collective kind, Pass pass) {
    const CommRecord* found = find_comm(*est.cluster, label, kind, pass);
    EXPECT_NE(found, nullptr) << label;
    return found != nullptr ? *found : CommRecord{};
  };
  const CommRecord gather = record(e, "zero3.param_gather", Collective::all_gather, Pass::forward);
  const CommRecord reduce = record(e, "dp.grad", Collective::reduce_scatter, Pass::backward);
  expect_relative(gather.bytes, 2.0 * layer_params);  // 1573888 bytes
  EXPECT_EQ(gather.count, 2.0 * 8.0 * 3.0);           // fwd + bwd, 8 layers, 3 micro-batches
  expect_relative(reduce.bytes, 2.0 * P);             // 13640192 bytes
  EXPECT_EQ(reduce.count, 3.0);                       // every micro-batch
  EXPECT_EQ(reduce.ranks, 4);
  const double gather_s = 0.75 * 2.0 * layer_params / 232.5e9 + 2.0 * 2e-6;
  const double reduce_s = 0.75 * 2.0 * P / 232.5e9 + 2.0 * 2e-6;
  expect_relative(gather.time_s, gather_s);
  expect_relative(reduce.time_s, reduce_s);
  // Nothing overlapped: all 48 gathers and 3 reductions on the critical path.
  expect_relative(e.cluster->grad_reduce_exposed_s, 3.0 * reduce_s);
  expect_relative(e.cluster->exposed_comm_s, 48.0 * gather_s + 3.0 * reduce_s);
  // fp32 reduction (FSDP reduce_dtype fp32, modar's bf16 default): twice the bytes.
  c.train.grad_reduce_in_fp32 = GradReduceInFp32::by_dtype;
  const CommRecord reduce32 =
      record(estimate(c, a100()), "dp.grad", Collective::reduce_scatter, Pass::backward);
  expect_relative(reduce32.bytes, 4.0 * P);
  EXPECT_EQ(reduce32.count, 3.0);
}

// FSDP's all-gathers and reduce-scatters run one after another on one NCCL
// process group (Zhao et al. 2023, section 3.3) over the same links, so
// with everything overlapped a micro-batch of compute C hides the 2 L
// gathers G first and the reduction R only in what they leave:
//   exposed reduction = (m - 1) x [max(0, G + R - C) - max(0, G - C)]
//                     + max([max(0, G/2 + R - 2C/3) - max(0, G/2 - 2C/3)], last bucket)
// (the last micro-batch hides behind its backward, about 2C/3, carrying the
// backward's half of the gathers).  The FSDP setup above on a slower 4-rank
// link (busbw 40 GB/s): G = 16 x (3/4 x 1573888 B / 40 GB/s + 4 us) =
// 0.536 ms and R = 3/4 x 13640192 B / 40 GB/s + 4 us = 0.260 ms each fit
// beside C (0.69 ms) but not together; the last bucket is the whole model
// (under 40M parameters), so the last micro-batch exposes all of R.
TEST(Cluster, FsdpGathersAndReductionShareTheChannel) {
  Config c = small();
  c.device.count = 4;
  c.train.global_batch = 24;  // m = 3
  c.train.grad_reduce_in_fp32 = GradReduceInFp32::param_dtype;
  c.parallel = {.zero = 3};
  DeviceProfile slow = a100();
  slow.network.intra_node.bus_bandwidth = 40e9;
  const Estimate e = estimate(c, slow);
  const double gather_s = 0.75 * 2.0 * 786944.0 / 40e9 + 2.0 * 2e-6;
  const double R = 0.75 * 2.0 * 6820096.0 / 40e9 + 2.0 * 2e-6;
  const double G = 2.0 * 8.0 * gather_s;
  const double C = e.cluster->stages[0].compute_s;  // the stage's compute per micro-batch
  ASSERT_LT(G, C);
  ASSERT_LT(R, C);
  ASSERT_GT(G + R, C);
  ASSERT_LT(G / 2.0 + R, 2.0 * C / 3.0 + R);  // the last window's share stays below R
  const double shared = 2.0 * (G + R - C) + R;
  expect_relative(e.cluster->grad_reduce_exposed_s, shared);
  // Each collective against the window alone would expose only the last R.
  EXPECT_GT(e.cluster->grad_reduce_exposed_s, 1.5 * R);
  // The gathers themselves stay hidden (2 g per layer < the layer's compute).
  expect_relative(e.cluster->exposed_comm_s, e.cluster->grad_reduce_exposed_s);
}

// PP 2 (1F1B): send of b s d B per boundary per micro-batch each way; the
// bubble is (p - 1) / m of the ideal time; interleaving divides it by v.
TEST(Cluster, PipelineTwoSendsAndBubble) {
  Config c = small();
  c.parallel = {.pipeline = 2, .balance_stages = false};
  c.device.count = 2;
  c.train.global_batch = 8;  // m = 4 micro-batches of 2
  const Estimate e = estimate(c, a100());
  const ClusterEstimate& k = *e.cluster;
  EXPECT_EQ(k.micro_batches, 4);
  ASSERT_EQ(k.stages.size(), 2u);
  EXPECT_EQ(k.stages[0].layers, 4);
  EXPECT_EQ(k.stages[1].layers, 4);
  const CommRecord& send = comm_record(k, "pp.activation", Collective::send_recv, Pass::forward);
  EXPECT_EQ(send.bytes, 2.0 * 128.0 * 256.0 * 2.0);
  EXPECT_EQ(send.count, 2.0 * 4.0);  // forward + backward, 4 micro-batches
  double slowest = 0.0;
  for (const StageSummary& s : k.stages) {
    slowest = std::max(slowest, s.compute_s + s.exposed_comm_s);
  }
  expect_relative(k.bubble_s, (2.0 - 1.0) / 4.0 * (4.0 * slowest));
  expect_relative(k.step_s, 4.0 * slowest + k.bubble_s + k.grad_reduce_exposed_s +
                                k.param_gather_exposed_s + k.optimizer_s + k.grad_norm_s +
                                k.step_overhead_s);
  // Memory: stage 0 holds embedding + 4 layers' weights, 2 micro-batches in
  // flight (p - 0); stage 1 holds one.
  const double P_layer = (e.params.non_embedding - 256.0) / 8.0;
  expect_relative(k.stages[0].params, 4 * P_layer + 1024.0 * 256.0);
  expect_relative(k.stages[1].params, 4 * P_layer + 1024.0 * 256.0 + 256.0);
  // Activations per layer (t = 1): (4 d + 3 d + d + 4 d + 4 d) B T + 8 T + 4 b H s.
  const double T = 256.0, d = 256.0, B = 2.0;
  const double per_layer = 16 * d * B * T + 8 * T + 4 * 2.0 * 4.0 * 128.0;
  expect_relative(k.stages[0].memory.activations, 4 * per_layer * 2.0);
  expect_relative(k.stages[1].memory.activations, (4 * per_layer + 2 * B * T * d + 8 * T) * 1.0);
  // Interleaved v = 2: bubble / ideal = (p - 1) / (v m).
  c.parallel.schedule = PipelineSchedule::interleaved;
  c.parallel.virtual_stages = 2;
  const Estimate i = estimate(c, a100());
  double slow_i = 0.0;
  for (const StageSummary& s : i.cluster->stages) {
    slow_i = std::max(slow_i, s.compute_s + s.exposed_comm_s);
  }
  expect_relative(i.cluster->bubble_s, 1.0 / (2.0 * 4.0) * (4.0 * slow_i));
  EXPECT_EQ(i.cluster->stages[0].chunk_layers.size(), 2u);
}

TEST(Cluster, BalancedPartitionMatchesBruteForce) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> cost(0.2, 3.0);
  for (int trial = 0; trial < 40; ++trial) {
    const int n = 5 + trial % 7;
    std::vector<double> c(static_cast<size_t>(n));
    for (double& x : c) {
      x = cost(rng);
    }
    const int64_t parts = 2 + trial % 3;
    const std::vector<int64_t> sizes = balance_pipeline_chunks(c, parts);
    ASSERT_EQ(static_cast<int64_t>(sizes.size()), parts);
    double worst = 0.0;
    int64_t at = 0;
    for (int64_t s : sizes) {
      ASSERT_GE(s, 1);
      double sum = 0.0;
      for (int64_t i = at; i < at + s; ++i) {
        sum += c[static_cast<size_t>(i)];
      }
      worst = std::max(worst, sum);
      at += s;
    }
    ASSERT_EQ(at, n);
    // Brute force over all cut positions (parts <= 4, n <= 11).
    double best = 1e300;
    std::vector<int> cuts(static_cast<size_t>(parts - 1));
    std::function<void(int, int)> search = [&](int index, int from) {
      if (index == parts - 1) {
        double w = 0.0;
        int start = 0;
        for (int k = 0; k <= parts - 1; ++k) {
          const int end = k < parts - 1 ? cuts[static_cast<size_t>(k)] : n;
          double sum = 0.0;
          for (int i = start; i < end; ++i) {
            sum += c[static_cast<size_t>(i)];
          }
          w = std::max(w, sum);
          start = end;
        }
        best = std::min(best, w);
        return;
      }
      for (int cut = from + 1; cut <= n - (parts - 1 - index); ++cut) {
        cuts[static_cast<size_t>(index)] = cut;
        search(index + 1, cut);
      }
    };
    search(0, 0);
    EXPECT_NEAR(worst, best, 1e-7 * best) << "trial " << trial;
  }
}

// MoD: routed layers cost about c of a full layer, so time-balanced stages
// hold different layer counts; the balanced bottleneck is never worse.
// The bisection of balance_pipeline_chunks() re-fills only where its last
// fills' recorded paths do not decide the bound: its split must be the plain
// bisection's (a fill at every step; written out here as the reference),
// including ties (integer and equal costs) and forced one-layer chunks.
std::vector<int64_t> bisection_filling_every_step(const std::vector<double>& cost, int64_t parts) {
  const int64_t n = static_cast<int64_t>(cost.size());
  const auto fill = [&](double bound, std::vector<int64_t>& sizes) {
    sizes.assign(static_cast<size_t>(parts), 0);
    int64_t chunk = 0;
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const size_t at = static_cast<size_t>(chunk);
      if (sizes[at] > 0 && chunk + 1 < parts &&
          (sum + cost[static_cast<size_t>(i)] > bound || n - i < parts - chunk)) {
        ++chunk;
        sum = 0.0;
      }
      sum += cost[static_cast<size_t>(i)];
      ++sizes[static_cast<size_t>(chunk)];
      if (sum > bound * (1.0 + 1e-12) &&
          (sizes[static_cast<size_t>(chunk)] > 1 || chunk + 1 == parts)) {
        return false;
      }
    }
    return chunk + 1 == parts;
  };
  double lo = *std::max_element(cost.begin(), cost.end());
  double hi = 0.0;
  for (double c : cost) {
    hi += c;
  }
  std::vector<int64_t> sizes, best;
  if (!fill(hi, best)) {
    return {};
  }
  for (int iteration = 0; iteration < 60 && hi - lo > 1e-9 * hi; ++iteration) {
    const double mid = 0.5 * (lo + hi);
    if (fill(mid, sizes)) {
      hi = mid;
      best = sizes;
    } else {
      lo = mid;
    }
  }
  return best;
}

TEST(Cluster, BalancedPartitionEqualsFillingEveryStep) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> real(0.2, 3.0);
  std::uniform_int_distribution<int> whole(1, 4);
  int compared = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const int n = 2 + trial % 97;
    const int64_t parts = 1 + trial % 16;
    if (parts > n) {
      continue;
    }
    std::vector<double> c(static_cast<size_t>(n));
    for (double& x : c) {
      x = trial % 3 == 0 ? real(rng) : trial % 3 == 1 ? double(whole(rng)) : 1.0;
    }
    c.front() += trial % 5 == 0 ? 7.5 : 0.0;  // a heavy first layer (the embedding)
    const std::vector<int64_t> reference = bisection_filling_every_step(c, parts);
    ASSERT_FALSE(reference.empty());
    EXPECT_EQ(balance_pipeline_chunks(c, parts), reference) << "trial " << trial;
    ++compared;
  }
  EXPECT_GT(compared, 500);
}

TEST(Cluster, ModStagesBalancedByTime) {
  Config c = small();
  c.model.n_layers = 12;
  c.model.vocab_size = 32768;  // a heavy head on the last stage
  c.mod.every = 2;
  c.parallel.pipeline = 3;
  c.device.count = 3;
  c.train.global_batch = 12;
  const Estimate balanced = estimate(c, a100());
  c.parallel.balance_stages = false;
  const Estimate equal = estimate(c, a100());
  auto bottleneck = [](const ClusterEstimate& k) {
    double worst = 0.0;
    for (const StageSummary& s : k.stages) {
      worst = std::max(worst, s.compute_s + s.exposed_comm_s);
    }
    return worst;
  };
  EXPECT_LT(bottleneck(*balanced.cluster), bottleneck(*equal.cluster));
  EXPECT_LT(balanced.time.step_s, equal.time.step_s);
  // The last stage (head) gets fewer layers than the first.
  EXPECT_LT(balanced.cluster->stages[2].layers, balanced.cluster->stages[0].layers);
  int64_t total = 0;
  for (const StageSummary& s : balanced.cluster->stages) {
    total += s.layers;
  }
  EXPECT_EQ(total, 12);
}

// DAR across stages: boundary j carries H_0 + the completed blocks; with
// interleaving the receiving rank caches what it saw in its previous chunk.
TEST(Cluster, DarBankAcrossStagesByHand) {
  Config c = small();
  c.dar = {.variant = DarVariant::dar, .block_layers = 2, .streams = 2};
  c.parallel = {.pipeline = 2, .balance_stages = false};
  c.device.count = 2;
  c.train.global_batch = 8;
  const double entry = 2.0 * 256.0 * (256.0 * 2.0 + 4.0);  // n T (d B + 4)
  const Estimate e = estimate(c, a100());
  // One boundary after layer 4: H_0 + 2 blocks.
  expect_relative(e.cluster->bank_send_bytes_uncached, 3 * entry);
  expect_relative(e.cluster->bank_send_bytes_cached, 3 * entry);
  // The bank alone crosses: no residual stream besides it.
  expect_relative(e.cluster->stages[0].send_bytes, 3 * entry);
  // Interleaved v = 2: chunks of 2 layers, boundaries after layers 2, 4, 6:
  // uncached 2 + 3 + 4 entries; cached 2 + (3 - 2) + (4 - 3).
  c.parallel.schedule = PipelineSchedule::interleaved;
  c.parallel.virtual_stages = 2;
  const Estimate i = estimate(c, a100());
  expect_relative(i.cluster->bank_send_bytes_uncached, 9 * entry);
  expect_relative(i.cluster->bank_send_bytes_cached, 4 * entry);
  c.parallel.dar_bank_cache = false;
  const Estimate nocache = estimate(c, a100());
  EXPECT_GT(nocache.time.step_s, i.time.step_s);
  // Bank memory per stage: entries up to its last chunk's end x micro-batches
  // in flight (stage 0: p + (p - 1) / v = 2.5; stage 1: 1).
  expect_relative(i.cluster->stages[0].memory.dar_bank, 4 * entry * 2.5);
  expect_relative(i.cluster->stages[1].memory.dar_bank, 5 * entry * 1.0);
}

// Depth reads under TP: replicated on every tensor rank without SP, sharded
// by tokens (local) with SP.
TEST(Cluster, DarDepthReadsUnderTensorParallelism) {
  Config c = small();
  c.dar.variant = DarVariant::dar;
  c.parallel.tensor = 2;
  c.device.count = 2;
  const Estimate replicated = estimate(c, a100());
  EXPECT_GT(replicated.cluster->dar_replicated_s, 0.0);
  c.parallel.sequence_parallel = true;
  const Estimate sharded = estimate(c, a100());
  EXPECT_EQ(sharded.cluster->dar_replicated_s, 0.0);
  EXPECT_LT(sharded.memory.dar_bank, replicated.memory.dar_bank);
  expect_relative(sharded.memory.dar_bank * 2.0, replicated.memory.dar_bank);
}

// MoD under SP: per-sequence top-k needs the whole sequence's router scores:
// an all-gather of b s fp32 scores per routed layer; TP collectives of routed
// layers carry b k rows.
TEST(Cluster, ModRouterScoresUnderSequenceParallelism) {
  Config c = small();
  c.mod = {.capacity = 0.125, .every = 2};
  c.parallel = {.tensor = 2, .sequence_parallel = true};
  c.device.count = 2;
  const Estimate e = estimate(c, a100());
  EXPECT_EQ(e.cluster->mod_score_gather_bytes, 2.0 * 128.0 * 4.0 * 4.0);  // 4 routed layers
  const CommRecord& scores =
      comm_record(*e.cluster, "tp.mod_router_scores", Collective::all_gather, Pass::forward);
  EXPECT_EQ(scores.bytes, 2.0 * 128.0 * 4.0);
  const CommRecord& routed =
      comm_record(*e.cluster, "tp.routed_layer", Collective::all_gather, Pass::forward);
  EXPECT_EQ(routed.bytes, 2.0 * 16.0 * 256.0 * 2.0);  // b k d B, k = 16
}

// Gradient traffic follows total parameters: a model with 1.5x the
// parameters reduces 1.5x the bytes whatever its FLOPs per token.
TEST(Cluster, GradientTrafficFollowsParameters) {
  Config c = small();
  c.device.count = 16;
  c.cluster.gpus_per_node = 8;
  const Estimate dense = estimate(c, a100());
  c.mod.every = 2;
  c.mod.capacity = 0.125;
  c.model.n_layers = 12;  // 1.5x the layers, fewer FLOPs per token per layer
  const Estimate mod = estimate(c, a100());
  const CommRecord& a =
      comm_record(*dense.cluster, "dp.grad", Collective::all_reduce, Pass::backward);
  const CommRecord& b =
      comm_record(*mod.cluster, "dp.grad", Collective::all_reduce, Pass::backward);
  expect_relative(b.bytes / a.bytes, mod.params.total / dense.params.total);
  EXPECT_EQ(a.level, NetLevel::inter_node);
}


// Where this erodes MoD's wall-clock advantage (docs/cluster.md): a MoD model
// with 1.5x the layers (about 1.4x the parameters, fewer FLOPs per token)
// steps faster than the dense one on 16 GPUs, but on 2048 GPUs (one
// micro-batch per GPU, the backward too short to hide the reduction) its
// larger gradient reduce-scatter is exposed and the advantage is gone.
TEST(Cluster, ModAdvantageErodesWithDataParallelScale) {
  auto step = [](int64_t layers, int64_t every, int64_t gpus, double* exposed) {
    Config c;
    c.model = {.d_model = 2048, .n_layers = layers, .n_heads = 16};
    c.mod.every = every;
    c.train = {.micro_batch = 1, .global_batch = 2048};
    c.device = {.profile = "a100-80gb-dgx", .count = gpus};
    c.parallel.zero = 1;
    const Estimate e = estimate(c, a100());
    *exposed = e.cluster->grad_reduce_exposed_s;
    return e.time.step_s;
  };
  double dense_small = 0, mod_small = 0, dense_large = 0, mod_large = 0;
  const double ratio_small = step(36, 2, 16, &mod_small) / step(24, 0, 16, &dense_small);
  const double ratio_large = step(36, 2, 2048, &mod_large) / step(24, 0, 2048, &dense_large);
  EXPECT_LT(ratio_small, 1.0);
  EXPECT_GT(ratio_large, ratio_small);
  EXPECT_GT(mod_large, dense_large);  // the exposed reduction follows parameters
}

// train.grad_accumulation = unfused (Megatron-LM 2021 DDP param hook,
// main_grad.add_(grad)): every micro-batch reads the fp32 main gradient (4 B)
// and the bf16 gradient (2 B) of each of the rank's parameters and writes the
// main gradient back (4 B), at the memory-bound ceiling, plus one launch.  By
// hand: 10 P bytes per micro-batch; DP 2, 4 micro-batches, no pipeline, the
// reduction not overlapped (so it does not depend on the compute): the step
// grows by exactly 4 x (10 P / bandwidth + launch).  One device: the same.
TEST(Cluster, UnfusedGradientAccumulationByHand) {
  const DeviceCeilings& ceilings = a100().ceilings;
  const double bandwidth = 1.733e12;  // achievable_bandwidth of the profile (85% of 2039 GB/s)
  ASSERT_EQ(ceilings.achievable_bandwidth, bandwidth);
  for (int64_t devices : {1, 2}) {
    Config c = small();
    c.device.count = devices;
    c.train.global_batch = 8 * devices;  // 4 micro-batches of 2 per device
    c.parallel.overlap_grad_reduce = false;
    const Estimate fused = estimate(c, a100());
    c.train.grad_accumulation = GradAccumulation::unfused;
    const Estimate unfused = estimate(c, a100());
    const double P = fused.params.total;
    const double per_micro_batch = 10.0 * P / bandwidth + ceilings.launch_overhead_s;
    const double expected = 4.0 * per_micro_batch;
    EXPECT_NEAR(unfused.time.step_s - fused.time.step_s, expected, 1e-6 * expected);
    EXPECT_EQ(unfused.cluster != nullptr, devices > 1);
  }
  // The default is fused (what Megatron-Core / Transformer Engine do).
  EXPECT_EQ(Config{}.train.grad_accumulation, GradAccumulation::fused);
  try {
    parse_config_toml("[train]\ngrad_accumulation = \"hook\"\n");
    ADD_FAILURE() << "an unknown grad_accumulation was accepted";
  } catch (const ConfigError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("train.grad_accumulation"), std::string::npos) << message;
    EXPECT_NE(message.find("unfused"), std::string::npos) << message;
  }
}

// The main gradients by hand on DP 2, 4 micro-batches, the reduction not
// overlapped, for a dtype and train.grad_reduce_in_fp32: the unfused
// accumulation moves `accumulation` bytes per parameter per micro-batch; the
// all-reduce moves `reduced` x P (plain formula: bus factor 1 on 2 ranks at
// 232.5 GB/s plus 2 latency steps of 2 us); the norm pass on one device (the
// cluster adds its 4-byte all-reduce) moves `norm` bytes per parameter.
// Memory keeps 4 P of gradients (the fp32 copy at the step).
void expect_main_gradients_by_hand(DType dtype, GradReduceInFp32 setting, double accumulation,
                                   double reduced, double norm) {
  const double bandwidth = 1.733e12;  // the profile's achievable_bandwidth
  const double launch = a100().ceilings.launch_overhead_s;
  Config one = small();
  one.train.dtype = dtype;
  one.train.grad_reduce_in_fp32 = setting;
  Config c = one;
  c.device.count = 2;
  c.train.global_batch = 16;  // 4 micro-batches of 2 per device
  c.parallel.overlap_grad_reduce = false;
  const Estimate fused = estimate(c, a100());
  c.train.grad_accumulation = GradAccumulation::unfused;
  const Estimate unfused = estimate(c, a100());
  const double P = fused.params.total;
  const double accumulation_s = 4.0 * (accumulation * P / bandwidth + launch);
  EXPECT_NEAR(unfused.time.step_s - fused.time.step_s, accumulation_s, 1e-6 * accumulation_s);
  const CommRecord& ar =
      comm_record(*fused.cluster, "dp.grad", Collective::all_reduce, Pass::backward);
  expect_relative(ar.bytes, reduced * P);
  expect_relative(ar.time_s, 2 * 2e-6 + reduced * P / 232.5e9);
  expect_relative(fused.cluster->grad_reduce_exposed_s, ar.time_s);
  expect_relative(fused.memory.gradients, 4 * P);
  expect_relative(estimate(one, a100()).time.grad_norm_s, norm * P / bandwidth + launch, 1e-12);
}

// fp16 training keeps fp16 main gradients at "auto" (Megatron's DDP: the
// gradient buffer in the parameters' dtype unless
// --accumulate-allreduce-grads-in-fp32, which only bf16 forces): the unfused
// accumulation reads main gradient and gradient and writes the main gradient,
// 3 x 2 bytes; the all-reduce moves 2 P; the norm pass copies the fp16
// gradients into fp32, unscales them and reads them: (2 + 4) + 8 + 4 bytes.
TEST(Cluster, Fp16MainGradientsByHand) {
  expect_main_gradients_by_hand(DType::fp16, GradReduceInFp32::by_dtype, 6.0, 2.0, 18.0);
}

// train.grad_reduce_in_fp32 set against the dtype's default: fp16 with fp32
// main gradients (--accumulate-allreduce-grads-in-fp32) accumulates
// 4 + 2 + 4 = 10 bytes, all-reduces 4 P, and its norm pass unscales (8) and
// reads (4) without a copy: 12 bytes.  bf16 with bf16 main gradients
// (--grad-reduce-in-bf16) accumulates 3 x 2 bytes, all-reduces 2 P, and its
// norm pass copies them into fp32 (2 + 4) and reads them (4): 10 bytes.
// fp32 training keeps fp32 main gradients whatever the setting: 12 bytes
// accumulated (4 + 4 + 4), 4 P reduced, the norm reads 4.
TEST(Cluster, GradReduceInFp32ByHand) {
  expect_main_gradients_by_hand(DType::fp16, GradReduceInFp32::fp32, 10.0, 4.0, 12.0);
  expect_main_gradients_by_hand(DType::bf16, GradReduceInFp32::param_dtype, 6.0, 2.0, 10.0);
  expect_main_gradients_by_hand(DType::fp32, GradReduceInFp32::param_dtype, 12.0, 4.0, 4.0);
}

// Megatron-LM's pipeline scatter / gather (Narayanan et al. 2021, section
// 4.1) under TP 2 without SP: each tensor rank sends half the b s d B
// activation, and the receiving tensor group all-gathers the two halves: one
// all-gather of b s d B = 2 x 128 x 256 x 2 bytes over 2 NVLink ranks per
// send (plain formula: one latency step of 2 us + (1/2) x bytes / 232.5 GB/s),
// forward and backward per micro-batch.  With SP the activation is already
// sharded by tokens: no gather.
TEST(Cluster, PipelineScatterGatherUnderTensorParallelism) {
  Config c = small();
  c.parallel = {.tensor = 2, .pipeline = 2, .balance_stages = false};
  c.device.count = 4;
  c.train.global_batch = 8;  // m = 4 micro-batches of 2
  const Estimate e = estimate(c, a100());
  const CommRecord& send =
      comm_record(*e.cluster, "pp.activation", Collective::send_recv, Pass::forward);
  const CommRecord& gather =
      comm_record(*e.cluster, "pp.gather", Collective::all_gather, Pass::forward);
  const double activation = 2.0 * 128.0 * 256.0 * 2.0;
  EXPECT_EQ(send.bytes, activation / 2.0);
  EXPECT_EQ(gather.bytes, activation);
  EXPECT_EQ(gather.ranks, 2);
  EXPECT_EQ(gather.count, 2.0 * 4.0);
  expect_relative(gather.time_s, 2e-6 + 0.5 * activation / 232.5e9);
  c.parallel.sequence_parallel = true;
  const Estimate sp = estimate(c, a100());
  EXPECT_EQ(find_comm(*sp.cluster, "pp.gather", Collective::all_gather, Pass::forward), nullptr);
}

// train.attention_kernel = unfused (Megatron-LM 2021 CoreAttention), by hand
// for one device without recompute: per layer and micro-batch the two
// batched GEMMs run the whole s x s square (4 s^2 d_h FLOPs per head forward,
// twice that backward) at the GEMM ceiling, plus the score traffic: with
// attention dropout (the 2021 code's 0.1) forward 6 passes of 2 B and the
// 1-byte dropout mask written, backward 9 passes and the mask read; 3
// launches each.  (Without dropout 4 and 7 passes, no mask, 2 launches:
// test_megatron_core.cpp.)
TEST(Cluster, UnfusedAttentionByHand) {
  Config c = small();  // b 2, heads 4, s 128, d_h 64, 8 layers, one micro-batch
  c.train.attention_kernel = AttentionKernel::unfused;
  c.train.attention_dropout = 0.1;
  const Estimate e = estimate(c, a100());
  const DeviceCeilings& ceilings = a100().ceilings;
  const double scores = 2.0 * 4.0 * 128.0 * 128.0;
  const double flop_rate = 267.9e12, bandwidth = 1.733e12;  // the profile's achievable ceilings
  const double forward = 4.0 * scores * 64.0 / flop_rate + (6.0 * 2.0 + 1.0) * scores / bandwidth +
                         3.0 * ceilings.launch_overhead_s;
  const double backward = 8.0 * scores * 64.0 / flop_rate +
                          (9.0 * 2.0 + 1.0) * scores / bandwidth + 3.0 * ceilings.launch_overhead_s;
  const OpKindTime& attention = e.time.by_kind[static_cast<size_t>(OpKind::attention)];
  const double expected = 8.0 * (forward + backward);
  EXPECT_NEAR(attention.time_s, expected, 1e-9 * expected);
}

// parallel.tp_comm_overlap (docs/cluster.md "Overlap"): "none" exposes every
// tensor-parallel all-reduce; "backward" hides each column-parallel linear's
// input-gradient all-reduce behind its weight-gradient GEMM, so per layer at
// most 2 backward all-reduces are hidden, the forward ones never; without
// sequence parallelism "full" is "backward".  One pipeline stage: the step
// shrinks by exactly the hidden time.
TEST(Cluster, TensorParallelOverlapHidesOnlyTheBackwardAllReduces) {
  Config c = small();
  c.parallel = {.tensor = 2, .tp_comm_overlap = TpCommOverlap::none};
  c.device.count = 2;
  const Estimate none = estimate(c, a100());
  EXPECT_EQ(none.cluster->overlapped_comm_s, 0.0);
  c.parallel.tp_comm_overlap = TpCommOverlap::backward;
  const Estimate backward = estimate(c, a100());
  const ClusterEstimate& k = *backward.cluster;
  const CommRecord& fwd = comm_record(k, "tp.layer", Collective::all_reduce, Pass::forward);
  const CommRecord& bwd = comm_record(k, "tp.layer", Collective::all_reduce, Pass::backward);
  EXPECT_EQ(fwd.exposed_fraction, 1.0);
  EXPECT_LT(bwd.exposed_fraction, 1.0);
  const double hidden = k.overlapped_comm_s;
  EXPECT_GT(hidden, 0.0);
  EXPECT_LE(hidden, 8.0 * 2.0 * bwd.time_s * (1.0 + 1e-12));  // 8 layers x 2 all-reduces
  expect_relative(none.time.step_s - backward.time.step_s, hidden, 1e-9);
  expect_relative(hidden, bwd.count * bwd.time_s * (1.0 - bwd.exposed_fraction), 1e-9);
  c.parallel.tp_comm_overlap = TpCommOverlap::full;
  EXPECT_EQ(estimate(c, a100()).time.step_s, backward.time.step_s);
  // With SP, "full" also hides forward all-gathers / reduce-scatters.
  c.parallel.sequence_parallel = true;
  const double sp_full = estimate(c, a100()).time.step_s;
  c.parallel.tp_comm_overlap = TpCommOverlap::backward;
  const double sp_backward = estimate(c, a100()).time.step_s;
  EXPECT_LT(sp_full, sp_backward);
}

// The gradient norm once per step (docs/kernel_model.md "Per-step costs"): a
// read of the 4-byte fp32 main gradient per parameter at the memory-bound
// rate, plus one launch; fp16 also unscales in place (+ 8 B read + write).
TEST(Cluster, GradientNormByHand) {
  Config c = small();
  const double bandwidth = 1.733e12, launch = a100().ceilings.launch_overhead_s;
  const Estimate e = estimate(c, a100());
  const double P = e.params.total;
  expect_relative(e.time.grad_norm_s, 4.0 * P / bandwidth + launch, 1e-12);
  c.train.dtype = DType::fp16;
  const Estimate half = estimate(c, a100());
  // fp16: its fp16 main gradients copied into fp32 (2 + 4), unscaled (8), read (4).
  expect_relative(half.time.grad_norm_s, 18.0 * P / bandwidth + launch, 1e-12);
  expect_relative(half.time.step_s,
                  half.time.accumulation_steps * half.time.micro_batch_s + half.time.optimizer_s +
                      half.time.grad_norm_s + half.time.step_overhead_s,
                  1e-12);
  // Decode steps have none.
  EXPECT_EQ(estimate(c, a100(), StepKind::decode).time.grad_norm_s, 0.0);
}

}  // namespace
}  // namespace modar
