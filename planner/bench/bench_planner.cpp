// Planner speed: process CPU time of optimal() (four architectures, full shape
// search, one budget) at several budgets, the sweep rate in candidates per
// second with and without per-candidate memory / step-time estimates, and the
// wall-clock budgets the docs run on clusters.
// The wall-clock rows also time the `modar` CLI beside this program as one
// process per call (what a user timing the command sees: start-up, loading,
// the search, the output), user + system CPU seconds from wait4.
// Prints a table; no assertions (speed is shown by programs, not tests).
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <utility>
#include <vector>

#include "bench_clock.hpp"
#include "modar/planner.hpp"

namespace {

// The `modar` CLI built beside this program ("" when there is none).
std::string cli_beside_this_program() {
  char buffer[4096];
  const ssize_t n = readlink("/proc/self/exe", buffer, sizeof buffer - 1);
  if (n <= 0) {
    return {};
  }
  std::string path(buffer, static_cast<size_t>(n));
  path = path.substr(0, path.rfind('/') + 1) + "modar";
  return access(path.c_str(), X_OK) == 0 ? path : std::string();
}

struct ProcessCost {
  double cpu_s = NAN;  // user + system
  double system_s = NAN;
  long max_rss_kib = 0;
};

// One run of `cli arguments...` (output discarded): its own CPU time.
ProcessCost run_process(const std::string& cli, const std::vector<std::string>& arguments) {
  std::vector<char*> argv{const_cast<char*>(cli.c_str())};
  for (const std::string& argument : arguments) {
    argv.push_back(const_cast<char*>(argument.c_str()));
  }
  argv.push_back(nullptr);
  std::fflush(nullptr);  // else the child would write this program's buffered tables again
  const pid_t child = fork();
  if (child == 0) {
    const int null = open("/dev/null", O_WRONLY);
    if (null < 0 || dup2(null, STDOUT_FILENO) < 0 || dup2(null, STDERR_FILENO) < 0) {
      _exit(127);
    }
    execv(cli.c_str(), argv.data());
    _exit(127);
  }
  ProcessCost cost;
  int status = 0;
  rusage usage{};
  if (child > 0 && wait4(child, &status, 0, &usage) == child && WIFEXITED(status) &&
      WEXITSTATUS(status) == 0) {
    const auto seconds = [](const timeval& t) {
      return double(t.tv_sec) + 1e-6 * double(t.tv_usec);
    };
    cost.system_s = seconds(usage.ru_stime);
    cost.cpu_s = seconds(usage.ru_utime) + cost.system_s;
    cost.max_rss_kib = usage.ru_maxrss;
  }
  return cost;
}

// The host's 1-minute load average (NaN where unknown): beside every CPU
// figure of a shared host.
double load_average() {
  double load[1] = {NAN};
  return getloadavg(load, 1) == 1 ? load[0] : NAN;
}

}  // namespace

