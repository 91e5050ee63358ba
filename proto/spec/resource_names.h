// The names of the API's resources (AIP-122), in one place for the daemon, the CLI and the job
// spec's codec:
//
//   projects/{project}
//   projects/{project}/jobs/{job}                         a job; short form jobs/{job}
//   projects/{project}/jobs/{job}/checkpoints/{step}      one of its checkpoints ({step} a
//   projects/{project}/jobs/{job}/checkpoints/final       number), or its final one
//   projects/{project}/datasets/{dataset}                 an uploaded dataset; short form
//                                                         datasets/{dataset} (the caller's
//                                                         project, or the job's in a spec)
//
// Every id ({project}, {job}, {dataset}) is [a-z0-9][a-z0-9-]{0,62}. A short form leaves the
// project to the context: `project` comes back empty.
//
// Thread-safety: pure functions.
#ifndef OOMB_PROTO_SPEC_RESOURCE_NAMES_H_
#define OOMB_PROTO_SPEC_RESOURCE_NAMES_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace oomb::names {

// Whether `id` may be a project, job or dataset id: [a-z0-9][a-z0-9-]{0,62}.
bool ValidId(absl::string_view id);

struct JobName {
  std::string project;  // empty: the short form jobs/{job}
  std::string job;
};

struct CheckpointName {
  JobName job;
  // The checkpoint's step, or nullopt for the final checkpoint (".../checkpoints/final", and a
  // job named alone where a checkpoint is expected: its final checkpoint).
  std::optional<int64_t> step;
};

struct DatasetName {
  std::string project;  // empty: the short form datasets/{dataset}
  std::string dataset;
};

std::string Project(absl::string_view project);  // "projects/{project}"
std::string Job(absl::string_view project, absl::string_view job);
std::string Checkpoint(absl::string_view project, absl::string_view job, std::optional<int64_t> step);
std::string Dataset(absl::string_view project, absl::string_view dataset);

// Each parser returns INVALID_ARGUMENT "<field>: expected <grammar>, got '<excerpt>'" for a
// string of another shape.
absl::StatusOr<std::string> ParseProject(absl::string_view name, absl::string_view field = "parent");
absl::StatusOr<JobName> ParseJob(absl::string_view name, absl::string_view field = "name");
// A checkpoint's name, or a job's name alone (its final checkpoint).
absl::StatusOr<CheckpointName> ParseCheckpoint(absl::string_view name, absl::string_view field = "name");
absl::StatusOr<DatasetName> ParseDataset(absl::string_view name, absl::string_view field = "name");

// Whether `value` is a name of the kind a job-spec field's (oomb.v1.rules).resource declares
// ("dataset": ParseDataset accepts it; "checkpoint": ParseCheckpoint does, the short form
// jobs/{job} excepted), rather than a path. Any other kind: false.
bool IsResourceName(absl::string_view kind, absl::string_view value);

}  // namespace oomb::names

#endif  // OOMB_PROTO_SPEC_RESOURCE_NAMES_H_
