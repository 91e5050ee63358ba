// Qwen3ForCausalLM (Qwen3 dense): an RMSNorm over each head of q and of k before RoPE, biases
// where attention_bias says, every layer attending the whole past.
#include "worker/common/status.h"
#include "worker/hf/families/common.h"
#include "worker/hf/family.h"

namespace oomb {
namespace {

absl::Status ParseQwen3(const nlohmann::json& root, const std::string& source, ModelConfig* c) {
  c->qk_norm = true;
  OOMB_RETURN_IF_ERROR(families::ParseAttentionBias(root, source, c));
  return families::RefuseSlidingWindows(root, source);
}

}  // namespace

Family Qwen3Family() {
  return {.architecture = "Qwen3ForCausalLM",
          .model_type = "qwen3",
          .parse = ParseQwen3,
          .presets = {{"qwen3-8b", families::PresetConfig("Qwen3ForCausalLM", "qwen3",
                                                          {{"vocab_size", 151936},
                                                           {"hidden_size", 4096},
                                                           {"intermediate_size", 12288},
                                                           {"num_hidden_layers", 36},
                                                           {"num_attention_heads", 32},
                                                           {"num_key_value_heads", 8},
                                                           {"tie_word_embeddings", false}})},
                      {"qwen3-32b", families::PresetConfig("Qwen3ForCausalLM", "qwen3",
                                                           {{"vocab_size", 151936},
                                                            {"hidden_size", 5120},
                                                            {"intermediate_size", 25600},
                                                            {"num_hidden_layers", 64},
                                                            {"num_attention_heads", 64},
                                                            {"num_key_value_heads", 8},
                                                            {"head_dim", 128},
                                                            {"tie_word_embeddings", false}})}}};
}

}  // namespace oomb
