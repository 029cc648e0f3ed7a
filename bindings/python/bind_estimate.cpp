// bindings/python/bind_estimate.cpp -- device profiles (include/modar/profile.hpp)
// and the cost model's estimate (include/modar/cost_model.hpp).
//
// Speed: a profile is loaded and pre-indexed (TimingModel) once and cached,
// keyed by its name (embedded profiles) or its path plus the file's identity,
// modification time and size; a single estimate returns the C++ structs
// (EstimateHandle) and builds the `modar estimate --json` document only when
// Python asks for it; the batched estimate evaluates many configurations in
// one call with the GIL released, writing straight into numpy arrays.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>
#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "bindings.hpp"
#include "config_access.hpp"
#include "modar/base/errors.hpp"
#include "modar/cost_model.hpp"
#include "modar/profile.hpp"

namespace modar::python {

namespace {

// ---- profiles, loaded once ------------------------------------------------------

struct ProfileEntry {
  DeviceProfile profile;
  std::optional<TimingModel> timing;  // indexes `profile` (same object, never moved)
};
using ProfileRef = std::shared_ptr<const ProfileEntry>;

ProfileRef make_entry(DeviceProfile profile) {
  auto entry = std::make_shared<ProfileEntry>();
  entry->profile = std::move(profile);
  entry->timing.emplace(entry->profile);
  return entry;
}

// The rule load_profile() applies (cost_models/profile.cpp): a reference with
// a slash or a ".toml" suffix is a file path, anything else a profile name.
bool looks_like_path(const std::string& ref) {
  return ref.find('/') != std::string::npos || ref.find('\\') != std::string::npos ||
         (ref.size() > 5 && ref.compare(ref.size() - 5, 5, ".toml") == 0);
}

class ProfileCache {
 public:
  ProfileRef get(const std::string& ref) {
    FileKey file;
    const bool is_file = looks_like_path(ref);
    if (is_file && !stat_file(ref, &file)) {
      return make_entry(load_profile(ref));  // load_profile names the file and the problem
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const Slot& slot : slots_) {
        if (slot.ref == ref && slot.is_file == is_file && (!is_file || slot.file == file)) {
          return slot.entry;
        }
      }
    }
    if (!is_file && embedded_profile_text(ref).empty()) {
      // A profile saved into the source tree after this build (or no such
      // profile: load_profile says so): not cached, its file may change.
      return make_entry(load_profile(ref));
    }
    ProfileRef entry = make_entry(load_profile(ref));
    std::lock_guard<std::mutex> lock(mutex_);
    slots_.erase(std::remove_if(slots_.begin(), slots_.end(),
                                [&](const Slot& slot) { return slot.ref == ref; }),
                 slots_.end());
    if (slots_.size() >= kMaxSlots) {
      slots_.erase(slots_.begin());
    }
    slots_.push_back({ref, is_file, file, entry});
    return entry;
  }

  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    slots_.clear();
  }

  size_t size() {
    std::lock_guard<std::mutex> lock(mutex_);
    return slots_.size();
  }

 private:
  struct FileKey {
    uint64_t device = 0, inode = 0, size = 0;
    int64_t mtime_ns = 0;
    bool operator==(const FileKey& o) const {
      return device == o.device && inode == o.inode && size == o.size && mtime_ns == o.mtime_ns;
    }
  };
  struct Slot {
    std::string ref;
    bool is_file;
    FileKey file;
    ProfileRef entry;
  };
  static bool stat_file(const std::string& path, FileKey* key) {
    struct stat info {};
    if (::stat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) {
      return false;
    }
    key->device = static_cast<uint64_t>(info.st_dev);
    key->inode = static_cast<uint64_t>(info.st_ino);
    key->size = static_cast<uint64_t>(info.st_size);
    key->mtime_ns = static_cast<int64_t>(info.st_mtim.tv_sec) * 1000000000 + info.st_mtim.tv_nsec;
    return true;
  }
  static constexpr size_t kMaxSlots = 32;
  std::mutex mutex_;
  std::vector<Slot> slots_;
};

ProfileCache& profile_cache() {
  static ProfileCache* cache = new ProfileCache();  // never destroyed: used until exit
  return *cache;
}

// A profile for the Python layer: a cached one, or a modar.Profile's own copy.
struct ProfileHandle {
  ProfileRef entry;
};

