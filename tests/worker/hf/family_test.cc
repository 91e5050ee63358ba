// The registry of families (worker/hf/family.h) and the layers they describe
// (worker/hf/layer_spec.h): which family a config.json is, what each preset's layers are, and
// that the forward's linear layers and the LoRA targets come from the same description.
#include "worker/hf/family.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "worker/hf/layer_spec.h"

namespace oomb {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ModelConfig Preset(const std::string& name) {
  absl::StatusOr<ModelConfig> c = PresetConfig(name);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : ModelConfig();
}

int64_t Count(const std::vector<int64_t>& windows, int64_t window) {
  return std::count(windows.begin(), windows.end(), window);
}

TEST(FamilyTest, TheFirstFamilyThatMatchesWins) {
  // model_type is matched before architecture within a family, families in registry order.
  EXPECT_EQ(FindFamily("LlamaForCausalLM", "qwen2")->model_type, "llama");
  EXPECT_EQ(FindFamily("SomethingElse", "qwen3")->architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(FindFamily("Phi3ForCausalLM", "")->model_type, "phi3");
  EXPECT_EQ(FindFamily("GPTNeoXForCausalLM", "gpt_neox"), nullptr);
  std::vector<std::string> architectures;
  for (const Family& f : Families()) architectures.push_back(f.architecture);
  EXPECT_THAT(architectures, ElementsAre("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                                         "Qwen3MoeForCausalLM", "MixtralForCausalLM", "GptOssForCausalLM",
                                         "MistralForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM"));
}

// gpt-oss: sinks, biases and windows by default (GptOssConfig's: layer_types alternating a window
// of 128, the window first), the experts' clamped SwiGLU, banks stored whole; MXFP4 checkpoints
// read, other quantizations refused naming the key.
TEST(FamilyTest, GptOss) {
  const ModelConfig g = Preset("gpt-oss-20b");
  const ModelSpec spec = DescribeModel(g);
  EXPECT_TRUE(g.attention_sinks && g.qkv_bias && g.o_bias && g.moe.biases && g.moe.stored_banks && g.moe.renormalize);
  EXPECT_EQ(g.rope.type, RopeType::kYarn);
  EXPECT_FALSE(g.rope.truncate);
  EXPECT_EQ(Count(spec.Windows(), 128), 12);
  EXPECT_EQ(spec.layers[0].window, 128);
  EXPECT_EQ(spec.layers[1].window, 0);
  EXPECT_EQ(spec.layers[1].sinks, 64);
  EXPECT_EQ(spec.layers[1].moe->swiglu_limit, 7.0);
  // Every tensor of the published checkpoint's shapes, dequantized: 20.9B parameters, 3.6B active.
  const int64_t H = 2880, I = 2880, E = 32, attention = H * 4096 + 4096 + 2 * (H * 512 + 512) + 4096 * H + H + 64;
  const int64_t expert = H * 2 * I + 2 * I + I * H + H, layer = attention + 2 * H + E * (H + 1) + E * expert;
  EXPECT_EQ(spec.ParameterCount(g), 2 * 201088 * H + H + 24 * layer);
  EXPECT_EQ(spec.ParameterCount(g), 20914757184);

  const std::string text = R"({"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": 10,
      "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 2,
      "num_key_value_heads": 1, "head_dim": 32, "max_position_embeddings": 64, "num_local_experts": 4,
      "num_experts_per_tok": 2, "sliding_window": 8, "quantization_config": {"quant_method": "mxfp4"}})";
  absl::StatusOr<ModelConfig> c = ParseModelConfig(text, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->sliding_layers, ElementsAre(true, false, true, false));
  EXPECT_EQ(c->moe.swiglu_alpha, 1.702);
  std::string other = text;
  other.replace(other.find("mxfp4"), 5, "bitsandbytes");
  const absl::Status bad = ParseModelConfig(other, "config.json").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(bad.message(), HasSubstr("quantization_config"));
}

