// The [moe] section: parsing, defaults, round trip, validation messages, and
// the layer / capacity rules of docs/model.md experts (hand-derived values).
#include <gtest/gtest.h>

#include <functional>

#include "../common/config_cases.hpp"
#include "../common/config_error_of.hpp"
#include "modar/base/errors.hpp"
#include "modar/config.hpp"

namespace modar {
namespace {

using modar_test::error_of;

std::string with(const std::vector<std::string>& assignments) {
  return error_of([&] {
    Config c;
    for (const std::string& a : assignments) {
      apply_override(c, a);
    }
    validate(c);
  });
}

TEST(MoeConfig, DefaultsAreDenseAndEveryKeyIsListed) {
  const Config c;
  EXPECT_FALSE(c.moe.enabled());
  // The [moe] defaults stated in tests/data/config_defaults.toml.
  for (const auto& row : modar_test::keys_as_stated("config_defaults.toml", c))
    EXPECT_EQ(row.actual, row.expected) << row.where;
  EXPECT_EQ(c.moe.moe_layers(24), 0);
  EXPECT_FALSE(c.moe.is_moe_layer(0));
  for (const char* key : {"moe.experts", "moe.top_k", "moe.expert_ffn", "moe.shared_experts",
                          "moe.interval", "moe.first_dense", "moe.capacity_factor",
                          "moe.aux_loss_coef", "moe.z_loss_coef", "moe.load_imbalance",
                          "moe.mode", "moe.null_experts"}) {
    const auto& keys = config_keys();
    EXPECT_NE(std::find(keys.begin(), keys.end(), key), keys.end()) << key;
  }
  EXPECT_EQ(ConfigKey("moe.mode").type(), ConfigValueType::choice);
  EXPECT_EQ(ConfigKey("moe.capacity_factor").type(), ConfigValueType::real);
  EXPECT_EQ(ConfigKey("moe.experts").type(), ConfigValueType::integer);
}

TEST(MoeConfig, ParsesAndRoundTrips) {
  const Config c = parse_config_toml(R"(
[model]
n_layers = 12
[moe]
experts = 64
top_k = 6
expert_ffn = 1408
shared_experts = 2
interval = 2
first_dense = 1
capacity_factor = 1.25
aux_loss_coef = 0.001
z_loss_coef = 0.0001
load_imbalance = 1.5
[parallel]
expert = 8
[device]
count = 8
)");
  EXPECT_EQ(c.moe.experts, 64);
  EXPECT_EQ(c.moe.top_k, 6);
  EXPECT_EQ(c.moe.expert_ffn, 1408);
  EXPECT_EQ(c.moe.shared_experts, 2);
  EXPECT_EQ(c.moe.capacity_factor, 1.25);
  EXPECT_EQ(c.moe.z_loss_coef, 0.0001);
  EXPECT_EQ(c.parallel.expert, 8);
  // Expert parallelism is carved out of data parallelism: DP stays 8.
  EXPECT_EQ(c.parallel.data(c.device.count), 8);
  // Layers 1, 3, 5, 7, 9, 11 are MoE (first_dense = 1, interval = 2): 6 of 12.
  EXPECT_EQ(c.moe.moe_layers(12), 6);
  EXPECT_FALSE(c.moe.is_moe_layer(0));
  EXPECT_TRUE(c.moe.is_moe_layer(1));
  EXPECT_FALSE(c.moe.is_moe_layer(2));
  EXPECT_TRUE(c.moe.is_moe_layer(11));
  const Config again = parse_config_toml(to_toml(c));
  EXPECT_EQ(to_toml(again), to_toml(c));
  EXPECT_NE(to_toml(c).find("[moe]\nexperts = 64\n"), std::string::npos);

  const Config mode = parse_config_toml(R"(
[moe]
experts = 8
null_experts = 8
top_k = 2
mode = "integrated"
)");
  EXPECT_EQ(mode.moe.mode, MoeMode::integrated);
  EXPECT_EQ(mode.moe.choices(), 16);
  EXPECT_EQ(parse_config_toml(to_toml(mode)).moe.null_experts, 8);
}

TEST(MoeConfig, CapacityIsCeilOfFactorTimesTokensTimesKOverChoices) {
  MoeConfig e;
  e.experts = 8;
  e.top_k = 2;
  EXPECT_EQ(e.expert_capacity(1000), 1000);  // dropless: at most every token
  e.capacity_factor = 1.0;
  EXPECT_EQ(e.expert_capacity(1000), 250);  // 1 * 1000 * 2 / 8
  e.capacity_factor = 1.25;
  EXPECT_EQ(e.expert_capacity(1000), 313);  // ceil(312.5)
  e.capacity_factor = 100.0;
  EXPECT_EQ(e.expert_capacity(1000), 1000);  // never more than the tokens
  e.mode = MoeMode::integrated;
  e.null_experts = 8;
  e.capacity_factor = 1.0;
  EXPECT_EQ(e.expert_capacity(1000), 125);  // 1000 * 2 / 16 choices
}

TEST(MoeConfig, ErrorsNameTheKeyTheValueAndWhatIsAllowed) {
  // The [[moe]] rows of tests/data/config_errors.toml, on the defaults.
  for (const auto& row : modar_test::config_case_errors("moe", Config{}))
    EXPECT_EQ(row.actual, row.expected) << row.where;
  // Slots x widths stay far from 64-bit overflow (the lowering multiplies them).
  EXPECT_EQ(with({"moe.experts=65536", "moe.expert_ffn=16777216", "moe.shared_experts=64",
                  "moe.capacity_factor=1024", "train.micro_batch=64"})
                .rfind("ConfigError: moe.experts = 65536: expert slots x width = ", 0),
            0u);
}

}  // namespace
}  // namespace modar
