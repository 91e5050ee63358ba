// GptOssForCausalLM (gpt-oss-20b, gpt-oss-120b): attention with q, k, v and o biases and a sink
// logit per head, sliding-window layers (layer_types; transformers' default alternates a window
// of sliding_window with a global layer, the window first), YaRN RoPE, and a mixture of experts
// in every layer: a router with a bias, the top num_experts_per_tok of num_local_experts experts
// weighted by a softmax over their logits, each expert of intermediate_size with biases and the
// clamped SwiGLU over interleaved gate and up rows (MoeConfig). The checkpoint keeps each expert
// bank whole, [E, in, out], in bfloat16 or MXFP4 (quantization_config quant_method "mxfp4", the
// published checkpoints), dequantized at load as transformers does.
#include "absl/strings/str_cat.h"
#include "worker/common/status.h"
#include "worker/hf/families/common.h"
#include "worker/hf/family.h"
#include "worker/hf/json_reader.h"

namespace oomb {
namespace {

using nlohmann::json;

absl::Status ParseQuantization(const json& root, const std::string& source) {
  const auto it = root.find("quantization_config");
  if (it == root.end() || it->is_null()) return absl::OkStatus();
  const auto method = it->is_object() ? it->find("quant_method") : it->end();
  if (method != it->end() && *method == "mxfp4") return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(source, ": quantization_config ", it->dump(),
                                               " is not supported (oomb dequantizes quant_method \"mxfp4\")"));
}

absl::Status ParseGptOss(const json& root, const std::string& source, ModelConfig* c) {
  const JsonReader r(root, source);
  c->attention_sinks = true;
  bool attention_bias = true;  // GptOssConfig's default
  OOMB_RETURN_IF_ERROR(r.Bool("attention_bias", &attention_bias));
  c->qkv_bias = c->o_bias = attention_bias;
  OOMB_RETURN_IF_ERROR(ParseQuantization(root, source));
  json windows = root;
  if (!root.contains("layer_types") || root["layer_types"].is_null()) {  // GptOssConfig's default
    json types = json::array();
    for (int64_t i = 0; i < c->num_layers; ++i) types.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
    windows["layer_types"] = std::move(types);
  }
  if (!windows.contains("sliding_window")) windows["sliding_window"] = 128;
  OOMB_RETURN_IF_ERROR(families::ParseSlidingWindow(windows, source, c));
  OOMB_RETURN_IF_ERROR(families::ParseMoe(root, source, "num_local_experts", c));
  MoeConfig& moe = c->moe;
  moe.intermediate = c->intermediate_size;
  moe.renormalize = true;
  moe.biases = true;
  moe.stored_banks = true;
  moe.swiglu_alpha = 1.702;
  moe.swiglu_limit = 7.0;
  OOMB_RETURN_IF_ERROR(r.DoubleIn("swiglu_limit", &moe.swiglu_limit, 0, 1e9, /*lo_open=*/true));
  OOMB_RETURN_IF_ERROR(r.DoubleIn("swiglu_alpha", &moe.swiglu_alpha, 0, 1e9, /*lo_open=*/true));
  return absl::OkStatus();
}

// gpt-oss-20b's config.json (without its quantization: the preset's weights are bfloat16).
json GptOss20bPreset() {
  json rope = {{"rope_type", "yarn"},   {"factor", 32.0},    {"beta_fast", 32.0},
               {"beta_slow", 1.0},      {"truncate", false}, {"original_max_position_embeddings", 4096},
               {"rope_theta", 150000.0}};
  json shape = {{"vocab_size", 201088},      {"hidden_size", 2880},      {"intermediate_size", 2880},
                {"num_local_experts", 32},   {"num_experts_per_tok", 4}, {"num_hidden_layers", 24},
                {"num_attention_heads", 64}, {"num_key_value_heads", 8}, {"head_dim", 64},
                {"sliding_window", 128},     {"rms_norm_eps", 1e-5},     {"tie_word_embeddings", false},
                {"rope_parameters", rope}};
  return families::PresetConfig("GptOssForCausalLM", "gpt_oss", std::move(shape));
}

}  // namespace

Family GptOssFamily() {
  return {.architecture = "GptOssForCausalLM",
          .model_type = "gpt_oss",
          .parse = ParseGptOss,
          .presets = {{"gpt-oss-20b", GptOss20bPreset()}}};
}

}  // namespace oomb
