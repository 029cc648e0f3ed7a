// The Megatron-Core settings of the cluster model (docs/cluster.md), each
// checked against a count derived by hand from the layout's definition:
// expert tensor parallelism and Megatron-Core's folding of the expert groups.
// Collective times are taken from collective_time_s() at the hand-derived
// bytes, group size and network level, so these tests hold the model's
// bytes, counts and placement whatever the network model's curves are.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>

#include "../common/config_error_of.hpp"
#include "../common/model_files.hpp"
#include "../common/moe_families.hpp"
#include "modar/base/errors.hpp"
#include "modar/cost_model.hpp"
#include "modar/parallel.hpp"

namespace modar {
namespace {

const DeviceProfile& h100() {
  static const DeviceProfile profile = load_profile("h100-80gb-dgx");
  return profile;
}

void expect_relative(double actual, double expected, double tolerance = 1e-9) {
  EXPECT_NEAR(actual, expected, tolerance * std::max(1.0, std::fabs(expected)))
      << "expected " << expected;
}

// Every record of the step with this label, kind and pass.
double comm_count(const ClusterEstimate& c, const char* label, Collective kind, Pass pass,
                  const CommRecord** found = nullptr) {
  double count = 0.0;
  for (const CommRecord& op : c.comm) {
    if (std::strcmp(op.label, label) == 0 && op.kind == kind && op.pass == pass) {
      count += op.count;
      if (found != nullptr) {
        *found = &op;
      }
    }
  }
  return count;
}

// A small MoE: d 1024, 4 layers, 16 heads of 64, SwiGLU, vocab 32000 untied,
// 8 experts of width 512, top-2, every layer MoE, dropless; s = 1024, micro-
// batch 1, global batch 8 sequences; bf16 (B = 2); 8 H100 in one node
// (tests/data/models/small_moe_1024x4.toml).
Config small_moe() {
  return modar_test::model_file("small_moe_1024x4");
}

ClusterEstimate cluster_of(const Config& c) {
  const Estimate e = estimate(c, h100());
  return *e.cluster;
}

// TP 2 x EP 8 x expert TP 1 on 8 GPUs (Megatron-Core accepts it: the world of
// 8 is divisible by expert_tensor x expert x pipeline = 1 x 8 x 1; the stage's
// tensor x data = 2 x 4 ranks fold into expert_tensor x expert x expert_data
// = 1 x 8 x 1).
Config tp2_ep8_etp1() {
  Config c = small_moe();
  c.parallel = {.tensor = 2, .sequence_parallel = true, .zero = 1, .expert = 8, .expert_tensor = 1};
  return c;
}

TEST(MegatronCore, ExpertTensorFoldingRule) {
  Config c = tp2_ep8_etp1();
  EXPECT_NO_THROW(validate(c));
  EXPECT_EQ(c.parallel.data(c.device.count), 4);
  EXPECT_EQ(c.parallel.expert_data(c.device.count), 1);
  // EP 8 x expert TP 2 = 16 does not divide the 8 ranks of the stage.
  c.parallel.expert_tensor = 2;
  try {
    validate(c);
    ADD_FAILURE() << "EP 8 x expert TP 2 on 8 GPUs accepted";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("parallel.expert = 8"), std::string::npos) << what;
    EXPECT_NE(what.find("must divide the ranks of a pipeline stage"), std::string::npos) << what;
    EXPECT_NE(what.find("= 8"), std::string::npos) << what;
  }
  // Expert TP 0 means the tensor size: EP 4 x TP 2 = 8 fits.
  c.parallel.expert_tensor = 0;
  c.parallel.expert = 4;
  EXPECT_NO_THROW(validate(c));
  EXPECT_EQ(c.parallel.expert_data(c.device.count), 1);
  // Expert TP apart from TP needs SP under tensor parallelism.
  c = tp2_ep8_etp1();
  c.parallel.sequence_parallel = false;
  EXPECT_THROW(validate(c), ConfigError);
  // Without experts the expert tensor size must stay the tensor size.
  Config dense = tp2_ep8_etp1();
  dense.moe = MoeConfig{};
  dense.parallel.expert = 1;
  EXPECT_THROW(validate(dense), ConfigError);
  // Must divide the expert width.
  c = tp2_ep8_etp1();
  c.parallel.expert = 2;
  c.parallel.expert_tensor = 3;
  c.device.count = 12;
  c.train.global_batch = 12;
  EXPECT_THROW(validate(c), ConfigError);
}

TEST(MegatronCore, ExpertTensorOneMemoryByHand) {
  const Config c = tp2_ep8_etp1();
  const ClusterEstimate cl = cluster_of(c);
  ASSERT_EQ(cl.stages.size(), 1u);
  EXPECT_EQ(cl.expert, 8);
  EXPECT_EQ(cl.expert_tensor, 1);
  EXPECT_EQ(cl.expert_data, 1);
  const double d = 1024, L = 4, V = 32000, f = 512, E = 8, dff = 2048;
  // Parameters: attention 4 d^2 per layer (16 heads of 64 = d), 2 norms, a
  // router d x E per MoE layer (every layer), the experts 3 d f each; the
  // dense FFN is replaced.  Embedding and untied head V d, final norm d.
  (void)dff;
  const double experts = L * E * 3.0 * d * f;
  const double dense = L * (4.0 * d * d + 2.0 * d + d * E) + 2.0 * V * d + d;
  const ParamCounts params = count_params(c);
  expect_relative(params.total, dense + experts);
  // A rank holds half the dense parameters (TP 2) and one expert at full
  // width (EP 8, expert TP 1).
  const double dense_rank = dense / 2.0;
  const double expert_rank = experts / 8.0;
  const MemoryBreakdown& mem = cl.stages[0].memory;
  expect_relative(mem.weights, 2.0 * (dense_rank + expert_rank));
  expect_relative(mem.gradients, 4.0 * (dense_rank + expert_rank));
  // ZeRO 1 shards the dense states over DP 4, the experts' over expert DP 1.
  expect_relative(mem.optimizer, 12.0 * (dense_rank / 4.0 + expert_rank));
}

TEST(MegatronCore, ExpertTensorOneCommunicationByHand) {
  const Config c = tp2_ep8_etp1();
  const ClusterEstimate cl = cluster_of(c);
  const NetworkProfile& net = h100().network;
  const double d = 1024, L = 4, B = 2, s = 1024;
  const double m = 8.0 / (1.0 * 4.0);  // global 8 / (micro 1 x DP 4)
  EXPECT_EQ(cl.micro_batches, 2);
  // A rank dispatches its T / t = 512 tokens x top-2 = 1024 slots of d bf16
  // over the EP group: ranks 0..7 (folded index stride expert TP 1), one node.
  const double a2a_bytes = 512.0 * 2.0 * d * B;
  const CommRecord* a2a = nullptr;
  EXPECT_DOUBLE_EQ(comm_count(cl, "ep.dispatch_combine", Collective::all_to_all, Pass::forward, &a2a),
                   2.0 * L * m);
  ASSERT_NE(a2a, nullptr);
  EXPECT_EQ(a2a->ranks, 8);
  EXPECT_EQ(a2a->level, NetLevel::intra_node);
  expect_relative(a2a->bytes, a2a_bytes);
  expect_relative(a2a->time_s, collective_time_s(net, Collective::all_to_all, a2a_bytes, 8,
                                                 NetLevel::intra_node, 8));
  EXPECT_DOUBLE_EQ(comm_count(cl, "ep.dispatch_combine", Collective::all_to_all, Pass::backward),
                   2.0 * L * m);
  // Expert TP 1: no expert-tensor collectives; the tensor group keeps only the
  // attention's all-gather and reduce-scatter of s d B per layer and pass.
  EXPECT_DOUBLE_EQ(comm_count(cl, "etp.slots", Collective::all_gather, Pass::forward), 0.0);
  const CommRecord* ag = nullptr;
  EXPECT_DOUBLE_EQ(comm_count(cl, "tp.layer", Collective::all_gather, Pass::forward, &ag), L * m);
  ASSERT_NE(ag, nullptr);
  expect_relative(ag->bytes, s * d * B);
  EXPECT_DOUBLE_EQ(comm_count(cl, "tp.layer", Collective::reduce_scatter, Pass::backward), L * m);
  // Gradients: the dense half over DP 4 (reduce-scatter, ZeRO 1); the experts
  // have expert DP 1 and reduce nowhere.
  const CommRecord* grad = nullptr;
  comm_count(cl, "dp.grad", Collective::reduce_scatter, Pass::backward, &grad);
  ASSERT_NE(grad, nullptr);
  EXPECT_EQ(grad->ranks, 4);
  const double experts = L * 8.0 * 3.0 * d * 512.0;
  const double dense = count_params(c).total - experts;
  expect_relative(grad->time_s, collective_time_s(net, Collective::reduce_scatter,
                                                  dense / 2.0 * 4.0, 4, NetLevel::intra_node, 4));
}

TEST(MegatronCore, ExpertTensorTwoGathersTheSlots) {
  // TP 2 x EP 4 x expert TP 2 (= TP): the tensor group gathers its two ranks'
  // slots before the experts and reduce-scatters after them.
  Config c = tp2_ep8_etp1();
  c.parallel.expert = 4;
  c.parallel.expert_tensor = 2;
  const ClusterEstimate cl = cluster_of(c);
  const NetworkProfile& net = h100().network;
  const double d = 1024, L = 4, B = 2, m = 2;
  EXPECT_EQ(cl.expert_data, 1);
  const CommRecord* ag = nullptr;
  EXPECT_DOUBLE_EQ(comm_count(cl, "etp.slots", Collective::all_gather, Pass::forward, &ag), L * m);
  ASSERT_NE(ag, nullptr);
  // 512 tokens x top-2 on each of the 2 ranks: 2048 slots gathered.
  expect_relative(ag->bytes, 2048.0 * d * B);
  EXPECT_EQ(ag->ranks, 2);
  expect_relative(ag->time_s, collective_time_s(net, Collective::all_gather, 2048.0 * d * B, 2,
                                                NetLevel::intra_node, 2));
  // EP 4: ranks 2 apart in the folded index (0, 2, 4, 6), one node.
  const CommRecord* a2a = nullptr;
  comm_count(cl, "ep.dispatch_combine", Collective::all_to_all, Pass::forward, &a2a);
  ASSERT_NE(a2a, nullptr);
  EXPECT_EQ(a2a->ranks, 4);
  expect_relative(a2a->bytes, 1024.0 * d * B);
  // Weights: the dense half and 2 experts at half width per rank.
  const double experts = L * 8.0 * 3.0 * d * 512.0;
  const double dense = count_params(c).total - experts;
  expect_relative(cl.stages[0].memory.weights, 2.0 * (dense / 2.0 + experts / 8.0));
}

TEST(MegatronCore, ExpertDataParallelAcrossNodes) {
  // 64 GPUs, TP 1, EP 8, expert TP 1: expert DP 8, each group's 8 members
  // 8 ranks apart, one per node: the expert gradients reduce inter-node.
  Config c = small_moe();
  c.device.count = 64;
  c.train.global_batch = 64;
  c.parallel = {.zero = 1, .expert = 8};
  const ClusterEstimate cl = cluster_of(c);
  EXPECT_EQ(cl.expert_data, 8);
  EXPECT_EQ(cl.data, 64);
  const double experts = 4 * 8.0 * 3.0 * 1024 * 512.0;
  const double dense = count_params(c).total - experts;
  // ZeRO 1: dense states over 64, expert states over 8.
  expect_relative(cl.stages[0].memory.optimizer, 12.0 * (dense / 64.0 + experts / 8.0 / 8.0));
}


// ---- vocabulary padding (model.make_vocab_size_divisible_by) ---------------

TEST(MegatronCore, VocabularyPaddingByHand) {
  Config c;
  c.model = {.d_model = 512, .n_layers = 2, .n_heads = 8};
  c.model.vocab_size = 50257;  // GPT-2's tokenizer
  c.model.seq_len = 256;
  c.train.micro_batch = 1;
  const ParamCounts given = count_params(c);
  // Megatron-LM's default 128 on one device: 393 x 128 = 50304 (nanoGPT's).
  c.model.make_vocab_size_divisible_by = 128;
  EXPECT_EQ(c.model.padded_vocab(1), 50304);
  const ParamCounts padded = count_params(c);
  expect_relative(padded.total - given.total, 2.0 * (50304 - 50257) * 512.0);  // untied
  // Under TP 8 the multiple is 128 x 8 = 1024: 50 x 1024 = 51200 (GPT-3's).
  EXPECT_EQ(c.model.padded_vocab(8), 51200);
  // The head GEMM and the loss run over the padded vocabulary: forward FLOPs
  // per token grow by 2 d (V' - V).
  const FlopCounts a = count_flops([&] {
    Config x = c;
    x.model.make_vocab_size_divisible_by = 1;
    return x;
  }());
  const FlopCounts b = count_flops(c);
  expect_relative(b.forward_per_token - a.forward_per_token, 2.0 * 512.0 * (50304 - 50257));
  // On a cluster each tensor rank holds V' / t rows of the embedding and head.
  Config tp = c;
  tp.device.count = 8;
  tp.parallel.tensor = 8;
  tp.device.profile = "h100-80gb-dgx";
  const Estimate e = estimate(tp, h100());
  const double non_vocab = e.params.total - 2.0 * 51200 * 512.0;
  expect_relative(e.params.total - count_params([&] {
                    Config x = tp;
                    x.model.make_vocab_size_divisible_by = 1;
                    return x;
                  }()).total,
                  2.0 * (51200 - 50264) * 512.0);  // vs a multiple of 8 only: 50264
  expect_relative(e.cluster->stages[0].memory.weights, 2.0 * (non_vocab + 2.0 * 51200 * 512.0) / 8);
  // Refused: 0.
  c.model.make_vocab_size_divisible_by = 0;
  EXPECT_THROW(validate(c), ConfigError);
}

// ---- dropout (train.hidden_dropout, train.attention_dropout) ---------------

// A GPT-style layer as Korthikanti et al. 2022 count it: GELU, MHA, 4d MLP,
// fp16, unfused attention, no recompute; d 1024, 16 heads, V 1024, s 512,
// micro-batch 2, dropout 0.1 (tests/data/models/korthikanti_gpt_layer.toml).
Config korthikanti_layer(int64_t layers) {
  Config c = modar_test::model_file("korthikanti_gpt_layer");
  c.model.n_layers = layers;
  return c;
}

TEST(MegatronCore, DropoutMasksMakeKorthikantisCount) {
  const DeviceProfile& p = h100();
  const double s = 512, b = 2, h = 1024, a = 16, T = s * b;
  // One layer's saved bytes: Korthikanti's 34 s b h + 5 a s^2 b, plus modar's
  // two fp32 RMSNorm rstd per row (8 bytes) the paper leaves out.
  const double layer = estimate_memory(korthikanti_layer(2), p).activations -
                       estimate_memory(korthikanti_layer(1), p).activations;
  expect_relative(layer, 34.0 * s * b * h + 5.0 * a * s * s * b + 8.0 * T);
  // Without dropout: 32 s b h + 2 a s^2 b (the softmax output only).
  Config off2 = korthikanti_layer(2), off1 = korthikanti_layer(1);
  for (Config* c : {&off2, &off1}) {
    c->train.hidden_dropout = 0.0;
    c->train.attention_dropout = 0.0;
  }
  const double plain =
      estimate_memory(off2, p).activations - estimate_memory(off1, p).activations;
  expect_relative(plain, 32.0 * s * b * h + 2.0 * a * s * s * b + 8.0 * T);
  // The embedding dropout's mask: s b h bytes once.
  const double with = estimate_memory(korthikanti_layer(1), p).activations;
  Config hidden_only = korthikanti_layer(1);
  hidden_only.train.attention_dropout = 0.0;
  expect_relative(with - estimate_memory(hidden_only, p).activations, 3.0 * a * s * s * b);
  Config none = hidden_only;
  none.train.hidden_dropout = 0.0;
  expect_relative(estimate_memory(hidden_only, p).activations -
                      estimate_memory(none, p).activations,
                  2.0 * T * h + T * h);
}

TEST(MegatronCore, DropoutMasksUnderTensorParallelism) {
  // Korthikanti's TP split without SP: 10 s b h replicated (the norms' inputs
  // and outputs, the two dropout masks), 24 s b h / t and 5 a s^2 b / t.
  const double s = 512, b = 2, h = 1024, a = 16, T = s * b, t = 2;
  auto stage_activations = [&](int64_t layers) {
    Config c = korthikanti_layer(layers);
    c.device.count = 2;
    c.parallel.tensor = 2;
    c.device.profile = "h100-80gb-dgx";
    return estimate(c, h100()).cluster->stages[0].memory.activations;
  };
  expect_relative(stage_activations(2) - stage_activations(1),
                  10.0 * s * b * h + 8.0 * T + (24.0 * s * b * h + 5.0 * a * s * s * b) / t);
}

TEST(MegatronCore, DropoutPassesByHand) {
  // Hidden dropout: per site a 1-byte mask written forward and, backward, the
  // gradient read and written with the mask read: (2B + 2) T d bytes per site
  // (B = 2), 2 sites per layer and the embedding's.
  const DeviceProfile& p = h100();
  Config on = korthikanti_layer(2);
  on.train.attention_kernel = AttentionKernel::flash;
  on.train.attention_dropout = 0.0;
  Config off = on;
  off.train.hidden_dropout = 0.0;
  const Estimate e_on = estimate(on, p), e_off = estimate(off, p);
  const size_t kind = static_cast<size_t>(OpKind::elementwise);
  const double T = 1024, d = 1024, B = 2;
  expect_relative(e_on.time.by_kind[kind].bytes - e_off.time.by_kind[kind].bytes,
                  (2.0 * 2.0 + 1.0) * T * d * (1.0 + 2.0 * B + 1.0));
  // FLOPs are not counted for dropout (elementwise).
  EXPECT_EQ(e_on.flops.train_per_step, e_off.flops.train_per_step);
  EXPECT_GT(e_on.time.step_s, e_off.time.step_s);
  // Attention dropout under the unfused kernel: 2 more passes of B bytes per
  // score each way and the mask's byte (written forward, read backward), and
  // one more launch each way.
  Config unfused_on = korthikanti_layer(2);
  unfused_on.train.hidden_dropout = 0.0;
  Config unfused_off = unfused_on;
  unfused_off.train.attention_dropout = 0.0;
  const size_t attention = static_cast<size_t>(OpKind::attention);
  const double scores = 2.0 * 16.0 * 512.0 * 512.0;  // b H s s per layer
  const DeviceCeilings& c = p.ceilings;
  expect_relative(estimate(unfused_on, p).time.by_kind[attention].time_s -
                      estimate(unfused_off, p).time.by_kind[attention].time_s,
                  // the profile's memory-bound rate: kernel.memory_efficiency 0.85 of 3.35 TB/s
                  2.0 * (2.0 * (2.0 * B + 1.0) * scores / (0.85 * c.memory_bandwidth) +
                         2.0 * c.launch_overhead_s),
                  1e-6);
  // FlashAttention regenerates its mask: no memory for it.
  Config flash = korthikanti_layer(1);
  flash.train.attention_kernel = AttentionKernel::flash;
  Config flash_off = flash;
  flash_off.train.attention_dropout = 0.0;
  EXPECT_EQ(estimate_memory(flash, p).activations, estimate_memory(flash_off, p).activations);
  // Bad values name the field.
  Config bad = korthikanti_layer(1);
  bad.train.hidden_dropout = 1.0;
  EXPECT_THROW(validate(bad), ConfigError);
}

// ---- context parallelism (parallel.context) ---------------------------------

// d 1024, 4 layers, 16 heads of 64 (MHA), GELU, vocab 32000, s = 4096,
// micro-batch 1, global batch 4; 2 H100, CP 2, ZeRO 1 (dp 1 x cp 2 = 2).
Config cp2() {
  Config c;
  c.model = {.d_model = 1024, .n_layers = 4, .n_heads = 16, .vocab_size = 32000, .seq_len = 4096};
  c.train = {.micro_batch = 1, .global_batch = 4};
  c.device = {.profile = "h100-80gb-dgx", .count = 2};
  c.parallel = {.context = 2, .zero = 1};
  return c;
}

TEST(MegatronCore, ContextParallelMemoryByHand) {
  const Config c = cp2();
  ASSERT_NO_THROW(validate(c));
  EXPECT_EQ(c.parallel.data(c.device.count), 1);
  const Estimate e = estimate(c, h100());
  const ClusterEstimate& cl = *e.cluster;
  EXPECT_EQ(cl.context, 2);
  EXPECT_EQ(cl.micro_batches, 4);
  const MemoryBreakdown& mem = cl.stages[0].memory;
  const double P = e.params.total;
  // Weights and gradients are replicated over the context group; ZeRO 1
  // shards the optimizer states over dp x cp = 2 ranks.
  expect_relative(mem.weights, 2.0 * P);
  expect_relative(mem.gradients, 4.0 * P);
  expect_relative(mem.optimizer, 12.0 * P / 2.0);
  // Each rank holds 2048 of the 4096 tokens: per layer (no recompute, flash,
  // bf16) the norms' inputs and outputs 4d, Q K V 3d, the attention output d,
  // the MLP's 4d up and 4d GELU outputs at B = 2 bytes, two fp32 rstd per row
  // and the fp32 log-sum-exp of its 2048 queries x 16 heads; the last stage
  // adds the final norm's input and output, its rstd and the token ids.
  const double T = 2048, d = 1024;
  const double layer = 2.0 * 16.0 * d * T + 8.0 * T + 4.0 * 16.0 * T;
  expect_relative(mem.activations, 4.0 * layer + 2.0 * 2.0 * T * d + 8.0 * T);
  // Exactly half of one device's activations for the whole sequence.
  Config one = c;
  one.device.count = 1;
  one.parallel = ParallelConfig{};
  expect_relative(mem.activations, estimate_memory(one, h100()).activations / 2.0);
  // FLOPs are the model's: CP splits them, it adds none.
  EXPECT_EQ(e.flops.train_per_step, estimate(one, h100()).flops.train_per_step);
}

TEST(MegatronCore, ContextParallelCommunicationByHand) {
  const Config c = cp2();
  const Estimate e = estimate(c, h100());
  const ClusterEstimate& cl = *e.cluster;
  const NetworkProfile& net = h100().network;
  const double L = 4, m = 4, B = 2;
  // Ring attention: each rank's K and V block, 2048 tokens x 2 x 16 heads x
  // 64 x B = 8 MiB, sent c - 1 = 1 time per layer forward, and the block with
  // its gradient (16 MiB) once backward, between the two ranks of the node.
  const double block = 2048.0 * 2.0 * 16.0 * 64.0 * B;
  const CommRecord* fwd = nullptr;
  const CommRecord* bwd = nullptr;
  EXPECT_DOUBLE_EQ(comm_count(cl, "cp.kv", Collective::send_recv, Pass::forward, &fwd), L * m);
  EXPECT_DOUBLE_EQ(comm_count(cl, "cp.kv", Collective::send_recv, Pass::backward, &bwd), L * m);
  ASSERT_NE(fwd, nullptr);
  ASSERT_NE(bwd, nullptr);
  expect_relative(fwd->bytes, block);
  expect_relative(bwd->bytes, 2.0 * block);
  EXPECT_EQ(fwd->level, NetLevel::intra_node);
  const double send_fwd =
      collective_time_s(net, Collective::send_recv, block, 2, NetLevel::intra_node);
  const double send_bwd =
      collective_time_s(net, Collective::send_recv, 2.0 * block, 2, NetLevel::intra_node);
  expect_relative(fwd->time_s, send_fwd);
  expect_relative(bwd->time_s, send_bwd);
  // Each step hides behind the attention of the block in hand: half of the
  // rank's attention (2048 queries against the 4096 keys, causal).
  const TimingModel timing(h100());
  OpShape attention;
  attention.kind = OpKind::attention;
  attention.dtype = DType::bf16;
  attention.dims = {1, 16, 16, 2048, 4096, 64, 1};
  TimingModel::Source source = TimingModel::Source::roofline;
  const double attention_fwd = timing.op_time_s(attention, Pass::forward, &source);
  const double attention_bwd = timing.op_time_s(attention, Pass::backward, &source);
  const double exposed = std::max(0.0, send_fwd - attention_fwd / 2.0) +
                         std::max(0.0, send_bwd - attention_bwd / 2.0);
  expect_relative(cl.stages[0].exposed_comm_s, L * exposed, 1e-6);
  // The gradients reduce-scatter over dp x cp = 2 ranks (ZeRO 1).
  const CommRecord* grad = nullptr;
  comm_count(cl, "dp.grad", Collective::reduce_scatter, Pass::backward, &grad);
  ASSERT_NE(grad, nullptr);
  EXPECT_EQ(grad->ranks, 2);
  expect_relative(grad->time_s, collective_time_s(net, Collective::reduce_scatter,
                                                  4.0 * e.params.total, 2,
                                                  NetLevel::intra_node, 2));
  // Across nodes (1 GPU per node) the sends go over InfiniBand: the exposed
  // part is what the attention of a block does not cover.
  Config far = c;
  far.cluster.gpus_per_node = 1;
  const ClusterEstimate slow = *estimate(far, h100()).cluster;
  const double far_fwd =
      collective_time_s(net, Collective::send_recv, block, 2, NetLevel::inter_node);
  const double far_bwd =
      collective_time_s(net, Collective::send_recv, 2.0 * block, 2, NetLevel::inter_node);
  expect_relative(slow.stages[0].exposed_comm_s,
                  L * (std::max(0.0, far_fwd - attention_fwd / 2.0) +
                       std::max(0.0, far_bwd - attention_bwd / 2.0)),
                  1e-6);
  EXPECT_GT(slow.step_s, cl.step_s);
}

TEST(MegatronCore, ContextParallelRules) {
  Config c = cp2();
  c.model.seq_len = 4094;  // not a multiple of 2 c = 4
  EXPECT_THROW(validate(c), ConfigError);
  c = cp2();
  c.train.attention_kernel = AttentionKernel::unfused;
  EXPECT_THROW(validate(c), ConfigError);
  c = cp2();
  c.device.count = 3;
  EXPECT_THROW(validate(c), ConfigError);
  // TP 2 x CP 2 x DP 2 on 8 GPUs with SP: each rank 1024 tokens.
  c = cp2();
  c.device.count = 8;
  c.parallel.tensor = 2;
  c.parallel.sequence_parallel = true;
  c.train.global_batch = 8;
  EXPECT_NO_THROW(validate(c));
  EXPECT_EQ(c.parallel.data(c.device.count), 2);
}

// ---- where the routing weights multiply (moe.router_weights) ----------------

// One MoE layer's saved bytes per token: the activations of 2 layers less 1.
struct PerToken {
  double activations = 0.0, router_buffers = 0.0;
};
PerToken moe_layer_per_token(Config c) {
  const double tokens = static_cast<double>(c.train.micro_batch * c.model.seq_len);
  c.model.n_layers = 2;
  const MemoryBreakdown two = estimate_memory(c, h100());
  c.model.n_layers = 1;
  const MemoryBreakdown one = estimate_memory(c, h100());
  return {(two.activations - one.activations) / tokens,
          (two.router_buffers - one.router_buffers) / tokens};
}

// Mixtral-8x7B's layer (common/moe_families.hpp): d 4096, 32 heads of 128
// with 8 KV heads, 8 experts of width 14336 (SwiGLU), top-2; s 4096, bf16,
// FlashAttention, no recompute.
Config mixtral_layer() {
  Config c = modar_test::mixtral_8x7b();
  c.train.micro_batch = 1;
  return c;
}

// OLMoE-1B-7B's layer (common/moe_families.hpp): d 2048, 16 heads of 128
// (MHA), 64 experts of width 1024 (SwiGLU), top-8; s 4096, as Mixtral's.
Config olmoe_layer() {
  Config c = modar_test::olmoe_1b_7b();
  c.train.micro_batch = 1;
  return c;
}

// What Megatron-Core saves for backward per token of an MoE layer (bf16,
// SwiGLU with bias_activation_fusion, the alltoall dispatcher without permute
// fusion, no recompute), counted from its source:
//  experts.py, TEGroupedMLP.forward: linear_fc1 (a TE GroupedLinear) saves its
//    input, the permuted tokens (d per slot); weighted_bias_swiglu_impl saves
//    its input, fc1's output (2f), and the permuted probs (one value per slot,
//    the router's dtype: bf16 by default); linear_fc2 saves its input, the
//    activation's output (f).  fc2's output is consumed by the combine and
//    kept by nothing: the probs were applied in the activation.
//  token_dispatcher.py (moe_utils.permute / unpermute): index_select keeps the
//    int64 sorted indices (8 bytes per slot; unpermute's scatter_add reuses
//    them) and masked_select of the probs keeps the boolean routing map (one
//    byte per expert per token); the all-to-alls keep nothing.
// k slots per token.  modar adds, per token of every layer: its attention
// side (the two norms' inputs and outputs 4d, Q K V (H + 2G) d_h, the
// attention output H d_h at B = 2, two fp32 rstd, the fp32 log-sum-exp per
// head) and its router's fp32 probabilities (4 E) and index + gate (8 k).
struct MegatronCount {
  double activations, router_buffers;
};
MegatronCount megatron_count(double d, double heads, double kv, double d_head, double f,
                             double experts, double k) {
  const double B = 2.0;
  const double attention = B * (4.0 * d + (heads + 2.0 * kv) * d_head + heads * d_head) + 8.0 +
                           4.0 * heads;
  const double experts_py = k * (B * (d + 2.0 * f + f) + B);
  const double dispatcher = k * 8.0 + experts * 1.0;
  return {attention + experts_py, 4.0 * experts + 8.0 * k + dispatcher};
}

TEST(MegatronCore, MoeActivationsPerTokenMatchMegatronCoresSavedTensors) {
  for (const auto& [config, count] :
       {std::pair<Config, MegatronCount>{mixtral_layer(),
                                          megatron_count(4096, 32, 8, 128, 14336, 8, 2)},
        {olmoe_layer(), megatron_count(2048, 16, 16, 128, 1024, 64, 8)}}) {
    ASSERT_EQ(config.moe.router_weights, RouterWeights::activation);  // the default
    const PerToken modar = moe_layer_per_token(config);
    expect_relative(modar.activations, count.activations);
    expect_relative(modar.router_buffers, count.router_buffers);
  }
  // Weights on the output (modar's runtime, GShard) keep the expert output
  // too: k (d - 1) B more per token: +6.8% for Mixtral, +28.5% for OLMoE.
  Config mixtral_output = mixtral_layer();
  mixtral_output.moe.router_weights = RouterWeights::output;
  Config olmoe_output = olmoe_layer();
  olmoe_output.moe.router_weights = RouterWeights::output;
  const double mixtral_ratio = moe_layer_per_token(mixtral_output).activations /
                               moe_layer_per_token(mixtral_layer()).activations;
  const double olmoe_ratio = moe_layer_per_token(olmoe_output).activations /
                             moe_layer_per_token(olmoe_layer()).activations;
  expect_relative(mixtral_ratio, 1.0 + 2.0 * 4095.0 * 2.0 / 241804.0);
  expect_relative(olmoe_ratio, 1.0 + 8.0 * 2047.0 * 2.0 / 114776.0);
  EXPECT_NEAR(mixtral_ratio, 1.068, 0.001);
  EXPECT_NEAR(olmoe_ratio, 1.285, 0.001);
  // On the input (top-1 only): the unscaled input beside the scaled one.
  Config input = mixtral_layer();
  input.moe.router_weights = RouterWeights::input;
  EXPECT_THROW(validate(input), ConfigError);
  input.moe.top_k = 1;
  Config activation_top1 = mixtral_layer();
  activation_top1.moe.top_k = 1;
  expect_relative(moe_layer_per_token(input).activations -
                      moe_layer_per_token(activation_top1).activations,
                  4096.0 * 2.0);
}

// ---- the token dispatcher (moe.token_dispatcher) ----------------------------

TEST(MegatronCore, AllGatherDispatcherByHand) {
  // TP 2 (SP) x EP 4 (expert TP 2) on 8 GPUs: the all-gather dispatcher
  // gathers the 8 ranks' tokens (512 each: d x B, top-2 weights x B and int64
  // indices) instead of the all-to-alls and the slot gathers.
  Config c = tp2_ep8_etp1();
  c.parallel.expert = 4;
  c.parallel.expert_tensor = 2;
  c.moe.token_dispatcher = TokenDispatcher::allgather;
  const ClusterEstimate cl = cluster_of(c);
  const NetworkProfile& net = h100().network;
  const double d = 1024, B = 2, L = 4, m = 2;
  const double bytes = 512.0 * 8.0 * (d * B + 2.0 * (B + 8.0));
  const CommRecord* ag = nullptr;
  EXPECT_DOUBLE_EQ(comm_count(cl, "ep.token_gather", Collective::all_gather, Pass::forward, &ag),
                   L * m);
  ASSERT_NE(ag, nullptr);
  EXPECT_EQ(ag->ranks, 8);
  expect_relative(ag->bytes, bytes);
  expect_relative(ag->time_s, collective_time_s(net, Collective::all_gather, bytes, 8,
                                                NetLevel::intra_node, 8));
  EXPECT_DOUBLE_EQ(comm_count(cl, "ep.dispatch_combine", Collective::all_to_all, Pass::forward),
                   0.0);
  EXPECT_DOUBLE_EQ(comm_count(cl, "etp.slots", Collective::all_gather, Pass::forward), 0.0);
  // Same compute and weights as the all-to-all dispatcher.
  Config a2a = c;
  a2a.moe.token_dispatcher = TokenDispatcher::alltoall;
  const ClusterEstimate other = cluster_of(a2a);
  expect_relative(cl.compute_s, other.compute_s);
  expect_relative(cl.stages[0].memory.weights, other.stages[0].memory.weights);
}


// ---- recompute: Megatron's granularity and modules beside modar's ----------

// d 1024, 16 heads of 64 (MHA), SwiGLU 2816, s 1024, micro-batch 1, bf16,
// FlashAttention; one layer's saved bytes by differencing 2 and 1 layers
// (tests/data/models/swiglu_1024_recompute.toml, vocabulary 1024).
Config recompute_layer(int64_t layers) {
  Config c = modar_test::model_file("swiglu_1024_recompute");
  c.model.n_layers = layers;
  return c;
}

double layer_bytes(const std::function<void(Config&)>& set) {
  Config two = recompute_layer(2), one = recompute_layer(1);
  set(two);
  set(one);
  return estimate_memory(two, h100()).activations - estimate_memory(one, h100()).activations;
}

TEST(MegatronCore, RecomputeModulesByHand) {
  const double T = 1024, d = 1024, dff = 2816, B = 2, H = 16;
  // No recompute: norms' inputs and outputs 4d, Q K V 3d, attention output d,
  // SwiGLU up 2 d_ff and activation d_ff at B, two fp32 rstd, the fp32 lse.
  const double none = B * T * (4 * d + 3 * d + d + 3 * dff) + 8 * T + 4 * H * T;
  expect_relative(layer_bytes([](Config&) {}), none);
  const auto megatron = [](const char* modules) {
    return [modules](Config& c) {
      c.train.recompute_granularity = RecomputeGranularity::selective;
      c.train.recompute_modules = modules;
    };
  };
  // Megatron's selective default, core_attn: under FlashAttention only the
  // log-sum-exp goes (Q, K, V are the checkpoint's inputs, the output the
  // projection's).
  expect_relative(layer_bytes(megatron("core_attn")), none - 4 * H * T);
  expect_relative(layer_bytes(megatron("layernorm")), none - 2 * d * B * T);
  expect_relative(layer_bytes(megatron("mlp")), none - 3 * dff * B * T);
  expect_relative(layer_bytes(megatron("core_attn, layernorm mlp")),
                  none - 4 * H * T - 2 * d * B * T - 3 * dff * B * T);
  // modar's selective: the norm outputs and the activation output.
  const double modar_selective = none - (2 * d + dff) * B * T;
  expect_relative(layer_bytes([](Config& c) { c.train.recompute = Recompute::selective; }),
                  modar_selective);
  // Mirroring Megatron's flag with modar's selective under-plans by this much.
  EXPECT_NEAR(1.0 - modar_selective / (none - 4 * H * T), 0.290, 0.001);
  // Megatron's full = modar's full (each layer's input only).
  expect_relative(layer_bytes([](Config& c) {
                    c.train.recompute_granularity = RecomputeGranularity::full;
                  }),
                  B * T * d);
  // Time: the recomputed modules' forward ops run again (HFU).
  Config core = recompute_layer(2);
  megatron("core_attn")(core);
  Config mlp = recompute_layer(2);
  megatron("mlp")(mlp);
  const double s = 1024, d_head = 64;
  // Causal attention forward per token: 4 H d_h s / 2; the MLP's GEMMs 6 d d_ff.
  expect_relative(count_flops(core).recompute_per_token, 2.0 * 4.0 * H * d_head * s / 2.0);
  expect_relative(count_flops(mlp).recompute_per_token, 2.0 * 6.0 * d * dff);
  // The two sets cannot be mixed; unknown modules are named.
  Config both = recompute_layer(1);
  both.train.recompute = Recompute::selective;
  both.train.recompute_granularity = RecomputeGranularity::selective;
  EXPECT_THROW(validate(both), ConfigError);
  Config typo = recompute_layer(1);
  typo.train.recompute_modules = "core_atn";
  const std::string error = modar_test::error_of([&] { validate(typo); });
  EXPECT_NE(error.find("ConfigError: "), std::string::npos) << error;
  EXPECT_NE(error.find("unknown module 'core_atn'"), std::string::npos) << error;
}

TEST(MegatronCore, MoeRecomputeModulesByHand) {
  // The Mixtral layer: moe_act drops the experts' activation output (f per
  // slot), moe the whole FFN's slots (and the router buffers), and re-runs
  // the dispatch.
  const double f = 14336, k = 2, B = 2;
  const PerToken plain = moe_layer_per_token(mixtral_layer());
  Config act = mixtral_layer();
  act.train.recompute_granularity = RecomputeGranularity::selective;
  act.train.recompute_modules = "moe_act";
  expect_relative(plain.activations - moe_layer_per_token(act).activations, k * f * B);
  Config moe = mixtral_layer();
  moe.train.recompute_granularity = RecomputeGranularity::selective;
  moe.train.recompute_modules = "moe";
  const PerToken whole = moe_layer_per_token(moe);
  expect_relative(plain.activations - whole.activations,
                  k * (B * (4096 + 3 * f) + B));  // experts.py's tensors
  EXPECT_EQ(whole.router_buffers, 0.0);
}

}  // namespace
}  // namespace modar
