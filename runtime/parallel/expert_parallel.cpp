// Expert parallelism (include/modar/runtime/parallel_steps.hpp
// ExpertParallelTrainer): the experts of every MoE layer split over an expert
// group carved out of the data group, tokens dispatched to the experts' ranks
// by all-to-all (counts exchanged first) and their outputs combined back.
#include <algorithm>
#include <string>

#include "modar/base/errors.hpp"
#include "modar/runtime/parallel_steps.hpp"

namespace modar::runtime {

namespace {

TensorView rows_of(const TensorView& view, int64_t d, int64_t begin, int64_t count) {
  return slice(reshape(view, {view.numel()}), begin * d, count * d);
}

}  // namespace

// ---- the exchange over the expert group ------------------------------------------------

class ExpertParallelTrainer::Exchange final : public ExpertExchange {
 public:
  Exchange(Backend& backend, Communicator& group, int64_t experts, ExpertTraffic& traffic)
      : backend_(backend),
        group_(group),
        local_experts_(experts / group.size()),
        traffic_(traffic) {}

  int size() const override { return group_.size(); }
  int rank() const override { return group_.rank(); }

  std::vector<int64_t> all_gather_counts(const std::vector<int64_t>& mine) override {
    const auto n = static_cast<int64_t>(mine.size());
    const Context ctx{backend_, nullptr, ScalarType::fp64};
    Buffer in = ctx.make({n});
    const std::vector<double> values(mine.begin(), mine.end());
    backend_.copy_from_host(values.data(), in);
    Buffer out = ctx.make({n * size()});
    group_.all_gather(in, out);
    traffic_.count_bytes += out.view().bytes();
    std::vector<int64_t> all;
    for (double v : download(backend_, out)) {
      all.push_back(static_cast<int64_t>(v));
    }
    return all;
  }

  Plan plan(const std::vector<int64_t>& counts) override {
    const int64_t ranks = size(), e_loc = local_experts_;
    Plan plan;
    plan.send = counts;  // [ranks][e_loc]: expert e of rank j is global expert j e_loc + e
    // The counts all-to-all: chunk j of mine is what rank j's experts get from me.
    const Context ctx{backend_, nullptr, ScalarType::fp64};
    Buffer send = ctx.make({ranks * e_loc});
    Buffer recv = ctx.make({ranks * e_loc});
    const std::vector<double> values(counts.begin(), counts.end());
    backend_.copy_from_host(values.data(), send);
    group_.all_to_all(send, recv);
    traffic_.count_bytes += send.view().bytes();
    int64_t largest = 0;
    for (int64_t j = 0; j < ranks; ++j) {
      int64_t block = 0;
      for (int64_t e = 0; e < e_loc; ++e) {
        block += counts[static_cast<size_t>(j * e_loc + e)];
      }
      largest = std::max(largest, block);
    }
    for (double v : download(backend_, recv)) {
      plan.recv.push_back(static_cast<int64_t>(v));
    }
    // Equal chunks: the group's largest block (one all-reduce of a scalar).
    Buffer chunk = ctx.make({1});
    const double mine = static_cast<double>(largest);
    backend_.copy_from_host(&mine, chunk);
    group_.all_reduce(chunk, ReduceOp::max);
    traffic_.count_bytes += chunk.view().bytes();
    plan.chunk = static_cast<int64_t>(download(backend_, chunk)[0]);
    return plan;
  }

  Buffer dispatch(const Context& ctx, const TensorView& rows, int64_t d,
                  const Plan& plan) override {
    const int64_t ranks = size(), e_loc = local_experts_, c = plan.chunk;
    int64_t local = 0;
    for (int64_t v : plan.recv) {
      local += v;
    }
    if (c == 0) {
      return Buffer{};  // no rows anywhere in the group: every rank skips
    }
    Buffer send = ctx.zeros({ranks * c, d});
    int64_t offset = 0, sent = 0;
    for (int64_t j = 0; j < ranks; ++j) {
      const int64_t block = block_of(plan.send, j);
      if (block > 0) {
        backend_.copy(rows_of(rows, d, offset, block), rows_of(send, d, j * c, block));
      }
      offset += block;
      sent += block;
    }
    Buffer recv = ctx.make({ranks * c, d});
    exchange(send, recv, sent * d);
    send.reset();
    // Local-expert-major: for each of my experts, the rows of every source.
    Buffer out;
    if (local > 0) {
      out = ctx.make({local, d});
      int64_t at = 0;
      for (int64_t e = 0; e < e_loc; ++e) {
        for (int64_t s = 0; s < ranks; ++s) {
          const int64_t n = plan.recv[static_cast<size_t>(s * e_loc + e)];
          if (n > 0) {
            backend_.copy(rows_of(recv, d, s * c + before(plan.recv, s, e), n),
                          rows_of(out, d, at, n));
          }
          at += n;
        }
      }
    }
    return out;
  }

  Buffer combine(const Context& ctx, const TensorView& rows, int64_t d,
                 const Plan& plan) override {
    const int64_t ranks = size(), e_loc = local_experts_, c = plan.chunk;
    if (c == 0) {
      return Buffer{};
    }
    Buffer send = ctx.zeros({ranks * c, d});
    int64_t at = 0;
    for (int64_t e = 0; e < e_loc; ++e) {
      for (int64_t s = 0; s < ranks; ++s) {
        const int64_t n = plan.recv[static_cast<size_t>(s * e_loc + e)];
        if (n > 0) {
          backend_.copy(rows_of(rows, d, at, n),
                        rows_of(send, d, s * c + before(plan.recv, s, e), n));
        }
        at += n;
      }
    }
    Buffer recv = ctx.make({ranks * c, d});
    exchange(send, recv, at * d);
    send.reset();
    int64_t total = 0;
    for (int64_t v : plan.send) {
      total += v;
    }
    Buffer out;
    if (total > 0) {
      out = ctx.make({total, d});
      int64_t offset = 0;
      for (int64_t j = 0; j < ranks; ++j) {
        const int64_t block = block_of(plan.send, j);
        if (block > 0) {
          backend_.copy(rows_of(recv, d, j * c, block), rows_of(out, d, offset, block));
        }
        offset += block;
      }
    }
    return out;
  }

