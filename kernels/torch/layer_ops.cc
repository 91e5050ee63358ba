#include "kernels/torch/layer_ops.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <array>
#include <initializer_list>
#include <vector>

#include "kernels/layer_ops.h"
#include "kernels/torch/matmul.h"

#if defined(OOMB_HAVE_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace oomb::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Whether the kernels take these tensors: on one GPU, all bfloat16 or all float16.
bool Fusable(std::initializer_list<const at::Tensor*> ts) {
#if defined(OOMB_HAVE_CUDA)
  const at::Tensor& first = **ts.begin();
  if (!first.is_cuda() || (first.scalar_type() != at::kBFloat16 && first.scalar_type() != at::kHalf)) return false;
  for (const at::Tensor* t : ts) {
    if (t->scalar_type() != first.scalar_type() || t->device() != first.device()) return false;
  }
  return true;
#else
  return false;
#endif
}

HalfDtype DtypeOf(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? HalfDtype::kBFloat16 : HalfDtype::kFloat16;
}

// Runs a launcher on x's device and current stream.
template <typename Params>
void Run(const at::Tensor& x, cudaError_t (*launch)(const Params&, cudaStream_t), const Params& p, const char* what) {
#if defined(OOMB_HAVE_CUDA)
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaError_t err = launch(p, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, what, " kernel: ", cudaGetErrorString(err));
#else
  TORCH_CHECK(false, what, " kernel: built without CUDA");
#endif
}

class RmsNormFn : public torch::autograd::Function<RmsNormFn> {
 public:
  // What forward and backward share: x [rows, cols], weight, rstd [rows], out (y or dx).
  static RmsNormParams Params(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& rstd, at::Tensor& out) {
    RmsNormParams p;
    p.x = x.data_ptr();
    p.weight = weight.data_ptr();
    p.out = out.data_ptr();
    p.rstd = rstd.data_ptr<float>();
    p.rows = rstd.numel();
    p.cols = x.size(-1);
    p.dtype = DtypeOf(x);
    return p;
  }

  // one_plus_weight: Gemma's RMSNorm (kernels/layer_ops.h).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& weight, double eps,
                            bool one_plus_weight) {
    const at::Tensor x = x_in.contiguous();
    const int64_t cols = x.size(-1);
    at::Tensor y = at::empty_like(x);
    at::Tensor rstd = at::empty({x.numel() / cols}, x.options().dtype(at::kFloat));
    RmsNormParams p = Params(x, weight, rstd, y);
    p.eps = static_cast<float>(eps);
    p.one_plus_weight = one_plus_weight;
    Run(x, LaunchRmsNormForward, p, "RMSNorm forward");
    ctx->save_for_backward({x, weight, rstd});
    ctx->saved_data["one_plus_weight"] = one_plus_weight;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &rstd = saved[2];
    const at::Tensor dy = grad_outputs[0].contiguous();
    at::Tensor dx = at::empty_like(x);
    RmsNormParams p = Params(x, weight, rstd, dx);
    p.dy = dy.data_ptr();
    p.one_plus_weight = ctx->saved_data["one_plus_weight"].toBool();
    Run(x, LaunchRmsNormBackward, p, "RMSNorm backward");
    return {dx, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Rope forward (dy = x) or backward (x = dy) through one kernel.
at::Tensor RopeKernel(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool backward) {
  at::Tensor out = at::empty_like(x);
  RopeParams p;
  p.x = x.data_ptr();
  p.cos = cos.data_ptr();
  p.sin = sin.data_ptr();
  p.out = out.data_ptr();
  p.rows = x.size(0);
  p.heads = x.size(1);
  p.head_dim = x.size(2);
  p.backward = backward;
  p.dtype = DtypeOf(x);
  Run(x, LaunchRope, p, "rotary embedding");
  return out;
}

class RopeFn : public torch::autograd::Function<RopeFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return RopeKernel(x.contiguous(), cos, sin, /*backward=*/false);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    return {RopeKernel(grad_outputs[0].contiguous(), saved[0], saved[1], /*backward=*/true), at::Tensor(),
            at::Tensor()};
  }
};

