// modar/runtime/model.hpp: a whole small model's training step, built from the
// same modar::Config the planner reads (SPEC section 1):
//
//   tokens -> embedding -> L layers -> final RMSNorm -> LM head (tied or untied)
//          -> cross-entropy;  backward;  AdamW.
//
// Layers: dense, or MoD-routed where config.mod.is_routed(l) (capacity, g(r),
// auxiliary loss / predictor from [mod]); the FFN is an MoE FFN where
// config.moe.is_moe_layer(l) ([moe]: staged MoDE inside routed blocks,
// integrated MoDE with null experts).  Residual: the plain residual stream,
// or AttnRes / DAR (config.dar.*) around every branch (layers.hpp
// DepthResidual).  MoD inside an AttnRes / DAR model routes each branch of a
// routed layer: the router reads the layer's attention-branch input h, both
// branches run on the same top-k tokens of their own inputs, and each branch's
// output is g(r) f(h~) at the routed tokens and 0 elsewhere.
//
// Initialisation is deterministic from ModelOptions::seed (GPT-2 style: matrix
// weights N(0, 0.02^2), output projections N(0, (0.02 / sqrt(2L))^2), norms 1).
// Every byte the model allocates is counted, so a step reports its peak bytes
// (parameters + gradients + AdamW state + activations + transients).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "modar/config.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/layers.hpp"

namespace modar::runtime {

struct ModelOptions {
  ScalarType dtype = ScalarType::fp32;  // activations / weights (fp64 for gradient checks)
  uint64_t seed = 1;
  double rope_theta = 10000.0;
  double router_aux_loss_weight = 0.01;
  bool unit_router_gate = false;  // g(r) = 1 (identity checks only, see RoutingOptions)
  AdamWParams adamw;              // .step is managed by the model
};

struct StepResult {
  double loss = 0.0;        // the optimised objective: lm + weighted router aux + predictor BCE
  double lm_loss = 0.0;     // mean cross-entropy
  double router_aux = 0.0;  // mean over routed layers of the router BCE (unweighted)
  double predictor = 0.0;   // mean over routed layers of the predictor BCE
  double predictor_accuracy = 0.0;
  // MoE layers ([moe]): the mean over MoE
  // layers of the unweighted load-balancing and z losses (their weighted sum
  // is part of `loss`), and the assignments dropped (over capacity) or routed
  // to a null expert, summed over layers.
  double moe_aux_loss = 0.0;
  double moe_z_loss = 0.0;
  int64_t moe_dropped = 0;
  int64_t moe_null = 0;
  int64_t peak_bytes = 0;  // peak bytes held during the step
  double step_s = 0.0;     // wall time of the step (measure_training_step only)
};

// Parameter units (ZeRO-3, runtime/parallel): the model's parameters in
// contiguous ranges of ParameterSet::all(), in order: the embedding, one unit
// per layer, the AttnRes / DAR depth residual (when enabled), and the final
// norm + head.  With hooks set, Model::run acquires a unit right before its
// use and releases it right after, instead of holding every parameter:
//   forward   embedding | layer 0 .. L-1 (depth held around all of them) |
//             final norm + head (+ the embedding when tied)
//   backward  final norm + head (+ tied embedding, held to the end) |
//             layer L-1 .. 0 (depth held around them, its recompute too) |
//             the embedding's gradient (values not needed when untied)
// The final norm + head unit is not released between the forward and the
// backward of a training step.  run() does not zero the gradients then (the
// hooks hand out zeroed ones), and optimizer_step() refuses to run.
struct ParameterUnit {
  std::string name;  // "embedding", "layer<l>", "depth", "head"
  int64_t begin = 0, end = 0;  // [begin, end) of parameters().all()
};
class ParameterUnitHooks {
 public:
  virtual ~ParameterUnitHooks() = default;
  // values: the unit's Parameter::value buffers must be present; grads: its
  // Parameter::grad buffers too (zeroed when handed out for the step).
  virtual void acquire(int64_t unit, bool values, bool grads) = 0;
  // The model is done with the unit: values may go, gradients are complete.
  virtual void release(int64_t unit) = 0;
};

class Model {
 public:
  Model(Backend& backend, const Config& config, const ModelOptions& options = {});
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // tokens, targets: i32 [b, s] on the backend (targets -1 = ignored).
  // Zeroes the gradients, runs forward and backward.
  StepResult forward_backward(const TensorView& tokens, const TensorView& targets);
  // Forward only (nothing saved for backward).
  StepResult evaluate(const TensorView& tokens, const TensorView& targets);
  void optimizer_step();
  // forward_backward + optimizer_step; peak_bytes covers all of it.
  StepResult train_step(const TensorView& tokens, const TensorView& targets);

