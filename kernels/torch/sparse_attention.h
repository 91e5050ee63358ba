// Attention of one chunk over its selected past pages and itself (page-level sparse
// attention, docs/ARCHITECTURE.md §5), as a LibTorch autograd function.
//
// Shapes (one sequence, one layer; C = chunk tokens, S = past tokens, a multiple of P):
//   q:          [C, num_heads, head_dim]      after RoPE
//   k, v:       [C, kv_heads, head_dim]       the chunk's own keys (after RoPE) and values
//   doc_start:  [C] int64                     global index of each query's document start, on
//                                             q's device or the CPU (the CPU's lets the fused
//                                             path be chosen without waiting for the device)
//   selection:  [n_tiles, kv_heads, n] int64  past pages per query tile of P rows and KV head
//                                             (kernels/torch/page_select.h; -1: none)
//   out:        [C, num_heads, head_dim]
//
// Query i (global S + i) of tile t = i / P, head h * G + g, attends to
//   - the tokens j of the pages selection[t, h, :] with doc_start[i] <= j, and
//   - the chunk's own tokens j with doc_start[i] <= j <= S + i,
// with softmax scale 1/sqrt(head_dim). With every visible page selected this is exactly
// PagedAttention (kernels/torch/paged_attention.h).
//
// Autograd: forward saves only chunk-local tensors and the selection; backward gathers the
// selected pages again and hands their dK/dV to SparsePast::AccumulatePageGrad, in place,
// outside autograd. So gradients reach only selected pages, and recomputation in stage 2 with
// the selection of stage 1 is exact.
//
// Two implementations, one contract:
//   - the reference (CPU, and any case the fused one does not take): per query tile, the
//     tile's G * P query rows of a KV head against that head's gathered pages and the chunk's
//     prefix, masked softmax in float32 (float64 for float64 inputs); it is the oracle.
//   - fused (CUDA, bf16 / fp16, head_dim a multiple of 8 up to 256, every query's document
//     starting at token 0): the kernels of fused_attention.h (cuDNN's on Hopper, else flash's)
//     over two key blocks merged by log-sum-exp: the past as one batched call, each query tile
//     [P, num_heads, D] against its own selected pages [kv_heads, n * P, D] (GQA in the kernel,
//     no repeated heads; in backward the G query heads of a KV head stacked as G * P rows of
//     one head, which the kernel runs at twice the rate), and the chunk against itself, causal. Backward runs both
//     blocks' kernel backward against the merged output; dK/dV of the selected pages come back per (tile, head) and are
//     added into the pages.
// Precision: bf16 / fp16 computed in float32 (the kernels' accumulation), dK/dV of the past
// accumulated in float32 (float64 for float64 inputs).
#ifndef OOMB_KERNELS_TORCH_SPARSE_ATTENTION_H_
#define OOMB_KERNELS_TORCH_SPARSE_ATTENTION_H_

#include <ATen/core/Tensor.h>

#include <memory>
#include <utility>

#include "kernels/torch/fused_attention.h"

namespace oomb::kernels {

// The paged past of one layer of one sequence, as sparse attention sees it. Implemented by the
// KV cache (worker/kv); tests implement it over plain tensors.
class SparsePast {
 public:
  virtual ~SparsePast() = default;
  // Number of past tokens (the chunk's start index S, a multiple of P).
  virtual int64_t past_tokens() const = 0;
  // Keys and values of the selected pages, selection [n_tiles, kv_heads, n] (page indices, -1:
  // none) -> [n_tiles, kv_heads, n * P, head_dim] each, zeros where -1, on the selection's
  // device, in the pages' dtype.
  virtual std::pair<at::Tensor, at::Tensor> GatherPages(const at::Tensor& selection) = 0;
  // Adds dK, dV of the selected pages, [n_tiles, kv_heads, n * P, head_dim] each (the fused
  // path's in the attention's dtype, the reference's in float32 or float64), into the pages'
  // gradients, accumulating in float32 (float64 for float64 pages); entries of -1 are skipped,
  // pages selected more than once receive every contribution.
  virtual void AccumulatePageGrad(const at::Tensor& selection, const at::Tensor& dk, const at::Tensor& dv) = 0;
  // A hint: the attention is done with this past in forward or in backward (what is read next
  // may start coming in). Every path calls it, in forward and backward.
  virtual void Finished(bool backward) {}
};

// Differentiable in q, k and v. `past` may be null when the chunk has no past (S == 0, the
// selection [n_tiles, kv_heads, 0]). `page_tokens` is P (also the query tile's rows). `kernel`:
// the fused path's (fused_attention.h).
// `sinks` as PagedAttention's (paged_attention.h).
// Raises c10::Error (TORCH_CHECK) for shape, dtype or device mismatches, naming the argument.
at::Tensor SparsePagedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& doc_start, std::shared_ptr<SparsePast> past,
                                const at::Tensor& selection, int64_t page_tokens,
                                GpuAttentionKernel kernel = GpuAttentionKernel::kCudnn, const at::Tensor& sinks = {});

}  // namespace oomb::kernels

#endif  // OOMB_KERNELS_TORCH_SPARSE_ATTENTION_H_
