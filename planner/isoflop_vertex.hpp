// The minimum of an isoFLOP curve as the MoD paper locates it (figure 4): a
// parabola in log forward FLOPs per token through the best shape of each depth
// near the discrete argmin, and its vertex.  Not a public header.
//
// Why: the loss model is flat near the optimum and the shape grid is coarse
// there (on the aspect edge d = aspect_max x L, a step of one layer moves N_f
// by about 3 / L, 20-25 % at 12-14 layers), so the discrete argmin can sit
// +-10 % from the curve's minimum.  The paper's "the optimal MoD uses as many
// FLOPs per forward pass as the isoFLOP-optimal baseline" compares the minima
// of fitted curves, not two grid points.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace modar::detail {

// One scored shape of an isoFLOP curve.
struct IsoflopPoint {
  int64_t n_layers = 0;
  double forward_flops_per_token = 0.0;
  double loss = 0.0;
};

struct IsoflopVertex {
  double forward_flops_per_token = 0.0;  // exp of the parabola's vertex
  double loss = 0.0;                     // the parabola at its vertex
  int64_t depth_low = 0;                 // the depths the parabola was fitted through
  int64_t depth_high = 0;
};

// Depths on either side of the argmin's depth whose best shapes the parabola
// is fitted through (7 points when the curve has them).
constexpr int kIsoflopVertexHalfWidth = 3;

// The vertex of the least-squares parabola loss = a x^2 + b x + c, x = ln(forward
// FLOPs per token), through the envelope (the lowest loss of each depth) at the
// kIsoflopVertexHalfWidth depths on either side of the envelope's minimum.
// nullopt when fewer than 3 depths were scored, the parabola is not convex, or
// its vertex lies outside the fitted points' range (the minimum is at an edge
// of the search space).  Non-finite losses (shapes not scored) are ignored.
std::optional<IsoflopVertex> isoflop_curve_vertex(const std::vector<IsoflopPoint>& points);

}  // namespace modar::detail
