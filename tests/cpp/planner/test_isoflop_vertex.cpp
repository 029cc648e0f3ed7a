// The isoFLOP curve's vertex (planner/isoflop_vertex.hpp): a parabola in log
// forward FLOPs through the best shape of each depth near the argmin.  The
// expected vertices are those of the parabolas the points were drawn from;
// in `modar optimal`, the MoD paper's bound on the optimum's FLOPs.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "../../../planner/isoflop_vertex.hpp"
#include "modar/planner.hpp"
#include "optimal_test_util.hpp"

namespace {

using modar::detail::isoflop_curve_vertex;
using modar::detail::IsoflopPoint;

// loss = 2 + 0.05 (ln f - ln 3e8)^2, forward FLOPs f of depth L spaced
// 10 % apart in log, so that the minimum 3e8 falls between two depths.
constexpr double kVertexFlops = 3e8;
double curve_flops(int layers) {
  return kVertexFlops * std::exp(0.1 * (layers - 13.4));
}
double curve_loss(double flops) {
  const double x = std::log(flops / kVertexFlops);
  return 2.0 + 0.05 * x * x;
}

std::vector<IsoflopPoint> curve(int first, int last) {
  std::vector<IsoflopPoint> points;
  for (int layers = first; layers <= last; ++layers) {
    const double flops = curve_flops(layers);
    points.push_back({layers, flops, curve_loss(flops)});
  }
  return points;
}

TEST(IsoflopVertex, RecoversTheParabolasMinimumBetweenGridPoints) {
  const auto vertex = isoflop_curve_vertex(curve(6, 24));
  ASSERT_TRUE(vertex.has_value());
  EXPECT_NEAR(vertex->forward_flops_per_token / kVertexFlops, 1.0, 1e-9);
  EXPECT_NEAR(vertex->loss, 2.0, 1e-12);
  // The argmin depth is 13 (x = -0.04); three depths on either side.
  EXPECT_EQ(vertex->depth_low, 10);
  EXPECT_EQ(vertex->depth_high, 16);
}

TEST(IsoflopVertex, UsesTheBestShapeOfEachDepthAndOnlyDepthsNearTheArgmin) {
  std::vector<IsoflopPoint> points = curve(6, 24);
  // Worse shapes of the same depths (narrower, more attention) and unscored ones.
  for (int layers = 6; layers <= 24; ++layers) {
    points.push_back({layers, 0.8 * curve_flops(layers), curve_loss(curve_flops(layers)) + 0.01});
    points.push_back({layers, 1.1 * curve_flops(layers), std::numeric_limits<double>::infinity()});
  }
  // Depths far from the argmin off the parabola: outside the 7 fitted depths.
  for (IsoflopPoint& point : points) {
    if (point.n_layers <= 8 || point.n_layers >= 19) {
      point.loss += 0.002 * static_cast<double>(point.n_layers % 3);
    }
  }
  const auto vertex = isoflop_curve_vertex(points);
  ASSERT_TRUE(vertex.has_value());
  EXPECT_NEAR(vertex->forward_flops_per_token / kVertexFlops, 1.0, 1e-9);
  EXPECT_NEAR(vertex->loss, 2.0, 1e-12);
}

TEST(IsoflopVertex, SkewedCurveIsFittedByLeastSquares) {
  // A cubic term: the least-squares parabola through the 7 depths around the
  // argmin, worked out by hand for symmetric points x = -3h..3h (h = 0.1):
  // loss = 2 + 0.05 x^2 + 0.01 x^3 -> b = 0.01 * sum(x^4) / sum(x^2) =
  // 0.01 * 196 h^4 / (28 h^2) = 0.07 h^2 = 0.0007, a = 0.05, vertex x = -b / (2a)
  // = -0.007.
  std::vector<IsoflopPoint> points;
  for (int layers = 7; layers <= 19; ++layers) {
    const double x = 0.1 * (layers - 13);
    points.push_back({layers, kVertexFlops * std::exp(x), 2.0 + 0.05 * x * x + 0.01 * x * x * x});
  }
  const auto vertex = isoflop_curve_vertex(points);
  ASSERT_TRUE(vertex.has_value());
  EXPECT_NEAR(std::log(vertex->forward_flops_per_token / kVertexFlops), -0.007, 1e-9);
}

TEST(IsoflopVertex, NoVertexAtAnEdgeOrWithTooFewDepths) {
  // Monotone: the minimum is at the search space's edge.
  std::vector<IsoflopPoint> falling;
  for (int layers = 2; layers <= 12; ++layers) {
    falling.push_back({layers, 1e8 * layers, 3.0 - 0.01 * layers});
  }
  EXPECT_FALSE(isoflop_curve_vertex(falling).has_value());
  EXPECT_FALSE(isoflop_curve_vertex(curve(13, 14)).has_value());
  EXPECT_FALSE(isoflop_curve_vertex({}).has_value());
}

}  // namespace

// ---- in `modar optimal` ------------------------------------------------------

namespace {

TEST(IsoflopVertex, OptimalReportsEachCurvesMinimumNearItsShape) {
  // The MoD paper (4.1): the optimal MoD uses as many forward FLOPs per token
  // as the isoFLOP-optimal baseline; modar's MoD prior puts the closed-form
  // optimum exactly there (docs/planner.md), so the curves' minima must be
  // within the paper's band (0.93-1.07x, the bound) at 2e19, where
  // the shape grid puts the recommended MoD at 1.07x.  Each minimum lies
  // within one depth step of its recommended shape's FLOPs (on the aspect
  // edge one layer moves the FLOPs by about 3 / L, under 30 % here).
  const modar::OptimalResult result = optimal_at(2e19, {"baseline", "mod"});
  const auto& baseline = find(result, "baseline", "isoflop_optimal");
  const auto& mod = find(result, "mod", "isoflop_optimal");
  ASSERT_TRUE(baseline.curve_forward_flops.has_value());
  ASSERT_TRUE(mod.curve_forward_flops.has_value());
  EXPECT_DOUBLE_EQ(mod.ratio_curve_forward_flops,
                   *mod.curve_forward_flops / *baseline.curve_forward_flops);
  EXPECT_GE(mod.ratio_curve_forward_flops, 0.93);
  EXPECT_LE(mod.ratio_curve_forward_flops, 1.07);
  for (const auto* rec : {&baseline, &mod}) {
    const double off = *rec->curve_forward_flops / rec->flops.forward_per_token;
    EXPECT_GT(off, 1.0 / 1.3) << rec->arch;
    EXPECT_LT(off, 1.3) << rec->arch;
  }
  // Not fitted for the parity model.
  EXPECT_FALSE(find(result, "mod", "parity_fastest").curve_forward_flops.has_value());
}

}  // namespace
