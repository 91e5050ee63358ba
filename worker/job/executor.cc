// The job executor: data, model, the training session's steps, schedules, checkpoints and
// progress, for one job on its ranks. Contract: worker/job/executor.h.
#include "worker/job/executor.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "worker/common/status.h"
#include "worker/data/dataset.h"
#include "worker/hf/chat_template.h"
#include "worker/hf/tokenizer.h"
#include "worker/job/build_info.h"
#include "worker/job/device.h"
#include "worker/job/eval_suites.h"
#include "worker/metrics/metrics_log.h"
#include "worker/model/transformer.h"
#include "worker/plan/lr_schedule.h"
#include "worker/session/training_session.h"
#include "worker/train/checkpoint.h"
#include "worker/train/data_parallel.h"
#include "worker/train/torch_status.h"

namespace oomb {
namespace {

using Clock = std::chrono::steady_clock;

// The devices of the run's ranks: RunOptions::devices, or derived from the spec (see
// executor.h). All CPU or all distinct CUDA devices.
absl::StatusOr<std::vector<at::Device>> ResolveDevices(const JobConfig& spec, const std::vector<std::string>& given) {
  const auto k = static_cast<size_t>(spec.resources.gpus);
  std::vector<at::Device> devices;
  if (!given.empty()) {
    if (given.size() != k) {
      return absl::InvalidArgumentError(
          absl::StrCat("resources.gpus: ", k, " but the run was given ", given.size(), " devices"));
    }
    for (const std::string& d : given) {
      OOMB_ASSIGN_OR_RETURN(at::Device device, ResolveDevice(d, "resources.device"));
      devices.push_back(device);
    }
  } else {
    OOMB_ASSIGN_OR_RETURN(at::Device first, ResolveDevice(spec.resources.device, "resources.device"));
    for (size_t r = 0; r < k; ++r) {
      devices.push_back(first.is_cpu() ? first
                                       : at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(first.index() + r)));
    }
    if (first.is_cuda() && first.index() + static_cast<int64_t>(k) > torch::cuda::device_count()) {
      return absl::FailedPreconditionError(absl::StrCat("resources.gpus: ", k, " from ", first.str(), " but only ",
                                                        torch::cuda::device_count(), " CUDA devices"));
    }
  }
  for (size_t r = 1; r < devices.size(); ++r) {
    if (devices[r].type() != devices[0].type()) {
      return absl::InvalidArgumentError("resources.gpus: the ranks' devices must all be CUDA or all the CPU");
    }
    for (size_t q = 0; devices[r].is_cuda() && q < r; ++q) {
      if (devices[q] == devices[r]) {
        return absl::InvalidArgumentError(absl::StrCat("resources.gpus: device ", devices[r].str(), " given twice"));
      }
    }
  }
  return devices;
}

// One rank of a run: which, of how many, and what the ranks of a data-parallel run share.
struct Rank {
  int index = 0;
  int world = 1;
  const Rendezvous* rendezvous = nullptr;  // world > 1
  std::atomic<int>* stop = nullptr;        // world > 1: rank 0's StopRequest, read by the others
};

// Failpoints for the reliability tests (RELIABILITY.md): only when the process runs with
// OOMB_FAILPOINTS=1, a job labelled `failpoint: oom-at-step-N` gets a real
// c10::OutOfMemoryError at the start of step N (SessionOptions::oom_at_step).
int64_t OomFailpointStep(const JobConfig& spec) {
  const char* enabled = std::getenv("OOMB_FAILPOINTS");
  if (enabled == nullptr || std::string(enabled) != "1") return 0;
  auto it = spec.labels.find("failpoint");
  int64_t step = 0;
  if (it == spec.labels.end() || !absl::SimpleAtoi(absl::StripPrefix(it->second, "oom-at-step-"), &step)) return 0;
  return step;
}

// The datasets of a job, read and checked, with the model directory and the tokenizer that
// read them (null when every sample was pre-tokenized).
struct JobData {
  std::optional<Dir> model_dir;
  std::unique_ptr<Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat;
  std::vector<Document> train;
  DatasetStats stats;
  std::vector<Document> validation;
};

// The tokenizer is loaded lazily (ModelTokenizer): pre-tokenized data needs no tokenizer.json.
// method.type evaluate reads no training data.
absl::StatusOr<JobData> ReadJobData(const JobConfig& spec, const FileAccess& files) {
  JobData data;
  absl::StatusOr<Dir> model_dir = files.OpenDir(spec.model.path);
  if (!model_dir.ok()) return Annotate(model_dir.status(), "model.path");
  data.model_dir = *model_dir;
  ModelTokenizer model_tokenizer(*model_dir, "model.path");
  const TokenizerLoader loader = model_tokenizer.Loader();
  DatasetOptions options;
  options.max_seq_len = spec.data.max_seq_len;
  options.too_long = spec.data.too_long;
  absl::StatusOr<int64_t> vocab = ModelVocabSize(*model_dir);
  if (!vocab.ok()) return Annotate(vocab.status(), "model.path");
  options.vocab_size = *vocab;
  if (spec.method.type != TrainMethod::kEvaluate) {
    absl::StatusOr<File> train = files.OpenFile(spec.data.train);
    if (!train.ok()) return Annotate(train.status(), "data.train");
    OOMB_ASSIGN_OR_RETURN(data.train, ReadJsonlDataset(*train, loader, options, &data.stats));
    if (data.stats.label_tokens == 0) {
      return WithReason(absl::InvalidArgumentError(absl::StrCat(
                            "data.train: ", spec.data.train,
                            ": no token carries a label (every label is -100, or no sample has an assistant turn "
                            "or more than one token): there is nothing to train on")),
                        Reason::kBadData);
    }
  }
  if (!spec.data.validation.empty()) {
    options.field = "data.validation";
    absl::StatusOr<File> validation = files.OpenFile(spec.data.validation);
    if (!validation.ok()) return Annotate(validation.status(), "data.validation");
    OOMB_ASSIGN_OR_RETURN(data.validation, ReadJsonlDataset(*validation, loader, options, nullptr));
  }
  data.tokenizer = model_tokenizer.TakeTokenizer();
  data.chat = model_tokenizer.TakeChat();
  return data;
}

// One rank's run: its data, its model and session, the step loop and what it writes. It is
// also the session's StepSync: the points where the ranks of a data-parallel run agree.
class Run final : public StepSync {
 public:
  Run(const JobConfig& spec, const RunOptions& options, at::Device device, Rank rank)
      : spec_(spec), options_(options), device_(device), rank_(rank) {}

