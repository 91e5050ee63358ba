// The PostgreSQL JobStore (fleet mode): several daemons share one queue.
//
// One connection for queries, serialised by a mutex (every operation is a short transaction at
// READ COMMITTED; row locks order concurrent writers of one job, SKIP LOCKED keeps claims and
// reaps of different daemons apart), and one connection that LISTENs on the "oomb_jobs"
// channel. Every write transaction NOTIFYs "<instance> <state> <job_id>" (delivered at commit);
// WaitForChanges() drops this object's own notices, which the scheduler has already acted on.
#include <pqxx/pqxx>

#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>
#include <random>
#include <thread>
#include <utility>

#include <spdlog/spdlog.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "server/store/job_store.h"
#include "server/store/store_internal.h"
#include "worker/common/status.h"

namespace oomb::server {
namespace {

using store_internal::IdOf;
using store_internal::IsLeased;

constexpr const char* kChannel = "oomb_jobs";
// pg_advisory_xact_lock key serialising schema creation between daemons starting at once.
constexpr int64_t kSchemaLock = 0x6f6f6d62;  // "oomb"
// pg_advisory_xact_lock key serialising claims that respect project quotas (ClaimRequest).
constexpr int64_t kQuotaLock = 0x6f6f6d6271;  // "oombq"
// pg_advisory_xact_lock (int, int) class serialising a project's dataset records (storage quota).
constexpr int32_t kDatasetLock = 0x6f6f6d64;  // "oomd"
// 2: jobs.project and device_usage (project quotas), datasets.
constexpr int kSchemaVersion = 2;

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS oomb_schema (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
  position BIGSERIAL PRIMARY KEY,
  id TEXT NOT NULL UNIQUE,
  state INTEGER NOT NULL,
  priority INTEGER NOT NULL DEFAULT 0,
  device TEXT NOT NULL DEFAULT '',
  gpus INTEGER NOT NULL DEFAULT 1,
  last_sequence BIGINT NOT NULL DEFAULT 0,
  owner TEXT,
  lease_expires TIMESTAMPTZ,
  queued_at TIMESTAMPTZ,
  job BYTEA NOT NULL
);
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS project TEXT NOT NULL DEFAULT '';
CREATE INDEX IF NOT EXISTS jobs_queue ON jobs (state, priority DESC, position);
CREATE INDEX IF NOT EXISTS jobs_owner ON jobs (owner) WHERE owner IS NOT NULL;
CREATE TABLE IF NOT EXISTS job_events (
  job_id TEXT NOT NULL,
  sequence BIGINT NOT NULL,
  event BYTEA NOT NULL,
  PRIMARY KEY (job_id, sequence)
);
CREATE TABLE IF NOT EXISTS checkpoints (
  job_id TEXT NOT NULL,
  sequence BIGINT NOT NULL,
  step BIGINT NOT NULL,
  checkpoint BYTEA NOT NULL,
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
  started TIMESTAMPTZ NOT NULL,
  ended TIMESTAMPTZ
);
CREATE INDEX IF NOT EXISTS device_usage_open ON device_usage (job_id) WHERE ended IS NULL;
CREATE INDEX IF NOT EXISTS device_usage_ended ON device_usage (ended);
CREATE TABLE IF NOT EXISTS datasets (
  position BIGSERIAL PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  project TEXT NOT NULL,
  bytes BIGINT NOT NULL,
  dataset BYTEA NOT NULL
);
CREATE TABLE IF NOT EXISTS webhook_outbox (
  id BIGSERIAL PRIMARY KEY,
  webhook_id TEXT NOT NULL,
  job_id TEXT NOT NULL,
  url TEXT NOT NULL,
  secret_file TEXT NOT NULL,
  secret_project TEXT NOT NULL,
  type TEXT NOT NULL,
  payload TEXT NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0,
  created TIMESTAMPTZ NOT NULL DEFAULT now(),
  next_attempt TIMESTAMPTZ NOT NULL DEFAULT now(),
  held_until TIMESTAMPTZ NOT NULL DEFAULT '-infinity',
  last_error TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS webhook_outbox_due ON webhook_outbox (next_attempt);
)sql";

// lease_expires in ApplyLocked: keep it, clear it, or start a new lease of this many µs.
constexpr int64_t kKeepLease = -1;
constexpr int64_t kNoLease = -2;

pqxx::binarystring Bytes(const google::protobuf::Message& m) { return pqxx::binarystring(m.SerializeAsString()); }

template <typename T>
absl::StatusOr<T> Parse(const pqxx::field& f) {
  const pqxx::binarystring b(f);
  T m;
  if (!m.ParseFromArray(b.data(), static_cast<int>(b.size()))) {
    return absl::DataLossError("corrupt record in the job store");
  }
  store_internal::UpgradeStored(&m);
  return m;
}

std::string RandomInstanceId() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::random_device rd;
  std::string id;
  for (int i = 0; i < 16; ++i) id += kHex[rd() % 16];
  return id;
}

// "$2,$3,$4" for `n` parameters from `first`.
std::string Placeholders(int first, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) absl::StrAppend(&out, i ? "," : "", "$", first + static_cast<int>(i));
  return out;
}

std::string StateList() {
  std::string out;
  for (v1::Job::State s : store_internal::ReapableStates()) {
    absl::StrAppend(&out, out.empty() ? "" : ",", static_cast<int>(s));
  }
  return out;
}

