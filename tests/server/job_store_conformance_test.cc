// The JobStore contract (server/store/job_store.h), one suite run against both backends: SQLite
// on a temporary file and PostgreSQL on a throwaway server on loopback (postgres_harness.h;
// one database per test). Includes two store objects on one database claiming and updating
// concurrently: a job is never claimed twice and sequences stay without gaps.
#include <gmock/gmock.h>
#include <google/protobuf/unknown_field_set.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include <SQLiteCpp/SQLiteCpp.h>
#include <pqxx/pqxx>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/store/job_store.h"
#include "tests/server/postgres_harness.h"

namespace oomb::server {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::Job NewJob(const std::string& id, v1::Job::State state = v1::Job::QUEUED, int priority = 0,
               const std::string& device = "", int gpus = 1) {
  v1::Job j;
  j.set_name("jobs/" + id);  // the name of a job stored before projects; ParseStoredName reads both
  j.set_state(state);
  j.set_priority(priority);
  j.mutable_spec()->mutable_resources()->set_priority(priority);
  j.mutable_spec()->mutable_resources()->set_device(device);
  j.mutable_spec()->mutable_resources()->set_gpus(gpus);
  return j;
}

v1::JobEvent StateEvent(v1::Job::State s) {
  v1::JobEvent e;
  e.set_type(v1::JobEvent::STATE_CHANGED);
  e.set_state(s);
  return e;
}

JobMutation SetStateTo(v1::Job::State s) {
  return [s](v1::Job* j, std::vector<v1::JobEvent>* events) {
    j->set_state(s);
    events->push_back(StateEvent(s));
    return absl::OkStatus();
  };
}

// The scheduler's start transition, in short.
JobMutation Start() {
  return [](v1::Job* j, std::vector<v1::JobEvent>* events) {
    if (j->state() != v1::Job::QUEUED) return absl::FailedPreconditionError("not QUEUED");
    j->set_attempt(j->attempt() + 1);
    j->set_state(v1::Job::RUNNING);
    events->push_back(StateEvent(v1::Job::RUNNING));
    return absl::OkStatus();
  };
}

// The recovery transition, in short.
JobMutation Recover() {
  return [](v1::Job* j, std::vector<v1::JobEvent>* events) {
    if (j->state() == v1::Job::RUNNING) {
      j->set_state(v1::Job::RECOVERING);
      events->push_back(StateEvent(v1::Job::RECOVERING));
      j->set_state(v1::Job::QUEUED);
      events->push_back(StateEvent(v1::Job::QUEUED));
    } else if (j->state() == v1::Job::CANCELLING) {
      j->set_state(v1::Job::CANCELLED);
      events->push_back(StateEvent(v1::Job::CANCELLED));
    }
    return absl::OkStatus();
  };
}

ClaimRequest Request(const std::string& owner, absl::Duration lease = absl::Seconds(30),
                     std::map<std::string, int32_t> devices = {{"", 1}, {"auto", 1}, {"cpu", 1}}) {
  ClaimRequest r;
  r.owner = owner;
  r.devices = std::move(devices);
  r.lease = lease;
  return r;
}

// The reaper's request of a running daemon.
ReapRequest KeepOwner(const std::string& owner) {
  return ReapRequest{.keep_owner = owner, .dead_owners = {}, .all = false};
}

// One backend: opens store objects on one database per test.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual absl::StatusOr<std::unique_ptr<JobStore>> Open() = 0;
  virtual bool shared() const = 0;  // store objects hear each other's changes
};

class SqliteBackend : public Backend {
 public:
  explicit SqliteBackend(fs::path file) : file_(std::move(file)) {}
  absl::StatusOr<std::unique_ptr<JobStore>> Open() override { return OpenSqliteJobStore(file_.string()); }
  bool shared() const override { return false; }

 private:
  fs::path file_;
};

class PostgresBackend : public Backend {
 public:
  explicit PostgresBackend(std::string url) : url_(std::move(url)) {}
  absl::StatusOr<std::unique_ptr<JobStore>> Open() override { return OpenPostgresJobStore(url_); }
  bool shared() const override { return true; }

 private:
  std::string url_;
};

class JobStoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->name());
    for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? std::tolower(c) : '_';
    dir_ = fs::temp_directory_path() / ("oomb_store_conformance_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    if (GetParam() == "sqlite") {
      backend_ = std::make_unique<SqliteBackend>(dir_ / "oombd.db");
    } else {
      if (oomb::testing::PostgresServer::BinDir().empty()) GTEST_SKIP() << "PostgreSQL is not installed";
      std::string error;
      pg_ = oomb::testing::PostgresServer::Start(dir_, &error);
      ASSERT_NE(pg_, nullptr) << error;
      const std::string url = pg_->CreateDatabase("conformance");
      ASSERT_FALSE(url.empty()) << pg_->log();
      backend_ = std::make_unique<PostgresBackend>(url);
    }
    absl::StatusOr<std::unique_ptr<JobStore>> s = backend_->Open();
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
  }

  void TearDown() override {
    store_.reset();
    pg_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::unique_ptr<JobStore> OpenAnother() {
    absl::StatusOr<std::unique_ptr<JobStore>> s = backend_->Open();
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }

  void Add(const std::string& id, v1::Job::State state = v1::Job::QUEUED, int priority = 0,
           const std::string& device = "", int gpus = 1) {
    absl::StatusOr<CreateResult> r = store_->Create(NewJob(id, state, priority, device, gpus), "", {StateEvent(state)});
    ASSERT_TRUE(r.ok()) << r.status();
  }

  std::vector<v1::JobEvent> Events(const std::string& id, JobStore* store = nullptr) {
    absl::StatusOr<std::vector<v1::JobEvent>> e = (store ? store : store_.get())->ListEvents(id, 0, 100000);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? *e : std::vector<v1::JobEvent>();
  }

  fs::path dir_;
  std::unique_ptr<oomb::testing::PostgresServer> pg_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<JobStore> store_;
};

TEST_P(JobStoreTest, CreateGetAndIdempotentRetries) {
  absl::StatusOr<CreateResult> a = store_->Create(NewJob("a"), "req-1", {StateEvent(v1::Job::QUEUED)});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->created);
  EXPECT_EQ(a->job.name(), "jobs/a");
  // The same request again: nothing stored, the first call's job returned, whatever its state.
  ASSERT_TRUE(store_->Update("a", SetStateTo(v1::Job::PAUSED)).ok());
  absl::StatusOr<CreateResult> again = store_->Create(NewJob("other"), "req-1", {StateEvent(v1::Job::QUEUED)});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->created);
  EXPECT_EQ(again->job.name(), "jobs/a");
  EXPECT_EQ(again->job.state(), v1::Job::PAUSED);
  EXPECT_EQ(store_->Get("other").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*store_->JobOfRequest("req-1"), std::optional<std::string>("a"));
  EXPECT_EQ(*store_->JobOfRequest("req-unknown"), std::nullopt);
  // A taken id from another request.
  EXPECT_EQ(store_->Create(NewJob("a"), "req-2", {}).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store_->Create(NewJob("a"), "", {}).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store_->Get("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->Update("nope", SetStateTo(v1::Job::QUEUED)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->ListEvents("nope", 0, 10).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->ListCheckpoints("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->QueuePosition("nope").status().code(), absl::StatusCode::kNotFound);
  // A new store object on the same database sees it all (durable).
  store_.reset();
  store_ = OpenAnother();
  ASSERT_NE(store_, nullptr);
  EXPECT_EQ(store_->Get("a")->state(), v1::Job::PAUSED);
  EXPECT_FALSE(store_->Create(NewJob("x"), "req-1", {})->created);
}

