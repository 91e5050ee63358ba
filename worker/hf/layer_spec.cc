#include "worker/hf/layer_spec.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace oomb {
namespace {

std::vector<NormSpec> LayerNorms(const ModelConfig& c) {
  const int64_t d = c.hidden_size;
  std::vector<NormSpec> out = {{NormRole::kInput, "input_layernorm.weight", d}};
  if (c.gemma_layers) {
    out.push_back({NormRole::kAttentionOutput, "post_attention_layernorm.weight", d});
    out.push_back({NormRole::kMlpInput, "pre_feedforward_layernorm.weight", d});
    out.push_back({NormRole::kMlpOutput, "post_feedforward_layernorm.weight", d});
  } else {
    out.push_back({NormRole::kMlpInput, "post_attention_layernorm.weight", d});
  }
  if (c.qk_norm) {
    out.push_back({NormRole::kQuery, "self_attn.q_norm.weight", c.head_dim});
    out.push_back({NormRole::kKey, "self_attn.k_norm.weight", c.head_dim});
  }
  return out;
}

std::vector<LinearSpec> LayerLinears(const ModelConfig& c) {
  const int64_t d = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), f = c.intermediate_size;
  if (c.fused_projections) {
    return {{"qkv_proj", true, d, q + 2 * kv, false},
            {"o_proj", true, q, d, false},
            {"gate_up_proj", false, d, 2 * f, false},
            {"down_proj", false, f, d, false}};
  }
  return {{"q_proj", true, d, q, c.qkv_bias},     {"k_proj", true, d, kv, c.qkv_bias},
          {"v_proj", true, d, kv, c.qkv_bias},    {"o_proj", true, q, d, c.o_bias},
          {"gate_proj", false, d, f, c.mlp_bias}, {"up_proj", false, d, f, c.mlp_bias},
          {"down_proj", false, f, d, c.mlp_bias}};
}

// The weights outside the layers: the embeddings (and an untied LM head) and the final norm.
int64_t OuterParameters(const ModelConfig& c) {
  return c.vocab_size * c.hidden_size * (c.tie_word_embeddings ? 1 : 2) + c.hidden_size;
}

}  // namespace

bool LayerSpec::Has(NormRole role) const {
  return std::any_of(norms.begin(), norms.end(), [&](const NormSpec& n) { return n.role == role; });
}

int64_t LayerSpec::HiddenNorms() const {
  return std::count_if(norms.begin(), norms.end(),
                       [](const NormSpec& n) { return n.role != NormRole::kQuery && n.role != NormRole::kKey; });
}

std::vector<int64_t> ModelSpec::Windows() const {
  std::vector<int64_t> out;
  for (const LayerSpec& l : layers) out.push_back(l.window);
  return out;
}

bool ModelSpec::HasWindows() const {
  return std::any_of(layers.begin(), layers.end(), [](const LayerSpec& l) { return l.window > 0; });
}

bool ModelSpec::HasLocalRope() const {
  return std::any_of(layers.begin(), layers.end(), [](const LayerSpec& l) { return l.local_rope; });
}

int64_t LayerSpec::Parameters() const {
  int64_t n = 0;
  for (const NormSpec& norm : norms) n += norm.size;
  for (const LinearSpec& linear : linears) n += linear.Parameters();
  return n;
}

double LayerSpec::AttentionPairs(int64_t tokens) const {
  const double t = static_cast<double>(tokens), w = static_cast<double>(window);
  return window > 0 && window < tokens ? w * t - w * w / 2 : t * t / 2;
}

double LayerSpec::TrainingFlops(int64_t q_dim, int64_t tokens) const {
  return 6.0 * static_cast<double>(Parameters()) * static_cast<double>(tokens) +
         12.0 * static_cast<double>(q_dim) * AttentionPairs(tokens);
}

std::vector<LinearSpec> LayerSpec::Adapted(const std::vector<std::string>& targets) const {
  std::vector<LinearSpec> out;
  for (const LinearSpec& l : linears) {
    if (std::find(targets.begin(), targets.end(), l.name) != targets.end()) out.push_back(l);
  }
  return out;
}

namespace {

constexpr int64_t kF32 = 4;

// One RMSNorm of hidden_size, per token (LayerSpec::SavedBytesPerToken).
int64_t NormBytesPerToken(const ModelConfig& c, const Execution& x) {
  return x.fused_norms ? 2 * x.elem_bytes * c.hidden_size + kF32 : (kF32 + x.elem_bytes) * c.hidden_size;
}

}  // namespace

