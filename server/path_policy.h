// Confinement of a job's filesystem paths (issue 11): model.path, data.train,
// data.validation and checkpoint.dir must be absolute and lie, after symlinks and ".." are
// resolved, inside one of the server's allowed roots (paths.allowed_roots, plus the data dir).
// So a job cannot make the daemon read /etc/shadow or write checkpoints over its binaries.
#ifndef OOMB_SERVER_PATH_POLICY_H_
#define OOMB_SERVER_PATH_POLICY_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/job/job_spec.h"

namespace oomb::server {

class PathPolicy {
 public:
  // `roots`: comma-separated directories; `data_dir` is always allowed. Roots are resolved
  // (symlinks included) once, here; a root that does not exist is an error naming it.
  static absl::StatusOr<PathPolicy> Create(const std::string& roots, const std::string& data_dir);

  // INVALID_ARGUMENT for a relative path, PERMISSION_DENIED for one outside every root; both
  // name the field. Paths that do not exist yet (a new checkpoint.dir) are resolved as far as
  // they exist.
  absl::Status Check(const JobSpec& spec) const;

  const std::vector<std::string>& roots() const { return roots_; }

 private:
  std::vector<std::string> roots_;  // canonical
};

}  // namespace oomb::server

#endif  // OOMB_SERVER_PATH_POLICY_H_
