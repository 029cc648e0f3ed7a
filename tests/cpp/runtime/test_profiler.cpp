// Profiler: statistics, every op kind executes, skipping, profile round trip,
// checkpoint / resume, rejection of partial / truncated / foreign profiles, and
// the timing model's interpolation inside a synthetic measured grid.  No
// assertion depends on how fast anything runs.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

#include "modar/base/errors.hpp"
#include "modar/cost_model.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/forwarding_backend.hpp"
#include "modar/runtime/profiler.hpp"
#include "test_ops_util.hpp"

namespace modar::runtime {
namespace {

namespace fs = std::filesystem;

OpShape shape_of(OpKind kind, std::initializer_list<int64_t> dims, DType dtype = DType::fp32) {
  OpShape shape;
  shape.kind = kind;
  shape.dtype = dtype;
  size_t i = 0;
  for (int64_t v : dims) {
    shape.dims[i++] = v;
  }
  return shape;
}

TimingOptions fast_timing() {
  TimingOptions options;
  options.budget_s = 0.002;
  options.min_repeats = 3;
  options.max_repeats = 3;
  options.min_sample_s = 0.0;
  options.rotation_bytes = 1 << 16;
  options.max_copies = 3;
  return options;
}

std::string temp_path(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("modar_test_profiler_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return (dir / name).string();
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_all(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

template <class Error, class F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return std::string();
}

TEST(ProfilerStats, PercentilesByHand) {
  // Samples 1..10 (shuffled): median = (5 + 6) / 2; p10 at position 0.9
  // between 1 and 2; p90 at position 8.1 between 9 and 10.
  const TimingStats stats = summarize_samples({7, 3, 10, 1, 5, 2, 9, 4, 8, 6});
  EXPECT_DOUBLE_EQ(stats.median_s, 5.5);
  EXPECT_DOUBLE_EQ(stats.p10_s, 1.9);
  EXPECT_DOUBLE_EQ(stats.p90_s, 9.1);
  EXPECT_EQ(stats.repeats, 10);
  EXPECT_DOUBLE_EQ(stats.spread(), (9.1 - 1.9) / 5.5);
  EXPECT_THROW(summarize_samples({}), std::invalid_argument);
}

// The CPU clock counts this process's CPU time, the wall clock elapsed time:
// a sleep shows in the wall clock only, busy work in both (CPU <= wall with
// one thread).
TEST(ProfilerClock, CpuClockExcludesSleepWallClockIncludesIt) {
  auto backend = make_cpu_backend();
  set_cpu_threads(1);
  auto cpu_timer = make_sample_timer(*backend, Clock::cpu);
  auto wall_timer = make_sample_timer(*backend, Clock::wall);
  cpu_timer->start();
  wall_timer->start();
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  cpu_timer->stop();
  wall_timer->stop();
  EXPECT_GE(wall_timer->elapsed_s(), 0.06);
  EXPECT_LT(cpu_timer->elapsed_s(), 0.02);

  cpu_timer->start();
  wall_timer->start();
  volatile double sink = 0.0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
  while (std::chrono::steady_clock::now() < until) {
    for (int i = 0; i < 1000; ++i)
      sink = sink + std::sqrt(static_cast<double>(i));
  }
  cpu_timer->stop();
  wall_timer->stop();
  EXPECT_GT(cpu_timer->elapsed_s(), 0.0);
  EXPECT_LE(cpu_timer->elapsed_s(), 1.05 * wall_timer->elapsed_s() + 2e-3);
}

TEST(ProfilerOps, WorkingSetOfGemmByHand) {
  // fp32 C[m, n] = A[m, k] B[k, n]: 4 (m k + k n + m n) bytes.
  EXPECT_EQ(op_working_set_bytes(shape_of(OpKind::gemm, {3, 5, 7, 1}), Pass::forward),
            4 * (3 * 7 + 7 * 5 + 3 * 5));
  // bf16: 2 bytes per element.
  EXPECT_EQ(op_working_set_bytes(shape_of(OpKind::gemm, {3, 5, 7, 1}, DType::bf16), Pass::forward),
            2 * (3 * 7 + 7 * 5 + 3 * 5));
}

// Small instances of every (kind, pass, categorical dims) the grid holds.
std::vector<ProfilePoint> small_points() {
  std::vector<ProfilePoint> points;
  auto add = [&](OpKind kind, std::initializer_list<int64_t> dims, Pass pass) {
    points.push_back({shape_of(kind, dims), pass});
  };
  for (const Pass pass : {Pass::forward, Pass::backward}) {
    add(OpKind::gemm, {8, 12, 16, 1}, pass);
    add(OpKind::attention, {1, 2, 2, 16, 16, 8, 1}, pass);
    add(OpKind::rmsnorm, {16, 8}, pass);
    add(OpKind::rope, {16, 4, 8}, pass);
    add(OpKind::router, {16, 8}, pass);
    add(OpKind::gather, {8, 8}, pass);
    add(OpKind::scatter_add, {8, 8}, pass);
    add(OpKind::embedding, {8, 8}, pass);
    add(OpKind::depth_read_prefix, {16, 3, 4, 8, 2, 2}, pass);
    add(OpKind::depth_read_prefix, {16, 3, 2, 8, 1, 1}, pass);
    add(OpKind::depth_read_merge, {16, 2, 8, 2}, pass);
    add(OpKind::depth_read_merge, {16, 1, 8, 1}, pass);
    add(OpKind::dar_coefficients, {16, 2, 8, 4}, pass);
    add(OpKind::dar_coefficients, {16, 2, 8, 5}, pass);
    for (const int64_t n : {1, 2}) {
      add(OpKind::dar_write, {16, n, 8, 2, 1}, pass);
      add(OpKind::dar_write, {16, n, 8, 0, 0}, pass);
      add(OpKind::dar_write, {16, n, 8, 1, 0}, pass);
      add(OpKind::dar_write, {16, n, 8, 1, 1}, pass);
    }
    add(OpKind::cross_entropy, {8, 32}, pass);
  }
  add(OpKind::topk, {2, 16, 4}, Pass::forward);
  add(OpKind::elementwise, {64, 1, 1}, Pass::forward);
  add(OpKind::elementwise, {64, 2, 1}, Pass::forward);
  add(OpKind::elementwise, {64, 2, 1}, Pass::backward);
  add(OpKind::elementwise, {64, 3, 2}, Pass::backward);
  add(OpKind::elementwise, {64, 1, 1}, Pass::backward);
  add(OpKind::optimizer_update, {100}, Pass::forward);
  for (const Pass pass : {Pass::forward, Pass::backward}) {
    add(OpKind::expert_gemm, {3, 20, 8, 6, 1500, 0}, pass);
    add(OpKind::expert_gemm, {3, 20, 8, 6, 1000, 1}, pass);
    add(OpKind::moe_topk, {16, 6, 2}, pass);
    add(OpKind::permute, {24, 8, 16}, pass);
    add(OpKind::unpermute, {24, 8, 16, 2}, pass);
  }
  return points;
}

TEST(ProfilerOps, EveryGridKindAndPassExecutesOnCpu) {
  auto backend = make_cpu_backend();
  const auto points = small_points();
  for (const ProfilePoint& point : points) {
    const OpTiming timed = measure_op(*backend, point.shape, point.pass, fast_timing());
    EXPECT_FALSE(timed.skipped) << describe(point.shape, point.pass) << ": " << timed.skip_reason;
    EXPECT_GT(timed.measurement.median_s, 0.0) << describe(point.shape, point.pass);
    EXPECT_EQ(timed.measurement.repeats, 3);
    EXPECT_GE(timed.copies, 1);
  }
  // The small list covers every (kind, pass, arity) group of both grids.
  std::set<std::string> covered;
  auto group = [](const ProfilePoint& p) {
    std::string key = std::string(to_string(p.shape.kind)) + "/" + to_string(p.pass);
    if (p.shape.kind == OpKind::elementwise) {
      key += "/" + std::to_string(p.shape.dims[1]) + "," + std::to_string(p.shape.dims[2]);
    }
    if (p.shape.kind == OpKind::dar_write) {
      key += "/" + std::to_string(p.shape.dims[1]) + "," + std::to_string(p.shape.dims[3]) + "," +
             std::to_string(p.shape.dims[4]);
    }
    return key;
  };
  for (const ProfilePoint& p : points)
    covered.insert(group(p));
  for (const GridSize size : {GridSize::quick, GridSize::full}) {
    for (const DeviceKind device : {DeviceKind::cpu, DeviceKind::cuda}) {
      for (const ProfilePoint& p : profile_grid(size, device, DType::fp32)) {
        EXPECT_TRUE(covered.count(group(p)) > 0) << "not exercised: " << group(p);
      }
    }
  }
}

TEST(ProfilerGrid, TensorProductAndOnlyForwardGemms) {
  const auto grid = profile_grid(GridSize::quick, DeviceKind::cpu, DType::fp32);
  int64_t gemms = 0;
  std::set<int64_t> m_values;
  for (const ProfilePoint& p : grid) {
    EXPECT_EQ(p.shape.dtype, DType::fp32);
    if (p.shape.kind == OpKind::gemm) {
      ++gemms;
      EXPECT_EQ(p.pass, Pass::forward);
      m_values.insert(p.shape.dims[0]);
    }
  }
  // A full cube over the m axis (n and k share it).
  const auto axis = static_cast<int64_t>(m_values.size());
  EXPECT_EQ(gemms, axis * axis * axis);
  // No duplicates (resume identifies points by their identity).
  for (size_t i = 0; i < grid.size(); ++i) {
    for (size_t j = i + 1; j < grid.size(); ++j) {
      ASSERT_FALSE(same_point(grid[i].shape, grid[i].pass, grid[j].shape, grid[j].pass))
          << describe(grid[i].shape, grid[i].pass);
    }
  }
}

// A bounded grid (--max-point-bytes, scripts/gpu-check.sh): a shape whose one
// copy of tensors exceeds the bound is recorded as skipped, one that fits runs.
TEST(ProfilerSkip, ABoundedGridSkipsShapesAboveTheBound) {
  auto backend = make_cpu_backend();
  TimingOptions options = fast_timing();
  const int64_t gemm_bytes = 4 * (64 * 64 * 3);  // fp32 A, B, C of 64^3, by hand
  options.max_point_bytes = gemm_bytes - 1;
  const OpTiming over =
      measure_op(*backend, shape_of(OpKind::gemm, {64, 64, 64, 1}), Pass::forward, options);
  EXPECT_TRUE(over.skipped);
  EXPECT_NE(over.skip_reason.find("bounded"), std::string::npos) << over.skip_reason;
  options.max_point_bytes = gemm_bytes;
  const OpTiming fits =
      measure_op(*backend, shape_of(OpKind::gemm, {64, 64, 64, 1}), Pass::forward, options);
  EXPECT_FALSE(fits.skipped) << fits.skip_reason;
}

TEST(ProfilerSkip, TooBigForTheMemoryLimitIsSkippedWithAReason) {
  auto backend = make_cpu_backend();
  TimingOptions options = fast_timing();
  options.memory_limit_bytes = 1000;
  // 4 (64*64*3) = 49152 bytes > 1000.
  const OpTiming timed =
      measure_op(*backend, shape_of(OpKind::gemm, {64, 64, 64, 1}), Pass::forward, options);
  EXPECT_TRUE(timed.skipped);
  EXPECT_NE(timed.skip_reason.find("memory limit"), std::string::npos) << timed.skip_reason;
  EXPECT_EQ(timed.working_set_bytes, 4 * 64 * 64 * 3);
  // Shapes the runtime cannot execute are skipped too, with the reason.
  const OpTiming decode = measure_op(*backend, shape_of(OpKind::attention, {1, 2, 2, 1, 16, 8, 0}),
                                     Pass::forward, fast_timing());
  EXPECT_TRUE(decode.skipped);
  EXPECT_NE(decode.skip_reason.find("s_q == s_k"), std::string::npos) << decode.skip_reason;
}

ProfileOptions small_run(const std::string& out) {
  ProfileOptions options;
  options.backend_name = "cpu";
  options.grid = GridSize::quick;
  options.dtype = DType::fp32;
  options.out_path = out;
  options.timing = fast_timing();
  options.measure_ceilings = false;
  options.points = {{shape_of(OpKind::gemm, {8, 8, 8, 1}), Pass::forward},
                    {shape_of(OpKind::rmsnorm, {16, 8}), Pass::forward},
                    {shape_of(OpKind::rmsnorm, {16, 8}), Pass::backward}};
  return options;
}

// A checkpoint as an interrupted run leaves it (placeholder ceilings).
DeviceProfile checkpoint_profile(const std::string& name, const std::string& backend,
                                 std::map<std::string, std::string> provenance) {
  DeviceProfile partial;
  partial.name = name;
  partial.backend = backend;
  partial.measured = true;
  partial.ceilings.peak_flops_bf16 = partial.ceilings.peak_flops_fp32 = 1.0;
  partial.ceilings.memory_bandwidth = partial.ceilings.memory_bytes = 1.0;
  partial.provenance = std::move(provenance);
  return partial;
}

TEST(ProfilerRun, RoundTripThroughTheFile) {
  auto backend = make_cpu_backend();
  const std::string out = temp_path("roundtrip.toml");
  ProfileOptions options = small_run(out);
  options.points.push_back({shape_of(OpKind::gemm, {4096, 4096, 4096, 1}), Pass::forward});
  options.timing.memory_limit_bytes = 1 << 20;  // the big GEMM is skipped
  const DeviceProfile written = run_profile(*backend, options);
  EXPECT_FALSE(fs::exists(partial_path(out)));
  ASSERT_EQ(written.measurements.size(), 3u);
  EXPECT_EQ(written.provenance.at("status"), "complete");
  EXPECT_EQ(written.provenance.at("skipped_count"), "1");
  EXPECT_NE(written.provenance.at("skipped.0001").find("memory limit"), std::string::npos);
  EXPECT_EQ(written.backend, "cpu");
  EXPECT_EQ(written.name, "roundtrip");
  EXPECT_EQ(written.provenance.at("clock"), "wall");

  const DeviceProfile read = load_measured_profile(out, "cpu");
  ASSERT_EQ(read.measurements.size(), written.measurements.size());
  for (size_t i = 0; i < read.measurements.size(); ++i) {
    const OpMeasurement& a = written.measurements[i];
    const OpMeasurement& b = read.measurements[i];
    EXPECT_TRUE(same_point(a.shape, a.pass, b.shape, b.pass));
    EXPECT_NEAR(b.median_s, a.median_s, 1e-12 * a.median_s);
    EXPECT_NEAR(b.spread, a.spread, 1e-12 + 1e-12 * a.spread);
    EXPECT_EQ(b.repeats, a.repeats);
  }
  EXPECT_EQ(read.provenance, written.provenance);
}

TEST(ProfilerRun, ResumeKeepsCheckpointedPointsAndMeasuresTheRest) {
  auto backend = make_cpu_backend();
  const std::string out = temp_path("resume.toml");
  ProfileOptions options = small_run(out);
  // A checkpoint as an interrupted run leaves it: the first point done, with a
  // sentinel time no measurement would produce.
  DeviceProfile partial = checkpoint_profile("resume", "cpu",
                                             {{"status", "partial"},
                                              {"grid", "quick"},
                                              {"dtype", "fp32"},
                                              {"measurement_count", "1"},
                                              {"ceilings_how", "test"}});
  OpMeasurement done;
  done.shape = options.points[0].shape;
  done.pass = options.points[0].pass;
  done.median_s = 123.0;
  done.repeats = 5;
  partial.measurements = {done};
  save_profile_atomically(partial, partial_path(out));

  // A partial profile is refused by the strict loader, with what to do.
  const std::string partial_message =
      error_message<FileError>([&] { load_measured_profile(partial_path(out), "cpu"); });
  EXPECT_NE(partial_message.find("partial"), std::string::npos) << partial_message;
  EXPECT_NE(partial_message.find("--resume"), std::string::npos) << partial_message;

  options.resume = true;
  const DeviceProfile resumed = run_profile(*backend, options);
  ASSERT_EQ(resumed.measurements.size(), 3u);
  EXPECT_EQ(resumed.measurements[0].median_s, 123.0);  // kept, not re-measured
  EXPECT_LT(resumed.measurements[1].median_s, 1.0);
  EXPECT_FALSE(fs::exists(partial_path(out)));
  EXPECT_EQ(load_measured_profile(out, "cpu").measurements.size(), 3u);
}

TEST(ProfilerRun, ResumeRefusesAForeignOrDamagedCheckpoint) {
  auto backend = make_cpu_backend();
  const std::string out = temp_path("foreign.toml");
  ProfileOptions options = small_run(out);
  options.resume = true;
  DeviceProfile partial = checkpoint_profile(
      "foreign", "cuda", {{"status", "partial"}, {"grid", "quick"}, {"dtype", "fp32"}});
  save_profile_atomically(partial, partial_path(out));
  const std::string foreign = error_message<ConfigError>([&] { run_profile(*backend, options); });
  EXPECT_NE(foreign.find("backend"), std::string::npos) << foreign;

  write_all(partial_path(out), "name = \"x\"\n[ceilings\npeak = ");
  const std::string damaged = error_message<FileError>([&] { run_profile(*backend, options); });
  EXPECT_NE(damaged.find("damaged checkpoint"), std::string::npos) << damaged;
  fs::remove(partial_path(out));
}

// A point whose op throws anything (here a std::runtime_error, not a
// ShapeError) is recorded as skipped with the reason; the run goes on.
class FailingBackend final : public ForwardingBackend {
 public:
  FailingBackend() : ForwardingBackend(testing::cpu()) {}

 protected:
  void execute(const OpArgs& call, const OpGeometry&) override {
    if (op_id(call) == OpId::rmsnorm_backward)
      throw std::runtime_error("device lost (test)");
    inner().run(call);
  }
};

TEST(ProfilerRun, APointThatThrowsAnythingIsRecordedAndSkipped) {
  FailingBackend backend;
  const std::string out = temp_path("failing.toml");
  const DeviceProfile written = run_profile(backend, small_run(out));
  ASSERT_EQ(written.measurements.size(), 2u);  // gemm and rmsnorm forward
  EXPECT_EQ(written.provenance.at("skipped_count"), "1");
  EXPECT_NE(written.provenance.at("skipped.0001").find("device lost (test)"), std::string::npos)
      << written.provenance.at("skipped.0001");
  EXPECT_NE(written.provenance.at("skipped.0001").find("rmsnorm backward"), std::string::npos);
}

// should_stop between points: Interrupted, the checkpoint keeps what was done.
TEST(ProfilerRun, StopBetweenPointsKeepsTheCheckpoint) {
  auto backend = make_cpu_backend();
  const std::string out = temp_path("stopped.toml");
  ProfileOptions options = small_run(out);
  int asked = 0;
  options.should_stop = [&asked] { return ++asked == 3; };  // before the 2nd point
  EXPECT_THROW(run_profile(*backend, options), Interrupted);
  EXPECT_FALSE(fs::exists(out));
  ASSERT_TRUE(fs::exists(partial_path(out)));
  const DeviceProfile partial = parse_profile_toml(read_all(partial_path(out)), "partial");
  EXPECT_EQ(partial.measurements.size(), 1u);
  EXPECT_EQ(partial.provenance.at("status"), "partial");
  // ... and a resumed run finishes from it.
  options.should_stop = nullptr;
  options.resume = true;
  EXPECT_EQ(run_profile(*backend, options).measurements.size(), 3u);
}

TEST(ProfilerRun, OutputProblemsAreFoundBeforeMeasuring) {
  auto backend = make_cpu_backend();
  const std::string dir = temp_path("a_directory");
  fs::create_directories(dir);
  const std::string as_dir =
      error_message<ConfigError>([&] { run_profile(*backend, small_run(dir)); });
  EXPECT_NE(as_dir.find("out_path = " + dir + ": is a directory"), std::string::npos) << as_dir;
  const std::string missing =
      error_message<ConfigError>([&] { run_profile(*backend, small_run(dir + "/no/x.toml")); });
  EXPECT_NE(missing.find("does not exist"), std::string::npos) << missing;

  // Another writer holds OUT.lock: refused, nothing written.
  const std::string out = temp_path("locked.toml");
  const int fd = ::open((out + ".lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  const std::string locked =
      error_message<ConfigError>([&] { run_profile(*backend, small_run(out)); });
  EXPECT_NE(locked.find("another profile run is writing it"), std::string::npos) << locked;
  EXPECT_FALSE(fs::exists(partial_path(out)));
  ::close(fd);
  EXPECT_EQ(run_profile(*backend, small_run(out)).measurements.size(), 3u);
  EXPECT_FALSE(fs::exists(out + ".lock"));
}

// A checkpoint measured with another clock, thread count or machine is refused
// (its times would be relabelled with this run's settings).
TEST(ProfilerRun, ResumeRefusesAnotherClockThreadsOrMachine) {
  auto backend = make_cpu_backend();
  const std::string out = temp_path("mismatch.toml");
  ProfileOptions options = small_run(out);
  options.threads = 1;
  const std::pair<const char*, const char*> foreign[] = {
      {"clock", "cpu"}, {"threads", "7"}, {"device", "Some Other CPU"}};
  for (const auto& [key, value] : foreign) {
    const DeviceProfile partial = checkpoint_profile(
        "mismatch", "cpu",
        {{"status", "partial"}, {"grid", "quick"}, {"dtype", "fp32"}, {key, value}});
    save_profile_atomically(partial, partial_path(out));
    options.resume = true;
    const std::string message = error_message<ConfigError>([&] { run_profile(*backend, options); });
    EXPECT_NE(message.find(std::string(key) + " = \"" + value + "\""), std::string::npos)
        << message;
  }
  fs::remove(partial_path(out));
}

TEST(ProfilerSettings, DefaultsAndFieldNamedErrors) {
  auto backend = make_cpu_backend();
  ProfileRequest request;
  request.out_path = temp_path("settings.toml");
  ProfileOptions options = resolve_profile_options(request, *backend);
  EXPECT_EQ(options.threads, 1);
  EXPECT_EQ(options.timing.clock, Clock::cpu);
  EXPECT_EQ(options.dtype, DType::fp32);
  EXPECT_DOUBLE_EQ(options.timing.budget_s, 0.25);
  request.quick = true;
  EXPECT_DOUBLE_EQ(resolve_profile_options(request, *backend).timing.budget_s, 0.08);
  // kinds / max_dim: only those kinds, every dim <= max_dim.
  request.kinds = {"rmsnorm"};
  request.max_dim = 512;
  options = resolve_profile_options(request, *backend);
  ASSERT_FALSE(options.points.empty());
  for (const ProfilePoint& p : options.points) {
    EXPECT_EQ(p.shape.kind, OpKind::rmsnorm);
    EXPECT_LE(std::max(p.shape.dims[0], p.shape.dims[1]), 512);
  }
  request.threads = 100000;
  const std::string threads =
      error_message<ConfigError>([&] { resolve_profile_options(request, *backend); });
  EXPECT_EQ(threads.rfind("threads = 100000: must be in [0, ", 0), 0u) << threads;
  EXPECT_THROW(set_cpu_threads(100000), ConfigError);
  request.threads.reset();
  request.kinds = {"matmul"};
  const std::string kinds =
      error_message<ConfigError>([&] { resolve_profile_options(request, *backend); });
  EXPECT_NE(kinds.find("kinds: \"matmul\""), std::string::npos) << kinds;
  EXPECT_EQ(kinds.find("--"), std::string::npos) << "library errors name fields, not flags";
}

TEST(ProfilerLoad, TruncatedCorruptedAndForeignProfilesAreRejected) {
  auto backend = make_cpu_backend();
  const std::string out = temp_path("complete.toml");
  run_profile(*backend, small_run(out));
  const std::string text = read_all(out);

  // Cut at a line boundary before the last measurement: still valid TOML, so
  // only the recorded count can tell.
  const std::string truncated_path = temp_path("truncated.toml");
  write_all(truncated_path, text.substr(0, text.rfind("[[measurements]]")));
  const std::string truncated =
      error_message<FileError>([&] { load_measured_profile(truncated_path, "cpu"); });
  EXPECT_NE(truncated.find("truncated"), std::string::npos) << truncated;

  // Cut in the middle of a line.
  write_all(truncated_path, text.substr(0, text.rfind("median_s") + 5));
  const std::string cut =
      error_message<FileError>([&] { load_measured_profile(truncated_path, "cpu"); });
  EXPECT_NE(cut.find("corrupted or truncated"), std::string::npos) << cut;

  write_all(truncated_path, "\x01\x02 not toml at all [[[");
  EXPECT_THROW(load_measured_profile(truncated_path, "cpu"), FileError);
  EXPECT_THROW(load_measured_profile(temp_path("missing.toml"), "cpu"), FileError);

  // Measured on the CPU, asked for CUDA.
  const std::string foreign =
      error_message<ConfigError>([&] { load_measured_profile(out, "cuda"); });
  EXPECT_NE(foreign.find("backend = \"cpu\""), std::string::npos) << foreign;
  EXPECT_NO_THROW(load_measured_profile(out, "cpu"));
}

// The timing model (cost_models) on a synthetic measured grid: grid points
// come back exactly; between them log(time) is linear in log(dims).
TEST(ProfileInterpolation, SyntheticGridByHand) {
  DeviceProfile profile;
  profile.name = "synthetic";
  profile.backend = "cpu";
  profile.measured = true;
  profile.ceilings.peak_flops_fp32 = profile.ceilings.peak_flops_bf16 = 1e12;
  profile.ceilings.memory_bandwidth = 1e11;
  profile.ceilings.memory_bytes = 1e10;
  // rmsnorm forward, rows in {64, 256}, d in {64, 256}: t = 1e-5 * a_rows * b_d
  // with a = {1, 4}, b = {1, 9}.
  auto add = [&](int64_t rows, int64_t d, double t) {
    OpMeasurement m;
    m.shape = shape_of(OpKind::rmsnorm, {rows, d});
    m.pass = Pass::forward;
    m.median_s = t;
    m.repeats = 5;
    profile.measurements.push_back(m);
  };
  add(64, 64, 1e-5);
  add(256, 64, 4e-5);
  add(64, 256, 9e-5);
  add(256, 256, 3.6e-4);
  const TimingModel timing(profile);
  auto predict = [&](int64_t rows, int64_t d, TimingModel::Source* source) {
    return timing.op_time_s(shape_of(OpKind::rmsnorm, {rows, d}), Pass::forward, source);
  };
  TimingModel::Source source{};
  EXPECT_DOUBLE_EQ(predict(64, 64, &source), 1e-5);
  EXPECT_EQ(source, TimingModel::Source::interpolated);
  EXPECT_DOUBLE_EQ(predict(256, 256, &source), 3.6e-4);
  EXPECT_DOUBLE_EQ(predict(256, 64, &source), 4e-5);
  // Geometric midpoint in rows (128 = sqrt(64 * 256)): sqrt(1e-5 * 4e-5) = 2e-5.
  EXPECT_NEAR(predict(128, 64, &source), 2e-5, 1e-17);
  // Midpoint in both: (1 * 4 * 9 * 36)^(1/4) * 1e-5 = 6e-5.
  EXPECT_NEAR(predict(128, 128, &source), 6e-5, 1e-16);
  // rows = 100: weight ln(100/64) / ln(4); t = 1e-5 * 4^w = 1e-5 * 100 / 64.
  EXPECT_NEAR(predict(100, 64, &source), 1.5625e-5, 1e-17);
  EXPECT_EQ(source, TimingModel::Source::interpolated);
  // Outside the grid: flagged as extrapolated.
  predict(1024, 64, &source);
  EXPECT_EQ(source, TimingModel::Source::extrapolated);
  bool extrapolated = false;
  OpRecord op;
  op.shape = shape_of(OpKind::rmsnorm, {1024, 64});
  op.pass = Pass::forward;
  predict_op_time_s(op, profile, &extrapolated);
  EXPECT_TRUE(extrapolated);
}

}  // namespace
}  // namespace modar::runtime
