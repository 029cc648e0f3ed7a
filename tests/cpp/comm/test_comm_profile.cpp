// tests/cpp/comm/test_comm_profile.cpp: `modar profile --comm`'s library part
// (run_comm_profile, with_measured_network) and the planner's reading of the
// tables it writes (collective_time_s).  Run alone and under mpirun -np 2 / 4
// with the other communicator tests; the expected numbers are nccl-tests'
// formulas and log-log interpolation worked by hand, not the code's output.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "modar/base/errors.hpp"
#include "modar/parallel.hpp"
#include "modar/profile.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/comm.hpp"
#include "modar/runtime/comm_profile.hpp"

namespace modar::runtime {
namespace {

struct World {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  std::unique_ptr<Communicator> comm = make_world_communicator(*cpu);
};
World& world() {
  static World w;
  return w;
}

CommProfileRequest tiny() {
  CommProfileRequest o;
  o.min_bytes = 1024;
  o.max_bytes = 4096;
  o.size_factor = 4.0;  // 1024, 4096
  o.warmup = 1;
  o.min_repeats = 3;
  o.max_repeats = 3;
  o.budget_s = 1e-3;
  o.sample_s = 1e-4;
  return o;
}

TEST(CommProfile, OneRankIsRefusedWithTheWayOut) {
  if (world().comm->size() > 1) {
    GTEST_SKIP() << "this world has " << world().comm->size() << " ranks";
  }
  try {
    run_comm_profile(*world().cpu, *world().comm, tiny());
    FAIL() << "a one-rank world was profiled";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("mpirun"), std::string::npos) << error.what();
  }
}

TEST(CommProfile, MeasuresEveryPointAndWritesTablesThePlannerReads) {
  Communicator& comm = *world().comm;
  const int p = comm.size();
  if (p == 1) {
    GTEST_SKIP() << "profile --comm needs 2 ranks (the world has 1)";
  }
  const CommProfileResult result = run_comm_profile(*world().cpu, comm, tiny());
  // One node here: groups 2, 4, ... <= p, and p.
  std::vector<int> groups;
  for (int g = 2; g <= p; g *= 2) {
    groups.push_back(g);
  }
  if (groups.back() != p) {
    groups.push_back(p);
  }
  ASSERT_EQ(result.ranks_per_node, p);
  EXPECT_FALSE(result.inter_node_measured);
  ASSERT_EQ(result.measurements.size(), 5u * groups.size() * 2u);
  for (const CommMeasurement& m : result.measurements) {
    EXPECT_TRUE(m.bytes == 1024 || m.bytes == 4096) << m.bytes;
    EXPECT_GT(m.median_s, 0.0);
    EXPECT_LE(m.p10_s, m.median_s);
    EXPECT_GE(m.p90_s, m.median_s);
    EXPECT_EQ(m.repeats, 3);
    // nccl-tests: busbw = size / time x {2(p-1)/p, (p-1)/p, 1}.
    const double g = m.ranks;
    const double factor = m.kind == Collective::all_reduce  ? 2.0 * (g - 1) / g
                          : m.kind == Collective::send_recv ? 1.0
                                                            : (g - 1) / g;
    EXPECT_DOUBLE_EQ(m.busbw(), static_cast<double>(m.bytes) / m.time_s * factor);
  }
  // Every rank holds rank 0's numbers.
  double sum = 0;
  for (const CommMeasurement& m : result.measurements) {
    sum += m.time_s;
  }
  double extremes[2] = {sum, -sum};
  comm.all_reduce(make_view(extremes, ScalarType::fp64, DeviceKind::cpu, {2}), ReduceOp::max);
  EXPECT_EQ(extremes[0], sum);
  EXPECT_EQ(-extremes[1], sum);

  // Into a profile, through TOML, back: the planner's times at the measured
  // sizes are the medians; between them the log-log midpoint (geometric mean).
  const DeviceProfile profile = with_measured_network(load_profile("cpu-generic"), result);
  const DeviceProfile back = parse_profile_toml(to_toml(profile), "comm-test.toml");
  check_profile_usable(back, "comm-test.toml");
  ASSERT_TRUE(back.network.present);
  EXPECT_EQ(back.network.gpus_per_node, p);
  EXPECT_EQ(back.network.intra_node.tables.size(), 5u * groups.size());
  EXPECT_TRUE(back.network.inter_node.tables.empty());
  EXPECT_NE(back.network.inter_node.name.find("not measured"), std::string::npos);
  EXPECT_EQ(back.provenance.at("network_ranks"), std::to_string(p));
  EXPECT_EQ(back.provenance.at("network_engine").rfind("mpi (", 0), 0u);
  const CommMeasurement* small = nullptr;
  const CommMeasurement* large = nullptr;
  for (const CommMeasurement& m : result.measurements) {
    if (m.kind == Collective::reduce_scatter && m.ranks == p) {
      (m.bytes == 1024 ? small : large) = &m;
    }
  }
  ASSERT_TRUE(small && large);
  const NetworkProfile& net = back.network;
  EXPECT_NEAR(collective_time_s(net, Collective::reduce_scatter, 1024, p, NetLevel::intra_node),
              small->time_s, 1e-9 * small->time_s);
  EXPECT_NEAR(collective_time_s(net, Collective::reduce_scatter, 2048, p, NetLevel::intra_node),
              std::sqrt(small->time_s * large->time_s), 1e-9 * large->time_s);
  // A group twice as large as any measured: the largest table, rescaled by
  // the bus factors (p-1)/p -> (2p-1)/(2p).
  const double rescaled = large->time_s * ((2.0 * p - 1) / (2.0 * p)) / ((p - 1.0) / p);
  EXPECT_NEAR(collective_time_s(net, Collective::reduce_scatter, 4096, 2 * p, NetLevel::intra_node),
              rescaled, 1e-9 * rescaled);
  // The fitted scalars: busbw of the largest all-reduce of the largest group,
  // latency = its smallest all-reduce / 2 ceil(log2 p) steps.
  for (const CommMeasurement& m : result.measurements) {
    if (m.kind == Collective::all_reduce && m.ranks == p && m.bytes == 4096) {
      EXPECT_NEAR(net.intra_node.bus_bandwidth, 4096.0 / m.time_s * 2.0 * (p - 1) / p,
                  1e-9 * net.intra_node.bus_bandwidth);
    }
    if (m.kind == Collective::all_reduce && m.ranks == p && m.bytes == 1024) {
      EXPECT_NEAR(net.intra_node.latency_s, m.time_s / (2.0 * std::ceil(std::log2(p))),
                  1e-9 * m.time_s);
    }
  }
  comm.barrier();
}

// The cold arrival's time of a call, on hand-made timelines (seconds on one
// clock): from the last member's start to the latest end.
TEST(CommProfile, ColdCallRunsFromTheLastArrivalToTheLatestEnd) {
  // Three members arrive at 10, 4 and 25 ms and leave at 31, 30 and 33 ms:
  // the call could not start before 25 ms; the last member out left at 33.
  EXPECT_NEAR(last_arrival_call_s({0.010, 0.004, 0.025}, {0.031, 0.030, 0.033}), 0.008, 1e-15);
  // The latest end need not be the last arrival's: 2 arrives last (at 7),
  // 0 is rescheduled late and leaves at 19: 12.
  EXPECT_NEAR(last_arrival_call_s({1.0, 2.0, 7.0}, {19.0, 9.0, 8.0}), 12.0, 1e-12);
  // A member that left before the last arrived (a send completes locally)
  // counts 0, not a negative time.
  EXPECT_EQ(last_arrival_call_s({0.0, 1.0}, {0.5, 0.9}), 0.0);
  EXPECT_THROW(last_arrival_call_s({}, {}), ConfigError);
  EXPECT_THROW(last_arrival_call_s({0.0, 1.0}, {2.0}), ConfigError);
}

TEST(CommProfile, ArrivalDefaultsColdOnTheCpuAndHotOnAGpu) {
  CommProfileRequest o;
  const CommProfileOptions cpu = resolve_comm_profile_options(o, DeviceKind::cpu, 4);
  EXPECT_EQ(cpu.arrival, CommArrival::cold);
  EXPECT_EQ(cpu.compute_before_s, 2e-3);
  EXPECT_EQ(cpu.budget_s, 1.0);
  const CommProfileOptions gpu = resolve_comm_profile_options(o, DeviceKind::cuda, 4);
  EXPECT_EQ(gpu.arrival, CommArrival::hot);
  o.arrival = CommArrival::hot;
  EXPECT_EQ(resolve_comm_profile_options(o, DeviceKind::cpu, 4).budget_s, 0.2);
  o.arrival = CommArrival::cold;
  try {
    resolve_comm_profile_options(o, DeviceKind::cuda, 4);
    FAIL() << "cold arrival accepted on a GPU";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("comm_profile.arrival = cold"), std::string::npos)
        << error.what();
  }
  o = CommProfileRequest{};
  o.compute_before_s = -1.0;
  EXPECT_THROW(resolve_comm_profile_options(o, DeviceKind::cpu, 4), ConfigError);
}

