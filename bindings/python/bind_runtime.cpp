// bindings/python/bind_runtime.cpp -- the reference runtime's profiler and
// validation (include/modar/runtime/{profiler,validate}.hpp).
//
// Both run for minutes, so they release the GIL.  Their progress lines (an
// std::FILE* in the C++ options, stderr in the CLI) are routed to a Python
// callable through a glibc cookie stream, so a notebook shows them in the
// cell's output.  The callable runs with the GIL held and never throws back
// into C stdio: a Python exception (Ctrl-C included) is kept and re-raised
// when the C++ call returns.
#include <pybind11/stl.h>

#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "modar/base/errors.hpp"
#include "modar/base/interrupt.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/profiler.hpp"
#include "modar/runtime/validate.hpp"
#include "progress.hpp"

namespace modar::python {

namespace {

// A write-only FILE* whose complete lines ('\n' or '\r' ended) go to `callback`.
class ProgressStream {
 public:
  explicit ProgressStream(py::object callback) : callback_(std::move(callback)) {
#ifdef __GLIBC__
    if (!callback_.is_none()) {
      cookie_io_functions_t functions{};
      functions.write = &ProgressStream::write;
      file_ = fopencookie(this, "w", functions);
      if (file_ != nullptr) {
        setvbuf(file_, nullptr, _IONBF, 0);
      }
    }
#endif
  }
  ProgressStream(const ProgressStream&) = delete;
  ProgressStream& operator=(const ProgressStream&) = delete;
  ~ProgressStream() {
    if (file_ != nullptr) {
      std::fclose(file_);
    }
  }

  std::FILE* file() const {
    return file_;
  }

  // After the C++ call (GIL held): re-raise what the callback raised.
  void rethrow_pending() {
    pending_error_.rethrow();
  }

 private:
  static ssize_t write(void* cookie, const char* data, size_t size) {
    auto* self = static_cast<ProgressStream*>(cookie);
    self->buffer_.append(data, size);
    size_t end = 0;
    std::vector<std::string> lines;
    while ((end = self->buffer_.find_first_of("\r\n")) != std::string::npos) {
      if (end > 0) {
        lines.push_back(self->buffer_.substr(0, end));
      }
      self->buffer_.erase(0, end + 1);
    }
    if (lines.empty() || self->pending_error_) {
      return static_cast<ssize_t>(size);
    }
    py::gil_scoped_acquire acquire;
    try {
      if (self->pending_error_.keep_signal()) {
        return static_cast<ssize_t>(size);
      }
      for (const std::string& line : lines) {
        self->callback_(line);
      }
    } catch (py::error_already_set& e) {
      self->pending_error_.keep(std::move(e));
    } catch (...) {  // never unwind through C stdio
    }
    return static_cast<ssize_t>(size);
  }

