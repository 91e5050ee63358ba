// The SQLite JobStore. One connection, serialised by a mutex: the daemon is the only writer
// and every write is a short transaction. WAL lets outside readers (sqlite3, backups) read
// while the daemon writes. The queue and leases follow the interface with the process clock
// (one daemon per file); WaitForChanges() has nobody else to hear from.
#include <SQLiteCpp/SQLiteCpp.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "server/store/job_store.h"
#include "server/store/store_internal.h"
#include "worker/common/status.h"

namespace oomb::server {

std::string JobName(const std::string& project, const std::string& job_id) {
  return absl::StrCat("projects/", project, "/jobs/", job_id);
}

JobRef ParseStoredName(const std::string& name) {
  const std::vector<std::string> parts = absl::StrSplit(name, '/');
  if (parts.size() == 4 && parts[0] == "projects" && parts[2] == "jobs") return {parts[1], parts[3]};
  if (parts.size() == 2 && parts[0] == "jobs") return {kDefaultProject, parts[1]};
  return {kDefaultProject, name};
}

namespace {

using store_internal::IdOf;
using store_internal::IsLeased;

// Times in the lease and queue columns: microseconds since the Unix epoch.
int64_t NowMicros() { return absl::ToUnixMicros(absl::Now()); }

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS jobs (
  position INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  state INTEGER NOT NULL,
  last_sequence INTEGER NOT NULL DEFAULT 0,
  job BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
CREATE TABLE IF NOT EXISTS job_events (
  job_id TEXT NOT NULL,
  sequence INTEGER NOT NULL,
  event BLOB NOT NULL,
  PRIMARY KEY (job_id, sequence)
);
CREATE TABLE IF NOT EXISTS checkpoints (
  job_id TEXT NOT NULL,
  sequence INTEGER NOT NULL,
  step INTEGER NOT NULL,
  checkpoint BLOB NOT NULL,
  PRIMARY KEY (job_id, sequence)
);
CREATE TABLE IF NOT EXISTS idempotency_keys (
  request_id TEXT PRIMARY KEY,
  job_id TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS device_usage (
  job_id TEXT NOT NULL,
  project TEXT NOT NULL,
  devices INTEGER NOT NULL,
  started INTEGER NOT NULL,
  ended INTEGER
);
CREATE INDEX IF NOT EXISTS device_usage_open ON device_usage(job_id) WHERE ended IS NULL;
CREATE INDEX IF NOT EXISTS device_usage_ended ON device_usage(ended);
CREATE TABLE IF NOT EXISTS datasets (
  position INTEGER PRIMARY KEY AUTOINCREMENT,
  name TEXT NOT NULL UNIQUE,
  project TEXT NOT NULL,
  bytes INTEGER NOT NULL,
  dataset BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS webhook_outbox (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  webhook_id TEXT NOT NULL,
  job_id TEXT NOT NULL,
  url TEXT NOT NULL,
  secret_file TEXT NOT NULL,
  secret_project TEXT NOT NULL,
  type TEXT NOT NULL,
  payload TEXT NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0,
  created INTEGER NOT NULL,
  next_attempt INTEGER NOT NULL,
  held_until INTEGER NOT NULL DEFAULT 0,
  last_error TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS webhook_outbox_due ON webhook_outbox(next_attempt);
)sql";

// Columns added for the queue and leases (fleet mode), to files made before them.
struct AddedColumn {
  const char* name;
  const char* definition;
};
constexpr AddedColumn kQueueColumns[] = {
    {"priority", "INTEGER NOT NULL DEFAULT 0"},  // spec.resources.priority
    {"device", "TEXT NOT NULL DEFAULT ''"},      // spec.resources.device
    {"gpus", "INTEGER NOT NULL DEFAULT 1"},      // max(1, spec.resources.gpus)
    {"owner", "TEXT"},                           // the daemon holding the lease
    {"lease_expires", "INTEGER"},                // microseconds since the epoch
    {"queued_at", "INTEGER"},                    // when the job last entered QUEUED, microseconds
    {"project", "TEXT NOT NULL DEFAULT ''"},     // the project of the job's name
};

// BEGIN IMMEDIATE ... COMMIT, rolled back unless committed.
class WriteTransaction {
 public:
  explicit WriteTransaction(SQLite::Database& db) : db_(db) { db_.exec("BEGIN IMMEDIATE"); }
  ~WriteTransaction() {
    if (!done_) {
      try {
        db_.exec("ROLLBACK");
      } catch (...) {  // destructors never throw; the connection reports the next error
      }
    }
  }
  void Commit() {
    db_.exec("COMMIT");
    done_ = true;
  }

 private:
  SQLite::Database& db_;
  bool done_ = false;
};

std::string Blob(const google::protobuf::Message& m) { return m.SerializeAsString(); }

template <typename T>
absl::StatusOr<T> Parse(const SQLite::Column& c) {
  T m;
  if (!m.ParseFromArray(c.getBlob(), c.getBytes())) return absl::DataLossError("corrupt record in the job store");
  store_internal::UpgradeStored(&m);
  return m;
}

class SqliteJobStore : public JobStore {
 public:
  explicit SqliteJobStore(std::unique_ptr<SQLite::Database> db) : db_(std::move(db)) {}

  absl::StatusOr<CreateResult> Create(const v1::Job& job, const std::string& request_id,
                                      std::vector<v1::JobEvent> events) override {
    absl::MutexLock lock(&mu_);
    return Guard("create job", [&]() -> absl::StatusOr<CreateResult> {
      const std::string id = IdOf(job);
      WriteTransaction tx(*db_);
      if (!request_id.empty()) {
        SQLite::Statement q(*db_, "SELECT job_id FROM idempotency_keys WHERE request_id = ?");
        q.bind(1, request_id);
        if (q.executeStep()) {
          OOMB_ASSIGN_OR_RETURN(v1::Job existing, GetLocked(q.getColumn(0).getString()));
          return CreateResult{existing, false};
        }
      }
      {
        SQLite::Statement q(*db_, "SELECT 1 FROM jobs WHERE id = ?");
        q.bind(1, id);
        if (q.executeStep()) return absl::AlreadyExistsError(absl::StrCat("job ", id, " already exists"));
      }
      v1::Job stored = job;
      stored.clear_daemon();  // only Claim() leases
      SQLite::Statement ins(*db_,
                            "INSERT INTO jobs (id, state, job, priority, device, gpus, queued_at, project) VALUES (?, "
                            "?, ?, ?, ?, ?, ?, ?)");
      ins.bind(1, id);
      ins.bind(2, static_cast<int>(stored.state()));
      const std::string blob = Blob(stored);
      ins.bind(3, blob.data(), static_cast<int>(blob.size()));
      ins.bind(4, stored.priority());
      ins.bind(5, stored.spec().resources().device());
      ins.bind(6, std::max(1, stored.spec().resources().gpus()));
      if (stored.state() == v1::Job::QUEUED) {
        ins.bind(7, NowMicros());
      } else {
        ins.bind(7);
      }
      ins.bind(8, store_internal::ProjectOf(stored));
      ins.exec();
      if (!request_id.empty()) {
        SQLite::Statement k(*db_, "INSERT INTO idempotency_keys (request_id, job_id) VALUES (?, ?)");
        k.bind(1, request_id);
        k.bind(2, id);
        k.exec();
      }
      AppendEventsLocked(id, stored, 0, &events);
      SetLastSequenceLocked(id, static_cast<int64_t>(events.size()));
      tx.Commit();
      return CreateResult{stored, true};
    });
  }

  absl::StatusOr<v1::Job> Get(const std::string& job_id) override {
    absl::MutexLock lock(&mu_);
    return Guard("get job", [&]() { return GetLocked(job_id); });
  }

  absl::StatusOr<std::optional<std::string>> JobOfRequest(const std::string& request_id) override {
    absl::MutexLock lock(&mu_);
    return Guard("find request", [&]() -> absl::StatusOr<std::optional<std::string>> {
      SQLite::Statement q(*db_, "SELECT job_id FROM idempotency_keys WHERE request_id = ?");
      q.bind(1, request_id);
      if (!q.executeStep()) return std::nullopt;
      return q.getColumn(0).getString();
    });
  }

  absl::StatusOr<ListResult> List(const ListQuery& query) override {
    absl::MutexLock lock(&mu_);
    return Guard("list jobs", [&]() -> absl::StatusOr<ListResult> {
      std::string sql = "SELECT position, job FROM jobs WHERE position < ?";
      if (!query.states.empty()) {
        sql += " AND state IN (";
        for (size_t i = 0; i < query.states.size(); ++i) sql += i ? ",?" : "?";
        sql += ")";
      }
      sql += " ORDER BY position DESC";
      SQLite::Statement q(*db_, sql);
      q.bind(1, query.before_position > 0 ? query.before_position : std::numeric_limits<int64_t>::max());
      for (size_t i = 0; i < query.states.size(); ++i)
        q.bind(static_cast<int>(i + 2), static_cast<int>(query.states[i]));
      ListResult out;
      int64_t last_position = 0;
      while (q.executeStep()) {
        const int64_t position = q.getColumn(0).getInt64();
        OOMB_ASSIGN_OR_RETURN(v1::Job job, Parse<v1::Job>(q.getColumn(1)));
        if (!store_internal::Matches(job, query)) continue;
        if (static_cast<int>(out.jobs.size()) == query.page_size) {
          // One more match exists: the next page starts at the last job returned.
          out.next_position = last_position;
          break;
        }
        out.jobs.push_back(std::move(job));
        last_position = position;
      }
      return out;
    });
  }

  absl::StatusOr<std::vector<v1::Job>> ListByState(const std::vector<v1::Job::State>& states) override {
    absl::MutexLock lock(&mu_);
    return Guard("list jobs by state", [&]() -> absl::StatusOr<std::vector<v1::Job>> {
      std::vector<v1::Job> out;
      if (states.empty()) return out;
      std::string sql = "SELECT job FROM jobs WHERE state IN (";
      for (size_t i = 0; i < states.size(); ++i) sql += i ? ",?" : "?";
      sql += ") ORDER BY position ASC";
      SQLite::Statement q(*db_, sql);
      for (size_t i = 0; i < states.size(); ++i) q.bind(static_cast<int>(i + 1), static_cast<int>(states[i]));
      while (q.executeStep()) {
        OOMB_ASSIGN_OR_RETURN(v1::Job job, Parse<v1::Job>(q.getColumn(0)));
        out.push_back(std::move(job));
      }
      return out;
    });
  }

  absl::StatusOr<std::map<v1::Job::State, int64_t>> CountByState() override {
    absl::MutexLock lock(&mu_);
    return Guard("count jobs by state", [&]() -> absl::StatusOr<std::map<v1::Job::State, int64_t>> {
      std::map<v1::Job::State, int64_t> out;
      SQLite::Statement q(*db_, "SELECT state, COUNT(*) FROM jobs GROUP BY state");
      while (q.executeStep()) {
        out[static_cast<v1::Job::State>(q.getColumn(0).getInt())] = q.getColumn(1).getInt64();
      }
      return out;
    });
  }

  absl::StatusOr<std::map<std::string, ProjectUsage>> Usage() override {
    absl::MutexLock lock(&mu_);
    return Guard("usage by project", [&]() { return UsageLocked(); });
  }

  absl::StatusOr<v1::Dataset> CreateDataset(const v1::Dataset& dataset, int64_t max_project_bytes,
                                            bool* created) override {
    absl::MutexLock lock(&mu_);
    return Guard("record a dataset", [&]() -> absl::StatusOr<v1::Dataset> {
      WriteTransaction tx(*db_);
      *created = false;
      {
        SQLite::Statement q(*db_, "SELECT dataset FROM datasets WHERE name = ?");
        q.bind(1, dataset.name());
        if (q.executeStep()) {
          OOMB_ASSIGN_OR_RETURN(v1::Dataset existing, Parse<v1::Dataset>(q.getColumn(0)));
          return store_internal::SameDatasetOrTaken(existing, dataset);
        }
      }
      const std::string project = store_internal::DatasetProject(dataset);
      OOMB_ASSIGN_OR_RETURN(const int64_t used, DatasetBytesLocked(project));
      OOMB_RETURN_IF_ERROR(store_internal::CheckStorage(project, used, dataset.size_bytes(), max_project_bytes));
      SQLite::Statement ins(*db_, "INSERT INTO datasets (name, project, bytes, dataset) VALUES (?, ?, ?, ?)");
      ins.bind(1, dataset.name());
      ins.bind(2, project);
      ins.bind(3, dataset.size_bytes());
      const std::string blob = Blob(dataset);
      ins.bind(4, blob.data(), static_cast<int>(blob.size()));
      ins.exec();
      tx.Commit();
      *created = true;
      return dataset;
    });
  }

  absl::StatusOr<v1::Dataset> GetDataset(const std::string& name) override {
    absl::MutexLock lock(&mu_);
    return Guard("get a dataset", [&]() -> absl::StatusOr<v1::Dataset> {
      SQLite::Statement q(*db_, "SELECT dataset FROM datasets WHERE name = ?");
      q.bind(1, name);
      if (!q.executeStep()) return absl::NotFoundError(absl::StrCat("no dataset ", name));
      return Parse<v1::Dataset>(q.getColumn(0));
    });
  }

  absl::StatusOr<DatasetPage> ListDatasets(const std::vector<std::string>& projects, int page_size,
                                           int64_t before_position) override {
    absl::MutexLock lock(&mu_);
    return Guard("list datasets", [&]() -> absl::StatusOr<DatasetPage> {
      std::string sql = "SELECT position, dataset FROM datasets WHERE position < ?";
      if (!projects.empty()) {
        sql += " AND project IN (";
        for (size_t i = 0; i < projects.size(); ++i) sql += i ? ",?" : "?";
        sql += ")";
      }
      sql += " ORDER BY position DESC LIMIT ?";
      SQLite::Statement q(*db_, sql);
      int param = 1;
      q.bind(param++, before_position > 0 ? before_position : std::numeric_limits<int64_t>::max());
      for (const std::string& p : projects) q.bind(param++, p);
      q.bind(param++, page_size + 1);
      DatasetPage out;
      int64_t last = 0;
      while (q.executeStep()) {
        if (static_cast<int>(out.datasets.size()) == page_size) {
          out.next_position = last;
          break;
        }
        last = q.getColumn(0).getInt64();
        OOMB_ASSIGN_OR_RETURN(v1::Dataset d, Parse<v1::Dataset>(q.getColumn(1)));
        out.datasets.push_back(std::move(d));
      }
      return out;
    });
  }

  absl::Status DeleteDataset(const std::string& name) override {
    absl::MutexLock lock(&mu_);
    return Guard("delete a dataset",
                 [&]() -> absl::StatusOr<bool> {
                   SQLite::Statement del(*db_, "DELETE FROM datasets WHERE name = ?");
                   del.bind(1, name);
                   if (del.exec() == 0) return absl::NotFoundError(absl::StrCat("no dataset ", name));
                   return true;
                 })
        .status();
  }

  absl::StatusOr<int64_t> DatasetBytes(const std::string& project) override {
    absl::MutexLock lock(&mu_);
    return Guard("dataset bytes", [&]() { return DatasetBytesLocked(project); });
  }

  absl::StatusOr<UpdateResult> Update(const std::string& job_id, const JobMutation& mutate) override {
    absl::MutexLock lock(&mu_);
    return Guard("update job", [&]() -> absl::StatusOr<UpdateResult> {
      WriteTransaction tx(*db_);
      OOMB_ASSIGN_OR_RETURN(Row row, ReadRowLocked(job_id));
      OOMB_ASSIGN_OR_RETURN(UpdateResult result, ApplyLocked(row, mutate, row.owner));
      tx.Commit();
      return result;
    });
  }

  absl::Status Delete(const std::string& job_id,
                      const std::function<absl::Status(const v1::Job&)>& precondition) override {
    absl::MutexLock lock(&mu_);
    return Guard("delete job",
                 [&]() -> absl::StatusOr<bool> {
                   WriteTransaction tx(*db_);
                   OOMB_ASSIGN_OR_RETURN(v1::Job job, GetLocked(job_id));
                   const absl::Status s = precondition(job);
                   if (!s.ok()) return s;
                   for (const char* sql :
                        {"DELETE FROM jobs WHERE id = ?", "DELETE FROM job_events WHERE job_id = ?",
                         "DELETE FROM checkpoints WHERE job_id = ?", "DELETE FROM idempotency_keys WHERE job_id = ?"}) {
                     SQLite::Statement d(*db_, sql);
                     d.bind(1, job_id);
                     d.exec();
                   }
                   tx.Commit();
                   return true;
                 })
        .status();
  }

  absl::StatusOr<std::vector<v1::JobEvent>> ListEvents(const std::string& job_id, int64_t after_sequence,
                                                       int limit) override {
    absl::MutexLock lock(&mu_);
    return Guard("list events", [&]() -> absl::StatusOr<std::vector<v1::JobEvent>> {
      {
        SQLite::Statement q(*db_, "SELECT 1 FROM jobs WHERE id = ?");
        q.bind(1, job_id);
        if (!q.executeStep()) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
      }
      SQLite::Statement q(*db_,
                          "SELECT event FROM job_events WHERE job_id = ? AND sequence > ? ORDER BY sequence LIMIT ?");
      q.bind(1, job_id);
      q.bind(2, after_sequence);
      q.bind(3, limit);
      std::vector<v1::JobEvent> out;
      while (q.executeStep()) {
        OOMB_ASSIGN_OR_RETURN(v1::JobEvent e, Parse<v1::JobEvent>(q.getColumn(0)));
        out.push_back(std::move(e));
      }
      return out;
    });
  }

  absl::StatusOr<std::vector<v1::Checkpoint>> ListCheckpoints(const std::string& job_id) override {
    absl::MutexLock lock(&mu_);
    return Guard("list checkpoints", [&]() -> absl::StatusOr<std::vector<v1::Checkpoint>> {
      OOMB_ASSIGN_OR_RETURN(v1::Job job, GetLocked(job_id));
      (void)job;
      SQLite::Statement q(*db_, "SELECT checkpoint FROM checkpoints WHERE job_id = ? ORDER BY step, sequence");
      q.bind(1, job_id);
      std::vector<v1::Checkpoint> out;
      while (q.executeStep()) {
        OOMB_ASSIGN_OR_RETURN(v1::Checkpoint c, Parse<v1::Checkpoint>(q.getColumn(0)));
        out.push_back(std::move(c));
      }
      return out;
    });
  }

  absl::StatusOr<int32_t> QueuePosition(const std::string& job_id) override {
    absl::MutexLock lock(&mu_);
    return Guard("queue position", [&]() -> absl::StatusOr<int32_t> {
      SQLite::Statement q(*db_, "SELECT state, priority, position FROM jobs WHERE id = ?");
      q.bind(1, job_id);
      if (!q.executeStep()) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
      if (q.getColumn(0).getInt() != v1::Job::QUEUED) return 0;
      const int priority = q.getColumn(1).getInt();
      const int64_t position = q.getColumn(2).getInt64();
      SQLite::Statement c(
          *db_, "SELECT COUNT(*) FROM jobs WHERE state = ? AND (priority > ? OR (priority = ? AND position < ?))");
      c.bind(1, static_cast<int>(v1::Job::QUEUED));
      c.bind(2, priority);
      c.bind(3, priority);
      c.bind(4, position);
      c.executeStep();
      return static_cast<int32_t>(c.getColumn(0).getInt64() + 1);
    });
  }

  absl::StatusOr<std::optional<ClaimResult>> Claim(const ClaimRequest& request, const JobMutation& start) override {
    if (request.owner.empty() || request.devices.empty() || request.lease <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError("claim: owner, devices and a positive lease are required");
    }
    absl::MutexLock lock(&mu_);
    return Guard("claim a job", [&]() -> absl::StatusOr<std::optional<ClaimResult>> {
      WriteTransaction tx(*db_);
      store_internal::ClaimLimits limits;
      if (!request.quotas.empty()) {
        OOMB_ASSIGN_OR_RETURN(const auto usage, UsageLocked());
        limits = store_internal::LimitsFor(request.quotas, usage);
      }
      std::string sql = "SELECT id FROM jobs WHERE state = ? AND (";
      for (size_t i = 0; i < request.devices.size(); ++i)
        sql += i ? " OR (device = ? AND gpus <= ?)" : "(device = ? AND gpus <= ?)";
      sql += ")";
      for (size_t i = 0; i < limits.excluded.size(); ++i) sql += " AND project != ?";
      for (size_t i = 0; i < limits.max_devices.size(); ++i) sql += " AND (project != ? OR gpus <= ?)";
      sql += " ORDER BY priority DESC, position ASC LIMIT 1";
      SQLite::Statement q(*db_, sql);
      q.bind(1, static_cast<int>(v1::Job::QUEUED));
      int param = 2;
      for (const auto& [device, max_gpus] : request.devices) {
        q.bind(param++, device);
        q.bind(param++, max_gpus);
      }
      for (const std::string& project : limits.excluded) q.bind(param++, project);
      for (const auto& [project, room] : limits.max_devices) {
        q.bind(param++, project);
        q.bind(param++, room);
      }
      if (!q.executeStep()) return std::optional<ClaimResult>();
      const std::string id = q.getColumn(0).getString();
      q.reset();
      OOMB_ASSIGN_OR_RETURN(Row row, ReadRowLocked(id));
      const int64_t now = NowMicros();
      ClaimResult out;
      out.queued = row.queued_at > 0 ? absl::Microseconds(now - row.queued_at) : absl::ZeroDuration();
      OOMB_ASSIGN_OR_RETURN(out.update, ApplyLocked(row, start, request.owner));
      if (IsLeased(out.update.job.state())) {
        SQLite::Statement up(*db_, "UPDATE jobs SET lease_expires = ? WHERE id = ?");
        up.bind(1, now + absl::ToInt64Microseconds(request.lease));
        up.bind(2, id);
        up.exec();
      }
      tx.Commit();
      return std::optional<ClaimResult>(std::move(out));
    });
  }

  absl::StatusOr<std::vector<LeasedJob>> Heartbeat(const std::string& owner, absl::Duration lease) override {
    absl::MutexLock lock(&mu_);
    return Guard("heartbeat", [&]() -> absl::StatusOr<std::vector<LeasedJob>> {
      WriteTransaction tx(*db_);
      SQLite::Statement up(*db_, "UPDATE jobs SET lease_expires = ? WHERE owner = ? AND state IN (?, ?, ?)");
      up.bind(1, NowMicros() + absl::ToInt64Microseconds(lease));
      up.bind(2, owner);
      up.bind(3, static_cast<int>(v1::Job::RUNNING));
      up.bind(4, static_cast<int>(v1::Job::PAUSING));
      up.bind(5, static_cast<int>(v1::Job::CANCELLING));
      up.exec();
      SQLite::Statement q(*db_, "SELECT id, state FROM jobs WHERE owner = ? AND state IN (?, ?, ?) ORDER BY position");
      q.bind(1, owner);
      q.bind(2, static_cast<int>(v1::Job::RUNNING));
      q.bind(3, static_cast<int>(v1::Job::PAUSING));
      q.bind(4, static_cast<int>(v1::Job::CANCELLING));
      std::vector<LeasedJob> out;
      while (q.executeStep()) {
        out.push_back(LeasedJob{q.getColumn(0).getString(), static_cast<v1::Job::State>(q.getColumn(1).getInt())});
      }
      q.reset();
      tx.Commit();
      return out;
    });
  }

  absl::StatusOr<std::vector<UpdateResult>> Reap(const ReapRequest& request, const JobMutation& recover) override {
    absl::MutexLock lock(&mu_);
    return Guard("reap expired leases", [&]() -> absl::StatusOr<std::vector<UpdateResult>> {
      std::vector<std::string> ids;
      {
        const std::vector<v1::Job::State> states = store_internal::ReapableStates();
        std::string sql = "SELECT id, owner, lease_expires FROM jobs WHERE state IN (";
        for (size_t i = 0; i < states.size(); ++i) sql += i ? ",?" : "?";
        sql += ") ORDER BY position";
        SQLite::Statement q(*db_, sql);
        for (size_t i = 0; i < states.size(); ++i) q.bind(static_cast<int>(i + 1), static_cast<int>(states[i]));
        const int64_t now = NowMicros();
        while (q.executeStep()) {
          const std::string owner = q.getColumn(1).isNull() ? "" : q.getColumn(1).getString();
          const bool no_lease = q.getColumn(2).isNull();
          const bool dead =
              std::find(request.dead_owners.begin(), request.dead_owners.end(), owner) != request.dead_owners.end();
          const bool kept = !request.keep_owner.empty() && owner == request.keep_owner;
          const bool expired = no_lease || q.getColumn(2).getInt64() < now;
          if (request.all || dead || (!kept && expired)) ids.push_back(q.getColumn(0).getString());
        }
      }
      std::vector<UpdateResult> out;
      for (const std::string& id : ids) {
        WriteTransaction tx(*db_);
        OOMB_ASSIGN_OR_RETURN(Row row, ReadRowLocked(id));
        absl::StatusOr<UpdateResult> r = ApplyLocked(row, recover, "");
        if (!r.ok()) continue;  // `recover` refused: leave the job as it is
        tx.Commit();
        out.push_back(*std::move(r));
      }
      return out;
    });
  }

  absl::StatusOr<std::vector<JobChange>> WaitForChanges(absl::Duration timeout) override {
    // Nobody else writes this file (one daemon per SQLite store): there is nothing to hear.
    absl::SleepFor(timeout);
    return std::vector<JobChange>();
  }

  absl::StatusOr<std::vector<OutboxMessage>> ClaimWebhooks(int limit, absl::Duration hold) override {
    absl::MutexLock lock(&mu_);
    return Guard("claim webhooks", [&]() -> absl::StatusOr<std::vector<OutboxMessage>> {
      const int64_t now = NowMicros();
      WriteTransaction tx(*db_);
      SQLite::Statement q(*db_,
                          "SELECT id, webhook_id, job_id, url, secret_file, secret_project, type, payload, attempts, "
                          "created, last_error FROM webhook_outbox WHERE next_attempt <= ?1 AND held_until <= ?1 "
                          "ORDER BY id LIMIT ?2");
      q.bind(1, now);
      q.bind(2, limit);
      std::vector<OutboxMessage> out;
      while (q.executeStep()) {
        OutboxMessage m;
        m.id = q.getColumn(0).getInt64();
        std::string* text[] = {&m.webhook_id,     &m.job_id, &m.url,    &m.secret_file,
                               &m.secret_project, &m.type,   &m.payload};
        for (int i = 0; i < 7; ++i) *text[i] = q.getColumn(i + 1).getString();
        m.attempts = q.getColumn(8).getInt();
        m.created = absl::FromUnixMicros(q.getColumn(9).getInt64());
        m.last_error = q.getColumn(10).getString();
        out.push_back(std::move(m));
      }
      for (const OutboxMessage& m : out) {
        SQLite::Statement up(*db_, "UPDATE webhook_outbox SET held_until = ? WHERE id = ?");
        up.bind(1, now + absl::ToInt64Microseconds(hold));
        up.bind(2, m.id);
        up.exec();
      }
      tx.Commit();
      return out;
    });
  }

  absl::Status FinishWebhook(int64_t id, std::optional<absl::Duration> retry_in, const std::string& error) override {
    absl::MutexLock lock(&mu_);
    return Guard("finish a webhook", [&]() -> absl::Status {
      WriteTransaction tx(*db_);
      std::unique_ptr<SQLite::Statement> q;
      if (retry_in.has_value()) {
        q = std::make_unique<SQLite::Statement>(*db_,
                                                "UPDATE webhook_outbox SET attempts = attempts + 1, next_attempt = ?, "
                                                "held_until = 0, last_error = ? WHERE id = ?");
        q->bind(1, NowMicros() + absl::ToInt64Microseconds(*retry_in));
        q->bind(2, error);
        q->bind(3, id);
      } else {
        q = std::make_unique<SQLite::Statement>(*db_, "DELETE FROM webhook_outbox WHERE id = ?");
        q->bind(1, id);
      }
      if (q->exec() == 0) return absl::NotFoundError(absl::StrCat("webhook message ", id, " not found"));
      tx.Commit();
      return absl::OkStatus();
    });
  }

  absl::Status ReleaseWebhook(int64_t id, absl::Duration due_in) override {
    absl::MutexLock lock(&mu_);
    return Guard("release a webhook", [&]() -> absl::Status {
      WriteTransaction tx(*db_);
      SQLite::Statement q(*db_, "UPDATE webhook_outbox SET next_attempt = ?, held_until = 0 WHERE id = ?");
      q.bind(1, NowMicros() + absl::ToInt64Microseconds(due_in));
      q.bind(2, id);
      if (q.exec() == 0) return absl::NotFoundError(absl::StrCat("webhook message ", id, " not found"));
      tx.Commit();
      return absl::OkStatus();
    });
  }

  absl::StatusOr<int64_t> PendingWebhooks() override {
    absl::MutexLock lock(&mu_);
    return Guard("count webhooks", [&]() -> absl::StatusOr<int64_t> {
      SQLite::Statement q(*db_, "SELECT COUNT(*) FROM webhook_outbox");
      q.executeStep();
      return q.getColumn(0).getInt64();
    });
  }

 private:
  // A job's row, as read inside a write transaction.
  struct Row {
    std::string id;
    v1::Job job;
    int64_t last_sequence = 0;
    std::string owner;      // empty: none
    int64_t queued_at = 0;  // 0: never queued (or before the column existed)
  };

  absl::StatusOr<Row> ReadRowLocked(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    SQLite::Statement q(*db_, "SELECT job, last_sequence, owner, queued_at FROM jobs WHERE id = ?");
    q.bind(1, job_id);
    if (!q.executeStep()) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
    Row row;
    row.id = job_id;
    OOMB_ASSIGN_OR_RETURN(row.job, Parse<v1::Job>(q.getColumn(0)));
    row.last_sequence = q.getColumn(1).getInt64();
    row.owner = q.getColumn(2).isNull() ? "" : q.getColumn(2).getString();
    row.queued_at = q.getColumn(3).isNull() ? 0 : q.getColumn(3).getInt64();
    return row;
  }

  // Applies `mutate` to `row` and writes the result inside the caller's transaction: the job
  // keeps `owner` while it stays leased and loses it (and the lease) when it leaves the leased
  // states; entering QUEUED starts its queue wait.
  absl::StatusOr<UpdateResult> ApplyLocked(const Row& row, const JobMutation& mutate, const std::string& owner)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    UpdateResult result;
    const v1::Job::State before = row.job.state();
    OOMB_ASSIGN_OR_RETURN(const bool leased, store_internal::MutateRecordingLease(row.job, mutate, owner, &result));
    SQLite::Statement up(*db_,
                         "UPDATE jobs SET state = ?, job = ?, last_sequence = ?, owner = ?, "
                         "lease_expires = CASE WHEN ? THEN lease_expires ELSE NULL END, queued_at = ?, priority = ? "
                         "WHERE id = ?");
    up.bind(1, static_cast<int>(result.job.state()));
    const std::string blob = Blob(result.job);
    up.bind(2, blob.data(), static_cast<int>(blob.size()));
    up.bind(3, row.last_sequence + static_cast<int64_t>(result.events.size()));
    if (leased) {
      up.bind(4, owner);
    } else {
      up.bind(4);
    }
    up.bind(5, leased && owner == row.owner ? 1 : 0);
    const bool enters_queue = store_internal::EntersQueue(before, result.job.state());
    if (enters_queue || row.queued_at > 0) {
      up.bind(6, enters_queue ? NowMicros() : row.queued_at);
    } else {
      up.bind(6);
    }
    up.bind(7, result.job.priority());
    up.bind(8, row.id);
    RecordDevicesLocked(row.id, before, result.job);  // before the update: it reads the lease
    up.exec();
    AppendEventsLocked(row.id, result.job, row.last_sequence, &result.events);
    return result;
  }

  absl::StatusOr<int64_t> DatasetBytesLocked(const std::string& project) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    SQLite::Statement q(*db_, "SELECT COALESCE(SUM(bytes), 0) FROM datasets WHERE project = ?");
    q.bind(1, project);
    q.executeStep();
    return q.getColumn(0).getInt64();
  }

  // Device accounting (job_store.h): an interval opens when the job enters a leased state and
  // closes when it leaves them, at the end of its lease if that came first (a daemon that died:
  // its last heartbeat's lease, not the restart or reap that noticed).
  void RecordDevicesLocked(const std::string& job_id, v1::Job::State before, const v1::Job& after)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const bool was = IsLeased(before), is = IsLeased(after.state());
    if (was == is) return;
    const int64_t now = NowMicros();
    if (is) {
      SQLite::Statement ins(*db_, "INSERT INTO device_usage (job_id, project, devices, started) VALUES (?, ?, ?, ?)");
      ins.bind(1, job_id);
      ins.bind(2, store_internal::ProjectOf(after));
      ins.bind(3, store_internal::DevicesOf(after));
      ins.bind(4, now);
      ins.exec();
      SQLite::Statement prune(*db_, "DELETE FROM device_usage WHERE ended < ?");
      prune.bind(1, now - store_internal::kUsageKeepMicros);
      prune.exec();
    } else {
      SQLite::Statement close(*db_,
                              "UPDATE device_usage SET ended = MAX(started, MIN(?1, COALESCE((SELECT lease_expires "
                              "FROM jobs WHERE id = ?2), ?1))) WHERE job_id = ?2 AND ended IS NULL");
      close.bind(1, now);
      close.bind(2, job_id);
      close.exec();
    }
  }

  absl::StatusOr<std::map<std::string, ProjectUsage>> UsageLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::map<std::string, ProjectUsage> out;
    SQLite::Statement held(*db_,
                           "SELECT project, state, COUNT(*), SUM(gpus) FROM jobs WHERE state IN (?, ?, ?, ?, ?, ?) "
                           "GROUP BY project, state");
    int param = 1;
    for (v1::Job::State st : {v1::Job::RUNNING, v1::Job::PAUSING, v1::Job::CANCELLING, v1::Job::VALIDATING,
                              v1::Job::QUEUED, v1::Job::PAUSED}) {
      held.bind(param++, static_cast<int>(st));
    }
    while (held.executeStep()) {
      ProjectUsage& u = out[held.getColumn(0).getString()];
      const auto state = static_cast<v1::Job::State>(held.getColumn(1).getInt());
      const int64_t jobs = held.getColumn(2).getInt64();
      if (IsLeased(state)) {
        u.running_devices += held.getColumn(3).getInt64();
      } else {
        u.waiting_jobs += jobs;
        if (state == v1::Job::QUEUED) u.queued_jobs += jobs;
      }
    }
    const int64_t now = NowMicros();
    SQLite::Statement used(*db_,
                           "SELECT project, SUM(devices * (MIN(COALESCE(ended, ?1), ?1) - MAX(started, ?2))) "
                           "FROM device_usage WHERE COALESCE(ended, ?1) > ?2 GROUP BY project");
    used.bind(1, now);
    used.bind(2, now - store_internal::kUsageWindowMicros);
    while (used.executeStep()) {
      out[used.getColumn(0).getString()].device_seconds_per_day = used.getColumn(1).getDouble() / 1e6;
    }
    return out;
  }

