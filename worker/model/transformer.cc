#include "worker/model/transformer.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#if defined(OOMB_HAVE_CUDA)
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/torch/chunked_cross_entropy.h"
#include "kernels/torch/expert_ops.h"
#include "kernels/torch/layer_ops.h"
#include "kernels/torch/matmul.h"
#include "kernels/torch/upload.h"
#include "worker/common/status.h"
#include "worker/hf/json_reader.h"
#include "worker/hf/safetensors.h"
#include "worker/model/rope.h"
#include "worker/plan/job_config.h"

namespace oomb {
namespace {

at::ScalarType ToScalarType(DType d) {
  switch (d) {
    case DType::kF64:
      return at::kDouble;
    case DType::kF32:
      return at::kFloat;
    case DType::kF16:
      return at::kHalf;
    case DType::kBF16:
      return at::kBFloat16;
    case DType::kI64:
      return at::kLong;
    case DType::kI32:
      return at::kInt;
    case DType::kI16:
      return at::kShort;
    case DType::kI8:
      return at::kChar;
    case DType::kU8:
      return at::kByte;
    case DType::kBool:
      return at::kBool;
  }
  return at::kFloat;
}

absl::StatusOr<DType> ToDType(at::ScalarType t) {
  switch (t) {
    case at::kDouble:
      return DType::kF64;
    case at::kFloat:
      return DType::kF32;
    case at::kHalf:
      return DType::kF16;
    case at::kBFloat16:
      return DType::kBF16;
    default:
      return absl::InvalidArgumentError(absl::StrCat("cannot save dtype ", c10::toString(t)));
  }
}

// Float type for LoRA parameters and RoPE tables: float64 models stay float64, others float32.
at::ScalarType MasterType(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// Copies a safetensors view into a new tensor of `dtype` on `device`.
at::Tensor FromView(const TensorView& v, at::ScalarType dtype, at::Device device) {
  const at::Tensor raw =
      at::from_blob(const_cast<void*>(v.data), v.shape, at::TensorOptions().dtype(ToScalarType(v.dtype)));
  return raw.to(device, dtype, /*non_blocking=*/false, /*copy=*/true);
}

// Dequantizes gpt-oss's MXFP4 expert bank `name` into `weight` [E, out, in], as transformers'
// convert_moe_packed_tensors does: <name>_blocks uint8 [E, out, in / 32, 16] holds two E2M1
// values a byte (the low nibble first), <name>_scales uint8 [E, out, in / 32] a power of two
// 2^(s - 127) for each 32 of them. One expert at a time, so the host holds one expert's floats.
absl::Status DequantizeMxfp4(const WeightSet& weights, const std::string& name, const std::string& dir,
                             at::Tensor weight) {
  const TensorView* blocks = weights.Find(name + "_blocks");
  const TensorView* scales = weights.Find(name + "_scales");
  const int64_t E = weight.size(0), out = weight.size(1), in = weight.size(2);
  const std::vector<int64_t> blocks_shape = {E, out, in / 32, 16}, scales_shape = {E, out, in / 32};
  if (scales == nullptr) return absl::InvalidArgumentError(absl::StrCat(dir, ": missing tensor '", name, "_scales'"));
  if (in % 32 != 0 || blocks->dtype != DType::kU8 || scales->dtype != DType::kU8 || blocks->shape != blocks_shape ||
      scales->shape != scales_shape) {
    const auto describe = [](const TensorView& v) {
      return absl::StrCat(std::string(DTypeName(v.dtype)), " [", absl::StrJoin(v.shape, ", "), "]");
    };
    return absl::InvalidArgumentError(absl::StrCat(
        dir, ": MXFP4 tensors '", name, "_blocks' ", describe(*blocks), " and '", name, "_scales' ", describe(*scales),
        ": expected U8 [", absl::StrJoin(blocks_shape, ", "), "] and U8 [", absl::StrJoin(scales_shape, ", "), "]"));
  }
  static const float kE2m1[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  const at::Tensor lut = at::from_blob(const_cast<float*>(kE2m1), {16}, at::kFloat);
  const at::Tensor all_blocks = FromView(*blocks, at::kByte, at::kCPU),
                   all_scales = FromView(*scales, at::kByte, at::kCPU);
  for (int64_t e = 0; e < E; ++e) {
    const at::Tensor b = all_blocks[e];  // [out, in / 32, 16]
    const at::Tensor low = lut.index({at::bitwise_and(b, 0x0F).to(at::kLong)});
    const at::Tensor high = lut.index({at::bitwise_right_shift(b, 4).to(at::kLong)});
    const at::Tensor values = at::stack({low, high}, -1).view({out, in / 32, 32});
    const at::Tensor exponents = (all_scales[e].to(at::kInt) - 127).unsqueeze(-1);
    weight[e].copy_(at::ldexp(values, exponents).view({out, in}));
  }
  return absl::OkStatus();
}

// Writes named tensors as safetensors (contiguous CPU copies in their own dtype).
absl::Status SaveTensors(const Dir& dir, const std::string& name,
                         const std::vector<std::pair<std::string, at::Tensor>>& named,
                         const std::map<std::string, std::string>& metadata) {
  std::vector<at::Tensor> keep;
  std::vector<TensorView> views;
  for (const auto& [name, t] : named) {
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    keep.push_back(c);
    TensorView v;
    v.name = name;
    OOMB_ASSIGN_OR_RETURN(v.dtype, ToDType(c.scalar_type()));
    v.shape.assign(c.sizes().begin(), c.sizes().end());
    v.data = c.data_ptr();
    v.nbytes = c.nbytes();
    views.push_back(std::move(v));
  }
  return WriteSafetensors(dir, name, views, metadata);
}

// INVALID_ARGUMENT naming the tensors of `weights` a load did not use (`used`), but for a
// vision-language checkpoint's other model's (vision tower, projector, a tied head) and RoPE
// tables.
absl::Status CheckEveryTensorUsed(const WeightSet& weights, const std::set<std::string>& used,
                                  const ModelConfig& config, const std::string& prefix, const std::string& dir) {
  std::vector<std::string> unexpected;
  for (const std::string& n : weights.names()) {
    const bool other_model = config.multimodal_text && n.rfind(prefix, 0) != 0;
    if (!used.count(n) && !other_model && n.find("rotary_emb.inv_freq") == std::string::npos) unexpected.push_back(n);
  }
  if (unexpected.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(dir, ": unexpected tensors: ", absl::StrJoin(unexpected, ", ")));
}

// Where a vision-language checkpoint keeps its language model's "model." tensors:
// "language_model.model." (as published) or "model.language_model." (as some transformers
// versions saved it); "model." for a language model's checkpoint.
std::string StoredPrefix(const ModelConfig& c, const WeightSet& weights) {
  if (!c.multimodal_text) return "model.";
  return weights.Find("model.language_model.embed_tokens.weight") != nullptr ? "model.language_model."
                                                                             : "language_model.model.";
}

// The checkpoint's name of the tensor transformers' language model calls `hf_name`.
std::string StoredName(const ModelConfig& c, const WeightSet& weights, const std::string& prefix,
                       const std::string& hf_name) {
  if (!c.multimodal_text) return hf_name;
  if (hf_name == "lm_head.weight") {
    return weights.Find("language_model.lm_head.weight") != nullptr ? "language_model.lm_head.weight" : hf_name;
  }
  return prefix + hf_name.substr(std::string("model.").size());
}

// PEFT's name of the module transformers' language model calls `name` ("model.layers.0...").
std::string PeftModuleName(const ModelConfig& c, const std::string& name) {
  return c.multimodal_text ? "model.language_model." + name.substr(std::string("model.").size()) : name;
}

// Whether `text` (a regular expression over module names) names `module` as a whole word.
bool NamesModule(const std::string& text, const std::string& module) {
  for (size_t at = text.find(module); at != std::string::npos; at = text.find(module, at + 1)) {
    const auto word = [&](size_t i) {
      return i < text.size() && (std::isalnum(static_cast<unsigned char>(text[i])) != 0 || text[i] == '_');
    };
    if ((at == 0 || !word(at - 1)) && !word(at + module.size())) return true;
  }
  return false;
}

// adapter_config.json's target_modules: the module names; for a vision-language checkpoint a
// regular expression that names them in its language model only (its vision tower has
// layers of the same names).
nlohmann::json SavedTargets(const ModelConfig& c, const std::vector<std::string>& targets) {
  if (!c.multimodal_text) return targets;
  return absl::StrCat(".*language_model.*\\.(", absl::StrJoin(targets, "|"), ")$");
}

// adapter_config.json's target_parameters that name linear layers' weights (SaveLora's dense
// MLP of a mixture of experts, "mlp.down_proj.weight"; PEFT adapts such a weight as it adapts the
// layer, under the layer's tensor names): taken out of `lora`'s target_parameters and added to its
// target_modules by the layer's name. The expert banks the rest name get their rank and alpha
// first (rank_pattern's, else r and lora_alpha times the rank factor target_modules gives them),
// so that the names added fuse no bank's adapter to a rank the file's does not have. `weights`:
// each linear layer's weight in each layer, PEFT's name with the layer's (ResolveLoraTargets').
// INVALID_ARGUMENT for a target naming a layer's weight in some of the layers that have it only
// (oomb adapts a name in every layer), or the dense MLP without the banks its names stand for.
absl::Status TakeLinearWeights(const ModelConfig& c, const std::vector<std::pair<std::string, std::string>>& weights,
                               LoraOptions* lora) {
  std::vector<std::string> rest, named;
  for (const std::string& t : lora->target_parameters) {
    std::map<std::string, int64_t> hits, layers;
    for (const auto& [weight, name] : weights) {
      ++layers[name];
      if (weight == t || absl::EndsWith(weight, "." + t)) ++hits[name];
    }
    if (hits.empty()) rest.push_back(t);
    for (const auto& [name, n] : hits) {
      if (n != layers[name]) {
        return absl::InvalidArgumentError(absl::StrCat("target_parameters: '", t, "' names ", name, " in ", n,
                                                       " of the ", layers[name],
                                                       " layers that have it; oomb adapts all or none"));
      }
      if (std::find(named.begin(), named.end(), name) == named.end()) named.push_back(name);
    }
  }
  if (named.empty()) return absl::OkStatus();
  OOMB_ASSIGN_OR_RETURN(const std::vector<ExpertLoraTarget> banks,
                        ResolveLoraExpertTargets(c, lora->target_modules, rest, /*dropout=*/0));
  for (const ExpertLoraTarget& b : banks) {
    lora->bank_ranks.try_emplace(b.bank, lora->rank * b.rank_factor);
    lora->bank_alphas.try_emplace(b.bank, lora->alpha * static_cast<double>(b.rank_factor));
  }
  OOMB_ASSIGN_OR_RETURN(const std::vector<ExpertLoraTarget> implied, ResolveLoraExpertTargets(c, named, {}, 0));
  for (const ExpertLoraTarget& b : implied) {
    if (std::none_of(banks.begin(), banks.end(), [&](const ExpertLoraTarget& a) { return a.bank == b.bank; })) {
      return absl::InvalidArgumentError(absl::StrCat("target_parameters: the dense layers' ",
                                                     absl::StrJoin(named, ", "), " without mlp.experts.", b.bank,
                                                     ": oomb adapts them together, as PEFT 0.22 reads target_modules"));
    }
  }
  lora->target_parameters = rest;
  for (const std::string& name : named) {
    if (std::find(lora->target_modules.begin(), lora->target_modules.end(), name) == lora->target_modules.end()) {
      lora->target_modules.push_back(name);
    }
  }
  return absl::OkStatus();
}

}  // namespace

Transformer::Transformer(ModelConfig config, at::ScalarType dtype, at::Device device)
    : config_(std::move(config)),
      spec_(DescribeModel(config_)),
      dtype_(dtype),
      device_(device),
      layers_(config_.num_layers) {
  for (int64_t i = 0; i < config_.num_layers; ++i) layers_[i].Describe(spec_.layers[i]);
}

std::vector<Transformer::NamedLinear> Transformer::NamedLinears() {
  std::vector<NamedLinear> out;
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    for (const LinearSpec& l : spec_.layers[i].linears) {
      out.push_back({absl::StrCat("model.layers.", i, l.attention ? ".self_attn." : ".mlp.", l.name), &l,
                     layers_[i].LinearNamed(l.name)});
    }
  }
  return out;
}

std::vector<std::pair<std::string, const Linear*>> Transformer::NamedLinears() const {
  std::vector<std::pair<std::string, const Linear*>> out;
  for (const NamedLinear& l : const_cast<Transformer*>(this)->NamedLinears()) out.emplace_back(l.name, l.linear);
  return out;
}

std::vector<Transformer::NamedNorm> Transformer::NamedNorms(int64_t i) {
  std::vector<NamedNorm> out;
  for (const NormSpec& n : spec_.layers[i].norms) {
    out.push_back({absl::StrCat("model.layers.", i, ".", n.name), &n, layers_[i].Norm(n.role)});
  }
  return out;
}

std::vector<Transformer::NamedBank> Transformer::NamedBanks() {
  std::vector<NamedBank> out;
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    const std::optional<MoeSpec>& moe = spec_.layers[i].moe;
    if (!moe.has_value()) continue;
    for (const ExpertBankSpec& b : moe->Banks()) {
      out.push_back({absl::StrCat("model.layers.", i, ".mlp.experts.", b.name), i, b, layers_[i].Bank(b.name)});
    }
  }
  return out;
}

std::string Transformer::RouterName(int64_t i) const {
  return absl::StrCat("model.layers.", i, config_.moe.stored_banks ? ".mlp.router" : ".mlp.gate");
}

std::vector<std::pair<std::string, at::Tensor>> Transformer::MoeBiases(int64_t i) const {
  if (!config_.moe.biases) return {};
  const DecoderLayer& l = layers_[i];
  const std::string experts = absl::StrCat("model.layers.", i, ".mlp.experts.");
  return {{RouterName(i) + ".bias", l.experts.router_bias},
          {experts + "gate_up_proj_bias", l.experts.gate_up.bias},
          {experts + "down_proj_bias", l.experts.down.bias}};
}

std::vector<std::pair<std::string, at::Tensor>> Transformer::StoredMoe(int64_t i) const {
  const MoeConfig& moe = config_.moe;
  const DecoderLayer& l = layers_[i];
  std::vector<std::pair<std::string, at::Tensor>> out = MoeBiases(i);
  if (moe.stored_banks) {  // whole, [E, in, out]
    const std::string experts = absl::StrCat("model.layers.", i, ".mlp.experts.");
    out.emplace_back(RouterName(i) + ".weight", l.experts.router);
    out.emplace_back(experts + "gate_up_proj", l.experts.gate_up.weight.transpose(1, 2));
    out.emplace_back(experts + "down_proj", l.experts.down.weight.transpose(1, 2));
    return out;
  }
  const std::string block = absl::StrCat("model.layers.", i, ".", moe.stored_block, ".");
  const int64_t I = moe.intermediate;
  out.emplace_back(block + "gate.weight", l.experts.router);
  for (int64_t e = 0; e < moe.experts; ++e) {
    const std::string expert = absl::StrCat(block, "experts.", e, ".");
    const at::Tensor gate_up = l.experts.gate_up.weight[e];  // gate's rows, then up's
    out.emplace_back(expert + moe.stored_projections[0] + ".weight", gate_up.narrow(0, 0, I));
    out.emplace_back(expert + moe.stored_projections[1] + ".weight", gate_up.narrow(0, I, I));
    out.emplace_back(expert + moe.stored_projections[2] + ".weight", l.experts.down.weight[e]);
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> Transformer::StoredWeights() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& [name, t] : BaseParameters()) {
    if (name.find(".mlp.experts.") == std::string::npos && name.find(".mlp.gate.weight") == std::string::npos &&
        name.find(".mlp.router.") == std::string::npos) {
      out.emplace_back(std::move(name), std::move(t));
    }
  }
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    if (!spec_.layers[i].moe.has_value()) continue;
    for (auto& named : StoredMoe(i)) out.push_back(std::move(named));
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> Transformer::BaseParameters() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.emplace_back("model.embed_tokens.weight", embed_);
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    for (const NamedNorm& n : const_cast<Transformer*>(this)->NamedNorms(i)) out.emplace_back(n.name, *n.weight);
    if (layers_[i].attention.sinks.defined())
      out.emplace_back(absl::StrCat("model.layers.", i, ".self_attn.sinks"), layers_[i].attention.sinks);
  }
  for (const auto& [name, l] : NamedLinears()) {
    out.emplace_back(name + ".weight", l->weight);
    if (l->bias.defined()) out.emplace_back(name + ".bias", l->bias);
  }
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    if (!spec_.layers[i].moe.has_value()) continue;
    out.emplace_back(RouterName(i) + ".weight", layers_[i].experts.router);
  }
  for (const NamedBank& b : const_cast<Transformer*>(this)->NamedBanks()) out.emplace_back(b.name, b.bank->weight);
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    if (spec_.layers[i].moe.has_value()) {
      for (auto& named : MoeBiases(i)) out.push_back(std::move(named));
    }
  }
  out.emplace_back("model.norm.weight", final_norm_);
  if (!config_.tie_word_embeddings) out.emplace_back("lm_head.weight", lm_head_);
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> Transformer::TrainableParameters() const {
  if (full_) return BaseParameters();
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [name, l] : NamedLinears()) {
    if (!l->lora_a.defined()) continue;
    const std::string module = "base_model.model." + PeftModuleName(config_, name);
    out.emplace_back(module + ".lora_A.weight", l->lora_a);
    out.emplace_back(module + ".lora_B.weight", l->lora_b);
  }
  // PEFT wraps mlp.experts once per adapted bank, the first (gate_up_proj) innermost: with both
  // adapted, gate_up_proj's adapter is experts.base_layer.lora_*, down_proj's experts.lora_*.
  const std::vector<std::string> banks = lora_.has_value() ? lora_->target_parameters : std::vector<std::string>{};
  for (const NamedBank& b : const_cast<Transformer*>(this)->NamedBanks()) {
    if (!b.bank->lora_a.defined()) continue;
    const bool inner = banks.size() == 2 && b.spec.name == banks.front();
    const std::string module =
        absl::StrCat("base_model.model.model.layers.", b.layer, ".mlp.experts", inner ? ".base_layer" : "");
    out.emplace_back(module + ".lora_A.weight", b.bank->lora_a);
    out.emplace_back(module + ".lora_B.weight", b.bank->lora_b);
  }
  return out;
}

