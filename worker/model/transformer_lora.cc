#include "worker/model/transformer.h"
#include "worker/model/weight_files.h"

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
#include "worker/hf/lora_limits.h"
#include "worker/hf/safetensors.h"
#include "worker/model/rope.h"

namespace oomb {
namespace {

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

absl::Status Transformer::AddLora(const LoraOptions& options, uint64_t seed) {
  if (full_) return absl::FailedPreconditionError("LoRA cannot be added to a model in full fine-tuning mode");
  if (options.rank <= 0 || options.rank > kMaxLoraRank) {
    return absl::InvalidArgumentError(absl::StrCat("LoRA rank must be in [1, ", kMaxLoraRank, "], got ", options.rank));
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
    if (r <= 0 || r > kMaxLoraRank) {
      return absl::InvalidArgumentError(
          absl::StrCat("LoRA rank of mlp.experts.", t.bank, " must be in [1, ", kMaxLoraRank, "], got ", r));
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
  OOMB_RETURN_IF_ERROR(reader.IntIn("r", &lora.rank, 1, kMaxLoraRank));
  OOMB_RETURN_IF_ERROR(reader.DoubleIn("lora_alpha", &lora.alpha, 0, kMaxLoraAlpha, /*lo_open=*/true));
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

}  // namespace oomb
