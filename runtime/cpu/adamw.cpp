// runtime/cpu/adamw.cpp: AdamW (Loshchilov & Hutter) with decoupled weight
// decay and bias correction, on fp32 (or fp64) master weights, in place:
//   g = grad_scale * grad
//   m = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g^2
//   m_hat = m / (1 - b1^t),  v_hat = v / (1 - b2^t)
//   p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p)
// params_lowp (optional) receives the updated weights in the model dtype.
#include <cmath>

#include "cpu_backend.hpp"
#include "cpu_common.hpp"

namespace modar::runtime::cpu {

void CpuBackend::run_op(const AdamwUpdateArgs& call) {
  const int64_t count = call.params.numel();
  dispatch_compute(call.params.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> g_in(call.grads);
    C* p = call.params.ptr<C>();
    C* m_p = call.m.ptr<C>();
    C* v_p = call.v.ptr<C>();
    const double step = static_cast<double>(call.hyper.step);
    const C correction1 = static_cast<C>(1.0 - std::pow(call.hyper.beta1, step));
    const C correction2 = static_cast<C>(1.0 - std::pow(call.hyper.beta2, step));
    const C b1 = static_cast<C>(call.hyper.beta1), b2 = static_cast<C>(call.hyper.beta2);
    const C lr = static_cast<C>(call.hyper.learning_rate),
            wd = static_cast<C>(call.hyper.weight_decay);
    const C eps = static_cast<C>(call.hyper.epsilon),
            grad_scale = static_cast<C>(call.hyper.grad_scale);
    MODAR_PARALLEL_FOR_IF(worth_threads(count))
    for (int64_t i = 0; i < count; ++i) {
      const C g = grad_scale * g_in[i];
      m_p[i] = b1 * m_p[i] + (C(1) - b1) * g;
      v_p[i] = b2 * v_p[i] + (C(1) - b2) * g * g;
      const C m_hat = m_p[i] / correction1;
      const C v_hat = v_p[i] / correction2;
      p[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + wd * p[i]);
    }
    if (!call.params_lowp.empty())
      store_converted(p, call.params_lowp, false);
  });
}

}  // namespace modar::runtime::cpu
