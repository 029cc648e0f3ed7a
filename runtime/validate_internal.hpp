// runtime/validate_internal.hpp: the tracing Backend of `modar validate`
// (runtime/validate_trace.cpp); not a public interface.
#pragma once

#include <chrono>
#include <vector>

#include "modar/runtime/backend.hpp"
#include "modar/runtime/validate.hpp"

namespace modar::runtime::validate_detail {

// Forwards every call to `inner` (memory, copies, timers, every op) and, while
// recording, counts the executed ops and keeps the GEMM shapes.
class TracingBackend final : public Backend {
 public:
  TracingBackend(Backend& inner, DType dtype) : inner_(inner), dtype_(dtype) {}
  std::string name() const override { return inner_.name(); }
  DeviceKind device() const override { return inner_.device(); }
  void* allocate(int64_t bytes) override { return inner_.allocate(bytes); }
  void deallocate(void* data) noexcept override { inner_.deallocate(data); }
  void copy_from_host(const void* host, const TensorView& dst) override {
    inner_.copy_from_host(host, dst);
  }
  void copy_to_host(const TensorView& src, void* host) override { inner_.copy_to_host(src, host); }
  void synchronize() override { inner_.synchronize(); }
  std::unique_ptr<Timer> make_timer() override { return inner_.make_timer(); }

  void start_recording() {
    recording_ = true;
    executed_ = ExecutedOps{};
    gemm_shapes_.clear();
  }
  void stop_recording() { recording_ = false; }
  const ExecutedOps& executed() const { return executed_; }
  const std::vector<OpShape>& gemm_shapes() const { return gemm_shapes_; }

