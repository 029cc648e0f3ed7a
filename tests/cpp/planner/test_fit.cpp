// `modar fit`: recovers known parameters from synthetic runs drawn from a known
// law (with and without noise) and rejects malformed CSV with the line number.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "modar/base/errors.hpp"
#include "modar/planner.hpp"

namespace {

const modar::LossFitParams kTruth{1.9, 400.0, 1800.0, 0.33, 0.36};

// Deterministic standard normals (splitmix64 + Box-Muller), independent of the
// standard library's distribution implementation.
struct Normal {
  uint64_t state;
  double uniform() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double(z >> 11) + 0.5) / 9007199254740992.0;
  }
  double operator()() {
    return std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform());
  }
};

std::vector<modar::RunRecord> synthetic_runs(double noise_sigma, uint64_t seed) {
  Normal normal{seed};
  std::vector<modar::RunRecord> runs;
  int64_t line = 2;
  for (const double n : {2e7, 5e7, 1e8, 2e8, 5e8, 1e9}) {
    for (const double d : {2e9, 5e9, 1e10, 2e10, 5e10}) {
      const double loss =
          (kTruth.E + kTruth.A / std::pow(n, kTruth.alpha) + kTruth.B / std::pow(d, kTruth.beta)) *
          std::exp(noise_sigma * normal());
      runs.push_back({n, d, loss, line++});
    }
  }
  return runs;
}

TEST(Fit, RecoversExactParametersWithoutNoise) {
  modar::FitOptions options;
  options.bootstrap_samples = 0;
  const modar::FitResult result = modar::fit_runs(synthetic_runs(0.0, 1), options);
  EXPECT_NEAR(result.E.estimate / kTruth.E, 1.0, 1e-3);
  EXPECT_NEAR(result.A.estimate / kTruth.A, 1.0, 1e-2);
  EXPECT_NEAR(result.B.estimate / kTruth.B, 1.0, 1e-2);
  EXPECT_NEAR(result.alpha.estimate, kTruth.alpha, 1e-3);
  EXPECT_NEAR(result.beta.estimate, kTruth.beta, 1e-3);
  EXPECT_LT(result.rms_log_residual, 1e-5);
}

TEST(Fit, RecoversParametersFromNoisyRunsWithHonestUncertainty) {
  // 0.5 % multiplicative noise on 30 runs.
  modar::FitOptions options;
  options.bootstrap_samples = 60;
  const modar::FitResult result = modar::fit_runs(synthetic_runs(0.005, 7), options);
  EXPECT_NEAR(result.alpha.estimate, kTruth.alpha, 0.04);
  EXPECT_NEAR(result.beta.estimate, kTruth.beta, 0.04);
  EXPECT_NEAR(result.E.estimate, kTruth.E, 0.1);
  // The residual matches the injected noise level.
  EXPECT_GT(result.rms_log_residual, 0.002);
  EXPECT_LT(result.rms_log_residual, 0.008);
  // Bootstrap intervals are non-degenerate and cover the truth for the exponents.
  EXPECT_GT(result.alpha.standard_error, 0.0);
  EXPECT_LE(result.alpha.ci_low, kTruth.alpha + 0.01);
  EXPECT_GE(result.alpha.ci_high, kTruth.alpha - 0.01);
  EXPECT_LE(result.beta.ci_low, kTruth.beta + 0.01);
  EXPECT_GE(result.beta.ci_high, kTruth.beta - 0.01);
  // Predictions inside the sampled range stay within 1 % of the truth.
  for (const double n : {3e7, 3e8}) {
    for (const double d : {3e9, 3e10}) {
      const double truth = modar::predicted_loss(kTruth, 1.0, n, d);
      EXPECT_NEAR(modar::predicted_loss(result.fit.params, 1.0, n, d) / truth, 1.0, 0.01);
    }
  }
  ASSERT_TRUE(result.fit.standard_errors.has_value());
}

TEST(Fit, TooFewRunsIsAnError) {
  std::vector<modar::RunRecord> runs = synthetic_runs(0.0, 1);
  runs.resize(4);
  EXPECT_THROW(modar::fit_runs(runs), modar::ConfigError);
}