bool GradientReach::every() const {
  return std::all_of(groups.begin(), groups.end(),
                     [](const Group& g) { return g.reached == g.modules && g.experts_reached == g.experts; });
}

std::string GradientReach::Describe() const {
  return absl::StrJoin(groups, ", ", [](std::string* out, const Group& g) {
    absl::StrAppend(out, g.name, " ", g.reached, "/", g.modules);
    if (g.experts > 0) absl::StrAppend(out, " (experts ", g.experts_reached, "/", g.experts, ")");
  });
}

namespace {

// A parameter's name without "model.layers.{i}." (and PEFT's "base_model.model." and the
// ".weight"): what its copies in every layer share.
std::string ModuleName(std::string name) {
  if (absl::StartsWith(name, "base_model.model.")) name = name.substr(17);
  if (absl::EndsWith(name, ".weight")) name.resize(name.size() - 7);
  if (absl::StartsWith(name, "model.")) name = name.substr(6);
  if (absl::StartsWith(name, "layers.")) name = name.substr(name.find('.', 7) + 1);
  return name;
}

bool Nonzero(const at::Tensor& t) { return t.grad().defined() && t.grad().ne(0).any().item<bool>(); }

// How many of the E experts a gradient reaches, the expert of each slice along `dim` of
// `grad` viewed as `shape`.
int64_t ExpertsReached(const at::Tensor& grad, at::IntArrayRef shape, int64_t dim) {
  if (!grad.defined()) return 0;
  at::Tensor any = grad.reshape(shape).ne(0).movedim(dim, 0).flatten(1).any(1);
  return any.sum().item<int64_t>();
}

}  // namespace

