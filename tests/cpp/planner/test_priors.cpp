// Efficiency priors: MoD from the MoD paper's figure 4 minima, DAR from its
// reported loss reductions.  Expected values worked by hand (python, not this
// code) from the formulas in SPEC section 4.
#include <gtest/gtest.h>

#include <cmath>

#include "modar/errors.hpp"
#include "modar/planner.hpp"

namespace {

modar::Config with_arch(const std::string& name, double capacity = 0.125, int64_t every = 2,
                        int64_t block_layers = 2, int64_t streams = 2) {
  const modar::ArchSpec arch = modar::make_arch(name, capacity, every, block_layers, streams);
  modar::Config config;
  config.mod = arch.mod;
  config.dar = arch.dar;
  return config;
}

TEST(Priors, ModUnderEpochMatchesSpecRange) {
  // eps_i = ((L_mod - 1.8172) / (L_base - 1.8172))^((0.3478+0.3658)/0.3658):
  // 6e18: (1.2728/1.3128)^1.95079 = 0.94142; 2e19: (1.0128/1.0428)^1.95079 = 0.94465;
  // 1e20: (0.7428/0.7728)^1.95079 = 0.92567; geometric mean 0.93721.
  const modar::LossFit epoch = modar::load_fit("epoch");
  const modar::EfficiencyPrior prior = modar::efficiency_prior(with_arch("mod"), epoch);
  ASSERT_TRUE(prior.known);
  EXPECT_NEAR(prior.eps, 0.93721, 2e-5);
  EXPECT_GE(prior.eps, 0.925);  // SPEC: 0.93 to 0.945
  EXPECT_LE(prior.eps, 0.945);
  EXPECT_NE(prior.derivation.find("0.9414"), std::string::npos) << prior.derivation;
  EXPECT_NE(prior.derivation.find("0.9446"), std::string::npos) << prior.derivation;
  EXPECT_NE(prior.derivation.find("0.9257"), std::string::npos) << prior.derivation;
  EXPECT_NE(prior.source.find("2404.02258"), std::string::npos);
  // SPEC: the optimal MoD size relative to dense is eps^(1/(alpha+beta)) ~ 0.92.
  EXPECT_NEAR(std::pow(prior.eps, 1.0 / (0.3478 + 0.3658)), 0.913, 0.005);
}

TEST(Priors, ModIsDerivedUnderTheActiveFit) {
  // Hoffmann: exponent 0.62/0.28 = 2.2143, E = 1.69: 0.93953, 0.94411, 0.92768 -> 0.93708.
  const modar::EfficiencyPrior prior =
      modar::efficiency_prior(with_arch("mod"), modar::load_fit("hoffmann"));
  ASSERT_TRUE(prior.known);
  EXPECT_NEAR(prior.eps, 0.93708, 2e-5);
}

TEST(Priors, DarFromReportedReductions) {
  // Epoch, N = 1e8, D = 20N: L_b = 3.43854, A/N^alpha = 0.79553,
  // eps = 1 - 0.0203*3.43854/0.79553 = 0.91226; N = 3e8: L_b = 2.91261,
  // A/N^alpha = 0.54289, eps = 1 - 0.0222*2.91261/0.54289 = 0.88090.
  // Block prior = sqrt(0.91226*0.88090) = 0.89644.  N = 5e8 (Full DAR):
  // L_b = 2.73007, A/N^alpha = 0.45452, eps = 1 - 0.0512*2.73007/0.45452 = 0.69247.
  const modar::LossFit epoch = modar::load_fit("epoch");
  const auto block = modar::efficiency_prior(with_arch("dar"), epoch);
  ASSERT_TRUE(block.known);
  EXPECT_NEAR(block.eps, 0.89644, 2e-5);
  const auto full = modar::efficiency_prior(with_arch("dar", 0.125, 2, 1, 2), epoch);
  ASSERT_TRUE(full.known);
  EXPECT_NEAR(full.eps, 0.69247, 2e-5);
  EXPECT_NE(block.derivation.find("0.9123"), std::string::npos) << block.derivation;
}

TEST(Priors, NoPriorMeansUnknownNotGuessed) {
  const modar::LossFit epoch = modar::load_fit("epoch");
  EXPECT_FALSE(modar::efficiency_prior(with_arch("mod", 0.5, 2), epoch).known);
  EXPECT_FALSE(modar::efficiency_prior(with_arch("mod", 0.125, 1), epoch).known);
  EXPECT_FALSE(modar::efficiency_prior(with_arch("mod+dar"), epoch).known);
  EXPECT_FALSE(modar::efficiency_prior(with_arch("dar", 0.125, 2, 2, 3), epoch).known);
  const auto baseline = modar::efficiency_prior(with_arch("baseline"), epoch);
  EXPECT_TRUE(baseline.known);
  EXPECT_EQ(baseline.eps, 1.0);
}

TEST(Priors, OverridesWin) {
  const modar::LossFit epoch = modar::load_fit("epoch");
  const modar::EpsOverrides overrides =
      modar::parse_eps_overrides("mod=0.94, dar=0.97,mod+dar=0.9");
  EXPECT_EQ(overrides.size(), 3u);
  EXPECT_EQ(modar::efficiency_prior(with_arch("mod", 0.5, 1), epoch, overrides).eps, 0.94);
  EXPECT_EQ(modar::efficiency_prior(with_arch("dar"), epoch, overrides).eps, 0.97);
  const auto combined = modar::efficiency_prior(with_arch("mod+dar"), epoch, overrides);
  EXPECT_TRUE(combined.known);
  EXPECT_EQ(combined.eps, 0.9);
  EXPECT_EQ(combined.source, "eps override");
}

TEST(Priors, BadOverridesAreRejected) {
  EXPECT_THROW(modar::parse_eps_overrides("mod"), modar::ConfigError);
  EXPECT_THROW(modar::parse_eps_overrides("mixtral=0.9"), modar::ConfigError);
  EXPECT_THROW(modar::parse_eps_overrides("mod=abc"), modar::ConfigError);
  EXPECT_THROW(modar::parse_eps_overrides("mod=0"), modar::ConfigError);
  EXPECT_THROW(modar::parse_eps_overrides("mod=nan"), modar::ConfigError);
  EXPECT_TRUE(modar::parse_eps_overrides("").empty());
}

TEST(Arch, UnknownNameListsAllowed) {
  try {
    modar::make_arch("mixtral");
    FAIL();
  } catch (const modar::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("baseline, mod, dar, mod+dar"), std::string::npos);
  }
  EXPECT_THROW(modar::make_arch("mod", 1.5), modar::ConfigError);
  const auto mod = modar::make_arch("mod");
  EXPECT_EQ(mod.mod.every, 2);
  EXPECT_TRUE(mod.mod.is_routed(1));
  EXPECT_FALSE(mod.mod.is_routed(0));
}

}  // namespace
