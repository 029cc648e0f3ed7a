// The JSON writer of modar/base/json.hpp.
#include "modar/base/json.hpp"

#include "modar/base/text.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace modar {

std::string json_number(double number) {
  if (!std::isfinite(number)) {
    return "null";
  }
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), number);
  return std::string(buffer, result.ptr);
}

std::string json_quote(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 2);
  out += '"';
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (static_cast<unsigned char>(ch) >= 0x80) {
      // JSON text is UTF-8 (RFC 8259): a well-formed sequence is copied, a
      // byte that starts none (a Latin-1 path, a cut-off name) is written as
      // U+FFFD, so every document parses.
      const size_t length = utf8_sequence_length(text, i);
      if (length == 0) {
        out += "\\ufffd";
      } else {
        out.append(text.substr(i, length));
        i += length - 1;
      }
      continue;
    }
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20) {
          char buffer[8];
          std::snprintf(buffer, sizeof(buffer), "\\u%04x", static_cast<unsigned>(ch));
          out += buffer;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
  return out;
}

void JsonWriter::newline_and_indent() {
  if (indent_ <= 0) {
    return;
  }
  out_ += '\n';
  out_.append(stack_.size() * static_cast<size_t>(indent_), ' ');
}

void JsonWriter::before_value() {
  if (stack_.empty()) {
    if (!out_.empty()) {
      throw std::logic_error("JsonWriter: a second top-level value");
    }
    return;
  }
  if (stack_.back() == Frame::object) {
    if (!expecting_value_after_key_) {
      throw std::logic_error("JsonWriter: value inside an object without a key");
    }
    expecting_value_after_key_ = false;
    return;
  }
  if (has_items_.back()) {
    out_ += ',';
  }
  has_items_.back() = true;
  newline_and_indent();
}

JsonWriter& JsonWriter::key(std::string_view name) {
  if (stack_.empty() || stack_.back() != Frame::object || expecting_value_after_key_) {
    throw std::logic_error("JsonWriter: key outside an object or after another key");
  }
  if (has_items_.back()) {
    out_ += ',';
  }
  has_items_.back() = true;
  newline_and_indent();
  out_ += json_quote(name);
  out_ += indent_ > 0 ? ": " : ":";
  expecting_value_after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::begin_object() {
  before_value();
  out_ += '{';
  stack_.push_back(Frame::object);
  has_items_.push_back(false);
  return *this;
}

JsonWriter& JsonWriter::begin_array() {
  before_value();
  out_ += '[';
  stack_.push_back(Frame::array);
  has_items_.push_back(false);
  return *this;
}

JsonWriter& JsonWriter::end_object() {
  if (stack_.empty() || stack_.back() != Frame::object || expecting_value_after_key_) {
    throw std::logic_error("JsonWriter: end_object without a matching begin_object");
  }
  const bool had_items = has_items_.back();
  stack_.pop_back();
  has_items_.pop_back();
  if (had_items) {
    newline_and_indent();
  }
  out_ += '}';
  return *this;
}

JsonWriter& JsonWriter::end_array() {
  if (stack_.empty() || stack_.back() != Frame::array) {
    throw std::logic_error("JsonWriter: end_array without a matching begin_array");
  }
  const bool had_items = has_items_.back();
  stack_.pop_back();
  has_items_.pop_back();
  if (had_items) {
    newline_and_indent();
  }
  out_ += ']';
  return *this;
}

JsonWriter& JsonWriter::value(double number) {
  before_value();
  out_ += json_number(number);
  return *this;
}

JsonWriter& JsonWriter::value(int64_t number) {
  before_value();
  out_ += std::to_string(number);
  return *this;
}

JsonWriter& JsonWriter::value(uint64_t number) {
  before_value();
  out_ += std::to_string(number);
  return *this;
}

JsonWriter& JsonWriter::value(bool flag) {
  before_value();
  out_ += flag ? "true" : "false";
  return *this;
}

JsonWriter& JsonWriter::value(std::string_view text) {
  before_value();
  out_ += json_quote(text);
  return *this;
}

JsonWriter& JsonWriter::null() {
  before_value();
  out_ += "null";
  return *this;
}

JsonWriter& JsonWriter::raw(std::string_view json_text) {
  before_value();
  out_ += json_text;
  return *this;
}

const std::string& JsonWriter::str() const {
  if (!stack_.empty()) {
    throw std::logic_error("JsonWriter: document has unclosed objects or arrays");
  }
  return out_;
}

void json_optional(JsonWriter& json, std::string_view key, const std::optional<double>& value) {
  json.key(key);
  if (value) {
    json.value(*value);
  } else {
    json.null();
  }
}

}  // namespace modar
