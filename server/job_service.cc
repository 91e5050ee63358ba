#include "server/job_service.h"

#include <atomic>
#include <deque>
#include <filesystem>
#include <optional>
#include <thread>

#include <spdlog/spdlog.h>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "proto/spec/resource_names.h"
#include "server/checkpoint_archive.h"
#include "server/grpc_status.h"
#include "server/job_spec.h"
#include "server/legacy_fields.h"
#include "server/named_inputs.h"
#include "server/notify/destination_policy.h"
#include "server/notify/webhooks.h"
#include "server/page_token.h"
#include "server/to_proto.h"
#include "worker/common/status.h"
#include "worker/hf/layer_spec.h"
#include "worker/hf/loading_code.h"
#include "worker/plan/context_window.h"
#include "worker/plan/step_time.h"

namespace oomb::server {
namespace {

// Idempotency keys are stored with the job: a UUID or a hash fits many times over.
constexpr size_t kMaxRequestIdBytes = 256;

// What creating a job may take after the last look at the caller's deadline (the store's commit,
// the reply): a caller with less time left is refused before anything is stored, rather than
// told DEADLINE_EXCEEDED after its job was.
constexpr auto kCreateMargin = std::chrono::milliseconds(250);

absl::Status CallerGone() {
  return absl::DeadlineExceededError(
      "the call's deadline passed, or would within the 250 ms that storing a job may take (or it was cancelled): no "
      "job was created");
}

constexpr int kDefaultPageSize = 50;
constexpr int kMaxPageSize = 1000;
constexpr int kDefaultEventPage = 500;
constexpr int kMaxEventPage = 5000;

// Runs a unary handler body with what the authorization step found (server/authorization.h) and
// finishes the reactor with its status.
template <typename Fn>
grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, absl::StatusOr<Authorization> authorized, Fn&& body) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const absl::Status s = authorized.ok() ? body(*authorized) : authorized.status();
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

// The fingerprint of a ListJobs filter (server/page_token.h).
uint64_t ListFilter(const v1::ListJobsRequest& req) {
  std::string key;
  absl::StrAppend(&key, req.parent(), "|");
  for (int s : req.states()) absl::StrAppend(&key, s, ",");
  std::map<std::string, std::string> labels(req.labels().begin(), req.labels().end());
  for (const auto& [k, v] : labels) absl::StrAppend(&key, k, "=", v, ";");
  return FilterHash(key);
}

// WatchJob: snapshot, replay from the store, then live events until the job is terminal.
class WatchReactor final : public grpc::ServerWriteReactor<v1::WatchJobResponse>, public WatchSubscriber {
 public:
  static constexpr size_t kMaxPending = 256;  // live events buffered before falling back to the store
  static constexpr int kBatch = 256;          // events read from the store at a time

  // `authorized` says, before each event is written, whether the caller may still see the job
  // (its token not revoked, its project still its own); when it may not, the stream ends with
  // its error.
  WatchReactor(JobStore* store, WatchHub* hub, Scheduler* scheduler, std::string job_id, int64_t after_sequence,
               std::function<absl::Status()> authorized)
      : store_(store),
        hub_(hub),
        job_id_(std::move(job_id)),
        authorized_(std::move(authorized)),
        last_sequence_(after_sequence) {
    // Subscribe before reading, so no event committed after the snapshot is missed; duplicates
    // are dropped by sequence number. Events that arrive meanwhile are queued behind the
    // snapshot, and nothing is written or re-read before it is queued (started_).
    hub_->Subscribe(job_id_, this);
    absl::StatusOr<v1::Job> job = store_->Get(job_id_);
    // Before taking mu_: the scheduler's lock is taken before the hub's and ours when events
    // are published (Scheduler::TransitionLocked), never after ours.
    if (job.ok()) scheduler->FillQueueState(&*job);
    {
      absl::MutexLock lock(&mu_);
      if (!job.ok()) {
        finish_status_ = ToGrpcStatus(job.status());
      } else {
        v1::WatchJobResponse snap;
        *snap.mutable_snapshot() = *job;
        pending_.push_front(std::move(snap));
        terminal_ = terminal_ || IsTerminal(job->state());
        reread_ = true;  // replay what the store has after `after_sequence`
      }
      started_ = true;
    }
    Pump();
  }

  void OnEvents(const std::vector<v1::JobEvent>& events) override {
    {
      absl::MutexLock lock(&mu_);
      for (const v1::JobEvent& e : events) AcceptLocked(e);
    }
    Pump();
  }

  void OnChangedElsewhere() override {
    {
      absl::MutexLock lock(&mu_);
      if (!finish_status_) reread_ = true;
    }
    Pump();
  }

