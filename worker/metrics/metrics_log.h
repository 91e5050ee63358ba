// metrics.jsonl: one JSON object per optimizer step, appended to the file in the job's
// checkpoint directory (a resumed run continues it), written by rank 0 alone. The one writer of
// the file; its fields:
//   step, loss, lr, tokens, seconds, tokens_per_second, peak_device_bytes, peak_host_bytes,
//   pcie_h2d_bytes, pcie_d2h_bytes, swapped_bytes, swapped_chunks, model_flops (StepReport), and
//   eval_loss with eval_tokens and eval_samples / attention_density / evaluation (the
//   evaluation section's results: positions, passkey, needle) / router_aux_loss (a mixture of
//   experts trained with the router's auxiliary loss) / mfu (over the datasheet peak,
//   worker/metrics/flops.h; a device the table lists) where the step has them.
// Torch-free. Thread-safety: one writer per file.
#ifndef OOMB_WORKER_METRICS_METRICS_LOG_H_
#define OOMB_WORKER_METRICS_METRICS_LOG_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "worker/common/file_access.h"
#include "worker/metrics/step_report.h"

namespace oomb {

// What Hugging Face's TrainerState holds beside its log: the checkpoint's place and the run's
// settings.
struct HfTrainerFacts {
  int64_t global_step = 0;  // the checkpoint's step
  double epoch = 0;         // the epoch of the next sequence
  int64_t max_steps = 0;    // training.max_steps (0 when training.epochs decides)
  int64_t num_train_epochs = 0;
  int64_t train_batch_size = 1;  // training.batch_sequences
  int64_t save_steps = 0;        // checkpoint.every_steps
  int64_t eval_steps = 0;        // training.eval_every_steps
  int64_t num_input_tokens_seen = 0;
};

class MetricsLog {
 public:
  static constexpr char kFileName[] = "metrics.jsonl";

  // Hugging Face's trainer_state.json (transformers.TrainerState: TrainerState.load_from_json
  // reads it, and the tools that plot its log_history) for a checkpoint at facts.global_step,
  // from `dir`/metrics.jsonl: every step up to it (of a step a resumed run logged twice, the
  // newer line) as {"step", "loss", "learning_rate", "num_input_tokens_seen"}, and after a step
  // that evaluated, {"step", "eval_loss", "eval_<suite>_accuracy"}; total_flos the sum of those
  // steps' model_flops (oomb's count, worker/metrics/flops.h, where HF estimates 6 N T). A line
  // that is not JSON (a torn last line) is skipped; no file: an empty log. Errors: reading the
  // file.
  static absl::StatusOr<nlohmann::json> HfTrainerState(const Dir& dir, const HfTrainerFacts& facts);

  // Opens (creating) `dir`/metrics.jsonl for appending.
  static absl::StatusOr<MetricsLog> Open(const Dir& dir);

  // Appends the step's line in one write(2); errors name the file.
  absl::Status Append(const StepReport& report);

 private:
  MetricsLog(UniqueFd fd, std::string path) : fd_(std::move(fd)), path_(std::move(path)) {}

  UniqueFd fd_;
  std::string path_;
};

}  // namespace oomb

#endif  // OOMB_WORKER_METRICS_METRICS_LOG_H_
