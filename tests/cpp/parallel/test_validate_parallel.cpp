// `modar validate --parallel` (runtime/calibration/validate_parallel.cpp).
//
// Alone: the dedicated-core replay of recorded timelines against step times
// worked out by hand.  Under mpirun -np 2 (tests/CMakeLists.txt): a tiny run of
// the multi-process validation checks the report's structure and that the
// measured parts add up (compute + comm = each rank's replayed end, the step
// is the slowest rank's), and that the predicted parts add up to the
// planner's step.  Accuracy is not checked here (noisy on a shared machine):
// it is the committed table's job (profiles/*.parallel-validation.txt).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "modar/base/errors.hpp"
#include "modar/profile.hpp"
#include "modar/runtime/host_facts.hpp"
#include "modar/runtime/parallel_steps.hpp"
#include "modar/runtime/profiler.hpp"
#include "modar/runtime/validate_parallel.hpp"

namespace modar::runtime {
namespace {

Backend* g_backend = nullptr;
Communicator* g_world = nullptr;

TimelineCall collective(int64_t group, int64_t sequence, std::vector<int> members, double compute,
                        double wall_start, double wall_end) {
  return {.group = group,
          .collective = true,
          .sequence = sequence,
          .members = std::move(members),
          .compute_before_s = compute,
          .wall_start_s = wall_start,
          .wall_end_s = wall_end};
}

// A send (send_to >= 0), a receive (recv_from >= 0) or both; `sequence`: the
// k-th send to / receive from that peer.
TimelineCall p2p(int send_to, int recv_from, double compute, double wall_start, double wall_end,
                 int64_t sequence = 0) {
  return {.group = 7,
          .collective = false,
          .members = {},
          .send_to = send_to,
          .recv_from = recv_from,
          .send_sequence = send_to >= 0 ? sequence : 0,
          .recv_sequence = recv_from >= 0 ? sequence : 0,
          .compute_before_s = compute,
          .wall_start_s = wall_start,
          .wall_end_s = wall_end};
}

// What a test worked out by hand for one replayed rank, in seconds; kAny:
// that part is not checked.
constexpr double kAny = std::numeric_limits<double>::quiet_NaN();
struct Replayed {
  double compute_s = kAny, transfer_s = kAny, wait_s = kAny, end_s = kAny;
};

void expect_replayed(const ReplayedRank& got, const Replayed& want, const char* rank) {
  const std::pair<double, double> parts[] = {{got.compute_s, want.compute_s},
                                             {got.transfer_s, want.transfer_s},
                                             {got.wait_s, want.wait_s},
                                             {got.end_s, want.end_s}};
  const char* names[] = {"compute_s", "transfer_s", "wait_s", "end_s"};
  for (size_t i = 0; i < 4; ++i) {
    if (!std::isnan(parts[i].second)) {
      EXPECT_DOUBLE_EQ(parts[i].first, parts[i].second) << rank << " " << names[i];
    }
  }
}

// Two ranks, one all-reduce.  Rank 0 computes 3 s, rank 1 5 s before it; on
// the wall clock rank 1 arrived last (10.5) and both left at 11.0, so the
// transfer is 0.5 s.  Replayed: the call starts at 5, ends at 5.5; rank 0
// waited 2 s; then 1 s and 0 s of compute: ends 6.5 and 5.5.
TEST(ParallelValidateReplay, AllReduceWaitsForTheLastArrival) {
  std::vector<RankTimeline> ranks(2);
  ranks[0].calls = {collective(1, 0, {0, 1}, 3.0, 10.0, 11.0)};
  ranks[0].compute_after_s = 1.0;
  ranks[1].calls = {collective(1, 0, {0, 1}, 5.0, 10.5, 11.0)};
  const std::vector<ReplayedRank> got = replay_timeline(ranks);
  ASSERT_EQ(got.size(), 2U);
  expect_replayed(got[0], {.compute_s = 4.0, .transfer_s = 0.5, .wait_s = 2.0, .end_s = 6.5},
                  "rank 0");
  expect_replayed(got[1], {.compute_s = 5.0, .wait_s = 0.0, .end_s = 5.5}, "rank 1");
}

// Two stages, two microbatches, both activations sent before any gradient
// is received (stage 0: send0, send1, recv g0, recv g1) while stage 1 runs
// recv0, send g0, recv1, send g1: stage 0's send1 pairs with stage 1's recv1,
// which comes after send g0, which pairs with stage 0's recv g0, which comes
// after send1.  With blocking (synchronous) sends that is a deadlock, and the
// replay reports it instead of inventing an order.
TEST(ParallelValidateReplay, ACycleOfBlockingCallsIsReported) {
  std::vector<RankTimeline> ranks(2);
  ranks[0].calls = {p2p(1, -1, 1.0, 1.0, 1.25), p2p(1, -1, 1.0, 2.25, 2.5, 1),
                    p2p(-1, 1, 0.0, 2.5, 3.0), p2p(-1, 1, 0.0, 3.0, 3.5, 1)};
  ranks[1].calls = {p2p(-1, 0, 0.0, 0.0, 1.25), p2p(0, -1, 2.0, 3.25, 3.5),
                    p2p(-1, 0, 0.0, 3.5, 3.75, 1), p2p(0, -1, 2.0, 5.75, 6.0, 1)};
  EXPECT_THROW(replay_timeline(ranks), std::runtime_error);
}

// Two stages, two microbatches, 1F1B: stage 0 = F (1 s), send a0, recv g0,
// F (1 s), send a1, recv g1; stage 1 = recv a0, F+B (2 s), send g0, recv a1,
// F+B (2 s), send g1.  Every transfer 0.25 s (both sides at the same wall
// times).  By hand:
//   send a0: stage 0 arrives 1, stage 1 at 0 -> 1..1.25 (stage 1 waits 1);
//   g0: stage 0 arrives 1.25, stage 1 at 3.25 -> 3.25..3.5 (stage 0 waits 2);
//   a1: stage 0 arrives 4.5, stage 1 at 3.5 -> 4.5..4.75 (stage 1 waits 1);
//   g1: stage 0 arrives 4.75, stage 1 at 6.75 -> 6.75..7 (stage 0 waits 2).
// Stage 0: compute 2, transfer 1, wait 4, end 7; stage 1: 4, 1, 2, end 7.
TEST(ParallelValidateReplay, PipelineIdleIsReplayedOnDedicatedCores) {
  std::vector<RankTimeline> ranks(2);
  ranks[0].calls = {p2p(1, -1, 1.0, 100.0, 100.25), p2p(-1, 1, 0.0, 100.0, 100.25),
                    p2p(1, -1, 1.0, 100.0, 100.25, 1), p2p(-1, 1, 0.0, 100.0, 100.25, 1)};
  ranks[1].calls = {p2p(-1, 0, 0.0, 100.0, 100.25), p2p(0, -1, 2.0, 100.0, 100.25),
                    p2p(-1, 0, 0.0, 100.0, 100.25, 1), p2p(0, -1, 2.0, 100.0, 100.25, 1)};
  const std::vector<ReplayedRank> got = replay_timeline(ranks);
  expect_replayed(got[0], {.compute_s = 2.0, .transfer_s = 1.0, .wait_s = 4.0, .end_s = 7.0},
                  "stage 0");
  expect_replayed(got[1], {.compute_s = 4.0, .transfer_s = 1.0, .wait_s = 2.0, .end_s = 7.0},
                  "stage 1");
}

// A send_recv exchange completes when both of its halves have: rank 0
// arrives at 1, rank 1 at 4, transfers 0.5 -> both end at 4.5.
TEST(ParallelValidateReplay, SendRecvWaitsForBothPeers) {
  std::vector<RankTimeline> ranks(2);
  ranks[0].calls = {p2p(1, 1, 1.0, 50.0, 50.5)};
  ranks[1].calls = {p2p(0, 0, 4.0, 50.0, 50.5)};
  const std::vector<ReplayedRank> got = replay_timeline(ranks);
  expect_replayed(got[0], {.wait_s = 3.0, .end_s = 4.5}, "rank 0");
  expect_replayed(got[1], {.end_s = 4.5}, "rank 1");
}

TEST(ParallelValidateReplay, AnUnmatchedCallIsReported) {
  std::vector<RankTimeline> ranks(2);
  ranks[0].calls = {collective(1, 0, {0, 1}, 1.0, 0.0, 1.0)};
  EXPECT_THROW(replay_timeline(ranks), std::runtime_error);
  std::vector<RankTimeline> lonely(2);
  lonely[0].calls = {p2p(1, -1, 1.0, 0.0, 1.0)};
  EXPECT_THROW(replay_timeline(lonely), std::runtime_error);
}

TEST(ParallelValidateCases, RankCountsOtherThanTwoOrFourAreRefusedByName) {
  try {
    parallel_validation_cases(3, false);
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("3 ranks"), std::string::npos) << e.what();
  }
  // Every case is a layout the planner accepts (validate() ran) and names its layout.
  for (const int world : {2, 4}) {
    for (const ParallelValidationCase& c : parallel_validation_cases(world, false)) {
      const ParallelConfig& p = c.config.parallel;
      EXPECT_EQ(c.config.device.count, world) << c.name;
      EXPECT_EQ(world % (p.tensor * p.pipeline), 0) << c.name;
      const int64_t dp = world / (p.tensor * p.pipeline);
      EXPECT_EQ(c.config.train.micro_batch * dp * c.microbatches, c.config.train.global_batch)
          << c.name;
      EXPECT_FALSE(p.overlap_grad_reduce) << c.name;
    }
  }
}

// The clock check lives in the library: a wall-clock profile is refused on
// every rank, before any case or communication, naming the field.
TEST(ParallelValidateRun, AWallClockProfileIsRefusedByItsField) {
  DeviceProfile profile =
      load_measured_profile(std::string(MODAR_SOURCE_DIR) + "/profiles/cpu-comm.toml", "cpu");
  profile.provenance["clock"] = "wall";
  try {
    run_parallel_validation(*g_backend, *g_world, profile, ParallelValidationOptions{});
    ADD_FAILURE() << "a wall-clock profile was accepted";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("provenance.clock = \"wall\""), std::string::npos) << what;
    EXPECT_NE(what.find("allowed: a profile measured with the cpu clock"), std::string::npos)
        << what;
  }
}

