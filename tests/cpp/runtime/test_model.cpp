// Whole-model training step: finite-difference gradients (fp64) for every
// layer / residual type, the identities of docs/model.md MoD / 1.2 at model level, a
// training sanity run and the peak-memory report.
#include "test_model_common.hpp"

namespace modar::runtime::layer_tests {
namespace {

Config tiny_config() { return tiny_model_config(); }
constexpr int64_t kBatch = kModelBatch, kSeq = kModelSeq;

class ModelGradients : public ::testing::TestWithParam<ModelCase> {};

TEST_P(ModelGradients, MatchFiniteDifferences) {
  Config config = tiny_config();
  GetParam().edit(config);
  ModelOptions options = fp64_model_options(5);
  options.router_aux_loss_weight = 0.5;
  Model model(cpu_backend(), config, options);
  randomize_parameters(model.parameters(), 61, 0.25);
  Buffer tokens = tiny_tokens(model, 0);
  std::vector<int32_t> target_ids = token_ids(kBatch * kSeq, 13, 1);
  target_ids[3] = -1;  // an ignored position
  Buffer targets = model.make_tokens(target_ids, kBatch, kSeq);
  const StepResult step = model.forward_backward(tokens, targets);
  const StepResult eval = model.evaluate(tokens, targets);
  EXPECT_DOUBLE_EQ(step.loss, eval.loss);
  EXPECT_TRUE(std::isfinite(step.loss));
  // The predictor reads a stop-gradient copy of its input: its BCE trains the
  // predictor's own weights only.  So the predictor weights are checked
  // against the full objective and everything else against the objective
  // without the predictor term.
  auto is_predictor = [](const std::string& name) {
    return name.find("predictor") != std::string::npos;
  };
  const double routed = static_cast<double>(model.routed_layers());
  expect_parameter_gradients(
      model.parameters(),
      [&]() {
        const StepResult r = model.evaluate(tokens, targets);
        return r.loss - r.predictor * routed;
      },
      3, 1e-6, 1e-5, [&](const std::string& name) { return !is_predictor(name); });
  if (config.mod.causal_router == CausalRouter::predictor) {
    expect_parameter_gradients(
        model.parameters(), [&]() { return model.evaluate(tokens, targets).loss; }, 6, 1e-6, 1e-5,
        is_predictor);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Architectures, ModelGradients,
    ::testing::Values(
        ModelCase{"dense_gelu", [](Config&) {}},
        ModelCase{"dense_swiglu_tied",
                  [](Config& c) {
                    c.model.mlp = MlpKind::swiglu;
                    c.model.tie_embeddings = true;
                  }},
        ModelCase{"mod_linear_every2", set_mod({.capacity = 0.5, .every = 2})},
        ModelCase{"mod_sigmoid_aux_every1", set_mod({.capacity = 0.34,
                                                     .every = 1,
                                                     .router_scale = RouterScale::sigmoid,
                                                     .causal_router = CausalRouter::aux_loss})},
        ModelCase{"mod_predictor", set_mod({.capacity = 0.5,
                                            .every = 2,
                                            .causal_router = CausalRouter::predictor,
                                            .predictor_hidden = 8})},
        ModelCase{"attnres_block", set_dar({.variant = DarVariant::attnres, .block_layers = 2})},
        ModelCase{"attnres_full", set_dar({.variant = DarVariant::attnres, .block_layers = 1})},
        ModelCase{"dar_block", set_dar({.variant = DarVariant::dar, .block_layers = 2})},
        ModelCase{"dar_full", set_dar({.variant = DarVariant::dar, .block_layers = 1})},
        ModelCase{"selfkv", set_dar({.variant = DarVariant::selfkv, .block_layers = 2})},
        ModelCase{"fixedkv", set_dar({.variant = DarVariant::fixedkv, .block_layers = 2})},
        ModelCase{"crossv", set_dar({.variant = DarVariant::crossv, .block_layers = 2})},
        ModelCase{"dar_n3", set_dar({.variant = DarVariant::dar, .block_layers = 2, .streams = 3})},
        ModelCase{
            "mod_in_dar",
            set_mod_dar({.capacity = 0.5, .every = 2, .causal_router = CausalRouter::aux_loss},
                        {.variant = DarVariant::dar, .block_layers = 2})}),
    model_case_name);

// docs/model.md MoD: MoD at capacity 1, every layer routed, with g(r) = 1, reproduces
// the dense model exactly (loss, logits and every shared gradient, bit for bit).
TEST(ModelIdentity, ModCapacityOneEveryOneIsTheDenseModel) {
  Config dense_config = tiny_config();
  Config mod_config = dense_config;
  mod_config.mod.every = 1;
  mod_config.mod.capacity = 1.0;
  const ModelOptions options = fp64_model_options();
  ModelOptions mod_options = options;
  mod_options.unit_router_gate = true;
  Model dense(cpu_backend(), dense_config, options);
  Model routed(cpu_backend(), mod_config, mod_options);
  EXPECT_EQ(routed.routed_layers(), 3);
  randomize_parameters(dense.parameters(), 8, 0.25);
  copy_parameters(dense.parameters(), routed.parameters());
  Buffer tokens = tiny_tokens(dense, 0);
  Buffer targets = tiny_tokens(dense, 2);
  const StepResult a = dense.forward_backward(tokens, targets);
  const StepResult b = routed.forward_backward(tokens, targets);
  expect_identical_steps(dense, a, routed, b);
}

// docs/model.md AttnRes/DAR: DAR reduces to AttnRes when the streams carry the same thing.
// With alpha = 1/2, beta = 1 (coefficient weights 0, biases 0) and the same
// query per stream, both streams stay identical (M is doubly stochastic), each
// retrieved state is the AttnRes read and h = R/2 + R/2: for every variant,
// the n = 2 model equals the n = 1 (AttnRes) model.
class DarEqualsAttnRes : public ::testing::TestWithParam<DarVariant> {};

TEST_P(DarEqualsAttnRes, WithIdenticalStreamsAndUnitCoefficients) {
  Config attn_config = tiny_config();
  attn_config.dar.variant = DarVariant::attnres;
  attn_config.dar.block_layers = 2;
  Config dar_config = attn_config;
  dar_config.dar.variant = GetParam();
  dar_config.dar.streams = 2;
  const ModelOptions options = fp64_model_options();
  Model attn(cpu_backend(), attn_config, options);
  Model dar(cpu_backend(), dar_config, options);
  randomize_parameters(attn.parameters(), 19, 0.25);
  copy_parameters(attn.parameters(), dar.parameters());  // depth.* shapes differ: set below
  const int64_t rows = 2 * 3 + 1, d = 16;
  const std::vector<double> q = random_values(rows * d, 70, 0.5);
  std::vector<double> gamma = random_values(rows * d, 71, 0.1);
  for (double& g : gamma)
    g += 1.0;
  set_parameter(attn.parameters(), "depth.query", q);
  set_parameter(attn.parameters(), "depth.key_norm", gamma);
  std::vector<double> q2 = q, gamma2 = gamma;
  q2.insert(q2.end(), q.begin(), q.end());
  gamma2.insert(gamma2.end(), gamma.begin(), gamma.end());
  set_parameter(dar.parameters(), "depth.query", q2);
  set_parameter(dar.parameters(), "depth.key_norm", gamma2);
  for (const auto& p : dar.parameters().all()) {
    if (p->name.find(".coef_weight") != std::string::npos ||
        p->name.find(".coef_bias") != std::string::npos) {
      std::vector<double> v(static_cast<size_t>(p->value.numel()), 0.0);
      if (p->name.find(".coef_bias") != std::string::npos && v.size() == 5)
        v[4] = 0.3;  // rho
      upload(cpu_backend(), v, p->value);
    }
  }
  Buffer tokens = tiny_tokens(attn, 0);
  Buffer targets = tiny_tokens(attn, 1);
  const StepResult a = attn.evaluate(tokens, targets);
  const StepResult b = dar.evaluate(tokens, targets);
  EXPECT_NEAR(a.loss, b.loss, 1e-12);
  const std::vector<double> la = attn.last_logits(), lb = dar.last_logits();
  for (size_t i = 0; i < la.size(); ++i)
    EXPECT_NEAR(la[i], lb[i], 1e-11);
}

INSTANTIATE_TEST_SUITE_P(Variants, DarEqualsAttnRes,
                         ::testing::Values(DarVariant::dar, DarVariant::selfkv, DarVariant::fixedkv,
                                           DarVariant::crossv));

// The DAR init breaks the stream symmetry (layers.hpp / layers_depth.cpp):
// after one step from the default init the two streams' gradients differ.
TEST(ModelInit, DarStreamsAreNotSymmetricAtInit) {
  Config config = tiny_config();
  config.dar.variant = DarVariant::dar;
  const ModelOptions options = fp64_model_options();
  Model model(cpu_backend(), config, options);
  Buffer tokens = tiny_tokens(model, 0);
  Buffer targets = tiny_tokens(model, 1);
  model.forward_backward(tokens, targets);
  const std::vector<double> g =
      download(cpu_backend(), model.parameters().find("depth.query")->grad);
  const size_t half = g.size() / 2;
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < half; ++i) {
    diff += std::abs(g[i] - g[half + i]);
    norm += std::abs(g[i]);
  }
  EXPECT_GT(norm, 0.0);
  EXPECT_GT(diff, 1e-3 * norm);
}

TEST(ModelInit, SameSeedSameParameters) {
  Config config = tiny_config();
  config.mod.every = 2;
  config.dar.variant = DarVariant::dar;
  Model a(cpu_backend(), config), b(cpu_backend(), config);
  ModelOptions other;
  other.seed = 2;
  Model c(cpu_backend(), config, other);
  ASSERT_EQ(a.parameters().all().size(), b.parameters().all().size());
  for (size_t i = 0; i < a.parameters().all().size(); ++i) {
    EXPECT_EQ(download(cpu_backend(), a.parameters().all()[i]->value),
              download(cpu_backend(), b.parameters().all()[i]->value));
  }
  EXPECT_NE(download(cpu_backend(), a.parameters().find("layer0.wq")->value),
            download(cpu_backend(), c.parameters().find("layer0.wq")->value));
}

// Sanity: a few dozen AdamW steps on one fixed synthetic batch reduce the loss.
class ModelTraining : public ::testing::TestWithParam<ModelCase> {};

TEST_P(ModelTraining, ReducesLossOnAFixedSequence) {
  Config config;
  config.model = {.d_model = 32, .n_layers = 2, .n_heads = 4, .vocab_size = 16, .seq_len = 16};
  GetParam().edit(config);
  ModelOptions options;
  options.adamw.learning_rate = 1e-2;
  Model model(cpu_backend(), config, options);
  const int64_t b = 2, s = 16;
  std::vector<int32_t> ids(static_cast<size_t>(b * s + 1));
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<int32_t>((5 * i * i + 3 * i) % 16);
  std::vector<int32_t> inputs(ids.begin(), ids.end() - 1), next(ids.begin() + 1, ids.end());
  Buffer tokens = model.make_tokens(inputs, b, s);
  Buffer targets = model.make_tokens(next, b, s);
  const double first = model.train_step(tokens, targets).lm_loss;
  double last = first;
  for (int step = 0; step < 40; ++step)
    last = model.train_step(tokens, targets).lm_loss;
  EXPECT_NEAR(first, std::log(16.0), 0.3);  // near-uniform predictions at init
  EXPECT_LT(last, 0.5 * first);
}

INSTANTIATE_TEST_SUITE_P(
    Architectures, ModelTraining,
    ::testing::Values(ModelCase{"dense", [](Config&) {}},
                      ModelCase{"mod", set_mod({.capacity = 0.5, .every = 2, .offset = 1})},
                      ModelCase{"dar", set_dar({.variant = DarVariant::dar, .block_layers = 1})}),
    model_case_name);

// The peak covers parameters + gradients + both AdamW moments (4 copies of the
// parameters in fp32) plus at least the logits of the step; a forward-only
// evaluation holds less than a training step.
TEST(ModelMemory, PeakBytesCoverStateAndActivations) {
  Config config = tiny_config();
  Model model(cpu_backend(), config);
  Buffer tokens = tiny_tokens(model, 0);
  Buffer targets = tiny_tokens(model, 1);
  const int64_t state_bytes = 4 * 4 * model.parameters().count();
  const int64_t logits_bytes = 4 * kBatch * kSeq * config.model.vocab_size;
  const StepResult train = model.train_step(tokens, targets);
  EXPECT_GE(train.peak_bytes, state_bytes + logits_bytes);
  const StepResult eval = model.evaluate(tokens, targets);
  EXPECT_LT(eval.peak_bytes, train.peak_bytes);
  EXPECT_EQ(model.memory().live_bytes(), state_bytes + logits_bytes);  // state + kept logits
}

// After a forward-only pass an AttnRes / DAR model holds no bank any more.
TEST(ModelMemory, EvaluateReleasesTheDepthBank) {
  Config config = tiny_config();
  config.dar.variant = DarVariant::dar;
  Model model(cpu_backend(), config);
  Buffer tokens = tiny_tokens(model, 0);
  const int64_t state_bytes = 4 * 4 * model.parameters().count();
  const int64_t logits_bytes = 4 * kBatch * kSeq * config.model.vocab_size;
  model.train_step(tokens, tokens);
  EXPECT_EQ(model.memory().live_bytes(), state_bytes + logits_bytes);
  model.evaluate(tokens, tokens);
  EXPECT_EQ(model.memory().live_bytes(), state_bytes + logits_bytes);
}

TEST(ModelMemory, MeasureTrainingStepUsesTheConfig) {
  Config config = tiny_config();
  config.train.micro_batch = 3;
  config.train.dtype = DType::fp32;
  const StepResult small = measure_training_step(cpu_backend(), config, 0);
  config.train.micro_batch = 6;
  const StepResult large = measure_training_step(cpu_backend(), config, 0);
  EXPECT_TRUE(std::isfinite(small.loss));
  EXPECT_GT(small.step_s, 0.0);
  // Twice the tokens: at least the extra logits (3 * 6 rows * V * 4 bytes) more.
  EXPECT_GE(large.peak_bytes - small.peak_bytes, 3 * 6 * config.model.vocab_size * 4);
  config.train.dtype = DType::fp16;
  EXPECT_THROW(measure_training_step(cpu_backend(), config, 0), ShapeError);
}

// Bad configurations are typed errors naming the field, not crashes.
TEST(ModelConfigErrors, AreConfigErrorsNamingTheField) {
  Config config = tiny_config();
  config.model.n_kv_heads = 3;  // does not divide n_heads = 2
  try {
    Model model(cpu_backend(), config);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.n_kv_heads"), std::string::npos) << e.what();
  }
  config = tiny_config();
  config.dar.variant = DarVariant::dar;
  config.dar.streams = 1;
  EXPECT_THROW(Model(cpu_backend(), config), ConfigError);
  config = tiny_config();
  config.mod.every = 1;
  config.mod.capacity = 1.5;
  EXPECT_THROW(Model(cpu_backend(), config), ConfigError);
  config = tiny_config();
  Model model(cpu_backend(), config);
  Buffer tokens = tiny_tokens(model, 0);
  Buffer wrong = model.make_tokens(token_ids(kSeq, 13, 0), 1, kSeq);
  EXPECT_THROW(model.forward_backward(tokens, wrong), ShapeError);
}

// Decoding token by token with KV caches reproduces the full forward's logits
// at every position (dense model: GQA, SwiGLU, tied head).
TEST(ModelDecode, DenseDecodeMatchesFullForward) {
  Config config = tiny_config();
  config.model.mlp = MlpKind::swiglu;
  config.model.tie_embeddings = true;
  const ModelOptions options = fp64_model_options();
  Model model(cpu_backend(), config, options);
  randomize_parameters(model.parameters(), 23, 0.25);
  const std::vector<int32_t> ids = token_ids(kSeq, 13, 1);
  Buffer tokens = model.make_tokens(ids, 1, kSeq);
  model.evaluate(tokens, tokens);
  const std::vector<double> full = model.last_logits();
  Model::DecodeState state = model.begin_decode(kSeq);
  const int64_t vocab = config.model.vocab_size;
  for (int64_t t = 0; t < kSeq; ++t) {
    const std::vector<double> step = model.decode_step(state, ids[static_cast<size_t>(t)]);
    for (int64_t v = 0; v < vocab; ++v) {
      EXPECT_NEAR(step[static_cast<size_t>(v)], full[static_cast<size_t>(t * vocab + v)], 1e-11);
    }
  }
  for (const KvCache& cache : state.caches)
    EXPECT_EQ(cache.count, kSeq);
}

// In an MoD model the routed layers' caches hold only the routed tokens, and
// exactly the tokens whose predictor logit is > 0.  Layer 0's parameters are
// zeroed, so its branches add nothing and layer 1's input is the token's
// embedding row: then the predictor's decision is computed here by hand,
// logit = gelu(E[token] P_in) . p_out (GELU, tanh form).
TEST(ModelDecode, RoutedLayersCacheExactlyThePredictedTokens) {
  Config config = tiny_config();
  config.mod.every = 2;
  config.mod.capacity = 0.5;
  config.mod.causal_router = CausalRouter::predictor;
  config.mod.predictor_hidden = 8;
  const ModelOptions options = fp64_model_options();
  Model model(cpu_backend(), config, options);
  randomize_parameters(model.parameters(), 29, 0.5);
  for (const auto& p : model.parameters().all()) {
    if (p->name.rfind("layer0.", 0) == 0)
      cpu_backend().fill(p->value.view(), 0.0);
  }
  const int64_t d = config.model.d_model, hidden = config.mod.predictor_hidden;
  const std::vector<double> embedding =
      download(cpu_backend(), model.parameters().find("embedding")->value.view());
  const Parameter* p_in = model.parameters().find("layer1.predictor_in");
  const Parameter* p_out = model.parameters().find("layer1.predictor_out");
  ASSERT_NE(p_in, nullptr);
  ASSERT_NE(p_out, nullptr);
  const std::vector<double> w_in = download(cpu_backend(), p_in->value.view());
  const std::vector<double> w_out = download(cpu_backend(), p_out->value.view());
  const auto gelu = [](double x) {
    return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
  };
  const int64_t steps = 12;
  int64_t expected_routed = 0;
  Model::DecodeState state = model.begin_decode(steps);
  for (int64_t t = 0; t < steps; ++t) {
    const int32_t token = static_cast<int32_t>((5 * t) % 13);
    double logit = 0.0;
    for (int64_t h = 0; h < hidden; ++h) {
      double z = 0.0;
      for (int64_t i = 0; i < d; ++i)
        z += embedding[static_cast<size_t>(token * d + i)] *
             w_in[static_cast<size_t>(i * hidden + h)];
      logit += gelu(z) * w_out[static_cast<size_t>(h)];
    }
    expected_routed += logit > 0.0 ? 1 : 0;
    const std::vector<double> logits = model.decode_step(state, token);
    for (double v : logits)
      EXPECT_TRUE(std::isfinite(v));
    EXPECT_EQ(state.caches[1].count, expected_routed) << "after token " << t;
  }
  // Non-trivial: some tokens routed, some not (a fixed seed).
  EXPECT_GT(expected_routed, 0);
  EXPECT_LT(expected_routed, steps);
  EXPECT_EQ(state.caches[0].count, steps);  // layer 0 dense
  EXPECT_EQ(state.caches[2].count, steps);
  Config dar = tiny_config();
  dar.dar.variant = DarVariant::attnres;
  Model dar_model(cpu_backend(), dar, options);
  EXPECT_THROW(dar_model.begin_decode(4), ConfigError);
}

}  // namespace
}  // namespace modar::runtime::layer_tests
