// runtime/cuda/cuda_backend.cpp: the CUDA implementation of the Backend
// interface (include/modar/runtime/backend.hpp).
//
// Backend::run has already checked shapes, dtypes and devices
// (runtime/core/op_checks.cpp) when a run_op here runs; this file maps an op's
// argument struct (op_args.hpp) onto the POD params of the kernel families (one *.cuh / *.cu
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
#include <type_traits>
#include <variant>
#include <vector>

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
#include "modar/base/errors.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/grouped_gemm_split.hpp"
#include "modar/runtime/host_facts.hpp"
#include "moe.cuh"
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
  cudaStream_t stream() const { return stream_; }
  int device_index() const { return device_; }
  DeviceKind device() const override { return DeviceKind::cuda; }
  DeviceFacts facts() const override { return cuda_device_facts(device_); }
  // Every op of the table in fp32 / bf16 storage (and i32 for copy / fill);
  // fp64 is the CPU backend's reference precision.
  bool supports(OpId, ScalarType dtype) const override { return dtype != ScalarType::fp64; }

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
  void execute(const OpArgs& call, const OpGeometry& geometry) override;

  // ---- the kernels of each op (one run_op per row of the op table) -----------------
  // ---- memory ops ----------------------------------------------------------------
  void run_op(const CopyArgs& call) {
    if (call.src.bytes() > 0) {
      MODAR_CUDA_CHECK(cudaMemcpyAsync(call.dst.data, call.src.data,
                                       static_cast<size_t>(call.src.bytes()),
                                       cudaMemcpyDeviceToDevice, stream_));
    }
  }

  void run_op(const FillArgs& call) {
    if (call.dst.dtype == ScalarType::i32) {
      gpu::launch_fill(call.dst.data, call.dst.numel(), call.value, Elem::fp32, true, stream_);
    } else {
      gpu::launch_fill(call.dst.data, call.dst.numel(), call.value, elem("fill", call.dst), false,
                       stream_);
    }
  }

  void run_op(const ConvertArgs& call) {
    gpu::launch_convert(call.src.data, elem("convert", call.src), call.dst.data,
                        elem("convert", call.dst), call.src.numel(), stream_);
  }

  // ---- GEMM --------------------------------------------------------------------------
  void run_op(const GemmArgs& call) {
    gpu::GemmArgs args;
    const bool batched = call.a.rank == 3 && call.b.rank == 3 && call.c.rank == 3;
    int64_t a_rows = 0, a_cols = 0, b_rows = 0, b_cols = 0;
    if (batched) {
      args.batch = call.a.shape[0];
      a_rows = call.a.shape[1], a_cols = call.a.shape[2], b_rows = call.b.shape[1],
      b_cols = call.b.shape[2];
      args.stride_a = a_rows * a_cols;
      args.stride_b = b_rows * b_cols;
      args.stride_c = call.c.shape[1] * call.c.shape[2];
    } else {
      a_rows = call.a.rows(), a_cols = call.a.dim(-1), b_rows = call.b.rows(),
      b_cols = call.b.dim(-1);
    }
    args.m = call.transpose_a ? a_cols : a_rows;
    args.k = call.transpose_a ? a_rows : a_cols;
    args.n = call.transpose_b ? b_rows : b_cols;
    args.transpose_a = call.transpose_a;
    args.transpose_b = call.transpose_b;
    args.lda = a_cols;
    args.ldb = b_cols;
    args.ldc = args.n;
    args.a = call.a.data;
    args.b = call.b.data;
    args.c = call.c.data;
    args.alpha = static_cast<float>(call.alpha);
    args.beta = static_cast<float>(call.beta);
    args.input_type =
        elem("gemm", call.a) == Elem::fp32 ? gpu::GemmType::fp32 : gpu::GemmType::bf16;
    args.output_type =
        elem("gemm", call.c) == Elem::fp32 ? gpu::GemmType::fp32 : gpu::GemmType::bf16;
    if (args.k == 0) {
      // An empty inner dimension: C = call.beta C (cuBLASLt rejects k = 0).
      if (call.beta == 0.0) {
        run_op(FillArgs{call.c, 0.0});
      } else if (call.beta != 1.0) {
        gpu::launch_scale(call.c.data, static_cast<float>(call.beta), call.c.numel(),
                          elem("gemm", call.c), stream_);
      }
      return;
    }
    gemm_->run(args, stream_);
  }

  // ---- RMSNorm -------------------------------------------------------------------------
  void run_op(const RmsnormForwardArgs& call) {
    gpu::RmsNormParams p;
    p.x = call.x.data;
    p.weight = call.weight.data;
    p.out = call.out.data;
    p.rstd = stats("rmsnorm_forward", call.rstd);
    p.rows = call.x.rows();
    p.d = call.x.dim(-1);
    p.eps = static_cast<float>(call.eps);
    p.type = elem("rmsnorm_forward", call.x);
    gpu::launch_rmsnorm_forward(p, stream_);
  }

  void run_op(const RmsnormBackwardArgs& call) {
    gpu::RmsNormBackwardParams p;
    p.dout = call.dout.data;
    p.x = call.x.data;
    p.weight = call.weight.data;
    p.rstd = stats("rmsnorm_backward", call.rstd);
    p.dx = call.dx.data;
    p.dweight = call.dweight.data;
    p.rows = call.x.rows();
    p.d = call.x.dim(-1);
    p.type = elem("rmsnorm_backward", call.x);
    if (!call.dweight.empty()) {
      p.dweight_type = elem("rmsnorm_backward", call.dweight);
      p.partial = scratch_floats({gpu::kReduceSplits * p.d})[0];
    }
    gpu::launch_rmsnorm_backward(p, stream_);
  }

  // ---- RoPE ------------------------------------------------------------------------------
  void run_op(const RopeForwardArgs& call) {
    launch_rope("rope_forward", call.x, call.positions, call.out, call.params, false);
  }

  void run_op(const RopeBackwardArgs& call) {
    launch_rope("rope_backward", call.dout, call.positions, call.dx, call.params, true);
  }

  // ---- attention ----------------------------------------------------------------------
  void run_op(const AttentionForwardArgs& call) {
    gpu::AttentionLaunchParams p =
        attention_params("attention_forward", call.q, call.k, call.v, call.valid_lengths, call.out,
                         call.lse, call.params);
    if (!attention_->forward(p, stream_)) {  // cuDNN SDPA where supported
      gpu::launch_attention_forward(p, stream_);
    }
  }

  void run_op(const AttentionBackwardArgs& call) {
    gpu::AttentionLaunchParams p =
        attention_params("attention_backward", call.q, call.k, call.v, call.valid_lengths, call.out,
                         call.lse, call.params);
    p.dout = call.dout.data;
    p.dq = call.dq.data;
    p.dk = call.dk.data;
    p.dv = call.dv.data;
    p.delta = scratch_floats({p.batch * p.heads * p.seq})[0];
    if (!attention_->backward(p, stream_)) {
      gpu::launch_attention_backward(p, stream_);
    }
  }

  // ---- MoD router, top-k, gather, scatter -----------------------------------------------
  void run_op(const RouterForwardArgs& call) {
    gpu::launch_router_forward(call.x.data, call.w.data, stats("router_forward", call.logits),
                               call.x.rows(), call.x.dim(-1), elem("router_forward", call.x),
                               stream_);
  }

  void run_op(const RouterBackwardArgs& call) {
    const int64_t d = call.x.dim(-1);
    float* partial = call.dw.empty() ? nullptr : scratch_floats({gpu::kReduceSplits * d})[0];
    gpu::launch_router_backward(
        stats("router_backward", call.dlogits), call.x.data, call.w.data, call.dx.data,
        call.dw.data, call.dw.empty() ? Elem::fp32 : elem("router_backward", call.dw), partial,
        call.x.rows(), d, elem("router_backward", call.x), stream_);
  }

  // topk and topk_ragged (counts: the ragged rows' valid lengths, or empty).
  void run_topk(const char* op, const TensorView& logits, const TensorView& counts,
                const TensorView& indices) {
    gpu::TopkParams p;
    p.logits = stats(op, logits);
    if (!counts.empty())
      p.counts = counts.ptr<int32_t>();
    p.indices = indices.ptr<int32_t>();
    p.batch = logits.shape[0];
    p.seq_len = logits.shape[1];
    p.k_max = indices.shape[1];
    gpu::launch_topk(p, stream_);
  }
  void run_op(const TopkArgs& call) { run_topk("topk", call.logits, TensorView{}, call.indices); }
  void run_op(const TopkRaggedArgs& call) {
    run_topk("topk_ragged", call.logits, call.counts, call.indices);
  }

  void run_op(const TopkMaskArgs& call) {
    gpu::launch_topk_mask(call.indices.ptr<int32_t>(), call.mask.data, call.indices.shape[0],
                          call.mask.shape[1], call.indices.shape[1], elem("topk_mask", call.mask),
                          stream_);
  }

  void run_op(const GatherRowsForwardArgs& call) {
    gpu::launch_gather_rows_forward(routed("gather_rows_forward", call.x, call.indices),
                                    call.x.data, call.out.data, stream_);
  }

  void run_op(const GatherRowsBackwardArgs& call) {
    gpu::launch_gather_rows_backward(routed("gather_rows_backward", call.dx, call.indices),
                                     call.dout.data, call.dx.data, stream_);
  }

  void run_op(const ScatterAddScaledForwardArgs& call) {
    gpu::launch_scatter_add_scaled_forward(
        routed("scatter_add_scaled_forward", call.x, call.indices), call.x.data,
        stats("scatter_add_scaled_forward", call.router_logits), call.delta.data,
        gate_kind(call.gate), stream_);
  }

  void run_op(const ScatterAddScaledBackwardArgs& call) {
    gpu::launch_scatter_add_scaled_backward(
        routed("scatter_add_scaled_backward", call.dx, call.indices), call.dx.data,
        stats("scatter_add_scaled_backward", call.router_logits), call.delta.data,
        gate_kind(call.gate), call.ddelta.data,
        optional_stats("scatter_add_scaled_backward", call.drouter_logits), stream_);
  }

  // ---- depth reads ------------------------------------------------------------------------
  void run_op(const DepthReadPrefixForwardArgs& call) {
    gpu::launch_depth_read_prefix_forward(prefix_params("depth_read_prefix_forward", call),
                                          stream_);
  }

  void run_op(const DepthReadPrefixBackwardArgs& call) {
    const char* op = "depth_read_prefix_backward";
    gpu::DepthReadPrefixParams p = prefix_params(op, call);
    p.dout = call.dout.data;
    p.dlse = optional_stats(op, call.dlse);
    p.dkeys = call.dkeys.data;
    p.dvalues = call.dvalues.data;
    p.dqueries = optional_stats(op, call.dqueries);
    if (p.dqueries != nullptr) {
      p.partial = scratch_floats({int64_t{gpu::kDepthReadBlocks} * p.queries_count * p.d})[0];
    }
    gpu::launch_depth_read_prefix_backward(p, stream_);
  }

  void run_op(const DepthReadMergeForwardArgs& call) {
    const char* op = "depth_read_merge_forward";
    gpu::DepthReadMergeParams p = merge_params(op, call);
    p.prefix_lse = stats(op, call.prefix_lse);
    p.out = call.out.data;
    gpu::launch_depth_read_merge_forward(p, stream_);
  }

  void run_op(const DepthReadMergeBackwardArgs& call) {
    const char* op = "depth_read_merge_backward";
    gpu::DepthReadMergeParams p = merge_params(op, call);
    p.dout = call.dout.data;
    p.dprefix_out = call.dprefix_out.data;
    p.dprefix_lse = optional_stats(op, call.dprefix_lse);
    p.dpartial_keys = call.dpartial_keys.data;
    p.dpartial_values = call.dpartial_values.data;
    p.dquery = optional_stats(op, call.dquery);
    if (p.dquery != nullptr) {
      p.partial = scratch_floats({int64_t{gpu::kDepthReadBlocks} * p.d})[0];
    }
    gpu::launch_depth_read_merge_backward(p, stream_);
  }

  // ---- DAR -----------------------------------------------------------------------------------
  void run_op(const DarCoefficientsForwardArgs& call) {
    gpu::DarCoefficientLaunchParams p = coefficient_params(
        "dar_coefficients_forward", call.retrieved, call.weight, call.bias, call.scale, call.alpha,
        call.beta, call.transport, call.z_rstd, call.params);
    gpu::launch_dar_coefficients_forward(p, stream_);
  }

  void run_op(const DarCoefficientsBackwardArgs& call) {
    const char* op = "dar_coefficients_backward";
    gpu::DarCoefficientLaunchParams p =
        coefficient_params(op, call.retrieved, call.weight, call.bias, call.scale, call.alpha,
                           call.beta, call.transport, call.z_rstd, call.params);
    p.dalpha = optional_stats(op, call.dalpha);
    p.dbeta = optional_stats(op, call.dbeta);
    p.dtransport = optional_stats(op, call.dtransport);
    p.dretrieved = call.dretrieved.data;
    p.dweight = optional_stats(op, call.dweight);
    p.dbias = optional_stats(op, call.dbias);
    p.dscale = optional_stats(op, call.dscale);
    const auto buffers = scratch_floats(
        {p.tokens * p.outputs, p.tokens * 3,
         p.dweight != nullptr ? int64_t{gpu::kReduceSplits} * p.streams * p.d * p.outputs : 0});
    p.token_dc = buffers[0];
    p.token_dscale = buffers[1];
    p.partial = buffers[2];
    gpu::launch_dar_coefficients_backward(p, stream_);
  }

  void run_op(const DarMixForwardArgs& call) {
    gpu::DarMixParams p = mix_params("dar_mix_forward", call.retrieved, call.alpha);
    p.out = call.out.data;
    gpu::launch_dar_mix_forward(p, stream_);
  }

  void run_op(const DarMixBackwardArgs& call) {
    gpu::DarMixParams p = mix_params("dar_mix_backward", call.retrieved, call.alpha);
    p.dout = call.dout.data;
    p.dretrieved = call.dretrieved.data;
    p.dalpha = optional_stats("dar_mix_backward", call.dalpha);
    gpu::launch_dar_mix_backward(p, stream_);
  }

  void run_op(const DarWriteForwardArgs& call) {
    gpu::DarWriteParams p = write_params("dar_write_forward", call.transport, call.partial,
                                         call.beta, call.y, call.out);
    gpu::launch_dar_write_forward(p, stream_);
  }

  void run_op(const DarWriteBackwardArgs& call) {
    const char* op = "dar_write_backward";
    gpu::DarWriteParams p =
        write_params(op, call.transport, call.partial, call.beta, call.y, call.dout);
    p.out = nullptr;
    p.dout = call.dout.data;
    p.dtransport = optional_stats(op, call.dtransport);
    p.dpartial = call.dpartial.data;
    p.dbeta = optional_stats(op, call.dbeta);
    p.dy = call.dy.data;
    gpu::launch_dar_write_backward(p, stream_);
  }

  // ---- elementwise ---------------------------------------------------------------------------
  void run_op(const GeluForwardArgs& call) {
    activation(gpu::UnaryOp::gelu_forward, "gelu_forward", call.x, {}, {}, call.out, {});
  }

  void run_op(const GeluBackwardArgs& call) {
    if (call.dx.empty())
      return;
    activation(gpu::UnaryOp::gelu_backward, "gelu_backward", call.x, {}, call.dout, call.dx, {});
  }

  void run_op(const SwigluForwardArgs& call) {
    activation(gpu::UnaryOp::swiglu_forward, "swiglu_forward", call.gate, call.up, {}, call.out,
               {});
  }

  void run_op(const SwigluBackwardArgs& call) {
    if (call.dgate.empty() && call.dup.empty())
      return;
    activation(gpu::UnaryOp::swiglu_backward, "swiglu_backward", call.gate, call.up, call.dout,
               call.dgate, call.dup);
  }

  void run_op(const AddArgs& call) {
    gpu::launch_add(call.a.data, call.b.data, call.out.data, call.a.numel(), elem("add", call.a),
                    stream_);
  }

  void run_op(const AxpyArgs& call) {
    gpu::launch_axpy(static_cast<float>(call.alpha), call.x.data, elem("axpy", call.x), call.y.data,
                     elem("axpy", call.y), call.x.numel(), stream_);
  }

  void run_op(const ScaleArgs& call) {
    gpu::launch_scale(call.x.data, static_cast<float>(call.alpha), call.x.numel(),
                      elem("scale", call.x), stream_);
  }

  void run_op(const MulForwardArgs& call) {
    gpu::launch_mul_forward(call.a.data, call.b.data, call.out.data, call.a.numel(),
                            elem("mul_forward", call.a), stream_);
  }

  void run_op(const MulBackwardArgs& call) {
    gpu::launch_mul_backward(call.dout.data, call.a.data, call.b.data, call.da.data, call.db.data,
                             call.a.numel(), elem("mul_backward", call.a), stream_);
  }

  // ---- losses, embedding, optimizer -----------------------------------------------------------
  void run_op(const CrossEntropyForwardArgs& call) {
    const char* op = "cross_entropy_forward";
    gpu::CrossEntropyParams p;
    p.logits = call.logits.data;
    p.targets = call.targets.ptr<int32_t>();
    p.loss = optional_stats(op, call.loss);
    p.lse = stats(op, call.lse);
    p.rows = call.logits.rows();
    p.vocab = call.logits.dim(-1);
    p.type = elem(op, call.logits);
    p.row_scratch = scratch_floats({p.rows})[0];
    gpu::launch_cross_entropy_forward(p, stream_);
  }

  void run_op(const CrossEntropyBackwardArgs& call) {
    const char* op = "cross_entropy_backward";
    if (call.dlogits.empty())
      return;
    gpu::CrossEntropyParams p;
    p.logits = call.logits.data;
    p.targets = call.targets.ptr<int32_t>();
    p.lse = stats(op, call.lse);
    p.dlogits = call.dlogits.data;
    p.dloss = static_cast<float>(call.dloss);
    p.rows = call.logits.rows();
    p.vocab = call.logits.dim(-1);
    p.type = elem(op, call.logits);
    p.count_scratch = scratch_floats({1})[0];
    gpu::launch_cross_entropy_backward(p, stream_);
  }

  void run_op(const BceWithLogitsForwardArgs& call) {
    const char* op = "bce_with_logits_forward";
    if (call.loss.empty() || call.logits.numel() == 0)
      return;
    gpu::launch_bce_with_logits_forward(stats(op, call.logits), stats(op, call.targets),
                                        stats(op, call.loss), call.logits.numel(), stream_);
  }

  void run_op(const BceWithLogitsBackwardArgs& call) {
    const char* op = "bce_with_logits_backward";
    if (call.dlogits.empty() || call.logits.numel() == 0)
      return;
    gpu::launch_bce_with_logits_backward(static_cast<float>(call.dloss), stats(op, call.logits),
                                         stats(op, call.targets), stats(op, call.dlogits),
                                         call.logits.numel(), stream_);
  }

  void run_op(const EmbeddingForwardArgs& call) {
    gpu::launch_embedding_forward(call.table.data, elem("embedding_forward", call.table),
                                  call.tokens.ptr<int32_t>(), call.out.data,
                                  elem("embedding_forward", call.out), call.tokens.numel(),
                                  call.table.shape[1], call.table.shape[0], stream_);
  }

  void run_op(const EmbeddingBackwardArgs& call) {
    const char* op = "embedding_backward";
    if (call.dtable.empty()) {
      return;
    }
    // Deterministic: rows sorted by token, runs summed in order, rounded once
    // (embedding_sorted.cuh); no atomics.
    gpu::launch_embedding_backward_sorted(
        call.dout.data, elem(op, call.dout), call.tokens.ptr<int32_t>(), call.dtable.data,
        elem(op, call.dtable), call.tokens.numel(), call.dtable.shape[1], call.dtable.shape[0],
        *allocator_, stream_);
  }

  void run_op(const AdamwUpdateArgs& call) {
    const char* op = "adamw_update";
    gpu::AdamWLaunchParams p;
    p.params = stats(op, call.params);
    p.grads = call.grads.data;
    p.m = stats(op, call.m);
    p.v = stats(op, call.v);
    p.params_lowp = call.params_lowp.data;
    p.count = call.params.numel();
    p.learning_rate = static_cast<float>(call.hyper.learning_rate);
    p.beta1 = static_cast<float>(call.hyper.beta1);
    p.beta2 = static_cast<float>(call.hyper.beta2);
    p.epsilon = static_cast<float>(call.hyper.epsilon);
    p.weight_decay = static_cast<float>(call.hyper.weight_decay);
    const double step = static_cast<double>(call.hyper.step);
    p.bias_correction1 = static_cast<float>(1.0 - std::pow(call.hyper.beta1, step));
    p.bias_correction2 = static_cast<float>(1.0 - std::pow(call.hyper.beta2, step));
    p.grad_scale = static_cast<float>(call.hyper.grad_scale);
    p.grad_type = elem(op, call.grads);
    p.lowp_type = call.params_lowp.empty() ? Elem::fp32 : elem(op, call.params_lowp);
    gpu::launch_adamw(p, stream_);
  }

  // ---- Mixture of Experts (moe.cu; the grouped GEMM is one GEMM per expert) ---------
  static gpu::MoeRouteParams moe_route(const TensorView& logits, const TensorView& indices) {
    gpu::MoeRouteParams p;
    p.tokens = logits.dim(0);
    p.experts = logits.dim(1);
    p.k = indices.dim(1);
    return p;
  }

  void run_op(const MoeRouteForwardArgs& call) {
    gpu::MoeRouteParams p = moe_route(call.logits, call.indices);
    p.renormalize = call.params.renormalize;
    gpu::launch_moe_route_forward(
        p, stats("moe_route_forward", call.logits), stats("moe_route_forward", call.probs),
        call.indices.ptr<int32_t>(), stats("moe_route_forward", call.gates), stream_);
  }

  void run_op(const MoeRouteBackwardArgs& call) {
    gpu::MoeRouteParams p = moe_route(call.probs, call.indices);
    p.renormalize = call.params.renormalize;
    gpu::launch_moe_route_backward(
        p, stats("moe_route_backward", call.dgates), stats("moe_route_backward", call.probs),
        call.indices.ptr<int32_t>(), stats("moe_route_backward", call.gates),
        stats("moe_route_backward", call.dlogits), stream_);
  }

  void run_op(const MoeAuxLossForwardArgs& call) {
    gpu::launch_moe_aux_loss_forward(
        moe_route(call.logits, call.indices), stats("moe_aux_loss_forward", call.logits),
        stats("moe_aux_loss_forward", call.probs), call.indices.ptr<int32_t>(),
        stats("moe_aux_loss_forward", call.loss), stream_);
  }

  void run_op(const MoeAuxLossBackwardArgs& call) {
    const gpu::MoeRouteParams p = moe_route(call.logits, call.indices);
    gpu::launch_moe_aux_loss_backward(
        p, call.daux, call.dz, stats("moe_aux_loss_backward", call.logits),
        stats("moe_aux_loss_backward", call.probs), call.indices.ptr<int32_t>(),
        stats("moe_aux_loss_backward", call.dlogits), scratch_floats({p.experts})[0], stream_);
  }

  void run_op(const MoeDispatchArgs& call) {
    const int64_t experts = call.counts.dim(0);
    // The cursor is int32 scratch (a float buffer of the same size).
    int32_t* cursor = reinterpret_cast<int32_t*>(scratch_floats({experts})[0]);
    gpu::launch_moe_dispatch(call.indices.dim(0), call.indices.dim(1), experts, call.capacity,
                             call.indices.ptr<int32_t>(), call.counts.ptr<int32_t>(),
                             call.slots.ptr<int32_t>(), cursor, stream_);
  }

  static gpu::MoeRowsParams moe_rows(const char* op, const TensorView& x, const TensorView& slots,
                                     const TensorView& rows) {
    gpu::MoeRowsParams p;
    p.tokens = x.rows();
    p.k = slots.dim(1);
    p.d = x.dim(-1);
    p.rows = rows.dim(0);
    p.slots = slots.ptr<int32_t>();
    p.type = elem(op, x);
    return p;
  }

  void run_op(const MoePermuteForwardArgs& call) {
    gpu::launch_moe_permute_forward(moe_rows("moe_permute_forward", call.x, call.slots, call.out),
                                    call.x.data, call.out.data, stream_);
  }

  void run_op(const MoePermuteBackwardArgs& call) {
    gpu::launch_moe_permute_backward(
        moe_rows("moe_permute_backward", call.dx, call.slots, call.dout), call.dout.data,
        call.dx.data, stream_);
  }

  void run_op(const MoeUnpermuteForwardArgs& call) {
    gpu::launch_moe_unpermute_forward(
        moe_rows("moe_unpermute_forward", call.out, call.slots, call.y), call.y.data,
        stats("moe_unpermute_forward", call.gates), call.out.data, stream_);
  }

  void run_op(const MoeUnpermuteBackwardArgs& call) {
    gpu::launch_moe_unpermute_backward(
        moe_rows("moe_unpermute_backward", call.dout, call.slots, call.y), call.dout.data,
        call.y.data, stats("moe_unpermute_backward", call.gates),
        call.dy.empty() ? nullptr : call.dy.data,
        optional_stats("moe_unpermute_backward", call.dgates), stream_);
  }

  // The expert row counts come to the host (one stream sync per call) to size
  // the per-expert GEMMs.
  void run_op(const GroupedGemmArgs& call) {
    const int64_t experts = call.counts.dim(0), rows = call.a.dim(0);
    std::vector<int32_t> counts(static_cast<size_t>(experts));
    MODAR_CUDA_CHECK(cudaMemcpyAsync(counts.data(), call.counts.data,
                                     counts.size() * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                     stream_));
    MODAR_CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (int64_t e = 0; e < experts; ++e) {
      if (counts[static_cast<size_t>(e)] < 0 || counts[static_cast<size_t>(e)] > rows) {
        throw ShapeError("grouped_gemm: counts[" + std::to_string(e) +
                         "] = " + std::to_string(counts[static_cast<size_t>(e)]) +
                         " out of range [0, " + std::to_string(rows + 1) + ")");
      }
    }
    detail::split_grouped_gemm(
        call, counts.data(), [this](const GemmArgs& g) { run_op(g); },
        [this](const FillArgs& f) { run_op(f); }, [this](const ScaleArgs& s) { run_op(s); });
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

  // One gelu / swiglu launch: `a` gives the element count and the storage
  // type; an operand the op does not take is an empty view.
  void activation(gpu::UnaryOp op, const char* name, const TensorView& a, const TensorView& b,
                  const TensorView& dout, const TensorView& out, const TensorView& out2) {
    const gpu::ActivationParams p{op,       a.data,    b.data,    dout.data,
                                  out.data, out2.data, a.numel(), elem(name, a)};
    gpu::launch_activation(p, stream_);
  }

  // The fields a depth read's forward and backward share (their args name them alike).
  template <typename Args>
  static gpu::DepthReadPrefixParams prefix_params(const char* op, const Args& call) {
    gpu::DepthReadPrefixParams p;
    p.keys = call.keys.data;
    p.key_rstd = stats(op, call.key_rstd);
    p.values = call.values.data;
    p.queries = stats(op, call.queries);
    p.out = call.out.data;
    p.lse = stats(op, call.lse);
    p.sources = call.keys.shape[0];
    p.tokens = call.keys.shape[1];
    p.d = call.keys.shape[2];
    p.queries_count = call.queries.shape[0];
    p.type = elem(op, call.keys);
    return p;
  }

  template <typename Args>
  static gpu::DepthReadMergeParams merge_params(const char* op, const Args& call) {
    gpu::DepthReadMergeParams p;
    p.prefix_out = call.prefix_out.data;
    p.partial_keys = call.partial_keys.data;
    p.partial_key_rstd = stats(op, call.partial_key_rstd);
    p.partial_values = call.partial_values.data;
    p.query = stats(op, call.query);
    p.partial_weight = stats(op, call.partial_weight);
    p.tokens = call.prefix_out.shape[0];
    p.d = call.prefix_out.shape[1];
    p.type = elem(op, call.prefix_out);
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

MODAR_BACKEND_EXECUTE(CudaBackend)

}  // namespace

std::unique_ptr<Backend> make_cuda_backend() {
  // Under mpirun each rank of a node takes its own GPU (comm.hpp): the
  // node-local rank modulo the devices present; device 0 when not launched.
  const int local_rank = launcher_local_rank();
  return std::make_unique<CudaBackend>(local_rank == 0 ? 0 : local_rank % device_count_or_throw());
}

void* cuda_backend_stream(const Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  if (cuda == nullptr) {
    throw BackendError("cuda_backend_stream: backend '" + backend.name() +
                       "' is not a CUDA backend");
  }
  return cuda->stream();
}

int cuda_backend_device(const Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  if (cuda == nullptr) {
    throw BackendError("cuda_backend_device: backend '" + backend.name() +
                       "' is not a CUDA backend");
  }
  return cuda->device_index();
}

DeviceFacts cuda_device_facts(int device) {
  const CudaDeviceInfo info = cuda_device_info(device);
  DeviceFacts facts;
  facts.description = info.name;
  facts.device_index = device;
  facts.cache_bytes = info.l2_cache_bytes;
  facts.memory_bytes = info.memory_bytes;
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    facts.memory_free_bytes = static_cast<int64_t>(free_bytes);
  } else {
    cudaGetLastError();
  }
  facts.provenance = cuda_provenance(device);
  return facts;
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
