// Validation against published runs: Megatron-LM weak scaling (Narayanan et
// al. 2021, Table 1) predicted on the embedded A100 profile with the
// published layouts (examples/cluster/megatron_table1.csv, base config
// examples/cluster/megatron_base.toml; the same rows and settings as
// examples/cluster/megatron_table1.py).  Throughput per GPU is counted by the
// paper's equation 3, F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)).  The
// embedded a100-80gb-dgx is the datasheet profile calibrated on seven of the
// rows (docs/calibrate.md; 3.6B, 76.1B and 529.6B held out, chosen before the
// fit), with the base config's 2021 settings (unfused attention, unfused
// gradient accumulation, fp16 main gradients, gradient reduce after the
// backward, synchronous tensor-parallel all-reduces; docs/cluster.md): median
// |error| 3.2 %, max 7.9 % (the target: 4 % and 8 %); the test fails
// if either grows past it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "modar/cost_model.hpp"
#include "modar/parallel.hpp"

namespace modar {
namespace {

std::vector<std::vector<std::string>> table_rows() {
  std::ifstream in(std::string(MODAR_SOURCE_DIR) + "/examples/cluster/megatron_table1.csv");
  std::vector<std::vector<std::string>> rows;
  std::string line;
  bool header = true;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') {
      continue;
    }
    if (header) {
      header = false;
      continue;
    }
    std::vector<std::string> cells;
    std::stringstream stream(line);
    std::string cell;
    while (std::getline(stream, cell, ',')) {
      cells.push_back(cell);
    }
    rows.push_back(cells);
  }
  return rows;
}

TEST(MegatronTable1, PredictedThroughputWithinBounds) {
  const auto rows = table_rows();
  ASSERT_EQ(rows.size(), 10u);
  const std::string base = std::string(MODAR_SOURCE_DIR) + "/examples/cluster/megatron_base.toml";
  const DeviceProfile profile = load_profile("a100-80gb-dgx");
  std::vector<double> errors;
  for (const auto& r : rows) {
    const int64_t heads = std::stoll(r[1]), hidden = std::stoll(r[2]), layers = std::stoll(r[3]),
                  tp = std::stoll(r[4]), pp = std::stoll(r[5]), gpus = std::stoll(r[6]),
                  batch = std::stoll(r[7]);
    const double published = std::stod(r[8]);
    std::vector<std::string> sets = {
        "model.d_model=" + std::to_string(hidden), "model.n_layers=" + std::to_string(layers),
        "model.n_heads=" + std::to_string(heads),  "parallel.tensor=" + std::to_string(tp),
        "parallel.pipeline=" + std::to_string(pp), "device.count=" + std::to_string(gpus),
        "train.global_batch=" + std::to_string(batch)};
    if (pp > 1 && layers % (2 * pp) == 0) {
      sets.push_back("parallel.schedule=interleaved");
      sets.push_back("parallel.virtual_stages=2");
    }
    const Config config = load_config_file(base, sets);
    const Estimate e = estimate(config, profile);
    ASSERT_NE(e.cluster, nullptr);
    EXPECT_TRUE(e.memory.fits) << r[0] << "B";
    const double s = 2048.0, V = 51200.0, h = static_cast<double>(hidden),
                 l = static_cast<double>(layers);
    const double flops = 96.0 * static_cast<double>(batch) * s * l * h * h *
                         (1.0 + s / (6.0 * h) + V / (16.0 * l * h));
    const double predicted = flops / e.time.step_s / static_cast<double>(gpus) / 1e12;
    errors.push_back(std::fabs(predicted / published - 1.0));
  }
  std::vector<double> sorted = errors;
  std::sort(sorted.begin(), sorted.end());
  const double median = 0.5 * (sorted[4] + sorted[5]);
  const double worst = sorted.back();
  EXPECT_LE(median, 0.04);
  EXPECT_LE(worst, 0.08) << "median " << median;
}

}  // namespace
}  // namespace modar
