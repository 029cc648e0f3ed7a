// `modar fit RUNS.csv`: fit L(N, D) = E + A / N^alpha + B / D^beta to your own
// runs (Huber loss on log-loss, grid of starts, BFGS, bootstrap) and write the
// fit as TOML for `modar optimal --fit PATH`.
#include <cstdio>
#include <string>

#include "cli_util.hpp"
#include "commands.hpp"
#include "modar/base/errors.hpp"
#include "modar/base/text.hpp"
#include "modar/planner.hpp"

namespace modar::cli {

int cmd_fit(const Args& args) {
  const FitOptions d = resolve_fit_options(FitRequest{});
  const std::vector<FlagSpec> flags = {
      {"--output", true, false, "PATH", "fit TOML to write (default: RUNS with .fit.toml)"},
      {"--bootstrap", true, false, "N",
       "bootstrap resamples for the uncertainty (default " + std::to_string(d.bootstrap_samples) +
           ")"},
      {"--seed", true, false, "S", "bootstrap random seed (default " + std::to_string(d.seed) + ")"},
      {"--delta", true, false, "D",
       "Huber delta on log-loss residuals (default " + format_number(d.huber_delta) + ")"},
      {"--json", false, false, "", "print JSON"},
      quiet_flag(),
  };
  if (print_help_if_asked(args, "fit", "RUNS.csv [options]", flags,
                          "RUNS.csv: a header row with columns loss, D (or tokens) and N (FLOP-"
                          "active parameters; or n_flop_active, params) or config (a TOML path "
                          "whose N_f the cost model counts).  Extra columns are ignored.")) {
    return 0;
  }
  const ParsedArgs parsed = parse_args(args, flags, "fit", 1, 1, "RUNS.csv");
  const std::string runs_path = parsed.positional[0];
  // Only what the user said; the library resolves and checks it.
  FitRequest request;
  set_if_given(parsed, "--bootstrap", request.bootstrap_samples, parse_int);
  set_if_given(parsed, "--seed", request.seed, parse_int);
  set_if_given(parsed, "--delta", request.huber_delta, parse_double);
  static const std::vector<FlagKey> kFitFlagKeys = {
      {"--bootstrap", "bootstrap_samples"}, {"--seed", "seed"}, {"--delta", "huber_delta"}};
  const FitOptions options =
      with_typed_flags(parsed, kFitFlagKeys, [&] { return resolve_fit_options(request); });
  std::string output = parsed.value_or("--output", "");
  if (output.empty()) {
    const auto dot = runs_path.rfind('.');
    const auto slash = runs_path.rfind('/');
    const bool has_extension =
        dot != std::string::npos && (slash == std::string::npos || dot > slash);
    output = (has_extension ? runs_path.substr(0, dot) : runs_path) + ".fit.toml";
  }
  // Before any work: the fit never replaces the runs it reads (same inode,
  // also via a symlink or a hard link) nor lands on a directory.
  check_output_path("--output", output, "runs file", runs_path);

  const std::vector<RunRecord> runs = load_runs_csv(runs_path);
  const RunControl control = progress_on_stderr(parsed.has("--quiet"));
  FitResult result;
  {
    const InterruptScope ctrl_c;  // Ctrl-C: exit 130, no file written
    result = fit_runs(runs, options, control);
  }
  result.fit.name = output;
  result.fit.source = "modar fit " + runs_path + ": " + result.fit.source;
  check_output_path("--output", output, "runs file", runs_path);  // (renamed meanwhile?)
  save_fit_atomically(result.fit, output);
  if (parsed.has("--json")) {
    std::fputs((to_json(result) + "\n").c_str(), stdout);
  } else {
    std::fputs(to_text(result).c_str(), stdout);
    const ClosedFormOptimum at_1e20 = closed_form_optimum(result.fit.params, 1e20);
    std::printf(
        "compute-optimal at 1e20 FLOPs under this fit: N* = %.3g, D* = %.3g (%.1f tokens "
        "per parameter)\n",
        at_1e20.n_opt, at_1e20.tokens_opt, at_1e20.tokens_opt / at_1e20.n_opt);
    std::printf("wrote %s (use: modar optimal --fit %s ...)\n", output.c_str(), output.c_str());
  }
  return 0;
}

}  // namespace modar::cli
