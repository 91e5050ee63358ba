// The scheduler: the job state machine, and one worker thread per device claiming jobs from the
// store's queue (JobStore::Claim: highest priority, then oldest) and running one at a time
// through an injected runner (production: oomb::RunJob from worker/job/executor.h).
//
// States and transitions (every one an event, durable in the JobStore before it is returned or
// published):
//
//   Submit            -> VALIDATING   the full dataset scan runs on the validator thread
//                                     (SchedulerOptions::validator); QUEUED at once when the
//                                     caller already scanned it (CreateJob, small datasets) or
//                                     no validator is set
//   VALIDATING        -> QUEUED       with Job.dataset, the summary | FAILED (bad data, naming
//                                     the file and line; reason BAD_DATA)
//   QUEUED            -> RUNNING      a device thread claims the job from the store's queue
//                                     (attempt + 1) and holds its lease (Job.daemon =
//                                     SchedulerOptions::daemon_id); a job with resources.gpus = k
//                                     takes k idle eligible devices at once (the claiming
//                                     thread's and k-1 others, which stay reserved until the run
//                                     ends); the queue's head waits for them rather than being
//                                     overtaken (a daemon with fewer eligible devices than k
//                                     passes over it)
//   RUNNING           -> SUCCEEDED | FAILED | CANCELLED | PAUSED   the runner's outcome
//   RUNNING (error)   -> QUEUED       retry while retries < resources.max_retries and the error
//                                     is transient (IsRetryable: by its Reason, e.g. CUDA_ERROR
//                                     yes, NAN_LOSS and DOES_NOT_FIT no; else by its code)
//   Cancel: VALIDATING | QUEUED | PAUSED | RECOVERING -> CANCELLED;  RUNNING | PAUSING -> CANCELLING
//   Pause:  QUEUED -> PAUSED;  RUNNING -> PAUSING (checkpoint, then PAUSED)
//   Resume: PAUSED -> QUEUED (the run resumes from the newest checkpoint)
//   Delete: SUCCEEDED | FAILED | CANCELLED only
//   Anything else is FAILED_PRECONDITION naming the state.
//
// Quotas (SchedulerOptions::projects, server/projects.h): claims pass over the jobs of a project
// at its max_running_devices or max_device_hours_per_day (JobStore::ClaimRequest::quotas), and
// the queue's next eligible job may then start; a passed-over job waits QUEUED with
// Job.waiting_reason saying why, and starts once its project is back under (a job of it ends,
// the 24-hour window moves on, the file raises the quota). Submit refuses a job that asks for
// more devices than its project may ever hold (RESOURCE_EXHAUSTED).
//
// Preemption (SchedulerOptions::preemption). When the best QUEUED job this daemon could run
// cannot start for want of idle devices, and running jobs of lower priority (of its project, or
// of any, as configured) hold enough of the devices it may run on, the lowest-priority of them
// (the most recently started first, among equals) are preempted: RUNNING -> PAUSING with
// Job.preempted_by naming the waiting job (the event's actor is that job's creator), they
// finish their current step, checkpoint it and go back to QUEUED ("preempted by ..."), to
// resume from that checkpoint once a device frees, exactly as an uninterrupted run would go on.
// A job is not preempted within `preemption_min_run` of its start, so none thrashes. A job
// quota-blocked does not preempt. Checked when a job is queued (submitted, resumed, requeued,
// its priority raised) and at every heartbeat. In a fleet each daemon preempts only its own
// running jobs, for the queued jobs it could run.
//
// Runs resume (RunOptions::resume) whenever the job has a recorded checkpoint. On Start(), jobs
// the previous process left RUNNING go RECOVERING -> QUEUED, PAUSING -> PAUSED, CANCELLING ->
// CANCELLED, and VALIDATING jobs are scanned again. Drain() (SIGTERM) asks running jobs to
// checkpoint and stop (kPause) and leaves them QUEUED, so they resume when the daemon restarts
// (or, in a fleet, at once on another daemon); one that has not stopped by the drain's deadline
// stops at its next chunk boundary without a checkpoint, QUEUED to resume from its last one.
//
// Fleet mode (SchedulerOptions::shared_store: daemons sharing a PostgreSQL store). A "fleet"
// thread renews the leases of this daemon's running jobs every `heartbeat` (JobStore::Heartbeat)
// and reaps other daemons' expired leases (JobStore::Reap) with the same transitions as Start()'s
// recovery, so a job whose daemon died (kill -9, lost host) is queued again `lease` after its
// last heartbeat and resumes from its checkpoint on whichever daemon claims it. Between
// heartbeats it waits for other daemons' changes (JobStore::WaitForChanges): a job queued
// elsewhere wakes idle devices; a cancel or pause of one of this daemon's jobs, asked through
// another daemon, stops it (also seen by the next heartbeat); WatchJob streams here re-read the
// events another daemon committed. A job this daemon runs whose lease was taken (it lost the
// database for longer than the lease) is stopped without recording anything more: every
// change a run records checks that Job.daemon is still this daemon. At Start() only the jobs
// of this daemon id (its previous process) are recovered at once; with a store nobody shares
// (SQLite), every active job is. The same code runs in both modes.
//
// Metrics: with SchedulerOptions::metrics set, every committed state change, run start and stop,
// step and checkpoint is also reported to that MetricsSink (server/metrics/metrics_sink.h),
// after the store committed it.
//
// Thread-safety: every public method may be called from any thread. State transitions are
// serialised by one mutex; progress events (steps, checkpoints, warnings) are not.
#ifndef OOMB_SERVER_SCHEDULER_H_
#define OOMB_SERVER_SCHEDULER_H_

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "oomb/v1/jobs.pb.h"
#include "server/admission.h"
#include "server/job_files.h"
#include "server/metrics/metrics_sink.h"
#include "server/projects.h"
#include "server/store/job_store.h"
#include "server/watch_hub.h"
#include "worker/job/executor.h"
#include "worker/plan/job_config.h"

