#include "server/job_files.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "worker/common/checkpoint_dir.h"
#include "worker/common/status.h"

namespace oomb::server {

absl::StatusOr<JobFiles> JobFiles::Create(const std::string& allowed_roots, const std::string& data_dir) {
  FileAccess::Options jobs;
  for (absl::string_view root : absl::StrSplit(allowed_roots, ',', absl::SkipWhitespace())) {
    jobs.roots.emplace_back(absl::StripAsciiWhitespace(root));
  }
  jobs.excluded = {data_dir};
  absl::StatusOr<std::shared_ptr<const FileAccess>> job_access = FileAccess::Create(jobs);
  if (!job_access.ok()) return Annotate(job_access.status(), "paths.allowed_roots");
  OOMB_ASSIGN_OR_RETURN(std::shared_ptr<const FileAccess> data_access,
                        FileAccess::Create({.roots = {data_dir}, .excluded = {}}));
  return JobFiles(*std::move(job_access), std::move(data_access), data_dir);
}

JobFiles JobFiles::Unconfined(const std::string& data_dir) {
  return JobFiles(FileAccess::Unconfined(), FileAccess::Unconfined(), data_dir);
}

std::string JobFiles::CheckpointDir(const std::string& id, const JobConfig& spec) const {
  if (!spec.checkpoint.dir.empty()) return spec.checkpoint.dir;
  return absl::StrCat(data_dir_, "/jobs/", id, "/checkpoints");
}

const FileAccess& JobFiles::CheckpointAccess(const std::string& path) const {
  return data_dir_access_->CheckPath(path).ok() ? *data_dir_access_ : *jobs_;
}

namespace {

// A file the spec names that cannot be opened is a bad field (INVALID_ARGUMENT), not a missing
// resource of the API (NOT_FOUND); refusals keep their code.
absl::Status FieldError(const absl::Status& s, const char* field) {
  if (s.ok()) return s;
  if (absl::IsNotFound(s)) return absl::InvalidArgumentError(absl::StrCat(field, ": ", s.message()));
  return Annotate(s, field);
}

}  // namespace

absl::Status JobFiles::CheckPaths(const JobConfig& spec) const {
  const std::pair<const char*, const std::string*> paths[] = {
      {"model.path", &spec.model.path},
      {"data.train", &spec.data.train},
      {"data.validation", &spec.data.validation},
      {"evaluation.haystack", &spec.evaluation.haystack},
      {"method.lora.init_adapter", &spec.method.lora.init_adapter},
      {"checkpoint.dir", &spec.checkpoint.dir}};
  for (const auto& [field, path] : paths) {
    if (!path->empty()) OOMB_RETURN_IF_ERROR(Annotate(jobs_->CheckPath(*path), field));
  }
  return absl::OkStatus();
}

absl::Status JobFiles::CheckSpec(const JobConfig& spec, const std::string& id) const {
  OOMB_RETURN_IF_ERROR(CheckPaths(spec));
  absl::StatusOr<Dir> model = jobs_->OpenDir(spec.model.path);
  if (!model.ok()) return FieldError(model.status(), "model.path");
  if (!model->Contains("config.json")) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.path: ", spec.model.path, ": no config.json (expected a Hugging Face model directory)"));
  }
  OOMB_RETURN_IF_ERROR(FieldError(model->OpenFile("config.json").status(), "model.path"));
  const std::pair<const char*, const std::string*> files[] = {{"data.train", &spec.data.train},  // empty: evaluate
                                                              {"data.validation", &spec.data.validation},
                                                              {"evaluation.haystack", &spec.evaluation.haystack}};
  for (const auto& [field, path] : files) {
    if (!path->empty()) OOMB_RETURN_IF_ERROR(FieldError(jobs_->OpenFile(*path).status(), field));
  }
  if (!spec.method.lora.init_adapter.empty()) {
    absl::StatusOr<Dir> adapter = jobs_->OpenDir(spec.method.lora.init_adapter);
    if (!adapter.ok()) return FieldError(adapter.status(), "method.lora.init_adapter");
    OOMB_RETURN_IF_ERROR(
        FieldError(adapter->OpenFile("adapter_model.safetensors").status(), "method.lora.init_adapter"));
  }
  if (!spec.checkpoint.dir.empty()) {
    OOMB_RETURN_IF_ERROR(Annotate(CheckCheckpointDirFree(*jobs_, spec.checkpoint.dir, id), "checkpoint.dir"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Dir> JobFiles::ClaimCheckpointDir(const std::string& id, const std::string& path) const {
  absl::StatusOr<Dir> dir = oomb::ClaimCheckpointDir(CheckpointAccess(path), path, id);
  if (!dir.ok()) return Annotate(dir.status(), "checkpoint.dir");
  return dir;
}

}  // namespace oomb::server
