// runtime/core/backend.cpp: Backend::run (check once, ask supports(), execute),
// the backend registry and factory, and the host helpers.
#include "modar/runtime/backend.hpp"

#include <cmath>
#include <cstring>
#include <map>
#include <utility>

#include "backend_module.hpp"
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
  for (const std::string& name : detail::module_backend_names()) {
    if (registry().count(name) == 0)
      names.push_back(name);
  }
  return names;
}

std::unique_ptr<Backend> make_backend(const std::string& name) {
  auto it = registry().find(name);
  if (it == registry().end() && detail::load_backend_module(name)) {
    it = registry().find(name);
    if (it == registry().end()) {
      throw BackendError("backend = " + name +
                         ": its module loaded but registered no backend (the program must export "
                         "its symbols: link it with modar_runtime)");
    }
  }
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

namespace {

// Element i of a host staging buffer of T (unaligned bytes: memcpy).
template <class T>
T load_element(const std::vector<unsigned char>& staging, size_t i) {
  T value;
  std::memcpy(&value, staging.data() + i * sizeof(T), sizeof(T));
  return value;
}
template <class T>
void store_element(std::vector<unsigned char>& staging, size_t i, T value) {
  std::memcpy(staging.data() + i * sizeof(T), &value, sizeof(T));
}

}  // namespace

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
      case ScalarType::fp64:
        store_element<double>(staging, i, values[i]);
        break;
      case ScalarType::fp32:
        store_element<float>(staging, i, static_cast<float>(values[i]));
        break;
      case ScalarType::bf16:
        store_element<uint16_t>(staging, i, float_to_bf16(static_cast<float>(values[i])));
        break;
      case ScalarType::i32:
        store_element<int32_t>(staging, i, static_cast<int32_t>(std::lround(values[i])));
        break;
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
      case ScalarType::fp64:
        values[i] = load_element<double>(staging, i);
        break;
      case ScalarType::fp32:
        values[i] = load_element<float>(staging, i);
        break;
      case ScalarType::bf16:
        values[i] = bf16_to_float(load_element<uint16_t>(staging, i));
        break;
      case ScalarType::i32:
        values[i] = load_element<int32_t>(staging, i);
        break;
    }
  }
  return values;
}

}  // namespace modar::runtime
