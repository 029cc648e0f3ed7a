// Helpers shared by the `modar` subcommands: flag parsing with clear errors,
// strict number parsing, --set overrides, and tables (number and unit
// formatting: modar/base/text.hpp).
//
// Every parse error is a modar::ConfigError whose message names the flag, the
// value and what is allowed; main() prints it on one line with exit code 2.
//
//   const std::vector<FlagSpec> flags = {
//       {"--set", true, true, "KEY=VALUE", "override a config key (repeatable)"},
//       {"--json", false, false, "", "print JSON instead of the report"}};
//   const ParsedArgs parsed = parse_args(args, flags, "estimate", 1, 1);
//   Config config = load_config_with_overrides(parsed.positional[0], parsed.values("--set"));
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "modar/base/errors.hpp"
#include "modar/base/run_control.hpp"
#include "modar/base/text.hpp"
#include "modar/config.hpp"

namespace modar::cli {

struct FlagSpec {
  std::string name;          // "--json", "--set" (long form, with the dashes)
  bool takes_value = false;  // "--flag VALUE" or "--flag=VALUE"
  bool repeatable = false;   // may be given more than once (values kept in order)
  std::string value_name;    // shown in the help, e.g. "KEY=VALUE"
  std::string help;
};

// Flags several commands declare alike, declared once.
// --quiet: no progress lines on stderr.
FlagSpec quiet_flag();
// --set KEY=VALUE: override a config key (repeatable).
FlagSpec set_flag();
// --profile NAME|PATH for a command that reads a config: the device profile
// instead of the config's device.profile.
FlagSpec config_profile_flag();

class ParsedArgs {
 public:
  std::vector<std::string> positional;

  bool has(const std::string& flag) const { return values_.count(flag) > 0; }
  // The value of a flag given once (the last one for repeatable flags).
  std::optional<std::string> value(const std::string& flag) const;
  std::string value_or(const std::string& flag, const std::string& fallback) const;
  // Every value of a repeatable flag, in command-line order (empty if absent).
  const std::vector<std::string>& values(const std::string& flag) const;

  void add(const std::string& flag, const std::string& value) { values_[flag].push_back(value); }