 private:
  int64_t block_of(const std::vector<int64_t>& counts, int64_t j) const {
    int64_t block = 0;
    for (int64_t e = 0; e < local_experts_; ++e) {
      block += counts[static_cast<size_t>(j * local_experts_ + e)];
    }
    return block;
  }
  // Rows of rank s's block that precede its local expert e.
  int64_t before(const std::vector<int64_t>& counts, int64_t s, int64_t e) const {
    int64_t n = 0;
    for (int64_t i = 0; i < e; ++i) {
      n += counts[static_cast<size_t>(s * local_experts_ + i)];
    }
    return n;
  }
  void exchange(const Buffer& send, const Buffer& recv, int64_t payload_elements) {
    group_.all_to_all(send, recv);
    traffic_.all_to_all_calls += 1;
    traffic_.all_to_all_bytes += send.view().bytes();
    traffic_.payload_bytes += payload_elements * scalar_bytes(send.dtype());
  }

  Backend& backend_;
  Communicator& group_;
  int64_t local_experts_;
  ExpertTraffic& traffic_;
};

// ---- the trainer ---------------------------------------------------------------------------

ExpertParallelTrainer::ExpertParallelTrainer(Model& model, Communicator& data_group, int64_t expert,
                                             int64_t zero_stage)
    : model_(model), data_(data_group) {
  const int64_t dp = data_group.size();
  const int64_t experts = model.config().moe.experts;
  if (expert < 1 || dp % expert != 0) {
    throw ConfigError("parallel.expert = " + std::to_string(expert) +
                      ": must divide the data-parallel group's " + std::to_string(dp) + " ranks");
  }
  if (experts < 1 || experts % expert != 0) {
    throw ConfigError("moe.experts = " + std::to_string(experts) +
                      ": must be a multiple of parallel.expert = " + std::to_string(expert));
  }
  // Expert group: ep consecutive data ranks; expert-data group: the ranks
  // holding the same experts (Megatron-Core's carving of the data group).
  const int r = data_group.rank();
  const int ep = static_cast<int>(expert);
  expert_ = data_group.split(r / ep, r % ep);
  expert_data_ = data_group.split(r % ep, r / ep);
  exchange_ = std::make_unique<Exchange>(model.backend(), *expert_, experts, traffic_);
  const Context ctx{model.backend(), &model.memory_tracker(), model.options().dtype};
  for (MoeFfn* ffn : model.moe_ffns()) {
    ffn->shard_experts(ctx, expert_->rank(), ep);
    ffn->set_expert_exchange(exchange_.get());
    for (Parameter* p : ffn->expert_parameters()) {
      expert_params_.push_back(p);
    }
    ffns_.push_back(ffn);
  }
  // The optimizer over two groups: the experts' gradients already hold every
  // token of the expert group, so they are summed (and their ZeRO state
  // sharded) over the expert-data group; everything else over the data group.
  const AdamWParams& adamw = model.options().adamw;
  if (zero_stage == 3) {
    zero3_ = std::make_unique<Zero3Optimizer>(model, data_group, adamw, expert_data_.get(),
                                              expert_params_);
    return;
  }
  std::vector<Parameter*> dense;
  for (const auto& p : model.parameters().all()) {
    if (!is_expert_parameter(p.get())) {
      dense.push_back(p.get());
    }
  }
  dense_optimizer_ = std::make_unique<ShardedOptimizer>(
      model.backend(), dense, &model.memory_tracker(), data_group, zero_stage, adamw);
  if (!expert_params_.empty()) {
    expert_optimizer_ = std::make_unique<ShardedOptimizer>(
        model.backend(), expert_params_, &model.memory_tracker(), *expert_data_, zero_stage, adamw);
  }
}

ExpertParallelTrainer::~ExpertParallelTrainer() {
  for (MoeFfn* ffn : ffns_) {
    ffn->set_expert_exchange(nullptr);
  }
}

bool ExpertParallelTrainer::is_expert_parameter(const Parameter* p) const {
  return std::find(expert_params_.begin(), expert_params_.end(), p) != expert_params_.end();
}

StepResult ExpertParallelTrainer::train_step(const TensorView& tokens, const TensorView& targets) {
  Backend& be = model_.backend();
  const int64_t counted = counted_targets(be, targets);
  const double weight =
      lm_loss_weight(counted, counted_targets_over(be, data_, counted), data_.size());
  const StepResult local = model_.forward_backward(tokens, targets, weight);
  // Both sums (expert-data group, data group) are over all dp ranks' means.
  const double scale = 1.0 / static_cast<double>(data_.size());
  if (zero3_) {
    zero3_->step(scale);
  } else {
    dense_optimizer_->step(scale);
    if (expert_optimizer_) {
      expert_optimizer_->step(scale);
    }
  }
  StepResult result = reduce_over_data(be, data_, local, weight);
  result.peak_bytes = model_.memory().peak_bytes();
  return result;
}

}  // namespace modar::runtime
