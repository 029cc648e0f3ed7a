// The CUDA backend as a module (libmodar_cuda.so, runtime/CMakeLists.txt):
// `modar` starts without the CUDA libraries (the dynamic loader's own log,
// LD_DEBUG=files, lists every file it opens), loads the module when a command
// asks for backend cuda (on a machine without a GPU, or with none visible, the
// backend in the module then answers "no CUDA device": the module loaded and
// its symbols bound to the program's), and a module that cannot be loaded is
// one line naming the file.  Builds without the module skip the CUDA cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "../common/cli_run.hpp"

namespace {

using Result = modar_test::CliResult;

Result run(const std::string& prefix, const std::string& arguments) {
  static int calls = 0;
  return modar_test::run_cli(
      modar_test::temp_path_for("cli_module_", "run" + std::to_string(++calls)), prefix, arguments);
}

std::string out_path() {
  return modar_test::temp_path_for("cli_module_", "profile.toml");
}

bool exists(const std::string& path) {
  return std::ifstream(path).good();
}

// True when this build has a CUDA backend (module or linked in): `modar
// profile --backend cuda` then fails later than "no CUDA backend".
bool build_has_cuda() {
  const Result r =
      run("CUDA_VISIBLE_DEVICES= ", "profile --backend cuda --quick --out " + out_path());
  return r.err.find("no CUDA backend") == std::string::npos;
}

TEST(CliBackendModule, StartUpLoadsNoCudaLibrary) {
  const Result r = run("LD_DEBUG=files ", "--version");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_NE(r.err.find("file="), std::string::npos) << "no loader log: " << r.err;
  for (const char* library : {"libcudart", "libcublas", "libmodar_cuda"}) {
    EXPECT_EQ(r.err.find(library), std::string::npos) << library << " loaded:\n" << r.err;
  }
}

TEST(CliBackendModule, CudaBackendIsLoadedOnFirstUse) {
  if (!build_has_cuda()) {
    GTEST_SKIP() << "this build has no CUDA backend";
  }
  const std::string out = out_path();
  const Result r = run("CUDA_VISIBLE_DEVICES= ", "profile --backend cuda --quick --out " + out);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("no CUDA device"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("undefined symbol"), std::string::npos) << r.err;
  EXPECT_FALSE(exists(out));
  const Result logged =
      run("CUDA_VISIBLE_DEVICES= LD_DEBUG=files ", "profile --backend cuda --quick --out " + out);
  EXPECT_NE(logged.err.find("libcublasLt"), std::string::npos) << logged.err;
}

TEST(CliBackendModule, AModuleThatCannotLoadIsOneLineNamingIt) {
  if (!build_has_cuda()) {
    GTEST_SKIP() << "this build has no CUDA backend";
  }
  const std::string missing = modar_test::temp_path_for("cli_module_", "libmodar_cuda_gone.so");
  const std::string out = out_path();
  const Result r =
      run("MODAR_CUDA_MODULE=" + missing + " ", "profile --backend cuda --quick --out " + out);
  if (r.err.find("no CUDA device") != std::string::npos) {
    GTEST_SKIP() << "the CUDA backend is linked in (MODAR_CUDA_MODULE=OFF)";
  }
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("cannot load its module"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(missing), std::string::npos) << r.err;
  EXPECT_FALSE(exists(out));
}

}  // namespace
