// Qwen3MoeForCausalLM (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (an RMSNorm over each
// head of q and of k before RoPE) and a mixture of experts in the sparse layers (decoder_sparse_step,
// mlp_only_layers keep a dense MLP of intermediate_size): num_experts experts of
// moe_intermediate_size, num_experts_per_tok of them per token, renormalised with norm_topk_prob.
#include "worker/common/status.h"
#include "worker/hf/families/common.h"
#include "worker/hf/family.h"
#include "worker/hf/json_reader.h"

namespace oomb {
namespace {

absl::Status ParseQwen3Moe(const nlohmann::json& root, const std::string& source, ModelConfig* c) {
  c->qk_norm = true;
  OOMB_RETURN_IF_ERROR(families::ParseAttentionBias(root, source, c));
  OOMB_RETURN_IF_ERROR(families::RefuseSlidingWindows(root, source));
  OOMB_RETURN_IF_ERROR(families::ParseMoe(root, source, "num_experts", c));
  const JsonReader r(root, source);
  OOMB_RETURN_IF_ERROR(r.IntIn("moe_intermediate_size", &c->moe.intermediate, 1, int64_t{1} << 19, true));
  return r.Bool("norm_topk_prob", &c->moe.renormalize);
}

}  // namespace

Family Qwen3MoeFamily() {
  return {.architecture = "Qwen3MoeForCausalLM",
          .model_type = "qwen3_moe",
          .parse = ParseQwen3Moe,
          .presets = {{"qwen3-30b-a3b", families::PresetConfig("Qwen3MoeForCausalLM", "qwen3_moe",
                                                               {{"vocab_size", 151936},
                                                                {"hidden_size", 2048},
                                                                {"intermediate_size", 6144},
                                                                {"moe_intermediate_size", 768},
                                                                {"num_experts", 128},
                                                                {"num_experts_per_tok", 8},
                                                                {"norm_topk_prob", true},
                                                                {"num_hidden_layers", 48},
                                                                {"num_attention_heads", 32},
                                                                {"num_key_value_heads", 4},
                                                                {"head_dim", 128},
                                                                {"tie_word_embeddings", false}})}}};
}

}  // namespace oomb
