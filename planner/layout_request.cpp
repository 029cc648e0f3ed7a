// The request of `modar layout` / modar.layout: what the user said, resolved
// by the library (defaults applied, every field checked, errors naming the
// request's fields), as the planner's requests are (planner/request.cpp).
#include <string>

#include "modar/base/errors.hpp"
#include "modar/layout_search.hpp"

namespace modar {

namespace {

// `field` in [low, high] (the message names the field, the value and the range).
int64_t bounded(const char* field, int64_t value, int64_t low, int64_t high,
                const char* high_text) {
  if (value < low || value > high) {
    throw ConfigError(std::string(field) + " = " + std::to_string(value) + ": must be in [" +
                      std::to_string(low) + ", " + high_text + "]");
  }
  return value;
}

}  // namespace

LayoutSettings resolve_layout(const LayoutRequest& request) {
  LayoutSettings settings;
  if (!request.gpus) {
    throw ConfigError("gpus: missing; allowed: the number of devices to lay the model out on");
  }
  // The bounds of device.count and of any int64 product of two of them.
  settings.options.gpus = bounded("gpus", *request.gpus, 1, kMaxLayoutGpus, "16777216");
  if (request.gpus_per_node) {
    settings.options.gpus_per_node =
        bounded("gpus_per_node", *request.gpus_per_node, 1, kMaxGpusPerNode, "1024");
  }
  if (request.global_batch) {
    settings.options.global_batch =
        bounded("global_batch", *request.global_batch, 1, kMaxGlobalBatch, "2^40");
  }
  settings.top = static_cast<size_t>(
      bounded("top", request.top.value_or(kDefaultLayoutTop), 1, kMaxLayoutTop, "100000"));
  settings.options.dimensions = layout_ranking_dimensions();
  return settings;
}

}  // namespace modar
