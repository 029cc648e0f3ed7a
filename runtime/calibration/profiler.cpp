// runtime/calibration/profiler.cpp: timing one op, the machine's ceilings, a whole
// profiling run with checkpoint / resume, and the strict profile loader.
// The timing rules are in the header (modar/runtime/profiler.hpp); how each op
// kind is executed is in profiler_ops.cpp, which shapes in profiler_grid.cpp.
#include "modar/runtime/profiler.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include <Eigen/Core>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <fstream>
#include <memory>
#include <new>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "modar/base/clock.hpp"
#include "modar/base/errors.hpp"
#include "modar/base/json.hpp"
#include "modar/base/text.hpp"
#include "modar/cost_model.hpp"
#include "modar/profile_io.hpp"
#include "profiler_internal.hpp"

#if defined(_OPENMP)
#include <omp.h>
#endif

#ifndef MODAR_VERSION
#define MODAR_VERSION "0.1.0"
#endif

namespace modar::runtime {

using profiler_detail::BenchSpec;

// ---- statistics ---------------------------------------------------------------

TimingStats summarize_samples(std::vector<double> samples_s) {
  if (samples_s.empty()) {
    throw std::invalid_argument("summarize_samples: no samples");
  }
  std::sort(samples_s.begin(), samples_s.end());
  auto quantile = [&](double q) {
    const double position = q * static_cast<double>(samples_s.size() - 1);
    const size_t below = static_cast<size_t>(std::floor(position));
    const size_t above = std::min(below + 1, samples_s.size() - 1);
    const double fraction = position - static_cast<double>(below);
    return samples_s[below] + fraction * (samples_s[above] - samples_s[below]);
  };
  TimingStats stats;
  stats.median_s = quantile(0.5);
  stats.p10_s = quantile(0.1);
  stats.p90_s = quantile(0.9);
  stats.repeats = static_cast<int64_t>(samples_s.size());
  return stats;
}

bool same_point(const OpShape& a, Pass pass_a, const OpShape& b, Pass pass_b) {
  if (a.kind != b.kind || a.dtype != b.dtype || pass_a != pass_b) {
    return false;
  }
  for (int i = 0; i < op_dims_count(a.kind); ++i) {
    if (a.dims[static_cast<size_t>(i)] != b.dims[static_cast<size_t>(i)]) {
      return false;
    }
  }
  return true;
}

std::string describe(const OpShape& shape, Pass pass) {
  std::string text = std::string(to_string(shape.kind)) + " " + to_string(pass) + " " +
                     to_string(shape.dtype) + " [";
  for (int i = 0; i < op_dims_count(shape.kind); ++i) {
    text += (i ? ", " : "") + std::to_string(shape.dims[static_cast<size_t>(i)]);
  }
  return text + "]";
}

// ---- clocks ---------------------------------------------------------------------

const char* to_string(Clock clock) {
  return clock == Clock::wall ? "wall" : "cpu";
}

namespace {

class ProcessCpuTimer final : public Timer {
 public:
  void start() override { start_s_ = process_cpu_s(); }
  void stop() override { stop_s_ = process_cpu_s(); }
  double elapsed_s() override {
    return (stop_s_ - start_s_) / static_cast<double>(std::max(1, cpu_threads()));
  }

 private:
  double start_s_ = 0.0;
  double stop_s_ = 0.0;
};

}  // namespace

std::unique_ptr<Timer> make_sample_timer(Backend& backend, Clock clock) {
  if (clock == Clock::wall) {
    return backend.make_timer();
  }
  if (backend.device() != DeviceKind::cpu) {
    throw ConfigError(std::string("clock = cpu: only the cpu backend can be timed by CPU time; ") +
                      backend.name() + " needs clock = wall");
  }
  return std::make_unique<ProcessCpuTimer>();
}

// ---- one op ---------------------------------------------------------------------

int64_t op_working_set_bytes(const OpShape& shape, Pass pass) {
  return profiler_detail::bench_bytes(profiler_detail::bench_spec(shape, pass));
}

namespace {

std::string gib(int64_t bytes) {
  return format_general(static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0), 3) + " GiB";
}

// An op ready to be timed: its tensors allocated (every rotated copy), filled,
// its untimed setup run.  measure_op prepares and times once; the profiler's
// rounds keep a batch's prepared ops between rounds when they fit in memory.
struct PreparedOp {
  BenchSpec spec;
  std::vector<std::vector<Tensor>> sets;
  std::vector<profiler_detail::BenchCalls> copy_calls;  // per copy of the tensors
  int64_t set_bytes = 0;
  int64_t bytes() const { return set_bytes * static_cast<int64_t>(sets.size()); }
};

// Fills `result` with the skip reason when the op cannot be prepared.
std::unique_ptr<PreparedOp> prepare_op(Backend& backend, const OpShape& shape, Pass pass,
                                       const TimingOptions& options, OpTiming& result) {
  auto op = std::make_unique<PreparedOp>();
  result.measurement.shape = shape;
  result.measurement.pass = pass;
  try {
    op->spec = profiler_detail::bench_spec(shape, pass);
  } catch (const ShapeError& e) {
    result.skipped = true;
    result.skip_reason = e.what();
    return nullptr;
  }
  const BenchSpec& spec = op->spec;
  const std::vector<SampleTensor> tensors = profiler_detail::bench_tensors(spec);
  const int64_t set_bytes = profiler_detail::bench_bytes(spec);
  op->set_bytes = result.working_set_bytes = set_bytes;
  if (options.memory_limit_bytes > 0 && set_bytes > options.memory_limit_bytes) {
    result.skipped = true;
    result.skip_reason = "needs " + gib(set_bytes) +
                         " for one copy of its tensors; the memory limit is " +
                         gib(options.memory_limit_bytes);
    return nullptr;
  }
  if (options.max_point_bytes > 0 && set_bytes > options.max_point_bytes) {
    result.skipped = true;
    result.skip_reason = "needs " + gib(set_bytes) + " for one copy of its tensors; this run " +
                         "is bounded to " + gib(options.max_point_bytes) + " per shape";
    return nullptr;
  }
  int64_t copies = 1;
  if (options.rotation_bytes > set_bytes && set_bytes > 0) {
    copies = (options.rotation_bytes + set_bytes - 1) / set_bytes;
  }
  copies = std::clamp<int64_t>(copies, 1, std::max(1, options.max_copies));
  if (options.memory_limit_bytes > 0) {
    copies = std::clamp<int64_t>(options.memory_limit_bytes / std::max<int64_t>(set_bytes, 1), 1,
                                 copies);
  }
  result.copies = static_cast<int>(copies);

  // Allocate every copy; fill copy 0 with random data and clone it (the copies
  // only have to live at different addresses).
  std::vector<std::vector<Tensor>>& sets = op->sets;
  try {
    sets.resize(static_cast<size_t>(copies));
    for (auto& set : sets) {
      for (const SampleTensor& tensor : tensors) {
        if (const std::optional<ScalarType> dtype = sample_dtype(tensor.role, spec.dtype)) {
          set.emplace_back(backend, tensor.shape, *dtype);
        } else {
          set.emplace_back();  // absent in this dtype (an empty view)
        }
      }
    }
  } catch (const BackendError& e) {
    result.skipped = true;
    result.skip_reason = std::string("allocation failed: ") + e.what();
    return nullptr;
  } catch (const std::bad_alloc&) {
    result.skipped = true;
    result.skip_reason = "allocation failed: out of memory (" + gib(set_bytes * copies) + ")";
    return nullptr;
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!sets[0][i].view().empty()) {
      fill_sample_tensor(backend, sets[0][i].view(), tensors[i], SampleFill::timing,
                         options.seed + 7919 * i);
    }
  }
  for (size_t c = 0; c < sets.size(); ++c) {
    if (c > 0) {
      for (size_t i = 0; i < tensors.size(); ++i) {
        if (!sets[0][i].view().empty())
          backend.copy(sets[0][i].view(), sets[c][i].view());
      }
    }
    std::vector<TensorView> set_views;
    for (const Tensor& tensor : sets[c]) {
      set_views.push_back(tensor.view());
    }
    op->copy_calls.push_back(profiler_detail::bench_calls(spec, set_views));
  }
  try {
    for (const auto& set : op->copy_calls) {
      for (const OpArgs& call : set.setup)
        backend.run(call);
    }
    backend.synchronize();
  } catch (const ShapeError& e) {
    result.skipped = true;
    result.skip_reason = std::string("the backend rejected it: ") + e.what();
    return nullptr;
  }
  return op;
}

