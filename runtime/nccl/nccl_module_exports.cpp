// runtime/nccl/nccl_module_exports.cpp: keeps, in every program that may load
// the CUDA module libmodar_cuda.so (runtime/CMakeLists.txt), the
// communicator functions the module's NCCL communicator binds to at load
// time.  The module leaves them undefined and the program exports its
// symbols; a program that never calls them itself (modar_bench_layers) would
// otherwise not link them from the static comm library, and the module would
// not load ("undefined symbol: ...comm_detail::check_pair...").  Compiled
// into an OBJECT library that the umbrella target modar_runtime hands to
// every program linking it.
#include "modar/runtime/comm.hpp"
#include "modar/runtime/comm_engine.hpp"

namespace modar::runtime::comm_detail {

// The engine interface (comm_engine.hpp) and the world registry (comm.hpp),
// each function referenced once.  External linkage, so that the table (and
// with it each reference) is emitted.
extern const void* const kNcclModuleBindsTo[];
[[gnu::used]] const void* const kNcclModuleBindsTo[] = {
    reinterpret_cast<const void*>(&check_buffer),
    reinterpret_cast<const void*>(&check_pair),
    reinterpret_cast<const void*>(&check_scatter_sizes),
    reinterpret_cast<const void*>(&check_gather_sizes),
    reinterpret_cast<const void*>(&check_all_to_all_sizes),
    reinterpret_cast<const void*>(&check_peer),
    reinterpret_cast<const void*>(&check_root),
    reinterpret_cast<const void*>(&make_mpi_world_communicator),
    reinterpret_cast<const void*>(&mpi_world_rank),
    reinterpret_cast<const void*>(&mpi_world_size),
    reinterpret_cast<const void*>(&mpi_world_broadcast_bytes),
    reinterpret_cast<const void*>(&mpi_world_all_gather_int),
    reinterpret_cast<const void*>(&mpi_world_ranks_on_node),
    reinterpret_cast<const void*>(&register_world_communicator),
    reinterpret_cast<const void*>(&make_world_communicator),
};

}  // namespace modar::runtime::comm_detail
