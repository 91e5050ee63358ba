// Fused elementwise parts of a decoder layer (RMSNorm, rotary embedding, SwiGLU, the experts'
// sum over a token's pairs, the merge of attention blocks), forward and backward, and of the LM
// head's loss (cross-entropy rows), one kernel each, for bfloat16 / float16 tensors. Each does in
// one pass over memory what the composite ATen ops (the CPU path and reference,
// kernels/torch/layer_ops.h) do in several kernels.
//
// Numerics (x: the stored dtype, f(): float32, r(): rounding to the stored dtype):
//   RmsNorm    y = r(w * r(x * rstd)),  rstd = 1 / sqrt(mean(f(x)^2) + eps), as Hugging Face's
//              Qwen2 / Llama RMSNorm (weight times the normalised input cast back); the float32
//              rstd [rows] is kept for backward. Backward: dx = rstd * (g - xhat * mean(g * xhat))
//              with g = dy * w and xhat = x * rstd, in float32 (the composite rounds g to the
//              stored dtype first), rounded once. Not the weight's gradient.
//              one_plus_weight (Gemma's RMSNorm): y = r(f(x) * rstd * (1 + f(w))), all in
//              float32 as Hugging Face's Gemma3RMSNorm, and g = dy * (1 + w) in backward.
//   Rope       y = r(r(x * cos) + r(rotate_half(x) * sin)), rotate_half(x) = [-x2, x1] over the
//              last dim; backward dx = r(r(dy * cos) + rotate_half^T(r(dy * sin))). Both equal
//              the composite ops bit for bit.
//   Glu        y = r(r(act(gate)) * up); backward d_up = r(dy * r(act(gate))) and
//              d_gate = r(act'(gate) * r(dy * up)), act silu (SwiGLU) or gelu with the tanh
//              approximation (Gemma's), act and act' written as ATen's kernels compute them in
//              float32: the composite's values bit for bit (the GPU tests check both).
//              With an addend (forward): gate and up first r(f(gate) + f(add)), the sums kept
//              where asked. Scaled (a mixture-of-experts pair's activation times its routing
//              weight, scale [rows] in the stored dtype): y = r(glu * scale[row]) with glu the value
//              above; backward from dy of y: d_glu = r(dy * scale[row]) into the gradients above
//              (the composite's bit for bit) and d_scale[row] = r(sum over the row of
//              r(dy * glu)) in float32 (the composite sums the same values in another order).
//   PairSum    the experts' outputs back to their tokens: out[t] = r(sum over token t's top_k
//              pairs j and the given sources s of f(s[inverse[t top_k + j]])), in float32
//              (a mixture-of-experts layer's pair rows and, as a second source, their LoRA
//              update), rounded once; the composite (kernels/torch/layer_ops.h
//              PairSumComposite) sums the same float32 values in another order.
//   AttentionMerge  two attention outputs over disjoint keys, a and b [batch, rows, heads, D],
//              merged by their log-sum-exps [batch, heads, rows] given the merged one m =
//              logaddexp(lse_a, lse_b): out = f(a) * exp(lse_a - m) + f(b) * exp(lse_b - m),
//              rounded to out's dtype; a and out float32 or the stored dtype, b the stored dtype.
//              The float32 products and sum are not contracted: the composite's float32 ops
//              (kernels/torch/fused_attention.h MergeFusedBlock) bit for bit.
//   CrossEntropyRows  per row of logits x [rows, vocab]: lse = log(sum(exp(f(x)))) (an online
//              max and sum in float32), loss = lse - f(x[label]) in float32, and, where asked,
//              x overwritten in place with r(exp(f(x) - lse) - onehot(label)), the loss's
//              gradient. Rows whose label is negative (ignored) get loss 0 and gradient 0. The
//              composite computes the same in float32 through logsumexp, gather and exp: equal
//              up to float32 rounding (the order of the sums).
//
// The launchers take plain pointers of contiguous tensors (no torch types);
// kernels/torch/layer_ops.h is the binding that validates tensors, and its composite path (ATen
// ops) is the CPU path and the reference.
#ifndef OOMB_KERNELS_LAYER_OPS_H_
#define OOMB_KERNELS_LAYER_OPS_H_

#include <cstdint>

#include "kernels/cuda_types.h"

