// What the JobStore backends share (server/store/*_job_store.cc); not part of the interface.
#ifndef OOMB_SERVER_STORE_STORE_INTERNAL_H_
#define OOMB_SERVER_STORE_STORE_INTERNAL_H_

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "google/protobuf/util/time_util.h"
#include "oomb/v1/jobs.pb.h"
#include "server/store/job_store.h"

namespace oomb::server::store_internal {

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

// Whether a change from `before` to `after` puts the job (back) in the queue: its wait starts.
inline bool EntersQueue(v1::Job::State before, v1::Job::State after) {
  return after == v1::Job::QUEUED && before != v1::Job::QUEUED;
}

}  // namespace oomb::server::store_internal

#endif  // OOMB_SERVER_STORE_STORE_INTERNAL_H_
