// Checkpoints: what a job writes so that Hugging Face / PEFT can load its result and so that
// training resumes exactly where it stopped.
//
// A checkpoint is a directory `<root>/checkpoint-<step>` (the last one of a finished job is
// `<root>/final`) holding:
//   adapter_model.safetensors + adapter_config.json   (LoRA; PEFT's layout), or
//   model.safetensors + config.json                   (full fine-tuning; HF's layout)
//   tokenizer.json, tokenizer_config.json, ...        copied from the base model
//   optimizer.pt                                      AdamW state (LibTorch serialization)
//   oomb_state.json                                   step, epoch, data position, tokens (resume)
//   trainer_state.json                                Hugging Face's TrainerState: the loss log
//   README.md                                         the model card
//   oomb_checkpoint.json                              the manifest: every file's size and CRC-32
// It is written into `<name>.tmp-<pid>`, every file fsync'ed, then renamed into place and the
// parent fsync'ed: a crash leaves either the previous set of checkpoints or the new one. On
// resume the manifest is verified; a torn or corrupted checkpoint is skipped with a warning
// and the previous one is used.
#ifndef OOMB_WORKER_TRAIN_CHECKPOINT_H_
#define OOMB_WORKER_TRAIN_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/common/file_access.h"
#include "worker/model/transformer.h"

namespace torch::optim {
class Optimizer;
}

namespace oomb {

struct TrainerState {
  int64_t step = 0;    // optimizer steps completed
  int64_t epoch = 0;   // epoch of the next sequence
  int64_t cursor = 0;  // index of the next sequence within the epoch's order
  int64_t tokens = 0;  // tokens trained so far
  double loss = 0;     // loss of the last step
};

struct CheckpointWriteOptions {
  std::string base_model_path;  // adapter_config.json's base_model_name_or_path
  std::string config_json;      // full fine-tuning: config.json to write
  // LoRA: base_config.json, the config to load the base model with for the adapter (the RoPE
  // scaling it was trained with); empty: none.
  std::string base_config_json;
  // Files copied from the base model (tokenizer.json, tokenizer_config.json, ...): name ->
  // contents, read once when the job started.
  std::map<std::string, std::string> base_files;
  // trainer_state.json's contents, in Hugging Face's schema (MetricsLog::HfTrainerState); empty:
  // none.
  std::string hf_trainer_state_json;
  std::string model_card;  // README.md (worker/hf/model_card.h); empty: none
};

// Writes the checkpoint `name` ("checkpoint-<step>" or "final") in `root` atomically (see
// above), every file with the checkpoint's own mode (0644 in a directory the job owns).
// Returns its size in bytes. Errors: those of the filesystem (RESOURCE_EXHAUSTED with reason
// DISK_FULL for a full disk); the partial directory is removed.
absl::StatusOr<int64_t> WriteCheckpoint(const Dir& root, const std::string& name, const Transformer& model,
                                        torch::optim::Optimizer& optimizer, const TrainerState& state,
                                        const CheckpointWriteOptions& options);

// Verifies the manifest of `dir`: every listed file exists with its size and CRC-32.
absl::Status VerifyCheckpoint(const Dir& dir);

// The names of the checkpoint directories in `root` (checkpoint-<step> and final), newest step
// first.
std::vector<std::string> ListCheckpointDirs(const Dir& root);

// Loads trainable weights, optimizer state and trainer state from a verified checkpoint (the
// state from oomb_state.json, or from trainer_state.json in a checkpoint written before
// oomb_state.json existed, which kept the same keys there).
absl::StatusOr<TrainerState> RestoreCheckpoint(const Dir& dir, Transformer& model, torch::optim::Optimizer& optimizer);

// Removes checkpoint-<step> directories beyond the newest `keep_last` (never `final`).
void PruneCheckpoints(const Dir& root, int64_t keep_last);

// Removes what interrupted writes left in `root`: "<name>.tmp-<pid>" directories and
// ".<file>.tmp-<pid>-<n>" files of a kill -9 or a full disk. Called when a run starts (recovery) and when it fails.
absl::Status RemovePartialCheckpoints(const Dir& root);

}  // namespace oomb

#endif  // OOMB_WORKER_TRAIN_CHECKPOINT_H_
