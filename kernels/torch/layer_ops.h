// RMSNorm, rotary embedding and SwiGLU as LibTorch autograd functions: one CUDA kernel each way
// (kernels/layer_ops.h) for bfloat16 / float16 tensors on a GPU, else the composite ATen ops,
// which are the CPU path and the reference the kernels are checked against
// (tests/kernels/kernels_gpu_test.cc). Numerics: kernels/layer_ops.h. Gemma's RMSNorm and
// GELU-tanh gate: ATen ops on every device, as autograd functions that keep less for backward
// than the composite ops (tests/kernels/layer_ops_test.cc).
#ifndef OOMB_KERNELS_TORCH_LAYER_OPS_H_
#define OOMB_KERNELS_TORCH_LAYER_OPS_H_

#include <ATen/core/Tensor.h>

namespace oomb::kernels {

// Hugging Face's RMSNorm: weight * (x / sqrt(mean(x^2) + eps)) in float32 (float64 for float64
// x), cast back to x's dtype before the weight. x [..., cols], weight [cols]. A weight that
// requires a gradient (full fine-tuning) takes the composite path.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

// Gemma's RMSNorm: x / sqrt(mean(x^2) + eps) * (1 + weight), all in float32 (float64 for
// float64 x), cast to x's dtype at the end. The composite ops' values on every device; with a
// frozen weight, an autograd function that keeps only x and one rstd a row for backward (the
// composite ops keep float32 copies of the row), a weight that requires a gradient (full
// fine-tuning) takes the composite path.
at::Tensor GemmaRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

// Gemma's gated MLP activation, gelu_tanh(gate) * up (the composite ops' values), keeping only
// gate and up for backward.
at::Tensor GeluTanhGlu(const at::Tensor& gate, const at::Tensor& up);

// x * cos + rotate_half(x) * sin with rotate_half(x) = [-x2, x1] over the last dim; x [rows,
// heads, head_dim], cos and sin [rows, 1, head_dim] in x's dtype. Differentiable in x.
at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// silu(gate) * up, both of one shape and dtype. Differentiable in both.
at::Tensor SwiGlu(const at::Tensor& gate, const at::Tensor& up);

// The composite forms (the reference): what the functions above compute where no kernel applies.
at::Tensor RmsNormComposite(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor ApplyRopeComposite(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor SwiGluComposite(const at::Tensor& gate, const at::Tensor& up);
at::Tensor GemmaRmsNormComposite(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor GeluTanhGluComposite(const at::Tensor& gate, const at::Tensor& up);

}  // namespace oomb::kernels

#endif  // OOMB_KERNELS_TORCH_LAYER_OPS_H_
