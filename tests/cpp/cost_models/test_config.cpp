// Configuration: TOML reading, --set overrides, validation messages, round trip.
#include <gtest/gtest.h>

#include <fstream>

#include "../common/config_error_of.hpp"
#include "modar/base/errors.hpp"
#include "modar/base/text.hpp"
#include "modar/config.hpp"

namespace modar {
namespace {

using modar_test::error_of;

TEST(Config, ParsesEverySection) {
  const Config c = parse_config_toml(R"(
[model]
d_model = 1024
n_layers = 12
n_heads = 8
n_kv_heads = 2
mlp = "swiglu"
vocab_size = 32000
tie_embeddings = true
seq_len = 4096
[mod]
capacity = 0.125
every = 2
offset = 1
router_scale = "sigmoid"
causal_router = "predictor"
predictor_hidden = 128
[dar]
variant = "dar"
block_layers = 3
streams = 2
[train]
micro_batch = 4
global_batch = 64
dtype = "fp32"
recompute = "selective"
[device]
profile = "cpu-generic"
count = 2
[counting]
attention_flops = "flash"
)");
  EXPECT_EQ(c.model.d_model, 1024);
  EXPECT_EQ(c.model.resolved_kv_heads(), 2);
  EXPECT_EQ(c.model.mlp, MlpKind::swiglu);
  EXPECT_TRUE(c.model.tie_embeddings);
  EXPECT_EQ(c.mod.capacity, 0.125);
  EXPECT_EQ(c.mod.router_scale, RouterScale::sigmoid);
  EXPECT_EQ(c.mod.causal_router, CausalRouter::predictor);
  EXPECT_EQ(c.dar.variant, DarVariant::dar);
  EXPECT_EQ(c.dar.block_layers, 3);
  EXPECT_EQ(c.train.dtype, DType::fp32);
  EXPECT_EQ(c.train.recompute, Recompute::selective);
  EXPECT_EQ(c.device.profile, "cpu-generic");
  EXPECT_EQ(c.device.count, 2);
  EXPECT_EQ(c.attention_flops, AttentionFlops::flash);
  // Round trip through to_toml.
  const Config again = parse_config_toml(to_toml(c));
  EXPECT_EQ(to_toml(again), to_toml(c));
  EXPECT_EQ(again.mod.capacity, 0.125);
  EXPECT_EQ(again.model.norm_eps, c.model.norm_eps);
}

TEST(Config, UnknownKeysSuggestTheNearestValidOne) {
  EXPECT_EQ(error_of([] { parse_config_toml("[mod]\ncapcity = 0.5\n", "a.toml"); }),
            "ConfigError: unknown key 'mod.capcity' in a.toml; did you mean 'mod.capacity'?");
  EXPECT_NE(error_of([] { parse_config_toml("[modd]\ncapacity = 0.5\n"); }).find("mod.capacity"),
            std::string::npos);
  Config c;
  EXPECT_EQ(
      error_of([&] { apply_override(c, "model.nlayers=3"); }),
      "ConfigError: unknown key 'model.nlayers' in an override; did you mean 'model.n_layers'?");
}

TEST(Config, OutOfRangeValuesNameKeyValueAndAllowed) {
  auto with = [](const std::string& assignment) {
    return error_of([&] {
      Config c;
      apply_override(c, assignment);
      validate(c);
    });
  };
  EXPECT_EQ(with("mod.capacity=1.5"), "ConfigError: mod.capacity = 1.5: must be in (0, 1]");
  EXPECT_EQ(with("mod.capacity=0"), "ConfigError: mod.capacity = 0: must be in (0, 1]");
  EXPECT_EQ(with("mod.capacity=nan"), "ConfigError: mod.capacity = nan: must be a finite number");
  EXPECT_EQ(with("mod.capacity=inf"), "ConfigError: mod.capacity = inf: must be a finite number");
  EXPECT_EQ(with("mod.every=-1"), "ConfigError: mod.every = -1: must be >= 0 (0 = no MoD)");
  EXPECT_EQ(with("model.n_heads=5"),
            "ConfigError: model.n_heads = 5: must divide model.d_model = 2048 (or set model.d_head "
            "explicitly)");
  EXPECT_EQ(with("model.n_kv_heads=3"),
            "ConfigError: model.n_kv_heads = 3: must divide model.n_heads = 16");
  EXPECT_EQ(with("model.d_model=-8"),
            "ConfigError: model.d_model = -8: must be a positive integer");
  EXPECT_EQ(with("model.n_layers=2.5"), "ConfigError: model.n_layers = 2.5: must be an integer");
  EXPECT_EQ(with("model.mlp=relu"),
            "ConfigError: model.mlp = relu: must be \"gelu\", \"swiglu\" or \"geglu\"");
  EXPECT_EQ(with("train.dtype=fp64"),
            "ConfigError: train.dtype = fp64: must be \"fp32\", \"bf16\" or \"fp16\"");
  EXPECT_EQ(with("model.tie_embeddings=yes"),
            "ConfigError: model.tie_embeddings = yes: must be true or false");
  EXPECT_EQ(with("dar.block_layers=0"),
            "ConfigError: dar.block_layers = 0: must be in [1, model.n_layers = 24]");
  EXPECT_EQ(with("mod.offset=3"), "no error");  // every = 0: offset unused
  EXPECT_EQ(with("train.global_batch=12"),
            "ConfigError: train.global_batch = 12: must be a multiple of train.micro_batch * "
            "device.count = 8");
  EXPECT_EQ(
      with("mod.capacity"),
      "ConfigError: override mod.capacity: must be section.key=value, e.g. mod.capacity=0.125");
}

TEST(Config, TomlTypeErrorsAndNaN) {
  EXPECT_EQ(error_of([] { parse_config_toml("[mod]\ncapacity = nan\n"); }),
            "ConfigError: mod.capacity = nan: must be a finite number");
  EXPECT_EQ(error_of([] { parse_config_toml("[mod]\ncapacity = \"0.5\"\n"); }),
            "ConfigError: mod.capacity = \"0.5\": must be a number");
  EXPECT_EQ(error_of([] { parse_config_toml("[model]\nn_layers = -3\n"); }),
            "ConfigError: model.n_layers = -3: must be a positive integer");
  EXPECT_EQ(error_of([] { parse_config_toml("[model]\nn_layers = 2.0\n"); }),
            "ConfigError: model.n_layers = 2.0: must be an integer");
  const std::string malformed =
      error_of([] { parse_config_toml("[model\nd_model = 3\n", "m.toml"); });
  EXPECT_EQ(malformed.rfind("FileError: m.toml:1:", 0), 0u) << malformed;
  EXPECT_NE(malformed.find("malformed TOML"), std::string::npos);
}

TEST(Config, MissingFileAndOverridesAfterTheFile) {
  EXPECT_EQ(error_of([] { load_config_file("/nonexistent/x.toml"); }),
            "FileError: config file '/nonexistent/x.toml': cannot open (missing or unreadable)");
  const std::string path = testing::TempDir() + "/modar_config_test.toml";
  {
    std::ofstream out(path);
    out << "[mod]\ncapacity = 1.5\n";
  }
  // The file alone is invalid; an override repairs it before validation.
  EXPECT_THROW(load_config_file(path), ConfigError);
  const Config c = load_config_file(path, {"mod.capacity=0.25", "mod.every=2"});
  EXPECT_EQ(c.mod.capacity, 0.25);
  EXPECT_EQ(c.mod.every, 2);
}

TEST(Config, EnumNamesAndDefaults) {
  EXPECT_STREQ(to_string(DarVariant::crossv), "crossv");
  EXPECT_STREQ(to_string(AttentionFlops::flash), "flash");
  EXPECT_EQ(dtype_bytes(DType::bf16), 2);
  EXPECT_EQ(parse_attention_flops("full", "x"), AttentionFlops::full);
  EXPECT_THROW(parse_attention_flops("half", "--attention-flops"), ConfigError);
  try {
    parse_attention_flops("half", "x");
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "x = half: must be \"causal\", \"full\" or \"flash\"");
  }
  // fp64 has a name (the runtime's reference dtype) but is no train.dtype.
  EXPECT_STREQ(to_string(DType::fp64), "fp64");
  EXPECT_STREQ(to_string(RecomputeGranularity::selective), "selective");
  EXPECT_STREQ(to_string(PipelineSchedule::one_f_one_b), "1f1b");
  ModelConfig m;
  m.d_model = 768;
  m.mlp = MlpKind::swiglu;
  EXPECT_EQ(m.resolved_d_ff(), 2048);  // 8 x 768 / 3 = 2048 exactly
  m.mlp = MlpKind::gelu;
  EXPECT_EQ(m.resolved_d_ff(), 3072);
  for (const std::string& key : config_keys()) {
    EXPECT_NE(key.find('.'), std::string::npos) << key;
  }
}

}  // namespace
}  // namespace modar
