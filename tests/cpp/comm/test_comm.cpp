// tests/cpp/comm/test_comm.cpp: every collective of the communicator against a
// brute-force expectation.  The same tests run at any world size: alone (the
// MPI singleton, or the self communicator) and under mpirun -np 2 / -np 4
// (tests/CMakeLists.txt).  Each rank fills its buffers from a closed formula
// of (rank, index), so every rank can compute what every other rank sent and
// hence the exact expected result (all values are small integers or dyadic
// fractions: the sums are exact in every dtype, whatever MPI's order).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm_test_values.hpp"
#include "modar/base/errors.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/comm.hpp"

namespace modar::runtime {
namespace {

Communicator& world() {
  static std::unique_ptr<Backend> cpu = make_cpu_backend();
  static std::unique_ptr<Communicator> communicator = make_world_communicator(*cpu);
  return *communicator;
}

template <class T>
TensorView view(std::vector<T>& data, ScalarType type) {
  return make_view(data.data(), type, DeviceKind::cpu, {static_cast<int64_t>(data.size())});
}

TEST(CommWorld, SizeAndRankAgreeWithTheLauncher) {
  Communicator& comm = world();
  const char* launched = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (mpi_available() && launched != nullptr) {
    EXPECT_EQ(comm.size(), std::atoi(launched));
    EXPECT_EQ(comm.rank(), std::atoi(std::getenv("OMPI_COMM_WORLD_RANK")));
  } else {
    EXPECT_EQ(comm.size(), 1);
  }
  EXPECT_GE(comm.rank(), 0);
  EXPECT_LT(comm.rank(), comm.size());
  if (mpi_available()) {
    EXPECT_EQ(comm.engine().rfind("mpi (", 0), 0u) << comm.engine();
  }
  EXPECT_EQ(comm.device(), DeviceKind::cpu);
}

// Sum over ranks, in fp64, fp32 and i32: the brute-force sum of value(q, i).
TEST(CommWorld, AllReduceSumEveryDtype) {
  Communicator& comm = world();
  const int p = comm.size();
  const int64_t n = 1031;  // odd, not a multiple of any size
  auto f64 = filled<double>(comm.rank(), n);
  auto f32 = filled<float>(comm.rank(), n);
  auto i32 = filled<int32_t>(comm.rank(), n);
  comm.all_reduce(view(f64, ScalarType::fp64));
  comm.all_reduce(view(f32, ScalarType::fp32), ReduceOp::sum);
  comm.all_reduce(view(i32, ScalarType::i32));
  for (int64_t i = 0; i < n; ++i) {
    double expected = 0;
    for (int q = 0; q < p; ++q) {
      expected += value(q, i);
    }
    ASSERT_EQ(f64[i], expected) << "index " << i;
    ASSERT_EQ(f32[i], static_cast<float>(expected)) << "index " << i;
    ASSERT_EQ(i32[i], static_cast<int32_t>(expected)) << "index " << i;
  }
}

TEST(CommWorld, AllReduceMax) {
  Communicator& comm = world();
  const int p = comm.size();
  const int64_t n = 64;
  // Rank r holds (r * 7 + i) mod p - i: the max over ranks is p - 1 - i.
  std::vector<double> f64(n);
  std::vector<int32_t> i32(n);
  for (int64_t i = 0; i < n; ++i) {
    f64[i] = static_cast<double>((comm.rank() * 7 + i) % p - i);
    i32[i] = static_cast<int32_t>(f64[i]);
  }
  comm.all_reduce(view(f64, ScalarType::fp64), ReduceOp::max);
  comm.all_reduce(view(i32, ScalarType::i32), ReduceOp::max);
  for (int64_t i = 0; i < n; ++i) {
    // (7 r + i) mod p takes the value p - 1 for some r when gcd(7, p) = 1.
    ASSERT_EQ(f64[i], static_cast<double>(p - 1 - i)) << "index " << i;
    ASSERT_EQ(i32[i], p - 1 - i) << "index " << i;
  }
}

// bf16: widened to fp32, reduced, rounded once (comm.hpp).  Rank 0 holds 1,
// every other rank 2^-9 (a quarter of bf16's unit in the last place at 1).
// Rounding once: 1 + (p-1) 2^-9 -> 1 + 2^-7 for p = 4 (0.75 ulp rounds up),
// 1 for p = 2 (0.25 ulp rounds down).  A ring that rounded after every step
// would keep 1 for any p.
TEST(CommWorld, AllReduceBf16RoundsOnce) {
  Communicator& comm = world();
  const int p = comm.size();
  std::vector<uint16_t> data(5, float_to_bf16(comm.rank() == 0 ? 1.0f : std::ldexp(1.0f, -9)));
  comm.all_reduce(view(data, ScalarType::bf16));
  const float exact = 1.0f + static_cast<float>(p - 1) * std::ldexp(1.0f, -9);
  // Round to nearest even by hand: bf16 keeps 7 fraction bits at [1, 2).
  const float ulp = std::ldexp(1.0f, -7);
  const float expected = 1.0f + std::nearbyint((exact - 1.0f) / ulp) * ulp;
  for (uint16_t bits : data) {
    EXPECT_EQ(bf16_to_float(bits), expected) << "p = " << p;
  }
  if (p == 4) {
    EXPECT_EQ(bf16_to_float(data[0]), 1.0f + ulp);
  }
}

TEST(CommWorld, ReduceScatterGivesEachRankItsChunkOfTheSum) {
  Communicator& comm = world();
  const int p = comm.size();
  const int64_t chunk = 37;
  auto in = filled<double>(comm.rank(), p * chunk);
  std::vector<double> out(chunk, -1.0);
  comm.reduce_scatter(view(in, ScalarType::fp64), view(out, ScalarType::fp64));
  for (int64_t i = 0; i < chunk; ++i) {
    double expected = 0;
    for (int q = 0; q < p; ++q) {
      expected += value(q, comm.rank() * chunk + i);
    }
    ASSERT_EQ(out[i], expected) << "index " << i;
  }
  // bf16 with small integers (exact in bf16).
  std::vector<uint16_t> in16(static_cast<size_t>(p * 3));
  for (size_t i = 0; i < in16.size(); ++i) {
    in16[i] = float_to_bf16(static_cast<float>(comm.rank() + static_cast<int>(i)));
  }
  std::vector<uint16_t> out16(3);
  comm.reduce_scatter(view(in16, ScalarType::bf16), view(out16, ScalarType::bf16));
  for (int i = 0; i < 3; ++i) {
    const int index = comm.rank() * 3 + i;
    EXPECT_EQ(bf16_to_float(out16[i]), static_cast<float>(p * (p - 1) / 2 + p * index));
  }
}

TEST(CommWorld, AllGatherInRankOrderAndInPlace) {
  Communicator& comm = world();
  const int p = comm.size();
  const int64_t n = 29;
  auto in = filled<float>(comm.rank(), n);
  std::vector<float> out(static_cast<size_t>(p * n), -1.0f);
  comm.all_gather(view(in, ScalarType::fp32), view(out, ScalarType::fp32));
  for (int q = 0; q < p; ++q) {
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(out[q * n + i], static_cast<float>(value(q, i))) << "chunk " << q << " index " << i;
    }
  }
  // In place: this rank's input is its own chunk of the output (ZeRO).
  std::vector<int32_t> all(static_cast<size_t>(p * n), -1);
  for (int64_t i = 0; i < n; ++i) {
    all[comm.rank() * n + i] = static_cast<int32_t>(value(comm.rank(), i));
  }
  TensorView all_view = view(all, ScalarType::i32);
  comm.all_gather(slice(all_view, comm.rank() * n, n), all_view);
  for (int q = 0; q < p; ++q) {
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(all[q * n + i], static_cast<int32_t>(value(q, i)));
    }
  }
}