// Warm-up, then the samples, per the timing rules; fills `result`.
void time_prepared_op(Backend& backend, PreparedOp& op, const TimingOptions& options,
                      OpTiming& result) {
  try {
    const double start_s = steady_now_s();
    auto timer = make_sample_timer(backend, options.clock);
    size_t next = 0;
    auto run_calls = [&](int64_t calls) {
      timer->start();
      for (int64_t i = 0; i < calls; ++i) {
        for (const OpArgs& call : op.copy_calls[next].timed)
          backend.run(call);
        next = (next + 1) % op.copy_calls.size();
      }
      timer->stop();
      return timer->elapsed_s();
    };
    const int64_t copies = static_cast<int64_t>(op.copy_calls.size());
    // Warm-up: at least two calls, then until the copies were all touched or a
    // fifth of the budget is spent.  (One call is warm-up enough when it alone
    // outlasted the budget.)
    double warm_s = run_calls(1);
    int64_t warm_calls = 1;
    while ((warm_calls < 2 && steady_now_s() - start_s < options.budget_s) ||
           (warm_calls < copies && steady_now_s() - start_s < 0.2 * options.budget_s)) {
      warm_s += run_calls(1);
      ++warm_calls;
    }
    const double per_call_s = std::max(1e-9, warm_s / static_cast<double>(warm_calls));
    const int64_t inner =
        std::max<int64_t>(1, static_cast<int64_t>(std::ceil(options.min_sample_s / per_call_s)));
    const double remaining_s = std::max(0.0, options.budget_s - (steady_now_s() - start_s));
    const int64_t affordable =
        static_cast<int64_t>(remaining_s / (per_call_s * static_cast<double>(inner)));
    const int64_t repeats = std::clamp<int64_t>(affordable, options.min_repeats,
                                                std::max(options.min_repeats, options.max_repeats));
    std::vector<double> samples;
    samples.reserve(static_cast<size_t>(repeats));
    for (int64_t r = 0; r < repeats; ++r) {
      samples.push_back(run_calls(inner) / static_cast<double>(inner));
    }
    result.stats = summarize_samples(samples);
    result.samples_s = std::move(samples);
    result.inner_calls = inner;
  } catch (const ShapeError& e) {
    result.skipped = true;
    result.skip_reason = std::string("the backend rejected it: ") + e.what();
    return;
  }
  result.measurement.median_s = result.stats.median_s;
  result.measurement.spread = result.stats.spread();
  result.measurement.repeats = result.stats.repeats;
}

}  // namespace

OpTiming measure_op(Backend& backend, const OpShape& shape, Pass pass,
                    const TimingOptions& options) {
  OpTiming result;
  std::unique_ptr<PreparedOp> op = prepare_op(backend, shape, pass, options, result);
  if (op != nullptr) {
    time_prepared_op(backend, *op, options, result);
  }
  return result;
}

// ---- the machine ---------------------------------------------------------------------

std::map<std::string, std::string> build_provenance() {
  std::map<std::string, std::string> p;
#if defined(__clang__)
  p["compiler"] = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  p["compiler"] = std::string("gcc ") + __VERSION__;
#else
  p["compiler"] = "unknown";
#endif
  std::string flags;
#if defined(__OPTIMIZE__)
  flags += "optimized";
#else
  flags += "not optimized";
#endif
#if defined(NDEBUG)
  flags += ", NDEBUG";
#endif
#if defined(__AVX512F__)
  flags += ", AVX-512F";
#endif
#if defined(__AVX2__)
  flags += ", AVX2";
#endif
#if defined(__FMA__)
  flags += ", FMA";
#endif
#if !defined(__AVX2__) && !defined(__AVX512F__)
  flags += ", baseline SIMD only (no -march=native)";
#endif
  p["compiler_flags"] = flags + " (from the compiler's predefined macros)";
  p["eigen"] = std::to_string(EIGEN_WORLD_VERSION) + "." + std::to_string(EIGEN_MAJOR_VERSION) +
               "." + std::to_string(EIGEN_MINOR_VERSION) +
               " (SIMD: " + Eigen::SimdInstructionSetsInUse() + ")";
#if defined(_OPENMP)
  p["openmp"] = std::to_string(_OPENMP);
#else
  p["openmp"] = "off";
#endif
  p["modar_version"] = MODAR_VERSION;
  return p;
}

int max_cpu_threads() {
  return std::max(8, 4 * static_cast<int>(std::thread::hardware_concurrency()));
}

void set_cpu_threads(int threads) {
  if (threads < 0 || threads > max_cpu_threads()) {
    throw ConfigError("threads = " + std::to_string(threads) + ": must be in [0, " +
                      std::to_string(max_cpu_threads()) +
                      "] (0 = all cores; at most 4 x the logical CPUs)");
  }
  if (threads == 0) {
    return;
  }
#if defined(_OPENMP)
  omp_set_num_threads(threads);
#endif
  Eigen::setNbThreads(threads);
}

int cpu_threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// ---- a whole run ------------------------------------------------------------------------

std::string partial_path(const std::string& out_path) {
  return out_path + ".partial";
}

