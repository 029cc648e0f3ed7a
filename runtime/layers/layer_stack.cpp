// runtime/layers/layer_stack.cpp: what the single-process model and every
// parallel trainer share of a step (include/modar/runtime/model.hpp): the
// objective's one formula (step_result), the model's layer as a StackLayer
// (ModelLayer), and the loops that drive a run of layers over one micro-batch
// on the plain residual stream or branch by branch through AttnRes / DAR.
#include <cmath>
#include <string>

#include "modar/runtime/model.hpp"

namespace modar::runtime {

// ---- the objective ------------------------------------------------------------------

void LayerLosses::add(const RoutedLayer::Losses& routed) {
  router_aux += routed.router_aux;
  predictor += routed.predictor;
  predictor_accuracy += routed.predictor_accuracy;
}

void LayerLosses::add_moe(const MoeFfn* ffn) {
  if (ffn == nullptr) {
    return;
  }
  const MoeFfn::Stats& stats = ffn->last_stats();
  moe_aux += stats.aux_loss;
  moe_z += stats.z_loss;
  moe_weighted +=
      ffn->options().aux_loss_coef * stats.aux_loss + ffn->options().z_loss_coef * stats.z_loss;
  moe_dropped += static_cast<double>(stats.dropped);
  moe_null += static_cast<double>(stats.null_assignments);
}

std::vector<double> LayerLosses::values() const {
  return {router_aux, predictor,    predictor_accuracy, moe_aux,
          moe_z,      moe_weighted, moe_dropped,        moe_null};
}

LayerLosses LayerLosses::from_values(const std::vector<double>& v) {
  LayerLosses out;
  out.router_aux = v.at(0);
  out.predictor = v.at(1);
  out.predictor_accuracy = v.at(2);
  out.moe_aux = v.at(3);
  out.moe_z = v.at(4);
  out.moe_weighted = v.at(5);
  out.moe_dropped = v.at(6);
  out.moe_null = v.at(7);
  return out;
}

void LayerLosses::add(const LayerLosses& other) {
  const std::vector<double> a = values(), b = other.values();
  std::vector<double> sum(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    sum[i] = a[i] + b[i];
  }
  *this = from_values(sum);
}

void LayerLosses::scale(double factor) {
  router_aux *= factor;
  predictor *= factor;
  predictor_accuracy *= factor;
  moe_aux *= factor;
  moe_z *= factor;
  moe_weighted *= factor;
}

double router_aux_weight(const Config& config, const ModelOptions& options) {
  return config.mod.causal_router == CausalRouter::aux_loss ? options.router_aux_loss_weight : 0.0;
}

StepResult step_result(double lm_loss, const LayerLosses& layers, int64_t routed_layers,
                       int64_t moe_layers, double router_aux_weight) {
  StepResult result;
  result.lm_loss = lm_loss;
  result.loss =
      lm_loss + router_aux_weight * layers.router_aux + layers.predictor + layers.moe_weighted;
  if (routed_layers > 0) {
    const double n = static_cast<double>(routed_layers);
    result.router_aux = layers.router_aux / n;
    result.predictor = layers.predictor / n;
    result.predictor_accuracy = layers.predictor_accuracy / n;
  }
  if (moe_layers > 0) {
    result.moe_aux_loss = layers.moe_aux / static_cast<double>(moe_layers);
    result.moe_z_loss = layers.moe_z / static_cast<double>(moe_layers);
  }
  result.moe_dropped = static_cast<int64_t>(std::llround(layers.moe_dropped));
  result.moe_null = static_cast<int64_t>(std::llround(layers.moe_null));
  return result;
}

Buffer sequence_positions(const Context& ctx, int64_t batch, int64_t seq) {
  std::vector<int32_t> values(static_cast<size_t>(batch * seq));
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = static_cast<int32_t>(static_cast<int64_t>(i) % seq);
  }
  return ctx.indices({batch, seq}, values);
}

// ---- the model's layer --------------------------------------------------------------

struct ModelLayer::State final : StackLayer::Saved {
  TransformerLayer::Saved dense;  // the whole dense layer, or a dense FFN branch
  RoutedLayer::Saved routed;
  AttentionBranch::Saved attention;  // a dense attention branch (AttnRes / DAR)
};

ModelLayer::ModelLayer(ParameterSet& params, const Context& ctx, const Config& config,
                       const ModelOptions& options, int64_t layer, Rng& rng) {
  const ModelConfig& m = config.model;
  BranchShape shape = BranchShape::from(m);
  shape.rope_theta = options.rope_theta;
  // GPT-2: output projections N(0, (0.02 / sqrt(2L))^2).
  const double out_std = 0.02 / std::sqrt(2.0 * static_cast<double>(m.n_layers));
  const std::string prefix = "layer" + std::to_string(layer);
  // [moe]: the FFN is an MoE FFN iff moe.is_moe_layer(l); inside a MoD routed
  // block that is staged MoDE, with null experts integrated MoDE.
  const MoeOptions moe = MoeOptions::from(config.moe, m);
  const MoeOptions* layer_moe = config.moe.is_moe_layer(layer) ? &moe : nullptr;
  if (config.mod.is_routed(layer)) {
    RoutingOptions routing = RoutingOptions::from(config.mod);
    routing.aux_loss_weight = options.router_aux_loss_weight;
    routing.unit_gate = options.unit_router_gate;
    routed_ =
        std::make_unique<RoutedLayer>(params, ctx, prefix, shape, routing, rng, out_std, layer_moe);
  } else {
    dense_ =
        std::make_unique<TransformerLayer>(params, ctx, prefix, shape, rng, out_std, layer_moe);
  }
}

