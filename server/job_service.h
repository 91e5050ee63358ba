// The gRPC JobService (proto/oomb/v1/jobs.proto) on the callback API.
//
// Handlers are thin: authenticate, check and convert the request, call the Scheduler or the
// JobStore, map the status with ToGrpcStatus(). Unary handlers finish inline (store calls are
// short transactions), but CreateJob, whose checks read the datasets, runs on a WorkPool and
// finishes from there, so reads and health checks stay fast while datasets are scanned. WatchJob streams through a
// reactor that takes live events from the WatchHub into a bounded buffer and re-reads from the store when it falls
// behind, so a slow client never blocks a training thread.
//
// Callers and projects (proto/oomb/v1/jobs.proto; server/auth.h): every handler begins with the
// one authorization step (server/authorization.h), which authenticates its caller
// (UNAUTHENTICATED otherwise) and checks it against the project of the job it names (NOT_FOUND
// for a job the caller may not see) or of the parent it names (PERMISSION_DENIED), as the
// method's (oomb.v1.auth) rule says; the handler acts on what the step found.
// grpc.health.v1 is a separate service and stays open for probes.
//
// Thread-safety: the service is called concurrently by gRPC's threads; it holds no state of
// its own beyond its collaborators, which are thread-safe.
#ifndef OOMB_SERVER_JOB_SERVICE_H_
#define OOMB_SERVER_JOB_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "oomb/v1/jobs.grpc.pb.h"
#include "server/auth.h"
#include "server/authorization.h"
#include "server/engine_rates_store.h"
#include "server/job_files.h"
#include "server/named_inputs.h"
#include "server/notify/destination_policy.h"
#include "server/scheduler.h"
#include "server/store/job_store.h"
#include "server/watch_hub.h"
#include "server/work_pool.h"
#include "worker/plan/memory_planner.h"

namespace oomb::server {

struct JobServiceOptions {
  // The authorization step every handler begins with. Required; must outlive the service.
  const Authorizer* authorizer = nullptr;
  // Who calls, for Job.creator when no user is identified (null: the gRPC peer). Must outlive
  // the service.
  const Authenticator* auth = nullptr;
  // Per-project settings (null: none): the secrets a job may name (its limits are the
  // scheduler's admission policy, server/admission.h).
  std::shared_ptr<const ProjectRegistry> projects;
  // CreateJob reads and checks the datasets with this (production: oomb::ValidateJobData)
  // when they are at most `validate_data_max_bytes` together, so a bad line is
  // INVALID_ARGUMENT naming the file and the line before anything is queued, and the job is
  // created QUEUED with its dataset summary. Larger datasets are scanned in the VALIDATING
  // state by the scheduler (SchedulerOptions::validator): a bad line then FAILs the job with the
  // line in JobError.message.
  std::function<absl::StatusOr<DataSummary>(const JobConfig&, const FileAccess&)> validate_data;
  int64_t validate_data_max_bytes = int64_t{16} << 20;
  // Where a job's files are, and the checks CreateJob and EstimateJob make before touching them.
  std::shared_ptr<const JobFiles> files;
  // Where CreateJob's checks run (null: on the handler's thread, for tests of the service
  // alone). A full pool answers UNAVAILABLE (retryable). Must outlive the service.
  WorkPool* work = nullptr;
  // The device rates EstimateJob's time and cost come from (null: none estimated). Must outlive
  // the service.
  EngineRatesStore* rates = nullptr;
  // Jobs may name webhooks of their own (notifications.job_webhooks).
  bool job_webhooks = true;
  // Where a job's own webhooks and MLflow server may be, per project
  // (server/notify/destination_policy.h); a refused one is CreateJob's INVALID_ARGUMENT naming
  // the field. Null: public addresses only.
  DestinationPolicyOf destinations;
  // tracking.mlflow_uri: the operator's MLflow server, which a job may name unchecked.
  std::string mlflow_uri;
  // GetServerInfo's static part (versions, devices, host memory, start time); `draining` is
  // filled per call.
  v1::ServerInfo server_info;
};

class JobServiceImpl final : public v1::JobService::CallbackService {
 public:
  JobServiceImpl(JobStore* store, Scheduler* scheduler, WatchHub* hub, JobServiceOptions options);

