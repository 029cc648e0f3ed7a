// Ctrl-C for every long command: the run is started, allowed to get going
// (its first progress line on stderr proves the computation runs with its
// interrupt handler installed), then sent SIGINT as a terminal sends it; it
// must exit 130 with one "interrupted" line and write nothing (no output
// file, no temporary beside it).  Under mpirun the signal goes to the ranks
// (the library path: the ranks agree on it at the next sample or round, all
// exit 130 and mpirun reports 130); docs/planner.md "Progress and Ctrl-C"
// says what a terminal's Ctrl-C to mpirun itself does.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "../common/cli_run.hpp"

namespace {

using Clock = std::chrono::steady_clock;

std::string temp_path(const std::string& name) {
  return modar_test::temp_path_for("cli_int_", name);
}

bool exists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0;
}

// A file of the directory of `path` whose name starts with path's name plus
// `suffix` (an atomic write's temporary, "<path>.tmp.<pid>").
bool leftover(const std::string& path, const std::string& suffix) {
  const size_t slash = path.rfind('/');
  const std::string dir = path.substr(0, slash);
  const std::string stem = path.substr(slash + 1) + suffix;
  DIR* listing = ::opendir(dir.c_str());
  bool found = false;
  while (listing != nullptr && !found) {
    const dirent* entry = ::readdir(listing);
    if (entry == nullptr) {
      break;
    }
    found = std::string(entry->d_name).rfind(stem, 0) == 0;
  }
  if (listing != nullptr) {
    ::closedir(listing);
  }
  return found;
}

// The children of `parent` (the ranks mpirun started).
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> pids;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) {
    return pids;
  }
  while (const dirent* entry = ::readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(entry->d_name));
    if (pid <= 0) {
      continue;
    }
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');
    if (close == std::string::npos) {
      continue;
    }
    char state = 0;
    int ppid = 0;
    if (std::sscanf(line.c_str() + close + 1, " %c %d", &state, &ppid) == 2 && ppid == parent) {
      pids.push_back(pid);
    }
  }
  ::closedir(proc);
  return pids;
}

// How long a command may take to print its ready text: generous, as a
// loaded CI host slows everything (the signal is sent only once the text
// proves the run is under way; a command that never prints it fails as such).
constexpr int kReadySeconds = 300;

struct Interrupted {
  bool started = false;      // the ready text appeared before the run ended
  bool never_ready = false;  // still running without it after kReadySeconds (killed)
  bool exited = false;
  int code = -1;
  std::string err;
};

// Run `command` (a shell command line, stdout to `out_file`), wait for
// `ready` on its stderr, then send SIGINT: to the process group of the
// command (a terminal's Ctrl-C), or with `to_ranks` to the children of the
// command's process (mpirun's ranks).
Interrupted interrupt_when_ready(const std::string& command, const std::string& ready,
                                 bool to_ranks = false) {
  const std::string err_path = temp_path("stderr.txt");
  std::remove(err_path.c_str());
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(err, STDERR_FILENO);
    const int null = ::open("/dev/null", O_RDONLY);
    ::dup2(null, STDIN_FILENO);
    ::execl("/bin/sh", "sh", "-c", ("exec " + command).c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  Interrupted result;
  int status = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(kReadySeconds);
  bool done = false;
  while (!result.started) {
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      done = true;
      break;
    }
    if (modar_test::slurp(err_path).find(ready) != std::string::npos) {
      result.started = true;
      break;
    }
    if (Clock::now() >= deadline) {
      // Never SIGINT a run that has not shown it is under way: that would
      // test nothing (or fail as "finished early" when the signal wins).
      result.never_ready = true;
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      done = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!done) {
    if (to_ranks) {
      for (const pid_t rank : children_of(pid)) {
        ::kill(rank, SIGINT);
      }
    } else {
      ::kill(-pid, SIGINT);
    }
    const auto stop_deadline = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < stop_deadline && ::waitpid(pid, &status, WNOHANG) != pid) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (Clock::now() >= stop_deadline) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
    }
  }
  result.exited = WIFEXITED(status);
  result.code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  result.err = modar_test::slurp(err_path);
  std::remove(err_path.c_str());
  return result;
}

void expect_interrupted(const Interrupted& r, const std::string& what) {
  ASSERT_FALSE(r.never_ready) << what << ": no ready text on stderr within " << kReadySeconds
                              << " s\n"
                              << r.err;
  ASSERT_TRUE(r.started) << what << ": finished (code " << r.code
                         << ") before it could be interrupted; give it more work\n"
                         << r.err;
  EXPECT_TRUE(r.exited) << what << ": killed by signal " << -r.code;
  EXPECT_EQ(r.code, 130) << what << "\n" << r.err;
  EXPECT_NE(r.err.find("interrupted"), std::string::npos) << what << "\n" << r.err;
}