TEST(CommWorld, AllToAllTransposesChunks) {
  Communicator& comm = world();
  const int p = comm.size();
  const int64_t chunk = 11;
  // Chunk j of rank i's input, element e: 10000 i + 100 j + e.
  std::vector<double> in(static_cast<size_t>(p * chunk));
  for (int j = 0; j < p; ++j) {
    for (int64_t e = 0; e < chunk; ++e) {
      in[j * chunk + e] = 10000.0 * comm.rank() + 100.0 * j + static_cast<double>(e);
    }
  }
  std::vector<double> out(in.size(), -1.0);
  comm.all_to_all(view(in, ScalarType::fp64), view(out, ScalarType::fp64));
  for (int i = 0; i < p; ++i) {
    for (int64_t e = 0; e < chunk; ++e) {
      ASSERT_EQ(out[i * chunk + e], 10000.0 * i + 100.0 * comm.rank() + static_cast<double>(e));
    }
  }
}

TEST(CommWorld, BroadcastFromTheLastRank) {
  Communicator& comm = world();
  const int root = comm.size() - 1;
  auto data = comm.rank() == root ? filled<uint16_t>(root, 50) : std::vector<uint16_t>(50, 0);
  comm.broadcast(view(data, ScalarType::bf16), root);  // bf16 moves as 16-bit words
  for (int64_t i = 0; i < 50; ++i) {
    ASSERT_EQ(data[i], static_cast<uint16_t>(value(root, i)));
  }
}