// The password of a libpq URI ("postgresql://user:PASSWORD@host/db") or key-value string
// ("... password=PASSWORD ..."); empty when it has none.
std::string PasswordOf(const std::string& url) {
  const size_t scheme = url.find("://");
  if (scheme != std::string::npos) {
    const size_t start = scheme + 3;
    const size_t at = url.find('@', start);
    const size_t colon = url.find(':', start);
    if (at != std::string::npos && colon != std::string::npos && colon < at)
      return url.substr(colon + 1, at - colon - 1);
    return "";
  }
  const size_t key = url.find("password=");
  if (key == std::string::npos) return "";
  const size_t start = key + 9;
  return url.substr(start, url.find(' ', start) - start);
}

// `message` (libpq's, which may quote the connection string) without the URL's password.
std::string Scrub(std::string message, const std::string& url) {
  const std::string password = PasswordOf(url);
  if (password.empty()) return message;
  for (size_t at = message.find(password); at != std::string::npos; at = message.find(password, at)) {
    message.replace(at, password.size(), "<redacted>");
    at += 10;
  }
  return message;
}

bool ShouldReap(const ReapRequest& r, const std::string& owner, bool expired) {
  if (r.all) return true;
  if (std::find(r.dead_owners.begin(), r.dead_owners.end(), owner) != r.dead_owners.end()) return true;
  const bool kept = !r.keep_owner.empty() && owner == r.keep_owner;
  return !kept && expired;
}

// Collects the notices of other store objects.
class Receiver final : public pqxx::notification_receiver {
 public:
  Receiver(pqxx::connection_base& c, std::string self)
      : pqxx::notification_receiver(c, kChannel), self_(std::move(self)) {}
  void operator()(const std::string& payload, int) override {
    std::vector<std::string> parts = absl::StrSplit(payload, absl::MaxSplits(' ', 2));
    int state = 0;
    if (parts.size() != 3 || parts[0] == self_ || !absl::SimpleAtoi(parts[1], &state)) return;
    changes.push_back(JobChange{parts[2], static_cast<v1::Job::State>(state)});
  }
  std::vector<JobChange> changes;

 private:
  const std::string self_;
};

class PostgresJobStore : public JobStore {
 public:
  PostgresJobStore(std::string url, std::unique_ptr<pqxx::connection> conn)
      : url_(std::move(url)), instance_(RandomInstanceId()), conn_(std::move(conn)) {
    absl::MutexLock lock(&listen_mu_);
    (void)ConnectListenerLocked();  // a failure is retried by WaitForChanges()
  }

  ~PostgresJobStore() override {
    absl::MutexLock lock(&listen_mu_);
    receiver_.reset();  // before its connection
    listen_conn_.reset();
  }

  absl::StatusOr<CreateResult> Create(const v1::Job& job, const std::string& request_id,
                                      std::vector<v1::JobEvent> events) override {
    const std::string id = IdOf(job);
    // A unique violation means a concurrent create (another daemon) took the id or request id
    // first and committed: run again, and the reads see it.
    for (int attempt = 0;; ++attempt) {
      absl::StatusOr<CreateResult> r = Run("create job", [&](pqxx::work& tx) -> absl::StatusOr<CreateResult> {
        if (!request_id.empty()) {
          const pqxx::result k =
              tx.exec_params("SELECT job_id FROM idempotency_keys WHERE request_id = $1", request_id);
          if (!k.empty()) {
            OOMB_ASSIGN_OR_RETURN(v1::Job existing, GetIn(tx, k[0][0].as<std::string>()));
            return CreateResult{existing, false};
          }
        }
        if (!tx.exec_params("SELECT 1 FROM jobs WHERE id = $1", id).empty()) {
          return absl::AlreadyExistsError(absl::StrCat("job ", id, " already exists"));
        }
        v1::Job stored = job;
        stored.clear_daemon();  // only Claim() leases
        std::vector<v1::JobEvent> evs = events;
        tx.exec_params(
            "INSERT INTO jobs (id, state, priority, device, gpus, last_sequence, queued_at, job, project) "
            "VALUES ($1, $2::integer, $3::integer, $4, $5::integer, $6::bigint, "
            "CASE WHEN $2::integer = $7::integer THEN now() END, $8, $9)",
            id, static_cast<int>(stored.state()), stored.priority(), stored.spec().resources().device(),
            store_internal::DevicesOf(stored), static_cast<int64_t>(evs.size()), static_cast<int>(v1::Job::QUEUED),
            Bytes(stored), store_internal::ProjectOf(stored));
        if (!request_id.empty()) {
          tx.exec_params("INSERT INTO idempotency_keys (request_id, job_id) VALUES ($1, $2)", request_id, id);
        }
        AppendEvents(tx, id, stored, 0, &evs);
        Notify(tx, id, stored.state());
        tx.commit();
        return CreateResult{stored, true};
      });
      if (r.ok() || r.status().code() != absl::StatusCode::kAborted || attempt >= 3) return r;
    }
  }

  absl::StatusOr<v1::Job> Get(const std::string& job_id) override {
    return Run("get job", [&](pqxx::work& tx) { return GetIn(tx, job_id); });
  }

  absl::StatusOr<std::optional<std::string>> JobOfRequest(const std::string& request_id) override {
    return Run("find request", [&](pqxx::work& tx) -> absl::StatusOr<std::optional<std::string>> {
      const pqxx::result k = tx.exec_params("SELECT job_id FROM idempotency_keys WHERE request_id = $1", request_id);
      if (k.empty()) return std::nullopt;
      return k[0][0].as<std::string>();
    });
  }

