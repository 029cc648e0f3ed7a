// Memory accounting, parameters and option structs of the runtime layers
// (include/modar/runtime/layers.hpp).
#include <cmath>
#include <utility>

#include "modar/base/errors.hpp"
#include "modar/runtime/layers.hpp"

namespace modar::runtime {

// ---- MemoryTracker / Buffer -------------------------------------------------------

void MemoryTracker::on_allocate(int64_t bytes) {
  live_bytes_ += bytes;
  if (live_bytes_ > peak_bytes_) {
    peak_bytes_ = live_bytes_;
  }
}

void MemoryTracker::on_release(int64_t bytes) {
  live_bytes_ -= bytes;
}

Buffer::Buffer(Backend& backend, MemoryTracker* tracker, const std::vector<int64_t>& shape,
               ScalarType dtype)
    : tensor_(backend, shape, dtype), tracker_(tracker) {
  if (tracker_ != nullptr) {
    tracker_->on_allocate(tensor_.bytes());
  }
}

Buffer::Buffer(Buffer&& other) noexcept
    : tensor_(std::move(other.tensor_)), tracker_(std::exchange(other.tracker_, nullptr)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    tensor_ = std::move(other.tensor_);
    tracker_ = std::exchange(other.tracker_, nullptr);
  }
  return *this;
}

Buffer::~Buffer() {
  release();
}

void Buffer::reset() {
  release();
  tensor_ = Tensor();
}

void Buffer::release() noexcept {
  if (tracker_ != nullptr && !tensor_.empty()) {
    tracker_->on_release(tensor_.bytes());
  }
  tracker_ = nullptr;
}

// ---- Context ------------------------------------------------------------------------

Buffer Context::make(const std::vector<int64_t>& shape, ScalarType type) const {
  return Buffer(backend, tracker, shape, type);
}

Buffer Context::zeros(const std::vector<int64_t>& shape, ScalarType type) const {
  Buffer buffer(backend, tracker, shape, type);
  backend.fill(buffer, 0.0);
  return buffer;
}

Buffer Context::copy_of(const TensorView& src) const {
  Buffer buffer(backend, tracker, src.shape_vector(), src.dtype);
  backend.copy(src, buffer);
  return buffer;
}

Buffer Context::indices(const std::vector<int64_t>& shape,
                        const std::vector<int32_t>& values) const {
  Buffer buffer(backend, tracker, shape, ScalarType::i32);
  if (static_cast<int64_t>(values.size()) != buffer.numel()) {
    throw ShapeError("indices: " + std::to_string(values.size()) + " values for " +
                     buffer.view().describe());
  }
  backend.copy_from_host(values.data(), buffer);
  return buffer;
}

// ---- Rng ----------------------------------------------------------------------------

uint64_t Rng::next_u64() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

double Rng::uniform() {
  return static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
}