// ---- under mpirun -------------------------------------------------------------

TEST(ParallelValidateRun, PartsAddUpToTheStep) {
  if (g_world->size() != 2) {
    GTEST_SKIP() << "needs mpirun -np 2 (this run has " << g_world->size() << " ranks)";
  }
  const DeviceProfile profile =
      load_measured_profile(std::string(MODAR_SOURCE_DIR) + "/profiles/cpu-comm.toml", "cpu");
  ParallelValidationOptions options;
  options.only = {"dp2-zero9-dense"};
  try {
    run_parallel_validation(*g_backend, *g_world, profile, options);
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {  // on every rank, before any communication
    EXPECT_NE(std::string(e.what()).find("'dp2-zero9-dense' is not a case on 2 ranks"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("allowed: dp2-zero0-dense"), std::string::npos)
        << e.what();
  }
  options.warmup_steps = 1;
  options.rounds = 1;
  options.quick = true;
  options.only = {"dp2-zero1-dense", "pp2-1f1b-m4-dense"};
  const ParallelValidationReport report =
      run_parallel_validation(*g_backend, *g_world, profile, options);
  ASSERT_EQ(report.cases.size(), 2U);
  EXPECT_EQ(report.world, 2);
  for (const ParallelCaseResult& r : report.cases) {
    const std::string& name = r.validation_case.name;
    ASSERT_EQ(r.rank_end_s.size(), 2U) << name;
    ASSERT_EQ(r.rank_peak_bytes.size(), 2U) << name;
    double slowest = 0.0;
    for (size_t k = 0; k < 2; ++k) {
      EXPECT_NEAR(r.rank_compute_s[k] + r.rank_comm_s[k], r.rank_end_s[k], 1e-9 * r.rank_end_s[k])
          << name << " rank " << k;
      EXPECT_GT(r.rank_compute_s[k], 0.0) << name;
      EXPECT_GT(r.rank_peak_bytes[k], 0.0) << name;
      slowest = std::max(slowest, r.rank_end_s[k]);
    }
    EXPECT_DOUBLE_EQ(r.step_s, slowest) << name;
    EXPECT_NEAR(r.compute_s + r.comm_s, r.step_s, 1e-9 * r.step_s) << name;
    EXPECT_NEAR(r.transfer_s + r.wait_s, r.comm_s, 1e-12 + 1e-9 * r.comm_s) << name;
    EXPECT_GE(r.transfer_s, 0.0) << name;
    EXPECT_GE(r.wait_s, 0.0) << name;
    EXPECT_GT(r.wall_step_s, 0.0) << name;
    // The predicted parts are the planner's whole step.
    EXPECT_NEAR(r.predicted_compute_s + r.predicted_comm_s, r.predicted_step_s,
                1e-9 * r.predicted_step_s)
        << name;
    EXPECT_GT(r.predicted_comm_s, 0.0) << name;
    double by_group = 0.0;
    for (const auto& [group, seconds] : r.comm_by_group_s) {
      by_group += seconds;
    }
    EXPECT_NEAR(by_group, r.comm_s, 1e-12 + 1e-9 * r.comm_s) << name;
  }
  // dp 2: every call is on the data group (the busiest rank may also idle
  // until the slowest one ends); pp 2: the activations and gradients travel
  // on the pipeline group.
  ASSERT_FALSE(report.cases[0].comm_by_group_s.empty());
  EXPECT_EQ(report.cases[0].comm_by_group_s[0].first, "data");
  for (const auto& [group, seconds] : report.cases[0].comm_by_group_s) {
    EXPECT_TRUE(group == "data" || group == "idle at the end") << group;
  }
  bool pipeline = false;
  for (const auto& [group, seconds] : report.cases[1].comm_by_group_s) {
    pipeline = pipeline || group == "pipeline";
  }
  EXPECT_TRUE(pipeline);
  // Communicator calls per step, counted from docs/runtime_parallel.md:
  // the all-reduce of the batch's counted targets (before the backward: the
  // objective's weights), then ZeRO-1 = one all-reduce of the flat gradient,
  // one all-gather of the updated shards, and the loss all-reduce of
  // DataParallelTrainer.
  EXPECT_EQ(report.cases[0].calls_per_step, 4);
  // 1F1B on 2 stages, 4 microbatches: every stage sends or receives one
  // activation and one gradient per microbatch (8), and more (loss, tied
  // or replicated parts) on top.
  EXPECT_GE(report.cases[1].calls_per_step, 8);
  // The bubble is predicted for the pipeline only.
  EXPECT_EQ(report.cases[0].predicted_bubble_s, 0.0);
  EXPECT_GT(report.cases[1].predicted_bubble_s, 0.0);
  const std::string text = parallel_validation_text(report);
  EXPECT_NE(text.find("pp2-1f1b-m4-dense"), std::string::npos);
  EXPECT_NE(text.find("load average before / after"), std::string::npos);
  const std::string json = parallel_validation_json(report);
  EXPECT_NE(json.find("\"transfer_s\""), std::string::npos);
}

}  // namespace
}  // namespace modar::runtime

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::unique_ptr<modar::runtime::Backend> backend = modar::runtime::make_cpu_backend();
  std::unique_ptr<modar::runtime::Communicator> world =
      modar::runtime::launched_by_mpirun() ? modar::runtime::make_world_communicator(*backend)
                                           : modar::runtime::make_self_communicator(*backend);
  modar::runtime::g_backend = backend.get();
  modar::runtime::g_world = world.get();
  int failed = RUN_ALL_TESTS();
  failed = static_cast<int>(
      modar::runtime::all_reduce_sum(*backend, *world, {static_cast<double>(failed != 0)})[0]);
  world.reset();
  return failed != 0 ? 1 : 0;
}
