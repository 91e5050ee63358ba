#include "worker/hf/model_config.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/common/status.h"
#include "worker/hf/json_reader.h"
#include "worker/hf/loading_code.h"

namespace oomb {
namespace {

// Bounds of the numbers a config.json gives, far outside any real model's and inside what the
// engine can size and compute with (the job spec's own bounds where it has the same field:
// model.rope_scaling's factor and original_max_position_embeddings).
constexpr int64_t kMaxPositions = int64_t{1} << 30;
constexpr double kMaxRopeFactor = 1024;
constexpr double kMaxRopeTheta = 1e12;

using nlohmann::json;

constexpr std::pair<RopeType, const char*> kRopeTypes[] = {
    {RopeType::kDefault, "default"}, {RopeType::kLinear, "linear"}, {RopeType::kDynamic, "dynamic"},
    {RopeType::kYarn, "yarn"},       {RopeType::kLlama3, "llama3"}, {RopeType::kLongrope, "longrope"}};

std::optional<RopeType> ParseRopeType(const std::string& name) {
  for (const auto& [type, n] : kRopeTypes) {
    if (name == n) return type;
  }
  return std::nullopt;
}

// sliding_window (null: none) and which layers use it: layer_types' sliding_attention entries
// when the config lists them (num_hidden_layers of them, checked by the caller), else all.
absl::Status ParseSlidingWindow(const json& root, const std::string& source, ModelConfig* c) {
  const JsonReader r(root, source);
  if (const auto it = root.find("sliding_window"); it == root.end() || it->is_null()) return absl::OkStatus();
  OOMB_RETURN_IF_ERROR(r.IntIn("sliding_window", &c->sliding_window, 1, kMaxPositions));
  int64_t layers = 0;
  OOMB_RETURN_IF_ERROR(r.Int("num_hidden_layers", &layers));
  c->sliding_layers.assign(std::max<int64_t>(layers, 0), true);
  const auto it = root.find("layer_types");
  if (it == root.end() || it->is_null()) {
    if (c->gemma_layers) {  // transformers 4.x Gemma 3 configs: every sliding_window_pattern-th layer is global
      int64_t pattern = 6;
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

// Gemma 3's text model: its layer (ModelConfig::gemma_layers), q/k norms, the attention scale,
// tied embeddings unless said otherwise; what oomb does not compute is refused by name.
absl::Status ParseGemma3(const json& root, const std::string& source, ModelConfig* c) {
  const JsonReader r(root, source);
  c->gemma_layers = true;
  c->qk_norm = true;
  c->tie_word_embeddings = true;  // Gemma3TextConfig's default
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
  return ParseSlidingWindow(root, source, c);
}

// The family (architecture and model_type) and what it fixes: Qwen2's q/k/v biases, Qwen3's
// q/k norms. Sliding windows: Mistral's sliding_window (every layer, or those layer_types marks
// sliding_attention); Qwen2's and Qwen3's are refused (every layer here attends the whole past).
absl::Status ParseFamily(const json& root, const std::string& source, ModelConfig* c) {
  if (c->model_type == "llama" || c->architecture == "LlamaForCausalLM") {
    c->model_type = "llama";
    c->architecture = "LlamaForCausalLM";
  } else if (c->model_type == "qwen2" || c->architecture == "Qwen2ForCausalLM") {
    c->model_type = "qwen2";
    c->architecture = "Qwen2ForCausalLM";
    c->qkv_bias = true;
  } else if (c->model_type == "qwen3" || c->architecture == "Qwen3ForCausalLM") {
    c->model_type = "qwen3";
    c->architecture = "Qwen3ForCausalLM";
    c->qk_norm = true;
  } else if (c->model_type == "mistral" || c->architecture == "MistralForCausalLM") {
    c->model_type = "mistral";
    c->architecture = "MistralForCausalLM";
    return ParseSlidingWindow(root, source, c);
  } else if (c->model_type == "gemma3_text" || c->architecture == "Gemma3ForCausalLM") {
    c->model_type = "gemma3_text";
    c->architecture = "Gemma3ForCausalLM";
    return ParseGemma3(root, source, c);
  } else if (c->model_type == "phi3" || c->architecture == "Phi3ForCausalLM") {
    c->model_type = "phi3";
    c->architecture = "Phi3ForCausalLM";
    c->fused_projections = true;
    return ParseSlidingWindow(root, source, c);
  } else {
    return absl::UnimplementedError(
        absl::StrCat(source, ": architecture '", c->architecture, "' (model_type '", c->model_type,
                     "') is not supported; supported: LlamaForCausalLM, ",
                     "Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, Gemma3ForCausalLM, Phi3ForCausalLM"));
  }
  bool sliding = false;
  OOMB_RETURN_IF_ERROR(JsonReader(root, source).Bool("use_sliding_window", &sliding));
  if (const auto it = root.find("layer_types"); it != root.end() && it->is_array()) {
    for (const json& t : *it) sliding |= t.is_string() && t.get<std::string>() != "full_attention";
  }
  if (sliding) {
    return absl::UnimplementedError(
        absl::StrCat(source,
                     ": sliding-window attention layers are not supported for this family (every layer must "
                     "attend the whole sequence: use_sliding_window false, layer_types all full_attention)"));
  }
  return absl::OkStatus();
}

// longrope's fields of one RoPE parameters object. original_max_position_embeddings: the
// config's top-level key (Phi-3 writes it there; ParseRope puts it in `r` first), else the
// object's, else max_position_embeddings; factor: the object's, else max_position_embeddings
// over it; attention_factor: the object's, else sqrt(1 + ln factor / ln original) above 1.
absl::Status ParseLongrope(const json& params, const std::string& source, int64_t max_position_embeddings,
                           RopeConfig* r) {
  const JsonReader p(params, absl::StrCat(source, ": rope parameters"));
  if (r->original_max_position_embeddings <= 0) {
    OOMB_RETURN_IF_ERROR(
        p.IntIn("original_max_position_embeddings", &r->original_max_position_embeddings, 0, kMaxPositions));
  }
  if (r->original_max_position_embeddings <= 0) r->original_max_position_embeddings = max_position_embeddings;
  if (r->original_max_position_embeddings <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": longrope needs original_max_position_embeddings"));
  }
  r->factor = static_cast<double>(max_position_embeddings) / r->original_max_position_embeddings;
  OOMB_RETURN_IF_ERROR(p.DoubleIn("factor", &r->factor, 0, kMaxRopeFactor, /*lo_open=*/true));
  OOMB_RETURN_IF_ERROR(p.DoubleIn("attention_factor", &r->attention_factor, 0, kMaxRopeFactor));
  if (r->attention_factor <= 0) {
    r->attention_factor =
        r->factor <= 1
            ? 1.0
            : std::sqrt(1 + std::log(r->factor) / std::log(static_cast<double>(r->original_max_position_embeddings)));
  }
  for (auto [key, out] : {std::pair{"short_factor", &r->short_factor}, {"long_factor", &r->long_factor}}) {
    const auto it = params.find(key);
    if (it == params.end() || !it->is_array() || it->empty() || !std::all_of(it->begin(), it->end(), [](const json& v) {
          return v.is_number() && v.get<double>() > 0 && v.get<double>() <= kMaxRopeFactor;
        })) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": rope parameters: key '", key,
                                                     "': expected a list of numbers in (0, ", kMaxRopeFactor, "]"));
    }
    *out = it->get<std::vector<double>>();
  }
  return absl::OkStatus();
}