  absl::StatusOr<RunResult> Execute() {
    if (rank_.world > 1) {
      OOMB_ASSIGN_OR_RETURN(group_, DataParallelGroup::Join(*rank_.rendezvous, rank_.index, rank_.world, device_));
    }
    OOMB_RETURN_IF_ERROR(Agree(Guarded([this] { return Setup(); }), nullptr));
    return spec_.method.type == TrainMethod::kEvaluate ? EvaluateOnly() : Train();
  }

  // StepSync.
  int world() const override { return rank_.world; }
  bool Owns(int64_t index) const override { return group_ == nullptr || group_->Owns(index); }
  absl::Status Agree(const absl::Status& mine, std::vector<double>* sums) override;
  absl::Status AllReduceGradients(const std::vector<at::Tensor>& params) override {
    return group_ == nullptr ? absl::OkStatus() : group_->AllReduceGradients(params);
  }
  bool stopping() const override { return stop_ != StopRequest::kNone; }

 private:
  bool lead() const { return rank_.index == 0; }

  absl::Status Setup();
  absl::Status LoadModel();
  absl::Status MakeSession(int64_t longest);
  absl::Status ReadBaseFiles();
  absl::Status PrepareEvaluation(const JobData& data);
  bool EvaluationDue() const;
  absl::StatusOr<EvalReport> Evaluate();
  absl::Status Resume();
  bool PollStop(bool step_end);
  void Warn(const std::string& msg) {
    if (lead() && options_.on_warning) options_.on_warning(msg);
  }
  const std::vector<TokenSequence>& EpochSequences(int64_t epoch);
  std::vector<TokenSequence> NextBatch(TrainerState* next);
  absl::StatusOr<CheckpointInfo> Checkpoint(bool final);
  absl::StatusOr<RunResult> Train();
  // method.type evaluate: data.validation's loss and the evaluation section, once, reported as
  // step 0 of 0 (one metrics.jsonl line, one on_step); no checkpoint.
  absl::StatusOr<RunResult> EvaluateOnly();
  // Rank 0: completes the step's report with its place in the run, writes its metrics.jsonl
  // line, announces it and writes the periodic checkpoint (into `result`).
  absl::Status Report(StepReport& report, double lr, double elapsed, int64_t first_step, RunResult* result);
  absl::StatusOr<RunResult> Stopped();