TEST_P(JobStoreTest, EventsAreNumberedWithoutGapsAndCheckpointsRecorded) {
  Add("e");
  ASSERT_TRUE(store_
                  ->Update("e",
                           [](v1::Job* j, std::vector<v1::JobEvent>* events) {
                             for (int step : {4, 2}) {
                               v1::JobEvent c;
                               c.set_type(v1::JobEvent::CHECKPOINT_SAVED);
                               c.mutable_checkpoint()->set_step(step);
                               c.mutable_checkpoint()->set_path("/ck/" + std::to_string(step));
                               events->push_back(c);
                             }
                             j->mutable_progress()->set_step(4);
                             return absl::OkStatus();
                           })
                  .ok());
  // A refused mutation changes nothing.
  absl::StatusOr<UpdateResult> refused = store_->Update("e", [](v1::Job* j, std::vector<v1::JobEvent>* events) {
    j->set_state(v1::Job::FAILED);
    events->push_back(StateEvent(v1::Job::FAILED));
    return absl::FailedPreconditionError("no");
  });
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<UpdateResult> r = store_->Update("e", SetStateTo(v1::Job::CANCELLED));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->events.size(), 1u);
  EXPECT_EQ(r->events[0].sequence(), 4);
  EXPECT_EQ(r->events[0].job(), "jobs/e");
  EXPECT_TRUE(r->events[0].has_time());

  const std::vector<v1::JobEvent> events = Events("e");
  ASSERT_EQ(events.size(), 4u);
  for (size_t i = 0; i < events.size(); ++i) EXPECT_EQ(events[i].sequence(), static_cast<int64_t>(i + 1));
  EXPECT_EQ(events[3].state(), v1::Job::CANCELLED);
  EXPECT_EQ(store_->Get("e")->progress().step(), 4);
  // A job read says which of its events it already includes (a watcher's replay starts there).
  EXPECT_EQ(store_->Get("e")->last_sequence(), 4);
  // after_sequence and limit.
  absl::StatusOr<std::vector<v1::JobEvent>> tail = store_->ListEvents("e", 1, 2);
  ASSERT_TRUE(tail.ok());
  ASSERT_EQ(tail->size(), 2u);
  EXPECT_EQ((*tail)[0].sequence(), 2);
  // Checkpoints in step order, stamped with their event's time; the replayed event equals it.
  absl::StatusOr<std::vector<v1::Checkpoint>> cps = store_->ListCheckpoints("e");
  ASSERT_TRUE(cps.ok());
  ASSERT_EQ(cps->size(), 2u);
  EXPECT_EQ((*cps)[0].step(), 2);
  EXPECT_EQ((*cps)[1].path(), "/ck/4");
  EXPECT_TRUE((*cps)[0].has_create_time());
  EXPECT_EQ(events[2].checkpoint().SerializeAsString(), (*cps)[0].SerializeAsString());
}

// The evaluation as an older daemon stored it (server/legacy_fields.h): the spec's suites as
// strings (field 1), the results one field each (2 positions, 3 passkey, 5 its accuracy), written
// here as the unknown fields they are now, which is the same wire form.
v1::EvaluationResult OldEvaluationResult() {
  v1::EvaluationResult r;
  r.set_step(3);
  v1::EvaluationResult::Bucket b;
  b.set_begin(1024);
  b.set_end(2048);
  b.set_loss(2.5);
  v1::EvaluationResult::Cell c;
  c.set_length(4096);
  c.set_correct(3);
  c.set_trials(4);
  google::protobuf::UnknownFieldSet* old = r.GetReflection()->MutableUnknownFields(&r);
  old->AddLengthDelimited(2, b.SerializeAsString());
  old->AddLengthDelimited(3, c.SerializeAsString());
  const double accuracy = 0.75;
  uint64_t bits = 0;
  std::memcpy(&bits, &accuracy, sizeof bits);
  old->AddFixed64(5, bits);
  return r;
}

void ExpectPresentForm(const v1::EvaluationResult& r) {
  EXPECT_EQ(r.step(), 3);
  EXPECT_EQ(r.GetReflection()->GetUnknownFields(r).field_count(), 0);
  ASSERT_EQ(r.suites().size(), 2u);
  ASSERT_EQ(r.suites().at("positions").buckets_size(), 1);
  EXPECT_EQ(r.suites().at("positions").buckets(0).begin(), 1024);
  EXPECT_EQ(r.suites().at("positions").buckets(0).loss(), 2.5);
  ASSERT_EQ(r.suites().at("passkey").cells_size(), 1);
  EXPECT_EQ(r.suites().at("passkey").cells(0).correct(), 3);
  EXPECT_EQ(r.suites().at("passkey").accuracy(), 0.75);
}

TEST_P(JobStoreTest, JobsAndEventsStoredWithTheOldEvaluationFieldsAreReadInTheirPresentForm) {
  v1::Job job = NewJob("old");
  v1::EvaluationSpec* e = job.mutable_spec()->mutable_evaluation();
  e->set_every_steps(5);
  e->GetReflection()->MutableUnknownFields(e)->AddLengthDelimited(1, "needle");
  e->GetReflection()->MutableUnknownFields(e)->AddLengthDelimited(1, "passkey");
  *job.mutable_progress()->mutable_evaluation() = OldEvaluationResult();
  v1::JobEvent step;
  step.set_type(v1::JobEvent::STEP);
  *step.mutable_progress()->mutable_evaluation() = OldEvaluationResult();
  ASSERT_TRUE(store_->Create(job, "", {step}).ok());

  absl::StatusOr<v1::Job> got = store_->Get("old");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(got->spec().evaluation().suites(), ElementsAre(v1::Evaluation::needle, v1::Evaluation::passkey));
  EXPECT_EQ(got->spec().evaluation().every_steps(), 5);
  EXPECT_EQ(got->spec().evaluation().GetReflection()->GetUnknownFields(got->spec().evaluation()).field_count(), 0);
  ExpectPresentForm(got->progress().evaluation());
  const std::vector<v1::JobEvent> events = Events("old");
  ASSERT_EQ(events.size(), 1u);
  ExpectPresentForm(events[0].progress().evaluation());
  // Written back after an update, the job keeps the present form only.
  ASSERT_TRUE(store_->Update("old", SetStateTo(v1::Job::CANCELLED)).ok());
  EXPECT_THAT(store_->Get("old")->spec().evaluation().suites(),
              ElementsAre(v1::Evaluation::needle, v1::Evaluation::passkey));
}

