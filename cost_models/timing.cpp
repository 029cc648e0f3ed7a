// Op time prediction from a device profile (docs/cost_model.md).
//
// Roofline: max(executed FLOPs / ceiling, bytes / bandwidth) + launch overhead,
// with the profile's resolved rates (kernel_rates(): [kernel] efficiencies x
// peaks, else the achievable ceilings, else the peaks; GEMMs, attention and
// each memory-bound op family at their own rate) and the FLOPs a
// FlashAttention-style kernel executes (op_cost with AttentionFlops::flash),
// whatever counting convention the report uses.
//
// Calibrated: measurements are grouped by (kind, pass class, dtype, the
// categorical dims: causal flag, streams, variant, mode, ...).  Each group's
// other dims span a grid (the sorted distinct values per dim); inside it,
// log(time) is interpolated multilinearly in log(dims), which is exact for a
// power law.  Outside the grid (or at a missing grid point) the time is the
// kind's fitted efficiency (geometric mean of measured / roofline over all its
// measurements) times the roofline, flagged as extrapolated.  GEMMs are timed
// the same in every pass (a dgrad / wgrad GEMM is a GEMM); recompute ops are
// timed as forward ops.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "modar/cost_model.hpp"
#include "modar/kernel_model.hpp"

namespace modar {
namespace {

constexpr int kMaxDims = static_cast<int>(kMaxOpDims);

// The pass whose measurements time an op (the table's timing column): one
// for every pass of an `any_pass` kind (a dgrad / wgrad GEMM is a GEMM);
// recompute ops are timed as forward ops.
Pass pass_class(OpKind kind, Pass pass) {
  if (op_kind_info(kind).timing == OpTiming::any_pass || pass == Pass::recompute) {
    return Pass::forward;
  }
  return pass;
}

// Dims that are flags / small categorical values (the dims struct's
// `category` dims): they must match exactly.
bool is_categorical(OpKind kind, int dim) {
  const OpKindInfo& info = op_kind_info(kind);
  return dim < info.dims_count && info.dims[dim].role == DimRole::category;
}

}  // namespace

struct TimingModel::Index {
  uint64_t id = 0;  // unique per model: keys the per-thread lookup cache
  struct Grid {
    Pass pass = Pass::forward;
    DType dtype = DType::bf16;
    std::array<int64_t, kMaxDims> categorical{};  // values of the categorical dims
    std::vector<int> axes_dims;                   // dims that span the grid
    std::vector<std::vector<double>> axes;        // distinct values per axis (ascending)
    std::vector<double> log_time;                 // row-major over axes; NaN = missing
    std::array<int64_t, kMaxDims> exact{};        // dims with one value: must match
    // Per dim: kCategorical, kExact, or the index of its axis.
    std::array<int8_t, kMaxDims> role{};
    std::vector<std::vector<double>> log_axes;  // log of the axes' values
  };
  static constexpr int8_t kCategorical = -1;
  static constexpr int8_t kExact = -2;
  struct Efficiency {
    Pass pass = Pass::forward;
    DType dtype = DType::bf16;
    double log_sum = 0.0;
    int64_t count = 0;
  };
  std::array<std::vector<Grid>, kOpKindCount> grids;
  std::array<std::vector<Efficiency>, kOpKindCount> efficiency;
  // Per kind: any grid or fitted efficiency at all (else: plain roofline,
  // answered without touching the lookup cache).
  std::array<bool, kOpKindCount> has_measurements{};
};

TimingModel::TimingModel(const DeviceProfile& profile)
    : profile_(&profile), index_(nullptr), rates_(kernel_rates(profile)) {
  const auto inverse = [](double rate) { return rate > 0.0 ? 1.0 / rate : 0.0; };
  for (int i = 0; i < kOpKindCount; ++i) {
    const OpKind kind = static_cast<OpKind>(i);
    seconds_per_flop16_[static_cast<size_t>(i)] =
        inverse(kind == OpKind::attention ? rates_.attention_flops : rates_.gemm_flops);
    seconds_per_byte_[static_cast<size_t>(i)] = inverse(rates_.bandwidth_of(kind));
  }
  seconds_per_flop_fp32_ = inverse(rates_.fp32_flops);
  launch_overhead_s_ = rates_.launch_overhead_s;
  shape_aware_ = rates_.params.sm_count > 0;
  static std::atomic<uint64_t> next_model_id{1};
  id_ = next_model_id.fetch_add(1);
  if (profile.measurements.empty()) {
    return;
  }
  static std::atomic<uint64_t> next_id{1};
  index_ = new Index();
  index_->id = next_id.fetch_add(1);
  // Group the measurements.
  struct Member {
    size_t group;
    const OpMeasurement* measurement;
  };
  std::vector<Member> members;
  for (const OpMeasurement& m : profile.measurements) {
    const OpKind kind = m.shape.kind;
    const Pass pass = pass_class(kind, m.pass);
    auto& grids = index_->grids[static_cast<size_t>(kind)];
    const int dims = op_dims_count(kind);
    std::array<int64_t, kMaxDims> categorical{};
    for (int i = 0; i < dims; ++i) {
      if (is_categorical(kind, i)) {
        categorical[static_cast<size_t>(i)] = m.shape.dims[static_cast<size_t>(i)];
      }
    }
    size_t group = grids.size();
    for (size_t g = 0; g < grids.size(); ++g) {
      if (grids[g].pass == pass && grids[g].dtype == m.shape.dtype &&
          grids[g].categorical == categorical) {
        group = g;
        break;
      }
    }
    if (group == grids.size()) {
      Index::Grid grid;
      grid.pass = pass;
      grid.dtype = m.shape.dtype;
      grid.categorical = categorical;
      grids.push_back(grid);
    }
    members.push_back({group + (static_cast<size_t>(kind) << 32), &m});

    // Efficiency of this measurement against the roofline.
    auto& fits = index_->efficiency[static_cast<size_t>(kind)];
    auto fit = std::find_if(fits.begin(), fits.end(), [&](const Index::Efficiency& e) {
      return e.pass == pass && e.dtype == m.shape.dtype;
    });
    if (fit == fits.end()) {
      fits.push_back({pass, m.shape.dtype, 0.0, 0});
      fit = fits.end() - 1;
    }
    fit->log_sum += std::log(m.median_s / roofline_s(m.shape, m.pass));
    fit->count += 1;
  }
  for (int kind_index = 0; kind_index < kOpKindCount; ++kind_index) {
    const size_t k = static_cast<size_t>(kind_index);
    index_->has_measurements[k] = !index_->grids[k].empty() || !index_->efficiency[k].empty();
  }
  // Build each grid's axes and fill its values.
  for (int kind_index = 0; kind_index < kOpKindCount; ++kind_index) {
    const OpKind kind = static_cast<OpKind>(kind_index);
    const int dims = op_dims_count(kind);
    auto& grids = index_->grids[static_cast<size_t>(kind_index)];
    for (size_t g = 0; g < grids.size(); ++g) {
      Index::Grid& grid = grids[g];
      const size_t key = g + (static_cast<size_t>(kind_index) << 32);
      std::vector<std::vector<double>> values(static_cast<size_t>(dims));
      for (const Member& member : members) {
        if (member.group != key) {
          continue;
        }
        for (int i = 0; i < dims; ++i) {
          if (!is_categorical(kind, i)) {
            values[static_cast<size_t>(i)].push_back(
                static_cast<double>(member.measurement->shape.dims[static_cast<size_t>(i)]));
          }
        }
      }
      for (int i = 0; i < dims; ++i) {
        auto& v = values[static_cast<size_t>(i)];
        if (is_categorical(kind, i) || v.empty()) {
          continue;
        }
        std::sort(v.begin(), v.end());
        v.erase(std::unique(v.begin(), v.end()), v.end());
        if (v.size() == 1) {
          // One value: queries must match it exactly.
          grid.exact[static_cast<size_t>(i)] = static_cast<int64_t>(v.front());
          continue;
        }
        // Zero has no logarithm: such points cannot be interpolated between.
        v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return x <= 0.0; }), v.end());
        grid.axes_dims.push_back(i);
        grid.axes.push_back(v);
      }
      for (int i = 0; i < kMaxDims; ++i) {
        grid.role[static_cast<size_t>(i)] = Index::kExact;
        if (i < dims && is_categorical(kind, i)) {
          grid.role[static_cast<size_t>(i)] = Index::kCategorical;
        }
      }
      for (size_t a = 0; a < grid.axes_dims.size(); ++a) {
        grid.role[static_cast<size_t>(grid.axes_dims[a])] = static_cast<int8_t>(a);
        std::vector<double> logs;
        for (double v : grid.axes[a]) {
          logs.push_back(std::log(v));
        }
        grid.log_axes.push_back(logs);
      }
      size_t total = 1;
      for (const auto& axis : grid.axes) {
        total *= axis.size();
      }
      grid.log_time.assign(total, std::numeric_limits<double>::quiet_NaN());
      for (const Member& member : members) {
        if (member.group != key) {
          continue;
        }
        const OpShape& shape = member.measurement->shape;
        bool matches = true;
        for (int i = 0; i < dims; ++i) {
          const bool on_axis =
              std::find(grid.axes_dims.begin(), grid.axes_dims.end(), i) != grid.axes_dims.end();
          if (!is_categorical(kind, i) && !on_axis &&
              shape.dims[static_cast<size_t>(i)] != grid.exact[static_cast<size_t>(i)]) {
            matches = false;
          }
        }
        if (!matches) {
          continue;
        }
        size_t flat = 0;
        for (size_t a = 0; a < grid.axes.size() && matches; ++a) {
          const double value =
              static_cast<double>(shape.dims[static_cast<size_t>(grid.axes_dims[a])]);
          const auto& axis = grid.axes[a];
          const size_t position =
              static_cast<size_t>(std::lower_bound(axis.begin(), axis.end(), value) - axis.begin());
          matches = position < axis.size() && axis[position] == value;
          flat = flat * axis.size() + position;
        }
        if (matches) {
          grid.log_time[flat] = std::log(member.measurement->median_s);
        }
      }
    }
  }
}

