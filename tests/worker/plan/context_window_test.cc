// A job's context against its model's window (worker/plan/context_window.h).
#include "worker/plan/context_window.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace oomb {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

ModelConfig Model(int64_t window) {
  ModelConfig c;
  c.max_position_embeddings = window;
  return c;
}

JobConfig Job(int64_t length, std::optional<RopeScalingOverride> scaling = std::nullopt) {
  JobConfig j;
  j.model.path = "/m";
  j.data.max_seq_len = length;
  j.model.rope_scaling = scaling;
  return j;
}

RopeScalingOverride Scaling(RopeType type, double factor) {
  RopeScalingOverride s;
  s.type = type;
  s.factor = factor;
  return s;
}

TEST(ContextWindowTest, TheWindowOfEachScaling) {
  EXPECT_EQ(ContextWindow(Model(8192)), 8192);
  EXPECT_EQ(ContextWindow(ApplyRopeScaling(Model(8192), Scaling(RopeType::kYarn, 8))), 65536);
  EXPECT_EQ(ContextWindow(ApplyRopeScaling(Model(8192), Scaling(RopeType::kLinear, 2.5))), 20480);
  EXPECT_EQ(ContextWindow(ApplyRopeScaling(Model(8192), Scaling(RopeType::kDynamic, 4))), 8192);
  EXPECT_EQ(ContextWindow(Model(0)), 0);
}

TEST(ContextWindowTest, WarnsForAContextPastTheWindowOnly) {
  EXPECT_THAT(ContextWindowWarnings(Model(8192), Job(8192)), IsEmpty());
  EXPECT_THAT(ContextWindowWarnings(Model(8192), Job(65536, Scaling(RopeType::kYarn, 8))), IsEmpty());
  EXPECT_THAT(ContextWindowWarnings(Model(8192), Job(20000)),
              ElementsAre(HasSubstr("data.max_seq_len (20000) exceeds the model's window (max_position_embeddings "
                                    "8192) and no RoPE scaling is set")));
  EXPECT_THAT(ContextWindowWarnings(Model(8192), Job(20000)), ElementsAre(HasSubstr("factor: 3}")));
  EXPECT_THAT(ContextWindowWarnings(Model(8192), Job(65537, Scaling(RopeType::kYarn, 8))),
              ElementsAre(HasSubstr("exceeds the window of the yarn RoPE scaling (factor 8 x 8192 = 65536 tokens)")));
  EXPECT_THAT(ContextWindowWarnings(Model(8192), Job(1 << 20, Scaling(RopeType::kDynamic, 2))), IsEmpty());
  EXPECT_THAT(ContextWindowWarnings(Model(0), Job(1 << 20)), IsEmpty());  // no window to compare with
  // Positions restart at each document: the longest sample is what reaches past the window.
  EXPECT_THAT(ContextWindowWarnings(Model(8192), Job(131072), /*longest_sample=*/4000), IsEmpty());
  EXPECT_THAT(ContextWindowWarnings(Model(8192), Job(131072), 9000),
              ElementsAre(HasSubstr("the longest sample (9000 tokens) exceeds the model's window")));
  EXPECT_THAT(ContextWindowWarnings(Model(8192), Job(10000), 1 << 20),  // capped at data.max_seq_len
              ElementsAre(HasSubstr("the longest sample (10000 tokens)")));
}

TEST(ContextWindowTest, WarnsWhenTheSpecReplacesTheModelsOwnScaling) {
  ModelConfig scaled = Model(32768);
  scaled.rope.type = RopeType::kYarn;
  scaled.rope.factor = 4;
  scaled.rope.original_max_position_embeddings = 32768;
  EXPECT_THAT(ContextWindowWarnings(scaled, Job(1000, Scaling(RopeType::kLinear, 2))),
              ElementsAre(HasSubstr("model.rope_scaling replaces the yarn scaling of /m/config.json (factor 4)")));
  EXPECT_THAT(ContextWindowWarnings(scaled, Job(131072)), IsEmpty());  // its own yarn reaches 4 x 32768
}

TEST(ContextWindowTest, YarnAndLlama3NeedAnOriginalWindow) {
  EXPECT_TRUE(CheckRopeScaling(Model(8192), Job(1000, Scaling(RopeType::kYarn, 4))).ok());
  EXPECT_TRUE(CheckRopeScaling(Model(0), Job(1000, Scaling(RopeType::kLinear, 4))).ok());
  for (RopeType type : {RopeType::kYarn, RopeType::kLlama3}) {
    const absl::Status s = CheckRopeScaling(Model(0), Job(1000, Scaling(type, 4)));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("model.rope_scaling.original_max_position_embeddings: required"));
  }
  RopeScalingOverride given = Scaling(RopeType::kYarn, 4);
  given.original_max_position_embeddings = 4096;
  EXPECT_TRUE(CheckRopeScaling(Model(0), Job(1000, given)).ok());
}

}  // namespace
}  // namespace oomb
