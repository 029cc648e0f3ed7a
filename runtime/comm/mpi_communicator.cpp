// runtime/comm/mpi_communicator.cpp: the MPI communicator (CPU memory), and
// the MPI world that bootstraps NCCL (modar/runtime/comm_engine.hpp).
//
// One MPI call per collective, no staging, except bf16 reductions: MPI has no
// bf16 type, so all_reduce / reduce_scatter of bf16 widen to an fp32 buffer,
// reduce it with MPI_FLOAT, and round the result once (comm.hpp).  Movement
// of bf16 (gather, all-to-all, broadcast, point to point) is MPI_UINT16_T.
//
// Errors: MPI_COMM_WORLD and every communicator split from it use
// MPI_ERRORS_RETURN, so a failing call throws BackendError with MPI's message
// instead of aborting the job.
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "modar/base/errors.hpp"
#include "modar/runtime/comm.hpp"
#include "modar/runtime/comm_engine.hpp"

#ifdef MODAR_HAVE_MPI
#include <mpi.h>
#endif


namespace modar::runtime {

#ifdef MODAR_HAVE_MPI

namespace {

using namespace comm_detail;

void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) {
    return;
  }
  char message[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, message, &length);
  throw BackendError(std::string("MPI: ") + what + " failed: " + std::string(message, length));
}

void finalize_mpi_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    MPI_Finalize();
  }
}

// Once per process: MPI_Init_thread (unless someone else, e.g. mpi4py, already
// did: then they finalise too), errors returned, MPI_Finalize at exit.
void ensure_mpi() {
  static std::once_flag once;
  std::call_once(once, [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided),
                "MPI_Init_thread");
      std::atexit(finalize_mpi_at_exit);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  });
}

std::string library_version_line() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string line(text, static_cast<size_t>(length));
  const size_t cut = line.find_first_of(",\n");
  return cut == std::string::npos ? line : line.substr(0, cut);
}

int checked_count(const char* call, int64_t count) {
  if (count > INT_MAX) {
    throw ShapeError(std::string(call) + ": " + std::to_string(count) +
                     " elements: MPI counts are int, at most " + std::to_string(INT_MAX));
  }
  return static_cast<int>(count);
}

