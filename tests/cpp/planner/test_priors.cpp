// Efficiency priors: MoD from the MoD paper's figure 4 minima, DAR from its
// reported loss reductions.  Expected values worked by hand (python, not this
// code) from the formulas in docs/planner.md.
#include <gtest/gtest.h>

#include <cmath>

#include "modar/base/errors.hpp"
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

TEST(Priors, ModUnderEpochIsTheReducibleLossRatio) {
  // The MoD prior multiplies the whole reducible loss (docs/planner.md), so
  // eps_i = (L_mod - 1.8172) / (L_base - 1.8172): 6e18: 1.2728/1.3128 = 0.96953;
  // 2e19: 1.0128/1.0428 = 0.97123; 1e20: 0.7428/0.7728 = 0.96118; geometric
  // mean 0.96730.
  const modar::LossFit epoch = modar::load_fit("epoch");
  const modar::EfficiencyPrior prior = modar::efficiency_prior(with_arch("mod"), epoch);
  ASSERT_TRUE(prior.known);
  EXPECT_EQ(prior.acts_on, modar::PriorTerm::reducible);
  EXPECT_NEAR(prior.eps, 0.96730, 2e-5);
  EXPECT_NE(prior.derivation.find("0.9695"), std::string::npos) << prior.derivation;
  EXPECT_NE(prior.derivation.find("0.9712"), std::string::npos) << prior.derivation;
  EXPECT_NE(prior.derivation.find("0.9612"), std::string::npos) << prior.derivation;
  EXPECT_NE(prior.source.find("2404.02258"), std::string::npos);
  // A common factor on both terms leaves the closed-form optimum's N_f where
  // the baseline's is (the paper: the optimal MoD has the optimal baseline's
  // forward FLOPs per token) and scales its reducible loss by eps.
  const double flops = 2e19;
  const modar::ClosedFormOptimum dense = modar::closed_form_optimum(epoch.params, flops);
  const modar::ClosedFormOptimum mod =
      modar::closed_form_optimum(epoch.params, flops, modar::loss_scale(prior, prior.eps));
  EXPECT_NEAR(mod.n_opt / dense.n_opt, 1.0, 1e-12);
  EXPECT_NEAR((mod.loss - 1.8172) / (dense.loss - 1.8172), prior.eps, 1e-12);
}

TEST(Priors, CausalAuxLossRouterCostsAQuarterPercentOfTheLoss) {
  // MoD paper 3.5: the auxiliary BCE router affects the LM objective by
  // ~0.2-0.3% (the middle, 0.25%); the predictor does not affect it.  By hand
  // at N = 1e8, D = 2e9 with eps = 0.9673: E + eps (A / N^alpha + B / D^beta),
  // times 1.0025 for the aux loss.
  const modar::LossFit epoch = modar::load_fit("epoch");
  const double n = 1e8, d = 2e9;
  const double top_k =
      1.8172 + 0.9673 * (482.01 / std::pow(n, 0.3478) + 2085.43 / std::pow(d, 0.3658));
  modar::Config config = with_arch("mod");
  const modar::EpsOverrides overrides = modar::parse_eps_overrides("mod=0.9673");
  for (const auto router : {modar::CausalRouter::none, modar::CausalRouter::predictor,
                            modar::CausalRouter::aux_loss}) {
    config.mod.causal_router = router;
    const auto prior = modar::efficiency_prior(config, epoch, overrides);
    const double expected = router == modar::CausalRouter::aux_loss ? 1.0025 * top_k : top_k;
    EXPECT_NEAR(modar::predicted_loss(epoch.params, modar::loss_scale(prior, prior.eps), n, d),
                expected, 1e-12);
  }
  // The penalty does not move the closed-form optimum, and a model without
  // MoD routing has none whatever its router setting.
  config.mod.causal_router = modar::CausalRouter::aux_loss;
  const auto aux = modar::efficiency_prior(config, epoch);
  EXPECT_NE(aux.derivation.find("aux_loss: loss x 1.0025"), std::string::npos) << aux.derivation;
  const modar::ClosedFormOptimum with_penalty =
      modar::closed_form_optimum(epoch.params, 2e19, modar::loss_scale(aux, aux.eps));
  const modar::ClosedFormOptimum without =
      modar::closed_form_optimum(epoch.params, 2e19, modar::LossScale{aux.eps, aux.eps});
  EXPECT_NEAR(with_penalty.n_opt / without.n_opt, 1.0, 1e-12);
  EXPECT_NEAR(with_penalty.loss / without.loss, 1.0025, 1e-12);
  modar::Config dense;
  dense.mod.causal_router = modar::CausalRouter::aux_loss;
  EXPECT_EQ(modar::loss_scale(modar::efficiency_prior(dense, epoch), 1.0).total, 1.0);
}

TEST(Priors, ModIsDerivedUnderTheActiveFit) {
  // Hoffmann, E = 1.69: 1.40/1.44 = 0.97222, 1.14/1.17 = 0.97436, 0.87/0.90 = 0.96667
  // -> geometric mean 0.97108.
  const modar::EfficiencyPrior prior =
      modar::efficiency_prior(with_arch("mod"), modar::load_fit("hoffmann"));
  ASSERT_TRUE(prior.known);
  EXPECT_NEAR(prior.eps, 0.97108, 2e-5);
}

TEST(Priors, OnlyMoDPriorsActOnTheDataTerm) {
  const modar::LossFit epoch = modar::load_fit("epoch");
  const auto dar = modar::efficiency_prior(with_arch("dar"), epoch);
  EXPECT_EQ(dar.acts_on, modar::PriorTerm::parameters);
  const modar::LossScale dar_scale = modar::loss_scale(dar, 0.9);
  EXPECT_EQ(dar_scale.params, 0.9);
  EXPECT_EQ(dar_scale.data, 1.0);
  const modar::EpsOverrides overrides = modar::parse_eps_overrides("mod+dar=0.9,dar=0.95");
  const auto mod_dar = modar::efficiency_prior(with_arch("mod+dar"), epoch, overrides);
  EXPECT_EQ(mod_dar.acts_on, modar::PriorTerm::reducible);
  EXPECT_EQ(modar::efficiency_prior(with_arch("dar"), epoch, overrides).acts_on,
            modar::PriorTerm::parameters);
  // L = E + s_p A / N^alpha + s_d B / D^beta by hand at N = 1e8, D = 2e9.
  const double n = 1e8, d = 2e9;
  const double by_hand =
      1.8172 + 0.9 * 482.01 / std::pow(n, 0.3478) + 0.8 * 2085.43 / std::pow(d, 0.3658);
  EXPECT_NEAR(modar::predicted_loss(epoch.params, modar::LossScale{0.9, 0.8}, n, d), by_hand,
              1e-12);
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
