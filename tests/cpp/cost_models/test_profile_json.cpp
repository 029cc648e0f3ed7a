// Device profiles (embedded, parse, atomic save).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "modar/base/errors.hpp"
#include "modar/base/json.hpp"
#include "modar/config.hpp"
#include "modar/profile.hpp"

namespace modar {
namespace {

TEST(Profile, EmbeddedProfilesLoadFromAnyDirectory) {
  const std::string here = std::filesystem::current_path().string();
  ASSERT_EQ(::chdir("/"), 0);
  const DeviceProfile h200 = load_profile("h200");
  ASSERT_EQ(::chdir(here.c_str()), 0);
  EXPECT_EQ(h200.name, "h200");
  EXPECT_FALSE(h200.measured);
  EXPECT_EQ(h200.ceilings.peak_flops_bf16, 989e12);  // datasheet, profiles/README.md
  EXPECT_EQ(h200.ceilings.memory_bandwidth, 4.8e12);
  // The GPU kernel model replaces the achievable ceilings (docs/kernel_model.md).
  EXPECT_EQ(h200.ceilings.achievable_flops_bf16, 0.0);
  EXPECT_EQ(h200.kernel.sm_count, 132);
  EXPECT_NEAR(h200.kernel.memory_efficiency, 4.3 / 4.8, 1e-3);  // the 4.3 TB/s device copy
  EXPECT_FALSE(h200.provenance.at("source").empty());
  const DeviceProfile cpu = load_profile("cpu-generic");
  EXPECT_EQ(cpu.backend, "cpu");
  EXPECT_FALSE(cpu.measured);
  const auto names = embedded_profile_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "h200"), names.end());
}

TEST(Profile, UnknownNameSuggests) {
  try {
    load_profile("h20");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'h200'"), std::string::npos);
  }
  EXPECT_THROW(load_profile("/nonexistent/p.toml"), FileError);
}

TEST(Profile, SaveAtomicallyRoundTrips) {
  DeviceProfile p = load_profile("h200");
  p.name = "roundtrip";
  p.measured = true;
  OpMeasurement m;
  m.shape.kind = OpKind::attention;
  m.shape.dims = {2, 16, 4, 1024, 1024, 128, 1};
  m.pass = Pass::backward;
  m.median_s = 1.25e-4;
  m.spread = 0.03;
  m.repeats = 20;
  p.measurements.push_back(m);
  const std::string path = testing::TempDir() + "/modar_profile_test.toml";
  save_profile_atomically(p, path);
  const DeviceProfile back = load_profile(path);
  EXPECT_EQ(back.name, "roundtrip");
  EXPECT_TRUE(back.measured);
  EXPECT_EQ(back.ceilings.peak_flops_bf16, p.ceilings.peak_flops_bf16);
  ASSERT_EQ(back.measurements.size(), 1u);
  EXPECT_EQ(back.measurements[0].shape.dims, m.shape.dims);
  EXPECT_EQ(back.measurements[0].pass, Pass::backward);
  EXPECT_EQ(back.measurements[0].median_s, 1.25e-4);
  EXPECT_EQ(back.provenance, p.provenance);
  // No temporary left behind.
  for (const auto& entry : std::filesystem::directory_iterator(testing::TempDir())) {
    EXPECT_EQ(entry.path().filename().string().find("modar_profile_test.toml.tmp"),
              std::string::npos);
  }
  EXPECT_THROW(save_profile_atomically(p, "/nonexistent-dir/p.toml"), FileError);
}

TEST(Profile, BadProfilesNameTheField) {
  const std::string base =
      "name = \"x\"\n[ceilings]\npeak_flops_bf16 = 1e12\npeak_flops_fp32 = 1e12\n"
      "memory_bandwidth = 1e12\nmemory_bytes = 1e9\n";
  EXPECT_NO_THROW(parse_profile_toml(base, "p.toml"));
  try {
    parse_profile_toml(
        base + "[[measurements]]\nkind = \"gemm\"\ndims = [1, 2, 3]\nmedian_s = 1e-3\n", "p.toml");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("measurements[0].dims"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_profile_toml(base + "[[measurements]]\nkind = \"conv\"\ndims = [1]\n"
                                         "median_s = 1e-3\n",
                                  "p.toml"),
               ConfigError);
  EXPECT_THROW(parse_profile_toml("name = \"x\"\n", "p.toml"), ConfigError);  // no [ceilings]
  EXPECT_THROW(parse_profile_toml("name = ", "p.toml"), FileError);
}

// docs/cost_model.md / issue 5: a measured H200 profile replaces the datasheet one as the
// default once it ships; until then the default is the datasheet "h200".
TEST(Profile, DefaultIsMeasuredH200WhenEmbedded) {
  const auto names = embedded_profile_names();
  const bool has_measured = std::find(names.begin(), names.end(), "h200-measured") != names.end();
  EXPECT_EQ(default_profile_name(), has_measured ? "h200-measured" : "h200");
  EXPECT_EQ(Config{}.device.profile, default_profile_name());
  EXPECT_NO_THROW(load_profile(default_profile_name()));
}

}  // namespace
}  // namespace modar
