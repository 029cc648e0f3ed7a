// Tensor views, bf16 conversion, the backend factory, host copies, fill / convert.
#include <limits>

#include "test_ops_util.hpp"

namespace modar::runtime::testing {
namespace {

TEST(OpsTensor, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xC000);
  // 1 + 2^-8 lies exactly between 0x3F80 and 0x3F81: ties go to the even 0x3F80.
  EXPECT_EQ(float_to_bf16(1.0f + 0.00390625f), 0x3F80);
  // 1 + 3 * 2^-8 lies between 0x3F81 and 0x3F82: the tie goes to the even 0x3F82.
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0.00390625f), 0x3F82);
  // Just above the tie rounds up.
  EXPECT_EQ(float_to_bf16(1.0f + 0.00390625f + 1e-6f), 0x3F81);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_to_float(0x3FC0), 1.5f);
}

TEST(OpsTensor, ViewHelpers) {
  Tensor t = tensor({2, 3, 4}, random_values(24, 1));
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.view().rows(), 6);
  EXPECT_EQ(t.dim(-1), 4);
  const TensorView flat = flatten_rows(t);
  EXPECT_EQ(flat.shape_vector(), (std::vector<int64_t>{6, 4}));
  const TensorView second = select(t, 1);
  EXPECT_EQ(second.shape_vector(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(values_of(second)[0], values_of(t)[12]);
  const TensorView tail = slice(t, 1, 1);
  EXPECT_EQ(tail.data, second.data);
  EXPECT_THROW(reshape(t, {5, 5}), ShapeError);
  EXPECT_THROW(slice(t, 1, 2), ShapeError);
  EXPECT_THROW(make_view(nullptr, ScalarType::fp32, DeviceKind::cpu, {1, 2, 3, 4, 5}), ShapeError);
  EXPECT_EQ(scalar_type(DType::bf16), ScalarType::bf16);
  EXPECT_THROW(scalar_type(DType::fp16), ShapeError);
  EXPECT_EQ(stats_type(ScalarType::bf16), ScalarType::fp32);
  EXPECT_NE(t.view().describe().find("[2, 3, 4] fp64 cpu"), std::string::npos);
}

TEST(OpsTensor, FactoryNamesBackends) {
  EXPECT_EQ(make_backend("cpu")->name(), "cpu");
  EXPECT_THROW(make_backend("tpu"), BackendError);
  bool has_cuda = false;
  for (const auto& name : available_backends())
    has_cuda = has_cuda || name == "cuda";
  if (!has_cuda) {
    try {
      make_backend("cuda");
      ADD_FAILURE() << "cuda backend without CUDA build";
    } catch (const BackendError& error) {
      EXPECT_NE(std::string(error.what()).find("no CUDA backend"), std::string::npos);
    }
  }
}

TEST(OpsTensor, UploadDownloadFillConvertCopy) {
  const std::vector<double> values = {1.5, -2.25, 3.0, 1e-3};
  for (ScalarType dtype : {ScalarType::fp64, ScalarType::fp32, ScalarType::bf16}) {
    Tensor t = tensor({4}, values, dtype);
    const auto back = values_of(t);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_EQ(back[i], values[i]);  // exact in all three
  }
  Tensor ids = tensor({3}, {0, 7, -1}, ScalarType::i32);
  EXPECT_EQ(values_of(ids), (std::vector<double>{0, 7, -1}));
  cpu().fill(ids, 4);
  EXPECT_EQ(values_of(ids), (std::vector<double>{4, 4, 4}));

  Tensor f32 = tensor({4}, values, ScalarType::fp32);
  Tensor b16 = zeros({4}, ScalarType::bf16);
  cpu().convert(f32, b16);
  EXPECT_EQ(values_of(b16)[1], -2.25);
  EXPECT_NEAR(values_of(b16)[3], 1e-3, 1e-3 / 128);  // 8 significant bits
  Tensor copy = zeros({2, 2}, ScalarType::fp32);
  cpu().copy(f32, copy);
  EXPECT_EQ(values_of(copy), values_of(f32));
  expect_shape_error([&] { cpu().copy(f32, b16); }, "same dtype");

  // Moving a Tensor transfers ownership.
  Tensor moved = std::move(f32);
  EXPECT_TRUE(f32.empty());
  EXPECT_EQ(values_of(moved)[0], 1.5);
}

TEST(OpsTensor, TimerMeasuresElapsedTime) {
  auto timer = cpu().make_timer();
  timer->start();
  volatile double sink = 0;
  for (int i = 0; i < 100000; ++i)
    sink = sink + std::sqrt(static_cast<double>(i));
  timer->stop();
  EXPECT_GT(timer->elapsed_s(), 0.0);
  EXPECT_LT(timer->elapsed_s(), 10.0);
}

}  // namespace
}  // namespace modar::runtime::testing