StepKind parse_step(const std::string& name) {
  if (name == "train") {
    return StepKind::train;
  }
  if (name == "decode") {
    return StepKind::decode;
  }
  throw ConfigError("step = \"" + shown(name) + "\": allowed: \"train\", \"decode\"");
}

// ---- one estimate, kept as C++ structs ------------------------------------------

struct EstimateHandle {
  Config config;
  ProfileRef profile;
  StepKind step = StepKind::train;
  Estimate estimate;
};

EstimateHandle estimate_one(const Config& config, const std::string& step_name,
                            const ProfileHandle* profile) {
  const StepKind step = parse_step(step_name);
  validate_checked(config);
  EstimateHandle handle{
      config, profile != nullptr ? profile->entry : profile_cache().get(config.device.profile),
      step, Estimate{}};
  thread_local OpList scratch;
  estimate_into(handle.config, *handle.profile->timing, step, scratch, handle.estimate);
  apply_parallel_model(handle.config, *handle.profile->timing, step, handle.estimate);
  return handle;
}

// ---- many estimates -------------------------------------------------------------

// The scalar outputs of an estimate, named as the flattened keys of the
// `modar estimate --json` document (estimate_json.cpp): these, then
// memory.breakdown.<key> for each of kMemoryParts, then kTimeColumns; the
// tests check each column against that document.
constexpr const char* kParamsFlopsColumns[] = {
    "params.total",
    "params.non_embedding",
    "params.flop_active",
    "params.experts",
    "params.active",
    "flops.forward_per_token",
    "flops.forward_attention_per_token",
    "flops.forward_router_per_token",
    "flops.forward_dar_per_token",
    "flops.backward_per_token",
    "flops.recompute_per_token",
    "flops.train_per_token",
    "flops.train_per_step",
    "flops.hardware_per_step",
    "flops.tokens_per_step",
    "memory.peak_bytes",
    "memory.capacity_bytes",
};
constexpr const char* kTimeColumns[] = {
    "time.step_s", "time.tokens_per_s", "time.mfu",       "time.mfu_full_attention",
    "time.hfu",    "time.micro_batch_s", "time.optimizer_s",
};
constexpr size_t kRealCount =
    std::size(kParamsFlopsColumns) + std::size(kMemoryParts) + std::size(kTimeColumns);
constexpr const char* kIntColumns[] = {"time.accumulation_steps"};
constexpr const char* kBoolColumns[] = {"memory.fits", "time.calibrated", "time.extrapolated"};
constexpr size_t kIntCount = 1;
constexpr size_t kBoolCount = 3;

std::vector<std::string> real_column_names() {
  std::vector<std::string> names(std::begin(kParamsFlopsColumns), std::end(kParamsFlopsColumns));
  for (const MemoryPart& part : kMemoryParts) {
    names.push_back(std::string("memory.breakdown.") + part.key);
  }
  names.insert(names.end(), std::begin(kTimeColumns), std::end(kTimeColumns));
  return names;
}

// Column-major outputs: reals[c * rows + r].
struct Outputs {
  double* reals = nullptr;
  int64_t* ints = nullptr;
  bool* bools = nullptr;
  size_t rows = 0;

  void write(size_t r, const Estimate& e) const {
    const double params_flops[std::size(kParamsFlopsColumns)] = {
        e.params.total,
        e.params.non_embedding,
        e.params.flop_active,
        e.params.experts,
        e.params.active,
        e.flops.forward_per_token,
        e.flops.forward_attention_per_token,
        e.flops.forward_router_per_token,
        e.flops.forward_dar_per_token,
        e.flops.backward_per_token,
        e.flops.recompute_per_token,
        e.flops.train_per_token,
        e.flops.train_per_step,
        e.flops.hardware_per_step,
        e.flops.tokens_per_step,
        e.memory.peak,
        e.memory.capacity,
    };
    const double time[std::size(kTimeColumns)] = {
        e.time.step_s, e.time.tokens_per_s, e.time.mfu,       e.time.mfu_full_attention,
        e.time.hfu,    e.time.micro_batch_s, e.time.optimizer_s,
    };
    size_t c = 0;
    for (const double value : params_flops) {
      reals[c++ * rows + r] = value;
    }
    for (const MemoryPart& part : kMemoryParts) {
      reals[c++ * rows + r] = e.memory.*part.bytes;
    }
    for (const double value : time) {
      reals[c++ * rows + r] = value;
    }
    ints[r] = e.time.accumulation_steps;
    bools[0 * rows + r] = e.memory.fits;
    bools[1 * rows + r] = e.time.calibrated;
    bools[2 * rows + r] = e.time.extrapolated;
  }