  void OnShutdown() override {
    {
      absl::MutexLock lock(&mu_);
      pending_.clear();
      if (!finish_status_) {
        finish_status_ = grpc::Status(
            grpc::StatusCode::UNAVAILABLE,
            absl::StrCat("the server is shutting down; watch again with after_sequence=", last_sent_sequence_));
      }
    }
    Pump();
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (current_.has_event()) last_sent_sequence_ = current_.event().sequence();
      if (!ok && !finish_status_) finish_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
    }
    Pump();
  }

  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      if (!finish_status_) finish_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
    }
    Pump();
  }

  void OnDone() override {
    hub_->Unsubscribe(job_id_, this);
    delete this;
  }

 private:
  // Takes the next event in sequence; a gap or a full buffer switches to re-reading the store.
  void AcceptLocked(const v1::JobEvent& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finish_status_ || e.sequence() <= last_sequence_) return;
    if (e.sequence() != last_sequence_ + 1 || pending_.size() >= kMaxPending || rereading_) {
      reread_ = true;
      return;
    }
    v1::WatchJobResponse r;
    *r.mutable_event() = e;
    pending_.push_back(std::move(r));
    last_sequence_ = e.sequence();
    if (e.type() == v1::JobEvent::STATE_CHANGED && IsTerminal(e.state())) terminal_ = true;
  }

  // Starts the next write, the finish, or a store re-read; gRPC operations run without mu_.
  void Pump() {
    for (;;) {
      int64_t reread_after = -1;
      std::optional<grpc::Status> finish;
      {
        absl::MutexLock lock(&mu_);
        if (!started_ || writing_ || finished_ || rereading_) return;
        if (finish_status_) {
          finished_ = true;
          finish = *finish_status_;
        } else if (!pending_.empty()) {
          current_ = std::move(pending_.front());
          pending_.pop_front();
          writing_ = true;
        } else if (reread_) {
          reread_ = false;
          rereading_ = true;
          reread_after = last_sequence_;
        } else if (terminal_) {
          finished_ = true;
          finish = grpc::Status::OK;
        } else {
          return;  // wait for events
        }
      }
      if (finish) {
        Finish(*finish);
        return;
      }
      if (reread_after < 0) {
        if (absl::Status allowed = authorized_(); !allowed.ok()) {
          absl::MutexLock lock(&mu_);
          writing_ = false;
          finish_status_ = ToGrpcStatus(allowed);
          continue;
        }
        StartWrite(&current_);
        return;
      }
      absl::StatusOr<std::vector<v1::JobEvent>> events = store_->ListEvents(job_id_, reread_after, kBatch);
      absl::MutexLock lock(&mu_);
      rereading_ = false;
      if (!events.ok()) {
        if (!finish_status_) finish_status_ = ToGrpcStatus(events.status());
        continue;
      }
      for (const v1::JobEvent& e : *events) AcceptLocked(e);
      if (static_cast<int>(events->size()) == kBatch) reread_ = true;
    }
  }

  JobStore* const store_;
  WatchHub* const hub_;
  const std::string job_id_;
  const std::function<absl::Status()> authorized_;
  std::chrono::steady_clock::time_point last_authorized_ = std::chrono::steady_clock::now();

  absl::Mutex mu_;
  std::deque<v1::WatchJobResponse> pending_ ABSL_GUARDED_BY(mu_);
  bool started_ ABSL_GUARDED_BY(mu_) = false;   // the snapshot (or the error) is queued
  v1::WatchJobResponse current_;                // the message being written; owned by the write in flight
  int64_t last_sequence_ ABSL_GUARDED_BY(mu_);  // last event queued
  int64_t last_sent_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reread_ ABSL_GUARDED_BY(mu_) = false;
  bool rereading_ ABSL_GUARDED_BY(mu_) = false;
  bool terminal_ ABSL_GUARDED_BY(mu_) = false;  // the terminal state is queued
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> finish_status_ ABSL_GUARDED_BY(mu_);
};

// DownloadCheckpoint: the archive's description, then its bytes from the offset, produced on a
// thread of the download's own into a bounded queue and written one message at a time, so a
// slow client holds at most kMaxQueued chunks of memory.
class DownloadReactor final : public grpc::ServerWriteReactor<v1::DownloadCheckpointResponse> {
 public:
  static constexpr size_t kChunk = size_t{1} << 20;
  static constexpr size_t kMaxQueued = 8;

