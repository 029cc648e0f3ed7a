// Parallel training steps equal the single-process step (fp64, CPU backend).
//
// Run as one process and under mpirun with 2 and 4 (tests/CMakeLists.txt).
// Every rank also runs the single-process Model on the whole global batch (the
// models are tiny), and compares with its own part after two steps: the
// losses, the reduced gradients, and every parameter, to 1e-12 relative.
#include "parallel_test_common.hpp"

namespace modar::runtime {
namespace {

std::vector<Family> families() {
  return common_families();
}

// ---- layout arithmetic (no communication) ---------------------------------------------

TEST(ParallelLayout, RankIsTensorFastestThenStageThenData) {
  ParallelConfig layout;
  layout.tensor = 2;
  layout.pipeline = 3;
  const LayoutShape shape = layout_shape(layout, 12);
  EXPECT_EQ(shape.data, 2);
  // Hand count: rank 11 = 1 + 2 * (2 + 3 * 1).
  const LayoutCoordinates at = layout_coordinates(shape, 11);
  EXPECT_EQ(at.tensor, 1);
  EXPECT_EQ(at.stage, 2);
  EXPECT_EQ(at.data, 1);
  const LayoutCoordinates at7 = layout_coordinates(shape, 7);  // 1 + 2 * (0 + 3 * 1)
  EXPECT_EQ(at7.tensor, 1);
  EXPECT_EQ(at7.stage, 0);
  EXPECT_EQ(at7.data, 1);
  for (int64_t r = 0; r < 12; ++r) {
    EXPECT_EQ(layout_rank(shape, layout_coordinates(shape, r)), r);
  }
  EXPECT_THROW(layout_shape(layout, 10), ConfigError);
}

TEST(ParallelLayout, GroupsHoldTheRanksSharingTheOtherCoordinates) {
  const int world = g_world->size();
  ParallelConfig layout;
  layout.pipeline = world >= 2 ? 2 : 1;
  ProcessGroups groups = make_process_groups(*g_world, layout);
  EXPECT_EQ(groups.pipeline->size(), layout.pipeline);
  EXPECT_EQ(groups.data->size(), world / layout.pipeline);
  EXPECT_EQ(groups.tensor->size(), 1);
  EXPECT_EQ(groups.pipeline->rank(), groups.at.stage);
  EXPECT_EQ(groups.data->rank(), groups.at.data);
  // The members of my data group are the world ranks with my stage: sum of
  // their world ranks, by hand = sum over d of (stage + p d).
  const std::vector<double> sum =
      all_reduce_sum(*g_backend, *groups.data, {static_cast<double>(g_world->rank())});
  double want = 0.0;
  for (int64_t dd = 0; dd < groups.shape.data; ++dd) {
    want += static_cast<double>(groups.at.stage + layout.pipeline * dd);
  }
  EXPECT_EQ(sum[0], want);
}

// ---- data parallel and ZeRO ----------------------------------------------------------------

void check_data_parallel(const Family& family, int64_t zero) {
  Config config = tiny_config();
  family.edit(config);
  const std::string what = family.name + " zero " + std::to_string(zero) + " on " +
                           std::to_string(g_world->size()) + " ranks";
  const Reference ref = serial_reference(config);
  // tensor = pipeline = 1: every rank a data-parallel rank
  ProcessGroups groups = make_process_groups(*g_world, {.zero = zero});
  const int64_t dp = groups.shape.data;
  Model model(*g_backend, config, fp64_options());
  DataParallelTrainer trainer(model, *groups.data, zero);
  expect_reference_steps(trainer, rank_batch(config, groups), ref, what);
  const auto& params = model.parameters().all();
  ASSERT_EQ(params.size(), ref.names.size());
  std::vector<double> flat_grad;  // global-mean gradient, flattened in parameter order
  for (size_t i = 0; i < params.size(); ++i) {
    expect_values(download(*g_backend, params[i]->value), ref.values[i],
                  what + " " + params[i]->name);
    flat_grad.insert(flat_grad.end(), ref.grads[i].begin(), ref.grads[i].end());
    if (zero == 0) {
      // The all-reduced gradient is the sum of the dp ranks' means.
      std::vector<double> g = download(*g_backend, params[i]->grad);
      for (double& v : g) {
        v /= static_cast<double>(dp);
      }
      expect_gradient(g, ref.grads[i], what + " grad " + params[i]->name);
      EXPECT_FALSE(params[i]->adam_m.empty());
    } else {
      EXPECT_TRUE(params[i]->adam_m.empty()) << "ZeRO releases the full moments";
    }
  }
  if (zero >= 1) {
    const ShardedOptimizer& opt = trainer.optimizer();
    EXPECT_EQ(opt.shard_numel() * dp, opt.flat_numel());
    EXPECT_GE(opt.flat_numel(), static_cast<int64_t>(flat_grad.size()));
    flat_grad.resize(static_cast<size_t>(opt.flat_numel()), 0.0);
    const auto begin = flat_grad.begin() + groups.at.data * opt.shard_numel();
    std::vector<double> want(begin, begin + opt.shard_numel());
    std::vector<double> got = opt.shard_gradient();
    for (double& v : got) {
      v /= static_cast<double>(dp);
    }
    if (max_abs(want) > 0.0) {
      expect_gradient(got, want, what + " shard gradient");
    }
  }
}

class DataParallelFamilies : public ::testing::TestWithParam<int> {};

TEST_P(DataParallelFamilies, EqualsTheSingleProcessStep) {
  for (const Family& family : families()) {
    check_data_parallel(family, GetParam());
  }
}
INSTANTIATE_TEST_SUITE_P(Zero, DataParallelFamilies, ::testing::Values(0, 1, 2));

TEST(DataParallel, ZeroShardsHoldLessOptimizerStateThanTheFullCopy) {
  if (g_world->size() < 2) {
    GTEST_SKIP() << "needs >= 2 ranks (mpirun)";
  }
  Config config = tiny_config();
  ParallelConfig layout;
  ProcessGroups groups = make_process_groups(*g_world, layout);
  const int64_t rows = kBatch / groups.shape.data, seq = config.model.seq_len;
  std::vector<int64_t> peaks;
  for (int64_t zero : {0, 1}) {
    Model model(*g_backend, config, fp64_options());
    const int64_t before = model.memory().live_bytes();
    DataParallelTrainer trainer(model, *groups.data, zero);
    const int64_t after = model.memory().live_bytes();
    const int64_t params = model.parameters().count();
    const int64_t shard = trainer.optimizer().shard_numel();
    if (zero == 1) {
      // Full moments (2 x params fp64) released; shard master + 2 moments held.
      EXPECT_EQ(after - before, 8 * (3 * shard - 2 * params));
    } else {
      EXPECT_EQ(after, before);
    }
    Buffer tokens = model.make_tokens(ids(13, seq, 0, rows, 0), rows, seq);
    Buffer targets = model.make_tokens(ids(13, seq, 0, rows, 1), rows, seq);
    peaks.push_back(trainer.train_step(tokens, targets).peak_bytes);
  }
  EXPECT_LT(peaks[1], peaks[0]);
}

// ---- pipeline parallel (1F1B), with data parallelism ------------------------------------------

void check_pipeline(const Family& family, int64_t stages, int64_t microbatches, int64_t zero) {
  Config config = tiny_config();
  family.edit(config);
  const std::string what = family.name + " pp " + std::to_string(stages) + " m " +
                           std::to_string(microbatches) + " zero " + std::to_string(zero) + " on " +
                           std::to_string(g_world->size()) + " ranks";
  const Reference ref = serial_reference(config);
  ProcessGroups groups = make_process_groups(*g_world, {.pipeline = stages, .zero = zero});
  const int64_t dp = groups.shape.data;
  ParallelTrainer trainer(*g_backend, config, fp64_options(), groups,
                          {.microbatches = microbatches, .zero_stage = zero});
  expect_reference_steps(trainer, rank_batch(config, groups), ref, what);
  for (const auto& p : trainer.parameters().all()) {
    const size_t i = index_of(ref, p->name);
    expect_values(download(*g_backend, p->value), ref.values[i], what + " " + p->name);
    if (zero == 0) {
      std::vector<double> g = download(*g_backend, p->grad);
      for (double& v : g) {
        v /= static_cast<double>(dp * microbatches);
      }
      expect_gradient(g, ref.grads[i], what + " grad " + p->name);
    }
  }
  // 1F1B: stage s runs min(p - s - 1, m) forwards before its first backward,
  // then alternates, and ends with the remaining backwards.
  const std::vector<PipelinePass>& order = trainer.last_schedule();
  ASSERT_EQ(static_cast<int64_t>(order.size()), 2 * microbatches);
  const int64_t warmup = std::min(stages - groups.at.stage - 1, microbatches);
  const int64_t chunk = groups.at.stage;
  std::vector<PipelinePass> want;
  int64_t f = 0, b = 0;
  for (; f < warmup; ++f) {
    want.push_back({true, f, chunk});
  }
  while (f < microbatches) {
    want.push_back({true, f++, chunk});
    want.push_back({false, b++, chunk});
  }
  while (b < microbatches) {
    want.push_back({false, b++, chunk});
  }
  EXPECT_TRUE(order == want) << what;
}

TEST(Pipeline, OneFOneBEqualsTheSingleProcessStep) {
  const int64_t world = g_world->size();
  for (const Family& family : families()) {
    if (family.name.find("dar") != std::string::npos ||
        family.name.find("attnres") != std::string::npos) {
      continue;  // AttnRes / DAR pipeline stages: tests/cpp/parallel/test_parallel_depth.cpp
    }
    for (const int64_t stages : sizes_dividing_world()) {
      const int64_t dp = world / stages;
      for (int64_t micro : {int64_t{1}, int64_t{2}, int64_t{4}}) {
        if ((kBatch / dp) % micro != 0) {
          continue;
        }
        check_pipeline(family, stages, micro, dp > 1 ? 1 : 0);
      }
    }
  }
}

// ---- tensor parallel (Megatron), with and without sequence parallelism -----------------------

void check_tensor(const Family& family, int64_t t, bool sp, int64_t zero) {
  Config config = tiny_config();
  config.model.n_heads = 4;
  config.model.n_kv_heads = t > 2 ? t : 2;
  config.model.seq_len = 8;
  family.edit(config);
  if (sp && config.mod.enabled() &&
      config.mod.routed_tokens_per_sequence(config.model.seq_len) > config.model.seq_len / t) {
    config.mod.capacity = 0.25;  // k = 2 = s / t (a shard must hold k rows)
  }
  const std::string what = family.name + " tp " + std::to_string(t) + (sp ? " sp" : "") + " zero " +
                           std::to_string(zero) + " on " + std::to_string(g_world->size()) +
                           " ranks";
  // The reference's full shapes, for the independent slicing.
  Model shapes(*g_backend, config, fp64_options());
  const Reference ref = serial_reference(config, distinct_ids);
  ProcessGroups groups =
      make_process_groups(*g_world, {.tensor = t, .sequence_parallel = sp, .zero = zero});
  const int64_t dp = groups.shape.data;
  ParallelTrainer trainer(*g_backend, config, fp64_options(), groups,
                          {.sequence_parallel = sp, .zero_stage = zero});
  expect_reference_steps(trainer, rank_batch(config, groups, distinct_ids), ref, what);
  ASSERT_EQ(trainer.parameters().all().size(), ref.names.size());
  // The vocabulary is split where t > 1 divides V (V = 13 here: never).
  const bool vocab_split = t > 1 && config.model.vocab_size % t == 0;
  for (const auto& p : trainer.parameters().all()) {
    const size_t i = index_of(ref, p->name);
    const Parameter* full = shapes.parameters().find(p->name);
    ASSERT_NE(full, nullptr);
    const int64_t r = full->value.dim(0), c = full->value.view().rank == 2 ? full->value.dim(1) : 1;
    const std::vector<double> want_value =
        megatron_shard(p->name, ref.values[i], r, c, t, groups.at.tensor, vocab_split);
    expect_values(download(*g_backend, p->value), want_value, what + " " + p->name);
    if (zero == 0) {
      std::vector<double> g = download(*g_backend, p->grad);
      for (double& v : g) {
        v /= static_cast<double>(dp);
      }
      expect_gradient(g,
                      megatron_shard(p->name, ref.grads[i], r, c, t, groups.at.tensor, vocab_split),
                      what + " grad " + p->name);
    }
  }
}

TEST(TensorParallel, MegatronLayersEqualTheSingleProcessStep) {
  const int64_t world = g_world->size();
  for (const Family& family : families()) {
    for (const int64_t t : sizes_dividing_world()) {
      for (bool sp : {false, true}) {
        check_tensor(family, t, sp, world / t > 1 ? 2 : 0);
      }
    }
  }
}

TEST(TensorParallel, AShardOfKvHeadsThatDoesNotDivideIsRefusedNamingTheFields) {
  if (g_world->size() < 2) {
    GTEST_SKIP() << "needs >= 2 ranks (mpirun)";
  }
  Config config = tiny_config();  // n_kv_heads = 1
  ProcessGroups groups = make_process_groups(*g_world, {.tensor = 2});
  expect_config_error(
      [&] {
        ParallelTrainer trainer(*g_backend, config, fp64_options(), groups,
                                ParallelTrainerOptions{});
      },
      {"model.n_kv_heads = 1", "parallel.tensor = 2"});
}

}  // namespace
}  // namespace modar::runtime

int main(int argc, char** argv) {
  return modar::runtime::run_parallel_tests(argc, argv);
}
