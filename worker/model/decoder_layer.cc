#include "worker/model/decoder_layer.h"

#include <c10/util/Exception.h>

#include <utility>

#include "kernels/torch/layer_ops.h"

namespace oomb {

at::Tensor BlockContext::Norm(const at::Tensor& x, const at::Tensor& weight) const {
  if (spec.norm == NormKind::kRmsOnePlusWeight) return kernels::GemmaRmsNorm(x, weight, config.rms_norm_eps);
  return kernels::RmsNorm(x, weight, config.rms_norm_eps);
}

void DecoderLayer::Describe(const LayerSpec& spec) {
  for (const LinearSpec& l : spec.linears) LinearNamed(l.name)->Describe(l);
  if (!spec.moe.has_value()) return;
  for (const ExpertBankSpec& b : spec.moe->Banks()) Bank(b.name)->Describe(b);
}

at::Tensor* DecoderLayer::Norm(NormRole role) {
  switch (role) {
    case NormRole::kInput:
      return &input_norm;
    case NormRole::kAttentionOutput:
      return &attn_out_norm;
    case NormRole::kMlpInput:
      return &post_norm;
    case NormRole::kMlpOutput:
      return &mlp_out_norm;
    case NormRole::kQuery:
      return &attention.q_norm;
    case NormRole::kKey:
      return &attention.k_norm;
  }
  return nullptr;
}

Linear* DecoderLayer::LinearNamed(const std::string& name) {
  const std::pair<const char*, Linear*> members[] = {
      {"q_proj", &attention.q}, {"k_proj", &attention.k},     {"v_proj", &attention.v},
      {"o_proj", &attention.o}, {"qkv_proj", &attention.qkv}, {"gate_proj", &mlp.gate},
      {"up_proj", &mlp.up},     {"down_proj", &mlp.down},     {"gate_up_proj", &mlp.gate_up}};
  for (const auto& [n, member] : members) {
    if (name == n) return member;
  }
  TORCH_CHECK(false, "no linear layer ", name);
}

ExpertBank* DecoderLayer::Bank(const std::string& name) {
  return name == "gate_up_proj" ? &experts.gate_up : &experts.down;
}

}  // namespace oomb
