// MistralForCausalLM: Llama's layer without biases, with its sliding_window on every layer (or
// the layers layer_types marks sliding_attention).
#include "worker/hf/families/common.h"
#include "worker/hf/family.h"

namespace oomb {
namespace {

absl::Status ParseMistral(const nlohmann::json& root, const std::string& source, ModelConfig* c) {
  return families::ParseSlidingWindow(root, source, c);
}

}  // namespace

Family MistralFamily() {
  return {.architecture = "MistralForCausalLM",
          .model_type = "mistral",
          .parse = ParseMistral,
          // Mistral-7B-v0.3: sliding_window null.
          .presets = {{"mistral-7b", families::PresetConfig("MistralForCausalLM", "mistral",
                                                            {{"vocab_size", 32768},
                                                             {"hidden_size", 4096},
                                                             {"intermediate_size", 14336},
                                                             {"num_hidden_layers", 32},
                                                             {"num_attention_heads", 32},
                                                             {"num_key_value_heads", 8},
                                                             {"tie_word_embeddings", false}})}}};
}

}  // namespace oomb