  py::object callback_;
  std::FILE* file_ = nullptr;
  std::string buffer_;
  PendingPythonError pending_error_;
};

std::unique_ptr<runtime::Backend> backend_or_config_error(const std::string& name) {
  try {
    return runtime::make_backend(name);
  } catch (const BackendError& e) {
    throw ConfigError(e.what());
  }
}

// A should_stop hook for a C++ run that released the GIL: it takes the GIL
// between grid points / rounds and asks Python whether a signal (Ctrl-C) came.
// The Python exception is kept and re-raised when the run returns.
struct SignalCheck {
  PendingPythonError pending;
  std::function<bool()> hook() {
    return [this] {
      py::gil_scoped_acquire acquire;
      return pending.keep_signal();
    };
  }
  void rethrow() { pending.rethrow(); }
};

std::optional<DType> dtype_of(const std::optional<std::string>& name) {
  if (!name)
    return std::nullopt;
  if (*name == "fp32")
    return DType::fp32;
  if (*name == "bf16")
    return DType::bf16;
  throw ConfigError("dtype = \"" + *name + "\": allowed: fp32, bf16");
}

std::optional<runtime::Clock> clock_of(const std::optional<std::string>& name) {
  if (!name)
    return std::nullopt;
  if (*name == "wall")
    return runtime::Clock::wall;
  if (*name == "cpu")
    return runtime::Clock::cpu;
  throw ConfigError("clock = \"" + *name + "\": allowed: wall, cpu");
}

// What the user said for `key`, or None.
py::object said_value(const py::dict& said, const char* key) {
  return said.contains(key) ? py::object(said[key]) : py::object(py::none());
}

// An integer argument converted to the field's C++ type (its range is the
// library's check; a Python int the type cannot hold names the field).
template <typename Int>
std::optional<Int> said_integer(const py::dict& said, const char* key) {
  const py::object value = said_value(said, key);
  if (value.is_none()) {
    return std::nullopt;
  }
  const py::int_ number(value);
  const long long wide = PyLong_AsLongLong(number.ptr());
  if (PyErr_Occurred() != nullptr || wide < std::numeric_limits<Int>::min() ||
      wide > std::numeric_limits<Int>::max()) {
    PyErr_Clear();
    throw ConfigError(std::string(key) + " = " + py::str(value).cast<std::string>() +
                      ": does not fit a " + std::to_string(sizeof(Int) * 8) + "-bit integer");
  }
  return static_cast<Int>(wide);
}

runtime::ProfileRequest profile_request(const py::dict& said) {
  // Only what the user said (None = the library's default).
  runtime::ProfileRequest r;
  const auto get = [&said](const char* key) { return said_value(said, key); };
  r.backend = get("backend").is_none() ? "cpu" : get("backend").cast<std::string>();
  r.out_path = get("out").is_none() ? "" : get("out").cast<std::string>();
  r.quick = !get("quick").is_none() && get("quick").cast<bool>();
  r.resume = !get("resume").is_none() && get("resume").cast<bool>();
  r.dtype = dtype_of(get("dtype").cast<std::optional<std::string>>());
  r.threads = said_integer<int>(said, "threads");
  r.clock = clock_of(get("clock").cast<std::optional<std::string>>());
  r.budget_s = get("budget_s").cast<std::optional<double>>();
  r.rotation_bytes = said_integer<int64_t>(said, "rotate_bytes");
  if (!get("kinds").is_none())
    r.kinds = get("kinds").cast<std::vector<std::string>>();
  r.max_dim = said_integer<int64_t>(said, "max_dim");
  r.measure_ceilings = get("measure_ceilings").is_none() || get("measure_ceilings").cast<bool>();
  r.rounds = said_integer<int>(said, "rounds");
  r.drift_tolerance = get("drift_tolerance").cast<std::optional<double>>();
  r.max_seconds = get("max_seconds").cast<std::optional<double>>();
  return r;
}

runtime::ValidationRequest validation_request(const py::dict& said) {
  runtime::ValidationRequest r;
  const auto get = [&said](const char* key) { return said_value(said, key); };
  r.backend = get("backend").is_none() ? "cpu" : get("backend").cast<std::string>();
  r.quick = !get("quick").is_none() && get("quick").cast<bool>();
  r.rounds = said_integer<int>(said, "rounds");
  r.repeats = said_integer<int>(said, "repeats");
  r.refuse_under_load =
      !get("refuse_under_load").is_none() && get("refuse_under_load").cast<bool>();
  r.warmup_steps = said_integer<int>(said, "warmup_steps");
  r.threads = said_integer<int>(said, "threads");
  r.clock = clock_of(get("clock").cast<std::optional<std::string>>());
  return r;
}

}  // namespace

void bind_runtime(py::module_& m) {
  m.attr("has_runtime") = true;
  m.def("available_backends", &runtime::available_backends);

  m.def(
      "profile_settings",
      [](const py::dict& said) {
        const runtime::ProfileRequest request = profile_request(said);
        const auto backend = backend_or_config_error(request.backend);
        const runtime::ProfileOptions options = runtime::resolve_profile_options(request, *backend);
        const runtime::ProfileDurationEstimate estimate = runtime::estimate_profile_duration(
            *backend, options,
            options.points.empty()
                ? runtime::profile_grid(options.grid, backend->device(), options.dtype)
                : options.points);
        return runtime::profile_settings_json(options, &estimate);
      },
      py::arg("request"),
      "The resolved settings of modar.profile(**request) as JSON (as `modar profile --dry-run`).");

  m.def(
      "profile_plan",
      [](const py::dict& said, const std::string& device) {
        // The PyTorch profile (modar/_torch_profile.py) times the same grid
        // with the same defaults on a device no modar Backend drives.
        if (device != "cpu" && device != "cuda") {
          throw ConfigError("device = \"" + device + "\": allowed: cpu, cuda");
        }
        const runtime::ProfileRequest request = profile_request(said);
        const runtime::DeviceKind kind =
            device == "cpu" ? runtime::DeviceKind::cpu : runtime::DeviceKind::cuda;
        runtime::ProfileOptions options = runtime::resolve_profile_options(request, kind);
        if (options.points.empty()) {
          options.points = runtime::profile_grid(options.grid, kind, options.dtype);
        }
        py::list points;
        for (const runtime::ProfilePoint& point : options.points) {
          std::vector<int64_t> dims(point.shape.dims.begin(),
                                    point.shape.dims.begin() + op_dims_count(point.shape.kind));
          points.append(py::make_tuple(to_string(point.shape.kind), to_string(point.pass),
                                       to_string(point.shape.dtype), dims));
        }
        py::dict plan;
        plan["grid"] = to_string(options.grid);
        plan["dtype"] = to_string(options.dtype);
        plan["threads"] = options.threads;
        plan["clock"] = to_string(options.timing.clock);
        plan["budget_s"] = options.timing.budget_s;
        plan["rotation_bytes"] = options.timing.rotation_bytes;
        plan["min_repeats"] = options.timing.min_repeats;
        plan["max_repeats"] = options.timing.max_repeats;
        plan["min_sample_s"] = options.timing.min_sample_s;
        plan["max_copies"] = options.timing.max_copies;
        plan["points"] = points;
        return plan;
      },
      py::arg("request"), py::arg("device"),
      "The resolved settings and grid points of a profile of `device` (cpu, cuda) for a backend "
      "outside modar's runtime (the PyTorch profile): the same defaults and checks as "
      "modar.profile.");

  m.def(
      "run_profile",
      [](const py::dict& said, py::object progress) {
        const runtime::ProfileRequest request = profile_request(said);
        ProgressStream stream(std::move(progress));
        SignalCheck signals;
        DeviceProfile profile;
        try {
          py::gil_scoped_release release;
          const auto backend = backend_or_config_error(request.backend);
          runtime::ProfileOptions options = runtime::resolve_profile_options(request, *backend);
          options.progress = stream.file();
          options.should_stop = signals.hook();
          profile = runtime::run_profile(*backend, options);
        } catch (const Interrupted&) {
          signals.rethrow();
          throw;
        }
        stream.rethrow_pending();
        return profile;
      },
      py::arg("request"), py::arg("progress") = py::none());

  m.def(
      "load_measured_profile",
      [](const std::string& path, const std::string& backend) {
        return runtime::load_measured_profile(path, backend);
      },
      py::arg("path"), py::arg("expected_backend") = "");

  m.def(
      "validation_settings",
      [](const DeviceProfile& profile, const py::dict& said) {
        const runtime::ValidationRequest request = validation_request(said);
        return runtime::validation_settings_json(
            runtime::resolve_validation_options(request, profile), request, profile);
      },
      py::arg("profile"), py::arg("request"),
      "The resolved settings of modar.validate(profile, **request) as JSON (as `modar validate "
      "--dry-run`).");

  m.def(
      "run_validation",
      [](const DeviceProfile& profile, const py::dict& said, py::object progress) {
        const runtime::ValidationRequest request = validation_request(said);
        ProgressStream stream(std::move(progress));
        SignalCheck signals;
        std::pair<std::string, std::string> documents;
        try {
          py::gil_scoped_release release;
          runtime::check_measured_profile(profile, profile.name, request.backend);
          runtime::ValidationOptions options =
              runtime::resolve_validation_options(request, profile);
          options.progress = stream.file();
          options.should_stop = signals.hook();
          const auto backend = backend_or_config_error(request.backend);
          const runtime::ValidationReport report =
              runtime::run_validation(*backend, profile, options);
          documents = {runtime::validation_json(report), runtime::validation_text(report)};
        } catch (const Interrupted&) {
          signals.rethrow();
          throw;
        }
        stream.rethrow_pending();
        return documents;
      },
      py::arg("profile"), py::arg("request"), py::arg("progress") = py::none(),
      "Measured vs predicted on held-out configurations: (validate --json text, table text).");
}

}  // namespace modar::python
