// runtime/calibration/comm_profile.cpp: `modar profile --comm`, the collectives timed
// over message sizes and group sizes (definitions and procedure:
// modar/runtime/comm_profile.hpp), and the [network] levels fitted to them.
#include "modar/runtime/comm_profile.hpp"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <sstream>

#include "modar/base/clock.hpp"
#include "modar/base/enum_names.hpp"
#include "modar/base/errors.hpp"
#include "modar/base/files.hpp"
#include "modar/base/interrupt.hpp"
#include "modar/base/text.hpp"
#include "modar/runtime/comm_engine.hpp"
#include "modar/runtime/host_facts.hpp"
#include "modar/runtime/profiler.hpp"

namespace modar::runtime {

namespace {

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * kKiB;
constexpr int64_t kGiB = 1024 * kMiB;

// Powers of two up to `ranks`, and `ranks` itself.
std::vector<int> default_group_sizes(int ranks) {
  std::vector<int> sizes;
  for (int g = 2; g <= ranks; g *= 2) {
    sizes.push_back(g);
  }
  if (ranks >= 2 && (sizes.empty() || sizes.back() != ranks)) {
    sizes.push_back(ranks);
  }
  return sizes;
}

// The buffers of one call: elements of `in` and `out` for a vector of `count`
// elements over `g` ranks (count already a multiple of g where it must be).
struct CallSizes {
  int64_t in = 0;
  int64_t out = 0;
};
CallSizes call_sizes(Collective kind, int64_t count, int g) {
  switch (kind) {
    case Collective::all_reduce:
      return {count, 0};
    case Collective::reduce_scatter:
      return {count, count / g};
    case Collective::all_gather:
      return {count / g, count};
    case Collective::all_to_all:
    case Collective::send_recv:
      return {count, count};
  }
  return {count, count};
}

void run_once(Communicator& group, Collective kind, const TensorView& in, const TensorView& out) {
  switch (kind) {
    case Collective::all_reduce:
      group.all_reduce(in, ReduceOp::sum);
      return;
    case Collective::reduce_scatter:
      group.reduce_scatter(in, out);
      return;
    case Collective::all_gather:
      group.all_gather(in, out);
      return;
    case Collective::all_to_all:
      group.all_to_all(in, out);
      return;
    case Collective::send_recv: {
      const int g = group.size();
      group.send_recv(in, (group.rank() + 1) % g, out, (group.rank() + g - 1) % g);
      return;
    }
  }
}

// The level's fitted figures from its tables (comm_profile.hpp).
void fit_level(NetworkLevel& level, const std::vector<CommMeasurement>& points, NetLevel which) {
  const CommMeasurement* largest = nullptr;   // all-reduce, largest group, largest size
  const CommMeasurement* smallest = nullptr;  // all-reduce, largest group, smallest size
  double best_busbw = 0.0;
  for (const CommMeasurement& m : points) {
    if (m.level != which) {
      continue;
    }
    best_busbw = std::max(best_busbw, m.busbw());
    if (m.kind != Collective::all_reduce) {
      continue;
    }
    if (largest == nullptr || m.ranks > largest->ranks ||
        (m.ranks == largest->ranks && m.bytes > largest->bytes)) {
      largest = &m;
    }
    if (smallest == nullptr || m.ranks > smallest->ranks ||
        (m.ranks == smallest->ranks && m.bytes < smallest->bytes)) {
      smallest = &m;
    }
  }
  level.bus_bandwidth = largest != nullptr ? largest->busbw() : best_busbw;
  if (smallest != nullptr) {
    const double steps = 2.0 * std::ceil(std::log2(static_cast<double>(smallest->ranks)));
    level.latency_s = smallest->time_s / std::max(1.0, steps);
  }
  // Tables: one per (kind, group size), ascending sizes.
  level.tables.clear();
  for (const CommMeasurement& m : points) {
    if (m.level != which) {
      continue;
    }
    auto it = std::find_if(level.tables.begin(), level.tables.end(), [&](const CollectiveTable& t) {
      return t.kind == m.kind && t.ranks == m.ranks;
    });
    if (it == level.tables.end()) {
      CollectiveTable table;
      table.kind = m.kind;
      table.ranks = m.ranks;
      level.tables.push_back(table);
      it = level.tables.end() - 1;
    }
    it->sizes_bytes.push_back(static_cast<double>(m.bytes));
    it->times_s.push_back(m.time_s);
  }
}

// Spins `seconds` of this thread's CPU time (the cold arrival's compute).
void spin_thread_cpu_s(double seconds) {
  auto thread_cpu_s = [] {
    timespec now{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
  };
  const double until = thread_cpu_s() + seconds;
  volatile double sink = 1.0;
  while (thread_cpu_s() < until) {
    for (int i = 0; i < 256; ++i) {
      sink = sink * 1.0000001 + 1e-9;
    }
  }
}

}  // namespace

constexpr const char* kCommArrivalNames[] = {"automatic", "hot", "cold"};
const char* to_string(CommArrival v) {
  return name_of(kCommArrivalNames, v, "?");
}

double last_arrival_call_s(const std::vector<double>& starts_s, const std::vector<double>& ends_s) {
  if (starts_s.empty() || starts_s.size() != ends_s.size()) {
    throw ConfigError("last_arrival_call_s: " + std::to_string(starts_s.size()) + " starts and " +
                      std::to_string(ends_s.size()) + " ends: one of each per member is needed");
  }
  const double last_start = *std::max_element(starts_s.begin(), starts_s.end());
  double time_s = 0.0;
  for (double end : ends_s) {
    time_s = std::max(time_s, end - last_start);
  }
  return time_s;
}

CommProfileOptions resolve_comm_profile_options(const CommProfileRequest& request,
                                                DeviceKind device, int world_size) {
  const bool gpu = device == DeviceKind::cuda;
  CommProfileOptions o;
  o.kinds = request.kinds;
  if (o.kinds.empty()) {
    for (int i = 0; i < kCollectiveCount; ++i) {
      o.kinds.push_back(static_cast<Collective>(i));
    }
  }
  o.group_sizes = request.group_sizes;
  o.min_bytes = request.min_bytes.value_or(kKiB);
  o.max_bytes = request.max_bytes.value_or(gpu ? kGiB : 16 * kMiB);
  o.size_factor = request.size_factor.value_or(gpu ? 2.0 : 4.0);
  o.dtype = request.dtype.value_or(ScalarType::fp32);
  o.warmup = request.warmup.value_or(5);
  o.min_repeats = request.min_repeats.value_or(5);
  o.max_repeats = request.max_repeats.value_or(std::max(50, o.min_repeats));
  o.arrival = request.arrival.value_or(CommArrival::automatic);
  if (o.arrival == CommArrival::automatic) {
    o.arrival = gpu ? CommArrival::hot : CommArrival::cold;
  }
  o.compute_before_s = request.compute_before_s.value_or(2e-3);
  o.budget_s = request.budget_s.value_or(gpu ? 0.1 : (o.arrival == CommArrival::cold ? 1.0 : 0.2));
  o.sample_s = request.sample_s.value_or(gpu ? 1e-3 : 2e-3);
  o.progress = request.progress;
  auto fail = [](const std::string& field, const std::string& value, const std::string& allowed) {
    throw ConfigError("comm_profile." + field + " = " + value + ": " + allowed);
  };
  if (o.min_bytes < 16) {
    fail("min_bytes", std::to_string(o.min_bytes), "must be >= 16");
  }
  if (o.max_bytes < o.min_bytes || o.max_bytes > 64 * kGiB) {
    fail("max_bytes", std::to_string(o.max_bytes),
         "must be in [min_bytes = " + std::to_string(o.min_bytes) + ", 64 GiB]");
  }
  if (!(o.size_factor >= 1.1 && o.size_factor <= 1024.0)) {
    fail("size_factor", format_general(o.size_factor, 4), "must be in [1.1, 1024]");
  }
  if (o.warmup < 0 || o.warmup > 1000) {
    fail("warmup", std::to_string(o.warmup), "must be in [0, 1000]");
  }
  if (o.min_repeats < 1 || o.min_repeats > 100000) {
    fail("min_repeats", std::to_string(o.min_repeats), "must be in [1, 100000]");
  }
  if (o.max_repeats < o.min_repeats || o.max_repeats > 100000) {
    fail("max_repeats", std::to_string(o.max_repeats),
         "must be in [min_repeats = " + std::to_string(o.min_repeats) + ", 100000]");
  }
  if (!(o.budget_s > 0.0 && o.budget_s <= 3600.0)) {
    fail("budget_s", format_general(o.budget_s, 4), "must be in (0, 3600] seconds");
  }
  if (!(o.sample_s > 0.0 && o.sample_s <= 10.0)) {
    fail("sample_s", format_general(o.sample_s, 4), "must be in (0, 10] seconds");
  }
  if (o.arrival == CommArrival::cold && gpu) {
    fail("arrival", "cold", "the cpu backend only (a GPU collective is timed hot, back to back)");
  }
  if (!(o.compute_before_s > 0.0 && o.compute_before_s <= 1.0)) {
    fail("compute_before_s", format_general(o.compute_before_s, 4), "must be in (0, 1] seconds");
  }
  if (o.dtype == ScalarType::i32) {
    fail("dtype", "i32", "must be fp64, fp32 or bf16");
  }
  for (int g : o.group_sizes) {
    if (g < 2 || g > world_size) {
      fail("group_sizes", std::to_string(g),
           "must be in [2, " + std::to_string(world_size) + "] (the ranks mpirun started)");
    }
  }
  return o;
}

namespace {

// What one group's points share: the resolved settings, the measured
// communicator and its control channel (host MPI), the buffers.
struct GroupRun {
  const CommProfileOptions& o;
  Backend& backend;
  Communicator& group;
  Communicator& control;
  const Tensor& in_buffer;
  const Tensor& out_buffer;
};

// Hot: one sample of `inner` back-to-back calls; the max over the group of
// the seconds per call (every member stops together on Ctrl-C).
double hot_sample(const GroupRun& run, Timer& timer, Collective kind, const TensorView& in,
                  const TensorView& out, int inner) {
  run.backend.synchronize();
  run.control.barrier();
  timer.start();
  for (int i = 0; i < inner; ++i) {
    run_once(run.group, kind, in, out);
  }
  timer.stop();
  double values[2] = {timer.elapsed_s() / inner, interrupt_requested() ? 1.0 : 0.0};
  run.control.all_reduce(make_view(values, ScalarType::fp64, DeviceKind::cpu, {2}), ReduceOp::max);
  if (values[1] != 0.0) {
    throw Interrupted("interrupted (Ctrl-C) during the communication profile");
  }
  return values[0];
}

// Cold: one call after a compute burst, timed from the last member's arrival
// (comm_profile.hpp); every member gets the same value.
double cold_sample(const GroupRun& run, Collective kind, const TensorView& in,
                   const TensorView& out) {
  const int members = run.group.size();
  std::vector<double> exchanged(static_cast<size_t>(members) * 3);
  spin_thread_cpu_s(run.o.compute_before_s);
  double mine[3] = {steady_now_s(), 0.0, 0.0};
  run_once(run.group, kind, in, out);
  run.backend.synchronize();
  mine[1] = steady_now_s();
  mine[2] = interrupt_requested() ? 1.0 : 0.0;
  run.control.all_gather(make_view(mine, ScalarType::fp64, DeviceKind::cpu, {3}),
                         make_view(exchanged.data(), ScalarType::fp64, DeviceKind::cpu,
                                   {static_cast<int64_t>(exchanged.size())}));
  std::vector<double> starts, ends;
  for (int r = 0; r < members; ++r) {
    starts.push_back(exchanged[static_cast<size_t>(r) * 3]);
    ends.push_back(exchanged[static_cast<size_t>(r) * 3 + 1]);
    if (exchanged[static_cast<size_t>(r) * 3 + 2] != 0.0) {
      throw Interrupted("interrupted (Ctrl-C) during the communication profile");
    }
  }
  return last_arrival_call_s(starts, ends);
}

// One point (kind, count elements) on the group: warm-up, then samples
// until the budget is spent; the group's time with its spread.
CommMeasurement measure_comm_point(const GroupRun& run, Collective kind, int64_t count) {
  const CommProfileOptions& o = run.o;
  const int g = run.group.size();
  const CallSizes sizes = call_sizes(kind, count, g);
  const TensorView in = slice(run.in_buffer.view(), 0, sizes.in);
  const TensorView out = sizes.out > 0 ? slice(run.out_buffer.view(), 0, sizes.out) : TensorView{};
  for (int i = 0; i < o.warmup; ++i) {
    run_once(run.group, kind, in, out);
  }
  std::vector<double> samples;
  int inner = 1;
  if (o.arrival == CommArrival::cold) {
    // Wall time, bursts included, bounds a point; rank 0's clock decides for
    // all (broadcast), so that every member stops at the same sample.
    const double began = steady_now_s();
    for (;;) {
      samples.push_back(cold_sample(run, kind, in, out));
      double more = static_cast<int>(samples.size()) < o.min_repeats ||
                            (steady_now_s() - began < o.budget_s &&
                             static_cast<int>(samples.size()) < o.max_repeats)
                        ? 1.0
                        : 0.0;
      run.control.broadcast(make_view(&more, ScalarType::fp64, DeviceKind::cpu, {1}), 0);
      if (more == 0.0) {
        break;
      }
    }
  } else {
    std::unique_ptr<Timer> timer = run.backend.make_timer();
    const double probe_s = hot_sample(run, *timer, kind, in, out, 1);
    inner =
        static_cast<int>(std::clamp(std::ceil(o.sample_s / std::max(probe_s, 1e-9)), 1.0, 10000.0));
    double spent_s = probe_s;
    while (static_cast<int>(samples.size()) < o.min_repeats ||
           (spent_s < o.budget_s && static_cast<int>(samples.size()) < o.max_repeats)) {
      const double s = hot_sample(run, *timer, kind, in, out, inner);
      samples.push_back(s);
      spent_s += s * inner;
    }
  }
  const TimingStats stats = summarize_samples(samples);
  CommMeasurement m;
  m.kind = kind;
  m.ranks = g;
  m.bytes = count * scalar_bytes(o.dtype);
  m.median_s = stats.median_s;
  m.time_s = stats.median_s;
  if (o.arrival == CommArrival::cold) {
    double sum_s = 0.0;
    for (double v : samples) {
      sum_s += v;
    }
    m.time_s = sum_s / static_cast<double>(samples.size());
  }
  m.p10_s = stats.p10_s;
  m.p90_s = stats.p90_s;
  m.repeats = static_cast<int>(stats.repeats);
  m.inner = inner;
  return m;
}

// Every rank gets rank 0's measurements (members of the last group know
// theirs only): broadcast them as doubles.
void share_rank0_measurements(Communicator& control_world, CommProfileResult& result) {
  double points = static_cast<double>(result.measurements.size());
  control_world.broadcast(make_view(&points, ScalarType::fp64, DeviceKind::cpu, {1}), 0);
  const int64_t count = static_cast<int64_t>(points);
  std::vector<double> packed(static_cast<size_t>(count) * 10);
  for (size_t i = 0; i < result.measurements.size() && control_world.rank() == 0; ++i) {
    const CommMeasurement& m = result.measurements[i];
    double* p = &packed[i * 10];
    p[0] = static_cast<double>(m.kind);
    p[1] = static_cast<double>(m.level);
    p[2] = m.ranks;
    p[3] = static_cast<double>(m.bytes);
    p[4] = m.median_s;
    p[5] = m.p10_s;
    p[6] = m.p90_s;
    p[7] = m.repeats;
    p[8] = m.inner;
    p[9] = m.time_s;
  }
  if (count > 0) {
    control_world.broadcast(
        make_view(packed.data(), ScalarType::fp64, DeviceKind::cpu, {count * 10}), 0);
  }
  result.measurements.clear();
  for (int64_t i = 0; i < count; ++i) {
    const double* p = &packed[static_cast<size_t>(i) * 10];
    CommMeasurement m;
    m.kind = static_cast<Collective>(static_cast<int>(p[0]));
    m.level = static_cast<NetLevel>(static_cast<int>(p[1]));
    m.ranks = static_cast<int>(p[2]);
    m.bytes = static_cast<int64_t>(p[3]);
    m.median_s = p[4];
    m.p10_s = p[5];
    m.p90_s = p[6];
    m.repeats = static_cast<int>(p[7]);
    m.inner = static_cast<int>(p[8]);
    m.time_s = p[9];
    result.measurements.push_back(m);
  }
}

// The levels fitted to the measurements, named, and the run's network_*
// provenance (engine, transport, placement, procedure, date, load).
void fit_and_describe(const Backend& backend, const std::string& engine,
                      const CommProfileOptions& o, CommProfileResult& result) {
  const bool nccl = engine.rfind("nccl", 0) == 0;
  const std::string transport =
      nccl ? "NCCL's choice: NVLink / NVSwitch or PCIe peer-to-peer within a node, the NICs "
             "between nodes (NCCL_DEBUG=INFO prints it)"
           : (result.nodes == 1 ? "shared memory within one node (Open MPI: btl vader / sm)"
                                : "shared memory within nodes, Open MPI's network BTL between");
  fit_level(result.intra_node, result.measurements, NetLevel::intra_node);
  result.intra_node.name = "measured: " + engine + ", " + std::to_string(result.ranks_per_node) +
                           " ranks per node (" + to_string(backend.device()) + ")";
  if (result.inter_node_measured) {
    fit_level(result.inter_node, result.measurements, NetLevel::inter_node);
    result.inter_node.name =
        "measured: " + engine + ", one rank per node, " + std::to_string(result.nodes) + " nodes";
  }
  const HostFacts host = read_host_facts();
  std::string env_settings;
  for (const char* name : {"OMPI_MCA_btl", "OMPI_MCA_pml", "NCCL_ALGO", "NCCL_PROTO",
                           "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_HCA", "NCCL_NET"}) {
    if (const char* value = std::getenv(name)) {
      env_settings += std::string(env_settings.empty() ? "" : ", ") + name + "=" + value;
    }
  }
  auto& p = result.provenance;
  p["network_engine"] = engine;
  p["network_transport"] = transport + (env_settings.empty() ? "" : " (" + env_settings + ")");
  p["network_ranks"] = std::to_string(result.world_size);
  p["network_ranks_per_node"] = std::to_string(result.ranks_per_node);
  p["network_nodes"] = std::to_string(result.nodes);
  p["network_device"] = backend.name() + (host.cpu_model.empty() ? "" : " on " + host.cpu_model) +
                        ", " + std::to_string(host.logical_cpus) + " logical CPUs";
  p["network_dtype"] = to_string(o.dtype);
  const std::string sampling =
      o.arrival == CommArrival::cold
          ? "samples of one call each, timed from the group's last arrival to the end (the max "
            "over its ranks), the table's time their MEAN (the spread from the median)"
          : "samples of ~" + format_general(o.sample_s * 1e3, 4) +
                " ms of back-to-back calls, the max over the group's ranks per sample, the "
                "median of the samples";
  p["network_how"] =
      "modar profile --comm: nccl-tests definitions (size = full vector, algbw = size / time, "
      "busbw = algbw x bus factor); one group at a time (ranks [0, g) of node 0; inter-node: "
      "one rank per node); " +
      std::to_string(o.warmup) + " warm-up calls, " + sampling + ", " +
      std::to_string(o.min_repeats) + ".." + std::to_string(o.max_repeats) + " samples within " +
      format_general(o.budget_s, 4) + " s per point; sizes " + std::to_string(o.min_bytes) + ".." +
      std::to_string(o.max_bytes) + " B by x" + format_general(o.size_factor, 4);
  p["network_arrival"] =
      o.arrival == CommArrival::cold
          ? "cold: before each timed call every rank of the group spins " +
                format_general(o.compute_before_s * 1e3, 4) +
                " ms of its thread CPU time (a step's compute), then calls; the time runs from "
                "the last rank's arrival (latest steady-clock start) to each rank's end, max over "
                "ranks: modar validate --parallel's transfer"
          : "hot: back-to-back calls, every rank already in the collective loop";
  p["network_date"] = utc_now_iso8601();
  // A shared machine's load is part of what was measured (oversubscribed
  // ranks wait for a core): /proc/loadavg at the end of the run.
  const std::string load = load_average();
  if (load != "unknown") {
    p["network_load_average"] = load + " (1, 5, 15 min, /proc/loadavg at the end of the run)";
  }
  p["network_points"] = std::to_string(result.measurements.size());
  double worst_spread = 0.0;
  for (const CommMeasurement& m : result.measurements) {
    worst_spread = std::max(worst_spread, m.spread());
  }
  p["network_worst_spread"] = format_general(worst_spread, 3);
  if (backend.device() == DeviceKind::cpu && result.ranks_per_node > host.logical_cpus &&
      host.logical_cpus > 0) {
    p["network_oversubscribed"] =
        std::to_string(result.ranks_per_node) + " ranks on " + std::to_string(host.logical_cpus) +
        " logical CPUs: ranks share cores, so times include waiting for a core (wall time)";
  }
}

// One progress line per point (rank 0).
void print_comm_point(FILE* progress, const CommMeasurement& m,
                      std::chrono::steady_clock::time_point started) {
  std::fprintf(progress,
               "profile --comm: %-14s %-10s ranks %d  %11lld B  %10.3f us  "
               "busbw %8.3f GB/s  (%d x %d calls, %.0f s)\n",
               to_string(m.kind), to_string(m.level), m.ranks, static_cast<long long>(m.bytes),
               m.time_s * 1e6, m.busbw() / 1e9, m.repeats, m.inner,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  std::fflush(progress);
}

}  // namespace

CommProfileResult run_comm_profile(Backend& backend, Communicator& world,
                                   const CommProfileRequest& request) {
  if (world.size() < 2) {
    throw ConfigError(
        "communication profile: the world has 1 rank (engine " + world.engine() +
        "): communication needs at least 2; allowed: a world of 2 or more ranks (run under "
        "mpirun, e.g. mpirun -np 4)");
  }
  if (world.device() != backend.device()) {
    throw ConfigError(std::string("communication profile: the communicator's device (") +
                      to_string(world.device()) + ") is not the backend's (" +
                      to_string(backend.device()) + ")");
  }
  const CommProfileOptions o = resolve_comm_profile_options(request, backend.device(), world.size());
  // Control traffic (sample times, stop decisions) over MPI on the host, so
  // that it never competes with the measured engine's device stream.
  std::unique_ptr<Backend> host_backend = make_cpu_backend();
  std::unique_ptr<Communicator> control_world = backend.device() == DeviceKind::cpu
                                                    ? world.split(0, world.rank())
                                                    : make_world_communicator(*host_backend);
  const int rank = world.rank();
  CommProfileResult result;
  result.world_size = world.size();
  result.ranks_per_node = std::max(1, comm_detail::mpi_world_ranks_on_node());
  if (result.world_size % result.ranks_per_node != 0) {
    result.ranks_per_node = result.world_size;  // irregular placement: treat as one node
  }
  result.nodes = result.world_size / result.ranks_per_node;
  result.inter_node_measured = result.nodes >= 2;

  // Buffers for the largest point.
  const int64_t element_bytes = scalar_bytes(o.dtype);
  const int64_t max_count = o.max_bytes / element_bytes;
  Tensor in_buffer(backend, {max_count}, o.dtype);
  Tensor out_buffer(backend, {max_count}, o.dtype);
  backend.fill(in_buffer, 0.0);
  backend.fill(out_buffer, 0.0);
  backend.synchronize();

  std::vector<int64_t> byte_sizes;
  for (double b = static_cast<double>(o.min_bytes); b <= static_cast<double>(o.max_bytes) * 1.0001;
       b *= o.size_factor) {
    byte_sizes.push_back(static_cast<int64_t>(std::llround(b)));
  }

  struct Level {
    NetLevel level;
    int ranks;  // ranks available to groups of this level
  };
  std::vector<Level> levels = {{NetLevel::intra_node, result.ranks_per_node}};
  if (result.inter_node_measured) {
    levels.push_back({NetLevel::inter_node, result.nodes});
  }
  const auto started = std::chrono::steady_clock::now();
  for (const Level& level : levels) {
    std::vector<int> groups;
    for (int g : (o.group_sizes.empty() ? default_group_sizes(level.ranks) : o.group_sizes)) {
      if (g >= 2 && g <= level.ranks) {
        groups.push_back(g);
      }
    }
    for (int g : groups) {
      // Members: ranks [0, g) of node 0, or local rank 0 of nodes [0, g).
      const int node = rank / result.ranks_per_node;
      const int local = rank % result.ranks_per_node;
      const bool member = level.level == NetLevel::intra_node ? (node == 0 && local < g)
                                                              : (local == 0 && node < g);
      std::unique_ptr<Communicator> group = world.split(member ? 0 : -1, rank);
      std::unique_ptr<Communicator> control = control_world->split(member ? 0 : -1, rank);
      if (member) {
        const GroupRun run{o, backend, *group, *control, in_buffer, out_buffer};
        for (Collective kind : o.kinds) {
          for (int64_t bytes : byte_sizes) {
            int64_t count = bytes / element_bytes;
            if (kind != Collective::all_reduce && kind != Collective::send_recv) {
              count -= count % g;
            }
            if (count < g) {
              continue;
            }
            CommMeasurement m = measure_comm_point(run, kind, count);
            m.level = level.level;
            result.measurements.push_back(m);
            if (o.progress != nullptr && rank == 0) {
              print_comm_point(o.progress, m, started);
            }
          }
        }
      }
      group.reset();
      control.reset();
      control_world->barrier();
    }
  }
  share_rank0_measurements(*control_world, result);
  fit_and_describe(backend, world.engine(), o, result);
  return result;
}

DeviceProfile with_measured_network(const DeviceProfile& base, const CommProfileResult& result) {
  DeviceProfile profile = base;
  const bool had_network = base.network.present;
  NetworkProfile& net = profile.network;
  net.present = true;
  net.gpus_per_node = result.ranks_per_node;
  auto keep_link = [](NetworkLevel measured, const NetworkLevel& old) {
    measured.link_bandwidth = old.link_bandwidth;
    return measured;
  };
  net.intra_node = keep_link(result.intra_node, base.network.intra_node);
  if (result.inter_node_measured) {
    net.inter_node = keep_link(result.inter_node, base.network.inter_node);
  } else if (!had_network) {
    net.inter_node = result.intra_node;
    net.inter_node.tables.clear();
    net.inter_node.name = "not measured (one node): the intra-node figures copied";
  }
  for (auto it = profile.provenance.begin(); it != profile.provenance.end();) {
    it = it->first.rfind("network", 0) == 0 ? profile.provenance.erase(it) : std::next(it);
  }
  for (const auto& [key, value] : result.provenance) {
    profile.provenance[key] = value;
  }
  if (!result.inter_node_measured) {
    profile.provenance["network_inter_node"] =
        had_network ? "not measured (one node): kept from the base profile"
                    : "not measured (one node): the intra-node figures copied";
  }
  return profile;
}

std::string comm_profile_table(const CommProfileResult& result) {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof(line), "%-14s %-10s %5s %12s %12s %7s %10s %10s\n", "collective",
                "level", "ranks", "size_B", "time_us", "spread", "algbw_GB/s", "busbw_GB/s");
  out << line;
  for (const CommMeasurement& m : result.measurements) {
    std::snprintf(line, sizeof(line), "%-14s %-10s %5d %12lld %12.2f %7.3f %10.3f %10.3f\n",
                  to_string(m.kind), to_string(m.level), m.ranks, static_cast<long long>(m.bytes),
                  m.time_s * 1e6, m.spread(), m.algbw() / 1e9, m.busbw() / 1e9);
    out << line;
  }
  return out.str();
}

}  // namespace modar::runtime
