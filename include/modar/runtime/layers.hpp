// modar/runtime/layers.hpp: the reference runtime's layers, built ONLY on the
// Backend interface (backend.hpp), so the same code runs on the CPU (Eigen)
// and CUDA backends.  Maths: docs/model.md and docs/dar_math.md.
//
// Pieces (each with forward and backward; backward ACCUMULATES into the
// parameter gradients, like every backend op):
//
//  * Buffer / MemoryTracker  a Tensor whose bytes are counted, so a model step
//    can report the peak bytes it held (compared with the cost model's memory
//    estimate by `modar validate`).  Every allocation of the layers and the
//    model goes through a Buffer.
//  * Parameter / ParameterSet  value + gradient (+ fp32 master when the value is
//    bf16) + AdamW moments; deterministic initialisation from a seed.
//  * AttentionBranch, MlpBranch  y = f(RMSNorm(h)): pre-norm causal attention
//    (RoPE at given positions, GQA, per-sequence valid lengths) and the GELU /
//    SwiGLU MLP.  Weights are [in, out]: y = x W.
//  * TransformerLayer  both branches on the plain residual stream:
//        a = Attn(RMSNorm(x)),  m = MLP(RMSNorm(x + a)),  delta = a + m,
//        out = x + delta.
//    delta is formed first and added once, so the MoD routed layer with unit
//    gate and capacity 1 reproduces this layer bit for bit (see RoutedLayer).
//  * RoutedLayer  the MoD block (docs/model.md MoD): r = w_r . x, per-sequence top-k
//    (ascending, ties to the lower position), gather, the layer's branches on
//    the k tokens with RoPE at their ORIGINAL positions, delta = a + m (never
//    X~ again), scatter x_i += g(r_i) delta_i.  Router gradient through g(r).
//    Optional BCE auxiliary loss on the router logits and a predictor MLP
//    (stop-gradient input, one GELU hidden layer) trained by BCE on the top-k
//    mask.  Decode: route iff sigmoid(logit) > 0.5 with a KV cache that holds
//    routed tokens only.
//  * DepthResidual  AttnRes (n = 1) and DAR (n >= 2, variants dar / selfkv /
//    fixedkv / crossv) around arbitrary branches, two-phase (prefix read once
//    per block + closed-form merge of the partial), mHC-style coefficient heads.
//    It owns the history bank; the model drives it branch by branch.
//  * LmHead  final RMSNorm, the head GEMM (untied, or the tied embedding) and
//    the cross-entropy: the one head of the single-process model and of every
//    parallel trainer.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "modar/config.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/tensor.hpp"

namespace modar::runtime {

// ---- memory accounting -------------------------------------------------------

class MemoryTracker {
 public:
  void on_allocate(int64_t bytes);
  void on_release(int64_t bytes);
  int64_t live_bytes() const { return live_bytes_; }
  int64_t peak_bytes() const { return peak_bytes_; }
  // Start a new peak measurement from the bytes live now.
  void reset_peak() { peak_bytes_ = live_bytes_; }

 private:
  int64_t live_bytes_ = 0;
  int64_t peak_bytes_ = 0;
};

// A Tensor whose bytes are counted by a MemoryTracker (nullptr: not counted).
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend& backend, MemoryTracker* tracker, const std::vector<int64_t>& shape,
         ScalarType dtype);
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  const TensorView& view() const { return tensor_.view(); }
  operator const TensorView&() const { return tensor_.view(); }  // NOLINT
  bool empty() const { return tensor_.empty(); }
  int64_t dim(int i) const { return tensor_.dim(i); }
  int64_t numel() const { return tensor_.numel(); }
  ScalarType dtype() const { return tensor_.dtype(); }
  void reset();

 private:
  void release() noexcept;
  Tensor tensor_;
  MemoryTracker* tracker_ = nullptr;
};

// What every layer call needs: the backend, the tracker, the compute dtype.
struct Context {
  Backend& backend;
  MemoryTracker* tracker = nullptr;
  ScalarType dtype = ScalarType::fp32;  // activations and matrix weights

  ScalarType stats() const { return stats_type(dtype); }
  Buffer make(const std::vector<int64_t>& shape, ScalarType type) const;
  Buffer make(const std::vector<int64_t>& shape) const { return make(shape, dtype); }
  Buffer zeros(const std::vector<int64_t>& shape, ScalarType type) const;
  Buffer zeros(const std::vector<int64_t>& shape) const { return zeros(shape, dtype); }
  Buffer copy_of(const TensorView& src) const;
  // i32 tensor from host values.
  Buffer indices(const std::vector<int64_t>& shape, const std::vector<int32_t>& values) const;
};

