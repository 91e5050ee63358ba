// The attention block's projections and what the model does around the attention itself (which
// is a callback: the paged KV cache's, kernels/torch/paged_attention.h, or a full-sequence one):
// q, k and v (or Phi-3's fused qkv_proj, split as transformers splits it), q/k biases (Qwen2),
// an RMSNorm over each head of q and k before RoPE (Qwen3, Gemma 3), RoPE over the first
// rotary_dim features of a head, the query scale (Gemma 3's query_pre_attn_scalar), the output
// projection, and gpt-oss's attention sinks (which the callback takes).
//
// Under tensor parallelism the block holds its rank's heads (q, k, v column-parallel, o
// row-parallel, the sinks split like the heads; worker/model/tensor_parallel.h).
//
// Thread-safety: as the model is.
#ifndef OOMB_WORKER_MODEL_ATTENTION_H_
#define OOMB_WORKER_MODEL_ATTENTION_H_

#include <ATen/ATen.h>

#include <array>

#include "worker/hf/layer_spec.h"
#include "worker/model/block_context.h"
#include "worker/model/linear.h"

namespace oomb {

struct AttentionBlock {
  Linear q, k, v, o;
  Linear qkv;                 // LayerSpec::fused_projections, instead of q, k and v
  at::Tensor q_norm, k_norm;  // [head_dim] (NormRole kQuery, kKey), or undefined
  at::Tensor sinks;           // [num_heads] (LayerSpec::sinks), or undefined

  // q [C, heads, D], k and v [C, kv_heads, D] of x [C, hidden] (the input norm's output, in the
  // column region), q and k after RoPE with cos and sin [C, 1, rotary_dim].
  std::array<at::Tensor, 3> Inputs(const BlockContext& ctx, const LayerSpec& spec, const at::Tensor& x,
                                   const at::Tensor& cos, const at::Tensor& sin, at::Generator* gen,
                                   bool training) const;
  // The output projection of the attention's output [C, heads, D], summed over the group.
  at::Tensor Output(const BlockContext& ctx, const at::Tensor& attention, at::Generator* gen, bool training) const;
};

}  // namespace oomb

#endif  // OOMB_WORKER_MODEL_ATTENTION_H_
