// Loss model, built-in fits, closed forms (docs/planner.md fixture) and fit
// files.  Expected numbers come from the papers / docs/planner.md or were worked by hand
// from the published constants (noted beside each).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "modar/base/errors.hpp"
#include "modar/planner.hpp"

namespace {

void expect_rel(double actual, double expected, double tolerance) {
  EXPECT_NEAR(actual / expected, 1.0, tolerance) << "actual " << actual << " expected " << expected;
}

TEST(ClosedForm, EpochFixturesFromSpec) {
  const modar::LossFit epoch = modar::load_fit("epoch");
  // docs/planner.md: C = 6e18 -> N* = 2.02e8, D* = 4.96e9; 1e20 -> 8.53e8,
  // 1.95e10; 5.76e23 -> 7.22e10, 1.33e12 (three significant figures).
  const struct {
    double flops, n, d;
  } fixtures[] = {{6e18, 2.02e8, 4.96e9}, {1e20, 8.53e8, 1.95e10}, {5.76e23, 7.22e10, 1.33e12}};
  for (const auto& f : fixtures) {
    const modar::ClosedFormOptimum opt = modar::closed_form_optimum(epoch.params, f.flops);
    expect_rel(opt.n_opt, f.n, 0.004);
    expect_rel(opt.tokens_opt, f.d, 0.004);
    // The allocation spends exactly the budget under C = 6 N D.
    expect_rel(6.0 * opt.n_opt * opt.tokens_opt, f.flops, 1e-12);
  }
  // About 18 tokens per parameter at the Chinchilla budget.
  const auto chinchilla = modar::closed_form_optimum(epoch.params, 5.76e23);
  EXPECT_NEAR(chinchilla.tokens_opt / chinchilla.n_opt, 18.4, 0.3);
}

TEST(ClosedForm, HoffmannRoundedByHand) {
  // G = (0.34*406.4 / (0.28*410.7))^(1/0.62) = 1.20157^1.6129 = 1.3447;
  // N*(1e19) = 1.3447 * (1e19/6)^(0.28/0.62) = 1.3447 * 1.6951e8 = 2.2795e8;
  // D*(1e19) = (1e19/6)^(0.34/0.62) / 1.3447 = 9.8307e9 / 1.3447 = 7.311e9 (32 tokens/param).
  // the same closed form, worked by hand: 1e21 -> 1.82e9 (50), 1e23 -> 1.46e10 (78),
  // 5.76e23 -> 3.22e10 (93).
  const modar::LossFit hoffmann = modar::load_fit("hoffmann");
  const auto at_1e19 = modar::closed_form_optimum(hoffmann.params, 1e19);
  EXPECT_NEAR(at_1e19.G, 1.3447, 0.0005);
  expect_rel(at_1e19.n_opt, 2.2795e8, 0.002);
  expect_rel(at_1e19.tokens_opt, 7.311e9, 0.002);
  const struct {
    double flops, n, tokens_per_param;
  } table[] = {{1e21, 1.82e9, 50}, {1e23, 1.46e10, 78}, {5.76e23, 3.22e10, 93}};
  for (const auto& row : table) {
    const auto opt = modar::closed_form_optimum(hoffmann.params, row.flops);
    expect_rel(opt.n_opt, row.n, 0.005);
    EXPECT_NEAR(opt.tokens_opt / opt.n_opt, row.tokens_per_param, 1.0);
  }
}

TEST(ClosedForm, IsTheMinimumAlongTheIsoflopCurve) {
  // Finite differences: moving N by +-1 % along C = 6 N D raises the loss.
  for (const std::string name : {"epoch", "hoffmann"}) {
    const modar::LossFitParams p = modar::load_fit(name).params;
    for (const double flops : {1e18, 1e21, 1e24}) {
      for (const double eps : {1.0, 0.9}) {
        const auto opt = modar::closed_form_optimum(p, flops, eps);
        const auto loss_at = [&](double n) {
          return modar::predicted_loss(p, eps, n, flops / (6.0 * n));
        };
        EXPECT_NEAR(loss_at(opt.n_opt), opt.loss, 1e-12);
        EXPECT_LT(opt.loss, loss_at(opt.n_opt * 1.01));
        EXPECT_LT(opt.loss, loss_at(opt.n_opt * 0.99));
        // Stationarity: the centred derivative in log N vanishes.
        const double h = 1e-4;
        const double slope =
            (loss_at(opt.n_opt * std::exp(h)) - loss_at(opt.n_opt * std::exp(-h))) / (2 * h);
        EXPECT_NEAR(slope, 0.0, 1e-7);
      }
    }
  }
}

TEST(ClosedForm, EpsScalesTheOptimalSize) {
  // With A -> eps A, G scales by eps^(1/(alpha+beta)) (docs/planner.md: ~0.92 for MoD).
  const modar::LossFitParams p = modar::load_fit("epoch").params;
  const auto dense = modar::closed_form_optimum(p, 1e20, 1.0);
  const auto mod = modar::closed_form_optimum(p, 1e20, 0.9372);
  EXPECT_NEAR(mod.n_opt / dense.n_opt, std::pow(0.9372, 1.0 / (0.3478 + 0.3658)), 1e-12);
}

TEST(LossModel, HandComputedValue) {
  // Epoch: 1.8172 + 482.01/1e8^0.3478 + 2085.43/(2e9)^0.3658
  //      = 1.8172 + 0.795529 + 0.825807 = 3.438537
  const modar::LossFitParams p = modar::load_fit("epoch").params;
  EXPECT_NEAR(modar::predicted_loss(p, 1.0, 1e8, 2e9), 3.438537, 2e-6);
  // eps only scales the parameter term.
  EXPECT_NEAR(modar::predicted_loss(p, 0.5, 1e8, 2e9), 3.438537 - 0.5 * 0.795529, 2e-6);
}

TEST(Fits, NamesAndErrors) {
  EXPECT_EQ(modar::builtin_fit_names(), (std::vector<std::string>{"epoch", "hoffmann"}));
  EXPECT_DOUBLE_EQ(modar::load_fit("epoch").params.beta, 0.3658);
  EXPECT_DOUBLE_EQ(modar::load_fit("hoffmann").params.E, 1.69);
  EXPECT_THROW(modar::load_fit("chinchilla"), modar::ConfigError);
  EXPECT_THROW(modar::load_fit("/nonexistent/dir/fit.toml"), modar::FileError);
  try {
    modar::load_fit("kaplan");
    FAIL();
  } catch (const modar::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("epoch, hoffmann"), std::string::npos) << e.what();
  }
}

