// Per-project settings (tenancy.projects_file), re-read when the file changes, so that a team's
// paths and quotas change without a restart:
//
//   projects:
//     nlp:
//       allowed_roots: [/data/nlp, /models]  # where its jobs' paths may lie (default:
//                                            # paths.allowed_roots); never the data dir
//       max_queued_jobs: 100                 # jobs waiting (VALIDATING, QUEUED, PAUSED) at once;
//                                            # 0 or absent: no limit
//       max_running_devices: 4               # devices (GPUs) its running jobs hold at once,
//                                            # across the fleet; 0 or absent: no limit
//       max_device_hours_per_day: 96         # device-hours its jobs ran in the last 24 h
//                                            # (rolling); 0 or absent: no limit
//       max_storage_bytes: 107374182400      # bytes of its uploaded datasets; 0 or absent: none
//       max_concurrent_uploads: 4            # its uploads in progress at once; absent or 0:
//                                            # uploads.max_concurrent_per_project (never more
//                                            # than uploads.max_concurrent in all)
//       secrets:                             # its tenants' own credentials, by name: files of
//         mlflow: /etc/oomb/nlp-mlflow.token # the operator's; a job names one (never its
//                                            # content), e.g. tracking.mlflow.token_secret
//       webhooks:                            # told of every job's events (server/notify/webhooks.h)
//         - {url: https://ml.example/hooks, secret_file: /etc/oomb/nlp.whsec, events: [job_failed]}
//       max_priority: 10                     # the highest resources.priority its jobs may
//                                            # have (refused at CreateJob and UpdateJob);
//                                            # absent: any (-1000000 to 1000000)
//       preempt_other_projects: false        # under scheduler.preemption: all, whether its jobs
//                                            # may preempt other projects' (default true)
//       outbound:                            # where its jobs' own webhooks and MLflow server may
//         allow: [10.20.0.0/16, mlflow.corp] # be, added to the daemon's outbound.allow / deny
//         deny: [hooks.partner.example]      # (server/notify/destination_policy.h)
//     vision: {}
//
// A job over its project's running-device or device-hour quota waits QUEUED (Job.waiting_reason
// says why) until its project is back under; one that asks for more devices than
// max_running_devices could never start and is refused at CreateJob.
//
// Projects absent from the file, or every project when no file is configured, use the daemon's
// settings. Unknown keys, a project id that is not [a-z0-9][a-z0-9-]{0,62}, and relative roots
// are errors naming the file and the key; a file that stops parsing keeps the settings read
// before (logged).
//
// Thread-safety: Get may be called from any thread.
#ifndef OOMB_SERVER_PROJECTS_H_
#define OOMB_SERVER_PROJECTS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "oomb/v1/job_spec.pb.h"
#include "server/notify/destination_policy.h"
#include "server/watched_file.h"

namespace oomb::server {

struct ProjectSettings {
  std::vector<std::string> allowed_roots;      // empty: paths.allowed_roots
  int64_t max_queued_jobs = 0;                 // 0: no limit
  int64_t max_running_devices = 0;             // 0: no limit
  double max_device_hours_per_day = 0;         // 0: no limit
  int64_t max_storage_bytes = 0;               // 0: no limit
  int64_t max_concurrent_uploads = 0;          // 0: uploads.max_concurrent_per_project
  std::map<std::string, std::string> secrets;  // name -> absolute path of a file holding it
  std::vector<v1::WebhookSpec> webhooks;       // the daemon's files: secret_file read as it is
  DestinationPolicy outbound;                  // the project's entries only (none: the daemon's)
  std::optional<int64_t> max_priority;         // nullopt: no bound
  bool preempt_other_projects = true;          // scheduler.preemption all: may preempt others' jobs
};

// Parses a projects file's text; INVALID_ARGUMENT naming `source` and the key otherwise.
absl::StatusOr<std::map<std::string, ProjectSettings>> ParseProjectsFile(const std::string& text,
                                                                         const std::string& source);

class ProjectRegistry {
 public:
  // `path` empty: no file (every project uses the daemon's settings). INVALID_ARGUMENT naming
  // tenancy.projects_file when the file cannot be read or parsed at start.
  static absl::StatusOr<std::shared_ptr<const ProjectRegistry>> Create(const std::string& path);

  // The settings of `project` (the defaults when the file does not list it), re-reading the
  // file at most once a second when it changed.
  ProjectSettings Get(const std::string& project) const;
  // Every project the file lists, with its settings (re-read as Get): the bounded set of
  // projects /metrics labels, and the quotas a claim respects.
  std::map<std::string, ProjectSettings> All() const;

 private:
  explicit ProjectRegistry(const std::string& path) : file_(path) {}
  absl::Status ReloadLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Re-reads the file when it changed; on an error the settings read before stay (logged).
  void RefreshLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  mutable WatchedFile file_ ABSL_GUARDED_BY(mu_);  // path empty: none
  mutable std::map<std::string, ProjectSettings> projects_ ABSL_GUARDED_BY(mu_);
};

}  // namespace oomb::server

#endif  // OOMB_SERVER_PROJECTS_H_
