// modar/runtime/model.hpp: a whole small model's training step, built from the
// same modar::Config the planner reads (docs/model.md):
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

// ---- the objective of a step ------------------------------------------------------

// The loss terms the layers add during a forward, summed over the layers that
// produced them: a MoD routed layer's router BCE, its predictor's BCE and
// accuracy; an MoE FFN's load-balancing and z losses (also weighted by its
// own coefficients), the assignments it dropped or sent to a null expert.
// Each term is a mean over the rows of the pass that produced it.
struct LayerLosses {
  double router_aux = 0.0, predictor = 0.0, predictor_accuracy = 0.0;
  double moe_aux = 0.0, moe_z = 0.0, moe_weighted = 0.0;
  double moe_dropped = 0.0, moe_null = 0.0;
  void add(const RoutedLayer::Losses& routed);
  void add_moe(const MoeFfn* ffn);  // its last forward's Stats (nullptr: nothing)
  void add(const LayerLosses& other);
  // Every mean term (a sum of per-part means -> their mean); the counts of
  // dropped and null assignments stay totals.
  void scale(double factor);
  // As a vector (for an all-reduce) and back.
  std::vector<double> values() const;
  static LayerLosses from_values(const std::vector<double>& values);
};

// The objective a step minimises, and the StepResult that reports it (the
// single-process model and every parallel trainer use this one formula).  Its
// gradient is what the layers' backward computes: each routed layer's BCE
// enters with the router weight w, each predictor with weight 1, each MoE
// layer with its own coefficients, so
//   loss = lm + w sum_routed aux_l + sum_routed pred_l + sum_moe (alpha aux_l + beta z_l)
// with lm the mean cross-entropy over every counted target of the batch and
// the layer terms means over the batch's rows.  (Formerly the model wrote
// w mean_l(aux_l) x count, the same number rounded twice, and the parallel
// trainers left the MoE terms out.)  router_aux / predictor / accuracy and
// the MoE losses are reported as means over their layers.
StepResult step_result(double lm_loss, const LayerLosses& layers, int64_t routed_layers,
                       int64_t moe_layers, double router_aux_weight);
// w of the formula above: ModelOptions::router_aux_loss_weight when the
// router trains by its auxiliary BCE (mod.causal_router = aux_loss), else 0.
double router_aux_weight(const Config& config, const ModelOptions& options);

// ---- one layer as a model or a pipeline chunk drives it --------------------------

// A layer on the plain residual stream (in place), or, inside AttnRes / DAR,
// one branch at a time on the branch's own input.  ModelLayer is the
// single-process model's layer; the tensor-parallel (Megatron) shard of
// runtime/parallel is another.  Saved is what one micro-batch keeps for its
// backward (a pipeline stage holds several in flight).
class StackLayer {
 public:
  struct Saved {
    virtual ~Saved() = default;
  };
  virtual ~StackLayer() = default;
  virtual std::unique_ptr<Saved> make_saved() const = 0;
  // x [b, s, d] += the layer's delta.  saved == nullptr: inference.
  virtual void forward_inplace(const Context& ctx, const TensorView& x, const TensorView& positions,
                               Saved* saved, LayerLosses& losses) = 0;
  // dx: in = gradient w.r.t. the layer's output, out = w.r.t. its input.
  virtual void backward_inplace(const Context& ctx, const TensorView& dx, Saved& saved) = 0;
  // Branch 0 (attention) or 1 (FFN) on its input h [b, s, d]: y [b, s, d].
  virtual Buffer branch_forward(const Context& ctx, int branch, const TensorView& h,
                                const TensorView& positions, Saved* saved, LayerLosses& losses) = 0;
  // d loss / d h of the branch for dy (branch 1 first, then branch 0).
  virtual Buffer branch_backward(const Context& ctx, int branch, const TensorView& dy,
                                 Saved& saved) = 0;
};

// Layer l of `config` as the single-process model builds it: dense, or
// MoD-routed where mod.is_routed(l); its FFN an MoE FFN where
// moe.is_moe_layer(l) (staged MoDE inside a routed layer).
class ModelLayer final : public StackLayer {
 public:
  ModelLayer(ParameterSet& params, const Context& ctx, const Config& config,
             const ModelOptions& options, int64_t layer, Rng& rng);
  ~ModelLayer() override;
  std::unique_ptr<Saved> make_saved() const override;
  void forward_inplace(const Context& ctx, const TensorView& x, const TensorView& positions,
                       Saved* saved, LayerLosses& losses) override;
  void backward_inplace(const Context& ctx, const TensorView& dx, Saved& saved) override;
  Buffer branch_forward(const Context& ctx, int branch, const TensorView& h,
                        const TensorView& positions, Saved* saved, LayerLosses& losses) override;
  Buffer branch_backward(const Context& ctx, int branch, const TensorView& dy,
                         Saved& saved) override;

