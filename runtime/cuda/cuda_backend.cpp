// runtime/cuda/cuda_backend.cpp: the CUDA implementation of the Backend
// interface (include/modar/runtime/backend.hpp).
//
// The public op methods of Backend have already checked shapes, dtypes and
// devices (runtime/op_checks.cpp) when an *_impl here runs; this file maps
// TensorViews onto the POD params of the kernel families (one *.cuh / *.cu
// pair per family in this folder) and launches them on the backend's stream.
//
// Precision: tensors are fp32 or bf16 (statistics fp32).  fp64 is the CPU
// backend's finite-difference precision and is rejected here with a
// ShapeError naming the op.
// Memory: tensors come from allocate(), i.e. the caching allocator
// (caching_allocator.hpp: size-class free lists, no cudaMalloc / sync / cudaFree
// after warm-up); attention runs on cuDNN's fused SDPA where it can
// (cudnn_attention.hpp) and on the reference kernel otherwise;
// temporaries of an op (partial sums, counts, attention's D) come from ONE
// device arena that is rewound at the start of every op and grows (with a
// stream synchronisation, only when a larger op is seen, i.e. during warm-up)
// to the largest op's need.  The cuBLASLt workspace is allocated once.
// All work is ordered on one non-blocking stream; copy_to_host / synchronize
// wait for it.
#include "modar/runtime/cuda_backend.hpp"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>

#include "arena.hpp"
#include "attention.cuh"
#include "caching_allocator.hpp"
#include "check.hpp"
#include "cudnn_attention.hpp"
#include "dar.cuh"
#include "depth_read.cuh"
#include "elementwise.cuh"
#include "embedding_adamw.cuh"
#include "embedding_sorted.cuh"
#include "gather_scatter.cuh"
#include "gemm.hpp"
#include "loss.cuh"
#include "modar/errors.hpp"
#include "modar/runtime/backend.hpp"
#include "norm.cuh"
#include "rope.cuh"
#include "topk.cuh"

namespace modar::runtime {

namespace {

using gpu::Elem;

constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;  // cuBLASLt's recommendation for Hopper

// One device count / init failure message for every entry point.
int device_count_or_throw() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state of the runtime
    throw BackendError(std::string("no CUDA device: cudaGetDeviceCount failed: ") +
                       cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
  }
  if (count == 0) {
    throw BackendError("no CUDA device: cudaGetDeviceCount returned 0 devices");
  }
  return count;
}

class CudaTimer final : public Timer {
 public:
  explicit CudaTimer(cudaStream_t stream) : stream_(stream) {
    MODAR_CUDA_CHECK(cudaEventCreate(&start_));
    MODAR_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~CudaTimer() override {
    cudaEventDestroy(stop_);
    cudaEventDestroy(start_);
  }
  CudaTimer(const CudaTimer&) = delete;
  CudaTimer& operator=(const CudaTimer&) = delete;
  void start() override { MODAR_CUDA_CHECK(cudaEventRecord(start_, stream_)); }
  void stop() override { MODAR_CUDA_CHECK(cudaEventRecord(stop_, stream_)); }
  double elapsed_s() override {
    MODAR_CUDA_CHECK(cudaEventSynchronize(stop_));
    float milliseconds = 0.0f;
    MODAR_CUDA_CHECK(cudaEventElapsedTime(&milliseconds, start_, stop_));
    return static_cast<double>(milliseconds) * 1e-3;
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    const int count = device_count_or_throw();
    if (device < 0 || device >= count) {
      throw BackendError("no CUDA device: index " + std::to_string(device) + " requested, " +
                         std::to_string(count) + " present");
    }
    MODAR_CUDA_CHECK(cudaSetDevice(device));
    cudaDeviceProp properties{};
    MODAR_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
    name_ = "cuda:" + std::to_string(device) + " (" + properties.name + ")";
    try {
      MODAR_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      gemm_workspace_ = gpu::counted_cuda_malloc(kGemmWorkspaceBytes);
      gemm_ = std::make_unique<gpu::LtGemm>(gemm_workspace_, kGemmWorkspaceBytes);
      allocator_ = std::make_unique<gpu::CachingAllocator>(stream_);
      attention_ = std::make_unique<gpu::CudnnAttention>(*allocator_);
    } catch (...) {
      release();  // the destructor does not run for a constructor that throws
      throw;
    }
  }

  ~CudaBackend() override { release(); }

  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return name_; }
  DeviceKind device() const override { return DeviceKind::cuda; }

  void* allocate(int64_t bytes) override {
    if (bytes < 0) {
      throw BackendError("cuda allocate: negative size " + std::to_string(bytes));
    }
    return allocator_->allocate(static_cast<size_t>(bytes));  // caching_allocator.hpp
  }

  // Back to the allocator's free list: no sync, no cudaFree (stream order).
  void deallocate(void* data) noexcept override { allocator_->deallocate(data); }

  gpu::CachingAllocator& caching_allocator() const { return *allocator_; }

