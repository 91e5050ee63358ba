#include "worker/hf/layer_spec.h"

#include <algorithm>
#include <cmath>
#include <map>
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

// Tensor parallelism's split of each layer (LinearSpec::row_parallel, parts).
std::vector<LinearSpec> WithSplits(const ModelConfig& c, std::vector<LinearSpec> linears) {
  for (LinearSpec& l : linears) {
    l.row_parallel = l.name == "o_proj" || l.name == "down_proj";
    l.parts = l.name == "qkv_proj"       ? std::vector<int64_t>{c.q_dim(), c.kv_dim(), c.kv_dim()}
              : l.name == "gate_up_proj" ? std::vector<int64_t>{l.out / 2, l.out / 2}
                                         : std::vector<int64_t>{l.row_parallel ? l.in : l.out};
  }
  return linears;
}

std::vector<LinearSpec> LayerLinears(const ModelConfig& c, bool sparse) {
  const int64_t d = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), f = c.intermediate_size;
  if (sparse) {
    return WithSplits(c, {{"q_proj", true, d, q, c.qkv_bias},
                          {"k_proj", true, d, kv, c.qkv_bias},
                          {"v_proj", true, d, kv, c.qkv_bias},
                          {"o_proj", true, q, d, c.o_bias}});
  }
  if (c.fused_projections) {
    return WithSplits(c, {{"qkv_proj", true, d, q + 2 * kv, false},
                          {"o_proj", true, q, d, false},
                          {"gate_up_proj", false, d, 2 * f, false},
                          {"down_proj", false, f, d, false}});
  }
  return WithSplits(c, {{"q_proj", true, d, q, c.qkv_bias},
                        {"k_proj", true, d, kv, c.qkv_bias},
                        {"v_proj", true, d, kv, c.qkv_bias},
                        {"o_proj", true, q, d, c.o_bias},
                        {"gate_proj", false, d, f, c.mlp_bias},
                        {"up_proj", false, d, f, c.mlp_bias},
                        {"down_proj", false, f, d, c.mlp_bias}});
}

// The weights outside the layers: the embeddings (and an untied LM head) and the final norm.
int64_t OuterParameters(const ModelConfig& c) {
  return c.vocab_size * c.hidden_size * (c.tie_word_embeddings ? 1 : 2) + c.hidden_size;
}

}  // namespace

std::vector<std::pair<std::string, std::vector<std::string>>> ExpertBankParts(const ModelConfig& c) {
  if (c.moe.experts == 0) return {};
  const std::vector<std::string>& own = c.moe.stored_projections;
  std::vector<std::pair<std::string, std::vector<std::string>>> out = {{"gate_up_proj", {own[0], own[1]}},
                                                                       {"down_proj", {own[2]}}};
  if (own[0] != "gate_proj") {
    out.push_back({"gate_up_proj", {"gate_proj", "up_proj"}});
    out.push_back({"down_proj", {"down_proj"}});
  }
  return out;
}

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

std::vector<ExpertBankSpec> MoeSpec::Banks() const {
  const bool interleaved = swiglu_limit > 0;
  return {{"gate_up_proj", experts, hidden, 2 * intermediate, false,
           interleaved ? std::vector<int64_t>{2 * intermediate} : std::vector<int64_t>{intermediate, intermediate}},
          {"down_proj", experts, intermediate, hidden, true, {intermediate}}};
}

namespace {

// The router's parameters, and one expert's.
int64_t RouterParameters(const MoeSpec& m) { return m.experts * (m.hidden + (m.biases ? 1 : 0)); }
int64_t ExpertParameters(const MoeSpec& m) {
  return 3 * m.hidden * m.intermediate + (m.biases ? 2 * m.intermediate + m.hidden : 0);
}

}  // namespace

int64_t MoeSpec::Parameters() const { return RouterParameters(*this) + experts * ExpertParameters(*this); }

int64_t MoeSpec::ActiveParameters() const { return RouterParameters(*this) + top_k * ExpertParameters(*this); }

int64_t LayerSpec::Parameters() const {
  int64_t n = (moe.has_value() ? moe->Parameters() : 0) + sinks;
  for (const NormSpec& norm : norms) n += norm.size;
  for (const LinearSpec& linear : linears) n += linear.Parameters();
  return n;
}

