// runtime/cpu/elementwise.cpp: GELU, SwiGLU, residual add, axpy, scale, mul.
//
//   gelu(x)   = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)   (tanh form)
//   gelu'(x)  = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
//   swiglu    = silu(gate) * up,  silu(a) = a sigmoid(a),
//   silu'(a)  = sigmoid(a) (1 + a (1 - sigmoid(a)))
//   add       out = a + b;   axpy  y += alpha x;   scale  x *= alpha
//   mul       out = a (.) b; backward da += dout (.) b, db += dout (.) a
// All tensors are flat arrays of equal element count; bf16 goes through fp32
// staging (cpu_common.hpp).
#include <cmath>
#include <utility>

#include "cpu_backend.hpp"
#include "cpu_common.hpp"

namespace modar::runtime::cpu {
namespace {

template <class C>
struct GeluTerms {
  C value;
  C derivative;
};

template <class C>
GeluTerms<C> gelu_terms(C x) {
  const C k = static_cast<C>(0.7978845608028654);  // sqrt(2 / pi)
  const C c = static_cast<C>(0.044715);
  const C u = k * (x + c * x * x * x);
  const C th = std::tanh(u);
  const C value = C(0.5) * x * (C(1) + th);
  const C derivative =
      C(0.5) * (C(1) + th) + C(0.5) * x * (C(1) - th * th) * k * (C(1) + C(3) * c * x * x);
  return {value, derivative};
}

// out[i] = f(a[i], b[i]) over equal-size flat tensors (out may alias a or b:
// each element is read before it is written).
template <class F>
void binary_map(const TensorView& a, const TensorView& b, const TensorView& out, F f) {
  const int64_t count = a.numel();
  dispatch_compute(a.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> a_in(a), b_in(b);
    Output<C> out_w(out, OutputMode::overwrite);
    MODAR_PARALLEL_FOR_IF(worth_threads(count))
    for (int64_t i = 0; i < count; ++i)
      out_w[i] = f(a_in[i], b_in[i]);
    out_w.commit();
  });
}

// The backward of a binary map: grads(a, b, dout) returns {d a, d b} for one
// element; they are accumulated into da and db (either may be absent).
template <class Grads>
void binary_backward(const TensorView& a, const TensorView& b, const TensorView& dout,
                     const TensorView& da, const TensorView& db, Grads grads) {
  const int64_t count = a.numel();
  dispatch_compute(a.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> a_in(a), b_in(b), g_in(dout);
    Output<C> da_acc(da, OutputMode::accumulate), db_acc(db, OutputMode::accumulate);
    C* da_p = da_acc.data();
    C* db_p = db_acc.data();
    MODAR_PARALLEL_FOR_IF(worth_threads(count))
    for (int64_t i = 0; i < count; ++i) {
      const auto [d_a, d_b] = grads(a_in[i], b_in[i], g_in[i]);
      if (da_p)
        da_p[i] += d_a;
      if (db_p)
        db_p[i] += d_b;
    }
    da_acc.commit();
    db_acc.commit();
  });
}

}  // namespace

void CpuBackend::run_op(const GeluForwardArgs& call) {
  const int64_t count = call.x.numel();
  dispatch_compute(call.x.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> x_in(call.x);
    Output<C> out_w(call.out, OutputMode::overwrite);
    MODAR_PARALLEL_FOR_IF(worth_threads(count))
    for (int64_t i = 0; i < count; ++i)
      out_w[i] = gelu_terms(x_in[i]).value;
    out_w.commit();
  });
}

void CpuBackend::run_op(const GeluBackwardArgs& call) {
  const int64_t count = call.x.numel();
  dispatch_compute(call.x.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> x_in(call.x), g_in(call.dout);
    Output<C> dx_acc(call.dx, OutputMode::accumulate);
    MODAR_PARALLEL_FOR_IF(worth_threads(count))
    for (int64_t i = 0; i < count; ++i)
      dx_acc[i] += g_in[i] * gelu_terms(x_in[i]).derivative;
    dx_acc.commit();
  });
}

void CpuBackend::run_op(const SwigluForwardArgs& call) {
  binary_map(call.gate, call.up, call.out, [](auto a, auto b) { return a * sigmoid(a) * b; });
}

void CpuBackend::run_op(const SwigluBackwardArgs& call) {
  binary_backward(call.gate, call.up, call.dout, call.dgate, call.dup, [](auto a, auto b, auto g) {
    using C = decltype(a);
    const C s = sigmoid(a);
    return std::pair<C, C>{g * b * s * (C(1) + a * (C(1) - s)), g * a * s};
  });
}

void CpuBackend::run_op(const AddArgs& call) {
  binary_map(call.a, call.b, call.out, [](auto a, auto b) { return a + b; });
}

void CpuBackend::run_op(const AxpyArgs& call) {
  const int64_t count = call.x.numel();
  dispatch_compute(call.y.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> x_in(call.x);
    Output<C> y_acc(call.y, OutputMode::accumulate);
    const C factor = static_cast<C>(call.alpha);
    MODAR_PARALLEL_FOR_IF(worth_threads(count))
    for (int64_t i = 0; i < count; ++i)
      y_acc[i] += factor * x_in[i];
    y_acc.commit();
  });
}

void CpuBackend::run_op(const ScaleArgs& call) {
  const int64_t count = call.x.numel();
  dispatch_compute(call.x.dtype, [&](auto tag) {
    using C = decltype(tag);
    Output<C> x_mod(call.x, OutputMode::modify);
    const C factor = static_cast<C>(call.alpha);
    MODAR_PARALLEL_FOR_IF(worth_threads(count))
    for (int64_t i = 0; i < count; ++i)
      x_mod[i] *= factor;
    x_mod.commit();
  });
}

void CpuBackend::run_op(const MulForwardArgs& call) {
  binary_map(call.a, call.b, call.out, [](auto a, auto b) { return a * b; });
}

void CpuBackend::run_op(const MulBackwardArgs& call) {
  binary_backward(call.a, call.b, call.dout, call.da, call.db, [](auto a, auto b, auto g) {
    return std::pair<decltype(a), decltype(a)>{g * b, g * a};
  });
}

}  // namespace modar::runtime::cpu
