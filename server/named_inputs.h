// The inputs a job names by resource name (proto/spec/resource_names.h) instead of a path, as the
// daemon reads them:
//   data.train, data.validation    datasets/{id} or projects/{p}/datasets/{id}: an uploaded
//                                  dataset (DatasetService), its file in the datasets dir
//                                  (JobFiles::DatasetPath); a short name is the job's project's
//   method.lora.init_adapter       projects/{p}/jobs/{j}: that job's final checkpoint;
//                                  projects/{p}/jobs/{j}/checkpoints/{step|final}: that one;
//                                  its directory as the job store records it
// Resolving gives the job's configuration with those fields replaced by the paths, and the
// directories ("grants") its inputs' access must open beside its project's roots
// (JobFiles::Inputs): the dataset's project directory, the checkpoint's directory. The job's
// stored spec keeps the names; the daemon resolves them again when it scans and when it runs the
// job, so a dataset or checkpoint deleted meanwhile fails the run (NOT_FOUND).
//
// Who may name what: with a `caller` (CreateJob, EstimateJob), a dataset of a project it may act
// in, and a checkpoint of a job it may see (as GetJob: INVALID_ARGUMENT "no job ..." for one it
// may not, telling nothing of it); without (the scheduler), what CreateJob accepted.
//
// Thread-safety: a pure function of its arguments (the store and files are thread-safe).
#ifndef OOMB_SERVER_NAMED_INPUTS_H_
#define OOMB_SERVER_NAMED_INPUTS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/auth.h"
#include "server/job_files.h"
#include "server/store/job_store.h"
#include "worker/plan/job_config.h"

namespace oomb::server {

struct ResolvedInputs {
  JobConfig job;                    // the names replaced by paths
  std::vector<std::string> grants;  // for JobFiles::Inputs
};

// Errors name the field: INVALID_ARGUMENT for a name that does not resolve with a caller (no
// such dataset or job, no such checkpoint on disk, a job without a final checkpoint yet); the
// same as NOT_FOUND without one (the job's input is gone).
absl::StatusOr<ResolvedInputs> ResolveNamedInputs(const JobConfig& job, const std::string& project, JobStore& store,
                                                  const JobFiles& files, const Caller* caller);

}  // namespace oomb::server

#endif  // OOMB_SERVER_NAMED_INPUTS_H_