 protected:
  void copy_impl(const TensorView& src, const TensorView& dst) override;
  void fill_impl(const TensorView& dst, double value) override;
  void convert_impl(const TensorView& src, const TensorView& dst) override;
  void gemm_impl(const TensorView& a, bool transpose_a, const TensorView& b, bool transpose_b,
                 const TensorView& c, double alpha, double beta) override;
  void rmsnorm_forward_impl(const TensorView& x, const TensorView& weight, const TensorView& out,
                            const TensorView& rstd, double eps) override;
  void rmsnorm_backward_impl(const TensorView& dout, const TensorView& x, const TensorView& weight,
                             const TensorView& rstd, const TensorView& dx,
                             const TensorView& dweight) override;
  void rope_forward_impl(const TensorView& x, const TensorView& positions, const TensorView& out,
                         const RopeParams& params) override;
  void rope_backward_impl(const TensorView& dout, const TensorView& positions, const TensorView& dx,
                          const RopeParams& params) override;
  void attention_forward_impl(const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& valid_lengths, const TensorView& out,
                              const TensorView& lse, const AttentionParams& params) override;
  void attention_backward_impl(const TensorView& dout, const TensorView& q, const TensorView& k,
                               const TensorView& v, const TensorView& valid_lengths,
                               const TensorView& out, const TensorView& lse, const TensorView& dq,
                               const TensorView& dk, const TensorView& dv,
                               const AttentionParams& params) override;
  void router_forward_impl(const TensorView& x, const TensorView& w,
                           const TensorView& logits) override;
  void router_backward_impl(const TensorView& dlogits, const TensorView& x, const TensorView& w,
                            const TensorView& dx, const TensorView& dw) override;
  void topk_impl(const TensorView& logits, const TensorView& indices) override;
  void topk_ragged_impl(const TensorView& logits, const TensorView& counts,
                        const TensorView& indices) override;
  void topk_mask_impl(const TensorView& indices, const TensorView& mask) override;
  void gather_rows_forward_impl(const TensorView& x, const TensorView& indices,
                                const TensorView& out) override;
  void gather_rows_backward_impl(const TensorView& dout, const TensorView& indices,
                                 const TensorView& dx) override;
  void scatter_add_scaled_forward_impl(const TensorView& x, const TensorView& indices,
                                       const TensorView& router_logits, const TensorView& delta,
                                       RouterScale gate) override;
  void scatter_add_scaled_backward_impl(const TensorView& dx, const TensorView& indices,
                                        const TensorView& router_logits, const TensorView& delta,
                                        RouterScale gate, const TensorView& ddelta,
                                        const TensorView& drouter_logits) override;
  void depth_read_prefix_forward_impl(const TensorView& keys, const TensorView& key_rstd,
                                      const TensorView& values, const TensorView& queries,
                                      const TensorView& out, const TensorView& lse) override;
  void depth_read_prefix_backward_impl(const TensorView& dout, const TensorView& dlse,
                                       const TensorView& keys, const TensorView& key_rstd,
                                       const TensorView& values, const TensorView& queries,
                                       const TensorView& out, const TensorView& lse,
                                       const TensorView& dkeys, const TensorView& dvalues,
                                       const TensorView& dqueries) override;
  void depth_read_merge_forward_impl(const TensorView& prefix_out, const TensorView& prefix_lse,
                                     const TensorView& partial_keys,
                                     const TensorView& partial_key_rstd,
                                     const TensorView& partial_values, const TensorView& query,
                                     const TensorView& out,
                                     const TensorView& partial_weight) override;
  void depth_read_merge_backward_impl(
      const TensorView& dout, const TensorView& prefix_out, const TensorView& partial_keys,
      const TensorView& partial_key_rstd, const TensorView& partial_values, const TensorView& query,
      const TensorView& partial_weight, const TensorView& dprefix_out,
      const TensorView& dprefix_lse, const TensorView& dpartial_keys,
      const TensorView& dpartial_values, const TensorView& dquery) override;
  void dar_coefficients_forward_impl(const TensorView& retrieved, const TensorView& weight,
                                     const TensorView& bias, const TensorView& scale,
                                     const TensorView& alpha, const TensorView& beta,
                                     const TensorView& transport, const TensorView& z_rstd,
                                     const DarCoefficientParams& params) override;
  void dar_coefficients_backward_impl(const TensorView& dalpha, const TensorView& dbeta,
                                      const TensorView& dtransport, const TensorView& retrieved,
                                      const TensorView& weight, const TensorView& bias,
                                      const TensorView& scale, const TensorView& alpha,
                                      const TensorView& beta, const TensorView& transport,
                                      const TensorView& z_rstd, const TensorView& dretrieved,
                                      const TensorView& dweight, const TensorView& dbias,
                                      const TensorView& dscale,
                                      const DarCoefficientParams& params) override;
  void dar_mix_forward_impl(const TensorView& retrieved, const TensorView& alpha,
                            const TensorView& out) override;
  void dar_mix_backward_impl(const TensorView& dout, const TensorView& retrieved,
                             const TensorView& alpha, const TensorView& dretrieved,
                             const TensorView& dalpha) override;
  void dar_write_forward_impl(const TensorView& transport, const TensorView& partial,
                              const TensorView& beta, const TensorView& y,
                              const TensorView& out) override;
  void dar_write_backward_impl(const TensorView& dout, const TensorView& transport,
                               const TensorView& partial, const TensorView& beta,
                               const TensorView& y, const TensorView& dtransport,
                               const TensorView& dpartial, const TensorView& dbeta,
                               const TensorView& dy) override;
  void gelu_forward_impl(const TensorView& x, const TensorView& out) override;
  void gelu_backward_impl(const TensorView& dout, const TensorView& x,
                          const TensorView& dx) override;
  void swiglu_forward_impl(const TensorView& gate, const TensorView& up,
                           const TensorView& out) override;
  void swiglu_backward_impl(const TensorView& dout, const TensorView& gate, const TensorView& up,
                            const TensorView& dgate, const TensorView& dup) override;
  void add_impl(const TensorView& a, const TensorView& b, const TensorView& out) override;
  void axpy_impl(double alpha, const TensorView& x, const TensorView& y) override;
  void scale_impl(const TensorView& x, double alpha) override;
  void mul_forward_impl(const TensorView& a, const TensorView& b, const TensorView& out) override;
  void mul_backward_impl(const TensorView& dout, const TensorView& a, const TensorView& b,
                         const TensorView& da, const TensorView& db) override;
  void cross_entropy_forward_impl(const TensorView& logits, const TensorView& targets,
                                  const TensorView& loss, const TensorView& lse) override;
  void cross_entropy_backward_impl(double dloss, const TensorView& logits,
                                   const TensorView& targets, const TensorView& lse,
                                   const TensorView& dlogits) override;
  void bce_with_logits_forward_impl(const TensorView& logits, const TensorView& targets,
                                    const TensorView& loss) override;
  void bce_with_logits_backward_impl(double dloss, const TensorView& logits,
                                     const TensorView& targets, const TensorView& dlogits) override;
  void embedding_forward_impl(const TensorView& table, const TensorView& tokens,
                              const TensorView& out) override;
  void embedding_backward_impl(const TensorView& dout, const TensorView& tokens,
                               const TensorView& dtable) override;
  void adamw_update_impl(const TensorView& params, const TensorView& grads, const TensorView& m,
                         const TensorView& v, const AdamWParams& hyper,
                         const TensorView& params_lowp) override;

 private:
  class Scope {
   public:
    Scope(TracingBackend* owner, OpKind kind);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    TracingBackend* owner_;
    OpKind kind_;
    std::chrono::steady_clock::time_point start_{};
  };
  Scope timed(OpKind kind);
  Backend& inner_;
  DType dtype_;
  bool recording_ = false;
  ExecutedOps executed_;
  std::vector<OpShape> gemm_shapes_;
};

}  // namespace modar::runtime::validate_detail