// i32 [b, s]: each row's positions 0 .. s - 1 (RoPE's, for whole sequences).
Buffer sequence_positions(const Context& ctx, int64_t batch, int64_t seq);

// ---- parameters ---------------------------------------------------------------

// Deterministic generator (splitmix64 + Box-Muller): the same numbers on every
// platform and standard library, so a seed names one initialisation.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next_u64();
  double uniform();  // [0, 1)
  double normal();   // N(0, 1)

 private:
  uint64_t state_;
};

struct Init {
  enum class Kind { constant, normal, values } kind = Kind::constant;
  double value = 0.0;  // constant value, or the normal's standard deviation
  std::vector<double> values;
  static Init constant_value(double v) { return {Kind::constant, v, {}}; }
  static Init normal_std(double std) { return {Kind::normal, std, {}}; }
  static Init from_values(std::vector<double> v) { return {Kind::values, 0.0, std::move(v)}; }
};

struct Parameter {
  std::string name;
  Buffer value;   // what the ops read (compute dtype, or stats dtype for AttnRes / DAR)
  Buffer grad;    // same dtype and shape as value
  Buffer master;  // fp32 master copy when value is bf16, else empty
  Buffer adam_m, adam_v;
  // The tensor AdamW updates (master when present, else value).
  const TensorView& optimizer_view() const { return master.empty() ? value.view() : master.view(); }
};

class ParameterSet {
 public:
  Parameter& add(const Context& ctx, const std::string& name, const std::vector<int64_t>& shape,
                 ScalarType dtype, const Init& init, Rng& rng);
  void zero_grads(Backend& backend);
  void adamw_step(Backend& backend, const AdamWParams& hyper);
  int64_t count() const;  // number of scalars
  const std::vector<std::unique_ptr<Parameter>>& all() const { return params_; }
  Parameter* find(const std::string& name) const;

 private:
  std::vector<std::unique_ptr<Parameter>> params_;
};

// ---- branch shapes ------------------------------------------------------------

struct BranchShape {
  int64_t d_model = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t d_head = 0;
  int64_t d_ff = 0;
  MlpKind mlp = MlpKind::gelu;
  double norm_eps = 1e-6;
  double rope_theta = 10000.0;
  static BranchShape from(const ModelConfig& model);
};

// Decode-time KV cache of one attention branch (one sequence), head-major
// [G][capacity][d_h] so that one kv head's keys are a contiguous [R, d_h] block.
struct KvCache {
  Buffer keys, values;
  int64_t capacity = 0;
  int64_t count = 0;  // tokens held (a routed layer holds routed tokens only)
};

// ---- the two branches ---------------------------------------------------------

class AttentionBranch {
 public:
  struct Saved {
    Buffer x, rstd, u, q, k, v, o, lse;
    TensorView positions, valid_lengths;  // not owned: the caller keeps them alive
  };
  AttentionBranch(ParameterSet& params, const Context& ctx, const std::string& prefix,
                  const BranchShape& shape, Rng& rng, double out_std);
  // x [b, s, d]; positions i32 [b, s]; valid_lengths i32 [b] or empty.  Returns
  // y [b, s, d].  saved == nullptr: inference (nothing kept).
  Buffer forward(const Context& ctx, const TensorView& x, const TensorView& positions,
                 const TensorView& valid_lengths, Saved* saved) const;
  // dx += d y / d x applied to dy; parameter gradients +=.
  void backward(const Context& ctx, const TensorView& dy, Saved& saved, const TensorView& dx) const;
  // One token x [1, 1, d] at `position`: appends its key / value to the cache.
  Buffer decode(const Context& ctx, const TensorView& x, int32_t position, KvCache& cache) const;
  KvCache make_cache(const Context& ctx, int64_t capacity) const;

 private:
  BranchShape shape_;
  Parameter *norm_, *wq_, *wk_, *wv_, *wo_;
};

class MlpBranch {
 public:
  struct Saved {
    Buffer x, rstd, u, pre, gate, up, hidden;
  };
  MlpBranch(ParameterSet& params, const Context& ctx, const std::string& prefix,
            const BranchShape& shape, Rng& rng, double out_std);
  Buffer forward(const Context& ctx, const TensorView& x, Saved* saved) const;
  void backward(const Context& ctx, const TensorView& dy, Saved& saved, const TensorView& dx) const;

 private:
  BranchShape shape_;
  Parameter *norm_, *w_in_, *w_gate_, *w_up_, *w_out_;
};

