// LlamaForCausalLM (Llama 2, 3, 3.1; SmolLM2): SwiGLU layers, biases where attention_bias and
// mlp_bias say, every layer attending the whole past.
#include "worker/common/status.h"
#include "worker/hf/families/common.h"
#include "worker/hf/family.h"
#include "worker/hf/json_reader.h"

namespace oomb {
namespace {

absl::Status ParseLlama(const nlohmann::json& root, const std::string& source, ModelConfig* c) {
  OOMB_RETURN_IF_ERROR(families::ParseAttentionBias(root, source, c));
  OOMB_RETURN_IF_ERROR(JsonReader(root, source).Bool("mlp_bias", &c->mlp_bias));
  return families::RefuseSlidingWindows(root, source);
}

}  // namespace

Family LlamaFamily() {
  // Llama-3.3-70B's shape (its config.json: llama3 RoPE scaling of 8 over 8,192 positions).
  return {.architecture = "LlamaForCausalLM",
          .model_type = "llama",
          .parse = ParseLlama,
          .presets = {{"llama-3.3-70b", families::PresetConfig("LlamaForCausalLM", "llama",
                                                               {{"vocab_size", 128256},
                                                                {"hidden_size", 8192},
                                                                {"intermediate_size", 28672},
                                                                {"num_hidden_layers", 80},
                                                                {"num_attention_heads", 64},
                                                                {"num_key_value_heads", 8},
                                                                {"rms_norm_eps", 1e-5},
                                                                {"rope_theta", 500000.0},
                                                                {"rope_scaling",
                                                                 {{"rope_type", "llama3"},
                                                                  {"factor", 8.0},
                                                                  {"low_freq_factor", 1.0},
                                                                  {"high_freq_factor", 4.0},
                                                                  {"original_max_position_embeddings", 8192}}},
                                                                {"tie_word_embeddings", false}})}}};
}

}  // namespace oomb
