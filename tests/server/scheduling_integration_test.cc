// Issue 53's quotas and preemption through the real daemon, trainer and CLI: a project at its
// device quota waits with the reason `oomb get` shows while another project's job runs, the
// quota raised live lets it in, the per-project gauges of /metrics count it all (on SQLite, and
// on PostgreSQL with two daemons: the quota holds across the fleet); a job preempted by one of
// higher priority finishes its step, checkpoints it, resumes when the device frees, and its
// adapter equals, byte for byte, that of the same job run without interruption.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>

#include "tests/client/daemon_harness.h"
#include "tests/server/http_get.h"
#include "tests/server/postgres_harness.h"

namespace oomb::testing {
namespace {

using ::testing::HasSubstr;

enum class Backend { kSqlite, kPostgres };

// The value of the /metrics sample `series` (its exact text before the value); -1 when absent.
double Sample(const std::string& metrics, const std::string& series) {
  const size_t at = metrics.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(metrics.substr(at + series.size() + 2));
}

class QuotaTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (!fs::exists(TinyLlama() / "config.json")) GTEST_SKIP() << "no test models under " << DataDir();
    tmp_ = std::make_unique<TempDir>();
    WriteFile(dir() / "tokens.csv", "alice-token,alice,1,nlp\nbob-token,bob,2,vision\n");
    Projects(1);
    WriteIdsJsonl(dir() / "ids.jsonl", 4, 100);
    // Long enough to hold a device while the test looks: cancelled at the end.
    WriteFile(dir() / "job.yaml", TinyJobYaml((dir() / "ids.jsonl").string(), 100000, 0));
    std::vector<std::string> extra = {"--set", "auth.tokens_file=" + (dir() / "tokens.csv").string(),
                                      "--set", "tenancy.projects_file=" + (dir() / "projects.yaml").string(),
                                      "--set", "store.heartbeat_seconds=1",
                                      "--set", "store.lease_seconds=5"};
    if (GetParam() == Backend::kPostgres) {
      if (PostgresServer::BinDir().empty()) GTEST_SKIP() << "PostgreSQL is not installed";
      std::string error;
      pg_ = PostgresServer::Start(dir(), &error);
      ASSERT_NE(pg_, nullptr) << error;
      const std::string url = pg_->CreateDatabase("oomb");
      ASSERT_FALSE(url.empty()) << pg_->log();
      WriteFile(dir() / "pg.url", url + "\n");
      extra.insert(extra.end(), {"--set", "store.backend=postgres", "--set",
                                 "store.postgres_url_file=" + (dir() / "pg.url").string()});
      for (const std::string id : {"a", "b"}) {  // one CPU device each
        DaemonOptions o;
        o.extra = extra;
        o.extra.insert(o.extra.end(), {"--set", "store.daemon_id=" + id, "--set", "scheduler.devices=cpu"});
        daemons_.push_back(std::make_unique<Daemon>(dir() / ("data-" + id), o));
      }
    } else {
      DaemonOptions o;
      o.extra = extra;
      o.extra.insert(o.extra.end(), {"--set", "scheduler.devices=cpu,cpu"});
      daemons_.push_back(std::make_unique<Daemon>(dir() / "data", o));
    }
    for (const auto& d : daemons_) ASSERT_GT(d->port(), 0) << d->log();
  }
  void TearDown() override {
    daemons_.clear();
    pg_.reset();
    tmp_.reset();
  }

  void Projects(int nlp_devices) {
    WriteFile(dir() / "projects.yaml", "projects:\n  nlp: {max_running_devices: " + std::to_string(nlp_devices) +
                                           ", max_device_hours_per_day: 1000}\n  vision: {}\n");
  }
  const fs::path& dir() const { return tmp_->path(); }
  Result As(const std::string& user, const std::string& args, size_t which = 0) {
    const Daemon& d = *daemons_[which % daemons_.size()];
    return Shell("OOMB_TOKEN=" + user + "-token " + OombCli() + " --endpoint " + d.tcp_endpoint() + " " + args, dir());
  }
  std::string State(const std::string& user, const std::string& job) {
    const Result r = As(user, "get " + job + " -o json");
    return r.rc == 0 ? json::parse(r.out).value("state", "") : "";
  }