TimingModel::~TimingModel() {
  delete index_;
}
TimingModel::TimingModel(TimingModel&& other) noexcept
    : profile_(other.profile_),
      index_(other.index_),
      id_(other.id_),
      shape_aware_(other.shape_aware_),
      rates_(other.rates_),
      seconds_per_flop16_(other.seconds_per_flop16_),
      seconds_per_byte_(other.seconds_per_byte_),
      seconds_per_flop_fp32_(other.seconds_per_flop_fp32_),
      launch_overhead_s_(other.launch_overhead_s_) {
  other.index_ = nullptr;
}
TimingModel& TimingModel::operator=(TimingModel&& other) noexcept {
  if (this != &other) {
    delete index_;
    profile_ = other.profile_;
    index_ = other.index_;
    id_ = other.id_;
    shape_aware_ = other.shape_aware_;
    rates_ = other.rates_;
    seconds_per_flop16_ = other.seconds_per_flop16_;
    seconds_per_byte_ = other.seconds_per_byte_;
    seconds_per_flop_fp32_ = other.seconds_per_flop_fp32_;
    launch_overhead_s_ = other.launch_overhead_s_;
    other.index_ = nullptr;
  }
  return *this;
}

double TimingModel::roofline_s(const OpShape& shape, Pass pass) const {
  const OpCost cost = op_cost(shape, pass, AttentionFlops::flash);
  return roofline_from_cost_s(shape.kind, shape.dtype, cost.flops, cost.bytes);
}

