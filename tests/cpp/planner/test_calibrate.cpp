// `modar calibrate`: a synthetic runs file generated from known parameters is
// fitted back to them; leave-one-out checked against a brute-force refit by
// hand on a tiny case; every bad input of the runs CSV is one line naming the
// row, the column, the value and what is allowed; the CLI never overwrites an
// input and its profile is accepted by estimate, optimal and sweep.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../common/cli_run.hpp"
#include "modar/base/errors.hpp"
#include "modar/calibrate.hpp"
#include "modar/profile.hpp"

namespace {

// Runs that stress different parameters: compute-bound GEMMs (bf16 and
// fp32), memory-bound unfused attention and gradient accumulation, tensor
// parallelism inside a node, data parallelism across nodes with the
// gradient reduce exposed.
const char* const kRunsCsv =
    "name,config,overrides,step_s\n"
    "wide,,model.d_model=4096 model.n_heads=32 model.n_layers=2 train.micro_batch=2,1\n"
    "narrow-unfused,,model.d_model=512 model.n_heads=8 model.n_layers=2 model.seq_len=4096 "
    "train.micro_batch=4 train.attention_kernel=unfused,1\n"
    "tp8,,model.n_layers=2 parallel.tensor=8 device.count=8 train.micro_batch=1,1\n"
    "dp16,,model.n_layers=2 device.count=16 parallel.overlap_grad_reduce=false "
    "train.micro_batch=1 train.global_batch=16,1\n"
    "fp32,,train.dtype=fp32 model.d_model=1024 model.n_layers=2 train.micro_batch=2,1\n"
    "accumulate,,model.d_model=1024 model.n_layers=4 train.micro_batch=4 "
    "train.grad_accumulation=unfused train.global_batch=32,1\n"
    "tp4-dp8,,parallel.tensor=4 device.count=32 model.n_layers=2 "
    "parallel.overlap_grad_reduce=false train.global_batch=32 train.micro_batch=1,1\n"
    "tp2-big,,model.d_model=8192 model.n_heads=64 model.n_layers=1 train.micro_batch=1 "
    "parallel.tensor=2 device.count=2,1\n";

const std::vector<std::pair<std::string, double>> kTruthFactors = {
    {"kernel.gemm_efficiency", 0.8},
    {"kernel.attention_efficiency", 0.7},
    {"kernel.memory_efficiency", 0.9},
    {"kernel.collective_efficiency_intra_node", 0.75},
    {"kernel.collective_efficiency_inter_node", 0.6},
};

// The runs with their step times replaced by the predictions of `profile`
// times a per-run factor.
std::vector<modar::CalibrationRun> measured_on(std::vector<modar::CalibrationRun> runs,
                                               const modar::DeviceProfile& profile,
                                               const std::vector<double>& factors = {}) {
  const std::vector<double> times = modar::predicted_step_times(runs, profile);
  for (size_t i = 0; i < runs.size(); ++i) {
    runs[i].step_s = times[i] * (factors.empty() ? 1.0 : factors[i]);
  }
  return runs;
}

modar::DeviceProfile truth_profile(const modar::DeviceProfile& base) {
  modar::DeviceProfile truth = base;
  for (const auto& [name, factor] : kTruthFactors) {
    modar::set_calibration_parameter(truth, name,
                                     factor * modar::calibration_parameter_value(base, name));
  }
  return truth;
}

TEST(Calibrate, RecoversKnownParametersFromSyntheticRuns) {
  const modar::DeviceProfile base = modar::load_profile("a100-80gb-dgx");
  const auto runs =
      measured_on(modar::parse_calibration_runs(kRunsCsv, "synthetic.csv"), truth_profile(base));
  const modar::CalibrateOptions options =
      modar::resolve_calibrate_options(modar::CalibrateRequest{}, base);
  const modar::CalibrationResult result = modar::calibrate(runs, base, options);
  ASSERT_EQ(result.parameters.size(), kTruthFactors.size());
  for (size_t j = 0; j < kTruthFactors.size(); ++j) {
    const auto& f = result.parameters[j];
    ASSERT_EQ(f.name, kTruthFactors[j].first);
    EXPECT_TRUE(f.determined) << f.name;
    EXPECT_NEAR(f.value / f.base_value, kTruthFactors[j].second, 1e-3) << f.name;
  }
  EXPECT_TRUE(result.converged);
  EXPECT_LT(result.max_abs_error, 1e-5);
  ASSERT_TRUE(result.loo_max_abs_error.has_value());
  EXPECT_LT(*result.loo_max_abs_error, 1e-4);
  // The base profile was off by the factors: its residual was not small.
  EXPECT_GT(result.base_rms_log_residual, 0.05);
  // The written profile times the runs as measured.
  const std::vector<double> again = modar::predicted_step_times(runs, result.profile);
  for (size_t i = 0; i < runs.size(); ++i) {
    EXPECT_NEAR(again[i] / runs[i].step_s, 1.0, 1e-5) << runs[i].name;
  }
  EXPECT_EQ(result.profile.name, "a100-80gb-dgx-calibrated");
  EXPECT_NE(result.profile.provenance.count("calibration_parameter.kernel.memory_efficiency"), 0u);
  EXPECT_NE(result.profile.provenance.count("calibration_run.0008"), 0u);
}

// The per-step and per-micro-batch host overheads start at 0 s in the base
// profile; runs with 1 to 8 micro-batches per step tell them apart.
TEST(Calibrate, RecoversPerStepAndPerMicroBatchOverheads) {
  const modar::DeviceProfile base = modar::load_profile("a100-80gb-dgx");
  modar::DeviceProfile truth = base;
  modar::set_calibration_parameter(
      truth, "kernel.gemm_efficiency",
      0.8 * modar::calibration_parameter_value(base, "kernel.gemm_efficiency"));
  modar::set_calibration_parameter(truth, "kernel.step_overhead_s", 0.03);
  modar::set_calibration_parameter(truth, "kernel.micro_batch_overhead_s", 0.004);
  const auto runs = measured_on(modar::parse_calibration_runs(kRunsCsv, "synthetic.csv"), truth);
  modar::CalibrateRequest request;
  request.parameters = std::vector<std::string>{"kernel.gemm_efficiency", "kernel.step_overhead_s",
                                                "kernel.micro_batch_overhead_s"};
  request.leave_one_out = false;
  const auto result = modar::calibrate(runs, base, modar::resolve_calibrate_options(request, base));
  ASSERT_EQ(result.parameters.size(), 3u);
  EXPECT_EQ(result.parameters[1].base_value, 0.0);
  EXPECT_NEAR(result.parameters[0].value / result.parameters[0].base_value, 0.8, 1e-3);
  EXPECT_NEAR(result.parameters[1].value, 0.03, 0.03 * 1e-3);
  EXPECT_NEAR(result.parameters[2].value, 0.004, 0.004 * 1e-3);
  EXPECT_LT(result.max_abs_error, 1e-5);
}

// kernel.gemm_quantization (the share of the GEMM model's tile / wave loss):
// the synthetic runs' GEMMs differ in how well they fill the A100's waves, so
// a profile that pays 40 % of the loss at 0.7 of the peak is found again
// from the datasheet profile (the loss in full at 0.795).
TEST(Calibrate, RecoversTheGemmQuantizationShare) {
  const modar::DeviceProfile base = modar::load_profile("a100-80gb-dgx-datasheet");
  modar::DeviceProfile truth = base;
  modar::set_calibration_parameter(truth, "kernel.gemm_efficiency", 0.7);
  modar::set_calibration_parameter(truth, "kernel.gemm_quantization", 0.4);
  const auto runs = measured_on(modar::parse_calibration_runs(kRunsCsv, "synthetic.csv"), truth);
  modar::CalibrateRequest request;
  request.parameters =
      std::vector<std::string>{"kernel.gemm_efficiency", "kernel.gemm_quantization"};
  request.leave_one_out = false;
  const auto result = modar::calibrate(runs, base, modar::resolve_calibrate_options(request, base));
  ASSERT_EQ(result.parameters.size(), 2u);
  EXPECT_EQ(result.parameters[1].base_value, 1.0);
  EXPECT_NEAR(result.parameters[0].value, 0.7, 0.7e-3);
  EXPECT_NEAR(result.parameters[1].value, 0.4, 0.4e-3);
  EXPECT_LT(result.max_abs_error, 1e-5);
}

// Minimise sum_j log^2(predicted_j(theta) / measured_j) over one parameter by
// golden-section search in log(theta): the leave-one-out refit by hand.
double brute_force_fit(const std::vector<modar::CalibrationRun>& runs,
                       const modar::DeviceProfile& base, const std::string& name) {
  const auto cost = [&](double log_theta) {
    modar::DeviceProfile p = base;
    modar::set_calibration_parameter(p, name, std::exp(log_theta));
    const std::vector<double> predicted = modar::predicted_step_times(runs, p);
    double sum = 0.0;
    for (size_t i = 0; i < runs.size(); ++i) {
      sum += std::pow(std::log(predicted[i] / runs[i].step_s), 2);
    }
    return sum;
  };
  const double center = std::log(modar::calibration_parameter_value(base, name));
  const double high = std::log(modar::calibration_parameter_range(base, name).second);
  double a = center - std::log(4.0), b = std::min(center + std::log(2.0), high);
  const double phi = 0.5 * (std::sqrt(5.0) - 1.0);
  double c = b - phi * (b - a), d = a + phi * (b - a);
  double fc = cost(c), fd = cost(d);
  while (b - a > 1e-10) {
    if (fc < fd) {
      b = d, d = c, fd = fc, c = b - phi * (b - a), fc = cost(c);
    } else {
      a = c, c = d, fc = fd, d = a + phi * (b - a), fd = cost(d);
    }
  }
  return std::exp(0.5 * (a + b));
}

TEST(Calibrate, LeaveOneOutMatchesARefitByHand) {
  const modar::DeviceProfile base = modar::load_profile("a100-80gb-dgx");
  const std::string name = "kernel.gemm_efficiency";
  const auto all = modar::parse_calibration_runs(kRunsCsv, "synthetic.csv");
  const std::vector<modar::CalibrationRun> tiny = {all[0], all[5], all[7]};
  const auto runs = measured_on(tiny, truth_profile(base), {1.04, 0.97, 1.01});
  modar::CalibrateRequest request;
  request.parameters = std::vector<std::string>{name};
  const modar::CalibrationResult result =
      modar::calibrate(runs, base, modar::resolve_calibrate_options(request, base));
  // The full fit by hand.
  EXPECT_NEAR(result.parameters[0].value / brute_force_fit(runs, base, name), 1.0, 1e-6);
  for (size_t out = 0; out < runs.size(); ++out) {
    std::vector<modar::CalibrationRun> others;
    for (size_t i = 0; i < runs.size(); ++i) {
      if (i != out) {
        others.push_back(runs[i]);
      }
    }
    modar::DeviceProfile refit = base;
    modar::set_calibration_parameter(refit, name, brute_force_fit(others, base, name));
    const double by_hand = modar::predicted_step_times({runs[out]}, refit)[0];
    ASSERT_TRUE(result.runs[out].loo_predicted_s.has_value());
    EXPECT_NEAR(*result.runs[out].loo_predicted_s / by_hand, 1.0, 1e-6) << runs[out].name;
    EXPECT_NEAR(*result.runs[out].loo_error, by_hand / runs[out].step_s - 1.0, 1e-6);
  }
  // One parameter for three runs with +4 / -3 / +1 % offsets: the fit cannot
  // match all of them, and leaving a run out moves its prediction away.
  EXPECT_GT(result.max_abs_error, 0.01);
  EXPECT_GT(*result.loo_max_abs_error, result.max_abs_error);
}

TEST(Calibrate, RefusesFewerRunsThanFreeParameters) {
  const modar::DeviceProfile base = modar::load_profile("a100-80gb-dgx");
  const auto all = modar::parse_calibration_runs(kRunsCsv, "synthetic.csv");
  const auto runs = measured_on({all[2], all[3]}, base);  // tp8, dp16
  modar::CalibrateRequest request;
  request.parameters =
      std::vector<std::string>{"kernel.gemm_efficiency", "kernel.memory_efficiency",
                               "kernel.collective_efficiency_intra_node"};
  try {
    modar::calibrate(runs, base, modar::resolve_calibrate_options(request, base));
    FAIL() << "2 runs for 3 parameters were accepted";
  } catch (const modar::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("2 runs for 3 free parameters"), std::string::npos)
        << e.what();
  }
}

