// `modar estimate` on a cluster end to end (docs/cluster.md): the report's
// parallel section, the communication ops of --ops, and one-line errors for
// bad [parallel] values (exit 2).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "../common/cli_run.hpp"

namespace {

using CliRun = modar_test::CliResult;

CliRun run_cli(const std::string& arguments) {
  return modar_test::run_cli_numbered("modar_cluster_cli_", "", arguments);
}

const std::string kGpt = std::string(MODAR_SOURCE_DIR) + "/examples/configs/gpt175b.toml";

TEST(CliCluster, EstimatePrintsTheParallelSplitAndCommOps) {
  const CliRun r = run_cli("estimate " + kGpt + " --ops");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* needle :
       {"parallel    tensor 8 x pipeline 8 (interleaved, v 2) x data 16", "pipeline bubble",
        "exposed gradient reduction", "communication ops", "tp.layer", "pp.activation",
        "dp.grad", "all_reduce", "send_recv", "peak memory"}) {
    EXPECT_NE(r.out.find(needle), std::string::npos) << needle;
  }
  const CliRun json = run_cli("estimate " + kGpt + " --json");
  ASSERT_EQ(json.exit_code, 0);
  EXPECT_NE(json.out.find("\"bubble_s\""), std::string::npos);
  EXPECT_NE(json.out.find("\"exposed_comm_s\""), std::string::npos);
}

TEST(CliCluster, BadParallelValuesAreOneLineErrors) {
  const CliRun r = run_cli("estimate " + kGpt + " --set parallel.tensor=7");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("parallel.tensor = 7: must divide model.n_heads = 96"), std::string::npos)
      << r.err;
  const CliRun z = run_cli("estimate " + kGpt + " --set parallel.zero=5");
  EXPECT_EQ(z.exit_code, 2);
  EXPECT_NE(z.err.find("parallel.zero = 5"), std::string::npos) << z.err;
}

}  // namespace
