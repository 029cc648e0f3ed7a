// The planner's experts as a knob (docs/moe.md, docs/planner.md): moe.* set
// by the user reach `optimal` and `sweep`, change the recommendation, are
// printed, and are refused when no planned architecture has experts.
#include <gtest/gtest.h>

#include <string>

#include "modar/base/errors.hpp"
#include "modar/planner.hpp"
#include "optimal_test_util.hpp"

namespace {

modar::MoeConfig experts(int64_t e, int64_t k) {
  modar::MoeConfig moe;
  moe.experts = e;
  moe.top_k = k;
  return moe;
}

TEST(PlannerExperts, TheUsersExpertsReplaceTheDefaultSetting) {
  const modar::ArchSpec moe = modar::make_arch("moe");
  // No moe.* settings: the figure-7 setting (8 experts, top-1).
  EXPECT_EQ(modar::planned_experts(moe, modar::MoeConfig{}).experts, 8);
  modar::MoeConfig user = experts(64, 8);
  user.shared_experts = 2;
  user.first_dense = 1;
  const modar::MoeConfig planned = modar::planned_experts(moe, user);
  EXPECT_EQ(planned.experts, 64);
  EXPECT_EQ(planned.top_k, 8);
  EXPECT_EQ(planned.shared_experts, 2);
  EXPECT_EQ(planned.first_dense, 1);
  EXPECT_EQ(planned.mode, modar::MoeMode::none);
  // Integrated MoDE keeps its null experts and capacity factor 1.
  const modar::MoeConfig integrated =
      modar::planned_experts(modar::make_arch("mode-integrated"), user);
  EXPECT_EQ(integrated.mode, modar::MoeMode::integrated);
  EXPECT_EQ(integrated.null_experts, 8);
  EXPECT_EQ(integrated.capacity_factor, 1.0);
  // An architecture without experts keeps none.
  EXPECT_FALSE(modar::planned_experts(modar::make_arch("mod"), user).enabled());
}

TEST(PlannerExperts, OptimalChangesItsRecommendationAndSaysSo) {
  modar::OptimalRequest request;
  request.flops = 1e20;
  request.arch = {"moe"};
  const modar::OptimalResult plain = modar::optimal(request);
  request.base.moe = experts(64, 8);
  const modar::OptimalResult set = modar::optimal(request);
  const modar::Recommendation& a = find(plain, "moe", "isoflop_optimal");
  const modar::Recommendation& b = find(set, "moe", "isoflop_optimal");
  EXPECT_EQ(a.config.moe.experts, 8);
  EXPECT_EQ(b.config.moe.experts, 64);
  EXPECT_EQ(b.config.moe.top_k, 8);
  // Top-8 of 64 experts of the dense width: 8 x the FFN FLOPs per token, so
  // at the same N_f (active forward FLOPs) the model is narrower or shallower.
  EXPECT_LT(b.shape.n_layers * b.shape.d_model, a.shape.n_layers * a.shape.d_model);
  // 64 experts held: more parameters per active one (the two optima need
  // not have the same N_f, so their totals are not compared).
  EXPECT_GT(b.params.total / b.params.flop_active, a.params.total / a.params.flop_active);
  bool said = false;
  for (const std::string& note : set.notes) {
    said = said || note.find("moe: experts as set (moe.*): 64 x") != std::string::npos;
  }
  EXPECT_TRUE(said);
  const std::string table = modar::to_table(set);
  EXPECT_NE(table.find("experts E x width, top-k"), std::string::npos) << table;
  EXPECT_NE(table.find(", top-8"), std::string::npos) << table;
  EXPECT_NE(modar::to_json(set).find("\"experts\": 64"), std::string::npos);
}

TEST(PlannerExperts, SweepRowsCarryTheExperts) {
  modar::SweepRequest request;
  request.flops = {1e20};
  request.arch = {"moe"};
  request.with_time = false;
  request.base.moe = experts(16, 2);
  const std::vector<modar::SweepRow> rows = modar::sweep(request);
  ASSERT_FALSE(rows.empty());
  for (const modar::SweepRow& row : rows) {
    EXPECT_EQ(row.experts, 16);
    EXPECT_EQ(row.top_k, 2);
    EXPECT_EQ(row.expert_ffn, row.shape.d_ff);  // moe.expert_ffn 0: each shape's d_ff
  }
  EXPECT_NE(modar::to_csv_line(rows.front())
                .find(",16,2," + std::to_string(rows.front().expert_ffn) + ","),
            std::string::npos);
}

TEST(PlannerExperts, SettingsNoArchitectureUsesAreRefused) {
  modar::OptimalRequest request;
  request.flops = 1e20;
  request.arch = {"baseline", "mod"};
  request.base.moe = experts(64, 8);
  try {
    modar::optimal(request);
    FAIL() << "expected ConfigError";
  } catch (const modar::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("moe.experts = 64: set, but no planned architecture"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