// The MPI datatype that MOVES elements of `type` (bf16 as 16-bit words).
MPI_Datatype move_type(ScalarType type) {
  switch (type) {
    case ScalarType::fp64:
      return MPI_DOUBLE;
    case ScalarType::fp32:
      return MPI_FLOAT;
    case ScalarType::bf16:
      return MPI_UINT16_T;
    case ScalarType::i32:
      return MPI_INT32_T;
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op) {
  return op == ReduceOp::max ? MPI_MAX : MPI_SUM;
}

std::vector<float> widen_bf16(const TensorView& view) {
  std::vector<float> wide(static_cast<size_t>(view.numel()));
  const uint16_t* data = view.ptr<uint16_t>();
  for (size_t i = 0; i < wide.size(); ++i) {
    wide[i] = bf16_to_float(data[i]);
  }
  return wide;
}

void narrow_to_bf16(const std::vector<float>& wide, const TensorView& view) {
  uint16_t* data = view.ptr<uint16_t>();
  for (size_t i = 0; i < wide.size(); ++i) {
    data[i] = float_to_bf16(wide[i]);
  }
}

constexpr int kPointToPointTag = 7100;

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed by the destructor) unless it is MPI_COMM_WORLD.
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm_ != MPI_COMM_WORLD && !finalized) {
      MPI_Comm_free(&comm_);
    }
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string engine() const override { return "mpi (" + mpi_library_version() + ")"; }
  DeviceKind device() const override { return DeviceKind::cpu; }

  void all_reduce(const TensorView& buf, ReduceOp op) override {
    check_buffer("all_reduce", "buf", buf, DeviceKind::cpu);
    const int count = checked_count("all_reduce", buf.numel());
    if (buf.dtype == ScalarType::bf16) {
      std::vector<float> wide = widen_bf16(buf);
      check_mpi(MPI_Allreduce(MPI_IN_PLACE, wide.data(), count, MPI_FLOAT, mpi_op(op), comm_),
                "MPI_Allreduce");
      narrow_to_bf16(wide, buf);
      return;
    }
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, buf.data, count, move_type(buf.dtype), mpi_op(op), comm_),
              "MPI_Allreduce");
  }

  void reduce_scatter(const TensorView& in, const TensorView& out) override {
    check_pair("reduce_scatter", in, out, DeviceKind::cpu);
    check_scatter_sizes("reduce_scatter", in, out, size_);
    checked_count("reduce_scatter", in.numel());
    const int count = checked_count("reduce_scatter", out.numel());
    if (in.dtype == ScalarType::bf16) {
      const std::vector<float> wide_in = widen_bf16(in);
      std::vector<float> wide_out(static_cast<size_t>(count));
      check_mpi(MPI_Reduce_scatter_block(wide_in.data(), wide_out.data(), count, MPI_FLOAT,
                                         MPI_SUM, comm_),
                "MPI_Reduce_scatter_block");
      narrow_to_bf16(wide_out, out);
      return;
    }
    check_mpi(MPI_Reduce_scatter_block(in.data, out.data, count, move_type(in.dtype), MPI_SUM,
                                       comm_),
              "MPI_Reduce_scatter_block");
  }

  void all_gather(const TensorView& in, const TensorView& out) override {
    check_pair("all_gather", in, out, DeviceKind::cpu);
    check_gather_sizes("all_gather", in, out, size_);
    checked_count("all_gather", out.numel());
    const int count = checked_count("all_gather", in.numel());
    const MPI_Datatype type = move_type(in.dtype);
    // In place when `in` is this rank's own chunk of `out` (ZeRO's gather).
    const char* own_chunk = static_cast<const char*>(out.data) + rank_ * in.bytes();
    const void* send = (in.data == own_chunk) ? MPI_IN_PLACE : in.data;
    check_mpi(MPI_Allgather(send, count, type, out.data, count, type, comm_), "MPI_Allgather");
  }

  void all_to_all(const TensorView& in, const TensorView& out) override {
    check_pair("all_to_all", in, out, DeviceKind::cpu);
    check_all_to_all_sizes("all_to_all", in, out, size_);
    const int chunk = checked_count("all_to_all", in.numel() / size_);
    const MPI_Datatype type = move_type(in.dtype);
    check_mpi(MPI_Alltoall(in.data, chunk, type, out.data, chunk, type, comm_), "MPI_Alltoall");
  }

  void broadcast(const TensorView& buf, int root) override {
    check_buffer("broadcast", "buf", buf, DeviceKind::cpu);
    check_root("broadcast", root, size_);
    check_mpi(MPI_Bcast(buf.data, checked_count("broadcast", buf.numel()), move_type(buf.dtype),
                        root, comm_),
              "MPI_Bcast");
  }

  void send(const TensorView& buf, int peer) override {
    check_buffer("send", "buf", buf, DeviceKind::cpu);
    check_peer("send", "peer", peer, size_, rank_);
    check_mpi(MPI_Send(buf.data, checked_count("send", buf.numel()), move_type(buf.dtype), peer,
                       kPointToPointTag, comm_),
              "MPI_Send");
  }

  void recv(const TensorView& buf, int peer) override {
    check_buffer("recv", "buf", buf, DeviceKind::cpu);
    check_peer("recv", "peer", peer, size_, rank_);
    MPI_Status status;
    check_mpi(MPI_Recv(buf.data, checked_count("recv", buf.numel()), move_type(buf.dtype), peer,
                       kPointToPointTag, comm_, &status),
              "MPI_Recv");
    check_received("recv", buf, status);
  }

  void send_recv(const TensorView& send_buf, int send_peer, const TensorView& recv_buf,
                 int recv_peer) override {
    check_buffer("send_recv", "send_buf", send_buf, DeviceKind::cpu);
    check_buffer("send_recv", "recv_buf", recv_buf, DeviceKind::cpu);
    check_peer("send_recv", "send_peer", send_peer, size_, rank_);
    check_peer("send_recv", "recv_peer", recv_peer, size_, rank_);
    MPI_Status status;
    check_mpi(MPI_Sendrecv(send_buf.data, checked_count("send_recv", send_buf.numel()),
                           move_type(send_buf.dtype), send_peer, kPointToPointTag, recv_buf.data,
                           checked_count("send_recv", recv_buf.numel()),
                           move_type(recv_buf.dtype), recv_peer, kPointToPointTag, comm_, &status),
              "MPI_Sendrecv");
    check_received("send_recv", recv_buf, status);
  }

  void barrier() override { check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); }

  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm part = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &part),
              "MPI_Comm_split");
    if (part == MPI_COMM_NULL) {
      return nullptr;
    }
    return std::make_unique<MpiCommunicator>(part);
  }

 private:
  // A message shorter than the buffer is a mismatch of the two sides' sizes
  // (a longer one already failed with MPI_ERR_TRUNCATE).
  void check_received(const char* call, const TensorView& buf, const MPI_Status& status) {
    int received = 0;
    MPI_Get_count(&status, move_type(buf.dtype), &received);
    if (received != buf.numel()) {
      throw ShapeError(std::string(call) + ": received " + std::to_string(received) +
                       " elements from rank " + std::to_string(status.MPI_SOURCE) +
                       " into buf " + buf.describe() + " of " + std::to_string(buf.numel()) +
                       ": the sender's size differs");
    }
  }

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

