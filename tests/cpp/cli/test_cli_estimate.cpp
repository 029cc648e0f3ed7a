// `modar estimate` end to end: runs the built binary (MODAR_CLI_PATH) and
// checks exit codes, the one-line errors, and the report / JSON.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "../common/cli_run.hpp"

namespace {

using Result = modar_test::CliResult;

Result run(const std::string& arguments) {
  return modar_test::run_cli_numbered("modar_cli_", "", arguments);
}

std::string example(const std::string& name) {
  return std::string(MODAR_SOURCE_DIR) + "/examples/configs/" + name;
}

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = testing::TempDir() + "/" + std::to_string(::getpid()) + "_" + name;
  std::ofstream(path) << text;
  return path;
}

int count_lines(const std::string& text) {
  int lines = 0;
  for (char c : text) {
    lines += c == '\n';
  }
  return lines;
}

// One line on stderr, exit code 2, containing every expected fragment.
void expect_bad_input(const std::string& arguments, std::initializer_list<const char*> fragments) {
  const Result r = run(arguments);
  SCOPED_TRACE(arguments + " -> " + r.err);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(count_lines(r.err), 1);
  EXPECT_TRUE(r.out.empty());
  for (const char* fragment : fragments) {
    EXPECT_NE(r.err.find(fragment), std::string::npos) << "missing: " << fragment;
  }
}

TEST(CliEstimate, ReportOnEveryExample) {
  for (const char* name :
       {"dense.toml", "mod_best.toml", "dar_block.toml", "mod_dar.toml", "attnres_block.toml",
        "tiny.toml", "tiny_mod_dar.toml", "narayanan_fixture.toml"}) {
    const Result r = run("estimate " + example(name));
    SCOPED_TRACE(name);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("conventions"), std::string::npos);
    EXPECT_NE(r.out.find("peak"), std::string::npos);
    EXPECT_NE(r.out.find("MFU"), std::string::npos);
  }
}

TEST(CliEstimate, NarayananFixtureFromTheCommandLine) {
  const Result r = run("estimate " + example("narayanan_fixture.toml"));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("train 9.0739e+09"), std::string::npos) << r.out;
  // Switching the convention on the command line changes the count.
  const Result causal =
      run("estimate " + example("narayanan_fixture.toml") + " --attention-flops causal");
  EXPECT_EQ(causal.out.find("train 9.0739e+09"), std::string::npos);
}

TEST(CliEstimate, JsonHasTheDocumentedKeys) {
  const Result r = run("estimate " + example("mod_dar.toml") + " --json --set mod.capacity=0.25");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* key : {"\"params\"",          "\"total\"",          "\"non_embedding\"",
                          "\"flop_active\"",     "\"flops\"",          "\"forward_per_token\"",
                          "\"train_per_token\"", "\"train_per_step\"", "\"memory\"",
                          "\"peak_bytes\"",      "\"breakdown\"",      "\"weights\"",
                          "\"gradients\"",       "\"optimizer\"",      "\"activations\"",
                          "\"dar_bank\"",        "\"kv_cache\"",       "\"time\"",
                          "\"step_s\"",          "\"tokens_per_s\"",   "\"mfu\"",
                          "\"conventions\"",     "\"capacity\": 0.25"}) {
    EXPECT_NE(r.out.find(key), std::string::npos) << key;
  }
}

TEST(CliEstimate, DecodeStepAndOps) {
  const Result r = run("estimate " + example("mod_best.toml") + " --step decode --ops");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("kv cache"), std::string::npos);
  EXPECT_NE(r.out.find("mod.router"), std::string::npos);
  EXPECT_EQ(run("estimate --help").exit_code, 0);
}

TEST(CliEstimate, BadInputIsOneLineAndExitCodeTwo) {
  const std::string tiny = example("tiny.toml");
  expect_bad_input("estimate /nonexistent/config.toml",
                   {"/nonexistent/config.toml", "cannot open"});
  expect_bad_input("estimate " + write_temp("malformed.toml", "[model\nd_model = 3\n"),
                   {"malformed.toml:1:", "malformed TOML"});
  expect_bad_input("estimate " + write_temp("unknown.toml", "[mod]\ncapcity = 0.5\n"),
                   {"mod.capcity", "did you mean 'mod.capacity'"});
  expect_bad_input("estimate " + tiny + " --set mod.capacity=0", {"mod.capacity = 0", "(0, 1]"});
  expect_bad_input("estimate " + tiny + " --set mod.capacity=1.5",
                   {"mod.capacity = 1.5", "(0, 1]"});
  expect_bad_input("estimate " + tiny + " --set model.n_heads=5",
                   {"model.n_heads = 5", "must divide model.d_model = 64"});
  expect_bad_input("estimate " + tiny + " --set model.n_kv_heads=3",
                   {"model.n_kv_heads = 3", "must divide model.n_heads = 4"});
  expect_bad_input("estimate " + tiny + " --set model.d_model=-64",
                   {"model.d_model = -64", "positive integer"});
  expect_bad_input("estimate " + tiny + " --set mod.capacity=nan",
                   {"mod.capacity = nan", "finite number"});
  expect_bad_input("estimate " + write_temp("nan.toml", "[mod]\ncapacity = nan\n"),
                   {"mod.capacity = nan", "finite number"});
  expect_bad_input("estimate " + tiny + " --set mod.every=-1", {"mod.every = -1", ">= 0"});
  expect_bad_input("estimate " + tiny + " --jsn", {"--jsn", "did you mean '--json'"});
  expect_bad_input("estimate " + tiny + " --attention-flops half",
                   {"--attention-flops = half", "causal"});
  expect_bad_input("estimate " + tiny + " --profile h20", {"h20", "did you mean 'h200'"});
  expect_bad_input("estimate " + tiny + " --set model.n_layers=abc",
                   {"model.n_layers = abc", "integer"});
  expect_bad_input("estimate", {"missing CONFIG"});
  expect_bad_input("estimate " + tiny + " extra.toml", {"unexpected argument 'extra.toml'"});
}

TEST(CliEstimate, NoCrashOnGarbageFiles) {
  for (const char* text :
       {"", "\x01\x02\xff\xfe", "[[model]]\n", "model = 3\n", "[model]\nd_model = 1e400\n",
        "[model]\nd_model = 99999999999999999999\n", "[device]\nprofile = 3\n"}) {
    const Result r = run("estimate " + write_temp("garbage.toml", text));
    SCOPED_TRACE(text);
    EXPECT_TRUE(r.exit_code == 0 || r.exit_code == 2) << r.exit_code << " " << r.err;
    if (r.exit_code == 2) {
      EXPECT_EQ(count_lines(r.err), 1) << r.err;
    }
  }
}

}  // namespace