TEST_P(JobStoreTest, ListPaginationIsStableUnderInsertsAndFilters) {
  auto add = [&](const std::string& id, const std::string& team, v1::Job::State state) {
    v1::Job j = NewJob(id, state);
    (*j.mutable_labels())["team"] = team;
    ASSERT_TRUE(store_->Create(j, "", {}).ok());
  };
  for (int i = 0; i < 5; ++i) add("j" + std::to_string(i), i % 2 ? "odd" : "even", v1::Job::QUEUED);
  ListQuery q;
  q.page_size = 2;
  ListResult p1 = *store_->List(q);
  ASSERT_EQ(p1.jobs.size(), 2u);
  EXPECT_EQ(p1.jobs[0].name(), "jobs/j4");
  add("j5", "odd", v1::Job::FAILED);  // inserted between pages: does not shift the next page
  q.before_position = p1.next_position;
  ListResult p2 = *store_->List(q);
  ASSERT_EQ(p2.jobs.size(), 2u);
  EXPECT_EQ(p2.jobs[0].name(), "jobs/j2");
  q.before_position = p2.next_position;
  ListResult p3 = *store_->List(q);
  ASSERT_EQ(p3.jobs.size(), 1u);
  EXPECT_EQ(p3.jobs[0].name(), "jobs/j0");
  EXPECT_EQ(p3.next_position, 0);
  ListQuery odd;
  odd.labels = {{"team", "odd"}};
  EXPECT_EQ(store_->List(odd)->jobs.size(), 3u);
  ListQuery failed;
  failed.states = {v1::Job::FAILED, v1::Job::CANCELLED};
  ASSERT_EQ(store_->List(failed)->jobs.size(), 1u);
  EXPECT_EQ(store_->List(failed)->jobs[0].name(), "jobs/j5");

  absl::StatusOr<std::vector<v1::Job>> queued = store_->ListByState({v1::Job::QUEUED});
  ASSERT_TRUE(queued.ok());
  ASSERT_EQ(queued->size(), 5u);
  EXPECT_EQ((*queued)[0].name(), "jobs/j0");  // oldest first
  EXPECT_TRUE(store_->ListByState({})->empty());
  const std::map<v1::Job::State, int64_t> counts = *store_->CountByState();
  EXPECT_EQ(counts, (std::map<v1::Job::State, int64_t>{{v1::Job::QUEUED, 5}, {v1::Job::FAILED, 1}}));
}

// Jobs in projects (issue 53): a list filtered by projects, across pages, and a job stored
// before projects ("jobs/{id}") in the default project; events carry the job's name.
TEST_P(JobStoreTest, ListsFilterByProjectAndEventsCarryTheJobsName) {
  for (int i = 0; i < 6; ++i) {
    v1::Job j = NewJob("p" + std::to_string(i));
    j.set_name(JobName(i % 3 == 0 ? "nlp" : "vision", "p" + std::to_string(i)));
    ASSERT_TRUE(store_->Create(j, "", {StateEvent(v1::Job::QUEUED)}).ok());
  }
  ASSERT_TRUE(store_->Create(NewJob("legacy"), "", {}).ok());
  ListQuery q;
  q.projects = {"vision"};
  q.page_size = 2;
  std::vector<std::string> names;
  for (;;) {
    const absl::StatusOr<ListResult> page = store_->List(q);
    ASSERT_TRUE(page.ok()) << page.status();
    for (const v1::Job& j : page->jobs) names.push_back(j.name());
    if (page->next_position == 0) break;
    q.before_position = page->next_position;
  }
  EXPECT_THAT(names, ElementsAre("projects/vision/jobs/p5", "projects/vision/jobs/p4", "projects/vision/jobs/p2",
                                 "projects/vision/jobs/p1"));
  ListQuery defaults;
  defaults.projects = {kDefaultProject, "nlp"};
  const absl::StatusOr<ListResult> listed = store_->List(defaults);
  ASSERT_TRUE(listed.ok()) << listed.status();
  std::vector<std::string> others;
  for (const v1::Job& j : listed->jobs) others.push_back(j.name());
  EXPECT_THAT(others, ElementsAre("jobs/legacy", "projects/nlp/jobs/p3", "projects/nlp/jobs/p0"));
  const std::vector<v1::JobEvent> events = *store_->ListEvents("p4", 0, 10);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].job(), "projects/vision/jobs/p4");
  EXPECT_EQ(ParseStoredName("projects/vision/jobs/p4").project, "vision");
  EXPECT_EQ(ParseStoredName("jobs/legacy").project, kDefaultProject);
  EXPECT_EQ(ParseStoredName("jobs/legacy").id, "legacy");
}

TEST_P(JobStoreTest, DeleteRemovesTheJobItsEventsCheckpointsAndRequestId) {
  ASSERT_TRUE(store_->Create(NewJob("d"), "req-d", {StateEvent(v1::Job::QUEUED)}).ok());
  absl::Status refused =
      store_->Delete("d", [](const v1::Job& j) { return absl::FailedPreconditionError("it is QUEUED"); });
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(store_->Get("d").ok());
  EXPECT_TRUE(store_->Delete("d", [](const v1::Job&) { return absl::OkStatus(); }).ok());
  EXPECT_EQ(store_->Get("d").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*store_->JobOfRequest("req-d"), std::nullopt);
  EXPECT_EQ(store_->Delete("d", [](const v1::Job&) { return absl::OkStatus(); }).code(), absl::StatusCode::kNotFound);
  // The id and the request id are free again; the new job starts its sequence at 1.
  absl::StatusOr<CreateResult> again = store_->Create(NewJob("d"), "req-d", {StateEvent(v1::Job::QUEUED)});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->created);
  EXPECT_EQ(Events("d").size(), 1u);
}

