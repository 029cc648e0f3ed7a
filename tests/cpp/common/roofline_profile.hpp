// The A100 datasheet profile on the plain roofline path, for the tests that
// derive the cluster and timing mechanics (bytes, counts, bubble, overlap,
// the roofline formula) by hand from docs/cost_model.md and docs/cluster.md:
// the embedded a100-80gb-dgx-datasheet (the A100 before calibration) with
// its [kernel] section cleared (no sm_count:
// no GPU kernel model, the plain collective formula latency x steps + bus
// factor x bytes / busbw), the achievable ceilings it carried before the
// kernel model (267.9 TFLOP/s: the A100 MAMF; 1.733 TB/s: 85% of 2.039) and
// step latencies of 2 us (NVLink) and 4 us (network).  The kernel-model path
// of the embedded profiles is tested by hand in test_kernel_model.cpp and
// test_cluster.cpp (NCCL's collective model).
#pragma once

#include "modar/profile.hpp"

namespace modar {

inline DeviceProfile a100_roofline_profile() {
  DeviceProfile p = load_profile("a100-80gb-dgx-datasheet");
  p.kernel = KernelParams{};
  p.ceilings.achievable_flops_bf16 = 267.9e12;
  p.ceilings.achievable_bandwidth = 1.733e12;
  p.network.intra_node.latency_s = 2e-6;
  p.network.inter_node.latency_s = 4e-6;
  return p;
}

}  // namespace modar
