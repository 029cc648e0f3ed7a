// ConfigKey: typed values set without text, held to the rules of TOML values.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "modar/base/errors.hpp"
#include "modar/config.hpp"

namespace modar {
namespace {

std::string message_of(void (*action)(Config&), Config& config) {
  try {
    action(config);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

TEST(ConfigKey, SetsTypedValuesLikeTheTomlReader) {
  Config config;
  ConfigKey("model.d_model").set_integer(config, 1024);
  ConfigKey("mod.capacity").set_integer(config, 1);  // a real key takes an integer
  ConfigKey("model.norm_eps").set_real(config, 1e-5);
  ConfigKey("model.tie_embeddings").set_boolean(config, true);
  ConfigKey("model.mlp").set_text(config, "swiglu");
  ConfigKey("device.profile").set_text(config, "a \"b\" ] [model] d_model = 1");
  EXPECT_EQ(config.model.d_model, 1024);
  EXPECT_EQ(config.mod.capacity, 1.0);
  EXPECT_EQ(config.model.norm_eps, 1e-5);
  EXPECT_TRUE(config.model.tie_embeddings);
  EXPECT_EQ(config.model.mlp, MlpKind::swiglu);
  EXPECT_EQ(config.device.profile, "a \"b\" ] [model] d_model = 1");  // one value, verbatim
  // and the TOML writer round-trips it
  const Config again = parse_config_toml(to_toml(config));
  EXPECT_EQ(again.device.profile, config.device.profile);
  EXPECT_EQ(again.model.d_model, 1024);
  EXPECT_EQ(ConfigKey("model.d_model").literal(config), "1024");
  EXPECT_EQ(ConfigKey("model.d_model").type(), ConfigValueType::integer);
  EXPECT_EQ(ConfigKey("model.mlp").type(), ConfigValueType::choice);
  EXPECT_EQ(ConfigKey("device.profile").type(), ConfigValueType::text);
}

TEST(ConfigKey, RefusesValuesOfTheWrongTypeNamingTheKey) {
  Config config;
  EXPECT_EQ(message_of([](Config& c) { ConfigKey("model.d_model").set_real(c, 512.5); }, config),
            "model.d_model = 512.5: must be an integer");
  EXPECT_EQ(message_of([](Config& c) { ConfigKey("model.d_model").set_text(c, "512"); }, config),
            "model.d_model = \"512\": must be an integer");
  EXPECT_EQ(message_of([](Config& c) { ConfigKey("model.d_model").set_boolean(c, true); }, config),
            "model.d_model = true: must be an integer");
  EXPECT_EQ(
      message_of([](Config& c) { ConfigKey("model.tie_embeddings").set_integer(c, 1); }, config),
      "model.tie_embeddings = 1: must be true or false");
  EXPECT_EQ(message_of([](Config& c) { ConfigKey("mod.capacity").set_real(c, NAN); }, config),
            "mod.capacity = nan: must be a finite number");
  EXPECT_EQ(message_of([](Config& c) { ConfigKey("model.mlp").set_text(c, "gelu\""); }, config),
            "model.mlp = \"gelu\"\": must be \"gelu\", \"swiglu\" or \"geglu\"");
  EXPECT_EQ(message_of([](Config& c) { ConfigKey("device.profile").set_integer(c, 3); }, config),
            "device.profile = 3: must be a string");
  // nothing was changed by the refused values
  EXPECT_EQ(config.model.d_model, Config().model.d_model);
  EXPECT_EQ(config.model.mlp, MlpKind::gelu);
}

TEST(ConfigKey, UnknownKeysAreNamed) {
  Config config;
  const std::string typo =
      message_of([](Config&) { ConfigKey key("model.d_modle"); }, config);
  EXPECT_NE(typo.find("unknown key 'model.d_modle'"), std::string::npos) << typo;
  EXPECT_NE(typo.find("model.d_model"), std::string::npos) << typo;
  const std::string spliced =
      message_of([](Config&) { ConfigKey key("model.d_model = 1\nn_layers"); }, config);
  EXPECT_NE(spliced.find("unknown key"), std::string::npos) << spliced;
}

}  // namespace
}  // namespace modar
