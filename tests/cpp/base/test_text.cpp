// base/text: numbers as text (checked against the printf / shortest
// round-trip forms written out by hand), the strict number grammar, and the
// "did you mean" helpers.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "modar/base/text.hpp"

namespace modar {
namespace {

TEST(BaseText, ShortestRoundTripAndTomlFloats) {
  EXPECT_EQ(format_number(0.125), "0.125");
  EXPECT_EQ(format_number(1e20), "1e+20");
  EXPECT_EQ(format_number(2.0), "2");
  EXPECT_EQ(format_number(std::nan("")), "nan");
  EXPECT_EQ(format_number(-std::numeric_limits<double>::infinity()), "-inf");
  // TOML reads "2" as an integer: a float literal needs '.' or an exponent.
  EXPECT_EQ(toml_float_literal(2.0), "2.0");
  EXPECT_EQ(toml_float_literal(0.125), "0.125");
  EXPECT_EQ(toml_float_literal(1e20), "1e+20");
  EXPECT_EQ(toml_float_literal(std::nan("")), "nan");
  EXPECT_EQ(toml_quote("a\"b\\c\n"), "\"a\\\"b\\\\c\\n\"");
}

TEST(BaseText, PrintfForms) {
  EXPECT_EQ(format_fixed(0.125, 3), "0.125");
  EXPECT_EQ(format_fixed(2.5, 0), "2");  // round half to even, as printf
  EXPECT_EQ(format_sci(9073900000.0, 4), "9.0739e+09");
  EXPECT_EQ(format_sci(1234.5, 2), "1.23e+03");
  EXPECT_EQ(format_general(1234.5, 3), "1.23e+03");
  EXPECT_EQ(format_general(0.5, 4), "0.5");
  EXPECT_EQ(format_general(12.3456, 4), "12.35");
  // Wider than a 64-character buffer: printed whole, not cut.
  EXPECT_EQ(format_fixed(1e80, 0).size(), 81u);
}

TEST(BaseText, UnitsAtThreeSignificantFigures) {
  EXPECT_EQ(format_count(1.31e9), "1.31 G");
  EXPECT_EQ(format_count(350e6), "350 M");
  EXPECT_EQ(format_count(12.3e3), "12.3 k");
  EXPECT_EQ(format_count(7.0), "7.00");
  EXPECT_EQ(format_bytes(1.5 * 1024 * 1024 * 1024), "1.50 GiB");
  EXPECT_EQ(format_bytes(512.0), "512 B");
  EXPECT_EQ(format_seconds(0.0123), "12.3 ms");
  EXPECT_EQ(format_seconds(2.5e-6), "2.50 us");
  EXPECT_EQ(format_seconds(3.0 * 86400.0), "3.00 d");
  EXPECT_EQ(format_seconds(3.0 * 3600.0), "3.00 h");
  EXPECT_EQ(format_seconds(90.0), "90.0 s");  // under 2 h stays in seconds
  EXPECT_EQ(format_percent(0.123), "12.3%");
  EXPECT_EQ(format_percent(0.0005), "0.050%");
  EXPECT_EQ(format_bytes(std::numeric_limits<double>::infinity()), "inf");
}

TEST(BaseText, StrictNumberGrammar) {
  double value = 0;
  EXPECT_TRUE(parse_finite_number_text("1e-6", &value));
  EXPECT_EQ(value, 1e-6);
  for (const char* bad : {"0x10", "0x1p3", "inf", "nan", "1e400", "1.5x", " 1", ""}) {
    EXPECT_FALSE(parse_finite_number_text(bad, &value)) << bad;
  }
  int64_t integer = 0;
  EXPECT_TRUE(parse_integer_text("+42", &integer));
  EXPECT_EQ(integer, 42);
  for (const char* bad : {"4.0", "1e3", "9223372036854775808", "", "+", "12 "}) {
    EXPECT_FALSE(parse_integer_text(bad, &integer)) << bad;
  }
}

TEST(BaseText, EditDistanceAndNearestName) {
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3);
  EXPECT_EQ(edit_distance("", "abc"), 3);
  EXPECT_EQ(nearest_name("--jsn", {"--json", "--set"}), "--json");
  EXPECT_EQ(nearest_name("completely-different", {"--json", "--set"}), "");
}

TEST(BaseText, EchoedValuesAreEscapedAndCut) {
  EXPECT_EQ(shown_value(std::string("a\nb\0c\t", 6)), "a\\nb\\x00c\\t");
  EXPECT_EQ(shown_value("abcdef", 3), "abc...(6 characters)");
}

TEST(BaseText, TrimAndSplit) {
  EXPECT_EQ(trim(" \t a b \r\n"), "a b");
  EXPECT_EQ(trim(" \n"), "");
  EXPECT_EQ(split_trimmed("a, b ,", ','), (std::vector<std::string>{"a", "b", ""}));
  EXPECT_EQ(split_trimmed("", ','), (std::vector<std::string>{""}));
}

}  // namespace
}  // namespace modar
