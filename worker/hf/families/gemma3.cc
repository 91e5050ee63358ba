// Gemma3ForCausalLM, and the language model of a Gemma3ForConditionalGeneration checkpoint:
// every RMSNorm scales by 1 + weight, the attention's and the MLP's outputs are normed too, q and
// k are normed per head, embeddings are scaled by sqrt(hidden_size), the MLP gates with GELU
// (tanh), scores are scaled by query_pre_attn_scalar^-1/2, and the local layers attend a
// sliding window with their own RoPE. What oomb does not compute is refused by name.
#include "absl/strings/str_cat.h"
#include "worker/common/status.h"
#include "worker/hf/families/common.h"
#include "worker/hf/family.h"
#include "worker/hf/json_reader.h"

namespace oomb {
namespace {

using nlohmann::json;

absl::Status ParseGemma3(const json& root, const std::string& source, ModelConfig* c) {
  const JsonReader r(root, source);
  c->gemma_layers = true;
  c->qk_norm = true;
  c->tie_word_embeddings = true;  // Gemma3TextConfig's default
  OOMB_RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &c->tie_word_embeddings));
  OOMB_RETURN_IF_ERROR(r.DoubleIn("query_pre_attn_scalar", &c->query_pre_attn_scalar, 0, 1e9, /*lo_open=*/true));
  std::string activation = "gelu_pytorch_tanh";
  OOMB_RETURN_IF_ERROR(r.String("hidden_activation", &activation));
  bool bidirectional = false;
  OOMB_RETURN_IF_ERROR(r.Bool("use_bidirectional_attention", &bidirectional));
  double softcap = 0;
  for (const char* key : {"final_logit_softcapping", "attn_logit_softcapping"}) {
    OOMB_RETURN_IF_ERROR(r.Double(key, &softcap, false));
  }
  if (activation != "gelu_pytorch_tanh" || bidirectional || softcap != 0) {
    return absl::UnimplementedError(absl::StrCat(
        source,
        ": this Gemma 3 variant is not supported (oomb computes hidden_activation gelu_pytorch_tanh, causal "
        "attention, no logit soft-capping)"));
  }
  // transformers 4.x configs: every sliding_window_pattern-th layer (default 6) is global.
  return families::ParseSlidingWindow(root, source, c, /*pattern_default=*/6);
}

// The text model's config.json of a Gemma3ForConditionalGeneration config: its text_config over
// Gemma3TextConfig's defaults (transformers 4 saves only the keys that differ from them), with
// the checkpoint's tie_word_embeddings.
std::optional<absl::StatusOr<json>> Gemma3TextConfig(const json& root, const std::string& source) {
  const auto archs = root.find("architectures");
  const bool named =
      archs != root.end() && archs->is_array() && !archs->empty() && (*archs)[0] == "Gemma3ForConditionalGeneration";
  if (!named && !(root.contains("model_type") && root["model_type"] == "gemma3")) return std::nullopt;
  const auto it = root.find("text_config");
  if (it == root.end() || !it->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": missing key 'text_config' (an object)"));
  }
  json text = {{"vocab_size", 262208},      {"hidden_size", 2304},
               {"intermediate_size", 9216}, {"num_hidden_layers", 26},
               {"num_attention_heads", 8},  {"num_key_value_heads", 4},
               {"head_dim", 256},           {"max_position_embeddings", 131072},
               {"rms_norm_eps", 1e-6},      {"query_pre_attn_scalar", 256},
               {"sliding_window", 4096},    {"rope_theta", 1000000.0},
               {"bos_token_id", 2},         {"eos_token_id", 1}};
  if (!it->contains("rope_parameters") && !it->contains("rope_local_base_freq")) {
    text["rope_local_base_freq"] = 10000.0;
  }
  text.update(*it);
  text["architectures"] = {"Gemma3ForCausalLM"};
  text["model_type"] = "gemma3_text";
  if (const auto tie = root.find("tie_word_embeddings"); tie != root.end() && tie->is_boolean()) {
    text["tie_word_embeddings"] = *tie;
  }
  return text;
}

// Gemma-3-12B's text model: 40 of 48 layers attend a window of 1024 with their own RoPE;
// -global makes every layer global (what the windows buy).
json Gemma312bPreset(bool windows) {
  json shape = {{"vocab_size", 262208},
                {"hidden_size", 3840},
                {"intermediate_size", 15360},
                {"num_hidden_layers", 48},
                {"num_attention_heads", 16},
                {"num_key_value_heads", 8},
                {"head_dim", 256},
                {"query_pre_attn_scalar", 256},
                {"rope_scaling", {{"rope_type", "linear"}, {"factor", 8.0}}}};
  if (windows) {
    shape.update({{"sliding_window", 1024}, {"sliding_window_pattern", 6}, {"rope_local_base_freq", 10000.0}});
  }
  return families::PresetConfig("Gemma3ForCausalLM", "gemma3_text", std::move(shape));
}

}  // namespace

Family Gemma3Family() {
  return {.architecture = "Gemma3ForCausalLM",
          .model_type = "gemma3_text",
          .parse = ParseGemma3,
          .language_model_config = Gemma3TextConfig,
          .presets = {{"gemma-3-12b", Gemma312bPreset(true)}, {"gemma-3-12b-global", Gemma312bPreset(false)}}};
}

}  // namespace oomb
