#include "worker/metrics/metrics_log.h"

#include <unistd.h>

#include <cerrno>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "worker/common/status.h"

namespace oomb {

absl::StatusOr<MetricsLog> MetricsLog::Open(const Dir& dir) {
  OOMB_ASSIGN_OR_RETURN(UniqueFd fd, dir.OpenAppend(kFileName));
  return MetricsLog(std::move(fd), dir.PathOf(kFileName));
}

absl::StatusOr<nlohmann::json> MetricsLog::HfTrainerState(const Dir& dir, const HfTrainerFacts& facts) {
  using nlohmann::json;
  absl::StatusOr<std::string> text = dir.ReadFile(kFileName, int64_t{1} << 30);
  if (!text.ok() && !absl::IsNotFound(text.status())) return text.status();
  std::map<int64_t, json> by_step;  // the newest line of each step
  std::istringstream lines(text.ok() ? *text : std::string());
  for (std::string line; std::getline(lines, line);) {
    json j = json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
    const int64_t step = j["step"].get<int64_t>();
    if (step >= 1 && step <= facts.global_step) by_step[step] = std::move(j);
  }
  json log = json::array();
  double total_flos = 0;  // the model FLOPs of the steps up to the checkpoint's
  for (const auto& [step, j] : by_step) {
    total_flos += j.value("model_flops", 0.0);
    log.push_back({{"step", step},
                   {"loss", j.value("loss", 0.0)},
                   {"learning_rate", j.value("lr", 0.0)},
                   {"num_input_tokens_seen", j.value("tokens", int64_t{0})}});
    json eval = {{"step", step}};
    if (j.contains("eval_loss")) eval["eval_loss"] = j["eval_loss"];
    if (j.contains("evaluation") && j["evaluation"].is_object()) {
      for (const auto& [suite, result] : j["evaluation"].items()) {
        if (result.is_object() && result.contains("accuracy")) {
          eval["eval_" + suite + "_accuracy"] = result["accuracy"];
        }
      }
    }
    if (eval.size() > 1) log.push_back(std::move(eval));
  }
  return json{{"epoch", facts.epoch},
              {"global_step", facts.global_step},
              {"max_steps", facts.max_steps},
              {"logging_steps", 1},
              {"eval_steps", facts.eval_steps},
              {"save_steps", facts.save_steps},
              {"train_batch_size", facts.train_batch_size},
              {"num_train_epochs", facts.num_train_epochs},
              {"num_input_tokens_seen", facts.num_input_tokens_seen},
              {"total_flos", total_flos},
              {"log_history", std::move(log)},
              {"best_metric", nullptr},
              {"best_global_step", nullptr},
              {"best_model_checkpoint", nullptr},
              {"is_local_process_zero", true},
              {"is_world_process_zero", true},
              {"is_hyper_param_search", false},
              {"trial_name", nullptr},
              {"trial_params", nullptr},
              {"stateful_callbacks", json::object()}};
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
                         {"swapped_chunks", r.swapped_chunks},
                         {"model_flops", r.model_flops}};
  if (r.eval_loss > 0)
    line.update({{"eval_loss", r.eval_loss}, {"eval_tokens", r.eval_tokens}, {"eval_samples", r.eval_samples}});
  if (r.evaluation.has_value()) line["evaluation"] = EvalReportJson(*r.evaluation);
  if (r.attention_density > 0) line["attention_density"] = r.attention_density;
  if (r.router_aux_loss > 0) line["router_aux_loss"] = r.router_aux_loss;
  if (r.mfu > 0) line["mfu"] = r.mfu;
  const std::string text = line.dump() + "\n";
  if (::write(fd_.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    return ErrnoStatus(errno, "write", path_);
  }
  return absl::OkStatus();
}

}  // namespace oomb