  std::unique_ptr<TempDir> tmp_;
  std::unique_ptr<PostgresServer> pg_;
  std::vector<std::unique_ptr<Daemon>> daemons_;
};

TEST_P(QuotaTest, AProjectAtItsDeviceQuotaWaitsWithAReasonAndStartsWhenTheQuotaIsRaised) {
  const std::string spec = (dir() / "job.yaml").string();
  ASSERT_EQ(As("alice", "submit " + spec + " --job-id n1").rc, 0);
  ASSERT_TRUE(WaitFor([&] { return State("alice", "n1") == "RUNNING"; }, std::chrono::seconds(30)));
  ASSERT_EQ(As("alice", "submit " + spec + " --job-id n2", 1).rc, 0);  // through the other daemon of a fleet
  ASSERT_EQ(As("bob", "submit " + spec + " --job-id v1").rc, 0);
  // vision's job takes the free device; nlp's second job waits, and says why.
  ASSERT_TRUE(WaitFor([&] { return State("bob", "v1") == "RUNNING"; }, std::chrono::seconds(30)));
  std::this_thread::sleep_for(std::chrono::seconds(2));  // heartbeats and claims come and go
  EXPECT_EQ(State("alice", "n2"), "QUEUED");
  const Result get = As("alice", "get n2");
  EXPECT_THAT(get.out, HasSubstr("waiting:     project nlp uses 1/1 devices"));
  EXPECT_EQ(json::parse(As("alice", "get n2 -o json").out).value("waiting_reason", ""), "project nlp uses 1/1 devices");
  // More devices than the project may ever hold: refused at once (a daemon of two devices).
  if (GetParam() == Backend::kSqlite) {
    const Result two = As("alice", "submit " + spec + " --set resources.gpus=2 --set training.batch_sequences=2");
    EXPECT_EQ(two.rc, 1) << two.err;
    EXPECT_THAT(two.err, HasSubstr("RESOURCE_EXHAUSTED: resources.gpus: 2 devices asked for, but project nlp may "
                                   "hold at most 1 at once"));
  }
  // The per-project gauges (the fleet's usage, as every daemon reads it from the store).
  const std::string metrics = HttpGet(daemons_[0]->metrics_port(), "/metrics").body;
  EXPECT_EQ(Sample(metrics, "oomb_project_running_devices{project=\"nlp\"}"), 1);
  EXPECT_EQ(Sample(metrics, "oomb_project_running_devices{project=\"vision\"}"), 1);
  EXPECT_EQ(Sample(metrics, "oomb_project_queued_jobs{project=\"nlp\"}"), 1);
  EXPECT_EQ(Sample(metrics, "oomb_project_quota_running_devices{project=\"nlp\"}"), 1);
  EXPECT_EQ(Sample(metrics, "oomb_project_quota_device_hours{project=\"nlp\"}"), 1000);
  EXPECT_EQ(Sample(metrics, "oomb_project_quota_running_devices{project=\"vision\"}"), -1);
  EXPECT_GT(Sample(metrics, "oomb_project_device_hours{project=\"nlp\"}"), 0);
  // Raised live: n2 starts once bob's job frees a device.
  Projects(2);
  ASSERT_EQ(As("bob", "cancel v1").rc, 0);
  EXPECT_TRUE(WaitFor([&] { return State("alice", "n2") == "RUNNING"; }, std::chrono::seconds(30)))
      << As("alice", "get n2").out;
  for (const std::string job : {"n1", "n2"}) EXPECT_EQ(As("alice", "cancel " + job).rc, 0);
}

INSTANTIATE_TEST_SUITE_P(Stores, QuotaTest, ::testing::Values(Backend::kSqlite, Backend::kPostgres),
                         [](const auto& info) { return info.param == Backend::kSqlite ? "Sqlite" : "Postgres"; });

