// A linear layer of the model: its base weight, an optional bias, an optional LoRA adapter, and
// its place under tensor parallelism, read from the layer description (LinearSpec:
// row_parallel, parts) and nowhere else.
//
// LoRA (PEFT semantics): y = x W^T + b + (dropout(x) A^T B^T) * alpha / r; A initialised like
// PEFT (kaiming-uniform, a = sqrt(5)), B with zeros; kept in float32 for bfloat16 models
// (float64 for float64 models).
//
// The split (tensor_parallel.h, Megatron-LM's layout): a column-parallel layer keeps its rank's
// output rows of every part (weight, bias and B alike; A replicated, its gradient partial); its
// input comes from the block's column region (BlockContext::EnterShards, once for the layers
// that share it). A row-parallel layer keeps its rank's input columns (weight and A; B and the
// bias replicated with partial gradients); its Forward adds the bias on the group's rank 0 alone
// and sums its output over the group, its own collective; its LoRA dropout draws the mask one
// device would draw and keeps its columns.
//
// The base product is one call (Product): where a quantized weight's storage will take over.
//
// Thread-safety: as the model is.
#ifndef OOMB_WORKER_MODEL_LINEAR_H_
#define OOMB_WORKER_MODEL_LINEAR_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "worker/hf/layer_spec.h"
#include "worker/model/block_context.h"
#include "worker/model/tensor_parallel.h"

namespace oomb {

// A tensor of the model with how tensor parallelism splits it (Transformer::Slots).
struct TensorSlot {
  at::Tensor* tensor;
  Split split;
};

// The splits of a linear layer's tensors, or an expert bank's (`experts`: one leading expert
// dimension more in the weight [E, out, in] and the bias [E, out]): the one place that says
// them. A column-parallel layer splits the weight's rows, the bias and B like them, its A
// replicated with a partial gradient; a row-parallel layer splits the weight's columns and A
// like them, its bias and B replicated with partial gradients.
void AddLinearSlots(bool row_parallel, const std::vector<int64_t>& parts, bool experts, at::Tensor* weight,
                    at::Tensor* bias, at::Tensor* lora_a, at::Tensor* lora_b, std::vector<TensorSlot>* out);

struct Linear {
  at::Tensor weight;  // [out, in]
  at::Tensor bias;    // [out] or undefined
  at::Tensor lora_a;  // [rank, in] or undefined
  at::Tensor lora_b;  // [out, rank]
  double lora_scaling = 0;
  double lora_dropout = 0;
  bool row_parallel = false;   // LinearSpec::row_parallel (set with the layer)
  std::vector<int64_t> parts;  // LinearSpec::parts: the split dimension's parts
  // A row-parallel layer under tensor parallelism: its whole input's width and where this rank's
  // columns start (0: not split).
  int64_t whole_in = 0, in_begin = 0;

  // Takes the layer description's split.
  void Describe(const LinearSpec& spec);
  // x W^T (+ b) + LoRA's update; a row-parallel layer's output summed over the group, its bias
  // added by rank 0 alone. `gen`: LoRA dropout's masks (training only).
  at::Tensor Forward(const BlockContext& ctx, const at::Tensor& x, at::Generator* gen, bool training) const;
  // The same before a row-parallel layer's sum (a fused consumer sums itself); with_bias false
  // leaves the bias out.
  at::Tensor Partial(const at::Tensor& x, at::Generator* gen, bool training, bool with_bias = true) const;
  // The base product x W^T (+ bias).
  at::Tensor Product(const at::Tensor& x, bool with_bias) const;
  // The layer's tensors (weight, bias, A, B) with their splits: the one place that says so.
  void AddSlots(std::vector<TensorSlot>* out);
  // Where this rank's columns start, for a row-parallel layer's dropout (rank of size).
  void JoinGroup(int64_t whole_in_features, int rank, int size);
};

}  // namespace oomb

#endif  // OOMB_WORKER_MODEL_LINEAR_H_