TEST(Calibrate, AParameterNoRunDependsOnIsKeptAndReported) {
  const modar::DeviceProfile base = modar::load_profile("a100-80gb-dgx");
  const auto all = modar::parse_calibration_runs(kRunsCsv, "synthetic.csv");
  const auto runs = measured_on({all[0], all[1]}, base, {1.1, 1.05});  // single-GPU runs
  modar::CalibrateRequest request;
  request.parameters =
      std::vector<std::string>{"kernel.gemm_efficiency", "kernel.collective_efficiency_inter_node"};
  const auto result = modar::calibrate(runs, base, modar::resolve_calibrate_options(request, base));
  EXPECT_TRUE(result.parameters[0].determined);
  EXPECT_FALSE(result.parameters[1].determined);
  EXPECT_EQ(result.parameters[1].value, result.parameters[1].base_value);
  ASSERT_FALSE(result.notes.empty());
  EXPECT_NE(result.notes[0].find("kernel.collective_efficiency_inter_node: no run's step time"),
            std::string::npos);
}

TEST(Calibrate, OptionsErrorsNameTheField) {
  const modar::DeviceProfile base = modar::load_profile("a100-80gb-dgx");
  const auto message = [&](const modar::CalibrateRequest& request) {
    try {
      modar::resolve_calibrate_options(request, base);
    } catch (const modar::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  modar::CalibrateRequest r;
  r.parameters = std::vector<std::string>{"kernel.gemm_eficiency"};
  EXPECT_NE(message(r).find("did you mean 'kernel.gemm_efficiency'"), std::string::npos)
      << message(r);
  r.parameters = std::vector<std::string>{};
  EXPECT_NE(message(r).find("parameters: empty"), std::string::npos) << message(r);
  r.parameters = std::vector<std::string>{"kernel.memory_efficiency", "kernel.memory_efficiency"};
  EXPECT_NE(message(r).find("named twice"), std::string::npos) << message(r);
  r = {};
  r.max_iterations = 0;
  EXPECT_NE(message(r).find("max_iterations = 0: must be in [1, 10000]"), std::string::npos);
  r = {};
  r.name = "a\"b";
  EXPECT_NE(message(r).find("name = 'a\"b'"), std::string::npos) << message(r);
}

// ---- the embedded A100: calibrated on Megatron Table 1's fitted rows only ------

std::string table1_file(const std::string& name) {
  return std::string(MODAR_SOURCE_DIR) + "/examples/cluster/" + name;
}

// The parameters an embedded calibrated profile was fitted with: the --fit
// list of its provenance's command (none: calibrate's defaults).
std::vector<std::string> embedded_fit_parameters(const std::string& profile = "a100-80gb-dgx") {
  const std::string command = modar::load_profile(profile).provenance.at("calibration_command");
  const size_t at = command.find("--fit ");
  if (at == std::string::npos) {
    return modar::default_calibration_parameters();
  }
  const size_t begin = at + 6;
  const std::string list = command.substr(begin, command.find(' ', begin) - begin);
  std::vector<std::string> names;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    names.push_back(list.substr(start, comma - start));
    start = comma + 1;
  }
  return names;
}

// The embedded calibrated profile holds what its command writes: the same
// fit redone here from the base profile and the fit rows gives its [kernel]
// values (relative 1e-6; a value at its bound 0, kernel.gemm_quantization: 1e-9).
void expect_embedded_is_the_refit(const std::string& name, const std::string& base_name,
                                  const std::vector<modar::CalibrationRun>& fit_runs) {
  const modar::DeviceProfile embedded = modar::load_profile(name);
  const modar::DeviceProfile base = modar::load_profile(base_name);
  modar::CalibrateRequest request;
  request.parameters = embedded_fit_parameters(name);
  request.leave_one_out = false;
  const auto redone =
      modar::calibrate(fit_runs, base, modar::resolve_calibrate_options(request, base));
  ASSERT_EQ(redone.parameters.size(), request.parameters->size());
  for (const auto& p : redone.parameters) {
    EXPECT_NEAR(modar::calibration_parameter_value(embedded, p.name), p.value,
                1e-6 * std::max(std::abs(p.value), 1e-3))
        << name << " " << p.name;
  }
}

// docs/validation.md: calibrate on the whole table from the uncalibrated
// (datasheet + GPU kernel model) profile, with the embedded profile's
// parameters (reached: 3.6 % and 7.1 %), predicts each row, left out of its
// own fit, within the targets: median 4 %, maximum 8 %.
TEST(CalibrateMegatronTable1, LeaveOneOutMedianFourPercent) {
  const modar::DeviceProfile base = modar::load_profile("a100-80gb-dgx-datasheet");
  const auto runs = modar::load_calibration_runs(table1_file("megatron_table1_runs.csv"));
  ASSERT_EQ(runs.size(), 10u);
  modar::CalibrateRequest request;
  request.parameters = embedded_fit_parameters();
  const auto result = modar::calibrate(runs, base, modar::resolve_calibrate_options(request, base));
  ASSERT_TRUE(result.loo_median_abs_error.has_value());
  EXPECT_LE(*result.loo_median_abs_error, 0.04);
  EXPECT_LE(*result.loo_max_abs_error, 0.08);
}

// The embedded a100-80gb-dgx is what its provenance's command writes: the
// same fit redone here from the datasheet profile and the fit rows gives its
// [kernel] values, and none of the rows reported as held out was fitted.
TEST(CalibrateMegatronTable1, EmbeddedProfileIsItsProvenanceCommandOnTheFitRowsOnly) {
  const modar::DeviceProfile embedded = modar::load_profile("a100-80gb-dgx");
  const std::string command = embedded.provenance.at("calibration_command");
  EXPECT_NE(command.find("megatron_table1_fit.csv"), std::string::npos) << command;
  EXPECT_NE(command.find("a100-80gb-dgx-datasheet"), std::string::npos) << command;
  for (const auto& [key, value] : embedded.provenance) {
    if (key.rfind("calibration_run.", 0) == 0) {
      for (const char* held_out : {"gpt-3.6b:", "gpt-76.1b:", "gpt-529.6b:"}) {
        EXPECT_NE(value.rfind(held_out, 0), 0u) << key << " = " << value;
      }
    }
  }
  const auto fit_runs = modar::load_calibration_runs(table1_file("megatron_table1_fit.csv"));
  ASSERT_EQ(fit_runs.size(), 7u);
  expect_embedded_is_the_refit("a100-80gb-dgx", "a100-80gb-dgx-datasheet", fit_runs);
}

// ---- the embedded H100: calibrated on NVIDIA's published runs it names ---------

// h100-80gb-dgx is what its provenance's command writes from the datasheet
// profile and examples/cluster/hopper_runs_fit.csv (the six rows marked
// calibration in hopper_runs.csv); no other published run is among them.
TEST(CalibrateHopper, EmbeddedH100IsItsProvenanceCommandOnTheCalibrationRowsOnly) {
  const modar::DeviceProfile embedded = modar::load_profile("h100-80gb-dgx");
  const std::string command = embedded.provenance.at("calibration_command");
  EXPECT_NE(command.find("hopper_runs_fit.csv"), std::string::npos) << command;
  EXPECT_NE(command.find("h100-80gb-dgx-datasheet"), std::string::npos) << command;
  const auto fit_runs = modar::load_calibration_runs(table1_file("hopper_runs_fit.csv"));
  ASSERT_EQ(fit_runs.size(), 6u);
  size_t listed = 0;
  for (const auto& [key, value] : embedded.provenance) {
    if (key.rfind("calibration_run.", 0) == 0) {
      ++listed;
      EXPECT_NE(value.rfind(fit_runs[listed - 1].name + ":", 0), std::string::npos)
          << key << " = " << value;
      for (const char* held_out : {"GPT-3", "Nemotron", "Llama 3.1 8B 16x", "Llama 3.1 70B 128x"}) {
        EXPECT_NE(value.rfind(held_out, 0), 0u) << key << " = " << value;
      }
    }
  }
  EXPECT_EQ(listed, fit_runs.size());
  expect_embedded_is_the_refit("h100-80gb-dgx", "h100-80gb-dgx-datasheet", fit_runs);
}

// h200 and h800-80gb-hgx carry h100-80gb-dgx's fitted GEMM and attention
// efficiencies (the same SM; their provenance says so): a refit of the H100
// must be carried over to them too.
TEST(CalibrateHopper, H200AndH800CarryTheH100Efficiencies) {
  const modar::DeviceProfile h100 = modar::load_profile("h100-80gb-dgx");
  for (const char* name : {"h200", "h800-80gb-hgx"}) {
    const modar::DeviceProfile other = modar::load_profile(name);
    for (const char* key : {"kernel.gemm_efficiency", "kernel.attention_efficiency"}) {
      EXPECT_DOUBLE_EQ(modar::calibration_parameter_value(other, key),
                       modar::calibration_parameter_value(h100, key))
          << name << " " << key;
    }
    EXPECT_NE(other.provenance.at("gemm_efficiency").find("h100-80gb-dgx"), std::string::npos)
        << name;
  }
}

// ---- the runs CSV: every bad input is one line naming row, column, value ----

std::string parse_error(const std::string& csv, const std::string& dir = ".") {
  try {
    modar::parse_calibration_runs(csv, "runs.csv", dir);
  } catch (const modar::FileError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    return what;
  }
  return "accepted";
}

TEST(CalibrationRuns, EachBadInputIsOneLineNamingRowColumnAndValue) {
  const std::string header = "name,config,overrides,step_s\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "runs.csv: empty; expected a header line"},
      {header, "runs.csv: a header and no runs"},
      {"name,config,overrides,stepz\n",
       "runs.csv:1: header column 'stepz' is not known (did you mean 'step_s'?)"},
      {"name,config,overrides\n", "runs.csv:1: the header lacks the column 'step_s'"},
      {"name,config,overrides,step_s,name\n", "runs.csv:1: header column 'name' appears twice"},
      {header + "a,,,1,2\n", "runs.csv:2: 5 fields, but the header has 4"},
      {header + ",,,1\n", "runs.csv:2: column 'name' = '': must be a non-empty name"},
      {header + "a,,,1\na,,,2\n",
       "runs.csv:3: row 'a', column 'name' = 'a': already used at line 2"},
      {header + "a,,,fast\n",
       "runs.csv:2: row 'a', column 'step_s' = 'fast': must be a positive decimal number of "
       "seconds"},
      {header + "a,,,-1\n", "row 'a', column 'step_s' = '-1': must be a positive"},
      {header + "a,,,0\n", "row 'a', column 'step_s' = '0': must be a positive"},
      {header + "a,,,nan\n", "row 'a', column 'step_s' = 'nan': must be a positive"},
      {header + "a,,,1e400\n", "row 'a', column 'step_s' = '1e400': must be a positive"},
      {"name,config,overrides,step_s,peak_memory_gib\na,,,1,-3\n",
       "row 'a', column 'peak_memory_gib' = '-3': must be empty or a positive decimal number"},
      {header + "a,,mod.capcity=0.5,1\n",
       "row 'a', column 'overrides' = 'mod.capcity=0.5': unknown key 'mod.capcity'"},
      {header + "a,,model.d_model,1\n",
       "row 'a', column 'overrides' = 'model.d_model': override model.d_model: must be "
       "section.key=value"},
      {header + "a,,mod.capacity=1.5,1\n",
       "row 'a', columns 'config' = '' and 'overrides' = 'mod.capacity=1.5': mod.capacity = "
       "1.5: must be in (0, 1]"},
      {header + "a,missing.toml,,1\n", "row 'a', column 'config' = 'missing.toml': "},
      {header + "\"a,,,1\n", "runs.csv:2: unterminated or misplaced double quote"},
  };
  for (const auto& [csv, expected] : cases) {
    EXPECT_NE(parse_error(csv).find(expected), std::string::npos)
        << "input:\n"
        << csv << "\nerror: " << parse_error(csv);
  }
}

