// Input hardening of the C++ core (docs/hardening.md): each test is one defect
// class of the hostile-input campaign of issue 9.  The expected fragments are
// the field, the value and the allowed range, written out by hand.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <string>

#include "../common/config_error_of.hpp"
#include "modar/base/errors.hpp"
#include "modar/base/text.hpp"
#include "modar/config.hpp"
#include "modar/cost_model.hpp"
#include "modar/profile.hpp"

namespace modar {
namespace {

using modar_test::error_of;

std::string validate_with(std::initializer_list<const char*> sets) {
  return error_of([&] {
    Config c;
    for (const char* s : sets) {
      apply_override(c, s);
    }
    validate(c);
  });
}

std::string temp_file(const std::string& name, const std::string& text) {
  const std::string path = testing::TempDir() + "/hardening_" + std::to_string(::getpid()) + "_" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// 2^32 * 2^32 wraps to 0 in int64_t: the product used to reach a modulo
// (SIGFPE).  Each factor is now range-checked before any product.
TEST(InputHardening, MicroBatchTimesDeviceCountCannotWrapToZero) {
  EXPECT_EQ(validate_with({"train.micro_batch=4294967296", "device.count=4294967296",
                           "train.global_batch=8"}),
            "ConfigError: train.micro_batch = 4294967296: must be <= 16777216");
  EXPECT_EQ(validate_with({"device.count=4294967296", "train.global_batch=8"}),
            "ConfigError: device.count = 4294967296: must be <= 16777216");
}

// A --set string value is not read by the TOML reader (which refuses text
// that is not UTF-8): each string key refuses it itself, naming the key.
TEST(InputHardening, EveryStringOverrideMustBeUtf8) {
  for (const std::string key : {"device.profile", "train.recompute_modules"}) {
    const std::string error = validate_with({(key + "=caf\xe9").c_str()});
    EXPECT_EQ(error.rfind("ConfigError: " + key + " = caf", 0), 0u) << error;
    EXPECT_NE(error.find("must be valid UTF-8 text"), std::string::npos) << error;
  }
  EXPECT_EQ(validate_with({"device.profile=caf\xc3\xa9.toml"}), "no error");
}

// A huge d_model used to be blamed on n_heads ("must divide d_model").
TEST(InputHardening, EachFieldIsCheckedAgainstItsOwnRangeFirst) {
  EXPECT_EQ(validate_with({"model.d_model=1000000001"}),
            "ConfigError: model.d_model = 1000000001: must be <= 16777216");
  EXPECT_EQ(validate_with({"model.n_heads=99999999999"}),
            "ConfigError: model.n_heads = 99999999999: must be <= 16777216");
  EXPECT_EQ(validate_with({"mod.every=99999999999"}),
            "ConfigError: mod.every = 99999999999: must be <= 16777216");
}

TEST(InputHardening, DarBlockLayersIsOnlyCheckedWhenDarIsOn) {
  // A dense 1-layer model with the default dar.block_layers = 2 is valid.
  EXPECT_EQ(validate_with({"model.n_layers=1"}), "no error");
  EXPECT_EQ(validate_with({"model.n_layers=1", "dar.variant=attnres"}),
            "ConfigError: dar.block_layers = 2: must be in [1, model.n_layers = 1]");
}

TEST(InputHardening, ModThatRoutesNoLayerIsRefused) {
  // Layer l is routed iff l % every == offset.  every 1000, offset 1, 2
  // layers: layer 1 is routed (allowed).  offset 2 with 2 layers, or offset 1
  // with 1 layer: no layer is ("0 of 2 layers routed" used to pass silently).
  EXPECT_EQ(validate_with({"model.n_layers=2", "mod.every=1000"}), "no error");
  const std::string error =
      validate_with({"model.n_layers=2", "mod.every=1000", "mod.offset=2"});
  EXPECT_NE(error.find("mod.every = 1000: routes 0 of model.n_layers = 2 layers"), std::string::npos)
      << error;
  EXPECT_NE(validate_with({"model.n_layers=1", "mod.every=1000"}).find("routes 0 of"),
            std::string::npos);
  EXPECT_EQ(validate_with({"model.n_layers=1", "mod.every=1", "mod.offset=0"}), "no error");
}

TEST(InputHardening, EchoedValuesAreEscapedAndShortened) {
  EXPECT_EQ(shown_value(std::string("a\nb\0c\t", 6)), "a\\nb\\x00c\\t");
  const std::string long_text(1000183, 'k');
  EXPECT_EQ(shown_value(long_text), std::string(60, 'k') + "...(1000183 characters)");
  // Through a real error: one line, bounded length.
  Config c;
  const std::string error = error_of([&] { apply_override(c, long_text + "\n=1"); });
  EXPECT_EQ(error.find('\n'), std::string::npos);
  EXPECT_LT(error.size(), 400u) << error.size();
  const std::string value_error = error_of([&] { apply_override(c, "model.mlp=relu\nx"); });
  EXPECT_NE(value_error.find("model.mlp = relu\\nx: must be"), std::string::npos) << value_error;
}

TEST(InputHardening, ConfigMustBeABoundedRegularFile) {
  const std::string dir = testing::TempDir();
  EXPECT_NE(error_of([&] { load_config_file(dir); }).find(": is a directory; allowed: a regular file"),
            std::string::npos);
  EXPECT_NE(error_of([] { load_config_file("/dev/zero"); }).find("not a regular file"),
            std::string::npos);
  // /proc/self/mem is a "regular" file of size 0 that cannot be read at offset 0.
  EXPECT_EQ(error_of([] { load_config_file("/proc/self/mem"); }).rfind("FileError: ", 0), 0u);
  const std::string big = temp_file("big.toml", std::string((16u << 20) + 1, '#'));
  EXPECT_NE(error_of([&] { load_config_file(big); }).find("larger than 16777216 bytes"),
            std::string::npos);
  std::remove(big.c_str());
}

// ---- profiles -----------------------------------------------------------------

const char* kCeilings =
    "[ceilings]\npeak_flops_bf16 = 1e12\npeak_flops_fp32 = 1e12\nmemory_bandwidth = 1e11\n"
    "memory_bytes = 1e10\n";

std::string measurement(const char* dtype, const char* median, const char* spread) {
  return std::string("[[measurements]]\nkind = \"gemm\"\ndtype = \"") + dtype +
         "\"\ndims = [64, 64, 64, 1]\nmedian_s = " + median + "\nspread = " + spread + "\n";
}

std::string load_error(const std::string& name, const std::string& text) {
  const std::string path = temp_file(name, text);
  const std::string error = error_of([&] { load_profile(path); });
  std::remove(path.c_str());
  return error;
}

TEST(InputHardening, PartialTruncatedAndDegenerateProfilesAreRefused) {
  const std::string head = "name = \"p\"\nbackend = \"cpu\"\nmeasured = true\n";
  EXPECT_NE(load_error("partial.toml", head + "[provenance]\nstatus = \"partial\"\n" + kCeilings +
                                           measurement("fp32", "1e-4", "0.1"))
                .find("provenance.status = \"partial\": a partial profile"),
            std::string::npos);
  EXPECT_NE(load_error("count.toml", head + "[provenance]\nmeasurement_count = \"3\"\n" +
                                         kCeilings + measurement("fp32", "1e-4", "0.1"))
                .find("measurement_count = 3 but the file holds 1 [[measurements]]"),
            std::string::npos);
  EXPECT_NE(load_error("atoi.toml", head + "[provenance]\nthreads = \"4x\"\n" + kCeilings)
                .find("provenance.threads = \"4x\": must be an integer >= 0"),
            std::string::npos);
  EXPECT_NE(load_error("clock.toml", head + "[provenance]\nclock = \"tsc\"\n" + kCeilings)
                .find("provenance.clock = \"tsc\": must be \"wall\" or \"cpu\""),
            std::string::npos);
  EXPECT_NE(load_error("spread.toml", head + kCeilings + measurement("fp32", "1e-4", "-0.5"))
                .find("measurements[0].spread = -0.5: must be >= 0"),
            std::string::npos);
  EXPECT_NE(load_error("denormal.toml", head + kCeilings + measurement("fp32", "4e-320", "0"))
                .find("measurements[0].median_s = 4e-320: must be in [1e-12, 1e6] seconds"),
            std::string::npos);
  const std::string huge =
      "name = \"p\"\n[ceilings]\npeak_flops_bf16 = 1e300\npeak_flops_fp32 = 1e12\n"
      "memory_bandwidth = 1e11\nmemory_bytes = 1e10\n";
  EXPECT_NE(load_error("huge.toml", huge).find("ceilings.peak_flops_bf16 = 1e+300: must be in "
                                               "[1e6, 1e19] FLOP/s"),
            std::string::npos);
  const std::string tiny =
      "name = \"p\"\n[ceilings]\npeak_flops_bf16 = 1e12\npeak_flops_fp32 = 1e12\n"
      "memory_bandwidth = 5e-324\nmemory_bytes = 1e10\n";
  EXPECT_NE(load_error("tiny.toml", tiny).find("ceilings.memory_bandwidth = 5e-324"),
            std::string::npos);
  // The same profile with sane numbers loads.
  EXPECT_EQ(load_error("good.toml", head + "[provenance]\nmeasurement_count = \"1\"\nstatus = "
                                           "\"complete\"\nclock = \"cpu\"\nthreads = \"2\"\n" +
                                           kCeilings + measurement("fp32", "1e-4", "0.1")),
            "no error");
}

TEST(InputHardening, LongProfileNamesAreABadValueNotAnInternalError) {
  // 300 characters: longer than a file name may be (ENAMETOOLONG).
  const std::string name(300, 'p');
  EXPECT_NE(error_of([&] { load_profile(name); }).find("no such profile"), std::string::npos);
  EXPECT_NE(error_of([&] { load_profile(std::string(5000, 'p')); }).find("at most 4096 characters"),
            std::string::npos);
}

// The embedded cpu-measured-quick profile measured fp32 ops only (its
// provenance says dtype = "fp32"): a bf16 config used to be timed by the
// roofline while the output claimed the measured op table.
TEST(InputHardening, MeasuredProfileRefusesADtypeItDidNotMeasure) {
  const DeviceProfile cpu = load_profile("cpu-measured-quick");
  ASSERT_TRUE(cpu.measured);
  EXPECT_EQ(cpu.provenance.at("dtype"), "fp32");
  EXPECT_TRUE(profile_measures_dtype(cpu, DType::fp32));
  EXPECT_FALSE(profile_measures_dtype(cpu, DType::bf16));
  Config c;
  c.model = {.d_model = 256, .n_layers = 2, .n_heads = 4, .vocab_size = 1000, .seq_len = 128};
  c.train.dtype = DType::bf16;
  c.device.profile = "cpu-measured-quick";
  const std::string error = error_of([&] { estimate(c, cpu, StepKind::train); });
  EXPECT_NE(error.find("train.dtype = bf16: device.profile = \"cpu-measured-quick\" measured only "
                       "fp32 ops"),
            std::string::npos)
      << error;
  c.train.dtype = DType::fp32;
  EXPECT_EQ(error_of([&] { estimate(c, cpu, StepKind::train); }), "no error");
  // Datasheet profiles have no op table: any dtype is fine.
  c.train.dtype = DType::bf16;
  EXPECT_EQ(error_of([&] { estimate(c, load_profile("h200"), StepKind::train); }), "no error");
}

}  // namespace
}  // namespace modar