// A gated activation through the kernels: gate and up of one shape, Fusable; y, or d_gate and d_up.
GluParams GluKernelParams(GluKind kind, const at::Tensor& gate, const at::Tensor& up, at::Tensor& out) {
  GluParams p;
  p.act = kind == GluKind::kGeluTanh ? GluActivation::kGeluTanh : GluActivation::kSilu;
  p.gate = gate.data_ptr();
  p.up = up.data_ptr();
  p.out = out.data_ptr();
  p.n = gate.numel();
  p.dtype = DtypeOf(gate);
  return p;
}

at::Tensor GluKernelForward(GluKind kind, const at::Tensor& gate_in, const at::Tensor& up_in) {
  const at::Tensor gate = gate_in.contiguous(), up = up_in.contiguous();
  at::Tensor y = at::empty_like(gate);
  Run(gate, LaunchGluForward, GluKernelParams(kind, gate, up, y), "gated activation forward");
  return y;
}

std::array<at::Tensor, 2> GluKernelBackward(GluKind kind, const at::Tensor& gate_in, const at::Tensor& up_in,
                                            const at::Tensor& dy_in) {
  const at::Tensor gate = gate_in.contiguous(), up = up_in.contiguous(), dy = dy_in.contiguous();
  at::Tensor d_gate = at::empty_like(gate), d_up = at::empty_like(up);
  GluParams p = GluKernelParams(kind, gate, up, d_gate);
  p.dy = dy.data_ptr();
  p.d_up = d_up.data_ptr();
  Run(gate, LaunchGluBackward, p, "gated activation backward");
  return {d_gate, d_up};
}

// The gated activation's value and its gradients with respect to gate and up, without autograd:
// the kernels where they apply (bfloat16 / float16 on a GPU), else the composite ops' own
// operations (the same values and gradients as autograd through them).
at::Tensor GluValue(GluKind kind, const at::Tensor& gate, const at::Tensor& up) {
  if (Fusable({&gate, &up})) return GluKernelForward(kind, gate, up);
  return kind == GluKind::kGeluTanh ? GeluTanhGluComposite(gate, up) : SwiGluComposite(gate, up);
}

std::array<at::Tensor, 2> GluGrads(GluKind kind, const at::Tensor& gate, const at::Tensor& up, const at::Tensor& dy) {
  if (Fusable({&gate, &up, &dy})) return GluKernelBackward(kind, gate, up, dy);
  if (kind == GluKind::kGeluTanh) return {at::gelu_backward(dy * up, gate, "tanh"), dy * at::gelu(gate, "tanh")};
  return {at::silu_backward(dy * up, gate), dy * at::silu(gate)};
}

class SwiGluFn : public torch::autograd::Function<SwiGluFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_in, const at::Tensor& up_in) {
    const at::Tensor gate = gate_in.contiguous(), up = up_in.contiguous();  // once (views of a gate_up product)
    ctx->save_for_backward({gate, up});
    return GluKernelForward(GluKind::kSilu, gate, up);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto [d_gate, d_up] = GluKernelBackward(GluKind::kSilu, saved[0], saved[1], grad_outputs[0]);
    return {d_gate, d_up};
  }
};

// SwiGLU over the halves of gate_up [rows, 2 n] on the gated-activation kernel, which reads the
// halves in place and writes the gradient into one [rows, 2 n] tensor.
class SwiGluHalvesFn : public torch::autograd::Function<SwiGluHalvesFn> {
 public:
  // gate_up's halves, and `out` (y [rows, n] forward; [rows, 2 n], d_gate then d_up, backward).
  static GluParams Params(const at::Tensor& gate_up, at::Tensor& out) {
    const int64_t n = gate_up.size(1) / 2, half_bytes = n * static_cast<int64_t>(gate_up.element_size());
    GluParams p;
    p.gate = gate_up.data_ptr();
    p.up = static_cast<char*>(gate_up.data_ptr()) + half_bytes;
    p.out = out.data_ptr();
    if (out.size(1) == 2 * n) p.d_up = static_cast<char*>(out.data_ptr()) + half_bytes;
    p.n = gate_up.size(0) * n;
    p.cols = n;
    p.in_ld = gate_up.stride(0);
    p.grad_ld = 2 * n;
    p.dtype = DtypeOf(gate_up);
    return p;
  }
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_up) {
    ctx->save_for_backward({gate_up});
    at::Tensor y = at::empty({gate_up.size(0), gate_up.size(1) / 2}, gate_up.options());
    Run(gate_up, LaunchGluForward, Params(gate_up, y), "gated activation forward");
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::Tensor gate_up = ctx->get_saved_variables()[0], dy = grad_outputs[0].contiguous();
    at::Tensor d = at::empty_like(gate_up, at::MemoryFormat::Contiguous);
    GluParams p = Params(gate_up, d);
    p.dy = dy.data_ptr();
    Run(gate_up, LaunchGluBackward, p, "gated activation backward");
    return {d};
  }
};

