// The durable job store: jobs, their events, their checkpoints and idempotency keys.
//
// One interface, several backends (SQLite embedded today; PostgreSQL for a shared queue later,
// run against the same conformance tests). Jobs are stored as whole oomb.v1.Job messages plus
// the columns needed to query them; events carry a per-job `sequence` from 1 without gaps,
// which powers WatchJob's replay.
//
// Durability: every method that changes state returns only after the change is durable
// (SQLite: one BEGIN IMMEDIATE transaction with synchronous=FULL). Callers acknowledge a
// transition to clients only after the store returned OK, so nothing a client was told is lost
// on a crash.
//
// Thread-safety: every method may be called from any thread.
//
// Errors: NOT_FOUND (no such job), ALREADY_EXISTS (job id taken), FAILED_PRECONDITION (a
// `mutate` or `precondition` callback refused), INTERNAL (the database failed; the message
// names the operation).
#ifndef OOMB_SERVER_STORE_JOB_STORE_H_
#define OOMB_SERVER_STORE_JOB_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "oomb/v1/jobs.pb.h"

namespace oomb::server {

// The job id of a name "jobs/{id}" and back.
std::string JobName(const std::string& job_id);

struct CreateResult {
  v1::Job job;
  bool created = false;  // false: `request_id` was seen before and `job` is the first call's job
};

struct ListQuery {
  std::vector<v1::Job::State> states;         // any of these; empty: all
  std::map<std::string, std::string> labels;  // all must match
  int page_size = 50;                         // > 0
  int64_t before_position = 0;                // 0: from the newest; else positions < this
};

struct ListResult {
  std::vector<v1::Job> jobs;  // newest first
  int64_t next_position = 0;  // 0 on the last page; else pass as before_position
};

// The outcome of Update(): the job after the change and the events it appended, with their
// sequence numbers and times filled in.
struct UpdateResult {
  v1::Job job;
  std::vector<v1::JobEvent> events;
};

// Changes a job inside the store's transaction: edit `job` and append events (their `job`,
// `sequence` and `time` are filled in by the store). Return a non-OK status to abort without
// changing anything (e.g. FAILED_PRECONDITION for an illegal transition).
using JobMutation = std::function<absl::Status(v1::Job* job, std::vector<v1::JobEvent>* events)>;

class JobStore {
 public:
  virtual ~JobStore() = default;

  // Stores a new job (its `name` must be set, "jobs/{id}") and its first events atomically.
  // With a non-empty `request_id` seen before, stores nothing and returns the job that
  // request created (created = false), whatever its state now. ALREADY_EXISTS when the id is
  // taken by another request. The store assigns the job's list position.
  virtual absl::StatusOr<CreateResult> Create(const v1::Job& job, const std::string& request_id,
                                              std::vector<v1::JobEvent> events) = 0;

  virtual absl::StatusOr<v1::Job> Get(const std::string& job_id) = 0;

  // Newest first; the position is the store's creation order, so pages are stable while jobs
  // are created concurrently.
  virtual absl::StatusOr<ListResult> List(const ListQuery& query) = 0;

  // Jobs in any of `states`, oldest first (the scheduler's recovery and queue rebuild).
  virtual absl::StatusOr<std::vector<v1::Job>> ListByState(const std::vector<v1::Job::State>& states) = 0;

  // How many jobs are in each state now (states without jobs are absent). For /metrics.
  virtual absl::StatusOr<std::map<v1::Job::State, int64_t>> CountByState() = 0;

  // Read-modify-write of one job in one transaction (see JobMutation). A CHECKPOINT_SAVED
  // event also records its checkpoint for ListCheckpoints.
  virtual absl::StatusOr<UpdateResult> Update(const std::string& job_id, const JobMutation& mutate) = 0;

  // Deletes the job, its events, checkpoints records and idempotency keys, if `precondition`
  // accepts the job as it is inside the transaction.
  virtual absl::Status Delete(const std::string& job_id,
                              const std::function<absl::Status(const v1::Job&)>& precondition) = 0;

  // Events with sequence > after_sequence, in order, at most `limit` of them.
  virtual absl::StatusOr<std::vector<v1::JobEvent>> ListEvents(const std::string& job_id, int64_t after_sequence,
                                                               int limit) = 0;

  // Checkpoints in step order.
  virtual absl::StatusOr<std::vector<v1::Checkpoint>> ListCheckpoints(const std::string& job_id) = 0;
};

// Opens (creating if needed) the SQLite store at `path`: WAL journal, busy_timeout, synchronous
// = FULL, BEGIN IMMEDIATE for writers. INTERNAL when the file cannot be opened or migrated.
absl::StatusOr<std::unique_ptr<JobStore>> OpenSqliteJobStore(const std::string& path);

}  // namespace oomb::server

#endif  // OOMB_SERVER_STORE_JOB_STORE_H_