  // A failure to read the model's files: the model's fault unless the cause says otherwise.
  static absl::Status ModelError(const absl::Status& s) {
    const absl::Status named = Annotate(s, "model.path");
    return ReasonOf(s).has_value() ? named : WithReason(named, Reason::kBadModel);
  }
  static constexpr int64_t kMaxBaseFileBytes = int64_t{256} << 20;

  const JobConfig& spec_;
  const RunOptions& options_;
  const at::Device device_;
  const Rank rank_;
  std::unique_ptr<DataParallelGroup> group_;  // world > 1
  std::optional<Dir> model_dir_;
  std::map<std::string, std::string> base_files_;  // copied into every checkpoint
  std::string base_config_json_;                   // the base model's config.json
  std::vector<Document> docs_;
  std::vector<TokenSequence> validation_;
  // The evaluation section's inputs: data.validation's samples, one sequence each (positions),
  // and the retrieval documents, made once.
  std::vector<TokenSequence> eval_samples_;
  std::vector<RetrievalDoc> eval_passkey_, eval_needle_;
  std::vector<TokenSequence> epoch_sequences_;
  int64_t packed_epoch_ = -1;
  int64_t total_steps_ = 0;
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<TrainingSession> session_;
  std::optional<MetricsLog> metrics_;  // rank 0
  TrainerState state_;
  StopRequest stop_ = StopRequest::kNone;
  bool pause_at_step_end_ = false;  // kPauseAtStepEnd was asked: stop_ becomes kPause at the step's end
};

// Data parallel: every rank learns, at the same point of the run, whether any rank failed or
// was asked to stop (one small collective), and `sums` are summed over the ranks on the way.
absl::Status Run::Agree(const absl::Status& mine, std::vector<double>* sums) {
  if (group_ == nullptr) return mine;
  std::vector<double> values = {mine.ok() ? 0.0 : 1.0, stop_ == StopRequest::kPause ? 1.0 : 0.0,
                                stop_ == StopRequest::kCancel ? 1.0 : 0.0};
  if (sums != nullptr) values.insert(values.end(), sums->begin(), sums->end());
  OOMB_ASSIGN_OR_RETURN(std::vector<double> summed, group_->SumAcrossRanks(values));
  if (summed[0] > 0) {
    return mine.ok()
               ? WithReason(absl::AbortedError("another rank of the data-parallel run failed"), Reason::kPeerFailed)
               : mine;
  }
  if (summed[2] > 0) {
    stop_ = StopRequest::kCancel;
  } else if (summed[1] > 0) {
    stop_ = StopRequest::kPause;
  }
  if (sums != nullptr) std::copy(summed.begin() + 3, summed.end(), sums->begin());
  return absl::OkStatus();
}

absl::Status Run::Setup() {
  OOMB_ASSIGN_OR_RETURN(JobData data, ReadJobData(spec_, *options_.files));
  model_dir_ = data.model_dir;
  OOMB_RETURN_IF_ERROR(ReadBaseFiles());
  docs_ = std::move(data.train);
  if (!spec_.data.validation.empty()) {
    validation_ = PackDocuments(data.validation, spec_.data.max_seq_len, spec_.data.packing, -1);
  }
  const auto first_epoch = PackDocuments(docs_, spec_.data.max_seq_len, spec_.data.packing, spec_.data.shuffle_seed);
  const int64_t per_epoch = static_cast<int64_t>(first_epoch.size());
  const int64_t batch = spec_.training.batch_sequences;
  total_steps_ = spec_.method.type == TrainMethod::kEvaluate ? 0
                 : spec_.training.max_steps > 0              ? spec_.training.max_steps
                                                : spec_.training.epochs * ((per_epoch + batch - 1) / batch);
  OOMB_RETURN_IF_ERROR(PrepareEvaluation(data));
  int64_t longest = 1;
  for (const auto& s : first_epoch) longest = std::max(longest, s.size());
  for (const auto& s : validation_) longest = std::max(longest, s.size());
  for (const auto& s : eval_samples_) longest = std::max(longest, s.size());
  for (const auto* docs : {&eval_passkey_, &eval_needle_}) {
    for (const RetrievalDoc& d : *docs) longest = std::max(longest, d.length);
  }
  OOMB_RETURN_IF_ERROR(LoadModel());
  OOMB_RETURN_IF_ERROR(MakeSession(longest));
  if (options_.resume) OOMB_RETURN_IF_ERROR(Resume());
  return absl::OkStatus();
}

// RoPE: model.rope_scaling when set; for evaluate, else the scaling the adapter was trained with
// (as `oombd model eval --adapter`); else config.json's.
absl::Status Run::LoadModel() {
  const bool evaluate = spec_.method.type == TrainMethod::kEvaluate;
  std::optional<Dir> adapter;
  std::optional<RopeScalingOverride> rope = spec_.model.rope_scaling;
  if (!spec_.method.lora.init_adapter.empty()) {
    absl::StatusOr<Dir> dir = options_.files->OpenDir(spec_.method.lora.init_adapter);
    if (!dir.ok()) return Annotate(dir.status(), "method.lora.init_adapter");
    adapter = *dir;
    if (evaluate && !rope.has_value()) {
      absl::StatusOr<std::optional<RopeScalingOverride>> trained = AdapterRopeScaling(*adapter);
      if (!trained.ok()) return Annotate(trained.status(), "method.lora.init_adapter");
      rope = *trained;
    }
  }
  absl::StatusOr<std::unique_ptr<Transformer>> model =
      Transformer::Load(*model_dir_, ModelScalarType(spec_), device_, rope);
  if (!model.ok()) return ModelError(model.status());
  model_ = *std::move(model);
  if (evaluate) {
    return adapter.has_value() ? Annotate(model_->LoadAdapter(*adapter), "method.lora.init_adapter") : absl::OkStatus();
  }
  OOMB_RETURN_IF_ERROR(PrepareTraining(*model_, spec_));
  if (spec_.method.type == TrainMethod::kFull) return absl::OkStatus();
  if (!adapter.has_value()) return absl::OkStatus();
  return Annotate(model_->LoadLoraWeights(*adapter), "method.lora.init_adapter");
}

absl::Status Run::MakeSession(int64_t longest) {
  SessionOptions o;
  o.device = device_;
  o.machine = ThisMachine(device_.is_cuda() ? device_.str() : "cpu");
  o.longest_sequence = longest;
  o.kv_stats = options_.kv_stats;
  o.kv_stats_slot = options_.devices.empty() ? device_.str() : options_.devices[rank_.index];
  o.should_stop = [this] { return PollStop(/*step_end=*/false); };
  o.sync = this;
  o.oom_at_step = OomFailpointStep(spec_);
  OOMB_ASSIGN_OR_RETURN(session_, TrainingSession::Create(model_.get(), spec_, std::move(o)));
  return absl::OkStatus();
}

// The base model's files a checkpoint carries (the tokenizer's, and config.json for the config
// as trained), read now: a file that cannot be read fails the job before any training.
absl::Status Run::ReadBaseFiles() {
  for (const char* name :
       {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"}) {
    if (!model_dir_->Contains(name)) continue;
    absl::StatusOr<std::string> contents = model_dir_->ReadFile(name, kMaxBaseFileBytes);
    if (!contents.ok()) return Annotate(contents.status(), "model.path");
    base_files_[name] = *std::move(contents);
  }
  absl::StatusOr<std::string> config = model_dir_->ReadFile("config.json", kMaxBaseFileBytes);
  if (!config.ok()) return Annotate(config.status(), "model.path");
  base_config_json_ = *std::move(config);
  return absl::OkStatus();
}

absl::Status Run::PrepareEvaluation(const JobData& data) {
  const JobConfig::Evaluation& e = spec_.evaluation;
  const auto wants = [&](const char* suite) {
    return std::find(e.suites.begin(), e.suites.end(), suite) != e.suites.end();
  };
  if (wants("positions")) {
    for (const Document& d : data.validation) {
      eval_samples_.emplace_back();
      eval_samples_.back().Append(d);
    }
  }
  if (!wants("passkey") && !wants("needle")) return absl::OkStatus();
  const Tokenizer* tokenizer = data.tokenizer.get();
  std::unique_ptr<Tokenizer> loaded;
  if (tokenizer == nullptr) {  // pre-tokenized data: the tokenizer was not needed until now
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromModelDir(*model_dir_);
    if (!t.ok() && t.status().code() == absl::StatusCode::kNotFound && !ReasonOf(t.status()).has_value()) {
      // A spec this model cannot run: the suites write their documents with its tokenizer.
      return WithReason(
          absl::FailedPreconditionError(absl::StrCat(
              "evaluation.suites: passkey and needle need the model's tokenizer, and ", t.status().message())),
          Reason::kBadSpec);
    }
    if (!t.ok()) return Annotate(t.status(), "evaluation.suites");
    loaded = *std::move(t);
    tokenizer = loaded.get();
  }
  const RetrievalOptions options{e.lengths, e.depths, e.trials, e.seed};
  if (wants("passkey")) {
    absl::StatusOr<std::vector<RetrievalDoc>> docs = PasskeyDocs(*tokenizer, options);
    if (!docs.ok()) return Annotate(docs.status(), "evaluation.lengths");
    eval_passkey_ = *std::move(docs);
  }
  if (wants("needle")) {
    absl::StatusOr<File> file = options_.files->OpenFile(e.haystack);
    absl::StatusOr<std::string> text = file.ok() ? file->ReadAll() : file.status();
    absl::StatusOr<std::vector<RetrievalDoc>> docs = text.ok() ? NeedleDocs(*tokenizer, *text, options) : text.status();
    if (!docs.ok()) return Annotate(docs.status(), "evaluation.haystack");
    eval_needle_ = *std::move(docs);
  }
  return absl::OkStatus();
}

// After every every_steps-th step and the last, on rank 0 (whose report carries it).
bool Run::EvaluationDue() const {
  const JobConfig::Evaluation& e = spec_.evaluation;
  if (e.suites.empty() || !lead()) return false;
  return state_.step == total_steps_ || (e.every_steps > 0 && state_.step % e.every_steps == 0);
}

absl::StatusOr<EvalReport> Run::Evaluate() {
  EvalReport report;
  ChunkTrainer& trainer = session_->trainer();
  OOMB_RETURN_IF_ERROR(Guarded([&]() -> absl::Status {
    if (!eval_samples_.empty()) {
      OOMB_ASSIGN_OR_RETURN(DataScore d, ScoreData(trainer, eval_samples_, /*by_position=*/true));
      report.positions = std::move(d.positions);
    }
    if (!eval_passkey_.empty()) {
      OOMB_ASSIGN_OR_RETURN(report.passkey, ScoreRetrieval(trainer, eval_passkey_));
    }
    if (!eval_needle_.empty()) {
      OOMB_ASSIGN_OR_RETURN(report.needle, ScoreRetrieval(trainer, eval_needle_));
    }
    return absl::OkStatus();
  }));
  return report;
}

absl::Status Run::Resume() {
  const Dir& root = *options_.checkpoint_dir;
  for (const std::string& name : ListCheckpointDirs(root)) {
    absl::StatusOr<Dir> dir = root.OpenDir(name);
    auto state = dir.ok() ? RestoreCheckpoint(*dir, *model_, session_->optimizer()) : dir.status();
    if (state.ok()) {
      state_ = *state;
      Warn(absl::StrCat("resumed from ", root.PathOf(name), " at step ", state_.step));
      return absl::OkStatus();
    }
    Warn(absl::StrCat("skipping checkpoint ", root.PathOf(name), ": ", state.status().message()));
  }
  if (state_.step == 0) Warn("no valid checkpoint to resume from: starting at step 0");
  return absl::OkStatus();
}

// Rank 0 asks poll_stop and passes the answer on to the other ranks (Rank::stop); the ranks act
// on it together (Agree). A pause at the step's end is held until `step_end`.
bool Run::PollStop(bool step_end) {
  if (stop_ == StopRequest::kNone) {
    if (lead() && options_.poll_stop) {
      StopRequest asked = options_.poll_stop();
      if (asked == StopRequest::kPauseAtStepEnd) {
        pause_at_step_end_ = true;
        asked = StopRequest::kNone;
      }
      stop_ = asked == StopRequest::kNone && step_end && pause_at_step_end_ ? StopRequest::kPause : asked;
    }
    if (rank_.stop != nullptr) {
      if (lead() && stop_ != StopRequest::kNone) rank_.stop->store(static_cast<int>(stop_));
      if (!lead()) stop_ = static_cast<StopRequest>(rank_.stop->load());
    }
  }
  return stop_ != StopRequest::kNone;
}

const std::vector<TokenSequence>& Run::EpochSequences(int64_t epoch) {
  if (epoch != packed_epoch_) {
    const int64_t seed = spec_.data.shuffle_seed < 0 ? -1 : spec_.data.shuffle_seed + epoch;
    epoch_sequences_ = PackDocuments(docs_, spec_.data.max_seq_len, spec_.data.packing, seed);
    packed_epoch_ = epoch;
  }
  return epoch_sequences_;
}

// The global batch of the step after `state_`: training.batch_sequences sequences, and the state
// after them. Held by value: a batch that crosses into the next epoch re-packs the epoch's
// sequences, which would leave pointers into the previous epoch dangling.
std::vector<TokenSequence> Run::NextBatch(TrainerState* next) {
  std::vector<TokenSequence> batch;
  *next = state_;
  for (int64_t i = 0; i < spec_.training.batch_sequences; ++i) {
    const auto& seqs = EpochSequences(next->epoch);
    batch.push_back(seqs[next->cursor]);
    if (++next->cursor == static_cast<int64_t>(seqs.size())) {
      next->cursor = 0;
      ++next->epoch;
    }
  }
  return batch;
}

absl::StatusOr<CheckpointInfo> Run::Checkpoint(bool final) {
  const Dir& root = *options_.checkpoint_dir;
  const std::string name = final ? std::string("final") : absl::StrCat("checkpoint-", state_.step);
  CheckpointWriteOptions w;
  w.base_model_path = spec_.model.path;
  w.base_files = base_files_;
  // The config as trained (RoPE scaling included): full fine-tuning's config.json; beside an
  // adapter, the config to load its base with.
  OOMB_ASSIGN_OR_RETURN(std::string config,
                        EffectiveConfigJson(base_config_json_, model_->config(), model_dir_->PathOf("config.json")));
  (model_->has_lora() ? w.base_config_json : w.config_json) = std::move(config);
  const auto started = Clock::now();
  OOMB_ASSIGN_OR_RETURN(int64_t bytes, WriteCheckpoint(root, name, *model_, session_->optimizer(), state_, w));
  PruneCheckpoints(root, spec_.checkpoint.keep_last);
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  CheckpointInfo info{state_.step, root.PathOf(name), bytes, final, seconds};
  if (options_.on_checkpoint) options_.on_checkpoint(info);
  return info;
}

// The step loop. The ranks of a data-parallel run agree inside every step (TrainingSession), at
// its evaluation, and after rank 0's reporting and checkpoint.
absl::StatusOr<RunResult> Run::Train() {
  RunResult result;
  if (lead()) {
    OOMB_ASSIGN_OR_RETURN(metrics_, MetricsLog::Open(*options_.checkpoint_dir));
  }
  const auto start = Clock::now();
  const int64_t first_step = state_.step;
  while (state_.step < total_steps_) {
    TrainerState next;
    const std::vector<TokenSequence> batch = NextBatch(&next);
    const double lr = LearningRate(spec_.training, state_.step, total_steps_);
    absl::StatusOr<StepReport> report = session_->Step(batch, state_.step + 1, lr);
    if (absl::IsCancelled(report.status())) return Stopped();
    if (!report.ok()) return report.status();
    state_.step += 1;
    state_.epoch = next.epoch;
    state_.cursor = next.cursor;
    state_.tokens += report->step_tokens;
    state_.loss = report->loss;
    const int64_t every = spec_.training.eval_every_steps;
    if (!validation_.empty() && (state_.step == total_steps_ || (every > 0 && state_.step % every == 0))) {
      OOMB_ASSIGN_OR_RETURN(report->eval_loss, session_->Evaluate(validation_));
    }
    if (EvaluationDue()) {
      absl::StatusOr<EvalReport> evaluation = Evaluate();
      if (absl::IsCancelled(evaluation.status())) return Stopped();
      if (!evaluation.ok()) return evaluation.status();
      report->evaluation = *std::move(evaluation);
    }
    const bool last = state_.step == total_steps_;
    absl::Status reported;
    if (lead()) {
      reported = Report(*report, lr, std::chrono::duration<double>(Clock::now() - start).count(), first_step, &result);
    }
    if (!last) PollStop(/*step_end=*/true);
    OOMB_RETURN_IF_ERROR(Agree(reported, nullptr));
    if (!last && stop_ != StopRequest::kNone) return Stopped();
  }
  if (lead()) {
    OOMB_ASSIGN_OR_RETURN(result.final_checkpoint, Checkpoint(true));
  }
  result.outcome = RunOutcome::kSucceeded;
  return result;
}

absl::StatusOr<RunResult> Run::EvaluateOnly() {
  OOMB_ASSIGN_OR_RETURN(metrics_, MetricsLog::Open(*options_.checkpoint_dir));
  StepReport report;
  absl::Status evaluated = [&]() -> absl::Status {
    if (!validation_.empty()) {
      OOMB_ASSIGN_OR_RETURN(report.eval_loss, session_->Evaluate(validation_));
      if (!std::isfinite(report.eval_loss)) {  // a NaN or infinite adapter: a failure, never a result
        return WithReason(absl::InternalError(absl::StrCat("the validation loss is ", report.eval_loss,
                                                           " (non-finite weights in method.lora.init_adapter?)")),
                          Reason::kNanLoss);
      }
    }
    if (!spec_.evaluation.suites.empty()) {
      OOMB_ASSIGN_OR_RETURN(report.evaluation, Evaluate());
    }
    return absl::OkStatus();
  }();
  if (absl::IsCancelled(evaluated)) return Stopped();
  OOMB_RETURN_IF_ERROR(evaluated);
  absl::Status written = metrics_->Append(report);
  if (options_.on_step) options_.on_step(report);
  OOMB_RETURN_IF_ERROR(written);
  return RunResult{};
}

absl::Status Run::Report(StepReport& report, double lr, double elapsed, int64_t first_step, RunResult* result) {
  report.step = state_.step;
  report.total_steps = total_steps_;
  report.tokens = state_.tokens;
  report.learning_rate = lr;
  report.eta_seconds = elapsed / static_cast<double>(state_.step - first_step) * (total_steps_ - state_.step);
  absl::Status written = metrics_->Append(report);
  if (options_.on_step) options_.on_step(report);
  OOMB_RETURN_IF_ERROR(written);
  const bool last = state_.step == total_steps_;
  if (last || spec_.checkpoint.every_steps <= 0 || state_.step % spec_.checkpoint.every_steps != 0) {
    return absl::OkStatus();
  }
  OOMB_ASSIGN_OR_RETURN(result->final_checkpoint, Checkpoint(false));
  return absl::OkStatus();
}

// Cancel: nothing more is written. Pause: a checkpoint of the last completed step (rank 0);
// none for evaluate, which starts over when resumed.
absl::StatusOr<RunResult> Run::Stopped() {
  RunResult r;
  session_->optimizer().zero_grad(/*set_to_none=*/true);
  if (stop_ == StopRequest::kPause) {
    r.outcome = RunOutcome::kPaused;
    if (!lead() || spec_.method.type == TrainMethod::kEvaluate) return r;
    OOMB_ASSIGN_OR_RETURN(r.final_checkpoint, Checkpoint(false));
  } else {
    r.outcome = RunOutcome::kCancelled;
  }
  return r;
}

// The ranks of a run (one thread each beyond the first), and their outcome.
absl::StatusOr<RunResult> RunRanks(const JobConfig& spec, const RunOptions& options) {
  absl::StatusOr<std::vector<at::Device>> devices;
  OOMB_RETURN_IF_ERROR(Guarded([&] {
    devices = ResolveDevices(spec, options.devices);
    return devices.status();
  }));
  const int world = static_cast<int>(devices->size());
  if (world == 1) {
    absl::StatusOr<RunResult> result;
    OOMB_RETURN_IF_ERROR(Guarded([&] {
      result = Run(spec, options, devices->front(), Rank{}).Execute();
      return absl::OkStatus();
    }));
    return result;
  }
  // Data parallel: one thread per rank; the run's outcome is rank 0's, unless a rank failed.
  const Rendezvous rendezvous = Rendezvous::InProcess();
  std::atomic<int> stop{static_cast<int>(StopRequest::kNone)};
  std::vector<absl::StatusOr<RunResult>> results(world, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      const Rank rank{.index = r, .world = world, .rendezvous = &rendezvous, .stop = &stop};
      absl::Status thrown = Guarded([&] {
        results[r] = Run(spec, options, (*devices)[r], rank).Execute();
        return absl::OkStatus();
      });
      if (!thrown.ok()) results[r] = thrown;
    });
  }
  for (std::thread& t : threads) t.join();
  for (const auto& result : results) {
    if (!result.ok() && ReasonOf(result.status()) != Reason::kPeerFailed) return result.status();
  }
  return results[0];
}

}  // namespace

