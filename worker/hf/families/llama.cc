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
  return {.architecture = "LlamaForCausalLM", .model_type = "llama", .parse = ParseLlama, .presets = {}};
}

}  // namespace oomb
