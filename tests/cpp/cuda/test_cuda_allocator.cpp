// The caching device allocator (runtime/cuda/caching_allocator.hpp) and the
// grid-stride launch cap (launch.hpp):
//   * size classes, from their definition (runs without a GPU);
//   * a freed block is reused by the next request of its class, with no new
//     cudaMalloc (GPU);
//   * every grid-stride kernel capped at 3 blocks still covers every element
//     (the striding path), against the CPU (GPU).
#include <set>

#include "caching_allocator.hpp"
#include "cuda_test_util.hpp"
#include "modar/runtime/cuda_backend.hpp"

namespace modar::runtime::cuda_testing {
namespace {

using gpu::CachingAllocator;

TEST(CudaAllocatorSizeClasses, FollowTheirDefinition) {
  // Requests: every small size around the granule edges, then powers of two
  // and their neighbours up to 64 GiB, and a pseudo-random spread.
  std::vector<size_t> requests = {0, 1, 511, 512, 513, 1023, 1024, 4097};
  for (size_t power = 1024; power <= (size_t{1} << 36); power *= 2) {
    for (const size_t delta : {size_t{0}, size_t{1}}) {
      requests.push_back(power - delta);
      requests.push_back(power + delta);
      requests.push_back(power + power / 4 + delta);
      requests.push_back(power + power / 2 - delta);
    }
  }
  uint64_t x = 12345;
  for (int i = 0; i < 2000; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    requests.push_back(static_cast<size_t>(x >> 30));  // up to 16 GiB
  }
  for (const size_t bytes : requests) {
    const size_t c = CachingAllocator::size_class(bytes);
    const size_t need = bytes == 0 ? 1 : bytes;
    EXPECT_GE(c, need) << bytes;
    EXPECT_EQ(c % 512, 0u) << bytes;
    if (bytes <= (size_t{1} << 20)) {
      EXPECT_LT(c - need, 512u) << bytes;  // the next multiple of 512
    } else {
      // A quarter of the largest power of two <= bytes is the step, so the
      // slack is under 25% of the request.
      size_t power = 1;
      while (power * 2 <= bytes) power *= 2;
      EXPECT_EQ(c % (power / 4), 0u) << bytes;
      EXPECT_LT(c - bytes, power / 4) << bytes;
      EXPECT_LE(c, power * 2) << bytes;
    }
    EXPECT_EQ(CachingAllocator::size_class(c), c) << "a class is its own class: " << bytes;
  }
  // Exactly four classes in (2^k, 2^(k+1)] above 1 MiB.
  for (const size_t power : {size_t{1} << 21, size_t{1} << 30}) {
    std::set<size_t> classes;
    for (size_t b = power + 1; b <= 2 * power; b += power / 64) {
      classes.insert(CachingAllocator::size_class(b));
    }
    EXPECT_EQ(classes, (std::set<size_t>{power * 5 / 4, power * 3 / 2, power * 7 / 4, power * 2}));
  }
}

TEST(CudaAllocator, FreedBlocksAreReusedWithoutCudaMalloc) {
  MODAR_REQUIRE_REAL_CUDA();
  void* first = gpu().allocate(1000);
  void* large = gpu().allocate(int64_t{40} << 20);
  gpu().deallocate(first);
  gpu().deallocate(large);
  const int64_t mallocs = cuda_device_malloc_calls();
  const CudaAllocatorStats before = cuda_allocator_stats(gpu());
  void* again = gpu().allocate(900);                    // class 1024, as 1000
  void* large_again = gpu().allocate(int64_t{39} << 20);  // class 40 MiB, as 40 MiB
  EXPECT_EQ(again, first);
  EXPECT_EQ(large_again, large);
  const CudaAllocatorStats after = cuda_allocator_stats(gpu());
  EXPECT_EQ(cuda_device_malloc_calls(), mallocs);
  EXPECT_EQ(after.cache_hits - before.cache_hits, 2);
  EXPECT_EQ(after.requests - before.requests, 2);
  EXPECT_EQ(after.bytes_in_use - before.bytes_in_use, 1024 + (int64_t{40} << 20));
  EXPECT_GE(after.peak_bytes_reserved, after.bytes_in_use + after.bytes_cached);
  // The reused memory works: write, read back.
  Tensor t = make_tensor(gpu(), {250}, ScalarType::fp32, random_values(250, 4));
  gpu().deallocate(again);
  gpu().deallocate(large_again);
  EXPECT_EQ(download(gpu(), t).size(), 250u);
  EXPECT_THROW(cuda_allocator_stats(cpu()), BackendError);
}

// Every grid-stride launch limited to 3 blocks: each thread handles many
// elements, and nothing is skipped or written twice.
class GridLimitScope {
 public:
  explicit GridLimitScope(int64_t blocks) { set_cuda_grid_limit_for_testing(blocks); }
  ~GridLimitScope() { set_cuda_grid_limit_for_testing(0); }
};

TEST(CudaGridStride, SmallGridsStrideOverEveryElement) {
  MODAR_REQUIRE_CUDA();
  GridLimitScope limit(3);
  const int64_t rows = 389, f = 257, n = rows * f;  // 99973 elements, 3 x 256 threads
  const auto a = random_values(n, 21, -3.0, 3.0);
  const auto b = random_values(n, 22, -3.0, 3.0);
  using V = std::vector<TensorView>;
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    const std::vector<int64_t> shape = {rows, f};
    expect_matches_cpu("gelu (3 blocks)", p, {data("x", shape, a), out_data("out", shape)},
                       [](Backend& be, const V& v) { be.gelu_forward(v[0], v[1]); });
    expect_matches_cpu("add (3 blocks)", p,
                       {data("a", shape, a), data("b", shape, b), out_data("out", shape)},
                       [](Backend& be, const V& v) { be.add(v[0], v[1], v[2]); });
    expect_matches_cpu("axpy (3 blocks)", p, {data("x", shape, a), grad_data("y", shape, b)},
                       [](Backend& be, const V& v) { be.axpy(0.5, v[0], v[1]); });
    expect_matches_cpu(
        "mul backward (3 blocks)", p,
        {data("dout", shape, b), data("a", shape, a), data("b", shape, b),
         grad_data("da", shape, random_values(n, 23)), grad_data("db", shape, random_values(n, 24))},
        [](Backend& be, const V& v) { be.mul_backward(v[0], v[1], v[2], v[3], v[4]); });
    // RoPE: [2, 300, 4, 64] (vector path) at positions up to 20000.
    const int64_t rb = 2, rs = 300, rh = 4, rd = 64, rcount = rb * rs * rh * rd;
    std::vector<double> positions;
    for (int64_t i = 0; i < rb * rs; ++i) positions.push_back(static_cast<double>(i * 67 % 20011));
    RopeParams rope;
    expect_matches_cpu("rope (3 blocks)", p,
                       {data("x", {rb, rs, rh, rd}, random_values(rcount, 25)),
                        index("pos", {rb, rs}, positions), out_data("out", {rb, rs, rh, rd})},
                       [&](Backend& be, const V& v) { be.rope_forward(v[0], v[1], v[2], rope); });
    // Embedding backward (sorted runs): 600 rows, 50 tokens, repeated.
    const int64_t erows = 600, vocab = 50, d = 96;
    std::vector<double> tokens;
    for (int64_t i = 0; i < erows; ++i) tokens.push_back(static_cast<double>((i * i + 7) % vocab));
    expect_matches_cpu("embedding backward (3 blocks)", p,
                       {data("dout", {erows, d}, random_values(erows * d, 26)),
                        index("tokens", {erows}, tokens),
                        grad_data("dtable", {vocab, d}, random_values(vocab * d, 27))},
                       [](Backend& be, const V& v) { be.embedding_backward(v[0], v[1], v[2]); });
  }
}

}  // namespace
}  // namespace modar::runtime::cuda_testing
