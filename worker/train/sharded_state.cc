#include "worker/train/sharded_state.h"

#include <utility>
#include <vector>

namespace oomb {
namespace {

std::vector<at::Tensor> Trainable(const Transformer& model) {
  std::vector<at::Tensor> out;
  for (auto& [name, p] : model.TrainableParameters()) out.push_back(p);
  return out;
}

// `state` with each tensor mapped by `f`.
template <typename F>
std::unique_ptr<torch::optim::AdamWParamState> MapState(const torch::optim::AdamWParamState& state, F f) {
  auto out = std::make_unique<torch::optim::AdamWParamState>();
  out->step(state.step());
  out->exp_avg(f(state.exp_avg()));
  out->exp_avg_sq(f(state.exp_avg_sq()));
  if (state.max_exp_avg_sq().defined()) out->max_exp_avg_sq(f(state.max_exp_avg_sq()));
  return out;
}

}  // namespace

WholeTraining GatherTraining(const Transformer& model, torch::optim::AdamW& optimizer) {
  WholeTraining whole;
  whole.model = model.Whole(/*trainable_only=*/true);
  const std::vector<at::Tensor> shards = Trainable(model), params = Trainable(*whole.model);
  const auto& options = static_cast<const torch::optim::AdamWOptions&>(optimizer.param_groups()[0].options());
  whole.optimizer = std::make_unique<torch::optim::AdamW>(params, options);
  for (size_t i = 0; i < shards.size(); ++i) {
    const auto it = optimizer.state().find(shards[i].unsafeGetTensorImpl());
    if (it == optimizer.state().end()) continue;  // before the first step: on every rank alike
    const Split split = model.SplitOf(shards[i]);
    const auto gather = [&](const at::Tensor& t) {
      return model.tensor_parallel() == nullptr ? t.clone() : GatherWhole(t, split, *model.tensor_parallel());
    };
    whole.optimizer->state()[params[i].unsafeGetTensorImpl()] =
        MapState(static_cast<const torch::optim::AdamWParamState&>(*it->second), gather);
  }
  return whole;
}

void ShardTraining(const WholeTraining& whole, Transformer& model, torch::optim::AdamW& optimizer) {
  const std::vector<at::Tensor> shards = Trainable(model), params = Trainable(*whole.model);
  TORCH_CHECK(shards.size() == params.size(), "ShardTraining: ", params.size(), " whole parameters for ",
              shards.size());
  const int rank = model.tensor_parallel_rank(), size = model.tensor_parallel_size();
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < shards.size(); ++i) {
    const Split split = model.SplitOf(shards[i]);
    const auto take = [&](const at::Tensor& t) { return TakeShard(t, split, rank, size).to(shards[i].device()); };
    shards[i].copy_(take(params[i]));
    const auto it = whole.optimizer->state().find(params[i].unsafeGetTensorImpl());
    if (it == whole.optimizer->state().end()) {
      optimizer.state().erase(shards[i].unsafeGetTensorImpl());
      continue;
    }
    optimizer.state()[shards[i].unsafeGetTensorImpl()] =
        MapState(static_cast<const torch::optim::AdamWParamState&>(*it->second), take);
  }
}

}  // namespace oomb