  grpc::ServerUnaryReactor* CreateJob(grpc::CallbackServerContext* ctx, const v1::CreateJobRequest* req,
                                      v1::Job* resp) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx, const v1::GetJobRequest* req,
                                   v1::Job* resp) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx, const v1::ListJobsRequest* req,
                                     v1::ListJobsResponse* resp) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* ctx, const v1::CancelJobRequest* req,
                                      v1::Job* resp) override;
  grpc::ServerUnaryReactor* PauseJob(grpc::CallbackServerContext* ctx, const v1::PauseJobRequest* req,
                                     v1::Job* resp) override;
  grpc::ServerUnaryReactor* ResumeJob(grpc::CallbackServerContext* ctx, const v1::ResumeJobRequest* req,
                                      v1::Job* resp) override;
  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* ctx, const v1::DeleteJobRequest* req,
                                      v1::DeleteJobResponse* resp) override;
  grpc::ServerUnaryReactor* ListJobEvents(grpc::CallbackServerContext* ctx, const v1::ListJobEventsRequest* req,
                                          v1::ListJobEventsResponse* resp) override;
  grpc::ServerWriteReactor<v1::WatchJobResponse>* WatchJob(grpc::CallbackServerContext* ctx,
                                                           const v1::WatchJobRequest* req) override;
  grpc::ServerUnaryReactor* ListCheckpoints(grpc::CallbackServerContext* ctx, const v1::ListCheckpointsRequest* req,
                                            v1::ListCheckpointsResponse* resp) override;
  // At most kMaxDownloads at once (UNAVAILABLE beyond: retry); each holds a thread that reads the
  // checkpoint's files (server/checkpoint_archive.h) and at most 8 MiB queued.
  grpc::ServerWriteReactor<v1::DownloadCheckpointResponse>* DownloadCheckpoint(
      grpc::CallbackServerContext* ctx, const v1::DownloadCheckpointRequest* req) override;
  grpc::ServerUnaryReactor* EstimateJob(grpc::CallbackServerContext* ctx, const v1::EstimateJobRequest* req,
                                        v1::EstimateJobResponse* resp) override;
  grpc::ServerUnaryReactor* UpdateJob(grpc::CallbackServerContext* ctx, const v1::UpdateJobRequest* req,
                                      v1::Job* resp) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* ctx, const v1::GetServerInfoRequest* req,
                                          v1::ServerInfo* resp) override;
  grpc::ServerUnaryReactor* GetCaller(grpc::CallbackServerContext* ctx, const v1::GetCallerRequest* req,
                                      v1::Caller* resp) override;

 private:
  // The authorization step (options_.authorizer) for the call `ctx` of the method taking `request`.
  absl::StatusOr<Authorization> Authorize(const grpc::CallbackServerContext* ctx,
                                          const google::protobuf::Message& request) const;
  // The checkpoint `name` names (proto/spec/resource_names.h; a job alone: its final one) of
  // `job` (the one authorization found), when its directory is on this daemon's disk; NOT_FOUND
  // otherwise.
  absl::StatusOr<v1::Checkpoint> CheckpointOf(const v1::Job& job, const std::string& name) const;
  // CreateJob's work after authorization (the caller and its project): a retry's job at once, else checks,
  // admission, dataset scan, Submit.
  // `abandoned` says whether the caller has gone (it cancelled, or its deadline is less than the time storing a job
  // may take away): checked first and last before the job is stored, so that no job is created for a caller told
  // DEADLINE_EXCEEDED (a retry with the same request_id covers a store slower than that margin).
  absl::Status Create(const v1::CreateJobRequest& req, const Authorization& authorized, const std::string& creator,
                      const std::function<bool()>& abandoned, v1::Job* resp) const;
  // options_.validate_data's summary for datasets within the size limit; nullopt otherwise.
  absl::StatusOr<std::optional<v1::DatasetSummary>> ValidateData(const ResolvedInputs& resolved,
                                                                 const std::string& project) const;
  // `job` with the inputs it names by resource name resolved for `caller` (server/named_inputs.h);
  // errors prefixed "spec: ".
  absl::StatusOr<ResolvedInputs> Inputs(const JobConfig& job, const std::string& project, const Caller* caller) const;
  // A CreateJob or EstimateJob spec, resolved once: its defaults filled in (`effective`, the form
  // stored), the inputs it names by resource name resolved to paths (`inputs.job`, the form the
  // engine runs), checked against the daemon's confinement (with `job_id`, CreateJob's: its
  // checkpoint dir too) and devices, its model's config.json read (`model`) and planned on the
  // eligible device with the most memory (`plan`). Errors are prefixed "spec: " and name the
  // field (model.path's config.json, or what the engine cannot run yet).
  struct Admission {
    v1::JobSpec effective;
    ResolvedInputs inputs;
    ModelConfig model;
    MemoryPlan plan;
  };
  absl::StatusOr<Admission> Admit(const v1::JobSpec& spec, const std::string& project, const Caller& caller,
                                  const std::string* job_id) const;
  // The config.json of the job's model, read through the confined inputs.
  absl::StatusOr<ModelConfig> ModelConfigOf(const JobConfig& job, const std::string& project) const;
  // EstimateJob's time and cost beside `plan` (EngineRatesStore, worker/plan/step_time.h).
  absl::Status EstimateTime(const Admission& admitted, v1::EstimateJobResponse* resp) const;
  // INVALID_ARGUMENT naming tracking.mlflow.token_secret when it names no secret of `project`
  // (ProjectSettings::secrets), or the job has no tracking server to send it to.
  absl::Status CheckTrackingSecret(const v1::MlflowSpec& mlflow, const std::string& project) const;

  static constexpr int kMaxDownloads = 16;

  JobStore* const store_;
  Scheduler* const scheduler_;
  WatchHub* const hub_;
  const JobServiceOptions options_;
  std::atomic<int> active_downloads_{0};
};

}  // namespace oomb::server

#endif  // OOMB_SERVER_JOB_SERVICE_H_
