// bindings/python/bind_planner.cpp -- the planner (include/modar/planner.hpp):
// optimal, sweep, fit, loss fits and priors; calibrate (modar/calibrate.hpp).
//
// Requests are the C++ structs themselves (fields bound read/write); results
// come back as the JSON text the CLI prints (to_json / to_json_line), plus the
// CLI's human-readable table, so Python never recomputes a number.
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "modar/base/errors.hpp"
#include "modar/calibrate.hpp"
#include "modar/planner.hpp"
#include "progress.hpp"

namespace modar::python {

namespace {

void bind_requests(py::module_& m) {
  py::class_<ShapeSearchOptions>(m, "ShapeSearchOptions")
      .def(py::init<>())
      .def_readwrite("aspect_min", &ShapeSearchOptions::aspect_min)
      .def_readwrite("aspect_max", &ShapeSearchOptions::aspect_max)
      .def_readwrite("d_model_multiple", &ShapeSearchOptions::d_model_multiple)
      .def_readwrite("min_layers", &ShapeSearchOptions::min_layers)
      .def_readwrite("max_layers", &ShapeSearchOptions::max_layers)
      .def_readwrite("max_d_model", &ShapeSearchOptions::max_d_model)
      .def_readwrite("gqa_group", &ShapeSearchOptions::gqa_group)
      .def_readwrite("depth_tolerance", &ShapeSearchOptions::depth_tolerance);

  py::class_<OptimalRequest>(m, "OptimalRequest")
      .def(py::init<>())
      .def_readwrite("train_flops", &OptimalRequest::train_flops)
      .def_readwrite("gpu_hours", &OptimalRequest::gpu_hours)
      .def_readwrite("profile", &OptimalRequest::profile)
      .def_readwrite("gpus", &OptimalRequest::gpus)
      .def_readwrite("gpus_per_node", &OptimalRequest::gpus_per_node)
      .def_readwrite("archs", &OptimalRequest::archs)
      .def_readwrite("fit", &OptimalRequest::fit)
      .def_readwrite("eps_overrides", &OptimalRequest::eps_overrides)
      .def_readwrite("base", &OptimalRequest::base)
      .def_readwrite("shapes", &OptimalRequest::shapes)
      .def_readwrite("capacity", &OptimalRequest::capacity)
      .def_readwrite("every", &OptimalRequest::every)
      .def_readwrite("dar_block_layers", &OptimalRequest::dar_block_layers)
      .def_readwrite("dar_streams", &OptimalRequest::dar_streams)
      .def_readwrite("grid_step", &OptimalRequest::grid_step)
      .def_readwrite("grid_half_width", &OptimalRequest::grid_half_width);

  py::class_<SweepRequest>(m, "SweepRequest")
      .def(py::init<>())
      .def_readwrite("budgets_flops", &SweepRequest::budgets_flops)
      .def_readwrite("archs", &SweepRequest::archs)
      .def_readwrite("capacities", &SweepRequest::capacities)
      .def_readwrite("everys", &SweepRequest::everys)
      .def_readwrite("block_layers", &SweepRequest::block_layers)
      .def_readwrite("streams", &SweepRequest::streams)
      .def_readwrite("fit", &SweepRequest::fit)
      .def_readwrite("eps_overrides", &SweepRequest::eps_overrides)
      .def_readwrite("profile", &SweepRequest::profile)
      .def_readwrite("gpus", &SweepRequest::gpus)
      .def_readwrite("with_time", &SweepRequest::with_time)
      .def_readwrite("base", &SweepRequest::base)
      .def_readwrite("shapes", &SweepRequest::shapes)
      .def_readwrite("grid_step", &SweepRequest::grid_step)
      .def_readwrite("grid_half_width", &SweepRequest::grid_half_width);

  py::class_<FitOptions>(m, "FitOptions")
      .def(py::init<>())
      .def_readwrite("huber_delta", &FitOptions::huber_delta)
      .def_readwrite("bootstrap_samples", &FitOptions::bootstrap_samples)
      .def_readwrite("seed", &FitOptions::seed);
}

// (json, readable text, fit TOML) of one fit.  The provenance line is the
// CLI's ("modar fit RUNS.csv: <method>"), so the JSON documents agree.
std::tuple<std::string, std::string, std::string> fit_documents(const std::vector<RunRecord>& runs,
                                                                const FitOptions& options,
                                                                const std::string& runs_name) {
  FitResult result = fit_runs(runs, options);
  result.fit.source = "modar fit " + runs_name + ": " + result.fit.source;
  return {to_json(result), to_text(result), to_toml(result.fit)};
}

// calibrate's request from what the Python caller said (None = the default).
CalibrateRequest calibrate_request(const py::dict& said) {
  CalibrateRequest r;
  const auto get = [&said](const char* key) {
    return said.contains(key) ? py::object(said[key]) : py::object(py::none());
  };
  r.parameters = get("parameters").cast<std::optional<std::vector<std::string>>>();
  r.leave_one_out = get("leave_one_out").cast<std::optional<bool>>();
  r.max_iterations = get("max_iterations").cast<std::optional<int>>();
  r.name = get("name").cast<std::optional<std::string>>();
  return r;
}

// (JSON, text, calibrated profile) of a fit of the runs (a CSV file, or CSV
// text read relative to base_dir) on the base profile.  Ctrl-C raises
// KeyboardInterrupt; `progress` gets the stage lines.
py::tuple calibrate_documents(const std::string& csv_path, const std::string& csv_text,
                              const std::string& source_name, const std::string& base_dir,
                              const std::string& profile_ref, const py::dict& said,
                              py::object progress) {
  const CalibrateRequest request = calibrate_request(said);
  ProgressTicker ticker(py::none(), 0.1);
  CalibrationResult result;
  {
    py::gil_scoped_release release;
    const DeviceProfile base = load_profile(profile_ref);
    const std::vector<CalibrationRun> runs =
        csv_path.empty() ? parse_calibration_runs(csv_text, source_name, base_dir)
                         : load_calibration_runs(csv_path);
    CalibrateOptions options = resolve_calibrate_options(request, base);
    int64_t polls = 0;
    options.should_stop = [&ticker, &polls] {
      ticker.tick(++polls, -1);  // KeyboardInterrupt unwinds from here
      return false;
    };
    if (!progress.is_none()) {
      options.progress = [&progress](const std::string& line) {
        py::gil_scoped_acquire acquire;
        progress(line);
      };
    }
    result = calibrate(runs, base, options);
    result.profile.provenance["calibration_command"] =
        "modar.calibrate(" + (csv_path.empty() ? source_name : csv_path) + ", profile=" +
        profile_ref + ")";
  }
  return py::make_tuple(to_json(result), to_text(result), result.profile);
}

}  // namespace

void bind_planner(py::module_& m) {
  bind_requests(m);

  m.def(
      "optimal",
      [](const OptimalRequest& request) {
        const OptimalResult result = optimal(request);
        return std::make_pair(to_json(result), to_table(result));
      },
      py::arg("request"), py::call_guard<py::gil_scoped_release>(),
      "Run the planner; returns (CLI --json text, CLI table text).");

  m.def(
      "sweep",
      [](SweepRequest request, py::object progress) {
        std::vector<std::string> lines;
        ProgressTicker ticker(std::move(progress), 0.1);
        // Ctrl-C is checked between chunks of the sweep's own work (shape
        // tables, curves, candidates), not only between emitted rows.
        request.poll = [&]() { ticker.tick(static_cast<int64_t>(lines.size()), -1); };
        {
          py::gil_scoped_release release;
          sweep(request, [&](const SweepRow& row) {
            lines.push_back(to_json_line(row));
            ticker.tick(static_cast<int64_t>(lines.size()), -1);
          });
          ticker.tick(static_cast<int64_t>(lines.size()), -1, true);
        }
        return lines;
      },
      py::arg("request"), py::arg("progress") = py::none(),
      "Every evaluated candidate, one JSON object (text) per row, as `modar sweep --json`.");
  m.def("sweep_csv_header", &sweep_csv_header);

  m.def(
      "fit_csv_file",
      [](const std::string& path, const FitOptions& options) {
        return fit_documents(load_runs_csv(path), options, path);
      },
      py::arg("path"), py::arg("options") = FitOptions{}, py::call_guard<py::gil_scoped_release>());
  m.def(
      "fit_csv_text",
      [](const std::string& text, const std::string& source_name, const std::string& base_dir,
         const FitOptions& options) {
        return fit_documents(parse_runs_csv(text, source_name, base_dir), options, source_name);
      },
      py::arg("text"), py::arg("source_name"), py::arg("base_dir") = ".",
      py::arg("options") = FitOptions{}, py::call_guard<py::gil_scoped_release>());

  m.def("calibrate", &calibrate_documents, py::arg("csv_path"), py::arg("csv_text"),
        py::arg("source_name"), py::arg("base_dir"), py::arg("profile"), py::arg("request"),
        py::arg("progress") = py::none(),
        "Fit the profile's parameters to the runs (a CSV path, or CSV text when the path is "
        "empty); returns (JSON, text, calibrated profile).");
  m.def("calibration_parameters", [] {
    py::list rows;
    for (const CalibrationParameter& p : calibration_parameters()) {
      rows.append(py::dict(py::arg("name") = p.name, py::arg("unit") = p.unit,
                           py::arg("min") = p.min, py::arg("max") = p.max,
                           py::arg("meaning") = p.meaning));
    }
    return rows;
  });
  m.def("default_calibration_parameters", &default_calibration_parameters);

  m.def("builtin_fit_names", &builtin_fit_names);
  m.def("arch_names", &arch_names);
  m.def("parse_eps_overrides", &parse_eps_overrides, py::arg("text"));
  m.def(
      "load_fit_toml",
      [](const std::string& name_or_path) { return to_toml(load_fit(name_or_path)); },
      py::arg("name_or_path"), "A built-in fit name or a fit TOML path -> its TOML text.");
  m.def(
      "closed_form_optimum",
      [](const std::string& fit_name, double train_flops, double eps) {
        const LossFit fit = load_fit(fit_name);
        const ClosedFormOptimum o = closed_form_optimum(fit.params, train_flops, eps);
        py::dict d;
        d["G"] = o.G;
        d["n_opt"] = o.n_opt;
        d["tokens_opt"] = o.tokens_opt;
        d["loss"] = o.loss;
        return d;
      },
      py::arg("fit"), py::arg("train_flops"), py::arg("eps") = 1.0,
      "Hoffmann eq. 4 closed form under C = 6 N D (docs/planner.md).");
}

}  // namespace modar::python
