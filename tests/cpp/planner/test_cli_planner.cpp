// `modar optimal | sweep | fit` on bad input: exit code 2 and exactly one line
// on stderr saying what is wrong and what is allowed.  Runs the real binary.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../common/cli_run.hpp"

namespace {

using CliRun = modar_test::CliResult;

CliRun run_cli(const std::string& args) {
  return modar_test::run_cli_numbered("modar_planner_cli.", "", args);
}

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + std::to_string(::getpid()) + "_" + name;
  std::ofstream(path) << text;
  return path;
}

void expect_one_line_error(const std::string& args, const std::string& needle) {
  const CliRun run = run_cli(args);
  EXPECT_EQ(run.exit_code, 2) << args << "\n" << run.err;
  EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << args << "\n" << run.err;
  EXPECT_NE(run.err.find(needle), std::string::npos) << args << "\n" << run.err;
  EXPECT_TRUE(run.out.empty()) << args << "\n" << run.out;
}

TEST(PlannerCli, BadBudgets) {
  expect_one_line_error("optimal --flops 0", "positive finite");
  expect_one_line_error("optimal --flops -1e20", "positive finite");
  expect_one_line_error("optimal --flops nan", "--flops");
  expect_one_line_error("optimal --flops inf", "--flops");
  expect_one_line_error("optimal --flops 1e10", "too small for any shape");
  expect_one_line_error("optimal --gpu-hours 0", "positive finite");
  expect_one_line_error("optimal", "no budget");
  expect_one_line_error("sweep --flops 1e20,0", "positive finite");
}

TEST(PlannerCli, UnknownNames) {
  expect_one_line_error("optimal --flops 1e20 --arch baseline,mixtral",
                        "allowed: baseline, mod, dar, mod+dar");
  expect_one_line_error("optimal --flops 1e20 --fit chinchilla", "allowed: epoch, hoffmann");
  expect_one_line_error("optimal --flops 1e20 --eps mod=abc", "[0.25, 1.5]");
  expect_one_line_error("optimal --flops 1e20 --frobnicate", "unknown option");
}

TEST(PlannerCli, MissingOrMalformedFiles) {
  expect_one_line_error("optimal --flops 1e20 --fit /nonexistent/fit.toml", "cannot open");
  const std::string bad_fit = write_temp("modar_bad_fit.toml", "[fit]\nE = 1.0\nA = 3\n");
  expect_one_line_error("optimal --flops 1e20 --fit " + bad_fit, "fit.B");
  expect_one_line_error("optimal --flops 1e20 --profile /nonexistent/profile.toml", "profile");
  const std::string bad_profile = write_temp("modar_bad_profile.toml", "this is [not toml\n");
  expect_one_line_error("optimal --flops 1e20 --profile " + bad_profile, "modar_bad_profile.toml");
  expect_one_line_error("fit /nonexistent/runs.csv", "cannot open");
  const std::string bad_runs =
      write_temp("modar_bad_runs.csv", "N,D,loss\n1e8,2e9,3.1\n1e8,4e9,oops\n");
  expect_one_line_error("fit " + bad_runs, "modar_bad_runs.csv:3:");
}

// Cluster flags are honoured or refused with the reason, never replaced in
// silence: --micro-batch fixes the layout search's micro-batch (it used to
// run 4), a --global-batch that micro-batch x data-parallel size divides is
// kept, and a budget in units the flag does not take is a one-line error
// naming what to give.
TEST(PlannerCli, ClusterFlagsAreHonouredOrRefusedWithTheReason) {
  const CliRun fixed =
      run_cli("optimal --flops 1e21 --gpus 64 --micro-batch 2 --arch baseline --json");
  ASSERT_EQ(fixed.exit_code, 0) << fixed.err;
  EXPECT_NE(fixed.out.find("\"micro_batch_fixed\": true"), std::string::npos) << fixed.out;
  EXPECT_NE(fixed.out.find(", mb 2, recompute"), std::string::npos) << fixed.out;
  EXPECT_EQ(fixed.out.find(", mb 4, recompute"), std::string::npos) << fixed.out;
  const CliRun global =
      run_cli("optimal --flops 1e21 --gpus 64 --global-batch 768 --arch baseline --json");
  ASSERT_EQ(global.exit_code, 0) << global.err;
  EXPECT_NE(global.out.find("\"global_batch\": 768"), std::string::npos) << global.out;
  expect_one_line_error("optimal --gpu-hours 2w --gpus 8 --arch baseline",
                        "--gpu-hours = 2w: not a number of GPU-hours");
  expect_one_line_error("optimal --days 2x --gpus 8 --arch baseline",
                        "--days = 2x: not a wall-clock duration");
}

