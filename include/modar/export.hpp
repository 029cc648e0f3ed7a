// modar/export.hpp: a planned model and layout as a training framework's
// launch arguments (`modar export`), and Megatron-LM arguments read back as a
// config (`--megatron-args`, Config.from_megatron_args).
//
// The argument names are Megatron-LM's megatron/training/arguments.py (the
// version is cited in docs/export.md); settings Megatron-LM has no argument
// for (Mixture-of-Depths, depth residuals, MoDE) are written as a comment
// block, never dropped silently.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "modar/config.hpp"

namespace modar {

// One argument: "--num-layers" with its value ("" for a switch such as
// "--swiglu"), and the comment written above it ("" for none).
struct LaunchArgument {
  std::string name;
  std::string value;
  std::string comment;
};

// A group of arguments as the Megatron-LM example scripts write them
// (GPT_MODEL_ARGS=( ... )).
struct LaunchArgumentGroup {
  std::string name;  // "MODEL_ARGS"
  std::vector<LaunchArgument> arguments;
};

struct LaunchArguments {
  std::vector<std::string> header;  // comment lines first: source, world size
  std::vector<LaunchArgumentGroup> groups;
  std::vector<std::string> not_expressible;  // the modar-only settings, one per line
  // Every argument in order, flattened ("--tensor-model-parallel-size", "8").
  std::vector<std::pair<std::string, std::string>> flat() const;
};

// The Megatron-LM arguments of a validated configuration.  The pipeline
// split is the one modar plans (estimate_cluster, on the config's profile):
// even splits are Megatron's default; a split with different first / last
// stages uses --decoder-first/last-pipeline-num-layers, anything else
// --pipeline-model-parallel-layout.  Throws ConfigError for a configuration
// Megatron-LM cannot run as planned (named by key).
LaunchArguments megatron_arguments(const Config& config, const std::string& source = "");

// Shell text: the header comments, then one bash array per group (one
// argument per line, its comment above it), then the not-expressible block.
std::string render_launch_arguments(const LaunchArguments& arguments);

// Megatron-LM arguments (a command line, or render_launch_arguments()'s
// text: comments, "NAME=(" / ")" and "\" continuations are skipped) read as
// a config.  Not validated (overrides come first).  `notes`: one line saying
// what was assumed (the world size, Megatron defaults modar's model differs
// from) and which arguments were not modelled.  Unknown arguments are listed
// there, never errors; a malformed value is a ConfigError naming the
// argument.
Config config_from_megatron_args(const std::string& text, std::string* notes = nullptr);

// A configuration out of `modar optimal --json`'s document: the
// recommendation of architecture `arch` ("" = the only one) and role
// ("isoflop_optimal" or "parity_fastest").  Throws ConfigError naming what is
// missing or ambiguous, FileError when `json_text` is not such a document.
Config config_from_recommendation_json(const std::string& json_text, const std::string& arch,
                                       const std::string& role, const std::string& source);

}  // namespace modar
