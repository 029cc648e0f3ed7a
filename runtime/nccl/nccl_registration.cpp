// runtime/nccl/nccl_registration.cpp: the NCCL communicator registers itself
// as the world communicator of CUDA backends (comm.hpp) at static
// initialisation.  Compiled into the OBJECT library
// modar_runtime_nccl_registration (runtime/CMakeLists.txt), which every
// program linking modar_runtime gets, so the static linker cannot drop it.
#include <memory>

#include "modar/runtime/comm.hpp"

namespace modar::runtime {

std::unique_ptr<Communicator> make_nccl_world_communicator(Backend& backend);

namespace {

[[maybe_unused]] const bool kNcclRegistered = [] {
  register_world_communicator(DeviceKind::cuda, &make_nccl_world_communicator);
  return true;
}();

}  // namespace

}  // namespace modar::runtime