// A ring: every rank sends to the next and receives from the previous, both
// with send_recv and with plain send / recv (even ranks send first).
TEST(CommWorld, PointToPointRing) {
  Communicator& comm = world();
  const int p = comm.size();
  if (p == 1) {
    GTEST_SKIP() << "point to point needs 2 ranks (the world has 1)";
  }
  const int next = (comm.rank() + 1) % p;
  const int previous = (comm.rank() + p - 1) % p;
  const int64_t n = 300000;  // 2.4 MB: above any eager limit, so send blocks until received
  auto mine = filled<double>(comm.rank(), n);
  std::vector<double> got(n, -1.0);
  comm.send_recv(view(mine, ScalarType::fp64), next, view(got, ScalarType::fp64), previous);
  for (int64_t i = 0; i < n; i += 997) {
    ASSERT_EQ(got[i], value(previous, i));
  }
  std::fill(got.begin(), got.end(), -1.0);
  if (comm.rank() % 2 == 0) {
    comm.send(view(mine, ScalarType::fp64), next);
    comm.recv(view(got, ScalarType::fp64), previous);
  } else {
    comm.recv(view(got, ScalarType::fp64), previous);
    comm.send(view(mine, ScalarType::fp64), next);
  }
  EXPECT_EQ(got[0], value(previous, 0));
  EXPECT_EQ(got[n - 1], value(previous, n - 1));
}

// A recv larger than the message names both sizes (a shorter one fails in MPI).
TEST(CommWorld, RecvOfTheWrongSizeThrows) {
  Communicator& comm = world();
  if (comm.size() == 1) {
    GTEST_SKIP() << "point to point needs 2 ranks (the world has 1)";
  }
  std::vector<float> three(3, 1.0f), four(4, 0.0f);
  if (comm.rank() == 0) {
    comm.send(view(three, ScalarType::fp32), 1);
  } else if (comm.rank() == 1) {
    EXPECT_THROW(comm.recv(view(four, ScalarType::fp32), 0), ShapeError);
  }
  comm.barrier();
}

// Split by parity, keys reversing the order: the new rank is the position of
// this rank among its color's members in descending old rank.
TEST(CommWorld, SplitByParityWithReversedKeys) {
  Communicator& comm = world();
  const int p = comm.size();
  const int color = comm.rank() % 2;
  std::unique_ptr<Communicator> part = comm.split(color, -comm.rank());
  ASSERT_NE(part, nullptr);
  std::vector<int> members;
  for (int q = p - 1; q >= 0; --q) {
    if (q % 2 == color) {
      members.push_back(q);
    }
  }
  EXPECT_EQ(part->size(), static_cast<int>(members.size()));
  int expected_rank = -1;
  for (size_t position = 0; position < members.size(); ++position) {
    if (members[position] == comm.rank()) {
      expected_rank = static_cast<int>(position);
    }
  }
  EXPECT_EQ(part->rank(), expected_rank);
  // Reduce inside the group only: the sum of the members' old ranks.
  std::vector<double> x{static_cast<double>(comm.rank())};
  part->all_reduce(view(x, ScalarType::fp64));
  double expected = 0;
  for (int q : members) {
    expected += q;
  }
  EXPECT_EQ(x[0], expected);
  // Gather inside the group: rank order = the reversed old ranks.
  std::vector<int32_t> one{comm.rank()};
  std::vector<int32_t> gathered(members.size(), -1);
  part->all_gather(view(one, ScalarType::i32), view(gathered, ScalarType::i32));
  for (size_t position = 0; position < members.size(); ++position) {
    EXPECT_EQ(gathered[position], members[position]);
  }
  // A sub-communicator of a sub-communicator.
  std::unique_ptr<Communicator> alone = part->split(part->rank(), 0);
  ASSERT_NE(alone, nullptr);
  EXPECT_EQ(alone->size(), 1);
  // Color < 0: no group (every rank but 0 opts out).
  std::unique_ptr<Communicator> only_zero = comm.split(comm.rank() == 0 ? 0 : -1, 0);
  EXPECT_EQ(only_zero == nullptr, comm.rank() != 0);
  if (only_zero) {
    EXPECT_EQ(only_zero->size(), 1);
  }
  comm.barrier();
}

