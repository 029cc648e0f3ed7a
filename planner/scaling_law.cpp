// Parametric loss model L(N_f, D) = E + s_p A / N_f^alpha + s_d B / D^beta (an
// architecture's prior eps in s_p, or in both for MoD: planner/priors.cpp): the
// built-in fits, fit files, and the closed-form compute-optimal allocation
// (Hoffmann et al. 2022 eq. 4; docs/planner.md).
#include <toml++/toml.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "../cost_models/toml_text.hpp"
#include "modar/base/errors.hpp"
#include "modar/base/files.hpp"
#include "modar/base/text.hpp"
#include "modar/planner.hpp"

namespace modar {

namespace {

LossFit epoch_fit() {
  LossFit fit;
  fit.name = "epoch";
  fit.source =
      "Besiroglu et al. 2024, 'Chinchilla Scaling: A replication attempt' (arXiv 2404.10102), "
      "Epoch AI refit of Hoffmann et al.'s approach 3";
  fit.params = {1.8172, 482.01, 2085.43, 0.3478, 0.3658};
  fit.standard_errors = LossFitParams{0.03, 124.58, 1293.23, 0.02, 0.02};
  return fit;
}

LossFit hoffmann_fit() {
  LossFit fit;
  fit.name = "hoffmann";
  fit.source =
      "Hoffmann et al. 2022, 'Training Compute-Optimal Large Language Models' "
      "(arXiv 2203.15556), approach 3, constants as printed";
  fit.params = {1.69, 406.4, 410.7, 0.34, 0.28};
  return fit;
}

bool looks_like_path(const std::string& s) {
  return s.find('/') != std::string::npos || s.find('.') != std::string::npos;
}

void check_params(const LossFitParams& p, const std::string& where) {
  const auto bad = [&](const char* field, double value, const char* allowed) {
    throw FileError(where + ": fit." + field + " = " + format_number(value) + ": must be " +
                    allowed);
  };
  if (!std::isfinite(p.E) || p.E < 0)
    bad("E", p.E, "finite and >= 0");
  if (!std::isfinite(p.A) || p.A <= 0)
    bad("A", p.A, "finite and > 0");
  if (!std::isfinite(p.B) || p.B <= 0)
    bad("B", p.B, "finite and > 0");
  if (!std::isfinite(p.alpha) || p.alpha <= 0 || p.alpha > 3)
    bad("alpha", p.alpha, "in (0, 3]");
  if (!std::isfinite(p.beta) || p.beta <= 0 || p.beta > 3)
    bad("beta", p.beta, "in (0, 3]");
}

LossFitParams read_params(const toml::table& table, const std::string& where,
                          const std::string& section) {
  LossFitParams p;
  const std::pair<const char*, double*> fields[] = {
      {"E", &p.E}, {"A", &p.A}, {"B", &p.B}, {"alpha", &p.alpha}, {"beta", &p.beta}};
  for (const auto& [key, slot] : fields) {
    const auto value = table[key].value<double>();
    if (!value) {
      throw FileError(where + ": " + section + "." + key +
                      " is missing or not a number; a fit needs E, A, B, alpha, beta");
    }
    *slot = *value;
  }
  return p;
}

}  // namespace

std::vector<std::string> builtin_fit_names() {
  return {"epoch", "hoffmann"};
}

LossFit load_fit(const std::string& name_or_path) {
  if (name_or_path == "epoch" || name_or_path.empty()) {
    return epoch_fit();
  }
  if (name_or_path == "hoffmann") {
    return hoffmann_fit();
  }
  if (!looks_like_path(name_or_path)) {
    throw ConfigError("fit = \"" + shown_value(name_or_path) +
                      "\": unknown fit; allowed: epoch, hoffmann, or a TOML file written by "
                      "`modar fit`");
  }
  // A fit file is a few hundred bytes; the bound refuses /dev/zero-like inputs.
  constexpr uint64_t kMaxFitBytes = uint64_t{16} << 20;
  return parse_fit_toml(read_input_file(name_or_path, "fit file", kMaxFitBytes), name_or_path);
}

LossFit parse_fit_toml(const std::string& toml_text, const std::string& source_name) {
  const toml::table root = detail::parse_toml_text(toml_text, source_name);
  const toml::table* fit_table = root["fit"].as_table();
  if (fit_table == nullptr) {
    throw FileError(source_name + ": no [fit] table; expected a file written by `modar fit`");
  }
  for (const auto& [key, node] : *fit_table) {
    static const char* const kAllowed[] = {"name", "source", "E",    "A",
                                           "B",    "alpha",  "beta", "standard_errors"};
    bool known = false;
    for (const char* allowed : kAllowed) {
      known = known || key.str() == allowed;
    }
    if (!known) {
      throw FileError(source_name + ": unknown key fit." + std::string(key.str()) +
                      "; allowed: name, source, E, A, B, alpha, beta, [fit.standard_errors]");
    }
  }
  LossFit fit;
  fit.name = source_name;
  fit.source = (*fit_table)["source"].value_or(std::string("fit file ") + source_name);
  fit.params = read_params(*fit_table, source_name, "fit");
  check_params(fit.params, source_name);
  if (const toml::table* se = (*fit_table)["standard_errors"].as_table()) {
    fit.standard_errors = read_params(*se, source_name, "fit.standard_errors");
  }
  return fit;
}

std::string to_toml(const LossFit& fit) {
  std::string out = "# Scaling-law fit L(N_f, D) = E + A / N_f^alpha + B / D^beta (modar)\n";
  out += "# N_f = FLOP-active parameters, D = training tokens.\n[fit]\n";
  out += "name = " + toml_quote(fit.name) + "\n";
  out += "source = " + toml_quote(fit.source) + "\n";
  const auto write = [&](const LossFitParams& p) {
    out += "E = " + toml_float_literal(p.E) + "\n";
    out += "A = " + toml_float_literal(p.A) + "\n";
    out += "B = " + toml_float_literal(p.B) + "\n";
    out += "alpha = " + toml_float_literal(p.alpha) + "\n";
    out += "beta = " + toml_float_literal(p.beta) + "\n";
  };
  write(fit.params);
  if (fit.standard_errors) {
    out += "\n[fit.standard_errors]  # bootstrap\n";
    write(*fit.standard_errors);
  }
  return out;
}

void save_fit_atomically(const LossFit& fit, const std::string& path) {
  write_file_atomically(path, to_toml(fit), "fit file");
}

double predicted_loss(const LossFitParams& fit, LossScale scale, double n_flop_active,
                      double tokens) {
  return scale.total * (fit.E + scale.params * fit.A / std::pow(n_flop_active, fit.alpha) +
                        scale.data * fit.B / std::pow(tokens, fit.beta));
}

double predicted_loss(const LossFitParams& fit, double eps, double n_flop_active, double tokens) {
  return predicted_loss(fit, LossScale{eps, 1.0}, n_flop_active, tokens);
}

ClosedFormOptimum closed_form_optimum(const LossFitParams& fit, double train_flops,
                                      LossScale scale) {
  const double sum = fit.alpha + fit.beta;
  ClosedFormOptimum out;
  out.G = std::pow(fit.alpha * scale.params * fit.A / (fit.beta * scale.data * fit.B), 1.0 / sum);
  out.n_opt = out.G * std::pow(train_flops / 6.0, fit.beta / sum);
  out.tokens_opt = std::pow(train_flops / 6.0, fit.alpha / sum) / out.G;
  out.loss = predicted_loss(fit, scale, out.n_opt, out.tokens_opt);
  return out;
}

ClosedFormOptimum closed_form_optimum(const LossFitParams& fit, double train_flops, double eps) {
  return closed_form_optimum(fit, train_flops, LossScale{eps, 1.0});
}

ClosedFormOptimum closed_form_optimum(const ClosedFormRequest& request) {
  if (!request.flops) {
    throw ConfigError("flops: missing; allowed: a training-FLOP budget, e.g. 1e20");
  }
  const double flops = *request.flops;
  if (!std::isfinite(flops) || flops < kMinTrainFlops || flops > kMaxTrainFlops) {
    throw ConfigError("flops = " + format_number(flops) + ": must be a finite number in [" +
                      format_number(kMinTrainFlops) + ", " + format_number(kMaxTrainFlops) + "]");
  }
  const double eps = request.eps.value_or(1.0);
  if (!std::isfinite(eps) || eps < kEpsMin || eps > kEpsMax) {
    throw ConfigError("eps = " + format_number(eps) + ": an efficiency prior must be in [" +
                      format_number(kEpsMin) + ", " + format_number(kEpsMax) +
                      "] (1 = the dense baseline; docs/planner.md \"Architecture priors\")");
  }
  return closed_form_optimum(load_fit(request.fit.value_or("epoch")).params, flops, eps);
}

}  // namespace modar
