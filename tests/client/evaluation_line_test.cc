// `oomb get` and `oomb watch`'s evaluation line and `oomb get`'s RULER lines (client/cli.h),
// without a server.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "client/cli.h"

namespace oomb::client {
namespace {

v1::EvaluationResult::TaskScore* Task(v1::EvaluationResult::Suite& s, const char* task, int64_t length, double score) {
  v1::EvaluationResult::TaskScore* t = s.add_tasks();
  t->set_task(task);
  t->set_length(length);
  t->set_score(score);
  t->set_samples(20);
  return t;
}

TEST(EvaluationLineTest, RulerShowsTheEffectiveLengthAndEachTaskByLength) {
  v1::EvaluationResult e;
  e.set_step(40);
  v1::EvaluationResult::Suite& passkey = (*e.mutable_suites())["passkey"];
  passkey.set_accuracy(0.9);
  v1::EvaluationResult::Suite& ruler = (*e.mutable_suites())["ruler"];
  Task(ruler, "vt", 4096, 95);
  Task(ruler, "vt", 8192, 80);
  Task(ruler, "cwe", 4096, 90);
  Task(ruler, "cwe", 8192, 70.25);
  for (const auto& [length, score] : {std::pair<int64_t, double>{4096, 92.5}, {8192, 75.125}}) {
    v1::EvaluationResult::LengthScore* a = ruler.add_averages();
    a->set_length(length);
    a->set_score(score);
  }
  ruler.set_threshold(85.6);
  ruler.set_effective_length(4096);
  EXPECT_EQ(EvaluationLine(e),
            "step 40: passkey 0.90, ruler effective length 4K (threshold 85.6; by length 4K 92.5, 8K 75.1)");
  EXPECT_THAT(RulerLines(e),
              ::testing::ElementsAre("vt                4K 95.0  8K 80.0", "cwe               4K 90.0  8K 70.2"));
  e.mutable_suites()->erase("ruler");
  EXPECT_TRUE(RulerLines(e).empty());
  EXPECT_EQ(EvaluationLine(e), "step 40: passkey 0.90");
}

}  // namespace
}  // namespace oomb::client
