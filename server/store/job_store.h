// The durable job store: jobs, their events, their checkpoints and idempotency keys, the queue
// the daemons' devices claim jobs from, the projects' device usage, and the records of uploaded
// datasets.
//
// One interface, two backends run against the same conformance tests
// (tests/server/job_store_conformance_test.cc): SQLite, embedded, for one daemon; PostgreSQL for
// a fleet of daemons sharing one queue. Jobs are stored as whole oomb.v1.Job messages plus the
// columns needed to query them; events carry a per-job `sequence` from 1 without gaps, which
// powers WatchJob's replay.
//
// Durability: every method that changes state returns only after the change is durable
// (SQLite: one BEGIN IMMEDIATE transaction with synchronous=FULL; PostgreSQL: one transaction,
// synchronous_commit as the server is configured, `on` by default). Callers acknowledge a
// transition to clients only after the store returned OK, so nothing a client was told is lost
// on a crash.
//
// Device accounting. Each time a job enters a leased state its devices (Job gpus) start
// counting for its project; when it leaves them (a run's end, a reap) they stop, the interval
// recorded with the database's clock. Usage() sums them over the last 24 h, the open intervals
// up to now; a reaped job's interval ends at the reap, so a dead daemon's job is counted until
// its lease is taken back. Intervals older than a week are deleted as new ones are recorded.
//
// Fleet mode (the queue, leases and heartbeats). A job in an active state (RUNNING, PAUSING,
// CANCELLING) is leased to the daemon running it: Claim() records the daemon's id (the
// owner, also in Job.daemon) and a lease expiry; Heartbeat() renews the leases of all of an
// owner's jobs; Reap() takes the jobs whose lease expired (their daemon died, or lost the
// database) back to the queue. Lease times are the database's clock (PostgreSQL's now()), so
// daemons' clocks need not agree. The owner is the store's to keep: Update() keeps it while the
// job stays active and clears it (and Job.daemon) when the job leaves the active states;
// mutations cannot change it. WaitForChanges() tells a daemon what other daemons changed
// (PostgreSQL: LISTEN/NOTIFY), so idle devices wake when work is queued elsewhere and watchers
// see events committed elsewhere.
//
// Thread-safety: every method may be called from any thread; WaitForChanges() by one thread at
// a time.
//
// Errors: NOT_FOUND (no such job), ALREADY_EXISTS (job id taken), FAILED_PRECONDITION (a
// `mutate` or `precondition` callback refused; the callback's status is returned as is),
// UNAVAILABLE (PostgreSQL cannot be reached; the operation changed nothing or, for a commit
// whose outcome is unknown, says so), INTERNAL (the database failed; the message names the
// operation).
#ifndef OOMB_SERVER_STORE_JOB_STORE_H_
#define OOMB_SERVER_STORE_JOB_STORE_H_

#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "oomb/v1/datasets.pb.h"
#include "oomb/v1/jobs.pb.h"