TEST_P(JobStoreTest, ClaimTakesTheHighestPriorityThenTheOldestEligibleJobAndLeasesIt) {
  Add("low-old", v1::Job::QUEUED, 0);
  Add("high", v1::Job::QUEUED, 5);
  Add("low-new", v1::Job::QUEUED, 0);
  Add("gpu", v1::Job::QUEUED, 9, "cuda");
  Add("paused", v1::Job::PAUSED, 10);
  EXPECT_EQ(*store_->QueuePosition("gpu"), 1);
  EXPECT_EQ(*store_->QueuePosition("high"), 2);
  EXPECT_EQ(*store_->QueuePosition("low-old"), 3);
  EXPECT_EQ(*store_->QueuePosition("low-new"), 4);
  EXPECT_EQ(*store_->QueuePosition("paused"), 0);

  std::vector<std::string> order;
  for (;;) {
    absl::StatusOr<std::optional<ClaimResult>> c = store_->Claim(Request("daemon-a"), Start());
    ASSERT_TRUE(c.ok()) << c.status();
    if (!c->has_value()) break;
    const UpdateResult& u = (*c)->update;
    order.push_back(u.job.name());
    EXPECT_EQ(u.job.state(), v1::Job::RUNNING);
    EXPECT_EQ(u.job.daemon(), "daemon-a");
    EXPECT_EQ(u.job.attempt(), 1);
    ASSERT_EQ(u.events.size(), 1u);
    EXPECT_EQ(u.events[0].sequence(), 2);
    EXPECT_GE((*c)->queued, absl::ZeroDuration());
    EXPECT_LT((*c)->queued, absl::Minutes(1));
    EXPECT_EQ(store_->Get(u.job.name().substr(5))->daemon(), "daemon-a");
  }
  // cpu takes neither the paused job nor the one asking for cuda.
  EXPECT_THAT(order, ElementsAre("jobs/high", "jobs/low-old", "jobs/low-new"));
  EXPECT_EQ(*store_->QueuePosition("gpu"), 1);
  absl::StatusOr<std::optional<ClaimResult>> gpu = store_->Claim(
      Request("daemon-a", absl::Seconds(30), {{"", 2}, {"auto", 2}, {"cuda", 2}, {"cuda:0", 1}}), Start());
  ASSERT_TRUE(gpu.ok() && gpu->has_value());
  EXPECT_EQ((*gpu)->update.job.name(), "jobs/gpu");
  EXPECT_EQ(*store_->QueuePosition("gpu"), 0);

  // A job asking for more devices (resources.gpus) than the claimer has for it is passed over.
  Add("four-gpus", v1::Job::QUEUED, 7, "cuda", 4);
  Add("two-gpus", v1::Job::QUEUED, 6, "cuda", 2);
  Add("one-gpu", v1::Job::QUEUED, 5, "cuda", 1);
  const std::map<std::string, int32_t> two_cudas = {{"", 2}, {"auto", 2}, {"cuda", 2}, {"cuda:1", 1}};
  absl::StatusOr<std::optional<ClaimResult>> two =
      store_->Claim(Request("daemon-a", absl::Seconds(30), two_cudas), Start());
  ASSERT_TRUE(two.ok() && two->has_value());
  EXPECT_EQ((*two)->update.job.name(), "jobs/two-gpus");
  // A start that refuses the best job (its devices are busy) takes no other in its place.
  absl::StatusOr<std::optional<ClaimResult>> busy =
      store_->Claim(Request("daemon-a", absl::Seconds(30), two_cudas),
                    [](v1::Job*, std::vector<v1::JobEvent>*) { return absl::ResourceExhaustedError("busy"); });
  EXPECT_EQ(busy.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store_->Get("one-gpu")->state(), v1::Job::QUEUED);
  EXPECT_EQ(*store_->QueuePosition("four-gpus"), 1);

  // A refusing start leaves the job QUEUED.
  Add("refused");
  absl::StatusOr<std::optional<ClaimResult>> refused =
      store_->Claim(Request("daemon-a"),
                    [](v1::Job*, std::vector<v1::JobEvent>*) { return absl::FailedPreconditionError("not now"); });
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->Get("refused")->state(), v1::Job::QUEUED);
  EXPECT_EQ(store_->Claim(Request(""), Start()).status().code(), absl::StatusCode::kInvalidArgument);
}

// Quotas: a claim passes over the jobs of a project at its device or device-hour quota and takes
// the next eligible job; usage (devices held, device-seconds in the last 24 h, jobs waiting) is
// accounted per project, and a reaped job's devices count until its lease ended, not until the
// reap.
TEST_P(JobStoreTest, QuotasHoldBackAProjectsJobsAndUsageIsCountedPerProject) {
  const auto add = [&](const std::string& project, const std::string& id, int priority, int gpus) {
    v1::Job j = NewJob(id, v1::Job::QUEUED, priority, "", gpus);
    j.set_name("projects/" + project + "/jobs/" + id);
    ASSERT_TRUE(store_->Create(j, "", {StateEvent(v1::Job::QUEUED)}).ok());
  };
  add("nlp", "n-two", 9, 2);
  add("nlp", "n-one", 8, 1);
  add("vision", "v-one", 0, 1);
  add("nlp", "n-later", 7, 1);
  const std::map<std::string, int32_t> four = {{"", 4}, {"auto", 4}, {"cpu", 4}};
  ClaimRequest request = Request("daemon-a", absl::Seconds(30), four);
  request.quotas["nlp"] = ProjectQuota{.max_devices = 2, .max_device_seconds_per_day = 0};
  request.quotas["idle"] = ProjectQuota{.max_devices = 1, .max_device_seconds_per_day = 1};
  const auto claim = [&](const ClaimRequest& r) -> std::string {
    absl::StatusOr<std::optional<ClaimResult>> c = store_->Claim(r, Start());
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() && c->has_value() ? (*c)->update.job.name() : "";
  };
  EXPECT_EQ(claim(request), "projects/nlp/jobs/n-two");
  // nlp holds 2 of its 2 devices: its other jobs wait and vision's, of lower priority, starts.
  EXPECT_EQ(claim(request), "projects/vision/jobs/v-one");
  EXPECT_EQ(claim(request), "");
  absl::StatusOr<std::map<std::string, ProjectUsage>> usage = store_->Usage();
  ASSERT_TRUE(usage.ok()) << usage.status();
  EXPECT_EQ((*usage)["nlp"].running_devices, 2);
  EXPECT_EQ((*usage)["nlp"].queued_jobs, 2);
  EXPECT_EQ((*usage)["nlp"].waiting_jobs, 2);
  EXPECT_EQ((*usage)["vision"].running_devices, 1);
  EXPECT_EQ(usage->count("idle"), 0u);
  // Without the quota the next nlp job would start; a quota of 3 lets one more in.
  request.quotas["nlp"].max_devices = 3;
  EXPECT_EQ(claim(request), "projects/nlp/jobs/n-one");
  EXPECT_EQ(claim(request), "");
  // n-two ends after running a while: its 2 devices stop counting as held, its time is used.
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(store_->Update("n-two", SetStateTo(v1::Job::SUCCEEDED)).ok());
  usage = store_->Usage();
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ((*usage)["nlp"].running_devices, 1);
  EXPECT_GE((*usage)["nlp"].device_seconds_per_day, 0.5);  // n-two: 2 devices x >= 0.3 s, n-one too
  EXPECT_LT((*usage)["nlp"].device_seconds_per_day, 60);
  // A device-hour quota spent: none of the project's jobs is taken, whatever the devices.
  request.quotas["nlp"] = ProjectQuota{.max_devices = 0, .max_device_seconds_per_day = 0.5};
  EXPECT_EQ(claim(request), "");
  request.quotas["nlp"].max_device_seconds_per_day = 3600;
  EXPECT_EQ(claim(request), "projects/nlp/jobs/n-later");
  // Deleting a finished job does not give its device time back.
  const double before = (*store_->Usage())["nlp"].device_seconds_per_day;
  ASSERT_TRUE(store_->Delete("n-two", [](const v1::Job&) { return absl::OkStatus(); }).ok());
  EXPECT_GE((*store_->Usage())["nlp"].device_seconds_per_day, before);
  // A job whose daemon died: reaped after its lease, counted until the lease ended.
  add("speech", "s-one", 0, 1);
  ClaimRequest short_lease = Request("daemon-b", absl::Seconds(1), four);
  ASSERT_EQ(claim(short_lease), "projects/speech/jobs/s-one");
  absl::SleepFor(absl::Milliseconds(2500));
  ASSERT_TRUE(store_->Reap(KeepOwner("daemon-a"), Recover()).ok());
  EXPECT_EQ(store_->Get("s-one")->state(), v1::Job::QUEUED);
  usage = store_->Usage();
  EXPECT_EQ((*usage)["speech"].running_devices, 0);
  EXPECT_GT((*usage)["speech"].device_seconds_per_day, 0.8);
  EXPECT_LT((*usage)["speech"].device_seconds_per_day, 2.0);  // the lease's second, not the 2.5 s to the reap
}

