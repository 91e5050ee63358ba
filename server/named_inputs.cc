#include "server/named_inputs.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/spec/resource_names.h"
#include "worker/common/status.h"

namespace oomb::server {
namespace {

// A name that does not resolve: the caller's mistake at submission, the input gone later.
absl::Status Unresolved(const Caller* caller, const std::string& field, const std::string& what) {
  const std::string message = absl::StrCat(field, ": ", what);
  return caller != nullptr ? absl::InvalidArgumentError(message) : absl::NotFoundError(message);
}

absl::Status ResolveDataset(std::string* path, const char* field, const std::string& project, JobStore& store,
                            const JobFiles& files, const Caller* caller, std::vector<std::string>* grants) {
  if (path->empty() || !names::IsResourceName("dataset", *path)) return absl::OkStatus();
  OOMB_ASSIGN_OR_RETURN(names::DatasetName name, names::ParseDataset(*path, field));
  if (name.project.empty()) name.project = project;
  const std::string full = names::Dataset(name.project, name.dataset);
  if (caller != nullptr && !caller->MayActIn(name.project)) return Unresolved(caller, field, "no dataset " + full);
  absl::StatusOr<v1::Dataset> d = store.GetDataset(full);
  if (absl::IsNotFound(d.status())) {
    return Unresolved(caller, field, absl::StrCat("no dataset ", full, " (upload it first: oomb datasets upload)"));
  }
  OOMB_RETURN_IF_ERROR(d.status());
  *path = files.DatasetPath(name.project, name.dataset);
  grants->push_back(files.DatasetsDirOf(name.project));
  return absl::OkStatus();
}

// The checkpoint of `name` the store records and the disk still has.
absl::StatusOr<std::string> CheckpointPath(const names::CheckpointName& name, const std::string& job_id,
                                           const v1::Job& job, JobStore& store, const Caller* caller,
                                           const std::string& field) {
  OOMB_ASSIGN_OR_RETURN(const std::vector<v1::Checkpoint> checkpoints, store.ListCheckpoints(job_id));
  std::vector<std::string> have;
  for (auto it = checkpoints.rbegin(); it != checkpoints.rend(); ++it) {
    std::error_code ec;
    if (!std::filesystem::is_directory(it->path(), ec)) continue;  // pruned by keep_last
    have.push_back(it->final() ? "final" : absl::StrCat(it->step()));
    const bool match = name.step.has_value() ? (!it->final() && it->step() == *name.step) : it->final();
    if (match) return it->path();
  }
  const std::string shown = names::Checkpoint(ParseStoredName(job.name()).project, job_id, name.step);
  if (!name.step.has_value() && job.state() != v1::Job::SUCCEEDED) {
    return Unresolved(caller, field,
                      absl::StrCat(shown, ": the job has no final checkpoint (it is ", v1::Job::State_Name(job.state()),
                                   "); name one of its checkpoints: ",
                                   have.empty() ? "it has none on disk" : absl::StrJoin(have, ", ")));
  }
  return Unresolved(caller, field,
                    absl::StrCat("no checkpoint ", shown, " on this daemon's disk (it has: ",
                                 have.empty() ? "none" : absl::StrJoin(have, ", "), ")"));
}

absl::Status ResolveCheckpoint(std::string* path, const char* field, JobStore& store, const Caller* caller,
                               std::vector<std::string>* grants) {
  if (path->empty() || !names::IsResourceName("checkpoint", *path)) return absl::OkStatus();
  OOMB_ASSIGN_OR_RETURN(const names::CheckpointName name, names::ParseCheckpoint(*path, field));
  const std::string job_name = names::Job(name.job.project, name.job.job);
  absl::StatusOr<v1::Job> job = store.Get(name.job.job);
  const bool visible = job.ok() && ParseStoredName(job->name()).project == name.job.project &&
                       (caller == nullptr || caller->MayActIn(name.job.project));
  if (!visible) {
    if (!job.ok() && !absl::IsNotFound(job.status())) return job.status();
    return Unresolved(caller, field, "no job " + job_name);
  }
  OOMB_ASSIGN_OR_RETURN(*path, CheckpointPath(name, name.job.job, *job, store, caller, field));
  grants->push_back(*path);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ResolvedInputs> ResolveNamedInputs(const JobConfig& job, const std::string& project, JobStore& store,
                                                  const JobFiles& files, const Caller* caller) {
  ResolvedInputs out{job, {}};
  OOMB_RETURN_IF_ERROR(ResolveDataset(&out.job.data.train, "data.train", project, store, files, caller, &out.grants));
  OOMB_RETURN_IF_ERROR(
      ResolveDataset(&out.job.data.validation, "data.validation", project, store, files, caller, &out.grants));
  OOMB_RETURN_IF_ERROR(
      ResolveCheckpoint(&out.job.method.lora.init_adapter, "method.lora.init_adapter", store, caller, &out.grants));
  return out;
}

}  // namespace oomb::server
