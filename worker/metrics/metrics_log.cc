#include "worker/metrics/metrics_log.h"

#include <unistd.h>

#include <cerrno>
#include <nlohmann/json.hpp>

#include "worker/common/status.h"

namespace oomb {

absl::StatusOr<MetricsLog> MetricsLog::Open(const Dir& dir) {
  OOMB_ASSIGN_OR_RETURN(UniqueFd fd, dir.OpenAppend(kFileName));
  return MetricsLog(std::move(fd), dir.PathOf(kFileName));
}

absl::Status MetricsLog::Append(const StepReport& r) {
  nlohmann::json line = {{"step", r.step},
                         {"loss", r.loss},
                         {"lr", r.learning_rate},
                         {"tokens", r.tokens},
                         {"seconds", r.step_seconds},
                         {"tokens_per_second", r.tokens_per_second},
                         {"peak_device_bytes", r.peak_device_bytes},
                         {"peak_host_bytes", r.host_kv_bytes},
                         {"pcie_h2d_bytes", r.pcie_h2d_bytes},
                         {"pcie_d2h_bytes", r.pcie_d2h_bytes},
                         {"swapped_bytes", r.swapped_bytes},
                         {"swapped_chunks", r.swapped_chunks}};
  if (r.eval_loss > 0)
    line.update({{"eval_loss", r.eval_loss}, {"eval_tokens", r.eval_tokens}, {"eval_samples", r.eval_samples}});
  if (r.evaluation.has_value()) line["evaluation"] = EvalReportJson(*r.evaluation);
  if (r.attention_density > 0) line["attention_density"] = r.attention_density;
  const std::string text = line.dump() + "\n";
  if (::write(fd_.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    return ErrnoStatus(errno, "write", path_);
  }
  return absl::OkStatus();
}

}  // namespace oomb
