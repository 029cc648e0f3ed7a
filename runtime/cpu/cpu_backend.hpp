// runtime/cpu/cpu_backend.hpp: the CPU (Eigen) backend, the reference every other
// backend is tested against.  One .cpp per op family in runtime/cpu/; each opens
// with a comment on its math and memory layout and defines the run_op()
// overloads of its ops (one per row of the op table, op_args.hpp).
#pragma once

#include <memory>
#include <string>

#include "modar/runtime/backend.hpp"

namespace modar::runtime::cpu {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  DeviceKind device() const override { return DeviceKind::cpu; }
  DeviceFacts facts() const override;
  // Every op, in fp64 / fp32 / bf16 (bf16 computes in fp32).
  bool supports(OpId, ScalarType) const override { return true; }
  void* allocate(int64_t bytes) override;
  void deallocate(void* data) noexcept override;
  void copy_from_host(const void* host, const TensorView& dst) override;
  void copy_to_host(const TensorView& src, void* host) override;
  void synchronize() override {}
  std::unique_ptr<Timer> make_timer() override;

 protected:
  MODAR_BACKEND_OPS
};

}  // namespace modar::runtime::cpu
