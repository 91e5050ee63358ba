// RMSNorm, rotary embedding and SwiGLU as LibTorch autograd functions, and the rows of the LM
// head's cross-entropy and the experts' sum over a token's pairs: one CUDA kernel each way
// (kernels/layer_ops.h) for bfloat16 / float16 tensors on a GPU, else the composite ATen ops,
// which are the CPU path and the reference the kernels are checked against
// (tests/kernels/kernels_gpu_test.cc). Numerics: kernels/layer_ops.h. Gemma's RMSNorm and
// GELU-tanh gate, and the gated activation with the down projection and its LoRA adapter: ATen
// ops (and the SwiGLU kernels) on every device, as autograd functions that keep less for
// backward than the separate ops (tests/kernels/layer_ops_test.cc).
#ifndef OOMB_KERNELS_TORCH_LAYER_OPS_H_
#define OOMB_KERNELS_TORCH_LAYER_OPS_H_

#include <ATen/core/Tensor.h>

#include <array>

namespace oomb::kernels {

// Hugging Face's RMSNorm: weight * (x / sqrt(mean(x^2) + eps)) in float32 (float64 for float64
// x), cast back to x's dtype before the weight. x [..., cols], weight [cols]. A weight that
// requires a gradient (full fine-tuning) takes the composite path.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

// Gemma's RMSNorm: x / sqrt(mean(x^2) + eps) * (1 + weight), all in float32 (float64 for
// float64 x), cast to x's dtype at the end. With a frozen weight, an autograd function that
// keeps only x and one rstd a row for backward (the composite ops keep float32 copies of the
// row): on a GPU in bfloat16 / float16 the RMSNorm kernel (kernels/layer_ops.h, the composite's
// values up to the order of the row's sums), elsewhere the composite ops' values bit for bit.
// A weight that requires a gradient (full fine-tuning) takes the composite path.
at::Tensor GemmaRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

// Gemma's gated MLP activation, gelu_tanh(gate) * up (the composite ops' values; bfloat16 /
// float16 on a GPU through the gated-activation kernel, kernels/layer_ops.h), keeping only gate
// and up for backward.
at::Tensor GeluTanhGlu(const at::Tensor& gate, const at::Tensor& up);

// gpt-oss's experts' activation over their gate_up product [rows, 2 n], gate and up
// interleaved (gate the even columns, up the odd): (clamp(up, -limit, limit) + 1) * g *
// sigmoid(alpha g) with g = min(gate, limit), [rows, n] (the composite ops' values, as
// transformers computes them), keeping only its input for backward.
at::Tensor ClampedSwiGlu(const at::Tensor& gate_up, double alpha, double limit);

// The gated MLP's activation: silu(gate) * up (SwiGlu) or gelu_tanh(gate) * up (GeluTanhGlu).
enum class GluKind { kSilu, kGeluTanh };

// The MLP's second half as one autograd function: act = glu(gate, up) (SwiGlu's or
// GeluTanhGlu's values), then the down projection with its LoRA adapter, act W^T + (act A^T) B^T
// (Linear::Partial's operations, worker/model/linear.h: the same values bit for bit). gate, up [rows, intermediate];
// weight W [out, intermediate], frozen, no bias; a [rank, intermediate] and b [out, rank] (the
// scaling folded in) in act's dtype. Keeps gate, up and the rank-wide act A^T for backward and
// recomputes act there, where the separate ops also keep act (LoRA A's input): one
// intermediate-wide tensor a token and layer less. Differentiable in gate, up, a and b.
at::Tensor GluDownLora(GluKind kind, const at::Tensor& gate, const at::Tensor& up, const at::Tensor& weight,
                       const at::Tensor& a, const at::Tensor& b);

// x * cos + rotate_half(x) * sin with rotate_half(x) = [-x2, x1] over the last dim; x [rows,
// heads, head_dim], cos and sin [rows, 1, head_dim] in x's dtype. Differentiable in x.
at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// silu(gate) * up, both of one shape and dtype. Differentiable in both.
at::Tensor SwiGlu(const at::Tensor& gate, const at::Tensor& up);

// SwiGlu over the halves of gate_up [rows, 2 n] (gate's columns first) -> [rows, n], SwiGlu's
// values bit for bit. In bfloat16 / float16 on a GPU the gated-activation kernel reads the halves
// in place and writes the gradient as one [rows, 2 n] tensor (SwiGlu over the halves' views
// copies them contiguous first, and autograd joins their two gradients). Keeps gate_up for
// backward. Differentiable in gate_up.
at::Tensor SwiGluHalves(const at::Tensor& gate_up);

// SwiGluHalves with each row scaled, r(SwiGluHalves(gate_up) * scale[:, None]) (scale [rows] in
// gate_up's dtype: a mixture of experts' routing weights), and its gradients from dy [rows, n]:
// d_gate_up [rows, 2 n] (the composite ops' bit for bit) and d_scale [rows] (their row sums, in
// another order), each one pass of the gated-activation kernels. With `add` (forward: a LoRA
// update of gate_up), the activation of gate_up + add (rounded as the composite's addition),
// the sum written to *sum where sum is given (what the gradients read). Not autograd functions
// (expert_ops.h ScaledExpertActivation is one); only where ScaledSwiGluHalvesFused: bfloat16 /
// float16 on one GPU, gate_up's rows contiguous (with `add`: both contiguous).
bool ScaledSwiGluHalvesFused(const at::Tensor& gate_up, const at::Tensor& scale, const at::Tensor& add = at::Tensor());
at::Tensor ScaledSwiGluHalves(const at::Tensor& gate_up, const at::Tensor& scale, const at::Tensor& add = at::Tensor(),
                              at::Tensor* sum = nullptr);
std::array<at::Tensor, 2> ScaledSwiGluHalvesGrads(const at::Tensor& gate_up, const at::Tensor& scale,
                                                  const at::Tensor& dy);

// The cross-entropy of each row of logits [rows, vocab] against its label (labels [rows] int64 on
// logits' device, each in [0, vocab), or negative: ignored, loss 0), float32 [rows] (float64
// for float64 logits). Where write_grad, logits is overwritten in place with the loss's
// gradient, softmax(row) - onehot(label) (0 on ignored rows), in logits' dtype. Not an
// autograd function: the LM head's loss (chunked_cross_entropy.h) calls it on a block of
// logits it never keeps.
at::Tensor CrossEntropyRows(at::Tensor& logits, const at::Tensor& labels, bool write_grad);

// The experts' outputs summed back to their tokens: rows [pairs, cols] (and, where defined, extra
// of the same shape and dtype, added to every row: a LoRA update kept apart from the product it
// updates), token t's pairs at rows inverse[t top_k + j] (inverse int64 [pairs] on rows' device)
// -> [pairs / top_k, cols] in rows' dtype, summed in float32 (float64 for float64 rows) and
// rounded once. Not an autograd function: kernels/torch/expert_ops.h FromPairs is.
at::Tensor PairSum(const at::Tensor& rows, const at::Tensor& extra, const at::Tensor& inverse, int64_t top_k);

// The composite forms (the reference): what the functions above compute where no kernel applies.
at::Tensor RmsNormComposite(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor ApplyRopeComposite(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor SwiGluComposite(const at::Tensor& gate, const at::Tensor& up);
at::Tensor GemmaRmsNormComposite(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor GeluTanhGluComposite(const at::Tensor& gate, const at::Tensor& up);
at::Tensor ClampedSwiGluComposite(const at::Tensor& gate_up, double alpha, double limit);
at::Tensor CrossEntropyRowsComposite(at::Tensor& logits, const at::Tensor& labels, bool write_grad);
at::Tensor PairSumComposite(const at::Tensor& rows, const at::Tensor& extra, const at::Tensor& inverse, int64_t top_k);

}  // namespace oomb::kernels

#endif  // OOMB_KERNELS_TORCH_LAYER_OPS_H_