  // `authorized` says, before a chunk is written (at most once a second, as the token file is
  // re-read), whether the caller may still read the job (its token not revoked, its project
  // still its own); when it may not, the stream ends with its error.
  DownloadReactor(CheckpointArchiveWriter archive, v1::CheckpointArchive description, int64_t offset,
                  std::atomic<int>* active, std::function<absl::Status()> authorized)
      : archive_(std::move(archive)), active_(active), authorized_(std::move(authorized)) {
    v1::DownloadCheckpointResponse first;
    *first.mutable_archive() = std::move(description);
    {
      absl::MutexLock lock(&mu_);
      queue_.push_back(std::move(first));
    }
    producer_ = std::thread([this, offset] { Produce(offset); });
    Pump();
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) stopped_ = true;
    }
    Pump();
  }
  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
  }
  void OnDone() override {
    {
      absl::MutexLock lock(&mu_);
      stopped_ = true;
    }
    producer_.join();
    active_->fetch_sub(1);
    delete this;
  }

 private:
  void Produce(int64_t offset) {
    const absl::Status s = archive_.Stream(offset, kChunk, [&](absl::string_view bytes) {
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](DownloadReactor* r)
                 ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) { return r->stopped_ || r->queue_.size() < kMaxQueued; },
            this));
        if (stopped_) return false;
        v1::DownloadCheckpointResponse m;
        m.set_data(std::string(bytes));
        queue_.push_back(std::move(m));
      }
      Pump();  // the writer may be idle, waiting for this chunk
      return true;
    });
    {
      absl::MutexLock lock(&mu_);
      produced_ = true;
      status_ = s;
    }
    Pump();
  }

  void Pump() {
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finished_) return;
      if (!queue_.empty() && !stopped_) {
        current_ = std::move(queue_.front());
        queue_.pop_front();
        writing_ = true;
      } else if (produced_ || stopped_) {
        if (!produced_) return;  // stopped: the producer ends soon, and Pump runs again
        finished_ = true;
        finish =
            stopped_ && status_.ok() ? grpc::Status(grpc::StatusCode::CANCELLED, "stopped") : ToGrpcStatus(status_);
      } else {
        return;
      }
    }
    // Only the one Pump that took writing_ gets here with a chunk: last_authorized_ is its own.
    const auto now = std::chrono::steady_clock::now();
    if (!finish && current_.has_data() && now - last_authorized_ >= std::chrono::seconds(1)) {
      last_authorized_ = now;
      if (absl::Status allowed = authorized_(); !allowed.ok()) {
        absl::MutexLock lock(&mu_);
        writing_ = false;
        stopped_ = true;  // the producer ends; its status is not the stream's
        finished_ = true;
        finish = ToGrpcStatus(allowed);
      }
    }
    if (finish) {
      Finish(*finish);
    } else {
      StartWrite(&current_);
    }
  }

  const CheckpointArchiveWriter archive_;
  std::atomic<int>* const active_;
  const std::function<absl::Status()> authorized_;
  std::chrono::steady_clock::time_point last_authorized_ = std::chrono::steady_clock::now();
  std::thread producer_;
  absl::Mutex mu_;
  std::deque<v1::DownloadCheckpointResponse> queue_ ABSL_GUARDED_BY(mu_);
  v1::DownloadCheckpointResponse current_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool produced_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// A stream reactor that only finishes, with an error.
template <typename Response>
class FailedStream final : public grpc::ServerWriteReactor<Response> {
 public:
  explicit FailedStream(const grpc::Status& st) { this->Finish(st); }
  void OnDone() override { delete this; }
};

}  // namespace

JobServiceImpl::JobServiceImpl(JobStore* store, Scheduler* scheduler, WatchHub* hub, JobServiceOptions options)
    : store_(store), scheduler_(scheduler), hub_(hub), options_(std::move(options)) {}

absl::StatusOr<std::optional<v1::DatasetSummary>> JobServiceImpl::ValidateData(const ResolvedInputs& resolved,
                                                                               const std::string& project) const {
  if (!options_.validate_data || options_.files == nullptr) return std::nullopt;
  const JobConfig& job = resolved.job;
  OOMB_ASSIGN_OR_RETURN(const std::shared_ptr<const FileAccess> inputs,
                        options_.files->Inputs(project, resolved.grants));
  int64_t bytes = 0;
  for (const std::string* path : {&job.data.train, &job.data.validation}) {
    if (path->empty()) continue;
    absl::StatusOr<File> f = inputs->OpenFile(*path);
    if (!f.ok()) return std::nullopt;  // the scan names the error, in the VALIDATING state
    bytes += f->size();
  }
  if (bytes > options_.validate_data_max_bytes) return std::nullopt;  // scanned in the VALIDATING state
  absl::StatusOr<DataSummary> summary = options_.validate_data(job, *inputs);
  if (summary.status().code() == absl::StatusCode::kNotFound) {  // e.g. removed since the checks
    return absl::InvalidArgumentError(summary.status().message());
  }
  if (!summary.ok()) return summary.status();
  return DatasetSummaryToProto(*summary);
}

absl::StatusOr<ResolvedInputs> JobServiceImpl::Inputs(const JobConfig& job, const std::string& project,
                                                      const Caller* caller) const {
  if (options_.files == nullptr) return ResolvedInputs{job, {}};
  absl::StatusOr<ResolvedInputs> r = ResolveNamedInputs(job, project, *store_, *options_.files, caller);
  if (!r.ok()) return Annotate(r.status(), "spec");
  return r;
}

absl::StatusOr<ModelConfig> JobServiceImpl::ModelConfigOf(const JobConfig& job, const std::string& project) const {
  std::shared_ptr<const FileAccess> access = FileAccess::Unconfined();
  if (options_.files != nullptr) {
    OOMB_ASSIGN_OR_RETURN(access, options_.files->Inputs(project));
  }
  absl::StatusOr<Dir> model = access->OpenDir(job.model.path);
  if (!model.ok()) return Annotate(model.status(), "model.path");
  return LoadModelConfig(*model);
}

