// How many configurations per second one core evaluates: lowering + FLOPs +
// parameters + memory + time (the planner's inner loop).  Target >= 1e6/s.
//
//   modar_bench_cost_model [seconds_per_row]
//
// Rows: the hot path estimate_into() (reused buffers, pre-indexed profile)
// on the datasheet H200 profile (roofline) and on a synthetic measured
// profile (grid interpolation for GEMMs and attention), per model family;
// then the convenience API estimate() (allocates) and count_flops() alone.
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "modar/cost_model.hpp"

namespace {

using Clock = std::chrono::steady_clock;

std::vector<modar::Config> sweep(bool mod, bool dar) {
  std::vector<modar::Config> configs;
  for (int64_t d_model : {512, 1024, 2048, 4096}) {
    for (int64_t layers : {8, 16, 24, 32, 48}) {
      for (double capacity : {0.125, 0.25, 0.5}) {
        for (int64_t block_layers : {1, 2, 4}) {
          modar::Config c;
          c.model.d_model = d_model;
          c.model.n_layers = layers;
          c.model.n_heads = d_model / 128;
          c.model.seq_len = 2048;
          c.train.micro_batch = 8;
          c.train.global_batch = 256;
          c.device.count = 8;
          if (mod) {
            c.mod.every = 2;
            c.mod.capacity = capacity;
          }
          if (dar) {
            c.dar.variant = modar::DarVariant::dar;
            c.dar.block_layers = block_layers;
          }
          modar::validate(c);
          configs.push_back(c);
        }
      }
    }
  }
  return configs;
}

modar::DeviceProfile measured_profile() {
  modar::DeviceProfile p = modar::load_profile("h200");
  p.name = "synthetic-measured";
  p.measured = true;
  for (int64_t m : {1024, 4096, 16384, 65536}) {
    for (int64_t n : {256, 1024, 4096, 16384, 65536}) {
      for (int64_t k : {256, 1024, 4096, 16384}) {
        modar::OpMeasurement meas;
        meas.shape =
            modar::OpShape::of(modar::GemmDims{.m = m, .n = n, .k = k}, modar::DType::bf16);
        meas.median_s = 2.0 * static_cast<double>(m) * n * k / 700e12 + 4e-6;
        p.measurements.push_back(meas);
      }
    }
  }
  for (int64_t s : {256, 512, 1024, 2048}) {
    for (int64_t heads : {4, 8, 16, 32}) {
      for (modar::Pass pass : {modar::Pass::forward, modar::Pass::backward}) {
        modar::OpMeasurement meas;
        meas.shape = modar::OpShape::of(modar::AttentionDims{.sequences = 8,
                                                             .heads = heads,
                                                             .kv_heads = heads,
                                                             .query_len = s,
                                                             .key_len = s,
                                                             .head_dim = 128,
                                                             .causal = 1},
                                        modar::DType::bf16);
        meas.pass = pass;
        meas.median_s = 4.0 * 8 * heads * 128.0 * s * s / 2 / 400e12 *
                        (pass == modar::Pass::backward ? 2.5 : 1.0);
        p.measurements.push_back(meas);
      }
    }
  }
  return p;
}

struct Row {
  double per_cpu_s = 0;   // per second of this thread's CPU time (one core)
  double per_wall_s = 0;  // per wall-clock second (lower when the machine is shared)
  double checksum = 0;
};

double thread_cpu_s() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

template <typename Body>
Row time_loop(const std::vector<modar::Config>& configs, double seconds, Body body) {
  Row row;
  int64_t evaluated = 0;
  const auto wall_start = Clock::now();
  const double cpu_start = thread_cpu_s();
  double cpu = 0;
  while (cpu < seconds) {
    for (const modar::Config& c : configs) {
      row.checksum += body(c);
    }
    evaluated += static_cast<int64_t>(configs.size());
    cpu = thread_cpu_s() - cpu_start;
  }
  const double wall = std::chrono::duration<double>(Clock::now() - wall_start).count();
  row.per_cpu_s = static_cast<double>(evaluated) / cpu;
  row.per_wall_s = static_cast<double>(evaluated) / wall;
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 1.0;
  if (argc > 1) {
    char* end = nullptr;
    seconds = std::strtod(argv[1], &end);
    if (end == argv[1] || *end != '\0' || !(seconds > 0.0) || seconds > 600.0) {
      std::fprintf(stderr, "usage: modar_bench_cost_model [seconds_per_row in (0, 600]]\n");
      return 2;
    }
  }
  const modar::DeviceProfile h200 = modar::load_profile("h200");
  const modar::DeviceProfile measured = measured_profile();
  const modar::TimingModel roofline_timing(h200);
  const modar::TimingModel measured_timing(measured);

  struct Family {
    const char* name;
    std::vector<modar::Config> configs;
  } families[] = {{"dense", sweep(false, false)},
                  {"MoD (c, every 2)", sweep(true, false)},
                  {"DAR (n 2, K 1/2/4)", sweep(false, true)},
                  {"MoD + DAR", sweep(true, true)}};

  std::printf("modar cost model: configurations evaluated per second on one core\n");
  std::printf("(lowering + FLOPs + parameters + memory + time; %.1f s per row; target 1e6/s)\n\n",
              seconds);
  std::printf("%-20s %-30s %14s %14s %10s %9s\n", "family", "path", "configs/cpu-s",
              "configs/wall-s", "ops/config", "vs target");
  std::printf("%s\n", std::string(102, '-').c_str());
  modar::OpList scratch;
  modar::Estimate out;
  double checksum = 0;
  for (const Family& family : families) {
    double ops = 0;
    for (const modar::Config& c : family.configs) {
      modar::lower_into(c, modar::StepKind::train, scratch);
      ops += static_cast<double>(scratch.size());
    }
    ops /= static_cast<double>(family.configs.size());
    struct Path {
      const char* name;
      const modar::TimingModel* timing;
    } paths[] = {{"estimate_into, h200 roofline", &roofline_timing},
                 {"estimate_into, measured grid", &measured_timing}};
    for (const Path& path : paths) {
      const Row row = time_loop(family.configs, seconds, [&](const modar::Config& c) {
        modar::estimate_into(c, *path.timing, modar::StepKind::train, scratch, out);
        return out.time.step_s + out.memory.peak;
      });
      checksum += row.checksum;
      std::printf("%-20s %-30s %14.0f %14.0f %10.1f %8.2fx\n", family.name, path.name,
                  row.per_cpu_s, row.per_wall_s, ops, row.per_cpu_s / 1e6);
    }
  }
  std::printf("%s\n", std::string(102, '-').c_str());
  const std::vector<modar::Config>& mixed = families[3].configs;
  const Row convenience = time_loop(
      mixed, seconds, [&](const modar::Config& c) { return modar::estimate(c, h200).time.step_s; });
  std::printf("%-20s %-30s %14.0f %14.0f\n", "MoD + DAR", "estimate() (allocates)",
              convenience.per_cpu_s, convenience.per_wall_s);
  const Row flops_only = time_loop(mixed, seconds, [&](const modar::Config& c) {
    return modar::count_flops(c).train_per_token;
  });
  std::printf("%-20s %-30s %14.0f %14.0f\n", "MoD + DAR", "count_flops() only",
              flops_only.per_cpu_s, flops_only.per_wall_s);
  const Row decode = time_loop(mixed, seconds, [&](const modar::Config& c) {
    modar::estimate_into(c, roofline_timing, modar::StepKind::decode, scratch, out);
    return out.time.step_s;
  });
  std::printf("%-20s %-30s %14.0f %14.0f\n", "MoD + DAR", "estimate_into, decode step",
              decode.per_cpu_s, decode.per_wall_s);
  checksum += convenience.checksum + flops_only.checksum + decode.checksum;
  std::printf("\n(checksum %.6e)\n", checksum);
  return 0;
}
