// bindings/python/bind_layout.cpp -- `modar layout` for Python: every
// parallel layout of one model and global batch, ranked (planner/
// layout_search.cpp rank_layouts).  Python fills a LayoutRequest with what
// the user said; resolve_layout applies the defaults and checks it.  Returns
// the CLI's --json text and table.
#include <pybind11/stl.h>

#include <string>
#include <utility>

#include "bindings.hpp"
#include "modar/base/errors.hpp"
#include "modar/layout_search.hpp"
#include "modar/profile.hpp"
#include "progress.hpp"

namespace modar::python {

void bind_layout(py::module_& m) {
  py::class_<LayoutRequest>(m, "LayoutRequest")
      .def(py::init<>())
      .def_readwrite("gpus", &LayoutRequest::gpus)
      .def_readwrite("gpus_per_node", &LayoutRequest::gpus_per_node)
      .def_readwrite("global_batch", &LayoutRequest::global_batch)
      .def_readwrite("top", &LayoutRequest::top);
  m.def(
      "layout",
      [](const Config& config, const LayoutRequest& request, py::object progress) {
        PythonRunControl control(std::move(progress));
        return control.run([&] {
          const LayoutSettings settings = resolve_layout(request);
          validate(config);
          const DeviceProfile profile = load_profile(config.device.profile);
          const TimingModel timing(profile);
          const LayoutRanking ranking =
              rank_layouts(config, timing, settings.options, control.control());
          return std::make_pair(to_json(ranking), to_table(ranking, settings.top));
        });
      },
      py::arg("config"), py::arg("request"), py::arg("progress") = py::none(),
      "Every layout of the model on request.gpus devices at one global batch, ranked by step "
      "time (GIL released; progress: None/False, True for a line on stderr, or a callable "
      "taking (done, total)); returns (CLI --json text, CLI table text).");
}

}  // namespace modar::python