double TimingModel::at_memory_efficiency_s(double seconds, OpKind kind, double efficiency) const {
  const double peak = profile_->ceilings.memory_bandwidth;
  const double family = rates_.bandwidth_of(kind);
  MemoryFamily memory_family;  // none: a compute kind, timed by its own rates
  if (efficiency <= 0.0 || peak <= 0.0 || family <= 0.0 ||
      !memory_family_of(kind, &memory_family)) {
    return seconds;
  }
  const double body_s = std::max(seconds - launch_overhead_s_, 0.0);
  return launch_overhead_s_ + body_s * family / (efficiency * peak);
}

double TimingModel::op_time_s(const OpShape& shape, Pass pass, Source* source) const {
  if (op_kind_info(shape.kind).timing == OpTiming::per_pass_else_gemm &&
      (index_ == nullptr || !index_->has_measurements[static_cast<size_t>(shape.kind)])) {
    // Not measured as such: the per-expert GEMM at the busiest expert's rows
    // (load imbalance), batched over the experts (ops.hpp).
    return op_time_s(OpShape::of(expert_gemm_timing_dims(shape.as<ExpertGemmDims>()), shape.dtype),
                     Pass::forward, source);
  }
  const double roofline = roofline_s(shape, pass);
  if (index_ == nullptr) {
    return datasheet_s(shape, pass, roofline, source);
  }
  return calibrated_s(shape, pass, roofline, source);
}

