// AdamW whose step updates every parameter of a group in one multi-tensor kernel
// (at::_fused_adamw_, what PyTorch's AdamW(fused=True) runs; on the CPU and on GPUs) instead of
// LibTorch's torch::optim::AdamW, which runs about ten kernels per parameter, each a pass over
// it (a mixture-of-experts adapter has hundreds of tensors, one pair per bank and layer). The
// state is AdamW's own (AdamWParamState: step, exp_avg, exp_avg_sq), so checkpoints,
// sharded_state.h and whatever holds a torch::optim::AdamW& see no difference. The update is
// AdamW's in the parameters' dtype with the kernel's own operation order: LibTorch's within
// float rounding (tests/worker/train/chunk_trainer_test.cc), not bit for bit. No amsgrad.
#ifndef OOMB_WORKER_TRAIN_FUSED_ADAMW_H_
#define OOMB_WORKER_TRAIN_FUSED_ADAMW_H_

#include <torch/optim/adamw.h>

#include <vector>

namespace oomb {

class FusedAdamW : public torch::optim::AdamW {
 public:
  FusedAdamW(const std::vector<torch::Tensor>& params, const torch::optim::AdamWOptions& options)
      : torch::optim::AdamW(params, options) {}
  torch::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace oomb

#endif  // OOMB_WORKER_TRAIN_FUSED_ADAMW_H_