// The request of optionals: unset fields take the documented defaults
// (comm_profile.hpp: 1 KiB .. 16 MiB by x4 on the CPU, 1 GiB by x2 on a GPU,
// 5 warm-up calls, 5..50 samples, 2 ms samples on the CPU); a value given,
// zero included (it once meant "the default"), is checked and a bad one is
// refused with its field, its value and what is allowed.
TEST(CommProfile, RequestDefaultsAndEveryBadFieldNamed) {
  const CommProfileOptions cpu = resolve_comm_profile_options({}, DeviceKind::cpu, 4);
  EXPECT_EQ(cpu.kinds.size(), 5u);
  EXPECT_EQ(cpu.min_bytes, 1024);
  EXPECT_EQ(cpu.max_bytes, 16 << 20);
  EXPECT_EQ(cpu.size_factor, 4.0);
  EXPECT_EQ(cpu.warmup, 5);
  EXPECT_EQ(cpu.min_repeats, 5);
  EXPECT_EQ(cpu.max_repeats, 50);
  EXPECT_EQ(cpu.sample_s, 2e-3);
  EXPECT_EQ(cpu.dtype, ScalarType::fp32);
  const CommProfileOptions gpu = resolve_comm_profile_options({}, DeviceKind::cuda, 4);
  EXPECT_EQ(gpu.max_bytes, int64_t{1} << 30);
  EXPECT_EQ(gpu.size_factor, 2.0);
  EXPECT_EQ(gpu.budget_s, 0.1);
  EXPECT_EQ(gpu.sample_s, 1e-3);
  // A larger min_repeats alone raises the default max_repeats with it.
  CommProfileRequest more;
  more.min_repeats = 80;
  EXPECT_EQ(resolve_comm_profile_options(more, DeviceKind::cpu, 4).max_repeats, 80);

  struct Bad {
    const char* expected;  // "comm_profile.FIELD = VALUE"
    void (*set)(CommProfileRequest&);
  };
  const Bad cases[] = {
      {"comm_profile.min_bytes = 0", [](CommProfileRequest& r) { r.min_bytes = 0; }},
      {"comm_profile.max_bytes = 0", [](CommProfileRequest& r) { r.max_bytes = 0; }},
      {"comm_profile.max_bytes = 512",
       [](CommProfileRequest& r) {
         r.min_bytes = 1024;
         r.max_bytes = 512;
       }},
      {"comm_profile.size_factor = 0", [](CommProfileRequest& r) { r.size_factor = 0.0; }},
      {"comm_profile.warmup = -1", [](CommProfileRequest& r) { r.warmup = -1; }},
      {"comm_profile.min_repeats = 0", [](CommProfileRequest& r) { r.min_repeats = 0; }},
      {"comm_profile.max_repeats = 2",
       [](CommProfileRequest& r) {
         r.min_repeats = 3;
         r.max_repeats = 2;
       }},
      {"comm_profile.budget_s = 0", [](CommProfileRequest& r) { r.budget_s = 0.0; }},
      {"comm_profile.sample_s = 0", [](CommProfileRequest& r) { r.sample_s = 0.0; }},
      {"comm_profile.compute_before_s = 0",
       [](CommProfileRequest& r) { r.compute_before_s = 0.0; }},
      {"comm_profile.dtype = i32", [](CommProfileRequest& r) { r.dtype = ScalarType::i32; }},
      {"comm_profile.group_sizes = 5",
       [](CommProfileRequest& r) {
         r.group_sizes = {2, 5};
       }},
  };
  for (const Bad& bad : cases) {
    CommProfileRequest request;
    bad.set(request);
    try {
      resolve_comm_profile_options(request, DeviceKind::cpu, 4);
      ADD_FAILURE() << "accepted: " << bad.expected;
    } catch (const ConfigError& error) {
      const std::string what = error.what();
      EXPECT_EQ(what.rfind(bad.expected, 0), 0u) << what;
      EXPECT_EQ(what.find("--"), std::string::npos) << "a library error names a flag: " << what;
    }
  }
}

