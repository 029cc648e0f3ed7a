// modar/base/enum_names.hpp: an enum's names as one list in enum order, read
// both ways: to_string (value -> name) and the readers that accept the names
// (name -> value), so the two cannot drift apart.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace modar {

// names[v]; `otherwise` for a value outside the list.
template <class Enum, std::size_t N>
constexpr const char* name_of(const char* const (&names)[N], Enum v,
                              const char* otherwise = "unknown") {
  const auto i = static_cast<std::size_t>(v);
  return i < N ? names[i] : otherwise;
}

// The value named `text`; nullopt for a name not in the list.
template <class Enum, std::size_t N>
std::optional<Enum> enum_named(const char* const (&names)[N], std::string_view text) {
  for (std::size_t i = 0; i < N; ++i) {
    if (text == names[i]) {
      return static_cast<Enum>(i);
    }
  }
  return std::nullopt;
}

}  // namespace modar