// ---- the Mixture-of-Experts FFN (MoE, integrated MoDE) ----------------------------

// What an MoE FFN is made of ([moe] of the config; see docs/runtime_layers.md#moe).
struct MoeOptions {
  int64_t experts = 8;            // real experts E
  int64_t top_k = 2;              // experts per token (token choice)
  int64_t expert_ffn = 0;         // hidden width of one expert; 0 = the model's d_ff
  int64_t shared_experts = 0;     // always-on experts (one MLP of width shared x shared_expert_ffn)
  int64_t shared_expert_ffn = 0;  // width of one shared expert; 0 = the routed experts' width
  // The one MLP the shared experts run as: shared_experts x their width
  // (`routed_width`: the routed experts' resolved width).
  int64_t shared_width(int64_t routed_width) const {
    return shared_experts * (shared_expert_ffn > 0 ? shared_expert_ffn : routed_width);
  }
  double capacity_factor = 0.0;   // 0 = dropless; else ceil(cf * tokens * top_k / experts)
  double aux_loss_coef = 0.01;    // weight of the load-balancing loss in the objective
  double z_loss_coef = 0.0;       // weight of the router z-loss
  int64_t null_experts = 0;       // integrated MoDE: tokens routed to one skip the FFN
  bool renormalize = true;        // gates of the top-k divided by their sum ([moe])
  int64_t total_experts() const { return experts + null_experts; }
  // Rows per expert for `tokens` tokens entering the layer:
  // MoeConfig::expert_capacity (ceil(cf tokens k / (E + null)); dropless: tokens).
  int64_t capacity(int64_t tokens) const;
  // The [moe] section of a config (null experts only in integrated mode).
  static MoeOptions from(const MoeConfig& moe, const ModelConfig& model);
};

// Expert parallelism of an MoeFfn (runtime/parallel/expert_parallel.cpp): the
// E experts are split over an expert group of size() ranks, E / size()
// consecutive experts each (the layer's expert weights then hold only this
// rank's).  Rows travel by all-to-all, the counts exchanged first.
class ExpertExchange {
 public:
  struct Plan {
    int64_t chunk = 0;  // rows per rank pair in the (padded) all-to-all buffers
    // [size][E / size]: rows this rank sends to rank j for j's local expert e,
    // and rows it receives from rank s for its own local expert e.
    std::vector<int64_t> send, recv;
  };
  virtual ~ExpertExchange() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  // Every rank's `mine` (the same length on every rank), in rank order.
  virtual std::vector<int64_t> all_gather_counts(const std::vector<int64_t>& mine) = 0;
  // counts [E]: this rank's rows per expert -> the plan (counts all-to-all,
  // chunk = the group's largest block).
  virtual Plan plan(const std::vector<int64_t>& counts) = 0;
  // rows [R, d] grouped by expert (R = sum counts; may be empty) -> this
  // rank's experts' rows [sum recv, d], grouped by local expert, then source.
  virtual Buffer dispatch(const Context& ctx, const TensorView& rows, int64_t d,
                          const Plan& plan) = 0;
  // The inverse: [sum recv, d] local-expert-major -> [R, d] back in the
  // senders' order.
  virtual Buffer combine(const Context& ctx, const TensorView& rows, int64_t d,
                         const Plan& plan) = 0;
};

