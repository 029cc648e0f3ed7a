// `modar validate --parallel` at the command line: misuse is exit 2 with one
// line naming the flag, the value and what is allowed (the multi-process run
// itself is tested under mpirun by parallel.validate_mpi_np2).
#include <gtest/gtest.h>

#include <string>

#include "../common/cli_run.hpp"

namespace {

modar_test::CliResult run(const std::string& arguments) {
  return modar_test::run_cli_numbered("cli_vpar_run",
                                      "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 ", arguments);
}

void expect_one_line_error(const modar_test::CliResult& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "not one line: " << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

const std::string kProfile = std::string(MODAR_SOURCE_DIR) + "/profiles/cpu-comm.toml";

TEST(CliValidateParallel, WithoutMpirunItSaysHowToRunIt) {
  expect_one_line_error(run("validate --parallel --profile " + kProfile),
                        "--parallel: run under mpirun with 2 or 4 ranks");
}

TEST(CliValidateParallel, FlagsThatDoNotApplyAreRefusedByName) {
  expect_one_line_error(run("validate --parallel --threads 2 --profile " + kProfile),
                        "--threads: not used with --parallel");
  expect_one_line_error(run("validate --parallel --clock wall --profile " + kProfile),
                        "--clock: not used with --parallel");
  expect_one_line_error(run("validate --parallel --backend cuda --profile " + kProfile),
                        "--backend cuda: --parallel runs on the cpu backend only");
  expect_one_line_error(run("validate --cases dp2-zero0-dense --profile " + kProfile),
                        "--cases: only used with --parallel");
  expect_one_line_error(run("validate --parallel"), "--profile is missing");
}

}  // namespace