// One RoPE parameters object (transformers' rope_parameters or rope_scaling) into `r`.
absl::Status ParseRopeParameters(const json& params, const std::string& source, int64_t max_position_embeddings,
                                 RopeConfig* r) {
  const JsonReader p(params, absl::StrCat(source, ": rope parameters"));
  OOMB_RETURN_IF_ERROR(p.DoubleIn("rope_theta", &r->theta, 1, kMaxRopeTheta, /*lo_open=*/true));
  std::string type;
  OOMB_RETURN_IF_ERROR(p.String("rope_type", &type));
  if (type.empty()) OOMB_RETURN_IF_ERROR(p.String("type", &type));
  if (type.empty()) type = "default";
  if (type == "su") type = "longrope";  // Phi-3's first configs
  const std::optional<RopeType> parsed = ParseRopeType(type);
  if (!parsed.has_value()) {
    return absl::UnimplementedError(absl::StrCat(
        source, ": rope type '", type, "' is not supported (default, linear, dynamic, yarn, llama3, longrope)"));
  }
  r->type = *parsed;
  if (r->type == RopeType::kDefault) return absl::OkStatus();
  if (r->type == RopeType::kLongrope) return ParseLongrope(params, source, max_position_embeddings, r);
  OOMB_RETURN_IF_ERROR(
      p.DoubleIn("factor", &r->factor, 0, kMaxRopeFactor, /*lo_open=*/true, r->type != RopeType::kYarn));
  OOMB_RETURN_IF_ERROR(p.IntIn("original_max_position_embeddings", &r->original_max_position_embeddings, 1,
                               kMaxPositions, r->type == RopeType::kLlama3 || r->type == RopeType::kYarn));
  if (r->type == RopeType::kLlama3) {
    OOMB_RETURN_IF_ERROR(p.DoubleIn("low_freq_factor", &r->low_freq_factor, 0, kMaxRopeFactor, true, true));
    OOMB_RETURN_IF_ERROR(p.DoubleIn("high_freq_factor", &r->high_freq_factor, 0, kMaxRopeFactor, true, true));
  }
  if (r->type == RopeType::kYarn) {
    if (!params.contains("factor") || params["factor"].is_null()) {
      r->factor = static_cast<double>(max_position_embeddings) / r->original_max_position_embeddings;
    }
    OOMB_RETURN_IF_ERROR(p.DoubleIn("beta_fast", &r->beta_fast, 0, kMaxRopeFactor, /*lo_open=*/true));
    OOMB_RETURN_IF_ERROR(p.DoubleIn("beta_slow", &r->beta_slow, 0, kMaxRopeFactor, /*lo_open=*/true));
    OOMB_RETURN_IF_ERROR(p.DoubleIn("attention_factor", &r->attention_factor, 0, kMaxRopeFactor));
    OOMB_RETURN_IF_ERROR(p.DoubleIn("mscale", &r->mscale, 0, kMaxRopeFactor));
    OOMB_RETURN_IF_ERROR(p.DoubleIn("mscale_all_dim", &r->mscale_all_dim, 0, kMaxRopeFactor));
    OOMB_RETURN_IF_ERROR(p.Bool("truncate", &r->truncate));
  }
  if (!(r->factor > 0 && r->factor <= kMaxRopeFactor)) {  // yarn's derived factor
    return p.OutOfRange("factor", absl::StrCat("(0, ", kMaxRopeFactor, "]"), absl::StrCat(r->factor));
  }
  return absl::OkStatus();
}