  void write_failed(size_t r) const {
    for (size_t c = 0; c < kRealCount; ++c) {
      reals[c * rows + r] = std::numeric_limits<double>::quiet_NaN();
    }
    ints[r] = 0;
    for (size_t c = 0; c < kBoolCount; ++c) {
      bools[c * rows + r] = false;
    }
  }
};

// One column of overrides, copied out of Python before the GIL is released.
struct Column {
  const KeyInfo* key = nullptr;
  enum class Kind { integer, real, boolean, text } kind = Kind::integer;
  std::vector<int64_t> integers;
  std::vector<double> reals;
  std::vector<uint8_t> booleans;
  std::vector<std::string> texts;

  void apply(Config& config, size_t r) const {
    switch (kind) {
      case Kind::integer:
        key->setter.set_integer(config, integers[r]);
        break;
      case Kind::real:
        key->setter.set_real(config, reals[r]);
        break;
      case Kind::boolean:
        key->setter.set_boolean(config, booleans[r] != 0);
        break;
      case Kind::text:
        key->setter.set_text(config, texts[r]);
        break;
    }
  }
};

Column make_column(const std::string& dotted_key, const py::handle& values, size_t rows) {
  Column column;
  column.key = find_key(dotted_key);
  if (column.key == nullptr) {
    fail_unknown_key(dotted_key);
  }
  auto check_length = [&](size_t n) {
    if (n != rows) {
      throw ConfigError("column " + dotted_key + ": " + std::to_string(n) +
                        " values; allowed: one per row (" + std::to_string(rows) + ")");
    }
  };
  if (py::isinstance<py::array_t<int64_t>>(values)) {
    auto a = values.cast<py::array_t<int64_t, py::array::c_style | py::array::forcecast>>();
    check_length(static_cast<size_t>(a.size()));
    column.kind = Column::Kind::integer;
    column.integers.assign(a.data(), a.data() + a.size());
  } else if (py::isinstance<py::array_t<double>>(values)) {
    auto a = values.cast<py::array_t<double, py::array::c_style | py::array::forcecast>>();
    check_length(static_cast<size_t>(a.size()));
    column.kind = Column::Kind::real;
    column.reals.assign(a.data(), a.data() + a.size());
  } else if (py::isinstance<py::array_t<bool>>(values)) {
    auto a = values.cast<py::array_t<bool, py::array::c_style | py::array::forcecast>>();
    check_length(static_cast<size_t>(a.size()));
    column.kind = Column::Kind::boolean;
    column.booleans.assign(a.data(), a.data() + a.size());
  } else if (py::isinstance<py::list>(values)) {
    const py::list list = values.cast<py::list>();
    check_length(list.size());
    column.kind = Column::Kind::text;
    column.texts.reserve(list.size());
    for (const py::handle item : list) {
      if (!PyUnicode_Check(item.ptr())) {
        throw ConfigError("column " + dotted_key + ": value " +
                          shown(py::repr(item).cast<std::string>()) +
                          " is not a string; allowed: one dtype per column (integers, "
                          "numbers, booleans or strings)");
      }
      column.texts.push_back(item.cast<std::string>());
    }
  } else {
    throw ConfigError("column " + dotted_key +
                      ": allowed: an int64, float64 or bool numpy array, or a list of str");
  }
  return column;
}

struct RowError {
  size_t row = std::numeric_limits<size_t>::max();
  std::string message;
};

// Rows [begin, end) of a batch.  Failed rows get NaN / false / 0 and their
// message in `messages` (when collecting); with stop_at_first, the first
// failing row ends the range.  `poll` is called between chunks (may throw).
struct BatchInput {
  const Config* base = nullptr;
  const std::vector<const Config*>* configs = nullptr;  // or columns applied to *base
  const std::vector<Column>* columns = nullptr;
  StepKind step = StepKind::train;
  ProfileRef fixed_profile;  // null: each row's device.profile (cached)
  Outputs out;
  bool stop_at_first = true;
};