  void copy_from_host(const void* host, const TensorView& dst) override {
    require_cuda("copy_from_host", "dst", dst);
    if (dst.bytes() > 0) {
      MODAR_CUDA_CHECK(cudaMemcpyAsync(dst.data, host, static_cast<size_t>(dst.bytes()),
                                       cudaMemcpyHostToDevice, stream_));
      MODAR_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
  }

  void copy_to_host(const TensorView& src, void* host) override {
    require_cuda("copy_to_host", "src", src);
    if (src.bytes() > 0) {
      MODAR_CUDA_CHECK(cudaMemcpyAsync(host, src.data, static_cast<size_t>(src.bytes()),
                                       cudaMemcpyDeviceToHost, stream_));
    }
    MODAR_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void synchronize() override { MODAR_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  std::unique_ptr<Timer> make_timer() override { return std::make_unique<CudaTimer>(stream_); }

 protected:
  // ---- memory ops ----------------------------------------------------------------
  void copy_impl(const TensorView& src, const TensorView& dst) override {
    if (src.bytes() > 0) {
      MODAR_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, static_cast<size_t>(src.bytes()),
                                       cudaMemcpyDeviceToDevice, stream_));
    }
  }

  void fill_impl(const TensorView& dst, double value) override {
    if (dst.dtype == ScalarType::i32) {
      gpu::launch_fill(dst.data, dst.numel(), value, Elem::fp32, true, stream_);
    } else {
      gpu::launch_fill(dst.data, dst.numel(), value, elem("fill", dst), false, stream_);
    }
  }

  void convert_impl(const TensorView& src, const TensorView& dst) override {
    gpu::launch_convert(src.data, elem("convert", src), dst.data, elem("convert", dst), src.numel(),
                        stream_);
  }

  // ---- GEMM --------------------------------------------------------------------------
  void gemm_impl(const TensorView& a, bool transpose_a, const TensorView& b, bool transpose_b,
                 const TensorView& c, double alpha, double beta) override {
    gpu::GemmArgs args;
    const bool batched = a.rank == 3 && b.rank == 3 && c.rank == 3;
    int64_t a_rows = 0, a_cols = 0, b_rows = 0, b_cols = 0;
    if (batched) {
      args.batch = a.shape[0];
      a_rows = a.shape[1], a_cols = a.shape[2], b_rows = b.shape[1], b_cols = b.shape[2];
      args.stride_a = a_rows * a_cols;
      args.stride_b = b_rows * b_cols;
      args.stride_c = c.shape[1] * c.shape[2];
    } else {
      a_rows = a.rows(), a_cols = a.dim(-1), b_rows = b.rows(), b_cols = b.dim(-1);
    }
    args.m = transpose_a ? a_cols : a_rows;
    args.k = transpose_a ? a_rows : a_cols;
    args.n = transpose_b ? b_rows : b_cols;
    args.transpose_a = transpose_a;
    args.transpose_b = transpose_b;
    args.lda = a_cols;
    args.ldb = b_cols;
    args.ldc = args.n;
    args.a = a.data;
    args.b = b.data;
    args.c = c.data;
    args.alpha = static_cast<float>(alpha);
    args.beta = static_cast<float>(beta);
    args.input_type = elem("gemm", a) == Elem::fp32 ? gpu::GemmType::fp32 : gpu::GemmType::bf16;
    args.output_type = elem("gemm", c) == Elem::fp32 ? gpu::GemmType::fp32 : gpu::GemmType::bf16;
    if (args.k == 0) {
      // An empty inner dimension: C = beta C (cuBLASLt rejects k = 0).
      if (beta == 0.0) {
        fill_impl(c, 0.0);
      } else if (beta != 1.0) {
        gpu::launch_scale(c.data, static_cast<float>(beta), c.numel(), elem("gemm", c), stream_);
      }
      return;
    }
    gemm_->run(args, stream_);
  }

  // ---- RMSNorm -------------------------------------------------------------------------
  void rmsnorm_forward_impl(const TensorView& x, const TensorView& weight, const TensorView& out,
                            const TensorView& rstd, double eps) override {
    gpu::RmsNormParams p;
    p.x = x.data;
    p.weight = weight.data;
    p.out = out.data;
    p.rstd = stats("rmsnorm_forward", rstd);
    p.rows = x.rows();
    p.d = x.dim(-1);
    p.eps = static_cast<float>(eps);
    p.type = elem("rmsnorm_forward", x);
    gpu::launch_rmsnorm_forward(p, stream_);
  }

  void rmsnorm_backward_impl(const TensorView& dout, const TensorView& x, const TensorView& weight,
                             const TensorView& rstd, const TensorView& dx,
                             const TensorView& dweight) override {
    gpu::RmsNormBackwardParams p;
    p.dout = dout.data;
    p.x = x.data;
    p.weight = weight.data;
    p.rstd = stats("rmsnorm_backward", rstd);
    p.dx = dx.data;
    p.dweight = dweight.data;
    p.rows = x.rows();
    p.d = x.dim(-1);
    p.type = elem("rmsnorm_backward", x);
    if (!dweight.empty()) {
      p.dweight_type = elem("rmsnorm_backward", dweight);
      p.partial = scratch_floats({gpu::kReduceSplits * p.d})[0];
    }
    gpu::launch_rmsnorm_backward(p, stream_);
  }

  // ---- RoPE ------------------------------------------------------------------------------
  void rope_forward_impl(const TensorView& x, const TensorView& positions, const TensorView& out,
                         const RopeParams& params) override {
    launch_rope("rope_forward", x, positions, out, params, false);
  }

  void rope_backward_impl(const TensorView& dout, const TensorView& positions, const TensorView& dx,
                          const RopeParams& params) override {
    launch_rope("rope_backward", dout, positions, dx, params, true);
  }

  // ---- attention ----------------------------------------------------------------------
  void attention_forward_impl(const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& valid_lengths, const TensorView& out,
                              const TensorView& lse, const AttentionParams& params) override {
    gpu::AttentionLaunchParams p =
        attention_params("attention_forward", q, k, v, valid_lengths, out, lse, params);
    if (!attention_->forward(p, stream_)) {  // cuDNN SDPA where supported
      gpu::launch_attention_forward(p, stream_);
    }
  }

  void attention_backward_impl(const TensorView& dout, const TensorView& q, const TensorView& k,
                               const TensorView& v, const TensorView& valid_lengths,
                               const TensorView& out, const TensorView& lse, const TensorView& dq,
                               const TensorView& dk, const TensorView& dv,
                               const AttentionParams& params) override {
    gpu::AttentionLaunchParams p =
        attention_params("attention_backward", q, k, v, valid_lengths, out, lse, params);
    p.dout = dout.data;
    p.dq = dq.data;
    p.dk = dk.data;
    p.dv = dv.data;
    p.delta = scratch_floats({p.batch * p.heads * p.seq})[0];
    if (!attention_->backward(p, stream_)) {
      gpu::launch_attention_backward(p, stream_);
    }
  }

  // ---- MoD router, top-k, gather, scatter -----------------------------------------------
  void router_forward_impl(const TensorView& x, const TensorView& w,
                           const TensorView& logits) override {
    gpu::launch_router_forward(x.data, w.data, stats("router_forward", logits), x.rows(), x.dim(-1),
                               elem("router_forward", x), stream_);
  }

  void router_backward_impl(const TensorView& dlogits, const TensorView& x, const TensorView& w,
                            const TensorView& dx, const TensorView& dw) override {
    const int64_t d = x.dim(-1);
    float* partial = dw.empty() ? nullptr : scratch_floats({gpu::kReduceSplits * d})[0];
    gpu::launch_router_backward(stats("router_backward", dlogits), x.data, w.data, dx.data, dw.data,
                                dw.empty() ? Elem::fp32 : elem("router_backward", dw), partial,
                                x.rows(), d, elem("router_backward", x), stream_);
  }

  void topk_impl(const TensorView& logits, const TensorView& indices) override {
    gpu::TopkParams p;
    p.logits = stats("topk", logits);
    p.indices = indices.ptr<int32_t>();
    p.batch = logits.shape[0];
    p.seq_len = logits.shape[1];
    p.k_max = indices.shape[1];
    gpu::launch_topk(p, stream_);
  }

  void topk_ragged_impl(const TensorView& logits, const TensorView& counts,
                        const TensorView& indices) override {
    gpu::TopkParams p;
    p.logits = stats("topk_ragged", logits);
    p.counts = counts.ptr<int32_t>();
    p.indices = indices.ptr<int32_t>();
    p.batch = logits.shape[0];
    p.seq_len = logits.shape[1];
    p.k_max = indices.shape[1];
    gpu::launch_topk(p, stream_);
  }

  void topk_mask_impl(const TensorView& indices, const TensorView& mask) override {
    gpu::launch_topk_mask(indices.ptr<int32_t>(), mask.data, indices.shape[0], mask.shape[1],
                          indices.shape[1], elem("topk_mask", mask), stream_);
  }

  void gather_rows_forward_impl(const TensorView& x, const TensorView& indices,
                                const TensorView& out) override {
    gpu::launch_gather_rows_forward(routed("gather_rows_forward", x, indices), x.data, out.data,
                                    stream_);
  }

  void gather_rows_backward_impl(const TensorView& dout, const TensorView& indices,
                                 const TensorView& dx) override {
    gpu::launch_gather_rows_backward(routed("gather_rows_backward", dx, indices), dout.data,
                                     dx.data, stream_);
  }

  void scatter_add_scaled_forward_impl(const TensorView& x, const TensorView& indices,
                                       const TensorView& router_logits, const TensorView& delta,
                                       RouterScale gate) override {
    gpu::launch_scatter_add_scaled_forward(routed("scatter_add_scaled_forward", x, indices), x.data,
                                           stats("scatter_add_scaled_forward", router_logits),
                                           delta.data, gate_kind(gate), stream_);
  }

  void scatter_add_scaled_backward_impl(const TensorView& dx, const TensorView& indices,
                                        const TensorView& router_logits, const TensorView& delta,
                                        RouterScale gate, const TensorView& ddelta,
                                        const TensorView& drouter_logits) override {
    gpu::launch_scatter_add_scaled_backward(
        routed("scatter_add_scaled_backward", dx, indices), dx.data,
        stats("scatter_add_scaled_backward", router_logits), delta.data, gate_kind(gate),
        ddelta.data, optional_stats("scatter_add_scaled_backward", drouter_logits), stream_);
  }

  // ---- depth reads ------------------------------------------------------------------------
  void depth_read_prefix_forward_impl(const TensorView& keys, const TensorView& key_rstd,
                                      const TensorView& values, const TensorView& queries,
                                      const TensorView& out, const TensorView& lse) override {
    const char* op = "depth_read_prefix_forward";
    gpu::DepthReadPrefixParams p;
    p.keys = keys.data;
    p.key_rstd = stats(op, key_rstd);
    p.values = values.data;
    p.queries = stats(op, queries);
    p.out = out.data;
    p.lse = stats(op, lse);
    p.sources = keys.shape[0];
    p.tokens = keys.shape[1];
    p.d = keys.shape[2];
    p.queries_count = queries.shape[0];
    p.type = elem(op, keys);
    gpu::launch_depth_read_prefix_forward(p, stream_);
  }

  void depth_read_prefix_backward_impl(const TensorView& dout, const TensorView& dlse,
                                       const TensorView& keys, const TensorView& key_rstd,
                                       const TensorView& values, const TensorView& queries,
                                       const TensorView& out, const TensorView& lse,
                                       const TensorView& dkeys, const TensorView& dvalues,
                                       const TensorView& dqueries) override {
    const char* op = "depth_read_prefix_backward";
    gpu::DepthReadPrefixParams p;
    p.keys = keys.data;
    p.key_rstd = stats(op, key_rstd);
    p.values = values.data;
    p.queries = stats(op, queries);
    p.out = out.data;
    p.lse = stats(op, lse);
    p.dout = dout.data;
    p.dlse = optional_stats(op, dlse);
    p.dkeys = dkeys.data;
    p.dvalues = dvalues.data;
    p.dqueries = optional_stats(op, dqueries);
    p.sources = keys.shape[0];
    p.tokens = keys.shape[1];
    p.d = keys.shape[2];
    p.queries_count = queries.shape[0];
    p.type = elem(op, keys);
    if (p.dqueries != nullptr) {
      p.partial = scratch_floats({int64_t{gpu::kDepthReadBlocks} * p.queries_count * p.d})[0];
    }
    gpu::launch_depth_read_prefix_backward(p, stream_);
  }

  void depth_read_merge_forward_impl(const TensorView& prefix_out, const TensorView& prefix_lse,
                                     const TensorView& partial_keys,
                                     const TensorView& partial_key_rstd,
                                     const TensorView& partial_values, const TensorView& query,
                                     const TensorView& out,
                                     const TensorView& partial_weight) override {
    const char* op = "depth_read_merge_forward";
    gpu::DepthReadMergeParams p;
    p.prefix_out = prefix_out.data;
    p.prefix_lse = stats(op, prefix_lse);
    p.partial_keys = partial_keys.data;
    p.partial_key_rstd = stats(op, partial_key_rstd);
    p.partial_values = partial_values.data;
    p.query = stats(op, query);
    p.out = out.data;
    p.partial_weight = stats(op, partial_weight);
    p.tokens = prefix_out.shape[0];
    p.d = prefix_out.shape[1];
    p.type = elem(op, prefix_out);
    gpu::launch_depth_read_merge_forward(p, stream_);
  }

  void depth_read_merge_backward_impl(
      const TensorView& dout, const TensorView& prefix_out, const TensorView& partial_keys,
      const TensorView& partial_key_rstd, const TensorView& partial_values, const TensorView& query,
      const TensorView& partial_weight, const TensorView& dprefix_out,
      const TensorView& dprefix_lse, const TensorView& dpartial_keys,
      const TensorView& dpartial_values, const TensorView& dquery) override {
    const char* op = "depth_read_merge_backward";
    gpu::DepthReadMergeParams p;
    p.prefix_out = prefix_out.data;
    p.partial_keys = partial_keys.data;
    p.partial_key_rstd = stats(op, partial_key_rstd);
    p.partial_values = partial_values.data;
    p.query = stats(op, query);
    p.partial_weight = stats(op, partial_weight);
    p.dout = dout.data;
    p.dprefix_out = dprefix_out.data;
    p.dprefix_lse = optional_stats(op, dprefix_lse);
    p.dpartial_keys = dpartial_keys.data;
    p.dpartial_values = dpartial_values.data;
    p.dquery = optional_stats(op, dquery);
    p.tokens = prefix_out.shape[0];
    p.d = prefix_out.shape[1];
    p.type = elem(op, prefix_out);
    if (p.dquery != nullptr) {
      p.partial = scratch_floats({int64_t{gpu::kDepthReadBlocks} * p.d})[0];
    }
    gpu::launch_depth_read_merge_backward(p, stream_);
  }

  // ---- DAR -----------------------------------------------------------------------------------
  void dar_coefficients_forward_impl(const TensorView& retrieved, const TensorView& weight,
                                     const TensorView& bias, const TensorView& scale,
                                     const TensorView& alpha, const TensorView& beta,
                                     const TensorView& transport, const TensorView& z_rstd,
                                     const DarCoefficientParams& params) override {
    gpu::DarCoefficientLaunchParams p =
        coefficient_params("dar_coefficients_forward", retrieved, weight, bias, scale, alpha, beta,
                           transport, z_rstd, params);
    gpu::launch_dar_coefficients_forward(p, stream_);
  }

  void dar_coefficients_backward_impl(const TensorView& dalpha, const TensorView& dbeta,
                                      const TensorView& dtransport, const TensorView& retrieved,
                                      const TensorView& weight, const TensorView& bias,
                                      const TensorView& scale, const TensorView& alpha,
                                      const TensorView& beta, const TensorView& transport,
                                      const TensorView& z_rstd, const TensorView& dretrieved,
                                      const TensorView& dweight, const TensorView& dbias,
                                      const TensorView& dscale,
                                      const DarCoefficientParams& params) override {
    const char* op = "dar_coefficients_backward";
    gpu::DarCoefficientLaunchParams p = coefficient_params(op, retrieved, weight, bias, scale,
                                                           alpha, beta, transport, z_rstd, params);
    p.dalpha = optional_stats(op, dalpha);
    p.dbeta = optional_stats(op, dbeta);
    p.dtransport = optional_stats(op, dtransport);
    p.dretrieved = dretrieved.data;
    p.dweight = optional_stats(op, dweight);
    p.dbias = optional_stats(op, dbias);
    p.dscale = optional_stats(op, dscale);
    const auto buffers = scratch_floats(
        {p.tokens * p.outputs, p.tokens * 3,
         p.dweight != nullptr ? int64_t{gpu::kReduceSplits} * p.streams * p.d * p.outputs : 0});
    p.token_dc = buffers[0];
    p.token_dscale = buffers[1];
    p.partial = buffers[2];
    gpu::launch_dar_coefficients_backward(p, stream_);
  }

  void dar_mix_forward_impl(const TensorView& retrieved, const TensorView& alpha,
                            const TensorView& out) override {
    gpu::DarMixParams p = mix_params("dar_mix_forward", retrieved, alpha);
    p.out = out.data;
    gpu::launch_dar_mix_forward(p, stream_);
  }

  void dar_mix_backward_impl(const TensorView& dout, const TensorView& retrieved,
                             const TensorView& alpha, const TensorView& dretrieved,
                             const TensorView& dalpha) override {
    gpu::DarMixParams p = mix_params("dar_mix_backward", retrieved, alpha);
    p.dout = dout.data;
    p.dretrieved = dretrieved.data;
    p.dalpha = optional_stats("dar_mix_backward", dalpha);
    gpu::launch_dar_mix_backward(p, stream_);
  }

  void dar_write_forward_impl(const TensorView& transport, const TensorView& partial,
                              const TensorView& beta, const TensorView& y,
                              const TensorView& out) override {
    gpu::DarWriteParams p = write_params("dar_write_forward", transport, partial, beta, y, out);
    gpu::launch_dar_write_forward(p, stream_);
  }

  void dar_write_backward_impl(const TensorView& dout, const TensorView& transport,
                               const TensorView& partial, const TensorView& beta,
                               const TensorView& y, const TensorView& dtransport,
                               const TensorView& dpartial, const TensorView& dbeta,
                               const TensorView& dy) override {
    const char* op = "dar_write_backward";
    gpu::DarWriteParams p = write_params(op, transport, partial, beta, y, dout);
    p.out = nullptr;
    p.dout = dout.data;
    p.dtransport = optional_stats(op, dtransport);
    p.dpartial = dpartial.data;
    p.dbeta = optional_stats(op, dbeta);
    p.dy = dy.data;
    gpu::launch_dar_write_backward(p, stream_);
  }

  // ---- elementwise ---------------------------------------------------------------------------
  void gelu_forward_impl(const TensorView& x, const TensorView& out) override {
    gpu::ActivationParams p{
        gpu::UnaryOp::gelu_forward, x.data, nullptr, nullptr, out.data, nullptr, x.numel(),
        elem("gelu_forward", x)};
    gpu::launch_activation(p, stream_);
  }

  void gelu_backward_impl(const TensorView& dout, const TensorView& x,
                          const TensorView& dx) override {
    if (dx.empty())
      return;
    gpu::ActivationParams p{
        gpu::UnaryOp::gelu_backward, x.data, nullptr, dout.data, dx.data, nullptr, x.numel(),
        elem("gelu_backward", x)};
    gpu::launch_activation(p, stream_);
  }

  void swiglu_forward_impl(const TensorView& gate, const TensorView& up,
                           const TensorView& out) override {
    gpu::ActivationParams p{
        gpu::UnaryOp::swiglu_forward, gate.data, up.data, nullptr, out.data, nullptr, gate.numel(),
        elem("swiglu_forward", gate)};
    gpu::launch_activation(p, stream_);
  }

  void swiglu_backward_impl(const TensorView& dout, const TensorView& gate, const TensorView& up,
                            const TensorView& dgate, const TensorView& dup) override {
    if (dgate.empty() && dup.empty())
      return;
    gpu::ActivationParams p{gpu::UnaryOp::swiglu_backward,
                            gate.data,
                            up.data,
                            dout.data,
                            dgate.data,
                            dup.data,
                            gate.numel(),
                            elem("swiglu_backward", gate)};
    gpu::launch_activation(p, stream_);
  }

  void add_impl(const TensorView& a, const TensorView& b, const TensorView& out) override {
    gpu::launch_add(a.data, b.data, out.data, a.numel(), elem("add", a), stream_);
  }

  void axpy_impl(double alpha, const TensorView& x, const TensorView& y) override {
    gpu::launch_axpy(static_cast<float>(alpha), x.data, elem("axpy", x), y.data, elem("axpy", y),
                     x.numel(), stream_);
  }

  void scale_impl(const TensorView& x, double alpha) override {
    gpu::launch_scale(x.data, static_cast<float>(alpha), x.numel(), elem("scale", x), stream_);
  }

  void mul_forward_impl(const TensorView& a, const TensorView& b, const TensorView& out) override {
    gpu::launch_mul_forward(a.data, b.data, out.data, a.numel(), elem("mul_forward", a), stream_);
  }

  void mul_backward_impl(const TensorView& dout, const TensorView& a, const TensorView& b,
                         const TensorView& da, const TensorView& db) override {
    gpu::launch_mul_backward(dout.data, a.data, b.data, da.data, db.data, a.numel(),
                             elem("mul_backward", a), stream_);
  }

  // ---- losses, embedding, optimizer -----------------------------------------------------------
  void cross_entropy_forward_impl(const TensorView& logits, const TensorView& targets,
                                  const TensorView& loss, const TensorView& lse) override {
    const char* op = "cross_entropy_forward";
    gpu::CrossEntropyParams p;
    p.logits = logits.data;
    p.targets = targets.ptr<int32_t>();
    p.loss = optional_stats(op, loss);
    p.lse = stats(op, lse);
    p.rows = logits.rows();
    p.vocab = logits.dim(-1);
    p.type = elem(op, logits);
    p.row_scratch = scratch_floats({p.rows})[0];
    gpu::launch_cross_entropy_forward(p, stream_);
  }

  void cross_entropy_backward_impl(double dloss, const TensorView& logits,
                                   const TensorView& targets, const TensorView& lse,
                                   const TensorView& dlogits) override {
    const char* op = "cross_entropy_backward";
    if (dlogits.empty())
      return;
    gpu::CrossEntropyParams p;
    p.logits = logits.data;
    p.targets = targets.ptr<int32_t>();
    p.lse = stats(op, lse);
    p.dlogits = dlogits.data;
    p.dloss = static_cast<float>(dloss);
    p.rows = logits.rows();
    p.vocab = logits.dim(-1);
    p.type = elem(op, logits);
    p.count_scratch = scratch_floats({1})[0];
    gpu::launch_cross_entropy_backward(p, stream_);
  }

  void bce_with_logits_forward_impl(const TensorView& logits, const TensorView& targets,
                                    const TensorView& loss) override {
    const char* op = "bce_with_logits_forward";
    if (loss.empty() || logits.numel() == 0)
      return;
    gpu::launch_bce_with_logits_forward(stats(op, logits), stats(op, targets), stats(op, loss),
                                        logits.numel(), stream_);
  }

  void bce_with_logits_backward_impl(double dloss, const TensorView& logits,
                                     const TensorView& targets,
                                     const TensorView& dlogits) override {
    const char* op = "bce_with_logits_backward";
    if (dlogits.empty() || logits.numel() == 0)
      return;
    gpu::launch_bce_with_logits_backward(static_cast<float>(dloss), stats(op, logits),
                                         stats(op, targets), stats(op, dlogits), logits.numel(),
                                         stream_);
  }

  void embedding_forward_impl(const TensorView& table, const TensorView& tokens,
                              const TensorView& out) override {
    gpu::launch_embedding_forward(table.data, elem("embedding_forward", table),
                                  tokens.ptr<int32_t>(), out.data, elem("embedding_forward", out),
                                  tokens.numel(), table.shape[1], table.shape[0], stream_);
  }

  void embedding_backward_impl(const TensorView& dout, const TensorView& tokens,
                               const TensorView& dtable) override {
    const char* op = "embedding_backward";
    if (dtable.empty()) {
      return;
    }
    // Deterministic: rows sorted by token, runs summed in order, rounded once
    // (embedding_sorted.cuh); no atomics.
    gpu::launch_embedding_backward_sorted(dout.data, elem(op, dout), tokens.ptr<int32_t>(),
                                          dtable.data, elem(op, dtable), tokens.numel(),
                                          dtable.shape[1], dtable.shape[0], *allocator_, stream_);
  }

  void adamw_update_impl(const TensorView& params, const TensorView& grads, const TensorView& m,
                         const TensorView& v, const AdamWParams& hyper,
                         const TensorView& params_lowp) override {
    const char* op = "adamw_update";
    gpu::AdamWLaunchParams p;
    p.params = stats(op, params);
    p.grads = grads.data;
    p.m = stats(op, m);
    p.v = stats(op, v);
    p.params_lowp = params_lowp.data;
    p.count = params.numel();
    p.learning_rate = static_cast<float>(hyper.learning_rate);
    p.beta1 = static_cast<float>(hyper.beta1);
    p.beta2 = static_cast<float>(hyper.beta2);
    p.epsilon = static_cast<float>(hyper.epsilon);
    p.weight_decay = static_cast<float>(hyper.weight_decay);
    const double step = static_cast<double>(hyper.step);
    p.bias_correction1 = static_cast<float>(1.0 - std::pow(hyper.beta1, step));
    p.bias_correction2 = static_cast<float>(1.0 - std::pow(hyper.beta2, step));
    p.grad_scale = static_cast<float>(hyper.grad_scale);
    p.grad_type = elem(op, grads);
    p.lowp_type = params_lowp.empty() ? Elem::fp32 : elem(op, params_lowp);
    gpu::launch_adamw(p, stream_);
  }

 private:
  // Frees what the constructor acquired (each part may be missing).
  void release() noexcept {
    gemm_.reset();
    attention_.reset();
    allocator_.reset();  // synchronises the stream, so before it is destroyed
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
      stream_ = nullptr;
    }
    if (gemm_workspace_ != nullptr) {
      gpu::counted_cuda_free(gemm_workspace_);
      gemm_workspace_ = nullptr;
    }
  }

