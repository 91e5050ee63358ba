// A model in training on one device: the memory plan for the job's longest sequence, the page
// pools placed by it, the chunk-recurrent trainer over them (worker/train/chunk_trainer.h) and
// AdamW, driven one optimizer step at a time, each reported as a StepReport. The executor
// (worker/job/executor.h), bench_train and the tests train through it; the run around the steps
// (data, epochs, checkpoints, evaluation schedule, stops) is the executor's.
//
// Data parallel: the ranks' sessions meet at the points StepSync names, in the same order on
// every rank, so a failure or a stop on one rank is seen by all at the same point.
//
// Thread-safety: one session per training thread.
#ifndef OOMB_WORKER_SESSION_TRAINING_SESSION_H_
#define OOMB_WORKER_SESSION_TRAINING_SESSION_H_

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/sequence.h"
#include "worker/kv/kv_pools.h"
#include "worker/metrics/kv_stats.h"
#include "worker/metrics/step_report.h"
#include "worker/model/transformer.h"
#include "worker/plan/job_config.h"
#include "worker/plan/memory_planner.h"
#include "worker/train/chunk_trainer.h"

namespace oomb {

// The ranks of a data-parallel run as a step sees them. The default is one device: every
// sequence is this rank's, and there is no one to agree with.
class StepSync {
 public:
  virtual ~StepSync() = default;
  // The ranks' count, and whether this rank trains sequence `index` of a batch.
  virtual int world() const { return 1; }
  virtual bool Owns(int64_t index) const { return true; }
  // Every rank learns, at the same point, whether any rank failed or was asked to stop; `sums`
  // (optional) are summed over the ranks in place. Returns this rank's error, or ABORTED with
  // reason PEER_FAILED when only another rank failed.
  virtual absl::Status Agree(const absl::Status& mine, std::vector<double>* sums) { return mine; }
  virtual absl::Status AllReduceGradients(const std::vector<at::Tensor>& params) { return absl::OkStatus(); }
  // Whether a stop was asked (after Agree: the same answer on every rank).
  virtual bool stopping() const { return false; }
};

// The dtype a job's model is loaded in (model.dtype).
at::ScalarType ModelScalarType(const JobConfig& job);

// What `job` trains in `model`: every base weight (method.type full), or LoRA adapters as
// method.lora sets them, initialised like PEFT from training.seed (lora; evaluate: nothing).
// An adapter to start from (method.lora.init_adapter) is the caller's to load.
absl::Status PrepareTraining(Transformer& model, const JobConfig& job);

struct SessionOptions {
  at::Device device = at::kCPU;
  // The machine the memory plan places the pages on: the device's and the host's memory
  // (worker/job/build_info.h, ThisMachine).
  PlanTarget machine;
  // The pools hold a sequence of this many tokens (the job's longest, training or validation).
  int64_t longest_sequence = 0;
  // Where the pools publish their live page counts and transfers (for /metrics), under `slot`;
  // null: nowhere. Must outlive the session.
  KvStatsRegistry* kv_stats = nullptr;
  std::string kv_stats_slot;
  // Asked at every chunk boundary; true stops the sequence (then the step returns CANCELLED
  // once the ranks agree).
  std::function<bool()> should_stop;
  StepSync* sync = nullptr;  // null: one device
  // The reliability tests' failpoint: a real c10::OutOfMemoryError at the start of this step
  // (1-based; 0: never), as an exhausted allocator would throw it.
  int64_t oom_at_step = 0;
  kernels::GpuAttentionKernel attention_kernel = kernels::GpuAttentionKernel::kCudnn;
};

class TrainingSession {
 public:
  // `model` (not owned; it must outlive the session) with its trainable parameters chosen
  // (LoRA added, or full fine-tuning enabled). Plans the job's memory on options.machine, makes
  // the pools (host slabs are pinned by their own threads from now on) and AdamW from
  // spec.training. RESOURCE_EXHAUSTED when the pools cannot be allocated; a plan that does not
  // fit is not refused here (admission, CreateJob, refuses such jobs before they run).
  static absl::StatusOr<std::unique_ptr<TrainingSession>> Create(Transformer* model, const JobConfig& job,
                                                                 SessionOptions options);