namespace {

// GPU facts the Backend interface does not report (yet): documented defaults.
constexpr int64_t kDefaultGpuL2Bytes = int64_t{50} * 1024 * 1024;  // H100 / H200
constexpr int64_t kDefaultGpuMemoryBytes = int64_t{80} * 1000 * 1000 * 1000;

std::string profile_name_from(const std::string& out_path, const std::string& backend) {
  std::string stem = std::filesystem::path(out_path).stem().string();
  return stem.empty() ? backend + "-measured" : stem;
}

std::string format_duration(double seconds) {
  const int64_t total = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  std::ostringstream out;
  if (total >= 3600) {
    out << total / 3600 << "h" << (total % 3600) / 60 << "m";
  } else {
    out << total / 60 << "m" << (total % 60) << "s";
  }
  return out.str();
}

std::string format_time(double seconds) {
  std::ostringstream out;
  out.precision(3);
  if (seconds < 1e-3) {
    out << seconds * 1e6 << " us";
  } else if (seconds < 1.0) {
    out << seconds * 1e3 << " ms";
  } else {
    out << seconds << " s";
  }
  return out.str();
}

// Median time of `run` (at least 3 samples, about `budget_s`).
double time_call(Backend& backend, Clock clock, const std::function<void()>& run, double budget_s,
                 int64_t inner = 1) {
  auto timer = make_sample_timer(backend, clock);
  run();
  backend.synchronize();
  std::vector<double> samples;
  const double start = steady_now_s();
  while (samples.size() < 3 || (steady_now_s() - start < budget_s && samples.size() < 101)) {
    timer->start();
    for (int64_t i = 0; i < inner; ++i) {
      run();
    }
    timer->stop();
    samples.push_back(timer->elapsed_s() / static_cast<double>(inner));
  }
  return summarize_samples(samples).median_s;
}

struct CeilingReport {
  DeviceCeilings ceilings;
  std::string how;
};

CeilingReport measure_ceilings(Backend& backend, Clock clock, DeviceKind device,
                               int64_t cache_bytes, int64_t memory_limit, double memory_bytes,
                               const std::function<void()>& stop_if_asked) {
  CeilingReport report;
  DeviceCeilings& c = report.ceilings;
  std::ostringstream how;
  const SampleTensor uniform{};  // U(-1, 1) values
  // Peak GEMM rate: a large square GEMM per dtype.
  const int64_t n = device == DeviceKind::cpu ? 2048 : 16384;
  for (const ScalarType type : {ScalarType::fp32, ScalarType::bf16}) {
    stop_if_asked();
    Tensor a(backend, {n, n}, type), b(backend, {n, n}, type), out(backend, {n, n}, type);
    fill_sample_tensor(backend, a.view(), uniform, SampleFill::timing, 11);
    fill_sample_tensor(backend, b.view(), uniform, SampleFill::timing, 12);
    const double seconds = time_call(
        backend, clock, [&] { backend.gemm(a.view(), false, b.view(), false, out.view()); }, 1.0);
    const double rate = 2.0 * static_cast<double>(n) * n * n / seconds;
    if (type == ScalarType::fp32) {
      c.peak_flops_fp32 = c.achievable_flops_fp32 = rate;
    } else {
      c.peak_flops_bf16 = c.achievable_flops_bf16 = rate;
    }
    how << "GEMM " << n << "^3 " << to_string(type) << ": " << format_general(rate / 1e9, 4)
        << " GFLOP/s; ";
  }
  // Bandwidth: a device copy well past the cache (bytes read + bytes written).
  int64_t copy_bytes = std::max<int64_t>(8 * cache_bytes, int64_t{256} << 20);
  if (device != DeviceKind::cpu) {
    copy_bytes = std::max<int64_t>(copy_bytes, int64_t{2} << 30);
  }
  if (memory_limit > 0) {
    copy_bytes = std::min<int64_t>(copy_bytes, memory_limit / 4);
  }
  stop_if_asked();
  {
    const int64_t elements = copy_bytes / 4;
    Tensor src(backend, {elements}, ScalarType::fp32), dst(backend, {elements}, ScalarType::fp32);
    fill_sample_tensor(backend, src.view(), uniform, SampleFill::timing, 13);
    backend.copy(src.view(), dst.view());
    const double seconds = time_call(
        backend, clock, [&] { backend.copy(src.view(), dst.view()); }, 1.0);
    c.memory_bandwidth = c.achievable_bandwidth = 2.0 * static_cast<double>(copy_bytes) / seconds;
    how << "copy of " << (copy_bytes >> 20)
        << " MiB: " << format_general(c.memory_bandwidth / 1e9, 4) << " GB/s (read + write); ";
  }
  // Launch / dispatch overhead: a 16-element add, back to back.
  stop_if_asked();
  {
    Tensor a(backend, {16}, ScalarType::fp32), b(backend, {16}, ScalarType::fp32),
        out(backend, {16}, ScalarType::fp32);
    fill_sample_tensor(backend, a.view(), uniform, SampleFill::timing, 14);
    fill_sample_tensor(backend, b.view(), uniform, SampleFill::timing, 15);
    c.launch_overhead_s = time_call(
        backend, clock, [&] { backend.add(a.view(), b.view(), out.view()); }, 0.3, 1000);
    how << "16-element add: " << format_time(c.launch_overhead_s) << " per call";
  }
  c.memory_bytes = memory_bytes;
  report.how = how.str();
  return report;
}

// Everything about out_path that would otherwise fail only at the final rename.
void check_out_path(const std::string& out_path) {
  if (out_path.empty()) {
    throw ConfigError("out_path: a path is required (where the profile is written)");
  }
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::path out(out_path);
  if (fs::is_directory(out, error)) {
    throw ConfigError("out_path = " + out_path + ": is a directory; give the path of a file");
  }
  if (fs::is_directory(fs::path(partial_path(out_path)), error)) {
    throw ConfigError("out_path = " + out_path + ": its checkpoint " + partial_path(out_path) +
                      " is a directory; remove it or choose another path");
  }
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  if (!fs::is_directory(parent, error)) {
    throw ConfigError("out_path = " + out_path + ": the folder " + parent.string() +
                      " does not exist");
  }
}

// An exclusive flock() on OUT.lock for the whole run.
class OutputLock {
 public:
  explicit OutputLock(const std::string& out_path) : path_(out_path + ".lock") {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      throw FileError("out_path = " + out_path + ": cannot create the lock file " + path_ + " (" +
                      std::strerror(errno) + ")");
    }
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd_);
      throw ConfigError("out_path = " + out_path + ": another profile run is writing it (" + path_ +
                        " is locked); wait for it to finish or choose another path");
    }
  }
  ~OutputLock() {
    ::unlink(path_.c_str());
    ::close(fd_);
  }
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
};

bool point_done(const DeviceProfile& profile, const ProfilePoint& point) {
  for (const OpMeasurement& m : profile.measurements) {
    if (same_point(m.shape, m.pass, point.shape, point.pass)) {
      return true;
    }
  }
  return false;
}

// What a run needs from the machine: the timing options with the rotation
// size and memory limit filled in, and the facts recorded in the provenance.
struct MachineSetup {
  TimingOptions timing;
  int64_t cache_bytes = 0;
  double memory_bytes = 0.0;
  std::string cache_source;
};

MachineSetup machine_setup(const Backend& backend, const ProfileOptions& options,
                           const HostFacts& host) {
  MachineSetup m;
  m.timing = options.timing;
  if (backend.device() == DeviceKind::cpu) {
    m.cache_bytes =
        host.last_level_cache_bytes > 0 ? host.last_level_cache_bytes : int64_t{32} << 20;
    m.cache_source = host.last_level_cache_bytes > 0 ? "last-level cache from sysfs"
                                                     : "sysfs unreadable: assumed 32 MiB";
    m.memory_bytes = static_cast<double>(host.memory_total_bytes);
    if (m.timing.memory_limit_bytes == 0 && host.memory_available_bytes > 0) {
      m.timing.memory_limit_bytes = host.memory_available_bytes / 2;
    }
  } else {
    // The backend reports its own device (no device index is assumed here).
    const DeviceFacts facts = backend.facts();
    const int64_t reported_l2 = facts.cache_bytes, reported_memory = facts.memory_bytes;
    m.cache_bytes = options.device_cache_bytes > 0 ? options.device_cache_bytes
                    : reported_l2 > 0              ? reported_l2
                                                   : kDefaultGpuL2Bytes;
    m.cache_source = options.device_cache_bytes > 0 ? "L2 size given on the command line"
                     : reported_l2 > 0              ? "L2 size reported by the device"
                                       : "L2 assumed 50 MiB (H100 / H200): not reported";
    m.memory_bytes =
        static_cast<double>(options.device_memory_bytes > 0 ? options.device_memory_bytes
                            : reported_memory > 0           ? reported_memory
                                                            : kDefaultGpuMemoryBytes);
    if (m.timing.memory_limit_bytes == 0) {
      m.timing.memory_limit_bytes = static_cast<int64_t>(0.8 * m.memory_bytes);
    }
  }
  if (m.timing.rotation_bytes == 0) {
    m.timing.rotation_bytes = 2 * m.cache_bytes;
  }
  return m;
}

std::string device_label(const Backend& backend, const HostFacts& host) {
  if (backend.device() != DeviceKind::cpu) {
    return backend.name();
  }
  return host.cpu_model.empty() ? "unknown CPU" : host.cpu_model;
}