TEST(CalibrationRuns, QuotingOrderCommentsAndConfigPaths) {
  const std::string dir = modar_test::temp_path_for("calibrate_runs_", "dir");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/small.toml") << "[model]\nd_model = 256\nn_layers = 2\nn_heads = 4\n";
  const std::string csv =
      "\xEF\xBB\xBF# measured on our cluster\r\n"
      "Step_S,NAME,Overrides,Config,peak_memory_gib\r\n"
      "\r\n"
      "1.5,\"run, \"\"one\"\"\",\"model.n_layers=4  train.micro_batch=2\",small.toml,\r\n"
      "0.25,two,,,7.5\n";
  const auto runs = modar::parse_calibration_runs(csv, "runs.csv", dir);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].name, "run, \"one\"");
  EXPECT_EQ(runs[0].line, 4);
  EXPECT_DOUBLE_EQ(runs[0].step_s, 1.5);
  EXPECT_FALSE(runs[0].peak_memory_gib.has_value());
  EXPECT_EQ(runs[0].overrides,
            (std::vector<std::string>{"model.n_layers=4", "train.micro_batch=2"}));
  EXPECT_EQ(runs[0].config.model.d_model, 256);  // from the file
  EXPECT_EQ(runs[0].config.model.n_layers, 4);   // the override wins
  EXPECT_EQ(runs[0].config.train.micro_batch, 2);
  EXPECT_EQ(runs[1].config.model.d_model, modar::Config{}.model.d_model);  // defaults
  ASSERT_TRUE(runs[1].peak_memory_gib.has_value());
  EXPECT_DOUBLE_EQ(*runs[1].peak_memory_gib, 7.5);
  std::filesystem::remove_all(dir);
}

