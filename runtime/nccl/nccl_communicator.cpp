// runtime/nccl/nccl_communicator.cpp: the NCCL communicator (CUDA device
// memory), the target modar_runtime_nccl: the one place where a communicator
// (runtime/comm) meets the CUDA backend (runtime/cuda), so neither of those
// includes the other.
//
// NCCL is loaded at run time (dlopen "libnccl.so.2", as cuDNN is): the
// binaries link no NCCL, so they run where it is missing (CUDA backend without
// a communicator: BackendError saying so) and pick up whichever NCCL 2.x the
// machine has (the CUDA toolkit's, or PyTorch's nvidia-nccl wheel on
// LD_LIBRARY_PATH).  nccl.h provides the types only.
//
// Bootstrap (make_world_communicator for a CUDA backend): world rank and size
// from MPI (modar/runtime/comm_engine.hpp; size 1 without MPI), rank 0 calls
// ncclGetUniqueId, MPI_Bcast's the 128-byte id, every rank calls
// ncclCommInitRank on its backend's device.  Sub-communicators come from
// ncclCommSplit (NCCL >= 2.18).
//
// Every call is enqueued on the CUDA backend's stream (comm.hpp: ordered like
// backend ops); the backend must outlive its communicators.  all_to_all and send_recv are NCCL groups of ncclSend /
// ncclRecv (ncclAlltoAll exists only from 2.28).  barrier() is an all-reduce of
// one int followed by a stream synchronisation.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstdint>
#include <mutex>
#include <string>

#include "modar/base/errors.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/comm.hpp"
#include "modar/runtime/comm_engine.hpp"
#include "modar/runtime/cuda_backend.hpp"

namespace modar::runtime {

namespace {

using namespace comm_detail;

// The NCCL entry points modar uses, resolved from libnccl.so.2.
struct NcclApi {
  bool loaded = false;
  std::string status;  // why not loaded, or "nccl 2.x.y (path)"
  int version = 0;     // ncclGetVersion: major * 10000 + minor * 100 + patch
  ncclResult_t (*get_version)(int*) = nullptr;
  ncclResult_t (*get_unique_id)(ncclUniqueId*) = nullptr;
  ncclResult_t (*comm_init_rank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*comm_finalize)(ncclComm_t) = nullptr;  // optional (>= 2.14)
  ncclResult_t (*comm_destroy)(ncclComm_t) = nullptr;
  ncclResult_t (*comm_split)(ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*) = nullptr;  // >= 2.18
  ncclResult_t (*comm_count)(const ncclComm_t, int*) = nullptr;
  ncclResult_t (*comm_user_rank)(const ncclComm_t, int*) = nullptr;
  const char* (*get_error_string)(ncclResult_t) = nullptr;
  const char* (*get_last_error)(ncclComm_t) = nullptr;  // optional (>= 2.13)
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                             cudaStream_t) = nullptr;
  ncclResult_t (*reduce_scatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                 ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*all_gather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                             cudaStream_t) = nullptr;
  ncclResult_t (*broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*group_start)() = nullptr;
  ncclResult_t (*group_end)() = nullptr;
};

template <class F>
bool resolve(void* handle, const char* name, F* out, std::string* missing) {
  *out = reinterpret_cast<F>(dlsym(handle, name));
  if (*out == nullptr && missing != nullptr) {
    *missing += std::string(missing->empty() ? "" : ", ") + name;
  }
  return *out != nullptr;
}

const NcclApi& nccl_api() {
  static NcclApi api;
  static std::once_flag once;
  std::call_once(once, [] {
    void* handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (handle == nullptr) {
      handle = dlopen("libnccl.so", RTLD_NOW | RTLD_GLOBAL);
    }
    if (handle == nullptr) {
      const char* error = dlerror();
      api.status = std::string("NCCL not found (") + (error ? error : "dlopen failed") +
                   "; put the directory of libnccl.so.2 on LD_LIBRARY_PATH)";
      return;
    }
    std::string missing;
    resolve(handle, "ncclGetVersion", &api.get_version, &missing);
    resolve(handle, "ncclGetUniqueId", &api.get_unique_id, &missing);
    resolve(handle, "ncclCommInitRank", &api.comm_init_rank, &missing);
    resolve(handle, "ncclCommDestroy", &api.comm_destroy, &missing);
    resolve(handle, "ncclCommCount", &api.comm_count, &missing);
    resolve(handle, "ncclCommUserRank", &api.comm_user_rank, &missing);
    resolve(handle, "ncclGetErrorString", &api.get_error_string, &missing);
    resolve(handle, "ncclAllReduce", &api.all_reduce, &missing);
    resolve(handle, "ncclReduceScatter", &api.reduce_scatter, &missing);
    resolve(handle, "ncclAllGather", &api.all_gather, &missing);
    resolve(handle, "ncclBroadcast", &api.broadcast, &missing);
    resolve(handle, "ncclSend", &api.send, &missing);
    resolve(handle, "ncclRecv", &api.recv, &missing);
    resolve(handle, "ncclGroupStart", &api.group_start, &missing);
    resolve(handle, "ncclGroupEnd", &api.group_end, &missing);
    resolve(handle, "ncclCommFinalize", &api.comm_finalize, nullptr);
    resolve(handle, "ncclCommSplit", &api.comm_split, nullptr);
    resolve(handle, "ncclGetLastError", &api.get_last_error, nullptr);
    if (!missing.empty()) {
      api.status = "NCCL library lacks " + missing + " (NCCL >= 2.7 needed)";
      return;
    }
    api.get_version(&api.version);
    api.loaded = true;
    api.status = "nccl " + std::to_string(api.version / 10000) + "." +
                 std::to_string(api.version / 100 % 100) + "." + std::to_string(api.version % 100);
  });
  return api;
}

const NcclApi& loaded_nccl_api() {
  const NcclApi& api = nccl_api();
  if (!api.loaded) {
    throw BackendError("communicator for the CUDA backend: " + api.status);
  }
  return api;
}

void check_nccl(ncclResult_t result, const char* what, ncclComm_t comm = nullptr) {
  if (result == ncclSuccess) {
    return;
  }
  const NcclApi& api = nccl_api();
  std::string message = std::string("NCCL: ") + what + " failed: " + api.get_error_string(result);
  if (api.get_last_error != nullptr) {
    const char* last = api.get_last_error(comm);
    if (last != nullptr && *last != '\0') {
      message += " (" + std::string(last) + ")";
    }
  }
  throw BackendError(message);
}

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw BackendError(std::string("CUDA error: ") + what + ": " + cudaGetErrorName(status) +
                       " (" + cudaGetErrorString(status) + ")");
  }
}

