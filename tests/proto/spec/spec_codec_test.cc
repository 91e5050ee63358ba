// The job spec's YAML codec (proto/spec/spec_codec.h) on its own: overrides, defaults, the round
// trip through YAML, relative paths, and that every default the schema declares reads and
// passes its own rules.
#include "proto/spec/spec_codec.h"

#include <gmock/gmock.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <string>

#include "oomb/v1/job_spec.pb.h"

namespace oomb::spec {
namespace {

using google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;

constexpr char kMinimal[] = "model: {path: /models/m}\ndata: {train: /data/t.jsonl}\n";

v1::JobSpec ParseOk(const std::string& yaml, const Source& source = {"job.yaml", ""}) {
  v1::JobSpec s;
  const absl::Status st = ParseYaml(yaml, source, &s);
  EXPECT_TRUE(st.ok()) << st;
  return s;
}

TEST(SpecCodecTest, EveryDeclaredDefaultReadsAndPassesItsRules) {
  v1::JobSpec s = ParseOk(kMinimal);
  FillDefaults(&s);
  EXPECT_TRUE(CheckRules(s, /*check_required=*/true).ok()) << CheckRules(s, true);
  EXPECT_EQ(s.training().max_steps(), 100);
  EXPECT_TRUE(s.has_method());
  EXPECT_EQ(s.method().lora().target_modules_size(), 7);
  EXPECT_FALSE(s.model().has_rope_scaling());          // no defaults beneath: stays absent
  EXPECT_EQ(s.attention().sparse().page_budget(), 0);  // auto (resolved by ResolveJobSpec)
  EXPECT_EQ(s.memory().page_tokens(), 0);
  // Epochs take the oneof: max_steps' default does not apply.
  v1::JobSpec e = ParseOk(std::string(kMinimal) + "training: {epochs: 3}\n");
  FillDefaults(&e);
  EXPECT_EQ(e.training().epochs(), 3);
  EXPECT_FALSE(e.training().has_max_steps());
}

TEST(SpecCodecTest, Overrides) {
  v1::JobSpec s = ParseOk(kMinimal);
  ASSERT_TRUE(ApplyOverride("training.max_steps=5", "", &s).ok());
  EXPECT_EQ(s.training().max_steps(), 5);
  ASSERT_TRUE(ApplyOverride("method.lora.target_modules=[q_proj, v_proj]", "", &s).ok());
  EXPECT_THAT(s.method().lora().target_modules(), ::testing::ElementsAre("q_proj", "v_proj"));
  ASSERT_TRUE(ApplyOverride("labels.team=nlp", "", &s).ok());
  EXPECT_EQ(s.labels().at("team"), "nlp");
  ASSERT_TRUE(ApplyOverride("labels.team=null", "", &s).ok());
  EXPECT_TRUE(s.labels().empty());
  ASSERT_TRUE(ApplyOverride("model.rope_scaling={type: linear, factor: 2}", "", &s).ok());
  EXPECT_EQ(s.model().rope_scaling().factor(), 2);
  ASSERT_TRUE(ApplyOverride("model.rope_scaling.factor=4", "", &s).ok());
  EXPECT_EQ(s.model().rope_scaling().factor(), 4);
  ASSERT_TRUE(ApplyOverride("model.rope_scaling=null", "", &s).ok());
  EXPECT_FALSE(s.model().has_rope_scaling());
  ASSERT_TRUE(ApplyOverride("data.validation=/v.jsonl", "", &s).ok());
  EXPECT_EQ(s.data().validation(), "/v.jsonl");
  ASSERT_TRUE(ApplyOverride("training.epochs=3", "", &s).ok());  // one of a oneof: clears max_steps
  EXPECT_EQ(s.training().epochs(), 3);
  EXPECT_FALSE(s.training().has_max_steps());
  ASSERT_TRUE(ApplyOverride("training.max_steps=9", "", &s).ok());
  EXPECT_FALSE(s.training().has_epochs());
  EXPECT_EQ(s.training().max_steps(), 9);
  ASSERT_TRUE(ApplyOverride("display_name=a=b", "", &s).ok());  // the first '=' splits
  EXPECT_EQ(s.display_name(), "a=b");
  ASSERT_TRUE(ApplyOverride("data.train=rel/t.jsonl", "/work", &s).ok());  // relative to the base
  EXPECT_EQ(s.data().train(), "/work/rel/t.jsonl");
  EXPECT_TRUE(CheckRules(s, /*check_required=*/true).ok());
}

TEST(SpecCodecTest, OverrideErrorsLeaveTheSpecUnchanged) {
  v1::JobSpec s = ParseOk(kMinimal);
  const v1::JobSpec before = s;
  absl::Status st = ApplyOverride("training.learning_rate=-1", "", &s);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "--set training.learning_rate=-1: training.learning_rate: must be in (0, 10], got -1");
  EXPECT_THAT(ApplyOverride("training.max_stepz=5", "", &s).message(),
              HasSubstr("--set training.max_stepz=5: training.max_stepz: unknown key (known keys under training:"));
  EXPECT_THAT(ApplyOverride("training.max_steps=five", "", &s).message(), HasSubstr("expected an integer"));
  EXPECT_THAT(ApplyOverride("training.max_steps", "", &s).message(), HasSubstr("expected key=value"));
  EXPECT_THAT(ApplyOverride("training={learning_rate: 0}", "", &s).message(),
              HasSubstr("training.learning_rate: must be in (0, 10]"));
  EXPECT_THAT(ApplyOverride("model.path.deeper=1", "", &s).message(), HasSubstr("model.path: is not a section"));
  EXPECT_TRUE(MessageDifferencer::Equals(s, before));
  // A rope scaling without its type is caught with the required fields.
  ASSERT_TRUE(ApplyOverride("model.rope_scaling.factor=2", "", &s).ok());
  EXPECT_THAT(CheckRules(s, /*check_required=*/true).message(), HasSubstr("model.rope_scaling.type: is required"));
}

TEST(SpecCodecTest, RoundTripDefaultsAndEverythingSet) {
  v1::JobSpec a = ParseOk(kMinimal);
  FillDefaults(&a);
  EXPECT_TRUE(MessageDifferencer::Equals(ParseOk(ToYaml(a)), a)) << ToYaml(a);
  // A word that stands for 0 (zero_word) is written as that word and reads back as 0.
  EXPECT_EQ(a.memory().chunk_tokens(), 0);
  EXPECT_NE(ToYaml(a).find("chunk_tokens: auto"), std::string::npos) << ToYaml(a);

  v1::JobSpec b = a;
  b.set_display_name("null");  // strings that read as YAML specials must survive
  (*b.mutable_labels())["team"] = "nlp";
  (*b.mutable_labels())["empty"] = "";
  (*b.mutable_labels())["n"] = "123";
  b.mutable_model()->set_dtype(v1::ModelSpec::float32);
  v1::RopeScaling* r = b.mutable_model()->mutable_rope_scaling();
  r->set_type(v1::RopeScaling::llama3);
  r->set_factor(8);
  r->set_original_max_position_embeddings(8192);
  b.mutable_method()->set_type(v1::Method::full);
  b.mutable_method()->mutable_lora()->set_alpha(0.1 + 0.2);  // not exactly representable in short decimal
  b.mutable_method()->mutable_lora()->clear_target_modules();
  b.mutable_method()->mutable_lora()->add_target_modules("q_proj");
  b.mutable_method()->mutable_lora()->add_target_modules("true");
  b.mutable_data()->set_validation("/v.jsonl");
  b.mutable_data()->set_packing(false);
  b.mutable_training()->set_epochs(2);
  b.mutable_training()->set_learning_rate(3.3e-5);
  b.mutable_training()->mutable_adam()->set_eps(1e-12);
  b.mutable_attention()->set_mode(v1::Attention::sparse);
  b.mutable_checkpoint()->set_dir("/c: d");
  b.mutable_resources()->set_device("cuda:3");
  b.mutable_resources()->set_priority(-7);
  ASSERT_TRUE(CheckRules(b, true).ok()) << CheckRules(b, true);
  const std::string yaml = ToYaml(b);
  EXPECT_TRUE(MessageDifferencer::Equals(ParseOk(yaml), b)) << yaml;
  EXPECT_EQ(ToYaml(ParseOk(yaml)), yaml);
}

TEST(SpecCodecTest, RelativePathsAreMadeAbsoluteAgainstTheBase) {
  const v1::JobSpec s = ParseOk("model: {path: ../m}\ndata: {train: t.jsonl}\ndisplay_name: not/a/path\n",
                                Source{"job.yaml", "/home/u/specs"});
  EXPECT_EQ(s.model().path(), "/home/u/m");
  EXPECT_EQ(s.data().train(), "/home/u/specs/t.jsonl");
  EXPECT_EQ(s.display_name(), "not/a/path");
}

TEST(SpecCodecTest, EmptySourceNameGivesTheBarePath) {
  v1::JobSpec s;
  const absl::Status st = ParseYaml(std::string(kMinimal) + "training: {learning_rate: -1}\n", {}, &s);
  EXPECT_EQ(st.message(), "training.learning_rate: must be in (0, 10], got -1");
}

}  // namespace
}  // namespace oomb::spec