// Cold: one call per sample after the compute burst (its length recorded in
// the provenance); hot: the provenance says so.
TEST(CommProfile, ColdSamplesAreOneCallAfterTheBurst) {
  Communicator& comm = *world().comm;
  if (comm.size() == 1) {
    GTEST_SKIP() << "profile --comm needs 2 ranks (the world has 1)";
  }
  CommProfileRequest o = tiny();
  o.kinds = {Collective::all_reduce};
  o.max_bytes = 1024;
  o.group_sizes = {2};
  o.arrival = CommArrival::cold;
  o.compute_before_s = 0.05;
  o.min_repeats = 3;
  o.max_repeats = 3;
  const CommProfileResult result = run_comm_profile(*world().cpu, comm, o);
  ASSERT_EQ(result.measurements.size(), 1u);
  const CommMeasurement& m = result.measurements[0];
  EXPECT_EQ(m.inner, 1);
  EXPECT_EQ(m.repeats, 3);
  EXPECT_GT(m.median_s, 0.0);
  // Cold: the table's time is the mean of the 3 samples, so it lies within
  // [min, max] of them and is at least a third of their max (all >= 0).
  EXPECT_GT(m.time_s, 0.0);
  EXPECT_GE(m.time_s, m.p10_s * (1 - 1e-12));
  EXPECT_GE(m.time_s, m.p90_s / 3.0 * (1 - 1e-12));
  EXPECT_EQ(result.provenance.at("network_arrival").rfind("cold: ", 0), 0u);
  EXPECT_NE(result.provenance.at("network_arrival").find("spins 50 ms"), std::string::npos)
      << result.provenance.at("network_arrival");
  o.arrival = CommArrival::hot;
  const CommProfileResult hot = run_comm_profile(*world().cpu, comm, o);
  ASSERT_EQ(hot.measurements.size(), 1u);
  EXPECT_EQ(hot.measurements[0].time_s, hot.measurements[0].median_s);  // hot: the median
  EXPECT_EQ(hot.provenance.at("network_arrival").rfind("hot: ", 0), 0u);
  comm.barrier();
}

