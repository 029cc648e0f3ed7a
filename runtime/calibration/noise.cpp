// runtime/calibration/noise.cpp: what the calibration loop knows about its
// own noise.  The drift sentinel (one fixed GEMM timed again and again through
// a run, so a machine whose speed changed shows up as a changed time) and the
// host's load measured from /proc/stat (the CPUs that other processes and the
// hypervisor kept busy while we measured).  docs/profiler.md, "Noise".
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "modar/base/clock.hpp"
#include "modar/runtime/profiler.hpp"
#include "profiler_internal.hpp"

namespace modar::runtime {
namespace {

// Larger over smaller, minus 1: a slow-down and a speed-up by the same factor
// count alike.
double relative_change(double a, double b) {
  return std::max(a, b) / std::min(a, b) - 1.0;
}

}  // namespace

// ---- the drift sentinel ----------------------------------------------------------------

DriftSentinel::DriftSentinel(Backend& backend, Clock clock)
    : backend_(backend),
      clock_(clock),
      n_(backend.device() == DeviceKind::cpu ? 256 : 4096),
      type_(backend.device() == DeviceKind::cpu ? ScalarType::fp32 : ScalarType::bf16),
      a_(backend, {n_, n_}, type_),
      b_(backend, {n_, n_}, type_),
      out_(backend, {n_, n_}, type_) {
  const SampleTensor uniform{};  // U(-1, 1) values
  fill_sample_tensor(backend_, a_.view(), uniform, SampleFill::timing, 21);
  fill_sample_tensor(backend_, b_.view(), uniform, SampleFill::timing, 22);
  backend_.gemm(a_.view(), false, b_.view(), false, out_.view());  // first touch
  backend_.synchronize();
}

double DriftSentinel::time_s(double budget_s) {
  auto timer = make_sample_timer(backend_, clock_);
  // A sample lasts at least 0.5 ms (the GPU GEMM is far shorter than that).
  const int64_t inner = backend_.device() == DeviceKind::cpu ? 1 : 8;
  std::vector<double> samples;
  const double start_s = steady_now_s();
  while (samples.size() < 5 || (steady_now_s() - start_s < budget_s && samples.size() < 101)) {
    timer->start();
    for (int64_t i = 0; i < inner; ++i) {
      backend_.gemm(a_.view(), false, b_.view(), false, out_.view());
    }
    timer->stop();
    samples.push_back(timer->elapsed_s() / static_cast<double>(inner));
  }
  return summarize_samples(std::move(samples)).median_s;
}

std::string DriftSentinel::description() const {
  return "gemm " + std::to_string(n_) + "x" + std::to_string(n_) + "x" + std::to_string(n_) + " " +
         to_string(type_) + ", " + to_string(clock_) + " clock, median of >= 5 calls";
}

double sentinel_drift(double reference_s, double before_s, double after_s) {
  if (!(reference_s > 0.0) || !(before_s > 0.0) || !(after_s > 0.0)) {
    return 0.0;
  }
  return std::max({relative_change(before_s, reference_s), relative_change(after_s, reference_s),
                   relative_change(after_s, before_s)});
}

// ---- the host's load ----------------------------------------------------------------------

namespace {

// /proc/stat's first line: cumulative jiffies of all CPUs; busy = everything
// but idle and iowait (steal, the time the hypervisor ran other guests, counts
// as busy: it is time this machine's CPUs were not ours).
bool read_cpu_jiffies(double* busy, double* total) {
  std::ifstream in("/proc/stat");
  std::string label;
  in >> label;
  if (!in || label != "cpu") {
    return false;
  }
  std::vector<double> fields;
  double value = 0.0;
  for (int i = 0; i < 8 && (in >> value); ++i) {
    fields.push_back(value);  // user nice system idle iowait irq softirq steal
  }
  if (fields.size() < 5) {
    return false;
  }
  *total = 0.0;
  for (const double f : fields) {
    *total += f;
  }
  *busy = *total - fields[3] - fields[4];
  return true;
}

}  // namespace

HostLoadMeter::HostLoadMeter() {
  readable_ = read_cpu_jiffies(&busy_start_, &total_start_);
  wall_start_s_ = steady_now_s();
  own_start_s_ = process_cpu_s();
}

double HostLoadMeter::other_busy_cpus() const {
  double busy = 0.0, total = 0.0;
  const long ticks = ::sysconf(_SC_CLK_TCK);
  const double wall_s = steady_now_s() - wall_start_s_;
  if (!readable_ || ticks <= 0 || !read_cpu_jiffies(&busy, &total) || wall_s <= 0.0) {
    return -1.0;
  }
  const double busy_s = (busy - busy_start_) / static_cast<double>(ticks);
  const double own_s = process_cpu_s() - own_start_s_;
  return std::max(0.0, (busy_s - own_s) / wall_s);
}

double provenance_positive_number(const DeviceProfile& profile, const char* key) {
  const auto it = profile.provenance.find(key);
  if (it == profile.provenance.end()) {
    return 0.0;
  }
  char* end = nullptr;
  const double value = std::strtod(it->second.c_str(), &end);
  return end != it->second.c_str() && std::isfinite(value) && value > 0.0 ? value : 0.0;
}

std::string load_average_text() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a.empty() ? std::string("unknown") : a + " " + b + " " + c;
}

}  // namespace modar::runtime
