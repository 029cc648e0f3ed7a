// Shared CLI helpers (see cli_util.hpp).
#include "cli_util.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <limits>
#include <memory>
#include <utility>

#include "modar/base/errors.hpp"
#include "modar/base/interrupt.hpp"
#include "modar/base/text.hpp"
#include "modar/export.hpp"

namespace modar::cli {

std::optional<std::string> ParsedArgs::value(const std::string& flag) const {
  const auto it = values_.find(flag);
  if (it == values_.end() || it->second.empty()) {
    return std::nullopt;
  }
  return it->second.back();
}

std::string ParsedArgs::value_or(const std::string& flag, const std::string& fallback) const {
  const std::optional<std::string> v = value(flag);
  return v ? *v : fallback;
}

const std::vector<std::string>& ParsedArgs::values(const std::string& flag) const {
  static const std::vector<std::string> kEmpty;
  const auto it = values_.find(flag);
  return it == values_.end() ? kEmpty : it->second;
}

FlagSpec quiet_flag() {
  return {"--quiet", false, false, "", "no progress lines on stderr"};
}

FlagSpec set_flag() {
  return {"--set", true, true, "KEY=VALUE", "override a config key (repeatable)"};
}

FlagSpec config_profile_flag() {
  return {"--profile", true, false, "NAME|PATH",
          "device profile (default: the config's device.profile)"};
}

bool wants_help(const Args& args) {
  for (const std::string& arg : args) {
    if (arg == "-h" || arg == "--help") {
      return true;
    }
    if (arg == "--") {
      break;
    }
  }
  return false;
}

ParsedArgs parse_args(const Args& args, const std::vector<FlagSpec>& flags,
                      const std::string& command, size_t min_positional, size_t max_positional,
                      const std::string& positional_name) {
  ParsedArgs parsed;
  std::vector<std::string> flag_names;
  for (const FlagSpec& spec : flags) {
    flag_names.push_back(spec.name);
  }
  bool only_positional = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (only_positional || arg.size() < 2 || arg[0] != '-' ||
        (arg[1] != '-' && (std::isdigit(static_cast<unsigned char>(arg[1])) || arg[1] == '.'))) {
      parsed.positional.push_back(arg);
      continue;
    }
    if (arg == "--") {
      only_positional = true;
      continue;
    }
    std::string name = arg;
    std::optional<std::string> inline_value;
    const size_t equals = arg.find('=');
    if (equals != std::string::npos) {
      name = arg.substr(0, equals);
      inline_value = arg.substr(equals + 1);
    }
    const auto spec =
        std::find_if(flags.begin(), flags.end(), [&](const FlagSpec& f) { return f.name == name; });
    if (spec == flags.end()) {
      std::string message = "unknown option '" + shown_value(name) + "' for modar " + command;
      const std::string suggestion = nearest_name(name, flag_names);
      if (!suggestion.empty()) {
        message += "; did you mean '" + suggestion + "'?";
      } else {
        message += "; see modar " + command + " --help";
      }
      throw ConfigError(message);
    }
    if (!spec->repeatable && parsed.has(name)) {
      throw ConfigError("option " + name + " given twice; it may be given once");
    }
    if (!spec->takes_value) {
      if (inline_value) {
        throw ConfigError("option " + name + " = " + shown_value(*inline_value) +
                          ": takes no value");
      }
      parsed.add(name, "");
      continue;
    }
    if (inline_value) {
      parsed.add(name, *inline_value);
      continue;
    }
    if (i + 1 >= args.size()) {
      throw ConfigError("option " + name + " needs a value" +
                        (spec->value_name.empty() ? "" : " (" + spec->value_name + ")"));
    }
    parsed.add(name, args[++i]);
  }
  if (parsed.positional.size() < min_positional) {
    throw ConfigError("missing " + positional_name + " (see modar " + command + " --help)");
  }
  if (parsed.positional.size() > max_positional) {
    throw ConfigError("unexpected argument '" + shown_value(parsed.positional[max_positional]) +
                      "'; takes " +
                      (max_positional == 0
                           ? std::string("no positional arguments")
                           : "at most " + std::to_string(max_positional) + " " + positional_name));
  }
  return parsed;
}

