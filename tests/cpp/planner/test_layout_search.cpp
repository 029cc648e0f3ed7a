// Cluster planning (docs/cluster.md): the layout search returns the fastest
// memory-feasible layout (checked against brute force through estimate()),
// `optimal --gpus 1024` lands near the closed-form optimum with a layout, and
// on one GPU the loss-optimal model that does not fit is named, not hidden.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "modar/cost_model.hpp"
#include "modar/layout_search.hpp"
#include "modar/parallel.hpp"
#include "modar/planner.hpp"

namespace modar {
namespace {

TEST(LayoutSearch, FastestFeasibleLayoutMatchesBruteForce) {
  Config c;
  c.model.d_model = 1024;
  c.model.n_layers = 8;
  c.model.n_heads = 8;
  c.model.vocab_size = 8192;
  c.model.seq_len = 512;
  c.device.profile = "a100-80gb-dgx";
  DeviceProfile profile = load_profile("a100-80gb-dgx");
  profile.ceilings.memory_bytes = 1.2e9;  // tight: forces model parallelism or sharding
  const TimingModel timing(profile);
  LayoutSearchOptions options;
  options.gpus = 4;
  options.global_batch = 16;
  const LayoutSearchResult found = search_layout(c, timing, options);
  ASSERT_TRUE(found.fits);
  // Brute force over the same space through the public estimate().
  double best = INFINITY;
  for (int64_t t : {1, 2, 4}) {
    for (int64_t p : {1, 2, 4}) {
      if (t * p > 4) {
        continue;
      }
      const int64_t dp = 4 / (t * p);
      for (int64_t v : {1, 2}) {
        if (v == 2 && p == 1) {
          continue;
        }
        for (int64_t mb : {1, 2, 4}) {
          if (16 % (mb * dp) != 0) {
            continue;
          }
          for (int64_t zero : {0, 1, 3}) {  // the searched stages
            if ((dp == 1) != (zero == 0)) {
              continue;
            }
            for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full}) {
              Config k = c;
              k.device.count = 4;
              k.cluster.gpus_per_node = 8;
              k.parallel.tensor = t;
              k.parallel.sequence_parallel = t > 1;
              k.parallel.pipeline = p;
              k.parallel.schedule =
                  v > 1 ? PipelineSchedule::interleaved : PipelineSchedule::one_f_one_b;
              k.parallel.virtual_stages = v;
              k.parallel.zero = zero;
              k.train.micro_batch = mb;
              k.train.global_batch = 16;
              k.train.recompute = r;
              const Estimate e = estimate(k, profile);
              if (e.memory.fits) {
                best = std::min(best, e.time.step_s);
              }
            }
          }
        }
      }
    }
  }
  EXPECT_NEAR(found.estimate.time.step_s, best, 1e-9 * best);
  EXPECT_FALSE(found.summary.empty());
}

TEST(LayoutSearch, ChinchillaBudgetOn1024GpusFitsNearTheClosedForm) {
  OptimalRequest request;
  request.train_flops = 5.76e23;
  request.gpus = 1024;
  request.archs = {"baseline"};
  request.profile = "a100-80gb-dgx";
  const OptimalResult result = optimal(request);
  const Recommendation& rec = result.recommendations.front();
  const ClosedFormOptimum closed = closed_form_optimum(result.fit.params, 5.76e23);
  EXPECT_NEAR(closed.n_opt, 7.22e10, 0.01e10);  // SPEC section 4 fixture
  EXPECT_LT(std::fabs(rec.params.flop_active / closed.n_opt - 1.0), 0.1);
  EXPECT_TRUE(rec.memory.fits);
  EXPECT_GT(rec.config.parallel.data(rec.config.device.count) * rec.config.parallel.tensor *
                rec.config.parallel.pipeline,
            1023);
  EXPECT_GT(result.layouts_evaluated, 0);
  bool noted = false;
  for (const std::string& note : result.notes) {
    noted = noted || note.find("with layout TP") != std::string::npos;
  }
  EXPECT_TRUE(noted);
  EXPECT_NE(to_table(result).find("layout"), std::string::npos);
  EXPECT_NE(to_json(result).find("\"layout\""), std::string::npos);
}

TEST(LayoutSearch, OneGpuSaysTheLossOptimalModelDoesNotFit) {
  OptimalRequest request;
  request.train_flops = 1e22;
  request.archs = {"baseline"};
  const OptimalResult result = optimal(request);
  const ClosedFormOptimum closed = closed_form_optimum(result.fit.params, 1e22);
  const Recommendation& rec = result.recommendations.front();
  ASSERT_LT(rec.params.flop_active, 0.8 * closed.n_opt);  // shrunk to fit one device
  bool noted = false;
  for (const std::string& note : result.notes) {
    noted = noted || (note.find("loss-optimal") != std::string::npos &&
                      note.find("does not fit") != std::string::npos);
  }
  EXPECT_TRUE(noted);
}

}  // namespace
}  // namespace modar