ModelLayer::~ModelLayer() = default;

const MoeFfn* ModelLayer::moe() const {
  return dense_ ? dense_->moe() : routed_->core().moe();
}

std::unique_ptr<StackLayer::Saved> ModelLayer::make_saved() const {
  return std::make_unique<State>();
}

void ModelLayer::forward_inplace(const Context& ctx, const TensorView& x,
                                 const TensorView& positions, Saved* saved, LayerLosses& losses) {
  State* st = static_cast<State*>(saved);
  if (dense_) {
    dense_->forward_inplace(ctx, x, positions, st != nullptr ? &st->dense : nullptr);
  } else {
    losses.add(routed_->forward_inplace(ctx, x, st != nullptr ? &st->routed : nullptr));
  }
  losses.add_moe(moe());
}

void ModelLayer::backward_inplace(const Context& ctx, const TensorView& dx, Saved& saved) {
  State& st = static_cast<State&>(saved);
  if (dense_) {
    dense_->backward_inplace(ctx, dx, st.dense);
  } else {
    routed_->backward_inplace(ctx, dx, st.routed);
  }
}

Buffer ModelLayer::branch_forward(const Context& ctx, int branch, const TensorView& h,
                                  const TensorView& positions, Saved* saved, LayerLosses& losses) {
  State* st = static_cast<State*>(saved);
  if (routed_) {
    // Branch 0 routes (and fills the selection both branches use).
    RoutedLayer::Saved& selection = st != nullptr ? st->routed : inference_;
    RoutedLayer::Losses routed;
    Buffer y = routed_->branch_forward(ctx, branch, h, selection, &routed);
    if (branch == 0) {
      losses.add(routed);
    } else {
      losses.add_moe(moe());
    }
    return y;
  }
  if (branch == 0) {
    return dense_->attention().forward(ctx, h, positions, TensorView{},
                                       st != nullptr ? &st->attention : nullptr);
  }
  Buffer y = dense_->ffn_forward(ctx, h, st != nullptr ? &st->dense : nullptr);
  losses.add_moe(moe());
  return y;
}

Buffer ModelLayer::branch_backward(const Context& ctx, int branch, const TensorView& dy,
                                   Saved& saved) {
  State& st = static_cast<State&>(saved);
  Buffer dh = ctx.zeros(dy.shape_vector());
  if (routed_) {
    routed_->branch_backward(ctx, branch, dy, st.routed, dh);
  } else if (branch == 0) {
    dense_->attention().backward(ctx, dy, st.attention, dh);
  } else {
    dense_->ffn_backward(ctx, dy, st.dense, dh);
  }
  return dh;
}

// ---- a run of layers ----------------------------------------------------------------

void layers_forward(const LayerPass& pass, const std::vector<StackLayer*>& layers, int64_t first,
                    const TensorView& x, LayerStates* saved, LayerLosses& losses) {
  const Context& ctx = pass.ctx;
  for (size_t i = 0; i < layers.size(); ++i) {
    const int64_t layer = first + static_cast<int64_t>(i);
    StackLayer::Saved* state = saved != nullptr ? (*saved)[i].get() : nullptr;
    if (pass.hooks != nullptr) {
      pass.hooks->acquire(pass.first_unit + layer, true, false);
    }
    if (pass.depth == nullptr) {
      layers[i]->forward_inplace(ctx, x, pass.positions, state, losses);
    } else {
      for (int branch = 0; branch < 2; ++branch) {
        const int64_t index = 2 * layer + branch;
        const TensorView h = reshape(pass.depth->read(ctx, index), pass.shape);
        Buffer y = layers[i]->branch_forward(ctx, branch, h, pass.positions, state, losses);
        pass.depth->write(ctx, index, y);
      }
    }
    if (pass.hooks != nullptr) {
      pass.hooks->release(pass.first_unit + layer);
    }
  }
}

void layers_backward(const LayerPass& pass, const std::vector<StackLayer*>& layers, int64_t first,
                     const TensorView& dx, LayerStates& saved) {
  const Context& ctx = pass.ctx;
  for (size_t i = layers.size(); i-- > 0;) {
    const int64_t layer = first + static_cast<int64_t>(i);
    if (pass.hooks != nullptr) {
      pass.hooks->acquire(pass.first_unit + layer, true, true);
    }
    if (pass.depth == nullptr) {
      layers[i]->backward_inplace(ctx, dx, *saved[i]);
    } else {
      for (int branch = 1; branch >= 0; --branch) {
        const int64_t index = 2 * layer + branch;
        const TensorView dy = reshape(pass.depth->write_backward(ctx, index), pass.shape);
        Buffer dh = layers[i]->branch_backward(ctx, branch, dy, *saved[i]);
        pass.depth->read_backward(ctx, index, dh);
      }
    }
    if (pass.hooks != nullptr) {
      pass.hooks->release(pass.first_unit + layer);
    }
  }
}

}  // namespace modar::runtime
