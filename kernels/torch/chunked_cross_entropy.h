// Fused, sub-chunked LM head + cross-entropy, as a LibTorch autograd function.
//
//   hidden:  [N, hidden_size]    final-norm outputs of N tokens
//   weight:  [vocab, hidden_size] the LM head (tied or not)
//   labels:  [N] int64            target token per row; kIgnoreIndex rows contribute nothing.
//                                 On hidden's device or the CPU: from the CPU, which blocks
//                                 have a label is known without waiting for the device.
//   returns: scalar, the SUM over rows of -log softmax(hidden @ weight^T)[label]
//
// Logits are computed `rows_per_block` rows at a time and never kept: one matmul a block, in the
// inputs' dtype (bfloat16 on the tensor cores, as transformers computes logits), then
// CrossEntropyRows (kernels/torch/layer_ops.h: log-sum-exp in float32, float64 for float64
// inputs) turns the block into its loss and, where a gradient is wanted (grad mode on and hidden
// or weight requiring one), into its gradient in place, which forward multiplies into the
// gradients of hidden (and of weight: full fine-tuning, tied embeddings) there and then. Backward
// only scales those by the loss's incoming gradient, in float32. So memory is rows_per_block x
// vocab in dtype beside hidden's gradient, never N x vocab (docs/ARCHITECTURE.md §3: never
// materialise C x vocab float32 logits), and the logits are computed once. Labels must be in
// [0, vocab) or kIgnoreIndex.
#ifndef OOMB_KERNELS_TORCH_CHUNKED_CROSS_ENTROPY_H_
#define OOMB_KERNELS_TORCH_CHUNKED_CROSS_ENTROPY_H_

#include <ATen/core/Tensor.h>

#include <utility>

#include "kernels/torch/tensor_parallel.h"

namespace oomb::kernels {

inline constexpr int64_t kIgnoreIndex = -100;

at::Tensor ChunkedLmHeadCrossEntropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                                     int64_t rows_per_block = 1024, const VocabShard* shard = nullptr);

// Per row, without autograd and with the same numerics: the cross-entropy of its label, and
// whether the label is the argmax of its logits (what greedy decoding would emit there).
// Returns {loss [N] float32 (float64 for float64 inputs), hit [N] bool} on hidden's device;
// kIgnoreIndex rows get 0 and false. Their sum over rows equals ChunkedLmHeadCrossEntropy's
// value to rounding. With `shard`, every rank returns the whole vocabulary's scores; the argmax
// is the first index of the largest logit, as on one device.
std::pair<at::Tensor, at::Tensor> LmHeadTokenScores(const at::Tensor& hidden, const at::Tensor& weight,
                                                    const at::Tensor& labels, int64_t rows_per_block = 1024,
                                                    const VocabShard* shard = nullptr);

}  // namespace oomb::kernels

#endif  // OOMB_KERNELS_TORCH_CHUNKED_CROSS_ENTROPY_H_
