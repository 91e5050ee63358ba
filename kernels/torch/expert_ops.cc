#include "kernels/torch/expert_ops.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kernels/torch/layer_ops.h"
#include "kernels/torch/matmul.h"

namespace oomb::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor PairTokens(const at::Tensor& order, int64_t top_k) { return at::div(order, top_k, "floor"); }

// An undefined tensor is no autograd function's input (nor a saved one): none passes as an empty
// tensor like `like`, and Defined turns it back.
at::Tensor OrEmpty(const at::Tensor& t, const at::Tensor& like) {
  return t.defined() ? t : at::empty({0}, like.options());
}
at::Tensor Defined(const at::Tensor& t) { return t.numel() > 0 ? t : at::Tensor(); }

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
    return PairSum(rows, Defined(extra), inverse, top_k);
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

// act(gate_up + add) * scale (add undefined: none), SwiGLU's on the scaled gated-activation
// kernel where it applies; `input`, where given, receives the activation's input (gate_up + add),
// which backward takes (else no sum is written).
at::Tensor ActivationForward(const at::Tensor& gate_up, const at::Tensor& add, const at::Tensor& scale, double alpha,
                             double limit, at::Tensor* input) {
  if (limit <= 0 && ScaledSwiGluHalvesFused(gate_up, scale, add)) {
    const at::Tensor y = ScaledSwiGluHalves(gate_up, scale, add, input != nullptr && add.defined() ? input : nullptr);
    if (input != nullptr && !add.defined()) *input = gate_up;
    return y;
  }
  const at::Tensor sum = add.defined() ? gate_up + add : gate_up;
  if (input != nullptr) *input = sum;
  return ScaledActivationValue(sum, scale, alpha, limit);
}

// The gradients of ActivationForward's value in its input and scale, given the value's: the
// kernel's backward where it applies, else autograd over the activation recomputed.
std::array<at::Tensor, 2> ActivationGrads(const at::Tensor& input, const at::Tensor& scale, const at::Tensor& grad,
                                          double alpha, double limit) {
  if (limit <= 0 && ScaledSwiGluHalvesFused(input, scale)) return ScaledSwiGluHalvesGrads(input, scale, grad);
  const at::AutoGradMode grad_mode(true);
  const at::Tensor x = input.detach().requires_grad_(true), s = scale.detach().requires_grad_(true);
  const at::Tensor y = ScaledActivationValue(x, s, alpha, limit);
  const auto grads = torch::autograd::grad({y}, {x, s}, {grad});
  return {grads[0], grads[1]};
}