TEST(FitFile, RoundTripsThroughTomlAtomically) {
  modar::LossFit fit;
  fit.name = "mine";
  fit.source = "unit test \"quoted\"";
  fit.params = {2.0, 300.5, 1234.25, 0.31, 0.29};
  fit.standard_errors = modar::LossFitParams{0.01, 10, 20, 0.005, 0.006};
  const std::string path =
      ::testing::TempDir() + "/" + std::to_string(::getpid()) + "_modar_fit_roundtrip.toml";
  modar::save_fit_atomically(fit, path);
  const modar::LossFit back = modar::load_fit(path);
  EXPECT_EQ(back.source, fit.source);
  EXPECT_DOUBLE_EQ(back.params.E, 2.0);
  EXPECT_DOUBLE_EQ(back.params.A, 300.5);
  EXPECT_DOUBLE_EQ(back.params.B, 1234.25);
  EXPECT_DOUBLE_EQ(back.params.alpha, 0.31);
  EXPECT_DOUBLE_EQ(back.params.beta, 0.29);
  ASSERT_TRUE(back.standard_errors.has_value());
  EXPECT_DOUBLE_EQ(back.standard_errors->A, 10);
  // No temporary file is left next to it.
  std::ifstream leftover(path + ".tmp." + std::to_string(::getpid()));
  EXPECT_FALSE(leftover.good());
}

TEST(FitFile, MalformedFilesNameTheProblem) {
  const auto expect_file_error = [](const std::string& text, const std::string& needle) {
    try {
      modar::parse_fit_toml(text, "bad.toml");
      ADD_FAILURE() << "accepted: " << text;
    } catch (const modar::FileError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_file_error("[fit]\nE = 1.0\nA = 1\nB = 1\nalpha = 0.3\n", "fit.beta");
  expect_file_error("[fit]\nE = 1.0\nA = -1\nB = 1\nalpha = 0.3\nbeta = 0.3\n", "fit.A");
  expect_file_error("[fit]\nE = 1.0\nA = 1\nB = 1\nalpha = 0.3\nbeta = 0.3\ngamma = 1\n",
                    "fit.gamma");
  expect_file_error("[model]\nd_model = 3\n", "no [fit] table");
  expect_file_error("[fit\nE = ", "bad.toml:1");
}

}  // namespace