// y = sum_j g_j Expert_{e_j}(u) + Shared(u),  u = RMSNorm(x) (weighted), over
// the top-k of p = softmax(u W_r) among E real + N null experts; a null
// expert contributes nothing (the token skips the FFN).  Experts are the dense
// MLP (GELU or SwiGLU, BranchShape::mlp) with width expert_ffn; weights
// [E, d, f] / [E, f, d].  Ops: gemm (router), moe_route_forward, moe_dispatch,
// moe_permute_forward, grouped_gemm, GELU / SwiGLU, grouped_gemm,
// moe_unpermute_forward (+ moe_aux_loss_forward when a loss weight is set).
class MoeFfn {
 public:
  struct Saved {
    Buffer x, rstd, u, logits, probs, indices, gates, counts, slots;
    Buffer rows, pre, gate, up, hidden, expert_out;         // expert-grouped [R, ..]
    Buffer shared_pre, shared_gate, shared_up, shared_hidden;  // shared experts [T, ..]
    int64_t kept_rows = 0;
    // Expert parallelism: the exchange plan; rows / pre / gate / up / hidden /
    // counts are then this rank's experts' (local_rows of them) and
    // expert_out the combined [kept_rows, d].
    ExpertExchange::Plan plan;
    int64_t local_rows = 0;
  };
  struct Stats {
    double aux_loss = 0.0;         // unweighted load-balancing loss (1 = balanced)
    double z_loss = 0.0;           // unweighted router z-loss
    int64_t assignments = 0;       // tokens * top_k
    int64_t null_assignments = 0;  // routed to a null expert (skipped the FFN)
    int64_t dropped = 0;           // real-expert assignments over capacity
  };
  MoeFfn(ParameterSet& params, const Context& ctx, const std::string& prefix,
         const BranchShape& shape, const MoeOptions& moe, Rng& rng, double out_std);
  // x [.., d] -> y of x's shape.  saved == nullptr: inference.
  Buffer forward(const Context& ctx, const TensorView& x, Saved* saved, Stats* stats) const;
  // dx += J^T dy; parameter gradients += (router through the gates and the
  // weighted auxiliary / z losses).
  void backward(const Context& ctx, const TensorView& dy, Saved& saved, const TensorView& dx) const;
  const MoeOptions& options() const { return moe_; }
  // The Stats of the last forward (also in inference, where saved == nullptr).
  const Stats& last_stats() const { return last_stats_; }
  // Expert parallelism (nullptr: every expert here).  The exchange's rank
  // holds experts [rank E / size, (rank + 1) E / size); shard_experts()
  // keeps only those rows of the expert weights (values, gradients,
  // moments).  Capacity (capacity_factor > 0) is then counted over the
  // group's tokens with the single-process priority (choice j-major, then
  // token order, ranks in order), so a group holding the whole batch drops
  // exactly what one process would.
  void set_expert_exchange(ExpertExchange* exchange) { exchange_ = exchange; }
  void shard_experts(const Context& ctx, int rank, int size);
  std::vector<Parameter*> expert_parameters() const;  // the [E, ..] weights

 private:
  // Host dispatch under expert parallelism: slots and counts of this rank's
  // rows (capacity over the group); returns the counts per expert.
  std::vector<int64_t> group_dispatch(const Context& ctx, const TensorView& indices,
                                      const TensorView& counts, const TensorView& slots) const;
  Buffer experts_forward(const Context& ctx, const TensorView& rows, const TensorView& counts,
                         Saved* saved) const;
  BranchShape shape_;
  MoeOptions moe_;
  int64_t width_ = 0;
  Parameter *norm_, *router_;
  Parameter *w_in_ = nullptr, *w_gate_ = nullptr, *w_up_ = nullptr, *w_out_ = nullptr;
  Parameter *s_in_ = nullptr, *s_gate_ = nullptr, *s_up_ = nullptr, *s_out_ = nullptr;
  mutable Stats last_stats_;
  ExpertExchange* exchange_ = nullptr;
  int64_t local_experts_ = 0;  // E, or E / size under expert parallelism
};

// ---- a transformer layer on the plain residual stream ---------------------------

class TransformerLayer {
 public:
  struct Saved {
    AttentionBranch::Saved attn;
    MlpBranch::Saved mlp;
    MoeFfn::Saved moe;
    MoeFfn::Stats moe_stats;
  };
  // moe != nullptr: the FFN is an MoE FFN (MoeFfn) instead of the dense MLP.
  TransformerLayer(ParameterSet& params, const Context& ctx, const std::string& prefix,
                   const BranchShape& shape, Rng& rng, double out_std,
                   const MoeOptions* moe = nullptr);
  // The FFN branch (dense MLP or MoE): y = f(x); backward dx += J^T dy.
  Buffer ffn_forward(const Context& ctx, const TensorView& x, Saved* saved) const;
  void ffn_backward(const Context& ctx, const TensorView& dy, Saved& saved,
                    const TensorView& dx) const;
  // delta = a + m for x [b, s, d] (x itself is not changed).
  Buffer delta_forward(const Context& ctx, const TensorView& x, const TensorView& positions,
                       const TensorView& valid_lengths, Saved* saved) const;
  // dx += (d delta / d x)^T ddelta.
  void delta_backward(const Context& ctx, const TensorView& ddelta, Saved& saved,
                      const TensorView& dx) const;
  // x += delta in place (the dense layer).
  void forward_inplace(const Context& ctx, const TensorView& x, const TensorView& positions,
                       Saved* saved) const;
  // dx: in = gradient w.r.t. the layer output, out = w.r.t. its input.
  void backward_inplace(const Context& ctx, const TensorView& dx, Saved& saved) const;
  // Decode one token x [1, 1, d] at `position` in place, appending to `cache`.
  void decode_inplace(const Context& ctx, const TensorView& x, int32_t position,
                      KvCache& cache) const;

