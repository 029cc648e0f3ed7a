// runtime/cuda/cuda_registration.cpp: the CUDA backend registers itself as
// "cuda" in the backend registry (backend.hpp) at static initialisation.  This
// file is compiled into an OBJECT library that the umbrella target
// modar_runtime hands to every program linking it, so the registration is never
// dropped by the static linker; the core never calls into CUDA.
#include "modar/runtime/backend.hpp"
#include "modar/runtime/cuda_backend.hpp"

namespace modar::runtime {
namespace {

[[maybe_unused]] const bool kCudaRegistered = [] {
  register_backend("cuda", [] { return make_cuda_backend(); });
  return true;
}();

}  // namespace

}  // namespace modar::runtime