// ScaledExpertActivation keeping the activation's input (gate_up, plus `add` where given) and
// scale, and recomputing the activation in backward. `keep`: whether a backward may follow
// (else nothing is kept, and no sum written).
class ScaledExpertActivationFn : public torch::autograd::Function<ScaledExpertActivationFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_up, const at::Tensor& add_argument,
                            const at::Tensor& scale, double alpha, double limit, bool keep) {
    const at::Tensor add = Defined(add_argument);
    ctx->saved_data["alpha"] = alpha;
    ctx->saved_data["limit"] = limit;
    ctx->saved_data["add"] = add.defined();
    at::Tensor input;
    const at::Tensor y = ActivationForward(gate_up, add, scale, alpha, limit, keep ? &input : nullptr);
    if (keep) ctx->save_for_backward({input, scale});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    TORCH_CHECK(saved.size() == 2, "ScaledExpertActivation: backward of a forward that kept nothing");
    const auto [d_input, d_scale] = ActivationGrads(
        saved[0], saved[1], grad_outputs[0], ctx->saved_data["alpha"].toDouble(), ctx->saved_data["limit"].toDouble());
    const at::Tensor d_add = ctx->saved_data["add"].toBool() ? d_input : at::Tensor();
    return {d_input, d_add, d_scale, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Expert e's gradient of a bank's operand b [E, K, N] (column-major, as the banks' operands
// are) in out = GroupedMatmul(a, b): a_e^T d_e, as at::_grouped_mm's autograd takes it.
at::Tensor GroupedOperandGrad(const at::Tensor& a, const at::Tensor& d, const at::Tensor& offs) {
  return GroupedMatmul(d.t(), a, offs).transpose(1, 2);
}

// The gradient of a in out = GroupedMatmul(a, b): d b_e^T over each expert's rows.
at::Tensor GroupedInputGrad(const at::Tensor& d, const at::Tensor& b, const at::Tensor& offs) {
  return GroupedMatmul(d, b.transpose(1, 2), offs);
}

// GroupedExpertMlp. Inputs after y and scale: gate_up's weight, a, b, down's weight, a, b (an
// adapter's a and b empty where the bank has none). `keep`: whether a backward may follow.
class GroupedExpertMlpFn : public torch::autograd::Function<GroupedExpertMlpFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& y, const at::Tensor& scale,
                            const at::Tensor& gate_up_weight, const at::Tensor& gate_up_a, const at::Tensor& gate_up_b,
                            const at::Tensor& down_weight, const at::Tensor& down_a, const at::Tensor& down_b,
                            const at::Tensor& order, const at::Tensor& inverse, const at::Tensor& offs, int64_t top_k,
                            double alpha, double limit, bool keep, bool recompute_gate_up) {
    const at::Tensor gu_a = Defined(gate_up_a), gu_b = Defined(gate_up_b), d_a = Defined(down_a), d_b = Defined(down_b);
    at::Tensor gate_up, gate_up_lora, u_gate_up;
    {
      const at::Tensor x = y.index_select(0, PairTokens(order, top_k));  // not kept: backward gathers it again
      gate_up = GroupedMatmul(x, gate_up_weight, offs);
      if (gu_a.defined()) {
        u_gate_up = GroupedMatmul(x, gu_a, offs);
        gate_up_lora = GroupedMatmul(u_gate_up, gu_b, offs);
      }
    }
    at::Tensor input;
    const bool keep_input = keep && !recompute_gate_up;
    const at::Tensor act = ActivationForward(gate_up, gate_up_lora, scale, alpha, limit, keep_input ? &input : nullptr);
    gate_up = at::Tensor();
    gate_up_lora = at::Tensor();
    const at::Tensor rows = GroupedMatmul(act, down_weight, offs);
    at::Tensor u_down, down_lora;
    if (d_a.defined()) {
      u_down = GroupedMatmul(act, d_a, offs);
      down_lora = GroupedMatmul(u_down, d_b, offs);
    }
    if (keep) {
      ctx->save_for_backward({y, scale, OrEmpty(keep_input ? input : at::Tensor(), y), OrEmpty(u_gate_up, y),
                              OrEmpty(u_down, y), gate_up_weight, gate_up_a, gate_up_b, down_weight, down_a, down_b,
                              order, inverse, offs});
      ctx->saved_data["top_k"] = top_k;
      ctx->saved_data["alpha"] = alpha;
      ctx->saved_data["limit"] = limit;
    }
    return PairSum(rows, down_lora, inverse, top_k);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    TORCH_CHECK(saved.size() == 14, "GroupedExpertMlp: backward of a forward that kept nothing");
    const at::Tensor &y = saved[0], &scale = saved[1], &gate_up_weight = saved[5], &down_weight = saved[8],
                     &order = saved[11], &inverse = saved[12], &offs = saved[13];
    const at::Tensor u_gate_up = Defined(saved[3]), u_down = Defined(saved[4]), gu_a = Defined(saved[6]),
                     gu_b = Defined(saved[7]), d_a = Defined(saved[9]), d_b = Defined(saved[10]);
    const int64_t top_k = ctx->saved_data["top_k"].toInt();
    const double alpha = ctx->saved_data["alpha"].toDouble(), limit = ctx->saved_data["limit"].toDouble();
    const at::Tensor tokens = PairTokens(order, top_k);
    // The activation's input, and the activation where down's LoRA A needs it: kept, or the
    // gate_up product recomputed from the pairs' rows (and the LoRA intermediate kept).
    at::Tensor input = Defined(saved[2]), act;
    if (!input.defined()) {
      const at::Tensor gate_up = GroupedMatmul(y.index_select(0, tokens), gate_up_weight, offs);
      const at::Tensor lora = gu_a.defined() ? GroupedMatmul(u_gate_up, gu_b, offs) : at::Tensor();
      act = ActivationForward(gate_up, lora, scale, alpha, limit, &input);
    } else if (d_a.defined()) {
      act = ActivationForward(input, at::Tensor(), scale, alpha, limit, nullptr);
    }
    variable_list grads(16);
    // The down bank: its rows' gradient is each pair's token's, the LoRA update's the same.
    at::Tensor d_act;
    {
      const at::Tensor d_rows = grad_outputs[0].index_select(0, tokens);
      d_act = GroupedInputGrad(d_rows, down_weight, offs);
      if (d_a.defined()) {
        grads[7] = GroupedOperandGrad(u_down, d_rows, offs);
        const at::Tensor d_u = GroupedInputGrad(d_rows, d_b, offs);
        grads[6] = GroupedOperandGrad(act, d_u, offs);
        d_act.add_(GroupedInputGrad(d_u, d_a, offs));
      }
    }
    act = at::Tensor();
    const auto [d_input, d_scale] = ActivationGrads(input, scale, d_act, alpha, limit);
    d_act = at::Tensor();
    input = at::Tensor();
    grads[1] = d_scale;
    // The gate_up bank: the pairs' input rows' two gradients, through the weight and through
    // LoRA's A, summed per token in one pass.
    const at::Tensor d_x = GroupedInputGrad(d_input, gate_up_weight, offs);
    at::Tensor d_x_lora;
    if (gu_a.defined()) {
      grads[4] = GroupedOperandGrad(u_gate_up, d_input, offs);
      const at::Tensor d_u = GroupedInputGrad(d_input, gu_b, offs);
      grads[3] = GroupedOperandGrad(y.index_select(0, tokens), d_u, offs);
      d_x_lora = GroupedInputGrad(d_u, gu_a, offs);
    }
    grads[0] = PairSum(d_x, d_x_lora, inverse, top_k);
    return grads;
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
  return FromPairsFn::apply(rows, OrEmpty(extra, rows), order, inverse, top_k);
}

at::Tensor GroupedExpertMlp(const at::Tensor& y, const at::Tensor& order, const at::Tensor& inverse, int64_t top_k,
                            const at::Tensor& offs, const at::Tensor& scale, const GroupedBankOperands& gate_up,
                            const GroupedBankOperands& down, double alpha, double limit, bool recompute_gate_up) {
  TORCH_CHECK(y.dim() == 2, "GroupedExpertMlp: y must be [tokens, hidden], got ", y.sizes());
  CheckPairs("GroupedExpertMlp", order, inverse, y.size(0) * top_k, top_k);
  TORCH_CHECK(scale.dim() == 1 && scale.size(0) == order.size(0), "GroupedExpertMlp: scale must be [", order.size(0),
              "], got ", scale.sizes());
  for (const GroupedBankOperands* bank : {&gate_up, &down}) {
    TORCH_CHECK(!bank->weight.requires_grad(),
                "GroupedExpertMlp: the experts' weights are frozen (full fine-tuning "
                "takes the separate functions)");
    TORCH_CHECK(bank->a.defined() == bank->b.defined(), "GroupedExpertMlp: a bank's LoRA needs both a and b");
  }
  const bool keep = at::GradMode::is_enabled() &&
                    (y.requires_grad() || scale.requires_grad() ||
                     (gate_up.a.defined() && (gate_up.a.requires_grad() || gate_up.b.requires_grad())) ||
                     (down.a.defined() && (down.a.requires_grad() || down.b.requires_grad())));
  return GroupedExpertMlpFn::apply(y, scale, gate_up.weight, OrEmpty(gate_up.a, y), OrEmpty(gate_up.b, y), down.weight,
                                   OrEmpty(down.a, y), OrEmpty(down.b, y), order, inverse, offs, top_k, alpha, limit,
                                   keep, recompute_gate_up);
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
  return ScaledExpertActivationFn::apply(gate_up, OrEmpty(add, gate_up), scale, alpha, limit, keep);
}

}  // namespace oomb::kernels