// The RoPE of every layer (rope_theta, and rope_parameters or rope_scaling over it) and, for a
// model with sliding-window layers of their own RoPE (Gemma 3), theirs: transformers 5 writes
// rope_parameters per layer type ({"full_attention": {...}, "sliding_attention": {...}}),
// transformers 4 a default RoPE of base rope_local_base_freq.
absl::Status ParseRope(const json& root, const std::string& source, ModelConfig* c) {
  OOMB_RETURN_IF_ERROR(JsonReader(root, source).DoubleIn("rope_theta", &c->rope.theta, 1, kMaxRopeTheta, true));
  if (c->fused_projections) {  // Phi-3: the pretraining window, for longrope
    OOMB_RETURN_IF_ERROR(
        JsonReader(root, source)
            .IntIn("original_max_position_embeddings", &c->rope.original_max_position_embeddings, 1, kMaxPositions));
  }
  const json* params = nullptr;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto it = root.find(key);
    if (it != root.end() && it->is_object()) {
      params = &*it;
      break;
    }
  }
  const int64_t max_pos = c->max_position_embeddings;
  if (params != nullptr && params->contains("full_attention")) {
    OOMB_RETURN_IF_ERROR(ParseRopeParameters(params->at("full_attention"), source, max_pos, &c->rope));
    if (params->contains("sliding_attention")) {
      c->sliding_rope.emplace();
      return ParseRopeParameters(params->at("sliding_attention"), source, max_pos, &*c->sliding_rope);
    }
    return absl::OkStatus();
  }
  if (root.contains("rope_local_base_freq")) {
    c->sliding_rope.emplace();
    OOMB_RETURN_IF_ERROR(
        JsonReader(root, source).DoubleIn("rope_local_base_freq", &c->sliding_rope->theta, 1, kMaxRopeTheta, true));
  }
  return params == nullptr ? absl::OkStatus() : ParseRopeParameters(*params, source, max_pos, &c->rope);
}

