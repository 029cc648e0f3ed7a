// The composed trainer (ParallelTrainer: tensor x pipeline x data, the
// interleaved 1F1B schedule) equals the single-process step (fp64, CPU
// backend); its pipeline bytes are the planner's; the objective holds when
// the parts of a batch count different numbers of targets.
//
// Run as one process and under mpirun with 2 and 4 (tests/CMakeLists.txt).
// Every rank also runs the single-process Model on the whole global batch and
// compares after two AdamW steps: losses to 1e-12 relative, every parameter
// (a tensor rank: its Megatron shard) and, ZeRO 0, every gradient to 1e-12
// of its tensor's largest entry.
#include <cstring>

#include "modar/cost_model.hpp"
#include "modar/parallel.hpp"
#include "parallel_test_common.hpp"

namespace modar::runtime {
namespace {

struct Layout {
  int64_t tensor = 1, pipeline = 1, virtual_stages = 1, microbatches = 1;
  bool sequence_parallel = false;
  std::string describe() const {
    return "t " + std::to_string(tensor) + (sequence_parallel ? " sp" : "") + " x p " +
           std::to_string(pipeline) + " v " + std::to_string(virtual_stages) + " m " +
           std::to_string(microbatches);
  }
};

// The tiny model with 4 heads (TP shards them), 8 positions (SP shards them)
// and 16 tokens (t = 2 splits the vocabulary: Megatron's vocab-parallel
// embedding and head).
Config composed_config(const Family& family, const Layout& layout) {
  Config config = tiny_config();
  config.model.n_heads = 4;
  config.model.n_kv_heads = 2;
  config.model.seq_len = 8;
  config.model.vocab_size = 16;
  family.edit(config);
  if (layout.sequence_parallel && config.mod.enabled() &&
      config.mod.routed_tokens_per_sequence(8) > 8 / layout.tensor) {
    config.mod.capacity = 0.25;  // k = 2 = s / t (a shard must hold k rows)
  }
  return config;
}

// Hand-worked Megatron interleaved orders (docs/runtime_parallel.md): p = 2,
// v = 2, table of the forward passes in groups of p micro-batches, warm-up
// 2 (p - s - 1) + (v - 1) p, backward k on the mirrored chunk.
std::vector<PipelinePass> hand_interleaved(int64_t microbatches, int64_t stage) {
  auto f = [](int64_t mb, int64_t c) { return PipelinePass{true, mb, c}; };
  auto b = [](int64_t mb, int64_t c) { return PipelinePass{false, mb, c}; };
  if (microbatches == 2) {
    // Table (0,k0) (1,k0) (0,k1) (1,k1); stage 0: warm-up 4 (everything).
    if (stage == 0) {
      return {f(0, 0), f(1, 0), f(0, 2), f(1, 2), b(0, 2), b(1, 2), b(0, 0), b(1, 0)};
    }
    return {f(0, 1), f(1, 1), f(0, 3), b(0, 3), f(1, 3), b(1, 3), b(0, 1), b(1, 1)};
  }
  // m = 4: table (0,k0) (1,k0) (0,k1) (1,k1) (2,k0) (3,k0) (2,k1) (3,k1).
  if (stage == 0) {
    return {f(0, 0), f(1, 0), f(0, 2), f(1, 2), f(2, 0), b(0, 2), f(3, 0), b(1, 2),
            f(2, 2), b(0, 0), f(3, 2), b(1, 0), b(2, 2), b(3, 2), b(2, 0), b(3, 0)};
  }
  return {f(0, 1), f(1, 1), f(0, 3), b(0, 3), f(1, 3), b(1, 3), f(2, 1), b(0, 1),
          f(3, 1), b(1, 1), f(2, 3), b(2, 3), f(3, 3), b(3, 3), b(2, 1), b(3, 1)};
}

// The plain residual's sends (peer, bytes) of stage `stage` in one step: per
// micro-batch, each of its chunks c sends its output forward (c < C - 1) and
// its input gradient back (c > 0), T d 8 / t bytes each (T = rows x s: each
// tensor rank sends 1 / t of the replicated tensor, or its SP shard whole).
std::vector<std::pair<int, int64_t>> expected_activation_sends(const Config& config,
                                                               const Layout& layout,
                                                               int64_t micro_rows, int64_t stage) {
  const int64_t p = layout.pipeline, chunks = p * layout.virtual_stages;
  const int64_t bytes =
      micro_rows * config.model.seq_len * config.model.d_model * 8 / layout.tensor;
  std::vector<std::pair<int, int64_t>> out;
  for (int64_t mb = 0; mb < layout.microbatches; ++mb) {
    for (int64_t c = stage; c < chunks; c += p) {
      if (c + 1 < chunks) {
        out.emplace_back(static_cast<int>((c + 1) % p), bytes);
      }
      if (c > 0) {
        out.emplace_back(static_cast<int>((c - 1) % p), bytes);
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The planner's pipeline message for this layout (cost_models/parallel.cpp,
// "pp.activation"): bytes of one boundary send per micro-batch, in fp32 (the
// planner's widest dtype; the runtime's tests run fp64, twice the bytes).
Estimate planner_estimate(Config config, const Layout& layout, int64_t dp) {
  config.parallel.tensor = layout.tensor;
  config.parallel.pipeline = layout.pipeline;
  config.parallel.virtual_stages = layout.virtual_stages;
  config.parallel.schedule =
      layout.virtual_stages > 1 ? PipelineSchedule::interleaved : PipelineSchedule::one_f_one_b;
  config.parallel.sequence_parallel = layout.sequence_parallel;
  config.parallel.balance_stages = false;
  config.device.count = layout.tensor * layout.pipeline * dp;
  config.device.profile = "a100-80gb-dgx";
  config.train.dtype = DType::fp32;
  config.train.micro_batch = kBatch / dp / layout.microbatches;
  config.train.global_batch = kBatch;
  return estimate(config, load_profile("a100-80gb-dgx"));
}

double planner_boundary_bytes(const Estimate& e) {
  for (const CommRecord& record : e.cluster->comm) {
    if (std::strcmp(record.label, "pp.activation") == 0) {
      return record.bytes;
    }
  }
  ADD_FAILURE() << "no pp.activation record";
  return 0.0;
}

struct ComposedRun {
  std::vector<std::pair<int, int64_t>> last_step_sends;  // pipeline group (peer, bytes)
  std::vector<PipelinePass> schedule;
};

// Two steps of the composed trainer against the single-process reference.
void check_composed(const Family& family, const Layout& layout, TokenIds targets_of = distinct_ids,
                    ComposedRun* out = nullptr) {
  if (g_world->size() % (layout.tensor * layout.pipeline) != 0) {
    return;
  }
  const Config config = composed_config(family, layout);
  const std::string what =
      family.name + " " + layout.describe() + " on " + std::to_string(g_world->size()) + " ranks";
  SCOPED_TRACE(what);
  Model shapes(*g_backend, config, fp64_options());
  const Reference ref = serial_reference(config, distinct_ids, fp64_options(), targets_of);
  ParallelConfig parallel;
  parallel.tensor = layout.tensor;
  parallel.pipeline = layout.pipeline;
  ProcessGroups groups = make_process_groups(*g_world, parallel);
  auto counting = std::make_unique<CountingCommunicator>(std::move(groups.pipeline));
  CountingCommunicator* counter = counting.get();
  groups.pipeline = std::move(counting);
  const int64_t dp = groups.shape.data;
  ParallelTrainerOptions options;
  options.microbatches = layout.microbatches;
  options.virtual_stages = layout.virtual_stages;
  options.sequence_parallel = layout.sequence_parallel;
  options.zero_stage = dp > 1 ? 1 : 0;
  ParallelTrainer trainer(*g_backend, config, fp64_options(), groups, options);
  const RankBatch batch = rank_batch(config, groups, distinct_ids, targets_of);
  for (int s = 0; s < kSteps; ++s) {
    counter->sends.clear();
    expect_losses(trainer.train_step(batch.tokens, batch.targets),
                  ref.steps[static_cast<size_t>(s)], "step " + std::to_string(s));
  }
  int64_t checked = 0;
  for (const auto& p : trainer.parameters().all()) {
    const size_t i = index_of(ref, p->name);
    const std::vector<int64_t> full =
        shapes.parameters().find(p->name)->value.view().shape_vector();
    const int64_t rows = full[0], cols = full.size() == 2 ? full[1] : 1, t = layout.tensor;
    const bool vocab = t > 1;  // 16 tokens: t = 2 splits them
    expect_values(download(*g_backend, p->value),
                  megatron_shard(p->name, ref.values[i], rows, cols, t, groups.at.tensor, vocab),
                  p->name);
    if (options.zero_stage == 0) {
      std::vector<double> g = download(*g_backend, p->grad);
      for (double& v : g) {
        v /= static_cast<double>(dp * layout.microbatches);
      }
      expect_gradient(g,
                      megatron_shard(p->name, ref.grads[i], rows, cols, t, groups.at.tensor, vocab),
                      "grad " + p->name);
    }
    ++checked;
  }
  EXPECT_GT(checked, 0);
  if (layout.virtual_stages == 2 && layout.pipeline == 2) {
    EXPECT_TRUE(trainer.last_schedule() == hand_interleaved(layout.microbatches, groups.at.stage));
  }
  // Every send of the pipeline group in the last step, by hand (AttnRes /
  // DAR: the bank entries the receiver lacks, test_parallel_depth.cpp's count).
  std::vector<std::pair<int, int64_t>> sends = counter->sends;
  std::sort(sends.begin(), sends.end());
  const int64_t micro_rows = kBatch / dp / layout.microbatches;
  std::vector<std::pair<int, int64_t>> want =
      config.dar.enabled()
          ? expected_sends(config, layout.pipeline, layout.virtual_stages, true, micro_rows,
                           layout.microbatches, groups.at.stage, layout.tensor)
          : expected_activation_sends(config, layout, micro_rows, groups.at.stage);
  const int64_t p = layout.pipeline, stage = groups.at.stage;
  if (config.model.tie_embeddings && p > 1 && (stage == 0 || stage == p - 1)) {
    // The tied embedding's gradient, once each way between the two ends: V d 8
    // (a tensor rank its V / t rows).
    want.emplace_back(static_cast<int>(p - 1 - stage),
                      config.model.vocab_size / layout.tensor * config.model.d_model * 8);
    std::sort(want.begin(), want.end());
  }
  EXPECT_EQ(sends, want);
  if (out != nullptr) {
    out->last_step_sends = counter->sends;
    out->schedule = trainer.last_schedule();
  }
}

std::vector<Family> families() {
  return common_families();
}

// ---- TP x PP in one trainer ---------------------------------------------------------------

TEST(Composed, TensorByPipelineEqualsTheSingleProcessStep) {
  if (g_world->size() != 4) {
    GTEST_SKIP() << "t 2 x p 2 needs 4 ranks (mpirun -np 4)";
  }
  // Both schedules and both tensor forms for every family, in two layouts
  // (the four combinations cost twice the time and show nothing more: the
  // schedule and the tensor form do not touch each other's code).
  for (const Family& family : families()) {
    check_composed(family, Layout{2, 2, 1, 2, true});
    check_composed(family, Layout{2, 2, 2, 2, false});
  }
}

// ---- Megatron's vocab-parallel embedding and head (t | V) ---------------------------------

// t 2, one stage (np 2; np 4 with dp 2, ZeRO 1): the embedding's rows and the
// head's columns split over the tensor group, the cross-entropy combined
// across the vocabulary shards; untied and tied, with and without SP.
// Skipping the all-reduce of the head's input gradient fails it.
TEST(Composed, VocabParallelHeadEqualsTheSingleProcessStep) {
  if (g_world->size() < 2) {
    GTEST_SKIP() << "needs >= 2 ranks (mpirun)";
  }
  const std::vector<Family> all = families();
  check_composed(all[0], Layout{2, 1, 1, 1, false});  // dense
  check_composed(all[0], Layout{2, 1, 1, 1, true});
  check_composed(all[1], Layout{2, 1, 1, 1, false});  // tied: the head reads the embedding's rows
  check_composed(all[2], Layout{2, 1, 1, 1, true});   // MoD
}

// ---- the interleaved 1F1B schedule ------------------------------------------------------------

TEST(Composed, InterleavedScheduleEqualsTheSingleProcessStep) {
  const int64_t world = g_world->size();
  if (world < 2) {
    GTEST_SKIP() << "needs >= 2 ranks (mpirun)";
  }
  std::vector<Family> all = families();
  all.push_back({"moe_dropless",  // the model's own MoE layers on each stage (t = 1)
                 [](Config& c) {
                   c.moe.experts = 4;
                   c.moe.top_k = 2;
                   c.moe.interval = 2;
                   c.moe.aux_loss_coef = 0.0;  // a batch statistic, not a mean over rows
                   c.moe.z_loss_coef = 1e-3;
                 }});
  for (const Family& family : all) {
    // p 2 x dp (world / 2), m = 2; m = 4 (two groups of p micro-batches) for
    // the dense model.
    check_composed(family, Layout{1, 2, 2, 2, false});
  }
  check_composed(all.front(), Layout{1, 2, 2, 4, false});
}

// ---- the bytes on the pipeline group are the planner's ------------------------------------------

// t 2 x p 2, v 2, m 2 (np 4), micro-batches of 4 x 8 tokens, d = 16, fp64.
// Plain residual: a boundary tensor [4, 8, 16] is replicated over the tensor
// group without SP, so each tensor rank sends half of it (SP: its half of the
// sequence), T d 8 / t = 32 x 16 x 8 / 2 = 2048 bytes; the planner's
// "pp.activation" message in fp32 is half that (1024).
// DAR (Block, K = 2, n = 2; L = 4 in 4 chunks of one layer, cached): the
// boundaries after layers 1, 2, 3 send 2 (H_0 + the cut block's partial),
// 2 - 1 (H_1; stage 0 held H_0) and 2 - 2 + 1 (the partial; stage 1 held
// H_0, H_1) entries, 4 in all, each n (T / t) (d + 1) 8 = 2 x 16 x 17 x 8 =
// 4352 bytes with its key rstd forward and n (T / t) d 8 = 4096 back: over
// both stages and m = 2, 2 x (4 x 4352 + 4 x 4096) = 67584 bytes.  The
// planner's cached bank per micro-batch (n T (4 d + 4) / t each, fp32) is
// 4 x 2176 = 8704.
TEST(Composed, PipelineBytesAreThePlannersScatterGatherCount) {
  if (g_world->size() != 4) {
    GTEST_SKIP() << "t 2 x p 2 needs 4 ranks (mpirun -np 4)";
  }
  for (bool sp : {false, true}) {
    const Layout layout{2, 2, 2, 2, sp};
    const Family dense = families().front();
    ComposedRun run;
    check_composed(dense, layout, distinct_ids, &run);  // every send checked by hand there
    ASSERT_EQ(run.last_step_sends.size(), 6U);
    EXPECT_EQ(run.last_step_sends.front().second, 2048);
    const Estimate plain = planner_estimate(composed_config(dense, layout), layout, 1);
    EXPECT_EQ(planner_boundary_bytes(plain), 1024.0) << (sp ? "sp" : "no sp");

    const Family dar{"dar_block", [](Config& c) {
                       c.dar.variant = DarVariant::dar;
                       c.dar.block_layers = 2;
                     }};
    check_composed(dar, layout, distinct_ids, &run);
    int64_t mine = 0;
    for (const auto& send : run.last_step_sends) {
      mine += send.second;
    }
    // Summed over the pipeline group (this tensor rank's two stages).
    ParallelConfig parallel;
    parallel.tensor = 2;
    parallel.pipeline = 2;
    ProcessGroups groups = make_process_groups(*g_world, parallel);
    EXPECT_EQ(all_reduce_sum(*g_backend, *groups.pipeline, {static_cast<double>(mine)})[0],
              67584.0);
    const Estimate bank = planner_estimate(composed_config(dar, layout), layout, 1);
    EXPECT_EQ(bank.cluster->bank_send_bytes_cached, 8704.0) << (sp ? "sp" : "no sp");
  }
}

// ---- the objective when the parts of a batch count different targets --------------------------

// tail_ignored_ids: row r ignores its last r mod s targets, so every
// micro-batch and data rank counts a different number of targets.  The
// single-process objective is the mean over all counted targets of the
// batch; the mean of the parts' means (each part weighted 1) is not, and
// fails here (lm_loss and every gradient).
TEST(Objective, UnevenlyIgnoredTargetsGiveTheSingleProcessStep) {
  const int64_t world = g_world->size();
  for (const Family& family : {families()[0], families()[2]}) {  // dense, MoD (aux loss)
    // Composed: micro-batches of 2 rows on 1 or 2 stages (world 4: t 2 x p 2,
    // and p 2 x dp 2); at world 1, 4 micro-batches.
    check_composed(family, Layout{1, 1, 1, world == 1 ? 4 : 2, false}, tail_ignored_ids);
    check_composed(family, Layout{1, 2, 1, 2, false}, tail_ignored_ids);
    check_composed(family, Layout{2, 2, 1, 2, false}, tail_ignored_ids);
    // DataParallelTrainer (ZeRO 0): each rank its rows.
    const Config config = composed_config(family, Layout{});
    const Reference ref = serial_reference(config, distinct_ids, fp64_options(), tail_ignored_ids);
    ProcessGroups groups = make_process_groups(*g_world, ParallelConfig{});
    Model model(*g_backend, config, fp64_options());
    DataParallelTrainer trainer(model, *groups.data, 0);
    const RankBatch batch = rank_batch(config, groups, distinct_ids, tail_ignored_ids);
    for (int s = 0; s < kSteps; ++s) {
      expect_losses(trainer.train_step(batch.tokens, batch.targets),
                    ref.steps[static_cast<size_t>(s)],
                    family.name + " dp step " + std::to_string(s));
    }
    for (size_t i = 0; i < ref.names.size(); ++i) {
      expect_values(download(*g_backend, model.parameters().all()[i]->value), ref.values[i],
                    family.name + " dp " + ref.names[i]);
    }
  }
}

}  // namespace
}  // namespace modar::runtime

int main(int argc, char** argv) {
  return modar::runtime::run_parallel_tests(argc, argv);
}