// A budget in the wrong unit names the flag, the value, what the flag takes
// and, when the value is another budget flag's, that flag with the value as
// the user would type it; a flag is never named twice ("----gpus").
TEST(PlannerCli, BudgetUnitMistakesNameTheFlagTheValueAndTheRightFlag) {
  const auto expect_error = [](const std::string& args, const std::vector<std::string>& needles) {
    const CliRun run = run_cli(args);
    EXPECT_EQ(run.exit_code, 2) << args << "\n" << run.err;
    EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << args << "\n" << run.err;
    for (const std::string& needle : needles) {
      EXPECT_NE(run.err.find(needle), std::string::npos) << args << ": " << needle << "\n"
                                                         << run.err;
    }
    EXPECT_EQ(run.err.find("----"), std::string::npos) << args << "\n" << run.err;
    EXPECT_EQ(run.err.find("gpu_hours"), std::string::npos) << args << "\n" << run.err;
  };
  expect_error("optimal --gpu-hours 2w --gpus 8",
               {"--gpu-hours = 2w", "200k", "give --days 2w with --gpus N"});
  expect_error("optimal --gpu-hours 3days --gpus 8", {"give --days 3days"});
  expect_error("optimal --gpu-hours lots --gpus 8", {"--gpu-hours = lots", "2e5"});
  expect_error("optimal --days 200k --gpus 8",
               {"--days = 200k", "weeks (2w)", "give --gpu-hours 200k"});
  expect_error("optimal --days -3 --gpus 8", {"--days = -3", "number of days"});
  expect_error("optimal --gpu-hours 0 --gpus 8", {"--gpu-hours = 0", "number of GPU-hours"});
  expect_error("optimal --flops 2w", {"--flops = 2w", "not a number of FLOPs", "--days D"});
  expect_error("sweep --flops 1e19,2w", {"--flops = 2w", "modar optimal's --gpu-hours"});
  expect_error("optimal --flops 1e20 --gpus x", {"--gpus = x"});
}

TEST(PlannerCli, OptimalJsonHasTheContractFields) {
  const CliRun run = run_cli("optimal --flops 1e20 --json");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  for (const char* key : {"\"recommendations\"",
                          "\"arch\"",
                          "\"role\"",
                          "\"isoflop_optimal\"",
                          "\"parity_fastest\"",
                          "\"total\"",
                          "\"flop_active\"",
                          "\"tokens\"",
                          "\"n_layers\"",
                          "\"d_model\"",
                          "\"n_heads\"",
                          "\"n_kv_heads\"",
                          "\"d_ff\"",
                          "\"forward_per_token\"",
                          "\"train_total\"",
                          "\"loss\"",
                          "\"peak_bytes\"",
                          "\"fits\"",
                          "\"step_s\"",
                          "\"train_hours\"",
                          "\"fit\"",
                          "\"eps\"",
                          "\"conventions\""}) {
    EXPECT_NE(run.out.find(key), std::string::npos) << key;
  }
  // mod+dar has no published prior: its loss is null, not a number.
  EXPECT_NE(run.out.find("\"loss\": null"), std::string::npos);
}

TEST(PlannerCli, OptimalPrintsRangesAndFlagsFullDar) {
  // Table: a range row under eps, N_f, D and the predicted loss; the MoD
  // prior's range (0.958..0.977 under Epoch: the Monte Carlo of the readings
  // in test_optimal_trust.cpp, docs/planner.md).
  const CliRun table = run_cli("optimal --flops 1e20");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("0.958..0.977"), std::string::npos) << table.out;
  EXPECT_GE(std::count(table.out.begin(), table.out.end(), '\n'), 10);
  for (const char* row : {"params FLOP-active N_f", "tokens D", "predicted loss", "eps"}) {
    const size_t at = table.out.find(std::string("\n") + row);
    ASSERT_NE(at, std::string::npos) << row;
    const size_t next = table.out.find('\n', at + 1);
    EXPECT_EQ(table.out.compare(next + 1, 7, "  range"), 0) << row;
  }
  // JSON: {value, low, high} ranges and {code, message} flags.
  const CliRun json = run_cli("optimal --flops 1e20 --json");
  ASSERT_EQ(json.exit_code, 0) << json.err;
  for (const char* key : {"\"ranges\"", "\"eps_range\"", "\"n_flop_active\"", "\"low\"",
                          "\"high\"", "\"flags\"", "\"same_shape\"", "\"interval\""}) {
    EXPECT_NE(json.out.find(key), std::string::npos) << key;
  }
  // Full DAR rests on one point: flagged in the table and the JSON.
  const CliRun full = run_cli("optimal --flops 1e20 --arch baseline,dar --block-layers 1");
  ASSERT_EQ(full.exit_code, 0) << full.err;
  EXPECT_NE(full.out.find("dar optimal: prior_single_point"), std::string::npos) << full.out;
  EXPECT_NE(full.out.find("dar parity-fastest: prior_single_point"), std::string::npos);
  const CliRun full_json =
      run_cli("optimal --flops 1e20 --arch baseline,dar --block-layers 1 --json");
  ASSERT_EQ(full_json.exit_code, 0) << full_json.err;
  EXPECT_NE(full_json.out.find("\"code\": \"prior_single_point\""), std::string::npos);
}

TEST(PlannerCli, FitWritesATomlThatOptimalAccepts) {
  std::string csv = "N,D,loss\n";
  for (const double n : {2e7, 5e7, 1e8, 2e8, 5e8}) {
    for (const double d : {2e9, 1e10, 5e10}) {
      const double loss = 1.9 + 400.0 / std::pow(n, 0.33) + 1800.0 / std::pow(d, 0.36);
      char line[128];
      std::snprintf(line, sizeof line, "%.6g,%.6g,%.9g\n", n, d, loss);
      csv += line;
    }
  }
  const std::string runs = write_temp("modar_runs.csv", csv);
  const std::string fit =
      ::testing::TempDir() + "/" + std::to_string(::getpid()) + "_modar_runs_fit.toml";
  const CliRun fitted = run_cli("fit " + runs + " --bootstrap 10 --output " + fit);
  ASSERT_EQ(fitted.exit_code, 0) << fitted.err;
  EXPECT_NE(fitted.out.find("alpha"), std::string::npos);
  const CliRun planned = run_cli("optimal --flops 1e20 --arch baseline --fit " + fit);
  EXPECT_EQ(planned.exit_code, 0) << planned.err;
}

}  // namespace
