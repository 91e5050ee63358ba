#include "server/job_files.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "worker/common/checkpoint_dir.h"
#include "worker/common/status.h"

namespace oomb::server {

absl::StatusOr<JobFiles> JobFiles::Create(const std::string& allowed_roots, const std::string& data_dir,
                                          std::shared_ptr<const ProjectRegistry> projects,
                                          const std::string& datasets_dir) {
  FileAccess::Options jobs;
  for (absl::string_view root : absl::StrSplit(allowed_roots, ',', absl::SkipWhitespace())) {
    jobs.roots.emplace_back(absl::StripAsciiWhitespace(root));
  }
  jobs.excluded = {data_dir};
  absl::StatusOr<std::shared_ptr<const FileAccess>> job_access = FileAccess::Create(jobs);
  if (!job_access.ok()) return Annotate(job_access.status(), "paths.allowed_roots");
  OOMB_ASSIGN_OR_RETURN(std::shared_ptr<const FileAccess> data_access,
                        FileAccess::Create({.roots = {data_dir}, .excluded = {}}));
  const std::string datasets = datasets_dir.empty() ? data_dir + "/datasets" : datasets_dir;
  if (absl::Status made = FileAccess::Unconfined()->MakeDirs(datasets, 0700).status(); !made.ok()) {
    return Annotate(made, "storage.datasets_dir");
  }
  return JobFiles(*std::move(job_access), std::move(data_access), data_dir, std::move(projects), datasets);
}

JobFiles JobFiles::Unconfined(const std::string& data_dir) {
  return JobFiles(FileAccess::Unconfined(), FileAccess::Unconfined(), data_dir, nullptr, data_dir + "/datasets");
}

std::vector<std::string> JobFiles::RootsOf(const std::string& project) const {
  if (projects_ != nullptr && !project.empty()) {
    std::vector<std::string> own = projects_->Get(project).allowed_roots;
    if (!own.empty()) return own;
  }
  return jobs_->roots();
}

absl::StatusOr<std::shared_ptr<const FileAccess>> JobFiles::Inputs(const std::string& project,
                                                                   const std::vector<std::string>& grants) const {
  if (grants.empty() || !jobs_->confined()) return Inputs(project);
  std::vector<std::string> roots = RootsOf(project);
  roots.insert(roots.end(), grants.begin(), grants.end());
  absl::StatusOr<std::shared_ptr<const FileAccess>> made =
      FileAccess::Create({.roots = roots, .excluded = {data_dir_}});
  if (!made.ok() && absl::IsInvalidArgument(made.status())) {  // a grant gone (deleted, or another daemon's disk)
    return absl::NotFoundError(made.status().message());
  }
  return made;
}

std::string JobFiles::DatasetsDirOf(const std::string& project) const {
  return absl::StrCat(datasets_dir_, "/", project);
}

std::string JobFiles::DatasetPath(const std::string& project, const std::string& id) const {
  return absl::StrCat(DatasetsDirOf(project), "/", id, ".jsonl");
}

absl::StatusOr<Dir> JobFiles::OpenDatasetsDir(const std::string& project) const {
  return FileAccess::Unconfined()->MakeDirs(DatasetsDirOf(project), 0700);
}

absl::StatusOr<Dir> JobFiles::OpenCheckpoint(const std::string& path, const std::string& project) const {
  OOMB_ASSIGN_OR_RETURN(const std::shared_ptr<const FileAccess> access, CheckpointAccess(path, project));
  return access->OpenDir(path);
}

absl::Status JobFiles::RemoveJobFiles(const std::string& id, const std::string& path,
                                      const std::string& project) const {
  OOMB_ASSIGN_OR_RETURN(const std::shared_ptr<const FileAccess> access, CheckpointAccess(path, project));
  const std::filesystem::path p = std::filesystem::path(path).lexically_normal();
  absl::StatusOr<Dir> parent = access->OpenDir(p.parent_path().string());
  if (absl::IsNotFound(parent.status())) return absl::OkStatus();
  OOMB_RETURN_IF_ERROR(parent.status());
  OOMB_RETURN_IF_ERROR(parent->RemoveTree(p.filename().string()));
  if (path != absl::StrCat(data_dir_, "/jobs/", id, "/checkpoints")) return absl::OkStatus();
  return RemoveJobDir(id);  // its metrics and anything else of it
}

void JobFiles::MarkJobDirDeleted(const std::string& id) const {
  ::utimensat(AT_FDCWD, absl::StrCat(data_dir_, "/jobs/", id).c_str(), nullptr, AT_SYMLINK_NOFOLLOW);
}

absl::Status JobFiles::RemoveJobDir(const std::string& id) const {
  absl::StatusOr<Dir> jobs = data_dir_access_->OpenDir(data_dir_ + "/jobs");
  if (absl::IsNotFound(jobs.status())) return absl::OkStatus();
  OOMB_RETURN_IF_ERROR(jobs.status());
  return jobs->RemoveTree(id);
}

std::vector<std::string> JobFiles::JobDirsOlderThan(absl::Time before) const {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(data_dir_ + "/jobs", ec)) {
    struct stat st;
    if (::lstat(e.path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
    if (absl::FromTimeT(st.st_mtim.tv_sec) < before) out.push_back(e.path().filename().string());
  }
  return out;
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

std::string JobFiles::CheckpointDir(const std::string& id, const JobConfig& job) const {
  if (!job.checkpoint.dir.empty()) return job.checkpoint.dir;
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

absl::Status JobFiles::CheckPaths(const JobConfig& job, const std::string& project,
                                  const std::vector<std::string>& grants) const {
  OOMB_ASSIGN_OR_RETURN(const std::shared_ptr<const FileAccess> inputs, Inputs(project, grants));
  const std::pair<const char*, const std::string*> paths[] = {
      {"model.path", &job.model.path},
      {"data.train", &job.data.train},
      {"data.validation", &job.data.validation},
      {"evaluation.haystack", &job.evaluation.haystack},
      {"method.lora.init_adapter", &job.method.lora.init_adapter},
      {"checkpoint.dir", &job.checkpoint.dir}};
  for (const auto& [field, path] : paths) {
    if (!path->empty()) OOMB_RETURN_IF_ERROR(Annotate(inputs->CheckPath(*path), field));
  }
  return absl::OkStatus();
}

absl::Status JobFiles::CheckSpec(const JobConfig& job, const std::string& id, const std::string& project,
                                 const std::vector<std::string>& grants) const {
  OOMB_RETURN_IF_ERROR(CheckPaths(job, project, grants));
  OOMB_ASSIGN_OR_RETURN(const std::shared_ptr<const FileAccess> inputs, Inputs(project, grants));
  absl::StatusOr<Dir> model = inputs->OpenDir(job.model.path);
  if (!model.ok()) return FieldError(model.status(), "model.path");
  if (!model->Contains("config.json")) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.path: ", job.model.path, ": no config.json (expected a Hugging Face model directory)"));
  }
  OOMB_RETURN_IF_ERROR(FieldError(model->OpenFile("config.json").status(), "model.path"));
  const std::pair<const char*, const std::string*> files[] = {{"data.train", &job.data.train},  // empty: evaluate
                                                              {"data.validation", &job.data.validation},
                                                              {"evaluation.haystack", &job.evaluation.haystack}};
  for (const auto& [field, path] : files) {
    if (!path->empty()) OOMB_RETURN_IF_ERROR(FieldError(inputs->OpenFile(*path).status(), field));
  }
  if (!job.method.lora.init_adapter.empty()) {
    absl::StatusOr<Dir> adapter = inputs->OpenDir(job.method.lora.init_adapter);
    if (!adapter.ok()) return FieldError(adapter.status(), "method.lora.init_adapter");
    OOMB_RETURN_IF_ERROR(
        FieldError(adapter->OpenFile("adapter_model.safetensors").status(), "method.lora.init_adapter"));
  }
  if (!job.checkpoint.dir.empty()) {
    OOMB_RETURN_IF_ERROR(Annotate(CheckCheckpointDirFree(*inputs, job.checkpoint.dir, id), "checkpoint.dir"));
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
