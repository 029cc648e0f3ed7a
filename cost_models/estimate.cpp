// estimate(): lower once, then derive FLOPs, parameters, memory and time from
// the same op list.
//
// Step time = accumulation_steps x (sum over the micro-batch's ops of
// multiplicity x op time + host time per micro-batch) + the optimizer update +
// host time per step; one stream, no overlap, no
// data-parallel communication (a lower bound on multi-device steps).
// tokens/s = tokens per step / step time (all devices); MFU = model FLOPs per
// step / (step time x peak x devices), HFU the same with recompute FLOPs.
#include "cost_model_internal.hpp"
#include "modar/parallel.hpp"
#include "grad_accumulation.hpp"
#include "step_accumulator.hpp"

namespace modar {

std::string conventions_text(const Config& config, const DeviceProfile& profile, StepKind step) {
  std::string text;
  text.reserve(900);
  text += "1 multiply-add = 2 FLOPs; GEMM backward = 2x forward; attention FLOPs: ";
  switch (config.attention_flops) {
    case AttentionFlops::causal:
      text += "causal (half of the s x s square, Megatron-LM), backward 2x";
      break;
    case AttentionFlops::full:
      text += "full (the whole s x s square, nanoGPT / PaLM), backward 2x";
      break;
    case AttentionFlops::flash:
      text += "flash (half square, backward 2.5x: FlashAttention's 7/2)";
      break;
  }
  text += "; MoD routed layers: k x k square, linear FLOPs on k tokens per sequence";
  text +=
      "; counted: GEMMs, attention, MoD router/predictor, LM head, AttnRes/DAR depth reads "
      "(docs/dar_math.md 4.3); not counted (bytes only): norms, RoPE, softmax/top-k, elementwise, "
      "gather/scatter, cross-entropy, embedding lookup, optimizer";
  text += "; N_f = forward FLOPs per token without attention / 2";
  if (step == StepKind::train) {
    text += "; training FLOPs = forward + backward (model FLOPs, MFU)";
    if (config.train.recompute != Recompute::none ||
        config.train.recompute_granularity != RecomputeGranularity::none) {
      text += " + " + recompute_text(config.train) + " recompute (hardware FLOPs, HFU)";
    }
    text +=
        "; memory: bf16/fp16 weights, fp32 gradients, AdamW fp32 master + m + v, peak over the "
        "step (forward/backward boundary or the last layer's backward)";
  } else {
    text +=
        "; decode: one new token per sequence over a KV cache of seq_len tokens (routed "
        "layers: k cached tokens; expected work over the routed count ~ Binomial(batch, "
        "capacity), r = 0 skips the block)";
  }
  text += "; time: ";
  const bool kernel_model = profile.kernel.sm_count > 0;
  text += profile.measured ? "measured op table of profile '"
          : kernel_model   ? "GPU kernel model of profile '"
                           : "uncalibrated roofline of profile '";
  text += profile.name;
  text += profile.measured ? "' (log-space interpolation, fitted efficiency outside the grid)"
          : kernel_model
              ? "' (tile and wave quantization, FlashAttention rates, per-family bandwidth "
                "from published facts and [kernel] parameters, not measured; "
                "docs/kernel_model.md)"
              : "' (datasheet ceilings, not measured)";
  text += ", one stream, no communication";
  if (config.dar.enabled()) {
    text +=
        "; DAR coefficients: modar's mHC-style parameterisation (the paper's exact equations "
        "are not public)";
  }
  return text;
}

void set_utilization(const DeviceProfile& profile, const FlopCounts& flops, double peak_flops,
                     TimeEstimate& time) {
  const double capacity = time.step_s * peak_flops;  // FLOPs the job could have run
  const auto utilization = [capacity](double step_flops) {
    return capacity > 0.0 ? step_flops / capacity : 0.0;
  };
  time.mfu = utilization(flops.train_per_step);
  time.hfu = utilization(flops.hardware_per_step);
  time.mfu_full_attention = utilization(flops.train_per_step_full_attention);
  const PublishedMfu* published = published_mfu(profile);
  if (published == nullptr) {
    time.published_mfu = 0.0;
    time.mfu_as_published = 0.0;
    time.published_mfu_attention_flops = "";
    time.published_mfu_source = "";
    time.mfu_beyond_published = false;
    return;
  }
  time.published_mfu = published->mfu;
  time.mfu_as_published = published->attention_flops == AttentionFlops::full
                              ? time.mfu_full_attention
                              : utilization(flops.train_per_step_causal_attention);
  time.published_mfu_attention_flops = to_string(published->attention_flops);
  time.published_mfu_source = published->source;
  time.mfu_beyond_published = time.mfu_as_published > published->mfu;
}

void estimate_into(const Config& config, const TimingModel& timing, StepKind step,
                   OpList& /*scratch*/, Estimate& out) {
  const DeviceProfile& profile = timing.profile();
  check_profile_dtype(profile, config.train.dtype);  // O(1) unless it throws
  check_attention_kernel(profile, config.train.attention_kernel);
  out.params = detail::closed_form_params(config);
  out.cluster.reset();  // single-device until apply_parallel_model()

  // The lowering streams its ops straight into the sums (nothing stored).
  TimeEstimate& time = out.time;
  time = TimeEstimate{};
  for (int i = 0; i < kOpKindCount; ++i) {
    time.by_kind[static_cast<size_t>(i)].kind = static_cast<OpKind>(i);
  }
  const int64_t accumulation = step == StepKind::train ? detail::accumulation_steps(config) : 1;
  time.accumulation_steps = accumulation;
  detail::StepAccumulator accumulator(timing, time, accumulation,
                                      config.train.attention_kernel,
                                      config.train.attention_dropout > 0.0);
  detail::lower_streaming(config, step, out.params.total, accumulator);
  const detail::FlopAccumulator& sums = accumulator.sums;
  out.flops = sums.finish(config, step);
  out.params.flop_active =
      step == StepKind::train
          ? (out.flops.forward_per_token - out.flops.forward_attention_per_token) / 2.0
          : 0.0;
  if (step != StepKind::train) {
    // N_f is a property of the model: take it from the training lowering.
    struct ForwardSums final : detail::OpConsumer {
      void take(const OpRecord& op) override { sums.add(op); }
      detail::FlopAccumulator sums;
    } train;
    detail::lower_streaming(config, StepKind::train, out.params.total, train);
    const FlopCounts train_flops = train.sums.finish(config, StepKind::train);
    out.params.flop_active =
        (train_flops.forward_per_token - train_flops.forward_attention_per_token) / 2.0;
    out.flops.backward_per_token = 0.0;
    out.flops.train_per_token = out.flops.forward_per_token;
    out.flops.train_per_step = out.flops.forward_per_token * out.flops.tokens_per_step;
    out.flops.hardware_per_step = out.flops.train_per_step;
  }
  out.memory =
      detail::memory_from_params(config, out.params.total, profile.ceilings.memory_bytes, step);

  if (step == StepKind::train) {
    // train.grad_accumulation = unfused: a read-modify-write of the main
    // gradients per micro-batch (docs/cluster.md), listed with the elementwise ops.
    const double accumulate_s =
        detail::grad_accumulation_time_s(out.params.total, config, timing.rates());
    if (accumulate_s > 0.0) {
      time.micro_batch_s += accumulate_s;
      OpKindTime& bucket = time.by_kind[static_cast<size_t>(OpKind::elementwise)];
      const double steps = static_cast<double>(accumulation);
      bucket.count += accumulation;
      bucket.bytes += steps * detail::grad_accumulation_bytes(out.params.total, config);
      bucket.flops += steps * out.params.total;
      bucket.time_s += steps * accumulate_s;
    }
  }
  time.extrapolated = time.ops_extrapolated > 0;
  time.calibrated = time.ops_interpolated + time.ops_extrapolated > 0;
  // Host time per micro-batch and per step (profile [kernel]; 0 by default).
  const KernelParams& kernel = timing.rates().params;
  time.micro_batch_overhead_s = kernel.micro_batch_overhead_s;
  time.micro_batch_s += time.micro_batch_overhead_s;
  time.step_overhead_s = step == StepKind::train ? kernel.step_overhead_s : 0.0;
  // The gradient norm and clipping pass over the main gradients (once per step).
  time.grad_norm_s =
      step == StepKind::train
          ? detail::grad_norm_time_s(out.params.total, config, timing.rates())
          : 0.0;
  time.step_s = static_cast<double>(accumulation) * time.micro_batch_s + time.optimizer_s +
                time.grad_norm_s + time.step_overhead_s;
  const double devices = static_cast<double>(config.device.count);
  const double peak = profile.ceilings.peak_flops(config.train.dtype) * devices;
  if (time.step_s > 0.0) {
    time.tokens_per_s = out.flops.tokens_per_step / time.step_s;
  }
  set_utilization(profile, out.flops, peak, time);
  // The text depends on a few switches only: build it once per combination
  // and copy it into the caller's buffer (no allocation once it is large enough).
  struct CachedConventions {
    AttentionFlops attention;
    Recompute recompute;
    RecomputeGranularity granularity;
    std::string modules;
    StepKind step;
    bool depth_reads;
    bool measured;
    bool kernel_model;
    const DeviceProfile* profile;
    std::string profile_name;
    std::string text;
  };
  thread_local std::vector<CachedConventions> cache;
  const CachedConventions* hit = nullptr;
  for (const CachedConventions& entry : cache) {
    if (entry.attention == config.attention_flops && entry.recompute == config.train.recompute &&
        entry.granularity == config.train.recompute_granularity &&
        entry.modules == config.train.recompute_modules &&
        entry.step == step && entry.depth_reads == config.dar.enabled() &&
        entry.profile == &profile && entry.measured == profile.measured &&
        entry.kernel_model == (profile.kernel.sm_count > 0) && entry.profile_name == profile.name) {
      hit = &entry;
      break;
    }
  }
  if (hit == nullptr) {
    if (cache.size() > 64) {
      cache.clear();
    }
    cache.push_back({config.attention_flops, config.train.recompute,
                     config.train.recompute_granularity, config.train.recompute_modules, step,
                     config.dar.enabled(), profile.measured, profile.kernel.sm_count > 0,
                     &profile, profile.name,
                     conventions_text(config, profile, step)});
    hit = &cache.back();
  }
  out.conventions.assign(hit->text);
}

namespace {

// The cluster model (parallel.cpp) replaces the single-device memory and time.
void apply_cluster(const Config& config, const TimingModel& timing, Estimate& out) {
  auto cluster = std::make_shared<ClusterEstimate>(estimate_cluster(config, timing, out));
  const StageSummary& busiest = cluster->stages[static_cast<size_t>(cluster->busiest_stage)];
  out.memory = busiest.memory;
  const StageSummary& slowest = cluster->stages[static_cast<size_t>(cluster->slowest_stage)];
  TimeEstimate& time = out.time;
  time.micro_batch_s = slowest.compute_s + slowest.exposed_comm_s;
  time.optimizer_s = cluster->optimizer_s;
  time.grad_norm_s = cluster->grad_norm_s;
  time.step_overhead_s = cluster->step_overhead_s;
  time.accumulation_steps = cluster->micro_batches;
  time.step_s = cluster->step_s;
  const double peak = timing.profile().ceilings.peak_flops(config.train.dtype) *
                      static_cast<double>(config.device.count);
  time.tokens_per_s = time.step_s > 0 ? out.flops.tokens_per_step / time.step_s : 0.0;
  set_utilization(timing.profile(), out.flops, peak, time);
  out.conventions = cluster_conventions(out.conventions, *cluster);
  out.cluster = std::move(cluster);
}

}  // namespace

std::string cluster_conventions(const std::string& single_device, const ClusterEstimate& cluster) {
  std::string text = single_device;
  const std::string single = ", one stream, no communication";
  const size_t at = text.find(single);
  if (at != std::string::npos) {
    text.erase(at, single.size());
  }
  return text + "; cluster: tensor x pipeline x data = " + std::to_string(cluster.tensor) + " x " +
         std::to_string(cluster.pipeline) + " x " + std::to_string(cluster.data) +
         ", memory per device of the busiest stage, step = m x slowest stage + bubble (p-1)/(v m) "
         "+ unhidden gradient reduction + sharded optimizer (docs/cluster.md)";
}

void apply_parallel_model(const Config& config, const TimingModel& timing, StepKind step,
                          Estimate& out) {
  if (step == StepKind::train && cluster_engaged(config)) {
    apply_cluster(config, timing, out);
  }
}

Estimate estimate(const Config& config, const DeviceProfile& profile, StepKind step) {
  validate(config);
  const TimingModel timing(profile);
  OpList ops;
  Estimate out;
  estimate_into(config, timing, step, ops, out);
  apply_parallel_model(config, timing, step, out);
  return out;
}

}  // namespace modar