// Gemma's RMSNorm with a frozen weight, keeping for backward only x and rstd (one a row, in the
// compute dtype) instead of the composite ops' float32 intermediates. The forward runs the
// composite ops (the same values, bit for bit); the backward is their gradient written out:
// with n = x * rstd and g = dy * (1 + weight), dx = rstd * (g - n * mean(g * n)).
class GemmaRmsNormFn : public torch::autograd::Function<GemmaRmsNormFn> {
 public:
  static at::ScalarType Compute(const at::Tensor& x) {
    return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  }

  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    const at::Tensor h = x.to(Compute(x));
    const at::Tensor rstd = at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
    ctx->save_for_backward({x, weight, rstd});
    return (h * rstd * (weight.to(Compute(x)) + 1.0)).to(x.scalar_type());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &rstd = saved[2];
    const at::Tensor n = x.to(Compute(x)) * rstd;
    const at::Tensor g = grad_outputs[0].to(Compute(x)) * (weight.to(Compute(x)) + 1.0);
    const at::Tensor dx = rstd * (g - n * (g * n).mean(-1, /*keepdim=*/true));
    return {dx.to(x.scalar_type()), at::Tensor(), at::Tensor()};
  }
};

// gelu_tanh(gate) * up keeping only gate and up for backward (the composite ops also keep
// gelu_tanh(gate)); gelu_tanh(gate) is recomputed there.
class GeluTanhGluFn : public torch::autograd::Function<GeluTanhGluFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    ctx->save_for_backward({gate, up});
    return GluValue(GluKind::kGeluTanh, gate, up);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto [d_gate, d_up] = GluGrads(GluKind::kGeluTanh, saved[0], saved[1], grad_outputs[0]);
    return {d_gate, d_up};
  }
};

// ClampedSwiGlu keeping only its input: backward recomputes the composite ops' values from it
// and takes their gradient.
class ClampedSwiGluFn : public torch::autograd::Function<ClampedSwiGluFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_up, double alpha, double limit) {
    ctx->save_for_backward({gate_up});
    ctx->saved_data["alpha"] = alpha;
    ctx->saved_data["limit"] = limit;
    return ClampedSwiGluComposite(gate_up, alpha, limit);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::AutoGradMode grad_mode(true);
    const at::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    const at::Tensor y =
        ClampedSwiGluComposite(x, ctx->saved_data["alpha"].toDouble(), ctx->saved_data["limit"].toDouble());
    return {torch::autograd::grad({y}, {x}, {grad_outputs[0]})[0], at::Tensor(), at::Tensor()};
  }
};

// GluDownLora (the header's contract). The forward runs the separate ops' operations (the same
// values, bit for bit); the backward is their gradient written out, with act = glu(gate, up)
// recomputed: for y = act W^T + d B^T with d = act A^T,
//   dd = dy B, dB = (d^T dy)^T, dA = (act^T dd)^T, dact = dy W + dd A.
class GluDownLoraFn : public torch::autograd::Function<GluDownLoraFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up,
                            const at::Tensor& weight, const at::Tensor& a, const at::Tensor& b, int64_t kind) {
    const at::Tensor act = GluValue(static_cast<GluKind>(kind), gate, up);
    const at::Tensor d = Linear(act, a);
    at::Tensor y = Linear(act, weight);
    AddMatmul_(y, d, b.t());
    ctx->save_for_backward({gate, up, weight, a, b, d});
    ctx->saved_data["kind"] = kind;
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &gate = saved[0], &up = saved[1], &weight = saved[2], &a = saved[3], &b = saved[4], &d = saved[5];
    const auto kind = static_cast<GluKind>(ctx->saved_data["kind"].toInt());
    const at::Tensor& dy = grad_outputs[0];
    const at::Tensor dd = Matmul(dy, b);
    const at::Tensor db = Matmul(d.t(), dy).t();
    at::Tensor da;
    {  // act only while dA needs it
      const at::Tensor act = GluValue(kind, gate, up);
      da = Matmul(act.t(), dd).t();
    }
    const at::Tensor dact = Matmul(dy, weight) + Matmul(dd, a);
    const auto [d_gate, d_up] = GluGrads(kind, gate, up, dact);
    return {d_gate, d_up, at::Tensor(), da, db, at::Tensor()};
  }
};

}  // namespace

