// The fused GPU attention kernels that dense (paged_attention.h) and sparse
// (sparse_attention.h) attention run, and the merge of key blocks by log-sum-exp.
//
// Both attention functions split a chunk's keys into blocks, run one fused kernel call per
// block (a batch of query blocks against their own keys at once), and merge the blocks'
// outputs by their log-sum-exp:
//   out = sum_b exp(lse_b - lse) out_b,   lse = logsumexp_b lse_b.
// Backward runs each block's kernel backward against the merged output and log-sum-exp, which
// gives each block's exact share of dq and its dK, dV.
#ifndef OOMB_KERNELS_TORCH_FUSED_ATTENTION_H_
#define OOMB_KERNELS_TORCH_FUSED_ATTENTION_H_

#include <ATen/core/Tensor.h>

#include <array>

namespace oomb::kernels {

// The kernel of the fused GPU paths. cuDNN's (9.x) fused attention runs Hopper-specific
// kernels, faster than LibTorch's flash attention in both directions on long contexts, so it
// is the default. kCudnn falls back to flash where cuDNN's path does not apply (before Hopper,
// head_dim over 256, cuDNN disabled).
enum class GpuAttentionKernel { kCudnn, kFlash };

// The kernel a fused call on q's device runs when `asked` is asked for (see above).
GpuAttentionKernel FusedKernel(const at::Tensor& q, GpuAttentionKernel asked);

// A local window in the flash kernel's terms, aligned at the bottom right: query i of Cq sees key
// j of n iff i + n - Cq - left <= j <= i + n - Cq + right, each bound dropped when it is -1 (a
// causal call sets right to 0 itself). Only the flash kernel takes one.
struct LocalWindow {
  int64_t left = -1, right = -1;
  bool any() const { return left >= 0 || right >= 0; }
};

// One fused kernel call (bf16 / fp16 on a GPU, head_dim a multiple of 8 up to 256):
//   q:              [B, Cq, num_heads, D]
//   keys, values:   [B, kv_heads, n, D]    any strides (cuDNN reads them in place; flash
//                                          copies them to its layout); GQA as in the header of
//                                          paged_attention.h
//   causal:         query i sees key j iff j <= i (then n == Cq); otherwise every key.
//   window:         and only the keys of the window (kFlash only; a query seeing no key of the
//                   block is the caller's to leave out).
// out [B, Cq, num_heads, D] in q's dtype; lse float32 [B, num_heads, Cq]; `aux` holds what the
// kernel's backward takes besides (flash: its RNG state; cuDNN: its philox seed and offset),
// unused without dropout but required.
struct FusedBlock {
  at::Tensor out, lse;
  std::array<at::Tensor, 2> aux;
};
FusedBlock FusedBlockForward(GpuAttentionKernel kernel, const at::Tensor& q, const at::Tensor& keys,
                             const at::Tensor& values, bool causal, double scale, LocalWindow window = {});

// The block's share of dq [B, Cq, num_heads, D] (float32 accumulation, q's dtype) and its dK,
// dV [B, kv_heads, n, D] in the keys' dtype, given dout, the merged output (q's dtype, q's
// layout) and the merged log-sum-exp [B, num_heads, Cq] of all blocks; `window` as in forward.
std::array<at::Tensor, 3> FusedBlockBackward(GpuAttentionKernel kernel, const at::Tensor& dout, const at::Tensor& q,
                                             const at::Tensor& keys, const at::Tensor& values, const at::Tensor& out,
                                             const at::Tensor& lse, bool causal, const std::array<at::Tensor, 2>& aux,
                                             double scale, LocalWindow window = {});

// Merges block `b` (out [B, Cq, num_heads, D] in q's dtype, lse [B, num_heads, Cq]) into the
// running output and log-sum-exp of the same shapes (undefined before the first block). The
// merged output is float32, or `result` where the caller merges its last block and keeps no
// float32 sum (the first block alone: the block's output in `result`). On a GPU one kernel
// (kernels/layer_ops.h AttentionMerge), which reads the blocks' outputs in their dtypes; the
// same values as the composite ops in float32 (the CPU path).
void MergeFusedBlock(at::Tensor* out, at::Tensor* lse, const at::Tensor& block_out, const at::Tensor& block_lse,
                     at::ScalarType result = at::kFloat);
// The same for a block of the first `rows` queries only (a window's past block: the later
// queries see none of its keys), into running tensors of all queries, in place.
void MergeFusedRows(at::Tensor& out, at::Tensor& lse, int64_t rows, const at::Tensor& block_out,
                    const at::Tensor& block_lse);

}  // namespace oomb::kernels

#endif  // OOMB_KERNELS_TORCH_FUSED_ATTENTION_H_
