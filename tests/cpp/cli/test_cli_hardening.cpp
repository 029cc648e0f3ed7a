// The CLI side of the input hardening (docs/hardening.md): bad input is exit 2
// and ONE line naming the flag the user typed, the value and what is allowed;
// nothing is half-written or overwritten; Ctrl-C stops a sweep with exit 130.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "../common/cli_run.hpp"

namespace {

using Result = modar_test::CliResult;
using modar_test::slurp;

std::string temp_path(const std::string& name) {
  return modar_test::temp_path_for("cli_hardening_", name);
}

Result run(const std::string& arguments) {
  static int calls = 0;
  return modar_test::run_cli(temp_path("run" + std::to_string(++calls)), "", arguments);
}

std::string example(const std::string& name) {
  return std::string(MODAR_SOURCE_DIR) + "/examples/configs/" + name;
}

int count_lines(const std::string& text) {
  int lines = 0;
  for (char c : text) {
    lines += c == '\n';
  }
  return lines;
}

void expect_bad_input(const std::string& arguments, std::initializer_list<const char*> fragments,
                      std::initializer_list<const char*> absent = {}) {
  const Result r = run(arguments);
  SCOPED_TRACE(arguments.substr(0, 200) + " -> " + r.err.substr(0, 600));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(count_lines(r.err), 1);
  EXPECT_TRUE(r.out.empty());
  for (const char* fragment : fragments) {
    EXPECT_NE(r.err.find(fragment), std::string::npos) << "missing: " << fragment;
  }
  for (const char* fragment : absent) {
    EXPECT_EQ(r.err.find(fragment), std::string::npos) << "present: " << fragment;
  }
}

const std::string kRuns =
    "N,D,loss\n"
    "2e7,2e9,3.35\n2e7,1e10,3.15\n1e8,2e9,3.05\n1e8,1e10,2.83\n5e8,2e9,2.92\n5e8,1e10,2.68\n"
    "1e9,5e10,2.49\n2e8,5e10,2.61\n";

std::string write(const std::string& name, const std::string& text) {
  const std::string path = temp_path(name);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// ---- crashes -------------------------------------------------------------------

TEST(CliHardening, HugeMicroBatchTimesGpusIsABadValueNotSigfpe) {
  expect_bad_input("estimate " + example("tiny.toml") +
                       " --set train.micro_batch=4294967296 --set device.count=4294967296"
                       " --set train.global_batch=8",
                   {"train.micro_batch = 4294967296: must be <= 16777216"});
  // Typed as flags, the error names the flags.
  expect_bad_input("optimal --flops 1e20 --micro-batch 4294967296 --gpus 4294967296",
                   {"--micro-batch = 4294967296: must be <= 16777216"}, {"train.micro_batch"});
  expect_bad_input("optimal --flops 1e20 --gpus 4294967296",
                   {"--gpus = 4294967296: must be <= 16777216"}, {"device.count"});
}

// ---- data loss -----------------------------------------------------------------

TEST(CliHardening, FitNeverOverwritesItsInput) {
  const std::string runs = write("runs.csv", kRuns);
  expect_bad_input("fit " + runs + " --output " + runs, {"--output", "is the runs file", "same file"});
  EXPECT_EQ(slurp(runs), kRuns);
  const std::string link = temp_path("link.csv");
  const std::string hard = temp_path("hard.csv");
  std::remove(link.c_str());
  std::remove(hard.c_str());
  ASSERT_EQ(::symlink(runs.c_str(), link.c_str()), 0);
  ASSERT_EQ(::link(runs.c_str(), hard.c_str()), 0);
  expect_bad_input("fit " + runs + " --output " + link, {"same file"});
  expect_bad_input("fit " + link + " --output " + hard, {"same file"});
  EXPECT_EQ(slurp(runs), kRuns);
  expect_bad_input("fit " + runs + " --output " + testing::TempDir(), {"is a directory"});
  // A good fit writes its TOML and nothing else.
  const std::string fit = temp_path("runs.fit.toml");
  const Result ok = run("fit " + runs + " --bootstrap 0 --output " + fit);
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(slurp(fit).find("alpha = "), std::string::npos);
  EXPECT_EQ(slurp(runs), kRuns);
  for (const std::string& path : {runs, link, hard, fit}) {
    std::remove(path.c_str());
  }
}

// ---- exit 0 with nonsense ----------------------------------------------------------

TEST(CliHardening, ImplausibleFitFailsAndWritesNothing) {
  // Loss rising with N and D: no law with alpha, beta > 0 fits.
  std::string csv = "N,D,loss\n";
  for (const char* n : {"1e7", "1e8", "1e9"}) {
    for (const char* d : {"1e9", "1e10", "1e11"}) {
      csv += std::string(n) + "," + d + "," + std::to_string(1.0 + 0.1 * std::stod(n) / 1e9 +
                                                                   0.1 * std::stod(d) / 1e11) +
             "\n";
    }
  }
  const std::string runs = write("rising.csv", csv);
  const std::string fit = temp_path("rising.fit.toml");
  std::remove(fit.c_str());
  // (--quiet: the fit's progress line would come before the error on stderr)
  expect_bad_input("fit " + runs + " --bootstrap 0 --quiet --output " + fit,
                   {"the fitted law: fit.", "must be", "do not determine"});
  struct stat info {};
  EXPECT_NE(::stat(fit.c_str(), &info), 0) << "a fit file was written";
  std::remove(runs.c_str());
}

TEST(CliHardening, SweepWithNoRowsSaysWhy) {
  expect_bad_input("sweep --flops 1e10 --no-time",
                   {"--flops = 1e+10 (arch baseline)", "no row", "budgets of about"});
  expect_bad_input("sweep --flops 1e40 --no-time", {"--flops = 1e+40", "<= 1e+35"});
  expect_bad_input("sweep --flops 1e20 --arch mod --every 1000 --no-time",
                   {"--every = 1000", "shape search stops at n_layers = 256",
                    "allowed: --every in [1, 256]"});
  expect_bad_input("sweep --flops 1e20 --arch dar --block-layers 1000 --no-time",
                   {"--block-layers = 1000", "allowed: --block-layers in [1, 256]"});
  // Some curves with rows, one without: the rows plus a note on stderr.
  const Result mixed = run("sweep --flops 1e10,1e20 --no-time");
  EXPECT_EQ(mixed.exit_code, 0) << mixed.err;
  EXPECT_GT(count_lines(mixed.out), 2);
  EXPECT_NE(mixed.err.find("modar sweep: note: --flops = 1e+10"), std::string::npos) << mixed.err;
}

TEST(CliHardening, ModRoutingNoLayerIsRefused) {
  expect_bad_input("estimate " + example("tiny.toml") +
                       " --set model.n_layers=2 --set mod.every=1000 --set mod.offset=2",
                   {"mod.every = 1000: routes 0 of model.n_layers = 2 layers"});
}

// ---- accepted or truncated input -----------------------------------------------------

TEST(CliHardening, NonRegularConfigFilesAreRefused) {
  expect_bad_input("estimate " + testing::TempDir(), {"is a directory"});
  expect_bad_input("estimate /proc/self/mem", {"/proc/self/mem"});
  expect_bad_input("estimate /dev/zero", {"not a regular file"});
  // Bytes that are not UTF-8: the error names the file.
  const std::string binary = write("binary.toml", "[model]\nd_model = \"\xff\xfe\"\n");
  expect_bad_input("estimate " + binary, {binary.c_str()});
  std::remove(binary.c_str());
  expect_bad_input("sweep --flops 1e20 --output " + testing::TempDir(), {"--output", "is a directory"});
}

TEST(CliHardening, IntegersAreRangeCheckedBeforeNarrowing) {
  const std::string runs = write("narrow.csv", kRuns);
  expect_bad_input("fit " + runs + " --bootstrap 4294967297",
                   {"--bootstrap = 4294967297: must be an integer in [0, 100000]"});
  std::remove(runs.c_str());
}

TEST(CliHardening, OneNumberGrammar) {
  expect_bad_input("optimal --flops 1e20 --eps mod=0x1p-1", {"--eps mod=0x1p-1", "[0.25, 1.5]"});
  const std::string runs = write("hex.csv", kRuns + "0x10,2e9,3.0\n");
  expect_bad_input("fit " + runs, {"column 'N' = '0x10'"});
  std::remove(runs.c_str());
}

// ---- valid input rejected -------------------------------------------------------------

// Issue 24: an efficiency prior has a meaningful range, [0.25, 1.5]
// (docs/planner.md "Architecture priors"); 1e-300 and 1e-6 are refused with
// it, one line, exit 2; the range's ends are accepted.
TEST(CliHardening, MeaninglessEpsIsRefusedWithItsRange) {
  expect_bad_input("optimal --flops 1e20 --eps mod=1e-300",
                   {"--eps mod=1e-300", "must be in [0.25, 1.5]"});
  expect_bad_input("optimal --flops 1e20 --arch baseline,dar --eps dar=1e-6",
                   {"--eps dar=1e-06", "must be in [0.25, 1.5]"});
  for (const char* eps : {"0.25", "1.5"}) {
    const Result ok = run(std::string("optimal --flops 1e20 --arch baseline,mod --eps mod=") + eps);
    EXPECT_EQ(ok.exit_code, 0) << eps << ": " << ok.err;
  }
}

TEST(CliHardening, ValidInputIsAccepted) {
  const Result dense_one_layer =
      run("estimate " + example("tiny.toml") + " --set model.n_layers=1 --set dar.variant=none");
  EXPECT_EQ(dense_one_layer.exit_code, 0) << dense_one_layer.err;
  const Result aspect = run("optimal --flops 1e20 --arch baseline --aspect-max 1e20");
  EXPECT_EQ(aspect.exit_code, 0) << aspect.err;
  const std::string runs = write("bom.csv", "\xEF\xBB\xBF\"N\",\"D\",\"loss\"\n" + kRuns.substr(9));
  const std::string fit = temp_path("bom.fit.toml");
  const Result bom = run("fit " + runs + " --bootstrap 0 --output " + fit);
  EXPECT_EQ(bom.exit_code, 0) << bom.err;
  std::remove(runs.c_str());
  std::remove(fit.c_str());
}

// ---- messages ---------------------------------------------------------------------------

TEST(CliHardening, MessagesAreOneShortLine) {
  expect_bad_input("optimal", {"modar optimal: error: no budget"}, {"error: modar optimal:"});
  expect_bad_input("sweep", {"modar sweep: error: --flops: missing"}, {"error: modar sweep:"});
  // A raw newline in a value is escaped, not echoed.
  expect_bad_input("estimate " + example("tiny.toml") + " --set \"model.mlp=$(printf 'relu\\nx')\"",
                   {"model.mlp = relu\\nx: must be"});
  // A 100,000-character key: one line of bounded length.
  const Result r = run("estimate " + example("tiny.toml") + " --set " + std::string(100000, 'k') +
                       "=1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(count_lines(r.err), 1);
  EXPECT_LT(r.err.size(), 500u);
  // A profile name longer than a file name: a bad value (exit 2), not "internal error".
  expect_bad_input("estimate " + example("tiny.toml") + " --profile " + std::string(300, 'p'),
                   {"--profile", "no such profile"}, {"internal error", "device.profile"});
}

TEST(CliHardening, MeasuredProfileOfAnotherDtypeIsRefused) {
  expect_bad_input("estimate " + example("tiny.toml") +
                       " --profile cpu-measured-quick --set train.dtype=bf16",
                   {"train.dtype = bf16", "measured only fp32 ops"}, {"device.profile"});
  const Result fp32 = run("estimate " + example("tiny.toml") + " --profile cpu-measured-quick");
  EXPECT_EQ(fp32.exit_code, 0) << fp32.err;
  EXPECT_NE(fp32.out.find("measured op table"), std::string::npos);
}

// ---- Ctrl-C ----------------------------------------------------------------------------

// A sweep far longer than a second, interrupted 0.3 s into its work: it stops
// within a few seconds with exit 130, one line, no --output file.
TEST(CliHardening, CtrlCStopsASweepWithNothingWritten) {
  const std::string out_file = temp_path("sweep.csv");
  const std::string err_file = temp_path("sweep.err");
  std::remove(out_file.c_str());
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::freopen(err_file.c_str(), "w", stderr);
    ::execl(MODAR_CLI_PATH, "modar", "sweep", "--flops",
            "1e17,3e17,1e18,3e18,1e19,3e19,1e20,3e20,1e21,3e21,1e22,3e22,1e23", "--arch",
            "baseline,mod,dar,mod+dar", "--capacity", "0.0625,0.125,0.25,0.5", "--every", "1,2,3,4",
            "--block-layers", "1,2,3,4,6,8", "--output", out_file.c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Wait until the sweep has installed its SIGINT handler (SigCgt bit 2 in
  // /proc/PID/status), so a loaded machine's slow start-up cannot make the
  // default action kill it; then let it work a moment.
  const auto started = std::chrono::steady_clock::now();
  while (true) {
    std::ifstream status_file("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    bool caught = false;
    while (std::getline(status_file, line)) {
      if (line.rfind("SigCgt:", 0) == 0) {
        caught = (std::stoull(line.substr(7), nullptr, 16) & (1ull << (SIGINT - 1))) != 0;
      }
    }
    if (caught) {
      break;
    }
    if (std::chrono::steady_clock::now() - started > std::chrono::seconds(60)) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      FAIL() << "the sweep never installed a SIGINT handler";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(::kill(pid, SIGINT), 0);
  const auto signalled = std::chrono::steady_clock::now();
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() - signalled > std::chrono::seconds(30)) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      FAIL() << "the sweep ignored Ctrl-C for 30 s";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - signalled).count();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
  EXPECT_LT(seconds, 5.0);  // between candidates: milliseconds even on a loaded machine
  const std::string err = slurp(err_file);
  EXPECT_EQ(count_lines(err), 1) << err;
  EXPECT_NE(err.find("interrupted (Ctrl-C)"), std::string::npos) << err;
  struct stat info {};
  EXPECT_NE(::stat(out_file.c_str(), &info), 0) << "a half sweep was written";
  std::remove(err_file.c_str());
}

}  // namespace