TEST(FamilyTest, AnUnknownPresetNamesTheOthers) {
  const absl::StatusOr<ModelConfig> c = PresetConfig("llama-70b");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr("qwen2.5-7b, qwen2.5-0.5b, tiny, qwen3-8b"));
}

// Parameter counts as Hugging Face reports them for the real models.
TEST(FamilyTest, PresetsCountTheRealModelsParameters) {
  EXPECT_EQ(Preset("qwen2.5-7b").ParameterCount(), 7615616512);
  EXPECT_EQ(Preset("phi-4-mini").ParameterCount(), 3836021760);
  EXPECT_EQ(Preset("mixtral-8x7b").ParameterCount(), 46702792704);
  EXPECT_EQ(Preset("qwen3-32b").ParameterCount(), 32762123264);      // 65,524,246,528 bytes in bfloat16
  EXPECT_EQ(Preset("llama-3.3-70b").ParameterCount(), 70553706496);  // 141,107,412,992 bytes
}

// A mixture of experts: which layers are sparse, the parameters Qwen3-30B-A3B has (30.5B) and
// those a token computes with (3.3B, what model FLOPs count), the expert banks LoRA adapts, and
// the configs and targets refused, naming the key or field.
TEST(FamilyTest, MixtureOfExpertsLayers) {
  const ModelConfig q = Preset("qwen3-30b-a3b");
  const ModelSpec spec = DescribeModel(q);
  ASSERT_TRUE(spec.layers[0].moe.has_value());
  EXPECT_EQ(spec.ParameterCount(q), 30532122624);
  const double t = 4096, active = 3353032704;
  EXPECT_DOUBLE_EQ(spec.TrainingFlops(q, 4096), 6.0 * active * t + 6.0 * q.q_dim() * q.num_layers * t * t);
  EXPECT_EQ(spec.layers[0].linears.size(), 4u);  // the attention's: the MLP is the experts

  const std::string sparse_every_2nd = R"({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
      "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 4,
      "num_attention_heads": 2, "max_position_embeddings": 64, "num_experts": 4, "num_experts_per_tok": 2,
      "moe_intermediate_size": 4, "decoder_sparse_step": 2, "mlp_only_layers": [1], "norm_topk_prob": true})";
  absl::StatusOr<ModelConfig> c = ParseModelConfig(sparse_every_2nd, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->moe.layers, ElementsAre(false, false, false, true));
  EXPECT_TRUE(c->moe.renormalize);
  EXPECT_EQ(DescribeModel(*c).layers[3].moe->intermediate, 4);
  EXPECT_EQ(c->moe.aux_loss_coef, 0);  // output_router_logits false (transformers' default): no auxiliary loss
  // The router's auxiliary loss: transformers' default coefficient, or the config's.
  std::string aux = sparse_every_2nd;
  aux.insert(aux.rfind('}'), R"(, "output_router_logits": true)");
  EXPECT_EQ(ParseModelConfig(aux, "config.json")->moe.aux_loss_coef, 0.001);
  aux.insert(aux.rfind('}'), R"(, "router_aux_loss_coef": 0.25)");
  EXPECT_EQ(ParseModelConfig(aux, "config.json")->moe.aux_loss_coef, 0.25);
  for (const auto& [from, to, key] :
       {std::tuple{"\"norm_topk_prob\": true",
                   "\"norm_topk_prob\": true, \"output_router_logits\": true, \"router_aux_loss_coef\": -1",
                   "router_aux_loss_coef"},
        {"\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 5", "num_experts_per_tok"},
        {"[1]", "[7]", "mlp_only_layers"}}) {
    std::string text = sparse_every_2nd;
    text.replace(text.find(from), std::string(from).size(), to);
    const absl::Status bad = ParseModelConfig(text, "config.json").status();
    EXPECT_FALSE(bad.ok()) << key;
    EXPECT_THAT(bad.message(), HasSubstr(key));
  }

  // The MLP's names adapt the experts (gate_proj with up_proj: gate_up_proj at twice the rank,
  // as PEFT fuses them); target_parameters by a suffix at a dot.
  const std::vector<std::string> every = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  auto banks = ResolveLoraExpertTargets(q, every, {}, 0);
  ASSERT_TRUE(banks.ok()) << banks.status();
  ASSERT_EQ(banks->size(), 2u);
  EXPECT_EQ((*banks)[0].bank, "gate_up_proj");
  EXPECT_EQ((*banks)[0].rank_factor, 2);
  EXPECT_EQ((*banks)[1].bank, "down_proj");
  EXPECT_EQ((*banks)[1].rank_factor, 1);
  EXPECT_THAT(*ResolveLoraTargets(q, every), ElementsAre("q_proj", "k_proj", "v_proj", "o_proj"));
  // Beside dense layers (mlp_only_layers) the MLP's names adapt those layers' MLP as well, as
  // PEFT 0.22 reads them (0.21: the banks alone).
  EXPECT_THAT(*ResolveLoraTargets(*c, every),
              ElementsAre("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"));
  EXPECT_EQ(ResolveLoraExpertTargets(*c, every, {}, 0)->size(), 2u);
  banks = ResolveLoraExpertTargets(q, {"q_proj"}, {"experts.down_proj", "mlp.experts.gate_up_proj"}, 0);
  ASSERT_TRUE(banks.ok()) << banks.status();
  ASSERT_EQ(banks->size(), 2u);
  EXPECT_EQ((*banks)[0].bank, "gate_up_proj");
  EXPECT_EQ((*banks)[0].rank_factor, 1);
  EXPECT_TRUE(ResolveLoraExpertTargets(q, {"q_proj"}, {}, 0.1)->empty());  // attention only: dropout is fine
  // Refused: a target naming nothing, experts with dropout, half of a fused bank, experts of a dense model.
  for (const absl::Status& bad :
       {ResolveLoraExpertTargets(q, {"q_proj"}, {"mlp.experts.up_proj"}, 0).status(),
        ResolveLoraExpertTargets(q, every, {}, 0.1).status(), ResolveLoraTargets(q, {"gate_proj"}).status(),
        ResolveLoraTargets(*c, {"gate_proj", "down_proj"}).status(),
        ResolveLoraExpertTargets(Preset("qwen3-8b"), {"q_proj"}, {"down_proj"}, 0).status()}) {
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(bad.message(), HasSubstr("method.lora."));
  }
}