int64_t LayerSpec::SavedBytesPerToken(const ModelConfig& c, const Execution& x) const {
  const int64_t Q = c.q_dim(), KV = c.kv_dim(), e = x.elem_bytes;
  int64_t bytes = HiddenNorms() * NormBytesPerToken(c, x);
  if (!x.fused_kernels) bytes += 2 * e * (Q + KV);  // RoPE
  bytes += e * (2 * Q + 2 * KV) + kF32 * c.num_heads;
  if (Has(NormRole::kQuery)) {
    bytes += x.fused_norms ? e * (Q + KV) + kF32 * (c.num_heads + c.num_kv_heads) : (kF32 + e) * (Q + KV);
  }
  bool glu_down = false;
  if (x.lora_rank > 0) {
    for (const LinearSpec& l : Adapted(x.lora_targets)) {
      bytes += e * x.lora_rank;
      if (x.lora_dropout > 0) bytes += (kF32 + e) * l.in;
      glu_down = glu_down || (l.name == "down_proj" && x.lora_dropout == 0);
    }
  }
  const bool fused_mlp = x.fused_kernels || mlp == MlpKind::kGeluTanhGlu;
  return bytes + (glu_down ? 2 : fused_mlp ? 3 : 4) * e * c.intermediate_size;
}

int64_t ModelSpec::SavedBytesPerToken(const ModelConfig& c, const Execution& x) const {
  int64_t per_token = NormBytesPerToken(c, x);
  for (const LayerSpec& layer : layers) per_token += layer.SavedBytesPerToken(c, x);
  return per_token;
}

int64_t ModelSpec::ParameterCount(const ModelConfig& c) const {
  int64_t n = OuterParameters(c);
  for (const LayerSpec& l : layers) n += l.Parameters();
  return n;
}

double ModelSpec::TrainingFlops(const ModelConfig& c, int64_t tokens) const {
  double flops = 6.0 * static_cast<double>(OuterParameters(c)) * static_cast<double>(tokens);
  for (const LayerSpec& l : layers) flops += l.TrainingFlops(c.q_dim(), tokens);
  return flops;
}

ModelSpec DescribeModel(const ModelConfig& c) {
  ModelSpec spec;
  spec.norm = c.gemma_layers ? NormKind::kRmsOnePlusWeight : NormKind::kRms;
  spec.scale_embeddings = c.gemma_layers;
  const double D = static_cast<double>(c.head_dim);
  if (c.query_pre_attn_scalar > 0 && c.query_pre_attn_scalar != D) {
    spec.query_scale = std::sqrt(D / c.query_pre_attn_scalar);
  }
  LayerSpec layer;
  layer.fused_projections = c.fused_projections;
  layer.mlp = c.gemma_layers ? MlpKind::kGeluTanhGlu : MlpKind::kSwiGlu;
  layer.norms = LayerNorms(c);
  layer.linears = LayerLinears(c);
  spec.layers.assign(c.num_layers, layer);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const bool sliding = i < static_cast<int64_t>(c.sliding_layers.size()) && c.sliding_layers[i];
    spec.layers[i].window = sliding ? c.sliding_window : 0;
    spec.layers[i].local_rope = sliding && c.sliding_window > 0 && c.sliding_rope.has_value();
  }
  return spec;
}

std::vector<LinearSpec> LinearLayers(const ModelConfig& c) { return DescribeModel(c).layers.front().linears; }

absl::StatusOr<std::vector<std::string>> ResolveLoraTargets(const ModelConfig& c,
                                                            const std::vector<std::string>& targets) {
  std::set<std::string> want(targets.begin(), targets.end());
  const std::vector<LinearSpec> linears = LinearLayers(c);
  if (linears.front().name == "qkv_proj") {
    const std::pair<const char*, std::vector<std::string>> kFused[] = {{"qkv_proj", {"q_proj", "k_proj", "v_proj"}},
                                                                       {"gate_up_proj", {"gate_proj", "up_proj"}}};
    for (const auto& [fused, parts] : kFused) {
      const auto named = std::count_if(parts.begin(), parts.end(), [&](const std::string& p) { return want.count(p); });
      if (named == 0) continue;
      if (named != static_cast<int64_t>(parts.size())) {
        return absl::InvalidArgumentError(absl::StrCat("method.lora.target_modules: ", c.architecture, " fuses ",
                                                       absl::StrJoin(parts, ", "), " into one layer (", fused,
                                                       "): name ", fused, ", or all of ", absl::StrJoin(parts, ", ")));
      }
      for (const std::string& p : parts) want.erase(p);
      want.insert(fused);
    }
  }
  std::vector<std::string> out, known;
  for (const LinearSpec& l : linears) {
    known.push_back(l.name);
    if (want.erase(l.name) > 0) out.push_back(l.name);
  }
  if (!want.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("method.lora.target_modules: unknown module '", *want.begin(),
                                                   "' for ", c.architecture,
                                                   " (its linear layers: ", absl::StrJoin(known, ", "), ")"));
  }
  return out;
}

}  // namespace oomb