// The checkpoint to continue from, after checking that it was measured with
// this run's backend, grid, dtype, clock, threads and machine.
DeviceProfile read_checkpoint(const Backend& backend, const ProfileOptions& options,
                              const HostFacts& host) {
  const std::string checkpoint = partial_path(options.out_path);
  DeviceProfile previous;
  try {
    previous = parse_profile_toml(read_profile_file(checkpoint), checkpoint);
  } catch (const std::invalid_argument& e) {
    throw FileError(checkpoint + ": cannot resume from a damaged checkpoint (" + e.what() +
                    "); delete it and run without resume");
  } catch (const FileError& e) {
    throw FileError(checkpoint + ": cannot resume from a damaged checkpoint (" + e.what() +
                    "); delete it and run without resume");
  }
  const auto field = [&](const char* key) {
    const auto it = previous.provenance.find(key);
    return it == previous.provenance.end() ? std::string() : it->second;
  };
  if (previous.backend != options.backend_name) {
    throw ConfigError(checkpoint + ": backend = \"" + previous.backend +
                      "\": the checkpoint was measured on another backend than backend = " +
                      options.backend_name + "; delete it or resume with the same backend");
  }
  if (field("grid") != to_string(options.grid) || field("dtype") != to_string(options.dtype)) {
    throw ConfigError(checkpoint + ": grid = \"" + field("grid") + "\", dtype = \"" +
                      field("dtype") + "\": the checkpoint is of another grid / dtype than " +
                      "this run (" + to_string(options.grid) + ", " + to_string(options.dtype) +
                      "); resume with the same settings or delete it");
  }
  // The old measurements were taken with the checkpoint's clock, threads and
  // machine: mixing them with new ones under this run's labels would be wrong.
  const std::string threads_now =
      std::to_string(backend.device() == DeviceKind::cpu ? cpu_threads() : 0);
  const std::pair<const char*, std::string> same[] = {
      {"clock", to_string(options.timing.clock)},
      {"threads", threads_now},
      {"device", device_label(backend, host)},
  };
  for (const auto& [key, now] : same) {
    if (!field(key).empty() && field(key) != now) {
      throw ConfigError(checkpoint + ": " + key + " = \"" + field(key) +
                        "\": the checkpoint was measured with another " + key + " than this run (" +
                        now + "); resume with the same settings on the same machine, or delete it");
    }
  }
  return previous;
}

// Provenance of this run (a resumed run keeps the first run's start date).
void record_run_provenance(DeviceProfile& profile, const Backend& backend,
                           const ProfileOptions& options, const MachineSetup& machine,
                           const HostFacts& host, bool resumed) {
  std::map<std::string, std::string>& p = profile.provenance;
  for (const auto& [key, value] : build_provenance()) {
    p[key] = value;
  }
  const bool cpu = backend.device() == DeviceKind::cpu;
  const TimingOptions& timing = machine.timing;
  p["backend_device"] = backend.name();
  p["device"] = device_label(backend, host);
  p["host_cpu"] = host.cpu_model;
  p["threads"] = std::to_string(cpu ? cpu_threads() : 0);
  p["logical_cpus"] = std::to_string(host.logical_cpus);
  p["grid"] = to_string(options.grid);
  p["dtype"] = to_string(options.dtype);
  p["rotation_bytes"] =
      std::to_string(timing.rotation_bytes) + " (2 x " + machine.cache_source + ")";
  p["memory_limit_bytes"] = std::to_string(timing.memory_limit_bytes);
  if (timing.max_point_bytes > 0) {
    p["max_point_bytes"] = std::to_string(timing.max_point_bytes) + " (bounded grid)";
  }
  p["clock"] = to_string(timing.clock);
  p["timing"] = "median of >= " + std::to_string(timing.min_repeats) +
                " samples (each >= " + format_general(timing.min_sample_s, 4) +
                " s of back-to-back calls) after warm-up; " + format_general(timing.budget_s, 4) +
                " s budget per shape; inputs random, rotated over copies exceeding the rotation "
                "size; spread = (p90 - p10) / median";
  p["rounds"] = std::to_string(options.rounds);
  p["noise_how"] =
      "points measured in batches of " + std::to_string(options.batch_points) + ", each batch in " +
      std::to_string(options.rounds) +
      " interleaved rounds (odd rounds in reverse order; budget / rounds per point and round); "
      "time = median of all samples, round_spread = (max - min) / median of the rounds' "
      "medians; " +
      (options.drift_tolerance > 0.0
           ? "the sentinel timed before and after each batch, which is measured again when "
             "it moved by more than drift_tolerance and marked drift = true if it moved again"
           : std::string("no drift sentinel (drift_tolerance = 0)"));
  p["load_average_at_start"] = trim_text(read_text_or_empty("/proc/loadavg"));
  p[resumed ? "resumed" : "date"] = utc_now_iso8601();
  if (!cpu) {
    for (const auto& [key, value] : backend.facts().provenance) {
      p[key] = value;
    }
  }
  p["status"] = "partial";
  p.erase("measurement_count");
}

// What one grid point gathered over the rounds of its batch.
struct PointRounds {
  std::vector<double> samples_s;
  std::vector<double> round_medians_s;
  bool skipped = false;
  std::string skip_reason;
  int copies = 0;
};

// One attempt at a batch: `rounds` interleaved rounds, each timing every
// point once with `round_timing` (odd rounds in reverse order, so no point is
// always measured first or last).  A point's prepared tensors are kept for
// its next round while the batch's kept tensors stay within `keep_bytes`
// (else they are prepared again).  A point that is skipped in a round (its
// op throws, it does not fit) is skipped for good.
std::vector<PointRounds> measure_rounds(Backend& backend, const std::vector<ProfilePoint>& batch,
                                        const TimingOptions& round_timing, int rounds,
                                        int64_t keep_bytes,
                                        const std::function<void()>& stop_if_asked) {
  std::vector<PointRounds> out(batch.size());
  std::vector<std::unique_ptr<PreparedOp>> kept(batch.size());
  int64_t kept_bytes = 0;
  for (int r = 0; r < rounds; ++r) {
    for (size_t j = 0; j < batch.size(); ++j) {
      const size_t i = r % 2 == 0 ? j : batch.size() - 1 - j;
      if (out[i].skipped) {
        continue;
      }
      stop_if_asked();
      // Whatever one point throws (a shape the backend rejects, an allocation
      // or a device error) is recorded as a skip; it never aborts the run.
      OpTiming timed;
      try {
        std::unique_ptr<PreparedOp> op = std::move(kept[i]);
        if (op != nullptr) {
          kept_bytes -= op->bytes();
          timed.copies = static_cast<int>(op->sets.size());
        } else {
          op = prepare_op(backend, batch[i].shape, batch[i].pass, round_timing, timed);
        }
        if (op != nullptr) {
          time_prepared_op(backend, *op, round_timing, timed);
          if (r + 1 < rounds && kept_bytes + op->bytes() <= keep_bytes) {
            kept_bytes += op->bytes();
            kept[i] = std::move(op);
          }
        }
      } catch (const std::exception& e) {
        timed = OpTiming{};
        timed.skipped = true;
        timed.skip_reason = std::string("failed: ") + e.what();
      }
      if (timed.skipped) {
        out[i].skipped = true;
        out[i].skip_reason = timed.skip_reason;
        continue;
      }
      out[i].round_medians_s.push_back(timed.stats.median_s);
      out[i].samples_s.insert(out[i].samples_s.end(), timed.samples_s.begin(),
                              timed.samples_s.end());
      out[i].copies = timed.copies;
    }
  }
  return out;
}

OpMeasurement pooled_measurement(const ProfilePoint& point, const PointRounds& measured,
                                 bool drift) {
  const TimingStats stats = summarize_samples(measured.samples_s);
  OpMeasurement m;
  m.shape = point.shape;
  m.pass = point.pass;
  m.median_s = stats.median_s;
  m.spread = stats.spread();
  m.repeats = stats.repeats;
  m.rounds = static_cast<int64_t>(measured.round_medians_s.size());
  const auto [low, high] =
      std::minmax_element(measured.round_medians_s.begin(), measured.round_medians_s.end());
  m.round_spread = stats.median_s > 0.0 ? (*high - *low) / stats.median_s : 0.0;
  m.drift = drift;
  return m;
}

// The sentinel's record over a run (and the runs it resumed).
struct DriftLedger {
  double reference_s = 0.0;
  double min_s = 0.0, max_s = 0.0;
  int64_t timings = 0, remeasured_batches = 0, marked_points = 0;
  void saw(double seconds) {
    min_s = timings == 0 ? seconds : std::min(min_s, seconds);
    max_s = timings == 0 ? seconds : std::max(max_s, seconds);
    ++timings;
  }
};

