// The config enums (modar/config_enums.hpp) as text: to_string (the names of
// config_keys.hpp's EnumNames, written once), parse_attention_flops for the
// CLI's and the bindings' convention flag, and each dtype's size in bytes.
#include "modar/config_enums.hpp"

#include <string>
#include <vector>

#include "config_keys.hpp"
#include "modar/base/errors.hpp"

namespace modar {

using detail::enum_name;

const char* to_string(MlpKind v) {
  return enum_name(v);
}
const char* to_string(QkNorm v) {
  return enum_name(v);
}
const char* to_string(RouterScale v) {
  return enum_name(v);
}
const char* to_string(CausalRouter v) {
  return enum_name(v);
}
const char* to_string(DarVariant v) {
  return enum_name(v);
}
const char* to_string(MoeMode v) {
  return enum_name(v);
}
const char* to_string(DType v) {
  return enum_name(v);
}
const char* to_string(Optimizer v) {
  return enum_name(v);
}
const char* to_string(Recompute v) {
  return enum_name(v);
}
const char* to_string(AttentionKernel v) {
  return enum_name(v);
}
const char* to_string(GradAccumulation v) {
  return enum_name(v);
}
const char* to_string(PipelineSchedule v) {
  return enum_name(v);
}
const char* to_string(AttentionFlops v) {
  return enum_name(v);
}

int64_t dtype_bytes(DType v) {
  switch (v) {
    case DType::fp32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::fp16:
      return 2;
    case DType::fp64:
      return 8;
  }
  return 4;
}

AttentionFlops parse_attention_flops(const std::string& text, const std::string& field) {
  const std::vector<const char*> names = detail::enum_names<AttentionFlops>();
  for (size_t i = 0; i < names.size(); ++i) {
    if (text == names[i]) {
      return static_cast<AttentionFlops>(i);
    }
  }
  throw ConfigError(field + " = " + text + ": must be " + detail::join_names(names));
}

}  // namespace modar