std::string usage_text(const std::string& command, const std::string& synopsis,
                       const std::vector<FlagSpec>& flags, const std::string& description) {
  std::string out = "usage: modar " + command + " " + synopsis + "\n";
  if (!description.empty()) {
    out += "\n" + description + "\n";
  }
  if (!flags.empty()) {
    out += "\noptions:\n";
    size_t width = 0;
    std::vector<std::string> lefts;
    for (const FlagSpec& flag : flags) {
      std::string left = "  " + flag.name;
      if (flag.takes_value) {
        left += " " + (flag.value_name.empty() ? std::string("VALUE") : flag.value_name);
      }
      width = std::max(width, left.size());
      lefts.push_back(left);
    }
    for (size_t i = 0; i < flags.size(); ++i) {
      out += lefts[i] + std::string(width - lefts[i].size() + 2, ' ') + flags[i].help + "\n";
    }
    const std::string help_left = "  -h, --help";
    out += help_left +
           std::string(width > help_left.size() ? width - help_left.size() + 2 : 2, ' ') +
           "show this help\n";
  }
  return out;
}

bool print_help_if_asked(const Args& args, const std::string& command, const std::string& synopsis,
                         const std::vector<FlagSpec>& flags, const std::string& description) {
  if (!wants_help(args)) {
    return false;
  }
  std::fputs(usage_text(command, synopsis, flags, description).c_str(), stdout);
  return true;
}

namespace {

// `text` read whole by `parse` (base/text.hpp), or the ConfigError
// "FLAG = TEXT: must be WHAT".
template <typename T>
T parse_whole(const std::string& flag, const std::string& text,
              bool (*parse)(const std::string&, T*), const char* what) {
  T value{};
  if (!parse(text, &value)) {
    throw ConfigError(flag + " = " + shown_value(text) + ": must be " + what);
  }
  return value;
}

}  // namespace

double parse_double(const std::string& flag, const std::string& text) {
  return parse_whole(flag, text, &parse_finite_number_text, "a finite number");
}

double parse_positive_double(const std::string& flag, const std::string& text) {
  const double value = parse_double(flag, text);
  if (!(value > 0.0)) {
    throw ConfigError(flag + " = " + shown_value(text) + ": must be a number > 0");
  }
  return value;
}

int64_t parse_int(const std::string& flag, const std::string& text) {
  return parse_whole(flag, text, &parse_integer_text, "an integer");
}

int64_t parse_positive_int(const std::string& flag, const std::string& text) {
  const int64_t value = parse_int(flag, text);
  if (value <= 0) {
    throw ConfigError(flag + " = " + shown_value(text) + ": must be a positive integer");
  }
  return value;
}

namespace {

int narrowed_to_int(const std::string& flag, const std::string& text, int64_t value) {
  if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max()) {
    throw ConfigError(flag + " = " + text + ": out of range");
  }
  return static_cast<int>(value);
}

}  // namespace

int parse_int32(const std::string& flag, const std::string& text) {
  return narrowed_to_int(flag, text, parse_int(flag, text));
}

int parse_positive_int32(const std::string& flag, const std::string& text) {
  return narrowed_to_int(flag, text, parse_positive_int(flag, text));
}

std::vector<std::string> parse_list(const std::string& flag, const std::string& text) {
  std::vector<std::string> pieces;
  std::string current;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == ',') {
      const auto begin = current.find_first_not_of(" \t");
      const auto end = current.find_last_not_of(" \t");
      if (begin == std::string::npos) {
        throw ConfigError(flag + " " + shown_value(text) +
                          ": empty item; allowed: a comma-separated list");
      }
      pieces.push_back(current.substr(begin, end - begin + 1));
      current.clear();
    } else {
      current += text[i];
    }
  }
  return pieces;
}

int parse_int_in_range(const std::string& flag, const std::string& text, int64_t low,
                       int64_t high) {
  const int64_t value = parse_int(flag, text);
  if (value < low || value > high) {
    throw ConfigError(flag + " = " + shown_value(text) + ": must be an integer in [" +
                      std::to_string(low) + ", " + std::to_string(high) + "]");
  }
  return static_cast<int>(value);
}

