// Fused, sub-chunked LM head + cross-entropy, as a LibTorch autograd function.
//
//   hidden:  [N, hidden_size]    final-norm outputs of N tokens
//   weight:  [vocab, hidden_size] the LM head (tied or not)
//   labels:  [N] int64            target token per row; kIgnoreIndex rows contribute nothing.
//                                 On hidden's device or the CPU: from the CPU, which blocks
//                                 have a label is known without waiting for the device.
//   returns: scalar, the SUM over rows of -log softmax(hidden @ weight^T)[label]
//
// Logits are computed `rows_per_block` rows at a time and never kept: forward saves only its
// inputs, backward recomputes each block's logits. So memory is rows_per_block x vocab, not
// N x vocab (ARCHITECTURE.md §3: never materialise C x vocab float32 logits). The logit
// matmuls run in the inputs' dtype (bfloat16 on the tensor cores, as transformers computes
// logits); log-sum-exp and softmax are float32 (float64 for float64 inputs). Gradients flow to hidden and, when it
// requires grad (full fine-tuning, tied embeddings), to weight.
#ifndef OOMB_KERNELS_TORCH_CHUNKED_CROSS_ENTROPY_H_
#define OOMB_KERNELS_TORCH_CHUNKED_CROSS_ENTROPY_H_

#include <ATen/core/Tensor.h>

namespace oomb::kernels {

inline constexpr int64_t kIgnoreIndex = -100;

at::Tensor ChunkedLmHeadCrossEntropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                                     int64_t rows_per_block = 1024);

}  // namespace oomb::kernels

#endif  // OOMB_KERNELS_TORCH_CHUNKED_CROSS_ENTROPY_H_