TEST(RunsCsv, ParsesColumnsInAnyOrderWithComments) {
  const std::string csv =
      "# my runs\n"
      "loss, D, arch, N\n"
      "3.1,2e9,x,1e8\n"
      "\n"
      "3.0,4e9,x,1e8\n"
      "2.9,4e9,y,2e8\n"
      "2.8,8e9,y,2e8\n"
      "2.7,8e9,y,4e8\n";
  const auto runs = modar::parse_runs_csv(csv, "runs.csv");
  ASSERT_EQ(runs.size(), 5u);
  EXPECT_EQ(runs[0].line, 3);
  EXPECT_EQ(runs[1].line, 5);
  EXPECT_DOUBLE_EQ(runs[4].n_flop_active, 4e8);
  EXPECT_DOUBLE_EQ(runs[4].tokens, 8e9);
  EXPECT_DOUBLE_EQ(runs[4].loss, 2.7);
}

void expect_csv_error(const std::string& csv, const std::string& needle) {
  try {
    modar::parse_runs_csv(csv, "runs.csv");
    ADD_FAILURE() << "accepted:\n" << csv;
  } catch (const modar::FileError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(RunsCsv, MalformedRowsNameTheLine) {
  const std::string good = "N,D,loss\n1e8,2e9,3.1\n1e8,4e9,3.0\n2e8,4e9,2.9\n2e8,8e9,2.8\n";
  expect_csv_error(good + "4e8,8e9,abc\n", "runs.csv:6: column 'loss' = 'abc'");
  expect_csv_error(good + "4e8,8e9\n", "runs.csv:6: 2 fields, but the header has 3");
  expect_csv_error("N,D,loss\n1e8,-2e9,3.1\n", "runs.csv:2: column 'D' = '-2e9'");
  expect_csv_error("N,D,loss\n1e8,nan,3.1\n", "runs.csv:2:");
  expect_csv_error("N,D,loss\n1e8,inf,3.1\n", "runs.csv:2:");
  expect_csv_error("params,tokens\n1e8,2e9\n", "runs.csv:1: header");
  expect_csv_error(good, "4 runs");
  expect_csv_error("", "empty");
  EXPECT_THROW(modar::load_runs_csv("/nonexistent/runs.csv"), modar::FileError);
}

}  // namespace

namespace {

TEST(RunsCsv, ConfigColumnIsCountedByTheCostModel) {
  // A run described by its configuration file: N_f is whatever the cost model
  // counts for that file (wiring test), and a broken file names the CSV line.
  const std::string dir = ::testing::TempDir();
  const std::string config_name = "modar_fit_run_" + std::to_string(::getpid()) + ".toml";
  std::ofstream(dir + "/" + config_name) << "[model]\nd_model = 512\nn_layers = 8\nn_heads = 8\n";
  std::string csv = "config,D,loss\n";
  for (int i = 0; i < 5; ++i) {
    csv += config_name + "," + std::to_string(1 + i) + "e9,3." + std::to_string(5 - i) + "\n";
  }
  const auto runs = modar::parse_runs_csv(csv, "runs.csv", dir);
  ASSERT_EQ(runs.size(), 5u);
  modar::Config expected;
  expected.model.d_model = 512;
  expected.model.n_layers = 8;
  expected.model.n_heads = 8;
  EXPECT_DOUBLE_EQ(runs[0].n_flop_active, modar::count_params(expected).flop_active);
  EXPECT_GT(runs[0].n_flop_active, 12.0 * 8 * 512 * 512);  // blocks alone, plus the head
  try {
    modar::parse_runs_csv("config,D,loss\nmissing.toml,1e9,3.0\n", "runs.csv", dir);
    ADD_FAILURE();
  } catch (const modar::FileError& e) {
    EXPECT_NE(std::string(e.what()).find("runs.csv:2: config 'missing.toml'"), std::string::npos)
        << e.what();
  }
}

}  // namespace
