// bindings/python/bind_layout.cpp -- `modar layout` for Python: every
// parallel layout of one model and global batch, ranked (planner/
// layout_search.cpp rank_layouts).  Returns the CLI's --json text and table.
#include <pybind11/stl.h>

#include <string>
#include <utility>

#include "bindings.hpp"
#include "modar/base/errors.hpp"
#include "modar/layout_search.hpp"
#include "modar/profile.hpp"

namespace modar::python {

void bind_layout(py::module_& m) {
  m.def(
      "layout",
      [](const Config& config, int64_t gpus, int64_t gpus_per_node, int64_t global_batch,
         int64_t top) {
        validate(config);
        if (top < 1) {
          throw ConfigError("top = " + std::to_string(top) + ": must be >= 1");
        }
        const DeviceProfile profile = load_profile(config.device.profile);
        const TimingModel timing(profile);
        LayoutSearchOptions options;
        options.gpus = gpus;
        options.gpus_per_node = gpus_per_node;
        options.global_batch = global_batch;
        options.dimensions = layout_ranking_dimensions();
        const LayoutRanking ranking = rank_layouts(config, timing, options);
        return std::make_pair(to_json(ranking), to_table(ranking, static_cast<size_t>(top)));
      },
      py::arg("config"), py::arg("gpus"), py::arg("gpus_per_node") = 0,
      py::arg("global_batch") = 0, py::arg("top") = 20, py::call_guard<py::gil_scoped_release>(),
      "Every layout of the model on `gpus` devices at one global batch, ranked by step time; "
      "returns (CLI --json text, CLI table text).");
}

}  // namespace modar::python