void run_rows(const BatchInput& in, size_t begin, size_t end, std::vector<RowError>* errors,
              const std::function<void()>& poll) {
  Config work = *in.base;
  OpList scratch;
  Estimate estimate;
  ProfileRef profile = in.fixed_profile;
  std::string profile_ref;  // the device.profile `profile` was looked up for
  constexpr size_t kChunk = 1024;
  for (size_t r = begin; r < end; ++r) {
    if ((r - begin) % kChunk == kChunk - 1) {
      poll();  // outside the try: an interrupt is not a row's error
    }
    try {
      const Config* config = &work;
      if (in.configs != nullptr) {
        config = (*in.configs)[r];
      } else {
        for (const Column& column : *in.columns) {
          column.apply(work, r);
        }
      }
      validate_checked(*config);
      if (!in.fixed_profile && (!profile || profile_ref != config->device.profile)) {
        profile = profile_cache().get(config->device.profile);
        profile_ref = config->device.profile;
      }
      estimate_into(*config, *profile->timing, in.step, scratch, estimate);
      apply_parallel_model(*config, *profile->timing, in.step, estimate);
      in.out.write(r, estimate);
    } catch (const ConfigError& error) {
      in.out.write_failed(r);
      errors->push_back({r, error.what()});
    } catch (const FileError& error) {
      in.out.write_failed(r);
      errors->push_back({r, error.what()});
    }
    if (in.stop_at_first && !errors->empty()) {
      return;
    }
  }
}

// Thrown in worker threads when the calling thread was interrupted.
struct Cancelled : std::exception {
  const char* what() const noexcept override { return "cancelled"; }
};

// The C++ hot path alone (what cost_models/bench measures), for the Python
// benchmark's reference row: estimate_into over the configs, repeated for
// `seconds` of this thread's CPU time; (evaluated, cpu s, wall s, checksum).
std::tuple<int64_t, double, double, double> time_estimate_loop(const std::vector<Config>& configs,
                                                               const ProfileHandle& profile,
                                                               const std::string& step_name,
                                                               double seconds) {
  const StepKind step = parse_step(step_name);
  if (configs.empty() || !(seconds > 0.0) || seconds > 600.0) {
    throw ConfigError("time_estimate_into: needs configs and seconds in (0, 600]");
  }
  for (const Config& c : configs) {
    validate_checked(c);
  }
  const auto cpu_now = []() {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  };
  OpList scratch;
  Estimate out;
  double checksum = 0.0;
  int64_t evaluated = 0;
  const auto wall_start = std::chrono::steady_clock::now();
  const double cpu_start = cpu_now();
  double cpu = 0.0;
  while (cpu < seconds) {
    for (const Config& c : configs) {
      estimate_into(c, *profile.entry->timing, step, scratch, out);
      checksum += out.time.step_s;
    }
    evaluated += static_cast<int64_t>(configs.size());
    cpu = cpu_now() - cpu_start;
  }
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  return std::make_tuple(evaluated, cpu, wall, checksum);
}

