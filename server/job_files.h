// The filesystem a daemon's jobs see (docs/RELIABILITY.md, threat model): every file a job reads
// or writes is opened through here, confined at the moment of opening (worker/common/
// file_access.h):
//   - inputs (model.path, data.train, data.validation) and a chosen checkpoint.dir lie beneath
//     the allowed roots of the job's project (tenancy.projects_file, server/projects.h), else
//     paths.allowed_roots, reached without a symbolic link, and never inside the data dir,
//     whatever the roots say (the job store, its WAL, the sockets and port files, and other
//     jobs' checkpoints live there);
//   - a job without checkpoint.dir writes to <data_dir>/jobs/<id>/checkpoints;
//   - a checkpoint directory belongs to one job (worker/common/checkpoint_dir.h);
//   - uploaded datasets live in <datasets_dir>/<project>/<id>.jsonl (storage.datasets_dir,
//     default <data_dir>/datasets); a job reads what it names by resource name (an uploaded
//     dataset, an earlier job's checkpoint: server/named_inputs.h) through "grants", directories
//     of the daemon's own that its inputs' access opens beside the roots.
// Thread-safe (the projects' accesses are made once per set of roots, under a mutex).
#ifndef OOMB_SERVER_JOB_FILES_H_
#define OOMB_SERVER_JOB_FILES_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/projects.h"
#include "worker/common/file_access.h"
#include "worker/plan/job_config.h"

namespace oomb::server {

class JobFiles {
 public:
  // `allowed_roots`: comma-separated directories (paths.allowed_roots), each existing;
  // INVALID_ARGUMENT naming the one that is not.
  // `projects` (null: none) gives projects roots of their own.
  // `datasets_dir` empty: <data_dir>/datasets.
  static absl::StatusOr<JobFiles> Create(const std::string& allowed_roots, const std::string& data_dir,
                                         std::shared_ptr<const ProjectRegistry> projects = nullptr,
                                         const std::string& datasets_dir = "");
  // Everything unconfined (tests of the queue that never touch files).
  static JobFiles Unconfined(const std::string& data_dir);

  // What the inputs of a job of `project` are opened through: its project's allowed_roots when
  // the projects file gives some, else paths.allowed_roots; never the data dir. INVALID_ARGUMENT
  // naming the project's setting when one of its roots is not a directory.
  absl::StatusOr<std::shared_ptr<const FileAccess>> Inputs(const std::string& project) const;
  // The same with `grants` (absolute directories of the daemon's own, e.g. inside the data dir)
  // opened beside the roots; NOT_FOUND naming the grant that is no directory here.
  absl::StatusOr<std::shared_ptr<const FileAccess>> Inputs(const std::string& project,
                                                           const std::vector<std::string>& grants) const;
  // paths.allowed_roots' (every project without roots of its own).
  const std::shared_ptr<const FileAccess>& inputs() const { return jobs_; }
  // Where job `id`'s checkpoints go: checkpoint.dir, else <data_dir>/jobs/<id>/checkpoints.
  std::string CheckpointDir(const std::string& id, const JobConfig& job) const;

  // The paths are absolute and allowed (each error names its field); nothing is opened.
  absl::Status CheckPaths(const JobConfig& job, const std::string& project = "",
                          const std::vector<std::string>& grants = {}) const;
  // CreateJob's checks, each naming its field: the paths are absolute and allowed; the model
  // directory opens and holds config.json; the datasets open as regular files; the checkpoint
  // directory is free for job `id` (empty: any job). Nothing is created.
  absl::Status CheckSpec(const JobConfig& job, const std::string& id, const std::string& project = "",
                         const std::vector<std::string>& grants = {}) const;

  // Where uploaded datasets are: storage.datasets_dir.
  const std::string& datasets_dir() const { return datasets_dir_; }
  // The file of dataset `id` of `project`, and the directory holding the project's datasets.
  std::string DatasetPath(const std::string& project, const std::string& id) const;
  std::string DatasetsDirOf(const std::string& project) const;
  // The project's datasets directory, opened (created 0700 when absent) for the daemon's own use.
  absl::StatusOr<Dir> OpenDatasetsDir(const std::string& project) const;

  // A checkpoint directory a job wrote (Checkpoint.path), opened for reading (downloads):
  // through the data dir's access for a default one, else the project's inputs'.
  absl::StatusOr<Dir> OpenCheckpoint(const std::string& path, const std::string& project) const;
  // DeleteJob's purge: removes job `id`'s checkpoint directory `path` and, for a default one,
  // the job's directory in the data dir. OK when already gone.
  absl::Status RemoveJobFiles(const std::string& id, const std::string& path, const std::string& project) const;
  // The ids of the job directories in the data dir (<data_dir>/jobs/<id>) last modified before
  // `before`: what retention looks at (server/retention.h).
  std::vector<std::string> JobDirsOlderThan(absl::Time before) const;
  // Marks job `id`'s directory in the data dir as deleted now (its time: retention counts from
  // it); nothing when it has none here.
  void MarkJobDirDeleted(const std::string& id) const;
  // Removes <data_dir>/jobs/<id>; OK when absent.
  absl::Status RemoveJobDir(const std::string& id) const;
  // Opens (creating) job `id`'s checkpoint directory `path` (the one CheckpointDir gave when
  // the job was created, perhaps by another daemon of a fleet) and claims it for the job.
  absl::StatusOr<Dir> ClaimCheckpointDir(const std::string& id, const std::string& path,
                                         const std::string& project = "") const;

  // The allowed roots' real paths, for logs.
  std::vector<std::string> roots() const { return jobs_->roots(); }

 private:
  struct ProjectAccesses {
    absl::Mutex mu;
    std::map<std::string, std::shared_ptr<const FileAccess>> by_roots ABSL_GUARDED_BY(mu);
  };
  JobFiles(std::shared_ptr<const FileAccess> jobs, std::shared_ptr<const FileAccess> data_dir_access,
           std::string data_dir, std::shared_ptr<const ProjectRegistry> projects, std::string datasets_dir)
      : jobs_(std::move(jobs)),
        data_dir_access_(std::move(data_dir_access)),
        data_dir_(std::move(data_dir)),
        datasets_dir_(std::move(datasets_dir)),
        projects_(std::move(projects)),
        accesses_(std::make_shared<ProjectAccesses>()) {}
  // The roots of `project`'s inputs: its own, else paths.allowed_roots'.
  std::vector<std::string> RootsOf(const std::string& project) const;
  // The access that opens the checkpoint directory `path`: the data dir's own for a path in it
  // (a default one), else the project's inputs' (a chosen checkpoint.dir, or another daemon's
  // default).
  absl::StatusOr<std::shared_ptr<const FileAccess>> CheckpointAccess(const std::string& path,
                                                                     const std::string& project) const;

  std::shared_ptr<const FileAccess> jobs_;             // roots: paths.allowed_roots; the data dir excluded
  std::shared_ptr<const FileAccess> data_dir_access_;  // root: the data dir (default checkpoint dirs)
  std::string data_dir_;
  std::string datasets_dir_;
  std::shared_ptr<const ProjectRegistry> projects_;  // null: no projects file
  std::shared_ptr<ProjectAccesses> accesses_;        // shared by copies
};

}  // namespace oomb::server

#endif  // OOMB_SERVER_JOB_FILES_H_