GradientReach Transformer::Reach() const {
  GradientReach out;
  std::map<std::string, size_t> index;
  auto count = [&](const std::string& name, bool reached, int64_t experts, int64_t experts_reached) {
    auto [it, added] = index.emplace(name, out.groups.size());
    if (added) out.groups.push_back({name});
    GradientReach::Group& g = out.groups[it->second];
    g.modules += 1;
    g.reached += reached ? 1 : 0;
    g.experts += experts;
    g.experts_reached += experts_reached;
  };
  auto* self = const_cast<Transformer*>(this);
  if (full_) {
    for (const auto& [name, p] : BaseParameters()) {
      const bool bank = p.dim() == 3 && absl::StrContains(name, ".mlp.experts.");  // [E, out, in]
      const int64_t E = bank ? p.size(0) : 0;
      count(ModuleName(name), Nonzero(p), E, bank ? ExpertsReached(p.grad(), p.sizes(), 0) : 0);
    }
    return out;
  }
  for (const auto& [name, l] : NamedLinears()) {
    if (l->lora_b.defined()) count(ModuleName(name), Nonzero(l->lora_b), 0, 0);
  }
  for (const NamedBank& b : self->NamedBanks()) {
    const at::Tensor& B = b.bank->lora_b;  // [out, r E]: expert e's columns k E + e
    if (!B.defined()) continue;
    const int64_t E = b.bank->weight.size(0);
    count(ModuleName(b.name), Nonzero(B), E, ExpertsReached(B.grad(), {B.size(0), B.size(1) / E, E}, 2));
  }
  return out;
}