 private:
  std::map<std::string, std::vector<std::string>> values_;
};

// True when args contain -h / --help (check before parse_args).
bool wants_help(const Args& args);

// Parse `args` against `flags`.  Throws ConfigError on an unknown flag (with the
// nearest valid one suggested), a missing value, a repeated non-repeatable
// flag, or a positional count outside [min_positional, max_positional].
ParsedArgs parse_args(const Args& args, const std::vector<FlagSpec>& flags,
                      const std::string& command, size_t min_positional, size_t max_positional,
                      const std::string& positional_name = "argument");

// A help text: "usage: modar <command> <synopsis>" plus one line per flag.
std::string usage_text(const std::string& command, const std::string& synopsis,
                       const std::vector<FlagSpec>& flags, const std::string& description = "");
// When args ask for help (wants_help): prints usage_text(...) on stdout and
// returns true (the command then exits 0).
bool print_help_if_asked(const Args& args, const std::string& command, const std::string& synopsis,
                         const std::vector<FlagSpec>& flags, const std::string& description = "");

// request field = parse(flag, text) when the user gave `flag`; a field whose
// flag was not given stays unset (the library's default).  `parse` is one of
// the parse_* functions below, or any callable (flag, text) -> value.
template <typename Field, typename Parse>
void set_if_given(const ParsedArgs& parsed, const std::string& flag, Field& field, Parse parse) {
  if (const std::optional<std::string> text = parsed.value(flag)) {
    field = parse(flag, *text);
  }
}
// The flag's text as it was typed (for set_if_given).
inline std::string text_as_given(const std::string& /*flag*/, const std::string& text) {
  return text;
}

// Strict numbers: the whole text must be a finite number (no NaN, inf or
// trailing garbage); errors name the flag and the value.
double parse_double(const std::string& flag, const std::string& text);
double parse_positive_double(const std::string& flag, const std::string& text);
int64_t parse_int(const std::string& flag, const std::string& text);
int64_t parse_positive_int(const std::string& flag, const std::string& text);
// An integer in [low, high], range-checked in 64 bits before it is narrowed
// (so 4294967297 is refused, never silently read as 1).
int parse_int_in_range(const std::string& flag, const std::string& text, int64_t low,
                       int64_t high);
// An integer that fits an int (range-checked in 64 bits: "FLAG = TEXT: out of
// range" otherwise); the positive one also refuses 0 and below.
int parse_int32(const std::string& flag, const std::string& text);
int parse_positive_int32(const std::string& flag, const std::string& text);
// A comma-separated list, each item trimmed ("a, b" -> {"a", "b"}); an empty
// item ("a,,b", "a,", "") is a ConfigError naming the flag.
std::vector<std::string> parse_list(const std::string& flag, const std::string& text);
// Index of `text` in `choices`, or ConfigError listing them.
size_t parse_choice(const std::string& flag, const std::string& text,
                    const std::vector<std::string>& choices);

// Config keys and request fields a command's flags set: the library names
// them in its errors, never flags (docs/hardening.md); the CLI names the flag
// the user typed instead.  A dotted config key is replaced wherever it
// appears; a request field (no dot) where the library writes it as a field:
// "gpus = 0", "gpus: ...", "eps[mod] = 1e-300" (-> "--eps mod=1e-300").
struct FlagKey {
  const char* flag;  // "--gpus"
  const char* key;   // "device.count" or "gpus"
};
// `message` with every key whose flag appears in `parsed` replaced by that flag.
std::string name_typed_flags(const std::string& message, const ParsedArgs& parsed,
                             const std::vector<FlagKey>& flag_keys);
// Run `body`; a ConfigError / FileError it throws comes back with the typed
// flags named (name_typed_flags).
template <typename Body>
auto with_typed_flags(const ParsedArgs& parsed, const std::vector<FlagKey>& flag_keys, Body body)
    -> decltype(body()) {
  try {
    return body();
  } catch (const FileError& e) {
    throw FileError(name_typed_flags(e.what(), parsed, flag_keys));
  } catch (const ConfigError& e) {
    throw ConfigError(name_typed_flags(e.what(), parsed, flag_keys));
  }
}

// While alive, Ctrl-C (SIGINT; also SIGTERM, which mpirun sends its ranks on
// a Ctrl-C) sets modar::request_interrupt(): the computation stops at its
// next check (RunReporter, should_stop) and main() exits 130, nothing
// written; a second signal kills the process the default way.
class InterruptScope {
 public:
  InterruptScope();
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;
};

// The RunControl of a long command (optimal, sweep, fit, ...): progress with
// an ETA on stderr once the call has run for about a second (one updating
// line on a terminal, a line every few seconds otherwise; nothing with
// `quiet`).  Ctrl-C reaches the library through InterruptScope's flag, which
// every RunReporter checks.
RunControl progress_on_stderr(bool quiet);
// Ends a progress line a failed or interrupted call left open on a terminal
// (main() calls it before printing the error).
void close_progress_line();

// True when both paths name the same existing file (same device and inode:
// also through symlinks and hard links).
bool same_file(const std::string& a, const std::string& b);
// Refuse an output path that is an input (same_file) or a directory, before
// any work is done.  `flag` names the output flag, `input_what` the input.
void check_output_path(const std::string& flag, const std::string& output,
                       const std::string& input_what, const std::string& input);

// Read CONFIG (TOML or a Hugging Face config.json), apply each
// "section.key=value" in order, validate; a config.json's notes (defaults
// taken, fields not modelled) go to stderr on one line.
Config load_config_with_overrides(const std::string& path, const std::vector<std::string>& sets);
// The configuration of a command that takes CONFIG or --megatron-args TEXT
// (Megatron-LM arguments, docs/export.md): one of the two, then `sets`,
// validated; the reader's notes go to stderr on one line.
Config load_config_source(const ParsedArgs& parsed, const std::vector<std::string>& sets);

// A plain-text table with aligned columns (numbers right-aligned).
class Table {
 public:
  explicit Table(std::vector<std::string> header);
  void add_row(std::vector<std::string> cells);
  // A horizontal rule before the next row (e.g. before a totals row).
  void add_rule();
  std::string render() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;  // an empty row is a rule
};

}  // namespace modar::cli
