// Whole training steps on the GPU (include/modar/runtime/model.hpp):
//   * a CUDA step against the CPU reference (FlashAttention rule on the loss,
//     the logits and every parameter gradient: fp64 CPU truth, CPU in the same
//     precision as the naive implementation), dense / MoD / MoD predictor
//     mode / DAR models;
//   * determinism: two models with the same seed give bitwise-identical
//     losses and parameters after several steps;
//   * the caching allocator: after two warm-up steps, further steps make no
//     cudaMalloc at all (cuda_device_malloc_calls unchanged) and are served
//     from the free lists (cuda_allocator_stats).
// All skip without a GPU.
#include <functional>

#include "cuda_test_util.hpp"
#include "modar/config.hpp"
#include "modar/runtime/cuda_backend.hpp"
#include "modar/runtime/model.hpp"

namespace modar::runtime::cuda_testing {
namespace {

constexpr int64_t kBatch = 4, kSeq = 64, kVocab = 97;

Config base_config() {
  Config config;
  config.model.d_model = 128;
  config.model.n_layers = 2;
  config.model.n_heads = 4;  // d_head 32: the cuDNN path takes it in bf16
  config.model.n_kv_heads = 2;
  config.model.d_ff = 256;
  config.model.vocab_size = kVocab;
  config.model.seq_len = kSeq;
  return config;
}

struct ModelKind {
  const char* name;
  std::function<void(Config&)> edit;
  bool routed = false;  // MoD: top-k can flip near-ties between precisions
};

const ModelKind kKinds[] = {
    {"dense", [](Config&) {}},
    {"mod",
     [](Config& c) {
       c.mod.every = 2;
       c.mod.offset = 1;
       c.mod.capacity = 0.25;
     },
     true},
    {"mod_predictor",
     [](Config& c) {
       c.mod.every = 2;
       c.mod.offset = 1;
       c.mod.capacity = 0.25;
       c.mod.causal_router = CausalRouter::predictor;
       c.mod.predictor_hidden = 32;
     },
     true},
    {"dar",
     [](Config& c) {
       c.dar.variant = DarVariant::dar;
       c.dar.block_layers = 1;
     }},
};

std::vector<int32_t> ids(int64_t count, int shift) {
  std::vector<int32_t> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    out[static_cast<size_t>(i)] = static_cast<int32_t>((13 * i + 5 + shift * i * i) % kVocab);
  }
  return out;
}

struct StepOutputs {
  double loss = 0.0;
  std::vector<double> logits;
  std::vector<std::vector<double>> grads;  // in parameter order
  std::vector<std::string> names;
};

StepOutputs one_step(Backend& backend, const Config& config, ScalarType dtype) {
  ModelOptions options;
  options.dtype = dtype;
  options.seed = 11;
  Model model(backend, config, options);
  Buffer tokens = model.make_tokens(ids(kBatch * kSeq, 0), kBatch, kSeq);
  Buffer targets = model.make_tokens(ids(kBatch * kSeq, 1), kBatch, kSeq);
  StepOutputs out;
  out.loss = model.forward_backward(tokens, targets).loss;
  out.logits = model.last_logits();
  for (const auto& p : model.parameters().all()) {
    out.grads.push_back(download(backend, p->grad.view()));
    out.names.push_back(p->name);
  }
  return out;
}

void expect_rule(const std::string& label, double eps, const std::vector<double>& gpu,
                 const std::vector<double>& naive, const std::vector<double>& truth) {
  ASSERT_EQ(gpu.size(), truth.size()) << label;
  const double gpu_error = max_error(gpu, truth);
  const double naive_error = max_error(naive, truth);
  const double floor = eps * (1.0 + max_abs(truth));
  EXPECT_LE(gpu_error, 2.0 * naive_error + floor)
      << label << ": gpu error " << gpu_error << ", naive cpu error " << naive_error
      << ", floor " << floor;
}

TEST(CudaModel, TrainingStepMatchesTheCpuReference) {
  MODAR_REQUIRE_CUDA();
  for (const ModelKind& kind : kKinds) {
    Config config = base_config();
    kind.edit(config);
    const StepOutputs truth = one_step(cpu(), config, ScalarType::fp64);
    for (const ScalarType dtype : {ScalarType::fp32, ScalarType::bf16}) {
      const double eps = dtype == ScalarType::fp32 ? std::ldexp(1.0, -20) : std::ldexp(1.0, -8);
      const std::string label = std::string(kind.name) + (dtype == ScalarType::fp32 ? " fp32" : " bf16");
      const StepOutputs naive = one_step(cpu(), config, dtype);
      const StepOutputs device = one_step(gpu(), config, dtype);
      expect_rule(label + " loss", eps, {device.loss}, {naive.loss}, {truth.loss});
      if (kind.routed && dtype == ScalarType::bf16) {
        // bf16 router logits may order a near-tie differently on each side,
        // which moves single elements of logits and gradients by O(1): the
        // loss is compared, the elementwise outputs in fp32 only.
        continue;
      }
      expect_rule(label + " logits", eps, device.logits, naive.logits, truth.logits);
      ASSERT_EQ(device.grads.size(), truth.grads.size()) << label;
      for (size_t i = 0; i < truth.grads.size(); ++i) {
        expect_rule(label + " grad " + truth.names[i], eps, device.grads[i], naive.grads[i],
                    truth.grads[i]);
      }
    }
  }
}

// Losses of `steps` training steps and the parameters after them.
struct Trajectory {
  std::vector<double> losses;
  std::vector<std::vector<double>> parameters;
};

Trajectory train(Backend& backend, const Config& config, int steps) {
  ModelOptions options;
  options.dtype = ScalarType::bf16;
  options.seed = 23;
  Model model(backend, config, options);
  Buffer tokens = model.make_tokens(ids(kBatch * kSeq, 2), kBatch, kSeq);
  Buffer targets = model.make_tokens(ids(kBatch * kSeq, 3), kBatch, kSeq);
  Trajectory t;
  for (int step = 0; step < steps; ++step) {
    t.losses.push_back(model.train_step(tokens, targets).loss);
  }
  for (const auto& p : model.parameters().all()) {
    t.parameters.push_back(download(backend, p->optimizer_view()));
  }
  return t;
}

TEST(CudaModel, RepeatedStepsAreBitwiseDeterministic) {
  MODAR_REQUIRE_REAL_CUDA();
  for (const ModelKind& kind : kKinds) {
    Config config = base_config();
    kind.edit(config);
    const Trajectory first = train(gpu(), config, 4);
    const Trajectory second = train(gpu(), config, 4);
    ASSERT_EQ(first.losses.size(), second.losses.size());
    for (size_t i = 0; i < first.losses.size(); ++i) {
      EXPECT_EQ(first.losses[i], second.losses[i]) << kind.name << " step " << i;
    }
    ASSERT_EQ(first.parameters.size(), second.parameters.size());
    for (size_t i = 0; i < first.parameters.size(); ++i) {
      EXPECT_EQ(first.parameters[i], second.parameters[i]) << kind.name << " parameter " << i;
    }
    // Training moves the loss (the steps did something).
    EXPECT_NE(first.losses.front(), first.losses.back()) << kind.name;
  }
}

TEST(CudaModel, NoDeviceAllocationAfterWarmup) {
  MODAR_REQUIRE_REAL_CUDA();
  for (const ModelKind& kind : kKinds) {
    Config config = base_config();
    kind.edit(config);
    ModelOptions options;
    options.dtype = ScalarType::bf16;
    Model model(gpu(), config, options);
    Buffer tokens = model.make_tokens(ids(kBatch * kSeq, 4), kBatch, kSeq);
    Buffer targets = model.make_tokens(ids(kBatch * kSeq, 5), kBatch, kSeq);
    model.train_step(tokens, targets);
    model.train_step(tokens, targets);
    gpu().synchronize();
    const int64_t mallocs_before = cuda_device_malloc_calls();
    const CudaAllocatorStats before = cuda_allocator_stats(gpu());
    for (int step = 0; step < 3; ++step) {
      model.train_step(tokens, targets);
    }
    gpu().synchronize();
    const CudaAllocatorStats after = cuda_allocator_stats(gpu());
    EXPECT_EQ(cuda_device_malloc_calls(), mallocs_before) << kind.name;
    EXPECT_EQ(after.device_mallocs, before.device_mallocs) << kind.name;
    EXPECT_EQ(after.device_frees, before.device_frees) << kind.name;
    const int64_t requests = after.requests - before.requests;
    EXPECT_GT(requests, 0) << kind.name;
    EXPECT_EQ(after.cache_hits - before.cache_hits, requests) << kind.name;
    // Every step gives back what it took: the bytes in use return to the
    // level before the steps.
    EXPECT_EQ(after.bytes_in_use, before.bytes_in_use) << kind.name;
  }
}

}  // namespace
}  // namespace modar::runtime::cuda_testing