  const AttentionBranch& attention() const { return attention_; }
  const MlpBranch& mlp() const { return *mlp_; }  // dense layers only (moe() == nullptr)
  const MoeFfn* moe() const { return moe_.get(); }

 private:
  AttentionBranch attention_;
  std::unique_ptr<MlpBranch> mlp_;
  std::unique_ptr<MoeFfn> moe_;
};

// ---- the MoD routed layer --------------------------------------------------------

struct RoutingOptions {
  double capacity = 0.125;  // k = clamp(round(c s), 1, s)  (ModConfig)
  RouterScale gate = RouterScale::linear;
  // g(r) = 1 exactly, the router receives no gradient.  Not a training mode:
  // it exists so that capacity 1 can be checked against the dense layer bit
  // for bit (docs/model.md MoD "c = 1 with every = 1 reproduces the dense model").
  bool unit_gate = false;
  CausalRouter causal = CausalRouter::none;
  int64_t predictor_hidden = 256;
  double aux_loss_weight = 0.01;  // weight of the router BCE term in the total loss
  static RoutingOptions from(const ModConfig& mod);
};

class RoutedLayer {
 public:
  struct Saved {
    Buffer x;           // layer input [b, s, d] (router input)
    Buffer logits;      // router logits [b, s] (stats)
    Buffer gate_input;  // what the scatter reads as r: logits, or ones for unit_gate
    Buffer indices;     // i32 [b, k]
    Buffer positions;   // i32 [b, k] (original positions; padding slots 0)
    Buffer counts;      // i32 [b] valid routed tokens per sequence (forced / ragged selections)
    Buffer gathered;    // X~ [b, k, d]
    Buffer delta;       // [b, k, d]
    Buffer mask;        // [b, s] stats top-k mask (BCE target) when a causal router is on
    Buffer pred_hidden_pre, pred_hidden, pred_logits;
    TransformerLayer::Saved core;
    Buffer branch_out[2];  // routed-branch mode: f(h~) of attention / MLP
    Buffer dlogits;        // routed-branch mode: router gradient of both branches
  };
  struct Losses {
    double router_aux = 0.0;  // unweighted BCE of router logits vs the mask
    double predictor = 0.0;   // BCE of predictor logits vs the mask
    double predictor_accuracy = 0.0;
  };
  // A fixed selection (decode check, experiments): per sequence ascending
  // positions; sequences may differ in length.
  struct Selection {
    std::vector<std::vector<int32_t>> positions;
  };

  // moe != nullptr: staged MoDE (the routed tokens' FFN is an MoE FFN).
  RoutedLayer(ParameterSet& params, const Context& ctx, const std::string& prefix,
              const BranchShape& shape, const RoutingOptions& routing, Rng& rng, double out_std,
              const MoeOptions* moe = nullptr);
  int64_t routed_tokens(int64_t seq_len) const;
  // x [b, s, d] updated in place.  `forced` selects the routed tokens instead
  // of top-k (no auxiliary losses then).
  Losses forward_inplace(const Context& ctx, const TensorView& x, Saved* saved,
                         const Selection* forced = nullptr) const;
  void backward_inplace(const Context& ctx, const TensorView& dx, Saved& saved) const;

  // Decode, one sequence: x [1, 1, d] at `position`, updated in place.  Routed
  // iff sigmoid(logit) > 0.5, logit = predictor's (CausalRouter::predictor) or
  // the router's.  Returns whether the token was routed.
  bool decode_inplace(const Context& ctx, const TensorView& x, int32_t position,
                      KvCache& cache) const;

  // Routed-branch mode (inside AttnRes / DAR, where each branch has its own
  // input h): branch 0 (attention) routes on its input and fills `saved`;
  // branch 1 (MLP) reuses the selection.  Returns y [b, s, d] = g(r) f(h~) at
  // the routed tokens, 0 elsewhere.  `losses` is filled by branch 0.
  Buffer branch_forward(const Context& ctx, int branch, const TensorView& h, Saved& saved,
                        Losses* losses) const;
  // dh += d y / d h applied to dy (call branch 1 first, then branch 0).
  void branch_backward(const Context& ctx, int branch, const TensorView& dy, Saved& saved,
                       const TensorView& dh) const;
  KvCache make_cache(const Context& ctx, int64_t capacity) const {
    return core_.attention().make_cache(ctx, capacity);
  }

  const RoutingOptions& routing() const { return routing_; }
  const TransformerLayer& core() const { return core_; }

