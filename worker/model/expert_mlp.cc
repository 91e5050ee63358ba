#include "worker/model/expert_mlp.h"

#include <c10/util/Optional.h>
#if defined(OOMB_HAVE_CUDA)
#include <ATen/cuda/CUDAContext.h>
#endif

#include "kernels/torch/expert_ops.h"
#include "kernels/torch/matmul.h"

namespace oomb {

void ExpertBank::Describe(const ExpertBankSpec& spec) {
  row_parallel = spec.row_parallel;
  parts = spec.parts;
}

void ExpertBank::AddSlots(std::vector<TensorSlot>* out) {
  AddLinearSlots(row_parallel, parts, true, &weight, &bias, &lora_a, &lora_b, out);
}

void RouterBalance::Add(const at::Tensor& probs, const at::Tensor& counts) {
  if (weighed()) {
    const at::Tensor rows_term = at::matmul(probs, weights.to(probs.scalar_type())).sum();
    term = term.defined() ? term + rows_term : rows_term;
    return;
  }
  const at::Tensor n = counts.to(at::kDouble);
  const at::Tensor s = probs.sum(0).to(at::kDouble);
  this->counts = this->counts.defined() ? this->counts + n : n;
  prob_sums = prob_sums.defined() ? prob_sums + s : s;
  rows += probs.size(0);
}

at::Tensor RouterBalance::Loss() const {
  if (rows == 0) return {};
  const double N = static_cast<double>(rows);
  return at::dot(counts, prob_sums) * (static_cast<double>(counts.size(0)) / (N * N));
}

void RouterBalance::Weigh() {
  const double N = static_cast<double>(rows);
  weights = counts * (static_cast<double>(counts.size(0)) / (N * N));
  prob_sums = prob_sums.detach();
  value = Loss();
  term = at::Tensor();
}

namespace {

// Every expert's weight and LoRA factors of a bank as views, split once per forward: autograd
// then gathers their gradients into one tensor per bank (UnbindBackward), where taking expert e's
// slice from the bank each time would build a bank-sized gradient per expert.
struct ExpertViews {
  // with_bias false: without the bank's biases (a row-parallel bank's, on ranks other than 0).
  ExpertViews(const ExpertBank& bank, at::ScalarType t, bool with_bias) : scaling(bank.lora_scaling) {
    weights = bank.weight.unbind(0);
    if (bank.bias.defined() && with_bias) biases = bank.bias.unbind(0);
    if (!bank.lora_a.defined()) return;
    const int64_t experts = bank.weight.size(0), rank = bank.lora_a.size(0) / experts;
    a = bank.lora_a.to(t).view({experts, rank, -1}).unbind(0);                               // [r, in] each
    b = (bank.lora_b * scaling).to(t).view({bank.lora_b.size(0), rank, experts}).unbind(2);  // [out, r] each
  }
  // Expert e over its pairs x [n, in]: x W_e^T + b_e bias_scale + (x A_e^T) B_e^T alpha / r
  // (bias_scale [n], the pairs' routing weights, or undefined: 1).
  at::Tensor Forward(int64_t e, const at::Tensor& x, const at::Tensor& bias_scale) const {
    const bool scaled_bias = !biases.empty() && bias_scale.defined();
    at::Tensor y = kernels::Linear(x, weights[e],
                                   biases.empty() || scaled_bias ? c10::nullopt : c10::optional<at::Tensor>(biases[e]));
    if (scaled_bias) y = y + (biases[e] * bias_scale.unsqueeze(-1)).to(biases[e].scalar_type());
    if (!a.empty()) kernels::AddMatmul_(y, kernels::Linear(x, a[e]), b[e].t());
    return y;
  }
  std::vector<at::Tensor> weights, biases, a, b;
  double scaling;
};

// A bank as kernels::GroupedMatmul takes it, each expert's matrix column-major: W_e^T, and LoRA's
// A_e^T and (B_e alpha / r)^T.
struct GroupedBank {
  GroupedBank(const ExpertBank& bank, at::ScalarType t, bool with_bias) : bias(with_bias ? bank.bias : at::Tensor()) {
    weight = bank.weight.transpose(1, 2);  // [E, in, out]
    if (!bank.lora_a.defined()) return;
    const int64_t experts = bank.weight.size(0), rank = bank.lora_a.size(0) / experts, out = bank.lora_b.size(0);
    a = bank.lora_a.to(t).view({experts, rank, -1}).transpose(1, 2);  // [E, in, r]
    // PEFT's B [out, r E] (expert e's column k at k E + e): to [E, out, r], then [E, r, out].
    b = (bank.lora_b * bank.lora_scaling)
            .to(t)
            .view({out, rank, experts})
            .permute({2, 0, 1})
            .contiguous()
            .transpose(1, 2);
  }
  // The pairs x [M, in] sorted by expert, offs their groups' ends, `experts` [M] each pair's
  // expert (where the bank has biases), bias_scale as ExpertViews::Forward's:
  // x W_e^T + b_e bias_scale + (x A_e^T) B_e^T alpha / r.
  // With `lora_apart`, LoRA's update goes there (undefined without an adapter), not into the sum.
  at::Tensor Forward(const at::Tensor& x, const at::Tensor& offs, const at::Tensor& experts,
                     const at::Tensor& bias_scale, at::Tensor* lora_apart = nullptr) const {
    at::Tensor y = kernels::GroupedMatmul(x, weight, offs);
    if (bias.defined()) y = y + PairBiases(experts, bias_scale);
    if (!a.defined()) return y;
    const at::Tensor update = kernels::GroupedMatmul(kernels::GroupedMatmul(x, a, offs), b, offs);
    if (lora_apart == nullptr) return y + update;
    *lora_apart = update;
    return y;
  }
  // Each pair's expert's bias, times its bias_scale where defined: scaled, a one-hot [M, E] of
  // the pairs' experts holding their scales times the bias [E, out] (the scales' gradient then
  // keeps nothing out-wide, where gathering the rows and scaling them would keep the rows).
  at::Tensor PairBiases(const at::Tensor& experts, const at::Tensor& bias_scale) const {
    if (!bias_scale.defined()) return bias.index_select(0, experts);
    const at::Tensor pick = at::zeros({experts.size(0), bias.size(0)}, bias.options())
                                .scatter(1, experts.unsqueeze(1), bias_scale.to(bias.scalar_type()).unsqueeze(1));
    return kernels::Matmul(pick, bias);
  }
  kernels::GroupedBankOperands Operands() const { return {.weight = weight, .a = a, .b = b}; }
  at::Tensor weight, bias, a, b;
};

}  // namespace

at::Tensor ExpertMlp::Forward(const BlockContext& ctx, const MoeSpec& moe, const ExpertRun& run,
                              const at::Tensor& y) const {
  const at::ScalarType dtype = ctx.dtype;
  // Routing, as transformers': softmax of the router's logits in float32, the top_k, renormalised.
  const at::Tensor logits = kernels::Linear(
      y, router, router_bias.defined() ? c10::optional<at::Tensor>(router_bias) : c10::nullopt);  // [C, E]
  const at::Tensor probs = at::softmax(logits, -1, ctx.master());
  auto [weights, experts] = at::topk(probs, moe.top_k, -1);
  if (moe.renormalize) weights = weights / weights.sum(-1, /*keepdim=*/true);
  if (!moe.float_scores) weights = weights.to(dtype);
  // The (token, slot) pairs in expert order, once, and each expert's count, on the device (a
  // scatter, where bincount would read the largest id on the host).
  const at::Tensor flat = experts.reshape(-1);
  const at::Tensor counts = at::zeros({moe.experts}, flat.options()).scatter_add_(0, flat, at::ones_like(flat));
  // Under tensor parallelism the experts' outputs are partial and the router's gradient with
  // them: rank 0 alone adds the auxiliary loss's share (tensor_parallel.h).
  if (run.balance != nullptr) run.balance->Add(ctx.LeadsGroup() ? probs : probs.detach(), counts);
  const at::Tensor order = at::argsort(flat, /*stable=*/true);
  const at::Tensor inverse = at::empty_like(order).scatter_(0, order, at::arange(order.size(0), order.options()));
  // Each pair's routing weight scales its activation, before the (linear) down projection: the
  // pairs' outputs are then summed per token as they are, and no hidden-wide output is kept for
  // the weights' gradient.
  const at::Tensor scale = weights.reshape(-1).index_select(0, order);
  // Grouped products over frozen banks without biases (LoRA's common case): one autograd function
  // that keeps of the pairs only the activation's input; else the separate functions.
  const bool frozen = !gate_up.weight.requires_grad() && !down.weight.requires_grad();
  if (run.kernel == ExpertKernel::kGrouped && frozen && !moe.biases) {
    const at::Tensor offs = counts.cumsum(0).to(at::kInt);
    const GroupedBank gu(gate_up, y.scalar_type(), false), dn(down, y.scalar_type(), false);
    return kernels::GroupedExpertMlp(y, order, inverse, moe.top_k, offs, scale, gu.Operands(), dn.Operands(),
                                     moe.swiglu_alpha, moe.swiglu_limit, run.recompute_gate_up)
        .to(dtype);
  }
  const at::Tensor x = kernels::ToPairs(y, order, inverse, moe.top_k);
  const PairOutputs out =
      run.kernel == ExpertKernel::kGrouped ? Grouped(ctx, moe, x, counts, scale) : Loop(ctx, moe, x, counts, scale);
  return kernels::FromPairs(out.rows, order, inverse, moe.top_k, out.lora).to(dtype);
}

ExpertMlp::PairOutputs ExpertMlp::Loop(const BlockContext& ctx, const MoeSpec& moe, const at::Tensor& x,
                                       const at::Tensor& counts, const at::Tensor& scale) const {
  const at::Tensor host = counts.cpu();
  const std::vector<int64_t> sizes(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
  // Split once (not a narrow per expert): autograd then joins the slices' gradients in one pass
  // rather than widening each to the whole [C k, hidden].
  const std::vector<at::Tensor> inputs = x.split_with_sizes(sizes), scales = scale.split_with_sizes(sizes);
  const ExpertViews gu(gate_up, x.scalar_type(), true), dn(down, x.scalar_type(), ctx.LeadsGroup());
  std::vector<at::Tensor> outputs;
  for (size_t e = 0; e < sizes.size(); ++e) {
    if (sizes[e] == 0) continue;
    const auto expert = static_cast<int64_t>(e);
    const at::Tensor act = kernels::ScaledExpertActivation(gu.Forward(expert, inputs[e], at::Tensor()), scales[e],
                                                           moe.swiglu_alpha, moe.swiglu_limit);
    outputs.push_back(dn.Forward(expert, act, scales[e]));
  }
  return {.rows = at::cat(outputs), .lora = at::Tensor()};
}

ExpertMlp::PairOutputs ExpertMlp::Grouped(const BlockContext& ctx, const MoeSpec& moe, const at::Tensor& x,
                                          const at::Tensor& counts, const at::Tensor& scale) const {
  const at::Tensor offs = counts.cumsum(0).to(at::kInt);
  // Each pair's expert, for the biases (the output size given: nothing read on the host).
  const at::Tensor experts =
      moe.biases ? at::repeat_interleave(at::arange(moe.experts, counts.options()), counts, 0, x.size(0))
                 : at::Tensor();
  const GroupedBank gu(gate_up, x.scalar_type(), true), dn(down, x.scalar_type(), ctx.LeadsGroup());
  // Both banks' LoRA updates kept apart from their products: gate_up's added in the
  // activation's pass, down's in the pairs' sum.
  at::Tensor gate_up_lora;
  const at::Tensor gate_up_product = gu.Forward(x, offs, experts, at::Tensor(), &gate_up_lora);
  const at::Tensor act =
      kernels::ScaledExpertActivation(gate_up_product, scale, moe.swiglu_alpha, moe.swiglu_limit, gate_up_lora);
  PairOutputs out;
  out.rows = dn.Forward(act, offs, experts, scale, &out.lora);
  return out;
}

ExpertKernel ChooseExpertKernel(ExpertKernel asked, const ModelConfig& config, at::ScalarType dtype,
                                const at::Device& device, int tp_size, const std::vector<int64_t>& lora_ranks) {
  if (asked != ExpertKernel::kAuto) return asked;
  ExpertPathTarget target;
  target.cuda = device.is_cuda();
#if defined(OOMB_HAVE_CUDA)
  if (target.cuda) {
    const auto* p = at::cuda::getDeviceProperties(device.index());
    target.compute_capability = p->major * 10 + p->minor;
  }
#endif
  target.half_precision = dtype == at::kBFloat16 || dtype == at::kHalf;
  target.elem_bytes = static_cast<int64_t>(c10::elementSize(dtype));
  return RunsGroupedExperts(target, ExpertInnerSizes(config, tp_size, lora_ranks)) ? ExpertKernel::kGrouped
                                                                                   : ExpertKernel::kLoop;
}

}  // namespace oomb
