// A checkpoint directory belongs to one job. The job that first uses a directory claims it with
// a marker file, `oomb_job`, holding its id; no other job may then write there, nor in a
// directory beneath it, nor in a directory above it (which holds it). This is what keeps two
// jobs given the same checkpoint.dir from overwriting and pruning each other's checkpoints.
//
// Errors: FAILED_PRECONDITION with reason CHECKPOINT_DIR_TAKEN naming the other job (or the
// files that make the directory not oomb's); those of FileAccess (PERMISSION_DENIED with reason
// PATH_DENIED for a path outside the roots, in the data dir, or through a link). Torch-free.
#ifndef OOMB_WORKER_COMMON_CHECKPOINT_DIR_H_
#define OOMB_WORKER_COMMON_CHECKPOINT_DIR_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/common/file_access.h"

namespace oomb {

// The marker's name.
inline constexpr char kCheckpointOwnerFile[] = "oomb_job";

// Opens `path` beneath `access`, creating it when absent, and claims it for `job_id`: OK when
// it is new or empty (the marker is created), or already claimed by `job_id`, or holds only
// what a job writes (checkpoint-<step>, final, metrics.jsonl; a directory from before claims
// existed). Refused when it, or a directory above it beneath its root, is claimed by another
// job, or when it holds other files.
absl::StatusOr<Dir> ClaimCheckpointDir(const FileAccess& access, const std::string& path, const std::string& job_id);

// What ClaimCheckpointDir would refuse, without creating or claiming anything (CreateJob's early
// answer; the claim itself is made when the job first runs).
absl::Status CheckCheckpointDirFree(const FileAccess& access, const std::string& path, const std::string& job_id);

}  // namespace oomb

#endif  // OOMB_WORKER_COMMON_CHECKPOINT_DIR_H_
