// tests/cpp/comm/comm_test_main.cpp: the GoogleTest main of the communicator
// tests, the same binary with and without mpirun.
//
// Under mpirun every rank runs every test (collectives need all ranks); only
// rank 0 prints gtest's report, the others print their failures only.  The
// exit status is the same on every rank: 1 when any rank failed a test.
#include <gtest/gtest.h>

#include <cstdio>

#include "modar/runtime/backend.hpp"
#include "modar/runtime/comm.hpp"

namespace {
// The report of a rank other than 0: its failed assertions, one line each.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (result.failed()) {
      std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_,
                   result.file_name() ? result.file_name() : "?", result.line_number(),
                   result.summary());
    }
  }

 private:
  int rank_;
};
}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  using namespace modar::runtime;
  // Listing tests must not start MPI (gtest_discover_tests-like callers).
  if (::testing::GTEST_FLAG(list_tests)) {
    return RUN_ALL_TESTS();
  }
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  std::unique_ptr<Communicator> world = make_world_communicator(*cpu);
  if (world->rank() != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(world->rank()));
  }
  if (world->rank() == 0) {
    std::printf("communicator tests: %s, %d rank(s)\n", world->engine().c_str(), world->size());
  }
  const int failed_here = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int failed_anywhere = failed_here;
  TensorView flag = make_view(&failed_anywhere, ScalarType::i32, DeviceKind::cpu, {1});
  world->all_reduce(flag, ReduceOp::max);
  if (failed_here) {
    std::fprintf(stderr, "communicator tests: rank %d of %d FAILED\n", world->rank(),
                 world->size());
  }
  return failed_anywhere;
}