std::vector<Transformer::Slot> Transformer::Slots() {
  std::vector<Slot> out;
  const Split vocab = Split::Vocabulary(config_.vocab_size);
  out.push_back({&embed_, vocab});
  out.push_back({&lm_head_, vocab});
  out.push_back({&final_norm_, Split::Replicated()});
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    for (const NamedNorm& n : NamedNorms(i)) {  // a per-head norm sees the rank's heads alone
      const bool per_head = n.spec->role == NormRole::kQuery || n.spec->role == NormRole::kKey;
      out.push_back({n.weight, per_head ? Split::Partial() : Split::Replicated()});
    }
    out.push_back({&layers_[i].attention.sinks, Split::Along(0, {config_.num_heads})});
    out.push_back({&layers_[i].experts.router, Split::Partial()});
    out.push_back({&layers_[i].experts.router_bias, Split::Partial()});
  }
  // Each linear layer's and bank's own (Linear::AddSlots, ExpertBank::AddSlots).
  for (const NamedLinear& l : NamedLinears()) l.linear->AddSlots(&out);
  for (const NamedBank& b : NamedBanks()) b.bank->AddSlots(&out);
  return out;
}

Split Transformer::SlotSplit(const at::Tensor* slot) {
  for (const Slot& s : Slots()) {
    if (s.tensor == slot) return s.split;
  }
  TORCH_CHECK(false, "not a tensor of the model");
}

void Transformer::JoinGroup(const kernels::Collectives& group) {
  const int rank = group.rank(), n = group.size();
  for (const NamedLinear& l : NamedLinears()) l.linear->JoinGroup(l.spec->in, rank, n);
  vocab_begin_ = ShardRanges(Split::Vocabulary(config_.vocab_size), rank, n)[0].first;
  tp_ = &group;
}

at::Tensor Transformer::ShardOf(const at::Tensor* slot, const at::Tensor& whole) {
  if (tp_ == nullptr) return whole;
  at::NoGradGuard no_grad;
  return TakeShard(whole, SlotSplit(slot), tp_->rank(), tp_->size());
}

absl::Status Transformer::Shard(const kernels::Collectives& group) {
  if (tp_ != nullptr) return absl::FailedPreconditionError("the model is already sharded");
  OOMB_RETURN_IF_ERROR(CheckTensorParallel(config_, group.size()));
  JoinGroup(group);
  for (const Slot& slot : Slots()) *slot.tensor = ShardOf(slot.tensor, *slot.tensor);
  return absl::OkStatus();
}

Split Transformer::SplitOf(const at::Tensor& tensor) const {
  for (const Slot& slot : const_cast<Transformer*>(this)->Slots()) {
    if (slot.tensor->defined() && slot.tensor->is_same(tensor)) return slot.split;
  }
  return Split::Replicated();
}

std::vector<at::Tensor> Transformer::PartialGradients() const {
  std::vector<at::Tensor> out;
  if (tp_ == nullptr) return out;
  for (const Slot& slot : const_cast<Transformer*>(this)->Slots()) {
    const at::Tensor& t = *slot.tensor;
    if (slot.split.kind == Split::Kind::kPartial && t.defined() && t.requires_grad()) out.push_back(t);
  }
  return out;
}

std::unique_ptr<Transformer> Transformer::Whole(bool trainable_only) const {
  std::unique_ptr<Transformer> m(new Transformer(config_, dtype_, device_));
  const std::vector<Slot> from = const_cast<Transformer*>(this)->Slots(), to = m->Slots();
  for (size_t i = 0; i < from.size(); ++i) {
    const at::Tensor& t = *from[i].tensor;
    if (!t.defined() || (trainable_only && !t.requires_grad())) continue;
    at::Tensor whole = tp_ != nullptr ? GatherWhole(t, from[i].split, *tp_) : t.detach().clone();
    if (whole.data_ptr() == t.data_ptr()) whole = whole.detach().clone();
    whole.set_requires_grad(t.requires_grad());
    if (t.grad().defined()) {
      whole.mutable_grad() = tp_ != nullptr ? GatherWhole(t.grad(), from[i].split, *tp_) : t.grad().clone();
    }
    *to[i].tensor = whole;
  }
  const std::vector<NamedLinear> src = const_cast<Transformer*>(this)->NamedLinears(), dst = m->NamedLinears();
  for (size_t i = 0; i < src.size(); ++i) {
    dst[i].linear->lora_scaling = src[i].linear->lora_scaling;
    dst[i].linear->lora_dropout = src[i].linear->lora_dropout;
  }
  const std::vector<NamedBank> src_banks = const_cast<Transformer*>(this)->NamedBanks(), dst_banks = m->NamedBanks();
  for (size_t i = 0; i < src_banks.size(); ++i) dst_banks[i].bank->lora_scaling = src_banks[i].bank->lora_scaling;
  m->lora_ = lora_;
  m->full_ = full_;
  m->expert_kernel_ = expert_kernel_;
  m->expert_recompute_layers_ = expert_recompute_layers_;
  return m;
}

at::Tensor Transformer::LmHeadLoss(const at::Tensor& hidden, const at::Tensor& labels, int64_t rows_per_block) const {
  if (tp_ == nullptr) return kernels::ChunkedLmHeadCrossEntropy(hidden, lm_head(), labels, rows_per_block);
  const kernels::VocabShard shard{tp_, vocab_begin_, config_.vocab_size};
  return kernels::ChunkedLmHeadCrossEntropy(hidden, lm_head(), labels, rows_per_block, &shard);
}

std::pair<at::Tensor, at::Tensor> Transformer::LmHeadScores(const at::Tensor& hidden, const at::Tensor& labels,
                                                            int64_t rows_per_block) const {
  if (tp_ == nullptr) return kernels::LmHeadTokenScores(hidden, lm_head(), labels, rows_per_block);
  const kernels::VocabShard shard{tp_, vocab_begin_, config_.vocab_size};
  return kernels::LmHeadTokenScores(hidden, lm_head(), labels, rows_per_block, &shard);
}

