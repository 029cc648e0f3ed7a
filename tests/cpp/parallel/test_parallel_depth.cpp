// AttnRes / DAR models across pipeline stages (fp64, CPU backend): the
// pipeline step equals the single-process step on the same global batch, and
// the bytes each boundary sends are the planner's (docs/runtime_parallel.md,
// cost_models/parallel.cpp), counted here by hand.
//
// Run as one process and under mpirun with 2 and 4 (tests/CMakeLists.txt).
// Every rank also runs the single-process Model on the whole global batch (the
// models are tiny) and compares after two AdamW steps: losses to 1e-12
// relative, every parameter (and, ZeRO 0, every gradient) to 1e-12 of its
// tensor's largest entry.
#include <utility>

#include "parallel_test_common.hpp"

namespace modar::runtime {
namespace {

std::vector<Family> families() {
  return {
      {"attnres_block", set_dar({.variant = DarVariant::attnres, .block_layers = 2})},
      {"attnres_full", set_dar({.variant = DarVariant::attnres, .block_layers = 1})},
      {"dar_full", set_dar({.variant = DarVariant::dar, .block_layers = 1})},
      {"dar_block", set_dar({.variant = DarVariant::dar, .block_layers = 2})},
      // n > 2: Sinkhorn transport, own-stream keys and values
      {"selfkv_n3", set_dar({.variant = DarVariant::selfkv, .block_layers = 2, .streams = 3})},
      {"mod_dar",
       set_mod_dar({.capacity = 0.5, .every = 2, .causal_router = CausalRouter::aux_loss},
                   {.variant = DarVariant::dar, .block_layers = 2})},
  };
}

// fp64_options() with AdamW in its near-linear regime:
ModelOptions depth_options() {
  ModelOptions options = fp64_options();
  // AdamW in its near-linear regime (epsilon = 1 >> |g|: the update is about
  // lr m, like momentum SGD), so that a parameter's error is its gradients'
  // error.  With epsilon = 1e-8, AdamW divides every element by its own
  // gradient scale: an element whose gradient is 1e-3 of its tensor's largest
  // and carries a 1e-14..4e-12 relative difference of summation order (any
  // regrouping: the cached bank's gradient is summed on the stage holding the
  // entry and then added to the other stages', a + (b + c) for (a + b) + c;
  // data-parallel means over 8 micro-batches do the same) moves lr times that
  // difference, 1.3e-12 of the largest entry of the zero-initialised
  // depth.query after two steps (Full DAR; both beta1 = 0.9 and 0).  The
  // gradients are checked to 1e-12 of their largest entry as they are.
  options.adamw.learning_rate = 0.1;
  options.adamw.epsilon = 1.0;
  return options;
}

// The single-process step on tokens all different within a sequence
// (distinct_ids: a repeated token routed with its copy would tie the copy's
// router logit in exact arithmetic, and MoD's top-k would pick between them
// by rounding; docs/runtime_parallel.md, MoD top-k at exact ties).
Reference depth_reference(const Config& config) {
  return serial_reference(config, distinct_ids, depth_options());
}

void check_pipeline(const Family& family, int64_t stages, int64_t virtual_stages,
                    int64_t microbatches, bool cache) {
  Config config = tiny_config();
  family.edit(config);
  const int64_t world = g_world->size(), dp = world / stages;
  const int64_t zero = dp > 1 ? 1 : 0;
  const std::string what = family.name + " pp " + std::to_string(stages) + " v " +
                           std::to_string(virtual_stages) + " m " + std::to_string(microbatches) +
                           (cache ? " cached" : " whole bank") + " dp " + std::to_string(dp) +
                           " on " + std::to_string(world) + " ranks";
  SCOPED_TRACE(what);
  const Reference ref = depth_reference(config);
  ProcessGroups groups = make_process_groups(*g_world, {.pipeline = stages, .zero = zero});
  auto counting = std::make_unique<CountingCommunicator>(std::move(groups.pipeline));
  CountingCommunicator* counter = counting.get();
  groups.pipeline = std::move(counting);
  const int64_t rows = kBatch / dp;
  ParallelTrainer trainer(*g_backend, config, depth_options(), groups,
                          {.microbatches = microbatches,
                           .virtual_stages = virtual_stages,
                           .zero_stage = zero,
                           .dar_bank_cache = cache});
  const RankBatch batch = rank_batch(config, groups, distinct_ids);
  for (int s = 0; s < kSteps; ++s) {
    counter->sends.clear();
    const StepResult got = trainer.train_step(batch.tokens, batch.targets);
    const StepResult& want = ref.steps[static_cast<size_t>(s)];
    const std::string step = " step " + std::to_string(s);
    expect_close(got.loss, want.loss, "loss" + step);
    expect_close(got.lm_loss, want.lm_loss, "lm_loss" + step);
    expect_close(got.router_aux, want.router_aux, "router_aux" + step);
  }
  // Every parameter this stage holds (the depth parameters on every stage).
  int64_t checked = 0;
  for (const auto& p : trainer.parameters().all()) {
    const auto it = std::find(ref.names.begin(), ref.names.end(), p->name);
    ASSERT_NE(it, ref.names.end()) << p->name;
    const size_t i = static_cast<size_t>(it - ref.names.begin());
    expect_values(download(*g_backend, p->value), ref.values[i], p->name);
    if (zero == 0) {
      std::vector<double> g = download(*g_backend, p->grad);
      for (double& v : g) {
        v /= static_cast<double>(dp * microbatches);
      }
      expect_values(g, ref.grads[i], "grad " + p->name);
    }
    ++checked;
  }
  EXPECT_GT(checked, 0);
  // The bank's bytes of the last step, message by message.
  std::vector<std::pair<int, int64_t>> sends = counter->sends;
  std::sort(sends.begin(), sends.end());
  EXPECT_EQ(sends, expected_sends(config, stages, virtual_stages, cache, rows / microbatches,
                                  microbatches, groups.at.stage));
  // The schedule: 1F1B at v = 1 (test_parallel_steps.cpp checks its order),
  // the interleaved 1F1B at v > 1 (test_parallel_composed.cpp).
  EXPECT_EQ(trainer.last_schedule().size(), static_cast<size_t>(2 * microbatches * virtual_stages));
}

TEST(PipelineDepth, BankAcrossStagesEqualsTheSingleProcessStep) {
  for (const Family& family : families()) {
    for (const int64_t stages : sizes_dividing_world()) {
      for (int64_t v : {int64_t{1}, int64_t{2}}) {
        if (stages * v > tiny_config().model.n_layers || (v > 1 && stages < 2)) {
          continue;
        }
        // m = 2: two micro-batches in flight under 1F1B, one bank state each
        // (m = 1 is the same code with one; kept out for the sanitizer
        // build's time).
        for (bool cache : {true, false}) {
          check_pipeline(family, stages, v, 2, cache);
        }
      }
    }
  }
}

// The byte formula above, once by hand for one layout (no communication):
// DAR Block (n = 2, K = 2), L = 4 in 4 chunks of one layer on 2 stages, one
// micro-batch of 4 x 6 tokens, d = 16, fp64.  Boundaries after layers 1, 2, 3:
//   layer 1 (stage 0 -> 1): H_0 + the cut block's partial: 2 entries, both modes;
//   layer 2 (stage 1 -> 0): H_0, H_1: 2 entries; cached: stage 0 held H_0 -> 1;
//   layer 3 (stage 0 -> 1): H_0, H_1 + partial: 3; cached: stage 1 held H_0,
//   H_1 (its chunk ended at layer 2) -> the partial only, 1.
// An entry is n T d 8 = 2 x 24 x 16 x 8 = 6144 bytes (+ 2 x 24 x 8 = 384 of rstd).
TEST(PipelineDepth, HandCountOfTheCachedBankBytes) {
  Config config = tiny_config();
  config.dar.variant = DarVariant::dar;
  config.dar.block_layers = 2;
  // Stage 0 sends forward at layers 1 and 3 and a gradient back at layer 2.
  // Cached: layer 1: 2 entries = 12288 + 768 rstd; layer 3: 6144 + 384;
  // backward of layer 2 (1 entry): 6144.
  const std::vector<std::pair<int, int64_t>> cached0 = {
      {1, 384}, {1, 768}, {1, 6144}, {1, 6144}, {1, 12288}};
  EXPECT_EQ(expected_sends(config, 2, 2, true, 4, 1, 0), cached0);
  // Whole bank: layer 1: 12288 + 768; layer 3: 18432 + 1152; layer 2 back: 12288.
  const std::vector<std::pair<int, int64_t>> whole0 = {
      {1, 768}, {1, 1152}, {1, 12288}, {1, 12288}, {1, 18432}};
  EXPECT_EQ(expected_sends(config, 2, 2, false, 4, 1, 0), whole0);
}

TEST(PipelineDepth, VirtualStagesWithoutAPipelineAreRefusedNamingTheField) {
  Config config = tiny_config();
  config.dar.variant = DarVariant::dar;
  ProcessGroups groups = make_process_groups(*g_world, {.pipeline = 1});
  expect_config_error(
      [&] {
        ParallelTrainer trainer(*g_backend, config, depth_options(), groups, {.virtual_stages = 2});
      },
      {"parallel.virtual_stages = 2"});
}

}  // namespace
}  // namespace modar::runtime

int main(int argc, char** argv) {
  return modar::runtime::run_parallel_tests(argc, argv);
}
