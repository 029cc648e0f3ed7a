// modar/runtime/comm_engine.hpp: what the communication engines share (the
// argument checks of comm.hpp's semantics, the MPI world that bootstraps
// NCCL).  For engines, not for callers of a communicator: the self and MPI
// communicators (runtime/comm/) and the NCCL communicator (runtime/nccl/,
// beside the CUDA backend) include it; the profiler's `profile --comm`
// (runtime/calibration/comm_profile.cpp) reads the ranks per node from it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "modar/runtime/comm.hpp"
#include "modar/runtime/tensor.hpp"

namespace modar::runtime::comm_detail {

// Throws ShapeError "<call>: <argument> <describe>: <problem>" unless `view`
// is a non-empty buffer on `device` of a communicable dtype (every ScalarType).
void check_buffer(const char* call, const char* argument, const TensorView& view,
                  DeviceKind device);
// Both buffers valid (check_buffer) and of one dtype.
void check_pair(const char* call, const TensorView& in, const TensorView& out, DeviceKind device);
// in.numel == factor * out.numel (reduce_scatter: factor = size) or the
// reverse (all_gather), or equal and divisible (all_to_all).
void check_scatter_sizes(const char* call, const TensorView& in, const TensorView& out, int size);
void check_gather_sizes(const char* call, const TensorView& in, const TensorView& out, int size);
void check_all_to_all_sizes(const char* call, const TensorView& in, const TensorView& out,
                            int size);
void check_peer(const char* call, const char* argument, int peer, int size, int rank);
void check_root(const char* call, int root, int size);

// ---- the MPI world (mpi_communicator.cpp; size 1 without MPI) ---------------
// MPI_COMM_WORLD as a communicator (the self communicator without MPI).
std::unique_ptr<Communicator> make_mpi_world_communicator();
// Initialises MPI when needed (once per process).
int mpi_world_rank();
int mpi_world_size();
// MPI_Bcast of `bytes` bytes over MPI_COMM_WORLD (no-op without MPI).
void mpi_world_broadcast_bytes(void* data, int64_t bytes, int root);
// MPI_Allgather of one int per rank over MPI_COMM_WORLD (values[size]).
void mpi_world_all_gather_int(int value, int* values);
// MPI_Comm_split_type(SHARED) size of the world: ranks on this node (1 without MPI).
int mpi_world_ranks_on_node();

}  // namespace modar::runtime::comm_detail
