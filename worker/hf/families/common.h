// What several families' config.json files say alike, beyond the keys ParseModelConfig reads for
// every family (worker/hf/family.h). Torch-free.
#ifndef OOMB_WORKER_HF_FAMILIES_COMMON_H_
#define OOMB_WORKER_HF_FAMILIES_COMMON_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/status.h"
#include "worker/hf/model_config.h"

namespace oomb::families {

// sliding_window (null: none) and which layers use it: the layers layer_types marks
// sliding_attention when the config lists them (num_hidden_layers of them), else every layer,
// or, with `pattern_default` > 0 (transformers 4.x Gemma 3 configs), all but every
// sliding_window_pattern-th (default `pattern_default`).
absl::Status ParseSlidingWindow(const nlohmann::json& root, const std::string& source, ModelConfig* c,
                                int64_t pattern_default = 0);

// UNIMPLEMENTED for a config.json with sliding-window layers (use_sliding_window, or a
// layer_types entry other than full_attention), for a family whose layers all attend the whole
// past here.
absl::Status RefuseSlidingWindows(const nlohmann::json& root, const std::string& source);

// attention_bias: q, k, v and o all biased, or none.
absl::Status ParseAttentionBias(const nlohmann::json& root, const std::string& source, ModelConfig* c);

// The mixture of experts of a config.json (MoeConfig): the number of experts from `experts_key`
// (or num_local_experts, as transformers 5 writes it), num_experts_per_tok, and which layers are
// sparse: those not in mlp_only_layers with (i + 1) a multiple of decoder_sparse_step (1: all).
// output_router_logits true: the router's auxiliary loss, weighted by router_aux_loss_coef
// (default 0.001, as transformers'; INVALID_ARGUMENT if negative). UNIMPLEMENTED for a
// router_jitter_noise other than 0.
absl::Status ParseMoe(const nlohmann::json& root, const std::string& source, const char* experts_key, ModelConfig* c);

// A preset's config.json: `shape` over the keys every preset shares (RMSNorm epsilon 1e-6,
// rope_theta 1e6, max_position_embeddings 2^23).
nlohmann::json PresetConfig(const std::string& architecture, const std::string& model_type, nlohmann::json shape);

}  // namespace oomb::families

#endif  // OOMB_WORKER_HF_FAMILIES_COMMON_H_
