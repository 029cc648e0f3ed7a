// runtime/cpu/depth_read.cpp: AttnRes / DAR depth reads (docs/dar_math.md 1.4, 5.1, 5.2).
//
// Prefix read (phase 1), per query q and token t over sources r = 0..R-1:
//   k_hat_r = keys[r, t] * key_rstd[r, t]            (unweighted RMSNorm; gamma
//                                                      is folded into the query)
//   s_r     = queries[q] . k_hat_r                   (no 1/sqrt(d))
//   lse     = log sum_r exp(s_r),  a_r = exp(s_r - lse)
//   out     = sum_r a_r values[r, t]                 (normalised, as in catswe)
// Backward (5.1), with dR = dout[q, t] and dlse the gradient of lse (from a merge):
//   dp_r = <values_r, dR>,  Delta = <out, dR>,  ds_r = a_r (dp_r - Delta + dlse)
//   dvalues_r += a_r dR
//   dkeys_r   += ds_r rstd_r (q - s_r k_hat_r / d)   (the rstd path included)
//   dq        += sum_r ds_r k_hat_r
// Merge (phase 2, exact closed form of an online-softmax merge):
//   s_P = q . P_key rstd_P,  p = sigmoid(s_P - lse),  h = o + p (P_val - o)
// Backward (5.2): do += (1-p) dh, dP_val += p dh, g = <dh, P_val - o>,
//   ds_P = p (1-p) g (key path as above), dlse += -p (1-p) g.
// Layout: keys, values [R, T, d]; key_rstd [R, T]; queries [Q, d];
// out [Q, T, d]; lse [Q, T]; merge tensors [T, d] and [T].  In DAR the key
// and value tensors are different streams of the bank, so the key gradient
// lands on the opposite stream (the caller passes those tensors).
// Tokens are independent: loops over t run in parallel; the query gradient is
// reduced over t per thread-chunk and summed in a fixed order (deterministic).
#include <cmath>
#include <limits>

#include "cpu_backend.hpp"
#include "cpu_common.hpp"

namespace modar::runtime::cpu {
namespace {

template <class C>
C dot(const C* a, const C* b, int64_t d) {
  C sum = 0;
  for (int64_t i = 0; i < d; ++i)
    sum += a[i] * b[i];
  return sum;
}

// Fixed chunking of [0, tokens) so that reductions do not depend on threads.
constexpr int64_t kTokenChunk = 64;

}  // namespace

void CpuBackend::run_op(const DepthReadPrefixForwardArgs& call) {
  const int64_t sources = call.keys.shape[0], tokens = call.keys.shape[1], d = call.keys.shape[2];
  const int64_t query_count = call.queries.shape[0];
  dispatch_compute(call.keys.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> k_in(call.keys), v_in(call.values);
    Output<C> out_w(call.out, OutputMode::overwrite);
    const C* rstd = call.key_rstd.ptr<C>();
    const C* q = call.queries.ptr<C>();
    C* lse_p = call.lse.ptr<C>();
    MODAR_PARALLEL_FOR_IF(worth_threads(tokens * query_count * sources * d))
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<C> scores(static_cast<size_t>(sources));
      for (int64_t qi = 0; qi < query_count; ++qi) {
        C row_max = -std::numeric_limits<C>::infinity();
        for (int64_t r = 0; r < sources; ++r) {
          const C s = dot(q + qi * d, k_in.data() + (r * tokens + t) * d, d) * rstd[r * tokens + t];
          scores[static_cast<size_t>(r)] = s;
          row_max = std::max(row_max, s);
        }
        C sum = 0;
        for (int64_t r = 0; r < sources; ++r)
          sum += std::exp(scores[static_cast<size_t>(r)] - row_max);
        const C log_partition = row_max + std::log(sum);
        lse_p[qi * tokens + t] = log_partition;
        C* dst = out_w.data() + (qi * tokens + t) * d;
        for (int64_t c = 0; c < d; ++c)
          dst[c] = 0;
        for (int64_t r = 0; r < sources; ++r) {
          const C weight = std::exp(scores[static_cast<size_t>(r)] - log_partition);
          const C* v = v_in.data() + (r * tokens + t) * d;
          for (int64_t c = 0; c < d; ++c)
            dst[c] += weight * v[c];
        }
      }
    }
    out_w.commit();
  });
}

