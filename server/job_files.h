// The filesystem a daemon's jobs see (docs/RELIABILITY.md, threat model): every file a job reads
// or writes is opened through here, confined at the moment of opening (worker/common/
// file_access.h):
//   - inputs (model.path, data.train, data.validation) and a chosen checkpoint.dir lie beneath
//     paths.allowed_roots, reached without a symbolic link, and never inside the data dir,
//     whatever the roots say (the job store, its WAL, the sockets and port files, and other
//     jobs' checkpoints live there);
//   - a job without checkpoint.dir writes to <data_dir>/jobs/<id>/checkpoints;
//   - a checkpoint directory belongs to one job (worker/common/checkpoint_dir.h).
// Thread-safe (immutable after Create).
#ifndef OOMB_SERVER_JOB_FILES_H_
#define OOMB_SERVER_JOB_FILES_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/common/file_access.h"
#include "worker/plan/job_config.h"

namespace oomb::server {

class JobFiles {
 public:
  // `allowed_roots`: comma-separated directories (paths.allowed_roots), each existing;
  // INVALID_ARGUMENT naming the one that is not.
  static absl::StatusOr<JobFiles> Create(const std::string& allowed_roots, const std::string& data_dir);
  // Everything unconfined (tests of the queue that never touch files).
  static JobFiles Unconfined(const std::string& data_dir);

  // What a job's inputs are opened through.
  const std::shared_ptr<const FileAccess>& inputs() const { return jobs_; }
  // Where job `id`'s checkpoints go: checkpoint.dir, else <data_dir>/jobs/<id>/checkpoints.
  std::string CheckpointDir(const std::string& id, const JobConfig& spec) const;

  // The paths are absolute and allowed (each error names its field); nothing is opened.
  absl::Status CheckPaths(const JobConfig& spec) const;
  // CreateJob's checks, each naming its field: the paths are absolute and allowed; the model
  // directory opens and holds config.json; the datasets open as regular files; the checkpoint
  // directory is free for job `id` (empty: any job). Nothing is created.
  absl::Status CheckSpec(const JobConfig& spec, const std::string& id) const;
  // Opens (creating) job `id`'s checkpoint directory `path` (the one CheckpointDir gave when
  // the job was created, perhaps by another daemon of a fleet) and claims it for the job.
  absl::StatusOr<Dir> ClaimCheckpointDir(const std::string& id, const std::string& path) const;

  // The allowed roots' real paths, for logs.
  std::vector<std::string> roots() const { return jobs_->roots(); }

 private:
  JobFiles(std::shared_ptr<const FileAccess> jobs, std::shared_ptr<const FileAccess> data_dir_access,
           std::string data_dir)
      : jobs_(std::move(jobs)), data_dir_access_(std::move(data_dir_access)), data_dir_(std::move(data_dir)) {}
  // The access that opens the checkpoint directory `path`: the data dir's own for a path in it
  // (a default one), else the jobs' (a chosen checkpoint.dir, or another daemon's default).
  const FileAccess& CheckpointAccess(const std::string& path) const;

  std::shared_ptr<const FileAccess> jobs_;             // roots: paths.allowed_roots; the data dir excluded
  std::shared_ptr<const FileAccess> data_dir_access_;  // root: the data dir (default checkpoint dirs)
  std::string data_dir_;
};

}  // namespace oomb::server

#endif  // OOMB_SERVER_JOB_FILES_H_
