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
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "modar/errors.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/profiler.hpp"
#include "modar/runtime/validate.hpp"

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
    if (pending_error_) {
      pending_error_->restore();
      pending_error_.reset();
      throw py::error_already_set();
    }
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
      if (PyErr_CheckSignals() != 0) {
        throw py::error_already_set();
      }
      for (const std::string& line : lines) {
        self->callback_(line);
      }
    } catch (py::error_already_set& e) {
      self->pending_error_ = std::make_unique<py::error_already_set>(std::move(e));
    } catch (...) {  // never unwind through C stdio
    }
    return static_cast<ssize_t>(size);
  }

  py::object callback_;
  std::FILE* file_ = nullptr;
  std::string buffer_;
  std::unique_ptr<py::error_already_set> pending_error_;
};

std::unique_ptr<runtime::Backend> backend_or_config_error(const std::string& name) {
  try {
    return runtime::make_backend(name);
  } catch (const BackendError& e) {
    throw ConfigError("backend = \"" + name + "\": " + e.what());
  }
}

runtime::GridSize grid_of(bool quick) {
  return quick ? runtime::GridSize::quick : runtime::GridSize::full;
}

}  // namespace

void bind_runtime(py::module_& m) {
  m.attr("has_runtime") = true;
  m.def("available_backends", &runtime::available_backends);

  py::class_<runtime::ProfileOptions>(m, "ProfileOptions")
      .def(py::init<>())
      .def_readwrite("backend_name", &runtime::ProfileOptions::backend_name)
      .def_property(
          "quick",
          [](const runtime::ProfileOptions& o) { return o.grid == runtime::GridSize::quick; },
          [](runtime::ProfileOptions& o, bool quick) { o.grid = grid_of(quick); })
      .def_property(
          "dtype", [](const runtime::ProfileOptions& o) { return std::string(to_string(o.dtype)); },
          [](runtime::ProfileOptions& o, const std::string& name) {
            if (name == "fp32") {
              o.dtype = DType::fp32;
            } else if (name == "bf16") {
              o.dtype = DType::bf16;
            } else {
              throw ConfigError("dtype = \"" + name + "\": allowed: fp32, bf16");
            }
          })
      .def_readwrite("threads", &runtime::ProfileOptions::threads)
      .def_readwrite("out_path", &runtime::ProfileOptions::out_path)
      .def_readwrite("resume", &runtime::ProfileOptions::resume)
      .def_property(
          "budget_s", [](const runtime::ProfileOptions& o) { return o.timing.budget_s; },
          [](runtime::ProfileOptions& o, double v) { o.timing.budget_s = v; })
      .def_property(
          "rotation_bytes",
          [](const runtime::ProfileOptions& o) { return o.timing.rotation_bytes; },
          [](runtime::ProfileOptions& o, int64_t v) { o.timing.rotation_bytes = v; })
      .def_readwrite("measure_ceilings", &runtime::ProfileOptions::measure_ceilings);

  m.def(
      "profile_grid_kinds",
      [](const std::string& backend_name, bool quick, const std::string& dtype_name) {
        const auto backend = backend_or_config_error(backend_name);
        const DType dtype = dtype_name == "bf16" ? DType::bf16 : DType::fp32;
        std::vector<std::string> kinds;
        for (const runtime::ProfilePoint& p :
             runtime::profile_grid(grid_of(quick), backend->device(), dtype)) {
          kinds.emplace_back(to_string(p.shape.kind));
        }
        return kinds;
      },
      py::arg("backend"), py::arg("quick"), py::arg("dtype"),
      "The op kind of every point of the profiler's grid (one entry per point).");

  m.def(
      "run_profile",
      [](runtime::ProfileOptions options, const std::vector<std::string>& kinds, int64_t max_dim,
         py::object progress) {
        ProgressStream stream(std::move(progress));
        options.progress = stream.file();
        DeviceProfile profile;
        {
          py::gil_scoped_release release;
          const auto backend = backend_or_config_error(options.backend_name);
          if (!kinds.empty() || max_dim > 0) {
            // A reduced grid: only these op kinds, only points whose every
            // dim is <= max_dim.  A per-dim threshold keeps each kind's
            // grid a tensor product, which is what the timing model
            // interpolates over.
            const std::set<std::string> wanted(kinds.begin(), kinds.end());
            for (const runtime::ProfilePoint& p :
                 runtime::profile_grid(options.grid, backend->device(), options.dtype)) {
              if (!wanted.empty() && wanted.count(to_string(p.shape.kind)) == 0) {
                continue;
              }
              bool small = true;
              for (int d = 0; d < op_dims_count(p.shape.kind); ++d) {
                small = small && (max_dim <= 0 || p.shape.dims[d] <= max_dim);
              }
              if (small) {
                options.points.push_back(p);
              }
            }
            if (options.points.empty()) {
              throw ConfigError("kinds / max_dim: no point of the profiler's grid is left");
            }
          }
          profile = runtime::run_profile(*backend, options);
        }
        stream.rethrow_pending();
        return profile;
      },
      py::arg("options"), py::arg("kinds"), py::arg("max_dim") = 0,
      py::arg("progress") = py::none());

  m.def(
      "load_measured_profile",
      [](const std::string& path, const std::string& backend) {
        return runtime::load_measured_profile(path, backend);
      },
      py::arg("path"), py::arg("expected_backend") = "");

  m.def(
      "run_validation",
      [](const DeviceProfile& profile, const std::string& backend_name, bool quick, int rounds,
         int warmup_steps, int threads, py::object progress) {
        ProgressStream stream(std::move(progress));
        runtime::ValidationOptions options;
        options.quick = quick;
        options.rounds = rounds;
        options.warmup_steps = warmup_steps;
        options.progress = stream.file();
        std::pair<std::string, std::string> documents;
        {
          py::gil_scoped_release release;
          runtime::check_measured_profile(profile, profile.name, backend_name);
          if (threads > 0) {
            runtime::set_cpu_threads(threads);
          }
          const auto backend = backend_or_config_error(backend_name);
          const runtime::ValidationReport report =
              runtime::run_validation(*backend, profile, options);
          documents = {runtime::validation_json(report), runtime::validation_text(report)};
        }
        stream.rethrow_pending();
        return documents;
      },
      py::arg("profile"), py::arg("backend"), py::arg("quick"), py::arg("rounds"),
      py::arg("warmup_steps"), py::arg("threads"), py::arg("progress") = py::none(),
      "Measured vs predicted on held-out configurations: (validate --json text, table text).");
}

}  // namespace modar::python