  absl::StatusOr<ListResult> List(const ListQuery& query) override {
    return Run("list jobs", [&](pqxx::work& tx) -> absl::StatusOr<ListResult> {
      std::vector<int> states;
      for (v1::Job::State s : query.states) states.push_back(static_cast<int>(s));
      std::string sql = "SELECT position, job FROM jobs WHERE position < $1";
      if (!states.empty()) absl::StrAppend(&sql, " AND state IN (", Placeholders(3, states.size()), ")");
      sql += " ORDER BY position DESC LIMIT $2";
      // Labels are matched here, on the decoded jobs: read batches until the page and one more
      // match are found (one batch without a label filter).
      const int64_t batch = query.labels.empty() ? query.page_size + 1 : std::max(64, 4 * (query.page_size + 1));
      int64_t before = query.before_position > 0 ? query.before_position : std::numeric_limits<int64_t>::max();
      ListResult out;
      int64_t last_position = 0;
      for (;;) {
        const pqxx::result rows = tx.exec_params(sql, before, batch, pqxx::prepare::make_dynamic_params(states));
        for (const pqxx::row& row : rows) {
          before = row[0].as<int64_t>();
          OOMB_ASSIGN_OR_RETURN(v1::Job job, Parse<v1::Job>(row[1]));
          if (!store_internal::Matches(job, query)) continue;
          if (static_cast<int>(out.jobs.size()) == query.page_size) {
            out.next_position = last_position;  // one more match exists
            return out;
          }
          out.jobs.push_back(std::move(job));
          last_position = before;
        }
        if (static_cast<int64_t>(rows.size()) < batch) return out;
      }
    });
  }

  absl::StatusOr<std::vector<v1::Job>> ListByState(const std::vector<v1::Job::State>& states) override {
    return Run("list jobs by state", [&](pqxx::work& tx) -> absl::StatusOr<std::vector<v1::Job>> {
      std::vector<v1::Job> out;
      if (states.empty()) return out;
      std::vector<int> s;
      for (v1::Job::State st : states) s.push_back(static_cast<int>(st));
      const pqxx::result rows = tx.exec_params(
          absl::StrCat("SELECT job FROM jobs WHERE state IN (", Placeholders(1, s.size()), ") ORDER BY position ASC"),
          pqxx::prepare::make_dynamic_params(s));
      for (const pqxx::row& row : rows) {
        OOMB_ASSIGN_OR_RETURN(v1::Job job, Parse<v1::Job>(row[0]));
        out.push_back(std::move(job));
      }
      return out;
    });
  }

  absl::StatusOr<std::map<v1::Job::State, int64_t>> CountByState() override {
    return Run("count jobs by state", [&](pqxx::work& tx) -> absl::StatusOr<std::map<v1::Job::State, int64_t>> {
      std::map<v1::Job::State, int64_t> out;
      for (const pqxx::row& row : tx.exec("SELECT state, COUNT(*) FROM jobs GROUP BY state")) {
        out[static_cast<v1::Job::State>(row[0].as<int>())] = row[1].as<int64_t>();
      }
      return out;
    });
  }

  absl::StatusOr<std::map<std::string, ProjectUsage>> Usage() override {
    return Run("usage by project", [&](pqxx::work& tx) { return UsageIn(tx); });
  }

  absl::StatusOr<v1::Dataset> CreateDataset(const v1::Dataset& dataset, int64_t max_project_bytes,
                                            bool* created) override {
    *created = false;
    return Run("record a dataset", [&](pqxx::work& tx) -> absl::StatusOr<v1::Dataset> {
      const std::string project = store_internal::DatasetProject(dataset);
      // Serialises the project's uploads, so two cannot both pass its storage quota.
      tx.exec_params("SELECT pg_advisory_xact_lock($1::integer, hashtext($2))", kDatasetLock, project);
      const pqxx::result existing = tx.exec_params("SELECT dataset FROM datasets WHERE name = $1", dataset.name());
      if (!existing.empty()) {
        OOMB_ASSIGN_OR_RETURN(v1::Dataset d, Parse<v1::Dataset>(existing[0][0]));
        return store_internal::SameDatasetOrTaken(d, dataset);
      }
      const int64_t used =
          tx.exec_params("SELECT COALESCE(SUM(bytes), 0) FROM datasets WHERE project = $1", project)[0][0]
              .as<int64_t>();
      OOMB_RETURN_IF_ERROR(store_internal::CheckStorage(project, used, dataset.size_bytes(), max_project_bytes));
      tx.exec_params("INSERT INTO datasets (name, project, bytes, dataset) VALUES ($1, $2, $3, $4)", dataset.name(),
                     project, dataset.size_bytes(), Bytes(dataset));
      tx.commit();
      *created = true;
      return dataset;
    });
  }

  absl::StatusOr<v1::Dataset> GetDataset(const std::string& name) override {
    return Run("get a dataset", [&](pqxx::work& tx) -> absl::StatusOr<v1::Dataset> {
      const pqxx::result r = tx.exec_params("SELECT dataset FROM datasets WHERE name = $1", name);
      if (r.empty()) return absl::NotFoundError(absl::StrCat("no dataset ", name));
      return Parse<v1::Dataset>(r[0][0]);
    });
  }

  absl::StatusOr<DatasetPage> ListDatasets(const std::vector<std::string>& projects, int page_size,
                                           int64_t before_position) override {
    return Run("list datasets", [&](pqxx::work& tx) -> absl::StatusOr<DatasetPage> {
      std::string sql = "SELECT position, dataset FROM datasets WHERE position < $1";
      if (!projects.empty()) absl::StrAppend(&sql, " AND project IN (", Placeholders(3, projects.size()), ")");
      sql += " ORDER BY position DESC LIMIT $2";
      const int64_t before = before_position > 0 ? before_position : std::numeric_limits<int64_t>::max();
      const pqxx::result rows =
          tx.exec_params(sql, before, page_size + 1, pqxx::prepare::make_dynamic_params(projects));
      DatasetPage out;
      int64_t last = 0;
      for (const pqxx::row& row : rows) {
        if (static_cast<int>(out.datasets.size()) == page_size) {
          out.next_position = last;
          break;
        }
        last = row[0].as<int64_t>();
        OOMB_ASSIGN_OR_RETURN(v1::Dataset d, Parse<v1::Dataset>(row[1]));
        out.datasets.push_back(std::move(d));
      }
      return out;
    });
  }

