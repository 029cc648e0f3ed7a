// runtime/cpu/rope.cpp: rotary position embedding, GPT-NeoX "half rotation".
//
// x [.., heads, d_h]; positions i32, one per row of x without the heads dim
// (x [b, s, H, d_h] -> positions [b, s]).  With h = d_h / 2 and, for i < h,
// theta_i = pos * base^(-2i / d_h):
//   out[i]     = x[i] cos(theta_i) - x[i + h] sin(theta_i)
//   out[i + h] = x[i + h] cos(theta_i) + x[i] sin(theta_i)
// The rotation is orthogonal, so the backward applies its transpose
// (theta -> -theta) and adds into dx.  Angles are computed in double so that
// large positions lose no accuracy.  Routed (MoD) rows carry their ORIGINAL
// positions, so a packed row rotates exactly as it would in the dense layer.
#include <cmath>

#include "cpu_backend.hpp"
#include "cpu_common.hpp"

namespace modar::runtime::cpu {
namespace {

// direction +1: forward rotation; -1: transpose (backward).
template <class C>
void rotate(const C* x, const int32_t* positions, C* out, int64_t position_rows, int64_t heads,
            int64_t d_head, double theta_base, double direction, bool accumulate) {
  const int64_t half = d_head / 2;
  std::vector<double> inverse_frequency(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    inverse_frequency[static_cast<size_t>(i)] =
        std::pow(theta_base, -2.0 * static_cast<double>(i) / static_cast<double>(d_head));
  }
  MODAR_PARALLEL_FOR_IF(worth_threads(position_rows * heads * d_head))
  for (int64_t r = 0; r < position_rows; ++r) {
    const double position = positions[r];
    for (int64_t i = 0; i < half; ++i) {
      const double angle = position * inverse_frequency[static_cast<size_t>(i)];
      const C cos_a = static_cast<C>(std::cos(angle));
      const C sin_a = static_cast<C>(direction * std::sin(angle));
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base = (r * heads + h) * d_head;
        const C x1 = x[base + i];
        const C x2 = x[base + i + half];
        const C y1 = x1 * cos_a - x2 * sin_a;
        const C y2 = x2 * cos_a + x1 * sin_a;
        if (accumulate) {
          out[base + i] += y1;
          out[base + i + half] += y2;
        } else {
          out[base + i] = y1;
          out[base + i + half] = y2;
        }
      }
    }
  }
}

}  // namespace

void CpuBackend::run_op(const RopeForwardArgs& call) {
  const int64_t heads = call.x.dim(-2), d_head = call.x.dim(-1);
  const int64_t position_rows = call.x.rows() / heads;
  dispatch_compute(call.x.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> x_in(call.x);  // call.out may alias call.x: each pair is read before it is written
    Output<C> out_w(call.out, OutputMode::overwrite);
    rotate<C>(x_in.data(), call.positions.ptr<int32_t>(), out_w.data(), position_rows, heads,
              d_head, call.params.theta_base, 1.0, false);
    out_w.commit();
  });
}

void CpuBackend::run_op(const RopeBackwardArgs& call) {
  const int64_t heads = call.dout.dim(-2), d_head = call.dout.dim(-1);
  const int64_t position_rows = call.dout.rows() / heads;
  dispatch_compute(call.dout.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> dout_in(call.dout);
    Output<C> dx_acc(call.dx, OutputMode::accumulate);
    rotate<C>(dout_in.data(), call.positions.ptr<int32_t>(), dx_acc.data(), position_rows, heads,
              d_head, call.params.theta_base, -1.0, true);
    dx_acc.commit();
  });
}

}  // namespace modar::runtime::cpu
