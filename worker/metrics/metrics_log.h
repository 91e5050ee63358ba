// metrics.jsonl: one JSON object per optimizer step, appended to the file in the job's
// checkpoint directory (a resumed run continues it), written by rank 0 alone. The one writer of
// the file; its fields:
//   step, loss, lr, tokens, seconds, tokens_per_second, peak_device_bytes, peak_host_bytes,
//   pcie_h2d_bytes, pcie_d2h_bytes, swapped_bytes, swapped_chunks (StepReport), and
//   eval_loss with eval_tokens and eval_samples / attention_density / evaluation (the
//   evaluation section's results: positions, passkey, needle) where the step has them.
// Torch-free. Thread-safety: one writer per file.
#ifndef OOMB_WORKER_METRICS_METRICS_LOG_H_
#define OOMB_WORKER_METRICS_METRICS_LOG_H_

#include <string>

#include "absl/status/statusor.h"
#include "worker/common/file_access.h"
#include "worker/metrics/step_report.h"

namespace oomb {

class MetricsLog {
 public:
  static constexpr char kFileName[] = "metrics.jsonl";

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