namespace oomb::server {

// Jobs live in projects: a job's name is "projects/{project}/jobs/{id}" (ids are unique across
// projects). A job stored before projects existed keeps its name "jobs/{id}" and lives in
// kDefaultProject, where jobs go when nothing says otherwise.
inline constexpr char kDefaultProject[] = "default";
std::string JobName(const std::string& project, const std::string& job_id);
struct JobRef {
  std::string project;
  std::string id;
};
// The project and id of a stored job's name (either form); an id alone for anything else.
JobRef ParseStoredName(const std::string& name);

struct CreateResult {
  v1::Job job;
  bool created = false;  // false: `request_id` was seen before and `job` is the first call's job
};

struct ListQuery {
  std::vector<v1::Job::State> states;         // any of these; empty: all
  std::map<std::string, std::string> labels;  // all must match
  std::vector<std::string> projects;          // in any of these (ParseStoredName); empty: all
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

// A project's limits on what its jobs run (tenancy.projects_file, server/projects.h); 0: none.
struct ProjectQuota {
  int64_t max_devices = 0;                // devices its leased jobs hold at once (Job gpus)
  double max_device_seconds_per_day = 0;  // device-seconds its jobs ran in the last 24 h
};

// What a project's jobs hold and used, now (Usage()).
struct ProjectUsage {
  int64_t running_devices = 0;        // devices held by its leased jobs (RUNNING, PAUSING, CANCELLING)
  double device_seconds_per_day = 0;  // device-seconds run in the last 24 h, the running jobs' so far too
  int64_t queued_jobs = 0;            // QUEUED
  int64_t waiting_jobs = 0;           // VALIDATING, QUEUED, PAUSED
};

// A page of datasets (ListDatasets).
struct DatasetPage {
  std::vector<v1::Dataset> datasets;  // newest first
  int64_t next_position = 0;          // 0 on the last page; else pass as before_position
};

// Which QUEUED jobs a device may take, and for whom.
struct ClaimRequest {
  std::string owner;  // the claiming daemon's id (store.daemon_id); not empty
  // The jobs this device may take: each value of spec.resources.device it may run, with the
  // most devices (spec.resources.gpus, stored as at least 1) the daemon has for such a job, e.g.
  // {"": 4, "auto": 4, "cuda": 4, "cuda:1": 1} for cuda:1 of a 4-GPU daemon. Jobs asking for
  // more are passed over. Not empty.
  std::map<std::string, int32_t> devices;
  absl::Duration lease = absl::Seconds(30);  // > 0; the claimed job's lease is now + lease
  // Projects with limits: a job of one is passed over when its devices would take the project
  // past max_devices, or when the project ran max_device_seconds_per_day in the last 24 h. The
  // usage is read inside the claim's transaction; claims that involve quotas are serialised
  // across daemons (PostgreSQL: an advisory lock), so a fleet never overshoots.
  std::map<std::string, ProjectQuota> quotas;
};

struct ClaimResult {
  UpdateResult update;    // the job after `start`, leased, and the events `start` appended
  absl::Duration queued;  // how long the job waited in QUEUED since it last entered it
};

// One of an owner's active jobs (Heartbeat()).
struct LeasedJob {
  std::string job_id;
  v1::Job::State state = v1::Job::STATE_UNSPECIFIED;  // RUNNING, PAUSING or CANCELLING
};

// Which active jobs Reap() takes back.
struct ReapRequest {
  // The caller's daemon id: its jobs are left alone (it renews their leases itself) unless
  // listed in `dead_owners`.
  std::string keep_owner;
  // Owners known to be gone, whose jobs are reaped whatever their lease (a daemon starting with
  // the id of its previous process).
  std::vector<std::string> dead_owners;
  // Every active job is reaped whatever its lease and owner (a daemon starting on a store no
  // other daemon uses: SQLite). Otherwise only expired leases, jobs without a lease and
  // `dead_owners`' jobs.
  bool all = false;
};

// A change another daemon committed (WaitForChanges()).
struct JobChange {
  std::string job_id;
  v1::Job::State state = v1::Job::STATE_UNSPECIFIED;  // after the change; unspecified: deleted
};

// A webhook delivery waiting in the outbox (server/notify/webhooks.h says what goes in it).
struct OutboxMessage {
  int64_t id = 0;          // the store's; 0 before it is stored
  std::string webhook_id;  // the webhook-id header, the same on every attempt
  std::string job_id;
  std::string url;
  std::string secret_file;
  // Non-empty: `secret_file` is the job's and is read beneath this project's allowed roots;
  // empty: the daemon's own (tenancy.projects_file).
  std::string secret_project;
  std::string type;                           // the payload's type, e.g. "job.succeeded"
  std::string payload;                        // the request body, JSON
  int32_t attempts = 0;                       // failed attempts so far
  absl::Time created = absl::InfinitePast();  // when the event was stored
  std::string last_error;
};

// The webhook deliveries an event of a job calls for (empty: none); called inside the
// transaction that stores the event, with the job as it is after the change.
using OutboxPolicy = std::function<std::vector<OutboxMessage>(const v1::Job& job, const v1::JobEvent& event)>;

// Changes a job inside the store's transaction: edit `job` and append events (their `job`,
// `sequence` and `time` are filled in by the store). Return a non-OK status to abort without
// changing anything (e.g. FAILED_PRECONDITION for an illegal transition).
using JobMutation = std::function<absl::Status(v1::Job* job, std::vector<v1::JobEvent>* events)>;

class JobStore {
 public:
  virtual ~JobStore() = default;

  // Sets what each stored event adds to the webhook outbox (none until set); before any other
  // call, once.
  void SetOutboxPolicy(OutboxPolicy policy) { outbox_policy_ = std::move(policy); }