// The checkpoint a preempted run wrote, and where its steps stood: the step of its pause
// checkpoint is that of its last STEP event before it was requeued (it finished the step).
TEST(PreemptionIntegration, APreemptedJobResumesAndItsAdapterEqualsAnUninterruptedRunsByteForByte) {
  if (!fs::exists(TinyLlama() / "config.json")) GTEST_SKIP() << "no test models under " << DataDir();
  TempDir tmp;
  const fs::path d = tmp.path();
  WriteIdsJsonl(d / "ids.jsonl", 8, 120);
  constexpr int kSteps = 200;
  WriteFile(d / "low.yaml", TinyJobYaml((d / "ids.jsonl").string(), kSteps, 0));
  WriteFile(d / "high.yaml", TinyJobYaml((d / "ids.jsonl").string(), 5, 0));
  DaemonOptions o;
  o.extra = {"--set", "scheduler.devices=cpu",     "--set", "scheduler.preemption_min_run_seconds=0",
             "--set", "store.heartbeat_seconds=1", "--set", "store.lease_seconds=5"};
  Daemon daemon(d / "data", o);
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  const std::string ep = daemon.tcp_endpoint();
  ASSERT_EQ(Oomb(ep, "submit " + (d / "low.yaml").string() + " --job-id low", d).rc, 0);
  ASSERT_TRUE(WaitFor(
      [&] {
        const json j = OombJson(ep, "get low", d);
        return j.value("state", "") == "RUNNING" && std::stoll(j["progress"].value("step", "0")) >= 3;
      },
      std::chrono::seconds(60)));
  const Result high =
      Oomb(ep, "submit " + (d / "high.yaml").string() + " --job-id high --set resources.priority=10 --watch", d);
  EXPECT_EQ(high.rc, 0) << high.out << high.err << daemon.log();
  EXPECT_EQ(Oomb(ep, "watch low", d).rc, 0);
  // The same job again, never interrupted.
  EXPECT_EQ(Oomb(ep, "submit " + (d / "low.yaml").string() + " --job-id twin --watch", d).rc, 0);

  const std::vector<json> events = AllEvents(ep, "low", d);
  int64_t last_step = 0, paused_at = -1, requeued_seq = -1;
  bool preempting = false;
  for (const json& e : events) {
    if (e["type"] == "STEP" && requeued_seq < 0) last_step = std::stoll(e["progress"]["step"].get<std::string>());
    if (e["type"] == "STATE_CHANGED" && e["state"] == "PAUSING") {
      preempting = true;
      EXPECT_THAT(e.value("message", ""), HasSubstr("preempting: projects/default/jobs/high (priority 10)"));
    }
    if (preempting && e["type"] == "CHECKPOINT_SAVED" && paused_at < 0) {
      paused_at = std::stoll(e["checkpoint"]["step"].get<std::string>());
    }
    if (e["type"] == "STATE_CHANGED" && e["state"] == "QUEUED" && preempting && requeued_seq < 0) {
      requeued_seq = Seq(e);
      EXPECT_THAT(e.value("message", ""), HasSubstr("preempted by projects/default/jobs/high"));
    }
  }
  ASSERT_TRUE(preempting) << "low was never preempted";
  EXPECT_EQ(paused_at, last_step) << "the preempted run checkpoints the step it finished";
  EXPECT_LT(paused_at, kSteps);
  const json low = OombJson(ep, "get low", d);
  EXPECT_EQ(low.value("state", ""), "SUCCEEDED");
  EXPECT_EQ(low.value("attempt", 0), 2);
  EXPECT_EQ(low.value("preempted_by", ""), "");
  // The preempted run's result is the uninterrupted run's, byte for byte.
  const std::string a = Slurp(d / "data/jobs/low/checkpoints/final/adapter_model.safetensors");
  const std::string b = Slurp(d / "data/jobs/twin/checkpoints/final/adapter_model.safetensors");
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "the preempted job's adapter differs from the uninterrupted run's";
}

}  // namespace
}  // namespace oomb::testing
