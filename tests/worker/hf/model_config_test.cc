// The config.json written with a checkpoint (the model as trained) and the code that loads it.
// That transformers reads the written config as oomb does is tests/worker/job's
// rope_parity_test (real SmolLM2, YaRN).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "worker/hf/layer_spec.h"
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

// The attention window of layer i as the engine builds it (0: the whole past).
int64_t Window(const ModelConfig& c, int64_t i) { return DescribeModel(c).layers.at(i).window; }

// Mistral's sliding_window: every layer (null: none), or the layers layer_types marks; malformed
// entries name the key. Qwen2's sliding windows stay refused.
TEST(ModelConfigTest, SlidingWindowsOfMistralAndTheirErrors) {
  std::string mistral = kBase;
  mistral.replace(mistral.find("LlamaForCausalLM"), 16, "MistralForCausalLM");
  mistral.replace(mistral.find("\"llama\""), 7, "\"mistral\"");
  const auto with = [&](const std::string& keys) { return mistral.substr(0, mistral.size() - 1) + ", " + keys + "}"; };
  ModelConfig c = Parse(with(R"("sliding_window": 4096)"));
  EXPECT_EQ(c.architecture, "MistralForCausalLM");
  EXPECT_EQ(Window(c, 0), 4096);
  EXPECT_EQ(Window(c, 1), 4096);
  EXPECT_FALSE(DescribeModel(Parse(with(R"("sliding_window": null)"))).HasWindows());
  c = Parse(with(R"("sliding_window": 512, "layer_types": ["full_attention", "sliding_attention"])"));
  EXPECT_EQ(Window(c, 0), 0);
  EXPECT_EQ(Window(c, 1), 512);
  const auto error = [](const std::string& text) {
    return std::string(ParseModelConfig(text, "config.json").status().message());
  };
  EXPECT_THAT(error(with(R"("sliding_window": 512, "layer_types": ["full_attention"])")),
              HasSubstr("config.json: key 'layer_types': expected a list of 2 (num_hidden_layers)"));
  EXPECT_THAT(error(with(R"("sliding_window": 512, "layer_types": ["full_attention", "chunked"])")),
              HasSubstr("key 'layer_types': entry 1"));
  // A window is a positive number of tokens or null (none); 0 and sizes past any context are
  // refused before anything is sized by them (issue 52).
  for (const char* bad : {"-1", "0", "4611686018427387904"}) {
    EXPECT_THAT(error(with(std::string(R"("sliding_window": )") + bad)),
                HasSubstr(std::string("config.json: key 'sliding_window' must be in [1, 1073741824], got ") + bad));
  }
  EXPECT_TRUE(ParseModelConfig(with(R"("sliding_window": null)"), "config.json").ok());
  std::string qwen2 = kBase;
  qwen2.replace(qwen2.find("LlamaForCausalLM"), 16, "Qwen2ForCausalLM");
  qwen2.replace(qwen2.find("\"llama\""), 7, "\"qwen2\"");
  EXPECT_THAT(error(qwen2.substr(0, qwen2.size() - 1) + R"(, "use_sliding_window": true})"),
              HasSubstr("sliding-window attention layers are not supported for this family"));
}

