// What a block's forward reads of the model it belongs to (worker/model/transformer.h): the
// configuration and layer description, the dtype, the tensor-parallel group, and the operations
// every block shares (the model's norm, entering a column-parallel region and summing a
// row-parallel one's output).
//
// Thread-safety: a view of the model; as the model is.
#ifndef OOMB_WORKER_MODEL_BLOCK_CONTEXT_H_
#define OOMB_WORKER_MODEL_BLOCK_CONTEXT_H_

#include <ATen/ATen.h>

#include "kernels/torch/tensor_parallel.h"
#include "worker/hf/layer_spec.h"
#include "worker/hf/model_config.h"

namespace oomb {

struct BlockContext {
  const ModelConfig& config;
  const ModelSpec& spec;
  at::ScalarType dtype;
  const kernels::Collectives* tp = nullptr;  // the tensor-parallel group, or none

  int tp_size() const { return tp == nullptr ? 1 : tp->size(); }
  // Whether this rank adds what is replicated inside a partial region (a row-parallel layer's
  // bias, the router's auxiliary loss): rank 0 alone (tensor_parallel.h).
  bool LeadsGroup() const { return tp == nullptr || tp->rank() == 0; }
  int64_t local_heads() const { return config.num_heads / tp_size(); }
  int64_t local_kv_heads() const { return config.num_kv_heads / tp_size(); }
  // A column-parallel region's input, and a row-parallel region's output summed over the group
  // (the identity without tensor parallelism).
  at::Tensor EnterShards(const at::Tensor& x) const { return tp == nullptr ? x : kernels::EnterShards(x, *tp); }
  at::Tensor SumShards(const at::Tensor& x) const { return tp == nullptr ? x : kernels::SumShards(x, *tp); }
  // The model's norm (ModelSpec::norm) of x with `weight`.
  at::Tensor Norm(const at::Tensor& x, const at::Tensor& weight) const;
  // Float type for LoRA parameters and RoPE tables: float64 models stay float64, others float32.
  at::ScalarType master() const { return dtype == at::kDouble ? at::kDouble : at::kFloat; }
};

}  // namespace oomb

#endif  // OOMB_WORKER_MODEL_BLOCK_CONTEXT_H_
