// bindings/python/bind_planner.cpp -- the planner (include/modar/planner.hpp):
// optimal, sweep, fit, loss fits and priors; calibrate (modar/calibrate.hpp).
//
// Requests are the C++ structs themselves (fields bound read/write, unset =
// None): Python fills in what the user gave, the library resolves and checks
// it (resolve_optimal, resolve_sweep, resolve_fit_options), as for the CLI.
// Results come back as the JSON text the CLI prints (to_json / to_json_line),
// plus the CLI's human-readable table, so Python never recomputes a number.
// Every call releases the GIL and reports progress / honours Ctrl-C through a
// RunControl (progress.hpp).
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

  py::class_<PlannerRunRequest>(m, "PlannerRunRequest")
      .def(py::init<>())
      .def_readwrite("fit", &PlannerRunRequest::fit)
      .def_readwrite("eps", &PlannerRunRequest::eps)
      .def_readwrite("profile", &PlannerRunRequest::profile)
      .def_readwrite("gpus", &PlannerRunRequest::gpus)
      .def_readwrite("gpus_per_node", &PlannerRunRequest::gpus_per_node)
      .def_readwrite("base", &PlannerRunRequest::base)
      .def_readwrite("base_keys", &PlannerRunRequest::base_keys)
      .def_readwrite("shapes", &PlannerRunRequest::shapes);

  py::class_<OptimalRequest, PlannerRunRequest>(m, "OptimalRequest")
      .def(py::init<>())
      .def_readwrite("flops", &OptimalRequest::flops)
      .def_readwrite("gpu_hours", &OptimalRequest::gpu_hours)
      .def_readwrite("days", &OptimalRequest::days)
      .def_readwrite("arch", &OptimalRequest::arch)
      .def_readwrite("capacity", &OptimalRequest::capacity)
      .def_readwrite("every", &OptimalRequest::every)
      .def_readwrite("block_layers", &OptimalRequest::block_layers)
      .def_readwrite("streams", &OptimalRequest::streams);

  py::class_<SweepRequest, PlannerRunRequest>(m, "SweepRequest")
      .def(py::init<>())
      .def_readwrite("flops", &SweepRequest::flops)
      .def_readwrite("arch", &SweepRequest::arch)
      .def_readwrite("capacity", &SweepRequest::capacity)
      .def_readwrite("every", &SweepRequest::every)
      .def_readwrite("block_layers", &SweepRequest::block_layers)
      .def_readwrite("streams", &SweepRequest::streams)
      .def_readwrite("with_time", &SweepRequest::with_time)
      .def_readwrite("grid_step", &SweepRequest::grid_step)
      .def_readwrite("grid_half_width", &SweepRequest::grid_half_width);

  py::class_<FitRequest>(m, "FitRequest")
      .def(py::init<>())
      .def_readwrite("huber_delta", &FitRequest::huber_delta)
      .def_readwrite("bootstrap_samples", &FitRequest::bootstrap_samples)
      .def_readwrite("seed", &FitRequest::seed);
}

// (json, readable text, fit TOML) of one fit.  The provenance line is the
// CLI's ("modar fit RUNS.csv: <method>"), so the JSON documents agree.
std::tuple<std::string, std::string, std::string> fit_documents(const std::vector<RunRecord>& runs,
                                                                const FitOptions& options,
                                                                const std::string& runs_name,
                                                                const RunControl& control) {
  FitResult result = fit_runs(runs, options, control);
  result.fit.source = "modar fit " + runs_name + ": " + result.fit.source;
  return {to_json(result), to_text(result), to_toml(result.fit)};
}

