// `modar layout`'s outputs (include/modar/layout_search.hpp): the JSON
// document of a layout ranking (every layout) and its text table (the fastest
// that fit, then the nearest misses with what binds them).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "modar/estimate_json.hpp"
#include "modar/base/json.hpp"
#include "modar/layout_search.hpp"

namespace modar {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string fixed(double value, int digits) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", digits, value);
  return buffer;
}

// Columns padded to their widest cell: the first `left_columns` left-aligned
// (rank, layout text), the rest right-aligned, the last left-aligned on request.
class Table {
 public:
  Table(std::vector<std::string> header, size_t left_columns)
      : rows_{std::move(header)}, left_(left_columns) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string render() const {
    std::vector<size_t> width(rows_.front().size(), 0);
    for (const auto& row : rows_) {
      for (size_t i = 0; i < row.size(); ++i) {
        width[i] = std::max(width[i], row[i].size());
      }
    }
    std::string out;
    for (const auto& row : rows_) {
      for (size_t i = 0; i < row.size(); ++i) {
        const std::string pad(width[i] - row[i].size(), ' ');
        const bool left = i < left_ || (i + 1 == row.size() && last_left_);
        out += i == 0 ? "" : "  ";
        out += left ? row[i] + (i + 1 == row.size() ? "" : pad) : pad + row[i];
      }
      out += "\n";
    }
    return out;
  }
  Table& last_column_left() {
    last_left_ = true;
    return *this;
  }

 private:
  std::vector<std::vector<std::string>> rows_;
  size_t left_;
  bool last_left_ = false;
};

void write_row(JsonWriter& json, const RankedLayout& row) {
  json.begin_object();
  json.field("layout", row.summary);
  json.key("parallel").begin_object();
  write_parallel_layout_json(json, parallel_layout_json(row.config));
  json.field("schedule", to_string(row.config.parallel.schedule));
  json.field("recompute", to_string(row.config.train.recompute));
  json.end_object();
  json.field("fits", row.fits);
  json.field("step_s", row.step_s);
  json.field("tokens_per_s", row.tokens_per_s);
  json.field("mfu", row.mfu);
  json.field("compute_s", row.compute_s);
  json.field("exposed_comm_s", row.exposed_comm_s);
  json.field("bubble_s", row.bubble_s);
  json.key("memory").begin_object();
  json.field("peak_bytes", row.memory.peak);
  json.field("capacity_bytes", row.memory.capacity);
  write_memory_parts_json(json, row.memory, "_bytes");
  json.end_object();
  if (!row.fits) {
    json.field("binding", row.binding);
  }
  json.end_object();
}

}  // namespace

std::string to_json(const LayoutRanking& ranking) {
  JsonWriter json;
  json.begin_object();
  json.field("gpus", ranking.gpus);
  json.field("gpus_per_node", ranking.gpus_per_node);
  json.field("global_batch", ranking.global_batch);
  json.field("global_batch_source", ranking.global_batch_source);
  json.field("tokens_per_step", ranking.tokens_per_step);
  json.field("profile", ranking.profile_name);
  json.field("device_memory_bytes", ranking.device_memory_bytes);
  json.field("considered", ranking.considered);
  json.key("fitting").begin_array();
  for (const RankedLayout& row : ranking.fitting) {
    write_row(json, row);
  }
  json.end_array();
  json.key("not_fitting").begin_array();
  for (const RankedLayout& row : ranking.not_fitting) {
    write_row(json, row);
  }
  json.end_array();
  json.field("skipped", ranking.skipped);
  json.end_object();
  return json.str();
}

std::string to_table(const LayoutRanking& ranking, size_t top) {
  std::string out;
  out += std::to_string(ranking.gpus) + " GPUs (" + std::to_string(ranking.gpus_per_node) +
         " per node), profile " + ranking.profile_name + ", " +
         fixed(ranking.device_memory_bytes / kGiB, 1) + " GiB per device; global batch " +
         std::to_string(ranking.global_batch) + " sequences (" +
         fixed(ranking.tokens_per_step / 1e6, 2) + "M tokens; " + ranking.global_batch_source +
         "), the same for every layout\n";
  out += std::to_string(ranking.fitting.size()) + " of " +
         std::to_string(ranking.fitting.size() + ranking.not_fitting.size()) +
         " layouts fit (" + std::to_string(ranking.considered) + " considered)\n\n";
  Table fits({"rank", "layout", "step s", "tokens/s", "MFU", "GiB/GPU", "compute s",
              "exposed comm s", "bubble s"},
             2);
  for (size_t i = 0; i < ranking.fitting.size() && i < top; ++i) {
    const RankedLayout& r = ranking.fitting[i];
    fits.add({std::to_string(i + 1), r.summary, fixed(r.step_s, 3),
              fixed(r.tokens_per_s, 0), fixed(100.0 * r.mfu, 1) + "%",
              fixed(r.memory.peak / kGiB, 1), fixed(r.compute_s, 3),
              fixed(r.exposed_comm_s, 3), fixed(r.bubble_s, 3)});
  }
  out += ranking.fitting.empty() ? "NO layout fits the device memory\n" : fits.render();
  if (!ranking.not_fitting.empty()) {
    out += "\nnearest that do not fit (least memory first):\n";
    Table misses({"layout", "step s", "GiB/GPU", "binding constraint"}, 1);
    misses.last_column_left();
    for (size_t i = 0; i < ranking.not_fitting.size() && i < top; ++i) {
      const RankedLayout& r = ranking.not_fitting[i];
      misses.add({r.summary, fixed(r.step_s, 3), fixed(r.memory.peak / kGiB, 1), r.binding});
    }
    out += misses.render();
  }
  if (!ranking.skipped.empty()) {
    out += "\nnot searched (" + std::to_string(ranking.skipped.size()) + "):";
    size_t shown = 0;
    for (const std::string& why : ranking.skipped) {
      if (shown++ == 6) {
        out += "\n  ... (--json lists every one)";
        break;
      }
      out += "\n  " + why;
    }
    out += "\n";
  }
  return out;
}

}  // namespace modar