  // Autoregressive decoding, one sequence, plain-residual models (dense and MoD
  // layers; AttnRes / DAR decoding is not implemented: ConfigError).  Each
  // layer keeps a KV cache; a routed layer routes a token iff
  // sigmoid(logit) > 0.5 (predictor or router) and caches routed tokens only.
  struct DecodeState {
    std::vector<KvCache> caches;  // one per layer
    int64_t position = 0;
  };
  DecodeState begin_decode(int64_t max_tokens) const;
  // Feeds `token` at the next position; returns the next-token logits [V].
  std::vector<double> decode_step(DecodeState& state, int32_t token) const;

  // Host ids -> an i32 [b, s] tensor on this model's backend (not counted).
  Buffer make_tokens(const std::vector<int32_t>& ids, int64_t batch, int64_t seq) const;
  // Logits [b * s, V] of the last evaluate() / forward_backward() call.
  std::vector<double> last_logits() const;

  ParameterSet& parameters() { return params_; }
  const Config& config() const { return config_; }
  const MemoryTracker& memory() const { return tracker_; }
  // For buffers held on the model's behalf (runtime/parallel: sharded optimizer state).
  MemoryTracker& memory_tracker() { return tracker_; }
  const ModelOptions& options() const { return options_; }
  Backend& backend() const { return backend_; }
  int64_t routed_layers() const;

  // ZeRO-3 (see ParameterUnitHooks above); nullptr: every parameter held.
  const std::vector<ParameterUnit>& parameter_units() const { return units_; }
  void set_parameter_hooks(ParameterUnitHooks* hooks) { hooks_ = hooks; }
  // The MoE FFNs of the MoE layers, in layer order (expert parallelism).
  std::vector<MoeFfn*> moe_ffns();

 private:
  struct LayerSlot;
  StepResult run(const TensorView& tokens, const TensorView& targets, bool with_backward);
  Context context() { return Context{backend_, &tracker_, options_.dtype}; }

  Backend& backend_;
  Config config_;
  ModelOptions options_;
  MemoryTracker tracker_;
  ParameterSet params_;
  Parameter* embedding_ = nullptr;
  Parameter* final_norm_ = nullptr;
  Parameter* head_ = nullptr;  // null when tied
  std::vector<std::unique_ptr<LayerSlot>> layers_;
  std::unique_ptr<DepthResidual> depth_;
  Buffer last_logits_;
  int64_t step_ = 0;
  std::vector<ParameterUnit> units_;
  int64_t layer_unit0_ = 1, depth_unit_ = -1, head_unit_ = -1;
  ParameterUnitHooks* hooks_ = nullptr;
};

// Build the model of `config` on `backend` (dtype config.train.dtype, batch
// config.train.micro_batch, sequence config.model.seq_len), run `warmup`
// training steps and then one measured step on deterministic synthetic tokens.
// Returns that step's result: peak_bytes (parameters + gradients + AdamW state
// + activations + transients, as allocated by the model) and step_s (backend
// timer).  This is what `modar validate` compares with the cost model.
StepResult measure_training_step(Backend& backend, const Config& config, int warmup = 1,
                                 uint64_t seed = 1);

}  // namespace modar::runtime
