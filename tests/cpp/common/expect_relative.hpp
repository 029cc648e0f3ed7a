// tests/cpp/common/expect_relative.hpp: the relative check of the hand
// counts (FLOPs, parameters, bytes): actual / expected within `tolerance` of
// 1, with both numbers in the message.  For expected values far from zero;
// a check that may meet zero wants an absolute floor (test_cluster.cpp's).
#pragma once

#include <gtest/gtest.h>

namespace modar_test {

inline void expect_relative(double actual, double expected, double tolerance = 1e-12) {
  EXPECT_NEAR(actual / expected, 1.0, tolerance) << "actual " << actual << " expected " << expected;
}

}  // namespace modar_test
