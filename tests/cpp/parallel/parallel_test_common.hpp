// tests/cpp/parallel/parallel_test_common.hpp: what the parallel-equals-serial
// test binaries share (each binary has one translation unit that includes it):
// the tiny fp64 model and its families, the global batch's token ids, the
// single-process reference step, the comparisons (1e-12) and main.
//
// Every rank also runs the single-process Model on the whole global batch (the
// models are tiny) and compares with its own part after two AdamW steps.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../common/tiny_model.hpp"
#include "modar/base/errors.hpp"
#include "modar/runtime/forwarding_communicator.hpp"
#include "modar/runtime/host_facts.hpp"
#include "modar/runtime/parallel_steps.hpp"

namespace modar::runtime {
namespace {

// Set by run_parallel_tests() (main) before the tests run.
Backend* g_backend = nullptr;
Communicator* g_world = nullptr;

constexpr double kRelative = 1e-12;
constexpr int kSteps = 2;
constexpr int64_t kBatch = 8;  // global batch (divisible by every dp x microbatches used)

// d 16, 4 layers, 2 heads over 1 KV head, d_ff 24, V 13, s 6, untied head.
inline Config tiny_config() {
  return tiny_model(4);
}

// The group sizes among {1, 2, 4} that divide the world (the layouts a run
// of this many ranks can hold).
inline std::vector<int64_t> sizes_dividing_world() {
  std::vector<int64_t> sizes;
  for (const int64_t size : {int64_t{1}, int64_t{2}, int64_t{4}}) {
    if (g_world->size() % size == 0) {
      sizes.push_back(size);
    }
  }
  return sizes;
}

// `make` throws a ConfigError whose message names each of `fields` (with the
// value: "parallel.tensor = 2").
template <typename Make>
void expect_config_error(Make&& make, std::initializer_list<const char*> fields) {
  try {
    make();
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    for (const char* field : fields) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  }
}

struct Family {
  std::string name;
  std::function<void(Config&)> edit;
};

// The model families every layout is tested with (each file adds its own).
inline std::vector<Family> common_families() {
  return {
      {"dense", [](Config&) {}},
      {"dense_tied", [](Config& c) { c.model.tie_embeddings = true; }},
      {"mod", set_mod({.capacity = 0.5, .every = 2, .causal_router = CausalRouter::aux_loss})},
      {"mod_predictor", set_mod({.capacity = 0.34,
                                 .every = 1,
                                 .router_scale = RouterScale::sigmoid,
                                 .causal_router = CausalRouter::predictor,
                                 .predictor_hidden = 8})},
      {"dar", set_dar({.variant = DarVariant::dar, .block_layers = 1})},
      {"attnres", set_dar({.variant = DarVariant::attnres, .block_layers = 2})},
      {"mod_dar",
       set_mod_dar({.capacity = 0.5, .every = 2, .causal_router = CausalRouter::aux_loss},
                   {.variant = DarVariant::dar, .block_layers = 2})},
  };
}

inline ModelOptions fp64_options() {
  return {
      .dtype = ScalarType::fp64, .seed = 8, .adamw = {.learning_rate = 1e-3, .weight_decay = 0.1}};
}

// Deterministic tokens / targets of the global batch: rows [begin, begin + count).
inline std::vector<int32_t> ids(int64_t vocab, int64_t seq, int64_t begin, int64_t count,
                                int shift) {
  std::vector<int32_t> values;
  for (int64_t r = begin; r < begin + count; ++r) {
    for (int64_t t = 0; t < seq; ++t) {
      const int64_t i = r * seq + t + shift;
      values.push_back(static_cast<int32_t>((i * 7919 + 13 + (i * i) % 5) % vocab));
    }
  }
  return values;
}

// Tokens all different within a sequence (seq <= vocab): (5 r + 7 t + 3) mod
// V, targets the next position's.  The tensor-parallel test uses these: a
// token repeated in a sequence and routed together with its copy keeps a
// residual EQUAL to the copy's in exact arithmetic (attention over two equal
// values returns that value; RoPE rotates only q and k), so their router
// logits tie exactly and MoD's top-k picks between them by the last bit of
// rounding, which the tensor ranks' partial sums change (see "MoD top-k at
// exact ties" in docs/runtime_parallel.md).
inline std::vector<int32_t> distinct_ids(int64_t vocab, int64_t seq, int64_t begin, int64_t count,
                                         int shift) {
  EXPECT_LE(seq, vocab) << "distinct tokens need seq <= vocab";
  std::vector<int32_t> values;
  for (int64_t r = begin; r < begin + count; ++r) {
    for (int64_t t = 0; t < seq; ++t) {
      values.push_back(static_cast<int32_t>((5 * r + 7 * (t + shift) + 3) % vocab));
    }
  }
  return values;
}

using TokenIds = std::vector<int32_t> (*)(int64_t, int64_t, int64_t, int64_t, int);

// distinct_ids' targets with the end of each row ignored (-1), more in later
// rows (row r loses its last r mod s targets), so that the micro-batches and
// ranks of a batch count different numbers of targets.
inline std::vector<int32_t> tail_ignored_ids(int64_t vocab, int64_t seq, int64_t begin,
                                             int64_t count, int shift) {
  std::vector<int32_t> values = distinct_ids(vocab, seq, begin, count, shift);
  for (int64_t r = begin; r < begin + count; ++r) {
    for (int64_t t = seq - r % seq; t < seq; ++t) {
      values[static_cast<size_t>((r - begin) * seq + t)] = -1;
    }
  }
  return values;
}

struct Reference {
  std::vector<StepResult> steps;
  std::vector<std::vector<double>> grads;  // of the last step, per parameter (global mean)
  std::vector<std::vector<double>> values;
  std::vector<std::string> names;
};

// target_ids: the targets' ids (shift 1; default: token_ids').
inline Reference serial_reference(const Config& config, TokenIds token_ids = ids,
                                  const ModelOptions& options = fp64_options(),
                                  TokenIds target_ids = nullptr) {
  Model model(*g_backend, config, options);
  const int64_t seq = config.model.seq_len, vocab = config.model.vocab_size;
  target_ids = target_ids != nullptr ? target_ids : token_ids;
  Buffer tokens = model.make_tokens(token_ids(vocab, seq, 0, kBatch, 0), kBatch, seq);
  Buffer targets = model.make_tokens(target_ids(vocab, seq, 0, kBatch, 1), kBatch, seq);
  Reference ref;
  for (int s = 0; s < kSteps; ++s) {
    ref.steps.push_back(model.train_step(tokens, targets));
  }
  for (const auto& p : model.parameters().all()) {
    ref.names.push_back(p->name);
    ref.grads.push_back(download(*g_backend, p->grad));
    ref.values.push_back(download(*g_backend, p->value));
  }
  return ref;
}

// This rank's rows of the global batch (rows kBatch / dp from its data rank),
// as token and target buffers.
struct RankBatch {
  Buffer tokens, targets;
};
inline RankBatch rank_batch(const Config& config, const ProcessGroups& groups,
                            TokenIds token_ids = ids, TokenIds target_ids = nullptr) {
  const Context ctx{*g_backend, nullptr, ScalarType::fp64};
  const int64_t rows = kBatch / groups.shape.data, seq = config.model.seq_len;
  const int64_t vocab = config.model.vocab_size, first = groups.at.data * rows;
  target_ids = target_ids != nullptr ? target_ids : token_ids;
  return {ctx.indices({rows, seq}, token_ids(vocab, seq, first, rows, 0)),
          ctx.indices({rows, seq}, target_ids(vocab, seq, first, rows, 1))};
}

inline size_t index_of(const Reference& ref, const std::string& name) {
  const auto it = std::find(ref.names.begin(), ref.names.end(), name);
  EXPECT_NE(it, ref.names.end()) << name;
  return static_cast<size_t>(it - ref.names.begin());
}

inline void expect_close(double got, double want, const std::string& what) {
  EXPECT_LE(std::abs(got - want), kRelative * std::abs(want))
      << what << ": " << got << " vs " << want;
}

inline void expect_losses(const StepResult& got, const StepResult& want, const std::string& what) {
  expect_close(got.loss, want.loss, what + " loss");
  expect_close(got.lm_loss, want.lm_loss, what + " lm_loss");
  expect_close(got.router_aux, want.router_aux, what + " router_aux");
  expect_close(got.predictor, want.predictor, what + " predictor");
}

// kSteps training steps of `trainer` on this rank's batch, each step's
// losses against the single-process reference's.
template <typename Trainer>
void expect_reference_steps(Trainer& trainer, const RankBatch& batch, const Reference& ref,
                            const std::string& what) {
  for (int s = 0; s < kSteps; ++s) {
    const StepResult got = trainer.train_step(batch.tokens, batch.targets);
    expect_losses(got, ref.steps[static_cast<size_t>(s)], what + " step " + std::to_string(s));
  }
}

// The largest |entry| of a tensor: the scale its elements are compared at.
inline double max_abs(const std::vector<double>& values) {
  double scale = 0.0;
  for (double v : values) {
    scale = std::max(scale, std::abs(v));
  }
  return scale;
}

// Every element of a parameter to 1e-12 relative to the parameter's largest
// entry (an element near zero is the difference p - lr u of two O(scale)
// numbers, so its own relative error is not meaningful).
inline void expect_values(const std::vector<double>& got, const std::vector<double>& want,
                          const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double scale = max_abs(want);
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::abs(got[i] - want[i]) > kRelative * scale) {
      if (++bad <= 3) {
        ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs " << want[i];
      }
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

// Gradients (sums of means reduced in another order) to 1e-12 of the tensor's
// largest entry.
inline void expect_gradient(const std::vector<double>& got, const std::vector<double>& want,
                            const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double scale = max_abs(want);
  // (A reference gradient that is exactly zero, e.g. the depth key norm's at
  // zero queries, must be exactly zero here too: scale 0 allows no error.)
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_LE(std::abs(got[i] - want[i]), kRelative * scale)
        << what << "[" << i << "]: " << got[i] << " vs " << want[i];
  }
}

// Rank r's block of a reference parameter, by name (Megatron's split):
// column-parallel Wq / Wk / Wv / W_in / W_gate / W_up, row-parallel Wo / W_out;
// with the vocabulary split (t > 1 dividing V) the embedding's rows and the
// head's columns.
inline std::vector<double> megatron_shard(const std::string& name, const std::vector<double>& full,
                                          int64_t rows, int64_t cols, int64_t t, int64_t r,
                                          bool vocab_split = false) {
  auto ends = [&](const char* tail) {
    const std::string s(tail);
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  const bool column = ends(".wq") || ends(".wk") || ends(".wv") || ends(".w_in") ||
                      ends(".w_gate") || ends(".w_up") || (vocab_split && name == "head");
  const bool row = ends(".wo") || ends(".w_out") || (vocab_split && name == "embedding");
  if (t == 1 || (!column && !row)) {
    return full;  // (t = 1: also the 3-D expert weights, [E, d, f])
  }
  std::vector<double> out;
  const int64_t r0 = row ? r * rows / t : 0, r1 = row ? (r + 1) * rows / t : rows;
  const int64_t c0 = column ? r * cols / t : 0, c1 = column ? (r + 1) * cols / t : cols;
  for (int64_t i = r0; i < r1; ++i) {
    for (int64_t j = c0; j < c1; ++j) {
      out.push_back(full[static_cast<size_t>(i * cols + j)]);
    }
  }
  return out;
}

// A group with every send recorded (peer, bytes): an account of the traffic
// independent of the trainer's own bookkeeping.
class CountingCommunicator final : public ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  std::vector<std::pair<int, int64_t>> sends;

 protected:
  void observe(const CommCall& call, const std::function<void()>& run) override {
    if (call.op == CommOp::send || call.op == CommOp::send_recv) {
      sends.emplace_back(call.send_peer, call.input->bytes());
    }
    run();
  }
};

// ---- the planner's bank bytes, by hand ---------------------------------------------------
//
// cost_models/parallel.cpp (bank_entries_at, the dar_bank_cache branch):
// the boundary after layer l sends the bank entries that exist then, H_0 and
// one per completed block (l / K), plus the partial of a block the boundary
// cuts (l mod K != 0) as one more entry; each entry is n T (d B + B_stats)
// bytes (the planner writes 4 for the fp32 statistic; in fp64 the runtime's
// key rstd is fp64: 8).  With the cache the receiving stage already holds
// the complete entries it had at the end of its previous chunk (1 + l' / K
// with l' that chunk's end layer): only the rest goes.  The backward returns
// the gradient of the same entries (d B each: the rstd is a function of its
// entry, not an input).
//
// Full AttnRes (K = 1) makes every BRANCH its own entry (docs/model.md AttnRes/DAR,
// docs/dar_math.md 1.2): 1 + 2 l entries after layer l, where the planner's
// bank_entries_at counts 1 + l (an undercount in the planner, reported).
struct BankShape {
  int64_t streams = 1;
  int64_t block_layers = 1;
  bool per_branch = false;  // Full AttnRes
  int64_t complete(int64_t layer) const {
    return per_branch ? 1 + 2 * layer : 1 + layer / block_layers;
  }
  bool cut(int64_t layer) const { return !per_branch && layer % block_layers != 0; }
};

inline BankShape bank_shape(const Config& c) {
  BankShape b;
  b.streams = c.dar.variant == DarVariant::attnres ? 1 : c.dar.streams;
  b.block_layers = c.dar.block_layers;
  b.per_branch = c.dar.variant == DarVariant::attnres && c.dar.block_layers == 1;
  return b;
}

// The sends (peer, bytes) one step makes on pipeline stage `stage` (each
// tensor rank of t sends 1 / t: its own tokens' entries under SP, else its
// piece of the replicated bank).
inline std::vector<std::pair<int, int64_t>> expected_sends(const Config& config, int64_t stages,
                                                           int64_t virtual_stages, bool cache,
                                                           int64_t micro_rows, int64_t microbatches,
                                                           int64_t stage, int64_t tensor = 1) {
  const BankShape bank = bank_shape(config);
  const int64_t L = config.model.n_layers, chunks = stages * virtual_stages;
  std::vector<int64_t> end(static_cast<size_t>(chunks));  // equal chunks, first L mod C longer
  int64_t layer = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    layer += L / chunks + (c < L % chunks ? 1 : 0);
    end[static_cast<size_t>(c)] = layer;
  }
  const int64_t T = micro_rows * config.model.seq_len / tensor, d = config.model.d_model, B = 8;
  std::vector<std::pair<int, int64_t>> out;
  for (int64_t mb = 0; mb < microbatches; ++mb) {
    for (int64_t c = 0; c + 1 < chunks; ++c) {
      const int64_t l = end[static_cast<size_t>(c)];
      int64_t held = 0;
      if (cache && c + 1 - stages >= 0) {
        held = bank.complete(end[static_cast<size_t>(c + 1 - stages)]);
      }
      const int64_t k = bank.complete(l) - held + (bank.cut(l) ? 1 : 0);
      if (k == 0) {
        continue;
      }
      const int64_t from_stage = c % stages, to_stage = (c + 1) % stages;
      if (from_stage == stage) {  // forward: entries, then their rstd
        out.emplace_back(static_cast<int>(to_stage), bank.streams * k * T * d * B);
        out.emplace_back(static_cast<int>(to_stage), bank.streams * k * T * B);
      }
      if (to_stage == stage) {  // backward: their gradient
        out.emplace_back(static_cast<int>(from_stage), bank.streams * k * T * d * B);
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

// The whole main of a parallel test binary: a CPU backend, the MPI world
// under mpirun (else a one-rank world), the tests, one verdict for all ranks.
inline int run_parallel_tests(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::unique_ptr<Backend> backend = make_cpu_backend();
  std::unique_ptr<Communicator> world =
      launched_by_mpirun() ? make_world_communicator(*backend) : make_self_communicator(*backend);
  g_backend = backend.get();
  g_world = world.get();
  int failed = RUN_ALL_TESTS();
  // One verdict for all ranks: any rank's failure fails the run.
  failed =
      static_cast<int>(all_reduce_sum(*backend, *world, {static_cast<double>(failed != 0)})[0]);
  world.reset();
  return failed != 0 ? 1 : 0;
}

}  // namespace modar::runtime
