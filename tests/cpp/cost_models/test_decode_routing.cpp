// MoD in a decode step (docs/cost_model.md "Decode"): each new token enters a
// routed block with probability c, so the rows a routed block processes are
// Binomial(B, c) and the step's work is its expectation.  Checked against the
// binomial's closed-form moments and a hand count of the FLOPs.
#include <gtest/gtest.h>

#include <cmath>

#include "modar/cost_model.hpp"
#include "modar/profile.hpp"

namespace modar {
namespace {

Config routed_model(int64_t batch) {
  Config c;
  c.model = {.d_model = 256, .n_layers = 6, .n_heads = 4, .vocab_size = 512, .seq_len = 128};
  c.mod = {.capacity = 0.125,
           .every = 2,
           .offset = 1,
           .causal_router = CausalRouter::predictor,
           .predictor_hidden = 32};
  c.train.micro_batch = batch;
  return c;
}

TEST(DecodeRouting, RoutedRowsFollowTheBinomialMoments) {
  for (const int64_t batch : {1, 8, 64}) {
    const Config c = routed_model(batch);
    const double routed_layers = 3.0;  // layers 1, 3, 5
    double runs = 0.0;                 // expected runs of the block per step, per layer
    double rows = 0.0;                 // expected rows per step, per layer
    for (const OpRecord& op : lower(c, StepKind::decode)) {
      if (std::string(op.label) == "mod.gather") {
        runs += op.weight * double(op.multiplicity) / routed_layers;
        rows += op.weight * double(op.multiplicity) * double(op.shape.dims[0]) / routed_layers;
      }
    }
    // P(r >= 1) = 1 - (1 - c)^B and E[r] = c B.
    EXPECT_NEAR(runs, 1.0 - std::pow(1.0 - 0.125, double(batch)), 1e-9) << batch;
    EXPECT_NEAR(rows, 0.125 * double(batch), 1e-9) << batch;
  }
}

TEST(DecodeRouting, BatchOneForwardFlopsByHand) {
  // Full layers 0, 2, 4: 24 d^2 + 4 s d (one query over s cached keys).
  // Routed layers 1, 3, 5: with probability c the block runs on the token,
  // 24 d^2 + 4 k d over the k = c s cached routed tokens; the predictor
  // (d -> h -> 1) runs always: 2 d h + 2 h.  Head: 2 V d.
  const Config c = routed_model(1);
  const double d = 256, s = 128, k = 16, h = 32, V = 512, cap = 0.125;
  const double expected = 3.0 * (24.0 * d * d + 4.0 * s * d) +
                          3.0 * (cap * (24.0 * d * d + 4.0 * k * d) + 2.0 * d * h + 2.0 * h) +
                          2.0 * V * d;
  const Estimate e = estimate(c, load_profile("h200"), StepKind::decode);
  EXPECT_NEAR(e.flops.forward_per_token / expected, 1.0, 1e-12);
}

TEST(DecodeRouting, LatencyAndThroughputMoveApart) {
  // Larger batches: each step serves more tokens (throughput up) and takes
  // longer (latency up).  At batch 1 a routed block runs with probability
  // c = 1/8, so the routed model's step is below the same shape's dense step;
  // at larger batches P(r >= 1) = 1 - (7/8)^B nears 1 and this tiny,
  // launch-bound model pays for its router, predictor, gather and scatter
  // launches, so no order is asserted there.
  Config dense = routed_model(1);
  dense.mod.capacity = 1.0;
  dense.mod.every = 0;
  double last_step = 0.0, last_rate = 0.0;
  for (const int64_t batch : {1, 8, 64}) {
    Config mod = routed_model(batch);
    dense.train.micro_batch = batch;
    const Estimate e = estimate(mod, load_profile("h200"), StepKind::decode);
    EXPECT_GT(e.time.step_s, last_step);
    EXPECT_GT(e.time.tokens_per_s, last_rate);
    last_step = e.time.step_s;
    last_rate = e.time.tokens_per_s;
    if (batch == 1) {
      EXPECT_LT(e.time.step_s, estimate(dense, load_profile("h200"), StepKind::decode).time.step_s);
    }
  }
}

}  // namespace
}  // namespace modar