// The planner picks, among the tables of a kind, the one measured at the
// group size nearest the asked one (log2), and rescales by the bus factor.
TEST(CommProfile, PlannerUsesTheNearestGroupSize) {
  NetworkProfile net;
  net.present = true;
  net.intra_node.bus_bandwidth = 1e9;
  net.inter_node.bus_bandwidth = 1e9;
  CollectiveTable two{Collective::all_reduce, 2, {1e3, 1e6}, {1e-5, 1e-3}};
  CollectiveTable eight{Collective::all_reduce, 8, {1e3, 1e6}, {4e-5, 5e-3}};
  net.intra_node.tables = {two, eight};
  // Exact group sizes: the tables themselves.
  EXPECT_DOUBLE_EQ(collective_time_s(net, Collective::all_reduce, 1e6, 2, NetLevel::intra_node), 1e-3);
  EXPECT_DOUBLE_EQ(collective_time_s(net, Collective::all_reduce, 1e6, 8, NetLevel::intra_node), 5e-3);
  // 16 ranks: nearest 8; bus factors 2*15/16 over 2*7/8.
  EXPECT_DOUBLE_EQ(collective_time_s(net, Collective::all_reduce, 1e6, 16, NetLevel::intra_node),
                   5e-3 * (30.0 / 16.0) / (14.0 / 8.0));
  // 3 ranks: log2 3 = 1.58 is nearer 1 (2 ranks) than 3 (8 ranks).
  EXPECT_DOUBLE_EQ(collective_time_s(net, Collective::all_reduce, 1e6, 3, NetLevel::intra_node),
                   1e-3 * (4.0 / 3.0) / 1.0);
  // 4 ranks: equally near 2 and 8 -> the larger, 8.
  EXPECT_DOUBLE_EQ(collective_time_s(net, Collective::all_reduce, 1e6, 4, NetLevel::intra_node),
                   5e-3 * 1.5 / 1.75);
  // Outside the measured sizes: the formula.  The plain one (latency 0 here)
  // is factor x bytes / busbw; NCCL's protocol model (the default) adds its
  // own per-step latencies to the same bandwidth term, so it is at least that
  // and, for a 10 MB message, within 1% of it.
  const double plain = 1.75 * 1e7 / 1e9;
  EXPECT_DOUBLE_EQ(collective_time_s(net, Collective::all_reduce, 1e7, 8, NetLevel::intra_node, 1,
                                     CollectiveEfficiency{.nccl_protocols = false}),
                   plain);
  const double nccl =
      collective_time_s(net, Collective::all_reduce, 1e7, 8, NetLevel::intra_node);
  EXPECT_GE(nccl, plain);
  EXPECT_LE(nccl, 1.01 * plain);
}

}  // namespace
}  // namespace modar::runtime
