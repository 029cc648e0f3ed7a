// Expert architectures in the planner: the MoD paper's figure 7 priors
// (docs/moe.md).  Expected values worked by hand (python, not this code):
// eps = geomean over L_b in {3.13, 2.86, 2.59} of ((r L_b - E)/(L_b - E))^((a+b)/b)
// with the Epoch fit (E 1.8172, alpha 0.3478, beta 0.3658).
#include <gtest/gtest.h>

#include "modar/base/errors.hpp"
#include "modar/planner.hpp"

namespace {

modar::Config with_arch(const std::string& name) {
  const modar::ArchSpec arch = modar::make_arch(name);
  modar::Config config;
  config.mod = arch.mod;
  config.dar = arch.dar;
  config.moe = arch.moe;
  return config;
}

TEST(MoePriors, Figure7ReadingsUnderEpoch) {
  const modar::LossFit epoch = modar::load_fit("epoch");
  const auto moe = modar::efficiency_prior(with_arch("moe"), epoch);
  ASSERT_TRUE(moe.known);
  EXPECT_NEAR(moe.eps, 0.88222, 1e-4);  // r = 0.978
  EXPECT_NEAR(moe.eps_low, 0.86121, 1e-4);   // the 1e20 baseline loss
  EXPECT_NEAR(moe.eps_high, 0.90023, 1e-4);  // the 6e18 baseline loss
  const auto mode = modar::efficiency_prior(with_arch("mode-integrated"), epoch);
  ASSERT_TRUE(mode.known);
  EXPECT_NEAR(mode.eps, 0.77637, 1e-4);  // r = 0.957
  EXPECT_NEAR(modar::efficiency_prior(with_arch("mode-staged"), epoch).eps, mode.eps, 1e-12);
  EXPECT_NE(mode.derivation.find("0.957"), std::string::npos);
  // No published prior for experts with DAR: unknown, not guessed.
  EXPECT_FALSE(modar::efficiency_prior(with_arch("moe+dar"), epoch).known);
  EXPECT_FALSE(modar::efficiency_prior(with_arch("mode-integrated+dar"), epoch).known);
}

TEST(MoePriors, ArchitecturesCarryTheirExperts) {
  const modar::ArchSpec moe = modar::make_arch("moe");
  EXPECT_EQ(moe.moe.experts, 8);
  EXPECT_EQ(moe.moe.top_k, 1);
  EXPECT_FALSE(moe.mod.enabled());
  const modar::ArchSpec staged = modar::make_arch("mode-staged");
  EXPECT_EQ(staged.moe.mode, modar::MoeMode::staged);
  EXPECT_EQ(staged.mod.every, 2);
  const modar::ArchSpec integrated = modar::make_arch("mode-integrated+dar");
  EXPECT_EQ(integrated.moe.null_experts, 8);
  EXPECT_TRUE(integrated.dar.enabled());
  EXPECT_FALSE(integrated.mod.enabled());
  EXPECT_THROW(modar::make_arch("mode"), modar::ConfigError);
  EXPECT_EQ(modar::parse_eps_overrides("moe=0.9").at("moe"), 0.9);
}

}  // namespace