// rotary_dim: partial_rotary_factor (top level, or in rope_parameters as transformers 5 writes
// it) times head_dim, truncated as transformers does; longrope's factors must match it.
absl::Status ParseRotaryDim(const json& root, const std::string& source, ModelConfig* c) {
  double partial = 1.0;
  OOMB_RETURN_IF_ERROR(JsonReader(root, source).Double("partial_rotary_factor", &partial, false));
  if (const auto it = root.find("rope_parameters"); it != root.end() && it->is_object()) {
    OOMB_RETURN_IF_ERROR(
        JsonReader(*it, absl::StrCat(source, ": rope_parameters")).Double("partial_rotary_factor", &partial, false));
  }
  c->rotary_dim = static_cast<int64_t>(static_cast<double>(c->head_dim) * partial);
  if (partial <= 0 || partial > 1 || c->rotary_dim % 2 != 0 || c->rotary_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": partial_rotary_factor ", partial, " x head_dim ",
                                                   c->head_dim, " must give an even rotary dimension in [2, ",
                                                   c->head_dim, "]"));
  }
  const RopeConfig& r = c->rope;
  if (r.type == RopeType::kLongrope) {
    const size_t want = static_cast<size_t>(c->rope_dim() / 2);
    if (r.short_factor.size() != want || r.long_factor.size() != want) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": longrope short_factor and long_factor must have rotary_dim / 2 = ", want,
                       " entries, got ", r.short_factor.size(), " and ", r.long_factor.size()));
    }
  }
  return absl::OkStatus();
}

bool IsGemma3Multimodal(const json& root) {
  const auto archs = root.find("architectures");
  const bool named =
      archs != root.end() && archs->is_array() && !archs->empty() && (*archs)[0] == "Gemma3ForConditionalGeneration";
  return named || (root.contains("model_type") && root["model_type"] == "gemma3");
}

// The text model's config.json of a Gemma3ForConditionalGeneration config: its text_config over
// Gemma3TextConfig's defaults (transformers 4 saves only the keys that differ from them), with
// the checkpoint's tie_word_embeddings.
absl::StatusOr<json> Gemma3TextConfig(const json& root, const std::string& source) {
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

}  // namespace

std::vector<LinearLayer> LinearLayers(const ModelConfig& c) {
  const int64_t d = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), f = c.intermediate_size;
  if (c.fused_projections) {
    return {{"qkv_proj", true, d, q + 2 * kv},
            {"o_proj", true, q, d},
            {"gate_up_proj", false, d, 2 * f},
            {"down_proj", false, f, d}};
  }
  return {{"q_proj", true, d, q},     {"k_proj", true, d, kv},  {"v_proj", true, d, kv},   {"o_proj", true, q, d},
          {"gate_proj", false, d, f}, {"up_proj", false, d, f}, {"down_proj", false, f, d}};
}