namespace {

bool is_key_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
}

}  // namespace

std::string name_typed_flags(const std::string& message, const ParsedArgs& parsed,
                             const std::vector<FlagKey>& flag_keys) {
  std::string out = message;
  for (const FlagKey& fk : flag_keys) {
    if (!parsed.has(fk.flag)) {
      continue;
    }
    const std::string key = fk.key;
    const std::string flag = fk.flag;
    const bool field = key.find('.') == std::string::npos;
    size_t at = 0;
    while ((at = out.find(key, at)) != std::string::npos) {
      // Not inside a word, nor the flag already ("--gpus = x" stays).
      const bool starts = at == 0 || (!is_key_char(out[at - 1]) && out[at - 1] != '-');
      const size_t after = at + key.size();
      if (!starts) {
        at = after;
        continue;
      }
      if (!field) {
        const bool ends = after >= out.size() || !is_key_char(out[after]) ||
                          (out[after] == '.' && (after + 1 >= out.size() || out[after + 1] == ' '));
        if (ends) {
          out.replace(at, key.size(), flag);
          at += flag.size();
        } else {
          at = after;
        }
        continue;
      }
      // A request field: "key = ", "key: ", "key in [" or "key[item] = value"
      // ("--flag item=value").
      const std::string rest = out.substr(after);
      if (rest.rfind(" = ", 0) == 0 || rest.rfind(": ", 0) == 0 || rest.rfind(" in [", 0) == 0) {
        out.replace(at, key.size(), flag);
        at += flag.size();
      } else if (rest.rfind("[", 0) == 0 && rest.find("] = ") != std::string::npos) {
        const size_t close = rest.find("] = ");
        const std::string item = rest.substr(1, close - 1);
        const size_t value_begin = close + 4;
        size_t value_end = rest.find(": ", value_begin);
        if (value_end == std::string::npos) {
          value_end = rest.size();
        }
        const std::string replacement =
            flag + " " + item + "=" + rest.substr(value_begin, value_end - value_begin);
        out.replace(at, key.size() + value_end, replacement);
        at += replacement.size();
      } else {
        at = after;
      }
    }
  }
  return out;
}

namespace {

extern "C" void on_interrupt(int) {
  modar::request_interrupt();  // SA_RESETHAND: a second Ctrl-C kills
}

struct sigaction g_previous_sigint;
struct sigaction g_previous_sigterm;

}  // namespace

InterruptScope::InterruptScope() {
  clear_interrupt();
  struct sigaction action {};
  action.sa_handler = on_interrupt;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESETHAND;
  sigaction(SIGINT, &action, &g_previous_sigint);
  // mpirun answers a Ctrl-C by sending its ranks SIGTERM (Open MPI 4.1): the
  // same graceful stop, before its SIGKILL.
  sigaction(SIGTERM, &action, &g_previous_sigterm);
}

InterruptScope::~InterruptScope() {
  sigaction(SIGINT, &g_previous_sigint, nullptr);
  sigaction(SIGTERM, &g_previous_sigterm, nullptr);
}

namespace {

// A progress line left open on a terminal (\r updates, no newline yet).
bool g_progress_line_open = false;

}  // namespace

void close_progress_line() {
  if (g_progress_line_open) {
    std::fputc('\n', stderr);
    g_progress_line_open = false;
  }
}