// An interrupted run printed nothing to `out` (its stdout); removes `out`.
void expect_printed_nothing(const std::string& out) {
  EXPECT_EQ(modar_test::slurp(out), "") << out;
  std::remove(out.c_str());
}

// An interrupted run wrote no `path`, and left no atomic write's temporary
// beside it.
void expect_not_written(const std::string& path) {
  EXPECT_FALSE(exists(path)) << path;
  EXPECT_FALSE(leftover(path, ".tmp")) << path;
}

std::string cli() {
  return MODAR_CLI_PATH;
}

bool have_mpirun() {
  return std::system("command -v mpirun >/dev/null 2>&1") == 0;
}

const std::string kMpirun =
    "env OMP_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 mpirun --allow-run-as-root "
    "--oversubscribe --bind-to none --mca btl self,vader -np 2 ";

// `modar ARGUMENTS > OUT`, interrupted at `ready` on its stderr: exit 130
// and nothing printed.
void expect_stops_printing_nothing(const std::string& what, const std::string& arguments,
                                   const std::string& ready) {
  const std::string out = temp_path(what.substr(0, what.find(' ')) + ".txt");
  const Interrupted r = interrupt_when_ready(cli() + " " + arguments + " > " + out, ready);
  expect_interrupted(r, what);
  expect_printed_nothing(out);
}

// `modar VERB ARGUMENTS OUT` (ARGUMENTS ends with the output flag),
// interrupted at its first progress line: exit 130 and no OUT, nor a
// temporary beside it.
void expect_stops_unwritten(const std::string& verb, const std::string& arguments,
                            const std::string& out_name) {
  const std::string out = temp_path(out_name);
  std::remove(out.c_str());
  const Interrupted r = interrupt_when_ready(
      cli() + " " + verb + " " + arguments + " " + out + " > /dev/null", "modar " + verb + ": ");
  expect_interrupted(r, verb);
  expect_not_written(out);
}

// A runs file holding `csv` for fit and calibrate.
std::string write_runs(const std::string& name, const std::string& csv) {
  const std::string runs = temp_path(name);
  std::ofstream(runs) << csv;
  return runs;
}

TEST(CliInterrupt, OptimalStopsAndPrintsNothing) {
  expect_stops_printing_nothing("optimal",
                                "optimal --gpu-hours 1e7 --gpus 4096 --profile h100-80gb-dgx "
                                "--arch baseline,mod,dar,mod+dar,moe,mode-staged,mode-integrated",
                                "modar optimal: ");
}

TEST(CliInterrupt, ExportFromOptimalStopsAndPrintsNothing) {
  // `export --from-optimal` runs optimal first: the same progress and Ctrl-C.
  expect_stops_printing_nothing(
      "export --from-optimal",
      "export --from-optimal --gpu-hours 1e7 --gpus 4096 --profile h100-80gb-dgx "
      "--arch baseline,mod,dar,mod+dar,moe,mode-staged,mode-integrated --pick baseline",
      "modar optimal: ");
}

TEST(CliInterrupt, LayoutStopsAndPrintsNothing) {
  // 204,432 layouts of a small MoE model (EP and expert TP multiply the
  // space) on 16,384 GPUs, 16 per node, global batch 4096: 2.7 s of CPU on
  // the 2-core build host at a load of 0.5 (2 December), well past the first
  // progress line (after 1 s); the 103,536 layouts at 8 per node and the
  // config's batch had come down to 1.3 s, and the run sometimes ended
  // before the signal.
  expect_stops_printing_nothing("layout",
                                std::string("layout ") + MODAR_SOURCE_DIR +
                                    "/examples/configs/moe_small.toml --gpus 16384 "
                                    "--gpus-per-node 16 --global-batch 4096 --profile "
                                    "h100-80gb-dgx",
                                "modar layout: ");
}

TEST(CliInterrupt, SweepStopsAndWritesNothing) {
  expect_stops_unwritten("sweep",
                         "--flops 1e19,1e20,1e21,1e22,1e23 --arch baseline,mod,dar,moe,mod+dar "
                         "--every 1,2,4 --gpus 1024 --profile a100-80gb-dgx --output",
                         "sweep.csv");
}