// Dataset records: created once (a retry with the same content returns the record, other
// content is ALREADY_EXISTS), bounded by the project's storage quota, listed newest first by
// project with stable pages, deleted.
TEST_P(JobStoreTest, DatasetRecordsAreUniqueBoundedByStorageAndListedByProject) {
  const auto dataset = [](const std::string& project, const std::string& id, int64_t bytes, const std::string& sha) {
    v1::Dataset d;
    d.set_name("projects/" + project + "/datasets/" + id);
    d.set_size_bytes(bytes);
    d.set_sha256(sha);
    return d;
  };
  bool created = false;
  ASSERT_TRUE(store_->CreateDataset(dataset("nlp", "a", 100, "aa"), 250, &created).ok());
  EXPECT_TRUE(created);
  absl::StatusOr<v1::Dataset> again = store_->CreateDataset(dataset("nlp", "a", 100, "aa"), 250, &created);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(created);
  EXPECT_EQ(store_->CreateDataset(dataset("nlp", "a", 100, "bb"), 250, &created).status().code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(store_->CreateDataset(dataset("nlp", "b", 150, "cc"), 250, &created).ok());
  const absl::StatusOr<v1::Dataset> over = store_->CreateDataset(dataset("nlp", "c", 1, "dd"), 250, &created);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(), HasSubstr("max_storage_bytes (250"));
  ASSERT_TRUE(store_->CreateDataset(dataset("vision", "a", 1000, "ee"), 0, &created).ok());
  EXPECT_EQ(*store_->DatasetBytes("nlp"), 250);
  EXPECT_EQ(*store_->DatasetBytes("speech"), 0);
  EXPECT_EQ(store_->GetDataset("projects/vision/datasets/a")->size_bytes(), 1000);
  EXPECT_EQ(store_->GetDataset("projects/speech/datasets/a").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<DatasetPage> page = store_->ListDatasets({"nlp"}, 1, 0);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->datasets.size(), 1u);
  EXPECT_EQ(page->datasets[0].name(), "projects/nlp/datasets/b");
  ASSERT_GT(page->next_position, 0);
  page = store_->ListDatasets({"nlp"}, 1, page->next_position);
  ASSERT_EQ(page->datasets.size(), 1u);
  EXPECT_EQ(page->datasets[0].name(), "projects/nlp/datasets/a");
  EXPECT_EQ(page->next_position, 0);
  EXPECT_EQ(store_->ListDatasets({}, 10, 0)->datasets.size(), 3u);
  ASSERT_TRUE(store_->DeleteDataset("projects/nlp/datasets/b").ok());
  EXPECT_EQ(store_->DeleteDataset("projects/nlp/datasets/b").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*store_->DatasetBytes("nlp"), 100);
  EXPECT_TRUE(store_->CreateDataset(dataset("nlp", "c", 150, "dd"), 250, &created).ok());
}

TEST_P(JobStoreTest, TheOwnerStaysWhileLeasedAndGoesWhenTheJobLeavesTheLeasedStates) {
  Add("o");
  ASSERT_TRUE(store_->Claim(Request("daemon-a"), Start())->has_value());
  // A mutation cannot change the owner; progress keeps it; CANCELLING keeps it.
  absl::StatusOr<UpdateResult> r = store_->Update("o", [](v1::Job* j, std::vector<v1::JobEvent>*) {
    j->set_daemon("intruder");
    j->mutable_progress()->set_step(1);
    return absl::OkStatus();
  });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->job.daemon(), "daemon-a");
  EXPECT_EQ(store_->Get("o")->daemon(), "daemon-a");
  ASSERT_EQ(store_->Update("o", SetStateTo(v1::Job::CANCELLING))->job.daemon(), "daemon-a");
  absl::StatusOr<std::vector<LeasedJob>> beat = store_->Heartbeat("daemon-a", absl::Seconds(30));
  ASSERT_TRUE(beat.ok()) << beat.status();
  ASSERT_EQ(beat->size(), 1u);
  EXPECT_EQ((*beat)[0].job_id, "o");
  EXPECT_EQ((*beat)[0].state, v1::Job::CANCELLING);
  // Ended: no owner, no lease.
  ASSERT_EQ(store_->Update("o", SetStateTo(v1::Job::CANCELLED))->job.daemon(), "");
  EXPECT_EQ(store_->Get("o")->daemon(), "");
  EXPECT_TRUE(store_->Heartbeat("daemon-a", absl::Seconds(30))->empty());
  // Create never leases, whatever the job says.
  v1::Job forged = NewJob("forged", v1::Job::RUNNING);
  forged.set_daemon("daemon-a");
  ASSERT_TRUE(store_->Create(forged, "", {}).ok());
  EXPECT_EQ(store_->Get("forged")->daemon(), "");
  EXPECT_TRUE(store_->Heartbeat("daemon-a", absl::Seconds(30))->empty());
}