  absl::Status DeleteDataset(const std::string& name) override {
    return Run("delete a dataset",
               [&](pqxx::work& tx) -> absl::StatusOr<bool> {
                 const pqxx::result r = tx.exec_params("DELETE FROM datasets WHERE name = $1 RETURNING 1", name);
                 if (r.empty()) return absl::NotFoundError(absl::StrCat("no dataset ", name));
                 tx.commit();
                 return true;
               })
        .status();
  }

  absl::StatusOr<int64_t> DatasetBytes(const std::string& project) override {
    return Run("dataset bytes", [&](pqxx::work& tx) -> absl::StatusOr<int64_t> {
      return tx.exec_params("SELECT COALESCE(SUM(bytes), 0) FROM datasets WHERE project = $1", project)[0][0]
          .as<int64_t>();
    });
  }

  absl::StatusOr<UpdateResult> Update(const std::string& job_id, const JobMutation& mutate) override {
    return Run("update job", [&](pqxx::work& tx) -> absl::StatusOr<UpdateResult> {
      OOMB_ASSIGN_OR_RETURN(std::optional<Row> row, LockRow(tx, job_id, /*skip_locked=*/false));
      if (!row) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
      OOMB_ASSIGN_OR_RETURN(UpdateResult r, Apply(tx, *row, mutate, row->owner, kKeepLease));
      tx.commit();
      return r;
    });
  }

  absl::Status Delete(const std::string& job_id,
                      const std::function<absl::Status(const v1::Job&)>& precondition) override {
    return Run("delete job",
               [&](pqxx::work& tx) -> absl::StatusOr<bool> {
                 OOMB_ASSIGN_OR_RETURN(std::optional<Row> row, LockRow(tx, job_id, /*skip_locked=*/false));
                 if (!row) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
                 OOMB_RETURN_IF_ERROR(precondition(row->job));
                 for (const char* sql :
                      {"DELETE FROM jobs WHERE id = $1", "DELETE FROM job_events WHERE job_id = $1",
                       "DELETE FROM checkpoints WHERE job_id = $1", "DELETE FROM idempotency_keys WHERE job_id = $1"}) {
                   tx.exec_params(sql, job_id);
                 }
                 Notify(tx, job_id, v1::Job::STATE_UNSPECIFIED);
                 tx.commit();
                 return true;
               })
        .status();
  }

  absl::StatusOr<std::vector<v1::JobEvent>> ListEvents(const std::string& job_id, int64_t after_sequence,
                                                       int limit) override {
    return Run("list events", [&](pqxx::work& tx) -> absl::StatusOr<std::vector<v1::JobEvent>> {
      if (tx.exec_params("SELECT 1 FROM jobs WHERE id = $1", job_id).empty()) {
        return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
      }
      std::vector<v1::JobEvent> out;
      for (const pqxx::row& row :
           tx.exec_params("SELECT event FROM job_events WHERE job_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3",
                          job_id, after_sequence, limit)) {
        OOMB_ASSIGN_OR_RETURN(v1::JobEvent e, Parse<v1::JobEvent>(row[0]));
        out.push_back(std::move(e));
      }
      return out;
    });
  }

  absl::StatusOr<std::vector<v1::Checkpoint>> ListCheckpoints(const std::string& job_id) override {
    return Run("list checkpoints", [&](pqxx::work& tx) -> absl::StatusOr<std::vector<v1::Checkpoint>> {
      if (tx.exec_params("SELECT 1 FROM jobs WHERE id = $1", job_id).empty()) {
        return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
      }
      std::vector<v1::Checkpoint> out;
      for (const pqxx::row& row :
           tx.exec_params("SELECT checkpoint FROM checkpoints WHERE job_id = $1 ORDER BY step, sequence", job_id)) {
        OOMB_ASSIGN_OR_RETURN(v1::Checkpoint c, Parse<v1::Checkpoint>(row[0]));
        out.push_back(std::move(c));
      }
      return out;
    });
  }

  absl::StatusOr<int32_t> QueuePosition(const std::string& job_id) override {
    return Run("queue position", [&](pqxx::work& tx) -> absl::StatusOr<int32_t> {
      const pqxx::result r = tx.exec_params("SELECT state, priority, position FROM jobs WHERE id = $1", job_id);
      if (r.empty()) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
      if (r[0][0].as<int>() != v1::Job::QUEUED) return 0;
      const pqxx::result c = tx.exec_params(
          "SELECT COUNT(*) FROM jobs WHERE state = $1::integer AND (priority > $2::integer OR (priority = $2::integer "
          "AND position < $3::bigint))",
          static_cast<int>(v1::Job::QUEUED), r[0][1].as<int>(), r[0][2].as<int64_t>());
      return static_cast<int32_t>(c[0][0].as<int64_t>() + 1);
    });
  }

