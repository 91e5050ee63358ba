#include "server/job_files.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "worker/common/checkpoint_dir.h"
#include "worker/common/status.h"

namespace oomb::server {

absl::StatusOr<JobFiles> JobFiles::Create(const std::string& allowed_roots, const std::string& data_dir,
                                          std::shared_ptr<const ProjectRegistry> projects) {
  FileAccess::Options jobs;
  for (absl::string_view root : absl::StrSplit(allowed_roots, ',', absl::SkipWhitespace())) {
    jobs.roots.emplace_back(absl::StripAsciiWhitespace(root));
  }
  jobs.excluded = {data_dir};
  absl::StatusOr<std::shared_ptr<const FileAccess>> job_access = FileAccess::Create(jobs);
  if (!job_access.ok()) return Annotate(job_access.status(), "paths.allowed_roots");
  OOMB_ASSIGN_OR_RETURN(std::shared_ptr<const FileAccess> data_access,
                        FileAccess::Create({.roots = {data_dir}, .excluded = {}}));
  return JobFiles(*std::move(job_access), std::move(data_access), data_dir, std::move(projects));
}

JobFiles JobFiles::Unconfined(const std::string& data_dir) {
  return JobFiles(FileAccess::Unconfined(), FileAccess::Unconfined(), data_dir, nullptr);
}

absl::StatusOr<std::shared_ptr<const FileAccess>> JobFiles::Inputs(const std::string& project) const {
  if (projects_ == nullptr || project.empty()) return jobs_;
  const ProjectSettings settings = projects_->Get(project);
  if (settings.allowed_roots.empty()) return jobs_;
  const std::string key = absl::StrJoin(settings.allowed_roots, ",");
  absl::MutexLock lock(&accesses_->mu);
  auto& access = accesses_->by_roots[key];
  if (access == nullptr) {
    absl::StatusOr<std::shared_ptr<const FileAccess>> made =
        FileAccess::Create({.roots = settings.allowed_roots, .excluded = {data_dir_}});
    if (!made.ok()) {
      accesses_->by_roots.erase(key);
      return Annotate(made.status(), absl::StrCat("tenancy.projects_file: projects.", project, ".allowed_roots"));
    }
    access = *std::move(made);
  }
  return access;
}

std::string JobFiles::CheckpointDir(const std::string& id, const JobConfig& spec) const {
  if (!spec.checkpoint.dir.empty()) return spec.checkpoint.dir;
  return absl::StrCat(data_dir_, "/jobs/", id, "/checkpoints");
}

absl::StatusOr<std::shared_ptr<const FileAccess>> JobFiles::CheckpointAccess(const std::string& path,
                                                                             const std::string& project) const {
  if (data_dir_access_->CheckPath(path).ok()) return data_dir_access_;
  return Inputs(project);
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

absl::Status JobFiles::CheckPaths(const JobConfig& spec, const std::string& project) const {
  OOMB_ASSIGN_OR_RETURN(const std::shared_ptr<const FileAccess> inputs, Inputs(project));
  const std::pair<const char*, const std::string*> paths[] = {
      {"model.path", &spec.model.path},
      {"data.train", &spec.data.train},
      {"data.validation", &spec.data.validation},
      {"evaluation.haystack", &spec.evaluation.haystack},
      {"method.lora.init_adapter", &spec.method.lora.init_adapter},
      {"checkpoint.dir", &spec.checkpoint.dir}};
  for (const auto& [field, path] : paths) {
    if (!path->empty()) OOMB_RETURN_IF_ERROR(Annotate(inputs->CheckPath(*path), field));
  }
  return absl::OkStatus();
}

absl::Status JobFiles::CheckSpec(const JobConfig& spec, const std::string& id, const std::string& project) const {
  OOMB_RETURN_IF_ERROR(CheckPaths(spec, project));
  OOMB_ASSIGN_OR_RETURN(const std::shared_ptr<const FileAccess> inputs, Inputs(project));
  absl::StatusOr<Dir> model = inputs->OpenDir(spec.model.path);
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
    if (!path->empty()) OOMB_RETURN_IF_ERROR(FieldError(inputs->OpenFile(*path).status(), field));
  }
  if (!spec.method.lora.init_adapter.empty()) {
    absl::StatusOr<Dir> adapter = inputs->OpenDir(spec.method.lora.init_adapter);
    if (!adapter.ok()) return FieldError(adapter.status(), "method.lora.init_adapter");
    OOMB_RETURN_IF_ERROR(
        FieldError(adapter->OpenFile("adapter_model.safetensors").status(), "method.lora.init_adapter"));
  }
  if (!spec.checkpoint.dir.empty()) {
    OOMB_RETURN_IF_ERROR(Annotate(CheckCheckpointDirFree(*inputs, spec.checkpoint.dir, id), "checkpoint.dir"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Dir> JobFiles::ClaimCheckpointDir(const std::string& id, const std::string& path,
                                                 const std::string& project) const {
  OOMB_ASSIGN_OR_RETURN(const std::shared_ptr<const FileAccess> access, CheckpointAccess(path, project));
  absl::StatusOr<Dir> dir = oomb::ClaimCheckpointDir(*access, path, id);
  if (!dir.ok()) return Annotate(dir.status(), "checkpoint.dir");
  return dir;
}

}  // namespace oomb::server