  // ---- helpers --------------------------------------------------------------------------------
  static void require_cuda(const char* op, const char* name, const TensorView& view) {
    if (view.device != DeviceKind::cuda) {
      throw ShapeError(std::string(op) + ": " + name + " is " + view.describe() +
                       "; expected a cuda tensor");
    }
  }

  static Elem elem(const char* op, const TensorView& view) {
    switch (view.dtype) {
      case ScalarType::fp32:
        return Elem::fp32;
      case ScalarType::bf16:
        return Elem::bf16;
      default:
        throw ShapeError(std::string(op) + ": " + view.describe() +
                         " is not supported by the CUDA backend (fp32 or bf16; fp64 is the CPU "
                         "backend's reference precision)");
    }
  }

  static float* stats(const char* op, const TensorView& view) {
    if (view.dtype != ScalarType::fp32) {
      throw ShapeError(std::string(op) + ": " + view.describe() +
                       " is not supported by the CUDA backend (statistics are fp32 on the GPU)");
    }
    return view.ptr<float>();
  }

  static float* optional_stats(const char* op, const TensorView& view) {
    return view.empty() ? nullptr : stats(op, view);
  }

  static gpu::GateKind gate_kind(RouterScale gate) {
    return gate == RouterScale::linear ? gpu::GateKind::linear : gpu::GateKind::sigmoid;
  }

