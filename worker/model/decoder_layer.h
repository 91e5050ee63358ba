// One decoder layer: its norms (LayerSpec::norms), its attention block, and its MLP block, dense
// or of experts (LayerSpec::moe), each block its own type and file:
//   attention.h   q/k/v/o (or qkv), q/k norms, RoPE, sinks
//   dense_mlp.h   gate/up/down (or gate_up), SwiGLU or GELU-tanh GLU
//   expert_mlp.h  the router and the expert banks
// A new block kind is a new file, a member here, and the line in Transformer::FinishLayer that
// runs it for the layers whose LayerSpec names it.
//
// Thread-safety: as the model is.
#ifndef OOMB_WORKER_MODEL_DECODER_LAYER_H_
#define OOMB_WORKER_MODEL_DECODER_LAYER_H_

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "worker/hf/layer_spec.h"
#include "worker/model/attention.h"
#include "worker/model/dense_mlp.h"
#include "worker/model/expert_mlp.h"
#include "worker/model/linear.h"

namespace oomb {

struct DecoderLayer {
  at::Tensor input_norm;  // [hidden]
  at::Tensor post_norm;   // [hidden], the MLP's input norm (Gemma's pre_feedforward_layernorm)
  // The norms LayerSpec::norms names (NormRole); undefined where the layer has none:
  at::Tensor attn_out_norm, mlp_out_norm;  // [hidden], of the attention's and the MLP's outputs
  AttentionBlock attention;
  DenseMlp mlp;       // a dense layer's
  ExpertMlp experts;  // LayerSpec::moe's, instead of mlp

  // Takes the layer description's splits into its linear layers and banks.
  void Describe(const LayerSpec& spec);
  // The member that holds the norm of `role`, the linear layer `name` (LinearSpec::name), the
  // expert bank `name` (ExpertBankSpec::name).
  at::Tensor* Norm(NormRole role);
  Linear* LinearNamed(const std::string& name);
  ExpertBank* Bank(const std::string& name);
};

}  // namespace oomb

#endif  // OOMB_WORKER_MODEL_DECODER_LAYER_H_