  // Runs `fn`, turning SQLite exceptions into INTERNAL statuses that name the operation.
  template <typename Fn>
  auto Guard(const char* what, Fn&& fn) -> decltype(fn()) {
    try {
      return fn();
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("job store: ", what, ": ", e.what()));
    }
  }

  absl::StatusOr<v1::Job> GetLocked(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    SQLite::Statement q(*db_, "SELECT job, last_sequence FROM jobs WHERE id = ?");
    q.bind(1, job_id);
    if (!q.executeStep()) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
    OOMB_ASSIGN_OR_RETURN(v1::Job job, Parse<v1::Job>(q.getColumn(0)));
    job.set_last_sequence(q.getColumn(1).getInt64());
    return job;
  }

  void SetLastSequenceLocked(const std::string& job_id, int64_t last) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    SQLite::Statement up(*db_, "UPDATE jobs SET last_sequence = ? WHERE id = ?");
    up.bind(1, last);
    up.bind(2, job_id);
    up.exec();
  }

  // Numbers the events after `last_sequence`, stamps them and inserts them (and checkpoint
  // records for CHECKPOINT_SAVED events).
  void AppendEventsLocked(const std::string& job_id, const v1::Job& job, int64_t last_sequence,
                          std::vector<v1::JobEvent>* events) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    store_internal::StampEvents(job.name(), last_sequence, events);
    const int64_t now = NowMicros();
    for (const OutboxMessage& m : OutboxFor(job, *events)) {
      SQLite::Statement ins(*db_,
                            "INSERT INTO webhook_outbox (webhook_id, job_id, url, secret_file, secret_project, type, "
                            "payload, created, next_attempt) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)");
      int i = 1;
      for (const std::string* v :
           {&m.webhook_id, &m.job_id, &m.url, &m.secret_file, &m.secret_project, &m.type, &m.payload}) {
        ins.bind(i++, *v);
      }
      ins.bind(i++, now);
      ins.bind(i, now);
      ins.exec();
    }
    for (v1::JobEvent& e : *events) {
      SQLite::Statement ins(*db_, "INSERT INTO job_events (job_id, sequence, event) VALUES (?, ?, ?)");
      ins.bind(1, job_id);
      ins.bind(2, e.sequence());
      const std::string blob = Blob(e);
      ins.bind(3, blob.data(), static_cast<int>(blob.size()));
      ins.exec();
      if (e.type() == v1::JobEvent::CHECKPOINT_SAVED) {
        const v1::Checkpoint& c = e.checkpoint();
        SQLite::Statement ck(*db_, "INSERT INTO checkpoints (job_id, sequence, step, checkpoint) VALUES (?, ?, ?, ?)");
        ck.bind(1, job_id);
        ck.bind(2, e.sequence());
        ck.bind(3, c.step());
        const std::string cblob = Blob(c);
        ck.bind(4, cblob.data(), static_cast<int>(cblob.size()));
        ck.exec();
      }
    }
  }

  absl::Mutex mu_;
  std::unique_ptr<SQLite::Database> db_ ABSL_GUARDED_BY(mu_);
};