namespace oomb::server {

using JobRunner = std::function<absl::StatusOr<RunResult>(const JobConfig&, const RunOptions&)>;

// The full scan of a job's datasets (production: oomb::ValidateJobData, converted).
using DataValidator = std::function<absl::StatusOr<v1::DatasetSummary>(const JobConfig&, const FileAccess&)>;

struct SchedulerOptions {
  // Where jobs' files are: inputs opened through it, checkpoint directories claimed through it
  // (a run whose directory cannot be claimed fails with the reason). Required.
  std::shared_ptr<const JobFiles> files;
  // One worker thread per entry: "cpu" or "cuda:N". Must not be empty.
  std::vector<std::string> devices;
  JobRunner runner;
  // Scans datasets in the VALIDATING state, one job at a time on its own thread. Null: jobs
  // skip VALIDATING (tests of the queue).
  DataValidator validator;
  // What a validated job's datasets show of its context against its model's window
  // (worker/plan/context_window.h), given the longest sample: recorded as Job.warnings and
  // WARNING events when the job leaves VALIDATING. Null: none.
  std::function<std::vector<std::string>(const JobConfig& job, int64_t longest_sample)> context_warnings;
  // Accept and queue jobs but start none (maintenance, tests of the queue).
  bool hold = false;
  // The most VALIDATING, QUEUED or PAUSED jobs one creator may have; 0: no limit.
  int64_t max_queued_per_client = 0;
  // Per-project quotas (see the file comment); null: none.
  std::shared_ptr<const ProjectRegistry> projects;
  // See the file comment.
  PreemptionScope preemption = PreemptionScope::kProject;
  absl::Duration preemption_min_run = absl::Minutes(5);
  // Where runs, steps, checkpoints and state changes are reported; null: nowhere. Must outlive
  // the scheduler.
  MetricsSink* metrics = nullptr;
  // Passed to every run (RunOptions::kv_stats): its KV page pools publish their page counts
  // there. Null: nowhere. Must outlive the scheduler.
  KvStatsRegistry* kv_stats = nullptr;

