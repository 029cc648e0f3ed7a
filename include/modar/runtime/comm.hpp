// modar/runtime/comm.hpp: the communicator of the reference runtime (processes
// that exchange tensors), on existing engines, never a home-made transport:
//
//   * MPI  (Open MPI from Debian) for the CPU backend (runtime/comm/mpi_communicator.cpp);
//   * NCCL (libnccl.so.2 of the CUDA toolkit, loaded at run time) for the CUDA
//     backend (runtime/nccl/nccl_communicator.cpp), bootstrapped over MPI: rank 0
//     creates the NCCL unique id and MPI_Bcast's it to the other ranks;
//   * self (one process, no MPI): serial runs and the P = 1 reference of the
//     parallel-equals-serial tests.
//
// ---- Semantics (the same for every engine) ----------------------------------
//  * Every collective is called by every rank of the communicator, in the same
//    order, with the same dtype and sizes (MPI's rule); a mismatch is a
//    programming error that MPI / NCCL may detect (or hang on).
//  * Tensors are TensorViews on the BACKEND's device (CPU memory for MPI, the
//    CUDA backend's device memory for NCCL), contiguous, dtype fp64 / fp32 /
//    bf16 / i32.  Shape is irrelevant: a buffer is its numel() elements.
//  * Calls are ordered like backend ops: for MPI they are blocking (the result
//    is in the buffer when the call returns); for NCCL they are enqueued on the
//    CUDA backend's stream, after every op already enqueued, before every op
//    enqueued later (Backend::synchronize() waits for them).
//  * all_reduce(buf, op)        in place, elementwise over ranks.
//    reduce_scatter(in, out)    sum; in.numel == size * out.numel; rank r gets
//                               chunk r of the sum.
//    all_gather(in, out)        out.numel == size * in.numel; chunk r of out is
//                               rank r's in (rank order).
//    all_to_all(in, out)        in.numel == out.numel == size * c; chunk j of
//                               rank i's in lands in chunk i of rank j's out.
//    broadcast(buf, root)       buf of root -> every rank.
//    send(buf, peer) / recv(buf, peer)  point to point, matched in call order
//                               between a pair.  A blocking MPI send of a large
//                               message waits for its recv: two ranks that
//                               exchange must order send/recv oppositely, or
//                               call send_recv().
//    send_recv(sbuf, dst, rbuf, src)  both at once (MPI_Sendrecv / an NCCL group).
//    barrier()                  every rank arrives before any leaves (NCCL: an
//                               all-reduce of one element, then a stream sync).
//    split(color, key)          MPI_Comm_split: ranks with the same color form a
//                               new communicator, ordered by (key, old rank);
//                               color < 0 joins none and gets nullptr.  Every
//                               rank of this communicator must call it.
//  * Reductions of bf16.  MPI has no bf16 type: the MPI communicator widens the
//    buffer to fp32, reduces in fp32 (MPI's reduction order), and rounds the
//    result ONCE to bf16 (round to nearest even).  The result equals the fp32
//    reduction of the bf16 inputs rounded to bf16, independent of the rank
//    count's rounding steps.  NCCL reduces bf16 natively (ncclBfloat16: its
//    kernels accumulate in fp32 inside a step but the ring passes bf16 between
//    steps, so the rounding error grows with the number of ranks); callers that
//    need the MPI behaviour on NCCL reduce an fp32 copy.
//  * Sizes.  MPI counts are int: a buffer (or a chunk) of more than 2^31 - 1
//    elements throws ShapeError naming the call and the count.
//  * Errors: a view on the wrong device, of the wrong dtype or size throws
//    modar::ShapeError naming the call, the argument and what was expected; an
//    engine failure (MPI error class, ncclResult_t) throws modar::BackendError
//    with the engine's own message.
//
// ---- MPI lifetime ------------------------------------------------------------
// MPI is initialised once per process, lazily, by the first call that needs it
// (make_world_communicator, mpi_world_rank ...), with MPI_Init_thread(
// MPI_THREAD_FUNNELED): only the thread that initialised MPI may call a
// communicator.  It is finalised at process exit (std::atexit).  Under mpirun
// the world is mpirun's ranks; without a launcher Open MPI starts a singleton
// world of size 1, so the CLI and the tests work both ways.
#pragma once

#include <memory>
#include <string>

#include "modar/runtime/tensor.hpp"

namespace modar::runtime {

class Backend;

enum class ReduceOp { sum, max };
const char* to_string(ReduceOp op);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The engine and its version: "mpi (Open MPI 4.1.4)", "nccl 2.28.9", "self".
  virtual std::string engine() const = 0;
  virtual DeviceKind device() const = 0;  // where its TensorViews must live

  virtual void all_reduce(const TensorView& buf, ReduceOp op = ReduceOp::sum) = 0;  // in place
  virtual void reduce_scatter(const TensorView& in, const TensorView& out) = 0;     // sum
  virtual void all_gather(const TensorView& in, const TensorView& out) = 0;         // rank order
  virtual void all_to_all(const TensorView& in, const TensorView& out) = 0;         // equal chunks
  virtual void broadcast(const TensorView& buf, int root) = 0;
  virtual void send(const TensorView& buf, int peer) = 0;
  virtual void recv(const TensorView& buf, int peer) = 0;
  virtual void send_recv(const TensorView& send_buf, int send_peer, const TensorView& recv_buf,
                         int recv_peer) = 0;
  virtual void barrier() = 0;
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;  // MPI_Comm_split
};

// The world of this process (collective: every rank calls it; each call is a
// new communication context, MPI_Comm_dup): MPI (all mpirun ranks) for a CPU backend; NCCL
// over the same ranks for a CUDA backend (each rank's backend must be on its
// own GPU: make_cuda_backend picks the node-local rank's device).  Without MPI
// in this build the world is this process alone (size 1; NCCL still runs, on
// one rank).  Throws BackendError when the backend's device has no
// communicator in this build (CUDA without NCCL found at run time).
std::unique_ptr<Communicator> make_world_communicator(Backend& backend);
// Size 1, rank 0 (collectives copy in to out; send / recv to oneself throw
// ShapeError).  No MPI needed.  Without a backend: CPU memory; with one: that
// backend's device memory (copies through backend.copy).
std::unique_ptr<Communicator> make_self_communicator();
std::unique_ptr<Communicator> make_self_communicator(Backend& backend);
// Built with MPI (MODAR_MPI).
bool mpi_available();
// "Open MPI v4.1.4, ..." first line of MPI_Get_library_version, or "" without MPI.
std::string mpi_library_version();
// (The launcher's environment, launcher_local_rank() / launched_by_mpirun():
// host_facts.hpp.)
// End the whole job after an error that only this rank saw (the others would
// wait forever in their next collective): MPI_Abort(MPI_COMM_WORLD, code) when
// MPI is initialised with more than one rank, else std::exit(code).
[[noreturn]] void abort_world(int exit_code);

// ---- engines register themselves (link topology as backends, backend.hpp) ---
// The communicator never calls into CUDA: the NCCL communicator (runtime/nccl/,
// target modar_runtime_nccl) registers a factory for DeviceKind::cuda at static
// initialisation.  make_world_communicator dispatches on backend.device().
using WorldCommunicatorFactory = std::unique_ptr<Communicator> (*)(Backend& backend);
void register_world_communicator(DeviceKind device, WorldCommunicatorFactory factory);

}  // namespace modar::runtime