// estimate_batch: many estimates in one call, the GIL released between the
// copies out of Python and the output arrays (see the binding's docstring).
py::tuple estimate_batch_rows(const Config& base, const py::object& configs,
                              const std::vector<std::string>& keys,
                              const std::vector<py::object>& values, int64_t rows_arg,
                              const std::string& step_name, const ProfileHandle* profile,
                              bool raise_errors, int threads, const py::object& check_signals) {
  const StepKind step = parse_step(step_name);
  if (keys.size() != values.size()) {
    throw ConfigError("estimate_batch: keys and values differ in length");
  }
  if (threads < 1 || threads > 1024) {
    throw ConfigError("threads = " + std::to_string(threads) + ": allowed: 1 to 1024");
  }
  // Inputs copied out of Python objects while the GIL is held.
  std::vector<py::object> keep_alive;
  std::vector<const Config*> config_list;
  std::vector<Column> columns;
  size_t rows = 0;
  if (!configs.is_none()) {
    for (const py::handle item : configs) {
      keep_alive.push_back(py::reinterpret_borrow<py::object>(item));
      config_list.push_back(&item.cast<const Config&>());
    }
    rows = config_list.size();
  } else {
    if (rows_arg < 0) {
      throw ConfigError("rows = " + std::to_string(rows_arg) + ": allowed: >= 0");
    }
    rows = static_cast<size_t>(rows_arg);
    for (size_t i = 0; i < keys.size(); ++i) {
      columns.push_back(make_column(keys[i], values[i], rows));
    }
  }
  py::array_t<double> reals({static_cast<py::ssize_t>(kRealCount), static_cast<py::ssize_t>(rows)});
  py::array_t<int64_t> ints({static_cast<py::ssize_t>(kIntCount), static_cast<py::ssize_t>(rows)});
  py::array_t<bool> bools({static_cast<py::ssize_t>(kBoolCount), static_cast<py::ssize_t>(rows)});
  BatchInput in;
  in.base = &base;
  in.configs = configs.is_none() ? nullptr : &config_list;
  in.columns = &columns;
  in.step = step;
  in.fixed_profile = profile != nullptr ? profile->entry : nullptr;
  in.out = Outputs{reals.mutable_data(), ints.mutable_data(), bools.mutable_data(), rows};
  in.stop_at_first = raise_errors;

  const size_t workers =
      std::max<size_t>(1, std::min<size_t>(static_cast<size_t>(threads), rows / 1024 + 1));
  std::vector<std::vector<RowError>> errors(workers);
  // Ctrl-C: between chunks the calling thread takes the GIL and runs
  // Python's signal handlers (KeyboardInterrupt unwinds the loop).
  auto last_check = std::chrono::steady_clock::now();
  std::function<void()> poll = [&]() {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_check < std::chrono::milliseconds(50)) {
      return;
    }
    last_check = now;
    py::gil_scoped_acquire acquire;
    if (!check_signals.is_none()) {
      check_signals();
    }
    if (PyErr_CheckSignals() != 0) {
      throw py::error_already_set();
    }
  };
  std::atomic<bool> cancelled{false};
  {
    py::gil_scoped_release release;
    const size_t per = (rows + workers - 1) / workers;
    std::vector<std::thread> pool;
    std::vector<std::exception_ptr> failures(workers);
    for (size_t w = 1; w < workers; ++w) {
      pool.emplace_back([&, w]() {
        try {
          const size_t begin = std::min(rows, w * per);
          const size_t end = std::min(rows, begin + per);
          const std::function<void()> stop = [&]() {
            if (cancelled.load(std::memory_order_relaxed)) {
              throw Cancelled();
            }
          };
          run_rows(in, begin, end, &errors[w], stop);
        } catch (...) {
          failures[w] = std::current_exception();
        }
      });
    }
    try {
      run_rows(in, 0, std::min(rows, per), &errors[0], poll);
    } catch (...) {
      failures[0] = std::current_exception();
      cancelled = true;
    }
    for (std::thread& t : pool) {
      t.join();
    }
    for (const std::exception_ptr& failure : failures) {
      if (failure) {
        std::rethrow_exception(failure);  // the caller's own first (KeyboardInterrupt)
      }
    }
  }
  std::vector<RowError> all;
  for (const auto& list : errors) {
    all.insert(all.end(), list.begin(), list.end());
  }
  std::sort(all.begin(), all.end(),
            [](const RowError& a, const RowError& b) { return a.row < b.row; });
  if (raise_errors && !all.empty()) {
    throw ConfigError("row " + std::to_string(all.front().row) + ": " + all.front().message);
  }
  py::list error_rows;
  py::list error_messages;
  for (const RowError& e : all) {
    error_rows.append(e.row);
    error_messages.append(py::str(e.message));
  }
  return py::make_tuple(reals, ints, bools, error_rows, error_messages);
}

// The profile objects and functions: loading, the cache, TOML round trips.
void bind_profiles(py::module_& m) {
  py::class_<DeviceProfile>(m, "DeviceProfile", "A loaded device profile (opaque; see to_toml)")
      .def_readonly("name", &DeviceProfile::name)
      .def_readonly("backend", &DeviceProfile::backend)
      .def_readonly("measured", &DeviceProfile::measured);

  m.def(
      "load_profile", [](const std::string& name_or_path) { return load_profile(name_or_path); },
      py::arg("name_or_path"),
      "An embedded profile name or a profile TOML path; FileError / ConfigError otherwise.");
  m.def(
      "parse_profile_toml",
      [](const std::string& text, const std::string& source) {
        return parse_profile_toml(text, source);
      },
      py::arg("toml_text"), py::arg("source_name") = "<string>");
  m.def(
      "profile_to_toml", [](const DeviceProfile& p) { return to_toml(p); }, py::arg("profile"));
  m.def("save_profile", &save_profile_atomically, py::arg("profile"), py::arg("path"),
        "Write the profile TOML atomically (temporary file + rename).");
  m.def("embedded_profile_names", &embedded_profile_names);
  m.def("default_profile_name", []() { return default_profile_name(); });

  py::class_<ProfileHandle>(m, "ProfileHandle",
                            "A profile pre-indexed for estimates (cached by name / path + mtime)")
      .def(
          py::init([](const DeviceProfile& profile) { return ProfileHandle{make_entry(profile)}; }),
          py::arg("profile"))
      .def_property_readonly("name", [](const ProfileHandle& h) { return h.entry->profile.name; });
  m.def(
      "cached_profile",
      [](const std::string& ref) { return ProfileHandle{profile_cache().get(ref)}; },
      py::arg("name_or_path"), py::call_guard<py::gil_scoped_release>(),
      "The profile, loaded once: embedded names are cached for the process, files by path, "
      "inode, modification time and size (an edited file is read again).");
  m.def("clear_profile_cache", []() { profile_cache().clear(); });
  m.def("profile_cache_size", []() { return profile_cache().size(); });
}

}  // namespace