  // Fleet mode (store.*, see the file comment). The id this daemon's claims are leased under;
  // unique among live daemons, and best stable across restarts (a restart then takes its jobs
  // back at once instead of after `lease`).
  std::string daemon_id = "local";
  // How long a claim or heartbeat keeps a job leased; > heartbeat. Longer: a dead daemon's job
  // waits longer; shorter: a daemon cut off from the database for that long loses its jobs.
  absl::Duration lease = absl::Seconds(30);
  // How often leases are renewed, expired ones reaped, and (as a fallback to the store's change
  // notices) the queue polled.
  absl::Duration heartbeat = absl::Seconds(10);
  // Other daemons share the store (PostgreSQL). False (SQLite): at Start() every active job
  // belongs to a process that is gone and is recovered at once.
  bool shared_store = false;
};

// What Scheduler::Submit records beside the spec.
struct SubmitOptions {
  const v1::DatasetSummary* dataset = nullptr;  // the caller's scan of the datasets
  std::string creator;                          // Job.creator
  std::vector<std::string> warnings;            // CreateJob's findings
  std::string project = kDefaultProject;        // the job's name is projects/{project}/jobs/{id}
  std::string actor;                            // JobEvent.actor of its first events
};

class Scheduler {
 public:
  Scheduler(JobStore* store, WatchHub* hub, SchedulerOptions options);
  ~Scheduler();  // Drain(absl::ZeroDuration()) if still running
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Recovers the previous process's jobs, rebuilds the queue, starts the device threads.
  absl::Status Start();

  // INVALID_ARGUMENT when this server has fewer than resources.gpus devices that may run
  // `job` (resources.device).
  absl::Status CheckPlacement(const JobConfig& job) const;

  // The devices of this server that may run `job` (resources.device), in the server's order.
  std::vector<std::string> EligibleDevices(const JobConfig& job) const;

  // Whether jobs are validated after CreateJob (VALIDATING) when their datasets were not read
  // inside it.
  bool validates() const { return static_cast<bool>(options_.validator); }

  // Stores a job of `spec` (the effective spec: its defaults filled, server/job_spec.h), resolved
  // by the caller as `job` (ResolveJobSpec, its placement checked: CheckPlacement):
  // VALIDATING, or QUEUED when `options.dataset` is given. `job_id` empty: one is generated.
  // See JobStore::Create for `request_id`; `created` tells whether this call created the job.
  // UNAVAILABLE while draining; what admission().Admit refuses (its queue limits, priority
  // bound and device quota), checked under the scheduler's lock with the insert. The
  // warnings are recorded as Job.warnings and as WARNING events after the first state event.
  absl::StatusOr<v1::Job> Submit(const v1::JobSpec& spec, const JobConfig& job, const std::string& job_id,
                                 const std::string& request_id, bool* created = nullptr,
                                 const SubmitOptions& options = {});

  // The job a Submit with this non-empty `request_id` created, as Submit returned it; nullopt
  // when none did (or it was deleted). A retried CreateJob is answered from it before the spec
  // and the datasets are checked again.
  absl::StatusOr<std::optional<v1::Job>> JobOfRequest(const std::string& request_id);

