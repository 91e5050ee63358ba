#include "server/scheduler.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <random>
#include <set>

#include <spdlog/spdlog.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/time_util.h"
#include "proto/spec/spec_codec.h"
#include "server/job_spec.h"
#include "server/named_inputs.h"
#include "server/to_proto.h"
#include "worker/common/status.h"

namespace oomb::server {
namespace {

using google::protobuf::util::TimeUtil;
using State = v1::Job::State;

v1::JobEvent StateEvent(State state, const std::string& message) {
  v1::JobEvent e;
  e.set_type(v1::JobEvent::STATE_CHANGED);
  e.set_state(state);
  e.set_message(BoundedText(message));
  return e;
}

v1::JobEvent WarningEvent(const std::string& message) {
  v1::JobEvent e;
  e.set_type(v1::JobEvent::WARNING);
  e.set_message(BoundedText(message));
  return e;
}

v1::JobEvent LogEvent(const std::string& message) {
  v1::JobEvent e;
  e.set_type(v1::JobEvent::LOG);
  e.set_message(BoundedText(message));
  return e;
}

// What CreateJob's scan of the datasets found, as a LOG event.
v1::JobEvent DataScanEvent(const v1::DatasetSummary& d) {
  return LogEvent(absl::StrCat("data scan: ", d.samples(), " samples, ", d.tokens(), " tokens, ", d.sequences(),
                               " sequences per epoch, the longest sample ", d.longest_sample(), " tokens; ",
                               d.dropped(), " dropped, ", d.truncated(), " truncated"));
}

void SetState(v1::Job* job, State state, const std::string& message, std::vector<v1::JobEvent>* events) {
  job->set_state(state);
  if (IsTerminal(state)) {
    *job->mutable_end_time() = TimeUtil::GetCurrentTime();
    job->clear_preempted_by();
  }
  events->push_back(StateEvent(state, message));
}

// `mutate`, with `actor` recorded on the events it makes (JobEvent.actor).
JobMutation By(const std::string& actor, JobMutation mutate) {
  return [actor, mutate = std::move(mutate)](v1::Job* job, std::vector<v1::JobEvent>* events) {
    const size_t before = events->size();
    OOMB_RETURN_IF_ERROR(mutate(job, events));
    for (size_t i = before; i < events->size(); ++i) (*events)[i].set_actor(actor);
    return absl::OkStatus();
  };
}

absl::Status IllegalTransition(const v1::Job& job, const char* verb, const char* allowed) {
  return absl::FailedPreconditionError(absl::StrCat("cannot ", verb, " ", job.name(), ": it is ",
                                                    v1::Job::State_Name(job.state()), " (allowed from ", allowed, ")"));
}

// A run's failure as recorded: one without a reason whose code is NOT_FOUND is a file the spec
// names that was gone when the job ran (a dataset deleted while it waited, an adapter without
// adapter_config.json): the spec's fault (BAD_SPEC), not INTERNAL.
absl::Status RunFailure(const absl::Status& s) {
  return absl::IsNotFound(s) && !ReasonOf(s).has_value() ? WithReason(s, Reason::kBadSpec) : s;
}

// Records `s` as the job's error (code, reason, a bounded message) and fails the job with it.
void Fail(v1::Job* j, const absl::Status& s, std::vector<v1::JobEvent>* events) {
  j->mutable_error()->set_code(absl::StatusCodeToString(s.code()));
  j->mutable_error()->set_reason(std::string(ReasonName(ReasonOrDefault(s))));
  j->mutable_error()->set_message(BoundedText(s.message()));
  SetState(j, v1::Job::FAILED, j->error().message(), events);
  *events->back().mutable_error() = j->error();
}

void FillProgress(const StepReport& p, const std::string& device, v1::Progress* out) {
  out->set_step(p.step);
  out->set_total_steps(p.total_steps);
  out->set_tokens(p.tokens);
  out->set_loss(p.loss);
  out->set_learning_rate(p.learning_rate);
  out->set_tokens_per_second(p.tokens_per_second);
  out->set_eta_seconds(p.eta_seconds);
  out->set_gpu_memory_bytes(p.peak_device_bytes);
  out->set_host_memory_bytes(p.host_kv_bytes);
  out->set_pcie_h2d_bytes(p.pcie_h2d_bytes);
  out->set_pcie_d2h_bytes(p.pcie_d2h_bytes);
  out->set_step_seconds(p.step_seconds);
  if (p.eval_loss > 0) out->set_eval_loss(p.eval_loss);
  out->set_router_aux_loss(p.router_aux_loss);
  out->set_mfu(p.mfu);
  if (p.evaluation.has_value()) *out->mutable_evaluation() = EvaluationToProto(*p.evaluation, p.step);
  out->set_device(device);
}

}  // namespace

bool IsTerminal(v1::Job::State state) {
  return state == v1::Job::SUCCEEDED || state == v1::Job::FAILED || state == v1::Job::CANCELLED;
}

Scheduler::Scheduler(JobStore* store, WatchHub* hub, SchedulerOptions options)
    : store_(store),
      hub_(hub),
      options_(std::move(options)),
      admission_(AdmissionOptions{.projects = options_.projects,
                                  .max_queued_per_client = options_.max_queued_per_client,
                                  .preemption = options_.preemption,
                                  .preemption_min_run = options_.preemption_min_run,
                                  .device_word = DeviceWord()}) {}

Scheduler::~Scheduler() { Drain(absl::InfiniteDuration()); }

absl::Status Scheduler::Start() {
  if (options_.devices.empty()) return absl::InvalidArgumentError("scheduler: no devices to run jobs on");
  if (options_.daemon_id.empty()) return absl::InvalidArgumentError("scheduler: empty daemon id");
  if (options_.heartbeat <= absl::ZeroDuration() || options_.lease <= options_.heartbeat) {
    return absl::InvalidArgumentError("scheduler: the lease must be longer than the heartbeat period");
  }
  // Recover what the previous process left behind: with a store of its own, every active job;
  // in a fleet, those of this daemon id (the other daemons' are reaped as their leases expire).
  OOMB_RETURN_IF_ERROR(
      ReapLeases(ReapRequest{.keep_owner = "", .dead_owners = {options_.daemon_id}, .all = !options_.shared_store},
                 /*at_start=*/true));
  OOMB_ASSIGN_OR_RETURN(std::vector<v1::Job> validating, store_->ListByState({v1::Job::VALIDATING}));
  std::vector<std::string> to_scan;
  for (const v1::Job& job : validating) {
    const std::string id = ParseStoredName(job.name()).id;
    if (options_.validator) {
      to_scan.push_back(id);
      continue;
    }
    absl::StatusOr<UpdateResult> r = store_->Update(id, [](v1::Job* j, std::vector<v1::JobEvent>* events) {
      if (j->state() == v1::Job::VALIDATING)
        SetState(j, v1::Job::QUEUED, "queued again after a server restart", events);
      return absl::OkStatus();
    });
    if (!r.ok()) return r.status();
    Committed(r->job, r->events);
  }
  {
    absl::MutexLock lock(&mu_);
    for (std::string& id : to_scan) validating_.push_back(std::move(id));
    active_threads_ = (options_.hold ? 0 : static_cast<int>(options_.devices.size())) + (options_.validator ? 1 : 0);
    busy_.assign(options_.devices.size(), false);
  }
  if (options_.validator) threads_.emplace_back([this] { ValidatorLoop(); });
  if (options_.hold) spdlog::warn("scheduler: hold is set; jobs are queued but none is started");
  for (size_t slot = 0; slot < options_.devices.size() && !options_.hold; ++slot) {
    threads_.emplace_back([this, slot] { WorkerLoop(slot); });
  }
  fleet_thread_ = std::thread([this] { FleetLoop(); });
  return absl::OkStatus();
}

absl::Status Scheduler::Recover(v1::Job* j, std::vector<v1::JobEvent>* events, bool at_start) const {
  const std::string why =
      at_start ? "the server stopped"
               : absl::StrCat("the lease of daemon ", j->daemon(), " expired (it stopped, or lost the job store)");
  switch (j->state()) {
    case v1::Job::RUNNING:
      SetState(j, v1::Job::RECOVERING, at_start ? why + " while the job ran" : why, events);
      SetState(j, v1::Job::QUEUED, "queued to resume from its last checkpoint", events);
      break;
    case v1::Job::RECOVERING:
      SetState(j, v1::Job::QUEUED, "queued again after a server restart", events);
      break;
    case v1::Job::PAUSING:
      SetState(j, v1::Job::PAUSED, absl::StrCat("paused (", why, " while pausing)"), events);
      break;
    case v1::Job::CANCELLING:
      SetState(j, v1::Job::CANCELLED, absl::StrCat("cancelled (", why, " while cancelling)"), events);
      break;
    default:
      break;
  }
  return absl::OkStatus();
}

absl::Status Scheduler::ReapLeases(const ReapRequest& request, bool at_start) {
  OOMB_ASSIGN_OR_RETURN(std::vector<UpdateResult> reaped,
                        store_->Reap(request, [this, at_start](v1::Job* j, std::vector<v1::JobEvent>* events) {
                          return Recover(j, events, at_start);
                        }));
  bool queued = false;
  for (const UpdateResult& r : reaped) {
    Committed(r.job, r.events);
    queued |= r.job.state() == v1::Job::QUEUED;
    spdlog::info("recovered {}: now {}", r.job.name(), v1::Job::State_Name(r.job.state()));
  }
  if (queued) {
    absl::MutexLock lock(&mu_);
    WakeWorkersLocked();
  }
  return absl::OkStatus();
}

bool Scheduler::Eligible(const std::string& requested, const std::string& device) const {
  if (requested == "auto" || requested.empty() || requested == device) return true;
  return requested == "cuda" && absl::StartsWith(device, "cuda");
}

absl::Status Scheduler::CheckPlacement(const JobConfig& job) const {
  const size_t eligible = EligibleDevices(job).size();
  if (eligible >= static_cast<size_t>(job.resources.gpus)) return absl::OkStatus();
  std::string devices;
  for (const std::string& d : options_.devices) absl::StrAppend(&devices, devices.empty() ? "" : ", ", d);
  if (eligible == 0) {
    return absl::InvalidArgumentError(absl::StrCat("resources.device: '", job.resources.device,
                                                   "' is not available on this server (devices: ", devices, ")"));
  }
  return absl::InvalidArgumentError(absl::StrCat("resources.gpus: ", job.resources.gpus, " devices asked for, but ",
                                                 eligible, " of this server's may run the job (resources.device '",
                                                 job.resources.device, "'; devices: ", devices, ")"));
}

std::vector<std::string> Scheduler::EligibleDevices(const JobConfig& job) const {
  std::vector<std::string> out;
  for (const std::string& d : options_.devices) {
    if (Eligible(job.resources.device, d)) out.push_back(d);
  }
  return out;
}

absl::StatusOr<v1::Job> Scheduler::TransitionLocked(const std::string& id, const JobMutation& mutate) {
  OOMB_ASSIGN_OR_RETURN(UpdateResult r, store_->Update(id, mutate));
  Committed(r.job, r.events);
  cv_.SignalAll();
  return r.job;
}

absl::StatusOr<v1::Job> Scheduler::Append(const std::string& id, const JobMutation& mutate) {
  OOMB_ASSIGN_OR_RETURN(UpdateResult r, store_->Update(id, mutate));
  Committed(r.job, r.events);
  return r.job;
}

void Scheduler::Committed(const v1::Job& job, const std::vector<v1::JobEvent>& events) {
  hub_->Publish(ParseStoredName(job.name()).id, events);
  if (options_.metrics == nullptr) return;
  for (const v1::JobEvent& e : events) {
    if (e.type() == v1::JobEvent::STATE_CHANGED) options_.metrics->StateEntered(job, e.state());
  }
}

void Scheduler::WakeWorkersLocked() { cv_.SignalAll(); }

absl::StatusOr<v1::Job> Scheduler::Submit(const v1::JobSpec& effective, const JobConfig& config,
                                          const std::string& job_id, const std::string& request_id, bool* created,
                                          const SubmitOptions& options) {
  const v1::DatasetSummary* dataset = options.dataset;
  const std::string& creator = options.creator;
  if (draining_) return absl::UnavailableError("the server is shutting down; submit to another server or retry later");
  absl::MutexLock lock(&mu_);
  // Counted and inserted under one lock: concurrent submits cannot all see room for one more.
  OOMB_RETURN_IF_ERROR(admission_.Admit(AdmissionRequest{.project = options.project,
                                                         .creator = creator,
                                                         .gpus = config.resources.gpus,
                                                         .priority = config.resources.priority},
                                        *store_));
  if (!config.checkpoint.dir.empty()) OOMB_RETURN_IF_ERROR(CheckCheckpointDirUnusedLocked(config, job_id, request_id));
  for (int attempt = 0;; ++attempt) {
    std::string id = job_id;
    if (id.empty()) {
      static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
      static std::mt19937_64 rng{std::random_device{}()};
      id = "job-";
      for (int i = 0; i < 10; ++i) id += kAlphabet[rng() % 36];
    }
    v1::Job job;
    job.set_name(JobName(options.project, id));
    *job.mutable_spec() = effective;
    const bool validate = dataset == nullptr && options_.validator;
    job.set_state(validate ? v1::Job::VALIDATING : v1::Job::QUEUED);
    if (dataset != nullptr) *job.mutable_dataset() = *dataset;
    *job.mutable_create_time() = TimeUtil::GetCurrentTime();
    job.mutable_labels()->insert(config.labels.begin(), config.labels.end());
    job.set_priority(config.resources.priority);
    job.set_creator(creator);
    job.set_checkpoint_dir(options_.files->CheckpointDir(id, config));
    job.mutable_progress()->set_total_steps(config.training.max_steps);
    std::vector<v1::JobEvent> events = {
        validate ? StateEvent(v1::Job::VALIDATING, "validating: reading and checking the datasets")
                 : StateEvent(v1::Job::QUEUED, "queued")};
    if (dataset != nullptr) events.push_back(DataScanEvent(*dataset));
    for (const std::string& w : options.warnings) {
      job.add_warnings(w);
      events.push_back(WarningEvent(w));
    }
    for (v1::JobEvent& e : events) e.set_actor(options.actor);
    absl::StatusOr<CreateResult> r = store_->Create(job, request_id, events);
    if (!r.ok() && r.status().code() == absl::StatusCode::kAlreadyExists && job_id.empty() && attempt < 5) continue;
    if (!r.ok()) return r.status();
    if (created != nullptr) *created = r->created;
    if (r->created && options_.metrics != nullptr) options_.metrics->StateEntered(r->job, r->job.state());
    if (r->created && validate) {
      validating_.push_back(id);
      cv_.SignalAll();
    } else if (r->created) {
      WakeWorkersLocked();
      MaybePreemptLocked();
    }
    v1::Job out = r->job;
    return out;
  }
}

namespace {

// Whether directory `a` is `b`, or one holds the other (component-wise, lexically).
bool Overlap(const std::string& a, const std::string& b) {
  const std::filesystem::path pa = std::filesystem::path(a).lexically_normal();
  const std::filesystem::path pb = std::filesystem::path(b).lexically_normal();
  auto ia = pa.begin(), ib = pb.begin();
  for (; ia != pa.end() && ib != pb.end(); ++ia, ++ib) {
    if (ia->empty() || ib->empty()) break;  // a trailing separator
    if (*ia != *ib) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::optional<v1::Job>> Scheduler::JobOfRequest(const std::string& request_id) {
  OOMB_ASSIGN_OR_RETURN(const std::optional<std::string> id, store_->JobOfRequest(request_id));
  if (!id.has_value()) return std::nullopt;
  absl::StatusOr<v1::Job> job = store_->Get(*id);
  if (absl::IsNotFound(job.status())) return std::nullopt;  // deleted since
  if (!job.ok()) return job.status();
  return *std::move(job);
}

absl::Status Scheduler::CheckCheckpointDirUnusedLocked(const JobConfig& job, const std::string& job_id,
                                                       const std::string& request_id) {
  if (!request_id.empty()) {
    OOMB_ASSIGN_OR_RETURN(std::optional<std::string> earlier, store_->JobOfRequest(request_id));
    if (earlier.has_value()) return absl::OkStatus();  // a retry: Create returns that job
  }
  ListQuery q;
  q.page_size = 500;
  for (;;) {
    OOMB_ASSIGN_OR_RETURN(ListResult page, store_->List(q));
    for (const v1::Job& other : page.jobs) {
      if (ParseStoredName(other.name()).id != job_id && Overlap(other.checkpoint_dir(), job.checkpoint.dir)) {
        return WithReason(
            absl::FailedPreconditionError(absl::StrCat(
                "checkpoint.dir: ", job.checkpoint.dir, " is or holds, or lies inside, ", other.checkpoint_dir(),
                ", the checkpoint directory of ", other.name(), "; a checkpoint directory belongs to one job")),
            Reason::kCheckpointDirTaken);
      }
    }
    if (page.next_position == 0) return absl::OkStatus();
    q.before_position = page.next_position;
  }
}

absl::StatusOr<v1::Job> Scheduler::Cancel(const std::string& id, const std::string& actor) {
  absl::MutexLock lock(&mu_);
  OOMB_ASSIGN_OR_RETURN(
      v1::Job job, TransitionLocked(id, By(actor, [](v1::Job* j, std::vector<v1::JobEvent>* events) {
                                      switch (j->state()) {
                                        case v1::Job::QUEUED:
                                        case v1::Job::PAUSED:
                                        case v1::Job::RECOVERING:
                                        case v1::Job::VALIDATING:
                                          SetState(j, v1::Job::CANCELLED, "cancelled", events);
                                          return absl::OkStatus();
                                        case v1::Job::RUNNING:
                                        case v1::Job::PAUSING:
                                          SetState(j, v1::Job::CANCELLING, "cancelling at the next chunk boundary",
                                                   events);
                                          return absl::OkStatus();
                                        case v1::Job::CANCELLING:
                                          return absl::OkStatus();  // already on its way
                                        default:
                                          return IllegalTransition(
                                              *j, "cancel", "VALIDATING, QUEUED, RUNNING, PAUSING, PAUSED, RECOVERING");
                                      }
                                    })));
  if (auto it = running_.find(id); it != running_.end()) it->second.stop->store(kStopCancel);
  return job;
}

absl::StatusOr<v1::Job> Scheduler::Pause(const std::string& id, const std::string& actor) {
  absl::MutexLock lock(&mu_);
  OOMB_ASSIGN_OR_RETURN(v1::Job job, TransitionLocked(id, By(actor, [](v1::Job* j, std::vector<v1::JobEvent>* events) {
                                                        switch (j->state()) {
                                                          case v1::Job::QUEUED:
                                                            SetState(j, v1::Job::PAUSED, "paused", events);
                                                            return absl::OkStatus();
                                                          case v1::Job::RUNNING:
                                                            SetState(j, v1::Job::PAUSING,
                                                                     "pausing: checkpoint at the next chunk boundary",
                                                                     events);
                                                            return absl::OkStatus();
                                                          default:
                                                            return IllegalTransition(*j, "pause", "QUEUED, RUNNING");
                                                        }
                                                      })));
  if (auto it = running_.find(id); it != running_.end()) {
    int expected = kNoStop;
    it->second.stop->compare_exchange_strong(expected, kStopPause);
    it->second.drain_pause = false;
  }
  return job;
}

absl::StatusOr<v1::Job> Scheduler::Resume(const std::string& id, const std::string& actor) {
  if (draining_) return absl::UnavailableError("the server is shutting down; resume the job after it restarts");
  absl::MutexLock lock(&mu_);
  OOMB_ASSIGN_OR_RETURN(v1::Job job, TransitionLocked(id, By(actor, [](v1::Job* j, std::vector<v1::JobEvent>* events) {
                                                        if (j->state() != v1::Job::PAUSED)
                                                          return IllegalTransition(*j, "resume", "PAUSED");
                                                        SetState(j, v1::Job::QUEUED,
                                                                 "resumed: queued to continue from its last checkpoint",
                                                                 events);
                                                        return absl::OkStatus();
                                                      })));
  WakeWorkersLocked();
  MaybePreemptLocked();
  return job;
}

absl::Status Scheduler::Delete(const std::string& id) {
  absl::MutexLock lock(&mu_);
  return store_->Delete(id, [](const v1::Job& j) {
    if (!IsTerminal(j.state())) return IllegalTransition(j, "delete", "SUCCEEDED, FAILED, CANCELLED");
    return absl::OkStatus();
  });
}

absl::StatusOr<v1::Job> Scheduler::Update(const std::string& id, const v1::Job& update,
                                          const std::vector<std::string>& paths, const std::string& actor) {
  const JobMutation apply = [&](v1::Job* j, std::vector<v1::JobEvent>* events) {
    if (IsTerminal(j->state())) return IllegalTransition(*j, "update", "any state but SUCCEEDED, FAILED, CANCELLED");
    for (const std::string& path : paths) {
      if (path == "labels") {  // Job.labels mirrors spec.labels
        *j->mutable_labels() = update.labels();
        *j->mutable_spec()->mutable_labels() = update.labels();
      } else if (path == "priority") {  // Job.priority mirrors spec.resources.priority
        j->set_priority(update.priority());
        j->mutable_spec()->mutable_resources()->set_priority(update.priority());
      } else if (path == "spec.display_name") {
        j->mutable_spec()->set_display_name(update.spec().display_name());
      }
    }
    v1::JobEvent e;
    e.set_type(v1::JobEvent::LOG);
    e.set_message(BoundedText(absl::StrCat("updated: ", absl::StrJoin(paths, ", "))));
    events->push_back(std::move(e));
    return absl::OkStatus();
  };
  absl::MutexLock lock(&mu_);
  OOMB_ASSIGN_OR_RETURN(v1::Job job, TransitionLocked(id, By(actor, apply)));
  if (auto it = running_.find(id); it != running_.end()) it->second.priority = job.priority();
  MaybePreemptLocked();
  return job;
}

void Scheduler::FillQueueState(v1::Job* job, const std::map<std::string, ProjectUsage>* usage) {
  job->set_queue_position(0);
  job->clear_waiting_reason();
  if (job->state() != v1::Job::QUEUED) return;
  absl::StatusOr<int32_t> position = store_->QueuePosition(ParseStoredName(job->name()).id);
  if (!position.ok()) return;
  job->set_queue_position(*position);
  std::string reason;
  if (admission_.has_projects()) {
    absl::StatusOr<std::map<std::string, ProjectUsage>> read;
    if (usage == nullptr) {
      read = store_->Usage();
      if (read.ok()) usage = &*read;
    }
    if (usage != nullptr) reason = admission_.QuotaReason(*job, *usage);
  }
  if (reason.empty()) {
    const int gpus = std::max(1, job->spec().resources().gpus());
    reason = *position > 1 ? absl::StrCat(*position - 1, *position == 2 ? " job" : " jobs", " ahead in the queue")
                           : absl::StrCat("next in the queue; waiting for ", gpus, " idle ",
                                          gpus == 1 ? DeviceWord().substr(0, DeviceWord().size() - 1) : DeviceWord());
  }
  job->set_waiting_reason(reason);
}

std::string Scheduler::DeviceWord() const {
  for (const std::string& d : options_.devices) {
    if (absl::StartsWith(d, "cuda")) return "GPUs";
  }
  return "devices";
}

std::map<std::string, int32_t> Scheduler::ClaimableDevices(size_t slot) const {
  const std::string& device = options_.devices[slot];
  std::vector<std::string> values = {"", "auto", device};
  if (absl::StartsWith(device, "cuda") && device != "cuda") values.push_back("cuda");
  std::map<std::string, int32_t> out;
  for (const std::string& v : values) {
    int32_t n = 0;
    for (const std::string& d : options_.devices) n += Eligible(v, d);
    out[v] = n;
  }
  return out;
}

absl::StatusOr<std::optional<ClaimResult>> Scheduler::ClaimNextLocked(size_t slot, std::vector<size_t>* slots) {
  slots->clear();
  if (busy_[slot]) return std::optional<ClaimResult>();  // reserved by another thread's run
  ClaimRequest request;
  request.owner = options_.daemon_id;
  request.devices = ClaimableDevices(slot);
  request.lease = options_.lease;
  request.quotas = admission_.Quotas();
  std::string on;
  // Runs inside the store's transaction, with mu_ held (busy_ cannot change meanwhile).
  absl::StatusOr<std::optional<ClaimResult>> claimed =
      store_->Claim(request, [&](v1::Job* j, std::vector<v1::JobEvent>* events) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        if (j->state() != v1::Job::QUEUED) return IllegalTransition(*j, "start", "QUEUED");
        const int gpus = std::max(1, j->spec().resources().gpus());
        slots->assign(1, slot);
        for (size_t other = 0; other < busy_.size() && static_cast<int>(slots->size()) < gpus; ++other) {
          if (other != slot && !busy_[other] && Eligible(j->spec().resources().device(), options_.devices[other])) {
            slots->push_back(other);
          }
        }
        if (static_cast<int>(slots->size()) < gpus) {  // the head of the queue waits for its devices
          return absl::ResourceExhaustedError(absl::StrCat(j->name(), " waits for ", gpus, " idle devices"));
        }
        std::vector<std::string> devices;
        for (size_t s : *slots) devices.push_back(options_.devices[s]);
        on = absl::StrJoin(devices, ",");
        if (options_.shared_store) absl::StrAppend(&on, " of ", options_.daemon_id);
        j->set_attempt(j->attempt() + 1);
        if (!j->has_start_time()) *j->mutable_start_time() = TimeUtil::GetCurrentTime();
        j->clear_error();
        j->clear_preempted_by();
        SetState(j, v1::Job::RUNNING, absl::StrCat("running on ", on, " (attempt ", j->attempt(), ")"), events);
        return absl::OkStatus();
      });
  if (!claimed.ok() && claimed.status().code() == absl::StatusCode::kResourceExhausted) {
    slots->clear();
    return std::optional<ClaimResult>();
  }
  if (!claimed.ok() || !claimed->has_value()) {
    slots->clear();
    return claimed;
  }
  for (size_t s : *slots) busy_[s] = true;
  Committed((*claimed)->update.job, (*claimed)->update.events);
  return claimed;
}

void Scheduler::WorkerLoop(size_t slot) {
  const std::string& device = options_.devices[slot];
  std::string last_error;
  for (;;) {
    v1::Job job;
    auto stop = std::make_shared<std::atomic<int>>(kNoStop);
    absl::Duration queue_wait;
    std::vector<std::string> devices;  // the run's, this thread's first
    std::vector<size_t> slots;
    {
      absl::MutexLock lock(&mu_);
      for (;;) {
        if (stopping_ || draining_) {
          --active_threads_;
          cv_.SignalAll();
          return;
        }
        absl::StatusOr<std::optional<ClaimResult>> claimed = ClaimNextLocked(slot, &slots);
        if (claimed.ok() && claimed->has_value()) {
          job = std::move((*claimed)->update.job);
          queue_wait = (*claimed)->queued;
          last_error.clear();
          break;
        }
        if (!claimed.ok() && claimed.status().ToString() != last_error) {  // say it once, not every poll
          last_error = claimed.status().ToString();
          spdlog::warn("{}: cannot claim a job: {}", device, last_error);
        }
        // Woken when a job is queued here or (through the fleet thread) elsewhere, or devices
        // free up; the timeout polls in case a change notice was lost.
        cv_.WaitWithTimeout(&mu_, options_.heartbeat);
      }
      for (size_t s : slots) devices.push_back(options_.devices[s]);
      running_[ParseStoredName(job.name()).id] = Running{.device = absl::StrJoin(devices, ","),
                                                         .stop = stop,
                                                         .drain_pause = false,
                                                         .lease_lost = false,
                                                         .slots = slots,
                                                         .project = ParseStoredName(job.name()).project,
                                                         .priority = job.priority(),
                                                         .started = absl::Now()};
    }
    if (options_.metrics != nullptr) options_.metrics->RunStarted(device, job, queue_wait);
    RunOne(job, devices, stop);
    if (options_.metrics != nullptr) options_.metrics->RunStopped(device);
    absl::MutexLock lock(&mu_);
    for (size_t s : slots) busy_[s] = false;
    cv_.SignalAll();
  }
}

void Scheduler::ValidatorLoop() {
  for (;;) {
    std::string id;
    {
      absl::MutexLock lock(&mu_);
      while (validating_.empty() && !stopping_ && !draining_) cv_.Wait(&mu_);
      if (stopping_ || draining_) {  // what is left stays VALIDATING and is scanned on restart
        --active_threads_;
        cv_.SignalAll();
        return;
      }
      id = validating_.front();
      validating_.pop_front();
    }
    Validate(id);
  }
}

void Scheduler::Validate(const std::string& id) {
  absl::StatusOr<v1::Job> job = store_->Get(id);
  if (!job.ok() || job->state() != v1::Job::VALIDATING) return;  // deleted or cancelled meanwhile
  spdlog::info("{}: validating the datasets", job->name());
  absl::StatusOr<v1::DatasetSummary> summary;
  absl::StatusOr<JobConfig> config = ResolveJobSpec(job->spec());
  const std::string project = ParseStoredName(job->name()).project;
  absl::StatusOr<ResolvedInputs> resolved = config.ok() ? ResolveNamedInputs(*config, project, *store_, *options_.files,
                                                                             /*caller=*/nullptr)
                                                        : absl::StatusOr<ResolvedInputs>(config.status());
  absl::StatusOr<std::shared_ptr<const FileAccess>> inputs =
      resolved.ok() ? options_.files->Inputs(project, resolved->grants) : resolved.status();
  if (!resolved.ok()) {
    summary = resolved.status();
  } else if (!inputs.ok()) {
    summary = inputs.status();
  } else {
    try {
      summary = options_.validator(resolved->job, **inputs);
    } catch (const std::exception& e) {  // the validator's contract is not to throw; be safe anyway
      summary = absl::InternalError(absl::StrCat("reading the datasets threw: ", e.what()));
    }
  }
  std::vector<std::string> warnings;
  if (summary.ok() && options_.context_warnings)
    warnings = options_.context_warnings(*config, summary->longest_sample());
  absl::MutexLock lock(&mu_);
  absl::StatusOr<v1::Job> done = TransitionLocked(id, [&](v1::Job* j, std::vector<v1::JobEvent>* events) {
    if (j->state() != v1::Job::VALIDATING) return absl::OkStatus();  // cancelled while scanning
    if (summary.ok()) {
      *j->mutable_dataset() = *summary;
      SetState(j, v1::Job::QUEUED,
               absl::StrCat("validated: ", summary->samples(), " samples, ", summary->tokens(), " tokens, ",
                            summary->sequences(), " sequences per epoch; queued"),
               events);
      for (const std::string& w : warnings) {
        j->add_warnings(w);
        events->push_back(WarningEvent(w));
      }
      return absl::OkStatus();
    }
    const absl::Status& s = summary.status();
    // What the scan finds wrong is the data's fault unless it says otherwise.
    Fail(j, absl::IsInvalidArgument(s) && !ReasonOf(s).has_value() ? WithReason(s, Reason::kBadData) : s, events);
    return absl::OkStatus();
  });
  if (!done.ok()) {
    spdlog::error("{}: recording the validation: {}", id, done.status().ToString());
    return;
  }
  spdlog::info("{}: {}", done->name(), v1::Job::State_Name(done->state()));
  if (done->state() == v1::Job::QUEUED) {
    WakeWorkersLocked();
    MaybePreemptLocked();
  }
}

RunOptions Scheduler::RunOptionsFor(const std::string& id, const std::vector<std::string>& devices,
                                    const JobConfig& job, std::shared_ptr<std::atomic<int>> stop, bool* timed_out) {
  const std::string device = devices.front();  // the slot its steps and checkpoints are reported under
  RunOptions o;
  o.devices = devices;
  absl::StatusOr<std::vector<v1::Checkpoint>> checkpoints = store_->ListCheckpoints(id);
  o.resume = checkpoints.ok() && !checkpoints->empty();
  o.kv_stats = options_.kv_stats;
  o.on_step = [this, id, device](const StepReport& p) {
    RecordEvent(id, "step", [&p, &device](v1::Job* j, std::vector<v1::JobEvent>* events) {
      FillProgress(p, device, j->mutable_progress());
      v1::JobEvent e;
      e.set_type(v1::JobEvent::STEP);
      *e.mutable_progress() = j->progress();
      events->push_back(std::move(e));
      return absl::OkStatus();
    });
    if (options_.metrics != nullptr) options_.metrics->Step(device, p);
  };
  o.on_checkpoint = [this, id, device](const CheckpointInfo& c) {
    RecordEvent(id, "a checkpoint", [&c](v1::Job*, std::vector<v1::JobEvent>* events) {
      v1::JobEvent e;
      e.set_type(v1::JobEvent::CHECKPOINT_SAVED);
      e.mutable_checkpoint()->set_step(c.step);
      e.mutable_checkpoint()->set_path(c.path);
      e.mutable_checkpoint()->set_bytes(c.bytes);
      e.mutable_checkpoint()->set_final(c.final);
      e.set_message(absl::StrCat("checkpoint at step ", c.step, ": ", c.path));
      events->push_back(std::move(e));
      return absl::OkStatus();
    });
    if (options_.metrics != nullptr) options_.metrics->CheckpointSaved(device, c);
  };
  o.on_warning = [this, id](const std::string& message) {
    RecordEvent(id, "a warning", [&message](v1::Job*, std::vector<v1::JobEvent>* events) {
      events->push_back(WarningEvent(message));
      return absl::OkStatus();
    });
  };
  o.on_log = [this, id](const std::string& message) {
    RecordEvent(id, "a log line", [&message](v1::Job*, std::vector<v1::JobEvent>* events) {
      events->push_back(LogEvent(message));
      return absl::OkStatus();
    });
  };
  const auto started = std::chrono::steady_clock::now();
  const int64_t max_runtime = job.resources.max_runtime_seconds;
  o.poll_stop = [stop, started, max_runtime, timed_out]() {
    const int f = stop->load();
    if (f == kStopCancel || f == kStopAbandon) return StopRequest::kCancel;
    if (f == kStopPause) return StopRequest::kPause;
    if (f == kStopPreempt) return StopRequest::kPauseAtStepEnd;
    if (max_runtime > 0 && std::chrono::steady_clock::now() - started > std::chrono::seconds(max_runtime)) {
      *timed_out = true;
      return StopRequest::kCancel;
    }
    return StopRequest::kNone;
  };
  return o;
}

void Scheduler::RecordEvent(const std::string& id, const char* what, JobMutation mutate) {
  absl::StatusOr<v1::Job> r = Append(id, IfStillOurs(std::move(mutate)));
  if (!r.ok()) spdlog::error("job-{}: recording {}: {}", id, what, r.status().ToString());
}

void Scheduler::RunOne(const v1::Job& job, const std::vector<std::string>& devices,
                       std::shared_ptr<std::atomic<int>> stop) {
  const std::string id = ParseStoredName(job.name()).id;
  absl::StatusOr<RunResult> result;
  bool timed_out = false;
  absl::StatusOr<JobConfig> config = ResolveJobSpec(job.spec());
  const std::string project = ParseStoredName(job.name()).project;
  // The inputs it names by resource name, resolved again: one deleted meanwhile fails the run.
  absl::StatusOr<ResolvedInputs> resolved =
      config.ok() ? ResolveNamedInputs(*config, project, *store_, *options_.files, /*caller=*/nullptr)
                  : absl::StatusOr<ResolvedInputs>(config.status());
  absl::StatusOr<std::shared_ptr<const FileAccess>> inputs =
      resolved.ok() ? options_.files->Inputs(project, resolved->grants) : resolved.status();
  if (!resolved.ok()) {
    result = resolved.status();
  } else if (!inputs.ok()) {
    result = inputs.status();
  } else {
    RunOptions o = RunOptionsFor(id, devices, resolved->job, stop, &timed_out);
    o.files = *std::move(inputs);  // the project's roots, and the grants of its named inputs
    o.spec_yaml = spec::ToYaml(job.spec());
    spdlog::info("{}: running on {} (resume={})", job.name(), absl::StrJoin(devices, ","), o.resume);
    result = Execute(id, job.checkpoint_dir(), resolved->job, std::move(o), project);
  }
  RunEnd end{.timed_out = timed_out, .abandoned = stop->load() == kStopAbandon};
  absl::MutexLock lock(&mu_);
  if (auto it = running_.find(id); it != running_.end()) {
    end.drain_pause = it->second.drain_pause;
    end.lease_lost = it->second.lease_lost;
    running_.erase(it);
  }
  if (end.lease_lost) {
    spdlog::warn("{}: stopped; its lease was taken by another daemon, which now runs it", job.name());
    return;
  }
  bool requeue = false;
  const int max_retries = job.spec().resources().max_retries();
  absl::StatusOr<v1::Job> done = TransitionLocked(
      id, IfStillOurs([&](v1::Job* j, std::vector<v1::JobEvent>* events) {
        if (result.ok()) {
          RecordOutcome(*result, end, j, events);
        } else if (IsRetryable(result.status()) && j->retries() < max_retries && j->state() == v1::Job::RUNNING) {
          Retry(result.status(), max_retries, j, events);
          requeue = !draining_;
        } else {
          Fail(j, RunFailure(result.status()), events);
        }
        return absl::OkStatus();
      }));
  if (!done.ok()) {
    spdlog::error("{}: recording the end of the run: {}", job.name(), done.status().ToString());
    return;
  }
  spdlog::info("{}: {}", job.name(), v1::Job::State_Name(done->state()));
  if (requeue || done->state() == v1::Job::QUEUED) {
    WakeWorkersLocked();
    MaybePreemptLocked();
  }
}

void Scheduler::RecordOutcome(const RunResult& result, const RunEnd& end, v1::Job* j,
                              std::vector<v1::JobEvent>* events) const {
  const char* const resumes = options_.shared_store ? "queued to resume from its last checkpoint on any daemon"
                                                    : "resumes from its last checkpoint on restart";
  switch (result.outcome) {
    case RunOutcome::kSucceeded:
      SetState(j, v1::Job::SUCCEEDED, "succeeded", events);
      return;
    case RunOutcome::kCancelled:
      if (end.timed_out) {
        Fail(j,
             WithReason(
                 absl::DeadlineExceededError(absl::StrCat("the job ran longer than resources.max_runtime_seconds (",
                                                          j->spec().resources().max_runtime_seconds(), " s)")),
                 Reason::kMaxRuntime),
             events);
      } else if (end.abandoned) {  // the drain's deadline passed before a checkpoint
        SetState(j, j->state() == v1::Job::PAUSING ? v1::Job::PAUSED : v1::Job::QUEUED,
                 absl::StrCat("stopped for a server shutdown before it could checkpoint; ", resumes), events);
      } else {
        SetState(j, v1::Job::CANCELLED, "cancelled", events);
      }
      return;
    case RunOutcome::kPaused:
      if (!j->preempted_by().empty() && j->state() == v1::Job::PAUSING) {
        SetState(j, v1::Job::QUEUED,
                 absl::StrCat("preempted by ", j->preempted_by(), "; queued to resume from its checkpoint"), events);
      } else if (end.drain_pause && j->state() != v1::Job::PAUSING) {
        SetState(j, v1::Job::QUEUED, absl::StrCat("stopped for a server shutdown; ", resumes), events);
      } else {
        SetState(j, v1::Job::PAUSED, "paused", events);
      }
      return;
  }
}

void Scheduler::Retry(const absl::Status& s, int max_retries, v1::Job* j, std::vector<v1::JobEvent>* events) const {
  j->set_retries(j->retries() + 1);
  events->push_back(
      WarningEvent(absl::StrCat("attempt ", j->attempt(), " failed: ", absl::StatusCodeToString(s.code()), ": ",
                                s.message(), "; retrying (retry ", j->retries(), " of ", max_retries, ")")));
  SetState(j, v1::Job::QUEUED, "queued for a retry from its last checkpoint", events);
}

absl::StatusOr<RunResult> Scheduler::Execute(const std::string& id, const std::string& checkpoint_dir,
                                             const JobConfig& job, RunOptions options, const std::string& project) {
  absl::StatusOr<Dir> dir = options_.files->ClaimCheckpointDir(id, checkpoint_dir, project);
  if (!dir.ok()) return dir.status();
  options.checkpoint_dir = *std::move(dir);
  try {
    return options_.runner(job, options);
  } catch (const std::exception& e) {  // the runner's contract is not to throw; be safe anyway
    return WithReason(absl::InternalError(absl::StrCat("the trainer threw: ", e.what())), Reason::kInternal);
  }
}

JobMutation Scheduler::IfStillOurs(JobMutation mutate) const {
  return [this, mutate = std::move(mutate)](v1::Job* j, std::vector<v1::JobEvent>* events) {
    if (j->daemon() != options_.daemon_id) {
      return absl::FailedPreconditionError(
          absl::StrCat(j->name(), " is no longer leased to this daemon (", options_.daemon_id, "); it is ",
                       v1::Job::State_Name(j->state()), j->daemon().empty() ? "" : " on " + j->daemon()));
    }
    return mutate(j, events);
  };
}

void Scheduler::HeartbeatOnce() {
  absl::MutexLock lock(&mu_);  // against claims: a job claimed now is in running_ and the store
  absl::StatusOr<std::vector<LeasedJob>> leased = store_->Heartbeat(options_.daemon_id, options_.lease);
  if (!leased.ok()) {
    spdlog::warn("heartbeat: {} (jobs here lose their leases after {})", leased.status().ToString(),
                 absl::FormatDuration(options_.lease));
    return;
  }
  std::map<std::string, v1::Job::State> states;
  for (const LeasedJob& l : *leased) states[l.job_id] = l.state;
  for (auto& [id, r] : running_) {
    auto it = states.find(id);
    if (it == states.end()) {
      if (!r.lease_lost) spdlog::warn("jobs/{}: the lease was lost to another daemon; stopping the run here", id);
      r.lease_lost = true;
      r.stop->store(kStopCancel);
    } else if (it->second == v1::Job::CANCELLING) {
      r.stop->store(kStopCancel);
    } else if (it->second == v1::Job::PAUSING) {
      int expected = kNoStop;
      if (r.stop->compare_exchange_strong(expected, kStopPause)) r.drain_pause = false;
    }
  }
  MaybePreemptLocked();  // a running job may have passed its minimum run time
}

void Scheduler::OnRemoteChanges(const std::vector<JobChange>& changes) {
  for (const JobChange& c : changes) hub_->Changed(c.job_id);
  absl::MutexLock lock(&mu_);
  bool queued = false;
  for (const JobChange& c : changes) {
    if (c.state == v1::Job::QUEUED) {
      WakeWorkersLocked();
      queued = true;
    }
    auto it = running_.find(c.job_id);
    if (it == running_.end()) continue;
    if (c.state == v1::Job::CANCELLING) {
      it->second.stop->store(kStopCancel);
    } else if (c.state == v1::Job::PAUSING) {
      int expected = kNoStop;
      if (it->second.stop->compare_exchange_strong(expected, kStopPause)) it->second.drain_pause = false;
    }
  }
  if (queued) MaybePreemptLocked();
}

void Scheduler::FleetLoop() {
  // Short waits: Drain() stops this thread within one of them.
  constexpr absl::Duration kMaxWait = absl::Milliseconds(250);
  absl::Time next_beat = absl::Now() + options_.heartbeat;
  std::string last_error;
  while (!fleet_stop_) {
    const absl::Duration wait = std::clamp(next_beat - absl::Now(), absl::ZeroDuration(), kMaxWait);
    absl::StatusOr<std::vector<JobChange>> changes = store_->WaitForChanges(wait);
    if (changes.ok()) {
      if (!changes->empty()) OnRemoteChanges(*changes);
    } else if (changes.status().ToString() != last_error) {
      last_error = changes.status().ToString();
      spdlog::warn("waiting for other daemons' changes: {}", last_error);
    }
    if (absl::Now() < next_beat) continue;
    next_beat = absl::Now() + options_.heartbeat;
    HeartbeatOnce();
    if (absl::Status s = ReapLeases(ReapRequest{.keep_owner = options_.daemon_id, .dead_owners = {}, .all = false},
                                    /*at_start=*/false);
        !s.ok()) {
      spdlog::warn("reaping expired leases: {}", s.ToString());
    }
  }
}

bool Scheduler::MayPreemptLocked(const Running& victim, const v1::Job& waiting, absl::Time now) const {
  if (victim.lease_lost || victim.stop->load() != kNoStop) return false;  // already stopping
  return admission_.MayPreempt(
      RunningJob{.project = victim.project, .priority = victim.priority, .started = victim.started}, waiting, now);
}

void Scheduler::MaybePreemptLocked() {
  if (options_.preemption == PreemptionScope::kNone || stopping_ || draining_ || options_.hold || running_.empty()) {
    return;
  }
  absl::StatusOr<std::vector<v1::Job>> queued = store_->ListByState({v1::Job::QUEUED});
  if (!queued.ok() || queued->empty()) return;
  // The claim order: highest priority, then oldest (ListByState gives the oldest first).
  std::stable_sort(queued->begin(), queued->end(),
                   [](const v1::Job& a, const v1::Job& b) { return a.priority() > b.priority(); });
  std::map<std::string, ProjectUsage> usage;
  if (admission_.has_projects()) {
    absl::StatusOr<std::map<std::string, ProjectUsage>> u = store_->Usage();
    if (!u.ok()) return;
    usage = *std::move(u);
  }
  const absl::Time now = absl::Now();
  for (const v1::Job& waiting : *queued) {
    if (!admission_.QuotaReason(waiting, usage).empty()) continue;  // its quota holds it
    const int gpus = std::max(1, waiting.spec().resources().gpus());
    std::vector<size_t> eligible;
    for (size_t slot = 0; slot < options_.devices.size(); ++slot) {
      if (Eligible(waiting.spec().resources().device(), options_.devices[slot])) eligible.push_back(slot);
    }
    if (static_cast<int>(eligible.size()) < gpus) continue;  // not a job for this daemon
    // Devices it could have soon: idle ones, and those of runs already stopping.
    std::set<size_t> freeing;
    for (size_t slot : eligible) {
      if (!busy_[slot]) freeing.insert(slot);
    }
    for (const auto& [id, r] : running_) {
      if (r.stop->load() == kNoStop) continue;
      for (size_t slot : r.slots) {
        if (std::find(eligible.begin(), eligible.end(), slot) != eligible.end()) freeing.insert(slot);
      }
    }
    if (static_cast<int>(freeing.size()) >= gpus) return;  // it starts without preempting anyone
    // Victims: the lowest priority first, then the most recently started.
    std::vector<std::pair<std::string, Running*>> candidates;
    for (auto& [id, r] : running_) {
      if (MayPreemptLocked(r, waiting, now)) candidates.emplace_back(id, &r);
    }
    std::sort(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) {
      if (a.second->priority != b.second->priority) return a.second->priority < b.second->priority;
      return a.second->started > b.second->started;
    });
    std::vector<std::pair<std::string, Running*>> victims;
    for (auto& c : candidates) {
      if (static_cast<int>(freeing.size()) >= gpus) break;
      bool helps = false;
      for (size_t slot : c.second->slots) {
        if (std::find(eligible.begin(), eligible.end(), slot) != eligible.end()) helps |= freeing.insert(slot).second;
      }
      if (helps) victims.push_back(c);
    }
    // The queue's head waits for its devices (ClaimNextLocked): whatever stands behind it could
    // not start before it, so it alone is considered.
    if (static_cast<int>(freeing.size()) < gpus) return;
    for (auto& [id, victim] : victims) PreemptLocked(id, *victim, waiting);
    return;
  }
}

void Scheduler::PreemptLocked(const std::string& id, Running& victim, const v1::Job& waiting) {
  const std::string message =
      absl::StrCat("preempting: ", waiting.name(), " (priority ", waiting.priority(),
                   ") waits for its devices; checkpoint after the current step, then queued to resume");
  // The event's actor: the waiting job's creator when that is a user (not a peer's address).
  const std::string& creator = waiting.creator();
  const bool user = !creator.empty() && creator != "unix" && creator.find(':') == std::string::npos;
  absl::StatusOr<v1::Job> job =
      TransitionLocked(id, IfStillOurs(By(user ? creator : "", [&](v1::Job* j, std::vector<v1::JobEvent>* events) {
                         if (j->state() != v1::Job::RUNNING) return IllegalTransition(*j, "preempt", "RUNNING");
                         j->set_preempted_by(waiting.name());
                         SetState(j, v1::Job::PAUSING, message, events);
                         return absl::OkStatus();
                       })));
  if (!job.ok()) {
    spdlog::info("jobs/{}: not preempted: {}", id, job.status().ToString());
    return;
  }
  int expected = kNoStop;
  victim.stop->compare_exchange_strong(expected, kStopPreempt);
  spdlog::info("{}: preempted by {} (priority {} > {})", job->name(), waiting.name(), waiting.priority(),
               victim.priority);
}

bool Scheduler::Drain(absl::Duration timeout) {
  draining_ = true;
  bool checkpointed = true;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& [id, r] : running_) {
      int expected = kNoStop;
      if (r.stop->compare_exchange_strong(expected, kStopPause)) r.drain_pause = true;
    }
    cv_.SignalAll();
    const absl::Time deadline = absl::Now() + timeout;
    while (active_threads_ > 0 && !cv_.WaitWithDeadline(&mu_, deadline)) {
    }
    if (active_threads_ > 0) {
      checkpointed = false;
      for (auto& [id, r] : running_) {
        for (int expected : {kNoStop, kStopPause, kStopPreempt}) {
          if (r.stop->compare_exchange_strong(expected, kStopAbandon)) break;
        }
        spdlog::warn("job-{}: still running at the drain's deadline; stopping it without a checkpoint", id);
      }
    }
    while (active_threads_ > 0) cv_.Wait(&mu_);
  }
  fleet_stop_ = true;  // after the device threads: it renewed their jobs' leases while they stopped
  if (fleet_thread_.joinable()) fleet_thread_.join();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  return checkpointed;
}

}  // namespace oomb::server
