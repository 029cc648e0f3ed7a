// `modar profile --comm` at the command line: bad input is exit 2 with one
// line naming the flag and nothing written; under mpirun it writes a profile
// whose [network] the planner reads back.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "../common/cli_run.hpp"
#include "modar/profile.hpp"

namespace {

using Result = modar_test::CliResult;
using modar_test::slurp;

std::string temp_path(const std::string& name) {
  return modar_test::temp_path_for("cli_comm_", name);
}

Result run(const std::string& prefix, const std::string& arguments) {
  static int calls = 0;
  // Processes that start MPI run without LeakSanitizer in the sanitizer
  // build (cmake/modar_mpi_test.cmake says why); harmless elsewhere.
  return modar_test::run_cli(temp_path("run" + std::to_string(++calls)),
                             "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 " + prefix, arguments);
}

bool exists(const std::string& path) {
  return std::ifstream(path).good();
}

void expect_one_line_error(const Result& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "not one line: " << r.err;
}

TEST(CliProfileComm, BadFlagsAreOneLineExit2AndWriteNothing) {
  const std::string out = temp_path("bad.toml");
  expect_one_line_error(run("", "profile --comm --quick --out " + out), "--quick: not used with --comm");
  expect_one_line_error(run("", "profile --comm --collectives all_reduce,broadcast --out " + out),
                        "--collectives: 'broadcast'");
  expect_one_line_error(run("", "profile --base h200 --out " + out), "--base: only used with --comm");
  expect_one_line_error(run("", "profile --comm --group-sizes 1 --out " + out), "--group-sizes");
  expect_one_line_error(run("", "profile --comm --base no-such-profile.toml --out " + out),
                        "no-such-profile");
  expect_one_line_error(run("", "profile --comm"), "--out is missing");
  expect_one_line_error(run("", "profile --comm --arrival warm --out " + out), "--arrival");
  expect_one_line_error(run("", "profile --arrival cold --out " + out),
                        "--arrival: only used with --comm");
  expect_one_line_error(run("", "profile --comm --compute-before-ms -1 --out " + out),
                        "--compute-before-ms");
  EXPECT_FALSE(exists(out));
}

// Alone (no mpirun) the world has one rank: refused, with the way out.
TEST(CliProfileComm, OneRankIsRefusedAndTheOldFileKept) {
  const std::string out = temp_path("kept.toml");
  { std::ofstream(out) << "# not a profile\n"; }
  // --out exists and no --base: the file itself is the base; it is not a
  // profile, so the run stops before measuring and leaves it alone.
  Result r = run("", "profile --comm --out " + out);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(slurp(out), "# not a profile\n");
  r = run("", "profile --comm --base cpu-generic --out " + out);
  expect_one_line_error(r, "mpirun");
  EXPECT_EQ(slurp(out), "# not a profile\n");
  std::remove(out.c_str());
}

TEST(CliProfileComm, UnderMpirunWritesTablesThePlannerReads) {
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "no mpirun on PATH (Open MPI: libopenmpi-dev openmpi-bin)";
  }
  const std::string out = temp_path("two.toml");
  const Result r = run("OMP_NUM_THREADS=1 mpirun -x ASAN_OPTIONS --allow-run-as-root --oversubscribe --bind-to none "
                       "--mca btl self,vader -np 2 ",
                       "profile --comm --backend cpu --collectives all_reduce,send_recv "
                       "--max-bytes 4096 --budget 0.01 --quiet --out " + out);
  if (r.err.find("no MPI") != std::string::npos) {
    GTEST_SKIP() << "this build has no MPI";
  }
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Rank 0 alone prints: one header line, 2 kinds x 1 group x 2 sizes, one "wrote".
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1 + 4 + 1) << r.out;
  const modar::DeviceProfile profile = modar::load_profile(out);
  EXPECT_EQ(profile.name, "cli_comm_" + std::to_string(::getpid()) + "_two");
  ASSERT_TRUE(profile.network.present);
  EXPECT_EQ(profile.network.gpus_per_node, 2);
  ASSERT_EQ(profile.network.intra_node.tables.size(), 2u);
  for (const modar::CollectiveTable& t : profile.network.intra_node.tables) {
    EXPECT_EQ(t.ranks, 2);
    EXPECT_EQ(t.sizes_bytes, (std::vector<double>{1024.0, 4096.0}));
  }
  EXPECT_EQ(profile.provenance.at("network_ranks"), "2");
  EXPECT_FALSE(exists(out + ".tmp"));
  std::remove(out.c_str());
}

}  // namespace