  // Rewinds the arena and carves one fp32 buffer per count (0 -> nullptr).
  // Grows the arena first if this op needs more than any op before it.
  std::array<float*, 3> scratch_floats(std::initializer_list<int64_t> counts) {
    if (counts.size() > 3) {
      throw BackendError("cuda backend: at most 3 scratch buffers per op");
    }
    size_t needed = 0;
    for (const int64_t count : counts) {
      needed += gpu::DeviceArena::aligned_bytes(static_cast<size_t>(count) * sizeof(float));
    }
    arena_.reset();
    if (needed > arena_.capacity_bytes()) {
      synchronize();  // the old buffer may still be read by queued kernels
      arena_.reserve(std::max(needed, arena_.capacity_bytes() * 2));
    }
    std::array<float*, 3> buffers{};
    size_t index = 0;
    for (const int64_t count : counts) {
      buffers[index++] = count > 0 ? arena_.allocate_elements<float>(count) : nullptr;
    }
    return buffers;
  }

  void launch_rope(const char* op, const TensorView& in, const TensorView& positions,
                   const TensorView& out, const RopeParams& params, bool backward) {
    if (out.empty())
      return;
    gpu::RopeLaunchParams p;
    p.in = in.data;
    p.out = out.data;
    p.positions = positions.ptr<int32_t>();
    p.heads = in.dim(-2);
    p.d_head = in.dim(-1);
    p.rows = in.numel() / (p.heads * p.d_head);
    p.theta_base = params.theta_base;
    p.backward = backward;
    p.type = elem(op, in);
    gpu::launch_rope(p, stream_);
  }

