#include "worker/hf/model_config.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/common/status.h"
#include "worker/hf/family.h"
#include "worker/hf/json_reader.h"
#include "worker/hf/layer_spec.h"
#include "worker/hf/loading_code.h"

namespace oomb {
namespace {

// Bounds of the numbers a config.json gives, far outside any real model's and inside what the
// engine can size and compute with (the job spec's own bounds where it has the same field:
// model.rope_scaling's factor and original_max_position_embeddings).
constexpr int64_t kMaxPositions = kMaxPositionEmbeddings;
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

}  // namespace

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

int64_t ModelConfig::ParameterCount() const { return DescribeModel(*this).ParameterCount(*this); }

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source) {
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  for (const Family& f : Families()) {
    if (f.language_model_config == nullptr) continue;
    if (std::optional<absl::StatusOr<json>> text = f.language_model_config(root, source)) {
      OOMB_RETURN_IF_ERROR(text->status());
      OOMB_ASSIGN_OR_RETURN(ModelConfig c, ParseModelConfig((*text)->dump(), absl::StrCat(source, ": text_config")));
      c.multimodal_text = true;
      return c;
    }
  }
  ModelConfig c;
  const JsonReader r(root, source);
  auto archs = root.find("architectures");
  if (archs != root.end() && archs->is_array() && !archs->empty() && (*archs)[0].is_string()) {
    c.architecture = (*archs)[0].get<std::string>();
  }
  OOMB_RETURN_IF_ERROR(r.String("model_type", &c.model_type));
  const Family* family = FindFamily(c.architecture, c.model_type);
  if (family == nullptr) {
    std::vector<std::string> supported;
    for (const Family& f : Families()) supported.push_back(f.architecture);
    return absl::UnimplementedError(absl::StrCat(source, ": architecture '", c.architecture, "' (model_type '",
                                                 c.model_type,
                                                 "') is not supported; supported: ", absl::StrJoin(supported, ", ")));
  }
  c.architecture = family->architecture;
  c.model_type = family->model_type;
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
  OOMB_RETURN_IF_ERROR(family->parse(root, source, &c));
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
