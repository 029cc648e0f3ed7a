// runtime/core/backend_module.hpp: backends built as modules that
// make_backend loads on first use (the CUDA backend, libmodar_cuda.so:
// runtime/CMakeLists.txt), so a program that never asks for the GPU does not
// load cuBLAS, cuBLASLt and the CUDA runtime at start-up.  Internal to the
// core (backend.cpp).
#pragma once

#include <string>
#include <vector>

namespace modar::runtime::detail {

// The backends this build provides as modules, loaded or not ("cuda" when
// built with MODAR_CUDA_MODULE).
std::vector<std::string> module_backend_names();

// Loads the module of backend `name` once; its static initialisers register
// the backend (and, for CUDA, the NCCL world communicator).  False when this
// build has no module for `name`; BackendError naming the file and what the
// dynamic loader reported (a missing libcublasLt.so.13, ...) when it cannot
// be loaded, or where it was looked for when it is not there.
bool load_backend_module(const std::string& name);

}  // namespace modar::runtime::detail
