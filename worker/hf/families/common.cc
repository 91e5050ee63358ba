#include "worker/hf/families/common.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/common/status.h"
#include "worker/hf/json_reader.h"

namespace oomb::families {

using nlohmann::json;

absl::Status ParseSlidingWindow(const json& root, const std::string& source, ModelConfig* c, int64_t pattern_default) {
  const JsonReader r(root, source);
  if (const auto it = root.find("sliding_window"); it == root.end() || it->is_null()) return absl::OkStatus();
  OOMB_RETURN_IF_ERROR(r.IntIn("sliding_window", &c->sliding_window, 1, kMaxPositionEmbeddings));
  const int64_t layers = c->num_layers;
  c->sliding_layers.assign(layers, true);
  const auto it = root.find("layer_types");
  if (it == root.end() || it->is_null()) {
    if (pattern_default > 0) {
      int64_t pattern = pattern_default;
      OOMB_RETURN_IF_ERROR(r.IntIn("sliding_window_pattern", &pattern, 0, int64_t{1} << 12));
      for (int64_t i = 0; i < layers; ++i) c->sliding_layers[i] = pattern <= 0 || (i + 1) % pattern != 0;
    }
    return absl::OkStatus();
  }
  if (!it->is_array() || static_cast<int64_t>(it->size()) != layers) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": key 'layer_types': expected a list of ", layers,
                                                   " (num_hidden_layers) layer types, got ", it->dump()));
  }
  for (int64_t i = 0; i < layers; ++i) {
    const json& t = (*it)[i];
    if (!t.is_string() || (t != "sliding_attention" && t != "full_attention")) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": key 'layer_types': entry ", i,
                                                     ": expected \"sliding_attention\" or \"full_attention\", got ",
                                                     t.dump()));
    }
    c->sliding_layers[i] = t == "sliding_attention";
  }
  return absl::OkStatus();
}

absl::Status RefuseSlidingWindows(const json& root, const std::string& source) {
  bool sliding = false;
  OOMB_RETURN_IF_ERROR(JsonReader(root, source).Bool("use_sliding_window", &sliding));
  if (const auto it = root.find("layer_types"); it != root.end() && it->is_array()) {
    for (const json& t : *it) sliding |= t.is_string() && t.get<std::string>() != "full_attention";
  }
  if (!sliding) return absl::OkStatus();
  return absl::UnimplementedError(
      absl::StrCat(source,
                   ": sliding-window attention layers are not supported for this family (every layer must "
                   "attend the whole sequence: use_sliding_window false, layer_types all full_attention)"));
}

absl::Status ParseAttentionBias(const json& root, const std::string& source, ModelConfig* c) {
  bool attention_bias = false;
  OOMB_RETURN_IF_ERROR(JsonReader(root, source).Bool("attention_bias", &attention_bias));
  c->qkv_bias = c->o_bias = attention_bias;
  return absl::OkStatus();
}

absl::Status ParseMoe(const json& root, const std::string& source, const char* experts_key, ModelConfig* c) {
  const JsonReader r(root, source);
  MoeConfig& moe = c->moe;
  constexpr int64_t kMaxExperts = 1 << 12;
  const char* key = root.contains(experts_key) ? experts_key : "num_local_experts";
  OOMB_RETURN_IF_ERROR(r.IntIn(key, &moe.experts, 1, kMaxExperts, /*required=*/true));
  OOMB_RETURN_IF_ERROR(r.IntIn("num_experts_per_tok", &moe.top_k, 1, moe.experts, /*required=*/true));
  int64_t step = 1;
  OOMB_RETURN_IF_ERROR(r.IntIn("decoder_sparse_step", &step, 1, c->num_layers));
  moe.layers.assign(c->num_layers, false);
  for (int64_t i = 0; i < c->num_layers; ++i) moe.layers[i] = (i + 1) % step == 0;
  if (const auto it = root.find("mlp_only_layers"); it != root.end() && !it->is_null()) {
    if (!it->is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(source,
                                                     ": key 'mlp_only_layers': expected a list of layer "
                                                     "indices, got ",
                                                     it->dump()));
    }
    for (const json& i : *it) {
      if (!i.is_number_integer() || i.get<int64_t>() < 0 || i.get<int64_t>() >= c->num_layers) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": key 'mlp_only_layers': entry ", i.dump(),
                                                       " is not a layer index in [0, ", c->num_layers, ")"));
      }
      moe.layers[i.get<int64_t>()] = false;
    }
  }
  bool router_logits = false;
  OOMB_RETURN_IF_ERROR(r.Bool("output_router_logits", &router_logits));
  if (router_logits) {
    moe.aux_loss_coef = 0.001;  // transformers' default for every family that has the loss
    OOMB_RETURN_IF_ERROR(r.Double("router_aux_loss_coef", &moe.aux_loss_coef, /*required=*/false));
    if (!std::isfinite(moe.aux_loss_coef) || moe.aux_loss_coef < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": router_aux_loss_coef ", moe.aux_loss_coef, " is not a finite number >= 0"));
    }
  }
  double jitter = 0;
  OOMB_RETURN_IF_ERROR(r.Double("router_jitter_noise", &jitter, /*required=*/false));
  if (jitter != 0) {
    return absl::UnimplementedError(
        absl::StrCat(source, ": router_jitter_noise ", jitter, " is not supported (only 0: no jitter)"));
  }
  return absl::OkStatus();
}

json PresetConfig(const std::string& architecture, const std::string& model_type, json shape) {
  json config = {{"architectures", {architecture}},
                 {"model_type", model_type},
                 {"rms_norm_eps", 1e-6},
                 {"rope_theta", 1e6},
                 {"max_position_embeddings", 1 << 23}};
  config.update(shape);
  return config;
}

}  // namespace oomb::families
