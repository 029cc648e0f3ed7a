// Input hardening of the planner library (docs/hardening.md): the runs CSV
// grammar, implausible fits, large fits, Ctrl-C, the --eps grammar and the
// aspect band's integer overflow.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "modar/base/errors.hpp"
#include "modar/base/interrupt.hpp"
#include "modar/planner.hpp"

namespace {

std::vector<modar::RunRecord> law_runs(const modar::LossFitParams& law, int count,
                                       double noise_sigma) {
  return modar::runs_from_law(law, count, noise_sigma, 12345);
}

TEST(PlannerHardening, RunsCsvAcceptsBomAndQuotedHeaders) {
  const std::string rows = "1e8,2e9,3.1\n1e8,4e9,3.0\n2e8,4e9,2.9\n2e8,8e9,2.8\n4e8,8e9,2.7\n";
  const auto bom = modar::parse_runs_csv("\xEF\xBB\xBFN,D,loss\n" + rows, "bom.csv");
  ASSERT_EQ(bom.size(), 5u);
  EXPECT_DOUBLE_EQ(bom[4].n_flop_active, 4e8);
  const auto quoted = modar::parse_runs_csv("\"N\",\"D\",\"loss\"\n" + rows, "quoted.csv");
  ASSERT_EQ(quoted.size(), 5u);
  EXPECT_DOUBLE_EQ(quoted[0].loss, 3.1);
}

TEST(PlannerHardening, RunsCsvUsesTheStrictNumberGrammar) {
  const std::string good = "N,D,loss\n1e8,2e9,3.1\n1e8,4e9,3.0\n2e8,4e9,2.9\n2e8,8e9,2.8\n";
  for (const char* cell : {"0x10", "0x1p3", "infinity", "1e999"}) {
    try {
      modar::parse_runs_csv(good + "4e8,8e9," + cell + "\n", "runs.csv");
      ADD_FAILURE() << cell << " accepted";
    } catch (const modar::FileError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("runs.csv:6: column 'loss' = '") + cell),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(PlannerHardening, EpsOverridesUseTheStrictNumberGrammar) {
  EXPECT_DOUBLE_EQ(modar::parse_eps_overrides("mod=0.25").at("mod"), 0.25);
  EXPECT_DOUBLE_EQ(modar::parse_eps_overrides("mod=1.5e0").at("mod"), 1.5);
  EXPECT_THROW(modar::parse_eps_overrides("mod=0x1p-1"), modar::ConfigError);
  EXPECT_THROW(modar::parse_eps_overrides("mod=inf"), modar::ConfigError);
}

// Issue 24's prior: an efficiency prior of 1e-300 is in type (a positive
// double) but no architecture's efficiency; refused with the range, in the
// text grammar, in a request and in the closed form (which returned
// tokens_opt = inf for it).
TEST(PlannerHardening, AMeaninglessPriorIsRefusedWithItsRange) {
  for (const char* text : {"mod=1e-300", "mod=1e-6", "mod=0.2", "mod=2", "dar=0"}) {
    try {
      modar::parse_eps_overrides(text);
      ADD_FAILURE() << text << " accepted";
    } catch (const modar::ConfigError& e) {
      const std::string message = e.what();
      EXPECT_EQ(message.rfind("eps[", 0), 0u) << message;
      EXPECT_NE(message.find("must be in [0.25, 1.5]"), std::string::npos) << message;
    }
  }
  modar::OptimalRequest request;
  request.flops = 1e20;
  request.eps = {{"mod", 1e-300}};
  EXPECT_THROW(modar::optimal(request), modar::ConfigError);
  try {
    modar::closed_form_optimum(modar::ClosedFormRequest{1e20, "epoch", 1e-300});
    ADD_FAILURE() << "closed form with eps 1e-300 accepted";
  } catch (const modar::ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("eps = 1e-300: ", 0), 0u) << e.what();
  }
  // The allowed range's ends give finite answers.
  for (const double eps : {modar::kEpsMin, modar::kEpsMax}) {
    const modar::ClosedFormOptimum o =
        modar::closed_form_optimum(modar::ClosedFormRequest{1e20, "epoch", eps});
    EXPECT_TRUE(std::isfinite(o.tokens_opt) && std::isfinite(o.loss)) << eps;
  }
}

// Losses that RISE with N and D admit no law with alpha, beta > 0: the fit
// must fail (as `modar optimal --fit` would refuse it), not report success.
TEST(PlannerHardening, ImplausibleFitIsAnError) {
  std::vector<modar::RunRecord> runs;
  int64_t line = 2;
  for (const double n : {1e7, 1e8, 1e9}) {
    for (const double d : {1e9, 1e10, 1e11}) {
      runs.push_back({n, d, 1.0 + 0.1 * std::log10(n) + 0.1 * std::log10(d), line++});
    }
  }
  modar::FitOptions options;
  options.bootstrap_samples = 0;
  try {
    modar::fit_runs(runs, options);
    ADD_FAILURE() << "an increasing loss was fitted";
  } catch (const modar::ConfigError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("the fitted law: fit."), std::string::npos) << message;
    EXPECT_NE(message.find("the runs do not determine L(N, D)"), std::string::npos) << message;
  }
}

// 2,500 runs take the large-fit path (grid on a 300-run subsample, best 4
// refined on all runs, m-out-of-n bootstrap with m = 2,000) and still recover
// the law.
TEST(PlannerHardening, LargeFitRecoversTheLaw) {
  const modar::LossFitParams truth{1.9, 400.0, 1800.0, 0.33, 0.36};
  modar::FitOptions options;
  options.bootstrap_samples = 4;
  std::vector<std::string> stages;
  std::vector<modar::RunProgress> reports;
  modar::RunControl control;
  control.progress_interval_s = 0.0;  // every unit
  control.progress = [&](const modar::RunProgress& p) {
    if (stages.empty() || stages.back() != p.stage) {
      stages.push_back(p.stage);
    }
    reports.push_back(p);
  };
  const modar::FitResult result = modar::fit_runs(law_runs(truth, 2500, 0.002), options, control);
  EXPECT_NEAR(result.alpha.estimate, truth.alpha, 0.01);
  EXPECT_NEAR(result.beta.estimate, truth.beta, 0.01);
  EXPECT_NEAR(result.E.estimate, truth.E, 0.02);
  EXPECT_NE(result.fit.source.find("300-run subsample, best 4 refined on all runs"), std::string::npos) << result.fit.source;
  EXPECT_NE(result.fit.source.find("m-out-of-n, m = 2000"), std::string::npos);
  ASSERT_GE(stages.size(), 2u);
  EXPECT_NE(stages[0].find("2500 runs"), std::string::npos);
  // Units: 675 grid starts + 4 refinements (2,500 runs: not above 20,000) +
  // 4 bootstrap samples, counted one by one, the last report final.
  ASSERT_FALSE(reports.empty());
  EXPECT_EQ(reports.front().total, 675 + 4 + 4);
  EXPECT_TRUE(reports.back().final);
  EXPECT_EQ(reports.back().done, 675 + 4 + 4);
  for (size_t i = 1; i < reports.size(); ++i) {
    EXPECT_GE(reports[i].done, reports[i - 1].done);
  }
}

// optimal() reports its steps with an ETA once one step is done (the CLI and
// Python print these lines, through progress_line, for calls over about a
// second): every report before the last is not final and has done <= total, a report after the
// first finished step carries an ETA >= 0 and its line says ", ETA ", and
// the last is final with done = total.
TEST(PlannerHardening, OptimalReportsStepsWithAnEta) {
  modar::OptimalRequest request;
  request.flops = 1e21;
  request.gpus = 64;
  request.arch = {"baseline", "mod"};
  std::vector<modar::RunProgress> reports;
  modar::RunControl control;
  control.progress_interval_s = 0.0;  // every unit
  control.progress = [&](const modar::RunProgress& p) { reports.push_back(p); };
  modar::optimal(request, control);
  ASSERT_GE(reports.size(), 3u);
  bool eta_seen = false;
  for (size_t i = 0; i + 1 < reports.size(); ++i) {
    const modar::RunProgress& p = reports[i];
    EXPECT_FALSE(p.final);
    EXPECT_LE(p.done, p.total);
    if (p.done > 0) {
      EXPECT_GE(p.eta_s, 0.0) << modar::progress_line(p);
      eta_seen = eta_seen || modar::progress_line(p).find(", ETA ") != std::string::npos;
    }
  }
  EXPECT_TRUE(eta_seen);
  EXPECT_TRUE(reports.back().final);
  EXPECT_EQ(reports.back().done, reports.back().total);
  EXPECT_NE(modar::progress_line(reports.back()).find(", done"), std::string::npos);
}

TEST(PlannerHardening, FitAndSweepStopOnInterrupt) {
  const modar::LossFitParams truth{1.9, 400.0, 1800.0, 0.33, 0.36};
  modar::request_interrupt();
  EXPECT_THROW(modar::fit_runs(law_runs(truth, 30, 0.0)), modar::Interrupted);
  modar::SweepRequest request;
  request.flops = {1e20};
  request.with_time = false;
  EXPECT_THROW(modar::sweep(request), modar::Interrupted);
  modar::clear_interrupt();
  EXPECT_GT(modar::sweep(request).size(), 0u);
}

// --aspect-max 1e20: aspect x layers used to be cast to int64_t (undefined
// behaviour past 2^63); the band is clamped to the d_model range instead.
TEST(PlannerHardening, HugeAspectBandIsClampedNotOverflowed) {
  modar::ShapeSearchOptions wide;
  wide.aspect_max = 1e20;
  modar::ShapeSearchOptions normal;
  normal.aspect_max = static_cast<double>(normal.max_d_model);  // d_model / 1 layer at most
  const modar::Config base;
  const auto a = modar::enumerate_shapes(base, 1e7, 1e10, wide);
  const auto b = modar::enumerate_shapes(base, 1e7, 1e10, normal);
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());  // no shape has d_model / n_layers above max_d_model / 2
  for (const auto& candidate : a) {
    EXPECT_LE(candidate.shape.d_model, wide.max_d_model);
  }
}

}  // namespace