  absl::StatusOr<std::optional<ClaimResult>> Claim(const ClaimRequest& request, const JobMutation& start) override {
    if (request.owner.empty() || request.devices.empty() || request.lease <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError("claim: owner, devices and a positive lease are required");
    }
    return Run("claim a job", [&](pqxx::work& tx) -> absl::StatusOr<std::optional<ClaimResult>> {
      store_internal::ClaimLimits limits;
      if (!request.quotas.empty()) {
        // Held to the commit: the next quota claim sees this one's devices.
        tx.exec_params("SELECT pg_advisory_xact_lock($1::bigint)", kQuotaLock);
        OOMB_ASSIGN_OR_RETURN(const auto usage, UsageIn(tx));
        limits = store_internal::LimitsFor(request.quotas, usage);
      }
      std::string eligible;
      std::vector<std::string> params;
      const auto param = [&](std::string value) {
        params.push_back(std::move(value));
        return absl::StrCat("$", params.size() + 1);  // $1 is the state
      };
      for (const auto& [device, max_gpus] : request.devices) {
        absl::StrAppend(&eligible, eligible.empty() ? "" : " OR ", "(device = ", param(device),
                        " AND gpus <= ", param(std::to_string(max_gpus)), "::integer)");
      }
      std::string quota;
      for (const std::string& project : limits.excluded) absl::StrAppend(&quota, " AND project <> ", param(project));
      for (const auto& [project, room] : limits.max_devices) {
        absl::StrAppend(&quota, " AND (project <> ", param(project), " OR gpus <= ", param(std::to_string(room)),
                        "::integer)");
      }
      const pqxx::result r = tx.exec_params(
          absl::StrCat("SELECT id, job, last_sequence, COALESCE(EXTRACT(EPOCH FROM now() - queued_at), 0) "
                       "FROM jobs WHERE state = $1 AND (",
                       eligible, ")", quota, " ORDER BY priority DESC, position ASC LIMIT 1 FOR UPDATE SKIP LOCKED"),
          static_cast<int>(v1::Job::QUEUED), pqxx::prepare::make_dynamic_params(params));
      if (r.empty()) return std::optional<ClaimResult>();
      Row row;
      row.id = r[0][0].as<std::string>();
      OOMB_ASSIGN_OR_RETURN(row.job, Parse<v1::Job>(r[0][1]));
      row.last_sequence = r[0][2].as<int64_t>();
      ClaimResult out;
      out.queued = absl::Seconds(std::max(0.0, r[0][3].as<double>()));
      OOMB_ASSIGN_OR_RETURN(out.update, Apply(tx, row, start, request.owner, absl::ToInt64Microseconds(request.lease)));
      tx.commit();
      return std::optional<ClaimResult>(std::move(out));
    });
  }