  // One optimizer step, number `step` (1-based), over the global batch at learning rate `lr`:
  // this rank's sequences forward and backward (gradients of the batch's mean loss), the loss
  // and statistics summed over the ranks, gradients all-reduced and clipped to
  // training.max_grad_norm, AdamW. Errors: CANCELLED when a stop was asked before the optimizer
  // step (nothing applied, gradients cleared); INTERNAL with reason NAN_LOSS for a loss that is
  // not finite; the trainer's errors (worker/train/chunk_trainer.h) and the other ranks'.
  absl::StatusOr<StepReport> Step(const std::vector<TokenSequence>& batch, int64_t step, double lr);

  // Where the gradients of this session's first step reached, all ranks' (Transformer::Reach,
  // measured once, after the all-reduce); empty before that step.
  const std::optional<GradientReach>& first_step_reach() const { return first_step_reach_; }

  // The mean loss over `sequences` (each rank its share), without gradients; 0 when a stop was
  // asked meanwhile.
  absl::StatusOr<double> Evaluate(const std::vector<TokenSequence>& sequences);

  // The seed of sequence `index` of step `step`'s batch: its LoRA dropout masks and SpaCO draws
  // (ChunkTrainer::KeepChunk).
  uint64_t DropoutSeed(int64_t step, size_t index) const;

  Transformer& model() const { return *model_; }
  torch::optim::AdamW& optimizer() const { return *optimizer_; }
  const MemoryPlan& plan() const { return plan_; }
  const OwnedKvPools& pools() const { return pools_; }
  ChunkTrainer& trainer() const { return *trainer_; }

 private:
  TrainingSession(Transformer* model, const JobConfig& job, SessionOptions options);
  absl::Status Init();
  // Publishes the pools' page counts and the copy engine's transfers to options_.kv_stats.
  void AttachKvStats();
  // This rank's sequences of the batch, gradients accumulated into `report` and `sums`
  // (loss, selected pages, past pages, attended pairs, kept tokens).
  absl::Status TrainLocal(const std::vector<TokenSequence>& batch, int64_t step, double loss_scale,
                          std::vector<double>* sums, StepReport* report, TrainerMemory* peak);
  // Clips and applies the gradients.
  absl::Status ApplyGradients(double lr);
  // training.max_grad_norm over the whole model's gradient: under tensor parallelism a split
  // parameter's squares summed over the group, a replicated one's counted once.
  void ClipGradients(double max_norm);
  // Under tensor parallelism the ranks of a group train the same sequences: what the sums count
  // once per sequence (the losses, the kept tokens) is counted by the group's rank 0 alone.
  void CountOncePerGroup(std::vector<double>* sums, std::initializer_list<size_t> fields) const;
  // The step's measured numbers, from what the ranks summed.
  void Measure(const std::vector<TokenSequence>& batch, const std::vector<double>& sums, const TrainerMemory& peak,
               double seconds, StepReport* report) const;

  Transformer* model_;
  JobConfig job_;  // memory.chunk_tokens auto resolved by the plan (Init)
  SessionOptions options_;
  StepSync one_device_;
  StepSync* sync_;
  std::vector<at::Tensor> params_;  // the trainable parameters, in the optimizer's order
  std::vector<bool> split_params_;  // tensor parallelism: whether params_[i] is split (Split::kSharded)
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  MemoryPlan plan_;
  OwnedKvPools pools_;
  std::unique_ptr<ChunkTrainer> trainer_;
  double peak_flops_ = 0;  // the device's datasheet peak, for MFU; 0: unknown
  std::optional<GradientReach> first_step_reach_;
};

}  // namespace oomb

#endif  // OOMB_WORKER_SESSION_TRAINING_SESSION_H_