absl::StatusOr<JobServiceImpl::Admission> JobServiceImpl::Admit(const v1::JobSpec& spec, const std::string& project,
                                                                const Caller& caller, const std::string* job_id) const {
  Admission a;
  a.effective = spec;
  UpgradeLegacyFields(&a.effective);  // a client built against an older proto/oomb/v1
  absl::StatusOr<JobConfig> resolved = ResolveJobSpec(&a.effective);
  if (!resolved.ok()) return Annotate(resolved.status(), "spec");
  // Inputs named by resource name, as paths of the daemon's (the stored spec keeps the names).
  OOMB_ASSIGN_OR_RETURN(a.inputs, Inputs(*resolved, project, &caller));
  const JobConfig& job = a.inputs.job;
  if (options_.files != nullptr) {
    OOMB_RETURN_IF_ERROR(Annotate(job_id != nullptr ? options_.files->CheckSpec(job, *job_id, project, a.inputs.grants)
                                                    : options_.files->CheckPaths(job, project, a.inputs.grants),
                                  "spec"));
    if (job_id != nullptr) {
      OOMB_ASSIGN_OR_RETURN(const std::shared_ptr<const FileAccess> inputs, options_.files->Inputs(project));
      OOMB_RETURN_IF_ERROR(Annotate(CheckJobWebhooks(a.effective, *inputs, options_.job_webhooks), "spec"));
    }
  }
  if (job_id != nullptr) {  // the servers the job names, as the daemon will reach them
    const DestinationPolicy destinations = options_.destinations ? options_.destinations(project) : DestinationPolicy();
    OOMB_RETURN_IF_ERROR(Annotate(CheckJobDestinations(a.effective, destinations, options_.mlflow_uri), "spec"));
    OOMB_RETURN_IF_ERROR(Annotate(CheckTrackingSecret(a.effective.tracking().mlflow(), project), "spec"));
  }
  OOMB_RETURN_IF_ERROR(Annotate(scheduler_->CheckPlacement(job), "spec"));
  absl::StatusOr<ModelConfig> model = ModelConfigOf(job, project);
  if (!model.ok()) return Annotate(model.status(), "spec");
  a.model = *std::move(model);
  const int64_t host = options_.server_info.host_memory_bytes();
  std::optional<MemoryPlan> best;
  for (const std::string& device : scheduler_->EligibleDevices(job)) {  // one at least: CheckPlacement
    PlanTarget target{.device = device, .device_bytes = device == "cpu" ? host : 0, .host_bytes = host};
    for (const v1::ServerInfo::Device& d : options_.server_info.devices()) {
      if (d.name() != device) continue;
      target.device_bytes = d.memory_bytes();
      if (d.compute_capability() > 0) target.compute_capability = d.compute_capability();
    }
    absl::StatusOr<MemoryPlan> plan = PlanMemory(a.model, job, target);
    if (!plan.ok()) return Annotate(plan.status(), "spec");
    if (!best || plan->device_capacity_bytes > best->device_capacity_bytes) best = *std::move(plan);
  }
  a.plan = *std::move(best);
  return a;
}

absl::StatusOr<Authorization> JobServiceImpl::Authorize(const grpc::CallbackServerContext* ctx,
                                                        const google::protobuf::Message& request) const {
  return options_.authorizer->Authorize(*ctx, request);
}

