// base/text: numbers as text (checked against the printf / shortest
// round-trip forms written out by hand), the strict number grammar, and the
// "did you mean" helpers; UTF-8 well-formedness against an independent
// bit-pattern decoder, exhaustively over every 1-, 2- and 3-byte input.
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

// The reference: decode by the bit patterns of RFC 3629 section 3 (0xxxxxxx,
// 110xxxxx 10xxxxxx, ...), then apply its three rules: the shortest form,
// no surrogate (U+D800..DFFF), nothing above U+10FFFF.  0 = not well-formed.
size_t reference_sequence_length(const std::string& bytes) {
  const auto b = [&](size_t k) { return static_cast<unsigned>(static_cast<unsigned char>(bytes[k])); };
  size_t length = 0;
  unsigned code = 0;
  if ((b(0) & 0x80u) == 0) {
    return 1;
  } else if ((b(0) & 0xE0u) == 0xC0u) {
    length = 2, code = b(0) & 0x1Fu;
  } else if ((b(0) & 0xF0u) == 0xE0u) {
    length = 3, code = b(0) & 0x0Fu;
  } else if ((b(0) & 0xF8u) == 0xF0u) {
    length = 4, code = b(0) & 0x07u;
  } else {
    return 0;
  }
  if (bytes.size() < length) {
    return 0;
  }
  for (size_t k = 1; k < length; ++k) {
    if ((b(k) & 0xC0u) != 0x80u) {
      return 0;
    }
    code = (code << 6) | (b(k) & 0x3Fu);
  }
  const unsigned shortest[] = {0, 0, 0x80, 0x800, 0x10000};
  if (code < shortest[length] || (code >= 0xD800 && code <= 0xDFFF) || code > 0x10FFFF) {
    return 0;
  }
  return length;
}

TEST(BaseText, Utf8AgreesWithTheBitPatternDecoderOnEveryShortInput) {
  std::string bytes;
  size_t checked = 0, well_formed = 0;
  const auto check = [&] {
    const size_t expected = reference_sequence_length(bytes);
    ASSERT_EQ(utf8_sequence_length(bytes, 0), expected) << shown_value(bytes);
    ++checked;
    well_formed += expected == bytes.size() ? 1 : 0;
  };
  for (unsigned a = 0; a < 256; ++a) {
    bytes = std::string(1, static_cast<char>(a));
    check();
    for (unsigned b = 0; b < 256; ++b) {
      bytes = {static_cast<char>(a), static_cast<char>(b)};
      check();
      if (a < 0xE0 || a > 0xF4) {
        continue;  // third bytes only matter after a 3- or 4-byte lead
      }
      for (unsigned c = 0; c < 256; ++c) {
        bytes = {static_cast<char>(a), static_cast<char>(b), static_cast<char>(c)};
        check();
        if (a >= 0xF0) {
          for (const unsigned d : {0x00u, 0x7Fu, 0x80u, 0xBFu, 0xC0u}) {
            bytes = {static_cast<char>(a), static_cast<char>(b), static_cast<char>(c),
                     static_cast<char>(d)};
            check();
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 1000000u);
  // Well-formed inputs counted by hand: 128 one-byte, 1920 two-byte
  // (U+0080..07FF), 61440 three-byte (U+0800..FFFF less 2048 surrogates),
  // and of the four-byte samples the 2**20 / 64 three-byte prefixes of
  // U+10000..10FFFF times the two continuation bytes sampled (80, BF).
  EXPECT_EQ(well_formed, 128u + 1920u + 61440u + 1048576u / 64u * 2u);
}

TEST(BaseText, Utf8BoundariesOfRfc3629) {
  // Each first / last code point of a length, and the first one past it.
  for (const char* ok : {"\x7f", "\xc2\x80", "\xdf\xbf", "\xe0\xa0\x80", "\xed\x9f\xbf",
                         "\xee\x80\x80", "\xef\xbf\xbf", "\xf0\x90\x80\x80",
                         "\xf4\x8f\xbf\xbf", "caf\xc3\xa9 \xe2\x82\xac"}) {
    EXPECT_TRUE(is_valid_utf8(ok)) << shown_value(ok);
  }
  for (const char* bad : {"\x80", "\xc0\x80", "\xc1\xbf", "\xe0\x9f\xbf", "\xed\xa0\x80",
                          "\xf0\x8f\xbf\xbf", "\xf4\x90\x80\x80", "\xf5\x80\x80\x80",
                          "\xff", "caf\xe9", "\xe2\x82"}) {
    EXPECT_FALSE(is_valid_utf8(bad)) << shown_value(bad);
  }
}

TEST(BaseText, TrimAndSplit) {
  EXPECT_EQ(trim(" \t a b \r\n"), "a b");
  EXPECT_EQ(trim(" \n"), "");
  EXPECT_EQ(split_trimmed("a, b ,", ','), (std::vector<std::string>{"a", "b", ""}));
  EXPECT_EQ(split_trimmed("", ','), (std::vector<std::string>{""}));
}

}  // namespace
}  // namespace modar