  // The transitions a caller asks for; `actor` is recorded on the events they make.
  absl::StatusOr<v1::Job> Cancel(const std::string& job_id, const std::string& actor = "");
  absl::StatusOr<v1::Job> Pause(const std::string& job_id, const std::string& actor = "");
  absl::StatusOr<v1::Job> Resume(const std::string& job_id,
                                 const std::string& actor = "");  // UNAVAILABLE while draining
  absl::Status Delete(const std::string& job_id);
  // UpdateJob: `update` (labels, priority, spec.display_name, as `paths` name them) applied to a
  // job not yet finished (FAILED_PRECONDITION otherwise), recorded as an event by `actor`.
  absl::StatusOr<v1::Job> Update(const std::string& job_id, const v1::Job& update,
                                 const std::vector<std::string>& paths, const std::string& actor);

  // Sets queue_position (1-based while QUEUED, else 0: the store's queue order, across the
  // fleet) and waiting_reason (while QUEUED: why it has not started). `usage`: the store's
  // Usage() when the caller read it for several jobs; null: read here when needed.
  void FillQueueState(v1::Job* job, const std::map<std::string, ProjectUsage>* usage = nullptr);

  // Stops taking jobs, asks running jobs to checkpoint and stop, and waits up to `timeout` for
  // them; a job still running then is told to stop at its next chunk boundary without a
  // checkpoint (QUEUED, to resume from its last one) and waited for. Then stops the fleet
  // thread, which renewed their leases until then, and joins every thread. Returns whether every
  // running job stopped at a checkpoint of its own within `timeout`.
  bool Drain(absl::Duration timeout);
  bool draining() const { return draining_.load(); }

  // The admission policy (server/admission.h) Submit and the claims use, built from the options;
  // CreateJob and UpdateJob ask it too.
  const AdmissionPolicy& admission() const { return admission_; }

