// modar/base/json.hpp: a tiny JSON writer used by every CLI command (--json) and by
// the Python bindings (which json.loads this text, so `.to_dict()` equals the
// CLI's --json output byte for byte in meaning).
//
//   JsonWriter json;
//   json.begin_object().field("step_s", 1.5).key("ops").begin_array()...;
//   json.end_array().end_object();
//   json.field("repeats_s", std::vector<double>{1.5, 1.6});  // an array
//   std::string text = json.str();
//
// Numbers are written with the shortest round-trip representation; NaN and
// infinities (not JSON) are written as null.  Misuse (a value where a key is
// expected, unbalanced ends) throws std::logic_error: it is a programming error.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace modar {

class JsonWriter {
 public:
  // indent = 0: compact, one line; > 0: pretty-printed with that many spaces.
  explicit JsonWriter(int indent = 2) : indent_(indent) {}

  JsonWriter& begin_object();
  JsonWriter& end_object();
  JsonWriter& begin_array();
  JsonWriter& end_array();
  JsonWriter& key(std::string_view name);

  JsonWriter& value(double number);
  JsonWriter& value(int64_t number);
  JsonWriter& value(uint64_t number);
  JsonWriter& value(int number) { return value(static_cast<int64_t>(number)); }
  JsonWriter& value(bool flag);
  JsonWriter& value(std::string_view text);
  JsonWriter& value(const char* text) { return value(std::string_view(text)); }
  JsonWriter& value(const std::string& text) { return value(std::string_view(text)); }
  // A JSON array of the values, each written by value().
  template <typename T>
  JsonWriter& value(const std::vector<T>& values) {
    begin_array();
    for (const T& v : values) {
      value(v);
    }
    return end_array();
  }
  JsonWriter& null();
  // Insert an already-serialised JSON value (e.g. from another writer).
  JsonWriter& raw(std::string_view json_text);

  template <typename T>
  JsonWriter& field(std::string_view name, const T& v) {
    key(name);
    return value(v);
  }

  // The document; throws std::logic_error when objects / arrays are still open.
  const std::string& str() const;

 private:
  enum class Frame : uint8_t { object, array };
  void before_value();
  void newline_and_indent();

  int indent_;
  std::string out_;
  std::vector<Frame> stack_;
  std::vector<bool> has_items_;
  bool expecting_value_after_key_ = false;
};

// "text" with JSON escapes (quotes included); a byte that is not part of
// well-formed UTF-8 is written as \ufffd, so the output always parses.
std::string json_quote(std::string_view text);
// Shortest round-trip text of a double; "null" for NaN / inf.
std::string json_number(double number);
// `"key": value`, or `"key": null` when the value is absent.
void json_optional(JsonWriter& json, std::string_view key, const std::optional<double>& value);

}  // namespace modar