double Rng::normal() {
  // Box-Muller; 1 - u keeps the logarithm finite.
  const double u1 = 1.0 - uniform();
  const double u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

// ---- parameters -------------------------------------------------------------------

Parameter& ParameterSet::add(const Context& ctx, const std::string& name,
                             const std::vector<int64_t>& shape, ScalarType dtype, const Init& init,
                             Rng& rng) {
  auto param = std::make_unique<Parameter>();
  param->name = name;
  param->value = ctx.make(shape, dtype);
  const int64_t numel = param->value.numel();
  std::vector<double> values;
  switch (init.kind) {
    case Init::Kind::constant:
      values.assign(static_cast<size_t>(numel), init.value);
      break;
    case Init::Kind::normal:
      values.resize(static_cast<size_t>(numel));
      for (double& v : values) {
        v = init.value * rng.normal();
      }
      break;
    case Init::Kind::values:
      values = init.values;
      break;
  }
  upload(ctx.backend, values, param->value);
  param->grad = ctx.zeros(shape, dtype);
  const ScalarType optimizer_type = dtype == ScalarType::fp64 ? ScalarType::fp64 : ScalarType::fp32;
  if (dtype == ScalarType::bf16) {
    param->master = ctx.make(shape, ScalarType::fp32);
    upload(ctx.backend, values, param->master);
  }
  param->adam_m = ctx.zeros(shape, optimizer_type);
  param->adam_v = ctx.zeros(shape, optimizer_type);
  params_.push_back(std::move(param));
  return *params_.back();
}

void ParameterSet::zero_grads(Backend& backend) {
  for (auto& p : params_) {
    backend.fill(p->grad, 0.0);
  }
}

void ParameterSet::adamw_step(Backend& backend, const AdamWParams& hyper) {
  for (auto& p : params_) {
    const TensorView lowp = p->master.empty() ? TensorView{} : p->value.view();
    backend.adamw_update(p->optimizer_view(), p->grad, p->adam_m, p->adam_v, hyper, lowp);
  }
}

int64_t ParameterSet::count() const {
  int64_t total = 0;
  for (const auto& p : params_) {
    total += p->value.numel();
  }
  return total;
}

Parameter* ParameterSet::find(const std::string& name) const {
  for (const auto& p : params_) {
    if (p->name == name) {
      return p.get();
    }
  }
  return nullptr;
}

// ---- option structs ------------------------------------------------------------------

BranchShape BranchShape::from(const ModelConfig& model) {
  // The cost model describes more of a model than the reference runtime
  // implements; a config it cannot run is refused here, by the key.
  if (model.mlp == MlpKind::geglu) {
    throw ConfigError(
        "model.mlp = \"geglu\": the reference runtime implements \"gelu\" and \"swiglu\" "
        "(geglu is planned by the cost model only)");
  }
  if (model.qkv_bias) {
    throw ConfigError(
        "model.qkv_bias = true: the reference runtime has no biases (planned by the cost model "
        "only)");
  }
  if (model.qk_norm != QkNorm::none) {
    throw ConfigError(std::string("model.qk_norm = \"") + to_string(model.qk_norm) +
                      "\": the reference runtime implements \"none\" (planned by the cost "
                      "model only)");
  }
  BranchShape shape;
  shape.d_model = model.d_model;
  shape.n_heads = model.n_heads;
  shape.n_kv_heads = model.resolved_kv_heads();
  shape.d_head = model.resolved_d_head();
  shape.d_ff = model.resolved_d_ff();
  shape.mlp = model.mlp;
  shape.norm_eps = model.norm_eps;
  return shape;
}

RoutingOptions RoutingOptions::from(const ModConfig& mod) {
  RoutingOptions routing;
  routing.capacity = mod.capacity;
  routing.gate = mod.router_scale;
  routing.causal = mod.causal_router;
  routing.predictor_hidden = mod.predictor_hidden;
  return routing;
}

StreamRoles StreamRoles::of(DarVariant variant, int64_t streams) {
  StreamRoles roles;
  const int n = static_cast<int>(streams);
  for (int j = 0; j < n; ++j) {
    int key = j, value = j;
    if (n >= 2) {
      switch (variant) {
        case DarVariant::dar:
          key = n == 2 ? 1 - j : (j + 1) % n;
          break;
        case DarVariant::selfkv:
          break;
        case DarVariant::fixedkv:
          key = 0;
          value = 1;
          break;
        case DarVariant::crossv:
          value = n == 2 ? 1 - j : (j + 1) % n;
          break;
        default:
          break;
      }
    }
    roles.key_stream.push_back(key);
    roles.value_stream.push_back(value);
  }
  return roles;
}

DepthOptions DepthOptions::from(const Config& config) {
  DepthOptions options;
  options.variant = config.dar.variant;
  options.streams = config.dar.resolved_streams();
  options.total_branches = 2 * config.model.n_layers;
  options.norm_eps = config.model.norm_eps;
  // S = 2K branches per block; Full AttnRes (K = 1) makes EVERY branch its own
  // source (docs/model.md AttnRes/DAR), Full DAR (K = 1) is one layer (two branches) per block.
  if (config.dar.variant == DarVariant::attnres && config.dar.block_layers == 1) {
    options.branches_per_block = 1;
  } else {
    options.branches_per_block = config.dar.branches_per_block();
  }
  return options;
}

}  // namespace modar::runtime