at::Tensor RmsNormComposite(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor h = x.to(x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
  const at::Tensor var = h.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (h * at::rsqrt(var + eps)).to(x.scalar_type());
}

at::Tensor GemmaRmsNormComposite(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::ScalarType compute = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor h = x.to(compute);
  const at::Tensor var = h.pow(2).mean(-1, /*keepdim=*/true);
  return (h * at::rsqrt(var + eps) * (weight.to(compute) + 1.0)).to(x.scalar_type());
}

at::Tensor GemmaRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(weight.dim() == 1 && x.size(-1) == weight.size(0), "GemmaRmsNorm: weight [", x.size(-1),
              "] expected, got ", weight.sizes());
  if (weight.requires_grad()) return GemmaRmsNormComposite(x, weight, eps);
  if (Fusable({&x, &weight}) && weight.is_contiguous())
    return RmsNormFn::apply(x, weight, eps, /*one_plus_weight=*/true);
  return GemmaRmsNormFn::apply(x, weight, eps);
}

at::Tensor GeluTanhGluComposite(const at::Tensor& gate, const at::Tensor& up) { return at::gelu(gate, "tanh") * up; }

at::Tensor GeluTanhGlu(const at::Tensor& gate, const at::Tensor& up) { return GeluTanhGluFn::apply(gate, up); }

at::Tensor ClampedSwiGluComposite(const at::Tensor& gate_up, double alpha, double limit) {
  const at::Tensor gate = gate_up.slice(-1, 0, c10::nullopt, 2).clamp_max(limit);
  const at::Tensor up = gate_up.slice(-1, 1, c10::nullopt, 2).clamp(-limit, limit);
  return (up + 1) * (gate * at::sigmoid(gate * alpha));
}

at::Tensor ClampedSwiGlu(const at::Tensor& gate_up, double alpha, double limit) {
  TORCH_CHECK(gate_up.size(-1) % 2 == 0, "ClampedSwiGlu: gate_up's last dimension must be even, got ", gate_up.sizes());
  return ClampedSwiGluFn::apply(gate_up, alpha, limit);
}

at::Tensor GluDownLora(GluKind kind, const at::Tensor& gate, const at::Tensor& up, const at::Tensor& weight,
                       const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(gate.dim() == 2 && gate.sizes() == up.sizes(), "GluDownLora: gate ", gate.sizes(), " and up ", up.sizes(),
              " must be one [rows, intermediate] shape");
  TORCH_CHECK(!weight.requires_grad(), "GluDownLora: the down projection's weight must be frozen");
  TORCH_CHECK(weight.size(1) == gate.size(1) && a.size(1) == gate.size(1) && b.size(0) == weight.size(0) &&
                  b.size(1) == a.size(0),
              "GluDownLora: weight ", weight.sizes(), ", a ", a.sizes(), " and b ", b.sizes(),
              " do not fit an intermediate of ", gate.size(1));
  return GluDownLoraFn::apply(gate, up, weight, a, b, static_cast<int64_t>(kind));
}

at::Tensor ApplyRopeComposite(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

at::Tensor SwiGluComposite(const at::Tensor& gate, const at::Tensor& up) { return at::silu(gate) * up; }

at::Tensor CrossEntropyRowsComposite(at::Tensor& logits, const at::Tensor& labels, bool write_grad) {
  const at::ScalarType ct = logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor x = logits.to(ct), valid = labels.ge(0).to(ct), index = labels.clamp_min(0).unsqueeze(1);
  const at::Tensor lse = at::logsumexp(x, -1);
  const at::Tensor loss = (lse - x.gather(1, index).squeeze(1)) * valid;
  if (write_grad) {
    at::Tensor g = (x - lse.unsqueeze(1)).exp_();
    g.scatter_add_(1, index, at::full({x.size(0), 1}, -1.0, g.options()));
    logits.copy_(g.mul_(valid.unsqueeze(1)));
  }
  return loss;
}

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(weight.dim() == 1 && x.size(-1) == weight.size(0), "RmsNorm: weight [", x.size(-1), "] expected, got ",
              weight.sizes());
  if (!Fusable({&x, &weight}) || weight.requires_grad() || !weight.is_contiguous()) {
    return RmsNormComposite(x, weight, eps);
  }
  return RmsNormFn::apply(x, weight, eps, /*one_plus_weight=*/false);
}