 private:
  // kStopAbandon: the drain's deadline passed; stop without a checkpoint and requeue.
  // kStopPreempt: finish the current step, checkpoint it, stop (and requeue).
  enum StopFlag : int { kNoStop = 0, kStopCancel = 1, kStopPause = 2, kStopAbandon = 3, kStopPreempt = 4 };
  struct Running {
    std::string device;  // the devices, comma-separated
    std::shared_ptr<std::atomic<int>> stop;
    bool drain_pause = false;   // the pause was the daemon's (drain), not the user's
    bool lease_lost = false;    // another daemon reaped the job: record nothing more
    std::vector<size_t> slots;  // its devices' slots in options_.devices
    std::string project;
    int32_t priority = 0;
    absl::Time started;  // when this run claimed the job
  };
  // "GPUs" or "devices", as this daemon's devices are.
  std::string DeviceWord() const;
  // Preempts running jobs for the best queued job that waits for devices (see the file comment).
  void MaybePreemptLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `victim` may be preempted for `waiting` (scope, priority, minimum run time).
  bool MayPreemptLocked(const Running& victim, const v1::Job& waiting, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks the running job `id` to stop for `waiting` (RUNNING -> PAUSING, kStopPreempt).
  void PreemptLocked(const std::string& id, Running& victim, const v1::Job& waiting) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  bool Eligible(const std::string& requested, const std::string& device) const;
  // A job was queued: idle device threads try to claim.
  void WakeWorkersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The jobs the thread of options_.devices[slot] may claim: each value of spec.resources.device
  // it may run, with the most devices (resources.gpus) this server has for it.
  std::map<std::string, int32_t> ClaimableDevices(size_t slot) const;
  // Claims for the thread of options_.devices[slot] the best queued job it may run
  // (JobStore::Claim: QUEUED -> RUNNING, leased to this daemon), with the idle devices its
  // resources.gpus asks for: `slots`, this one first, then marked busy. nullopt when no job is
  // eligible, or when the best one waits for devices to free up.
  absl::StatusOr<std::optional<ClaimResult>> ClaimNextLocked(size_t slot, std::vector<size_t>* slots)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The transitions of a job whose daemon is gone (Start()'s recovery and the reaper).
  absl::Status Recover(v1::Job* job, std::vector<v1::JobEvent>* events, bool at_start) const;
  absl::Status ReapLeases(const ReapRequest& request, bool at_start);
  // `mutate`, refused (FAILED_PRECONDITION) when the job is no longer leased to this daemon.
  JobMutation IfStillOurs(JobMutation mutate) const;
  // Renews leases, stops this daemon's jobs that were cancelled, paused or taken elsewhere.
  void HeartbeatOnce();
  // Acts on changes other daemons committed.
  void OnRemoteChanges(const std::vector<JobChange>& changes);
  void FleetLoop();
  absl::StatusOr<v1::Job> TransitionLocked(const std::string& id, const JobMutation& mutate)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<v1::Job> Append(const std::string& id, const JobMutation& mutate);
  // Publishes committed events to watchers and reports their state changes to the metrics.
  void Committed(const v1::Job& job, const std::vector<v1::JobEvent>& events);
  // The thread of options_.devices[slot].
  void WorkerLoop(size_t slot);
  void ValidatorLoop();
  void Validate(const std::string& id);
  // Runs `job` on `devices` (rank 0's first), from the thread of devices[0].
  void RunOne(const v1::Job& job, const std::vector<std::string>& devices, std::shared_ptr<std::atomic<int>> stop);
  // The run's callbacks: events recorded (while the job is still ours), metrics, stops polled
  // (`timed_out` set when resources.max_runtime_seconds stopped it).
  RunOptions RunOptionsFor(const std::string& id, const std::vector<std::string>& devices, const JobConfig& job,
                           std::shared_ptr<std::atomic<int>> stop, bool* timed_out);
  // Appends a run's event (`what` names it in the log if that fails).
  void RecordEvent(const std::string& id, const char* what, JobMutation mutate);
  // How a run ended, beside its result.
  struct RunEnd {
    bool timed_out = false;    // resources.max_runtime_seconds stopped it
    bool abandoned = false;    // the drain's deadline stopped it without a checkpoint
    bool drain_pause = false;  // the pause was the drain's
    bool lease_lost = false;   // another daemon took the job
  };
  // The job's state after a run that returned `result`.
  void RecordOutcome(const RunResult& result, const RunEnd& end, v1::Job* j, std::vector<v1::JobEvent>* events) const;
  // A transient failure: QUEUED for another attempt, with a warning naming the error.
  void Retry(const absl::Status& s, int max_retries, v1::Job* j, std::vector<v1::JobEvent>* events) const;
  // FAILED_PRECONDITION (CHECKPOINT_DIR_TAKEN) when spec.checkpoint.dir is, holds or lies inside
  // the checkpoint directory of a job in the store (not `job_id`, nor the job of `request_id`).
  absl::Status CheckCheckpointDirUnusedLocked(const JobConfig& job, const std::string& job_id,
                                              const std::string& request_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The run's outcome: the runner's, once its checkpoint directory is claimed (through the
  // inputs of `project` for a chosen checkpoint.dir).
  absl::StatusOr<RunResult> Execute(const std::string& id, const std::string& checkpoint_dir, const JobConfig& job,
                                    RunOptions options, const std::string& project);

  JobStore* const store_;
  WatchHub* const hub_;
  const SchedulerOptions options_;
  const AdmissionPolicy admission_;  // from options_

  absl::Mutex mu_;
  absl::CondVar cv_;                                         // a job was queued, the running set or stopping_ changed
  std::deque<std::string> validating_ ABSL_GUARDED_BY(mu_);  // ids in VALIDATING, oldest first
  std::map<std::string, Running> running_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> busy_ ABSL_GUARDED_BY(mu_);  // per options_.devices slot: running or reserved
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> draining_{false};
  std::vector<std::thread> threads_;
  int active_threads_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread fleet_thread_;
  std::atomic<bool> fleet_stop_{false};
};

// Whether `state` is SUCCEEDED, FAILED or CANCELLED.
bool IsTerminal(v1::Job::State state);

}  // namespace oomb::server

#endif  // OOMB_SERVER_SCHEDULER_H_