absl::StatusOr<std::unique_ptr<Transformer>> Transformer::Load(const Dir& model_dir, at::ScalarType dtype,
                                                               at::Device device,
                                                               const std::optional<RopeScalingOverride>& rope_scaling,
                                                               const kernels::Collectives* tensor_parallel) {
  OOMB_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model_dir));
  if (rope_scaling.has_value() && config.rope.type == RopeType::kLongrope) {
    return absl::InvalidArgumentError(absl::StrCat(model_dir.PathOf("config.json"),
                                                   ": the model scales its RoPE with longrope; a RoPE scaling over it "
                                                   "cannot apply"));
  }
  if (rope_scaling.has_value()) config = ApplyRopeScaling(std::move(config), *rope_scaling);
  OOMB_ASSIGN_OR_RETURN(std::unique_ptr<WeightSet> weights, WeightSet::Open(model_dir));
  const std::string& dir = model_dir.path();
  std::unique_ptr<Transformer> m(new Transformer(config, dtype, device));
  if (tensor_parallel != nullptr) {
    OOMB_RETURN_IF_ERROR(CheckTensorParallel(config, tensor_parallel->size()));
    m->JoinGroup(*tensor_parallel);
  }
  const int64_t d = config.hidden_size;
  std::set<std::string> used;
  const std::string prefix = StoredPrefix(config, *weights);
  // Into `out`, one of the model's tensors (its share: ShardOf), or with `whole` a tensor of the caller's.
  auto take = [&](const std::string& hf_name, std::vector<int64_t> shape, at::Tensor* out,
                  bool whole = false) -> absl::Status {
    const std::string name = StoredName(config, *weights, prefix, hf_name);
    const TensorView* v = weights->Find(name);
    if (v == nullptr) return absl::InvalidArgumentError(absl::StrCat(dir, ": missing tensor '", name, "'"));
    if (v->shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": tensor '", name, "' has shape [",
                                                     absl::StrJoin(v->shape, ", "), "], expected [",
                                                     absl::StrJoin(shape, ", "), "]"));
    }
    if (ToScalarType(v->dtype) == at::kBool || !at::isFloatingType(ToScalarType(v->dtype))) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, ": tensor '", name, "' has non-float dtype ", std::string(DTypeName(v->dtype))));
    }
    *out = whole ? FromView(*v, dtype, device) : m->ShardOf(out, FromView(*v, dtype, device));
    used.insert(name);
    return absl::OkStatus();
  };
  OOMB_RETURN_IF_ERROR(take("model.embed_tokens.weight", {config.vocab_size, d}, &m->embed_));
  OOMB_RETURN_IF_ERROR(take("model.norm.weight", {d}, &m->final_norm_));
  if (!config.tie_word_embeddings) {
    OOMB_RETURN_IF_ERROR(take("lm_head.weight", {config.vocab_size, d}, &m->lm_head_));
  }
  for (int64_t i = 0; i < config.num_layers; ++i) {
    for (const NamedNorm& n : m->NamedNorms(i)) OOMB_RETURN_IF_ERROR(take(n.name, {n.spec->size}, n.weight));
    if (m->spec_.layers[i].sinks > 0) {
      OOMB_RETURN_IF_ERROR(take(absl::StrCat("model.layers.", i, ".self_attn.sinks"), {config.num_heads},
                                &m->layers_[i].attention.sinks));
    }
  }
  for (const NamedLinear& l : m->NamedLinears()) {
    OOMB_RETURN_IF_ERROR(take(l.name + ".weight", {l.spec->out, l.spec->in}, &l.linear->weight));
    if (l.spec->bias) OOMB_RETURN_IF_ERROR(take(l.name + ".bias", {l.spec->out}, &l.linear->bias));
  }
  const auto options = at::TensorOptions().dtype(dtype).device(device);
  for (int64_t i = 0; i < config.num_layers; ++i) {  // each expert's tensors into its bank
    if (!m->spec_.layers[i].moe.has_value()) continue;
    m->AllocateMoe(i, options);
    for (auto& [name, view] : m->StoredMoe(i)) {
      at::Tensor stored;
      if (config.moe.stored_banks && weights->Find(name) == nullptr && weights->Find(name + "_blocks") != nullptr) {
        OOMB_RETURN_IF_ERROR(DequantizeMxfp4(*weights, name, dir, view.transpose(1, 2)));
        used.insert({name + "_blocks", name + "_scales"});
        continue;
      }
      OOMB_RETURN_IF_ERROR(take(name, view.sizes().vec(), &stored, /*whole=*/true));
      view.copy_(stored);
    }
    for (at::Tensor* t : {&m->layers_[i].experts.gate_up.weight, &m->layers_[i].experts.gate_up.bias,
                          &m->layers_[i].experts.down.weight, &m->layers_[i].experts.down.bias}) {
      *t = m->ShardOf(t, *t);  // the bank whole, then split
    }
  }
  OOMB_RETURN_IF_ERROR(CheckEveryTensorUsed(*weights, used, config, prefix, dir));
  return m;
}

void Transformer::AllocateMoe(int64_t i, const at::TensorOptions& options) {
  const MoeConfig& moe = config_.moe;
  layers_[i].experts.router = at::empty({moe.experts, config_.hidden_size}, options);
  if (moe.biases) layers_[i].experts.router_bias = at::empty({moe.experts}, options);
  for (const NamedBank& b : NamedBanks()) {
    if (b.layer != i) continue;
    b.bank->weight = at::empty({b.spec.experts, b.spec.out, b.spec.in}, options);
    if (moe.biases) b.bank->bias = at::empty({b.spec.experts, b.spec.out}, options);
  }
}

std::unique_ptr<Transformer> Transformer::Random(const ModelConfig& config, at::ScalarType dtype, at::Device device,
                                                 uint64_t seed, double init_std,
                                                 const kernels::Collectives* tensor_parallel) {
  std::unique_ptr<Transformer> m(new Transformer(config, dtype, device));
  if (tensor_parallel != nullptr) {
    TORCH_CHECK(CheckTensorParallel(config, tensor_parallel->size()).ok(),
                "Random: ", CheckTensorParallel(config, tensor_parallel->size()).message());
    m->JoinGroup(*tensor_parallel);
  }
  const auto put = [&](at::Tensor* slot, at::Tensor whole) { *slot = m->ShardOf(slot, whole); };
  at::Generator gen = at::detail::createCPUGenerator(seed);
  // On the CPU drawn in float64 whatever the dtype, so models of different dtypes from one seed
  // hold the same weights up to rounding (tests compare them). On a GPU drawn there directly
  // (a 7B model drawn on the host in float64 would take minutes).
  if (device.is_cuda()) at::manual_seed(seed);
  auto draw = [&](std::vector<int64_t> shape, double mean, double std) {
    if (device.is_cuda()) return at::empty(shape, at::TensorOptions().dtype(dtype).device(device)).normal_(mean, std);
    return at::normal(mean, std, shape, gen, at::TensorOptions().dtype(at::kDouble)).to(device, dtype);
  };
  auto randn = [&](std::vector<int64_t> shape) { return draw(shape, 0.0, init_std); };
  auto norm = [&](int64_t n) { return draw({n}, 1.0, 0.1); };
  const int64_t d = config.hidden_size;
  put(&m->embed_, randn({config.vocab_size, d}));
  put(&m->final_norm_, norm(d));
  if (!config.tie_word_embeddings) put(&m->lm_head_, randn({config.vocab_size, d}));
  for (int64_t i = 0; i < config.num_layers; ++i) {
    for (const NamedNorm& n : m->NamedNorms(i)) put(n.weight, norm(n.spec->size));
  }
  const std::vector<NamedLinear> linears = m->NamedLinears();  // a layer's weights, then its biases
  for (size_t layer = 0, first = 0, end = 0; layer < m->spec_.layers.size(); ++layer, first = end) {
    end = first + m->spec_.layers[layer].linears.size();
    for (size_t i = first; i < end; ++i) {
      put(&linears[i].linear->weight, randn({linears[i].spec->out, linears[i].spec->in}));
    }
    for (size_t i = first; i < end; ++i) {
      if (linears[i].spec->bias) put(&linears[i].linear->bias, randn({linears[i].spec->out}));
    }
  }
  for (int64_t i = 0; i < config.num_layers; ++i) {
    if (m->spec_.layers[i].moe.has_value()) put(&m->layers_[i].experts.router, randn({config.moe.experts, d}));
    if (m->spec_.layers[i].sinks > 0) put(&m->layers_[i].attention.sinks, randn({config.num_heads}));
  }
  for (const NamedBank& b : m->NamedBanks()) put(&b.bank->weight, randn({b.spec.experts, b.spec.out, b.spec.in}));
  if (config.moe.biases) {
    for (int64_t i = 0; i < config.num_layers; ++i) {
      if (m->spec_.layers[i].moe.has_value()) put(&m->layers_[i].experts.router_bias, randn({config.moe.experts}));
    }
    for (const NamedBank& b : m->NamedBanks()) put(&b.bank->bias, randn({b.spec.experts, b.spec.out}));
  }
  return m;
}

