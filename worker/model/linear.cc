#include "worker/model/linear.h"

#include <c10/util/Optional.h>

#include "kernels/torch/matmul.h"

namespace oomb {

void Linear::Describe(const LinearSpec& spec) {
  row_parallel = spec.row_parallel;
  parts = spec.parts;
}

at::Tensor Linear::Product(const at::Tensor& x, bool with_bias) const {
  const bool b = with_bias && bias.defined();
  return kernels::Linear(x, weight, b ? c10::optional<at::Tensor>(bias) : c10::nullopt);
}

at::Tensor Linear::Partial(const at::Tensor& x, at::Generator* gen, bool training, bool with_bias) const {
  at::Tensor y = Product(x, with_bias);
  if (!lora_a.defined()) return y;
  at::Tensor xin = x;
  if (training && lora_dropout > 0) {
    // A row-parallel layer's rank draws the whole input's mask and keeps its columns.
    std::vector<int64_t> mask_shape = x.sizes().vec();
    if (whole_in > 0) mask_shape.back() = whole_in;
    at::Tensor keep = at::bernoulli(at::full(mask_shape, 1.0 - lora_dropout, x.options().dtype(at::kFloat)), *gen);
    if (whole_in > 0) keep = keep.narrow(-1, in_begin, x.size(-1));
    xin = x * keep.to(x.scalar_type()) / (1.0 - lora_dropout);
  }
  // y + scaling * (xin A^T) B^T, the addition in the second product's epilogue (in place: the
  // base product's output is not saved for backward) and the scaling folded into B, so neither
  // costs a pass over the [C, out] output, forward or backward.
  const at::Tensor a = lora_a.to(x.scalar_type());
  const at::Tensor b = (lora_b * lora_scaling).to(x.scalar_type());
  const at::Tensor down = kernels::Linear(xin, a);
  // On y itself where it is 2-D: an in-place op on a view would make autograd copy the whole
  // gradient of y in backward (CopySlices).
  if (y.dim() == 2) {
    kernels::AddMatmul_(y, down, b.t());
  } else {
    at::Tensor rows = y.view({-1, y.size(-1)});
    kernels::AddMatmul_(rows, down.view({-1, down.size(-1)}), b.t());
  }
  return y;
}

at::Tensor Linear::Forward(const BlockContext& ctx, const at::Tensor& x, at::Generator* gen, bool training) const {
  if (!row_parallel) return Partial(x, gen, training);
  return ctx.SumShards(Partial(x, gen, training, ctx.LeadsGroup()));
}

void AddLinearSlots(bool row_parallel, const std::vector<int64_t>& parts, bool experts, at::Tensor* weight,
                    at::Tensor* bias, at::Tensor* lora_a, at::Tensor* lora_b, std::vector<TensorSlot>* out) {
  const int64_t lead = experts ? 1 : 0;  // the weight [E, out, in] and the bias [E, out] of a bank
  out->push_back({weight, Split::Along(lead + (row_parallel ? 1 : 0), parts)});
  out->push_back({bias, row_parallel ? Split::Partial() : Split::Along(lead, parts)});
  out->push_back({lora_a, row_parallel ? Split::Along(1, parts) : Split::Partial()});  // [r, in], a bank's [E r, in]
  out->push_back({lora_b, row_parallel ? Split::Partial() : Split::Along(0, parts)});  // [out, r], a bank's [out, r E]
}

void Linear::AddSlots(std::vector<TensorSlot>* out) {
  AddLinearSlots(row_parallel, parts, false, &weight, &bias, &lora_a, &lora_b, out);
}

void Linear::JoinGroup(int64_t whole_in_features, int rank, int size) {
  if (!row_parallel) return;
  whole_in = whole_in_features;
  in_begin = ShardRanges(Split::Along(1, parts), rank, size)[0].first;
}

}  // namespace oomb