  // Stores a new job (its `name` must be set, "jobs/{id}") and its first events atomically.
  // With a non-empty `request_id` seen before, stores nothing and returns the job that
  // request created (created = false), whatever its state now. ALREADY_EXISTS when the id is
  // taken by another request. The store assigns the job's list position.
  virtual absl::StatusOr<CreateResult> Create(const v1::Job& job, const std::string& request_id,
                                              std::vector<v1::JobEvent> events) = 0;

  virtual absl::StatusOr<v1::Job> Get(const std::string& job_id) = 0;

  // The id of the job a Create with this non-empty `request_id` created; nullopt when none did
  // (or that job was deleted).
  virtual absl::StatusOr<std::optional<std::string>> JobOfRequest(const std::string& request_id) = 0;

  // Newest first; the position is the store's creation order, so pages are stable while jobs
  // are created concurrently.
  virtual absl::StatusOr<ListResult> List(const ListQuery& query) = 0;

  // Jobs in any of `states`, oldest first (rescans of VALIDATING jobs, per-client limits).
  virtual absl::StatusOr<std::vector<v1::Job>> ListByState(const std::vector<v1::Job::State>& states) = 0;

  // How many jobs are in each state now (states without jobs are absent). For /metrics.
  virtual absl::StatusOr<std::map<v1::Job::State, int64_t>> CountByState() = 0;

  // What each project's jobs hold and used now (see "Device accounting"); projects without
  // jobs or usage are absent. For quotas, waiting reasons and /metrics.
  virtual absl::StatusOr<std::map<std::string, ProjectUsage>> Usage() = 0;

  // --- Uploaded datasets (DatasetService): their records; the files are the daemon's ---

  // Records `dataset` (its name "projects/{p}/datasets/{id}" set) unless the project's datasets
  // would then exceed `max_project_bytes` (0: no limit; RESOURCE_EXHAUSTED naming the limit).
  // A dataset of that name already recorded: returned as it is when its sha256 and size are
  // `dataset`'s (a retried upload; `created` false), ALREADY_EXISTS otherwise.
  virtual absl::StatusOr<v1::Dataset> CreateDataset(const v1::Dataset& dataset, int64_t max_project_bytes,
                                                    bool* created) = 0;
  // NOT_FOUND when absent.
  virtual absl::StatusOr<v1::Dataset> GetDataset(const std::string& name) = 0;
  // Newest first, of any of `projects` (empty: all), `page_size` > 0 at a time.
  virtual absl::StatusOr<DatasetPage> ListDatasets(const std::vector<std::string>& projects, int page_size,
                                                   int64_t before_position) = 0;
  // NOT_FOUND when absent.
  virtual absl::Status DeleteDataset(const std::string& name) = 0;
  // The bytes of the project's datasets.
  virtual absl::StatusOr<int64_t> DatasetBytes(const std::string& project) = 0;

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

  // --- The queue and fleet primitives (see the file comment) ---

  // 1 + the number of QUEUED jobs Claim() takes before `job_id` (higher priority, or the same
  // priority and created earlier); 0 when the job is not QUEUED. NOT_FOUND for no such job.
  virtual absl::StatusOr<int32_t> QueuePosition(const std::string& job_id) = 0;

  // Takes the best QUEUED job that `request` may run (highest priority, then oldest), applies
  // `start` to it (the QUEUED -> RUNNING transition) and leases it to request.owner, all in one
  // transaction. Concurrent claims, from this or other store objects and processes, never take
  // the same job (PostgreSQL: SELECT ... FOR UPDATE SKIP LOCKED). nullopt when no job is
  // eligible. The result's job carries Job.daemon = owner. A refusing `start` aborts the claim
  // and its status is returned (the job stays QUEUED, and no other job is tried in its place:
  // the scheduler refuses a job whose devices are busy, so the head of the queue waits for
  // them). INVALID_ARGUMENT for an empty owner or device list or a lease that is not positive.
  virtual absl::StatusOr<std::optional<ClaimResult>> Claim(const ClaimRequest& request, const JobMutation& start) = 0;

  // Renews the lease of every active job of `owner` to now + `lease`, and returns those jobs
  // with their states: a job of the owner's in CANCELLING or PAUSING was asked (perhaps through
  // another daemon) to stop; a job the owner runs but that is absent was taken from it (its lease
  // had expired and another daemon reaped it): the owner must stop it without recording more.
  virtual absl::StatusOr<std::vector<LeasedJob>> Heartbeat(const std::string& owner, absl::Duration lease) = 0;