std::unique_ptr<Transformer> Transformer::CastTo(at::ScalarType dtype) const {
  std::unique_ptr<Transformer> m(new Transformer(config_, dtype, device_));
  auto cast = [&](const at::Tensor& t) { return t.defined() ? t.detach().to(dtype) : t; };
  auto master = [&](const at::Tensor& t) {
    return t.defined() ? t.detach().to(MasterType(dtype)).set_requires_grad(t.requires_grad()) : t;
  };
  m->embed_ = cast(embed_);
  m->final_norm_ = cast(final_norm_);
  m->lm_head_ = cast(lm_head_);
  const auto dst = m->NamedLinears();
  const auto src = NamedLinears();
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    const auto dst_norms = m->NamedNorms(i), src_norms = const_cast<Transformer*>(this)->NamedNorms(i);
    for (size_t j = 0; j < src_norms.size(); ++j) *dst_norms[j].weight = cast(*src_norms[j].weight);
  }
  for (size_t i = 0; i < src.size(); ++i) {
    Linear& d = *dst[i].linear;
    const Linear& s = *src[i].second;
    d.weight = cast(s.weight);
    d.bias = cast(s.bias);
    d.lora_a = master(s.lora_a);
    d.lora_b = master(s.lora_b);
    d.lora_scaling = s.lora_scaling;
    d.lora_dropout = s.lora_dropout;
    d.whole_in = s.whole_in;
    d.in_begin = s.in_begin;
  }
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    m->layers_[i].experts.router = cast(layers_[i].experts.router);
    m->layers_[i].experts.router_bias = cast(layers_[i].experts.router_bias);
    m->layers_[i].attention.sinks = cast(layers_[i].attention.sinks);
  }
  const auto dst_banks = m->NamedBanks(), src_banks = const_cast<Transformer*>(this)->NamedBanks();
  for (size_t i = 0; i < src_banks.size(); ++i) {
    ExpertBank& d = *dst_banks[i].bank;
    const ExpertBank& s = *src_banks[i].bank;
    d.weight = cast(s.weight);
    d.bias = cast(s.bias);
    d.lora_a = master(s.lora_a);
    d.lora_b = master(s.lora_b);
    d.lora_scaling = s.lora_scaling;
  }
  m->lora_ = lora_;
  m->tp_ = tp_;
  m->vocab_begin_ = vocab_begin_;
  if (full_) m->EnableFullFineTuning();
  return m;
}

absl::Status Transformer::AddLora(const LoraOptions& options, uint64_t seed) {
  if (full_) return absl::FailedPreconditionError("LoRA cannot be added to a model in full fine-tuning mode");
  if (options.rank <= 0 || options.rank > JobConfig::kMaxLoraRank) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoRA rank must be in [1, ", JobConfig::kMaxLoraRank, "], got ", options.rank));
  }
  OOMB_ASSIGN_OR_RETURN(const std::vector<std::string> resolved, ResolveLoraTargets(config_, options.target_modules));
  OOMB_ASSIGN_OR_RETURN(
      const std::vector<ExpertLoraTarget> banks,
      ResolveLoraExpertTargets(config_, options.target_modules, options.target_parameters, options.dropout));
  const std::set<std::string> targets(resolved.begin(), resolved.end());
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const auto opts = at::TensorOptions().dtype(MasterType(dtype_));
  // A: kaiming_uniform_(a = sqrt(5)) over `in` inputs; B: zeros.
  // Drawn whole (the layer's whole in and out), then this rank's share.
  const auto lora_pair = [&](int64_t a_rows, int64_t in, int64_t out, at::Tensor* a, at::Tensor* b) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    *a = ShardOf(a, at::empty({a_rows, in}, at::TensorOptions().dtype(at::kDouble))
                        .uniform_(-bound, bound, gen)
                        .to(device_, opts.dtype().toScalarType()))
             .set_requires_grad(true);
    *b = ShardOf(b, at::zeros({out, a_rows}, opts.device(device_))).set_requires_grad(true);
  };
  for (const NamedLinear& named : NamedLinears()) {
    if (!targets.count(named.spec->name)) continue;
    Linear* l = named.linear;
    lora_pair(options.rank, named.spec->in, named.spec->out, &l->lora_a, &l->lora_b);
    l->lora_scaling = options.alpha / static_cast<double>(options.rank);
    l->lora_dropout = options.dropout;
  }
  LoraOptions applied = options;
  applied.target_modules = resolved;
  applied.target_parameters.clear();
  applied.bank_ranks.clear();
  applied.bank_alphas.clear();
  for (const ExpertLoraTarget& t : banks) {
    const auto rank = options.bank_ranks.find(t.bank);
    const auto alpha = options.bank_alphas.find(t.bank);
    const int64_t r = rank != options.bank_ranks.end() ? rank->second : options.rank * t.rank_factor;
    const double a = alpha != options.bank_alphas.end() ? alpha->second : options.alpha * t.rank_factor;
    if (r <= 0 || r > JobConfig::kMaxLoraRank) {
      return absl::InvalidArgumentError(
          absl::StrCat("LoRA rank of mlp.experts.", t.bank, " must be in [1, ", JobConfig::kMaxLoraRank, "], got ", r));
    }
    for (const NamedBank& named : NamedBanks()) {
      if (named.spec.name != t.bank) continue;
      ExpertBank* b = named.bank;
      lora_pair(r * named.spec.experts, named.spec.in, named.spec.out, &b->lora_a, &b->lora_b);
      b->lora_scaling = a / static_cast<double>(r);
    }
    applied.target_parameters.push_back(t.bank);
    if (r != options.rank) applied.bank_ranks[t.bank] = r;
    if (a != options.alpha) applied.bank_alphas[t.bank] = a;
  }
  lora_ = std::move(applied);
  return absl::OkStatus();
}

void Transformer::EnableFullFineTuning() {
  TORCH_CHECK(!lora_.has_value(), "full fine-tuning of a model with LoRA adapters");
  full_ = true;
  for (auto& [name, t] : BaseParameters()) t.set_requires_grad(true);
}

