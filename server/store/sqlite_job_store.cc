// The SQLite JobStore. One connection, serialised by a mutex: the daemon is the only writer
// and every write is a short transaction. WAL lets outside readers (sqlite3, backups) read
// while the daemon writes.
#include <SQLiteCpp/SQLiteCpp.h>

#include <chrono>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/util/time_util.h"
#include "server/store/job_store.h"
#include "worker/common/status.h"

namespace oomb::server {

std::string JobName(const std::string& job_id) { return "jobs/" + job_id; }

namespace {

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
)sql";

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
      SQLite::Statement ins(*db_, "INSERT INTO jobs (id, state, job) VALUES (?, ?, ?)");
      ins.bind(1, id);
      ins.bind(2, static_cast<int>(job.state()));
      const std::string blob = Blob(job);
      ins.bind(3, blob.data(), static_cast<int>(blob.size()));
      ins.exec();
      if (!request_id.empty()) {
        SQLite::Statement k(*db_, "INSERT INTO idempotency_keys (request_id, job_id) VALUES (?, ?)");
        k.bind(1, request_id);
        k.bind(2, id);
        k.exec();
      }
      AppendEventsLocked(id, 0, &events);
      SetLastSequenceLocked(id, static_cast<int64_t>(events.size()));
      tx.Commit();
      return CreateResult{job, true};
    });
  }

  absl::StatusOr<v1::Job> Get(const std::string& job_id) override {
    absl::MutexLock lock(&mu_);
    return Guard("get job", [&]() { return GetLocked(job_id); });
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
        bool match = true;
        for (const auto& [k, v] : query.labels) {
          auto it = job.labels().find(k);
          if (it == job.labels().end() || it->second != v) match = false;
        }
        if (!match) continue;
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

  absl::StatusOr<UpdateResult> Update(const std::string& job_id, const JobMutation& mutate) override {
    absl::MutexLock lock(&mu_);
    return Guard("update job", [&]() -> absl::StatusOr<UpdateResult> {
      WriteTransaction tx(*db_);
      SQLite::Statement q(*db_, "SELECT job, last_sequence FROM jobs WHERE id = ?");
      q.bind(1, job_id);
      if (!q.executeStep()) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
      OOMB_ASSIGN_OR_RETURN(v1::Job job, Parse<v1::Job>(q.getColumn(0)));
      const int64_t last_sequence = q.getColumn(1).getInt64();
      q.reset();
      UpdateResult result;
      const absl::Status s = mutate(&job, &result.events);
      if (!s.ok()) return s;
      SQLite::Statement up(*db_, "UPDATE jobs SET state = ?, job = ?, last_sequence = ? WHERE id = ?");
      up.bind(1, static_cast<int>(job.state()));
      const std::string blob = Blob(job);
      up.bind(2, blob.data(), static_cast<int>(blob.size()));
      up.bind(3, last_sequence + static_cast<int64_t>(result.events.size()));
      up.bind(4, job_id);
      up.exec();
      AppendEventsLocked(job_id, last_sequence, &result.events);
      tx.Commit();
      result.job = std::move(job);
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

 private:
  // Runs `fn`, turning SQLite exceptions into INTERNAL statuses that name the operation.
  template <typename Fn>
  auto Guard(const char* what, Fn&& fn) -> decltype(fn()) {
    try {
      return fn();
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("job store: ", what, ": ", e.what()));
    }
  }

  static std::string IdOf(const v1::Job& job) {
    const std::string& name = job.name();
    return name.rfind("jobs/", 0) == 0 ? name.substr(5) : name;
  }

  absl::StatusOr<v1::Job> GetLocked(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    SQLite::Statement q(*db_, "SELECT job FROM jobs WHERE id = ?");
    q.bind(1, job_id);
    if (!q.executeStep()) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
    return Parse<v1::Job>(q.getColumn(0));
  }

  void SetLastSequenceLocked(const std::string& job_id, int64_t last) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    SQLite::Statement up(*db_, "UPDATE jobs SET last_sequence = ? WHERE id = ?");
    up.bind(1, last);
    up.bind(2, job_id);
    up.exec();
  }

  // Numbers the events after `last_sequence`, stamps them and inserts them (and checkpoint
  // records for CHECKPOINT_SAVED events).
  void AppendEventsLocked(const std::string& job_id, int64_t last_sequence, std::vector<v1::JobEvent>* events)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const auto now = google::protobuf::util::TimeUtil::GetCurrentTime();
    for (v1::JobEvent& e : *events) {
      e.set_job(JobName(job_id));
      e.set_sequence(++last_sequence);
      if (!e.has_time()) *e.mutable_time() = now;
      // Stamped before the event is stored, so a replay from the store equals the live event.
      if (e.type() == v1::JobEvent::CHECKPOINT_SAVED && !e.checkpoint().has_create_time()) {
        *e.mutable_checkpoint()->mutable_create_time() = e.time();
      }
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

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> OpenSqliteJobStore(const std::string& path) {
  try {
    auto db = std::make_unique<SQLite::Database>(path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    db->setBusyTimeout(5000);
    db->exec("PRAGMA journal_mode=WAL");
    db->exec("PRAGMA synchronous=FULL");
    db->exec("PRAGMA foreign_keys=ON");
    db->exec(kSchema);
    return std::unique_ptr<JobStore>(new SqliteJobStore(std::move(db)));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("cannot open the job store ", path, ": ", e.what()));
  }
}

}  // namespace oomb::server
