#include "proto/spec/resource_names.h"

#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace oomb::names {
namespace {

// The name as an error shows it: at most 80 bytes, escaped.
std::string Shown(absl::string_view name) {
  constexpr size_t kMax = 80;
  std::string out = absl::CHexEscape(name.substr(0, kMax));
  if (name.size() > kMax) absl::StrAppend(&out, "... (", name.size() - kMax, " more bytes)");
  return out;
}

absl::Status Expected(absl::string_view field, absl::string_view grammar, absl::string_view name) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": expected ", grammar, ", got '", Shown(name), "'"));
}

std::vector<absl::string_view> Parts(absl::string_view name) { return absl::StrSplit(name, '/'); }

// parts[0..3] = projects/{p}/jobs/{j}, or parts[0..1] = jobs/{j} (`short_ok`); the number of
// parts used, 0 when neither.
size_t MatchJob(const std::vector<absl::string_view>& p, bool short_ok, JobName* out) {
  if (p.size() >= 4 && p[0] == "projects" && ValidId(p[1]) && p[2] == "jobs" && ValidId(p[3])) {
    *out = JobName{std::string(p[1]), std::string(p[3])};
    return 4;
  }
  if (short_ok && p.size() >= 2 && p[0] == "jobs" && ValidId(p[1])) {
    *out = JobName{"", std::string(p[1])};
    return 2;
  }
  return 0;
}

constexpr char kJobGrammar[] = "projects/{project}/jobs/{job_id} (or jobs/{job_id})";
constexpr char kCheckpointGrammar[] =
    "projects/{project}/jobs/{job_id}[/checkpoints/{step|final}] (or jobs/{job_id}/...)";
constexpr char kDatasetGrammar[] = "projects/{project}/datasets/{dataset_id} (or datasets/{dataset_id})";

}  // namespace

bool ValidId(absl::string_view id) {
  if (id.empty() || id.size() > 63) return false;
  for (size_t i = 0; i < id.size(); ++i) {
    const char c = id[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (c == '-' && i > 0))) return false;
  }
  return true;
}

std::string Project(absl::string_view project) { return absl::StrCat("projects/", project); }

std::string Job(absl::string_view project, absl::string_view job) {
  return absl::StrCat("projects/", project, "/jobs/", job);
}

std::string Checkpoint(absl::string_view project, absl::string_view job, std::optional<int64_t> step) {
  return absl::StrCat(Job(project, job), "/checkpoints/", step.has_value() ? absl::StrCat(*step) : "final");
}

std::string Dataset(absl::string_view project, absl::string_view dataset) {
  return absl::StrCat("projects/", project, "/datasets/", dataset);
}

absl::StatusOr<std::string> ParseProject(absl::string_view name, absl::string_view field) {
  const std::vector<absl::string_view> p = Parts(name);
  if (p.size() == 2 && p[0] == "projects" && ValidId(p[1])) return std::string(p[1]);
  return Expected(field, "projects/{project} ([a-z0-9][a-z0-9-]{0,62})", name);
}

absl::StatusOr<JobName> ParseJob(absl::string_view name, absl::string_view field) {
  const std::vector<absl::string_view> p = Parts(name);
  JobName out;
  if (MatchJob(p, /*short_ok=*/true, &out) == p.size()) return out;
  return Expected(field, kJobGrammar, name);
}

absl::StatusOr<CheckpointName> ParseCheckpoint(absl::string_view name, absl::string_view field) {
  const std::vector<absl::string_view> p = Parts(name);
  CheckpointName out;
  const size_t used = MatchJob(p, /*short_ok=*/true, &out.job);
  if (used > 0 && used == p.size()) return out;  // the job's final checkpoint
  if (used > 0 && used + 2 == p.size() && p[used] == "checkpoints") {
    const absl::string_view c = p[used + 1];
    int64_t step = 0;
    if (c == "final") return out;
    if (!c.empty() && c.size() <= 18 && c.find_first_not_of("0123456789") == absl::string_view::npos &&
        absl::SimpleAtoi(c, &step)) {
      out.step = step;
      return out;
    }
  }
  return Expected(field, kCheckpointGrammar, name);
}

absl::StatusOr<DatasetName> ParseDataset(absl::string_view name, absl::string_view field) {
  const std::vector<absl::string_view> p = Parts(name);
  if (p.size() == 4 && p[0] == "projects" && ValidId(p[1]) && p[2] == "datasets" && ValidId(p[3])) {
    return DatasetName{std::string(p[1]), std::string(p[3])};
  }
  if (p.size() == 2 && p[0] == "datasets" && ValidId(p[1])) return DatasetName{"", std::string(p[1])};
  return Expected(field, kDatasetGrammar, name);
}

bool IsResourceName(absl::string_view kind, absl::string_view value) {
  if (kind == "dataset") return ParseDataset(value).ok();
  if (kind == "checkpoint") return absl::StartsWith(value, "projects/") && ParseCheckpoint(value).ok();
  return false;
}

}  // namespace oomb::names
