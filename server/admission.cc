#include "server/admission.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/common/status.h"

namespace oomb::server {

absl::Status AdmissionPolicy::Admit(const AdmissionRequest& request, JobStore& store) const {
  OOMB_RETURN_IF_ERROR(CheckQueues(request, store));
  OOMB_RETURN_IF_ERROR(Annotate(CheckPriority(request.priority, request.project, "resources.priority"), "spec"));
  if (options_.projects == nullptr) return absl::OkStatus();
  const int64_t most = options_.projects->Get(request.project).max_running_devices;
  if (most > 0 && request.gpus > most) {
    return absl::ResourceExhaustedError(absl::StrCat("resources.gpus: ", request.gpus, " ", options_.device_word,
                                                     " asked for, but project ", request.project, " may hold at most ",
                                                     most, " at once (max_running_devices in tenancy.projects_file)"));
  }
  return absl::OkStatus();
}

absl::Status AdmissionPolicy::CheckQueues(const AdmissionRequest& request, JobStore& store) const {
  const int64_t project_limit =
      options_.projects != nullptr ? options_.projects->Get(request.project).max_queued_jobs : 0;
  if (project_limit > 0) {
    OOMB_ASSIGN_OR_RETURN(const auto usage, store.Usage());
    const auto it = usage.find(request.project);
    const int64_t waiting = it == usage.end() ? 0 : it->second.waiting_jobs;
    if (waiting >= project_limit) {
      return absl::ResourceExhaustedError(absl::StrCat("project ", request.project, " has ", waiting,
                                                       " jobs waiting (max_queued_jobs ", project_limit,
                                                       " in tenancy.projects_file); submit when some have started"));
    }
  }
  if (options_.max_queued_per_client > 0 && !request.creator.empty()) {
    OOMB_ASSIGN_OR_RETURN(const std::vector<v1::Job> waiting,
                          store.ListByState({v1::Job::VALIDATING, v1::Job::QUEUED, v1::Job::PAUSED}));
    const int64_t mine =
        std::count_if(waiting.begin(), waiting.end(), [&](const v1::Job& j) { return j.creator() == request.creator; });
    if (mine >= options_.max_queued_per_client) {
      return absl::ResourceExhaustedError(
          absl::StrCat(request.creator, " already has ", mine, " jobs waiting (scheduler.max_queued_jobs_per_client: ",
                       options_.max_queued_per_client, "); submit more when some have started or ended"));
    }
  }
  return absl::OkStatus();
}

absl::Status AdmissionPolicy::CheckPriority(int64_t priority, const std::string& project,
                                            const std::string& field) const {
  if (options_.projects == nullptr) return absl::OkStatus();
  const std::optional<int64_t> max = options_.projects->Get(project).max_priority;
  if (!max.has_value() || priority <= *max) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": at most ", *max, " in project ", project,
                                                 " (max_priority in tenancy.projects_file), got ", priority));
}

std::map<std::string, ProjectQuota> AdmissionPolicy::Quotas() const {
  std::map<std::string, ProjectQuota> out;
  if (options_.projects == nullptr) return out;
  for (const auto& [project, settings] : options_.projects->All()) {
    if (settings.max_running_devices > 0 || settings.max_device_hours_per_day > 0) {
      out[project] = ProjectQuota{.max_devices = settings.max_running_devices,
                                  .max_device_seconds_per_day = settings.max_device_hours_per_day * 3600};
    }
  }
  return out;
}

std::string AdmissionPolicy::QuotaReason(const v1::Job& job, const std::map<std::string, ProjectUsage>& usage) const {
  if (options_.projects == nullptr) return "";
  const std::string project = ParseStoredName(job.name()).project;
  const ProjectSettings settings = options_.projects->Get(project);
  const auto it = usage.find(project);
  const ProjectUsage used = it == usage.end() ? ProjectUsage() : it->second;
  const std::string& word = options_.device_word;
  if (settings.max_device_hours_per_day > 0 &&
      used.device_seconds_per_day >= settings.max_device_hours_per_day * 3600) {
    return absl::StrFormat("project %s used %.1f/%g %s-hours in the last 24 h", project,
                           used.device_seconds_per_day / 3600, settings.max_device_hours_per_day,
                           word.substr(0, word.size() - 1));
  }
  const int gpus = std::max(1, job.spec().resources().gpus());
  if (settings.max_running_devices > 0 && used.running_devices + gpus > settings.max_running_devices) {
    return absl::StrCat("project ", project, " uses ", used.running_devices, "/", settings.max_running_devices, " ",
                        word, gpus > 1 ? absl::StrCat(" (this job needs ", gpus, ")") : "");
  }
  return "";
}

bool AdmissionPolicy::MayPreempt(const RunningJob& victim, const v1::Job& waiting, absl::Time now) const {
  if (options_.preemption == PreemptionScope::kNone) return false;
  if (victim.priority >= waiting.priority()) return false;
  const std::string project = ParseStoredName(waiting.name()).project;
  if (victim.project != project &&
      (options_.preemption == PreemptionScope::kProject ||
       (options_.projects != nullptr && !options_.projects->Get(project).preempt_other_projects))) {
    return false;
  }
  return now - victim.started >= options_.preemption_min_run;
}

}  // namespace oomb::server