namespace {

// A per-thread direct-mapped cache of calibrated lookups: sweeps evaluate the
// same op shapes over and over (only depth or capacity changes), and a grid
// lookup costs logs, a binary search per axis and 2^axes corners.
struct CachedLookup {
  uint64_t model_id = 0;  // 0 = empty
  OpShape shape;
  Pass pass = Pass::forward;
  TimingModel::Source source = TimingModel::Source::roofline;
  double seconds = 0.0;
};
// 65,536 slots (~6 MB per thread and cache): the wall-clock planner's step
// floors lower tens of thousands of layouts whose GEMMs recur across shapes;
// with 4,096 slots the documented h100 call (`modar optimal --gpu-hours 2e5
// --gpus 512 --profile h100-80gb-dgx`) missed 556,521 times (the kernel
// model's GEMM timing: 21 % of its instructions), with 65,536 61,704 times.
constexpr size_t kLookupCacheSize = 65536;

size_t lookup_slot(uint64_t model_id, const OpShape& shape, Pass pass) {
  // Independent multiplies (no dependent chain): a slot costs a few cycles.
  uint64_t h = model_id * 0x9E3779B97F4A7C15ULL;
  h ^= static_cast<uint64_t>(shape.kind) | (static_cast<uint64_t>(shape.dtype) << 8) |
       (static_cast<uint64_t>(pass) << 16);
  static_assert(kMaxOpDims == 7, "lookup_slot hashes all 7 dims");
  const auto& x = shape.dims;
  h += static_cast<uint64_t>(x[0]) * 0xC2B2AE3D27D4EB4FULL +
       static_cast<uint64_t>(x[1]) * 0x165667B19E3779F9ULL +
       static_cast<uint64_t>(x[2]) * 0x27D4EB2F165667C5ULL +
       static_cast<uint64_t>(x[3]) * 0x85EBCA77C2B2AE63ULL +
       static_cast<uint64_t>(x[4]) * 0xFF51AFD7ED558CCDULL +
       static_cast<uint64_t>(x[5]) * 0xC4CEB9FE1A85EC53ULL +
       static_cast<uint64_t>(x[6]) * 0x9FB21C651E98DF25ULL;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ULL;
  return static_cast<size_t>(h ^ (h >> 32)) & (kLookupCacheSize - 1);
}

bool same_shape(const OpShape& a, const OpShape& b) {
  bool same = a.kind == b.kind && a.dtype == b.dtype;
  for (size_t i = 0; i < a.dims.size(); ++i) {
    same &= a.dims[i] == b.dims[i];
  }
  return same;
}

}  // namespace

double TimingModel::calibrated_s(const OpShape& shape, Pass pass, double roofline,
                                 Source* source) const {
  if (!index_->has_measurements[static_cast<size_t>(shape.kind)]) {
    // What calibrated_uncached_s() ends with for a kind never measured.
    return datasheet_s(shape, pass, roofline, source);
  }
  thread_local std::vector<CachedLookup> cache(kLookupCacheSize);
  CachedLookup& slot = cache[lookup_slot(index_->id, shape, pass)];
  if (slot.model_id == index_->id && slot.pass == pass && same_shape(slot.shape, shape)) {
    *source = slot.source;
    return slot.seconds;
  }
  const double seconds = calibrated_uncached_s(shape, pass, roofline, source);
  slot.model_id = index_->id;
  slot.shape = shape;
  slot.pass = pass;
  slot.source = *source;
  slot.seconds = seconds;
  return seconds;
}