int64_t LayerSpec::ActiveParameters() const {
  return moe.has_value() ? Parameters() - moe->Parameters() + moe->ActiveParameters() : Parameters();
}

double LayerSpec::AttentionPairs(int64_t tokens) const {
  const double t = static_cast<double>(tokens), w = static_cast<double>(window);
  return window > 0 && window < tokens ? w * t - w * w / 2 : t * t / 2;
}

double LayerSpec::TrainingFlops(int64_t q_dim, int64_t tokens) const {
  return 6.0 * static_cast<double>(ActiveParameters()) * static_cast<double>(tokens) +
         12.0 * static_cast<double>(q_dim) * AttentionPairs(tokens);
}

std::vector<LinearSpec> LayerSpec::Adapted(const std::vector<std::string>& targets) const {
  std::vector<LinearSpec> out;
  for (const LinearSpec& l : linears) {
    if (std::find(targets.begin(), targets.end(), l.name) != targets.end()) out.push_back(l);
  }
  return out;
}

std::vector<std::pair<ExpertBankSpec, int64_t>> LayerSpec::AdaptedExperts(
    const std::vector<ExpertLoraTarget>& targets) const {
  std::vector<std::pair<ExpertBankSpec, int64_t>> out;
  if (!moe.has_value()) return out;
  for (const ExpertBankSpec& b : moe->Banks()) {
    for (const ExpertLoraTarget& t : targets) {
      if (t.bank == b.name) out.emplace_back(b, t.rank_factor);
    }
  }
  return out;
}

namespace {

constexpr int64_t kF32 = 4, kI64 = 8;

// One feature of a composite RMSNorm (LayerSpec::SavedBytesPerToken): its float32 input and its
// output, and in full fine-tuning its normalised input too (the weight's gradient reads it).
int64_t CompositeNormBytes(const Execution& x) { return kF32 + x.elem_bytes * (x.lora_rank == 0 ? 2 : 1); }

// One RMSNorm of hidden_size, per token (LayerSpec::SavedBytesPerToken), with its output.
int64_t NormBytesPerToken(const ModelConfig& c, const Execution& x) {
  return x.fused_norms ? 2 * x.elem_bytes * c.hidden_size + kF32 : CompositeNormBytes(x) * c.hidden_size;
}

}  // namespace

