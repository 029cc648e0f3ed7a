// CUDA backend basics: the no-device error, device information, memory ops,
// and cuBLASLt GEMMs (fp32, bf16 -> bf16, bf16 -> fp32, transposes, batched,
// beta != 0) against the CPU backend with the FlashAttention rule.
#include "cuda_test_util.hpp"
#include "modar/runtime/cuda_backend.hpp"

namespace modar::runtime::cuda_testing {
namespace {

TEST(CudaBackend, NoDeviceGivesOneTypedLine) {
  // Covers machines WITHOUT a GPU: make_cuda_backend() and make_backend("cuda")
  // both throw BackendError whose message starts with "no CUDA device:" and is
  // one line.
  std::string message;
  try {
    make_cuda_backend();
  } catch (const BackendError& error) {
    message = error.what();
  }
  if (message.empty()) {
    GTEST_SKIP() << "a CUDA device is present; this test covers machines without one";
  }
  EXPECT_EQ(message.rfind("no CUDA device:", 0), 0u) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  try {
    make_backend("cuda");
    ADD_FAILURE() << "make_backend(\"cuda\") should throw without a device";
  } catch (const BackendError& error) {
    EXPECT_EQ(std::string(error.what()).rfind("no CUDA device:", 0), 0u) << error.what();
  }
  EXPECT_THROW(cuda_device_info(0), BackendError);
}

TEST(CudaBackend, DeviceInfoIsFilled) {
  MODAR_REQUIRE_REAL_CUDA();
  const CudaDeviceInfo info = cuda_device_info(0);
  EXPECT_FALSE(info.name.empty());
  EXPECT_GE(info.compute_capability_major, 8);
  EXPECT_GT(info.multiprocessors, 0);
  EXPECT_GT(info.l2_cache_bytes, 0);
  EXPECT_GT(info.memory_bytes, int64_t{1} << 30);
  EXPECT_GT(info.driver_version, 0);
  EXPECT_GT(info.cublas_version, 0);
  const auto provenance = cuda_provenance(0);
  EXPECT_EQ(provenance.at("gpu_name"), info.name);
  EXPECT_EQ(gpu().device(), DeviceKind::cuda);
  EXPECT_NE(gpu().name().find(info.name), std::string::npos);
  EXPECT_THROW(cuda_device_info(1 << 20), BackendError);
}

TEST(CudaBackend, CopyFillConvertRoundTrip) {
  MODAR_REQUIRE_CUDA();
  const auto values = random_values(1000, 11, -3.0, 3.0);
  Tensor a = make_tensor(gpu(), {10, 100}, ScalarType::fp32, values);
  Tensor b = make_tensor(gpu(), {10, 100}, ScalarType::fp32);
  gpu().copy(a, b);
  const auto copied = download(gpu(), b);
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(copied[i], static_cast<double>(static_cast<float>(values[i])));
  }
  // fp32 -> bf16 is round-to-nearest-even, as the CPU's float_to_bf16.
  Tensor half = make_tensor(gpu(), {1000}, ScalarType::bf16);
  gpu().convert(a, half);
  const auto rounded = download(gpu(), half);
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(rounded[i], bf16_to_float(float_to_bf16(static_cast<float>(values[i]))));
  }
  Tensor ints = make_tensor(gpu(), {7}, ScalarType::i32);
  gpu().fill(ints, -3.0);
  for (const double v : download(gpu(), ints))
    EXPECT_EQ(v, -3.0);
  gpu().fill(half, 0.5);
  for (const double v : download(gpu(), half))
    ASSERT_EQ(v, 0.5);
}

TEST(CudaBackend, TimerMeasuresDeviceWork) {
  MODAR_REQUIRE_REAL_CUDA();
  Tensor a = make_tensor(gpu(), {512, 512}, ScalarType::fp32, random_values(512 * 512, 3));
  Tensor c = make_tensor(gpu(), {512, 512}, ScalarType::fp32);
  auto timer = gpu().make_timer();
  timer->start();
  for (int i = 0; i < 5; ++i)
    gpu().gemm(a, false, a, false, c);
  timer->stop();
  const double seconds = timer->elapsed_s();
  EXPECT_GT(seconds, 0.0);
  EXPECT_LT(seconds, 10.0);
}

struct GemmCase {
  int64_t m, n, k;
  bool ta, tb;
  int64_t batch;
  double alpha, beta;
};

void run_gemm(const GemmCase& g, Precision precision, bool fp32_output, uint64_t seed) {
  const std::vector<int64_t> a_shape =
      g.batch > 1 ? std::vector<int64_t>{g.batch, g.ta ? g.k : g.m, g.ta ? g.m : g.k}
                  : std::vector<int64_t>{g.ta ? g.k : g.m, g.ta ? g.m : g.k};
  const std::vector<int64_t> b_shape =
      g.batch > 1 ? std::vector<int64_t>{g.batch, g.tb ? g.n : g.k, g.tb ? g.k : g.n}
                  : std::vector<int64_t>{g.tb ? g.n : g.k, g.tb ? g.k : g.n};
  const std::vector<int64_t> c_shape =
      g.batch > 1 ? std::vector<int64_t>{g.batch, g.m, g.n} : std::vector<int64_t>{g.m, g.n};
  std::vector<Arg> args = {data("a", a_shape, random_values(count_of(a_shape), seed)),
                           data("b", b_shape, random_values(count_of(b_shape), seed + 1))};
  // C accumulates when beta != 0: give it values (as a "grad" role).
  if (fp32_output) {
    args.push_back(grad_stat("c", c_shape, random_values(count_of(c_shape), seed + 2)));
  } else {
    args.push_back(grad_data("c", c_shape, random_values(count_of(c_shape), seed + 2)));
  }
  const std::string label = "gemm m=" + std::to_string(g.m) + " n=" + std::to_string(g.n) +
                            " k=" + std::to_string(g.k) + (g.ta ? " A^T" : "") +
                            (g.tb ? " B^T" : "") + " batch=" + std::to_string(g.batch);
  expect_matches_cpu(label, precision, args, [&](Backend& be, const std::vector<TensorView>& v) {
    be.gemm(v[0], g.ta, v[1], g.tb, v[2], g.alpha, g.beta);
  });
}

TEST(CudaGemm, MatchesCpuFp32AndBf16) {
  MODAR_REQUIRE_CUDA();
  const GemmCase cases[] = {
      {64, 48, 32, false, false, 1, 1.0, 0.0},   {33, 17, 65, true, false, 1, 0.5, 0.0},
      {40, 24, 56, false, true, 1, 1.0, 1.0},    {37, 29, 41, true, true, 1, -1.5, 0.25},
      {16, 24, 40, false, false, 3, 1.0, 0.0},   {8, 12, 20, true, true, 4, 2.0, 1.0},
      {256, 128, 512, false, true, 1, 1.0, 0.0},
  };
  uint64_t seed = 100;
  for (const GemmCase& g : cases) {
    run_gemm(g, Precision::fp32, false, seed);
    run_gemm(g, Precision::bf16, false, seed + 10);
    run_gemm(g, Precision::bf16, true, seed + 20);  // bf16 in, fp32 out (weight gradients)
    seed += 100;
  }
}

}  // namespace
}  // namespace modar::runtime::cuda_testing
