// RMSNorm (weighted / unweighted / statistics only) and RoPE at gathered
// positions, forward and backward, CUDA vs CPU (FlashAttention rule).
#include "cuda_test_util.hpp"

namespace modar::runtime::cuda_testing {
namespace {

TEST(CudaRmsNorm, ForwardBackwardMatchCpu) {
  MODAR_REQUIRE_CUDA();
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    for (const int64_t d : {int64_t{64}, int64_t{300}, int64_t{1024}}) {
      const int64_t rows = 37;
      const auto x = random_values(rows * d, 1 + d, -2.0, 2.0);
      const auto w = random_values(d, 2 + d, 0.5, 1.5);
      const std::string label = "rmsnorm d=" + std::to_string(d);
      // weighted, with out
      expect_matches_cpu(label + " weighted", p,
                         {data("x", {rows, d}, x), data("w", {d}, w), out_data("out", {rows, d}),
                          out_stat("rstd", {rows})},
                         [](Backend& be, const std::vector<TensorView>& v) {
                           be.rmsnorm_forward(v[0], v[1], v[2], v[3], 1e-6);
                         });
      // statistics only (depth-read key rstd), unweighted
      expect_matches_cpu(label + " rstd only", p,
                         {data("x", {rows, d}, x), out_stat("rstd", {rows})},
                         [](Backend& be, const std::vector<TensorView>& v) {
                           be.rmsnorm_forward(v[0], TensorView{}, TensorView{}, v[1], 1e-5);
                         });
      // backward: dx (+=) and dweight (+=, in the weight dtype and in fp32)
      const auto dout = random_values(rows * d, 3 + d);
      for (const bool fp32_dweight : {false, true}) {
        std::vector<Arg> args = {data("dout", {rows, d}, dout),
                                 data("x", {rows, d}, x),
                                 data("w", {d}, w),
                                 stat("rstd", {rows}, {}),
                                 grad_data("dx", {rows, d}, random_values(rows * d, 4)),
                                 fp32_dweight ? grad_stat("dw", {d}, random_values(d, 5))
                                              : grad_data("dw", {d}, random_values(d, 5))};
        // rstd must be the forward's: compute it in fp64 on the host.
        std::vector<double> rstd(static_cast<size_t>(rows));
        for (int64_t r = 0; r < rows; ++r) {
          double sum = 0.0;
          for (int64_t c = 0; c < d; ++c) {
            const double xv = round_to(x[static_cast<size_t>(r * d + c)],
                                       p == Precision::fp32 ? ScalarType::fp32 : ScalarType::bf16);
            sum += xv * xv;
          }
          rstd[static_cast<size_t>(r)] = 1.0 / std::sqrt(sum / static_cast<double>(d) + 1e-6);
        }
        args[3].values = rstd;
        expect_matches_cpu(label + " backward", p, args,
                           [](Backend& be, const std::vector<TensorView>& v) {
                             be.rmsnorm_backward(v[0], v[1], v[2], v[3], v[4], v[5]);
                           });
      }
    }
  }
}

TEST(CudaRope, ForwardBackwardAtGatheredPositions) {
  MODAR_REQUIRE_CUDA();
  const int64_t b = 2, s = 9, heads = 3;
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    // d_head 8 / 64 / 128: 4-pair vector path; 6 and 20: the one-pair path.
    for (const int64_t d_head : {int64_t{6}, int64_t{8}, int64_t{20}, int64_t{64}, int64_t{128}}) {
      const int64_t count = b * s * heads * d_head;
      // Positions of routed tokens: sparse, up to 20000 (large angles, the
      // kernel's 256 x 256 tables), and every 6th beyond 65536 (its fp64 path).
      std::vector<double> positions;
      for (int64_t i = 0; i < b * s; ++i)
        positions.push_back(i % 6 == 5 ? static_cast<double>(65536 + i * 977)
                                       : static_cast<double>(i * 2213 % 20011));
      RopeParams params;
      params.theta_base = 10000.0;
      expect_matches_cpu("rope forward d_head=" + std::to_string(d_head), p,
                         {data("x", {b, s, heads, d_head}, random_values(count, 7)),
                          index("pos", {b, s}, positions), out_data("out", {b, s, heads, d_head})},
                         [&](Backend& be, const std::vector<TensorView>& v) {
                           be.rope_forward(v[0], v[1], v[2], params);
                         });
      expect_matches_cpu("rope backward d_head=" + std::to_string(d_head), p,
                         {data("dout", {b, s, heads, d_head}, random_values(count, 8)),
                          index("pos", {b, s}, positions),
                          grad_data("dx", {b, s, heads, d_head}, random_values(count, 9))},
                         [&](Backend& be, const std::vector<TensorView>& v) {
                           be.rope_backward(v[0], v[1], v[2], params);
                         });
    }
  }
}

}  // namespace
}  // namespace modar::runtime::cuda_testing
