// A run's checkpoints (worker/job/executor.h): the base model's files each one carries, read
// when the run starts; writing one (atomically, checksummed, the older ones pruned to
// checkpoint.keep_last) with Hugging Face's trainer_state.json made from the run's
// metrics.jsonl and a model card (worker/hf/model_card.h), and announcing it; resuming from the
// newest valid one.
#ifndef OOMB_WORKER_JOB_CHECKPOINTER_H_
#define OOMB_WORKER_JOB_CHECKPOINTER_H_

#include <functional>
#include <map>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "worker/common/file_access.h"
#include "worker/job/executor.h"
#include "worker/plan/job_config.h"
#include "worker/train/checkpoint.h"

namespace oomb {

class Checkpointer {
 public:
  // Reads the base model's tokenizer files and config.json from `model_dir` now: a file that
  // cannot be read fails the job before any training (errors name model.path). `spec_yaml`: the
  // job's spec shown in the model card (RunOptions::spec_yaml).
  static absl::StatusOr<Checkpointer> Open(const JobConfig& job, const Dir& model_dir, const Dir& root,
                                           std::string spec_yaml,
                                           std::function<void(const CheckpointInfo&)> on_written);

  // "checkpoint-<step>" or "final" under the root, with the config as trained; announced once
  // durable.
  absl::StatusOr<CheckpointInfo> Write(const Transformer& model, torch::optim::Optimizer& optimizer,
                                       const TrainerState& state, bool final) const;
  // The state of the newest checkpoint that restores into `model` and `optimizer` (torn or
  // corrupt ones skipped, each said through `warn`); step 0 when none does.
  TrainerState Resume(Transformer& model, torch::optim::Optimizer& optimizer,
                      const std::function<void(const std::string&)>& warn) const;

 private:
  Checkpointer(const JobConfig& job, Dir model_dir, Dir root, std::string spec_yaml,
               std::function<void(const CheckpointInfo&)> on_written)
      : job_(&job),
        model_dir_(std::move(model_dir)),
        root_(std::move(root)),
        spec_yaml_(std::move(spec_yaml)),
        on_written_(std::move(on_written)) {}

  // The model card of checkpoint `name` at `state`, its metrics the newest of `hf_state`'s log.
  std::string Card(const std::string& name, const TrainerState& state, bool lora, const nlohmann::json& hf_state) const;

  const JobConfig* job_;
  Dir model_dir_, root_;
  std::string spec_yaml_;
  std::function<void(const CheckpointInfo&)> on_written_;
  std::map<std::string, std::string> base_files_;  // copied into every checkpoint
  std::string base_config_json_;                   // the base model's config.json
};

}  // namespace oomb

#endif  // OOMB_WORKER_JOB_CHECKPOINTER_H_