absl::StatusOr<std::vector<std::string>> ResolveLoraTargets(const ModelConfig& c,
                                                            const std::vector<std::string>& targets) {
  std::set<std::string> want(targets.begin(), targets.end());
  if (c.fused_projections) {
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
  for (const LinearLayer& l : LinearLayers(c)) {
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

const char* RopeTypeName(RopeType type) {
  for (const auto& [t, n] : kRopeTypes) {
    if (t == type) return n;
  }
  return "default";
}

ModelConfig ApplyRopeScaling(ModelConfig config, const RopeScalingOverride& s) {
  RopeConfig& r = config.rope;
  const int64_t pretrained =
      r.original_max_position_embeddings > 0 ? r.original_max_position_embeddings : config.max_position_embeddings;
  r.type = s.type;
  r.factor = s.factor.value_or(1.0);
  r.original_max_position_embeddings = s.original_max_position_embeddings.value_or(pretrained);
  if (s.low_freq_factor) r.low_freq_factor = *s.low_freq_factor;
  if (s.high_freq_factor) r.high_freq_factor = *s.high_freq_factor;
  if (s.beta_fast) r.beta_fast = *s.beta_fast;
  if (s.beta_slow) r.beta_slow = *s.beta_slow;
  return config;
}

absl::StatusOr<std::string> EffectiveConfigJson(const std::string& base_config_json, const ModelConfig& effective,
                                                const std::string& source) {
  json root = json::parse(base_config_json, nullptr, /*allow_exceptions=*/false);
  if (!root.is_object()) return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  // A vision-language checkpoint's RoPE is its text_config's.
  const bool nested = effective.multimodal_text && root.contains("text_config") && root["text_config"].is_object();
  json& text = nested ? root["text_config"] : root;
  const RopeConfig& r = effective.rope;
  // A job cannot rescale longrope (ApplyRopeScaling's callers refuse it): the model's own.
  if (r.type == RopeType::kDefault || r.type == RopeType::kLongrope) return root.dump(2) + "\n";
  json rope = {{"rope_type", RopeTypeName(r.type)}, {"factor", r.factor}};
  if (r.type == RopeType::kYarn || r.type == RopeType::kLlama3) {
    rope["original_max_position_embeddings"] = r.original_max_position_embeddings;
  }
  if (r.type == RopeType::kYarn) {
    rope["beta_fast"] = r.beta_fast;
    rope["beta_slow"] = r.beta_slow;
    if (r.attention_factor > 0) rope["attention_factor"] = r.attention_factor;
    if (r.mscale > 0) rope["mscale"] = r.mscale;
    if (r.mscale_all_dim > 0) rope["mscale_all_dim"] = r.mscale_all_dim;
    if (!r.truncate) rope["truncate"] = false;
  }
  if (r.type == RopeType::kLlama3) {
    rope["low_freq_factor"] = r.low_freq_factor;
    rope["high_freq_factor"] = r.high_freq_factor;
  }
  rope["rope_theta"] = r.theta;
  text["rope_theta"] = r.theta;
  text["rope_scaling"] = rope;
  text["rope_parameters"] = rope;
  if (effective.sliding_rope.has_value()) {  // Gemma 3: the scaling is the global layers'
    const RopeConfig& local = *effective.sliding_rope;
    json full = rope;
    full["rope_theta"] = r.theta;
    text["rope_parameters"] = {
        {"full_attention", full},
        {"sliding_attention", {{"rope_type", RopeTypeName(local.type)}, {"rope_theta", local.theta}}}};
    text["rope_local_base_freq"] = local.theta;
  }
  if (r.type != RopeType::kDynamic) {
    const int64_t pretrained =
        r.original_max_position_embeddings > 0 ? r.original_max_position_embeddings : effective.max_position_embeddings;
    const auto extended = static_cast<int64_t>(std::llround(r.factor * static_cast<double>(pretrained)));
    text["max_position_embeddings"] = std::max(effective.max_position_embeddings, extended);
  }
  return root.dump(2) + "\n";
}

std::optional<RopeScalingOverride> RopeScalingOf(const RopeConfig& trained) {
  if (trained.type == RopeType::kDefault || trained.type == RopeType::kLongrope) return std::nullopt;
  RopeScalingOverride o;
  o.type = trained.type;
  o.factor = trained.factor;
  o.original_max_position_embeddings = trained.original_max_position_embeddings;
  o.low_freq_factor = trained.low_freq_factor;
  o.high_freq_factor = trained.high_freq_factor;
  o.beta_fast = trained.beta_fast;
  o.beta_slow = trained.beta_slow;
  return o;
}

int64_t ModelConfig::ParameterCount() const {
  const int64_t d = hidden_size;
  int64_t attn = d * q_dim() + 2 * d * kv_dim() + q_dim() * d;
  if (qkv_bias) attn += q_dim() + 2 * kv_dim();
  if (o_bias) attn += d;
  const int64_t mlp = 3 * d * intermediate_size;
  const int64_t layer = attn + mlp + (gemma_layers ? 4 : 2) * d + (qk_norm ? 2 * head_dim : 0);
  return num_layers * layer + vocab_size * d * (tie_word_embeddings ? 1 : 2) + d;
}

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source) {
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  if (IsGemma3Multimodal(root)) {
    OOMB_ASSIGN_OR_RETURN(const json text, Gemma3TextConfig(root, source));
    OOMB_ASSIGN_OR_RETURN(ModelConfig c, ParseModelConfig(text.dump(), absl::StrCat(source, ": text_config")));
    c.multimodal_text = true;
    return c;
  }
  ModelConfig c;
  const JsonReader r(root, source);
  auto archs = root.find("architectures");
  if (archs != root.end() && archs->is_array() && !archs->empty() && (*archs)[0].is_string()) {
    c.architecture = (*archs)[0].get<std::string>();
  }
  OOMB_RETURN_IF_ERROR(r.String("model_type", &c.model_type));
  OOMB_RETURN_IF_ERROR(ParseFamily(root, source, &c));
  OOMB_RETURN_IF_ERROR(r.Int("vocab_size", &c.vocab_size));
  OOMB_RETURN_IF_ERROR(r.Int("hidden_size", &c.hidden_size));
  OOMB_RETURN_IF_ERROR(r.Int("intermediate_size", &c.intermediate_size));
  OOMB_RETURN_IF_ERROR(r.Int("num_hidden_layers", &c.num_layers));
  OOMB_RETURN_IF_ERROR(r.Int("num_attention_heads", &c.num_heads));
  c.num_kv_heads = c.num_heads;
  OOMB_RETURN_IF_ERROR(r.Int("num_key_value_heads", &c.num_kv_heads, false));
  OOMB_RETURN_IF_ERROR(r.IntIn("max_position_embeddings", &c.max_position_embeddings, 1, kMaxPositions));
  OOMB_RETURN_IF_ERROR(r.DoubleIn("rms_norm_eps", &c.rms_norm_eps, 0, 0.1, /*lo_open=*/true));
  OOMB_RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &c.tie_word_embeddings));
  if (c.model_type == "llama" || c.model_type == "qwen3") {  // Mistral: no biases
    bool attention_bias = false;
    OOMB_RETURN_IF_ERROR(r.Bool("attention_bias", &attention_bias));
    c.qkv_bias = c.o_bias = attention_bias;
  }
  if (c.model_type == "llama") OOMB_RETURN_IF_ERROR(r.Bool("mlp_bias", &c.mlp_bias));
  OOMB_RETURN_IF_ERROR(r.TokenId("bos_token_id", &c.bos_token_id));
  OOMB_RETURN_IF_ERROR(r.TokenId("eos_token_id", &c.eos_token_id));
  OOMB_RETURN_IF_ERROR(r.String("torch_dtype", &c.torch_dtype));
  if (c.torch_dtype.empty()) OOMB_RETURN_IF_ERROR(r.String("dtype", &c.torch_dtype));
  // Bounds far above any real model's, so that the planner's byte counts cannot overflow.
  for (auto [name, v, max] : {std::tuple{"vocab_size", c.vocab_size, int64_t{1} << 24},
                              {"hidden_size", c.hidden_size, int64_t{1} << 17},
                              {"intermediate_size", c.intermediate_size, int64_t{1} << 19},
                              {"num_hidden_layers", c.num_layers, int64_t{1} << 12},
                              {"num_attention_heads", c.num_heads, int64_t{1} << 12},
                              {"num_key_value_heads", c.num_kv_heads, int64_t{1} << 12}}) {
    if (v <= 0 || v > max) {
      return WithReason(
          absl::InvalidArgumentError(absl::StrCat(source, ": key '", name, "' must be in [1, ", max, "], got ", v)),
          Reason::kBadModel);
    }
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": num_attention_heads (", c.num_heads,
                                                   ") must be a multiple of num_key_value_heads (", c.num_kv_heads,
                                                   ")"));
  }
  c.head_dim = c.hidden_size / c.num_heads;
  OOMB_RETURN_IF_ERROR(r.Int("head_dim", &c.head_dim, false));
  if (c.head_dim <= 0 || c.head_dim % 2 != 0 || c.head_dim > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": head_dim must be even and in [2, 4096], got ", c.head_dim));
  }
  OOMB_RETURN_IF_ERROR(ParseRope(root, source, &c));
  OOMB_RETURN_IF_ERROR(ParseRotaryDim(root, source, &c));
  return c;
}

// config.json files are small; a bigger one is not a model's configuration.
constexpr int64_t kMaxConfigBytes = int64_t{16} << 20;

absl::StatusOr<ModelConfig> LoadModelConfig(const Dir& model_dir) {
  OOMB_ASSIGN_OR_RETURN(std::string text, model_dir.ReadFile("config.json", kMaxConfigBytes));
  return ParseModelConfig(text, model_dir.PathOf("config.json"));
}

absl::StatusOr<std::optional<RopeScalingOverride>> AdapterRopeScaling(const Dir& adapter) {
  if (!adapter.Contains(kBaseConfigFile)) return std::optional<RopeScalingOverride>();
  OOMB_ASSIGN_OR_RETURN(const std::string text, adapter.ReadFile(kBaseConfigFile, kMaxConfigBytes));
  OOMB_ASSIGN_OR_RETURN(const ModelConfig trained, ParseModelConfig(text, adapter.PathOf(kBaseConfigFile)));
  return RopeScalingOf(trained.rope);
}

}  // namespace oomb
