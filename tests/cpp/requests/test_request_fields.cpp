// Every numeric field of every request, at the library boundary: values
// that are in type but meaningless (a prior of 1e-300, a dimension of 0, a
// budget that overflows, NaN, a negative count) are refused by the library's
// resolve function with a ConfigError naming the field and the value, before
// any work.  One table; one row per (request, field, value).  The CLI and
// Python pass these fields through untouched, so this is their check too.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "modar/base/errors.hpp"
#include "modar/base/text.hpp"
#include "modar/calibrate.hpp"
#include "modar/layout_search.hpp"
#include "modar/planner.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/comm_profile.hpp"
#include "modar/runtime/profiler.hpp"
#include "modar/runtime/validate.hpp"

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

struct Row {
  std::string request;  // which request
  std::string field;    // the field the message must name
  std::string value;    // the value the message must show
  std::function<void()> resolve;
};

// The row adder of one request: each row's request gets the fields it needs
// to resolve at all (`base`), then the one field of the row (`set`), and is
// resolved (`resolve`).
template <class Request, class Base, class Resolve>
auto row_adder(std::vector<Row>& rows, const char* request, Base base, Resolve resolve) {
  return [&rows, request, base, resolve](const std::string& field, const std::string& value,
                                         const std::function<void(Request&)>& set) {
    rows.push_back({request, field, value, [base, resolve, set] {
                      Request r;
                      base(r);
                      set(r);
                      resolve(r);
                    }});
  };
}

std::string text(double v) {
  return modar::format_number(v);
}

void optimal_rows(std::vector<Row>& rows) {
  const auto add = row_adder<modar::OptimalRequest>(
      rows, "optimal", [](auto& r) { r.flops = 1e20; },
      [](const auto& r) { modar::resolve_optimal(r); });
  for (const double v : {0.0, -1e20, 0.5, 1e36, kNaN, kInf}) {
    add("flops", text(v), [v](auto& r) { r.flops = v; });
  }
  for (const double v : {0.0, -5.0, 1e16, kNaN, kInf}) {
    add("gpu_hours", text(v), [v](auto& r) { r.gpu_hours = v; });
  }
  for (const double v : {0.0, -1.0, 1e6, kNaN}) {
    add("days", text(v), [v](auto& r) { r.days = v; });
  }
  for (const int64_t v : {int64_t{0}, int64_t{-4}}) {
    add("gpus", std::to_string(v), [v](auto& r) { r.gpus = v; });
  }
  add("gpus", "33554432", [](auto& r) { r.gpus = int64_t{1} << 25; });  // device.count's bound
  for (const int64_t v : {int64_t{0}, int64_t{2000}}) {
    add("gpus_per_node", std::to_string(v), [v](auto& r) {
      r.gpus = 16;
      r.gpus_per_node = v;
    });
  }
  for (const double v : {0.0, -0.1, 1.5, kNaN}) {
    add("capacity", text(v), [v](auto& r) { r.capacity = v; });
  }
  for (const int64_t v : {int64_t{0}, int64_t{-2}, int64_t{1000}}) {
    add("every", std::to_string(v), [v](auto& r) { r.every = v; });
  }
  for (const int64_t v : {int64_t{0}, int64_t{1000}}) {
    add("block_layers", std::to_string(v), [v](auto& r) { r.block_layers = v; });
  }
  for (const int64_t v : {int64_t{1}, int64_t{0}, int64_t{-3}}) {
    add("streams", std::to_string(v), [v](auto& r) { r.streams = v; });
  }
  for (const double v : {1e-300, 0.0, -1.0, 0.2, 1.6, kNaN, kInf}) {
    add("eps[mod]", text(v), [v](auto& r) { r.eps = {{"mod", v}}; });
  }
  for (const double v : {0.0, -32.0, kNaN}) {
    add("aspect_min", text(v), [v](auto& r) { r.shapes.aspect_min = v; });
  }
  add("aspect_max", "16", [](auto& r) { r.shapes.aspect_max = 16; });  // < aspect_min
  add("aspect_max", "nan", [](auto& r) { r.shapes.aspect_max = kNaN; });
  for (const int64_t v : {int64_t{0}, int64_t{-1}}) {
    add("gqa_group", std::to_string(v), [v](auto& r) { r.shapes.gqa_group = v; });
  }
  add("train.micro_batch", "0", [](auto& r) { r.base.train.micro_batch = 0; });
  add("model.seq_len", "0", [](auto& r) { r.base.model.seq_len = 0; });
  add("model.vocab_size", "-1", [](auto& r) { r.base.model.vocab_size = -1; });
}