  // Applies `recover` to every active job that request selects (see ReapRequest), each in its
  // own transaction, clearing its owner; jobs another store object is changing right now are
  // skipped (PostgreSQL: SKIP LOCKED) and reaped on a later call if still expired. A job
  // `recover` refuses is left as it was. Returns what it changed.
  virtual absl::StatusOr<std::vector<UpdateResult>> Reap(const ReapRequest& request, const JobMutation& recover) = 0;

  // Blocks until changes committed through other store objects (other daemons) arrive, or
  // `timeout` passes, and returns them: those since the previous call, or since the store was
  // opened (empty on timeout; a job changed several times may be reported once or several
  // times). A store nobody else shares (SQLite) reports nothing: it waits `timeout` and
  // returns an empty list. Changes made while the store had lost its connection to the
  // database are missed (UNAVAILABLE is returned while it cannot reconnect), so callers also
  // poll (Claim, Heartbeat) now and then.
  virtual absl::StatusOr<std::vector<JobChange>> WaitForChanges(absl::Duration timeout) = 0;

  // --- The webhook outbox (server/notify/webhook_sender.h) ---
  // Every event's OutboxPolicy messages are stored in the transaction that stores the event, so
  // a committed change is never without its deliveries, and a delivery is never lost to a
  // crash: it stays until FinishWebhook() removes it.

  // At most `limit` messages due now (next attempt reached, not held by another claim), oldest
  // first, held for `hold` (other claims pass them over; after it they are due again, as when
  // the daemon sending them died). PostgreSQL: FOR UPDATE SKIP LOCKED across daemons.
  virtual absl::StatusOr<std::vector<OutboxMessage>> ClaimWebhooks(int limit, absl::Duration hold) = 0;
  // Ends an attempt: `retry_in` nullopt removes the message (delivered, or given up); else it is
  // due again after `retry_in`, its attempts + 1 and `error` recorded. NOT_FOUND when absent.
  virtual absl::Status FinishWebhook(int64_t id, std::optional<absl::Duration> retry_in, const std::string& error) = 0;
  // Gives a claimed message back unattempted (its endpoint is busy or backing off): due again
  // after `due_in`, its attempts and last error unchanged. NOT_FOUND when absent.
  virtual absl::Status ReleaseWebhook(int64_t id, absl::Duration due_in) = 0;
  // How many messages wait (for /metrics and tests).
  virtual absl::StatusOr<int64_t> PendingWebhooks() = 0;

 protected:
  // The messages for `events` of `job` (none without a policy), their ids unset.
  std::vector<OutboxMessage> OutboxFor(const v1::Job& job, const std::vector<v1::JobEvent>& events) const {
    std::vector<OutboxMessage> out;
    if (!outbox_policy_) return out;
    for (const v1::JobEvent& e : events) {
      std::vector<OutboxMessage> m = outbox_policy_(job, e);
      out.insert(out.end(), std::make_move_iterator(m.begin()), std::make_move_iterator(m.end()));
    }
    return out;
  }

 private:
  OutboxPolicy outbox_policy_;
};

// Opens (creating if needed) the SQLite store at `path`: WAL journal, busy_timeout, synchronous
// = FULL, BEGIN IMMEDIATE for writers. INTERNAL when the file cannot be opened or migrated.
absl::StatusOr<std::unique_ptr<JobStore>> OpenSqliteJobStore(const std::string& path);

// Connects to PostgreSQL at `url` (a libpq connection string or URI, e.g.
// "postgresql://oomb@db.internal:5432/oomb") and creates or migrates the schema (serialised
// between daemons starting at once by an advisory lock). Two connections: one for queries,
// serialised by a mutex, one that LISTENs for WaitForChanges(). A lost connection is reopened
// on the next call. UNAVAILABLE when the server cannot be reached; INTERNAL when the schema
// cannot be created; FAILED_PRECONDITION when a newer oombd made it. Error messages never
// contain the URL's password.
absl::StatusOr<std::unique_ptr<JobStore>> OpenPostgresJobStore(const std::string& url);

}  // namespace oomb::server

#endif  // OOMB_SERVER_STORE_JOB_STORE_H_