RunControl progress_on_stderr(bool quiet) {
  RunControl control;
  if (quiet) {
    return control;
  }
  const bool terminal = ::isatty(STDERR_FILENO) != 0;
  control.progress_interval_s = terminal ? 0.25 : 1.0;
  // Quiet for calls under about a second; a terminal gets one line that
  // updates in place, a log one line per report.
  auto shown = std::make_shared<bool>(false);
  control.progress = [terminal, shown](const RunProgress& progress) {
    if (!*shown && (progress.final || progress.elapsed_s < 1.0)) {
      return;
    }
    *shown = true;
    const std::string line = "modar " + progress_line(progress);
    if (terminal) {
      std::fprintf(stderr, "\r%s\033[K%s", line.c_str(), progress.final ? "\n" : "");
      g_progress_line_open = !progress.final;
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    std::fflush(stderr);
  };
  return control;
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

void check_output_path(const std::string& flag, const std::string& output,
                       const std::string& input_what, const std::string& input) {
  if (same_file(output, input)) {
    throw ConfigError(flag + " = " + shown_value(output, 200) + ": is the " + input_what + " " +
                      shown_value(input, 200) +
                      " (same file); allowed: a different path (the input is never overwritten)");
  }
  struct stat info {};
  if (::stat(output.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) {
    throw ConfigError(flag + " = " + shown_value(output, 200) +
                      ": is a directory; allowed: a file path");
  }
}

size_t parse_choice(const std::string& flag, const std::string& text,
                    const std::vector<std::string>& choices) {
  for (size_t i = 0; i < choices.size(); ++i) {
    if (text == choices[i]) {
      return i;
    }
  }
  std::string allowed;
  for (size_t i = 0; i < choices.size(); ++i) {
    allowed += (i == 0 ? "" : (i + 1 == choices.size() ? " or " : ", ")) + choices[i];
  }
  throw ConfigError(flag + " = " + shown_value(text) + ": must be " + allowed);
}

Config load_config_with_overrides(const std::string& path, const std::vector<std::string>& sets) {
  ConfigDocument document = load_config_document(path, sets);
  if (!document.notes.empty()) {
    // A config.json: what was assumed and left out, once, beside the output.
    std::fprintf(stderr, "modar: note: %s\n", shown_value(document.notes, 4000).c_str());
  }
  return std::move(document.config);
}

Config load_config_source(const ParsedArgs& parsed, const std::vector<std::string>& sets) {
  const auto megatron = parsed.value("--megatron-args");
  if (!megatron) {
    if (parsed.positional.empty()) {
      throw ConfigError(
          "missing CONFIG (a TOML file or a Hugging Face config.json), or "
          "--megatron-args TEXT");
    }
    return load_config_with_overrides(parsed.positional[0], sets);
  }
  if (!parsed.positional.empty()) {
    throw ConfigError("--megatron-args: give CONFIG or --megatron-args, not both");
  }
  std::string notes;
  Config config = config_from_megatron_args(*megatron, &notes);
  for (const std::string& assignment : sets) {
    apply_override(config, assignment);
  }
  validate(config);
  std::fprintf(stderr, "modar: note: %s\n", shown_value(notes, 4000).c_str());
  return config;
}

Table::Table(std::vector<std::string> header) : header_(std::move(header)) {}

void Table::add_row(std::vector<std::string> cells) {
  cells.resize(header_.size());
  rows_.push_back(std::move(cells));
}

void Table::add_rule() {
  rows_.emplace_back();
}

std::string Table::render() const {
  std::vector<size_t> widths(header_.size());
  for (size_t c = 0; c < header_.size(); ++c) {
    widths[c] = header_[c].size();
    for (const auto& row : rows_) {
      if (!row.empty()) {
        widths[c] = std::max(widths[c], row[c].size());
      }
    }
  }
  auto is_numeric = [](const std::string& cell) {
    return !cell.empty() &&
           (std::isdigit(static_cast<unsigned char>(cell[0])) ||
            ((cell[0] == '-' || cell[0] == '+' || cell[0] == '.') && cell.size() > 1));
  };
  std::string out;
  auto emit_row = [&](const std::vector<std::string>& row, bool header) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const size_t pad = widths[c] - row[c].size();
      const bool right = !header && c > 0 && is_numeric(row[c]);
      if (c > 0) {
        line += "  ";
      }
      line += right ? std::string(pad, ' ') + row[c] : row[c] + std::string(pad, ' ');
    }
    while (!line.empty() && line.back() == ' ') {
      line.pop_back();
    }
    out += line + "\n";
  };
  size_t total_width = 0;
  for (size_t c = 0; c < widths.size(); ++c) {
    total_width += widths[c] + (c ? 2 : 0);
  }
  emit_row(header_, true);
  out += std::string(total_width, '-') + "\n";
  for (const auto& row : rows_) {
    if (row.empty()) {
      out += std::string(total_width, '-') + "\n";
    } else {
      emit_row(row, false);
    }
  }
  return out;
}

}  // namespace modar::cli