// Gemma 3 as transformers 4.x wrote it (Gemma-3 checkpoints on the hub): rope_theta and
// rope_scaling for the global layers, rope_local_base_freq for the local ones, every sixth layer
// global (sliding_window_pattern), tied embeddings by default; what oomb does not compute is
// refused.
TEST(ModelConfigTest, Gemma3AsTransformers4WroteIt) {
  const std::string gemma = R"({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
    "vocab_size": 262144, "hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 7,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "query_pre_attn_scalar": 256,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    "sliding_window": 512, "sliding_window_pattern": 6, "hidden_activation": "gelu_pytorch_tanh",
    "final_logit_softcapping": null, "attn_logit_softcapping": null})";
  const ModelConfig c = Parse(gemma);
  EXPECT_TRUE(c.gemma_layers);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.query_pre_attn_scalar, 256);
  EXPECT_EQ(c.rope.type, RopeType::kLinear);
  EXPECT_EQ(c.rope.factor, 8.0);
  EXPECT_EQ(c.rope.theta, 1e6);
  ASSERT_TRUE(c.sliding_rope.has_value());
  EXPECT_EQ(c.sliding_rope->type, RopeType::kDefault);
  EXPECT_EQ(c.sliding_rope->theta, 1e4);
  for (int64_t i = 0; i < 7; ++i) EXPECT_EQ(Window(c, i), i == 5 ? 0 : 512) << i;
  // Parameters: embeddings (tied), and per layer q, k, v, o, the MLP, four norms and q/k norms.
  EXPECT_EQ(c.ParameterCount(),
            7 * (640 * 1024 + 2 * 640 * 256 + 1024 * 640 + 3 * 640 * 2048 + 4 * 640 + 2 * 256) + 262144 * 640 + 640);
  // The config as trained with YaRN: the global layers' scaling, read back as trained, in both
  // transformers generations' keys; the local layers keep theirs.
  RopeScalingOverride yarn;
  yarn.type = RopeType::kYarn;
  yarn.factor = 4.0;
  auto written = EffectiveConfigJson(gemma, ApplyRopeScaling(c, yarn), "config.json");
  ASSERT_TRUE(written.ok()) << written.status();
  const ModelConfig back = Parse(*written);
  EXPECT_EQ(back.rope.type, RopeType::kYarn);
  EXPECT_EQ(back.rope.theta, 1e6);
  ASSERT_TRUE(back.sliding_rope.has_value());
  EXPECT_EQ(back.sliding_rope->type, RopeType::kDefault);
  EXPECT_EQ(back.sliding_rope->theta, 1e4);
  const auto j = nlohmann::json::parse(*written);
  EXPECT_EQ(j["rope_scaling"]["rope_type"], "yarn");
  EXPECT_EQ(j["rope_local_base_freq"], 1e4);
  const auto error = [&](const std::string& from, const std::string& to) {
    std::string text = gemma;
    text.replace(text.find(from), from.size(), to);
    return std::string(ParseModelConfig(text, "config.json").status().message());
  };
  EXPECT_THAT(error(R"("final_logit_softcapping": null)", R"("final_logit_softcapping": 30.0)"),
              HasSubstr("config.json: this Gemma 3 variant is not supported"));
  EXPECT_THAT(error(R"("gelu_pytorch_tanh")", R"("silu")"), HasSubstr("hidden_activation gelu_pytorch_tanh"));
}

