#include "kernels/torch/tensor_parallel.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "kernels/torch/gpu_timeline.h"

namespace oomb::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The group travels through saved_data as an address (an IValue holds no C++ object).
const Collectives& GroupOf(AutogradContext* ctx) {
  return *reinterpret_cast<const Collectives*>(ctx->saved_data["group"].toInt());
}

// The sum over the ranks (the GPU's time in it is --sections' "tensor_parallel.sum").
at::Tensor Summed(const at::Tensor& x, const Collectives& group) {
  at::Tensor out = x.contiguous().clone();
  timeline::Mark("tensor_parallel.sum");
  group.AllReduce(out, ReduceOp::kSum);
  timeline::Mark("model");
  return out;
}

class EnterShardsFn : public torch::autograd::Function<EnterShardsFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const Collectives* group) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {Summed(grads[0], GroupOf(ctx)), at::Tensor()};
  }
};

class SumShardsFn : public torch::autograd::Function<SumShardsFn> {
 public:
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, const Collectives* group) {
    return Summed(x, *group);
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0], at::Tensor()}; }
};

// The sums one OverlapShards started and has not waited for yet: forward, its blocks' outputs';
// backward, its blocks' input gradients, waited for where the blocks join (SplitRowsFn).
struct PendingSums : torch::CustomClassHolder {
  std::vector<std::unique_ptr<Collectives::Pending>> started;
  void WaitAll() {
    timeline::Mark("tensor_parallel.sum");
    for (auto& p : started) p->Wait();
    started.clear();
    timeline::Mark("model");
  }
};

PendingSums& PendingOf(AutogradContext* ctx) {
  return *c10::static_intrusive_pointer_cast<PendingSums>(ctx->saved_data["pending"].toCapsule());
}

// The blocks of rows of x; backward waits for the sums the blocks' EnterRowsFn started, then
// joins their gradients.
class SplitRowsFn : public torch::autograd::Function<SplitRowsFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, int64_t block_rows,
                               const c10::intrusive_ptr<PendingSums>& pending) {
    ctx->saved_data["pending"] = c10::IValue::make_capsule(pending);
    ctx->saved_data["rows"] = x.size(0);
    ctx->saved_data["block_rows"] = block_rows;
    return x.split(block_rows);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    PendingOf(ctx).WaitAll();
    const int64_t rows = ctx->saved_data["rows"].toInt(), block_rows = ctx->saved_data["block_rows"].toInt();
    const auto used = std::find_if(grads.begin(), grads.end(), [](const at::Tensor& g) { return g.defined(); });
    if (used == grads.end()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    for (size_t i = 0; i < grads.size(); ++i) {  // a block nothing downstream used: zeros
      if (grads[i].defined()) continue;
      std::vector<int64_t> shape = used->sizes().vec();
      shape[0] = std::min(block_rows, rows - static_cast<int64_t>(i) * block_rows);
      grads[i] = at::zeros(shape, used->options());
    }
    return {at::cat(grads, 0), at::Tensor(), at::Tensor()};
  }
};

// EnterShards for one block, its backward's sum started and left to SplitRowsFn to wait for.
class EnterRowsFn : public torch::autograd::Function<EnterRowsFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const Collectives* group,
                            const c10::intrusive_ptr<PendingSums>& pending) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    ctx->saved_data["pending"] = c10::IValue::make_capsule(pending);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor g = grads[0].contiguous().clone();
    PendingOf(ctx).started.push_back(GroupOf(ctx).StartSum(g));
    return {g, at::Tensor(), at::Tensor()};
  }
};

// SumShards for one block, its sum started and left to OverlapShards to wait for.
class SumRowsFn : public torch::autograd::Function<SumRowsFn> {
 public:
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, const Collectives* group, PendingSums* pending) {
    at::Tensor out = x.contiguous().clone();
    pending->started.push_back(group->StartSum(out));
    return out;
  }
  static variable_list backward(AutogradContext*, variable_list grads) {
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};

}  // namespace

std::vector<at::Tensor> OverlapShards(const at::Tensor& x, const Collectives& group, int64_t blocks, bool enter,
                                      bool sum, const std::function<std::vector<at::Tensor>(const at::Tensor&)>& fn) {
  const int64_t rows = x.size(0);
  blocks = std::min(blocks, rows);
  if (group.size() == 1 || blocks <= 1) {
    std::vector<at::Tensor> out = fn(enter ? EnterShards(x, group) : x);
    if (sum) {
      for (at::Tensor& t : out) t = SumShards(t, group);
    }
    return out;
  }
  const int64_t block_rows = (rows + blocks - 1) / blocks;
  const auto backward_sums = c10::make_intrusive<PendingSums>();
  const std::vector<at::Tensor> inputs = enter ? SplitRowsFn::apply(x, block_rows, backward_sums) : x.split(block_rows);
  PendingSums forward_sums;
  std::vector<std::vector<at::Tensor>> outputs;  // [output][block]
  for (const at::Tensor& input : inputs) {
    std::vector<at::Tensor> out = fn(enter ? EnterRowsFn::apply(input, &group, backward_sums) : input);
    if (outputs.empty()) outputs.resize(out.size());
    for (size_t i = 0; i < out.size(); ++i) {
      outputs[i].push_back(sum ? SumRowsFn::apply(out[i], &group, &forward_sums) : out[i]);
    }
  }
  forward_sums.WaitAll();
  std::vector<at::Tensor> joined;
  for (const auto& blocks_of_output : outputs) joined.push_back(at::cat(blocks_of_output, 0));
  return joined;
}

at::Tensor EnterShards(const at::Tensor& x, const Collectives& group) {
  if (group.size() == 1) return x;
  return EnterShardsFn::apply(x, &group);
}

at::Tensor SumShards(const at::Tensor& x, const Collectives& group) {
  if (group.size() == 1) return x;
  return SumShardsFn::apply(x, &group);
}

}  // namespace oomb::kernels
