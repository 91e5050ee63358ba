#include "worker/common/checkpoint_dir.h"

#include <filesystem>
#include <regex>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "worker/common/status.h"

namespace oomb {
namespace {

absl::Status Taken(const std::string& message) {
  return WithReason(absl::FailedPreconditionError(message), Reason::kCheckpointDirTaken);
}

// The job id in `dir`'s marker; empty when it has none.
std::string OwnerOf(const Dir& dir) {
  absl::StatusOr<std::string> text = dir.ReadFile(kCheckpointOwnerFile, 4096);
  return text.ok() ? std::string(absl::StripAsciiWhitespace(*text)) : std::string();
}

// Whether every entry of `dir` is something a job writes there.
absl::Status HoldsOnlyJobOutputs(const Dir& dir) {
  static const std::regex kJobOutput(
      R"(checkpoint-\d+|final|metrics\.jsonl|(checkpoint-\d+|final)\.tmp-\d+|\..+\.tmp-\d+-\d+)");
  OOMB_ASSIGN_OR_RETURN(std::vector<DirEntry> entries, dir.List());
  for (const DirEntry& e : entries) {
    if (!std::regex_match(e.name, kJobOutput)) {
      return Taken(absl::StrCat(dir.path(), " is not empty (it holds '", Excerpt(e.name, 80),
                                "'): checkpoint.dir must be a new or empty directory, or one this job used"));
    }
  }
  return absl::OkStatus();
}

// Refuses when a directory above `path`, up to its root, is claimed by another job.
absl::Status CheckAncestors(const FileAccess& access, const std::string& path, const std::string& job_id) {
  std::filesystem::path p = std::filesystem::path(path).lexically_normal();
  if (p.has_filename() == false) p = p.parent_path();
  for (p = p.parent_path(); !p.empty() && p != p.root_path(); p = p.parent_path()) {
    absl::StatusOr<Dir> dir = access.OpenDir(p.string());
    if (!dir.ok()) break;  // above the root, or not there yet
    const std::string owner = OwnerOf(*dir);
    if (!owner.empty() && owner != job_id) {
      return Taken(
          absl::StrCat(path, " is inside ", p.string(), ", the checkpoint directory of job ", Excerpt(owner, 80)));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckDir(const Dir& dir, const std::string& job_id) {
  const std::string owner = OwnerOf(dir);
  if (!owner.empty() && owner == job_id) return absl::OkStatus();
  if (!owner.empty()) {
    return Taken(absl::StrCat(dir.path(), " is the checkpoint directory of job ", Excerpt(owner, 80),
                              "; give this job another checkpoint.dir"));
  }
  return HoldsOnlyJobOutputs(dir);
}

}  // namespace

absl::Status CheckCheckpointDirFree(const FileAccess& access, const std::string& path, const std::string& job_id) {
  OOMB_RETURN_IF_ERROR(access.CheckPath(path));
  OOMB_RETURN_IF_ERROR(CheckAncestors(access, path, job_id));
  absl::StatusOr<Dir> dir = access.OpenDir(path);
  if (absl::IsNotFound(dir.status())) return absl::OkStatus();
  if (!dir.ok()) return dir.status();
  return CheckDir(*dir, job_id);
}

absl::StatusOr<Dir> ClaimCheckpointDir(const FileAccess& access, const std::string& path, const std::string& job_id) {
  OOMB_RETURN_IF_ERROR(CheckAncestors(access, path, job_id));
  OOMB_ASSIGN_OR_RETURN(Dir dir, access.MakeDirs(path, 0755));
  OOMB_RETURN_IF_ERROR(CheckDir(dir, job_id));
  if (OwnerOf(dir).empty()) {
    absl::Status created = dir.CreateExclusive(kCheckpointOwnerFile, job_id + "\n");
    // Another process claimed it in between: whose is it now?
    if (absl::IsAlreadyExists(created))
      OOMB_RETURN_IF_ERROR(CheckDir(dir, job_id));
    else
      OOMB_RETURN_IF_ERROR(created);
  }
  return dir;
}

}  // namespace oomb
