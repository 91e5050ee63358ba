// The job executor: runs one fine-tuning job, start to finish, from the calling thread. The
// daemon (server/) owns the threads, the queue and the store; `oombd run` calls the executor
// directly. Torch-free header (see worker/CMakeLists.txt).
//
// Contract:
//   - Run() validates the spec against the filesystem (model directory, dataset), builds the
//     model and the data pipeline, and trains, calling the callbacks from the calling thread.
//   - Progress goes out through `on_step` after every optimizer step; every checkpoint written
//     (atomically, checksummed) is announced through `on_checkpoint` after it is durable.
//   - `poll_stop` is called at every chunk boundary; when it returns kCancel the run returns
//     kCancelled promptly; kPause writes a checkpoint first and returns kPaused; kPauseAtStepEnd
//     (a preemption) finishes the current step, writes its checkpoint and returns kPaused.
//   - With `resume` set, training continues from the newest valid checkpoint under
//     `checkpoint_dir` (torn or corrupt ones are skipped) and the loss sequence continues
//     exactly as an uninterrupted run would.
//   - Failures of the job itself (NaN loss, bad data found late, out of memory) come back as a
//     status with a reason in `RunResult`; Run() never throws and never aborts the process.
//   - method.type evaluate trains nothing: data.validation's loss and the evaluation section
//     run once, on the base model with method.lora.init_adapter when set, and come back as one
//     on_step report (step 0 of 0; one metrics.jsonl line); no checkpoint is written, and a
//     paused evaluation starts over when resumed.
//   - resources.gpus = k > 1: data parallel over k devices (worker/train/rank_group.h), one
//     thread per device started by Run(); each step's global batch of
//     training.batch_sequences sequences is split between them and the result is that of one
//     device with the same global batch (to float rounding). The callbacks come from the
//     thread of rank 0, which alone writes checkpoints and metrics.jsonl; a failure of any
//     rank fails the run with that rank's error.
#ifndef OOMB_WORKER_JOB_EXECUTOR_H_
#define OOMB_WORKER_JOB_EXECUTOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/common/file_access.h"
#include "worker/data/dataset.h"
#include "worker/metrics/kv_stats.h"
#include "worker/metrics/step_report.h"
#include "worker/plan/job_config.h"

namespace oomb {

struct CheckpointInfo {
  int64_t step = 0;
  std::string path;  // directory, loadable by HF / PEFT
  int64_t bytes = 0;
  bool final = false;
  double seconds = 0;  // writing it, fsyncs included
};

enum class StopRequest { kNone, kCancel, kPause, kPauseAtStepEnd };

struct RunOptions {
  // Where the job's inputs are opened (model directory, datasets): the daemon's confinement
  // (FileAccess::Create), or FileAccess::Unconfined() for a user's own run. Required.
  std::shared_ptr<const FileAccess> files;
  // The directory checkpoints and metrics.jsonl go to, opened and owned by this job
  // (ClaimCheckpointDir, worker/common/checkpoint_dir.h). Required. Partial checkpoints left in it
  // (a kill -9, a full disk) are removed when the run starts and when it fails.
  std::optional<Dir> checkpoint_dir;
  // One device per data-parallel rank ("cpu", "cuda:0"), resources.gpus of them; from the
  // scheduler. Empty: derived from the spec: resources.device for rank 0 and the next CUDA
  // devices for the other ranks (the CPU: every rank on the CPU).
  std::vector<std::string> devices;
  bool resume = false;  // continue from the newest valid checkpoint in checkpoint_dir
  // The job's spec as it runs (YAML), shown in each checkpoint's model card; empty: not shown.
  std::string spec_yaml;
  std::function<void(const StepReport&)> on_step;
  std::function<void(const CheckpointInfo&)> on_checkpoint;
  std::function<void(const std::string&)> on_warning;
  // What the run did and chose, for people (the job's LOG events): the data read, the model
  // loaded, the memory plan's choices and why, the checkpoint it resumed from. Rank 0 only.
  std::function<void(const std::string&)> on_log;
  std::function<StopRequest()> poll_stop;
  // Where the run's KV page pools publish their live page counts (for /metrics), under the
  // slot of each rank's device; null: nowhere. Must outlive the run.
  KvStatsRegistry* kv_stats = nullptr;
};

enum class RunOutcome { kSucceeded, kCancelled, kPaused };

struct RunResult {
  RunOutcome outcome = RunOutcome::kSucceeded;
  CheckpointInfo final_checkpoint;  // the last checkpoint written (final one on success)
};

// Process-wide settings runs need, made from main() before any other thread starts: LibTorch's
// c10d flight recorder off (worker/train/rank_group.h). Idempotent.
void InitExecutorProcess();

// Runs the job. Errors carry a Reason (worker/common/status.h) where the cause is known:
// INVALID_ARGUMENT (spec or data, naming the field or file:line; BAD_DATA, BAD_SPEC),
// PERMISSION_DENIED (a path refused by the confinement; PATH_DENIED), RESOURCE_EXHAUSTED (out of
// memory, OUT_OF_MEMORY; pages exhausted, DOES_NOT_FIT; a full disk, DISK_FULL), INTERNAL (NaN
// or infinite loss with the step, NAN_LOSS; LibTorch and CUDA errors, TORCH_ERROR, CUDA_ERROR).
absl::StatusOr<RunResult> RunJob(const JobConfig& job, const RunOptions& options);

// What a job's training data amounts to: the reader's summary of data.train (samples, tokens,
// dropped, truncated, length histogram) and the sequences of one epoch after packing.
struct DataSummary {
  DatasetStats train;
  int64_t sequences = 0;
};

// Reads and checks the job's datasets exactly as RunJob does (tokenizing, data.too_long),
// without loading the model: INVALID_ARGUMENT naming the field, the file and the line, as
// "data.train: /d/a.jsonl:12: invalid JSON: ...". Takes about as long as tokenizing the files;
// the daemon calls it from CreateJob for small datasets and in the VALIDATING state for the
// rest. The tokenizer is loaded only when a
// sample needs one: a model without tokenizer.json trains on pre-tokenized {"input_ids"} data
// (ids checked against config.json's vocab_size), and a text sample is then an error naming
// its line.
absl::StatusOr<DataSummary> ValidateJobData(const JobConfig& job, const FileAccess& files);

}  // namespace oomb

#endif  // OOMB_WORKER_JOB_EXECUTOR_H_