// Model FLOPs of training, block by block: 6 per weight per token, 12 per query-key pair per
// query feature. Two layers with one 10x10 linear each, q_dim 64, a window of 4 in the first:
// over 10 tokens it sees 4 * 10 - 4 * 4 / 2 = 32 pairs, the second 10 * 10 / 2 = 50; a window as
// long as the sequence is the whole past.
TEST(FamilyTest, TrainingFlopsAddUpTheBlocks) {
  ModelConfig c;
  c.vocab_size = 10;
  c.hidden_size = 4;
  c.tie_word_embeddings = true;
  c.num_heads = 2;
  c.head_dim = 32;
  ModelSpec spec;
  LayerSpec layer;
  layer.linears = {{"proj", true, 10, 10, false}};
  spec.layers = {layer, layer};
  spec.layers[0].window = 4;
  const int64_t n = 10 * 4 + 4 + 2 * 100;
  ASSERT_EQ(spec.ParameterCount(c), n);
  EXPECT_DOUBLE_EQ(spec.TrainingFlops(c, 10), 6.0 * n * 10 + 12.0 * 64 * (32 + 50));
  EXPECT_DOUBLE_EQ(spec.TrainingFlops(c, 0), 0);
  spec.layers[0].window = 10;
  EXPECT_DOUBLE_EQ(spec.TrainingFlops(c, 10), 6.0 * n * 10 + 12.0 * 64 * (50 + 50));
  // Qwen2.5-7B, every layer global: 6 N T + 6 d L T^2.
  const ModelConfig qwen = Preset("qwen2.5-7b");
  const double t = 16384;
  EXPECT_DOUBLE_EQ(DescribeModel(qwen).TrainingFlops(qwen, 16384),
                   6.0 * 7615616512 * t + 6.0 * qwen.q_dim() * qwen.num_layers * t * t);
}

