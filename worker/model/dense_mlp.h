// The dense MLP block: a gated MLP (SwiGLU, or Gemma's GELU-tanh GLU; LayerSpec::mlp) of gate,
// up and down projections (Phi-3's fused gate_up_proj, gate's rows first). Under tensor
// parallelism gate and up are column-parallel over the intermediate features, down
// row-parallel (worker/model/tensor_parallel.h).
//
// Thread-safety: as the model is.
#ifndef OOMB_WORKER_MODEL_DENSE_MLP_H_
#define OOMB_WORKER_MODEL_DENSE_MLP_H_

#include <ATen/ATen.h>

#include "worker/hf/layer_spec.h"
#include "worker/model/block_context.h"
#include "worker/model/linear.h"

namespace oomb {

struct DenseMlp {
  Linear gate, up, down;
  Linear gate_up;  // LayerSpec::fused_projections, instead of gate and up

  // The MLP of y [C, hidden] (the MLP's input norm's output, in the column region), summed over
  // the group.
  at::Tensor Forward(const BlockContext& ctx, const LayerSpec& spec, const at::Tensor& y, at::Generator* gen,
                     bool training) const;
};

}  // namespace oomb

#endif  // OOMB_WORKER_MODEL_DENSE_MLP_H_
