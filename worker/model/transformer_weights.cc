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
#include "worker/hf/safetensors.h"
#include "worker/model/rope.h"

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

}  // namespace

// Float type for LoRA parameters and RoPE tables: float64 models stay float64, others float32.
at::ScalarType MasterType(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// Copies a safetensors view into a new tensor of `dtype` on `device`.
at::Tensor FromView(const TensorView& v, at::ScalarType dtype, at::Device device) {
  const at::Tensor raw =
      at::from_blob(const_cast<void*>(v.data), v.shape, at::TensorOptions().dtype(ToScalarType(v.dtype)));
  return raw.to(device, dtype, /*non_blocking=*/false, /*copy=*/true);
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

absl::Status Transformer::SaveFull(const Dir& dir, const std::string& config_json) const {
  OOMB_RETURN_IF_ERROR(SaveTensors(dir, "model.safetensors", StoredWeights(), {{"format", "pt"}}));
  nlohmann::json config = nlohmann::json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (config.is_object() && config.erase("quantization_config") > 0) {  // the weights are written dequantized
    return dir.WriteFileAtomic("config.json", config.dump(2) + "\n");
  }
  return dir.WriteFileAtomic("config.json", config_json);
}

}  // namespace oomb
