// Hand counts shared by the cost-model and planner tests: written from the
// design documents (docs/dar_math.md), never from modar's output.
#pragma once

#include <algorithm>
#include <cstdint>

namespace modar {

// docs/dar_math.md 4.3, written out term by term (n streams, m = 1 transport
// output for n = 2, m_i = 0 for the first branch of a block).
inline double dar_extra_flops_per_token(double d, int64_t L, int64_t K, double n, bool attnres) {
  const int64_t N = (L + K - 1) / K;
  double phase1 = 0.0;
  for (int64_t b = 1; b <= N; ++b) {
    const double S_b = 2.0 * static_cast<double>(std::min(K, L - (b - 1) * K));
    phase1 += 4.0 * n * d * S_b * static_cast<double>(b);
  }
  const double branches = 2.0 * static_cast<double>(L);
  const double later = branches - static_cast<double>(N);  // branches with i >= 2
  const double rstd = 2.0 * n * d * static_cast<double>(N + 1);
  const double phase2 = 7.0 * n * d * later;
  const double output = 4.0 * n * d * static_cast<double>(N + 1);
  if (attnres) {
    return rstd + phase1 + phase2 + output;
  }
  const double predictor = branches * 2.0 * n * d +                            // RMS over n d
                           static_cast<double>(N) * 2.0 * n * d * (2.0 * n) +  // i = 1: 2n outputs
                           later * 2.0 * n * d * (2.0 * n + 1.0);              // i >= 2: 2n + 1
  const double mix = branches * 2.0 * n * d;
  const double transport = later * 2.0 * n * n * d;
  const double write = branches * 2.0 * n * d;
  return rstd + phase1 + phase2 + predictor + mix + transport + write + output;
}

}  // namespace modar
