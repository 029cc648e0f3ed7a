// tests/cpp/comm/comm_test_values.hpp: the closed formula of (rank, index)
// every communicator test fills its buffers from (MPI's test_comm.cpp and
// NCCL's test_comm_nccl.cpp), so that every rank can compute what every other
// rank sent.  The values are small integers: sums over ranks are exact in
// every dtype, whatever the library's order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace modar::runtime {
namespace {

// The value rank r holds at index i (exact in fp32 and i32; < 2^20).
double value(int r, int64_t i) {
  return (r + 1) * 1000.0 + static_cast<double>(i % 997) - 3.0 * (i % 5);
}

template <class T>
std::vector<T> filled(int r, int64_t n) {
  std::vector<T> data(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    data[static_cast<size_t>(i)] = static_cast<T>(value(r, i));
  }
  return data;
}

}  // namespace
}  // namespace modar::runtime
