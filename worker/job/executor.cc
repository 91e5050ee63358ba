// The job executor: the step loop of one job on its ranks, around its data (job_data.h), model
// (model_loader.h), evaluation schedule (evaluation_schedule.h) and checkpoints
// (checkpointer.h). Contract: worker/job/executor.h.
#include "worker/job/executor.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "worker/common/status.h"
#include "worker/data/dataset.h"
#include "worker/job/build_info.h"
#include "worker/job/checkpointer.h"
#include "worker/job/device.h"
#include "worker/job/evaluation_schedule.h"
#include "worker/job/job_data.h"
#include "worker/job/model_loader.h"
#include "worker/metrics/metrics_log.h"
#include "worker/model/transformer.h"
#include "worker/plan/lr_schedule.h"
#include "worker/plan/memory_planner.h"
#include "worker/session/training_session.h"
#include "worker/train/checkpoint.h"
#include "worker/train/rank_group.h"
#include "worker/train/sharded_state.h"
#include "worker/train/torch_status.h"

namespace oomb {
namespace {

using Clock = std::chrono::steady_clock;

// LibTorch's device for `d`, `after` devices past it when it is a CUDA device (rank r's).
at::Device TorchDevice(const ComputeDevice& d, int after) {
  return d.cuda ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(d.index + after)) : at::Device(at::kCPU);
}

// The devices of the run's ranks: RunOptions::devices, or derived from the spec (see
// executor.h). All CPU or all distinct CUDA devices.
absl::StatusOr<std::vector<at::Device>> ResolveDevices(const JobConfig& job, const std::vector<std::string>& given) {
  const auto k = static_cast<size_t>(job.resources.gpus);
  std::vector<at::Device> devices;
  if (!given.empty()) {
    if (given.size() != k) {
      return absl::InvalidArgumentError(
          absl::StrCat("resources.gpus: ", k, " but the run was given ", given.size(), " devices"));
    }
    for (const std::string& d : given) {
      OOMB_ASSIGN_OR_RETURN(const ComputeDevice device, ResolveDevice(d, "resources.device"));
      devices.push_back(TorchDevice(device, 0));
    }
  } else {
    OOMB_ASSIGN_OR_RETURN(const ComputeDevice first, ResolveDevice(job.resources.device, "resources.device"));
    for (size_t r = 0; r < k; ++r) devices.push_back(TorchDevice(first, static_cast<int>(r)));
    if (first.cuda && first.index + static_cast<int64_t>(k) > torch::cuda::device_count()) {
      return absl::FailedPreconditionError(absl::StrCat("resources.gpus: ", k, " from ", devices.front().str(),
                                                        " but only ", torch::cuda::device_count(), " CUDA devices"));
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

// One rank of a run: which, of how many, and what the ranks of a run share. With tensor
// parallelism (parallel.tensor t > 1) ranks [g t, (g + 1) t) form tensor-parallel group g, which
// is data-parallel rank g of world / t; the ranks with one place in their groups form a
// data-parallel group.
struct Rank {
  int index = 0;
  int world = 1;
  int tensor = 1;                          // parallel.tensor
  const Rendezvous* rendezvous = nullptr;  // world > 1
  std::atomic<int>* stop = nullptr;        // world > 1: rank 0's StopRequest, read by the others
  const std::string* links = nullptr;      // tensor > 1: TensorParallelLinks, for the log

  int replica() const { return index / tensor; }  // its data-parallel rank
  int replicas() const { return world / tensor; }
  int shard() const { return index % tensor; }  // its place in its tensor-parallel group
};

// Failpoints for the reliability tests (RELIABILITY.md): only when the process runs with
// OOMB_FAILPOINTS=1, a job labelled `failpoint: oom-at-step-N` gets a real
// c10::OutOfMemoryError at the start of step N (SessionOptions::oom_at_step).
int64_t OomFailpointStep(const JobConfig& job) {
  const char* enabled = std::getenv("OOMB_FAILPOINTS");
  if (enabled == nullptr || std::string(enabled) != "1") return 0;
  auto it = job.labels.find("failpoint");
  int64_t step = 0;
  if (it == job.labels.end() || !absl::SimpleAtoi(absl::StripPrefix(it->second, "oom-at-step-"), &step)) return 0;
  return step;
}

// One rank's run: its data, its model and session, the step loop and what it writes. It is
// also the session's StepSync: the points where the ranks of a data-parallel run agree.
class Run final : public StepSync {
 public:
  Run(const JobConfig& job, const RunOptions& options, at::Device device, Rank rank)
      : job_(job), options_(options), device_(device), rank_(rank) {}

  absl::StatusOr<RunResult> Execute() {
    OOMB_RETURN_IF_ERROR(JoinGroups());
    OOMB_RETURN_IF_ERROR(Agree(Guarded([this] { return Setup(); }), nullptr));
    return job_.method.type == TrainMethod::kEvaluate ? EvaluateOnly() : Train();
  }

  // StepSync.
  int world() const override { return rank_.world; }
  bool Owns(int64_t index) const override {
    const RankGroup* data = data_group();
    return data == nullptr || data->Owns(index);
  }
  absl::Status Agree(const absl::Status& mine, std::vector<double>* sums) override;
  // The tensor-parallel group's partial gradients summed in it, then every gradient over the
  // data-parallel ranks.
  absl::Status AllReduceGradients(const std::vector<at::Tensor>& params) override {
    if (tensor_group_ != nullptr) OOMB_RETURN_IF_ERROR(tensor_group_->AllReduceGradients(model_->PartialGradients()));
    RankGroup* data = data_group();
    return data == nullptr ? absl::OkStatus() : data->AllReduceGradients(params);
  }
  bool stopping() const override { return stop_ != StopRequest::kNone; }

 private:
  bool lead() const { return rank_.index == 0; }
  // The ranks that take part in writing checkpoints: the first tensor-parallel group (rank 0
  // writes what they gather).
  bool writes_checkpoints() const { return rank_.replica() == 0; }
  // The run's groups: every rank (world > 1), the tensor-parallel group (tensor > 1), the
  // data-parallel one (the world's without tensor parallelism).
  absl::Status JoinGroups();
  RankGroup* data_group() const { return rank_.tensor == 1 ? group_.get() : data_group_.get(); }

  absl::Status Setup();
  absl::Status LoadModel(const JobData& data);
  absl::Status MakeSession(int64_t longest);
  bool PollStop(bool step_end);
  void Warn(const std::string& msg) {
    if (lead() && options_.on_warning) options_.on_warning(msg);
  }
  void Log(const std::string& msg) {
    if (lead() && options_.on_log) options_.on_log(msg);
  }
  // Where the run's first step's gradients reached: a LOG line, and a warning naming what
  // received none (a target the data never reaches, experts no token was routed to).
  void ReportReach(const GradientReach& reach, int64_t step) {
    if (reach.every())
      return Log(absl::StrCat("gradients at step ", step, " reached every trainable module: ", reach.Describe()));
    Warn(absl::StrCat("gradients at step ", step,
                      " did not reach every trainable module (reached/trainable): ", reach.Describe(),
                      "; what received none does not train: check method.lora's targets, or the data (an expert "
                      "no token was routed to receives nothing)"));
  }
  // The LOG lines of Setup: the data, the model, the plan.
  void LogSetup(const DatasetStats& data, double load_seconds);
  // Rank 0 writes; under tensor parallelism the first group's every rank calls it (it gathers).
  absl::StatusOr<CheckpointInfo> Checkpoint(bool final);
  absl::StatusOr<RunResult> Train();
  // method.type evaluate: data.validation's loss and the evaluation section, once, reported as
  // step 0 of 0 (one metrics.jsonl line, one on_step); no checkpoint.
  absl::StatusOr<RunResult> EvaluateOnly();
  // data.validation's mean loss, with what it is over, into `report`: from the positions
  // suite's buckets when given (they score the same samples, one sequence each), else a
  // forward of its own (every rank its share).
  absl::Status Validate(const SuiteResult* positions, StepReport* report);
  // Rank 0: completes the step's report with its place in the run, writes its metrics.jsonl
  // line and announces it (on_step).
  absl::Status Announce(StepReport& report, double lr, double elapsed, int64_t first_step);
  absl::StatusOr<RunResult> Stopped();

  const JobConfig& job_;
  const RunOptions& options_;
  const at::Device device_;
  const Rank rank_;
  std::unique_ptr<RankGroup> group_;         // world > 1: every rank
  std::unique_ptr<RankGroup> tensor_group_;  // tensor > 1
  std::unique_ptr<RankGroup> data_group_;    // tensor > 1 and replicas > 1
  // What the run is made of, set up by Setup(): its data, evaluation, checkpoints, model and
  // session.
  std::optional<TrainingBatches> batches_;
  std::vector<TokenSequence> validation_;                   // data.validation packed, for the validation loss
  int64_t validation_samples_ = 0, validation_tokens_ = 0;  // its samples and label tokens
  std::optional<EvaluationSchedule> evaluation_;
  std::optional<Checkpointer> checkpointer_;
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<TrainingSession> session_;
  std::optional<MetricsLog> metrics_;  // rank 0
  TrainerState state_;
  StopRequest stop_ = StopRequest::kNone;
  bool pause_at_step_end_ = false;  // kPauseAtStepEnd was asked: stop_ becomes kPause at the step's end
};

absl::Status Run::JoinGroups() {
  if (rank_.world == 1) return absl::OkStatus();
  OOMB_ASSIGN_OR_RETURN(group_, RankGroup::Join(*rank_.rendezvous, rank_.index, rank_.world, device_));
  if (rank_.tensor == 1) return absl::OkStatus();
  OOMB_ASSIGN_OR_RETURN(tensor_group_,
                        RankGroup::Join(rank_.rendezvous->Prefixed(absl::StrCat("tp", rank_.replica(), "/")),
                                        rank_.shard(), rank_.tensor, device_));
  if (rank_.replicas() == 1) return absl::OkStatus();
  OOMB_ASSIGN_OR_RETURN(data_group_, RankGroup::Join(rank_.rendezvous->Prefixed(absl::StrCat("dp", rank_.shard(), "/")),
                                                     rank_.replica(), rank_.replicas(), device_));
  return absl::OkStatus();
}

absl::StatusOr<CheckpointInfo> Run::Checkpoint(bool final) {
  if (tensor_group_ == nullptr) return checkpointer_->Write(*model_, session_->optimizer(), state_, final);
  const WholeTraining whole = GatherTraining(*model_, session_->optimizer());
  if (!lead()) return CheckpointInfo{};
  return checkpointer_->Write(*whole.model, *whole.optimizer, state_, final);
}

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
  OOMB_ASSIGN_OR_RETURN(JobData data, ReadJobData(job_, *options_.files));
  if (const std::string w = TrainedOnEvaluatedSuites(job_.evaluation, data.stats.generators); !w.empty()) Warn(w);
  OOMB_ASSIGN_OR_RETURN(checkpointer_, Checkpointer::Open(job_, *data.model_dir, *options_.checkpoint_dir,
                                                          options_.spec_yaml, options_.on_checkpoint));
  if (!job_.data.validation.empty()) {
    validation_ = PackDocuments(data.validation, job_.data.max_seq_len, job_.data.packing, -1);
    validation_samples_ = static_cast<int64_t>(data.validation.size());
    for (const TokenSequence& s : validation_) {
      validation_tokens_ +=
          std::count_if(s.labels.begin(), s.labels.end(), [](int64_t l) { return l != kIgnoreLabel; });
    }
  }
  OOMB_ASSIGN_OR_RETURN(evaluation_, EvaluationSchedule::Prepare(job_, data, *options_.files));
  batches_.emplace(job_, std::move(data.train));
  int64_t longest = std::max(batches_->longest(), evaluation_->longest());
  for (const auto& s : validation_) longest = std::max(longest, s.size());
  const auto load_start = Clock::now();
  OOMB_RETURN_IF_ERROR(LoadModel(data));
  const double load_seconds = std::chrono::duration<double>(Clock::now() - load_start).count();
  OOMB_RETURN_IF_ERROR(MakeSession(longest));
  LogSetup(data.stats, load_seconds);
  if (options_.resume) {
    const auto warn = [this](const std::string& m) { Warn(m); };
    if (tensor_group_ == nullptr) {
      state_ = checkpointer_->Resume(*model_, session_->optimizer(), warn);
    } else {  // the whole state, read by every rank, each keeping its share
      const WholeTraining whole = GatherTraining(*model_, session_->optimizer());
      state_ = checkpointer_->Resume(*whole.model, *whole.optimizer, warn);
      ShardTraining(whole, *model_, session_->optimizer());
    }
    if (state_.step > 0) Log(absl::StrCat("resumed from the checkpoint of step ", state_.step));
  }
  return absl::OkStatus();
}

void Run::LogSetup(const DatasetStats& data, double load_seconds) {
  if (job_.method.type != TrainMethod::kEvaluate) {
    Log(absl::StrCat("data.train: ", data.samples, " samples, ", data.tokens, " tokens (", data.label_tokens,
                     " with labels), the longest ", data.longest, "; ", data.dropped, " dropped, ", data.truncated,
                     " truncated; ", batches_->total_steps(), " steps"));
  }
  int64_t trainable = 0;
  for (const auto& [name, p] : model_->TrainableParameters()) trainable += p.numel();
  Log(absl::StrCat("model: ", model_->config().architecture, " from ", job_.model.path, " on ", device_.str(),
                   ", loaded in ", absl::StrFormat("%.1f", load_seconds), " s; ", trainable, " trainable parameters"));
  const MemoryPlan& plan = session_->plan();
  Log(absl::StrCat("plan: chunks of ", plan.chunk_tokens, " tokens; KV ", plan.placement, "; planned peak ",
                   FormatBytes(plan.peak_device_bytes), " of ", FormatBytes(plan.device_capacity_bytes), " on ",
                   plan.device));
  for (const std::string& choice : plan.choices) Log("plan: " + choice);
  if (rank_.links != nullptr) Log(*rank_.links);
}

// method.lora.init_adapter: the adapter evaluated, or the adapter training starts from.
absl::Status Run::LoadModel(const JobData& data) {
  ModelSource source{.model = *data.model_dir};
  if (!job_.method.lora.init_adapter.empty()) {
    absl::StatusOr<Dir> dir = options_.files->OpenDir(job_.method.lora.init_adapter);
    if (!dir.ok()) return Annotate(dir.status(), "method.lora.init_adapter");
    source.adapter = *dir;
  }
  OOMB_ASSIGN_OR_RETURN(model_, job_.method.type == TrainMethod::kEvaluate
                                    ? LoadForEvaluation(source, ModelScalarType(job_), device_, job_.model.rope_scaling)
                                    : LoadForTraining(source, job_, device_, tensor_group_.get()));
  return absl::OkStatus();
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
  o.oom_at_step = OomFailpointStep(job_);
  OOMB_ASSIGN_OR_RETURN(session_, TrainingSession::Create(model_.get(), job_, std::move(o)));
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

// The step loop. The ranks of a data-parallel run agree inside every step (TrainingSession), at
// its evaluation, and after rank 0's reporting and checkpoint.
absl::StatusOr<RunResult> Run::Train() {
  RunResult result;
  if (lead()) {
    OOMB_ASSIGN_OR_RETURN(metrics_, MetricsLog::Open(*options_.checkpoint_dir));
  }
  const auto start = Clock::now();
  const int64_t first_step = state_.step;
  const int64_t total_steps = batches_->total_steps();
  while (state_.step < total_steps) {
    TrainerState next;
    const std::vector<TokenSequence> batch = batches_->Next(state_, &next);
    const double lr = LearningRate(job_.training, state_.step, total_steps);
    absl::StatusOr<StepReport> report = session_->Step(batch, state_.step + 1, lr);
    if (absl::IsCancelled(report.status())) return Stopped();
    if (!report.ok()) return report.status();
    if (state_.step == first_step) ReportReach(*session_->first_step_reach(), state_.step + 1);
    state_.step += 1;
    state_.epoch = next.epoch;
    state_.cursor = next.cursor;
    state_.tokens += report->step_tokens;
    state_.loss = report->loss;
    const int64_t every = job_.training.eval_every_steps;
    if (!validation_.empty() && (state_.step == total_steps || (every > 0 && state_.step % every == 0))) {
      OOMB_RETURN_IF_ERROR(Validate(/*positions=*/nullptr, &*report));
    }
    if (lead() && evaluation_->Due(state_.step, total_steps)) {  // rank 0's report carries it
      absl::StatusOr<EvalReport> evaluation = evaluation_->Run(session_->trainer());
      if (absl::IsCancelled(evaluation.status())) {  // the step is trained (a pause checkpoints it): told, then stop
        OOMB_RETURN_IF_ERROR(
            Announce(*report, lr, std::chrono::duration<double>(Clock::now() - start).count(), first_step));
        return Stopped();
      }
      if (!evaluation.ok()) return evaluation.status();
      report->evaluation = *std::move(evaluation);
    }
    const bool last = state_.step == total_steps;
    absl::Status reported;
    if (lead()) {
      reported = Announce(*report, lr, std::chrono::duration<double>(Clock::now() - start).count(), first_step);
    }
    const int64_t checkpoint_every = job_.checkpoint.every_steps;
    if (!last && checkpoint_every > 0 && state_.step % checkpoint_every == 0 && writes_checkpoints()) {
      absl::StatusOr<CheckpointInfo> written = Checkpoint(false);
      if (lead() && written.ok()) result.final_checkpoint = *std::move(written);
      if (reported.ok()) reported = written.status();
    }
    if (!last) PollStop(/*step_end=*/true);
    OOMB_RETURN_IF_ERROR(Agree(reported, nullptr));
    if (!last && stop_ != StopRequest::kNone) return Stopped();
  }
  if (writes_checkpoints()) {
    OOMB_ASSIGN_OR_RETURN(result.final_checkpoint, Checkpoint(true));
  }
  result.outcome = RunOutcome::kSucceeded;
  return result;
}

absl::StatusOr<RunResult> Run::EvaluateOnly() {
  OOMB_ASSIGN_OR_RETURN(metrics_, MetricsLog::Open(*options_.checkpoint_dir));
  StepReport report;
  absl::Status evaluated = [&]() -> absl::Status {
    if (!job_.evaluation.suites.empty()) {
      OOMB_ASSIGN_OR_RETURN(report.evaluation, evaluation_->Run(session_->trainer()));
    }
    if (!validation_.empty()) {
      const SuiteResult* positions = nullptr;
      if (report.evaluation && report.evaluation->count(EvalSuite::kPositions) > 0) {
        positions = &report.evaluation->at(EvalSuite::kPositions);
      }
      OOMB_RETURN_IF_ERROR(Validate(positions, &report));
      if (!std::isfinite(report.eval_loss)) {  // a NaN or infinite adapter: a failure, never a result
        return WithReason(absl::InternalError(absl::StrCat("the validation loss is ", report.eval_loss,
                                                           " (non-finite weights in method.lora.init_adapter?)")),
                          Reason::kNanLoss);
      }
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

absl::Status Run::Validate(const SuiteResult* positions, StepReport* report) {
  report->eval_samples = validation_samples_;
  if (positions == nullptr) {
    report->eval_tokens = validation_tokens_;
    OOMB_ASSIGN_OR_RETURN(report->eval_loss, session_->Evaluate(validation_));
    return absl::OkStatus();
  }
  double loss_sum = 0;
  report->eval_tokens = 0;
  for (const PositionLoss& b : positions->buckets) {
    loss_sum += b.loss * static_cast<double>(b.tokens);
    report->eval_tokens += b.tokens;
  }
  report->eval_loss = report->eval_tokens > 0 ? loss_sum / static_cast<double>(report->eval_tokens) : 0.0;
  return absl::OkStatus();
}

absl::Status Run::Announce(StepReport& report, double lr, double elapsed, int64_t first_step) {
  report.step = state_.step;
  const int64_t total_steps = batches_->total_steps();
  report.total_steps = total_steps;
  report.tokens = state_.tokens;
  report.learning_rate = lr;
  report.eta_seconds = elapsed / static_cast<double>(state_.step - first_step) * (total_steps - state_.step);
  absl::Status written = metrics_->Append(report);
  if (options_.on_step) options_.on_step(report);
  return written;
}

// Cancel: nothing more is written. Pause: a checkpoint of the last completed step (rank 0);
// none for evaluate, which starts over when resumed.
absl::StatusOr<RunResult> Run::Stopped() {
  RunResult r;
  session_->optimizer().zero_grad(/*set_to_none=*/true);
  if (stop_ == StopRequest::kPause) {
    r.outcome = RunOutcome::kPaused;
    if (!writes_checkpoints() || job_.method.type == TrainMethod::kEvaluate) return r;
    OOMB_ASSIGN_OR_RETURN(r.final_checkpoint, Checkpoint(false));
  } else {
    r.outcome = RunOutcome::kCancelled;
  }
  return r;
}

// The ranks of a run (one thread each beyond the first), and their outcome.
absl::StatusOr<RunResult> RunRanks(const JobConfig& job, const RunOptions& options) {
  absl::StatusOr<std::vector<at::Device>> devices;
  OOMB_RETURN_IF_ERROR(Guarded([&] {
    devices = ResolveDevices(job, options.devices);
    return devices.status();
  }));
  const int world = static_cast<int>(devices->size());
  if (world == 1) {
    absl::StatusOr<RunResult> result;
    OOMB_RETURN_IF_ERROR(Guarded([&] {
      result = Run(job, options, devices->front(), Rank{}).Execute();
      return absl::OkStatus();
    }));
    return result;
  }
  // Data parallel: one thread per rank; the run's outcome is rank 0's, unless a rank failed.
  const Rendezvous rendezvous = Rendezvous::InProcess();
  std::atomic<int> stop{static_cast<int>(StopRequest::kNone)};
  std::vector<std::string> names;
  for (const at::Device& d : *devices) names.push_back(d.str());
  const std::string links = job.parallel.tensor > 1 ? TensorParallelLinks(names, job.parallel.tensor) : "";
  std::vector<absl::StatusOr<RunResult>> results(world, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      const Rank rank{.index = r,
                      .world = world,
                      .tensor = job.parallel.tensor,
                      .rendezvous = &rendezvous,
                      .stop = &stop,
                      .links = links.empty() ? nullptr : &links};
      absl::Status thrown = Guarded([&] {
        results[r] = Run(job, options, (*devices)[r], rank).Execute();
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

absl::StatusOr<RunResult> RunJob(const JobConfig& job, const RunOptions& options) {
  if (options.files == nullptr || !options.checkpoint_dir.has_value()) {
    return absl::InvalidArgumentError("RunJob: RunOptions::files and checkpoint_dir are required");
  }
  OOMB_RETURN_IF_ERROR(RemovePartialCheckpoints(*options.checkpoint_dir));
  absl::StatusOr<RunResult> result = RunRanks(job, options);
  if (!result.ok()) (void)RemovePartialCheckpoints(*options.checkpoint_dir);
  return result;
}

absl::StatusOr<DataSummary> ValidateJobData(const JobConfig& job, const FileAccess& files) {
  DataSummary summary;
  OOMB_RETURN_IF_ERROR(Guarded(
      [&]() -> absl::Status {
        OOMB_ASSIGN_OR_RETURN(JobData data, ReadJobData(job, files));
        summary.train = data.stats;
        summary.sequences = static_cast<int64_t>(
            PackDocuments(data.train, job.data.max_seq_len, job.data.packing, job.data.shuffle_seed).size());
        return absl::OkStatus();
      },
      "reading the datasets"));
  return summary;
}

}  // namespace oomb