// Adds the queue columns to a file made before them (filling priority, device, gpus and project
// from the stored jobs) and the queue's index.
void MigrateQueueColumns(SQLite::Database& db) {
  std::vector<std::string> have;
  {
    SQLite::Statement q(db, "PRAGMA table_info(jobs)");
    while (q.executeStep()) have.push_back(q.getColumn(1).getString());
  }
  bool added = false;
  for (const AddedColumn& c : kQueueColumns) {
    if (std::find(have.begin(), have.end(), c.name) != have.end()) continue;
    db.exec(absl::StrCat("ALTER TABLE jobs ADD COLUMN ", c.name, " ", c.definition));
    added = true;
  }
  if (added) {
    std::vector<std::pair<std::string, v1::Job>> jobs;
    SQLite::Statement q(db, "SELECT id, job FROM jobs");
    while (q.executeStep()) {
      absl::StatusOr<v1::Job> j = Parse<v1::Job>(q.getColumn(1));
      if (j.ok()) jobs.emplace_back(q.getColumn(0).getString(), *std::move(j));
    }
    for (const auto& [id, job] : jobs) {
      SQLite::Statement up(db, "UPDATE jobs SET priority = ?, device = ?, gpus = ?, project = ? WHERE id = ?");
      up.bind(1, job.priority());
      up.bind(2, job.spec().resources().device());
      up.bind(3, store_internal::DevicesOf(job));
      up.bind(4, store_internal::ProjectOf(job));
      up.bind(5, id);
      up.exec();
    }
  }
  db.exec("CREATE INDEX IF NOT EXISTS jobs_queue ON jobs(state, priority DESC, position)");
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> OpenSqliteJobStore(const std::string& path) {
  try {
    auto db = std::make_unique<SQLite::Database>(path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    db->setBusyTimeout(5000);
    db->exec("PRAGMA journal_mode=WAL");
    db->exec("PRAGMA synchronous=FULL");
    db->exec("PRAGMA foreign_keys=ON");
    {
      WriteTransaction tx(*db);
      db->exec(kSchema);
      MigrateQueueColumns(*db);
      tx.Commit();
    }
    return std::unique_ptr<JobStore>(new SqliteJobStore(std::move(db)));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("cannot open the job store ", path, ": ", e.what()));
  }
}

}  // namespace oomb::server