  gpu::AttentionLaunchParams attention_params(const char* op, const TensorView& q,
                                              const TensorView& k, const TensorView& v,
                                              const TensorView& valid_lengths,
                                              const TensorView& out, const TensorView& lse,
                                              const AttentionParams& params) const {
    gpu::AttentionLaunchParams p;
    p.q = q.data;
    p.k = k.data;
    p.v = v.data;
    p.out = out.data;
    p.lse = stats(op, lse);
    p.valid_lengths = valid_lengths.empty() ? nullptr : valid_lengths.ptr<int32_t>();
    p.batch = q.shape[0];
    p.seq = q.shape[1];
    p.heads = q.shape[2];
    p.kv_heads = k.shape[2];
    p.d_head = q.shape[3];
    p.softmax_scale = static_cast<float>(params.softmax_scale > 0.0
                                             ? params.softmax_scale
                                             : 1.0 / std::sqrt(static_cast<double>(p.d_head)));
    p.causal = params.causal;
    p.type = elem(op, q);
    return p;
  }

  static gpu::RoutedRowsParams routed(const char* op, const TensorView& x,
                                      const TensorView& indices) {
    gpu::RoutedRowsParams p;
    p.batch = x.shape[0];
    p.seq_len = x.shape[1];
    p.d = x.shape[2];
    p.k = indices.shape[1];
    p.indices = indices.ptr<int32_t>();
    p.type = elem(op, x);
    return p;
  }

