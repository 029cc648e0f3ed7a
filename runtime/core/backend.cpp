// runtime/core/backend.cpp: Backend::run (check once, ask supports(), execute),
// the backend registry and factory, and the host helpers.
#include "modar/runtime/backend.hpp"

#include <cmath>
#include <cstring>
#include <map>
#include <utility>

#include "modar/base/errors.hpp"

namespace modar::runtime {

OpGeometry Backend::run(const OpArgs& call) {
  const OpGeometry geometry = check(device(), call);
  const OpInfo& info = op_info(op_id(call));
  if (!supports(info.id, geometry.dtype)) {
    throw ShapeError(std::string(info.name) + ": dtype " + to_string(geometry.dtype) +
                     " is not supported by backend " + name());
  }
  execute(call, geometry);
  return geometry;
}

void Backend::dar_transport_forward(const TensorView& transport, const TensorView& partial,
                                    const TensorView& out) {
  run(DarWriteForwardArgs{transport, partial, TensorView{}, TensorView{}, out});
}

void Backend::dar_transport_backward(const TensorView& dout, const TensorView& transport,
                                     const TensorView& partial, const TensorView& dtransport,
                                     const TensorView& dpartial) {
  run(DarWriteBackwardArgs{dout, transport, partial, TensorView{}, TensorView{}, dtransport,
                           dpartial, TensorView{}, TensorView{}});
}

// ---- factory and registry -----------------------------------------------------------

namespace {

// Function-local so that registrations from other translation units' static
// initialisers find it constructed.  The CPU backend is always present.
std::map<std::string, BackendFactory>& registry() {
  static std::map<std::string, BackendFactory> factories{
      {"cpu", [] { return make_cpu_backend(); }}};
  return factories;
}

}  // namespace

void register_backend(const std::string& name, BackendFactory factory) {
  registry()[name] = std::move(factory);
}

std::vector<std::string> available_backends() {
  std::vector<std::string> names{"cpu"};
  for (const auto& entry : registry()) {
    if (entry.first != "cpu")
      names.push_back(entry.first);
  }
  return names;
}

std::unique_ptr<Backend> make_backend(const std::string& name) {
  const auto it = registry().find(name);
  if (it != registry().end())
    return it->second();
  std::string allowed;
  for (const std::string& available : available_backends()) {
    allowed += (allowed.empty() ? "" : ", ") + available;
  }
  if (name == "cuda") {
    throw BackendError(
        "backend = cuda: this build of modar has no CUDA backend (configure with "
        "-DMODAR_CUDA=ON on a machine with the CUDA toolkit); available: " +
        allowed);
  }
  throw BackendError("backend = " + name + ": unknown; allowed: " + allowed);
}

// ---- host helpers ---------------------------------------------------------------

Tensor make_tensor(Backend& backend, const std::vector<int64_t>& shape, ScalarType dtype) {
  return Tensor(backend, shape, dtype);
}

Tensor make_tensor(Backend& backend, const std::vector<int64_t>& shape, ScalarType dtype,
                   const std::vector<double>& values) {
  Tensor tensor(backend, shape, dtype);
  upload(backend, values, tensor);
  return tensor;
}

void upload(Backend& backend, const std::vector<double>& values, const TensorView& dst) {
  if (static_cast<int64_t>(values.size()) != dst.numel()) {
    throw ShapeError("upload: " + std::to_string(values.size()) + " values for tensor " +
                     dst.describe());
  }
  std::vector<unsigned char> staging(static_cast<size_t>(dst.bytes()));
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dst.dtype) {
      case ScalarType::fp64: {
        const double value = values[i];
        std::memcpy(staging.data() + i * 8, &value, 8);
        break;
      }
      case ScalarType::fp32: {
        const float value = static_cast<float>(values[i]);
        std::memcpy(staging.data() + i * 4, &value, 4);
        break;
      }
      case ScalarType::bf16: {
        const uint16_t value = float_to_bf16(static_cast<float>(values[i]));
        std::memcpy(staging.data() + i * 2, &value, 2);
        break;
      }
      case ScalarType::i32: {
        const int32_t value = static_cast<int32_t>(std::lround(values[i]));
        std::memcpy(staging.data() + i * 4, &value, 4);
        break;
      }
    }
  }
  backend.copy_from_host(staging.data(), dst);
}

std::vector<double> download(Backend& backend, const TensorView& src) {
  std::vector<unsigned char> staging(static_cast<size_t>(src.bytes()));
  backend.copy_to_host(src, staging.data());
  std::vector<double> values(static_cast<size_t>(src.numel()));
  for (size_t i = 0; i < values.size(); ++i) {
    switch (src.dtype) {
      case ScalarType::fp64: {
        double value;
        std::memcpy(&value, staging.data() + i * 8, 8);
        values[i] = value;
        break;
      }
      case ScalarType::fp32: {
        float value;
        std::memcpy(&value, staging.data() + i * 4, 4);
        values[i] = value;
        break;
      }
      case ScalarType::bf16: {
        uint16_t value;
        std::memcpy(&value, staging.data() + i * 2, 2);
        values[i] = bf16_to_float(value);
        break;
      }
      case ScalarType::i32: {
        int32_t value;
        std::memcpy(&value, staging.data() + i * 4, 4);
        values[i] = value;
        break;
      }
    }
  }
  return values;
}

}  // namespace modar::runtime