int64_t LayerSpec::SavedBytesPerToken(const ModelConfig& c, const Execution& x, bool gate_up_recomputed) const {
  const int64_t Q = c.q_dim(), KV = c.kv_dim(), e = x.elem_bytes;
  // A norm's output counts as the input the product it feeds keeps; the norms of a branch's
  // output (Gemma 3's post-attention and post-MLP norms) feed the residual sum, which keeps
  // nothing.
  const int64_t branch_output_norms = (Has(NormRole::kAttentionOutput) ? 1 : 0) + (Has(NormRole::kMlpOutput) ? 1 : 0);
  int64_t bytes = HiddenNorms() * NormBytesPerToken(c, x) - branch_output_norms * e * c.hidden_size;
  if (!x.fused_kernels) bytes += 2 * e * (Q + KV);  // RoPE
  bytes += e * (2 * Q + 2 * KV) + kF32 * c.num_heads;
  if (Has(NormRole::kQuery)) {
    bytes += x.fused_norms ? e * (Q + KV) + kF32 * (c.num_heads + c.num_kv_heads) : CompositeNormBytes(x) * (Q + KV);
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
  const int64_t glu = fused_mlp ? 3 : 4;
  if (moe.has_value()) {
    const int64_t k = moe->top_k, H = moe->hidden;
    bytes += kF32 * moe->experts + kF32 + k * (kF32 + 3 * kI64);
    // Each pair's gate_up product (the scaled activation's input) and, but in GroupedExpertMlp,
    // its input row (LoRA A's input) and scaled activation (the down bank's LoRA A's input).
    const bool one_function = x.grouped_experts && x.lora_rank > 0 && !moe->biases;
    const int64_t product = one_function && gate_up_recomputed ? 0 : 2 * moe->intermediate;
    bytes += k * (e * (product + (one_function ? 0 : H + moe->intermediate)) + kF32);
    for (const auto& [bank, factor] : AdaptedExperts(x.lora_expert_targets)) bytes += k * e * x.lora_rank * factor;
    return bytes;
  }
  return bytes + (glu_down ? 2 : glu) * e * c.intermediate_size;
}

int64_t ModelSpec::SavedBytesPerToken(const ModelConfig& c, const Execution& x) const {
  int64_t per_token = NormBytesPerToken(c, x), sparse = 0;
  for (const LayerSpec& layer : layers) {
    per_token += layer.SavedBytesPerToken(c, x, layer.moe.has_value() && sparse < x.expert_recompute_layers);
    if (layer.moe.has_value()) ++sparse;
  }
  return per_token;
}

int64_t ModelSpec::ParameterCount(const ModelConfig& c) const {
  int64_t n = OuterParameters(c);
  for (const LayerSpec& l : layers) n += l.Parameters();
  return n;
}

int64_t ModelSpec::ActiveParameterCount(const ModelConfig& c) const {
  int64_t n = OuterParameters(c);
  for (const LayerSpec& l : layers) n += l.ActiveParameters();
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
  layer.linears = LayerLinears(c, /*sparse=*/false);
  spec.layers.assign(c.num_layers, layer);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    if (c.moe.experts > 0 && c.moe.layers[i]) {
      spec.layers[i].linears = LayerLinears(c, /*sparse=*/true);
      spec.layers[i].moe = MoeSpec{.experts = c.moe.experts,
                                   .top_k = c.moe.top_k,
                                   .hidden = c.hidden_size,
                                   .intermediate = c.moe.intermediate,
                                   .renormalize = c.moe.renormalize,
                                   .float_scores = c.moe.float_scores,
                                   .biases = c.moe.biases,
                                   .swiglu_limit = c.moe.swiglu_limit,
                                   .swiglu_alpha = c.moe.swiglu_alpha};
    }
    const bool sliding = i < static_cast<int64_t>(c.sliding_layers.size()) && c.sliding_layers[i];
    spec.layers[i].window = sliding ? c.sliding_window : 0;
    spec.layers[i].sinks = c.attention_sinks ? c.num_heads : 0;
    spec.layers[i].local_rope = sliding && c.sliding_window > 0 && c.sliding_rope.has_value();
  }
  return spec;
}

