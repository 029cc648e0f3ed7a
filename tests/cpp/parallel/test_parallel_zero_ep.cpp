// ZeRO-3 (and, below, expert parallelism) of the runtime equal the
// single-process step (fp64, CPU backend).
//
// Run as one process and under mpirun with 2 and 4 (tests/CMakeLists.txt).
// Every rank also runs the single-process Model on the whole global batch (the
// models are tiny) and compares after two steps: losses to 1e-12 relative,
// every parameter to 1e-12 of its tensor's largest entry, the reduced gradient
// shards likewise.  Memory and traffic are checked against hand counts.
#include "parallel_test_common.hpp"

namespace modar::runtime {
namespace {

// The common families and a dropless MoE (its load-balancing loss off: a
// per-batch statistic, not a mean over rows).
std::vector<Family> families() {
  std::vector<Family> all = common_families();
  all.push_back({"moe_dropless", [](Config& c) {
                   c.moe.experts = 4;
                   c.moe.top_k = 2;
                   c.moe.interval = 2;
                   c.moe.aux_loss_coef = 0.0;
                 }});
  return all;
}

constexpr int64_t kD = 16, kV = 13, kLayers = 4;
constexpr int64_t kEmbedding = kV * kD;                      // 208
constexpr int64_t kLayer = 2 * kD                            // two norms
                           + kD * 16 + 2 * kD * 8 + 16 * kD  // wq, wk, wv, wo
                           + 2 * kD * 24;                    // w_in, w_out
constexpr int64_t kHead = kD + kD * kV;                      // final norm + head
static_assert(kLayer == 1568, "hand count");

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

void check_zero3(const Family& family) {
  Config config = tiny_config();
  family.edit(config);
  const std::string what = family.name + " zero 3 on " + std::to_string(g_world->size()) + " ranks";
  const Reference ref = serial_reference(config);
  ProcessGroups groups = make_process_groups(*g_world, {.zero = 3});
  const int64_t dp = groups.shape.data;
  Model model(*g_backend, config, fp64_options());
  DataParallelTrainer trainer(model, *groups.data, 3);
  expect_reference_steps(trainer, rank_batch(config, groups), ref, what);
  const auto& params = model.parameters().all();
  ASSERT_EQ(params.size(), ref.names.size());
  // Between steps no value, gradient or moment of the model is held.
  for (const auto& p : params) {
    EXPECT_TRUE(p->value.empty() && p->grad.empty() && p->adam_m.empty()) << what << p->name;
  }
  Zero3Optimizer& zero3 = trainer.zero3();
  const auto& units = model.parameter_units();
  ASSERT_EQ(static_cast<int64_t>(units.size()), zero3.unit_count());
  for (size_t u = 0; u < units.size(); ++u) {
    const int64_t unit = static_cast<int64_t>(u);
    // Every updated parameter, gathered from the shards.
    zero3.acquire(unit, true, false);
    std::vector<double> flat_grad;  // the reference's global-mean gradient of the unit
    for (int64_t i = units[u].begin; i < units[u].end; ++i) {
      const size_t k = static_cast<size_t>(i);
      EXPECT_EQ(params[k]->name, ref.names[k]);
      expect_values(download(*g_backend, params[k]->value), ref.values[k],
                    what + " " + params[k]->name);
      flat_grad.insert(flat_grad.end(), ref.grads[k].begin(), ref.grads[k].end());
    }
    zero3.release(unit);
    // This rank's reduced gradient shard of the unit.
    const int64_t shard = zero3.unit_shard_numel(unit);
    EXPECT_EQ(shard, ceil_div(static_cast<int64_t>(flat_grad.size()), dp));
    flat_grad.resize(static_cast<size_t>(shard * dp), 0.0);
    const auto begin = flat_grad.begin() + groups.at.data * shard;
    const std::vector<double> want(begin, begin + shard);
    std::vector<double> got = zero3.shard_gradient(unit);
    for (double& v : got) {
      v /= static_cast<double>(dp);
    }
    expect_gradient(got, want, what + " shard gradient of " + units[u].name);
  }
}

TEST(Zero3, EqualsTheSingleProcessStep) {
  for (const Family& family : families()) {
    check_zero3(family);
  }
}

TEST(Zero3, UnitsAreTheEmbeddingEachLayerTheDepthResidualAndTheHead) {
  Config config = tiny_config();
  config.dar.variant = DarVariant::dar;
  config.dar.block_layers = 1;
  Model model(*g_backend, config, fp64_options());
  const auto& units = model.parameter_units();
  ASSERT_EQ(units.size(), static_cast<size_t>(kLayers + 3));
  EXPECT_EQ(units.front().name, "embedding");
  EXPECT_EQ(units[1].name, "layer0");
  EXPECT_EQ(units[kLayers + 1].name, "depth");
  EXPECT_EQ(units.back().name, "head");
  const auto& all = model.parameters().all();
  auto numel = [&](const ParameterUnit& u) {
    int64_t n = 0;
    for (int64_t i = u.begin; i < u.end; ++i) {
      n += all[static_cast<size_t>(i)]->value.numel();
    }
    return n;
  };
  EXPECT_EQ(numel(units[0]), kEmbedding);
  EXPECT_EQ(numel(units[1]), kLayer);
  EXPECT_EQ(numel(units.back()), kHead);
  EXPECT_EQ(units.back().end, static_cast<int64_t>(all.size()));
  for (size_t u = 1; u < units.size(); ++u) {
    EXPECT_EQ(units[u].begin, units[u - 1].end);
  }
}

// Peak parameter bytes per rank: the shards of every unit plus the largest
// unit gathered at once (untied, plain residual: one unit at a time), against
// the full parameters under ZeRO 0-2; the persistent state likewise.
TEST(Zero3, ParameterMemoryIsTheShardPlusTheLargestGatheredUnit) {
  Config config = tiny_config();
  ParallelConfig layout;
  layout.zero = 3;
  ProcessGroups groups = make_process_groups(*g_world, layout);
  const int64_t dp = groups.shape.data, rows = kBatch / dp, seq = config.model.seq_len;
  const int64_t total = kEmbedding + kLayers * kLayer + kHead;  // 6704
  const int64_t shards =
      ceil_div(kEmbedding, dp) + kLayers * ceil_div(kLayer, dp) + ceil_div(kHead, dp);
  const int64_t largest = std::max({kEmbedding, kLayer, kHead});
  std::vector<int64_t> step_peaks;
  for (int64_t zero : {int64_t{2}, int64_t{3}}) {
    Model model(*g_backend, config, fp64_options());
    EXPECT_EQ(model.parameters().count(), total);
    const int64_t before = model.memory().live_bytes();
    DataParallelTrainer trainer(model, *groups.data, zero);
    const int64_t after = model.memory().live_bytes();
    Buffer tokens = model.make_tokens(ids(kV, seq, 0, rows, 0), rows, seq);
    Buffer targets = model.make_tokens(ids(kV, seq, 0, rows, 1), rows, seq);
    for (int s = 0; s < kSteps; ++s) {
      step_peaks.push_back(trainer.train_step(tokens, targets).peak_bytes);
    }
    if (zero == 3) {
      // Model: value, grad, m, v of every parameter released (4 x total);
      // held: master, m, v and reduced gradient of each unit's shard.
      EXPECT_EQ(after - before, 8 * (4 * shards - 4 * total));
      const MemoryTracker& pm = trainer.zero3().parameter_memory();
      EXPECT_EQ(pm.live_bytes(), 8 * shards);
      EXPECT_EQ(pm.peak_bytes(), 8 * (shards + largest));
      if (dp > 1) {
        EXPECT_LT(pm.peak_bytes(), 8 * total);  // ZeRO 0-2 hold 8 x total
      }
    }
  }
  if (dp > 1) {
    EXPECT_LT(step_peaks[3], step_peaks[1]) << "ZeRO-3 step peak below ZeRO-2's";
  }
}

// All-gather / reduce-scatter bytes of one step against the planner's ZeRO-3
// count (cost_models/parallel.cpp): "zero3.param_gather", 2 x layers x m
// all-gathers of one layer's parameter bytes (forward and backward), and the
// gradient reduce-scatter of every parameter once per step (ZeRO >= 2, m = 1).
// The runtime also gathers the embedding and the head once (forward; the head
// stays gathered into its backward, the untied embedding's backward needs no
// values), which the planner leaves out of the per-layer count.
TEST(Zero3, TrafficMatchesThePlannersCount) {
  if (g_world->size() < 2) {
    GTEST_SKIP() << "needs >= 2 ranks (mpirun)";
  }
  Config config = tiny_config();
  ParallelConfig layout;
  layout.zero = 3;
  ProcessGroups groups = make_process_groups(*g_world, layout);
  const int64_t dp = groups.shape.data, rows = kBatch / dp, seq = config.model.seq_len;
  Model model(*g_backend, config, fp64_options());
  DataParallelTrainer trainer(model, *groups.data, 3);
  Buffer tokens = model.make_tokens(ids(kV, seq, 0, rows, 0), rows, seq);
  Buffer targets = model.make_tokens(ids(kV, seq, 0, rows, 1), rows, seq);
  trainer.train_step(tokens, targets);
  trainer.zero3().reset_traffic();
  trainer.train_step(tokens, targets);
  const Zero3Optimizer::Traffic& t = trainer.zero3().traffic();
  const int64_t bytes = 8;  // fp64
  // Planner: 2 x L x layer_param_bytes (kLayer divides by dp = 2, 4: no padding).
  ASSERT_EQ(kLayer % dp, 0);
  EXPECT_EQ(t.layer_gather_bytes, 2 * kLayers * kLayer * bytes);
  EXPECT_EQ(t.all_gather_calls, 2 * kLayers + 2);
  EXPECT_EQ(t.all_gather_bytes,
            t.layer_gather_bytes + bytes * dp * (ceil_div(kEmbedding, dp) + ceil_div(kHead, dp)));
  // Planner: one reduce-scatter of every parameter's gradient per step; here
  // one per unit, each padded to a multiple of dp.
  EXPECT_EQ(t.reduce_scatter_calls, kLayers + 2);
  EXPECT_EQ(t.reduce_scatter_bytes,
            bytes * dp * (ceil_div(kEmbedding, dp) + kLayers * kLayer / dp + ceil_div(kHead, dp)));
  EXPECT_GE(t.reduce_scatter_bytes, bytes * (kEmbedding + kLayers * kLayer + kHead));
}

TEST(Zero3, LowPrecisionValuesWithAMasterCopyAreRefusedNamingTheField) {
  Config config = tiny_config();
  ModelOptions options = fp64_options();
  options.dtype = ScalarType::bf16;
  Model model(*g_backend, config, options);
  auto self = make_self_communicator(*g_backend);
  expect_config_error([&] { Zero3Optimizer zero3(model, *self, options.adamw); },
                      {"train.dtype = bf16"});
}

// ---- expert parallelism ----------------------------------------------------------------------

struct MoeFamily {
  std::string name;
  std::function<void(Config&)> edit;
  bool capacity;  // capacity counted over the expert group: equals one process only at ep = dp
};

// MoE families: 4 experts, every layer MoE unless staged; the load-balancing
// loss is 0 (a statistic of the whole batch, not a mean over rows); the
// z-loss (a mean over tokens) is on in one family.
std::vector<MoeFamily> moe_families() {
  auto moe = [](Config& c, int64_t k, double cf) {
    c.moe.experts = 4;
    c.moe.top_k = k;
    c.moe.capacity_factor = cf;
    c.moe.aux_loss_coef = 0.0;
  };
  return {
      {"moe_top1_dropless", [=](Config& c) { moe(c, 1, 0.0); }, false},
      {"moe_top2_dropless_zloss",
       [=](Config& c) {
         moe(c, 2, 0.0);
         c.moe.z_loss_coef = 1e-3;
       },
       false},
      {"moe_top1_capacity", [=](Config& c) { moe(c, 1, 1.0); }, true},
      {"moe_top2_capacity", [=](Config& c) { moe(c, 2, 0.75); }, true},
      {"staged_mode",
       [=](Config& c) {
         moe(c, 2, 0.0);
         c.moe.mode = MoeMode::staged;
         c.mod.every = 2;
         c.mod.capacity = 0.5;
         c.mod.causal_router = CausalRouter::aux_loss;
       },
       false},
      {"moe_dar",
       [=](Config& c) {
         moe(c, 2, 0.0);
         c.dar.variant = DarVariant::dar;
         c.dar.block_layers = 2;
       },
       false},
  };
}

// Expert rank r's experts [r E / ep, (r + 1) E / ep) of an [E, ..] weight.
std::vector<double> expert_block(const std::vector<double>& full, int64_t ep, int64_t r) {
  const auto per_rank = static_cast<int64_t>(full.size()) / ep;
  return std::vector<double>(full.begin() + r * per_rank, full.begin() + (r + 1) * per_rank);
}

void check_expert_parallel(const MoeFamily& family, int64_t ep, int64_t zero = 0) {
  Config config = tiny_config();
  family.edit(config);
  const std::string what = family.name + " ep " + std::to_string(ep) + " zero " +
                           std::to_string(zero) + " on " + std::to_string(g_world->size()) +
                           " ranks";
  const Reference ref = serial_reference(config);
  ParallelConfig layout;
  ProcessGroups groups = make_process_groups(*g_world, layout);
  const int64_t dp = groups.shape.data, rows = kBatch / dp, seq = config.model.seq_len;
  const int64_t vocab = config.model.vocab_size;
  Model model(*g_backend, config, fp64_options());
  ExpertParallelTrainer trainer(model, *groups.data, ep, zero);
  ASSERT_EQ(trainer.expert_group().size(), ep);
  ASSERT_EQ(trainer.expert_data_group().size(), dp / ep);
  const int64_t expert_rank = groups.at.data % ep;  // ep consecutive data ranks per group
  EXPECT_EQ(trainer.expert_group().rank(), expert_rank);
  Buffer tokens = model.make_tokens(ids(vocab, seq, groups.at.data * rows, rows, 0), rows, seq);
  Buffer targets = model.make_tokens(ids(vocab, seq, groups.at.data * rows, rows, 1), rows, seq);
  for (int s = 0; s < kSteps; ++s) {
    const StepResult got = trainer.train_step(tokens, targets);
    const StepResult& want = ref.steps[static_cast<size_t>(s)];
    expect_losses(got, want, what + " step " + std::to_string(s));
    expect_close(got.moe_z_loss, want.moe_z_loss, what + " z loss");
    EXPECT_EQ(got.moe_dropped, want.moe_dropped) << what << " dropped assignments";
  }
  const auto& params = model.parameters().all();
  ASSERT_EQ(params.size(), ref.names.size());
  if (zero == 3) {  // every unit gathered from its shards (experts: the expert-data group's)
    for (int64_t u = 0; u < trainer.zero3()->unit_count(); ++u) {
      trainer.zero3()->acquire(u, true, false);
    }
  }
  int64_t experts_seen = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string& name = params[i]->name;
    const bool expert = name.find(".experts.") != std::string::npos;
    EXPECT_EQ(trainer.is_expert_parameter(params[i].get()), expert) << name;
    experts_seen += expert ? 1 : 0;
    const std::vector<double> want =
        expert ? expert_block(ref.values[i], ep, expert_rank) : ref.values[i];
    expect_values(download(*g_backend, params[i]->value), want, what + " " + name);
    if (zero != 0) {
      continue;  // the reduced gradients live in the optimizers' shards
    }
    std::vector<double> g = download(*g_backend, params[i]->grad);
    for (double& v : g) {
      v /= static_cast<double>(dp);
    }
    expect_gradient(g, expert ? expert_block(ref.grads[i], ep, expert_rank) : ref.grads[i],
                    what + " grad " + name);
  }
  EXPECT_GT(experts_seen, 0) << what;
}

TEST(ExpertParallel, EqualsTheSingleProcessStep) {
  const int64_t dp = g_world->size();
  for (const MoeFamily& family : moe_families()) {
    for (int64_t ep : {int64_t{1}, int64_t{2}, int64_t{4}}) {
      if (dp % ep != 0 || (family.capacity && ep != dp)) {
        continue;  // capacity over the expert group: one process's drops only at ep = dp
      }
      check_expert_parallel(family, ep);
    }
  }
}

// ZeRO 1-3 with expert parallelism: the experts' optimizer state (ZeRO 3:
// their values too) sharded over the expert-data group, the rest over the
// data group.  Dropless top-2 with z-loss and MoE + DAR.
TEST(ExpertParallel, WithZeroEqualsTheSingleProcessStep) {
  const int64_t dp = g_world->size();
  const std::vector<MoeFamily> all = moe_families();
  for (const MoeFamily& family : {all[1], all[5]}) {
    for (int64_t zero : {int64_t{1}, int64_t{2}, int64_t{3}}) {
      for (int64_t ep : {int64_t{1}, int64_t{2}, int64_t{4}}) {
        if (dp % ep == 0 && (ep > 1 || dp == 1)) {
          check_expert_parallel(family, ep, zero);
        }
      }
    }
  }
}

TEST(ExpertParallel, TheCapacityFamiliesDropAssignments) {
  // Otherwise the capacity cases above would test nothing beyond dropless.
  for (const MoeFamily& family : moe_families()) {
    if (!family.capacity) {
      continue;
    }
    Config config = tiny_config();
    family.edit(config);
    const Reference ref = serial_reference(config);
    EXPECT_GT(ref.steps[0].moe_dropped, 0) << family.name;
  }
}

// All-to-all bytes of one step against the planner's count
// (cost_models/parallel.cpp "ep.dispatch_combine"): per MoE layer 2 forward
// (dispatch, combine) and 2 backward all-to-alls of moe_slots(T) x d x bytes,
// T the rank's tokens; dropless moe_slots(T) = T x top_k (no null experts).
// The runtime's payload (rows actually sent, self included) summed over the
// expert group is exactly ep x that; its messages are padded to equal chunks.
TEST(ExpertParallel, AllToAllBytesMatchThePlannersCount) {
  const int64_t world = g_world->size();
  if (world < 2) {
    GTEST_SKIP() << "needs >= 2 ranks (mpirun)";
  }
  Config config = tiny_config();
  moe_families()[1].edit(config);  // top-2 dropless, every layer MoE
  ParallelConfig layout;
  ProcessGroups groups = make_process_groups(*g_world, layout);
  const int64_t dp = groups.shape.data, ep = dp, rows = kBatch / dp, seq = config.model.seq_len;
  Model model(*g_backend, config, fp64_options());
  ExpertParallelTrainer trainer(model, *groups.data, ep);
  Buffer tokens = model.make_tokens(ids(kV, seq, groups.at.data * rows, rows, 0), rows, seq);
  Buffer targets = model.make_tokens(ids(kV, seq, groups.at.data * rows, rows, 1), rows, seq);
  trainer.train_step(tokens, targets);
  trainer.reset_traffic();
  trainer.train_step(tokens, targets);
  const ExpertTraffic& t = trainer.traffic();
  const int64_t moe_layers = kLayers, top_k = 2, bytes = 8;
  const int64_t planner_one = rows * seq * top_k * kD * bytes;  // moe_slots(T) d B
  EXPECT_EQ(t.all_to_all_calls, 4 * moe_layers);
  const std::vector<double> sums = all_reduce_sum(
      *g_backend, trainer.expert_group(),
      {static_cast<double>(t.payload_bytes), static_cast<double>(t.all_to_all_bytes)});
  EXPECT_EQ(static_cast<int64_t>(sums[0]), ep * 4 * moe_layers * planner_one);
  EXPECT_GE(static_cast<int64_t>(sums[1]), static_cast<int64_t>(sums[0]));
  // Counts before every forward exchange: the assignments all-gather
  // (1 + E k values), the counts all-to-all (E values), one chunk maximum.
  EXPECT_EQ(t.count_bytes, moe_layers * bytes * ((1 + 4 * top_k) * ep + 4 + 1));
}

TEST(ExpertParallel, AnExpertGroupThatDoesNotDivideIsRefusedNamingTheField) {
  Config config = tiny_config();
  moe_families()[0].edit(config);
  ProcessGroups groups = make_process_groups(*g_world, ParallelConfig{});
  Model model(*g_backend, config, fp64_options());
  expect_config_error([&] { ExpertParallelTrainer trainer(model, *groups.data, 3); },
                      {"parallel.expert = 3"});
  if (g_world->size() >= 2) {
    config.moe.experts = 3;
    Model three(*g_backend, config, fp64_options());
    expect_config_error([&] { ExpertParallelTrainer trainer(three, *groups.data, 2); },
                        {"moe.experts = 3"});
  }
}

}  // namespace
}  // namespace modar::runtime

int main(int argc, char** argv) {
  return modar::runtime::run_parallel_tests(argc, argv);
}