void bind_fit(py::module_& m) {
  m.def(
      "fit_csv_file",
      [](const std::string& path, const FitRequest& request, py::object progress) {
        const FitOptions options = resolve_fit_options(request);
        PythonRunControl control(std::move(progress));
        return control.run([&] {
          return fit_documents(load_runs_csv(path), options, path, control.control());
        });
      },
      py::arg("path"), py::arg("request") = FitRequest{}, py::arg("progress") = py::none());
  m.def(
      "fit_csv_text",
      [](const std::string& text, const std::string& source_name, const std::string& base_dir,
         const FitRequest& request, py::object progress) {
        const FitOptions options = resolve_fit_options(request);
        PythonRunControl control(std::move(progress));
        return control.run([&] {
          return fit_documents(parse_runs_csv(text, source_name, base_dir), options, source_name,
                               control.control());
        });
      },
      py::arg("text"), py::arg("source_name"), py::arg("base_dir") = ".",
      py::arg("request") = FitRequest{}, py::arg("progress") = py::none());
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
  PythonRunControl control{py::none()};
  CalibrationResult result = control.run([&] {
    const DeviceProfile base = load_profile(profile_ref);
    const std::vector<CalibrationRun> runs =
        csv_path.empty() ? parse_calibration_runs(csv_text, source_name, base_dir)
                         : load_calibration_runs(csv_path);
    CalibrateOptions options = resolve_calibrate_options(request, base);
    options.should_stop = control.control().should_stop;  // Ctrl-C: KeyboardInterrupt
    if (!progress.is_none()) {
      options.progress = [&progress](const std::string& line) {
        py::gil_scoped_acquire acquire;
        progress(line);
      };
    }
    CalibrationResult fitted = calibrate(runs, base, options);
    fitted.profile.provenance["calibration_command"] =
        "modar.calibrate(" + (csv_path.empty() ? source_name : csv_path) + ", profile=" +
        profile_ref + ")";
    return fitted;
  });
  return py::make_tuple(to_json(result), to_text(result), result.profile);
}

}  // namespace

void bind_planner(py::module_& m) {
  bind_requests(m);

  m.def(
      "optimal",
      [](const OptimalRequest& request, py::object progress) {
        PythonRunControl control(std::move(progress));
        return control.run([&] {
          const OptimalResult result = optimal(request, control.control());
          return std::make_pair(to_json(result), to_table(result));
        });
      },
      py::arg("request"), py::arg("progress") = py::none(),
      "Run the planner; returns (CLI --json text, CLI table text).");

  m.def(
      "sweep",
      [](const SweepRequest& request, py::object progress) {
        PythonRunControl control(std::move(progress));
        return control.run([&] {
          std::vector<std::string> lines;
          const SweepSummary summary = sweep(
              request, [&](const SweepRow& row) { lines.push_back(to_json_line(row)); },
              control.control());
          return std::make_pair(lines, summary.notes);
        });
      },
      py::arg("request"), py::arg("progress") = py::none(),
      "The isoFLOP curves: (one JSON object (text) per row, as `modar sweep --jsonl`; notes on "
      "curves without rows).");
  m.def("sweep_csv_header", &sweep_csv_header);
  bind_fit(m);

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
      "parse_days", [](const std::string& text) { return parse_days(text); }, py::arg("text"),
      "'14', '14d', '2w', '336h' -> days.");
  m.def(
      "parse_gpu_hours", [](const std::string& text) { return parse_gpu_hours(text); },
      py::arg("text"), "'2e5', '200k' -> GPU-hours.");
  m.def(
      "load_fit_toml",
      [](const std::string& name_or_path) { return to_toml(load_fit(name_or_path)); },
      py::arg("name_or_path"), "A built-in fit name or a fit TOML path -> its TOML text.");
  m.def(
      "closed_form_optimum",
      [](std::optional<double> flops, std::optional<std::string> fit, std::optional<double> eps) {
        const ClosedFormOptimum o = closed_form_optimum(ClosedFormRequest{flops, fit, eps});
        py::dict d;
        d["G"] = o.G;
        d["n_opt"] = o.n_opt;
        d["tokens_opt"] = o.tokens_opt;
        d["loss"] = o.loss;
        return d;
      },
      py::arg("flops"), py::arg("fit") = py::none(), py::arg("eps") = py::none(),
      "Hoffmann eq. 4 closed form under C = 6 N D (docs/planner.md).");
}

}  // namespace modar::python
