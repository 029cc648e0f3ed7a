// Process groups, the data-parallel / ZeRO optimizer step and the replicated
// model trainer (include/modar/runtime/parallel_steps.hpp).
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "modar/base/errors.hpp"
#include "modar/runtime/parallel_steps.hpp"

namespace modar::runtime {

// ---- process groups ----------------------------------------------------------------

LayoutShape layout_shape(const ParallelConfig& layout, int64_t world_size) {
  if (layout.tensor < 1 || layout.pipeline < 1) {
    throw ConfigError("parallel.tensor = " + std::to_string(layout.tensor) +
                      ", parallel.pipeline = " + std::to_string(layout.pipeline) +
                      ": both must be >= 1");
  }
  if (layout.expert != 1) {
    throw ConfigError("parallel.expert = " + std::to_string(layout.expert) +
                      ": the runtime's parallel steps run expert = 1 only");
  }
  if (world_size % (layout.tensor * layout.pipeline) != 0) {
    throw ConfigError(
        "parallel.tensor x parallel.pipeline = " + std::to_string(layout.tensor * layout.pipeline) +
        " must divide the " + std::to_string(world_size) + " processes");
  }
  LayoutShape shape;
  shape.tensor = layout.tensor;
  shape.pipeline = layout.pipeline;
  shape.data = world_size / (layout.tensor * layout.pipeline);
  return shape;
}

LayoutCoordinates layout_coordinates(const LayoutShape& shape, int64_t rank) {
  LayoutCoordinates at;
  at.tensor = rank % shape.tensor;
  at.stage = (rank / shape.tensor) % shape.pipeline;
  at.data = rank / (shape.tensor * shape.pipeline);
  return at;
}

int64_t layout_rank(const LayoutShape& shape, const LayoutCoordinates& at) {
  return at.tensor + shape.tensor * (at.stage + shape.pipeline * at.data);
}

ProcessGroups make_process_groups(Communicator& world, const ParallelConfig& layout) {
  ProcessGroups groups;
  groups.shape = layout_shape(layout, world.size());
  groups.at = layout_coordinates(groups.shape, world.rank());
  const LayoutShape& s = groups.shape;
  const LayoutCoordinates& at = groups.at;
  // Colours name the coordinates the members share; keys order them.
  groups.tensor =
      world.split(static_cast<int>(at.stage + s.pipeline * at.data), static_cast<int>(at.tensor));
  groups.pipeline =
      world.split(static_cast<int>(at.tensor + s.tensor * at.data), static_cast<int>(at.stage));
  groups.data =
      world.split(static_cast<int>(at.tensor + s.tensor * at.stage), static_cast<int>(at.data));
  return groups;
}

std::vector<double> all_reduce_sum(Backend& backend, Communicator& group,
                                   const std::vector<double>& values) {
  if (group.size() == 1 || values.empty()) {
    return values;
  }
  Buffer buffer(backend, nullptr, {static_cast<int64_t>(values.size())}, ScalarType::fp64);
  upload(backend, values, buffer);
  group.all_reduce(buffer, ReduceOp::sum);
  return download(backend, buffer);
}

// ---- the objective across parts of a batch ---------------------------------------------

int64_t counted_targets(Backend& backend, const TensorView& targets) {
  int64_t counted = 0;
  for (const double target : download(backend, targets)) {
    counted += target >= 0.0 ? 1 : 0;
  }
  return counted;
}

int64_t counted_targets_over(Backend& backend, Communicator& group, int64_t counted_here) {
  if (group.size() == 1) {
    return counted_here;
  }
  return std::llround(all_reduce_sum(backend, group, {static_cast<double>(counted_here)})[0]);
}

double lm_loss_weight(int64_t counted_here, int64_t counted_total, int64_t parts) {
  if (counted_total == 0) {
    return 0.0;  // nothing counts anywhere: the cross-entropy is 0 and so is its gradient
  }
  // Exact integers in a double: 1 exactly when every part counts the same.
  return static_cast<double>(counted_here * parts) / static_cast<double>(counted_total);
}

StepResult reduce_over_data(Backend& backend, Communicator& data, const StepResult& local,
                            double lm_weight) {
  const double ranks = static_cast<double>(data.size());
  const std::vector<double> sums = all_reduce_sum(
      backend, data,
      {local.lm_loss * lm_weight, local.loss - local.lm_loss, local.router_aux, local.predictor,
       local.predictor_accuracy, local.moe_aux_loss, local.moe_z_loss,
       static_cast<double>(local.moe_dropped), static_cast<double>(local.moe_null)});
  StepResult result = local;
  result.lm_loss = sums[0] / ranks;
  result.loss = result.lm_loss + sums[1] / ranks;
  result.router_aux = sums[2] / ranks;
  result.predictor = sums[3] / ranks;
  result.predictor_accuracy = sums[4] / ranks;
  result.moe_aux_loss = sums[5] / ranks;
  result.moe_z_loss = sums[6] / ranks;
  result.moe_dropped = std::llround(sums[7]);
  result.moe_null = std::llround(sums[8]);
  return result;
}

// ---- ShardedOptimizer ------------------------------------------------------------------

namespace {

// dst = src, converting when the types differ (bf16 gradients into fp32 flats).
void copy_or_convert(Backend& backend, const TensorView& src, const TensorView& dst) {
  if (src.dtype == dst.dtype) {
    backend.copy(src, dst);
  } else {
    backend.convert(src, dst);
  }
}

TensorView flat_view(const TensorView& view) {
  return reshape(view, {view.numel()});
}

}  // namespace

namespace {

std::vector<Parameter*> pointers_to(const ParameterSet& params) {
  std::vector<Parameter*> out;
  for (const auto& p : params.all()) {
    out.push_back(p.get());
  }
  return out;
}

}  // namespace

ShardedOptimizer::ShardedOptimizer(Backend& backend, ParameterSet& params, MemoryTracker* tracker,
                                   Communicator& data_group, int64_t zero_stage,
                                   const AdamWParams& adamw)
    : ShardedOptimizer(backend, pointers_to(params), tracker, data_group, zero_stage, adamw) {}

ShardedOptimizer::ShardedOptimizer(Backend& backend, std::vector<Parameter*> params,
                                   MemoryTracker* tracker, Communicator& data_group,
                                   int64_t zero_stage, const AdamWParams& adamw)
    : backend_(backend),
      params_(std::move(params)),
      tracker_(tracker),
      data_(data_group),
      zero_(zero_stage),
      adamw_(adamw) {
  if (zero_stage < 0 || zero_stage > 2) {
    throw ConfigError("parallel.zero = " + std::to_string(zero_stage) +
                      ": ShardedOptimizer runs ZeRO stages 0, 1 and 2 (stage 3: Zero3Optimizer "
                      "through DataParallelTrainer)");
  }
  const std::vector<Parameter*>& all = params_;
  if (all.empty()) {
    throw ConfigError("data-parallel optimizer: the stage holds no parameters");
  }
  optimizer_type_ = all.front()->optimizer_view().dtype;
  int64_t offset = 0;
  for (const Parameter* p : all) {
    if (p->optimizer_view().dtype != optimizer_type_) {
      throw ShapeError("data-parallel optimizer: parameter " + p->name + " is " +
                       to_string(p->optimizer_view().dtype) + ", the others " +
                       to_string(optimizer_type_));
    }
    offsets_.push_back(offset);
    offset += p->value.numel();
  }
  const int64_t ranks = data_.size();
  shard_numel_ = (offset + ranks - 1) / ranks;
  flat_numel_ = shard_numel_ * ranks;
  if (zero_ == 0) {
    return;
  }
  // This rank's shard [r S, (r + 1) S) of the flattened parameters: master
  // copy and moments here, the parameters' own moments released.
  const Context ctx{backend_, tracker_, optimizer_type_};
  Buffer flat = ctx.zeros({flat_numel_});
  for (size_t i = 0; i < all.size(); ++i) {
    copy_or_convert(backend_, flat_view(all[i]->optimizer_view()),
                    slice(flat.view(), offsets_[i], all[i]->value.numel()));
  }
  shard_master_ = ctx.make({shard_numel_});
  backend_.copy(slice(flat.view(), data_.rank() * shard_numel_, shard_numel_), shard_master_);
  flat.reset();
  shard_m_ = ctx.zeros({shard_numel_});
  shard_v_ = ctx.zeros({shard_numel_});
  for (Parameter* p : all) {
    p->adam_m.reset();
    p->adam_v.reset();
  }
}

ShardedOptimizer::~ShardedOptimizer() = default;

void ShardedOptimizer::flatten_grads(const TensorView& flat) {
  const std::vector<Parameter*>& all = params_;
  const int64_t used = offsets_.back() + all.back()->value.numel();
  if (used < flat_numel_) {
    backend_.fill(slice(flat, used, flat_numel_ - used), 0.0);
  }
  for (size_t i = 0; i < all.size(); ++i) {
    copy_or_convert(backend_, flat_view(all[i]->grad),
                    slice(flat, offsets_[i], all[i]->grad.numel()));
  }
}

void ShardedOptimizer::scatter_params(const TensorView& flat) {
  const std::vector<Parameter*>& all = params_;
  for (size_t i = 0; i < all.size(); ++i) {
    Parameter& p = *all[i];
    const TensorView part = slice(flat, offsets_[i], p.value.numel());
    if (!p.master.empty()) {
      backend_.copy(part, flat_view(p.master));
    }
    copy_or_convert(backend_, part, flat_view(p.value));
  }
}

// ZeRO-0 reduces the gradients as data-parallel frameworks do, in buckets of
// consecutive parameters of one dtype of at most kGradBucketBytes (PyTorch
// DDP's default bucket_cap_mb = 25): one all-reduce per bucket instead of one
// per tensor, so the call count is what the planner's bucketed reduce counts.
// A bucket of one tensor is reduced in place.
void ShardedOptimizer::all_reduce_grads_in_buckets() {
  constexpr int64_t kGradBucketBytes = int64_t{25} << 20;
  const std::vector<Parameter*>& all = params_;
  size_t first = 0;
  while (first < all.size()) {
    const ScalarType type = all[first]->grad.dtype();
    int64_t numel = all[first]->grad.numel();
    size_t end = first + 1;
    while (end < all.size() && all[end]->grad.dtype() == type &&
           (numel + all[end]->grad.numel()) * scalar_bytes(type) <= kGradBucketBytes) {
      numel += all[end]->grad.numel();
      ++end;
    }
    if (end == first + 1) {
      data_.all_reduce(all[first]->grad, ReduceOp::sum);
    } else {
      const Context ctx{backend_, tracker_, type};
      Buffer bucket = ctx.make({numel});
      int64_t at = 0;
      for (size_t i = first; i < end; ++i) {
        const int64_t n = all[i]->grad.numel();
        backend_.copy(flat_view(all[i]->grad), slice(bucket.view(), at, n));
        at += n;
      }
      data_.all_reduce(bucket, ReduceOp::sum);
      at = 0;
      for (size_t i = first; i < end; ++i) {
        const int64_t n = all[i]->grad.numel();
        backend_.copy(slice(bucket.view(), at, n), flat_view(all[i]->grad));
        at += n;
      }
    }
    first = end;
  }
}

void ShardedOptimizer::step(double grad_scale) {
  AdamWParams hyper = adamw_;
  hyper.step = ++step_;
  hyper.grad_scale = adamw_.grad_scale * grad_scale;
  const bool reduce = data_.size() > 1;
  if (zero_ == 0) {
    // Every rank reduces every gradient (in buckets) and updates every parameter.
    if (reduce) {
      all_reduce_grads_in_buckets();
    }
    for (Parameter* p : params_) {
      const TensorView lowp = p->master.empty() ? TensorView{} : p->value.view();
      backend_.adamw_update(p->optimizer_view(), p->grad, p->adam_m, p->adam_v, hyper, lowp);
    }
    return;
  }
  const Context ctx{backend_, tracker_, optimizer_type_};
  Buffer flat = ctx.make({flat_numel_});
  flatten_grads(flat);
  const TensorView mine = slice(flat.view(), data_.rank() * shard_numel_, shard_numel_);
  shard_grad_ = ctx.make({shard_numel_});
  if (zero_ == 1) {
    // ZeRO-1: the full reduced gradient on every rank; the optimizer state
    // and the update are this rank's shard only.
    if (reduce) {
      data_.all_reduce(flat, ReduceOp::sum);
    }
    backend_.copy(mine, shard_grad_);
  } else {
    // ZeRO-2: each rank receives only its shard of the reduced gradient.
    if (reduce) {
      data_.reduce_scatter(flat, shard_grad_);
    } else {
      backend_.copy(mine, shard_grad_);
    }
  }
  backend_.adamw_update(shard_master_, shard_grad_, shard_m_, shard_v_, hyper, TensorView{});
  // The updated shards into every rank's full parameter values.
  if (reduce) {
    data_.all_gather(shard_master_, flat);
  } else {
    backend_.copy(shard_master_, flat);
  }
  scatter_params(flat);
}

std::vector<double> ShardedOptimizer::shard_gradient() const {
  if (shard_grad_.empty()) {
    return {};
  }
  return download(backend_, shard_grad_);
}

// ---- DataParallelTrainer ---------------------------------------------------------------

DataParallelTrainer::DataParallelTrainer(Model& model, Communicator& data_group, int64_t zero_stage)
    : model_(model), data_(data_group) {
  if (zero_stage == 3) {
    zero3_ = std::make_unique<Zero3Optimizer>(model, data_group, model.options().adamw);
  } else {
    optimizer_ = std::make_unique<ShardedOptimizer>(model.backend(), model.parameters(),
                                                    &model.memory_tracker(), data_group,
                                                    zero_stage, model.options().adamw);
  }
}

DataParallelTrainer::~DataParallelTrainer() = default;

ShardedOptimizer& DataParallelTrainer::optimizer() {
  if (!optimizer_) {
    throw std::logic_error("DataParallelTrainer::optimizer(): ZeRO 3 runs a Zero3Optimizer");
  }
  return *optimizer_;
}

Zero3Optimizer& DataParallelTrainer::zero3() {
  if (!zero3_) {
    throw std::logic_error("DataParallelTrainer::zero3(): this trainer runs ZeRO 0-2");
  }
  return *zero3_;
}

StepResult DataParallelTrainer::train_step(const TensorView& tokens, const TensorView& targets) {
  Backend& be = model_.backend();
  if (zero3_) {
    zero3_->reset_parameter_peak();
  }
  const int64_t counted = counted_targets(be, targets);
  const double weight =
      lm_loss_weight(counted, counted_targets_over(be, data_, counted), data_.size());
  const StepResult local = model_.forward_backward(tokens, targets, weight);
  const double ranks = static_cast<double>(data_.size());
  if (zero3_) {
    zero3_->step(1.0 / ranks);
  } else {
    optimizer_->step(1.0 / ranks);
  }
  StepResult result = reduce_over_data(be, data_, local, weight);
  result.peak_bytes = model_.memory().peak_bytes();
  return result;
}

}  // namespace modar::runtime