TEST(FamilyTest, PresetLayersAreTheFamilysLayers) {
  const ModelSpec qwen2 = DescribeModel(Preset("qwen2.5-7b"));
  EXPECT_EQ(qwen2.norm, NormKind::kRms);
  EXPECT_EQ(qwen2.layers.size(), 28u);
  EXPECT_TRUE(qwen2.layers[0].linears[0].bias);   // q_proj
  EXPECT_FALSE(qwen2.layers[0].linears[3].bias);  // o_proj
  EXPECT_FALSE(qwen2.layers[0].Has(NormRole::kQuery));

  const ModelSpec qwen3 = DescribeModel(Preset("qwen3-8b"));
  EXPECT_TRUE(qwen3.layers[0].Has(NormRole::kQuery) && qwen3.layers[0].Has(NormRole::kKey));
  EXPECT_FALSE(qwen3.layers[0].linears[0].bias);

  const ModelConfig gemma_config = Preset("gemma-3-12b");
  const ModelSpec gemma = DescribeModel(gemma_config);
  EXPECT_EQ(gemma.norm, NormKind::kRmsOnePlusWeight);
  EXPECT_TRUE(gemma.scale_embeddings);
  EXPECT_DOUBLE_EQ(gemma.query_scale, 1.0);  // query_pre_attn_scalar 256 = head_dim
  EXPECT_EQ(gemma.layers[0].mlp, MlpKind::kGeluTanhGlu);
  EXPECT_EQ(gemma.layers[0].HiddenNorms(), 4);
  EXPECT_EQ(Count(gemma.Windows(), 1024), 40);
  EXPECT_EQ(Count(gemma.Windows(), 0), 8);
  EXPECT_TRUE(gemma.layers[0].local_rope);
  EXPECT_FALSE(gemma.layers[5].local_rope);
  EXPECT_EQ(gemma_config.rope.type, RopeType::kLinear);
  EXPECT_FALSE(DescribeModel(Preset("gemma-3-12b-global")).HasWindows());

  const ModelConfig phi_config = Preset("phi-4-mini");
  const ModelSpec phi = DescribeModel(phi_config);
  EXPECT_TRUE(phi.layers[0].fused_projections);
  EXPECT_EQ(phi.layers[0].linears[0].name, "qkv_proj");
  EXPECT_EQ(Count(phi.Windows(), 262144), 32);
  EXPECT_EQ(phi_config.rope_dim(), 96);
  EXPECT_EQ(phi_config.rope.type, RopeType::kLongrope);
  EXPECT_DOUBLE_EQ(phi_config.rope.factor, 32);
}

// The linear layers LoRA can target are the forward's, for every family and preset.
TEST(FamilyTest, LoraTargetsAreTheLayersLinears) {
  for (const std::string& name : PresetNames()) {
    const ModelConfig c = Preset(name);
    std::vector<std::string> names;
    const ModelSpec spec = DescribeModel(c);
    for (const LinearSpec& l : spec.layers.back().linears) names.push_back(l.name);
    const absl::StatusOr<std::vector<std::string>> all = ResolveLoraTargets(c, names);
    ASSERT_TRUE(all.ok()) << name << ": " << all.status();
    EXPECT_EQ(*all, names) << name;
    const absl::StatusOr<std::vector<std::string>> parts =
        ResolveLoraTargets(c, {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"});
    ASSERT_TRUE(parts.ok()) << name << ": " << parts.status();
    EXPECT_EQ(*parts, names) << name;  // fused layers named through their parts
  }
}

}  // namespace
}  // namespace oomb