TEST_P(JobStoreTest, HeartbeatsKeepLeasesAndTheReaperTakesOnlyExpiredOnes) {
  Add("a1");
  Add("b1");
  Add("b2");
  ASSERT_TRUE(store_->Claim(Request("daemon-a", absl::Seconds(2)), Start())->has_value());
  ASSERT_TRUE(store_->Claim(Request("daemon-b", absl::Seconds(2)), Start())->has_value());
  ASSERT_TRUE(store_->Claim(Request("daemon-b", absl::Seconds(2)), Start())->has_value());
  ASSERT_TRUE(store_->Update("b2", SetStateTo(v1::Job::CANCELLING)).ok());
  // Nothing has expired yet.
  EXPECT_TRUE(store_->Reap(KeepOwner("daemon-b"), Recover())->empty());
  // b renews; a does not. After a's lease ran out, b's reaper takes a1 only.
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<std::vector<LeasedJob>> beat = store_->Heartbeat("daemon-b", absl::Seconds(2));
    ASSERT_TRUE(beat.ok()) << beat.status();
    ASSERT_EQ(beat->size(), 2u);
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
  }
  absl::StatusOr<std::vector<UpdateResult>> reaped = store_->Reap(KeepOwner("daemon-b"), Recover());
  ASSERT_TRUE(reaped.ok()) << reaped.status();
  ASSERT_EQ(reaped->size(), 1u);
  const UpdateResult& r = (*reaped)[0];
  EXPECT_EQ(r.job.name(), "jobs/a1");
  EXPECT_EQ(r.job.state(), v1::Job::QUEUED);
  EXPECT_EQ(r.job.daemon(), "");
  ASSERT_EQ(r.events.size(), 2u);
  EXPECT_EQ(r.events[0].state(), v1::Job::RECOVERING);
  EXPECT_EQ(r.events[1].sequence(), 4);
  EXPECT_TRUE(store_->Heartbeat("daemon-a", absl::Seconds(2))->empty());  // a lost it
  // The reaped job is claimable again, and waited from its reaping.
  absl::StatusOr<std::optional<ClaimResult>> again = store_->Claim(Request("daemon-b"), Start());
  ASSERT_TRUE(again.ok() && again->has_value());
  EXPECT_EQ((*again)->update.job.name(), "jobs/a1");
  EXPECT_EQ((*again)->update.job.attempt(), 2);
  EXPECT_LT((*again)->queued, absl::Seconds(2));
  // A daemon starting under b's id takes b's jobs back whatever their leases; `all` takes every one.
  absl::StatusOr<std::vector<UpdateResult>> dead =
      store_->Reap(ReapRequest{.keep_owner = "", .dead_owners = {"daemon-b"}, .all = false}, Recover());
  ASSERT_TRUE(dead.ok()) << dead.status();
  std::set<std::string> states;
  for (const UpdateResult& u : *dead) states.insert(u.job.name() + "=" + v1::Job::State_Name(u.job.state()));
  EXPECT_EQ(states, (std::set<std::string>{"jobs/a1=QUEUED", "jobs/b1=QUEUED", "jobs/b2=CANCELLED"}));
  ASSERT_TRUE(store_->Claim(Request("daemon-c"), Start())->has_value());
  EXPECT_EQ(store_->Reap(ReapRequest{.keep_owner = "daemon-c", .dead_owners = {}, .all = true}, Recover())->size(), 1u);
  // A job in RUNNING without a lease (not claimed) is reaped at once.
  Add("unleased", v1::Job::RUNNING);
  absl::StatusOr<std::vector<UpdateResult>> unleased = store_->Reap(KeepOwner("daemon-c"), Recover());
  ASSERT_TRUE(unleased.ok());
  ASSERT_EQ(unleased->size(), 1u);
  EXPECT_EQ((*unleased)[0].job.name(), "jobs/unleased");
}