void record_noise_provenance(DeviceProfile& profile, const DriftLedger& ledger,
                             const DriftSentinel* sentinel, const ProfileOptions& options) {
  std::map<std::string, std::string>& p = profile.provenance;
  std::vector<double> round_spreads;
  for (const OpMeasurement& m : profile.measurements) {
    if (m.rounds > 1) {
      round_spreads.push_back(m.round_spread);
    }
  }
  if (!round_spreads.empty()) {
    std::sort(round_spreads.begin(), round_spreads.end());
    p["round_spread_median"] = format_general(summarize_samples(round_spreads).median_s, 4);
    p["round_spread_p90"] = format_general(summarize_samples(round_spreads).p90_s, 4);
  }
  p["load_average_at_end"] = trim_text(read_text_or_empty("/proc/loadavg"));
  if (sentinel == nullptr) {
    return;
  }
  p["sentinel"] = sentinel->description();
  p["sentinel_reference_s"] = format_general(ledger.reference_s, 4);
  p["sentinel_min_s"] = format_general(ledger.min_s, 4);
  p["sentinel_max_s"] = format_general(ledger.max_s, 4);
  p["drift"] = format_general(
      ledger.reference_s > 0.0 ? (ledger.max_s - ledger.min_s) / ledger.reference_s : 0.0, 4);
  p["drift_tolerance"] = format_general(options.drift_tolerance, 4);
  p["drift_remeasured_batches"] = std::to_string(ledger.remeasured_batches);
  p["drift_marked_points"] = std::to_string(ledger.marked_points);
}

// The GEMM ceiling is the best rate any GEMM of the profile's dtype reached.
void raise_gemm_ceilings(DeviceProfile& profile) {
  for (const OpMeasurement& m : profile.measurements) {
    if (m.shape.kind != OpKind::gemm || m.median_s <= 0.0) {
      continue;
    }
    const GemmDims gemm = m.shape.as<GemmDims>();
    const double rate = 2.0 * static_cast<double>(gemm.m) * static_cast<double>(gemm.n) *
                        static_cast<double>(gemm.k) *
                        static_cast<double>(std::max<int64_t>(gemm.batch, 1)) / m.median_s;
    DeviceCeilings& c = profile.ceilings;
    if (m.shape.dtype == DType::fp32 && rate > c.achievable_flops_fp32) {
      c.achievable_flops_fp32 = c.peak_flops_fp32 = rate;
    } else if (m.shape.dtype == DType::bf16 && rate > c.achievable_flops_bf16) {
      c.achievable_flops_bf16 = c.peak_flops_bf16 = rate;
    }
  }
}

// Points of the run beyond options.max_seconds, recorded with the reason.
void record_unmeasured(DeviceProfile& profile, const std::vector<ProfilePoint>& points,
                       const std::string& reason) {
  std::map<std::string, std::string>& p = profile.provenance;
  int64_t count = static_cast<int64_t>(provenance_positive_number(profile, "unmeasured_count"));
  for (const ProfilePoint& point : points) {
    ++count;
    char key[40];
    std::snprintf(key, sizeof(key), "unmeasured.%04lld", static_cast<long long>(count));
    p[key] = describe(point.shape, point.pass) + ": " + reason;
  }
  p["unmeasured_count"] = std::to_string(count);
}

// Everything measure_points needs from the run.
struct PointsRun {
  Backend& backend;
  const ProfileOptions& options;
  const TimingOptions& timing;
  double run_start_s = 0.0;
  DriftSentinel* sentinel = nullptr;  // null: no drift check
  const std::function<void()>& stop_if_asked;
  const std::function<void()>& checkpoint_now;
};

void print_point_progress(const ProfileOptions& options, size_t done, size_t todo,
                          const std::string& name, const PointRounds& measured,
                          const OpMeasurement* m, double run_start_s) {
  const double elapsed = steady_now_s() - run_start_s;
  const double eta = elapsed / static_cast<double>(done) * static_cast<double>(todo - done);
  if (m == nullptr) {
    std::fprintf(options.progress, "[%4zu/%zu] %s: skipped (%s)\n", done, todo, name.c_str(),
                 measured.skip_reason.c_str());
    return;
  }
  std::fprintf(options.progress,
               "[%4zu/%zu] %-52s %10s +-%4.1f%% rounds +-%4.1f%% x%-3d elapsed %s ETA %s%s\n", done,
               todo, name.c_str(), format_time(m->median_s).c_str(), 50.0 * m->spread,
               50.0 * m->round_spread, measured.copies, format_duration(elapsed).c_str(),
               format_duration(eta).c_str(), m->drift ? " (drift)" : "");
}

// Measure `todo` in batches of interleaved rounds, the sentinel timed after
// each batch (`before_s` = its last time), checkpointing after every batch;
// stops at options.max_seconds (the rest recorded as unmeasured).  Returns
// the points skipped.
int64_t measure_points(const PointsRun& run, const std::vector<ProfilePoint>& todo,
                       DeviceProfile& profile, DriftLedger& ledger, double before_s) {
  const ProfileOptions& options = run.options;
  Backend& backend = run.backend;
  const TimingOptions& timing = run.timing;
  DriftSentinel* sentinel = run.sentinel;
  const double run_start_s = run.run_start_s;
  const auto& stop_if_asked = run.stop_if_asked;
  std::map<std::string, std::string>& p = profile.provenance;
  int64_t skipped = 0;
  TimingOptions round_timing = timing;
  const int rounds = std::max(1, options.rounds);
  if (rounds > 1) {
    round_timing.budget_s = timing.budget_s / rounds;
    round_timing.min_repeats = std::max(2, (timing.min_repeats + rounds - 1) / rounds);
  }
  const size_t batch_size = static_cast<size_t>(std::max(1, options.batch_points));
  // A batch keeps its points' tensors between rounds up to a quarter of the
  // memory limit (at most 1 GiB): a point of a few copies is then filled once.
  const int64_t keep_bytes = std::min<int64_t>(int64_t{1} << 30, timing.memory_limit_bytes > 0
                                                                     ? timing.memory_limit_bytes / 4
                                                                     : int64_t{1} << 30);
  size_t done = 0;
  for (size_t first = 0; first < todo.size(); first += batch_size) {
    if (options.max_seconds > 0.0 && steady_now_s() - run_start_s >= options.max_seconds) {
      const std::vector<ProfilePoint> rest(todo.begin() + static_cast<std::ptrdiff_t>(first),
                                           todo.end());
      record_unmeasured(profile, rest,
                        "not measured: the run's time bound max_seconds = " +
                            format_general(options.max_seconds, 4) + " s was spent");
      break;
    }
    const std::vector<ProfilePoint> batch(
        todo.begin() + static_cast<std::ptrdiff_t>(first),
        todo.begin() + static_cast<std::ptrdiff_t>(std::min(todo.size(), first + batch_size)));
    std::vector<PointRounds> measured;
    bool drifted = false;
    for (int attempt = 0;; ++attempt) {
      measured = measure_rounds(backend, batch, round_timing, rounds, keep_bytes, stop_if_asked);
      if (sentinel == nullptr) {
        break;
      }
      const double after_s = sentinel->time_s();
      ledger.saw(after_s);
      const double drift = sentinel_drift(ledger.reference_s, before_s, after_s);
      if (options.progress != nullptr && drift > options.drift_tolerance) {
        std::fprintf(options.progress,
                     "modar profile: the sentinel moved %.0f%% (reference %s, before %s, after "
                     "%s): %s\n",
                     100.0 * drift, format_time(ledger.reference_s).c_str(),
                     format_time(before_s).c_str(), format_time(after_s).c_str(),
                     attempt == 0 ? "measuring the batch again" : "its points are marked drift");
      }
      before_s = after_s;
      const bool out_of_time =
          options.max_seconds > 0.0 && steady_now_s() - run_start_s >= options.max_seconds;
      if (drift <= options.drift_tolerance) {
        break;
      }
      if (attempt == 1 || out_of_time) {
        drifted = true;
        break;
      }
      ++ledger.remeasured_batches;
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      ++done;
      const std::string name = describe(batch[i].shape, batch[i].pass);
      if (measured[i].skipped) {
        ++skipped;
        char key[32];
        std::snprintf(key, sizeof(key), "skipped.%04lld", static_cast<long long>(skipped));
        p[key] = name + ": " + measured[i].skip_reason;
      } else {
        profile.measurements.push_back(pooled_measurement(batch[i], measured[i], drifted));
        ledger.marked_points += drifted ? 1 : 0;
      }
      if (options.progress != nullptr) {
        print_point_progress(options, done, todo.size(), name, measured[i],
                             measured[i].skipped ? nullptr : &profile.measurements.back(),
                             run_start_s);
      }
    }
    if (options.progress != nullptr) {
      std::fflush(options.progress);
    }
    run.checkpoint_now();
  }
  raise_gemm_ceilings(profile);
  return skipped;
}

}  // namespace