void InitExecutorProcess() { DisableFlightRecorder(); }

absl::StatusOr<RunResult> RunJob(const JobConfig& spec, const RunOptions& options) {
  if (options.files == nullptr || !options.checkpoint_dir.has_value()) {
    return absl::InvalidArgumentError("RunJob: RunOptions::files and checkpoint_dir are required");
  }
  OOMB_RETURN_IF_ERROR(RemovePartialCheckpoints(*options.checkpoint_dir));
  absl::StatusOr<RunResult> result = RunRanks(spec, options);
  if (!result.ok()) (void)RemovePartialCheckpoints(*options.checkpoint_dir);
  return result;
}

absl::StatusOr<DataSummary> ValidateJobData(const JobConfig& spec, const FileAccess& files) {
  DataSummary summary;
  OOMB_RETURN_IF_ERROR(Guarded(
      [&]() -> absl::Status {
        OOMB_ASSIGN_OR_RETURN(JobData data, ReadJobData(spec, files));
        summary.train = data.stats;
        summary.sequences = static_cast<int64_t>(
            PackDocuments(data.train, spec.data.max_seq_len, spec.data.packing, spec.data.shuffle_seed).size());
        return absl::OkStatus();
      },
      "reading the datasets"));
  return summary;
}

}  // namespace oomb
