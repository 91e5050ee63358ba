// The config.json written with a checkpoint (the model as trained) and the code that loads it.
// That transformers reads the written config as oomb does is tests/worker/job's
// rope_parity_test (real SmolLM2, YaRN).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "worker/hf/loading_code.h"
#include "worker/hf/model_config.h"

namespace oomb {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kBase[] = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 256,
  "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
  "rope_scaling": null, "tie_word_embeddings": true, "custom_key": [1, 2]})";

ModelConfig Parse(const std::string& text) {
  auto c = ParseModelConfig(text, "config.json");
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : ModelConfig();
}

// Mistral's sliding_window: every layer (null: none), or the layers layer_types marks; malformed
// entries name the key. Qwen2's sliding windows stay refused.
TEST(ModelConfigTest, SlidingWindowsOfMistralAndTheirErrors) {
  std::string mistral = kBase;
  mistral.replace(mistral.find("LlamaForCausalLM"), 16, "MistralForCausalLM");
  mistral.replace(mistral.find("\"llama\""), 7, "\"mistral\"");
  const auto with = [&](const std::string& keys) { return mistral.substr(0, mistral.size() - 1) + ", " + keys + "}"; };
  ModelConfig c = Parse(with(R"("sliding_window": 4096)"));
  EXPECT_EQ(c.architecture, "MistralForCausalLM");
  EXPECT_EQ(c.AttentionWindow(0), 4096);
  EXPECT_EQ(c.AttentionWindow(1), 4096);
  EXPECT_FALSE(Parse(with(R"("sliding_window": null)")).has_sliding_layers());
  c = Parse(with(R"("sliding_window": 512, "layer_types": ["full_attention", "sliding_attention"])"));
  EXPECT_EQ(c.AttentionWindow(0), 0);
  EXPECT_EQ(c.AttentionWindow(1), 512);
  const auto error = [](const std::string& text) {
    return std::string(ParseModelConfig(text, "config.json").status().message());
  };
  EXPECT_THAT(error(with(R"("sliding_window": 512, "layer_types": ["full_attention"])")),
              HasSubstr("config.json: key 'layer_types': expected a list of 2 (num_hidden_layers)"));
  EXPECT_THAT(error(with(R"("sliding_window": 512, "layer_types": ["full_attention", "chunked"])")),
              HasSubstr("key 'layer_types': entry 1"));
  EXPECT_THAT(error(with(R"("sliding_window": -1)")), HasSubstr("'sliding_window' must be positive or null"));
  std::string qwen2 = kBase;
  qwen2.replace(qwen2.find("LlamaForCausalLM"), 16, "Qwen2ForCausalLM");
  qwen2.replace(qwen2.find("\"llama\""), 7, "\"qwen2\"");
  EXPECT_THAT(error(qwen2.substr(0, qwen2.size() - 1) + R"(, "use_sliding_window": true})"),
              HasSubstr("sliding-window attention layers are not supported for this family"));
}

TEST(EffectiveConfigTest, YarnIsWrittenForBothTransformersGenerationsAndReadsBackAsTrained) {
  RopeScalingOverride yarn;
  yarn.type = RopeType::kYarn;
  yarn.factor = 8.0;
  const ModelConfig trained = ApplyRopeScaling(Parse(kBase), yarn);
  auto text = EffectiveConfigJson(kBase, trained, "config.json");
  ASSERT_TRUE(text.ok()) << text.status();
  const nlohmann::json j = nlohmann::json::parse(*text);
  EXPECT_EQ(j["max_position_embeddings"], 65536);  // 8 x the original 8192
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    EXPECT_EQ(j[key]["rope_type"], "yarn") << key;
    EXPECT_EQ(j[key]["factor"], 8.0) << key;
    EXPECT_EQ(j[key]["original_max_position_embeddings"], 8192) << key;
    EXPECT_EQ(j[key]["rope_theta"], 100000.0) << key;
  }
  EXPECT_EQ(j["custom_key"], nlohmann::json::array({1, 2}));  // everything else kept
  EXPECT_EQ(j["tie_word_embeddings"], true);

  const ModelConfig back = Parse(*text);
  EXPECT_EQ(back.rope.type, RopeType::kYarn);
  EXPECT_DOUBLE_EQ(back.rope.factor, 8.0);
  EXPECT_EQ(back.rope.original_max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(back.rope.theta, 100000.0);
  // Read back and applied to the base again, the scaling gives the trained RoPE.
  const std::optional<RopeScalingOverride> again = RopeScalingOf(back.rope);
  ASSERT_TRUE(again.has_value());
  const ModelConfig reapplied = ApplyRopeScaling(Parse(kBase), *again);
  EXPECT_EQ(reapplied.rope.type, trained.rope.type);
  EXPECT_DOUBLE_EQ(reapplied.rope.factor, trained.rope.factor);
  EXPECT_EQ(reapplied.rope.original_max_position_embeddings, trained.rope.original_max_position_embeddings);
  EXPECT_DOUBLE_EQ(reapplied.rope.beta_fast, trained.rope.beta_fast);
}

TEST(EffectiveConfigTest, DynamicKeepsTheBaseWindowAndDefaultLeavesTheConfigAlone) {
  RopeScalingOverride dynamic;
  dynamic.type = RopeType::kDynamic;
  dynamic.factor = 2.0;
  auto text = EffectiveConfigJson(kBase, ApplyRopeScaling(Parse(kBase), dynamic), "config.json");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(nlohmann::json::parse(*text)["max_position_embeddings"], 8192);
  EXPECT_EQ(nlohmann::json::parse(*text)["rope_parameters"]["rope_type"], "dynamic");

  auto plain = EffectiveConfigJson(kBase, Parse(kBase), "config.json");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(nlohmann::json::parse(*plain), nlohmann::json::parse(kBase));
  EXPECT_FALSE(RopeScalingOf(Parse(kBase).rope).has_value());
}

TEST(EffectiveConfigTest, NotJsonIsAnErrorNamingTheFile) {
  auto text = EffectiveConfigJson("[1, 2", Parse(kBase), "/m/config.json");
  ASSERT_FALSE(text.ok());
  EXPECT_THAT(std::string(text.status().message()), HasSubstr("/m/config.json"));
}

TEST(LoadingCodeTest, AnAdapterLoadsItsBaseWithTheConfigItWasTrainedWith) {
  LoadingCodeOptions o;
  o.checkpoint_path = "/ck/final";
  o.base_model_path = "/models/it's";
  const std::string code = LoadingCode(o);
  EXPECT_THAT(code, HasSubstr("config = AutoConfig.from_pretrained(\"/ck/final/base_config.json\")"));
  EXPECT_THAT(code, HasSubstr("base = AutoModelForCausalLM.from_pretrained(\"/models/it's\", config=config)"));
  EXPECT_THAT(code, HasSubstr("model = PeftModel.from_pretrained(base, \"/ck/final\")"));
  o.has_base_config = false;
  EXPECT_THAT(LoadingCode(o), Not(HasSubstr("AutoConfig.from_pretrained(")));
  o.lora = false;
  EXPECT_THAT(LoadingCode(o), HasSubstr("model = AutoModelForCausalLM.from_pretrained(\"/ck/final\")"));
  EXPECT_THAT(LoadingCode(o), Not(HasSubstr("peft")));
}

}  // namespace
}  // namespace oomb
