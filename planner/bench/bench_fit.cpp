// `modar fit` scaling: wall time of fit_runs (default options: 675 BFGS starts,
// 200 bootstrap resamples) against the number of runs, on runs drawn from a
// known law with 0.5 % noise.  Prints a table and the recovered exponents; no
// assertions (speed is shown by programs, not tests).
//   modar_bench_fit [max_runs]      (default 1000000)
#include <chrono>
#include <cmath>
#include <ctime>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_clock.hpp"
#include "modar/planner.hpp"

int main(int argc, char** argv) {
  const int64_t max_runs = argc > 1 ? std::atoll(argv[1]) : 1000000;
  const modar::LossFitParams truth{1.9, 400.0, 1800.0, 0.33, 0.36};
  std::printf("modar fit: default options (675 BFGS starts, 200 bootstrap resamples), one thread,\n"
              "runs from E=1.9 A=400 B=1800 alpha=0.33 beta=0.36 with 0.5%% noise\n");
  std::printf("%10s %10s %10s %10s %10s %12s\n", "runs", "CPU s", "wall s", "alpha", "beta",
              "alpha SE");
  for (int64_t count = 1000; count <= max_runs; count *= 10) {
    const std::vector<modar::RunRecord> runs = modar::runs_from_law(truth, count, 0.005, 2024);
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = cpu_seconds();
    const modar::FitResult result = modar::fit_runs(runs);
    const double cpu = cpu_seconds() - cpu_start;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%10lld %10.2f %10.2f %10.4f %10.4f %12.2e\n", static_cast<long long>(count), cpu,
                seconds, result.alpha.estimate, result.beta.estimate,
                result.alpha.standard_error);
    std::fflush(stdout);
  }
  return 0;
}