// ---- the CLI -------------------------------------------------------------------

class CalibrateCli : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = modar_test::temp_path_for("calibrate_cli_", "dir");
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ + "/model.toml")
        << "[model]\nd_model = 1024\nn_layers = 2\nn_heads = 8\nseq_len = 1024\n";
    std::ofstream(dir_ + "/runs.csv") << "name,config,overrides,step_s\n"
                                      << "one,model.toml,train.micro_batch=1,0.02\n"
                                      << "two,model.toml,train.micro_batch=4,0.07\n"
                                      << "three,model.toml,model.n_layers=4,0.05\n";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  modar_test::CliResult run(const std::string& arguments) {
    return modar_test::run_cli(dir_ + "/cli", "cd " + dir_ + " && ", arguments);
  }
  std::string dir_;
};

TEST_F(CalibrateCli, WritesAProfileThatEstimateOptimalAndSweepAccept) {
  const auto fit =
      run("calibrate runs.csv --profile a100-80gb-dgx --out cal.toml --quiet "
          "--fit kernel.gemm_efficiency");
  ASSERT_EQ(fit.exit_code, 0) << fit.err;
  EXPECT_NE(fit.out.find("leave-one-out |error| median"), std::string::npos) << fit.out;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/cal.toml.tmp"));
  const modar::DeviceProfile calibrated = modar::load_profile(dir_ + "/cal.toml");
  EXPECT_EQ(calibrated.name, "a100-80gb-dgx-calibrated");
  EXPECT_EQ(calibrated.provenance.at("calibration_command"),
            "modar calibrate runs.csv --profile a100-80gb-dgx --fit kernel.gemm_efficiency "
            "--out cal.toml");
  EXPECT_EQ(run("estimate model.toml --profile cal.toml").exit_code, 0);
  EXPECT_EQ(run("optimal --flops 1e19 --profile cal.toml --arch baseline").exit_code, 0);
  const auto sweep = run("sweep --flops 6e18 --profile cal.toml --arch baseline");
  EXPECT_EQ(sweep.exit_code, 0) << sweep.err;
}