double TimingModel::calibrated_uncached_s(const OpShape& shape, Pass pass, double roofline,
                                          Source* source) const {
  const OpKind kind = shape.kind;
  const Pass klass = pass_class(kind, pass);
  const int dims = op_dims_count(kind);
  for (const Index::Grid& grid : index_->grids[static_cast<size_t>(kind)]) {
    if (grid.pass != klass || grid.dtype != shape.dtype) {
      continue;
    }
    // Categorical and single-valued dims must match; locate the others.
    const size_t axes = grid.axes.size();
    std::array<size_t, kMaxDims> lower{};
    std::array<double, kMaxDims> weight{};
    bool inside = true;
    for (int i = 0; i < dims && inside; ++i) {
      const int8_t role = grid.role[static_cast<size_t>(i)];
      const int64_t query = shape.dims[static_cast<size_t>(i)];
      if (role == Index::kCategorical) {
        inside = grid.categorical[static_cast<size_t>(i)] == query;
      } else if (role == Index::kExact) {
        inside = grid.exact[static_cast<size_t>(i)] == query;
      } else {
        const size_t a = static_cast<size_t>(role);
        const auto& axis = grid.axes[a];
        const double value = static_cast<double>(query);
        if (axis.empty() || value < axis.front() || value > axis.back() || value <= 0.0) {
          inside = false;
          break;
        }
        const size_t upper =
            static_cast<size_t>(std::lower_bound(axis.begin(), axis.end(), value) - axis.begin());
        if (axis[upper] == value) {
          lower[a] = upper;
          weight[a] = 0.0;
        } else {
          const auto& logs = grid.log_axes[a];
          lower[a] = upper - 1;
          weight[a] = (std::log(value) - logs[upper - 1]) / (logs[upper] - logs[upper - 1]);
        }
      }
    }
    if (!inside) {
      continue;
    }
    // Multilinear interpolation over the 2^axes corners.
    double log_time = 0.0;
    bool complete = true;
    for (size_t corner = 0; corner < (size_t{1} << axes) && complete; ++corner) {
      double corner_weight = 1.0;
      size_t flat = 0;
      for (size_t a = 0; a < axes; ++a) {
        const bool high = (corner >> a) & 1U;
        corner_weight *= high ? weight[a] : 1.0 - weight[a];
        const size_t position = lower[a] + (high && weight[a] > 0.0 ? 1 : 0);
        flat = flat * grid.axes[a].size() + position;
      }
      if (corner_weight == 0.0) {
        continue;
      }
      const double value = grid.log_time[flat];
      if (std::isnan(value)) {
        complete = false;
      }
      log_time += corner_weight * value;
    }
    if (complete) {
      *source = Source::interpolated;
      return std::exp(log_time);
    }
  }
  for (const Index::Efficiency& fit : index_->efficiency[static_cast<size_t>(kind)]) {
    if (fit.pass == klass && fit.dtype == shape.dtype && fit.count > 0) {
      *source = Source::extrapolated;
      return std::exp(fit.log_sum / static_cast<double>(fit.count)) * roofline;
    }
  }
  return datasheet_s(shape, pass, roofline, source);
}

double TimingModel::datasheet_s(const OpShape& shape, Pass pass, double roofline,
                                Source* source) const {
  if (!shape_aware_) {
    *source = Source::roofline;
    return roofline;
  }
  *source = Source::kernel_model;
  if (shape.kind != OpKind::gemm && shape.kind != OpKind::attention) {
    // Memory-bound families (and the few FLOPs of small ops) are the
    // roofline at the family's bandwidth: the kernel model's memory rule.
    return roofline;
  }
  thread_local std::vector<CachedLookup> cache(kLookupCacheSize);
  CachedLookup& slot = cache[lookup_slot(id_, shape, pass)];
  if (slot.model_id == id_ && slot.pass == pass && same_shape(slot.shape, shape)) {
    return slot.seconds;
  }
  double seconds = 0.0;
  if (shape.kind == OpKind::gemm) {
    const GemmDims x = shape.as<GemmDims>();
    seconds =
        gpu_gemm_time({x.m, x.n, x.k, std::max<int64_t>(x.batch, 1), shape.dtype}, rates_).seconds;
  } else {
    const OpCost cost = op_cost(shape, pass, AttentionFlops::flash);
    const AttentionDims x = shape.as<AttentionDims>();
    const AttentionShape attention{x.sequences, x.heads,    x.kv_heads,    x.query_len,
                                   x.key_len,   x.head_dim, x.causal != 0, shape.dtype};
    seconds =
        flash_attention_time_s(attention, pass == Pass::backward ? Pass::backward : Pass::forward,
                               cost.flops, cost.bytes, rates_);
  }
  slot.model_id = id_;
  slot.shape = shape;
  slot.pass = pass;
  slot.source = Source::kernel_model;
  slot.seconds = seconds;
  return seconds;
}

double predict_op_time_s(const OpRecord& op, const DeviceProfile& profile, bool* extrapolated) {
  const TimingModel timing(profile);
  TimingModel::Source source = TimingModel::Source::roofline;
  const double seconds = timing.at_memory_efficiency_s(timing.op_time_s(op.shape, op.pass, &source),
                                                       op.shape.kind, op.memory_efficiency);
  if (extrapolated != nullptr) {
    *extrapolated = source == TimingModel::Source::extrapolated;
  }
  return seconds;
}

}  // namespace modar