DeviceProfile run_profile(Backend& backend, const ProfileOptions& options) {
  check_out_path(options.out_path);
  // One writer per output: a second run on the same out_path is refused while
  // this one holds OUT.lock (released by the OS if this process dies).
  const OutputLock lock(options.out_path);
  const double run_start_s = steady_now_s();
  const DeviceKind device = backend.device();
  const HostFacts host = read_host_facts();
  set_cpu_threads(options.threads);
  const auto stop_if_asked = [&] {
    if (options.should_stop && options.should_stop()) {
      throw Interrupted("profile interrupted; the points measured so far are kept in " +
                        partial_path(options.out_path) + " (continue with resume)");
    }
  };
  const MachineSetup machine = machine_setup(backend, options, host);
  const TimingOptions& timing = machine.timing;
  const std::vector<ProfilePoint> points =
      options.points.empty() ? profile_grid(options.grid, device, options.dtype) : options.points;

  DeviceProfile profile;
  const std::string checkpoint = partial_path(options.out_path);
  const bool resumed = options.resume && std::filesystem::exists(checkpoint);
  if (resumed) {
    profile = read_checkpoint(backend, options, host);
  } else {
    profile.name = profile_name_from(options.out_path, options.backend_name);
    profile.backend = options.backend_name;
    profile.measured = true;
  }
  record_run_provenance(profile, backend, options, machine, host, resumed);
  std::map<std::string, std::string>& p = profile.provenance;
  auto checkpoint_now = [&] {
    p["measurement_count"] = std::to_string(profile.measurements.size());
    save_profile_atomically(profile, checkpoint);
  };

  stop_if_asked();
  if (options.measure_ceilings && !(resumed && p.count("ceilings_how") > 0)) {
    if (!resumed) {
      // A first checkpoint before the ceilings (seconds on a loaded machine):
      // a Ctrl-C during them keeps OUT.partial too, with placeholder ceilings
      // and no ceilings_how, so that a resume measures them.
      DeviceCeilings& c = profile.ceilings;
      c.peak_flops_fp32 = c.peak_flops_bf16 = c.memory_bandwidth = 1.0;
      c.memory_bytes = machine.memory_bytes > 0 ? machine.memory_bytes : 1.0;
      checkpoint_now();
    }
    if (options.progress != nullptr) {
      std::fprintf(options.progress, "modar profile: measuring ceilings (GEMM, copy, dispatch)\n");
    }
    const CeilingReport report =
        measure_ceilings(backend, timing.clock, device, machine.cache_bytes,
                         timing.memory_limit_bytes, machine.memory_bytes, stop_if_asked);
    profile.ceilings = report.ceilings;
    p["ceilings_how"] = report.how + "; peak = achievable = measured (no datasheet)";
  } else if (!resumed) {
    DeviceCeilings& c = profile.ceilings;
    c.peak_flops_fp32 = c.peak_flops_bf16 = c.memory_bandwidth = 1.0;
    c.memory_bytes = machine.memory_bytes > 0 ? machine.memory_bytes : 1.0;
    p["ceilings_how"] = "not measured (placeholders)";
  }
  checkpoint_now();

  for (auto it = p.begin(); it != p.end();) {
    const bool per_run = it->first.rfind("skipped.", 0) == 0 ||
                         it->first.rfind("unmeasured.", 0) == 0 || it->first == "unmeasured_count";
    it = per_run ? p.erase(it) : std::next(it);
  }
  std::vector<ProfilePoint> todo;
  for (const ProfilePoint& point : points) {
    if (!point_done(profile, point)) {
      todo.push_back(point);
    }
  }
  const size_t already_measured = points.size() - todo.size();
  // The bound: the time left after the ceilings; the most expensive points
  // that do not fit are left out (and reported) before measuring.
  double estimated_s = 0.0;
  if ((options.max_seconds > 0.0 || options.progress != nullptr) && !todo.empty()) {
    ProfileOptions rest = options;
    rest.measure_ceilings = false;
    if (options.max_seconds > 0.0) {
      rest.max_seconds = std::max(1e-3, options.max_seconds - (steady_now_s() - run_start_s));
    }
    const ProfileDurationEstimate estimate = estimate_profile_duration(backend, rest, todo);
    estimated_s = estimate.total_s;
    p["estimated_duration_s"] = format_general(estimate.total_s, 4) + " (the points, after the ceilings)";
    if (!estimate.left_out.empty()) {
      record_unmeasured(
          profile, estimate.left_out,
          "left out to fit max_seconds = " + format_general(options.max_seconds, 4) +
              " s (the most expensive points first: " + std::to_string(estimate.left_out.size()) +
              " points, about " + format_duration(estimate.left_out_s) + " of measuring)");
      todo = estimate.kept;
    }
  }
  if (options.progress != nullptr) {
    std::fprintf(options.progress,
                 "modar profile: %zu shapes (%zu already measured%s), grid %s, %s, %d round%s; "
                 "%zu to measure, estimated %s%s\n",
                 points.size(), already_measured, resumed ? ", resumed" : "",
                 to_string(options.grid), to_string(options.dtype), options.rounds,
                 options.rounds == 1 ? "" : "s", todo.size(), format_duration(estimated_s).c_str(),
                 p.count("unmeasured_count") > 0
                     ? (" (" + p["unmeasured_count"] + " left out to fit max_seconds)").c_str()
                     : "");
  }

  // The drift sentinel: its reference is the median of three timings at the
  // start (a resumed run keeps the first run's, so a machine that changed
  // speed in between shows as drift).
  std::unique_ptr<DriftSentinel> sentinel;
  DriftLedger ledger;
  double before_s = 0.0;
  if (options.drift_tolerance > 0.0) {
    sentinel = std::make_unique<DriftSentinel>(backend, timing.clock);
    ledger.reference_s = resumed ? provenance_positive_number(profile, "sentinel_reference_s") : 0.0;
    ledger.remeasured_batches =
        static_cast<int64_t>(provenance_positive_number(profile, "drift_remeasured_batches"));
    ledger.marked_points = static_cast<int64_t>(provenance_positive_number(profile, "drift_marked_points"));
    std::vector<double> first = {sentinel->time_s(), sentinel->time_s(), sentinel->time_s()};
    for (const double t : first) {
      ledger.saw(t);
    }
    if (ledger.reference_s <= 0.0) {
      ledger.reference_s = summarize_samples(first).median_s;
    }
    before_s = first.back();
  }

  const std::function<void()> stop = stop_if_asked;
  const std::function<void()> save = checkpoint_now;
  const PointsRun run{backend, options, timing, run_start_s, sentinel.get(), stop, save};
  const int64_t skipped = measure_points(run, todo, profile, ledger, before_s);
  record_noise_provenance(profile, ledger, sentinel.get(), options);
  p["skipped_count"] = std::to_string(skipped);
  p["duration_s"] = format_general(steady_now_s() - run_start_s, 4) + " (this invocation)";
  p["status"] = "complete";
  p["measurement_count"] = std::to_string(profile.measurements.size());
  save_profile_atomically(profile, options.out_path);
  std::error_code ignored;
  std::filesystem::remove(checkpoint, ignored);
  return profile;
}

