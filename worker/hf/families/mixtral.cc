// MixtralForCausalLM: Mistral's attention (its sliding_window where set) and a mixture of experts
// in every layer: num_local_experts experts of intermediate_size, num_experts_per_tok of them per
// token, always renormalised, their weights applied in float32; the checkpoint keeps them under
// block_sparse_moe, each expert's projections named w1 (gate), w3 (up) and w2 (down).
#include "worker/common/status.h"
#include "worker/hf/families/common.h"
#include "worker/hf/family.h"

namespace oomb {
namespace {

absl::Status ParseMixtral(const nlohmann::json& root, const std::string& source, ModelConfig* c) {
  OOMB_RETURN_IF_ERROR(families::ParseSlidingWindow(root, source, c));
  OOMB_RETURN_IF_ERROR(families::ParseMoe(root, source, "num_local_experts", c));
  c->moe.intermediate = c->intermediate_size;
  c->moe.renormalize = true;
  c->moe.float_scores = true;
  c->moe.stored_block = "block_sparse_moe";
  c->moe.stored_projections = {"w1", "w3", "w2"};
  return absl::OkStatus();
}

}  // namespace

Family MixtralFamily() {
  return {.architecture = "MixtralForCausalLM",
          .model_type = "mixtral",
          .parse = ParseMixtral,
          // Mixtral-8x7B-v0.1.
          .presets = {{"mixtral-8x7b", families::PresetConfig("MixtralForCausalLM", "mixtral",
                                                              {{"vocab_size", 32000},
                                                               {"hidden_size", 4096},
                                                               {"intermediate_size", 14336},
                                                               {"num_local_experts", 8},
                                                               {"num_experts_per_tok", 2},
                                                               {"num_hidden_layers", 32},
                                                               {"num_attention_heads", 32},
                                                               {"num_key_value_heads", 8},
                                                               {"tie_word_embeddings", false}})}}};
}

}  // namespace oomb
