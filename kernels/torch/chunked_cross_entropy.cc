#include "kernels/torch/chunked_cross_entropy.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <vector>

#include "kernels/torch/upload.h"

namespace oomb::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::ScalarType ComputeType(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// Whether each block of rows_per_block rows has a label, from the labels on the CPU (a copy of
// device labels waits for the device).
std::vector<bool> BlocksWithLabels(const at::Tensor& labels_cpu, int64_t rows_per_block) {
  const at::Tensor l = labels_cpu.contiguous();
  const int64_t* x = l.data_ptr<int64_t>();
  std::vector<bool> out;
  for (int64_t r0 = 0; r0 < l.size(0); r0 += rows_per_block) {
    const int64_t r1 = std::min(l.size(0), r0 + rows_per_block);
    out.push_back(std::any_of(x + r0, x + r1, [](int64_t label) { return label != kIgnoreIndex; }));
  }
  return out;
}

// The shapes both functions take (chunked_cross_entropy.h); labels on hidden's device or the CPU.
void CheckInputs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels, int64_t rows_per_block) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
              "hidden [N, d] and weight [vocab, d] expected, got ", hidden.sizes(), " and ", weight.sizes());
  TORCH_CHECK(labels.dim() == 1 && labels.size(0) == hidden.size(0) && labels.scalar_type() == at::kLong,
              "labels: expected int64 [", hidden.size(0), "], got ", labels.scalar_type(), " ", labels.sizes());
  TORCH_CHECK(rows_per_block > 0, "rows_per_block must be > 0, got ", rows_per_block);
  TORCH_CHECK(labels.is_cpu() || labels.device() == hidden.device(), "labels: expected on ", hidden.device(),
              " or the CPU, got ", labels.device());
}

class ChunkedCrossEntropyFn : public torch::autograd::Function<ChunkedCrossEntropyFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                            const at::Tensor& labels, int64_t rows_per_block) {
    CheckInputs(hidden, weight, labels, rows_per_block);
    const at::ScalarType ct = ComputeType(hidden.scalar_type());
    const at::Tensor w = weight.to(hidden.scalar_type());
    const std::vector<bool> labelled = BlocksWithLabels(labels.cpu(), rows_per_block);
    const at::Tensor labels_on_device = Upload(labels, hidden.device());
    at::Tensor total = at::zeros({}, hidden.options().dtype(ct));
    for (int64_t r0 = 0; r0 < hidden.size(0); r0 += rows_per_block) {
      const int64_t r1 = std::min(hidden.size(0), r0 + rows_per_block);
      if (!labelled[r0 / rows_per_block]) continue;
      const at::Tensor lab = labels_on_device.slice(0, r0, r1);
      const at::Tensor valid = lab.ne(kIgnoreIndex);
      const at::Tensor logits = at::matmul(hidden.slice(0, r0, r1), w.t()).to(ct);  // [B, vocab]
      const at::Tensor lse = at::logsumexp(logits, -1);
      const at::Tensor picked = logits.gather(1, lab.clamp_min(0).unsqueeze(1)).squeeze(1);
      total.add_(((lse - picked) * valid.to(ct)).sum());
    }
    ctx->save_for_backward({hidden, weight, labels_on_device});
    ctx->saved_data["rows_per_block"] = rows_per_block;
    c10::List<bool> saved_labelled;
    for (const bool b : labelled) saved_labelled.push_back(b);
    ctx->saved_data["labelled"] = std::move(saved_labelled);
    return total.to(hidden.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &hidden = saved[0], &weight = saved[1], &labels = saved[2];
    const int64_t rows_per_block = ctx->saved_data["rows_per_block"].toInt();
    const at::ScalarType ct = ComputeType(hidden.scalar_type());
    const at::ScalarType mt = hidden.scalar_type();  // matmul type
    const at::Tensor w = weight.to(mt);
    const at::Tensor g = grad_outputs[0].to(ct);
    const bool want_weight = ctx->needs_input_grad(1);
    const c10::List<bool> labelled = ctx->saved_data["labelled"].toBoolList();
    at::Tensor dhidden = at::zeros(hidden.sizes(), hidden.options().dtype(ct));
    at::Tensor dweight = want_weight ? at::zeros(weight.sizes(), weight.options().dtype(ct)) : at::Tensor();
    for (int64_t r0 = 0; r0 < hidden.size(0); r0 += rows_per_block) {
      const int64_t r1 = std::min(hidden.size(0), r0 + rows_per_block);
      if (!labelled[r0 / rows_per_block]) continue;
      const at::Tensor lab = labels.slice(0, r0, r1);
      const at::Tensor valid = lab.ne(kIgnoreIndex);
      const at::Tensor h = hidden.slice(0, r0, r1);
      at::Tensor dlogits = at::softmax(at::matmul(h, w.t()).to(ct), -1);  // [B, vocab]
      dlogits.scatter_add_(1, lab.clamp_min(0).unsqueeze(1), at::full({r1 - r0, 1}, -1.0, dlogits.options()));
      dlogits.mul_(valid.to(ct).unsqueeze(1) * g);
      const at::Tensor dl = dlogits.to(mt);
      dhidden.slice(0, r0, r1).copy_(at::matmul(dl, w));
      if (want_weight) dweight.add_(at::matmul(dl.t(), h));
    }
    return {dhidden.to(hidden.scalar_type()), want_weight ? dweight.to(weight.scalar_type()) : at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor ChunkedLmHeadCrossEntropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                                     int64_t rows_per_block) {
  return ChunkedCrossEntropyFn::apply(hidden, weight, labels, rows_per_block);
}

std::pair<at::Tensor, at::Tensor> LmHeadTokenScores(const at::Tensor& hidden, const at::Tensor& weight,
                                                    const at::Tensor& labels, int64_t rows_per_block) {
  CheckInputs(hidden, weight, labels, rows_per_block);
  at::NoGradGuard no_grad;
  const at::ScalarType ct = ComputeType(hidden.scalar_type());
  const at::Tensor w = weight.to(hidden.scalar_type());
  const at::Tensor lab_all = Upload(labels, hidden.device());
  at::Tensor loss = at::zeros({hidden.size(0)}, hidden.options().dtype(ct));
  at::Tensor hit = at::zeros({hidden.size(0)}, hidden.options().dtype(at::kBool));
  for (int64_t r0 = 0; r0 < hidden.size(0); r0 += rows_per_block) {
    const int64_t r1 = std::min(hidden.size(0), r0 + rows_per_block);
    const at::Tensor lab = lab_all.slice(0, r0, r1);
    const at::Tensor valid = lab.ne(kIgnoreIndex);
    const at::Tensor logits = at::matmul(hidden.slice(0, r0, r1), w.t()).to(ct);  // [B, vocab]
    const at::Tensor picked = logits.gather(1, lab.clamp_min(0).unsqueeze(1)).squeeze(1);
    loss.slice(0, r0, r1).copy_((at::logsumexp(logits, -1) - picked) * valid.to(ct));
    hit.slice(0, r0, r1).copy_(logits.argmax(-1).eq(lab) & valid);
  }
  return {loss, hit};
}

}  // namespace oomb::kernels
