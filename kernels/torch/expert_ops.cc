#include "kernels/torch/expert_ops.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kernels/torch/layer_ops.h"

namespace oomb::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor PairTokens(const at::Tensor& order, int64_t top_k) { return at::div(order, top_k, "floor"); }

// ToPairs and FromPairs are each other's transpose: each one's backward is the other's forward.
class ToPairsFn : public torch::autograd::Function<ToPairsFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& order,
                            const at::Tensor& inverse, int64_t top_k) {
    ctx->save_for_backward({order, inverse});
    ctx->saved_data["top_k"] = top_k;
    return x.index_select(0, PairTokens(order, top_k));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    return {FromPairs(grad_outputs[0], saved[0], saved[1], ctx->saved_data["top_k"].toInt()), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

class FromPairsFn : public torch::autograd::Function<FromPairsFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& rows, const at::Tensor& extra,
                            const at::Tensor& order, const at::Tensor& inverse, int64_t top_k) {
    ctx->save_for_backward({order, inverse});
    ctx->saved_data["top_k"] = top_k;
    ctx->saved_data["extra"] = extra.numel() > 0;
    return PairSum(rows, extra.numel() > 0 ? extra : at::Tensor(), inverse, top_k);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor pairs = ToPairs(grad_outputs[0], saved[0], saved[1], ctx->saved_data["top_k"].toInt());
    return {pairs, ctx->saved_data["extra"].toBool() ? pairs : at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor ScaledActivationValue(const at::Tensor& gate_up, const at::Tensor& scale, double alpha, double limit) {
  at::Tensor act;
  if (limit > 0) {
    act = ClampedSwiGlu(gate_up, alpha, limit);
  } else {
    act = SwiGluHalves(gate_up);
  }
  return (act * scale.unsqueeze(-1)).to(gate_up.scalar_type());
}

// ScaledExpertActivation keeping the activation's input (gate_up, plus `add` where given) and
// scale: SwiGLU's on the scaled gated-activation kernels where they apply, else backward
// recomputes the activation's values and takes their gradient. `keep`: whether a backward may
// follow (else nothing is kept, and no sum written).
class ScaledExpertActivationFn : public torch::autograd::Function<ScaledExpertActivationFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_up, const at::Tensor& add_argument,
                            const at::Tensor& scale, double alpha, double limit, bool keep) {
    const at::Tensor add = add_argument.numel() > 0 ? add_argument : at::Tensor();
    ctx->saved_data["alpha"] = alpha;
    ctx->saved_data["limit"] = limit;
    ctx->saved_data["add"] = add.defined();
    at::Tensor input, y;
    if (limit <= 0 && ScaledSwiGluHalvesFused(gate_up, scale, add)) {
      y = ScaledSwiGluHalves(gate_up, scale, add, keep && add.defined() ? &input : nullptr);
      if (!add.defined()) input = gate_up;
    } else {
      input = add.defined() ? gate_up + add : gate_up;
      y = ScaledActivationValue(input, scale, alpha, limit);
    }
    if (keep) ctx->save_for_backward({input, scale});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    TORCH_CHECK(saved.size() == 2, "ScaledExpertActivation: backward of a forward that kept nothing");
    const double alpha = ctx->saved_data["alpha"].toDouble(), limit = ctx->saved_data["limit"].toDouble();
    at::Tensor d_input, d_scale;
    if (limit <= 0 && ScaledSwiGluHalvesFused(saved[0], saved[1])) {
      const auto grads = ScaledSwiGluHalvesGrads(saved[0], saved[1], grad_outputs[0]);
      d_input = grads[0];
      d_scale = grads[1];
    } else {
      const at::AutoGradMode grad_mode(true);
      const at::Tensor x = saved[0].detach().requires_grad_(true), s = saved[1].detach().requires_grad_(true);
      const at::Tensor y = ScaledActivationValue(x, s, alpha, limit);
      const auto grads = torch::autograd::grad({y}, {x, s}, {grad_outputs[0]});
      d_input = grads[0];
      d_scale = grads[1];
    }
    const at::Tensor d_add = ctx->saved_data["add"].toBool() ? d_input : at::Tensor();
    return {d_input, d_add, d_scale, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

void CheckPairs(const char* op, const at::Tensor& order, const at::Tensor& inverse, int64_t rows, int64_t top_k) {
  TORCH_CHECK(top_k > 0 && order.dim() == 1 && inverse.sizes() == order.sizes() && order.size(0) == rows, op,
              ": order and inverse must be [", rows, "] (the pairs), got ", order.sizes(), " and ", inverse.sizes(),
              " with top_k ", top_k);
}

}  // namespace

at::Tensor ToPairs(const at::Tensor& x, const at::Tensor& order, const at::Tensor& inverse, int64_t top_k) {
  TORCH_CHECK(x.dim() == 2, "ToPairs: x must be [tokens, hidden], got ", x.sizes());
  CheckPairs("ToPairs", order, inverse, x.size(0) * top_k, top_k);
  return ToPairsFn::apply(x, order, inverse, top_k);
}

at::Tensor FromPairs(const at::Tensor& rows, const at::Tensor& order, const at::Tensor& inverse, int64_t top_k,
                     const at::Tensor& extra) {
  TORCH_CHECK(rows.dim() == 2, "FromPairs: rows must be [pairs, hidden], got ", rows.sizes());
  CheckPairs("FromPairs", order, inverse, rows.size(0), top_k);
  TORCH_CHECK(rows.size(0) % top_k == 0, "FromPairs: ", rows.size(0), " rows are not whole tokens of ", top_k,
              " pairs");
  // An undefined tensor is no autograd function's input: none as an empty one.
  return FromPairsFn::apply(rows, extra.defined() ? extra : at::empty({0}, rows.options()), order, inverse, top_k);
}

at::Tensor ScaledExpertActivation(const at::Tensor& gate_up, const at::Tensor& scale, double alpha, double limit,
                                  const at::Tensor& add) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0,
              "ScaledExpertActivation: gate_up must be [rows, 2 n], got ", gate_up.sizes());
  TORCH_CHECK(scale.dim() == 1 && scale.size(0) == gate_up.size(0), "ScaledExpertActivation: scale must be [",
              gate_up.size(0), "], got ", scale.sizes());
  TORCH_CHECK(!add.defined() || (add.sizes() == gate_up.sizes() && add.scalar_type() == gate_up.scalar_type()),
              "ScaledExpertActivation: add must be gate_up's shape and dtype, got ", add.sizes());
  const bool keep = at::GradMode::is_enabled() &&
                    (gate_up.requires_grad() || scale.requires_grad() || (add.defined() && add.requires_grad()));
  // An undefined tensor is no autograd function's input: none as an empty one.
  return ScaledExpertActivationFn::apply(gate_up, add.defined() ? add : at::empty({0}, gate_up.options()), scale, alpha,
                                         limit, keep);
}

}  // namespace oomb::kernels
