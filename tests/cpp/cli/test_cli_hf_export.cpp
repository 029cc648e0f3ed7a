// `modar estimate config.json` (a Hugging Face config), `modar export` and
// `--megatron-args` end to end: the published MoE counts through the CLI,
// the one-line note, one-line errors (exit 2) and the exported arguments.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "../common/cli_run.hpp"
#include "../common/hf_configs.hpp"
#include "modar/base/json.hpp"

namespace {

using modar_test::CliResult;

CliResult run(const std::string& arguments) {
  return modar_test::run_cli_numbered("modar_hf_cli_", "", arguments);
}

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = modar_test::temp_path_for("modar_hf_cli_", name);
  std::ofstream(path) << text;
  return path;
}

// The number after "key": in a JSON document (the first occurrence).
double json_number(const std::string& json, const std::string& key) {
  const size_t at = json.find("\"" + key + "\":");
  if (at == std::string::npos) {
    ADD_FAILURE() << key << " not in " << json.substr(0, 200);
    return NAN;
  }
  return std::stod(json.substr(at + key.size() + 3));
}

size_t lines(const std::string& text) {
  size_t n = 0;
  for (const char ch : text) {
    n += ch == '\n' ? 1 : 0;
  }
  return n;
}

TEST(CliHfExport, EstimateReadsTheFourMoeConfigs) {
  for (const modar_test::PublishedMoe& model : modar_test::kPublishedMoe) {
    SCOPED_TRACE(model.name);
    const std::string path = write_file(std::string(model.name) + ".json", model.config_json);
    const CliResult r = run("estimate " + path + " --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const double total = json_number(r.out, "total");
    const double active = json_number(r.out, "active");
    EXPECT_LE(std::fabs(total / model.total - 1.0), 0.005) << total;
    EXPECT_LE(std::fabs(active - model.active), model.active_precision / 2.0) << active;
    // One note, one line, on stderr: the seq_len default and what is not modelled.
    EXPECT_EQ(lines(r.err), 1u) << r.err;
    EXPECT_NE(r.err.find("modar: note: "), std::string::npos);
    EXPECT_NE(r.err.find("model.seq_len = 4096"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("not modelled:"), std::string::npos) << r.err;
    std::remove(path.c_str());
  }
}

TEST(CliHfExport, ReportAndOneLineErrors) {
  const std::string mixtral = write_file("mixtral.json", modar_test::kMixtralConfig);
  const CliResult report = run("estimate " + mixtral + " --set model.seq_len=8192");
  ASSERT_EQ(report.exit_code, 0) << report.err;
  EXPECT_NE(report.out.find("8 experts (width 14336), top-2"), std::string::npos) << report.out;
  EXPECT_NE(report.out.find("seq_len 8192"), std::string::npos);
  EXPECT_EQ(report.err.find("seq_len"), std::string::npos) << report.err;  // the user's
  const std::string mamba = write_file("mamba.json", R"({"model_type": "mamba", "d_model": 768})");
  const CliResult bad = run("estimate " + mamba);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(lines(bad.err), 1u) << bad.err;
  EXPECT_NE(bad.err.find("model_type = \"mamba\": not a supported architecture"), std::string::npos)
      << bad.err;
  const std::string broken = write_file("broken.json", "{\"model_type\": \"llama\",");
  const CliResult not_json = run("estimate " + broken);
  EXPECT_EQ(not_json.exit_code, 2);
  EXPECT_NE(not_json.err.find("not valid JSON"), std::string::npos) << not_json.err;
  for (const std::string& path : {mixtral, mamba, broken}) {
    std::remove(path.c_str());
  }
}

TEST(CliHfExport, ExportAndMegatronArgs) {
  const std::string mixtral = write_file("mixtral_export.json", modar_test::kMixtralConfig);
  const CliResult r = run("export " + mixtral +
                          " --set device.count=16 --set parallel.tensor=2 --set parallel.expert=8"
                          " --set parallel.zero=1 --set train.micro_batch=1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* line :
       {"    --num-experts 8\n", "    --moe-router-topk 2\n", "    --num-query-groups 8\n",
        "    --tensor-model-parallel-size 2\n", "    --expert-model-parallel-size 8\n",
        "    --global-batch-size 8\n", "    --use-distributed-optimizer\n"}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << line << r.out;
  }
  // The exported text read back by estimate (the world size given).
  const std::string args_path = write_file("args.sh", r.out);
  const CliResult back =
      run("estimate --megatron-args \"$(cat " + args_path + ")\" --set device.count=16 --json");
  ASSERT_EQ(back.exit_code, 0) << back.err;
  EXPECT_DOUBLE_EQ(json_number(back.out, "total"), 46702792704.0);
  EXPECT_NE(back.err.find("Megatron-LM arguments read"), std::string::npos) << back.err;
  const CliResult both = run("export " + mixtral + " --megatron-args \"--num-layers 2\"");
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(both.err.find("not both"), std::string::npos) << both.err;
  const CliResult format = run("export " + mixtral + " --format deepspeed");
  EXPECT_EQ(format.exit_code, 2);
  EXPECT_NE(format.err.find("--format"), std::string::npos) << format.err;
  std::remove(mixtral.c_str());
  std::remove(args_path.c_str());
}

}  // namespace
