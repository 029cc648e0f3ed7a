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

void CpuBackend::gelu_forward_impl(const TensorView& x, const TensorView& out) {
  const int64_t count = x.numel();
  dispatch_compute(x.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> x_in(x);
    Output<C> out_w(out, OutputMode::overwrite);
    MODAR_PARALLEL_FOR_IF(worth_threads(count))
    for (int64_t i = 0; i < count; ++i)
      out_w[i] = gelu_terms(x_in[i]).value;
    out_w.commit();
  });
}

void CpuBackend::gelu_backward_impl(const TensorView& dout, const TensorView& x,
                                    const TensorView& dx) {
  const int64_t count = x.numel();
  dispatch_compute(x.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> x_in(x), g_in(dout);
    Output<C> dx_acc(dx, OutputMode::accumulate);
    MODAR_PARALLEL_FOR_IF(worth_threads(count))
    for (int64_t i = 0; i < count; ++i)
      dx_acc[i] += g_in[i] * gelu_terms(x_in[i]).derivative;
    dx_acc.commit();
  });
}

void CpuBackend::swiglu_forward_impl(const TensorView& gate, const TensorView& up,
                                     const TensorView& out) {
  const int64_t count = gate.numel();
  dispatch_compute(gate.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> a_in(gate), b_in(up);
    Output<C> out_w(out, OutputMode::overwrite);
    MODAR_PARALLEL_FOR_IF(worth_threads(count))
    for (int64_t i = 0; i < count; ++i)
      out_w[i] = a_in[i] * sigmoid(a_in[i]) * b_in[i];
    out_w.commit();
  });
}

void CpuBackend::swiglu_backward_impl(const TensorView& dout, const TensorView& gate,
                                      const TensorView& up, const TensorView& dgate,
                                      const TensorView& dup) {
  const int64_t count = gate.numel();
  dispatch_compute(gate.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> a_in(gate), b_in(up), g_in(dout);
    Output<C> da_acc(dgate, OutputMode::accumulate), db_acc(dup, OutputMode::accumulate);
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

void CpuBackend::add_impl(const TensorView& a, const TensorView& b, const TensorView& out) {
  const int64_t count = a.numel();
  dispatch_compute(a.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> a_in(a), b_in(b);  // out may alias a or b: elementwise, read before write
    Output<C> out_w(out, OutputMode::overwrite);
    MODAR_PARALLEL_FOR_IF(worth_threads(count))
    for (int64_t i = 0; i < count; ++i)
      out_w[i] = a_in[i] + b_in[i];
    out_w.commit();
  });
}

void CpuBackend::axpy_impl(double alpha, const TensorView& x, const TensorView& y) {
  const int64_t count = x.numel();
  dispatch_compute(y.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> x_in(x);
    Output<C> y_acc(y, OutputMode::accumulate);
    const C factor = static_cast<C>(alpha);
    MODAR_PARALLEL_FOR_IF(worth_threads(count))
    for (int64_t i = 0; i < count; ++i)
      y_acc[i] += factor * x_in[i];
    y_acc.commit();
  });
}

void CpuBackend::scale_impl(const TensorView& x, double alpha) {
  const int64_t count = x.numel();
  dispatch_compute(x.dtype, [&](auto tag) {
    using C = decltype(tag);
    Output<C> x_mod(x, OutputMode::modify);
    const C factor = static_cast<C>(alpha);
    MODAR_PARALLEL_FOR_IF(worth_threads(count))
    for (int64_t i = 0; i < count; ++i)
      x_mod[i] *= factor;
    x_mod.commit();
  });
}

void CpuBackend::mul_forward_impl(const TensorView& a, const TensorView& b, const TensorView& out) {
  const int64_t count = a.numel();
  dispatch_compute(a.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> a_in(a), b_in(b);
    Output<C> out_w(out, OutputMode::overwrite);
    MODAR_PARALLEL_FOR_IF(worth_threads(count))
    for (int64_t i = 0; i < count; ++i)
      out_w[i] = a_in[i] * b_in[i];
    out_w.commit();
  });
}

void CpuBackend::mul_backward_impl(const TensorView& dout, const TensorView& a, const TensorView& b,
                                   const TensorView& da, const TensorView& db) {
  const int64_t count = a.numel();
  dispatch_compute(a.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> a_in(a), b_in(b), g_in(dout);
    Output<C> da_acc(da, OutputMode::accumulate), db_acc(db, OutputMode::accumulate);
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