 private:
  Buffer predictor_logits(const Context& ctx, const TensorView& x, Saved* saved) const;
  // Router logits, selection (top-k or forced), causal-router losses.
  Losses route(const Context& ctx, const TensorView& x, Saved& st, const Selection* forced) const;
  // Auxiliary / predictor gradients and the router backward (dx += ...).
  void route_backward(const Context& ctx, const TensorView& dlogits, Saved& st,
                      const TensorView& dx) const;
  TensorView positions_of(const Saved& st) const {
    return st.positions.empty() ? st.indices.view() : st.positions.view();
  }
  TensorView gate_input_of(const Saved& st) const {
    return st.gate_input.empty() ? st.logits.view() : st.gate_input.view();
  }
  void predictor_backward(const Context& ctx, const TensorView& dlogits, Saved& saved) const;

  RoutingOptions routing_;
  BranchShape shape_;
  TransformerLayer core_;
  Parameter* router_;
  Parameter *pred_in_ = nullptr, *pred_out_ = nullptr;
};

// ---- AttnRes / DAR --------------------------------------------------------------

// kappa / nu of docs/model.md AttnRes/DAR (n = 1: both the identity).
struct StreamRoles {
  std::vector<int> key_stream;    // kappa(j)
  std::vector<int> value_stream;  // nu(j)
  static StreamRoles of(DarVariant variant, int64_t streams);
};

struct DepthOptions {
  DarVariant variant = DarVariant::attnres;
  int64_t streams = 1;             // n (1 for attnres)
  int64_t total_branches = 0;      // 2 L
  int64_t branches_per_block = 2;  // S (attnres Full: 1; DAR Full: 2)
  double norm_eps = 1e-6;          // rstd of keys / z
  double coefficient_std = 0.02;   // W_l init
  double beta_bias_spread = 0.2;   // symmetry breaking of the write gates (see .cpp)
  double rho_bias = 4.0;           // sigmoid(4) = 0.982: transport starts near identity
  static DepthOptions from(const Config& config);
};

// The history bank and the depth reads around a sequence of branches.  Usage
// (forward):  begin(embedding) ; for each branch: h = read(l) ; y = f_l(h) ;
// write(l, y) ; after the last: h_out = read_output().  Backward in reverse:
// dy = write_backward(l, ...) ... see model.cpp.  All tensors are [T, d] with
// T = b * s (the depth reads are token-wise).
class DepthResidual {
 public:
  DepthResidual(ParameterSet& params, const Context& ctx, const DepthOptions& options, int64_t d,
                Rng& rng);
  ~DepthResidual();
  DepthResidual(const DepthResidual&) = delete;
  DepthResidual& operator=(const DepthResidual&) = delete;
  const DepthOptions& options() const { return options_; }
  int64_t blocks() const;  // N
  int64_t entries() const { return blocks() + 1; }

  // ---- forward ----
  void begin(const Context& ctx, const TensorView& embedding, int64_t tokens);
  // The branch input h_l [T, d] (a view owned by this object, valid until the
  // branch's write).
  TensorView read(const Context& ctx, int64_t branch);
  void write(const Context& ctx, int64_t branch, const TensorView& y);
  // The final read over all entries (no partial) mixed over streams, owned by
  // the caller (nothing here keeps a second copy of it).
  Buffer read_output(const Context& ctx);

  // ---- backward (strict reverse order) ----
  void begin_backward(const Context& ctx, const TensorView& dh_out);
  // Gradient w.r.t. y_l for the last written branch not yet processed; the
  // caller runs the branch backward and then calls read_backward(l, dh).
  TensorView write_backward(const Context& ctx, int64_t branch);
  void read_backward(const Context& ctx, int64_t branch, const TensorView& dh);
  // d loss / d embedding, += into dembedding [T, d].  Frees the saved state.
  void finish_backward(const Context& ctx, const TensorView& dembedding);

  void set_saving(bool saving) { saving_ = saving; }
  // Free the bank and every saved state (after a forward-only pass).
  void release();