  const TransformerLayer* dense() const { return dense_.get(); }  // one of the two is set
  const RoutedLayer* routed() const { return routed_.get(); }
  const MoeFfn* moe() const;  // the MoE FFN, or nullptr

 private:
  struct State;
  std::unique_ptr<TransformerLayer> dense_;
  std::unique_ptr<RoutedLayer> routed_;
  RoutedLayer::Saved inference_;  // a routed branch's selection in inference
};

// ---- a run of consecutive layers over one micro-batch ----------------------------

// What one pass of layers [first, first + layers.size()) needs: the whole
// sequence's positions, the shape of the residual stream here ([b, s, d];
// s / t of a sequence-parallel shard), the AttnRes / DAR bank the branches
// read and write (nullptr: the plain residual), and ZeRO-3's hooks around
// each layer (unit first_unit + layer index).
struct LayerPass {
  const Context& ctx;
  TensorView positions;
  std::vector<int64_t> shape;
  DepthResidual* depth = nullptr;
  ParameterUnitHooks* hooks = nullptr;
  int64_t first_unit = 0;
};
using LayerStates = std::vector<std::unique_ptr<StackLayer::Saved>>;

// Forward: x in place (plain residual), or every layer's two branches through
// pass.depth.  saved: one state per layer, filled (nullptr: inference).
void layers_forward(const LayerPass& pass, const std::vector<StackLayer*>& layers, int64_t first,
                    const TensorView& x, LayerStates* saved, LayerLosses& losses);
// Backward in reverse: dx in place (plain residual), or every branch through
// pass.depth's bank gradients (begin_backward before, finish after: the caller's).
void layers_backward(const LayerPass& pass, const std::vector<StackLayer*>& layers, int64_t first,
                     const TensorView& dx, LayerStates& saved);

class Model {
 public:
  Model(Backend& backend, const Config& config, const ModelOptions& options = {});
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // tokens, targets: i32 [b, s] on the backend (targets -1 = ignored).
  // Zeroes the gradients, runs forward and backward.  lm_loss_weight: the
  // weight of this call's mean cross-entropy in the objective (1: the call
  // holds the whole batch; a data-parallel rank's rows weigh their share of
  // the batch's counted targets times the ranks, runtime/parallel).
  StepResult forward_backward(const TensorView& tokens, const TensorView& targets,
                              double lm_loss_weight = 1.0);
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
  int64_t moe_layers() const;

  // ZeRO-3 (see ParameterUnitHooks above); nullptr: every parameter held.
  const std::vector<ParameterUnit>& parameter_units() const { return units_; }
  void set_parameter_hooks(ParameterUnitHooks* hooks) { hooks_ = hooks; }
  // The MoE FFNs of the MoE layers, in layer order (expert parallelism).
  std::vector<MoeFfn*> moe_ffns();

 private:
  StepResult run(const TensorView& tokens, const TensorView& targets, bool with_backward,
                 double lm_loss_weight);
  // The layers over x [b, s, d] (the embedded tokens): the plain residual in
  // place, or AttnRes / DAR around every branch.  Returns the head's input.
  Buffer layers_forward_pass(Buffer x, const LayerPass& pass, bool with_backward,
                             LayerLosses& losses);
  // dx: the head's input gradient in, the embedding's gradient out.
  void layers_backward_pass(const TensorView& dx, const LayerPass& pass);
  Context context() { return Context{backend_, &tracker_, options_.dtype}; }
  void acquire(int64_t unit, bool values, bool grads) {
    if (hooks_ != nullptr && unit >= 0) {
      hooks_->acquire(unit, values, grads);
    }
  }
  void release(int64_t unit) {
    if (hooks_ != nullptr && unit >= 0) {
      hooks_->release(unit);
    }
  }

  Backend& backend_;
  Config config_;
  ModelOptions options_;
  MemoryTracker tracker_;
  ParameterSet params_;
  Parameter* embedding_ = nullptr;
  std::vector<std::unique_ptr<ModelLayer>> layers_;
  std::vector<StackLayer*> stack_;  // the same layers, as layers_forward takes them
  LayerStates saved_;               // what the last forward kept for its backward
  std::unique_ptr<DepthResidual> depth_;
  std::unique_ptr<LmHead> head_;
  Buffer last_logits_;
  int64_t step_ = 0;
  std::vector<ParameterUnit> units_;
  static constexpr int64_t kEmbeddingUnit = 0;
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