namespace oomb::kernels {

enum class HalfDtype { kBFloat16, kFloat16 };

struct RmsNormParams {
  const void* x = nullptr;       // [rows, cols]
  const void* weight = nullptr;  // [cols]
  const void* dy = nullptr;      // [rows, cols] (backward)
  void* out = nullptr;           // y (forward) or dx (backward), [rows, cols]
  float* rstd = nullptr;         // [rows]: written forward, read backward
  int64_t rows = 0, cols = 0;
  float eps = 0;
  bool one_plus_weight = false;  // Gemma's (1 + w), the product in float32
  HalfDtype dtype = HalfDtype::kBFloat16;
};
cudaError_t LaunchRmsNormForward(const RmsNormParams& p, cudaStream_t stream);
cudaError_t LaunchRmsNormBackward(const RmsNormParams& p, cudaStream_t stream);

struct RopeParams {
  const void* x = nullptr;                    // [rows, heads, head_dim] (dy in backward)
  const void* cos = nullptr;                  // [rows, head_dim]
  const void* sin = nullptr;                  // [rows, head_dim]
  void* out = nullptr;                        // [rows, heads, head_dim]
  int64_t rows = 0, heads = 0, head_dim = 0;  // head_dim even
  bool backward = false;
  HalfDtype dtype = HalfDtype::kBFloat16;
};
cudaError_t LaunchRope(const RopeParams& p, cudaStream_t stream);

enum class GluActivation { kSilu, kGeluTanh };
struct GluParams {
  GluActivation act = GluActivation::kSilu;
  const void* gate = nullptr;  // [n]
  const void* up = nullptr;    // [n]
  const void* dy = nullptr;    // [n] (backward)
  void* out = nullptr;         // y (forward) or d_gate (backward)
  void* d_up = nullptr;        // backward
  int64_t n = 0;
  // Rows (in_ld > 0): the n elements are rows of `cols`; gate's and up's rows lie in_ld elements
  // apart, d_gate's and d_up's grad_ld apart (the halves of one [rows, 2 cols] tensor: 2 cols);
  // y and dy stay contiguous. in_ld 0: every tensor contiguous.
  int64_t cols = 0, in_ld = 0, grad_ld = 0;
  // Scaled rows (rows given by cols): scale [n / cols], and d_scale [n / cols] written backward.
  const void* scale = nullptr;
  void* d_scale = nullptr;
  // Forward: a second addend of gate and up at their offsets (a LoRA update), added first (each
  // sum rounded, as the composite's addition), and where given the sums written at their offsets.
  const void* gate_add = nullptr;
  const void* up_add = nullptr;
  void* gate_sum = nullptr;
  void* up_sum = nullptr;
  HalfDtype dtype = HalfDtype::kBFloat16;
};
cudaError_t LaunchGluForward(const GluParams& p, cudaStream_t stream);
cudaError_t LaunchGluBackward(const GluParams& p, cudaStream_t stream);

struct PairSumParams {
  const void* rows = nullptr;        // [pairs, cols]
  const void* extra = nullptr;       // [pairs, cols], a second source, or nullptr
  const int64_t* inverse = nullptr;  // [tokens * top_k]: the row of token t's pair j at t * top_k + j
  void* out = nullptr;               // [tokens, cols]
  int64_t tokens = 0, top_k = 0, cols = 0;
  HalfDtype dtype = HalfDtype::kBFloat16;
};
cudaError_t LaunchPairSum(const PairSumParams& p, cudaStream_t stream);

struct AttentionMergeParams {
  const void* a = nullptr;  // [batch, rows, heads, head_dim], float32 where a_f32
  const void* b = nullptr;  // [batch, rows, heads, head_dim]
  const float* lse_a = nullptr;
  const float* lse_b = nullptr;
  const float* lse = nullptr;  // the merged; each [batch, heads, rows]
  void* out = nullptr;         // [batch, rows, heads, head_dim], float32 where out_f32
  int64_t batch = 0, rows = 0, heads = 0, head_dim = 0;
  bool a_f32 = true, out_f32 = true;
  HalfDtype dtype = HalfDtype::kBFloat16;
};
cudaError_t LaunchAttentionMerge(const AttentionMergeParams& p, cudaStream_t stream);

struct CrossEntropyParams {
  void* logits = nullptr;           // [rows, vocab], the gradient written in place if write_grad
  const int64_t* labels = nullptr;  // [rows], < vocab; negative: ignored
  float* loss = nullptr;            // [rows]
  int64_t rows = 0, vocab = 0;
  bool write_grad = false;
  HalfDtype dtype = HalfDtype::kBFloat16;
};
cudaError_t LaunchCrossEntropyRows(const CrossEntropyParams& p, cudaStream_t stream);

}  // namespace oomb::kernels

#endif  // OOMB_KERNELS_LAYER_OPS_H_