absl::Status Transformer::LoadLoraWeights(const Dir& adapter) {
  if (!lora_.has_value()) return absl::FailedPreconditionError("LoadLoraWeights: the model has no adapters");
  OOMB_ASSIGN_OR_RETURN(auto weights, WeightSet::Open(adapter, "adapter_model.safetensors"));
  const std::string& adapter_dir = adapter.path();
  for (auto& [name, t] : TrainableParameters()) {
    const TensorView* v = weights->Find(name);
    if (v == nullptr) return absl::InvalidArgumentError(absl::StrCat(adapter_dir, ": missing tensor '", name, "'"));
    const at::Tensor whole = FromView(*v, t.scalar_type(), t.device());
    at::Tensor share = whole;
    if (tp_ != nullptr && whole.dim() == t.dim()) {
      try {
        share = TakeShard(whole, SplitOf(t), tp_->rank(), tp_->size());
      } catch (const c10::Error&) {  // too small to split: the shape check below says so
      }
    }
    if (share.sizes() != t.sizes()) {
      return absl::InvalidArgumentError(
          absl::StrCat(adapter_dir, ": tensor '", name, "' has shape [", absl::StrJoin(v->shape, ", "),
                       "], which does not fit this model ([", absl::StrJoin(t.sizes(), ", "), "]",
                       tp_ == nullptr ? "" : " on each rank of tensor parallelism", ")"));
    }
    at::NoGradGuard no_grad;
    t.copy_(share);
  }
  return absl::OkStatus();
}

absl::Status Transformer::LoadAdapter(const Dir& adapter) {
  const std::string path = adapter.PathOf("adapter_config.json");
  OOMB_ASSIGN_OR_RETURN(const std::string text, adapter.ReadFile("adapter_config.json", int64_t{1} << 20));
  const auto cfg = nlohmann::json::parse(text, nullptr, false);
  if (!cfg.is_object()) return absl::InvalidArgumentError(path + ": not a JSON object");
  LoraOptions lora;
  lora.rank = 8;  // PEFT's LoraConfig defaults
  lora.alpha = 8;
  const JsonReader reader(cfg, path);
  OOMB_RETURN_IF_ERROR(reader.IntIn("r", &lora.rank, 1, JobConfig::kMaxLoraRank));
  OOMB_RETURN_IF_ERROR(reader.DoubleIn("lora_alpha", &lora.alpha, 0, JobConfig::kMaxLoraAlpha, /*lo_open=*/true));
  try {
    const nlohmann::json targets = cfg.value("target_modules", nlohmann::json({"q_proj", "v_proj"}));
    if (targets.is_string()) {  // a regular expression over module names: the model's layers it names
      lora.target_modules.clear();
      for (const LinearSpec& l : LinearLayers(config_)) {
        if (NamesModule(targets.get<std::string>(), l.name)) lora.target_modules.emplace_back(l.name);
      }
    } else {
      lora.target_modules = targets.get<std::vector<std::string>>();
    }
    if (const auto it = cfg.find("target_parameters"); it != cfg.end() && !it->is_null()) {
      lora.target_parameters = it->get<std::vector<std::string>>();
    }
    if (config_.moe.experts > 0) {
      // PEFT converts the family's own names of the experts' projections to their banks and
      // ignores names that match nothing (Mixtral's gate_proj).
      const std::vector<LinearSpec> linears = LinearLayers(config_);
      const std::vector<std::string>& own = config_.moe.stored_projections;
      std::erase_if(lora.target_modules, [&](const std::string& t) {
        return std::find(own.begin(), own.end(), t) == own.end() &&
               std::none_of(linears.begin(), linears.end(), [&](const LinearSpec& l) { return l.name == t; });
      });
    }
    // rank_pattern and alpha_pattern: the keys that name an expert bank, as PEFT matches them
    // (a regular expression over the parameter's name, from a dot).
    const auto banks = ExpertBankParts(config_);
    for (const auto& [field, into] : {std::pair{"rank_pattern", false}, std::pair{"alpha_pattern", true}}) {
      const auto it = cfg.find(field);
      if (it == cfg.end() || !it->is_object()) continue;
      for (const auto& [key, value] : it->items()) {
        const std::regex pattern("(.*\\.)?(" + key + ")");
        for (const auto& [bank, parts] : banks) {
          if (!std::regex_match("model.layers.0.mlp.experts." + bank, pattern)) continue;
          if (into) {
            lora.bank_alphas[bank] = value.get<double>();
          } else {
            lora.bank_ranks[bank] = value.get<int64_t>();
          }
        }
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
  } catch (const std::regex_error& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": rank_pattern / alpha_pattern: ", e.what()));
  }
  std::vector<std::pair<std::string, std::string>> weights;
  for (const NamedLinear& l : NamedLinears()) {
    weights.emplace_back(PeftModuleName(config_, l.name) + ".weight", l.spec->name);
  }
  OOMB_RETURN_IF_ERROR(Annotate(TakeLinearWeights(config_, weights, &lora), path));
  OOMB_RETURN_IF_ERROR(Annotate(AddLora(lora, 0), path));
  OOMB_RETURN_IF_ERROR(LoadLoraWeights(adapter));
  // A tensor no adapter takes would be dropped without a word: the config read otherwise than
  // its writer meant it (PEFT 0.21's and 0.22's target_modules on a mixture of experts).
  OOMB_ASSIGN_OR_RETURN(auto file, WeightSet::Open(adapter, "adapter_model.safetensors"));
  std::set<std::string> taken;
  for (const auto& [name, t] : TrainableParameters()) taken.insert(name);
  for (const std::string& name : file->names()) {
    if (taken.count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(adapter.PathOf("adapter_model.safetensors"), ": tensor '", name,
                                                     "' belongs to no adapter that ", path, " gives this model"));
    }
  }
  return absl::OkStatus();
}

absl::Status Transformer::SaveLora(const Dir& dir, const std::string& base_model_path) const {
  if (!lora_.has_value()) return absl::FailedPreconditionError("SaveLora: the model has no adapters");
  OOMB_RETURN_IF_ERROR(SaveTensors(dir, "adapter_model.safetensors", TrainableParameters(), {{"format", "pt"}}));
  nlohmann::json cfg = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", base_model_path},
      {"r", lora_->rank},
      {"lora_alpha", lora_->alpha},
      {"lora_dropout", lora_->dropout},
      {"target_modules", nullptr},
      {"target_parameters", nullptr},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"use_rslora", false},
      {"use_dora", false},
      {"modules_to_save", nullptr},
      {"layers_to_transform", nullptr},
      {"revision", nullptr},
  };
  // A mixture of experts' dense MLP goes in target_parameters as its weights: PEFT 0.21 reads
  // the MLP's names in target_modules as the expert banks alone, 0.22 as the banks and the dense
  // layers, and both adapt a weight target_parameters names as they adapt its layer.
  std::vector<std::string> modules, parameters;
  const std::vector<LinearSpec> linears = LinearLayers(config_);
  for (const std::string& t : lora_->target_modules) {
    const bool dense_mlp =
        config_.moe.experts > 0 &&
        std::any_of(linears.begin(), linears.end(), [&](const LinearSpec& l) { return l.name == t && !l.attention; });
    if (dense_mlp) {
      parameters.push_back("mlp." + t + ".weight");
    } else {
      modules.push_back(t);
    }
  }
  for (const std::string& b : lora_->target_parameters) parameters.push_back("mlp.experts." + b);
  if (!modules.empty()) cfg["target_modules"] = SavedTargets(config_, modules);
  if (!parameters.empty()) cfg["target_parameters"] = parameters;
  nlohmann::json ranks = nlohmann::json::object(), alphas = nlohmann::json::object();  // as PEFT writes them
  for (const auto& [bank, r] : lora_->bank_ranks) ranks[".*\\." + bank] = r;
  for (const auto& [bank, a] : lora_->bank_alphas) alphas[".*\\." + bank] = a;
  cfg["rank_pattern"] = ranks;
  cfg["alpha_pattern"] = alphas;
  return dir.WriteFileAtomic("adapter_config.json", cfg.dump(2) + "\n");
}