TEST_F(CalibrateCli, NeverOverwritesAnInputAndRefusesBadInputInOneLine) {
  const std::string runs_before = modar_test::slurp(dir_ + "/runs.csv");
  const std::string config_before = modar_test::slurp(dir_ + "/model.toml");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"calibrate runs.csv --profile a100-80gb-dgx --out runs.csv",
       "--out = runs.csv: is the runs file"},
      {"calibrate runs.csv --profile a100-80gb-dgx --out model.toml",
       "--out = model.toml: is the config file"},
      {"calibrate runs.csv --profile a100-80gb-dgx --out .", "is a directory"},
      {"calibrate runs.csv --out x.toml", "--profile: required"},
      {"calibrate runs.csv --profile a100-80gb-dgx", "--out: required"},
      {"calibrate runs.csv --profile a100-80gb-dgx --out x.toml --fit nope",
       "parameter 'nope': no such profile parameter"},
      {"calibrate two.csv --profile a100-80gb-dgx --out x.toml --fit "
       "kernel.gemm_efficiency,kernel.memory_efficiency,ceilings.launch_overhead_s",
       "2 runs for 3 free parameters"},
  };
  std::ofstream(dir_ + "/two.csv") << "name,config,overrides,step_s\n"
                                   << "one,model.toml,train.micro_batch=1,0.02\n"
                                   << "two,model.toml,train.micro_batch=4,0.07\n";
  for (const auto& [arguments, expected] : cases) {
    const auto r = run(arguments);
    EXPECT_EQ(r.exit_code, 2) << arguments;
    EXPECT_NE(r.err.find(expected), std::string::npos) << arguments << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/x.toml"));
  EXPECT_EQ(modar_test::slurp(dir_ + "/runs.csv"), runs_before);
  EXPECT_EQ(modar_test::slurp(dir_ + "/model.toml"), config_before);
  std::ofstream(dir_ + "/bad.csv") << "name,config,overrides,step_s\none,model.toml,,slow\n";
  const auto bad = run("calibrate bad.csv --profile a100-80gb-dgx --out x.toml");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("bad.csv:2: row 'one', column 'step_s' = 'slow'"), std::string::npos)
      << bad.err;
}

}  // namespace