  absl::StatusOr<std::vector<LeasedJob>> Heartbeat(const std::string& owner, absl::Duration lease) override {
    return Run("heartbeat", [&](pqxx::work& tx) -> absl::StatusOr<std::vector<LeasedJob>> {
      const pqxx::result r = tx.exec_params(
          "UPDATE jobs SET lease_expires = now() + $2::bigint * interval '1 microsecond' "
          "WHERE owner = $1 AND state IN ($3, $4, $5) RETURNING id, state, position",
          owner, absl::ToInt64Microseconds(lease), static_cast<int>(v1::Job::RUNNING),
          static_cast<int>(v1::Job::PAUSING), static_cast<int>(v1::Job::CANCELLING));
      tx.commit();
      std::vector<std::pair<int64_t, LeasedJob>> jobs;
      for (const pqxx::row& row : r) {
        jobs.push_back(
            {row[2].as<int64_t>(), LeasedJob{row[0].as<std::string>(), static_cast<v1::Job::State>(row[1].as<int>())}});
      }
      std::sort(jobs.begin(), jobs.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      std::vector<LeasedJob> out;
      for (auto& [position, job] : jobs) out.push_back(std::move(job));
      return out;
    });
  }

  absl::StatusOr<std::vector<UpdateResult>> Reap(const ReapRequest& request, const JobMutation& recover) override {
    const std::string states = StateList();
    const std::string expired = "(lease_expires IS NULL OR lease_expires < now())";
    OOMB_ASSIGN_OR_RETURN(std::vector<std::string> candidates, Run("reap expired leases", [&](pqxx::work& tx) {
                            std::vector<std::string> ids;
                            for (const pqxx::row& row :
                                 tx.exec(absl::StrCat("SELECT id, COALESCE(owner, ''), ", expired,
                                                      " FROM jobs WHERE state IN (", states, ") ORDER BY position"))) {
                              if (ShouldReap(request, row[1].as<std::string>(), row[2].as<bool>())) {
                                ids.push_back(row[0].as<std::string>());
                              }
                            }
                            return absl::StatusOr<std::vector<std::string>>(std::move(ids));
                          }));
    std::vector<UpdateResult> out;
    for (const std::string& id : candidates) {
      // Again under the row's lock, which a daemon heartbeating or ending the job right now
      // holds: skip it then; if still expired, a later call reaps it.
      absl::StatusOr<std::optional<UpdateResult>> r =
          Run("reap expired leases", [&](pqxx::work& tx) -> absl::StatusOr<std::optional<UpdateResult>> {
            const pqxx::result row = tx.exec_params(
                absl::StrCat("SELECT job, last_sequence, COALESCE(owner, ''), ", expired,
                             " FROM jobs WHERE id = $1 AND state IN (", states, ") FOR UPDATE SKIP LOCKED"),
                id);
            if (row.empty() || !ShouldReap(request, row[0][2].as<std::string>(), row[0][3].as<bool>())) {
              return std::optional<UpdateResult>();
            }
            Row locked;
            locked.id = id;
            OOMB_ASSIGN_OR_RETURN(locked.job, Parse<v1::Job>(row[0][0]));
            locked.last_sequence = row[0][1].as<int64_t>();
            absl::StatusOr<UpdateResult> u = Apply(tx, locked, recover, "", kNoLease);
            if (!u.ok()) return std::optional<UpdateResult>();  // `recover` refused: leave it
            tx.commit();
            return std::optional<UpdateResult>(*std::move(u));
          });
      if (!r.ok()) return r.status();
      if (*r) out.push_back(**std::move(r));
    }
    return out;
  }

  absl::StatusOr<std::vector<JobChange>> WaitForChanges(absl::Duration timeout) override {
    absl::MutexLock lock(&listen_mu_);
    try {
      if (listen_conn_ == nullptr || !listen_conn_->is_open()) {
        receiver_.reset();
        listen_conn_.reset();
        if (absl::Status s = ConnectListenerLocked(); !s.ok()) {
          absl::SleepFor(timeout);  // do not spin while the server is away
          return s;
        }
      }
      listen_conn_->get_notifs();
      if (receiver_->changes.empty()) {
        const int64_t us = std::max<int64_t>(0, absl::ToInt64Microseconds(timeout));
        listen_conn_->await_notification(us / 1000000, us % 1000000);
      }
      std::vector<JobChange> out;
      out.swap(receiver_->changes);
      return out;
    } catch (const std::exception& e) {
      receiver_.reset();
      listen_conn_.reset();  // reconnect on the next call
      return absl::UnavailableError(absl::StrCat("job store: waiting for changes: ", Scrub(e.what(), url_)));
    }
  }

  absl::StatusOr<std::vector<OutboxMessage>> ClaimWebhooks(int limit, absl::Duration hold) override {
    return Run("claim webhooks", [&](pqxx::work& tx) -> absl::StatusOr<std::vector<OutboxMessage>> {
      const pqxx::result r = tx.exec_params(
          "UPDATE webhook_outbox SET held_until = now() + $2::bigint * interval '1 microsecond' WHERE id IN "
          "(SELECT id FROM webhook_outbox WHERE next_attempt <= now() AND held_until <= now() ORDER BY id "
          "LIMIT $1::integer FOR UPDATE SKIP LOCKED) RETURNING id, webhook_id, job_id, url, secret_file, "
          "secret_project, type, payload, attempts, (EXTRACT(EPOCH FROM created) * 1000000)::bigint, last_error",
          limit, absl::ToInt64Microseconds(hold));
      std::vector<OutboxMessage> out;
      for (const pqxx::row& row : r) {
        OutboxMessage m;
        m.id = row[0].as<int64_t>();
        std::string* text[] = {&m.webhook_id,     &m.job_id, &m.url,    &m.secret_file,
                               &m.secret_project, &m.type,   &m.payload};
        for (int i = 0; i < 7; ++i) *text[i] = row[i + 1].as<std::string>();
        m.attempts = row[8].as<int32_t>();
        m.created = absl::FromUnixMicros(row[9].as<int64_t>());
        m.last_error = row[10].as<std::string>();
        out.push_back(std::move(m));
      }
      std::sort(out.begin(), out.end(), [](const OutboxMessage& a, const OutboxMessage& b) { return a.id < b.id; });
      tx.commit();
      return out;
    });
  }

  absl::Status FinishWebhook(int64_t id, std::optional<absl::Duration> retry_in, const std::string& error) override {
    return Run("finish a webhook", [&](pqxx::work& tx) -> absl::Status {
      const pqxx::result r =
          retry_in.has_value() ? tx.exec_params(
                                     "UPDATE webhook_outbox SET attempts = attempts + 1, next_attempt = now() + "
                                     "$2::bigint * interval '1 microsecond', held_until = '-infinity', last_error = $3 "
                                     "WHERE id = $1",
                                     id, absl::ToInt64Microseconds(*retry_in), error)
                               : tx.exec_params("DELETE FROM webhook_outbox WHERE id = $1", id);
      if (r.affected_rows() == 0) return absl::NotFoundError(absl::StrCat("webhook message ", id, " not found"));
      tx.commit();
      return absl::OkStatus();
    });
  }

  absl::Status ReleaseWebhook(int64_t id, absl::Duration due_in) override {
    return Run("release a webhook", [&](pqxx::work& tx) -> absl::Status {
      const pqxx::result r = tx.exec_params(
          "UPDATE webhook_outbox SET next_attempt = now() + $2::bigint * interval '1 microsecond', "
          "held_until = '-infinity' WHERE id = $1",
          id, absl::ToInt64Microseconds(due_in));
      if (r.affected_rows() == 0) return absl::NotFoundError(absl::StrCat("webhook message ", id, " not found"));
      tx.commit();
      return absl::OkStatus();
    });
  }

  absl::StatusOr<int64_t> PendingWebhooks() override {
    return Run("count webhooks", [&](pqxx::work& tx) -> absl::StatusOr<int64_t> {
      return tx.exec("SELECT COUNT(*) FROM webhook_outbox")[0][0].as<int64_t>();
    });
  }

 private:
  struct Row {
    std::string id;
    v1::Job job;
    int64_t last_sequence = 0;
    std::string owner;  // empty: none
  };

  // Runs `fn` in a transaction on the query connection; turns exceptions into statuses that
  // name the operation. A lost connection is reopened and `fn` run once more (the server rolled
  // back the first try); a deadlock or serialisation failure is retried too. Unique violations
  // come back as ABORTED for the caller to retry.
  template <typename Fn>
  auto Run(const char* what, Fn&& fn) -> decltype(fn(std::declval<pqxx::work&>())) {
    absl::MutexLock lock(&mu_);
    for (int attempt = 0;; ++attempt) {
      const bool last = attempt >= 2;
      try {
        if (conn_ == nullptr || !conn_->is_open()) {
          conn_.reset();
          conn_ = std::make_unique<pqxx::connection>(url_);
        }
        pqxx::work tx(*conn_);
        return fn(tx);
      } catch (const pqxx::in_doubt_error&) {
        conn_.reset();
        return absl::UnavailableError(
            absl::StrCat("job store: ", what, ": the connection broke while committing; the outcome is unknown"));
      } catch (const pqxx::broken_connection& e) {
        conn_.reset();
        if (last) return absl::UnavailableError(absl::StrCat("job store: ", what, ": ", Scrub(e.what(), url_)));
        std::this_thread::sleep_for(std::chrono::milliseconds(100 << attempt));
      } catch (const pqxx::unique_violation& e) {
        return absl::AbortedError(absl::StrCat("job store: ", what, ": ", Scrub(e.what(), url_)));
      } catch (const pqxx::transaction_rollback& e) {  // deadlock, serialisation failure
        if (last) return absl::InternalError(absl::StrCat("job store: ", what, ": ", Scrub(e.what(), url_)));
      } catch (const std::exception& e) {
        return absl::InternalError(absl::StrCat("job store: ", what, ": ", Scrub(e.what(), url_)));
      }
    }
  }

  absl::Status ConnectListenerLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(listen_mu_) {
    try {
      listen_conn_ = std::make_unique<pqxx::connection>(url_);
      receiver_ = std::make_unique<Receiver>(*listen_conn_, instance_);
      return absl::OkStatus();
    } catch (const std::exception& e) {
      receiver_.reset();
      listen_conn_.reset();
      return absl::UnavailableError(absl::StrCat("job store: listening for changes: ", Scrub(e.what(), url_)));
    }
  }

  static absl::StatusOr<v1::Job> GetIn(pqxx::work& tx, const std::string& job_id) {
    const pqxx::result r = tx.exec_params("SELECT job, last_sequence FROM jobs WHERE id = $1", job_id);
    if (r.empty()) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
    OOMB_ASSIGN_OR_RETURN(v1::Job job, Parse<v1::Job>(r[0][0]));
    job.set_last_sequence(r[0][1].as<int64_t>());
    return job;
  }

  static absl::StatusOr<std::optional<Row>> LockRow(pqxx::work& tx, const std::string& job_id, bool skip_locked) {
    const pqxx::result r =
        tx.exec_params(absl::StrCat("SELECT job, last_sequence, COALESCE(owner, '') FROM jobs WHERE id = $1 FOR UPDATE",
                                    skip_locked ? " SKIP LOCKED" : ""),
                       job_id);
    if (r.empty()) return std::optional<Row>();
    Row row;
    row.id = job_id;
    OOMB_ASSIGN_OR_RETURN(row.job, Parse<v1::Job>(r[0][0]));
    row.last_sequence = r[0][1].as<int64_t>();
    row.owner = r[0][2].as<std::string>();
    return std::optional<Row>(std::move(row));
  }

  // Applies `mutate` to the locked `row` and writes it: the job keeps `owner` while it stays
  // leased and loses it (and the lease) when it leaves the leased states. `lease_us`: kKeepLease,
  // kNoLease, or the length of a new lease. Entering QUEUED starts the queue wait.
  absl::StatusOr<UpdateResult> Apply(pqxx::work& tx, const Row& row, const JobMutation& mutate,
                                     const std::string& owner, int64_t lease_us) {
    UpdateResult result;
    const v1::Job::State before = row.job.state();
    OOMB_ASSIGN_OR_RETURN(const bool leased, store_internal::MutateRecordingLease(row.job, mutate, owner, &result));
    if (!leased) lease_us = kNoLease;
    RecordDevices(tx, row.id, before, result.job);  // before the update: it reads the lease
    tx.exec_params(
        "UPDATE jobs SET state = $2::integer, job = $3, last_sequence = $4::bigint, owner = NULLIF($5::text, ''), "
        "lease_expires = CASE WHEN $6::bigint >= 0 THEN now() + $6::bigint * interval '1 microsecond' "
        "WHEN $6::bigint = -1 THEN lease_expires END, "
        "queued_at = CASE WHEN $7::boolean THEN now() ELSE queued_at END, priority = $8::integer WHERE id = $1",
        row.id, static_cast<int>(result.job.state()), Bytes(result.job),
        row.last_sequence + static_cast<int64_t>(result.events.size()), leased ? owner : std::string(), lease_us,
        store_internal::EntersQueue(before, result.job.state()), result.job.priority());
    AppendEvents(tx, row.id, result.job, row.last_sequence, &result.events);
    Notify(tx, row.id, result.job.state());
    return result;
  }

  // Device accounting (job_store.h): an interval opens when the job enters a leased state and
  // closes when it leaves them, at the end of its lease if that came first.
  static void RecordDevices(pqxx::work& tx, const std::string& job_id, v1::Job::State before, const v1::Job& after) {
    const bool was = IsLeased(before), is = IsLeased(after.state());
    if (was == is) return;
    if (is) {
      tx.exec_params("INSERT INTO device_usage (job_id, project, devices, started) VALUES ($1, $2, $3, now())", job_id,
                     store_internal::ProjectOf(after), store_internal::DevicesOf(after));
      tx.exec_params("DELETE FROM device_usage WHERE ended < now() - $1::bigint * interval '1 microsecond'",
                     store_internal::kUsageKeepMicros);
    } else {
      tx.exec_params(
          "UPDATE device_usage SET ended = GREATEST(started, LEAST(now(), COALESCE((SELECT lease_expires FROM jobs "
          "WHERE id = $1), now()))) WHERE job_id = $1 AND ended IS NULL",
          job_id);
    }
  }

  static absl::StatusOr<std::map<std::string, ProjectUsage>> UsageIn(pqxx::work& tx) {
    std::map<std::string, ProjectUsage> out;
    const pqxx::result held = tx.exec_params(
        "SELECT project, state, COUNT(*), SUM(gpus) FROM jobs WHERE state IN ($1, $2, $3, $4, $5, $6) "
        "GROUP BY project, state",
        static_cast<int>(v1::Job::RUNNING), static_cast<int>(v1::Job::PAUSING), static_cast<int>(v1::Job::CANCELLING),
        static_cast<int>(v1::Job::VALIDATING), static_cast<int>(v1::Job::QUEUED), static_cast<int>(v1::Job::PAUSED));
    for (const pqxx::row& row : held) {
      ProjectUsage& u = out[row[0].as<std::string>()];
      const auto state = static_cast<v1::Job::State>(row[1].as<int>());
      const int64_t jobs = row[2].as<int64_t>();
      if (IsLeased(state)) {
        u.running_devices += row[3].as<int64_t>();
      } else {
        u.waiting_jobs += jobs;
        if (state == v1::Job::QUEUED) u.queued_jobs += jobs;
      }
    }
    const pqxx::result used = tx.exec_params(
        "SELECT project, SUM(devices * EXTRACT(EPOCH FROM LEAST(COALESCE(ended, now()), now()) - "
        "GREATEST(started, now() - $1::bigint * interval '1 microsecond'))) FROM device_usage "
        "WHERE COALESCE(ended, now()) > now() - $1::bigint * interval '1 microsecond' GROUP BY project",
        store_internal::kUsageWindowMicros);
    for (const pqxx::row& row : used) out[row[0].as<std::string>()].device_seconds_per_day = row[1].as<double>();
    return out;
  }

  // Numbers the events after `last_sequence`, stamps them and inserts them, with checkpoint
  // records for CHECKPOINT_SAVED events and the outbox's messages.
  void AppendEvents(pqxx::work& tx, const std::string& job_id, const v1::Job& job, int64_t last_sequence,
                    std::vector<v1::JobEvent>* events) const {
    store_internal::StampEvents(job.name(), last_sequence, events);
    for (const OutboxMessage& m : OutboxFor(job, *events)) {
      tx.exec_params(
          "INSERT INTO webhook_outbox (webhook_id, job_id, url, secret_file, secret_project, type, payload) VALUES "
          "($1, $2, $3, $4, $5, $6, $7)",
          m.webhook_id, m.job_id, m.url, m.secret_file, m.secret_project, m.type, m.payload);
    }
    for (const v1::JobEvent& e : *events) {
      tx.exec_params("INSERT INTO job_events (job_id, sequence, event) VALUES ($1, $2, $3)", job_id, e.sequence(),
                     Bytes(e));
      if (e.type() == v1::JobEvent::CHECKPOINT_SAVED) {
        tx.exec_params("INSERT INTO checkpoints (job_id, sequence, step, checkpoint) VALUES ($1, $2, $3, $4)", job_id,
                       e.sequence(), e.checkpoint().step(), Bytes(e.checkpoint()));
      }
    }
  }

  // Delivered to the listeners when the transaction commits.
  void Notify(pqxx::work& tx, const std::string& job_id, v1::Job::State state) {
    tx.exec_params("SELECT pg_notify($1, $2)", std::string(kChannel),
                   absl::StrCat(instance_, " ", static_cast<int>(state), " ", job_id));
  }

  const std::string url_;
  const std::string instance_;  // tells this object's notices from other daemons'

  absl::Mutex mu_;
  std::unique_ptr<pqxx::connection> conn_ ABSL_GUARDED_BY(mu_);

  absl::Mutex listen_mu_;
  std::unique_ptr<pqxx::connection> listen_conn_ ABSL_GUARDED_BY(listen_mu_);
  std::unique_ptr<Receiver> receiver_ ABSL_GUARDED_BY(listen_mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> OpenPostgresJobStore(const std::string& url) {
  std::unique_ptr<pqxx::connection> conn;
  try {
    conn = std::make_unique<pqxx::connection>(url);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot connect to the PostgreSQL job store: ", Scrub(e.what(), url)));
  }
  try {
    pqxx::work tx(*conn);
    tx.exec_params("SELECT pg_advisory_xact_lock($1::bigint)", kSchemaLock);
    tx.exec(kSchema);
    const pqxx::result v = tx.exec("SELECT COALESCE(MAX(version), 0) FROM oomb_schema");
    const int version = v[0][0].as<int>();
    if (version > kSchemaVersion) {
      return absl::FailedPreconditionError(absl::StrCat("the PostgreSQL job store has schema version ", version,
                                                        "; this oombd knows up to ", kSchemaVersion,
                                                        " (a newer oombd made it)"));
    }
    if (version < 2) {  // jobs.project from the stored jobs' names
      for (const pqxx::row& row : tx.exec("SELECT id, job FROM jobs WHERE project = ''")) {
        absl::StatusOr<v1::Job> job = Parse<v1::Job>(row[1]);
        if (job.ok()) {
          tx.exec_params("UPDATE jobs SET project = $2 WHERE id = $1", row[0].as<std::string>(),
                         store_internal::ProjectOf(*job));
        }
      }
    }
    if (version < kSchemaVersion) tx.exec_params("INSERT INTO oomb_schema (version) VALUES ($1)", kSchemaVersion);
    tx.commit();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("cannot create the PostgreSQL job store's tables: ", Scrub(e.what(), url)));
  }
  return std::unique_ptr<JobStore>(new PostgresJobStore(url, std::move(conn)));
}

}  // namespace oomb::server
