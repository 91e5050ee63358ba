#include "worker/hf/tokenize_tool.h"

#include <filesystem>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/test_env.h"

namespace oomb {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

struct Result {
  int code;
  std::string out, err;
};

Result RunTool(const std::string& dir, bool decode, bool special, const std::string& input) {
  std::istringstream in(input);
  std::ostringstream out, err;
  const int code = RunTokenizeTool(dir, decode, special, in, out, err);
  return {code, out.str(), err.str()};
}

class TokenizeToolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::DataDir() + "/models/SmolLM2-135M-Instruct";
    if (!std::filesystem::exists(dir_)) GTEST_SKIP() << "test data not found at " << dir_;
  }
  std::string dir_;
};

TEST_F(TokenizeToolTest, EncodeThenDecode) {
  const std::string text = "<|im_start|>user\nHello, wörld! 123\n";
  const Result enc = RunTool(dir_, false, false, text);
  ASSERT_EQ(enc.code, 0) << enc.err;
  EXPECT_THAT(enc.out, StartsWith("[1,"));
  EXPECT_EQ(enc.out.back(), '\n');
  const Result dec = RunTool(dir_, true, false, enc.out);
  ASSERT_EQ(dec.code, 0) << dec.err;
  EXPECT_EQ(dec.out, text);
  EXPECT_EQ(RunTool(dir_, false, false, "").out, "[]\n");
}

TEST_F(TokenizeToolTest, Errors) {
  Result r = RunTool(dir_, false, false, "bad \xFF utf8");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("not valid UTF-8"));
  r = RunTool(dir_, true, false, "[1, 2");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("not a JSON array"));
  r = RunTool(dir_, true, false, "[1, \"x\"]");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("element 1"));
  r = RunTool(dir_, true, false, "[1, 99999999]");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("id 99999999"));
  r = RunTool("/nonexistent/model", false, false, "x");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("tokenizer.json"));
  EXPECT_TRUE(r.out.empty());
}

}  // namespace
}  // namespace oomb