at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.dim() == 3 && x.size(2) % 2 == 0, "ApplyRope: x [rows, heads, head_dim] (head_dim even) expected, got ",
              x.sizes());
  const std::vector<int64_t> table = {x.size(0), 1, x.size(2)};
  TORCH_CHECK(cos.sizes() == at::IntArrayRef(table) && sin.sizes() == cos.sizes(), "ApplyRope: cos and sin [",
              x.size(0), ", 1, ", x.size(2), "] expected, got ", cos.sizes(), " and ", sin.sizes());
  if (!Fusable({&x, &cos, &sin}) || cos.requires_grad() || sin.requires_grad() || !cos.is_contiguous() ||
      !sin.is_contiguous()) {
    return ApplyRopeComposite(x, cos, sin);
  }
  return RopeFn::apply(x, cos, sin);
}

at::Tensor SwiGluHalves(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0, "SwiGluHalves: gate_up must be [rows, 2 n], got ",
              gate_up.sizes());
  if (Fusable({&gate_up}) && gate_up.stride(1) == 1) return SwiGluHalvesFn::apply(gate_up);
  const auto parts = gate_up.chunk(2, -1);
  return SwiGlu(parts[0], parts[1]);
}

bool ScaledSwiGluHalvesFused(const at::Tensor& gate_up, const at::Tensor& scale, const at::Tensor& add) {
  if (!Fusable({&gate_up, &scale}) || gate_up.dim() != 2 || gate_up.size(1) % 2 != 0 || gate_up.stride(1) != 1 ||
      gate_up.size(1) == 0 || scale.dim() != 1 || scale.size(0) != gate_up.size(0) || !scale.is_contiguous()) {
    return false;
  }
  return !add.defined() || (Fusable({&gate_up, &add}) && add.sizes() == gate_up.sizes() && add.is_contiguous() &&
                            gate_up.is_contiguous());
}

at::Tensor ScaledSwiGluHalves(const at::Tensor& gate_up, const at::Tensor& scale, const at::Tensor& add,
                              at::Tensor* sum) {
  TORCH_CHECK(ScaledSwiGluHalvesFused(gate_up, scale, add), "ScaledSwiGluHalves: gate_up ", gate_up.sizes(), ", scale ",
              scale.sizes(), " and add ", add.sizes(),
              " are not the kernels' (one GPU, one half dtype, rows contiguous)");
  at::Tensor y = at::empty({gate_up.size(0), gate_up.size(1) / 2}, gate_up.options());
  GluParams p = SwiGluHalvesFn::Params(gate_up, y);
  p.scale = scale.data_ptr();
  if (add.defined()) {
    const int64_t half_bytes = p.cols * static_cast<int64_t>(gate_up.element_size());
    p.gate_add = add.data_ptr();
    p.up_add = static_cast<const char*>(add.data_ptr()) + half_bytes;
    if (sum != nullptr) {
      *sum = at::empty_like(gate_up);
      p.gate_sum = sum->data_ptr();
      p.up_sum = static_cast<char*>(sum->data_ptr()) + half_bytes;
    }
  }
  Run(gate_up, LaunchGluForward, p, "scaled gated activation forward");
  return y;
}

std::array<at::Tensor, 2> ScaledSwiGluHalvesGrads(const at::Tensor& gate_up, const at::Tensor& scale,
                                                  const at::Tensor& dy_in) {
  TORCH_CHECK(ScaledSwiGluHalvesFused(gate_up, scale) && dy_in.dim() == 2 && dy_in.size(0) == gate_up.size(0) &&
                  2 * dy_in.size(1) == gate_up.size(1) && dy_in.scalar_type() == gate_up.scalar_type(),
              "ScaledSwiGluHalvesGrads: gate_up ", gate_up.sizes(), ", scale ", scale.sizes(), " and dy ",
              dy_in.sizes(), " are not the kernels'");
  const at::Tensor dy = dy_in.contiguous();
  at::Tensor d = at::empty_like(gate_up, at::MemoryFormat::Contiguous), d_scale = at::empty_like(scale);
  GluParams p = SwiGluHalvesFn::Params(gate_up, d);
  p.dy = dy.data_ptr();
  p.scale = scale.data_ptr();
  p.d_scale = d_scale.data_ptr();
  Run(gate_up, LaunchGluBackward, p, "scaled gated activation backward");
  return {d, d_scale};
}

