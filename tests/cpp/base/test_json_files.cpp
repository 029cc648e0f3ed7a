// base/json, base/files and base/interrupt: the JSON writer's exact text,
// bounded input files, atomic output files, the load average and the
// Ctrl-C flag.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>

#include "modar/base/errors.hpp"
#include "modar/base/files.hpp"
#include "modar/base/interrupt.hpp"
#include "modar/base/json.hpp"

namespace modar {
namespace {

TEST(BaseJson, WriterProducesExactText) {
  JsonWriter json(0);
  json.begin_object()
      .field("a", 1.5)
      .field("b", int64_t{3})
      .field("s", "q\"uote\n")
      .field("t", true)
      .field("nan", std::nan(""))
      .key("list")
      .begin_array()
      .value(1e20)
      .value(0.1)
      .null()
      .end_array()
      .key("empty")
      .begin_object()
      .end_object()
      .end_object();
  EXPECT_EQ(json.str(),
            "{\"a\":1.5,\"b\":3,\"s\":\"q\\\"uote\\n\",\"t\":true,\"nan\":null,"
            "\"list\":[1e+20,0.1,null],\"empty\":{}}");
  JsonWriter bad;
  bad.begin_object();
  EXPECT_THROW(bad.value(1.0), std::logic_error);
  EXPECT_THROW(bad.str(), std::logic_error);
}

// RFC 8259: JSON text is UTF-8.  Well-formed sequences are copied; a byte
// that starts none becomes \ufffd (each such byte), so the output parses.
TEST(BaseJson, TextThatIsNotUtf8IsWrittenAsReplacementCharacters) {
  EXPECT_EQ(json_quote("caf\xc3\xa9 \xe2\x82\xac \xf0\x9d\x84\x9e"),
            "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9d\x84\x9e\"");
  EXPECT_EQ(json_quote("caf\xe9.toml"), "\"caf\\ufffd.toml\"");
  EXPECT_EQ(json_quote("\xed\xa0\x80"), "\"\\ufffd\\ufffd\\ufffd\"");  // a surrogate
  EXPECT_EQ(json_quote("a\xe2\x82"), "\"a\\ufffd\\ufffd\"");              // cut off
}

TEST(BaseJson, OptionalIsTheValueOrNull) {
  JsonWriter json(0);
  json.begin_object();
  json_optional(json, "x", 0.5);
  json_optional(json, "y", std::nullopt);
  json.end_object();
  EXPECT_EQ(json.str(), "{\"x\":0.5,\"y\":null}");
}

std::string read_back(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string file_error(const std::function<void()>& action) {
  try {
    action();
  } catch (const FileError& e) {
    return e.what();
  }
  return "no FileError";
}

TEST(BaseFiles, AtomicWriteReplacesWholeOrNothing) {
  const std::string path = testing::TempDir() + "/modar_base_atomic.txt";
  write_file_atomically(path, "first\n");
  write_file_atomically(path, "second\n", "report");
  EXPECT_EQ(read_back(path), "second\n");
  std::ifstream leftover(path + ".tmp." + std::to_string(::getpid()));
  EXPECT_FALSE(leftover.good());
  std::remove(path.c_str());
  // A directory that does not exist: one line naming what and where.
  const std::string error =
      file_error([] { write_file_atomically("/nonexistent-dir/x.toml", "x", "profile file"); });
  EXPECT_EQ(error.rfind("profile file '/nonexistent-dir/x.toml': cannot write (", 0), 0u) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos);
}

TEST(BaseFiles, InputsAreBoundedRegularFiles) {
  const std::string path = testing::TempDir() + "/modar_base_input.txt";
  write_file_atomically(path, "12345");
  EXPECT_EQ(read_input_file(path, "runs file", 5), "12345");
  EXPECT_EQ(file_error([&] { read_input_file(path, "runs file", 4); }),
            "runs file '" + path + "': larger than 4 bytes; allowed: a file of at most 4 bytes");
  std::remove(path.c_str());
  EXPECT_NE(file_error([] {
              read_input_file("/", "config file", 100);
            }).find("'/': is a directory; allowed: a regular file"),
            std::string::npos);
  EXPECT_NE(file_error([] {
              read_input_file("/nonexistent/x", "config file", 100);
            }).find("cannot open (missing or unreadable)"),
            std::string::npos);
}

TEST(BaseFiles, LoadAverageIsThreeNumbersOrUnknown) {
  const std::string load = load_average();
  if (load == "unknown") {
    GTEST_SKIP() << "no /proc/loadavg here";
  }
  std::istringstream fields(load);
  double one = -1, five = -1, fifteen = -1;
  fields >> one >> five >> fifteen;
  EXPECT_TRUE(fields.eof() || fields.good()) << load;
  EXPECT_GE(one, 0.0);
  EXPECT_GE(five, 0.0);
  EXPECT_GE(fifteen, 0.0);
  std::string extra;
  EXPECT_FALSE(fields >> extra) << load;
}

TEST(BaseInterrupt, FlagThrowsOnlyWhenRequested) {
  clear_interrupt();
  EXPECT_NO_THROW(throw_if_interrupted("x"));
  request_interrupt();
  EXPECT_THROW(throw_if_interrupted("x"), Interrupted);
  clear_interrupt();
  EXPECT_FALSE(interrupt_requested());
}

}  // namespace
}  // namespace modar
