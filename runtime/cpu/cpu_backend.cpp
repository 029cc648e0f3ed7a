// runtime/cpu/cpu_backend.cpp: memory, copies, fill / convert, the steady_clock
// timer, the device facts, execute() (the op table's dispatch) and the factory
// of the CPU backend.  Memory is plain host memory,
// 64-byte aligned (one cache line; enough for any SIMD width Eigen uses).
#include "cpu_backend.hpp"

#include <chrono>
#include <cstring>
#include <new>
#include <type_traits>
#include <variant>

#include "cpu_common.hpp"
#include "modar/base/errors.hpp"
#include "modar/runtime/host_facts.hpp"

namespace modar::runtime {

std::unique_ptr<Backend> make_cpu_backend() {
  return std::make_unique<cpu::CpuBackend>();
}

namespace cpu {
namespace {

constexpr std::align_val_t kAlignment{64};

class SteadyClockTimer final : public Timer {
 public:
  void start() override { start_ = std::chrono::steady_clock::now(); }
  void stop() override { stop_ = std::chrono::steady_clock::now(); }
  double elapsed_s() override { return std::chrono::duration<double>(stop_ - start_).count(); }

 private:
  std::chrono::steady_clock::time_point start_{};
  std::chrono::steady_clock::time_point stop_{};
};

}  // namespace

void check_index_range(const char* op, const char* name, const TensorView& indices, int64_t lowest,
                       int64_t upper) {
  const int32_t* values = indices.ptr<int32_t>();
  for (int64_t i = 0; i < indices.numel(); ++i) {
    if (values[i] < lowest || values[i] >= upper) {
      throw ShapeError(std::string(op) + ": " + name + "[" + std::to_string(i) +
                       "] = " + std::to_string(values[i]) + " out of range [" +
                       std::to_string(lowest) + ", " + std::to_string(upper) + ")");
    }
  }
}

void* CpuBackend::allocate(int64_t bytes) {
  if (bytes < 0)
    throw BackendError("cpu allocate: negative size " + std::to_string(bytes));
  try {
    return ::operator new(static_cast<size_t>(bytes > 0 ? bytes : 1), kAlignment);
  } catch (const std::bad_alloc&) {
    throw BackendError("cpu allocate: out of host memory for " + std::to_string(bytes) + " bytes");
  }
}

void CpuBackend::deallocate(void* data) noexcept {
  ::operator delete(data, kAlignment);
}

void CpuBackend::copy_from_host(const void* host, const TensorView& dst) {
  if (dst.device != DeviceKind::cpu) {
    throw ShapeError("copy_from_host: dst is " + dst.describe() + "; expected a cpu tensor");
  }
  if (dst.bytes() > 0)
    std::memcpy(dst.data, host, static_cast<size_t>(dst.bytes()));
}

void CpuBackend::copy_to_host(const TensorView& src, void* host) {
  if (src.device != DeviceKind::cpu) {
    throw ShapeError("copy_to_host: src is " + src.describe() + "; expected a cpu tensor");
  }
  if (src.bytes() > 0)
    std::memcpy(host, src.data, static_cast<size_t>(src.bytes()));
}

std::unique_ptr<Timer> CpuBackend::make_timer() {
  return std::make_unique<SteadyClockTimer>();
}

DeviceFacts CpuBackend::facts() const {
  const HostFacts host = read_host_facts();
  DeviceFacts facts;
  facts.description = host.cpu_model.empty() ? "unknown CPU" : host.cpu_model;
  facts.cache_bytes = host.last_level_cache_bytes;
  facts.memory_bytes = host.memory_total_bytes;
  facts.memory_free_bytes = host.memory_available_bytes;
  facts.provenance["host_cpu"] = host.cpu_model;
  facts.provenance["logical_cpus"] = std::to_string(host.logical_cpus);
  return facts;
}

MODAR_BACKEND_EXECUTE(CpuBackend)

void CpuBackend::run_op(const CopyArgs& call) {
  if (call.src.data != call.dst.data && call.src.bytes() > 0) {
    std::memmove(call.dst.data, call.src.data, static_cast<size_t>(call.src.bytes()));
  }
}

void CpuBackend::run_op(const FillArgs& call) {
  const int64_t count = call.dst.numel();
  auto fill_with = [&](auto value) {
    auto* p = call.dst.ptr<decltype(value)>();
    for (int64_t i = 0; i < count; ++i)
      p[i] = value;
  };
  switch (call.dst.dtype) {
    case ScalarType::fp64:
      fill_with(call.value);
      break;
    case ScalarType::fp32:
      fill_with(static_cast<float>(call.value));
      break;
    case ScalarType::bf16:
      fill_with(float_to_bf16(static_cast<float>(call.value)));
      break;
    case ScalarType::i32:
      fill_with(static_cast<int32_t>(call.value));
      break;
  }
}

void CpuBackend::run_op(const ConvertArgs& call) {
  std::vector<double> staging(static_cast<size_t>(call.src.numel()));
  load_converted(call.src, staging.data());
  store_converted(staging.data(), call.dst, false);
}

}  // namespace cpu
}  // namespace modar::runtime
