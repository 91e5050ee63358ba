// Attention of one chunk over its past (KV pages) and itself, as a LibTorch autograd function.
//
// Shapes (one sequence, one layer; C = chunk tokens, S = start of the chunk = past tokens):
//   q:          [C, num_heads, head_dim]      after RoPE
//   k, v:       [C, kv_heads, head_dim]       the chunk's own keys (after RoPE) and values
//   doc_start:  [C] int64                     global index of the first token of each query's
//                                             document (0 without packing), on q's device or
//                                             the CPU (the CPU's lets the path be chosen
//                                             without waiting for the device)
//   out:        [C, num_heads, head_dim]
//
// Query i (global index S + i) attends to key j (global index) iff doc_start[i] <= j <= S + i:
// causal inside the chunk, no attention across packed documents, the past through `PastKv`,
// which is read from the smallest doc_start on only (a sliding window's first keys passed as
// doc_start: what lies before may have been released).
// Softmax scale 1/sqrt(head_dim). GQA: query head h reads KV head h / (num_heads / kv_heads).
// `sinks` (gpt-oss; undefined: none): [num_heads], a logit each query head's softmax takes
// beside its keys' scores, with a zero value (FoldSinks, attention_inputs.h); differentiable.
//
// Autograd (docs/ARCHITECTURE.md §3): forward saves only chunk-local tensors (q, k, v, out, the
// log-sum-exp) and the PastKv handle, never the past itself. Backward re-reads the past through
// PastKv, returns dq, dk, dv of the chunk, and hands dK/dV of the past to
// PastKv::AccumulateGrad, in place, outside autograd.
//
// Precision: float64 and float32 inputs are computed in their own precision (float64 is what
// the exactness tests use); bfloat16 / float16 in float32, outputs cast back. dK/dV of the past
// are accumulated in float32 (float64 for float64 inputs).
//
// The CPU implementation here is the reference (the oracle of the CUDA kernels and the CPU
// path). It works like the kernels: query blocks against key blocks with an online softmax in
// forward, and per-key-block gradients in backward, so its memory does not grow with the
// past's length.
#ifndef OOMB_KERNELS_TORCH_PAGED_ATTENTION_H_
#define OOMB_KERNELS_TORCH_PAGED_ATTENTION_H_

#include <ATen/core/Tensor.h>

#include <array>
#include <memory>
#include <utility>

#include "kernels/torch/fused_attention.h"

namespace oomb::kernels {

// The past of one layer of one sequence, as the attention sees it. Implemented by the KV
// cache (worker/kv); tests implement it over plain tensors. The attention reads the past in
// key blocks, so no call ever needs more than one block of it in memory.
class PastKv {
 public:
  virtual ~PastKv() = default;
  // Number of past tokens (the chunk's start index S).
  virtual int64_t past_tokens() const = 0;
  // Keys and values of past tokens [begin, end), [kv_heads, end - begin, head_dim] each, in
  // the compute dtype's device.
  virtual std::pair<at::Tensor, at::Tensor> Read(int64_t begin, int64_t end) = 0;
  // Adds gradients of past tokens [begin, begin + n), [kv_heads, n, head_dim] each, float32
  // (float64 for float64 inputs), into the gradient store.
  virtual void AccumulateGrad(int64_t begin, const at::Tensor& dk, const at::Tensor& dv) = 0;
  // Hints, so copies of host pages overlap the work queued meanwhile: Read(begin, end) comes
  // next (in backward also AccumulateGrad of that range); the attention is done with this past
  // in forward or in backward (what the next layer reads may start coming in).
  virtual void Prefetch(int64_t begin, int64_t end, bool backward) {}
  virtual void Finished(bool backward) {}
};

// A past held in plain tensors [kv_heads, S, D] (tests; the step-time calibration,
// worker/job/calibration.h): gradients accumulate into `dk` and `dv` (float32; float64 for
// float64 keys); `reads` counts the Read calls.
class TensorPast final : public PastKv {
 public:
  TensorPast(at::Tensor k, at::Tensor v);
  int64_t past_tokens() const override { return k_.size(1); }
  std::pair<at::Tensor, at::Tensor> Read(int64_t begin, int64_t end) override {
    ++reads;
    return {k_.slice(1, begin, end), v_.slice(1, begin, end)};
  }
  void AccumulateGrad(int64_t begin, const at::Tensor& dk_add, const at::Tensor& dv_add) override {
    dk.slice(1, begin, begin + dk_add.size(1)).add_(dk_add);
    dv.slice(1, begin, begin + dv_add.size(1)).add_(dv_add);
  }
  at::Tensor dk, dv;
  int reads = 0;