ncclDataType_t nccl_type(ScalarType type) {
  switch (type) {
    case ScalarType::fp64:
      return ncclFloat64;
    case ScalarType::fp32:
      return ncclFloat32;
    case ScalarType::bf16:
      return ncclBfloat16;
    case ScalarType::i32:
      return ncclInt32;
  }
  return ncclInt8;
}

size_t count_of(const TensorView& view) {
  return static_cast<size_t>(view.numel());
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Backend& backend, ncclComm_t comm) : backend_(backend), comm_(comm) {
    const NcclApi& api = loaded_nccl_api();
    stream_ = static_cast<cudaStream_t>(cuda_backend_stream(backend));
    device_ = cuda_backend_device(backend);
    check_nccl(api.comm_user_rank(comm_, &rank_), "ncclCommUserRank", comm_);
    check_nccl(api.comm_count(comm_, &size_), "ncclCommCount", comm_);
    barrier_word_ = backend_.allocate(sizeof(int32_t));
    backend_.fill(make_view(barrier_word_, ScalarType::i32, DeviceKind::cuda, {1}), 0.0);
  }
  ~NcclCommunicator() override {
    const NcclApi& api = nccl_api();
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    if (api.comm_finalize != nullptr) {
      api.comm_finalize(comm_);
    }
    api.comm_destroy(comm_);
    backend_.deallocate(barrier_word_);
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string engine() const override { return nccl_api().status; }
  DeviceKind device() const override { return DeviceKind::cuda; }

  void all_reduce(const TensorView& buf, ReduceOp op) override {
    check_buffer("all_reduce", "buf", buf, DeviceKind::cuda);
    enter();
    check_nccl(api().all_reduce(buf.data, buf.data, count_of(buf), nccl_type(buf.dtype),
                                op == ReduceOp::max ? ncclMax : ncclSum, comm_, stream_),
               "ncclAllReduce", comm_);
  }
  void reduce_scatter(const TensorView& in, const TensorView& out) override {
    check_pair("reduce_scatter", in, out, DeviceKind::cuda);
    check_scatter_sizes("reduce_scatter", in, out, size_);
    enter();
    check_nccl(api().reduce_scatter(in.data, out.data, count_of(out), nccl_type(in.dtype), ncclSum,
                                    comm_, stream_),
               "ncclReduceScatter", comm_);
  }
  void all_gather(const TensorView& in, const TensorView& out) override {
    check_pair("all_gather", in, out, DeviceKind::cuda);
    check_gather_sizes("all_gather", in, out, size_);
    enter();
    check_nccl(api().all_gather(in.data, out.data, count_of(in), nccl_type(in.dtype), comm_,
                                stream_),
               "ncclAllGather", comm_);
  }
  void all_to_all(const TensorView& in, const TensorView& out) override {
    check_pair("all_to_all", in, out, DeviceKind::cuda);
    check_all_to_all_sizes("all_to_all", in, out, size_);
    enter();
    const size_t chunk = count_of(in) / static_cast<size_t>(size_);
    const size_t chunk_bytes = chunk * static_cast<size_t>(scalar_bytes(in.dtype));
    const ncclDataType_t type = nccl_type(in.dtype);
    check_nccl(api().group_start(), "ncclGroupStart");
    for (int peer = 0; peer < size_; ++peer) {
      const char* send = static_cast<const char*>(in.data) + peer * chunk_bytes;
      char* recv = static_cast<char*>(out.data) + peer * chunk_bytes;
      check_nccl(api().send(send, chunk, type, peer, comm_, stream_), "ncclSend", comm_);
      check_nccl(api().recv(recv, chunk, type, peer, comm_, stream_), "ncclRecv", comm_);
    }
    check_nccl(api().group_end(), "ncclGroupEnd (all_to_all)", comm_);
  }
  void broadcast(const TensorView& buf, int root) override {
    check_buffer("broadcast", "buf", buf, DeviceKind::cuda);
    check_root("broadcast", root, size_);
    enter();
    check_nccl(api().broadcast(buf.data, buf.data, count_of(buf), nccl_type(buf.dtype), root,
                               comm_, stream_),
               "ncclBroadcast", comm_);
  }
  void send(const TensorView& buf, int peer) override {
    point_to_point(Direction::send, buf, peer);
  }
  void recv(const TensorView& buf, int peer) override {
    point_to_point(Direction::recv, buf, peer);
  }
  void send_recv(const TensorView& send_buf, int send_peer, const TensorView& recv_buf,
                 int recv_peer) override {
    check_buffer("send_recv", "send_buf", send_buf, DeviceKind::cuda);
    check_buffer("send_recv", "recv_buf", recv_buf, DeviceKind::cuda);
    check_peer("send_recv", "send_peer", send_peer, size_, rank_);
    check_peer("send_recv", "recv_peer", recv_peer, size_, rank_);
    enter();
    check_nccl(api().group_start(), "ncclGroupStart");
    post(Direction::send, send_buf, send_peer);
    post(Direction::recv, recv_buf, recv_peer);
    check_nccl(api().group_end(), "ncclGroupEnd (send_recv)", comm_);
  }
  void barrier() override {
    enter();
    check_nccl(api().all_reduce(barrier_word_, barrier_word_, 1, ncclInt32, ncclSum, comm_, stream_),
               "ncclAllReduce (barrier)", comm_);
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (barrier)");
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    if (api().comm_split == nullptr) {
      throw BackendError("NCCL: split needs ncclCommSplit (NCCL >= 2.18); this is " +
                         nccl_api().status);
    }
    enter();
    ncclComm_t part = nullptr;
    check_nccl(api().comm_split(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &part, nullptr),
               "ncclCommSplit", comm_);
    if (part == nullptr) {
      return nullptr;
    }
    return std::make_unique<NcclCommunicator>(backend_, part);
  }

 private:
  enum class Direction { send, recv };

  static const NcclApi& api() { return nccl_api(); }
  // NCCL calls act on the current device: the backend's.
  void enter() const { check_cuda(cudaSetDevice(device_), "cudaSetDevice"); }
  // send / recv: the checks (errors name the op "send" / "recv"), then one post.
  void point_to_point(Direction direction, const TensorView& buf, int peer) {
    const char* op = direction == Direction::send ? "send" : "recv";
    check_buffer(op, "buf", buf, DeviceKind::cuda);
    check_peer(op, "peer", peer, size_, rank_);
    enter();
    post(direction, buf, peer);
  }
  // One ncclSend of `buf` to `peer` or ncclRecv into it from `peer`, on the stream.
  void post(Direction direction, const TensorView& buf, int peer) {
    const size_t count = count_of(buf);
    const ncclDataType_t type = nccl_type(buf.dtype);
    if (direction == Direction::send) {
      check_nccl(api().send(buf.data, count, type, peer, comm_, stream_), "ncclSend", comm_);
    } else {
      check_nccl(api().recv(buf.data, count, type, peer, comm_, stream_), "ncclRecv", comm_);
    }
  }

  Backend& backend_;
  ncclComm_t comm_;
  cudaStream_t stream_ = nullptr;
  int device_ = 0;
  int rank_ = 0;
  int size_ = 1;
  void* barrier_word_ = nullptr;
};

}  // namespace

// The world communicator of a CUDA backend (registered by nccl_registration.cpp).
std::unique_ptr<Communicator> make_nccl_world_communicator(Backend& backend) {
  const NcclApi& api = loaded_nccl_api();
  const int device = cuda_backend_device(backend);
  const int rank = mpi_world_rank();
  const int size = mpi_world_size();
  ncclUniqueId id{};
  if (rank == 0) {
    check_nccl(api.get_unique_id(&id), "ncclGetUniqueId");
  }
  mpi_world_broadcast_bytes(&id, static_cast<int64_t>(sizeof(id)), 0);
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  ncclComm_t comm = nullptr;
  const ncclResult_t result = api.comm_init_rank(&comm, size, id, rank);
  if (result != ncclSuccess) {
    check_nccl(result, ("ncclCommInitRank (rank " + std::to_string(rank) + " of " +
                        std::to_string(size) + ", GPU " + std::to_string(device) +
                        "; every rank of a node needs its own GPU)")
                           .c_str());
  }
  return std::make_unique<NcclCommunicator>(backend, comm);
}

}  // namespace modar::runtime