  // ---- pipeline stages (runtime/parallel/pipeline.cpp) ----
  // A stage runs the branches [first, end) of the model (a segment; the
  // default is every branch).  A block cut by a segment edge is started from
  // the bank at the segment's first read, and its phase-1 backward is split:
  // each segment differentiates its own positions (the others' read
  // gradients are exact zeros there).
  void set_segment(int64_t first_branch, int64_t end_branch);
  // Complete bank entries after branches [0, end): H_0 and the finished
  // blocks; a boundary inside a block also carries the partial P.
  int64_t complete_entries(int64_t end_branch) const {
    return 1 + end_branch / options_.branches_per_block;
  }
  bool cuts_block(int64_t end_branch) const {
    return end_branch % options_.branches_per_block != 0;
  }
  // Allocates the bank of a stage that receives it (no embedding here); a
  // no-op when this micro-batch's bank already lives here (an earlier chunk).
  void begin_received(const Context& ctx, int64_t tokens);
  // The boundary after branch `end`: entries [from, complete_entries(end))
  // and, when the boundary cuts a block, P (as one more entry), each with its
  // key statistic: values [n, k, T, d] and rstd [n, k, T].
  struct BoundaryBuffers {
    Buffer values, stats;
  };
  BoundaryBuffers pack_boundary(const Context& ctx, int64_t end_branch, int64_t from) const;
  void unpack_boundary(const Context& ctx, int64_t end_branch, int64_t from,
                       const BoundaryBuffers& in);
  // Backward across the same boundary: d values [n, k, T, d] (the statistic is
  // a function of its entry, not an input: no gradient of its own).  The
  // receiving stage packs and ZEROES the gradients it sends (they now belong
  // to the sender); the sender adds them into its bank gradient and takes the
  // partial's gradient as dP of its last branch.
  void begin_backward_received(const Context& ctx);
  Buffer pack_boundary_gradient(const Context& ctx, int64_t end_branch, int64_t from);
  void unpack_boundary_gradient(const Context& ctx, int64_t end_branch, int64_t from,
                                const TensorView& dvalues);
  // The forward / backward state of one micro-batch, so that a pipeline stage
  // can hold several in flight (1F1B): take_state() leaves this object empty.
  struct State;
  std::shared_ptr<State> take_state();  // (shared: State is opaque here)
  void put_state(std::shared_ptr<State> state);

 private:
  struct BranchState;
  struct BlockState;
  int64_t block_of(int64_t branch) const { return branch / options_.branches_per_block; }
  int64_t position_in_block(int64_t branch) const { return branch % options_.branches_per_block; }
  int64_t first_branch(int64_t block) const { return block * options_.branches_per_block; }
  int64_t block_size(int64_t block) const;
  void start_block(const Context& ctx, int64_t block);
  // The step's start once the bank is allocated (begin, begin_received): the
  // folded queries, and no block, branch, partial or output state.
  void start_step(const Context& ctx);
  // Phase 1 of `block` (o-bar, lse per stream) from the bank into `state`:
  // once in forward, once more in backward (nothing of it is kept between).
  void prefix_forward(const Context& ctx, int64_t block, BlockState& state);
  void prefix_backward(const Context& ctx, int64_t block);
  // R [n, T, d] of `branch` (and, i >= 1, the merge weights p [n, T]) from the
  // block's phase-1 outputs and P^{i-1} (`partial`, `partial_rstd`).
  void retrieve(const Context& ctx, int64_t branch, const TensorView& partial,
                const TensorView& partial_rstd, const TensorView& retrieved,
                const TensorView& merge_weight) const;
  // h of a read: the retrieved streams themselves (n = 1), else DAR
  // coefficients (set `coefficients`, with transport when `with_transport`)
  // and their mix; the intermediates are saved in `state`.
  TensorView mix_retrieved(const Context& ctx, BranchState& state, int64_t coefficients,
                           bool with_transport);
  TensorView bank_stream(int j) const;       // [E, T, d]
  TensorView bank_rstd_stream(int j) const;  // [E, T]
  TensorView dbank_stream(int j) const;

  DepthOptions options_;
  StreamRoles roles_;
  int64_t d_ = 0;
  int64_t tokens_ = 0;
  bool saving_ = true;
  Parameter *query_, *key_norm_;  // [n, 2L + 1, d] each (last row: output read), stats dtype
  std::vector<Parameter*> coef_weight_, coef_bias_, coef_scale_;  // per branch (+ output), n >= 2
  Buffer folded_query_;  // q' = w (.) gamma  [n, 2L + 1, d]
  Buffer dfolded_query_;
  Buffer bank_, bank_rstd_, dbank_;
  std::vector<std::unique_ptr<BlockState>> block_states_;
  std::vector<std::unique_ptr<BranchState>> branch_states_;
  Buffer partial_, partial_rstd_;  // P^i [n, T, d], rstd [n, T]
  Buffer dpartial_;
  std::unique_ptr<BranchState> output_state_;
  int64_t segment_first_ = 0, segment_end_ = -1;  // -1: every branch
};

// ---- a layer's part of a tensor group ----------------------------------------------

