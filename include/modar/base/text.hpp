// modar/base/text.hpp: text <-> number and the text helpers every area shares.
//
//  * format_number: the shortest text that reads back to the same double,
//    used in every error message and in TOML / config output;
//    toml_float_literal adds ".0" where TOML needs it to read a float.
//  * parse_*_text: the strict text -> number grammar of every boundary
//    (TOML --set values, CLI flags, CSV cells).
//  * shown_value: a user-supplied value as it may appear in a one-line error.
//  * utf8_sequence_length / is_valid_utf8: RFC 3629 UTF-8, the one check of
//    every boundary that takes free text (--set string values, JSON output).
//  * edit_distance / nearest_name: "did you mean" suggestions.
//  * format_fixed / format_sci / format_general and the unit formatters
//    (format_count, format_bytes, format_seconds, format_percent): report
//    text (tables, notes, provenance lines).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace modar {

// ---- numbers as text ----------------------------------------------------------

// A double as the shortest text that reads back to the same value ("0.125",
// "1e+20", "nan", "inf", "-inf").
std::string format_number(double value);
// A TOML float literal: format_number with ".0" appended when the text has no
// '.', exponent or "nan"/"inf" (so 2.0 reads back as a float, not an integer).
std::string toml_float_literal(double value);
// A TOML basic string with its quotes (TOML takes JSON's escapes).
std::string toml_quote(const std::string& text);

// printf-style report numbers: "%.<decimals>f", "%.<decimals>e", "%.<digits>g".
std::string format_fixed(double value, int decimals);              // (0.125, 3) -> "0.125"
std::string format_sci(double value, int decimals = 4);            // (9.07391e9, 4) -> "9.0739e+09"
std::string format_general(double value, int significant_digits);  // (1234.5, 3) -> "1.23e+03"

// Human-readable units, three significant figures; NaN / inf as format_number.
std::string format_count(double value);       // "1.31 G", "350 M", "12.3 k"
std::string format_bytes(double bytes);       // "1.50 GiB"
std::string format_seconds(double seconds);   // "12.3 ms", "2.50 h", "3.00 d"
std::string format_percent(double fraction);  // 0.123 -> "12.3%"

// ---- text as numbers ----------------------------------------------------------

// Strict text -> number used by every boundary (TOML --set values, CLI flags):
// the whole text must be consumed (an optional leading '+' is allowed); reals
// must be finite.  Return false on anything else, so the caller can name the
// field in its error.
bool parse_integer_text(const std::string& text, int64_t* out);
bool parse_finite_number_text(const std::string& text, double* out);

// ---- text in messages -----------------------------------------------------------

// A user-supplied value as it may appear inside a one-line error message:
// control characters escaped (\n, \t, \x00, ...) and anything past
// `max_chars` characters cut to "...(N characters)", so no error is ever
// multi-line or a megabyte long.  Every echoed value goes through this.
std::string shown_value(const std::string& text, size_t max_chars = 60);

// ---- UTF-8 ------------------------------------------------------------------------

// The length (1 to 4) of the well-formed RFC 3629 UTF-8 sequence starting at
// text[i], or 0 where the bytes there are not one (a stray continuation byte,
// an overlong form, a surrogate, a code point above U+10FFFF, a sequence cut
// off by the end).  What TOML and JSON accept as text.
size_t utf8_sequence_length(std::string_view text, size_t i);
bool is_valid_utf8(std::string_view text);

// Levenshtein distance, and the candidate nearest to `word` ("" when none is
// close enough to be a plausible typo: more than a third of the word, and
// more than 2 edits, changed).
int64_t edit_distance(const std::string& a, const std::string& b);
std::string nearest_name(const std::string& word, const std::vector<std::string>& candidates);

// ASCII whitespace (space, tab, CR, LF) removed from both ends.
std::string trim(const std::string& text);
// Split on `separator`, trimming each piece ("a, b," -> {"a", "b", ""}).
std::vector<std::string> split_trimmed(const std::string& text, char separator);

}  // namespace modar
