// One search behind `modar optimal`, `modar sweep` and the plot's star: for
// every architecture, the sweep's best row at a budget (the lowest predicted
// loss among the rows that fit, the deepest of ties: optimal's rule, applied
// here to the rows alone) is the row it marks `recommended`, and that row is
// exactly optimal's isoFLOP-optimal recommendation (shape and loss).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "modar/planner.hpp"
#include "optimal_test_util.hpp"

namespace {

// Optimal's selection rule written out over a set of rows.
const modar::SweepRow* best_row(const std::vector<modar::SweepRow>& rows) {
  double lowest = INFINITY;
  for (const modar::SweepRow& row : rows) {
    if (row.fits && row.loss) {
      lowest = std::min(lowest, *row.loss);
    }
  }
  const modar::SweepRow* best = nullptr;
  for (const modar::SweepRow& row : rows) {
    if (!row.fits || !row.loss || *row.loss > lowest * (1.0 + modar::kLossTieRelative)) {
      continue;
    }
    if (best == nullptr || row.shape.n_layers > best->shape.n_layers ||
        (row.shape.n_layers == best->shape.n_layers && *row.loss < *best->loss)) {
      best = &row;
    }
  }
  return best;
}

TEST(OneSearch, SweepBestRowIsOptimalsRecommendation) {
  for (const char* arch : {"baseline", "mod", "dar", "moe"}) {
    modar::SweepRequest sweep;
    sweep.flops = {1e20};
    sweep.arch = {arch};
    sweep.with_time = false;
    const std::vector<modar::SweepRow> rows = modar::sweep(sweep);
    ASSERT_GT(rows.size(), 10u) << arch;
    int recommended = 0;
    for (const modar::SweepRow& row : rows) {
      recommended += row.recommended ? 1 : 0;
    }
    EXPECT_EQ(recommended, 1) << arch;  // one star per curve

    const modar::OptimalResult result = optimal_at(1e20, {arch});
    const modar::Recommendation& rec = find(result, arch, "isoflop_optimal");

    const modar::SweepRow* best = best_row(rows);
    ASSERT_NE(best, nullptr) << arch;
    EXPECT_TRUE(best->recommended) << arch;
    EXPECT_EQ(best->shape.n_layers, rec.shape.n_layers) << arch;
    EXPECT_EQ(best->shape.d_model, rec.shape.d_model) << arch;
    ASSERT_TRUE(rec.loss.has_value()) << arch;
    EXPECT_DOUBLE_EQ(*best->loss, *rec.loss) << arch;
  }
}

TEST(OneSearch, EveryRowIsTheBestOfItsBinThatFits) {
  // The bins re-derived here (docs/planner.md "modar sweep"): ratio 1.05
  // around the closed form's N_f*, ceil(ln 6 / ln 1.05) = 37 bins either
  // side; every shape of the space scored by the loss law, memory checked by
  // the cost model.  Each row must lie in its own bin and be the bin's best
  // that fits (within the tie band).
  modar::SweepRequest sweep;
  sweep.flops = {6e18};
  sweep.arch = {"baseline"};
  sweep.with_time = false;
  const std::vector<modar::SweepRow> rows = modar::sweep(sweep);
  ASSERT_GT(rows.size(), 10u);
  const modar::LossFitParams law = modar::load_fit("epoch").params;
  const double step = 1.05;
  const int half = static_cast<int>(std::ceil(std::log(6.0) / std::log(step)));
  ASSERT_EQ(half, 37);
  const double centre = modar::closed_form_optimum(law, 6e18).n_opt;
  const double low = centre * std::pow(step, -half - 0.5);
  const auto bin_of = [&](double n_f) {
    return static_cast<int>(std::floor(std::log(n_f / low) / std::log(step)));
  };
  std::vector<double> best_fitting(static_cast<size_t>(2 * half + 1), INFINITY);
  const modar::DeviceProfile profile = modar::load_profile(modar::default_profile_name());
  for (const modar::ShapeCandidate& c : modar::enumerate_shapes(
           modar::Config{}, low, centre * std::pow(step, half + 0.5), modar::ShapeSearchOptions{})) {
    const int bin = bin_of(c.params.flop_active);
    if (bin < 0 || bin > 2 * half ||
        !modar::estimate_memory(modar::with_shape(modar::Config{}, c.shape), profile,
                                modar::StepKind::train)
             .fits) {
      continue;
    }
    const double loss =
        modar::predicted_loss(law, 1.0, c.params.flop_active, 6e18 / c.train_flops_per_token);
    best_fitting[static_cast<size_t>(bin)] = std::min(best_fitting[static_cast<size_t>(bin)], loss);
  }
  std::vector<int> seen;
  for (const modar::SweepRow& row : rows) {
    const int bin = bin_of(row.params.flop_active);
    ASSERT_GE(bin, 0);
    ASSERT_LE(bin, 2 * half);
    EXPECT_TRUE(std::find(seen.begin(), seen.end(), bin) == seen.end()) << "two rows in bin " << bin;
    seen.push_back(bin);
    EXPECT_TRUE(row.fits);
    EXPECT_LE(*row.loss, best_fitting[static_cast<size_t>(bin)] * (1.0 + modar::kLossTieRelative))
        << row.shape.n_layers << " x " << row.shape.d_model;
  }
}

}  // namespace
