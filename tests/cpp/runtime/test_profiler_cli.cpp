// `modar profile` / `modar validate` argument and file errors, end to end:
// exit code 2 and one line naming what is wrong.  (No profiling run: the
// quick grid takes minutes.)  Skipped when the CLI binary was not built.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>

#include "modar/profile.hpp"

namespace {

struct Result {
  int exit_code = -1;
  std::string err;
};

Result run(const std::string& arguments) {
  static int calls = 0;
  const std::string err_path = testing::TempDir() + "/modar_profiler_cli_" +
                               std::to_string(::getpid()) + "_" + std::to_string(++calls) + ".err";
  const std::string command =
      std::string(MODAR_CLI_PATH) + " " + arguments + " >/dev/null 2>" + err_path;
  const int status = std::system(command.c_str());
  Result r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(err_path);
  std::stringstream text;
  text << in.rdbuf();
  r.err = text.str();
  std::remove(err_path.c_str());
  return r;
}

int lines(const std::string& text) {
  int count = 0;
  for (char c : text)
    count += c == '\n';
  return count;
}

// A measured cpu profile with one rmsnorm measurement and this provenance.
modar::DeviceProfile one_measurement_profile(const std::string& name,
                                             std::map<std::string, std::string> provenance) {
  modar::DeviceProfile profile;
  profile.name = name;
  profile.backend = "cpu";
  profile.measured = true;
  profile.ceilings.peak_flops_bf16 = profile.ceilings.peak_flops_fp32 = 1.0;
  profile.ceilings.memory_bandwidth = profile.ceilings.memory_bytes = 1.0;
  modar::OpMeasurement m;
  m.shape.kind = modar::OpKind::rmsnorm;
  m.shape.dtype = modar::DType::fp32;
  m.shape.dims = {16, 8, 0, 0, 0, 0, 0};
  m.median_s = 1e-6;
  profile.measurements = {m};
  profile.provenance = std::move(provenance);
  return profile;
}

class ProfilerCli : public testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(MODAR_CLI_PATH)) {
      GTEST_SKIP() << "modar CLI not built: " << MODAR_CLI_PATH;
    }
  }
};

TEST_F(ProfilerCli, BadFlagsExitTwoWithOneLine) {
  for (const char* args :
       {"profile --backend cpu", "profile --backend tpu --out x.toml",
        "profile --backend cpu --out x.toml --clock sundial", "validate --backend cpu",
        "validate --profile x.toml --rounds 0", "profile --backend cpu --out x.toml --rounds 0",
        "profile --backend cpu --out x.toml --drift-tolerance -1",
        "profile --backend cpu --out x.toml --max-seconds 0",
        "profile --backend cpu --out x.toml --max-seconds soon",
        "validate --profile x.toml --repeats 0"}) {
    const Result r = run(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.err;
    EXPECT_EQ(lines(r.err), 1) << args << ": " << r.err;
  }
  EXPECT_NE(run("profile --backend cpu").err.find("--out"), std::string::npos);
  EXPECT_EQ(run("profile --help").exit_code, 0);
  EXPECT_EQ(run("validate --help").exit_code, 0);
}

TEST_F(ProfilerCli, PartialForeignAndMissingProfilesAreRefused) {
  modar::DeviceProfile profile =
      one_measurement_profile("cli-test", {{"status", "partial"}, {"measurement_count", "1"}});
  const std::string path =
      testing::TempDir() + "/modar_profiler_cli_" + std::to_string(::getpid()) + ".toml";
  modar::save_profile_atomically(profile, path);

  Result r = run("validate --profile " + path);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("partial"), std::string::npos) << r.err;

  profile.provenance["status"] = "complete";
  modar::save_profile_atomically(profile, path);
  r = run("validate --profile " + path + " --backend cuda");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("backend = \"cpu\""), std::string::npos) << r.err;

  r = run("validate --profile " + path + ".missing");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("cannot open"), std::string::npos) << r.err;
  std::remove(path.c_str());
}

// Output problems and impossible settings are refused before any measuring,
// naming the field; --dry-run shows the resolved defaults.
TEST_F(ProfilerCli, OutputAndSettingsAreCheckedUpFront) {
  const std::string dir =
      testing::TempDir() + "/modar_profiler_cli_dir_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  Result r = run("profile --backend cpu --quick --out " + dir);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("is a directory"), std::string::npos) << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
  r = run("profile --backend cpu --quick --out " + dir + "/missing/x.toml");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("does not exist"), std::string::npos) << r.err;
  r = run("profile --backend cpu --quick --threads 100000 --out " + dir + "/x.toml");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("threads = 100000"), std::string::npos) << r.err;
  r = run("profile --backend cpu --quick --threads 4294967297 --out " + dir + "/x.toml");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  std::filesystem::remove_all(dir);
}

// --dry-run estimates the run and shows what --max-seconds leaves out.
TEST_F(ProfilerCli, DryRunEstimatesTheDurationAndTheBound) {
  const std::string out =
      testing::TempDir() + "/modar_profiler_cli_bound_" + std::to_string(::getpid()) + ".toml";
  const auto dry_run = [&out](const std::string& flags) {
    const std::string command = std::string(MODAR_CLI_PATH) +
                                " profile --backend cpu --quick --kinds gemm --out " + out + " " +
                                flags + " --dry-run";
    std::FILE* pipe = ::popen(command.c_str(), "r");
    std::string json;
    char buffer[4096];
    while (pipe != nullptr && std::fgets(buffer, sizeof(buffer), pipe) != nullptr) {
      json += buffer;
    }
    EXPECT_EQ(pipe == nullptr ? -1 : ::pclose(pipe), 0) << json;
    return json;
  };
  const auto number = [](const std::string& json, const std::string& key) {
    const size_t at = json.find("\"" + key + "\": ");
    return at == std::string::npos ? -1.0 : std::stod(json.substr(at + key.size() + 4));
  };
  const std::string all = dry_run("");
  const double estimate_s = number(all, "estimated_duration_s");
  ASSERT_GT(estimate_s, 0.0) << all;
  EXPECT_DOUBLE_EQ(number(all, "points_left_out"), 0.0) << all;
  EXPECT_DOUBLE_EQ(number(all, "rounds"), 3.0) << all;
  // A bound below the ceilings' own estimate (two 2048^3 GEMMs, a copy, the
  // dispatch loop: more than 3 s) leaves every point out.  (Which points a
  // feasible bound keeps: ProfilerNoise.MaxSecondsLeavesOutTheMostExpensivePoints.)
  const std::string none = dry_run("--max-seconds 1");
  EXPECT_DOUBLE_EQ(number(none, "points_within_bound"), 0.0) << none;
  EXPECT_DOUBLE_EQ(number(none, "points_left_out"), number(none, "points")) << none;
  EXPECT_DOUBLE_EQ(number(none, "max_seconds"), 1.0) << none;
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST_F(ProfilerCli, ValidateThreadsAreBounded) {
  const modar::DeviceProfile profile = one_measurement_profile(
      "cli-threads",
      {{"status", "complete"}, {"measurement_count", "1"}, {"clock", "cpu"}, {"threads", "1"}});
  const std::string path =
      testing::TempDir() + "/modar_profiler_cli_threads_" + std::to_string(::getpid()) + ".toml";
  modar::save_profile_atomically(profile, path);
  // Previously a SIGSEGV: now one line naming the field, exit 2.
  Result r = run("validate --profile " + path + " --threads 100000");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("threads = 100000"), std::string::npos) << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
  std::remove(path.c_str());
}

}  // namespace
