// The vertex of an isoFLOP curve's fitted parabola (planner/isoflop_vertex.hpp;
// docs/planner.md "The isoFLOP curve's minimum").
#include "isoflop_vertex.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>

namespace modar::detail {

std::optional<IsoflopVertex> isoflop_curve_vertex(const std::vector<IsoflopPoint>& points) {
  // The envelope: the lowest loss of each depth.
  std::map<int64_t, IsoflopPoint> envelope;
  for (const IsoflopPoint& point : points) {
    if (!std::isfinite(point.loss) || !(point.forward_flops_per_token > 0.0)) {
      continue;
    }
    auto [at, inserted] = envelope.emplace(point.n_layers, point);
    if (!inserted && point.loss < at->second.loss) {
      at->second = point;
    }
  }
  if (envelope.size() < 3) {
    return std::nullopt;
  }
  auto best = std::min_element(envelope.begin(), envelope.end(), [](const auto& l, const auto& r) {
    return l.second.loss < r.second.loss;
  });
  auto first = best;
  auto last = best;
  for (int i = 0; i < kIsoflopVertexHalfWidth && first != envelope.begin(); ++i) {
    --first;
  }
  for (int i = 0; i < kIsoflopVertexHalfWidth && std::next(last) != envelope.end(); ++i) {
    ++last;
  }
  ++last;
  if (std::distance(first, last) < 3) {
    return std::nullopt;
  }
  // Least squares in centred x (conditioning): normal equations of [x^2 x 1].
  double mean_x = 0.0;
  double count = 0.0;
  for (auto it = first; it != last; ++it) {
    mean_x += std::log(it->second.forward_flops_per_token);
    count += 1.0;
  }
  mean_x /= count;
  double s[5] = {0, 0, 0, 0, 0};  // sums of x^k, k = 0..4
  double t[3] = {0, 0, 0};        // sums of y x^k, k = 0..2
  double x_low = INFINITY;
  double x_high = -INFINITY;
  for (auto it = first; it != last; ++it) {
    const double x = std::log(it->second.forward_flops_per_token) - mean_x;
    const double y = it->second.loss;
    x_low = std::min(x_low, x);
    x_high = std::max(x_high, x);
    double power = 1.0;
    for (int k = 0; k < 5; ++k) {
      s[k] += power;
      if (k < 3) {
        t[k] += y * power;
      }
      power *= x;
    }
  }
  // | s4 s3 s2 | |a|   |t2|
  // | s3 s2 s1 | |b| = |t1|
  // | s2 s1 s0 | |c|   |t0|   (Cramer's rule)
  auto det3 = [](double a11, double a12, double a13, double a21, double a22, double a23, double a31,
                 double a32, double a33) {
    return a11 * (a22 * a33 - a23 * a32) - a12 * (a21 * a33 - a23 * a31) +
           a13 * (a21 * a32 - a22 * a31);
  };
  const double det = det3(s[4], s[3], s[2], s[3], s[2], s[1], s[2], s[1], s[0]);
  if (!(std::abs(det) > 0.0)) {
    return std::nullopt;
  }
  const double a = det3(t[2], s[3], s[2], t[1], s[2], s[1], t[0], s[1], s[0]) / det;
  const double b = det3(s[4], t[2], s[2], s[3], t[1], s[1], s[2], t[0], s[0]) / det;
  const double c = det3(s[4], s[3], t[2], s[3], s[2], t[1], s[2], s[1], t[0]) / det;
  if (!(a > 0.0)) {
    return std::nullopt;
  }
  const double vertex_x = -b / (2.0 * a);
  if (vertex_x < x_low || vertex_x > x_high) {
    return std::nullopt;
  }
  IsoflopVertex vertex;
  vertex.forward_flops_per_token = std::exp(vertex_x + mean_x);
  vertex.loss = c - b * b / (4.0 * a);
  vertex.depth_low = first->first;
  vertex.depth_high = std::prev(last)->first;
  return vertex;
}

}  // namespace modar::detail
