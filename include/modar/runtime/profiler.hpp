// modar/runtime/profiler.hpp: time the runtime's ops and write a device profile.
//
// The profiler executes every op kind of the shared vocabulary (ops.hpp) on a
// Backend over a grid of OpShapes, forward and backward, and records the
// median time with its spread.  cost_models (TimingModel) interpolates those
// times in log-space to predict a configuration's step time (docs/cost_model.md).
//
// Timing rules (docs/profiler.md, CUTLASS / llm.c / ggml practice):
//  * inputs are random (uniform in [-1, 1], positive where the op needs it,
//    valid indices), never zeros;
//  * untimed warm-up calls first (allocation, first-touch, clocks);
//  * each timing sample covers `inner` back-to-back calls (so that a sample is
//    long enough for the timer), with device timers (Backend::make_timer:
//    steady_clock on the CPU, CUDA events on a GPU);
//  * calls rotate over enough copies of the op's tensors that the copies
//    together exceed the rotation size (default 2x the last-level cache), so a
//    repeat does not find its inputs in the cache the previous one warmed;
//  * the median of the samples is the time; (p90 - p10) / median the spread;
//  * each (shape, pass) gets a time budget; at least `min_repeats` samples;
//  * shapes whose tensors do not fit in the memory limit are skipped, with the
//    reason recorded in the profile's provenance.
//
// A run checkpoints its partial table to OUT.partial (atomically) after every
// shape; `resume` continues from it.  The final profile carries
// provenance.status = "complete" and provenance.measurement_count, so that a
// partial or truncated file is refused with a clear message
// (load_measured_profile).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "modar/base/interrupt.hpp"
#include "modar/ops.hpp"
#include "modar/profile.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/host_facts.hpp"
#include "modar/runtime/tensor.hpp"

namespace modar::runtime {

// ---- statistics ---------------------------------------------------------------

struct TimingStats {
  double median_s = 0.0;
  double p10_s = 0.0;
  double p90_s = 0.0;
  int64_t repeats = 0;
  double spread() const { return median_s > 0.0 ? (p90_s - p10_s) / median_s : 0.0; }
};
// Median and 10th / 90th percentiles (linear interpolation between order
// statistics, the "type 7" definition of numpy / R).  Throws std::invalid_argument
// for an empty sample.
TimingStats summarize_samples(std::vector<double> samples_s);

// ---- the grid -----------------------------------------------------------------

struct ProfilePoint {
  OpShape shape;
  Pass pass = Pass::forward;
};

enum class GridSize : uint8_t { quick, full };
const char* to_string(GridSize size);

// The shapes profiled per op kind.  Every kind's grid is a full tensor
// product over the dims that vary (what TimingModel interpolates over), with
// the values chosen to cover what the planner lowers typical configurations
// into; the CPU grid is scaled down to what 2 cores finish in minutes.
// docs/profiler.md lists the values.
std::vector<ProfilePoint> profile_grid(GridSize size, DeviceKind device, DType dtype);

// The same identity used for resume and for tests: kind, pass, dtype, dims.
bool same_point(const OpShape& a, Pass pass_a, const OpShape& b, Pass pass_b);
// "gemm forward fp32 [256, 1024, 64, 1]".
std::string describe(const OpShape& shape, Pass pass);

// ---- measuring one op -----------------------------------------------------------

// Bytes of one copy of the tensors the op touches in this pass (inputs,
// outputs, saved state).  Throws ShapeError for shapes the runtime cannot
// execute (e.g. attention with s_q != s_k).
int64_t op_working_set_bytes(const OpShape& shape, Pass pass);

// What a timing sample measures.  wall: the backend's timer (steady_clock on
// the CPU, CUDA events on a GPU).  cpu: the process's CPU time divided by the
// CPU threads (CPU backend only): on a shared, loaded machine it excludes the
// time the OS gave to other processes (best with --threads 1, where it is the
// work of the one thread; with more threads it also counts spin-waiting).
enum class Clock : uint8_t { wall, cpu };
const char* to_string(Clock clock);
// Throws ConfigError for "cpu" on a non-CPU backend.
std::unique_ptr<Timer> make_sample_timer(Backend& backend, Clock clock);

struct TimingOptions {
  Clock clock = Clock::wall;
  double budget_s = 0.25;  // wall time aimed at per (shape, pass), warm-up included
  int min_repeats = 5;     // samples, even past the budget
  int max_repeats = 101;
  double min_sample_s = 2e-4;  // a sample covers enough calls to last this long
  int64_t rotation_bytes = 0;  // copies of the tensors until their total exceeds this
  int max_copies = 256;
  int64_t memory_limit_bytes = 0;  // 0: no limit
  // A bounded grid (scripts/gpu-check.sh): shapes whose one copy of tensors
  // exceeds this are recorded as skipped without being allocated (0: none).
  int64_t max_point_bytes = 0;
  uint64_t seed = 0x6d6f646172ULL;
};

struct OpTiming {
  bool skipped = false;
  std::string skip_reason;  // when skipped
  OpMeasurement measurement;
  TimingStats stats;
  std::vector<double> samples_s;  // every sample (seconds per call), in order
  int copies = 0;           // rotated tensor sets
  int64_t inner_calls = 0;  // calls per sample
  int64_t working_set_bytes = 0;
};

// Execute `shape` in `pass` on `backend` per the timing rules above.
OpTiming measure_op(Backend& backend, const OpShape& shape, Pass pass,
                    const TimingOptions& options);

// ---- noise: the drift sentinel -------------------------------------------------------

// A reference kernel timed again and again through a run: a square GEMM
// (256^3 fp32 on the CPU, 4096^3 bf16 on a GPU) with the run's clock.  The
// profiler times it before and after every batch of points, validate before
// and after its repeats; the profile records its time so that a later run on
// the same machine can tell whether the machine still runs at that speed.
class DriftSentinel {
 public:
  DriftSentinel(Backend& backend, Clock clock);
  DriftSentinel(const DriftSentinel&) = delete;
  DriftSentinel& operator=(const DriftSentinel&) = delete;
  // Median seconds per call over about budget_s (at least 5 samples).
  double time_s(double budget_s = 0.03);
  // "gemm 256x256x256 fp32, cpu clock"
  std::string description() const;