void CpuBackend::run_op(const DepthReadPrefixBackwardArgs& call) {
  const int64_t sources = call.keys.shape[0], tokens = call.keys.shape[1], d = call.keys.shape[2];
  const int64_t query_count = call.queries.shape[0];
  dispatch_compute(call.keys.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> k_in(call.keys), v_in(call.values), o_in(call.out), g_in(call.dout);
    // call.dkeys and call.dvalues may be one tensor: stage them through one buffer then.
    const bool shared_grad = !call.dkeys.empty() && call.dkeys.data == call.dvalues.data;
    Output<C> dk_acc(call.dkeys, OutputMode::accumulate);
    Output<C> dv_acc(shared_grad ? TensorView{} : call.dvalues, OutputMode::accumulate);
    C* dk = dk_acc.data();
    C* dv = shared_grad ? dk : dv_acc.data();
    const C* rstd = call.key_rstd.ptr<C>();
    const C* q = call.queries.ptr<C>();
    const C* lse_p = call.lse.ptr<C>();
    const C* dlse_p = call.dlse.empty() ? nullptr : call.dlse.ptr<C>();
    const int64_t chunks = (tokens + kTokenChunk - 1) / kTokenChunk;
    std::vector<C> dq_partial(
        call.dqueries.empty() ? 0 : static_cast<size_t>(chunks * query_count * d), C(0));
    const C inv_d = C(1) / static_cast<C>(d);
    MODAR_PARALLEL_FOR_IF(worth_threads(tokens * query_count * sources * d))
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      std::vector<C> scores(static_cast<size_t>(sources));
      for (int64_t t = chunk * kTokenChunk; t < std::min(tokens, (chunk + 1) * kTokenChunk); ++t) {
        for (int64_t qi = 0; qi < query_count; ++qi) {
          const C* query = q + qi * d;
          const C* grad = g_in.data() + (qi * tokens + t) * d;
          const C delta = dot(grad, o_in.data() + (qi * tokens + t) * d, d);
          const C log_partition = lse_p[qi * tokens + t];
          const C extra = dlse_p ? dlse_p[qi * tokens + t] : C(0);
          for (int64_t r = 0; r < sources; ++r) {
            const int64_t row = (r * tokens + t) * d;
            const C* key = k_in.data() + row;
            const C key_scale = rstd[r * tokens + t];
            const C s = dot(query, key, d) * key_scale;
            const C a = std::exp(s - log_partition);
            const C ds = a * (dot(v_in.data() + row, grad, d) - delta + extra);
            if (dv) {
              for (int64_t c = 0; c < d; ++c)
                dv[row + c] += a * grad[c];
            }
            if (dk) {
              for (int64_t c = 0; c < d; ++c) {
                dk[row + c] += ds * key_scale * (query[c] - s * key[c] * key_scale * inv_d);
              }
            }
            if (!dq_partial.empty()) {
              C* dq = dq_partial.data() + (chunk * query_count + qi) * d;
              for (int64_t c = 0; c < d; ++c)
                dq[c] += ds * key[c] * key_scale;
            }
          }
        }
      }
    }
    dk_acc.commit();
    dv_acc.commit();
    if (!dq_partial.empty()) {
      C* dq = call.dqueries.ptr<C>();
      for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        for (int64_t i = 0; i < query_count * d; ++i)
          dq[i] += dq_partial[static_cast<size_t>(chunk * query_count * d + i)];
      }
    }
  });
}