TEST_P(JobStoreTest, TwoStoreObjectsClaimingConcurrentlyNeverTakeTheSameJob) {
  constexpr int kJobs = 40;
  for (int i = 0; i < kJobs; ++i) Add("c" + std::to_string(i), v1::Job::QUEUED, i % 3);
  std::unique_ptr<JobStore> other = OpenAnother();
  ASSERT_NE(other, nullptr);
  absl::Mutex mu;
  std::map<std::string, int> claims;  // job -> times claimed
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    JobStore* store = t % 2 ? other.get() : store_.get();
    threads.emplace_back([&, store, t] {
      for (;;) {
        absl::StatusOr<std::optional<ClaimResult>> c = store->Claim(Request("daemon-" + std::to_string(t)), Start());
        if (!c.ok()) {
          ADD_FAILURE() << c.status();
          ++errors;
          return;
        }
        if (!c->has_value()) return;
        absl::MutexLock lock(&mu);
        ++claims[(*c)->update.job.name()];
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(claims.size(), static_cast<size_t>(kJobs));
  for (const auto& [job, n] : claims) EXPECT_EQ(n, 1) << job;
  for (int i = 0; i < kJobs; ++i) {
    const std::string id = "c" + std::to_string(i);
    const v1::Job j = *store_->Get(id);
    EXPECT_EQ(j.attempt(), 1) << id;
    EXPECT_EQ(j.state(), v1::Job::RUNNING) << id;
    EXPECT_EQ(Events(id).size(), 2u) << id;  // QUEUED, RUNNING: one start
  }
}

TEST_P(JobStoreTest, ConcurrentUpdatesFromTwoStoreObjectsKeepSequencesWithoutGaps) {
  Add("s");
  std::unique_ptr<JobStore> other = OpenAnother();
  ASSERT_NE(other, nullptr);
  constexpr int kPerThread = 25;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    JobStore* store = t % 2 ? other.get() : store_.get();
    threads.emplace_back([store] {
      for (int i = 0; i < kPerThread; ++i) {
        absl::StatusOr<UpdateResult> r = store->Update("s", [](v1::Job* j, std::vector<v1::JobEvent>* events) {
          j->mutable_progress()->set_step(j->progress().step() + 1);
          v1::JobEvent e;
          e.set_type(v1::JobEvent::STEP);
          *e.mutable_progress() = j->progress();
          events->push_back(e);
          return absl::OkStatus();
        });
        ASSERT_TRUE(r.ok()) << r.status();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const std::vector<v1::JobEvent> events = Events("s", other.get());
  ASSERT_EQ(events.size(), static_cast<size_t>(1 + 4 * kPerThread));
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].sequence(), static_cast<int64_t>(i + 1));
    // Read-modify-write under the row lock: each step event saw every earlier one.
    if (i > 0) {
      EXPECT_EQ(events[i].progress().step(), static_cast<int64_t>(i));
    }
  }
  EXPECT_EQ(store_->Get("s")->progress().step(), 4 * kPerThread);
}

TEST_P(JobStoreTest, WaitForChangesReportsWhatOtherStoreObjectsCommitted) {
  std::unique_ptr<JobStore> other = OpenAnother();
  ASSERT_NE(other, nullptr);
  if (!backend_->shared()) {
    // Nobody shares an SQLite store: nothing to hear; the wait is bounded by the timeout.
    const absl::Time start = absl::Now();
    absl::StatusOr<std::vector<JobChange>> none = store_->WaitForChanges(absl::Milliseconds(100));
    ASSERT_TRUE(none.ok());
    EXPECT_TRUE(none->empty());
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
    return;
  }
  // Its own changes are not reported; another store object's are, with the job's new state.
  ASSERT_TRUE(store_->Create(NewJob("mine"), "", {}).ok());
  ASSERT_TRUE(other->Create(NewJob("theirs"), "", {}).ok());
  ASSERT_TRUE(other->Update("theirs", SetStateTo(v1::Job::PAUSED)).ok());
  std::vector<JobChange> seen;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (seen.size() < 2 && absl::Now() < deadline) {
    absl::StatusOr<std::vector<JobChange>> c = store_->WaitForChanges(absl::Seconds(1));
    ASSERT_TRUE(c.ok()) << c.status();
    seen.insert(seen.end(), c->begin(), c->end());
  }
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].job_id, "theirs");
  EXPECT_EQ(seen[0].state, v1::Job::QUEUED);
  EXPECT_EQ(seen[1].state, v1::Job::PAUSED);
  // A waiter wakes when the change arrives, not at its timeout.
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ASSERT_TRUE(other->Delete("theirs", [](const v1::Job&) { return absl::OkStatus(); }).ok());
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<JobChange>> deleted = store_->WaitForChanges(absl::Seconds(20));
  writer.join();
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  ASSERT_EQ(deleted->size(), 1u);
  EXPECT_EQ((*deleted)[0].state, v1::Job::STATE_UNSPECIFIED);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

// The outbox: the messages an event calls for are stored in the event's transaction (none for a
// refused change), claimed by one store object at a time, held for the claim's time, retried
// when an attempt fails, removed when delivered, and kept across a reopen.
TEST_P(JobStoreTest, WebhookMessagesAreStoredWithTheirEventsAndClaimedOnceUntilFinished) {
  const OutboxPolicy policy = [](const v1::Job& job, const v1::JobEvent& e) {
    std::vector<OutboxMessage> out;
    if (e.type() != v1::JobEvent::STATE_CHANGED || e.state() == v1::Job::RUNNING) return out;
    OutboxMessage m;
    m.webhook_id = absl::StrCat("msg_", ParseStoredName(job.name()).id, "_", e.sequence());
    m.job_id = ParseStoredName(job.name()).id;
    m.url = "http://127.0.0.1:1/hook";
    m.secret_file = "/secrets/s";
    m.secret_project = "nlp";
    m.type = absl::StrCat("job.", v1::Job::State_Name(e.state()));
    m.payload = absl::StrCat("{\"sequence\": ", e.sequence(), "}");
    out.push_back(m);
    return out;
  };
  store_->SetOutboxPolicy(policy);
  std::unique_ptr<JobStore> other = OpenAnother();
  ASSERT_NE(other, nullptr);
  other->SetOutboxPolicy(policy);
  Add("w");  // its QUEUED event: one message
  EXPECT_EQ(*store_->PendingWebhooks(), 1);
  // A refused change stores no message.
  EXPECT_FALSE(store_
                   ->Update("w",
                            [](v1::Job* j, std::vector<v1::JobEvent>* events) {
                              events->push_back(StateEvent(v1::Job::FAILED));
                              return absl::FailedPreconditionError("no");
                            })
                   .ok());
  ASSERT_TRUE(store_->Update("w", SetStateTo(v1::Job::RUNNING)).ok());  // the policy asks for none
  ASSERT_TRUE(store_->Update("w", SetStateTo(v1::Job::SUCCEEDED)).ok());
  EXPECT_EQ(*store_->PendingWebhooks(), 2);

  absl::StatusOr<std::vector<OutboxMessage>> claimed = store_->ClaimWebhooks(1, absl::Hours(1));
  ASSERT_TRUE(claimed.ok()) << claimed.status();
  ASSERT_EQ(claimed->size(), 1u);
  const OutboxMessage first = (*claimed)[0];
  EXPECT_EQ(first.webhook_id, "msg_w_1");  // oldest first
  EXPECT_EQ(first.job_id, "w");
  EXPECT_EQ(first.url, "http://127.0.0.1:1/hook");
  EXPECT_EQ(first.secret_file, "/secrets/s");
  EXPECT_EQ(first.secret_project, "nlp");
  EXPECT_EQ(first.type, "job.QUEUED");
  EXPECT_EQ(first.payload, "{\"sequence\": 1}");
  EXPECT_EQ(first.attempts, 0);
  EXPECT_LT(absl::Now() - first.created, absl::Minutes(5));
  // Held: neither this store object nor another takes it again; the other takes the next one.
  absl::StatusOr<std::vector<OutboxMessage>> rest = other->ClaimWebhooks(10, absl::Hours(1));
  ASSERT_TRUE(rest.ok()) << rest.status();
  ASSERT_EQ(rest->size(), 1u);
  EXPECT_EQ((*rest)[0].webhook_id, "msg_w_3");
  EXPECT_TRUE(store_->ClaimWebhooks(10, absl::Hours(1))->empty());

  // A failed attempt: due again after its wait, its attempts and error recorded.
  ASSERT_TRUE(store_->FinishWebhook(first.id, absl::ZeroDuration(), "HTTP 503").ok());
  claimed = store_->ClaimWebhooks(10, absl::Milliseconds(1));
  ASSERT_TRUE(claimed.ok()) << claimed.status();
  ASSERT_EQ(claimed->size(), 1u);
  EXPECT_EQ((*claimed)[0].webhook_id, "msg_w_1");
  EXPECT_EQ((*claimed)[0].attempts, 1);
  EXPECT_EQ((*claimed)[0].last_error, "HTTP 503");
  // A claim whose sender died: due again once its hold has passed.
  absl::SleepFor(absl::Milliseconds(20));
  claimed = other->ClaimWebhooks(10, absl::Hours(1));
  ASSERT_TRUE(claimed.ok()) << claimed.status();
  ASSERT_EQ(claimed->size(), 1u);
  ASSERT_TRUE(other->FinishWebhook(first.id, absl::Hours(1), "HTTP 500").ok());
  EXPECT_TRUE(store_->ClaimWebhooks(10, absl::Hours(1))->empty());  // not due for an hour

  // Delivered: removed; finishing it again is NOT_FOUND.
  ASSERT_TRUE(store_->FinishWebhook((*rest)[0].id, std::nullopt, "").ok());
  EXPECT_EQ(store_->FinishWebhook((*rest)[0].id, std::nullopt, "").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*store_->PendingWebhooks(), 1);
  // Durable: a new store object (a restarted daemon) finds what waits.
  other.reset();
  store_.reset();
  store_ = OpenAnother();
  ASSERT_NE(store_, nullptr);
  EXPECT_EQ(*store_->PendingWebhooks(), 1);
}

// A message given back unattempted (its endpoint busy or backing off): due again after the wait,
// to any store object, its attempts and last error as they were.
TEST_P(JobStoreTest, AReleasedWebhookIsDueAgainWithItsAttemptsUnchanged) {
  store_->SetOutboxPolicy([](const v1::Job& job, const v1::JobEvent&) {
    OutboxMessage m;
    m.webhook_id = "msg_r";
    m.job_id = ParseStoredName(job.name()).id;
    m.url = "http://127.0.0.1:1/hook";
    m.type = "job.queued";
    m.payload = "{}";
    return std::vector<OutboxMessage>{m};
  });
  Add("r");
  absl::StatusOr<std::vector<OutboxMessage>> claimed = store_->ClaimWebhooks(10, absl::Hours(1));
  ASSERT_TRUE(claimed.ok()) << claimed.status();
  ASSERT_EQ(claimed->size(), 1u);
  const int64_t id = (*claimed)[0].id;
  ASSERT_TRUE(store_->FinishWebhook(id, absl::ZeroDuration(), "HTTP 503").ok());
  claimed = store_->ClaimWebhooks(10, absl::Hours(1));
  ASSERT_EQ(claimed->size(), 1u);
  ASSERT_TRUE(store_->ReleaseWebhook(id, absl::Hours(1)).ok());
  std::unique_ptr<JobStore> other = OpenAnother();
  ASSERT_NE(other, nullptr);
  EXPECT_TRUE(other->ClaimWebhooks(10, absl::Hours(1))->empty());  // not due for an hour
  ASSERT_TRUE(store_->ReleaseWebhook(id, absl::ZeroDuration()).ok());
  claimed = other->ClaimWebhooks(10, absl::Hours(1));  // no longer held: due at once
  ASSERT_TRUE(claimed.ok()) << claimed.status();
  ASSERT_EQ(claimed->size(), 1u);
  EXPECT_EQ((*claimed)[0].attempts, 1);
  EXPECT_EQ((*claimed)[0].last_error, "HTTP 503");
  EXPECT_EQ(store_->ReleaseWebhook(id + 1000, absl::ZeroDuration()).code(), absl::StatusCode::kNotFound);
}

INSTANTIATE_TEST_SUITE_P(Backends, JobStoreTest, ::testing::Values("sqlite", "postgres"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

// A file made before the queue columns existed opens, gains them, and its queued jobs are
// claimable in priority order.
TEST(SqliteJobStoreTest, MigratesAFileWithoutTheQueueColumns) {
  const fs::path path = fs::temp_directory_path() / ("oomb_store_migrate_" + std::to_string(::getpid()) + ".db");
  fs::remove(path);
  {
    SQLite::Database db(path.string(), SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    db.exec(
        "CREATE TABLE jobs (position INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, state INTEGER NOT "
        "NULL, last_sequence INTEGER NOT NULL DEFAULT 0, job BLOB NOT NULL)");
    for (const auto& [id, priority] : std::vector<std::pair<std::string, int>>{{"old-low", 0}, {"old-high", 3}}) {
      const std::string blob = NewJob(id, v1::Job::QUEUED, priority).SerializeAsString();
      SQLite::Statement ins(db, "INSERT INTO jobs (id, state, job) VALUES (?, ?, ?)");
      ins.bind(1, id);
      ins.bind(2, static_cast<int>(v1::Job::QUEUED));
      ins.bind(3, blob.data(), static_cast<int>(blob.size()));
      ins.exec();
    }
  }
  absl::StatusOr<std::unique_ptr<JobStore>> store = OpenSqliteJobStore(path.string());
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(*(*store)->QueuePosition("old-high"), 1);
  absl::StatusOr<std::optional<ClaimResult>> c = (*store)->Claim(Request("d"), Start());
  ASSERT_TRUE(c.ok() && c->has_value()) << c.status();
  EXPECT_EQ((*c)->update.job.name(), "jobs/old-high");
  store->reset();
  fs::remove(path);
}

// A database an oombd of schema version 1 made (before projects: no jobs.project column, no
// device_usage or datasets tables) opens as version 2: each job's project is read from its stored
// name, so lists by project find it and it is claimable; a second open changes nothing.
TEST(PostgresJobStoreTest, MigratesASchemaVersion1Database) {
  if (oomb::testing::PostgresServer::BinDir().empty()) GTEST_SKIP() << "PostgreSQL is not installed";
  const fs::path dir = fs::temp_directory_path() / ("oomb_store_pg_migrate_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::string error;
  std::unique_ptr<oomb::testing::PostgresServer> pg = oomb::testing::PostgresServer::Start(dir, &error);
  ASSERT_NE(pg, nullptr) << error;
  const std::string url = pg->CreateDatabase("version1");
  ASSERT_FALSE(url.empty()) << pg->log();
  {
    pqxx::connection c(url);
    pqxx::work tx(c);
    tx.exec(
        "CREATE TABLE oomb_schema (version INTEGER NOT NULL); INSERT INTO oomb_schema (version) VALUES (1); "
        "CREATE TABLE jobs (position BIGSERIAL PRIMARY KEY, id TEXT NOT NULL UNIQUE, state INTEGER NOT NULL, "
        "priority INTEGER NOT NULL DEFAULT 0, device TEXT NOT NULL DEFAULT '', gpus INTEGER NOT NULL DEFAULT 1, "
        "last_sequence BIGINT NOT NULL DEFAULT 0, owner TEXT, lease_expires TIMESTAMPTZ, queued_at TIMESTAMPTZ, "
        "job BYTEA NOT NULL)");
    for (const auto& [id, name] : std::vector<std::pair<std::string, std::string>>{
             {"old", "jobs/old"}, {"nlp-job", "projects/nlp/jobs/nlp-job"}}) {
      v1::Job j = NewJob(id);
      j.set_name(name);
      tx.exec_params("INSERT INTO jobs (id, state, job) VALUES ($1, $2, $3)", id, static_cast<int>(v1::Job::QUEUED),
                     pqxx::binarystring(j.SerializeAsString()));
    }
    tx.commit();
  }
  for (int open = 0; open < 2; ++open) {
    absl::StatusOr<std::unique_ptr<JobStore>> store = OpenPostgresJobStore(url);
    ASSERT_TRUE(store.ok()) << store.status();
    ListQuery nlp;
    nlp.projects = {"nlp"};
    absl::StatusOr<ListResult> listed = (*store)->List(nlp);
    ASSERT_TRUE(listed.ok()) << listed.status();
    ASSERT_EQ(listed->jobs.size(), 1u);
    EXPECT_EQ(listed->jobs[0].name(), "projects/nlp/jobs/nlp-job");
    ListQuery defaults;
    defaults.projects = {kDefaultProject};
    listed = (*store)->List(defaults);
    ASSERT_TRUE(listed.ok()) << listed.status();
    ASSERT_EQ(listed->jobs.size(), 1u);
    EXPECT_EQ(listed->jobs[0].name(), "jobs/old");
    EXPECT_EQ(*(*store)->QueuePosition("old"), 1);
  }
  {
    pqxx::connection c(url);
    pqxx::work tx(c);
    EXPECT_EQ(tx.exec("SELECT MAX(version) FROM oomb_schema")[0][0].as<int>(), 2);
    EXPECT_EQ(tx.exec("SELECT COUNT(*) FROM jobs WHERE project = ''")[0][0].as<int>(), 0);
  }
  pg.reset();
  fs::remove_all(dir);
}

// An unreachable or malformed PostgreSQL URL is UNAVAILABLE, and its password never appears.
TEST(PostgresJobStoreTest, ConnectionErrorsAreUnavailableAndHideThePassword) {
  for (const std::string url : {"postgresql://oomb:s3cret-pw@127.0.0.1:1/oomb?connect_timeout=2",
                                "host=127.0.0.1 port=1 password=s3cret-pw connect_timeout=2 bogus"}) {
    absl::StatusOr<std::unique_ptr<JobStore>> store = OpenPostgresJobStore(url);
    ASSERT_FALSE(store.ok()) << url;
    EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable) << store.status();
    EXPECT_THAT(std::string(store.status().message()), ::testing::Not(HasSubstr("s3cret-pw")));
    EXPECT_THAT(std::string(store.status().message()), HasSubstr("cannot connect to the PostgreSQL job store"));
  }
}

}  // namespace
}  // namespace oomb::server