void bind_estimate(py::module_& m) {
  bind_profiles(m);

  py::class_<EstimateHandle>(m, "EstimateHandle", "One estimate, as the C++ structs")
      .def_property_readonly("step_s",
                             [](const EstimateHandle& h) { return h.estimate.time.step_s; })
      .def_property_readonly("tokens_per_s",
                             [](const EstimateHandle& h) { return h.estimate.time.tokens_per_s; })
      .def_property_readonly("mfu", [](const EstimateHandle& h) { return h.estimate.time.mfu; })
      .def_property_readonly("peak_bytes",
                             [](const EstimateHandle& h) { return h.estimate.memory.peak; })
      .def_property_readonly("fits", [](const EstimateHandle& h) { return h.estimate.memory.fits; })
      .def_property_readonly("params_total",
                             [](const EstimateHandle& h) { return h.estimate.params.total; })
      .def_property_readonly(
          "train_flops_per_token",
          [](const EstimateHandle& h) { return h.estimate.flops.train_per_token; })
      .def(
          "to_json",
          [](const EstimateHandle& h) {
            return estimate_to_json(h.config, h.profile->profile, h.step, h.estimate);
          },
          "The `modar estimate --json` document.");

  m.def(
      "estimate",
      [](const Config& config, const std::string& step, const ProfileHandle* profile) {
        return estimate_one(config, step, profile);
      },
      py::arg("config"), py::arg("step") = "train", py::arg("profile") = nullptr,
      py::call_guard<py::gil_scoped_release>(),
      "One estimate (EstimateHandle); profile None: the config's device.profile, cached.");

  m.def(
      "estimate_json",
      [](const Config& config, const DeviceProfile& profile, const std::string& step_name) {
        const StepKind step = parse_step(step_name);
        validate_checked(config);
        return estimate_to_json(config, profile, step, estimate(config, profile, step));
      },
      py::arg("config"), py::arg("profile"), py::arg("step") = "train",
      py::call_guard<py::gil_scoped_release>(),
      "The `modar estimate --json` document, computed without any cache.");

  m.def("time_estimate_into", &time_estimate_loop, py::arg("configs"), py::arg("profile"),
        py::arg("step") = "train", py::arg("seconds") = 1.0,
        py::call_guard<py::gil_scoped_release>(),
        "(configs evaluated, thread CPU s, wall s, checksum) of a C++ loop over estimate_into.");

  m.def(
      "batch_columns",
      []() {
        std::vector<std::string> names = real_column_names();
        names.insert(names.end(), std::begin(kIntColumns), std::end(kIntColumns));
        names.insert(names.end(), std::begin(kBoolColumns), std::end(kBoolColumns));
        return names;
      },
      "The output columns of estimate_batch, in order.");

  m.def("estimate_batch", &estimate_batch_rows, py::arg("base"), py::arg("configs"),
        py::arg("keys"), py::arg("values"), py::arg("rows"), py::arg("step") = "train",
        py::arg("profile") = nullptr, py::arg("raise_errors") = true, py::arg("threads") = 1,
        py::arg("check_signals") = py::none(),
        "Many estimates in one call, the GIL released: either `configs` (a list of Config) or "
        "`base` with columns of overrides (keys[i] -> values[i], one value per row).  Returns "
        "(reals[col, row], ints[col, row], bools[col, row], failed rows, their messages); the "
        "columns are batch_columns().");
}

}  // namespace modar::python
