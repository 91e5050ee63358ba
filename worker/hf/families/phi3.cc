// Phi3ForCausalLM (Phi-3, Phi-4-mini): q, k and v in one linear layer and gate and up in
// another (fused projections), longrope over the top-level original_max_position_embeddings,
// partial rotary (read with the RoPE), its sliding_window on every layer.
#include "worker/common/status.h"
#include "worker/hf/families/common.h"
#include "worker/hf/family.h"
#include "worker/hf/json_reader.h"

namespace oomb {
namespace {

absl::Status ParsePhi3(const nlohmann::json& root, const std::string& source, ModelConfig* c) {
  c->fused_projections = true;
  // The pretraining window, for longrope (ParseModelConfig reads the RoPE after this).
  OOMB_RETURN_IF_ERROR(JsonReader(root, source)
                           .IntIn("original_max_position_embeddings", &c->rope.original_max_position_embeddings, 1,
                                  kMaxPositionEmbeddings));
  return families::ParseSlidingWindow(root, source, c);
}

// Phi-4-mini-instruct: RoPE over 96 of 128 features, longrope past 4096 (factors of 1: the
// speed does not depend on them), its sliding_window of 262144.
nlohmann::json Phi4MiniPreset() {
  const std::vector<double> ones(48, 1.0);
  return families::PresetConfig(
      "Phi3ForCausalLM", "phi3",
      {{"vocab_size", 200064},
       {"hidden_size", 3072},
       {"intermediate_size", 8192},
       {"num_hidden_layers", 32},
       {"num_attention_heads", 24},
       {"num_key_value_heads", 8},
       {"tie_word_embeddings", true},
       {"partial_rotary_factor", 0.75},
       {"rope_theta", 10000.0},
       {"original_max_position_embeddings", 4096},
       {"rope_scaling", {{"type", "longrope"}, {"factor", 32.0}, {"short_factor", ones}, {"long_factor", ones}}},
       {"sliding_window", 262144}});
}

}  // namespace

Family Phi3Family() {
  return {.architecture = "Phi3ForCausalLM",
          .model_type = "phi3",
          .parse = ParsePhi3,
          .presets = {{"phi-4-mini", Phi4MiniPreset()}}};
}

}  // namespace oomb
