// ZeRO stage 3 over the data group (include/modar/runtime/parallel_steps.hpp
// Zero3Optimizer): each parameter unit of the Model (model.hpp) sharded over
// the data ranks (under expert parallelism its experts over the expert-data
// ranks), gathered right before its use and its gradients reduce-scattered
// right after its backward.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "modar/base/errors.hpp"
#include "modar/runtime/parallel_steps.hpp"

namespace modar::runtime {

// One sharded part of a parameter unit: its parameters over one group (the
// data group; under expert parallelism the experts over the expert-data group).
struct Zero3Optimizer::Unit {
  std::string name;
  Communicator* group = nullptr;
  std::vector<Parameter*> params;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<int64_t> offsets;  // flat offset of each parameter in the unit
  ScalarType dtype = ScalarType::fp32;
  int64_t numel = 0, shard = 0;  // shard = ceil(numel / dp); flat = shard * dp
  Buffer master, m, v, grad;     // this rank's shard
  bool has_values = false, has_grads = false, reduced = false;
};

namespace {

TensorView flat_of(const TensorView& view) {
  return reshape(view, {view.numel()});
}

}  // namespace

Zero3Optimizer::Zero3Optimizer(Model& model, Communicator& data_group, const AdamWParams& adamw,
                               Communicator* expert_data_group,
                               const std::vector<Parameter*>& expert_params)
    : model_(model), adamw_(adamw) {
  const auto& all = model_.parameters().all();
  for (const ParameterUnit& pu : model_.parameter_units()) {
    std::vector<Parameter*> dense, experts;
    for (int64_t i = pu.begin; i < pu.end; ++i) {
      Parameter* p = all[static_cast<size_t>(i)].get();
      if (!p->master.empty()) {
        throw ConfigError("train.dtype = " + std::string(to_string(p->value.dtype())) +
                          ": the runtime's ZeRO-3 (parallel.zero = 3) shards parameters whose "
                          "values are their own master copy (fp32, fp64)");
      }
      const bool expert =
          expert_data_group != nullptr &&
          std::find(expert_params.begin(), expert_params.end(), p) != expert_params.end();
      (expert ? experts : dense).push_back(p);
    }
    parts_.emplace_back();
    for (auto* list : {&dense, &experts}) {
      if (!list->empty()) {
        parts_.back().push_back(units_.size());
        add_part(pu.name, list == &dense ? data_group : *expert_data_group, *list);
      }
    }
  }
  parameter_memory_.reset_peak();
  model_.set_parameter_hooks(this);
}

void Zero3Optimizer::add_part(const std::string& name, Communicator& group,
                              const std::vector<Parameter*>& params) {
  Backend& be = model_.backend();
  auto unit = std::make_unique<Unit>();
  unit->name = name;
  unit->group = &group;
  for (Parameter* p : params) {
    if (!unit->params.empty() && p->value.dtype() != unit->dtype) {
      throw ShapeError("ZeRO-3: parameter " + p->name + " is " + to_string(p->value.dtype()) +
                       ", the rest of unit " + name + " " + to_string(unit->dtype));
    }
    unit->dtype = p->value.dtype();
    unit->params.push_back(p);
    unit->shapes.push_back(p->value.view().shape_vector());
    unit->offsets.push_back(unit->numel);
    unit->numel += p->value.numel();
  }
  const int64_t ranks = group.size();
  unit->shard = (unit->numel + ranks - 1) / ranks;
  // This rank's shard [r S, (r + 1) S) of the part's flattened values.
  const Context ctx{be, &model_.memory_tracker(), unit->dtype};
  {
    Buffer flat = ctx.zeros({unit->shard * ranks});
    for (size_t i = 0; i < unit->params.size(); ++i) {
      be.copy(flat_of(unit->params[i]->value),
              slice(flat.view(), unit->offsets[i], unit->params[i]->value.numel()));
    }
    unit->master = ctx.make({unit->shard});
    be.copy(slice(flat.view(), group.rank() * unit->shard, unit->shard), unit->master);
  }
  unit->m = ctx.zeros({unit->shard});
  unit->v = ctx.zeros({unit->shard});
  unit->grad = ctx.zeros({unit->shard});
  parameter_memory_.on_allocate(unit->master.view().bytes());
  // The model's full copies go: values, gradients, moments.
  for (Parameter* p : unit->params) {
    p->value.reset();
    p->grad.reset();
    p->adam_m.reset();
    p->adam_v.reset();
  }
  units_.push_back(std::move(unit));
}

Zero3Optimizer::~Zero3Optimizer() {
  model_.set_parameter_hooks(nullptr);
}

int64_t Zero3Optimizer::unit_numel(int64_t unit) const {
  int64_t numel = 0;
  for (const size_t part : parts_.at(static_cast<size_t>(unit))) {
    numel += units_[part]->numel;
  }
  return numel;
}

int64_t Zero3Optimizer::unit_shard_numel(int64_t unit) const {
  int64_t shard = 0;
  for (const size_t part : parts_.at(static_cast<size_t>(unit))) {
    shard += units_[part]->shard;
  }
  return shard;
}

void Zero3Optimizer::acquire(int64_t index, bool values, bool grads) {
  for (const size_t part : parts_.at(static_cast<size_t>(index))) {
    acquire_part(*units_[part], values, grads);
  }
}

void Zero3Optimizer::release(int64_t index) {
  for (const size_t part : parts_.at(static_cast<size_t>(index))) {
    release_part(*units_[part]);
  }
}

void Zero3Optimizer::acquire_part(Unit& unit, bool values, bool grads) {
  Backend& be = model_.backend();
  const Context ctx{be, &model_.memory_tracker(), unit.dtype};
  Communicator& group = *unit.group;
  const int64_t ranks = group.size();
  if (values && !unit.has_values) {
    // All-gather the shards into a staging buffer, then into the values.
    Buffer flat = ctx.make({unit.shard * ranks});
    if (ranks > 1) {
      group.all_gather(unit.master, flat);
      traffic_.all_gather_bytes += flat.view().bytes();
      traffic_.all_gather_calls += 1;
      if (unit.name.rfind("layer", 0) == 0) {
        traffic_.layer_gather_bytes += flat.view().bytes();
      }
    } else {
      be.copy(unit.master, flat);
    }
    for (size_t i = 0; i < unit.params.size(); ++i) {
      Parameter& p = *unit.params[i];
      p.value = ctx.make(unit.shapes[i]);
      be.copy(slice(flat.view(), unit.offsets[i], p.value.numel()), flat_of(p.value));
    }
    unit.has_values = true;
    parameter_memory_.on_allocate(unit.numel * scalar_bytes(unit.dtype));
  }
  if (grads && !unit.has_grads) {
    for (size_t i = 0; i < unit.params.size(); ++i) {
      unit.params[i]->grad = ctx.zeros(unit.shapes[i]);
    }
    unit.has_grads = true;
  }
}

void Zero3Optimizer::release_part(Unit& unit) {
  Backend& be = model_.backend();
  const Context ctx{be, &model_.memory_tracker(), unit.dtype};
  Communicator& group = *unit.group;
  const int64_t ranks = group.size();
  if (unit.has_grads) {
    // Reduce-scatter the unit's gradients into this rank's shard.
    Buffer flat = ctx.make({unit.shard * ranks});
    const int64_t padding = unit.shard * ranks - unit.numel;
    if (padding > 0) {
      be.fill(slice(flat.view(), unit.numel, padding), 0.0);
    }
    for (size_t i = 0; i < unit.params.size(); ++i) {
      Parameter& p = *unit.params[i];
      be.copy(flat_of(p.grad), slice(flat.view(), unit.offsets[i], p.grad.numel()));
      p.grad.reset();
    }
    Buffer reduced = ctx.make({unit.shard});
    if (ranks > 1) {
      group.reduce_scatter(flat, reduced);
      traffic_.reduce_scatter_bytes += flat.view().bytes();
      traffic_.reduce_scatter_calls += 1;
    } else {
      be.copy(flat, reduced);
    }
    if (unit.reduced) {
      be.axpy(1.0, reduced, unit.grad);  // a second backward of the unit in this step
    } else {
      be.copy(reduced, unit.grad);
    }
    unit.reduced = true;
    unit.has_grads = false;
  }
  if (unit.has_values) {
    for (Parameter* p : unit.params) {
      p->value.reset();
    }
    unit.has_values = false;
    parameter_memory_.on_release(unit.numel * scalar_bytes(unit.dtype));
  }
}

void Zero3Optimizer::step(double grad_scale) {
  AdamWParams hyper = adamw_;
  hyper.step = ++step_;
  hyper.grad_scale = adamw_.grad_scale * grad_scale;
  for (const auto& unit : units_) {
    if (unit->has_values || unit->has_grads) {
      throw std::logic_error("ZeRO-3 step: unit " + unit->name + " is still held");
    }
    if (!unit->reduced) {
      throw std::logic_error("ZeRO-3 step: unit " + unit->name + " has no reduced gradient");
    }
  }
  for (const auto& unit : units_) {
    model_.backend().adamw_update(unit->master, unit->grad, unit->m, unit->v, hyper,
                                  TensorView{});
    unit->reduced = false;
  }
}

std::vector<double> Zero3Optimizer::shard_gradient(int64_t unit) const {
  std::vector<double> out;
  for (const size_t part : parts_.at(static_cast<size_t>(unit))) {
    const std::vector<double> g = download(model_.backend(), units_[part]->grad);
    out.insert(out.end(), g.begin(), g.end());
  }
  return out;
}

}  // namespace modar::runtime
