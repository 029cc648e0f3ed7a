// runtime/comm/communicator.cpp: the engine-independent part of the
// communicator (comm.hpp): argument checks, the self communicator, the world
// factory registry.
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "modar/base/enum_names.hpp"
#include "modar/base/errors.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/comm.hpp"
#include "modar/runtime/comm_engine.hpp"
#include "modar/runtime/host_facts.hpp"

namespace modar::runtime {

constexpr const char* kReduceOpNames[] = {"sum", "max"};
const char* to_string(ReduceOp v) {
  return name_of(kReduceOpNames, v, "?");
}

namespace comm_detail {

void check_buffer(const char* call, const char* argument, const TensorView& view,
                  DeviceKind device) {
  if (view.empty()) {
    throw ShapeError(std::string(call) + ": " + argument + " is empty (no data)");
  }
  if (view.device != device) {
    throw ShapeError(std::string(call) + ": " + argument + " " + view.describe() +
                     ": must be on the communicator's device (" + to_string(device) + ")");
  }
}

void check_pair(const char* call, const TensorView& in, const TensorView& out,
                DeviceKind device) {
  check_buffer(call, "in", in, device);
  check_buffer(call, "out", out, device);
  if (in.dtype != out.dtype) {
    throw ShapeError(std::string(call) + ": in " + in.describe() + " and out " +
                     out.describe() + ": must have one dtype");
  }
}

namespace {
[[noreturn]] void size_error(const char* call, const TensorView& in, const TensorView& out,
                             const std::string& rule) {
  throw ShapeError(std::string(call) + ": in " + in.describe() + " (" +
                   std::to_string(in.numel()) + " elements), out " + out.describe() + " (" +
                   std::to_string(out.numel()) + " elements): " + rule);
}
}  // namespace

void check_scatter_sizes(const char* call, const TensorView& in, const TensorView& out,
                         int size) {
  if (in.numel() != static_cast<int64_t>(size) * out.numel()) {
    size_error(call, in, out,
               "in must have size x out elements (size = " + std::to_string(size) + ")");
  }
}

void check_gather_sizes(const char* call, const TensorView& in, const TensorView& out,
                        int size) {
  if (out.numel() != static_cast<int64_t>(size) * in.numel()) {
    size_error(call, in, out,
               "out must have size x in elements (size = " + std::to_string(size) + ")");
  }
}

void check_all_to_all_sizes(const char* call, const TensorView& in, const TensorView& out,
                            int size) {
  if (in.numel() != out.numel() || in.numel() % size != 0) {
    size_error(call, in, out,
               "in and out must have one number of elements, divisible by size = " +
                   std::to_string(size));
  }
}

void check_peer(const char* call, const char* argument, int peer, int size, int rank) {
  if (peer < 0 || peer >= size || peer == rank) {
    throw ShapeError(std::string(call) + ": " + argument + " = " + std::to_string(peer) +
                     ": must be another rank in [0, " + std::to_string(size) +
                     ") (this rank is " + std::to_string(rank) + ")");
  }
}

void check_root(const char* call, int root, int size) {
  if (root < 0 || root >= size) {
    throw ShapeError(std::string(call) + ": root = " + std::to_string(root) +
                     ": must be a rank in [0, " + std::to_string(size) + ")");
  }
}

}  // namespace comm_detail

namespace {

using namespace comm_detail;

// One process.  Collectives are copies (or nothing, in place); with a backend
// the copies run on its device.
class SelfCommunicator final : public Communicator {
 public:
  explicit SelfCommunicator(Backend* backend) : backend_(backend) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string engine() const override { return "self"; }
  DeviceKind device() const override {
    return backend_ == nullptr ? DeviceKind::cpu : backend_->device();
  }

  void all_reduce(const TensorView& buf, ReduceOp op) override {
    check_buffer("all_reduce", "buf", buf, device());
  }
  void reduce_scatter(const TensorView& in, const TensorView& out) override {
    check_pair("reduce_scatter", in, out, device());
    check_scatter_sizes("reduce_scatter", in, out, 1);
    copy(in, out);
  }
  void all_gather(const TensorView& in, const TensorView& out) override {
    check_pair("all_gather", in, out, device());
    check_gather_sizes("all_gather", in, out, 1);
    copy(in, out);
  }
  void all_to_all(const TensorView& in, const TensorView& out) override {
    check_pair("all_to_all", in, out, device());
    check_all_to_all_sizes("all_to_all", in, out, 1);
    copy(in, out);
  }
  void broadcast(const TensorView& buf, int root) override {
    check_buffer("broadcast", "buf", buf, device());
    check_root("broadcast", root, 1);
  }
  void send(const TensorView& buf, int peer) override {
    check_buffer("send", "buf", buf, device());
    check_peer("send", "peer", peer, 1, 0);
  }
  void recv(const TensorView& buf, int peer) override {
    check_buffer("recv", "buf", buf, device());
    check_peer("recv", "peer", peer, 1, 0);
  }
  void send_recv(const TensorView& send_buf, int send_peer, const TensorView& recv_buf,
                 int recv_peer) override {
    check_buffer("send_recv", "send_buf", send_buf, device());
    check_buffer("send_recv", "recv_buf", recv_buf, device());
    check_peer("send_recv", "send_peer", send_peer, 1, 0);
  }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int color, int key) override {
    if (color < 0) {
      return nullptr;
    }
    return std::make_unique<SelfCommunicator>(backend_);
  }

 private:
  void copy(const TensorView& in, const TensorView& out) {
    if (in.data == out.data) {
      return;
    }
    if (backend_ == nullptr) {
      std::memmove(out.data, in.data, static_cast<size_t>(in.bytes()));
    } else {
      backend_->copy(reshape(in, {in.numel()}), reshape(out, {out.numel()}));
    }
  }
  Backend* backend_;
};

std::mutex& registry_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::map<DeviceKind, WorldCommunicatorFactory>& registry() {
  static std::map<DeviceKind, WorldCommunicatorFactory> factories;
  return factories;
}

}  // namespace

std::unique_ptr<Communicator> make_self_communicator() {
  return std::make_unique<SelfCommunicator>(nullptr);
}
std::unique_ptr<Communicator> make_self_communicator(Backend& backend) {
  return std::make_unique<SelfCommunicator>(&backend);
}

void register_world_communicator(DeviceKind device, WorldCommunicatorFactory factory) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[device] = factory;
}

std::unique_ptr<Communicator> make_world_communicator(Backend& backend) {
  // mpirun started several processes but this build cannot join them: each
  // would believe it is alone and compute something else than asked.
  if (!mpi_available() && launched_by_mpirun()) {
    const char* ranks = environment_value("OMPI_COMM_WORLD_SIZE")
                            ? environment_value("OMPI_COMM_WORLD_SIZE")
                            : environment_value("PMI_SIZE");
    if (ranks != nullptr && std::string(ranks) != "1") {
      throw BackendError(std::string("communicator: started by mpirun with ") + ranks +
                         " ranks, but this build of modar has no MPI (MODAR_MPI=OFF or no "
                         "Open MPI found at configure time)");
    }
  }
  if (backend.device() == DeviceKind::cpu) {
    return comm_detail::make_mpi_world_communicator();
  }
  WorldCommunicatorFactory factory = nullptr;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    const auto it = registry().find(backend.device());
    if (it != registry().end()) {
      factory = it->second;
    }
  }
  if (factory == nullptr) {
    throw BackendError(std::string("communicator for backend '") + backend.name() +
                       "': this build has no communication engine for device " +
                       to_string(backend.device()));
  }
  return factory(backend);
}

}  // namespace modar::runtime