void CpuBackend::run_op(const DepthReadMergeForwardArgs& call) {
  const int64_t tokens = call.prefix_out.shape[0], d = call.prefix_out.shape[1];
  dispatch_compute(call.prefix_out.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> o_in(call.prefix_out), pk_in(call.partial_keys), pv_in(call.partial_values);
    Output<C> out_w(call.out, OutputMode::overwrite);
    const C* q = call.query.ptr<C>();
    const C* lse = call.prefix_lse.ptr<C>();
    const C* rstd = call.partial_key_rstd.ptr<C>();
    C* weight = call.partial_weight.ptr<C>();
    MODAR_PARALLEL_FOR_IF(worth_threads(tokens * d))
    for (int64_t t = 0; t < tokens; ++t) {
      const C s = dot(q, pk_in.data() + t * d, d) * rstd[t];
      const C p = sigmoid(s - lse[t]);
      weight[t] = p;
      const C* o = o_in.data() + t * d;
      const C* v = pv_in.data() + t * d;
      C* h = out_w.data() + t * d;
      for (int64_t c = 0; c < d; ++c)
        h[c] = o[c] + p * (v[c] - o[c]);
    }
    out_w.commit();
  });
}

void CpuBackend::run_op(const DepthReadMergeBackwardArgs& call) {
  const int64_t tokens = call.prefix_out.shape[0], d = call.prefix_out.shape[1];
  dispatch_compute(call.prefix_out.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> g_in(call.dout), o_in(call.prefix_out), pk_in(call.partial_keys),
        pv_in(call.partial_values);
    const bool shared_grad =
        !call.dpartial_keys.empty() && call.dpartial_keys.data == call.dpartial_values.data;
    Output<C> do_acc(call.dprefix_out, OutputMode::accumulate);
    Output<C> dk_acc(call.dpartial_keys, OutputMode::accumulate);
    Output<C> dv_acc(shared_grad ? TensorView{} : call.dpartial_values, OutputMode::accumulate);
    C* dk = dk_acc.data();
    C* dv = shared_grad ? dk : dv_acc.data();
    C* dlse = call.dprefix_lse.empty() ? nullptr : call.dprefix_lse.ptr<C>();
    const C* q = call.query.ptr<C>();
    const C* rstd = call.partial_key_rstd.ptr<C>();
    const C* weight = call.partial_weight.ptr<C>();
    const int64_t chunks = (tokens + kTokenChunk - 1) / kTokenChunk;
    std::vector<C> dq_partial(call.dquery.empty() ? 0 : static_cast<size_t>(chunks * d), C(0));
    const C inv_d = C(1) / static_cast<C>(d);
    MODAR_PARALLEL_FOR_IF(worth_threads(tokens * d))
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      for (int64_t t = chunk * kTokenChunk; t < std::min(tokens, (chunk + 1) * kTokenChunk); ++t) {
        const C p = weight[t];
        const C* grad = g_in.data() + t * d;
        const C* o = o_in.data() + t * d;
        const C* v = pv_in.data() + t * d;
        const C* key = pk_in.data() + t * d;
        C g = 0;
        for (int64_t c = 0; c < d; ++c)
          g += grad[c] * (v[c] - o[c]);
        const C ds = p * (C(1) - p) * g;
        if (do_acc.data()) {
          C* dst = do_acc.data() + t * d;
          for (int64_t c = 0; c < d; ++c)
            dst[c] += (C(1) - p) * grad[c];
        }
        if (dv) {
          C* dst = dv + t * d;
          for (int64_t c = 0; c < d; ++c)
            dst[c] += p * grad[c];
        }
        if (dlse)
          dlse[t] -= ds;
        const C key_scale = rstd[t];
        if (dk) {
          const C s = dot(q, key, d) * key_scale;
          C* dst = dk + t * d;
          for (int64_t c = 0; c < d; ++c) {
            dst[c] += ds * key_scale * (q[c] - s * key[c] * key_scale * inv_d);
          }
        }
        if (!dq_partial.empty()) {
          C* dq = dq_partial.data() + chunk * d;
          for (int64_t c = 0; c < d; ++c)
            dq[c] += ds * key[c] * key_scale;
        }
      }
    }
    do_acc.commit();
    dk_acc.commit();
    dv_acc.commit();
    if (!dq_partial.empty()) {
      C* dq = call.dquery.ptr<C>();
      for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        for (int64_t c = 0; c < d; ++c)
          dq[c] += dq_partial[static_cast<size_t>(chunk * d + c)];
      }
    }
  });
}

}  // namespace modar::runtime::cpu
