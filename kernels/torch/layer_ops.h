// RMSNorm, rotary embedding and SwiGLU as LibTorch autograd functions: one CUDA kernel each way
// (kernels/layer_ops.h) for bfloat16 / float16 tensors on a GPU, else the composite ATen ops,
// which are the CPU path and the reference the kernels are checked against
// (tests/kernels/kernels_gpu_test.cc). Numerics: kernels/layer_ops.h.
#ifndef OOMB_KERNELS_TORCH_LAYER_OPS_H_
#define OOMB_KERNELS_TORCH_LAYER_OPS_H_

#include <ATen/core/Tensor.h>

namespace oomb::kernels {

// Hugging Face's RMSNorm: weight * (x / sqrt(mean(x^2) + eps)) in float32 (float64 for float64
// x), cast back to x's dtype before the weight. x [..., cols], weight [cols]. A weight that
// requires a gradient (full fine-tuning) takes the composite path.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

// Gemma's RMSNorm: x / sqrt(mean(x^2) + eps) * (1 + weight), all in float32 (float64 for
// float64 x), cast to x's dtype at the end. Composite ops on every device.
at::Tensor GemmaRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

// x * cos + rotate_half(x) * sin with rotate_half(x) = [-x2, x1] over the last dim; x [rows,
// heads, head_dim], cos and sin [rows, 1, head_dim] in x's dtype. Differentiable in x.
at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// silu(gate) * up, both of one shape and dtype. Differentiable in both.
at::Tensor SwiGlu(const at::Tensor& gate, const at::Tensor& up);

// The composite forms (the reference): what the functions above compute where no kernel applies.
at::Tensor RmsNormComposite(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor ApplyRopeComposite(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor SwiGluComposite(const at::Tensor& gate, const at::Tensor& up);

}  // namespace oomb::kernels

#endif  // OOMB_KERNELS_TORCH_LAYER_OPS_H_