// Phi-4-mini's config.json as published (transformers 4 keys): fused projections, longrope with
// its factors over the rotary 3/4 of a head, the pretraining window at the top level; LoRA
// targets resolve to the fused layers; a job's RoPE scaling cannot replace longrope.
TEST(ModelConfigTest, Phi4MiniAsPublished) {
  std::vector<double> factors(48, 1.0);
  nlohmann::json phi = {{"architectures", {"Phi3ForCausalLM"}},
                        {"model_type", "phi3"},
                        {"vocab_size", 200064},
                        {"hidden_size", 3072},
                        {"intermediate_size", 8192},
                        {"num_hidden_layers", 32},
                        {"num_attention_heads", 24},
                        {"num_key_value_heads", 8},
                        {"max_position_embeddings", 131072},
                        {"original_max_position_embeddings", 4096},
                        {"partial_rotary_factor", 0.75},
                        {"rope_theta", 10000.0},
                        {"rope_scaling", {{"type", "longrope"}, {"short_factor", factors}, {"long_factor", factors}}},
                        {"sliding_window", 262144},
                        {"tie_word_embeddings", true}};
  const ModelConfig c = Parse(phi.dump());
  EXPECT_TRUE(c.fused_projections);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rope_dim(), 96);
  EXPECT_EQ(c.rope.type, RopeType::kLongrope);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(c.rope.factor, 32.0);
  EXPECT_DOUBLE_EQ(c.rope.attention_factor, std::sqrt(1 + std::log(32.0) / std::log(4096.0)));
  EXPECT_EQ(Window(c, 0), 262144);
  // 3.84B parameters, as Microsoft gives it: q, k, v and gate, up fused change no count.
  EXPECT_EQ(c.ParameterCount(),
            int64_t{32} * (3072 * 3072 + 2 * 3072 * 1024 + 3072 * 3072 + 3 * 3072 * 8192 + 2 * 3072) +
                int64_t{200064} * 3072 + 3072);

  const auto targets = ResolveLoraTargets(
      c, {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"});  // the spec's default
  ASSERT_TRUE(targets.ok()) << targets.status();
  EXPECT_THAT(*targets, ::testing::ElementsAre("qkv_proj", "o_proj", "gate_up_proj", "down_proj"));
  EXPECT_THAT(ResolveLoraTargets(c, {"q_proj", "v_proj"}).status().message(),
              HasSubstr("method.lora.target_modules: Phi3ForCausalLM fuses q_proj, k_proj, v_proj into one layer "
                        "(qkv_proj)"));
  EXPECT_THAT(ResolveLoraTargets(c, {"fc1"}).status().message(),
              HasSubstr("unknown module 'fc1' for Phi3ForCausalLM (its linear layers: qkv_proj, o_proj, gate_up_proj, "
                        "down_proj)"));
  // The config as trained is the base config: longrope is the model's own.
  auto written = EffectiveConfigJson(phi.dump(), c, "config.json");
  ASSERT_TRUE(written.ok());
  EXPECT_EQ(nlohmann::json::parse(*written), phi);
  EXPECT_FALSE(RopeScalingOf(c.rope).has_value());

  phi["rope_scaling"]["long_factor"] = std::vector<double>(64, 1.0);  // a full head's worth
  EXPECT_THAT(ParseModelConfig(phi.dump(), "config.json").status().message(),
              HasSubstr("must have rotary_dim / 2 = 48 entries, got 48 and 64"));
  phi["partial_rotary_factor"] = 1.5;
  EXPECT_THAT(ParseModelConfig(phi.dump(), "config.json").status().message(), HasSubstr("partial_rotary_factor"));
}

// A Gemma 3 vision-language checkpoint's config (Gemma-3-4B's, as transformers 4 saved it: the
// text_config holds only what differs from Gemma3TextConfig's defaults) reads as its language
// model; the RoPE scaling a job trains with is written into text_config.
TEST(ModelConfigTest, Gemma3MultimodalReadsItsLanguageModel) {
  const std::string gemma = R"({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
    "boi_token_index": 255999, "image_token_index": 262144, "mm_tokens_per_image": 256,
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
      "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024},
    "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model", "num_hidden_layers": 27}})";
  const ModelConfig c = Parse(gemma);
  EXPECT_TRUE(c.multimodal_text);
  EXPECT_TRUE(c.gemma_layers);
  EXPECT_EQ(c.architecture, "Gemma3ForCausalLM");
  EXPECT_EQ(c.vocab_size, 262208);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.query_pre_attn_scalar, 256);
  EXPECT_EQ(c.rope.type, RopeType::kLinear);
  EXPECT_EQ(c.rope.theta, 1e6);
  ASSERT_TRUE(c.sliding_rope.has_value());
  EXPECT_EQ(c.sliding_rope->theta, 1e4);
  for (int64_t i = 0; i < 34; ++i) EXPECT_EQ(Window(c, i), (i + 1) % 6 == 0 ? 0 : 1024) << i;
  RopeScalingOverride yarn;
  yarn.type = RopeType::kYarn;
  yarn.factor = 16.0;
  auto written = EffectiveConfigJson(gemma, ApplyRopeScaling(c, yarn), "config.json");
  ASSERT_TRUE(written.ok());
  const auto j = nlohmann::json::parse(*written);
  EXPECT_EQ(j["text_config"]["rope_scaling"]["rope_type"], "yarn");
  EXPECT_FALSE(j.contains("rope_scaling"));
  EXPECT_EQ(j["vision_config"]["num_hidden_layers"], 27);
  EXPECT_EQ(Parse(*written).rope.type, RopeType::kYarn);
  EXPECT_THAT(ParseModelConfig(R"({"model_type": "gemma3"})", "config.json").status().message(),
              HasSubstr("config.json: missing key 'text_config'"));
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
