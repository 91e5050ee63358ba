// Qwen2ForCausalLM (Qwen2, Qwen2.5): Llama's layer with q, k and v biased; every layer attends
// the whole past here (Qwen2's use_sliding_window is refused).
#include "worker/common/status.h"
#include "worker/hf/families/common.h"
#include "worker/hf/family.h"

namespace oomb {
namespace {

absl::Status ParseQwen2(const nlohmann::json& root, const std::string& source, ModelConfig* c) {
  c->qkv_bias = true;
  return families::RefuseSlidingWindows(root, source);
}

ModelPreset Qwen2Preset(const std::string& name, nlohmann::json shape) {
  return {name, families::PresetConfig("Qwen2ForCausalLM", "qwen2", std::move(shape))};
}

}  // namespace

Family Qwen2Family() {
  return {.architecture = "Qwen2ForCausalLM",
          .model_type = "qwen2",
          .parse = ParseQwen2,
          .presets = {Qwen2Preset("qwen2.5-7b", {{"vocab_size", 152064},
                                                 {"hidden_size", 3584},
                                                 {"intermediate_size", 18944},
                                                 {"num_hidden_layers", 28},
                                                 {"num_attention_heads", 28},
                                                 {"num_key_value_heads", 4},
                                                 {"tie_word_embeddings", false}}),
                      Qwen2Preset("qwen2.5-0.5b", {{"vocab_size", 151936},
                                                   {"hidden_size", 896},
                                                   {"intermediate_size", 4864},
                                                   {"num_hidden_layers", 24},
                                                   {"num_attention_heads", 14},
                                                   {"num_key_value_heads", 2},
                                                   {"tie_word_embeddings", true}}),
                      // For trying the benchmark on the CPU.
                      Qwen2Preset("tiny", {{"vocab_size", 512},
                                           {"hidden_size", 128},
                                           {"intermediate_size", 256},
                                           {"num_hidden_layers", 2},
                                           {"num_attention_heads", 4},
                                           {"num_key_value_heads", 2}})}};
}

}  // namespace oomb