std::vector<LinearSpec> LinearLayers(const ModelConfig& c) {
  std::vector<LinearSpec> out;
  for (const LayerSpec& layer : DescribeModel(c).layers) {
    for (const LinearSpec& l : layer.linears) {
      if (std::none_of(out.begin(), out.end(), [&](const LinearSpec& o) { return o.name == l.name; })) out.push_back(l);
    }
  }
  return out;
}

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
  // On a mixture of experts the MLP's names stand for the expert banks (ExpertBankParts), as
  // PEFT converts them for transformers 5; since 0.22 PEFT also keeps a name that the dense
  // layers' MLP linears have, adapting those too: such names stay.
  for (const auto& [bank, parts] : ExpertBankParts(c)) {
    const auto named = std::count_if(parts.begin(), parts.end(), [&](const std::string& p) { return want.count(p); });
    if (named > 0 && named < static_cast<int64_t>(parts.size())) {
      return absl::InvalidArgumentError(absl::StrCat("method.lora.target_modules: ", c.architecture, "'s experts fuse ",
                                                     absl::StrJoin(parts, ", "), " into one bank (mlp.experts.", bank,
                                                     "): name all of ", absl::StrJoin(parts, ", "),
                                                     ", or the bank in target_parameters"));
    }
    if (named > 0) {
      for (const std::string& p : parts) {
        if (std::none_of(linears.begin(), linears.end(), [&](const LinearSpec& l) { return l.name == p; })) {
          want.erase(p);
        }
      }
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

absl::StatusOr<std::vector<ExpertLoraTarget>> ResolveLoraExpertTargets(const ModelConfig& c,
                                                                       const std::vector<std::string>& modules,
                                                                       const std::vector<std::string>& targets,
                                                                       double dropout) {
  std::vector<ExpertBankSpec> banks;
  for (const LayerSpec& layer : DescribeModel(c).layers) {
    if (layer.moe.has_value()) banks = layer.moe->Banks();
  }
  std::vector<std::string> known, out;
  std::map<std::string, int64_t> factor;
  for (const auto& [bank, parts] : ExpertBankParts(c)) {
    if (std::all_of(parts.begin(), parts.end(), [&](const std::string& p) {
          return std::find(modules.begin(), modules.end(), p) != modules.end();
        })) {
      out.push_back(bank);
      factor[bank] = static_cast<int64_t>(parts.size());
    }
  }
  for (const ExpertBankSpec& b : banks) known.push_back("mlp.experts." + b.name);
  for (const std::string& t : targets) {
    const auto names = [&](const std::string& parameter) {
      return t == parameter ||
             (t.size() < parameter.size() && parameter.compare(parameter.size() - t.size(), t.size(), t) == 0 &&
              parameter[parameter.size() - t.size() - 1] == '.');
    };
    const auto hit = std::find_if(banks.begin(), banks.end(),
                                  [&](const ExpertBankSpec& b) { return names("mlp.experts." + b.name); });
    if (hit == banks.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "method.lora.target_parameters: '", t, "' names no parameter of ", c.architecture,
          known.empty() ? std::string(" (a dense model: it has no expert banks; adapt its linear layers with "
                                      "target_modules)")
                        : absl::StrCat(" (its expert banks: ", absl::StrJoin(known, ", "), ")")));
    }
    if (std::find(out.begin(), out.end(), hit->name) == out.end()) out.push_back(hit->name);
  }
  std::vector<ExpertLoraTarget> ordered;  // the forward's order
  for (const ExpertBankSpec& b : banks) {
    if (std::find(out.begin(), out.end(), b.name) != out.end()) {
      ordered.push_back({b.name, factor.count(b.name) > 0 ? factor[b.name] : 1});
    }
  }
  if (!ordered.empty() && dropout > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("method.lora.dropout: LoRA on the experts' banks (",
                     absl::StrJoin(ordered, ", ", [](std::string* o, const ExpertLoraTarget& t) { o->append(t.bank); }),
                     ") takes no dropout, as PEFT's target_parameters take none; set it to 0, or adapt attention only "
                     "(target_modules without the MLP's names, no target_parameters)"));
  }
  return ordered;
}

absl::Status CheckTensorParallel(const ModelConfig& c, int ranks) {
  const std::pair<const char*, int64_t> sizes[] = {{"num_attention_heads", c.num_heads},
                                                   {"num_key_value_heads", c.num_kv_heads},
                                                   {"intermediate_size", c.intermediate_size},
                                                   {"moe_intermediate_size", c.moe.intermediate}};
  for (const auto& [key, size] : sizes) {
    if (size % ranks != 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor parallelism over ", ranks, " ranks: ", key, " = ", size,
                                                     " is not a multiple of ", ranks));
    }
  }
  return absl::OkStatus();
}

ModelConfig ShardConfig(const ModelConfig& c, int ranks) {
  ModelConfig s = c;
  s.num_heads /= ranks;
  s.num_kv_heads /= ranks;
  s.intermediate_size /= ranks;
  s.moe.intermediate /= ranks;
  s.vocab_size = (c.vocab_size + ranks - 1) / ranks;
  return s;
}

bool RunsGroupedExperts(const ExpertPathTarget& target, const std::vector<int64_t>& inner_sizes) {
  if (!target.cuda || target.compute_capability < 90 || !target.half_precision) return false;
  for (const int64_t n : inner_sizes) {
    if (n * target.elem_bytes % 16 != 0) return false;
  }
  return true;
}

std::vector<int64_t> ExpertInnerSizes(const ModelConfig& c, int tp_size, const std::vector<int64_t>& lora_ranks) {
  std::vector<int64_t> sizes = {c.hidden_size, c.moe.intermediate / tp_size};
  sizes.insert(sizes.end(), lora_ranks.begin(), lora_ranks.end());
  return sizes;
}

}  // namespace oomb
