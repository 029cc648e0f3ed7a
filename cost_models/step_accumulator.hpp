// estimate_into's consumer of the streamed lowering: sums FLOPs and op times.
// In a header so that lowering.cpp's Lowerer<StepAccumulator> calls it
// directly (no virtual call) and inlines it per emission site.
#pragma once

#include <iterator>

#include "attention_kernel.hpp"
#include "cost_model_internal.hpp"

namespace modar::detail {

// The TimeEstimate counter of each TimingModel::Source, in the enum's order.
inline constexpr int64_t TimeEstimate::*kOpsBySource[] = {
    &TimeEstimate::ops_roofline, &TimeEstimate::ops_interpolated, &TimeEstimate::ops_extrapolated,
    &TimeEstimate::ops_kernel_model};
static_assert(static_cast<size_t>(TimingModel::Source::roofline) == 0 &&
              static_cast<size_t>(TimingModel::Source::interpolated) == 1 &&
              static_cast<size_t>(TimingModel::Source::extrapolated) == 2 &&
              static_cast<size_t>(TimingModel::Source::kernel_model) == 3 &&
              std::size(kOpsBySource) == 4);

// Sums FLOPs and op times as the lowering streams the ops.
class StepAccumulator final : public OpConsumer {
 public:
  StepAccumulator(const TimingModel& timing, TimeEstimate& time, int64_t accumulation,
                  AttentionKernel kernel = AttentionKernel::flash, bool attention_dropout = false)
      : timing_(timing),
        time_(time),
        accumulation_(static_cast<double>(accumulation)),
        kernel_(kernel),
        attention_dropout_(attention_dropout) {}

  // Defined here so that the lowering inlines it at every emission site.
  void take(const OpRecord& op) override {
    sums.add(op);
    TimingModel::Source source = TimingModel::Source::roofline;
    const double one_s = kernel_ == AttentionKernel::flash
                             ? timing_.op_time_s(op, &source)
                             : attention_kernel_time_s(op, timing_, kernel_,
                                                       attention_dropout_, &source);
    const double multiplicity = static_cast<double>(op.multiplicity);
    const bool per_step = op.shape.kind == OpKind::optimizer_update;
    const double copies = per_step ? multiplicity : multiplicity * accumulation_;
    const double seconds = one_s * copies * op.weight;  // expected runs per step
    if (per_step) {
      time_.optimizer_s += seconds;
    } else {
      time_.micro_batch_s += one_s * multiplicity * op.weight;
    }
    OpKindTime& bucket = time_.by_kind[static_cast<size_t>(op.shape.kind)];
    bucket.count += static_cast<int64_t>(copies);
    bucket.flops += op.flops * copies * op.weight;
    bucket.bytes += op.bytes * copies * op.weight;
    bucket.time_s += seconds;
    ++(time_.*kOpsBySource[static_cast<size_t>(source)]);
  }

  FlopAccumulator sums;

 private:
  const TimingModel& timing_;
  TimeEstimate& time_;
  const double accumulation_;
  const AttentionKernel kernel_;
  const bool attention_dropout_;
};

}  // namespace modar::detail
