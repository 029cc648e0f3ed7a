// The [moe] section: parsing, defaults, round trip, validation messages, and
// the layer / capacity rules of docs/model.md experts (hand-derived values).
#include <gtest/gtest.h>

#include <functional>

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
  EXPECT_EQ(c.moe.experts, 0);
  EXPECT_EQ(c.moe.top_k, 1);
  EXPECT_EQ(c.moe.interval, 1);
  EXPECT_EQ(c.moe.capacity_factor, 0.0);
  EXPECT_EQ(c.moe.aux_loss_coef, 0.01);
  EXPECT_EQ(c.moe.load_imbalance, 1.0);
  EXPECT_EQ(c.moe.mode, MoeMode::none);
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
  EXPECT_EQ(with({"moe.experts=-1"}),
            "ConfigError: moe.experts = -1: must be >= 0 (0 = dense, no experts)");
  EXPECT_EQ(with({"moe.experts=8", "moe.top_k=0"}),
            "ConfigError: moe.top_k = 0: must be a positive integer");
  EXPECT_EQ(with({"moe.experts=8", "moe.top_k=9"}),
            "ConfigError: moe.top_k = 9: must be <= moe.experts = 8");
  EXPECT_EQ(with({"moe.capacity_factor=-0.5"}),
            "ConfigError: moe.capacity_factor = -0.5: must be in [0, 1024] (0 = dropless)");
  EXPECT_EQ(with({"moe.load_imbalance=0.5"}),
            "ConfigError: moe.load_imbalance = 0.5: must be a finite number >= 1 (busiest "
            "expert's tokens / mean)");
  EXPECT_EQ(with({"moe.experts=8", "moe.top_k=2", "moe.load_imbalance=5"}),
            "ConfigError: moe.load_imbalance = 5: must be <= (moe.experts + null experts) / "
            "moe.top_k = 4 (the busiest expert receives at most every token)");
  EXPECT_EQ(with({"moe.interval=0"}), "ConfigError: moe.interval = 0: must be a positive integer");
  EXPECT_EQ(with({"moe.mode=\"staged\""}),
            "ConfigError: moe.mode = \"staged\": needs moe.experts > 0 (MoDE routes among experts)");
  EXPECT_EQ(with({"moe.mode=fancy"}),
            "ConfigError: moe.mode = fancy: must be \"none\", \"staged\" or \"integrated\"");
  EXPECT_EQ(with({"moe.experts=8", "moe.mode=staged"}),
            "ConfigError: moe.mode = \"staged\": needs MoD routing around the blocks (set "
            "mod.every > 0)");
  EXPECT_EQ(with({"moe.experts=8", "moe.null_experts=4"}),
            "ConfigError: moe.null_experts = 4: needs moe.mode = \"integrated\" (null experts "
            "are integrated MoDE's no-op choices)");
  EXPECT_EQ(with({"moe.experts=8", "mod.every=2"}),
            "ConfigError: moe.mode = \"none\": with mod.every > 0 and moe.experts > 0 must be "
            "\"staged\" (MoD around the block, experts inside)");
  EXPECT_EQ(with({"moe.experts=8", "moe.first_dense=24"}),
            "ConfigError: moe.first_dense = 24: must be < model.n_layers = 24 (at least one MoE "
            "layer; set moe.experts = 0 for a dense model)");
  EXPECT_EQ(with({"parallel.expert=2", "device.count=2"}),
            "ConfigError: parallel.expert = 2: must be 1 without experts (set moe.experts > 0 "
            "for expert parallelism)");
  EXPECT_EQ(with({"moe.experts=6", "parallel.expert=4", "device.count=4"}),
            "ConfigError: parallel.expert = 4: must divide moe.experts = 6");
  EXPECT_EQ(with({"moe.experts=8", "parallel.expert=4", "device.count=2"}),
            "ConfigError: parallel.expert = 4: parallel.expert x parallel.expert_tensor = 4 x 1 "
            "must divide the ranks of a pipeline stage, parallel.tensor x parallel.context x "
            "data-parallel size = device.count / parallel.pipeline = 2 (Megatron-Core folds the "
            "expert groups over the tensor, context and data-parallel ranks)");
  // Slots x widths stay far from 64-bit overflow (the lowering multiplies them).
  EXPECT_EQ(with({"moe.experts=65536", "moe.expert_ffn=16777216", "moe.shared_experts=64",
                  "moe.capacity_factor=1024", "train.micro_batch=64"})
                .rfind("ConfigError: moe.experts = 65536: expert slots x width = ", 0),
            0u);
  EXPECT_EQ(with({"moe.experts=8", "moe.top_k=2", "moe.mode=integrated", "moe.null_experts=8",
                  "moe.load_imbalance=8"}),
            "no error");
  EXPECT_EQ(with({"moe.experts=8", "mod.every=2", "moe.mode=staged"}), "no error");
  EXPECT_EQ(with({"moe.experts=8", "parallel.expert=8", "device.count=8"}), "no error");
}

}  // namespace
}  // namespace modar
