// `modar layout CONFIG --gpus N` end to end (docs/cluster.md "modar layout"):
// the ranked table with one global batch for every layout, the JSON document,
// and one-line errors (exit 2) for a missing or bad flag.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "../common/cli_run.hpp"

namespace {

const std::string kLlama = std::string(MODAR_SOURCE_DIR) + "/examples/configs/llama2_7b.toml";

modar_test::CliResult layout(const std::string& arguments) {
  return modar_test::run_cli_numbered("layout", "", "layout " + arguments);
}

TEST(CliLayout, RanksTensorPipelineAndZeroLayoutsOfLlama2AtOneGlobalBatch) {
  const modar_test::CliResult r = layout(kLlama + " --gpus 8 --top 5000");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // One global batch for every layout: 1024 sequences of 4096 (the default).
  EXPECT_NE(r.out.find("global batch 1024 sequences (4.19M tokens"), std::string::npos) << r.out;
  for (const char* needle : {"TP 1 x PP 1 x DP 8, ZeRO 1", "TP 2 (SP) x PP 1 x DP 4",
                             "TP 8 (SP) x PP 1 x DP 1, ZeRO 0", "x PP 2 x DP", "ZeRO 3",
                             "rank", "MFU", "GiB/GPU"}) {
    EXPECT_NE(r.out.find(needle), std::string::npos) << needle;
  }
  const modar_test::CliResult json = layout(kLlama + " --gpus 8 --json");
  ASSERT_EQ(json.exit_code, 0) << json.err;
  for (const char* needle : {"\"global_batch\": 1024", "\"fitting\"", "\"not_fitting\"",
                             "\"binding\"", "\"mfu\"", "\"peak_bytes\"", "\"context\""}) {
    EXPECT_NE(json.out.find(needle), std::string::npos) << needle;
  }
}

TEST(CliLayout, BadFlagsAreOneLineErrors) {
  for (const auto& [arguments, needle] :
       {std::pair<std::string, std::string>{kLlama, "--gpus: required"},
        {kLlama + " --gpus 0", "--gpus"},
        {kLlama + " --gpus 8 --global-batch 0", "--global-batch"},
        {kLlama + " --gpus 8 --gpus-per-node 2000", "--gpus-per-node"},
        {kLlama + " --gpus 8 --set model.n_heads=33", "model.n_heads"},
        {"/nonexistent.toml --gpus 8", "nonexistent"}}) {
    const modar_test::CliResult r = layout(arguments);
    EXPECT_EQ(r.exit_code, 2) << arguments << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

}  // namespace