// The collectives a layer that holds a shard of its weights needs, over the
// tensor group it is split across (runtime/parallel implements them on a
// Communicator; the layers have no communicator of their own).
class ShardGroup {
 public:
  virtual ~ShardGroup() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  virtual void all_reduce_sum(const TensorView& buf) = 0;                    // in place
  virtual void all_gather(const TensorView& in, const TensorView& out) = 0;  // rank order
};

// ---- the language-model head --------------------------------------------------------

// The end of a causal LM, for the single-process model and every parallel
// trainer alike:
//   u = RMSNorm(x) (weight final_norm),  logits = u W  (W the untied head
//   [d, V], or the tied embedding [V, d] read transposed),
//   loss = mean over the rows whose target is not -1 of lse(logits_i) - logits_i[y_i].
// backward(weight) adds the gradient of `weight` x that mean: 1 when the call
// holds the whole batch; a part of a batch (a micro-batch, a data-parallel
// rank's rows) weighs its share of the batch's counted targets (the objective
// is the mean over every counted target of the batch, docs/runtime_parallel.md).
//
// Vocab-parallel (a `vocab_group` of t ranks, Megatron's parallel output
// layer and cross-entropy): rank r holds the vocabulary [r V / t, (r + 1) V /
// t): columns of the head, rows of the tied embedding, its logits [T, V / t].
// The cross-entropy combines the ranks' log-sum-exps (an all-gather of [T]
// per rank) and takes each target's logit from the rank that holds it (an
// all-reduce of [T]); the backward's input gradient, a sum over the
// vocabulary, is all-reduced ([T, d]).  u and the final norm are replicated.
class LmHead {
 public:
  struct Saved {
    TensorView x;        // the input [.., d] (the caller keeps it alive until backward)
    TensorView targets;  // i32, x's rows
    Buffer rstd, u, logits, lse;
    // backward() frees the logits right after the loss gradient unless they
    // are kept (the single-process model reports them: Model::last_logits).
    bool keep_logits = false;
    // Vocab-parallel: each row's target in this rank's columns (0 when it
    // lies elsewhere, -1 ignored), the rows whose target lies elsewhere (at
    // column 0, else -1), and the counts of both.
    Buffer local_targets, elsewhere_targets;
    int64_t counted = 0, elsewhere = 0;
  };
  // tied_embedding: the [V, d] embedding the head reads (nullptr: an untied
  // head [d, V] is added, drawn from `head_init`).  Adds "final_norm" (and
  // "head").  vocab_group: split the vocabulary over it (V a multiple of its
  // size; the tied embedding then holds this rank's V / t rows).
  LmHead(ParameterSet& params, const Context& ctx, int64_t d_model, int64_t vocab, double norm_eps,
         Parameter* tied_embedding, const Init& head_init, Rng& rng,
         ShardGroup* vocab_group = nullptr);
  // x [.., d], targets i32 with x's rows (-1 = ignored).  Returns the mean
  // cross-entropy over the counted rows (0 when none is counted).
  double forward(const Context& ctx, const TensorView& x, const TensorView& targets,
                 Saved& saved) const;
  // Returns d loss / d x (x's shape) for `weight` x the mean loss; the head's
  // parameter gradients +=.  Frees u (and the logits unless kept).
  Buffer backward(const Context& ctx, double weight, Saved& saved) const;
  // Logits [rows, V] of x [rows, d] (decoding; nothing saved; whole vocabulary only).
  Buffer logits(const Context& ctx, const TensorView& x) const;

  Parameter& final_norm() const { return *final_norm_; }
  Parameter* head() const { return head_; }  // nullptr when tied
  int64_t vocab_begin() const { return vocab_begin_; }
  int64_t local_vocab() const { return local_vocab_; }

 private:
  // logits = u W (the untied head, or the tied embedding transposed).
  void project(Backend& backend, const TensorView& u_rows, const TensorView& logits) const;
  // The vocab-parallel cross-entropy of the saved logits (forward), and its
  // gradient into dlogits (backward).
  double split_cross_entropy(const Context& ctx, Saved& saved) const;
  void split_cross_entropy_backward(const Context& ctx, double weight, Saved& saved,
                                    const TensorView& dlogits) const;
  int64_t d_ = 0, vocab_ = 0, local_vocab_ = 0, vocab_begin_ = 0;
  double norm_eps_ = 1e-6;
  Parameter* final_norm_ = nullptr;
  Parameter* head_ = nullptr;
  Parameter* tied_ = nullptr;
  ShardGroup* group_ = nullptr;
};

}  // namespace modar::runtime