  static gpu::DarCoefficientLaunchParams coefficient_params(
      const char* op, const TensorView& retrieved, const TensorView& weight, const TensorView& bias,
      const TensorView& scale, const TensorView& alpha, const TensorView& beta,
      const TensorView& transport, const TensorView& z_rstd, const DarCoefficientParams& params) {
    gpu::DarCoefficientLaunchParams p;
    p.retrieved = retrieved.data;
    p.weight = stats(op, weight);
    p.bias = stats(op, bias);
    p.scale = stats(op, scale);
    p.alpha = stats(op, alpha);
    p.beta = stats(op, beta);
    p.transport = optional_stats(op, transport);
    p.z_rstd = stats(op, z_rstd);
    p.streams = retrieved.shape[0];
    p.tokens = retrieved.shape[1];
    p.d = retrieved.shape[2];
    p.outputs = weight.shape[1];
    p.eps = static_cast<float>(params.eps);
    p.sinkhorn_iterations = params.sinkhorn_iterations;
    p.type = elem(op, retrieved);
    return p;
  }

  static gpu::DarMixParams mix_params(const char* op, const TensorView& retrieved,
                                      const TensorView& alpha) {
    gpu::DarMixParams p;
    p.retrieved = retrieved.data;
    p.alpha = stats(op, alpha);
    p.streams = retrieved.shape[0];
    p.tokens = retrieved.shape[1];
    p.d = retrieved.shape[2];
    p.type = elem(op, retrieved);
    return p;
  }

