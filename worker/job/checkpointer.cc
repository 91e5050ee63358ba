// A run's checkpoints: contract in worker/job/checkpointer.h.
#include "worker/job/checkpointer.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/common/status.h"
#include "worker/hf/loading_code.h"
#include "worker/hf/model_card.h"
#include "worker/hf/model_config.h"
#include "worker/job/build_info.h"
#include "worker/metrics/metrics_log.h"
#include "worker/model/transformer.h"

namespace oomb {
namespace {

constexpr int64_t kMaxBaseFileBytes = int64_t{256} << 20;

}  // namespace

absl::StatusOr<Checkpointer> Checkpointer::Open(const JobConfig& job, const Dir& model_dir, const Dir& root,
                                                std::string spec_yaml,
                                                std::function<void(const CheckpointInfo&)> on_written) {
  Checkpointer c(job, model_dir, root, std::move(spec_yaml), std::move(on_written));
  for (const char* name :
       {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"}) {
    if (!model_dir.Contains(name)) continue;
    absl::StatusOr<std::string> contents = model_dir.ReadFile(name, kMaxBaseFileBytes);
    if (!contents.ok()) return Annotate(contents.status(), "model.path");
    c.base_files_[name] = *std::move(contents);
  }
  absl::StatusOr<std::string> config = model_dir.ReadFile("config.json", kMaxBaseFileBytes);
  if (!config.ok()) return Annotate(config.status(), "model.path");
  c.base_config_json_ = *std::move(config);
  return c;
}

absl::StatusOr<CheckpointInfo> Checkpointer::Write(const Transformer& model, torch::optim::Optimizer& optimizer,
                                                   const TrainerState& state, bool final) const {
  const std::string name = final ? std::string("final") : absl::StrCat("checkpoint-", state.step);
  CheckpointWriteOptions w;
  w.base_model_path = job_->model.path;
  w.base_files = base_files_;
  // The config as trained (RoPE scaling included): full fine-tuning's config.json; beside an
  // adapter, the config to load its base with.
  OOMB_ASSIGN_OR_RETURN(std::string config,
                        EffectiveConfigJson(base_config_json_, model.config(), model_dir_.PathOf("config.json")));
  (model.has_lora() ? w.base_config_json : w.config_json) = std::move(config);
  const HfTrainerFacts facts{.global_step = state.step,
                             .epoch = static_cast<double>(state.epoch),
                             .max_steps = job_->training.max_steps,
                             .num_train_epochs = job_->training.epochs,
                             .train_batch_size = job_->training.batch_sequences,
                             .save_steps = job_->checkpoint.every_steps,
                             .eval_steps = job_->training.eval_every_steps,
                             .num_input_tokens_seen = state.tokens};
  OOMB_ASSIGN_OR_RETURN(const nlohmann::json hf_state, MetricsLog::HfTrainerState(root_, facts));
  w.hf_trainer_state_json = hf_state.dump(2) + "\n";
  w.model_card = Card(name, state, model.has_lora(), hf_state);
  const auto started = std::chrono::steady_clock::now();
  OOMB_ASSIGN_OR_RETURN(int64_t bytes, WriteCheckpoint(root_, name, model, optimizer, state, w));
  PruneCheckpoints(root_, job_->checkpoint.keep_last);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  CheckpointInfo info{state.step, root_.PathOf(name), bytes, final, seconds};
  if (on_written_) on_written_(info);
  return info;
}

std::string Checkpointer::Card(const std::string& name, const TrainerState& state, bool lora,
                               const nlohmann::json& hf_state) const {
  const JobConfig& job = *job_;
  ModelCardOptions card;
  card.title = job.display_name.empty() ? name : job.display_name;
  card.base_model = job.model.path;
  card.lora = lora;
  card.method = lora ? absl::StrCat("LoRA rank ", job.method.lora.rank, ", alpha ", job.method.lora.alpha, " on ",
                                    absl::StrJoin(job.method.lora.target_modules, ", "))
                     : "full fine-tuning";
  card.data = job.data.train;
  card.built_by = absl::StrCat("oomb (commit ", BuildGitSha(), ")");
  card.step = state.step;
  card.tokens = state.tokens;
  for (const nlohmann::json& entry : hf_state["log_history"]) {
    for (const auto& [key, value] : entry.items()) {
      if (key == "step" || key == "num_input_tokens_seen" || !value.is_number()) continue;
      auto it = std::find_if(card.metrics.begin(), card.metrics.end(), [&](const auto& m) { return m.first == key; });
      if (it == card.metrics.end()) it = card.metrics.insert(card.metrics.end(), {key, 0.0});
      it->second = value.get<double>();
    }
  }
  card.loading_code = LoadingCode({.checkpoint_path = root_.PathOf(name),
                                   .base_model_path = job.model.path,
                                   .lora = lora,
                                   .has_base_config = lora});
  card.spec_yaml = spec_yaml_;
  return ModelCard(card);
}

TrainerState Checkpointer::Resume(Transformer& model, torch::optim::Optimizer& optimizer,
                                  const std::function<void(const std::string&)>& warn) const {
  for (const std::string& name : ListCheckpointDirs(root_)) {
    absl::StatusOr<Dir> dir = root_.OpenDir(name);
    auto state = dir.ok() ? RestoreCheckpoint(*dir, model, optimizer) : dir.status();
    if (state.ok()) {
      warn(absl::StrCat("resumed from ", root_.PathOf(name), " at step ", state->step));
      return *state;
    }
    warn(absl::StrCat("skipping checkpoint ", root_.PathOf(name), ": ", state.status().message()));
  }
  warn("no valid checkpoint to resume from: starting at step 0");
  return TrainerState{};
}

}  // namespace oomb