absl::Status Transformer::SaveFull(const Dir& dir, const std::string& config_json) const {
  OOMB_RETURN_IF_ERROR(SaveTensors(dir, "model.safetensors", StoredWeights(), {{"format", "pt"}}));
  nlohmann::json config = nlohmann::json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (config.is_object() && config.erase("quantization_config") > 0) {  // the weights are written dequantized
    return dir.WriteFileAtomic("config.json", config.dump(2) + "\n");
  }
  return dir.WriteFileAtomic("config.json", config_json);
}

Transformer::Cursor Transformer::Begin(const ChunkInput& input) const {
  Cursor cursor;
  // LoRA dropout's masks are drawn where the activations are: a generator of that device, seeded
  // for the chunk (a CUDA generator's masks are the same on every device for one seed).
#if defined(OOMB_HAVE_CUDA)
  if (device_.is_cuda()) {
    cursor.gen = at::cuda::detail::createCUDAGenerator(device_.index());
    cursor.gen.set_current_seed(input.dropout_seed);
  } else {
    cursor.gen = at::detail::createCPUGenerator(input.dropout_seed);
  }
#else
  cursor.gen = at::detail::createCPUGenerator(input.dropout_seed);
#endif
  auto [cos, sin] = oomb::RopeTables(config_, config_.rope, input.positions, input.rope_seq_len, dtype_);
  cursor.cos = cos.unsqueeze(1);  // [C, 1, D]
  cursor.sin = sin.unsqueeze(1);
  if (spec_.HasLocalRope()) {
    auto [local_cos, local_sin] =
        oomb::RopeTables(config_, *config_.sliding_rope, input.positions, input.rope_seq_len, dtype_);
    cursor.sliding_cos = local_cos.unsqueeze(1);
    cursor.sliding_sin = local_sin.unsqueeze(1);
  }
  if (tp_ == nullptr) {
    cursor.h = at::embedding(embed_, input.ids);
  } else {  // the rank's rows of the vocabulary, the others' tokens zeros, summed over the group
    const int64_t rows = embed_.size(0);
    const at::Tensor local = input.ids - vocab_begin_;
    const at::Tensor own = local.ge(0) & local.lt(rows);
    cursor.h = Context().SumShards(at::embedding(embed_, local.clamp(0, rows - 1)) * own.unsqueeze(1).to(dtype_));
  }
  if (spec_.scale_embeddings) {  // times sqrt(hidden) rounded to the model's dtype, as transformers does
    cursor.h = cursor.h * at::scalar_tensor(std::sqrt(static_cast<double>(config_.hidden_size)), dtype_).item();
  }
  cursor.training = input.training;
  cursor.balance = input.balance;
  return cursor;
}

std::array<at::Tensor, 3> Transformer::AttentionInputs(Cursor& cursor) const {
  const BlockContext ctx = Context();
  const DecoderLayer& l = layers_[cursor.layer];
  const LayerSpec& spec = spec_.layers[cursor.layer];
  const at::Tensor x = ctx.EnterShards(ctx.Norm(cursor.h, l.input_norm));
  const bool local = spec.local_rope;
  return l.attention.Inputs(ctx, spec, x, local ? cursor.sliding_cos : cursor.cos,
                            local ? cursor.sliding_sin : cursor.sin, &cursor.gen, cursor.training);
}

void Transformer::FinishLayer(Cursor& cursor, const at::Tensor& attention) const {
  const BlockContext ctx = Context();
  const DecoderLayer& l = layers_[cursor.layer];
  const LayerSpec& spec = spec_.layers[cursor.layer];
  at::Tensor attn_out = l.attention.Output(ctx, attention, &cursor.gen, cursor.training);
  if (spec.Has(NormRole::kAttentionOutput)) attn_out = ctx.Norm(attn_out, l.attn_out_norm);
  const at::Tensor h = cursor.h + attn_out;
  // The MLP block the layer's description names: dense, or of experts.
  const at::Tensor y = ctx.EnterShards(ctx.Norm(h, l.post_norm));
  at::Tensor mlp_out;
  if (spec.moe.has_value()) {
    const auto sparse_before = std::count_if(spec_.layers.begin(), spec_.layers.begin() + cursor.layer,
                                             [](const LayerSpec& s) { return s.moe.has_value(); });
    const ExpertRun run{.kernel = expert_kernel(),
                        .recompute_gate_up = sparse_before < expert_recompute_layers_,
                        .balance = cursor.balance};
    mlp_out = ctx.SumShards(l.experts.Forward(ctx, *spec.moe, run, y));
  } else {
    mlp_out = l.mlp.Forward(ctx, spec, y, &cursor.gen, cursor.training);
  }
  if (spec.Has(NormRole::kMlpOutput)) mlp_out = ctx.Norm(mlp_out, l.mlp_out_norm);
  cursor.h = h + mlp_out;
  ++cursor.layer;
}

ExpertKernel Transformer::expert_kernel() const {
  std::vector<int64_t> ranks;  // the adapted banks' LoRA ranks
  for (const DecoderLayer& l : layers_) {
    for (const ExpertBank* b : {&l.experts.gate_up, &l.experts.down}) {
      if (b->lora_a.defined()) ranks.push_back(b->lora_a.size(0) / b->weight.size(0));
    }
  }
  return ChooseExpertKernel(expert_kernel_, config_, dtype_, device_, tensor_parallel_size(), ranks);
}

std::pair<at::Tensor, at::Tensor> Transformer::RopeTables(const RopeConfig& rope, const at::Tensor& positions,
                                                          int64_t rope_seq_len) const {
  return oomb::RopeTables(config_, rope, positions, rope_seq_len, dtype_);
}

at::Tensor Transformer::End(const Cursor& cursor) const { return Context().Norm(cursor.h, final_norm_); }

at::Tensor Transformer::Hidden(const ChunkInput& input, const AttentionFn& attention) const {
  Cursor cursor = Begin(input);
  while (cursor.layer < config_.num_layers) {
    const auto [q, k, v] = AttentionInputs(cursor);
    FinishLayer(cursor, attention(cursor.layer, q, k, v));
  }
  return End(cursor);
}

}  // namespace oomb
