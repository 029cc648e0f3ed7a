// modar/runtime/forwarding_backend.hpp: a Backend that forwards everything
// (memory, copies, timers, facts, every op) to another backend.  Subclasses
// override execute() to observe or alter ops: validate's tracing backend
// (runtime/calibration/validate_trace.cpp) and test doubles.
#pragma once

#include <memory>
#include <string>

#include "modar/runtime/backend.hpp"

namespace modar::runtime {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner) : inner_(inner) {}
  std::string name() const override { return inner_.name(); }
  DeviceKind device() const override { return inner_.device(); }
  DeviceFacts facts() const override { return inner_.facts(); }
  bool supports(OpId op, ScalarType dtype) const override { return inner_.supports(op, dtype); }
  void* allocate(int64_t bytes) override { return inner_.allocate(bytes); }
  void deallocate(void* data) noexcept override { inner_.deallocate(data); }
  void copy_from_host(const void* host, const TensorView& dst) override {
    inner_.copy_from_host(host, dst);
  }
  void copy_to_host(const TensorView& src, void* host) override { inner_.copy_to_host(src, host); }
  void synchronize() override { inner_.synchronize(); }
  std::unique_ptr<Timer> make_timer() override { return inner_.make_timer(); }

 protected:
  // Runs the op on the inner backend (which checks it again: cheap).
  void execute(const OpArgs& call, const OpGeometry& /*geometry*/) override { inner_.run(call); }
  Backend& inner() { return inner_; }

 private:
  Backend& inner_;
};

}  // namespace modar::runtime
