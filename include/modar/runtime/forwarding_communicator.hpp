// modar/runtime/forwarding_communicator.hpp: a Communicator that forwards
// every call to the one it wraps, beside ForwardingBackend.  Decorators of a
// communicator (validate --parallel's timing recorder, the tests' byte
// counters) derive from it and override only what they change:
//
//   * observe(call, run): every communication call (collectives, point to
//     point, barrier) passes through this one hook as a CommCall that names
//     the operation, its buffers and its peers; the default runs it.  A
//     decorator that times, traces or counts calls overrides only this.
//   * a call it alters (rare): override that call itself.
//   * split(): the default returns the inner communicator's part unwrapped;
//     a decorator that must see the sub-groups' calls too overrides it.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "modar/runtime/comm.hpp"

namespace modar::runtime {

enum class CommOp {
  all_reduce,
  reduce_scatter,
  all_gather,
  all_to_all,
  broadcast,
  send,
  recv,
  send_recv,
  barrier
};
inline bool is_collective(CommOp op) {
  return op != CommOp::send && op != CommOp::recv && op != CommOp::send_recv;
}

// One communication call as a decorator sees it.  Peers and root are ranks of
// the communicator the call was made on (-1: none).
struct CommCall {
  CommOp op = CommOp::barrier;
  const TensorView* input = nullptr;   // what this rank contributes or sends
  const TensorView* output = nullptr;  // what it receives (in place: the same buffer)
  int send_peer = -1, recv_peer = -1, root = -1;
};

class ForwardingCommunicator : public Communicator {
 public:
  explicit ForwardingCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string engine() const override { return inner_->engine(); }
  DeviceKind device() const override { return inner_->device(); }
  Communicator& inner() { return *inner_; }

  void all_reduce(const TensorView& buf, ReduceOp op) override {
    observe({CommOp::all_reduce, &buf, &buf}, [&] { inner_->all_reduce(buf, op); });
  }
  void reduce_scatter(const TensorView& in, const TensorView& out) override {
    observe({CommOp::reduce_scatter, &in, &out}, [&] { inner_->reduce_scatter(in, out); });
  }
  void all_gather(const TensorView& in, const TensorView& out) override {
    observe({CommOp::all_gather, &in, &out}, [&] { inner_->all_gather(in, out); });
  }
  void all_to_all(const TensorView& in, const TensorView& out) override {
    observe({CommOp::all_to_all, &in, &out}, [&] { inner_->all_to_all(in, out); });
  }
  void broadcast(const TensorView& buf, int root) override {
    observe({CommOp::broadcast, &buf, &buf, -1, -1, root}, [&] { inner_->broadcast(buf, root); });
  }
  void send(const TensorView& buf, int peer) override {
    observe({CommOp::send, &buf, nullptr, peer}, [&] { inner_->send(buf, peer); });
  }
  void recv(const TensorView& buf, int peer) override {
    observe({CommOp::recv, nullptr, &buf, -1, peer}, [&] { inner_->recv(buf, peer); });
  }
  void send_recv(const TensorView& send_buf, int send_peer, const TensorView& recv_buf,
                 int recv_peer) override {
    observe({CommOp::send_recv, &send_buf, &recv_buf, send_peer, recv_peer},
            [&] { inner_->send_recv(send_buf, send_peer, recv_buf, recv_peer); });
  }
  void barrier() override {
    observe({CommOp::barrier}, [&] { inner_->barrier(); });
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    return inner_->split(color, key);
  }

 protected:
  // Every communication call passes through here; `run` makes it on the
  // inner communicator (call it exactly once).
  virtual void observe(const CommCall& /*call*/, const std::function<void()>& run) { run(); }

 private:
  std::unique_ptr<Communicator> inner_;
};

}  // namespace modar::runtime