bool mpi_available() {
  return true;
}

void abort_world(int exit_code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  int size = 1;
  if (initialized && !finalized) {
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
  if (size > 1) {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, exit_code);
  }
  std::exit(exit_code);
}

std::string mpi_library_version() {
  static const std::string version = [] {
    std::string line = library_version_line();  // "Open MPI v4.1.4"
    const size_t v = line.find(" v");
    if (v != std::string::npos && v + 2 < line.size() && line[v + 2] >= '0' && line[v + 2] <= '9') {
      line.erase(v + 1, 1);  // "Open MPI 4.1.4"
    }
    return line;
  }();
  return version;
}

namespace comm_detail {

std::unique_ptr<Communicator> make_mpi_world_communicator() {
  ensure_mpi();
  // A duplicate: each world communicator is its own context, so traffic of
  // two of them (a library's and the caller's) can never match by mistake.
  MPI_Comm world = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &world), "MPI_Comm_dup");
  return std::make_unique<MpiCommunicator>(world);
}

int mpi_world_rank() {
  ensure_mpi();
  int rank = 0;
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
  return rank;
}

int mpi_world_size() {
  ensure_mpi();
  int size = 1;
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");
  return size;
}

void mpi_world_broadcast_bytes(void* data, int64_t bytes, int root) {
  ensure_mpi();
  check_mpi(MPI_Bcast(data, checked_count("broadcast", bytes), MPI_BYTE, root, MPI_COMM_WORLD),
            "MPI_Bcast");
}

void mpi_world_all_gather_int(int value, int* values) {
  ensure_mpi();
  check_mpi(MPI_Allgather(&value, 1, MPI_INT, values, 1, MPI_INT, MPI_COMM_WORLD),
            "MPI_Allgather");
}

int mpi_world_ranks_on_node() {
  ensure_mpi();
  MPI_Comm node = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
            "MPI_Comm_split_type");
  int size = 1;
  MPI_Comm_size(node, &size);
  MPI_Comm_free(&node);
  return size;
}

}  // namespace comm_detail

#else  // no MPI in this build: the world is this process

bool mpi_available() {
  return false;
}

void abort_world(int exit_code) {
  std::exit(exit_code);
}

std::string mpi_library_version() {
  return "";
}

namespace comm_detail {
std::unique_ptr<Communicator> make_mpi_world_communicator() {
  return make_self_communicator();
}
int mpi_world_rank() {
  return 0;
}
int mpi_world_size() {
  return 1;
}
void mpi_world_broadcast_bytes(void*, int64_t, int) {}
void mpi_world_all_gather_int(int value, int* values) {
  values[0] = value;
}
int mpi_world_ranks_on_node() {
  return 1;
}
}  // namespace comm_detail

#endif

}  // namespace modar::runtime