absl::Status JobServiceImpl::CheckTrackingSecret(const v1::MlflowSpec& mlflow, const std::string& project) const {
  const std::string& name = mlflow.token_secret();
  if (name.empty()) return absl::OkStatus();
  if (mlflow.uri().empty() && options_.mlflow_uri.empty()) {
    return absl::InvalidArgumentError(
        "tracking.mlflow.token_secret: the job has no tracking server (set tracking.mlflow.uri; the daemon has no "
        "tracking.mlflow_uri)");
  }
  if (options_.projects == nullptr || options_.projects->Get(project).secrets.count(name) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("tracking.mlflow.token_secret: project ", project,
                                                   " has no secret '", name,
                                                   "' (secrets in tenancy.projects_file, kept by the operator)"));
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* JobServiceImpl::CreateJob(grpc::CallbackServerContext* ctx, const v1::CreateJobRequest* req,
                                                    v1::Job* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::StatusOr<Authorization> authorized = Authorize(ctx, *req);
  if (!authorized.ok()) {
    reactor->Finish(ToGrpcStatus(authorized.status()));
    return reactor;
  }
  // `req` and `resp` live until the reactor finishes.
  auto work = [this, ctx, reactor, req, resp, a = *std::move(authorized),
               peer = options_.auth != nullptr ? options_.auth->ClientIdentity(*ctx) : PeerIdentity(*ctx)] {
    const auto abandoned = [ctx] {
      return ctx->IsCancelled() || ctx->deadline() <= std::chrono::system_clock::now() + kCreateMargin;
    };
    const std::string& user = a.caller.user;
    reactor->Finish(ToGrpcStatus(Create(*req, a, user.empty() ? peer : user, abandoned, resp)));
  };
  if (options_.work == nullptr) {
    work();
  } else if (!options_.work->TrySubmit(std::move(work))) {
    // Back-pressure, not a verdict on the job: UNAVAILABLE, which clients retry (with the same
    // request_id), unlike RESOURCE_EXHAUSTED for a job that does not fit.
    reactor->Finish(ToGrpcStatus(
        absl::UnavailableError("too many CreateJob requests are being checked at once; retry in a few seconds")));
  }
  return reactor;
}

namespace {

// For a CreateJob whose request_id already created a job (a retry): that job in `resp`, and
// true; ALREADY_EXISTS when the caller may not see it; false for a first request.
absl::StatusOr<bool> AnswerRetry(Scheduler& scheduler, const v1::CreateJobRequest& req, const Caller& caller,
                                 v1::Job* resp) {
  if (req.request_id().empty() || req.validate_only()) return false;
  OOMB_ASSIGN_OR_RETURN(std::optional<v1::Job> earlier, scheduler.JobOfRequest(req.request_id()));
  if (!earlier.has_value()) return false;
  if (!caller.MayActIn(ParseStoredName(earlier->name()).project)) {
    return absl::AlreadyExistsError("request_id: used before, for a job in another project");
  }
  *resp = *std::move(earlier);
  scheduler.FillQueueState(resp);
  return true;
}

}  // namespace

absl::Status JobServiceImpl::Create(const v1::CreateJobRequest& req, const Authorization& authorized,
                                    const std::string& creator, const std::function<bool()>& abandoned,
                                    v1::Job* resp) const {
  if (abandoned()) return CallerGone();
  const Caller& caller = authorized.caller;
  const std::string& project = authorized.project;
  if (scheduler_->draining()) {
    return absl::UnavailableError("the server is shutting down; submit to another server or retry later");
  }
  if (!req.job_id().empty() && !names::ValidId(req.job_id())) {
    return absl::InvalidArgumentError(
        absl::StrCat("job_id: must match [a-z0-9][a-z0-9-]{0,62}, got '", Excerpt(req.job_id()), "'"));
  }
  if (req.request_id().size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id: at most ", kMaxRequestIdBytes, " bytes, got ", req.request_id().size()));
  }
  // A retry gets its job at once: the checks below take as long as the datasets are large, and
  // a retry sent because the first answer came after the caller's deadline must not pass its
  // own deadline the same way.
  OOMB_ASSIGN_OR_RETURN(const bool retried, AnswerRetry(*scheduler_, req, caller, resp));
  if (retried) return absl::OkStatus();
  // Admission before the spec and the datasets are checked, so that a full queue is refused at
  // once; Submit asks the same policy again under the scheduler's lock, with the insert.
  OOMB_RETURN_IF_ERROR(scheduler_->admission().Admit(AdmissionRequest{.project = project,
                                                                      .creator = creator,
                                                                      .gpus = req.spec().resources().gpus(),
                                                                      .priority = req.spec().resources().priority()},
                                                     *store_));
  OOMB_ASSIGN_OR_RETURN(const Admission admitted, Admit(req.spec(), project, caller, &req.job_id()));
  const JobConfig& job = admitted.inputs.job;
  // Admission: a job that cannot fit is refused now, naming the limit and the longest context
  // that would fit, rather than failing later with an out-of-memory error.
  if (!admitted.plan.fits) return absl::ResourceExhaustedError(admitted.plan.limit);
  OOMB_RETURN_IF_ERROR(Annotate(CheckRopeScaling(admitted.model, job), "spec"));
  absl::StatusOr<std::optional<v1::DatasetSummary>> summary = ValidateData(admitted.inputs, project);
  if (!summary.ok()) return Annotate(summary.status(), "spec");
  // Without the datasets read here, the warnings come when the job leaves VALIDATING, from its
  // longest sample (SchedulerOptions::context_warnings).
  std::vector<std::string> warnings = IgnoredSettingWarnings(req.spec());
  if (summary->has_value() || !scheduler_->validates()) {
    for (std::string& w :
         ContextWindowWarnings(admitted.model, job, summary->has_value() ? (*summary)->longest_sample() : 0)) {
      warnings.push_back(std::move(w));
    }
  }
  if (req.validate_only()) {
    *resp->mutable_spec() = admitted.effective;
    if (!req.job_id().empty()) resp->set_name(JobName(project, req.job_id()));
    for (const std::string& w : warnings) resp->add_warnings(w);
    return absl::OkStatus();
  }
  // Last before the job becomes visible: a caller whose deadline passed (or who cancelled)
  // while the spec and the datasets were checked is told so, and no job is created for it.
  if (abandoned()) return CallerGone();
  bool created = false;
  SubmitOptions submit;
  submit.dataset = summary->has_value() ? &**summary : nullptr;
  submit.creator = creator;
  submit.warnings = std::move(warnings);
  submit.project = project;
  submit.actor = caller.user;
  OOMB_ASSIGN_OR_RETURN(*resp,
                        scheduler_->Submit(admitted.effective, job, req.job_id(), req.request_id(), &created, submit));
  // A retried request_id returns its job, whoever asks: only to a caller who may see it.
  if (!created && !caller.MayActIn(ParseStoredName(resp->name()).project)) {
    return absl::AlreadyExistsError("request_id: used before, for a job in another project");
  }
  if (created) spdlog::info("created {}", resp->name());
  scheduler_->FillQueueState(resp);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(grpc::CallbackServerContext* ctx, const v1::GetJobRequest* req,
                                                 v1::Job* resp) {
  return Unary(ctx, Authorize(ctx, *req), [&](Authorization& a) -> absl::Status {
    *resp = *std::move(a.job);
    scheduler_->FillQueueState(resp);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(grpc::CallbackServerContext* ctx, const v1::ListJobsRequest* req,
                                                   v1::ListJobsResponse* resp) {
  return Unary(ctx, Authorize(ctx, *req), [&](Authorization& a) -> absl::Status {
    if (req->page_size() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("page_size: must be >= 0, got ", req->page_size()));
    }
    ListQuery q;
    if (a.list_projects.has_value()) {
      if (a.list_projects->empty()) return absl::OkStatus();  // no project: no jobs
      q.projects = *a.list_projects;
    }
    q.page_size = req->page_size() == 0 ? kDefaultPageSize : std::min(req->page_size(), kMaxPageSize);
    for (int s : req->states()) q.states.push_back(static_cast<v1::Job::State>(s));
    q.labels = {req->labels().begin(), req->labels().end()};
    const uint64_t filter = ListFilter(*req);
    if (!req->page_token().empty()) {
      OOMB_ASSIGN_OR_RETURN(q.before_position, DecodePageToken(req->page_token(), filter, "ListJobs"));
    }
    OOMB_ASSIGN_OR_RETURN(ListResult r, store_->List(q));
    // The projects' usage, read once for the page's waiting reasons.
    std::optional<std::map<std::string, ProjectUsage>> usage;
    if (std::any_of(r.jobs.begin(), r.jobs.end(), [](const v1::Job& j) { return j.state() == v1::Job::QUEUED; })) {
      absl::StatusOr<std::map<std::string, ProjectUsage>> u = store_->Usage();
      if (u.ok()) usage = *std::move(u);
    }
    for (v1::Job& j : r.jobs) {
      scheduler_->FillQueueState(&j, usage ? &*usage : nullptr);
      *resp->add_jobs() = std::move(j);
    }
    if (r.next_position > 0) resp->set_next_page_token(EncodePageToken(r.next_position, filter));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(grpc::CallbackServerContext* ctx, const v1::CancelJobRequest* req,
                                                    v1::Job* resp) {
  return Unary(ctx, Authorize(ctx, *req), [&](Authorization& a) -> absl::Status {
    OOMB_ASSIGN_OR_RETURN(*resp, scheduler_->Cancel(ParseStoredName(a.job->name()).id, a.caller.user));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* JobServiceImpl::PauseJob(grpc::CallbackServerContext* ctx, const v1::PauseJobRequest* req,
                                                   v1::Job* resp) {
  return Unary(ctx, Authorize(ctx, *req), [&](Authorization& a) -> absl::Status {
    OOMB_ASSIGN_OR_RETURN(*resp, scheduler_->Pause(ParseStoredName(a.job->name()).id, a.caller.user));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* JobServiceImpl::ResumeJob(grpc::CallbackServerContext* ctx, const v1::ResumeJobRequest* req,
                                                    v1::Job* resp) {
  return Unary(ctx, Authorize(ctx, *req), [&](Authorization& a) -> absl::Status {
    OOMB_ASSIGN_OR_RETURN(*resp, scheduler_->Resume(ParseStoredName(a.job->name()).id, a.caller.user));
    scheduler_->FillQueueState(resp);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* JobServiceImpl::DeleteJob(grpc::CallbackServerContext* ctx, const v1::DeleteJobRequest* req,
                                                    v1::DeleteJobResponse*) {
  return Unary(ctx, Authorize(ctx, *req), [&](Authorization& a) -> absl::Status {
    const v1::Job& job = *a.job;
    const JobRef ref = ParseStoredName(job.name());
    OOMB_RETURN_IF_ERROR(scheduler_->Delete(ref.id));
    if (options_.files == nullptr) return absl::OkStatus();
    if (!req->purge()) {
      options_.files->MarkJobDirDeleted(ref.id);  // storage.retention_days counts from now
      return absl::OkStatus();
    }
    if (absl::Status s = options_.files->RemoveJobFiles(ref.id, job.checkpoint_dir(), ref.project); !s.ok()) {
      return Annotate(s,
                      absl::StrCat("the job was deleted, but purging its files failed (", job.checkpoint_dir(), ")"));
    }
    spdlog::info("deleted {} and its files by {}", job.name(), a.caller.Name());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobEvents(grpc::CallbackServerContext* ctx,
                                                        const v1::ListJobEventsRequest* req,
                                                        v1::ListJobEventsResponse* resp) {
  return Unary(ctx, Authorize(ctx, *req), [&](Authorization& a) -> absl::Status {
    const std::string id = ParseStoredName(a.job->name()).id;
    if (req->page_size() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("page_size: must be >= 0, got ", req->page_size()));
    }
    const int limit = req->page_size() == 0 ? kDefaultEventPage : std::min(req->page_size(), kMaxEventPage);
    OOMB_ASSIGN_OR_RETURN(std::vector<v1::JobEvent> events, store_->ListEvents(id, req->after_sequence(), limit + 1));
    resp->set_more(static_cast<int>(events.size()) > limit);
    if (resp->more()) events.pop_back();
    for (v1::JobEvent& e : events) *resp->add_events() = std::move(e);
    return absl::OkStatus();
  });
}

grpc::ServerWriteReactor<v1::WatchJobResponse>* JobServiceImpl::WatchJob(grpc::CallbackServerContext* ctx,
                                                                         const v1::WatchJobRequest* req) {
  const absl::StatusOr<Authorization> a = Authorize(ctx, *req);
  if (!a.ok()) return new FailedStream<v1::WatchJobResponse>(ToGrpcStatus(a.status()));
  const std::string id = ParseStoredName(a->job->name()).id;
  auto authorized = [this, ctx, request = *req]() -> absl::Status { return Authorize(ctx, request).status(); };
  return new WatchReactor(store_, hub_, scheduler_, id, std::max<int64_t>(0, req->after_sequence()),
                          std::move(authorized));
}

grpc::ServerUnaryReactor* JobServiceImpl::ListCheckpoints(grpc::CallbackServerContext* ctx,
                                                          const v1::ListCheckpointsRequest* req,
                                                          v1::ListCheckpointsResponse* resp) {
  return Unary(ctx, Authorize(ctx, *req), [&](Authorization& a) -> absl::Status {
    const v1::Job& job = *a.job;
    OOMB_ASSIGN_OR_RETURN(std::vector<v1::Checkpoint> cps, store_->ListCheckpoints(ParseStoredName(job.name()).id));
    // The store keeps every CHECKPOINT_SAVED event; checkpoint.keep_last has since deleted all
    // but the newest directories, and only those can be loaded or resumed from.
    for (v1::Checkpoint& c : cps) {
      std::error_code ec;
      if (!std::filesystem::is_directory(c.path(), ec)) continue;
      LoadingCodeOptions load;
      load.checkpoint_path = c.path();
      load.base_model_path = job.spec().model().path();
      load.lora = job.spec().method().type() != v1::Method::full;
      load.has_base_config = std::filesystem::exists(std::filesystem::path(c.path()) / kBaseConfigFile, ec);
      c.set_load_code(LoadingCode(load));
      const JobRef ref = ParseStoredName(job.name());
      c.set_name(names::Checkpoint(ref.project, ref.id, c.final() ? std::nullopt : std::optional<int64_t>(c.step())));
      *resp->add_checkpoints() = std::move(c);
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<v1::Checkpoint> JobServiceImpl::CheckpointOf(const v1::Job& job, const std::string& name) const {
  OOMB_ASSIGN_OR_RETURN(const names::CheckpointName ref, names::ParseCheckpoint(name));
  OOMB_ASSIGN_OR_RETURN(const std::vector<v1::Checkpoint> cps, store_->ListCheckpoints(ParseStoredName(job.name()).id));
  for (auto it = cps.rbegin(); it != cps.rend(); ++it) {
    const bool match = ref.step.has_value() ? (!it->final() && it->step() == *ref.step) : it->final();
    std::error_code ec;
    if (match && std::filesystem::is_directory(it->path(), ec)) return *it;
  }
  return absl::NotFoundError(
      absl::StrCat("no checkpoint ", Excerpt(name), " on this daemon's disk (oomb checkpoints lists those there are)"));
}

grpc::ServerWriteReactor<v1::DownloadCheckpointResponse>* JobServiceImpl::DownloadCheckpoint(
    grpc::CallbackServerContext* ctx, const v1::DownloadCheckpointRequest* req) {
  const auto fail = [](const absl::Status& s) {
    return new FailedStream<v1::DownloadCheckpointResponse>(ToGrpcStatus(s));
  };
  absl::StatusOr<Authorization> a = Authorize(ctx, *req);
  if (!a.ok()) return fail(a.status());
  const v1::Job& job = *a->job;
  absl::StatusOr<v1::Checkpoint> checkpoint = CheckpointOf(job, req->name());
  if (!checkpoint.ok()) return fail(checkpoint.status());
  const JobRef ref = ParseStoredName(job.name());
  absl::StatusOr<Dir> dir = options_.files != nullptr ? options_.files->OpenCheckpoint(checkpoint->path(), ref.project)
                                                      : FileAccess::Unconfined()->OpenDir(checkpoint->path());
  if (!dir.ok()) return fail(dir.status());
  absl::StatusOr<CheckpointArchiveWriter> archive = CheckpointArchiveWriter::Open(
      *std::move(dir), checkpoint->final() ? "final" : absl::StrCat("checkpoint-", checkpoint->step()));
  if (!archive.ok()) return fail(archive.status());
  v1::CheckpointArchive description = archive->description();
  description.set_name(names::Checkpoint(
      ref.project, ref.id, checkpoint->final() ? std::nullopt : std::optional<int64_t>(checkpoint->step())));
  if (!req->etag().empty() && req->etag() != description.etag()) {
    return fail(
        absl::AbortedError(absl::StrCat("etag: the checkpoint is no longer the one of etag ", Excerpt(req->etag()),
                                        " (now ", description.etag(), "): download it again from the start")));
  }
  if (req->offset() < 0 || req->offset() > description.total_bytes()) {
    return fail(absl::OutOfRangeError(
        absl::StrCat("offset: ", req->offset(), " is outside the archive's ", description.total_bytes(), " bytes")));
  }
  description.set_offset(req->offset());
  if (active_downloads_.fetch_add(1) >= kMaxDownloads) {
    active_downloads_.fetch_sub(1);
    return fail(absl::UnavailableError(
        absl::StrCat(kMaxDownloads, " downloads are running on this daemon; retry in a moment")));
  }
  auto authorized = [this, ctx, request = *req]() -> absl::Status {
    OOMB_ASSIGN_OR_RETURN(const Authorization again, Authorize(ctx, request));
    return CheckpointOf(*again.job, request.name()).status();
  };
  return new DownloadReactor(*std::move(archive), std::move(description), req->offset(), &active_downloads_,
                             std::move(authorized));
}

grpc::ServerUnaryReactor* JobServiceImpl::EstimateJob(grpc::CallbackServerContext* ctx,
                                                      const v1::EstimateJobRequest* req,
                                                      v1::EstimateJobResponse* resp) {
  return Unary(ctx, Authorize(ctx, *req), [&](Authorization& a) -> absl::Status {
    OOMB_ASSIGN_OR_RETURN(const Admission admitted, Admit(req->spec(), a.project, a.caller, nullptr));
    *resp = MemoryPlanToProto(admitted.plan);
    return EstimateTime(admitted, resp);
  });
}

absl::Status JobServiceImpl::EstimateTime(const Admission& admitted, v1::EstimateJobResponse* resp) const {
  const JobConfig& job = admitted.inputs.job;
  const MemoryPlan& plan = admitted.plan;
  resp->set_total_steps(job.training.max_steps);
  if (options_.rates == nullptr) {
    resp->set_rates("not estimated: this daemon measures no rates");
    return absl::OkStatus();
  }
  if (!plan.fits) {
    resp->set_rates("not estimated: the job does not fit");
    return absl::OkStatus();
  }
  // Under tensor parallelism one rank's shard is measured and timed (its plan is of the shard too).
  const int tensor = job.parallel.tensor;
  const ModelConfig rank_model = tensor > 1 ? ShardConfig(admitted.model, tensor) : admitted.model;
  const absl::StatusOr<EngineRates> rates = options_.rates->Get(rank_model, job, StepChunkTokens(plan), plan.device);
  const absl::StatusOr<StepTime> step = rates.ok() ? EstimateStepTime(rank_model, job, plan, *rates) : rates.status();
  if (!step.ok()) {
    // A device too busy to measure on, or a job the model does not cover, still gets its plan.
    resp->set_rates(absl::StrCat("not estimated: ", step.status().message()));
    return absl::OkStatus();
  }
  resp->set_step_seconds(step->seconds);
  resp->set_device_hours(static_cast<double>(job.training.max_steps) * step->seconds *
                         static_cast<double>(std::max(1, job.resources.gpus)) / 3600.0);
  resp->set_rates(absl::StrCat(
      "measured on ", rates->device_name, " (", job.model.dtype == ModelDtype::kFloat32 ? "float32" : "bfloat16",
      ", chunks of ", rates->chunk_tokens, ") at ", rates->measured_at,
      tensor > 1 ? absl::StrCat("; one rank's shard of ", tensor, " (parallel.tensor), the group's sums not counted")
                 : "",
      job.training.max_steps == 0 ? "; no device-hours: training.epochs sets the steps once the data is read" : ""));
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* JobServiceImpl::GetServerInfo(grpc::CallbackServerContext* ctx,
                                                        const v1::GetServerInfoRequest* req, v1::ServerInfo* resp) {
  return Unary(ctx, Authorize(ctx, *req), [&](Authorization&) -> absl::Status {
    *resp = options_.server_info;
    resp->set_draining(scheduler_->draining());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* JobServiceImpl::UpdateJob(grpc::CallbackServerContext* ctx, const v1::UpdateJobRequest* req,
                                                    v1::Job* resp) {
  return Unary(ctx, Authorize(ctx, *req), [&](Authorization& a) -> absl::Status {
    const v1::Job& job = *a.job;
    if (req->update_mask().paths().empty()) {
      return absl::InvalidArgumentError("update_mask: name the fields to change (labels, priority, spec.display_name)");
    }
    // The new values, checked by the job spec's own rules for the same fields.
    v1::JobSpec probe;
    std::vector<std::string> paths;
    for (const std::string& path : req->update_mask().paths()) {
      if (path == "labels") {
        *probe.mutable_labels() = req->job().labels();
      } else if (path == "priority") {
        probe.mutable_resources()->set_priority(req->job().priority());
        OOMB_RETURN_IF_ERROR(
            Annotate(scheduler_->admission().CheckPriority(req->job().priority(), a.project, "priority"), "job"));
      } else if (path == "spec.display_name") {
        probe.set_display_name(req->job().spec().display_name());
        OOMB_RETURN_IF_ERROR(Annotate(CheckDisplayName(probe.display_name()), "job"));
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("update_mask: '", Excerpt(path), "' cannot be updated (labels, priority, spec.display_name)"));
      }
      paths.push_back(path);
    }
    OOMB_RETURN_IF_ERROR(Annotate(spec::CheckRules(probe, /*check_required=*/false), "job"));
    OOMB_ASSIGN_OR_RETURN(*resp, scheduler_->Update(ParseStoredName(job.name()).id, req->job(), paths, a.caller.user));
    scheduler_->FillQueueState(resp);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* JobServiceImpl::GetCaller(grpc::CallbackServerContext* ctx, const v1::GetCallerRequest* req,
                                                    v1::Caller* resp) {
  return Unary(ctx, Authorize(ctx, *req), [&](Authorization& a) -> absl::Status {
    const Caller& caller = a.caller;
    resp->set_user(caller.user);
    resp->set_uid(caller.uid);
    for (const std::string& g : caller.groups) resp->add_groups(g);
    resp->set_authenticated_by(caller.authenticated_by);
    resp->set_admin(caller.admin());
    for (const std::string& p : caller.Projects()) resp->add_projects("projects/" + p);
    return absl::OkStatus();
  });
}

}  // namespace oomb::server
