// tests/cpp/comm/test_comm_nccl.cpp: the NCCL communicator (CUDA backend)
// against brute-force expectations, like test_comm.cpp for MPI.  Skips with a
// one-line reason without a GPU (or without libnccl.so.2).  On one GPU the
// world is one rank (every collective still runs through NCCL); under mpirun
// on a multi-GPU node each rank takes its own GPU (make_cuda_backend).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "comm_test_values.hpp"
#include "modar/base/errors.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/comm.hpp"

namespace modar::runtime {
namespace {

struct Gpu {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Communicator> comm;
  std::string reason;  // why there is none
};

Gpu& gpu() {
  static Gpu state = [] {
    Gpu g;
    try {
      g.backend = make_backend("cuda");
      g.comm = make_world_communicator(*g.backend);
    } catch (const BackendError& error) {
      g.reason = error.what();
      g.comm.reset();
      g.backend.reset();
    }
    return g;
  }();
  return state;
}

#define REQUIRE_NCCL()                                    \
  if (!gpu().comm) {                                      \
    GTEST_SKIP() << "no NCCL communicator: " << gpu().reason; \
  }

template <class T>
Tensor upload(const std::vector<T>& host, ScalarType type) {
  Tensor t(*gpu().backend, {static_cast<int64_t>(host.size())}, type);
  gpu().backend->copy_from_host(host.data(), t);
  return t;
}

template <class T>
std::vector<T> download(const Tensor& t) {
  std::vector<T> host(static_cast<size_t>(t.numel()));
  gpu().backend->copy_to_host(t, host.data());
  return host;
}

TEST(CommNccl, EngineAndDevice) {
  REQUIRE_NCCL();
  EXPECT_EQ(gpu().comm->engine().rfind("nccl 2.", 0), 0u) << gpu().comm->engine();
  EXPECT_EQ(gpu().comm->device(), DeviceKind::cuda);
}

TEST(CommNccl, AllReduceSumAndMax) {
  REQUIRE_NCCL();
  Communicator& comm = *gpu().comm;
  const int p = comm.size();
  const int64_t n = 100003;
  Tensor f64 = upload(filled<double>(comm.rank(), n), ScalarType::fp64);
  Tensor f32 = upload(filled<float>(comm.rank(), n), ScalarType::fp32);
  Tensor i32 = upload(filled<int32_t>(comm.rank(), n), ScalarType::i32);
  comm.all_reduce(f64);
  comm.all_reduce(f32);
  comm.all_reduce(i32, ReduceOp::max);
  const auto r64 = download<double>(f64);
  const auto r32 = download<float>(f32);
  const auto ri = download<int32_t>(i32);
  for (int64_t i = 0; i < n; ++i) {
    double sum = 0, max = -1e300;
    for (int q = 0; q < p; ++q) {
      sum += value(q, i);
      max = std::max(max, value(q, i));
    }
    ASSERT_EQ(r64[i], sum) << i;
    ASSERT_EQ(r32[i], static_cast<float>(sum)) << i;
    ASSERT_EQ(ri[i], static_cast<int32_t>(max)) << i;
  }
  // bf16 small integers: exact whatever NCCL's rounding steps.
  std::vector<uint16_t> b(64);
  for (size_t i = 0; i < b.size(); ++i) {
    b[i] = float_to_bf16(static_cast<float>(comm.rank() + static_cast<int>(i % 8)));
  }
  Tensor bt = upload(b, ScalarType::bf16);
  comm.all_reduce(bt);
  const auto rb = download<uint16_t>(bt);
  for (size_t i = 0; i < rb.size(); ++i) {
    EXPECT_EQ(bf16_to_float(rb[i]), static_cast<float>(p * (p - 1) / 2 + p * static_cast<int>(i % 8)));
  }
}

TEST(CommNccl, ReduceScatterAllGatherAllToAllBroadcast) {
  REQUIRE_NCCL();
  Communicator& comm = *gpu().comm;
  const int p = comm.size();
  const int64_t chunk = 4099;
  Tensor in = upload(filled<float>(comm.rank(), p * chunk), ScalarType::fp32);
  Tensor out(*gpu().backend, {chunk}, ScalarType::fp32);
  comm.reduce_scatter(in, out);
  const auto scattered = download<float>(out);
  for (int64_t i = 0; i < chunk; ++i) {
    double sum = 0;
    for (int q = 0; q < p; ++q) {
      sum += value(q, comm.rank() * chunk + i);
    }
    ASSERT_EQ(scattered[i], static_cast<float>(sum)) << i;
  }
  Tensor mine = upload(filled<float>(comm.rank(), chunk), ScalarType::fp32);
  Tensor all(*gpu().backend, {p * chunk}, ScalarType::fp32);
  comm.all_gather(mine, all);
  const auto gathered = download<float>(all);
  for (int q = 0; q < p; ++q) {
    for (int64_t i = 0; i < chunk; i += 7) {
      ASSERT_EQ(gathered[q * chunk + i], static_cast<float>(value(q, i)));
    }
  }
  std::vector<double> a2a(static_cast<size_t>(p * chunk));
  for (int j = 0; j < p; ++j) {
    for (int64_t e = 0; e < chunk; ++e) {
      a2a[j * chunk + e] = 1e6 * comm.rank() + 1e4 * j + static_cast<double>(e);
    }
  }
  Tensor a2a_in = upload(a2a, ScalarType::fp64);
  Tensor a2a_out(*gpu().backend, {p * chunk}, ScalarType::fp64);
  comm.all_to_all(a2a_in, a2a_out);
  const auto transposed = download<double>(a2a_out);
  for (int i = 0; i < p; ++i) {
    for (int64_t e = 0; e < chunk; e += 13) {
      ASSERT_EQ(transposed[i * chunk + e], 1e6 * i + 1e4 * comm.rank() + static_cast<double>(e));
    }
  }
  const int root = p - 1;
  Tensor bcast = upload(comm.rank() == root ? filled<int32_t>(root, 77) : std::vector<int32_t>(77, 0),
                        ScalarType::i32);
  comm.broadcast(bcast, root);
  EXPECT_EQ(download<int32_t>(bcast), filled<int32_t>(root, 77));
  comm.barrier();
}

TEST(CommNccl, RingAndSplit) {
  REQUIRE_NCCL();
  Communicator& comm = *gpu().comm;
  const int p = comm.size();
  std::unique_ptr<Communicator> part = comm.split(comm.rank() % 2, comm.rank());
  ASSERT_NE(part, nullptr);
  EXPECT_EQ(part->size(), (p - comm.rank() % 2 + 1) / 2);
  EXPECT_EQ(part->rank(), comm.rank() / 2);
  Tensor x = upload(std::vector<double>{static_cast<double>(comm.rank())}, ScalarType::fp64);
  part->all_reduce(x);
  double expected = 0;
  for (int q = comm.rank() % 2; q < p; q += 2) {
    expected += q;
  }
  EXPECT_EQ(download<double>(x)[0], expected);
  EXPECT_EQ(comm.split(-1, 0), nullptr);
  if (p == 1) {
    GTEST_SKIP() << "point to point needs 2 ranks (one GPU here)";
  }
  const int next = (comm.rank() + 1) % p, previous = (comm.rank() + p - 1) % p;
  Tensor send = upload(filled<float>(comm.rank(), 1000), ScalarType::fp32);
  Tensor recv(*gpu().backend, {1000}, ScalarType::fp32);
  comm.send_recv(send, next, recv, previous);
  EXPECT_EQ(download<float>(recv), filled<float>(previous, 1000));
}

}  // namespace
}  // namespace modar::runtime
