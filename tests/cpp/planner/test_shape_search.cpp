// Shape search: concrete shapes near a target N_f, inside the aspect band,
// d_model a multiple of 128, d_head 64 / 128, deeper shapes winning near-ties.
// The reference is a brute-force loop over every (layers, d_model) in the band
// that asks count_params directly.
#include <gtest/gtest.h>

#include <cmath>

#include "modar/base/errors.hpp"
#include "modar/planner.hpp"

namespace {

TEST(ShapeSearch, ClosestShapeMatchesBruteForceWithDepthPreference) {
  const modar::ShapeSearchOptions options;
  modar::Config base;
  for (const double target : {3e7, 2e8, 8.5e8, 5e9}) {
    const modar::ShapeCandidate chosen = modar::closest_shape(base, target, options);
    const modar::Shape& s = chosen.shape;
    EXPECT_EQ(s.d_model % 128, 0);
    EXPECT_GE(s.aspect_ratio(), options.aspect_min);
    EXPECT_LE(s.aspect_ratio(), options.aspect_max);
    EXPECT_EQ(s.d_head, s.d_model < 2048 ? 64 : 128);
    EXPECT_EQ(s.n_heads * s.d_head, s.d_model);
    EXPECT_EQ(s.n_kv_heads, s.n_heads);
    EXPECT_EQ(s.d_ff, 4 * s.d_model);  // GELU default
    // Brute force: best log distance over the band, then the deepest shape
    // within max(best, tolerance) of the target.
    double best = INFINITY;
    struct Entry {
      int64_t layers, d_model;
      double distance;
    };
    std::vector<Entry> entries;
    for (int64_t layers = options.min_layers; layers <= 200; ++layers) {
      for (int64_t d = 128; d <= options.aspect_max * layers && d <= 16384; d += 128) {
        if (d < options.aspect_min * layers) {
          continue;
        }
        const modar::Config config =
            modar::with_shape(base, modar::make_shape(layers, d, base.model, options));
        const double n_f = modar::count_params(config).flop_active;
        const double distance = std::abs(std::log(n_f / target));
        best = std::min(best, distance);
        entries.push_back({layers, d, distance});
      }
    }
    int64_t deepest = 0;
    for (const Entry& e : entries) {
      if (e.distance <= std::max(best, std::log1p(options.depth_tolerance)) + 1e-12) {
        deepest = std::max(deepest, e.layers);
      }
    }
    EXPECT_EQ(s.n_layers, deepest) << "target " << target;
    EXPECT_LE(std::abs(std::log(chosen.params.flop_active / target)),
              std::max(best, std::log1p(options.depth_tolerance)) + 1e-12);
    // Large targets are matched closely (shape granularity).
    if (target >= 1e8) {
      EXPECT_NEAR(chosen.params.flop_active / target, 1.0, 0.06) << "target " << target;
    }
  }
}

TEST(ShapeSearch, ModShapesCountRoutedLayersAtCapacity) {
  // For MoD the same shape has fewer FLOP-active parameters, so the shape for
  // the same N_f target is larger in total parameters.
  const modar::ShapeSearchOptions options;
  modar::Config dense;
  modar::Config mod;
  mod.mod = modar::make_arch("mod").mod;
  const auto dense_shape = modar::closest_shape(dense, 3e8, options);
  const auto mod_shape = modar::closest_shape(mod, 3e8, options);
  EXPECT_NEAR(mod_shape.params.flop_active / 3e8, 1.0, 0.06);
  EXPECT_GT(mod_shape.params.total, 1.3 * dense_shape.params.total);
}

TEST(ShapeSearch, GqaAndSwiGlu) {
  modar::ShapeSearchOptions options;
  options.gqa_group = 4;
  modar::Config base;
  base.model.mlp = modar::MlpKind::swiglu;
  const auto chosen = modar::closest_shape(base, 1e9, options);
  EXPECT_EQ(chosen.shape.n_heads % chosen.shape.n_kv_heads, 0);
  EXPECT_LE(chosen.shape.n_kv_heads * 4, chosen.shape.n_heads);
  EXPECT_EQ(chosen.shape.d_ff % 64, 0);
  EXPECT_NEAR(double(chosen.shape.d_ff) / chosen.shape.d_model, 8.0 / 3.0, 0.1);
}

TEST(ShapeSearch, BadInput) {
  modar::Config base;
  modar::ShapeSearchOptions options;
  EXPECT_THROW(modar::closest_shape(base, -1.0, options), modar::ConfigError);
  EXPECT_THROW(modar::closest_shape(base, NAN, options), modar::ConfigError);
  EXPECT_THROW(modar::closest_shape(base, 1e3, options), modar::ConfigError);  // below any shape
  options.aspect_min = 200;
  options.aspect_max = 100;
  EXPECT_THROW(modar::closest_shape(base, 1e8, options), modar::ConfigError);
}

}  // namespace
