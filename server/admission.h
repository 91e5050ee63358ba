// The admission policy: what a project and a client may hold of the queue and the devices, in
// one place. CreateJob asks it before a spec is checked (a full queue is refused before the
// datasets are read), Scheduler::Submit asks it again under the scheduler's lock with the insert
// (so concurrent submits cannot all pass a limit), UpdateJob for a new priority, and the
// scheduler for its claims' quotas, a waiting job's reason and whom a waiting job may preempt.
//
// The limits (server/projects.h for the per-project ones, in tenancy.projects_file):
//   - max_queued_jobs: a project's jobs waiting (VALIDATING, QUEUED, PAUSED) at once;
//   - scheduler.max_queued_jobs_per_client: one creator's jobs waiting at once;
//   - max_running_devices: the devices a project's jobs hold at once (a job asking for more is
//     refused; one that would pass it waits QUEUED), and max_device_hours_per_day;
//   - max_priority: the highest resources.priority a project's jobs may have;
//   - preemption (scheduler.preemption, preempt_other_projects): whom a waiting job may preempt.
//
// Thread-safety: immutable; the projects file is re-read by ProjectRegistry.
#ifndef OOMB_SERVER_ADMISSION_H_
#define OOMB_SERVER_ADMISSION_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "oomb/v1/jobs.pb.h"
#include "server/projects.h"
#include "server/store/job_store.h"

namespace oomb::server {

// Which running jobs a waiting job of higher priority may preempt (scheduler.preemption).
enum class PreemptionScope {
  kNone,     // none: priorities only order the queue
  kProject,  // those of its own project
  kAll,      // those of any project, unless its project has preempt_other_projects: false
             // (server/projects.h)
};

struct AdmissionOptions {
  std::shared_ptr<const ProjectRegistry> projects;  // per-project limits; null: none
  int64_t max_queued_per_client = 0;                // 0: no limit
  PreemptionScope preemption = PreemptionScope::kProject;
  absl::Duration preemption_min_run = absl::Minutes(5);  // no job is preempted sooner after its start
  std::string device_word = "devices";                   // "GPUs" on a daemon of CUDA devices, for messages
};

// A job asking to be admitted.
struct AdmissionRequest {
  std::string project;
  std::string creator;  // Job.creator; empty: no per-client limit
  int64_t gpus = 0;     // resources.gpus (0: not yet resolved, not checked)
  int64_t priority = 0;
};

// A running job, as preemption sees it.
struct RunningJob {
  std::string project;
  int32_t priority = 0;
  absl::Time started;
};

class AdmissionPolicy {
 public:
  explicit AdmissionPolicy(AdmissionOptions options) : options_(std::move(options)) {}

  // Whether a job may join the queue now: RESOURCE_EXHAUSTED naming the limit when its project
  // has max_queued_jobs waiting, its creator max_queued_per_client, or it asks for more devices
  // than its project may ever hold; INVALID_ARGUMENT naming spec's resources.priority above
  // max_priority. Reads the waiting jobs from `store`.
  absl::Status Admit(const AdmissionRequest& request, JobStore& store) const;
  // INVALID_ARGUMENT naming `field` when `priority` is above `project`'s max_priority.
  absl::Status CheckPriority(int64_t priority, const std::string& project, const std::string& field) const;

  // Whether projects have limits at all (no projects file: none).
  bool has_projects() const { return options_.projects != nullptr; }
  // The device quotas of every project with one, as a claim takes them.
  std::map<std::string, ProjectQuota> Quotas() const;
  // Why a QUEUED job waits on its project's quota ("project nlp uses 4/4 GPUs"); empty when its
  // project is under its quotas.
  std::string QuotaReason(const v1::Job& job, const std::map<std::string, ProjectUsage>& usage) const;

  PreemptionScope preemption() const { return options_.preemption; }
  // Whether `victim` may be preempted for `waiting` at `now`: a lower priority, a project the
  // scope allows, and a run of at least preemption_min_run.
  bool MayPreempt(const RunningJob& victim, const v1::Job& waiting, absl::Time now) const;

 private:
  // RESOURCE_EXHAUSTED when the project or the creator is at its limit of waiting jobs.
  absl::Status CheckQueues(const AdmissionRequest& request, JobStore& store) const;

  const AdmissionOptions options_;
};

}  // namespace oomb::server

#endif  // OOMB_SERVER_ADMISSION_H_