// ---- how long a run takes --------------------------------------------------------------

namespace {

// Estimated seconds to measure one point in `rounds` rounds of `round`.
double estimated_point_s(const ProfilePoint& point, const TimingOptions& round, int rounds,
                         double flops_per_s, double bytes_per_s) {
  int64_t set_bytes = 0;
  try {
    set_bytes = op_working_set_bytes(point.shape, point.pass);
  } catch (const std::exception&) {
    return 0.0;  // skipped at once
  }
  if ((round.memory_limit_bytes > 0 && set_bytes > round.memory_limit_bytes) ||
      (round.max_point_bytes > 0 && set_bytes > round.max_point_bytes)) {
    return 0.0;
  }
  const OpCost cost = op_cost(point.shape, point.pass);
  const double call_s =
      std::max(cost.flops / flops_per_s, cost.bytes / bytes_per_s) + 2e-6;  // + dispatch
  int64_t copies = 1;
  if (round.rotation_bytes > set_bytes && set_bytes > 0) {
    copies = std::min<int64_t>((round.rotation_bytes + set_bytes - 1) / set_bytes,
                               std::max(1, round.max_copies));
  }
  // Filling copy 0 with random numbers and copying it: a few passes over the
  // bytes, once (a batch keeps its tensors between rounds).
  const double setup_s = 4.0 * static_cast<double>(copies * set_bytes) / bytes_per_s;
  const double round_s =
      std::max(round.budget_s, static_cast<double>(1 + round.min_repeats) * call_s);
  return static_cast<double>(rounds) * round_s + setup_s;
}

}  // namespace

ProfileDurationEstimate estimate_profile_duration(Backend& backend, const ProfileOptions& options,
                                                  const std::vector<ProfilePoint>& points) {
  ProfileDurationEstimate estimate;
  const HostFacts host = read_host_facts();
  const MachineSetup machine = machine_setup(backend, options, host);
  // The rates: a 256^3 GEMM (the sentinel) and a copy of 64 MiB, timed now.
  {
    DriftSentinel gemm(backend, options.timing.clock);
    const double n = backend.device() == DeviceKind::cpu ? 256.0 : 4096.0;
    estimate.gemm_flops_per_s = 2.0 * n * n * n / gemm.time_s(0.02);
    const int64_t elements = int64_t{16} << 20;
    // (The values do not matter to a copy; time_call's untimed first call
    // touches the pages.)
    Tensor src(backend, {elements}, ScalarType::fp32), dst(backend, {elements}, ScalarType::fp32);
    const double seconds = time_call(
        backend, options.timing.clock, [&] { backend.copy(src.view(), dst.view()); }, 0.03);
    estimate.bytes_per_s = 2.0 * 4.0 * static_cast<double>(elements) / seconds;
  }
  TimingOptions round = machine.timing;
  const int rounds = std::max(1, options.rounds);
  if (rounds > 1) {
    round.budget_s = machine.timing.budget_s / rounds;
    round.min_repeats = std::max(2, (machine.timing.min_repeats + rounds - 1) / rounds);
  }
  if (options.measure_ceilings) {
    // Two square GEMMs (fp32, bf16 taken at half the rate), >= 4 calls or 1 s
    // each; a 1 s copy; the 0.3 s dispatch loop.
    const double n = backend.device() == DeviceKind::cpu ? 2048.0 : 16384.0;
    const double gemm_s = 2.0 * n * n * n / estimate.gemm_flops_per_s;
    estimate.ceilings_s = std::max(1.0, 4.0 * gemm_s) + std::max(1.0, 8.0 * gemm_s) + 1.3;
  }
  std::vector<double> cost_s(points.size());
  double points_s = 0.0;
  for (size_t i = 0; i < points.size(); ++i) {
    cost_s[i] = estimated_point_s(points[i], round, rounds, estimate.gemm_flops_per_s,
                                  estimate.bytes_per_s);
    points_s += cost_s[i];
  }
  const size_t batches =
      (points.size() + static_cast<size_t>(std::max(1, options.batch_points)) - 1) /
      static_cast<size_t>(std::max(1, options.batch_points));
  const double sentinel_s =
      options.drift_tolerance > 0.0 ? 0.03 * static_cast<double>(batches + 3) : 0.0;
  // Under a bound: leave out the most expensive points until the rest fits.
  std::vector<bool> keep(points.size(), true);
  if (options.max_seconds > 0.0) {
    std::vector<size_t> order(points.size());
    for (size_t i = 0; i < order.size(); ++i) {
      order[i] = i;
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return cost_s[a] > cost_s[b]; });
    const double room_s = options.max_seconds - estimate.ceilings_s - sentinel_s;
    for (size_t i = 0; i < order.size() && points_s > room_s; ++i) {
      keep[order[i]] = false;
      points_s -= cost_s[order[i]];
      estimate.left_out_s += cost_s[order[i]];
    }
  }
  for (size_t i = 0; i < points.size(); ++i) {
    (keep[i] ? estimate.kept : estimate.left_out).push_back(points[i]);
  }
  estimate.total_s = estimate.ceilings_s + sentinel_s + std::max(0.0, points_s);
  return estimate;
}

// ---- settings ------------------------------------------------------------------------

ProfileOptions resolve_profile_options(const ProfileRequest& request, const Backend& backend) {
  return resolve_profile_options(request, backend.device());
}

