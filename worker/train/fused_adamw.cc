#include "worker/train/fused_adamw.h"

#include <ATen/ATen.h>
#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

namespace oomb {

torch::Tensor FusedAdamW::step(LossClosure closure) {
  torch::Tensor loss;
  if (closure != nullptr) {
    const at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  const torch::NoGradGuard no_grad;
  for (torch::optim::OptimizerParamGroup& group : param_groups_) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    TORCH_CHECK(!o.amsgrad(), "FusedAdamW: amsgrad is LibTorch's AdamW's");
    // The parameters with a gradient, by device and dtype (one kernel call each), their state
    // created as LibTorch's AdamW creates it and its step advanced.
    struct Lists {
      at::TensorOptions options;
      std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
      std::vector<double> steps;
    };
    std::vector<Lists> lists;
    for (const at::Tensor& p : group.params()) {
      if (!p.grad().defined()) continue;
      TORCH_CHECK(!p.grad().is_sparse(), "FusedAdamW: sparse gradients are not supported");
      auto& slot = state_[p.unsafeGetTensorImpl()];
      if (slot == nullptr) {
        auto s = std::make_unique<torch::optim::AdamWParamState>();
        s->step(0);
        s->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
        s->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(s);
      }
      auto& s = static_cast<torch::optim::AdamWParamState&>(*slot);
      s.step(s.step() + 1);
      auto it = std::find_if(lists.begin(), lists.end(), [&](const Lists& l) {
        return l.options.device() == p.device() && l.options.dtype() == p.dtype();
      });
      if (it == lists.end()) {
        it = lists.insert(lists.end(), Lists());
        it->options = p.options();
      }
      Lists& l = *it;
      l.params.push_back(p);
      l.grads.push_back(p.grad());
      l.exp_avgs.push_back(s.exp_avg());
      l.exp_avg_sqs.push_back(s.exp_avg_sq());
      l.steps.push_back(static_cast<double>(s.step()));
    }
    for (const Lists& l : lists) {
      // The kernel reads each parameter's step count from a float32 tensor on its device.
      const at::Tensor steps = at::tensor(l.steps, at::kDouble).to(l.options.device(), at::kFloat);
      const std::vector<at::Tensor> state_steps = steps.unbind(0);
      at::_fused_adamw_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, /*max_exp_avg_sqs=*/{}, state_steps, o.lr(),
                        std::get<0>(o.betas()), std::get<1>(o.betas()), o.weight_decay(), o.eps(),
                        /*amsgrad=*/false, /*maximize=*/false);
    }
  }
  return loss;
}

}  // namespace oomb