void sweep_rows(std::vector<Row>& rows) {
  const auto add = row_adder<modar::SweepRequest>(
      rows, "sweep",
      [](auto& r) {
        r.flops = {1e20};
        r.arch = {"baseline", "mod", "dar"};
      },
      [](const auto& r) { modar::resolve_sweep(r); });
  for (const double v : {0.0, -1.0, 1e40, kNaN}) {
    add("flops", text(v), [v](auto& r) { r.flops = {1e19, v}; });
  }
  for (const double v : {0.0, 2.0}) {
    add("capacity", text(v), [v](auto& r) { r.capacity = {0.125, v}; });
  }
  add("every", "0", [](auto& r) { r.every = {2, 0}; });
  add("block_layers", "0", [](auto& r) { r.block_layers = {0}; });
  add("streams", "1", [](auto& r) { r.streams = {1}; });
  for (const double v : {1.0, 0.5, 1.0001, 11.0, kNaN}) {
    add("grid_step", text(v), [v](auto& r) { r.grid_step = v; });
  }
  for (const double v : {1.0, 0.0, 5000.0, kInf}) {
    add("grid_half_width", text(v), [v](auto& r) { r.grid_half_width = v; });
  }
  add("gpus", "0", [](auto& r) { r.gpus = 0; });
  add("eps[dar]", "1e-300", [](auto& r) { r.eps = {{"dar", 1e-300}}; });
}

void fit_and_closed_form_rows(std::vector<Row>& rows) {
  const auto fit = [&](const std::string& field, const std::string& value,
                       const std::function<void(modar::FitRequest&)>& set) {
    rows.push_back({"fit", field, value, [set] {
                      modar::FitRequest r;
                      set(r);
                      modar::resolve_fit_options(r);
                    }});
  };
  for (const double v : {0.0, -1e-3, kNaN, kInf}) {
    fit("huber_delta", text(v), [v](auto& r) { r.huber_delta = v; });
  }
  for (const int64_t v : {int64_t{-1}, int64_t{100001}}) {
    fit("bootstrap_samples", std::to_string(v), [v](auto& r) { r.bootstrap_samples = v; });
  }
  fit("seed", "-1", [](auto& r) { r.seed = -1; });
  const auto closed = [&](const std::string& field, const std::string& value, double flops,
                          double eps) {
    rows.push_back({"closed_form", field, value, [flops, eps] {
                      modar::closed_form_optimum(modar::ClosedFormRequest{flops, "epoch", eps});
                    }});
  };
  for (const double v : {0.0, 0.5, 1e36, kNaN, -1e20}) {
    closed("flops", text(v), v, 1.0);
  }
  for (const double v : {1e-300, 0.0, 1.6, kNaN}) {
    closed("eps", text(v), 1e20, v);
  }
}

void profile_rows(std::vector<Row>& rows) {
  const auto add = row_adder<modar::runtime::ProfileRequest>(
      rows, "profile",
      [](auto& r) {
        r.out_path = "unused.toml";
        r.quick = true;
      },
      [](const auto& r) {
        const auto backend = modar::runtime::make_backend("cpu");
        modar::runtime::resolve_profile_options(r, *backend);
      });
  for (const int v : {-1, 1 << 30}) {
    add("threads", std::to_string(v), [v](auto& r) { r.threads = v; });
  }
  for (const double v : {0.0, -1.0, 1e6, kNaN, kInf}) {
    add("budget_s", text(v), [v](auto& r) { r.budget_s = v; });
  }
  add("rotation_bytes", "0", [](auto& r) { r.rotation_bytes = 0; });
  add("rotation_bytes", "-1", [](auto& r) { r.rotation_bytes = -1; });
  add("rotation_bytes", "4398046511104", [](auto& r) { r.rotation_bytes = int64_t{1} << 42; });
  add("device_cache_bytes", "0", [](auto& r) { r.device_cache_bytes = 0; });
  add("device_memory_bytes", "-5", [](auto& r) { r.device_memory_bytes = -5; });
  add("max_point_bytes", "0", [](auto& r) { r.max_point_bytes = 0; });
  for (const int64_t v : {int64_t{0}, int64_t{-3}}) {
    add("max_dim", std::to_string(v), [v](auto& r) { r.max_dim = v; });
  }
  for (const int v : {0, -1, 21}) {
    add("rounds", std::to_string(v), [v](auto& r) { r.rounds = v; });
  }
  for (const double v : {-0.5, 11.0}) {
    add("drift_tolerance", text(v), [v](auto& r) { r.drift_tolerance = v; });
  }
  for (const double v : {0.0, -1.0}) {
    add("max_seconds", text(v), [v](auto& r) { r.max_seconds = v; });
  }
}

void validate_rows(std::vector<Row>& rows) {
  const auto add = row_adder<modar::runtime::ValidationRequest>(
      rows, "validate", [](auto&) {},
      [](const auto& r) {
        const modar::DeviceProfile profile = modar::runtime::load_measured_profile(
            std::string(MODAR_SOURCE_DIR) + "/profiles/cpu-measured-quick.toml", "cpu");
        modar::runtime::resolve_validation_options(r, profile);
      });
  for (const int v : {0, -1, 1001}) {
    add("rounds", std::to_string(v), [v](auto& r) { r.rounds = v; });
  }
  for (const int v : {-1, 1001}) {
    add("warmup_steps", std::to_string(v), [v](auto& r) { r.warmup_steps = v; });
  }
  for (const int v : {0, 101}) {
    add("repeats", std::to_string(v), [v](auto& r) { r.repeats = v; });
  }
  add("threads", "-2", [](auto& r) { r.threads = -2; });
}