TEST(CliInterrupt, FitStopsAndWritesNothing) {
  std::string csv = "N,D,loss\n";
  for (const double n : {2e7, 1e8, 5e8}) {
    for (const double d : {2e9, 1e10, 5e10}) {
      char line[96];
      std::snprintf(line, sizeof line, "%g,%g,%.9g\n", n, d,
                    1.8 + 480.0 / std::pow(n, 0.35) + 2000.0 / std::pow(d, 0.37));
      csv += line;
    }
  }
  const std::string runs = write_runs("runs.csv", csv);
  expect_stops_unwritten("fit", runs + " --bootstrap 100000 --output", "runs.fit.toml");
  std::remove(runs.c_str());
}

TEST(CliInterrupt, CalibrateStopsAndWritesNoProfile) {
  // The Megatron runs, each copied 12 times under new names: 120 runs, whose
  // leave-one-out refits take far longer than the wait for the first line.
  const std::string examples = std::string(MODAR_SOURCE_DIR) + "/examples/cluster/";
  std::ifstream source(examples + "megatron_table1_runs.csv");
  std::string csv = "name,config,overrides,step_s\n";
  std::vector<std::string> rows;
  for (std::string line; std::getline(source, line);) {
    if (!line.empty() && line[0] != '#' && line.rfind("name,", 0) != 0) {
      rows.push_back(line);
    }
  }
  ASSERT_GE(rows.size(), 5u);
  for (int copy = 0; copy < 12; ++copy) {
    for (const std::string& row : rows) {
      const size_t comma = row.find(',');
      const size_t config_end = row.find(',', comma + 1);
      csv += row.substr(0, comma) + "-" + std::to_string(copy) + "," + examples +
             row.substr(comma + 1, config_end - comma - 1) + row.substr(config_end) + "\n";
    }
  }
  const std::string runs = write_runs("cal_runs.csv", csv);
  expect_stops_unwritten("calibrate", runs + " --profile a100-80gb-dgx --out", "calibrated.toml");
  std::remove(runs.c_str());
}

TEST(CliInterrupt, ProfileStopsAndWritesNoProfile) {
  const std::string out = temp_path("profile.toml");
  std::remove(out.c_str());
  const Interrupted r = interrupt_when_ready(
      cli() + " profile --backend cpu --quick --no-ceilings --out " + out + " > /dev/null",
      "shapes (");  // run_profile's header, printed under the interrupt scope before measuring
  expect_interrupted(r, "profile");
  EXPECT_FALSE(exists(out));  // (OUT.partial keeps the points measured: --resume)
  std::remove((out + ".partial").c_str());
}

TEST(CliInterrupt, ValidateStopsAndPrintsNothing) {
  expect_stops_printing_nothing("validate", "validate --profile cpu-measured-quick --rounds 50",
                                "modar validate: ");
}

TEST(CliInterrupt, CommProfileRanksStopTogetherAndWriteNothing) {
  if (!have_mpirun()) {
    GTEST_SKIP() << "no mpirun on PATH (Open MPI: libopenmpi-dev openmpi-bin)";
  }
  const std::string out = temp_path("comm.toml");
  std::remove(out.c_str());
  const Interrupted r = interrupt_when_ready(
      kMpirun + cli() + " profile --comm --backend cpu --base cpu-generic --out " + out +
          " > /dev/null",
      "profile --comm: ", /*to_ranks=*/true);
  if (r.err.find("no MPI") != std::string::npos) {
    GTEST_SKIP() << "this build has no MPI";
  }
  expect_interrupted(r, "profile --comm");
  EXPECT_EQ(r.err.find("MPI_ABORT"), std::string::npos) << r.err;  // no rank aborted the world
  expect_not_written(out);
}

TEST(CliInterrupt, ParallelValidateRanksStopTogether) {
  if (!have_mpirun()) {
    GTEST_SKIP() << "no mpirun on PATH (Open MPI: libopenmpi-dev openmpi-bin)";
  }
  const std::string out = temp_path("vpar.txt");
  const Interrupted r = interrupt_when_ready(kMpirun + cli() + " validate --parallel --profile " +
                                                 std::string(MODAR_SOURCE_DIR) +
                                                 "/profiles/cpu-comm.toml --rounds 100 > " + out,
                                             "modar validate --parallel: ", /*to_ranks=*/true);
  if (r.err.find("no MPI") != std::string::npos) {
    GTEST_SKIP() << "this build has no MPI";
  }
  expect_interrupted(r, "validate --parallel");
  EXPECT_EQ(r.err.find("MPI_ABORT"), std::string::npos) << r.err;
  expect_printed_nothing(out);
}

}  // namespace