 private:
  at::Tensor k_, v_;
};

// What a forward computed that its backward reads besides q, k and v: the output, the
// log-sum-exp and the fused kernel's `aux` (FusedBlock), in the layout and dtype the path keeps
// them (fused: out [1, C, Hq, D] in q's dtype, lse float32 [1, Hq, C]; blockwise: out
// [Hkv, G, C, D] and lse [Hkv, G, C] in the compute type).
struct AttentionResult {
  at::Tensor out, lse;
  std::array<at::Tensor, 2> aux;
};

// Swap instead of recompute (worker/train/attention_swap.h). `keep`: the forward fills it with
// what it computed. `replay`: the forward computes nothing and reads nothing of the past; the
// result it returns and saves for backward is `replay`'s, which must be what a forward of these
// same inputs computed (stage 1's, on the device), so backward gives the same gradients.
struct AttentionSwap {
  AttentionResult* keep = nullptr;
  const AttentionResult* replay = nullptr;
};

// Differentiable in q, k and v. `past` may be null when the chunk has no past (S == 0).
// Raises c10::Error (TORCH_CHECK) for shape, dtype or device mismatches, naming the argument.
// `key_block_tokens` sets how many past tokens are read at once (the blockwise CPU path: at
// least 16384 on a GPU).
//
// The fused GPU path (bf16/fp16, one document per chunk, head_dim % 8 == 0 and <= 256) runs
// the fused kernel (`kernel`, fused_attention.h) once per key block of the past (non-causal:
// every query sees every past key) and once over the chunk (causal), and merges the blocks by
// log-sum-exp, forward and backward as fused_attention.h describes. The next block is
// prefetched (PastKv::Prefetch) before the current one computes. Memory: one block, whatever
// the past's length. A sliding-window layer (doc_start from SlidingWindowStart over one
// document) takes it too, with the flash kernel's local windows whatever `kernel` asks: the
// past from the window's first key, each block over only the queries that see some of it; the
// blockwise path stays the reference the GPU tests compare it with.
//
// Every path calls PastKv::Finished when it is done with the past, in forward (not when it
// replays) and backward.
at::Tensor PagedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& doc_start,
                          std::shared_ptr<PastKv> past, int64_t key_block_tokens = 2048,
                          GpuAttentionKernel kernel = GpuAttentionKernel::kCudnn, AttentionSwap swap = {},
                          const at::Tensor& sinks = {});

// The doc_start of a sliding-window layer (Mistral's sliding_window; transformers' mask: the
// query at global index p sees key j iff j > p - window): each query's first visible key,
// max(doc_start[i], S + i - window + 1), on doc_start's device. Passed as `doc_start` to the
// attentions here, it makes them the layer's windowed attention, forward and backward.
at::Tensor SlidingWindowStart(const at::Tensor& doc_start, int64_t S, int64_t window);

// Plain masked softmax attention over full sequences, for tests and for checking the paged
// path: q [T, num_heads, D], k, v [T, kv_heads, D], doc_start [T], `sinks` as PagedAttention's
// (a column of the scores, dropped after the softmax, as transformers' gpt-oss computes them).
// Differentiable through ordinary autograd (it materialises the T x T scores).
at::Tensor DenseAttentionReference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& doc_start, const at::Tensor& sinks = {});

}  // namespace oomb::kernels

#endif  // OOMB_KERNELS_TORCH_PAGED_ATTENTION_H_
