// MoE FFN and MoDE layers: one expert / top-1 == the dense layer bit for bit
// (fp32 and fp64, GELU and SwiGLU, forward and backward); null experts skip
// the FFN; capacity drops counted independently; finite-difference gradients
// (fp64) of the MoE FFN (top-2, renormalised, null + shared experts, drops,
// aux + z losses), the MoE transformer layer and staged MoDE.
#include "test_layers_common.hpp"

namespace modar::runtime::layer_tests {
namespace {

// Copies the dense layer's parameters into the one-expert MoE layer ("w_in"
// [d, f] -> "experts.w_in" [1, d, f], ...).
void copy_dense_into_moe(const ParameterSet& dense, ParameterSet& moe, const std::string& prefix) {
  Backend& be = cpu_backend();
  copy_parameters(dense, moe);
  for (const char* name : {"w_in", "w_gate", "w_up", "w_out"}) {
    const Parameter* p = dense.find(prefix + "." + name);
    if (p == nullptr)
      continue;
    Parameter* q = moe.find(prefix + ".experts." + name);
    ASSERT_NE(q, nullptr) << name;
    upload(be, download(be, p->value), q->value);
  }
}

std::vector<double> grad_of(const ParameterSet& params, const std::string& name) {
  const Parameter* p = params.find(name);
  EXPECT_NE(p, nullptr) << name;
  return p == nullptr ? std::vector<double>{} : download(cpu_backend(), p->grad);
}

struct IdentityCase {
  MlpKind mlp;
  ScalarType dtype;
};

class MoeOneExpert : public ::testing::TestWithParam<IdentityCase> {};

// One expert, top-1: p = 1 and gate = 1 exactly, every token keeps its row, and
// each grouped GEMM is the gemm op on the same operands, so the layer IS the
// dense layer, bit for bit, forward and backward (load-balancing loss on: its
// gradient through a one-column softmax is exactly 0).
TEST_P(MoeOneExpert, EqualsTheDenseLayerBitForBit) {
  const Context ctx{cpu_backend(), nullptr, GetParam().dtype};
  const BranchShape shape = small_shape(GetParam().mlp);
  ParameterSet dense_params, moe_params;
  Rng rng_a(3), rng_b(3);
  TransformerLayer dense(dense_params, ctx, "layer", shape, rng_a, 0.02);
  MoeOptions moe{.experts = 1, .top_k = 1, .aux_loss_coef = 0.01};
  moe.capacity_factor = 1.0;  // capacity ceil(1 * T * 1 / 1) = T: nothing dropped
  TransformerLayer sparse(moe_params, ctx, "layer", shape, rng_b, 0.02, &moe);
  randomize_parameters(dense_params, 40);
  randomize_parameters(moe_params, 41);  // the router keeps random values
  copy_dense_into_moe(dense_params, moe_params, "layer");

  const int64_t b = 2, s = 5, d = shape.d_model;
  const std::vector<double> x_host = random_values(b * s * d, 9);
  const std::vector<double> dy_host = random_values(b * s * d, 10);
  Buffer positions = sequence_positions(ctx, b, s);
  std::vector<double> out[2], dx[2];
  TransformerLayer* layers[2] = {&dense, &sparse};
  ParameterSet* sets[2] = {&dense_params, &moe_params};
  for (int i = 0; i < 2; ++i) {
    sets[i]->zero_grads(ctx.backend);
    Buffer x = host_tensor(ctx, {b, s, d}, x_host);
    TransformerLayer::Saved saved;
    layers[i]->forward_inplace(ctx, x, positions, &saved);
    out[i] = download(ctx.backend, x);
    Buffer g = host_tensor(ctx, {b, s, d}, dy_host);
    layers[i]->backward_inplace(ctx, g, saved);
    dx[i] = download(ctx.backend, g);
  }
  EXPECT_EQ(out[0], out[1]);
  EXPECT_EQ(dx[0], dx[1]);
  for (const char* name : {"attn_norm", "wq", "wk", "wv", "wo", "mlp_norm"}) {
    EXPECT_EQ(grad_of(dense_params, std::string("layer.") + name),
              grad_of(moe_params, std::string("layer.") + name))
        << name;
  }
  for (const char* name : {"w_in", "w_gate", "w_up", "w_out"}) {
    if (dense_params.find(std::string("layer.") + name) == nullptr)
      continue;
    EXPECT_EQ(grad_of(dense_params, std::string("layer.") + name),
              grad_of(moe_params, std::string("layer.experts.") + name))
        << name;
  }
  // The one-column softmax gives the router no gradient at all.
  for (double g : grad_of(moe_params, "layer.moe_router"))
    EXPECT_EQ(g, 0.0);
}

INSTANTIATE_TEST_SUITE_P(MlpAndDtype, MoeOneExpert,
                         ::testing::Values(IdentityCase{MlpKind::gelu, ScalarType::fp32},
                                           IdentityCase{MlpKind::swiglu, ScalarType::fp32},
                                           IdentityCase{MlpKind::gelu, ScalarType::fp64},
                                           IdentityCase{MlpKind::swiglu, ScalarType::bf16}));

// ---- null experts (integrated MoDE) and capacity ------------------------------

// A null expert whose router column dominates takes every token: the FFN is
// skipped (y = 0 exactly, the expert weights get no gradient); with a shared
// expert y is the shared expert alone.
TEST(MoeFfnLayer, TokensRoutedToANullExpertSkipTheFfn) {
  const Context ctx = fp64_context();
  const BranchShape shape = small_shape();
  MoeOptions moe{.experts = 2, .top_k = 1, .null_experts = 1};
  ParameterSet params;
  Rng rng(5);
  MoeFfn ffn(params, ctx, "layer", shape, moe, rng, 0.02);
  randomize_parameters(params, 50);
  const int64_t t = 8, d = shape.d_model;
  // u = RMSNorm(x) g with g = 1: choose x with a large positive first feature
  // and the router's first row favouring column 2 (the null expert) by +50.
  std::vector<double> x_host = random_values(t * d, 51, 0.1);
  for (int64_t i = 0; i < t; ++i)
    x_host[static_cast<size_t>(i * d)] = 3.0;
  std::vector<double> router(static_cast<size_t>(d * 3), 0.0);
  router[2] = 50.0;
  set_parameter(params, "layer.moe_router", router);
  set_parameter(params, "layer.mlp_norm", std::vector<double>(static_cast<size_t>(d), 1.0));
  Buffer x = host_tensor(ctx, {t, d}, x_host);
  MoeFfn::Saved saved;
  MoeFfn::Stats stats;
  Buffer y = ffn.forward(ctx, x, &saved, &stats);
  EXPECT_EQ(stats.assignments, t);
  EXPECT_EQ(stats.null_assignments, t);
  EXPECT_EQ(stats.dropped, 0);
  for (double v : download(ctx.backend, y))
    EXPECT_EQ(v, 0.0);
  params.zero_grads(ctx.backend);
  Buffer dx = ctx.zeros({t, d});
  ffn.backward(ctx, host_tensor(ctx, {t, d}, random_values(t * d, 52)), saved, dx);
  for (double g : grad_of(params, "layer.experts.w_in"))
    EXPECT_EQ(g, 0.0);
}

// Capacity: tokens * top_k assignments over E experts, C = ceil(cf T k / E);
// the drops equal sum_e max(0, load_e - C) counted from the router's choices,
// a dropped top-1 token's FFN output is exactly 0, and a capacity factor large
// enough (C >= T) gives exactly the dropless output.
TEST(MoeFfnLayer, CapacityDropsAreCountedAndLargeCapacityIsDropless) {
  const Context ctx = fp64_context();
  const BranchShape shape = small_shape();
  MoeOptions moe;
  moe.experts = 4;
  moe.top_k = 1;
  const int64_t t = 24, d = shape.d_model;
  const std::vector<double> x_host = random_values(t * d, 61);
  auto run = [&](double cf, MoeFfn::Saved* saved, MoeFfn::Stats* stats) {
    moe.capacity_factor = cf;
    ParameterSet params;
    Rng rng(7);
    MoeFfn ffn(params, ctx, "layer", shape, moe, rng, 0.02);
    randomize_parameters(params, 60);
    Buffer x = host_tensor(ctx, {t, d}, x_host);
    return download(ctx.backend, ffn.forward(ctx, x, saved, stats));
  };
  MoeFfn::Saved dropless_saved;
  MoeFfn::Stats dropless_stats;
  const std::vector<double> dropless = run(0.0, &dropless_saved, &dropless_stats);
  const std::vector<double> idx = download(ctx.backend, dropless_saved.indices);
  std::vector<int64_t> load(4, 0);
  for (double e : idx)
    ++load[static_cast<size_t>(e)];
  EXPECT_EQ(dropless_stats.dropped, 0);
  // cf = 4: C = ceil(4 * 24 / 4) = 24 = T, nothing can drop.
  MoeFfn::Saved big_saved;
  MoeFfn::Stats big_stats;
  EXPECT_EQ(run(4.0, &big_saved, &big_stats), dropless);
  EXPECT_EQ(big_stats.dropped, 0);
  // cf = 0.5: C = ceil(0.5 * 24 / 4) = 3.
  MoeFfn::Saved small_saved;
  MoeFfn::Stats small_stats;
  const std::vector<double> small = run(0.5, &small_saved, &small_stats);
  int64_t expected_drops = 0;
  for (int64_t l : load)
    expected_drops += std::max<int64_t>(0, l - 3);
  ASSERT_GT(expected_drops, 0) << "the router spread 24 tokens over 4 experts within 3 each";
  EXPECT_EQ(small_stats.dropped, expected_drops);
  EXPECT_EQ(small_saved.kept_rows, t - expected_drops);
  const std::vector<double> slots = download(ctx.backend, small_saved.slots);
  int64_t zero_rows = 0;
  for (int64_t i = 0; i < t; ++i) {
    // A kept token's row equals the dropless one (up to the GEMM's blocking
    // over a different number of rows).
    bool all_zero = true, same = true;
    for (int64_t c = 0; c < d; ++c) {
      const size_t at = static_cast<size_t>(i * d + c);
      all_zero = all_zero && small[at] == 0.0;
      same = same && std::abs(small[at] - dropless[at]) <= 1e-12;
    }
    if (slots[static_cast<size_t>(i)] < 0) {
      EXPECT_TRUE(all_zero) << "dropped token " << i;
      ++zero_rows;
    } else {
      EXPECT_TRUE(same) << "kept token " << i;
    }
  }
  EXPECT_EQ(zero_rows, expected_drops);
}

// ---- finite-difference gradients -------------------------------------------------

struct FfnCase {
  const char* name;
  MlpKind mlp;
  int64_t experts, null_experts, top_k, shared;
  double capacity_factor;
  bool renormalize;
  int64_t shared_ffn = 0;  // each shared expert's width; 0 = the routed width (10)
};

class MoeFfnGradients : public ::testing::TestWithParam<FfnCase> {};

TEST_P(MoeFfnGradients, MatchFiniteDifferences) {
  const FfnCase& c = GetParam();
  const Context ctx = fp64_context();
  BranchShape shape = small_shape(c.mlp);
  MoeOptions moe{.experts = c.experts,
                 .top_k = c.top_k,
                 .expert_ffn = 10,
                 .shared_experts = c.shared,
                 .shared_expert_ffn = c.shared_ffn,
                 .capacity_factor = c.capacity_factor,
                 .aux_loss_coef = 0.3,
                 .z_loss_coef = 0.05,
                 .null_experts = c.null_experts,
                 .renormalize = c.renormalize};
  ParameterSet params;
  Rng rng(13);
  MoeFfn ffn(params, ctx, "layer", shape, moe, rng, 0.02);
  randomize_parameters(params, 300);
  const int64_t b = 2, s = 6, d = shape.d_model;
  std::vector<double> x_host = random_values(b * s * d, 71);
  const std::vector<double> w = random_values(b * s * d, 72);
  auto loss = [&]() {
    Buffer x = host_tensor(ctx, {b, s, d}, x_host);
    MoeFfn::Saved saved;
    MoeFfn::Stats stats;
    const std::vector<double> y = download(ctx.backend, ffn.forward(ctx, x, &saved, &stats));
    return dot(y, w) + moe.aux_loss_coef * stats.aux_loss + moe.z_loss_coef * stats.z_loss;
  };
  params.zero_grads(ctx.backend);
  Buffer x = host_tensor(ctx, {b, s, d}, x_host);
  MoeFfn::Saved saved;
  MoeFfn::Stats stats;
  ffn.forward(ctx, x, &saved, &stats);
  if (c.capacity_factor > 0.0) {
    EXPECT_GT(stats.dropped, 0) << "the case is meant to drop assignments";
  }
  if (c.null_experts > 0) {
    EXPECT_GT(stats.null_assignments, 0) << "the case is meant to route to null experts";
  }
  Buffer dx = ctx.zeros({b, s, d});
  ffn.backward(ctx, host_tensor(ctx, {b, s, d}, w), saved, dx);
  const std::vector<double> dx_host = download(ctx.backend, dx);
  expect_parameter_gradients(params, loss, 6);
  expect_input_gradient(x_host, dx_host, loss, 16);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MoeFfnGradients,
    ::testing::Values(FfnCase{"top2", MlpKind::gelu, 4, 0, 2, 0, 0.0, false},
                      FfnCase{"swiglu_renorm", MlpKind::swiglu, 4, 0, 2, 0, 0.0, true},
                      FfnCase{"null_shared", MlpKind::gelu, 3, 2, 2, 1, 0.0, false},
                      FfnCase{"capacity", MlpKind::swiglu, 4, 0, 2, 1, 0.5, false},
                      FfnCase{"shared_own_width", MlpKind::swiglu, 4, 0, 2, 2, 0.0, true, 6}),
    [](const ::testing::TestParamInfo<FfnCase>& info) { return std::string(info.param.name); });

// The MoE transformer layer (attention + MoE FFN) and staged MoDE (the MoD
// routed block with an MoE FFN inside): <w, out> + weighted aux / z losses.
TEST(MoeLayers, TransformerAndStagedModeGradients) {
  const Context ctx = fp64_context();
  const BranchShape shape = small_shape(MlpKind::swiglu);
  MoeOptions moe{
      .experts = 3, .top_k = 2, .expert_ffn = 8, .aux_loss_coef = 0.2, .z_loss_coef = 0.1};
  const int64_t b = 2, s = 6, d = shape.d_model;
  for (const bool staged : {false, true}) {
    SCOPED_TRACE(staged ? "staged MoDE" : "MoE layer");
    ParameterSet params;
    Rng rng(17);
    RoutingOptions routing;
    routing.capacity = 0.5;
    std::unique_ptr<TransformerLayer> dense;
    std::unique_ptr<RoutedLayer> routed;
    if (staged) {
      routed = std::make_unique<RoutedLayer>(params, ctx, "layer", shape, routing, rng, 0.02, &moe);
    } else {
      dense = std::make_unique<TransformerLayer>(params, ctx, "layer", shape, rng, 0.02, &moe);
    }
    randomize_parameters(params, 400);
    Buffer positions = sequence_positions(ctx, b, s);
    std::vector<double> x_host = random_values(b * s * d, 81);
    const std::vector<double> w = random_values(b * s * d, 82);
    auto forward = [&](const TensorView& x, MoeFfn::Stats* stats, TransformerLayer::Saved* ds,
                       RoutedLayer::Saved* rs) {
      if (staged) {
        routed->forward_inplace(ctx, x, rs);
        *stats = rs->core.moe_stats;
      } else {
        dense->forward_inplace(ctx, x, positions, ds);
        *stats = ds->moe_stats;
      }
    };
    auto loss = [&]() {
      Buffer x = host_tensor(ctx, {b, s, d}, x_host);
      TransformerLayer::Saved ds;
      RoutedLayer::Saved rs;
      MoeFfn::Stats stats;
      forward(x, &stats, &ds, &rs);
      return dot(download(ctx.backend, x), w) + moe.aux_loss_coef * stats.aux_loss +
             moe.z_loss_coef * stats.z_loss;
    };
    params.zero_grads(ctx.backend);
    Buffer x = host_tensor(ctx, {b, s, d}, x_host);
    TransformerLayer::Saved ds;
    RoutedLayer::Saved rs;
    MoeFfn::Stats stats;
    forward(x, &stats, &ds, &rs);
    // Staged: the MoE FFN sees only the b * k routed tokens.
    EXPECT_EQ(stats.assignments, (staged ? b * 3 : b * s) * moe.top_k);
    Buffer dx = host_tensor(ctx, {b, s, d}, w);
    if (staged) {
      routed->backward_inplace(ctx, dx, rs);
    } else {
      dense->backward_inplace(ctx, dx, ds);
    }
    const std::vector<double> dx_host = download(ctx.backend, dx);
    expect_parameter_gradients(params, loss, 5);
    expect_input_gradient(x_host, dx_host, loss, 12);
  }
}

// Shared experts of their own width (moe.shared_expert_ffn): one MLP of
// shared x width; parameters counted by hand (d = small_shape's).
TEST(MoeFfnLayer, SharedExpertsOfTheirOwnWidth) {
  const Context ctx = fp64_context();
  const BranchShape shape = small_shape(MlpKind::gelu);
  MoeOptions moe{
      .experts = 3, .top_k = 1, .expert_ffn = 10, .shared_experts = 2, .shared_expert_ffn = 6};
  ParameterSet params;
  Rng rng(3);
  MoeFfn ffn(params, ctx, "layer", shape, moe, rng, 0.02);
  const int64_t d = shape.d_model;
  // norm d, router d x 3, experts 3 x (d x 10 + 10 x d), shared d x 12 + 12 x d.
  EXPECT_EQ(params.count(), d + 3 * d + 3 * 2 * d * 10 + 2 * d * 12);
}

// Keys the cost model plans and the reference runtime does not run are
// refused by name.
TEST(MoeFfnLayer, KeysTheRuntimeDoesNotRunAreRefused) {
  ModelConfig model;
  model.mlp = MlpKind::geglu;
  EXPECT_THROW(BranchShape::from(model), ConfigError);
  model.mlp = MlpKind::swiglu;
  model.qk_norm = QkNorm::head;
  try {
    BranchShape::from(model);
    ADD_FAILURE() << "qk_norm accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.qk_norm = \"head\""), std::string::npos);
  }
  MoeConfig gated;
  gated.experts = 4;
  gated.shared_experts = 1;
  gated.shared_expert_gate = true;
  EXPECT_THROW(MoeOptions::from(gated, ModelConfig{}), ConfigError);
}

TEST(MoeFfnLayer, BadOptionsNameTheField) {
  const Context ctx = fp64_context();
  ParameterSet params;
  Rng rng(1);
  MoeOptions moe;
  moe.experts = 2;
  moe.top_k = 3;
  try {
    MoeFfn ffn(params, ctx, "layer", small_shape(), moe, rng, 0.02);
    ADD_FAILURE() << "top_k > experts accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("moe.top_k = 3"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace modar::runtime::layer_tests