 private:
  Backend& backend_;
  Clock clock_;
  int64_t n_ = 0;
  ScalarType type_ = ScalarType::fp32;
  Tensor a_, b_, out_;
};

// How far the sentinel moved over a batch: the largest relative change among
// before vs the run's reference, after vs the reference, and after vs before
// (|x / y - 1|, the larger time over the smaller, so that a slow-down and a
// speed-up of the same factor count alike).  0 when any time is <= 0.
double sentinel_drift(double reference_s, double before_s, double after_s);

// The CPUs other work kept busy since construction: /proc/stat's busy time of
// all CPUs (steal included: the hypervisor's other guests) minus this
// process's CPU time, over the wall time, i.e. the average number of logical
// CPUs that something else used while we measured.
class HostLoadMeter {
 public:
  HostLoadMeter();
  // -1 when /proc/stat cannot be read.
  double other_busy_cpus() const;

 private:
  bool readable_ = false;
  double busy_start_ = 0.0, total_start_ = 0.0;
  double wall_start_s_ = 0.0, own_start_s_ = 0.0;
};
// "0.52 0.61 0.80" (/proc/loadavg), or "unknown".
std::string load_average_text();
// A profile's provenance value read as a number > 0 (sentinel_reference_s,
// counts), or 0 when it is missing or not such a number.
double provenance_positive_number(const DeviceProfile& profile, const char* key);

// ---- the machine ----------------------------------------------------------------

// HostFacts / read_host_facts(): modar/runtime/host_facts.hpp.

// Compiler, flags (from predefined macros), Eigen version, OpenMP, modar version.
std::map<std::string, std::string> build_provenance();

// Threads the CPU backend's parallel loops and Eigen use (OpenMP); 0 = keep.
// Throws ConfigError("threads = N: must be in [0, max_cpu_threads()]").
void set_cpu_threads(int threads);
int cpu_threads();
// The most threads accepted: 4 x the logical CPUs (at least 8).
int max_cpu_threads();

// Thrown by run_profile / run_validation when their should_stop() hook says
// so (Ctrl-C; the checkpoint keeps every point measured so far): the one
// Interrupted of modar/base/interrupt.hpp, which every long call throws.
using modar::Interrupted;

// ---- a whole run -------------------------------------------------------------------

struct ProfileOptions {
  std::string backend_name = "cpu";  // recorded; must match backend.device()
  GridSize grid = GridSize::quick;
  DType dtype = DType::fp32;
  int threads = 0;       // CPU: OpenMP threads (0 = the default)
  std::string out_path;  // the profile; OUT.partial holds the checkpoint
  bool resume = false;
  TimingOptions timing;  // rotation / memory limit 0 = from the machine
  // Device facts the backend interface cannot report yet (GPU L2 size and
  // memory): 0 = a documented default for the device kind.
  int64_t device_cache_bytes = 0;
  int64_t device_memory_bytes = 0;
  std::vector<ProfilePoint> points;  // empty: profile_grid(grid, device, dtype)
  std::FILE* progress = nullptr;     // progress lines with an ETA (stderr in the CLI)
  bool measure_ceilings = true;
  // Noise (docs/profiler.md, "Noise"): the points are measured in batches of
  // batch_points; each batch in `rounds` interleaved rounds (round r times
  // every point of the batch once with budget_s / rounds; odd rounds in
  // reverse order), a point's time being the median of all its samples.  The
  // drift sentinel is timed before and after each batch; when it moved by more
  // than drift_tolerance (sentinel_drift) the batch is measured once more, and
  // its points are marked (OpMeasurement::drift) if it moved again.
  // drift_tolerance = 0: no sentinel.  The defaults here measure each point
  // once; resolve_profile_options() applies the run's (3 rounds, 32, 0.10).
  int rounds = 1;
  int batch_points = 1;
  double drift_tolerance = 0.0;
  // Bound on the whole run in seconds (0: none): the points whose estimated
  // cost does not fit are left out before measuring, and measuring stops when
  // the time is spent; both are reported (provenance.unmeasured_*).
  double max_seconds = 0.0;
  // Asked between grid points (and between ceilings): true stops the run
  // cleanly (checkpoint kept) by throwing Interrupted.
  std::function<bool()> should_stop;
};

// ---- settings: what the user said -> the options of a run ----------------------------
// The ONE owner of the profiler's defaults: the CLI (`modar profile`) and
// Python (modar.profile) fill a ProfileRequest with only what the user gave,
// and resolve_profile_options() applies the defaults and the checks.  Errors
// name the field (e.g. "threads = -1: ..."), never a CLI flag.
struct ProfileRequest {
  std::string backend = "cpu";
  std::string out_path;  // required
  bool quick = false;
  bool resume = false;
  std::optional<DType> dtype;                  // default: fp32 on the CPU, bf16 on a GPU
  std::optional<int> threads;                  // default: 1 on the CPU (see clock), 0 = all cores
  std::optional<Clock> clock;                  // default: cpu on the CPU backend, wall on a GPU
  std::optional<double> budget_s;              // default: 0.08 s per shape (quick), 0.25 s (full)
  std::optional<int64_t> rotation_bytes;       // default: 2 x last-level cache / L2
  std::optional<int64_t> device_cache_bytes;   // default: what the device reports
  std::optional<int64_t> device_memory_bytes;  // default: what the device reports
  std::optional<int64_t> max_point_bytes;      // default: unbounded (points larger are skipped)
  std::optional<int> rounds;                   // default: 3 interleaved rounds per point
  std::optional<double> drift_tolerance;       // default: 0.10 (the sentinel may move 10 %)
  std::optional<double> max_seconds;           // default: no bound on the run
  std::vector<std::string> kinds;              // only these op kinds (empty: all)
  std::optional<int64_t> max_dim;              // only points whose every dim is <= max_dim (>= 1)
  bool measure_ceilings = true;
};
ProfileOptions resolve_profile_options(const ProfileRequest& request, const Backend& backend);
// The same for a device of this kind that no modar Backend drives (the
// PyTorch profile, `python -m modar profile --backend torch`): the same
// defaults, checks and grid for its device.
ProfileOptions resolve_profile_options(const ProfileRequest& request, DeviceKind device);
// How long a run of `options` on `backend` should take, and which points fit
// options.max_seconds.  Each point costs its rounds: per round the budget
// share, or its warm-up plus minimum samples when one call outlasts that,
// plus filling its rotated copies; a call's time is the larger of its FLOPs
// at the rate of a 256^3 GEMM and its bytes at the rate of a large copy, both
// timed here (about 0.1 s).  The ceilings and the sentinel are added.  Under
// a bound, the most expensive points are left out until the rest fits.
struct ProfileDurationEstimate {
  double total_s = 0.0;                              // ceilings + sentinel + the points kept
  double ceilings_s = 0.0;                           // 0 when the ceilings are not measured
  double gemm_flops_per_s = 0.0, bytes_per_s = 0.0;  // the rates it used
  std::vector<ProfilePoint> kept, left_out;          // left_out: beyond max_seconds
  double left_out_s = 0.0;                           // what the left-out points would have cost
};
ProfileDurationEstimate estimate_profile_duration(Backend& backend, const ProfileOptions& options,
                                                  const std::vector<ProfilePoint>& points);

// The resolved settings as one JSON object (backend, out_path, grid, dtype,
// threads, clock, budget_s, rotation_bytes, rounds, drift_tolerance,
// max_seconds, points, kinds; with an estimate, estimated_duration_s and the
// points within the bound): what `modar profile --dry-run` and
// modar.profile(dry_run=True) show.
std::string profile_settings_json(const ProfileOptions& options,
                                  const ProfileDurationEstimate* estimate = nullptr);

// Path of the checkpoint of a run writing `out_path`.
std::string partial_path(const std::string& out_path);

// Measure the ceilings and every grid point, checkpointing to OUT.partial,
// write OUT atomically, remove the checkpoint, and return the profile.
DeviceProfile run_profile(Backend& backend, const ProfileOptions& options);

// Read a profile written by the profiler and check it: not partial, not
// truncated (measurement_count matches), measured, and of `expected_backend`
// ("" = any).  FileError / ConfigError with a message that says what to do.
DeviceProfile load_measured_profile(const std::string& path, const std::string& expected_backend);
// The same checks on a parsed profile (`source` names it in messages).
void check_measured_profile(const DeviceProfile& profile, const std::string& source,
                            const std::string& expected_backend);

}  // namespace modar::runtime