int main() {
  // candidates = shapes whose predicted loss was computed; timed = shapes
  // whose memory and step time were estimated (parity search, ranges).
  std::printf("modar optimal: 4 architectures (baseline, mod, dar, mod+dar), profile h200\n");
  std::printf("%-10s %10s %12s %8s %14s\n", "budget", "CPU s", "candidates", "timed",
              "candidates/s");
  for (const double budget : {6e18, 1e20, 1e22, 1e24}) {
    modar::OptimalRequest request;
    request.flops = budget;
    const int repeats = 3;
    int64_t candidates = 0;
    int64_t timed = 0;
    const double start = cpu_seconds();
    for (int r = 0; r < repeats; ++r) {
      const modar::OptimalResult result = modar::optimal(request);
      candidates = result.candidates_evaluated;
      timed = result.cost_evaluations;
    }
    const double per_call = (cpu_seconds() - start) / repeats;
    std::printf("%-10.0e %10.4f %12lld %8lld %14.0f\n", budget, per_call,
                static_cast<long long>(candidates), static_cast<long long>(timed),
                double(candidates) / per_call);
  }

  std::printf(
      "\nmodar sweep: budgets 6e18,2e19,1e20; arch baseline, mod (c 0.125,0.25,0.5 x "
      "every 1,2), dar (K 1,2,4 x n 2,3), mod+dar\n");
  std::printf("%-26s %10s %10s %14s\n", "mode", "CPU s", "rows", "candidates/s");
  for (const bool with_time : {false, true}) {
    modar::SweepRequest request;
    request.flops = {6e18, 2e19, 1e20};
    request.arch = {"baseline", "mod", "dar", "mod+dar"};
    request.capacity = {0.125, 0.25, 0.5};
    request.every = {1, 2};
    request.block_layers = {1, 2, 4};
    request.streams = {2, 3};
    request.with_time = with_time;
    int64_t rows = 0;
    const double start = cpu_seconds();
    modar::sweep(request, [&](const modar::SweepRow&) { ++rows; });
    const double elapsed = cpu_seconds() - start;
    std::printf("%-26s %10.3f %10lld %14.0f\n",
                with_time ? "counts + memory + time" : "counts + loss only", elapsed,
                static_cast<long long>(rows), double(rows) / elapsed);
  }

  // Cluster planning (docs/cluster.md): every candidate shape gets a memory
  // screen of its layouts; shapes whose step time is needed get a layout
  // search (TP/SP, PP, interleaving, ZeRO, micro-batch, recompute).
  std::printf("\nmodar optimal --gpus N: 4 architectures, profile a100-80gb-dgx\n");
  std::printf("%-10s %6s %10s %12s %8s %10s %10s %12s\n", "budget", "GPUs", "CPU s",
              "candidates", "timed", "layouts", "l. timed", "layouts/s");
  for (const auto& [budget, gpus] : {std::pair<double, int64_t>{1e23, 1024},
                                     std::pair<double, int64_t>{5.76e23, 1024},
                                     std::pair<double, int64_t>{1e21, 64},
                                     std::pair<double, int64_t>{1e22, 8}}) {
    modar::OptimalRequest request;
    request.flops = budget;
    request.gpus = gpus;
    request.profile = "a100-80gb-dgx";
    const double start = cpu_seconds();
    const modar::OptimalResult result = modar::optimal(request);
    const double elapsed = cpu_seconds() - start;
    std::printf("%-10.3g %6lld %10.3f %12lld %8lld %10lld %10lld %12.0f\n", budget,
                static_cast<long long>(gpus), elapsed,
                static_cast<long long>(result.candidates_evaluated),
                static_cast<long long>(result.cost_evaluations),
                static_cast<long long>(result.layouts_evaluated),
                static_cast<long long>(result.layouts_timed),
                double(result.layouts_evaluated) / elapsed);
  }

  // The wall-clock budgets the docs run (docs/cluster.md, docs/planner.md):
  // `modar optimal --gpu-hours H --gpus N --profile P`, default architectures.
  // CPU seconds: the least of three calls (a shared host's load only adds).
  // CLI: one `modar optimal ... --quiet` process per run, 5 runs: the least
  // and the median of user + system CPU s, and the system part of the least.
  const std::string cli = cli_beside_this_program();
  std::printf(
      "\nmodar optimal --gpu-hours H --gpus N --profile P (default architectures), "
      "CPU s: in this process, min of 3 calls; CLI: one `modar` process per run, user + "
      "system, min / median of 5 runs (sys of the min run, max RSS; the host's 1-minute load "
      "average before / after the 5 runs)\n");
  std::printf("%-10s %6s %-16s %10s %12s %8s %10s %10s   %s\n", "GPU-hours", "GPUs", "profile",
              "CPU s", "candidates", "timed", "layouts", "l. timed", "CLI CPU s min / median");
  struct WallClock {
    double gpu_hours;
    int64_t gpus;
    const char* profile;
  };
  for (const WallClock& run : {WallClock{2e5, 512, "h100-80gb-dgx"},
                               WallClock{86016, 256, "a100-80gb-dgx"}}) {
    modar::OptimalRequest request;
    request.gpu_hours = run.gpu_hours;
    request.gpus = run.gpus;
    request.profile = run.profile;
    modar::OptimalResult result;
    double elapsed = INFINITY;
    for (int repeat = 0; repeat < 3; ++repeat) {
      const double start = cpu_seconds();
      result = modar::optimal(request);
      elapsed = std::min(elapsed, cpu_seconds() - start);
    }
    std::string cli_text = "(no modar beside this program)";
    if (!cli.empty()) {
      char gpu_hours[32], gpus[32];
      std::snprintf(gpu_hours, sizeof gpu_hours, "%.17g", run.gpu_hours);
      std::snprintf(gpus, sizeof gpus, "%lld", static_cast<long long>(run.gpus));
      std::vector<ProcessCost> runs;
      const double load_before = load_average();
      for (int repeat = 0; repeat < 5; ++repeat) {
        runs.push_back(run_process(cli, {"optimal", "--gpu-hours", gpu_hours, "--gpus", gpus,
                                         "--profile", run.profile, "--quiet"}));
      }
      std::sort(runs.begin(), runs.end(),
                [](const ProcessCost& a, const ProcessCost& b) { return a.cpu_s < b.cpu_s; });
      char text[128];
      std::snprintf(text, sizeof text, "%.3f / %.3f (sys %.3f, %ld MiB; load %.1f / %.1f)",
                    runs.front().cpu_s, runs[runs.size() / 2].cpu_s, runs.front().system_s,
                    runs.front().max_rss_kib / 1024, load_before, load_average());
      cli_text = text;
    }
    std::printf("%-10.6g %6lld %-16s %10.3f %12lld %8lld %10lld %10lld   %s\n", run.gpu_hours,
                static_cast<long long>(run.gpus), run.profile, elapsed,
                static_cast<long long>(result.candidates_evaluated),
                static_cast<long long>(result.cost_evaluations),
                static_cast<long long>(result.layouts_evaluated),
                static_cast<long long>(result.layouts_timed), cli_text.c_str());
  }
  return 0;
}
