// What the JobStore backends share (server/store/*_job_store.cc); not part of the interface.
#ifndef OOMB_SERVER_STORE_STORE_INTERNAL_H_
#define OOMB_SERVER_STORE_STORE_INTERNAL_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/time_util.h"
#include "oomb/v1/jobs.pb.h"
#include "server/legacy_fields.h"
#include "server/store/job_store.h"

namespace oomb::server::store_internal {

// A record as read from the store, its old fields in their present form (server/legacy_fields.h).
template <typename T>
void UpgradeStored(T* record) {
  if constexpr (std::is_same_v<T, v1::Job> || std::is_same_v<T, v1::JobEvent>) UpgradeLegacyFields(record);
}

// The states in which a job is leased to the daemon running it.
inline bool IsLeased(v1::Job::State s) {
  return s == v1::Job::RUNNING || s == v1::Job::PAUSING || s == v1::Job::CANCELLING;
}

// The states Reap() looks at: the leased ones, and RECOVERING (never left standing by the
// scheduler, which goes on to QUEUED in the same transaction; older versions did).
inline std::vector<v1::Job::State> ReapableStates() {
  return {v1::Job::RUNNING, v1::Job::PAUSING, v1::Job::CANCELLING, v1::Job::RECOVERING};
}

// "projects/p/jobs/a" (or "jobs/a") -> "a".
inline std::string IdOf(const v1::Job& job) { return ParseStoredName(job.name()).id; }

// Numbers `events` after `last_sequence` and stamps them: job name, time (when unset), and the
// checkpoint's create time for CHECKPOINT_SAVED, before they are stored, so that a replay from
// the store equals the live event.
inline void StampEvents(const std::string& job_name, int64_t last_sequence, std::vector<v1::JobEvent>* events) {
  const auto now = google::protobuf::util::TimeUtil::GetCurrentTime();
  for (v1::JobEvent& e : *events) {
    e.set_job(job_name);
    e.set_sequence(++last_sequence);
    if (!e.has_time()) *e.mutable_time() = now;
    if (e.type() == v1::JobEvent::CHECKPOINT_SAVED && !e.checkpoint().has_create_time()) {
      *e.mutable_checkpoint()->mutable_create_time() = e.time();
    }
  }
}

// Runs `mutate` on a copy of `job` into `result` (Update's read-modify-write) and records the
// lease holder on it: Job.daemon is `owner` while the job stays in a leased state (and `owner`
// is set), and cleared otherwise. Returns whether the job is leased after the change.
inline absl::StatusOr<bool> MutateRecordingLease(const v1::Job& job, const JobMutation& mutate,
                                                 const std::string& owner, UpdateResult* result) {
  result->job = job;
  if (absl::Status s = mutate(&result->job, &result->events); !s.ok()) return s;
  const bool leased = IsLeased(result->job.state()) && !owner.empty();
  if (leased) {
    result->job.set_daemon(owner);
  } else {
    result->job.clear_daemon();
  }
  return leased;
}

// Whether `job` matches ListQuery's in-memory filters: every label with the same value, and one of
// its projects.
inline bool Matches(const v1::Job& job, const ListQuery& query) {
  for (const auto& [k, v] : query.labels) {
    auto it = job.labels().find(k);
    if (it == job.labels().end() || it->second != v) return false;
  }
  if (query.projects.empty()) return true;
  const std::string project = ParseStoredName(job.name()).project;
  return std::find(query.projects.begin(), query.projects.end(), project) != query.projects.end();
}

// The devices a job holds while leased (its gpus, at least 1).
inline int32_t DevicesOf(const v1::Job& job) { return std::max(1, job.spec().resources().gpus()); }

// The project of a stored job.
inline std::string ProjectOf(const v1::Job& job) { return ParseStoredName(job.name()).project; }

// The device-usage window (JobStore::Usage) and how long closed intervals are kept.
inline constexpr int64_t kUsageWindowMicros = int64_t{24} * 3600 * 1000000;
inline constexpr int64_t kUsageKeepMicros = 7 * kUsageWindowMicros;

// What a claim may take of each project with a quota, given its usage now: a project is
// excluded, or its jobs may take at most `max_devices` more devices.
struct ClaimLimits {
  std::vector<std::string> excluded;
  std::vector<std::pair<std::string, int64_t>> max_devices;
};
inline ClaimLimits LimitsFor(const std::map<std::string, ProjectQuota>& quotas,
                             const std::map<std::string, ProjectUsage>& usage) {
  ClaimLimits out;
  for (const auto& [project, quota] : quotas) {
    const auto it = usage.find(project);
    const ProjectUsage used = it == usage.end() ? ProjectUsage() : it->second;
    if (quota.max_device_seconds_per_day > 0 && used.device_seconds_per_day >= quota.max_device_seconds_per_day) {
      out.excluded.push_back(project);
    } else if (quota.max_devices > 0) {
      const int64_t room = quota.max_devices - used.running_devices;
      if (room <= 0) {
        out.excluded.push_back(project);
      } else {
        out.max_devices.emplace_back(project, room);
      }
    }
  }
  return out;
}

// The project of a dataset's name ("projects/{p}/datasets/{id}").
inline std::string DatasetProject(const v1::Dataset& d) {
  const std::string& n = d.name();
  const size_t start = n.find('/') + 1, end = n.find('/', start);
  return n.substr(start, end - start);
}

// CreateDataset for a name already recorded: the record when `asked` is the same content (a
// retried upload), ALREADY_EXISTS otherwise.
inline absl::StatusOr<v1::Dataset> SameDatasetOrTaken(const v1::Dataset& existing, const v1::Dataset& asked) {
  if (existing.sha256() == asked.sha256() && existing.size_bytes() == asked.size_bytes()) return existing;
  return absl::AlreadyExistsError(absl::StrCat(existing.name(), " exists with other content (sha256 ",
                                               existing.sha256(), "); delete it first, or choose another id"));
}

// RESOURCE_EXHAUSTED when `adding` bytes take `project` past `max_bytes` (0: no limit).
inline absl::Status CheckStorage(const std::string& project, int64_t used, int64_t adding, int64_t max_bytes) {
  if (max_bytes <= 0 || used + adding <= max_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat("project ", project, " stores ", used, " bytes of datasets; ",
                                                   adding, " more would pass its max_storage_bytes (", max_bytes,
                                                   " in tenancy.projects_file): delete some first"));
}

// Whether a change from `before` to `after` puts the job (back) in the queue: its wait starts.
inline bool EntersQueue(v1::Job::State before, v1::Job::State after) {
  return after == v1::Job::QUEUED && before != v1::Job::QUEUED;
}

}  // namespace oomb::server::store_internal

#endif  // OOMB_SERVER_STORE_STORE_INTERNAL_H_