void comm_profile_rows(std::vector<Row>& rows) {
  const auto add = row_adder<modar::runtime::CommProfileRequest>(
      rows, "profile --comm", [](auto&) {},
      [](const auto& r) {
        modar::runtime::resolve_comm_profile_options(r, modar::runtime::DeviceKind::cpu, 2);
      });
  add("min_bytes", "8", [](auto& r) { r.min_bytes = 8; });
  add("min_bytes", "-1024", [](auto& r) { r.min_bytes = -1024; });
  add("max_bytes", "100000000000", [](auto& r) { r.max_bytes = 100000000000; });
  add("size_factor", "1.01", [](auto& r) { r.size_factor = 1.01; });
  add("warmup", "-1", [](auto& r) { r.warmup = -1; });
  add("min_repeats", "0", [](auto& r) { r.min_repeats = 0; });
  add("budget_s", "-1", [](auto& r) { r.budget_s = -1; });
  add("compute_before_s", "-1", [](auto& r) { r.compute_before_s = -1; });
}

void calibrate_rows(std::vector<Row>& rows) {
  const auto add = row_adder<modar::CalibrateRequest>(
      rows, "calibrate", [](auto&) {},
      [](const auto& r) {
        modar::resolve_calibrate_options(r, modar::load_profile("a100-80gb-dgx"));
      });
  for (const int v : {0, -3, 10001}) {
    add("max_iterations", std::to_string(v), [v](auto& r) { r.max_iterations = v; });
  }
}

void layout_rows(std::vector<Row>& rows) {
  const auto add = row_adder<modar::LayoutRequest>(
      rows, "layout", [](auto& r) { r.gpus = 8; }, [](const auto& r) { modar::resolve_layout(r); });
  for (const int64_t v : {int64_t{0}, int64_t{-8}, int64_t{1} << 25}) {
    add("gpus", std::to_string(v), [v](auto& r) { r.gpus = v; });
  }
  for (const int64_t v : {int64_t{0}, int64_t{-1}, int64_t{2000}}) {
    add("gpus_per_node", std::to_string(v), [v](auto& r) { r.gpus_per_node = v; });
  }
  for (const int64_t v : {int64_t{0}, int64_t{-16}, int64_t{1} << 41}) {
    add("global_batch", std::to_string(v), [v](auto& r) { r.global_batch = v; });
  }
  for (const int64_t v : {int64_t{0}, int64_t{-1}, int64_t{100001}}) {
    add("top", std::to_string(v), [v](auto& r) { r.top = v; });
  }
}

TEST(RequestFields, EveryMeaninglessNumberIsRefusedNamingItsField) {
  std::vector<Row> rows;
  optimal_rows(rows);
  sweep_rows(rows);
  fit_and_closed_form_rows(rows);
  profile_rows(rows);
  validate_rows(rows);
  comm_profile_rows(rows);
  calibrate_rows(rows);
  layout_rows(rows);
  ASSERT_GT(rows.size(), 100u);
  for (const Row& row : rows) {
    const std::string where = row.request + " " + row.field + " = " + row.value;
    try {
      row.resolve();
      ADD_FAILURE() << where << ": accepted";
    } catch (const modar::ConfigError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(row.field), std::string::npos) << where << ": " << message;
      EXPECT_NE(message.find(row.value), std::string::npos) << where << ": " << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << where << ": " << message;
      EXPECT_EQ(message.find("--"), std::string::npos) << where << ": names a flag: " << message;
    }
  }
}

TEST(RequestFields, TheDefaultsResolve) {
  // The empty request of each is valid (the CLI's --help shows its values).
  EXPECT_NO_THROW(modar::resolve_optimal(modar::OptimalRequest{}));
  modar::SweepRequest sweep;
  sweep.flops = {1e20};
  EXPECT_NO_THROW(modar::resolve_sweep(sweep));
  EXPECT_NO_THROW(modar::resolve_fit_options(modar::FitRequest{}));
  EXPECT_NO_THROW(modar::closed_form_optimum(modar::ClosedFormRequest{1e20, {}, {}}));
  modar::LayoutRequest layout;
  layout.gpus = 8;
  const modar::LayoutSettings settings = modar::resolve_layout(layout);
  EXPECT_EQ(settings.options.gpus, 8);
  EXPECT_EQ(settings.top, 20u);
  EXPECT_EQ(settings.options.global_batch, 0);  // 0: the config's, else ~4M tokens
  // gpus has no default: an empty layout request is refused naming it.
  try {
    modar::resolve_layout(modar::LayoutRequest{});
    ADD_FAILURE() << "an empty layout request was accepted";
  } catch (const modar::ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("gpus: missing", 0), 0u) << e.what();
  }
}

}  // namespace
