#include "kernels/torch/chunked_cross_entropy.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "kernels/torch/gpu_timeline.h"
#include "kernels/torch/layer_ops.h"
#include "kernels/torch/matmul.h"
#include "kernels/torch/upload.h"

namespace oomb::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::ScalarType ComputeType(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// Whether each block of rows_per_block rows has a label, from the labels on the CPU (a copy of
// device labels waits for the device); each label checked to be kIgnoreIndex or in [0, vocab).
std::vector<bool> BlocksWithLabels(const at::Tensor& labels_cpu, int64_t rows_per_block, int64_t vocab) {
  const at::Tensor l = labels_cpu.contiguous();
  const int64_t* x = l.data_ptr<int64_t>();
  for (int64_t i = 0; i < l.size(0); ++i) {
    TORCH_CHECK(x[i] == kIgnoreIndex || (x[i] >= 0 && x[i] < vocab), "labels: row ", i, " holds ", x[i],
                ", outside the vocabulary [0, ", vocab, ") and not the ignore index ", kIgnoreIndex);
  }
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

// A block of a vocabulary-parallel LM head (chunked_cross_entropy.h): the rows' losses over the
// whole vocabulary from this rank's logits [B, rows of its shard] (in dtype) and the labels;
// with write_grad, the logits become this rank's columns of the loss's gradient, as
// CrossEntropyRows writes them.
struct ShardedBlock {
  at::Tensor loss;  // [B] in the compute type
  at::Tensor max;   // [B] the largest logit of each row over the whole vocabulary
  at::Tensor x;     // the logits in the compute type
};

ShardedBlock CombineShards(at::Tensor& logits, const at::Tensor& labels, const VocabShard& shard, bool write_grad) {
  const at::ScalarType ct = ComputeType(logits.scalar_type());
  const int64_t rows = logits.size(1);
  ShardedBlock b;
  b.x = logits.to(ct);
  const at::Tensor valid = labels.ne(kIgnoreIndex), local = labels - shard.begin;
  const at::Tensor own = valid & local.ge(0) & local.lt(rows);
  const at::Tensor index = local.clamp(0, rows - 1).unsqueeze(1);
  b.max = std::get<0>(b.x.max(-1));
  timeline::Mark("tensor_parallel.vocab");
  shard.group->AllReduce(b.max, ReduceOp::kMax);
  timeline::Mark("model");
  const at::Tensor target = at::where(own, b.x.gather(1, index).squeeze(1), at::zeros({}, b.x.options()));
  at::Tensor sums = at::stack({(b.x - b.max.unsqueeze(1)).exp().sum(-1), target});  // [2, B]
  timeline::Mark("tensor_parallel.vocab");
  shard.group->AllReduce(sums, ReduceOp::kSum);
  timeline::Mark("model");
  const at::Tensor lse = b.max + sums[0].log();
  b.loss = (lse - sums[1]) * valid.to(ct);
  if (write_grad) {
    at::Tensor g = (b.x - lse.unsqueeze(1)).exp();
    g.scatter_add_(1, index, -own.to(ct).unsqueeze(1));
    logits.copy_(g.mul_(valid.to(ct).unsqueeze(1)));
  }
  return b;
}

class ChunkedCrossEntropyFn : public torch::autograd::Function<ChunkedCrossEntropyFn> {
 public:
  // grads: whether autograd records this call (grad mode, outside forward, was on).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                            const at::Tensor& labels, int64_t rows_per_block, bool grads, const VocabShard* shard) {
    CheckInputs(hidden, weight, labels, rows_per_block);
    const at::ScalarType ct = ComputeType(hidden.scalar_type());
    const at::Tensor w = weight.to(hidden.scalar_type());
    const int64_t vocab = shard != nullptr ? shard->vocab : weight.size(0);
    const std::vector<bool> labelled = BlocksWithLabels(labels.cpu(), rows_per_block, vocab);
    const at::Tensor labels_on_device = Upload(labels, hidden.device());
    const bool want_hidden = grads && hidden.requires_grad(), want_weight = grads && weight.requires_grad();
    // The loss's gradients for an incoming gradient of 1; unlabelled blocks keep their zeros.
    at::Tensor dhidden = want_hidden ? at::zeros(hidden.sizes(), hidden.options()) : at::Tensor();
    at::Tensor dweight = want_weight ? at::zeros(weight.sizes(), weight.options().dtype(ct)) : at::Tensor();
    at::Tensor total = at::zeros({}, hidden.options().dtype(ct));
    for (int64_t r0 = 0; r0 < hidden.size(0); r0 += rows_per_block) {
      const int64_t r1 = std::min(hidden.size(0), r0 + rows_per_block);
      if (!labelled[r0 / rows_per_block]) continue;
      const at::Tensor h = hidden.slice(0, r0, r1);
      at::Tensor logits = Matmul(h, w.t());  // [B, vocab]; then the loss's gradient
      const at::Tensor block_labels = labels_on_device.slice(0, r0, r1);
      const bool write_grad = want_hidden || want_weight;
      total.add_(shard != nullptr ? CombineShards(logits, block_labels, *shard, write_grad).loss.sum()
                                  : CrossEntropyRows(logits, block_labels, write_grad).sum());
      if (want_hidden) {
        at::Tensor rows = dhidden.slice(0, r0, r1);
        MatmulOut(rows, logits, w);
      }
      if (want_weight) dweight.add_(Matmul(logits.t(), h));
    }
    // Each rank's rows' share of hidden's gradient, summed once.
    if (want_hidden && shard != nullptr) {
      timeline::Mark("tensor_parallel.vocab");
      shard->group->AllReduce(dhidden, ReduceOp::kSum);
      timeline::Mark("model");
    }
    ctx->save_for_backward({dhidden, dweight});
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    return total.to(hidden.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &dhidden = saved[0], &dweight = saved[1];
    const at::Tensor& g = grad_outputs[0];  // float32 (float64): applied before any rounding to dtype
    const auto scaled = [&](const at::Tensor& d, at::ScalarType dtype) {
      return d.defined() ? (d.to(g.scalar_type()) * g).to(dtype) : at::Tensor();
    };
    const auto weight_dtype = static_cast<at::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    return {scaled(dhidden, dhidden.scalar_type()),
            scaled(dweight, weight_dtype),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor ChunkedLmHeadCrossEntropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                                     int64_t rows_per_block, const VocabShard* shard) {
  return ChunkedCrossEntropyFn::apply(hidden, weight, labels, rows_per_block, at::GradMode::is_enabled(), shard);
}

std::pair<at::Tensor, at::Tensor> LmHeadTokenScores(const at::Tensor& hidden, const at::Tensor& weight,
                                                    const at::Tensor& labels, int64_t rows_per_block,
                                                    const VocabShard* shard) {
  CheckInputs(hidden, weight, labels, rows_per_block);
  at::NoGradGuard no_grad;
  const at::ScalarType ct = ComputeType(hidden.scalar_type());
  const at::Tensor w = weight.to(hidden.scalar_type());
  const int64_t vocab = shard != nullptr ? shard->vocab : weight.size(0);
  const std::vector<bool> labelled = BlocksWithLabels(labels.cpu(), rows_per_block, vocab);
  const at::Tensor lab_all = Upload(labels, hidden.device());
  at::Tensor loss = at::zeros({hidden.size(0)}, hidden.options().dtype(ct));
  at::Tensor hit = at::zeros({hidden.size(0)}, hidden.options().dtype(at::kBool));
  for (int64_t r0 = 0; r0 < hidden.size(0); r0 += rows_per_block) {
    const int64_t r1 = std::min(hidden.size(0), r0 + rows_per_block);
    if (!labelled[r0 / rows_per_block]) continue;
    const at::Tensor lab = lab_all.slice(0, r0, r1);
    at::Tensor logits = Matmul(hidden.slice(0, r0, r1), w.t());  // [B, vocab]
    if (shard == nullptr) {
      loss.slice(0, r0, r1).copy_(CrossEntropyRows(logits, lab, /*write_grad=*/false));
      hit.slice(0, r0, r1).copy_(logits.argmax(-1).eq(lab) & lab.ne(kIgnoreIndex));
      continue;
    }
    const ShardedBlock b = CombineShards(logits, lab, *shard, /*write_grad=*/false);
    loss.slice(0, r0, r1).copy_(b.loss);
    // The first index of the largest logit over the whole vocabulary, as argmax gives it.
    const auto [local_max, local_argmax] = b.x.max(-1);
    at::Tensor first = at::where(local_max.eq(b.max), local_argmax + shard->begin,
                                 at::full({}, std::numeric_limits<int64_t>::max(), local_argmax.options()));
    shard->group->AllReduce(first, ReduceOp::kMin);
    hit.slice(0, r0, r1).copy_(first.eq(lab) & lab.ne(kIgnoreIndex));
  }
  return {loss, hit};
}

}  // namespace oomb::kernels
