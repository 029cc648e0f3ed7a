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
  const int64_t count = call.gate.numel();
  dispatch_compute(call.gate.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> a_in(call.gate), b_in(call.up);
    Output<C> out_w(call.out, OutputMode::overwrite);
    MODAR_PARALLEL_FOR_IF(worth_threads(count))
    for (int64_t i = 0; i < count; ++i)
      out_w[i] = a_in[i] * sigmoid(a_in[i]) * b_in[i];
    out_w.commit();
  });
}

void CpuBackend::run_op(const SwigluBackwardArgs& call) {
  const int64_t count = call.gate.numel();
  dispatch_compute(call.gate.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> a_in(call.gate), b_in(call.up), g_in(call.dout);
    Output<C> da_acc(call.dgate, OutputMode::accumulate), db_acc(call.dup, OutputMode::accumulate);
    C* da = da_acc.data();
    C* db = db_acc.data();
    MODAR_PARALLEL_FOR_IF(worth_threads(count))
    for (int64_t i = 0; i < count; ++i) {
      const C a = a_in[i];
      const C s = sigmoid(a);
      if (da)
        da[i] += g_in[i] * b_in[i] * s * (C(1) + a * (C(1) - s));
      if (db)
        db[i] += g_in[i] * a * s;
    }
    da_acc.commit();
    db_acc.commit();
  });
}

void CpuBackend::run_op(const AddArgs& call) {
  const int64_t count = call.a.numel();
  dispatch_compute(call.a.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> a_in(call.a),
        b_in(call.b);  // call.out may alias call.a or call.b: elementwise, read before write
    Output<C> out_w(call.out, OutputMode::overwrite);
    MODAR_PARALLEL_FOR_IF(worth_threads(count))
    for (int64_t i = 0; i < count; ++i)
      out_w[i] = a_in[i] + b_in[i];
    out_w.commit();
  });
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
  const int64_t count = call.a.numel();
  dispatch_compute(call.a.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> a_in(call.a), b_in(call.b);
    Output<C> out_w(call.out, OutputMode::overwrite);
    MODAR_PARALLEL_FOR_IF(worth_threads(count))
    for (int64_t i = 0; i < count; ++i)
      out_w[i] = a_in[i] * b_in[i];
    out_w.commit();
  });
}

void CpuBackend::run_op(const MulBackwardArgs& call) {
  const int64_t count = call.a.numel();
  dispatch_compute(call.a.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> a_in(call.a), b_in(call.b), g_in(call.dout);
    Output<C> da_acc(call.da, OutputMode::accumulate), db_acc(call.db, OutputMode::accumulate);
    C* da_p = da_acc.data();
    C* db_p = db_acc.data();
    MODAR_PARALLEL_FOR_IF(worth_threads(count))
    for (int64_t i = 0; i < count; ++i) {
      if (da_p)
        da_p[i] += g_in[i] * b_in[i];
      if (db_p)
        db_p[i] += g_in[i] * a_in[i];
    }
    da_acc.commit();
    db_acc.commit();
  });
}

}  // namespace modar::runtime::cpu