  static gpu::DarWriteParams write_params(const char* op, const TensorView& transport,
                                          const TensorView& partial, const TensorView& beta,
                                          const TensorView& y, const TensorView& out) {
    gpu::DarWriteParams p;
    p.transport = optional_stats(op, transport);
    p.partial = partial.data;
    p.beta = optional_stats(op, beta);
    p.y = y.data;
    p.out = out.data;
    p.streams = out.shape[0];
    p.tokens = out.shape[1];
    p.d = out.shape[2];
    p.type = elem(op, out);
    return p;
  }

  int device_ = 0;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  void* gemm_workspace_ = nullptr;
  std::unique_ptr<gpu::LtGemm> gemm_;
  std::unique_ptr<gpu::CachingAllocator> allocator_;
  std::unique_ptr<gpu::CudnnAttention> attention_;
  gpu::DeviceArena arena_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend() {
  return std::make_unique<CudaBackend>(0);
}

CudaAllocatorStats cuda_allocator_stats(const Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  if (cuda == nullptr) {
    throw BackendError("cuda_allocator_stats: backend '" + backend.name() +
                       "' is not a CUDA backend");
  }
  return cuda->caching_allocator().stats();
}

void set_cuda_grid_limit_for_testing(int64_t max_blocks) {
  gpu::set_grid_stride_block_cap(max_blocks);
}

int64_t cuda_device_malloc_calls() {
  return gpu::cuda_malloc_calls();
}

CudaDeviceInfo cuda_device_info(int device) {
  const int count = device_count_or_throw();
  if (device < 0 || device >= count) {
    throw BackendError("no CUDA device: index " + std::to_string(device) + " requested, " +
                       std::to_string(count) + " present");
  }
  CudaDeviceInfo info;
  info.device_index = device;
  cudaDeviceProp properties{};
  MODAR_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
  info.name = properties.name;
  info.compute_capability_major = properties.major;
  info.compute_capability_minor = properties.minor;
  info.multiprocessors = properties.multiProcessorCount;
  info.memory_bus_width_bits = properties.memoryBusWidth;
  info.l2_cache_bytes = properties.l2CacheSize;
  info.memory_bytes = static_cast<int64_t>(properties.totalGlobalMem);
  info.shared_memory_per_block_optin_bytes =
      static_cast<int64_t>(properties.sharedMemPerBlockOptin);
  MODAR_CUDA_CHECK(cudaDeviceGetAttribute(&info.max_sm_clock_khz, cudaDevAttrClockRate, device));
  MODAR_CUDA_CHECK(
      cudaDeviceGetAttribute(&info.max_memory_clock_khz, cudaDevAttrMemoryClockRate, device));
  MODAR_CUDA_CHECK(cudaDriverGetVersion(&info.driver_version));
  MODAR_CUDA_CHECK(cudaRuntimeGetVersion(&info.runtime_version));
  info.cublas_version = static_cast<int>(cublasLtGetVersion());
  char bus_id[32] = {};
  if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device) == cudaSuccess) {
    info.pci_bus_id = bus_id;
  } else {
    cudaGetLastError();
  }
  return info;
}