ProfileOptions resolve_profile_options(const ProfileRequest& request, DeviceKind device) {
  ProfileOptions options;
  const bool cpu = device == DeviceKind::cpu;
  options.backend_name = request.backend;
  options.out_path = request.out_path;
  options.grid = request.quick ? GridSize::quick : GridSize::full;
  options.resume = request.resume;
  options.measure_ceilings = request.measure_ceilings;
  options.dtype = request.dtype.value_or(cpu ? DType::fp32 : DType::bf16);
  if (options.dtype != DType::fp32 && options.dtype != DType::bf16) {
    throw ConfigError(std::string("dtype = ") + to_string(options.dtype) +
                      ": the profiler times fp32 or bf16");
  }
  // CPU default: one thread timed by CPU time, so that a profile taken on a
  // shared machine does not depend on the load at the time (docs/profiler.md).
  options.threads = request.threads.value_or(cpu ? 1 : 0);
  if (options.threads < 0 || options.threads > max_cpu_threads()) {
    throw ConfigError("threads = " + std::to_string(options.threads) + ": must be in [0, " +
                      std::to_string(max_cpu_threads()) + "] (0 = all cores)");
  }
  options.timing.clock = request.clock.value_or(cpu ? Clock::cpu : Clock::wall);
  if (options.timing.clock == Clock::cpu && !cpu) {
    throw ConfigError("clock = cpu: only the cpu backend can be timed by CPU time; use wall");
  }
  // Noise: 3 interleaved rounds per point in batches of 32 (a few seconds of
  // work each), the sentinel allowed to move 10 % (docs/profiler.md, "Noise").
  options.rounds = request.rounds.value_or(3);
  if (options.rounds < 1 || options.rounds > 20) {
    throw ConfigError("rounds = " + std::to_string(options.rounds) +
                      ": must be an integer in [1, 20] (interleaved rounds per point)");
  }
  options.batch_points = 32;
  options.drift_tolerance = request.drift_tolerance.value_or(0.10);
  if (!(options.drift_tolerance >= 0.0 && options.drift_tolerance <= 10.0)) {
    throw ConfigError("drift_tolerance = " + format_general(options.drift_tolerance, 4) +
                      ": must be in [0, 10] (a fraction: 0.1 = the sentinel may move 10 %; 0 = "
                      "no sentinel)");
  }
  options.max_seconds = request.max_seconds.value_or(0.0);
  if (request.max_seconds && !(options.max_seconds > 0.0 && options.max_seconds <= 1e7)) {
    throw ConfigError("max_seconds = " + format_general(options.max_seconds, 4) +
                      ": must be in (0, 1e7] seconds (the bound on the whole run)");
  }
  options.timing.budget_s = request.budget_s.value_or(request.quick ? 0.08 : 0.25);
  // A shape's budget beyond an hour is no profile anyone waits for.
  if (!(options.timing.budget_s > 0.0) || !(options.timing.budget_s <= 3600.0)) {
    throw ConfigError("budget_s = " + format_general(options.timing.budget_s, 4) +
                      ": must be in (0, 3600] seconds per shape");
  }
  // Byte counts: positive and at most `most` (2^40 = 1 TiB of caches or
  // rotated copies, 2^50 of device memory: beyond any device).
  const auto bytes = [](const char* name, const std::optional<int64_t>& value,
                        int64_t most) -> int64_t {
    if (!value)
      return 0;
    if (*value <= 0 || *value > most)
      throw ConfigError(std::string(name) + " = " + std::to_string(*value) + ": must be in [1, " +
                        std::to_string(most) + "] bytes");
    return *value;
  };
  constexpr int64_t kTiB = int64_t{1} << 40;
  constexpr int64_t kMostMemory = int64_t{1} << 50;
  options.timing.rotation_bytes = bytes("rotation_bytes", request.rotation_bytes, kTiB);
  options.device_cache_bytes = bytes("device_cache_bytes", request.device_cache_bytes, kTiB);
  options.device_memory_bytes =
      bytes("device_memory_bytes", request.device_memory_bytes, kMostMemory);
  options.timing.max_point_bytes = bytes("max_point_bytes", request.max_point_bytes, kMostMemory);
  const int64_t max_dim = request.max_dim.value_or(0);
  if (request.max_dim && (max_dim < 1 || max_dim > (int64_t{1} << 40))) {
    throw ConfigError("max_dim = " + std::to_string(max_dim) +
                      ": must be an integer >= 1 (only grid points whose every dimension is <= "
                      "max_dim; leave it unset for all)");
  }
  if (!request.kinds.empty() || max_dim > 0) {
    std::set<std::string> known;
    const std::vector<ProfilePoint> grid =
        profile_grid(options.grid, device, options.dtype);
    for (const ProfilePoint& point : grid)
      known.insert(to_string(point.shape.kind));
    for (const std::string& kind : request.kinds) {
      if (known.count(kind) == 0) {
        std::string allowed;
        for (const std::string& name : known)
          allowed += (allowed.empty() ? "" : ", ") + name;
        throw ConfigError("kinds: \"" + kind +
                          "\" is not an op kind of the grid; allowed: " + allowed);
      }
    }
    // A reduced grid: only these op kinds, only points whose every dim is <=
    // max_dim.  A per-dim threshold keeps each kind's grid a tensor product,
    // which is what the timing model interpolates over.
    const std::set<std::string> wanted(request.kinds.begin(), request.kinds.end());
    for (const ProfilePoint& point : grid) {
      if (!wanted.empty() && wanted.count(to_string(point.shape.kind)) == 0)
        continue;
      bool small = true;
      for (int d = 0; d < op_dims_count(point.shape.kind); ++d) {
        small = small && (max_dim <= 0 || point.shape.dims[static_cast<size_t>(d)] <= max_dim);
      }
      if (small)
        options.points.push_back(point);
    }
    if (options.points.empty()) {
      throw ConfigError("kinds / max_dim: no point of the profiler's grid is left");
    }
  }
  return options;
}

std::string profile_settings_json(const ProfileOptions& options,
                                  const ProfileDurationEstimate* estimate) {
  JsonWriter json(2);
  json.begin_object();
  json.field("backend", options.backend_name);
  json.field("out_path", options.out_path);
  json.field("grid", to_string(options.grid));
  json.field("dtype", to_string(options.dtype));
  json.field("threads", options.threads);
  json.field("clock", to_string(options.timing.clock));
  json.field("budget_s", options.timing.budget_s);
  json.field("rotation_bytes", options.timing.rotation_bytes);
  json.field("device_cache_bytes", options.device_cache_bytes);
  json.field("device_memory_bytes", options.device_memory_bytes);
  json.field("max_point_bytes", options.timing.max_point_bytes);
  json.field("resume", options.resume);
  json.field("measure_ceilings", options.measure_ceilings);
  const std::vector<ProfilePoint> points =
      options.points.empty()
          ? profile_grid(options.grid,
                         options.backend_name == "cpu" ? DeviceKind::cpu : DeviceKind::cuda,
                         options.dtype)
          : options.points;
  json.field("points", static_cast<int64_t>(points.size()));
  json.field("rounds", options.rounds);
  json.field("batch_points", options.batch_points);
  json.field("drift_tolerance", options.drift_tolerance);
  json.field("max_seconds", options.max_seconds);
  if (estimate != nullptr) {
    json.field("estimated_duration_s", estimate->total_s);
    json.field("points_within_bound", static_cast<int64_t>(estimate->kept.size()));
    json.field("points_left_out", static_cast<int64_t>(estimate->left_out.size()));
  }
  json.end_object();
  return json.str() + "\n";
}

// ---- loading ---------------------------------------------------------------------------

void check_measured_profile(const DeviceProfile& profile, const std::string& source,
                            const std::string& expected_backend) {
  const auto status = profile.provenance.find("status");
  if (status != profile.provenance.end() && status->second != "complete") {
    throw FileError(source + ": provenance.status = \"" + status->second +
                    "\": a partial profile (the checkpoint of an interrupted `modar profile` "
                    "run); finish it with `modar profile --resume --out <the final path>`");
  }
  const auto count = profile.provenance.find("measurement_count");
  if (count != profile.provenance.end()) {
    char* end = nullptr;
    const long long expected = std::strtoll(count->second.c_str(), &end, 10);
    if (end == count->second.c_str() || *end != '\0' ||
        expected != static_cast<long long>(profile.measurements.size())) {
      throw FileError(source + ": provenance.measurement_count = \"" + count->second +
                      "\" but the file holds " + std::to_string(profile.measurements.size()) +
                      " measurements: the profile is truncated or corrupted; measure it again "
                      "with `modar profile`");
    }
  }
  if (!profile.measured || profile.measurements.empty()) {
    std::string built_in;
    for (const std::string& name : embedded_profile_names()) {
      if (load_profile(name).measured) {
        built_in += (built_in.empty() ? "" : ", ") + name;
      }
    }
    throw ConfigError(source + ": measured = " + (profile.measured ? "true" : "false") + " with " +
                      std::to_string(profile.measurements.size()) +
                      " measurements: comparing needs a measured profile (one the profiler wrote" +
                      (built_in.empty() ? std::string(")") : "; built in: " + built_in + ")"));
  }
  if (!expected_backend.empty() && profile.backend != expected_backend) {
    throw ConfigError(source + ": backend = \"" + profile.backend +
                      "\": this profile was measured on the " + profile.backend +
                      " backend, not on " + expected_backend +
                      "; allowed: a profile measured with backend = \"" + expected_backend + "\"");
  }
}

DeviceProfile load_measured_profile(const std::string& path, const std::string& expected_backend) {
  // A built-in profile by name, as every other command takes it.
  if (path.find('/') == std::string::npos &&
      !(path.size() > 5 && path.compare(path.size() - 5, 5, ".toml") == 0) &&
      !embedded_profile_text(path).empty()) {
    DeviceProfile profile = load_profile(path);
    check_measured_profile(profile, "profile '" + path + "'", expected_backend);
    return profile;
  }
  const std::string text = read_profile_file(path);
  DeviceProfile profile;
  try {
    profile = parse_profile_toml(text, path);
  } catch (const FileError& e) {
    throw FileError(std::string(e.what()) + " (the profile is corrupted or truncated)");
  } catch (const ConfigError& e) {
    throw FileError(std::string(e.what()) + " (the profile is corrupted or truncated)");
  }
  check_measured_profile(profile, path, expected_backend);
  return profile;
}

}  // namespace modar::runtime
