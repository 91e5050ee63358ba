// Checkpoints of tensor parallelism: what the ranks of a sharded model (Transformer::Shard)
// write and resume from is the whole training state — the trainable parameters and AdamW's
// state, gathered — so a checkpoint is the one a single device writes (PEFT's or HF's layout,
// optimizer.pt over the whole parameters) and resumes at any other parallel degree.
#ifndef OOMB_WORKER_TRAIN_SHARDED_STATE_H_
#define OOMB_WORKER_TRAIN_SHARDED_STATE_H_

#include <torch/optim/adamw.h>

#include <memory>

#include "worker/model/transformer.h"

namespace oomb {

struct WholeTraining {
  std::unique_ptr<Transformer> model;              // the trainable parameters whole (Whole(true))
  std::unique_ptr<torch::optim::AdamW> optimizer;  // over them, with the ranks' state gathered
};

// The whole training state of a sharded `model` trained by `optimizer` (over its
// TrainableParameters, in order). Every rank of the model's group calls it: it gathers.
WholeTraining GatherTraining(const Transformer& model, torch::optim::AdamW& optimizer);

// Copies this rank's share of `whole` (the parameters and the optimizer state) into `model` and
// `optimizer`: GatherTraining's inverse, at the model's own degree whatever wrote `whole`.
void ShardTraining(const WholeTraining& whole, Transformer& model, torch::optim::AdamW& optimizer);

}  // namespace oomb

#endif  // OOMB_WORKER_TRAIN_SHARDED_STATE_H_