// Bad arguments are refused before any rank communicates (so every rank
// throws alike and nobody hangs).
TEST(CommWorld, BadArgumentsThrowShapeErrorNamingTheCall) {
  Communicator& comm = world();
  const int p = comm.size();
  std::vector<double> a(4 * p + 1), b(4);
  try {
    comm.reduce_scatter(view(a, ScalarType::fp64), view(b, ScalarType::fp64));
    FAIL() << "reduce_scatter of " << a.size() << " into 4 accepted";
  } catch (const ShapeError& error) {
    EXPECT_NE(std::string(error.what()).find("reduce_scatter"), std::string::npos) << error.what();
  }
  std::vector<float> f(4);
  EXPECT_THROW(comm.all_to_all(view(a, ScalarType::fp64), view(f, ScalarType::fp32)), ShapeError);
  TensorView on_gpu = view(b, ScalarType::fp64);
  on_gpu.device = DeviceKind::cuda;
  EXPECT_THROW(comm.all_reduce(on_gpu), ShapeError);
  EXPECT_THROW(comm.all_reduce(TensorView{}), ShapeError);
  EXPECT_THROW(comm.broadcast(view(b, ScalarType::fp64), p), ShapeError);
  EXPECT_THROW(comm.send(view(b, ScalarType::fp64), comm.rank()), ShapeError);
  EXPECT_THROW(comm.all_gather(view(b, ScalarType::fp64), view(a, ScalarType::fp64)), ShapeError);
  comm.barrier();
}

// ---- the self communicator (no MPI) ------------------------------------------

TEST(CommSelf, CollectivesAreCopiesOnOneRank) {
  std::unique_ptr<Communicator> self = make_self_communicator();
  EXPECT_EQ(self->size(), 1);
  EXPECT_EQ(self->rank(), 0);
  EXPECT_EQ(self->engine(), "self");
  auto in = filled<double>(0, 8);
  std::vector<double> out(8, 0.0);
  self->all_reduce(view(in, ScalarType::fp64));
  EXPECT_EQ(in, filled<double>(0, 8));
  self->reduce_scatter(view(in, ScalarType::fp64), view(out, ScalarType::fp64));
  EXPECT_EQ(out, in);
  std::fill(out.begin(), out.end(), 0.0);
  self->all_gather(view(in, ScalarType::fp64), view(out, ScalarType::fp64));
  EXPECT_EQ(out, in);
  std::fill(out.begin(), out.end(), 0.0);
  self->all_to_all(view(in, ScalarType::fp64), view(out, ScalarType::fp64));
  EXPECT_EQ(out, in);
  EXPECT_THROW(self->send(view(in, ScalarType::fp64), 0), ShapeError);
  EXPECT_EQ(self->split(-1, 0), nullptr);
  EXPECT_EQ(self->split(3, 0)->size(), 1);
  std::vector<double> small(3);
  EXPECT_THROW(self->all_gather(view(in, ScalarType::fp64), view(small, ScalarType::fp64)),
               ShapeError);
}

TEST(CommSelf, WithABackendCopiesOnItsDevice) {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  std::unique_ptr<Communicator> self = make_self_communicator(*cpu);
  auto in = filled<float>(0, 6);
  std::vector<float> out(6, 0.0f);
  self->all_to_all(view(in, ScalarType::fp32), view(out, ScalarType::fp32));
  EXPECT_EQ(out, in);
}

}  // namespace
}  // namespace modar::runtime