std::map<std::string, std::string> cuda_provenance(int device) {
  const CudaDeviceInfo info = cuda_device_info(device);
  auto version = [](int v) {  // 12040 -> "12.4"
    return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
  };
  std::map<std::string, std::string> out;
  out["gpu_name"] = info.name;
  out["compute_capability"] = std::to_string(info.compute_capability_major) + "." +
                              std::to_string(info.compute_capability_minor);
  out["multiprocessors"] = std::to_string(info.multiprocessors);
  out["sm_clock_max_mhz"] = std::to_string(info.max_sm_clock_khz / 1000);
  out["memory_clock_max_mhz"] = std::to_string(info.max_memory_clock_khz / 1000);
  out["memory_bus_width_bits"] = std::to_string(info.memory_bus_width_bits);
  out["l2_cache_bytes"] = std::to_string(info.l2_cache_bytes);
  out["memory_bytes"] = std::to_string(info.memory_bytes);
  out["driver_version"] = version(info.driver_version);
  out["cuda_runtime_version"] = version(info.runtime_version);
  out["cublas_version"] = std::to_string(info.cublas_version / 10000) + "." +
                          std::to_string((info.cublas_version / 100) % 100) + "." +
                          std::to_string(info.cublas_version % 100);
  out["pci_bus_id"] = info.pci_bus_id;
  return out;
}

int64_t cuda_l2_cache_bytes(int device) {
  return cuda_device_info(device).l2_cache_bytes;
}

}  // namespace modar::runtime