at::Tensor SwiGlu(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(gate.sizes() == up.sizes(), "SwiGlu: gate ", gate.sizes(), " and up ", up.sizes(), " differ");
  if (!Fusable({&gate, &up})) return SwiGluComposite(gate, up);
  return SwiGluFn::apply(gate, up);
}

at::Tensor PairSumComposite(const at::Tensor& rows, const at::Tensor& extra, const at::Tensor& inverse, int64_t top_k) {
  const auto sum = [&](const at::Tensor& r) { return r.index_select(0, inverse).view({-1, top_k, r.size(1)}).sum(1); };
  if (!extra.defined()) return sum(rows);  // the reduction accumulates in float32 for half types
  const at::ScalarType ct = at::promote_types(rows.scalar_type(), at::kFloat);
  return sum(rows.to(ct) + extra.to(ct)).to(rows.scalar_type());
}

at::Tensor PairSum(const at::Tensor& rows, const at::Tensor& extra, const at::Tensor& inverse, int64_t top_k) {
  TORCH_CHECK(rows.dim() == 2 && top_k > 0 && rows.size(0) % top_k == 0 && inverse.dim() == 1 &&
                  inverse.size(0) == rows.size(0) && inverse.scalar_type() == at::kLong &&
                  inverse.device() == rows.device(),
              "PairSum: rows [pairs, cols] in whole tokens of top_k ", top_k,
              " and int64 inverse [pairs] on their device expected, got ", rows.sizes(), " and ", inverse.scalar_type(),
              " ", inverse.sizes());
  TORCH_CHECK(!extra.defined() || (extra.sizes() == rows.sizes() && extra.scalar_type() == rows.scalar_type()),
              "PairSum: extra must be rows' shape and dtype, got ", extra.sizes(), " for ", rows.sizes());
  if (!Fusable({&rows}) || !rows.is_contiguous() ||
      (extra.defined() && (!Fusable({&rows, &extra}) || !extra.is_contiguous()))) {
    return PairSumComposite(rows, extra, inverse, top_k);
  }
  const at::Tensor inv = inverse.contiguous();
  at::Tensor out = at::empty({rows.size(0) / top_k, rows.size(1)}, rows.options());
  PairSumParams p;
  p.rows = rows.data_ptr();
  p.extra = extra.defined() ? extra.data_ptr() : nullptr;
  p.inverse = inv.data_ptr<int64_t>();
  p.out = out.data_ptr();
  p.tokens = out.size(0);
  p.top_k = top_k;
  p.cols = rows.size(1);
  p.dtype = DtypeOf(rows);
  Run(rows, LaunchPairSum, p, "pair sum");
  return out;
}

at::Tensor CrossEntropyRows(at::Tensor& logits, const at::Tensor& labels, bool write_grad) {
  TORCH_CHECK(logits.dim() == 2 && labels.dim() == 1 && labels.size(0) == logits.size(0) &&
                  labels.scalar_type() == at::kLong && labels.device() == logits.device(),
              "CrossEntropyRows: logits [rows, vocab] and int64 labels [rows] on one device expected, got ",
              logits.sizes(), " and ", labels.scalar_type(), " ", labels.sizes(), " on ", labels.device());
  if (!Fusable({&logits}) || !logits.is_contiguous()) return CrossEntropyRowsComposite(logits, labels, write_grad);
  const at::Tensor lab = labels.contiguous();
  at::Tensor loss = at::empty({logits.size(0)}, logits.options().dtype(at::kFloat));
  CrossEntropyParams p;
  p.logits = logits.data_ptr();
  p.labels = lab.data_ptr<int64_t>();
  p.loss = loss.data_ptr<float>();
  p.rows = logits.size(0);
  p.vocab = logits.size(1);
  p.write_grad = write_grad;
  p.dtype = DtypeOf(logits);
  Run(logits, LaunchCrossEntropyRows, p, "cross-entropy");
  return loss;
}

}  // namespace oomb::kernels
