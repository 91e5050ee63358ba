// Fleet mode end to end: two real `oombd serve` processes (ids "a" and "b", one cpu device each)
// sharing a real PostgreSQL on loopback (postgres_harness.h), with the real trainer on the tiny
// test model. Ten jobs submitted to either daemon each run exactly once; a kill -9 of the daemon
// running a job hands the job to the other daemon once its lease (3 s here) expires, and it
// resumes from its checkpoint and succeeds; a SIGTERM hands the running job over at once; a
// cancel or pause through the other daemon stops a run.
// Skips without the test models, or when PostgreSQL is not installed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <set>
#include <thread>

#include "tests/client/daemon_harness.h"
#include "tests/server/postgres_harness.h"

namespace oomb::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kLeaseSeconds = 3;

class FleetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(TinyLlama() / "config.json")) {
      GTEST_SKIP() << "no test models under " << DataDir() << " (run scripts/fetch_test_data.sh)";
    }
    if (PostgresServer::BinDir().empty()) GTEST_SKIP() << "PostgreSQL is not installed";
    tmp_ = std::make_unique<TempDir>();
    std::string error;
    pg_ = PostgresServer::Start(tmp_->path(), &error);
    ASSERT_NE(pg_, nullptr) << error;
    const std::string url = pg_->CreateDatabase("oomb");
    ASSERT_FALSE(url.empty()) << pg_->log();
    WriteFile(dir() / "pg.url", url + "\n");  // a secret by file path, as in production
    for (const std::string id : {"a", "b"}) {
      DaemonOptions o;
      o.extra = {
          "--set", "store.backend=postgres",    "--set", "store.postgres_url_file=" + (dir() / "pg.url").string(),
          "--set", "store.daemon_id=" + id,     "--set", "store.lease_seconds=" + std::to_string(kLeaseSeconds),
          "--set", "store.heartbeat_seconds=1", "--set", "scheduler.devices=cpu"};
      daemons_[id] = std::make_unique<Daemon>(dir() / ("data-" + id), o);
      ASSERT_GT(daemons_[id]->port(), 0) << daemons_[id]->log();
    }
    WriteIdsJsonl(dir() / "ids.jsonl", 8, 120);
  }
  void TearDown() override {
    daemons_.clear();
    pg_.reset();
    tmp_.reset();
  }

  const fs::path& dir() const { return tmp_->path(); }
  Daemon& daemon(const std::string& id) { return *daemons_.at(id); }
  std::string endpoint(const std::string& id) { return daemon(id).tcp_endpoint(); }
  std::string other(const std::string& id) { return id == "a" ? "b" : "a"; }
  std::string logs() { return "--- a:\n" + daemon("a").log() + "\n--- b:\n" + daemon("b").log(); }

  fs::path WriteJob(const std::string& name, int steps, int every_steps) {
    const fs::path p = dir() / (name + ".yaml");
    WriteFile(p, TinyJobYaml((dir() / "ids.jsonl").string(), steps, every_steps));
    return p;
  }

  // The daemon a job is leased to (Job.daemon), once it runs (on `want`, when given), asking
  // daemon `ask`; empty if that does not happen within a minute.
  std::string RunningOn(const std::string& job, const std::string& ask, const std::string& want = "") {
    std::string on;
    WaitFor(
        [&] {
          const json j = OombJson(endpoint(ask), "get " + job, dir());
          on = j.value("state", "") == "RUNNING" ? j.value("daemon", "") : "";
          if (!want.empty() && on != want) on.clear();
          return !on.empty();
        },
        std::chrono::seconds(60), std::chrono::milliseconds(20));
    return on;
  }

  std::unique_ptr<TempDir> tmp_;
  std::unique_ptr<PostgresServer> pg_;
  std::map<std::string, std::unique_ptr<Daemon>> daemons_;
};

std::vector<std::string> States(const std::vector<json>& events) {
  std::vector<std::string> out;
  for (const json& e : events) {
    if (e["type"] == "STATE_CHANGED") out.push_back(e["state"]);
  }
  return out;
}

TEST_F(FleetTest, TenJobsSubmittedToEitherDaemonEachRunExactlyOnce) {
  const fs::path spec = WriteJob("job", 4, 2);
  for (int i = 0; i < 10; ++i) {
    const std::string to = i % 2 ? "b" : "a";
    const json j = OombJson(endpoint(to), "submit " + spec.string() + " --job-id j" + std::to_string(i), dir());
    ASSERT_EQ(j.value("name", ""), "projects/default/jobs/j" + std::to_string(i)) << logs();
  }
  // Every job ends, watched through the daemon it was NOT submitted to: its events reach that
  // daemon's watchers whichever daemon ran it.
  std::map<std::string, int> ran_on;
  for (int i = 0; i < 10; ++i) {
    const std::string job = "j" + std::to_string(i);
    const std::string watcher = i % 2 ? "a" : "b";
    const Result w = Oomb(endpoint(watcher), "watch " + job, dir());
    EXPECT_EQ(w.rc, 0) << job << ": " << w.out << w.err << logs();
    EXPECT_THAT(w.out, HasSubstr("SUCCEEDED")) << job;
  }
  for (int i = 0; i < 10; ++i) {
    const std::string job = "j" + std::to_string(i);
    const json j = OombJson(endpoint("a"), "get " + job, dir());
    EXPECT_EQ(j.value("state", ""), "SUCCEEDED") << job;
    EXPECT_EQ(j.value("attempt", 0), 1) << job;   // exactly one run
    EXPECT_EQ(j.value("daemon", ""), "") << job;  // the lease ended with the run
    const std::vector<json> events = AllEvents(endpoint("b"), job, dir());
    for (size_t k = 0; k < events.size(); ++k) EXPECT_EQ(Seq(events[k]), static_cast<int64_t>(k + 1)) << job;
    EXPECT_EQ(States(events), (std::vector<std::string>{"QUEUED", "RUNNING", "SUCCEEDED"})) << job;
    int steps = 0;
    for (const json& e : events) {
      if (e["type"] == "STEP") ++steps;
      if (e["type"] == "STATE_CHANGED" && e["state"] == "RUNNING") {
        const std::string m = e["message"];
        if (m.find("of a ") != std::string::npos) ++ran_on["a"];
        if (m.find("of b ") != std::string::npos) ++ran_on["b"];
      }
    }
    EXPECT_EQ(steps, 4) << job;  // no step trained twice
  }
  std::cout << "runs: " << ran_on["a"] << " on a, " << ran_on["b"] << " on b" << std::endl;
  EXPECT_EQ(ran_on["a"] + ran_on["b"], 10);
  // Both daemons took work from the one queue.
  EXPECT_GE(ran_on["a"], 1) << logs();
  EXPECT_GE(ran_on["b"], 1) << logs();
  // One queue, one list: each daemon lists all ten.
  EXPECT_EQ(OombJson(endpoint("a"), "list --page-size 100", dir())["jobs"].size(), 10u);
  EXPECT_EQ(OombJson(endpoint("b"), "list --page-size 100", dir())["jobs"].size(), 10u);
}

TEST_F(FleetTest, KillNineOfTheDaemonRunningAJobHandsItToTheOtherAfterTheLease) {
  constexpr int kSteps = 60;
  const fs::path spec = WriteJob("long", kSteps, 1);
  ASSERT_EQ(OombJson(endpoint("a"), "submit " + spec.string() + " --job-id crash", dir()).value("name", ""),
            "projects/default/jobs/crash");
  const std::string victim = RunningOn("crash", "a");
  ASSERT_FALSE(victim.empty()) << logs();
  const std::string survivor = other(victim);

  // Follow the job on the daemon running it; kill -9 that daemon once a client has seen two
  // checkpoints while the job still runs.
  std::chrono::steady_clock::time_point killed_at;
  const std::vector<json> seen = WatchUntilTheSecondCheckpoint(endpoint(victim), "crash", [&] {
    daemon(victim).Kill();
    killed_at = std::chrono::steady_clock::now();
  });
  ASSERT_FALSE(seen.empty()) << "the job ended before the kill; make it longer";
  EXPECT_EQ(daemon(victim).exit_code(), 128 + SIGKILL);

  // The job stays RUNNING on the dead daemon until its lease expires, then the survivor's
  // reaper queues it again and the survivor runs it.
  ASSERT_TRUE(WaitFor(
      [&] {
        const json j = OombJson(endpoint(survivor), "get crash", dir());
        return j.value("state", "") != "RUNNING" || j.value("daemon", "") != victim;
      },
      std::chrono::seconds(30), std::chrono::milliseconds(50)))
      << logs();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  std::cout << "daemon " << victim << " killed; " << survivor << " took the job over after " << waited << " s (lease "
            << kLeaseSeconds << " s, heartbeat 1 s)" << std::endl;
  // The lease was renewed at most one heartbeat (1 s) before the kill.
  EXPECT_GE(waited, kLeaseSeconds - 1.5) << "reaped before the lease expired";
  EXPECT_LE(waited, kLeaseSeconds + 10.0);

  const Result w = Oomb(endpoint(survivor), "watch crash", dir());
  EXPECT_EQ(w.rc, 0) << w.out << w.err << logs();
  const std::vector<json> events = AllEvents(endpoint(survivor), "crash", dir());
  ASSERT_GT(events.size(), seen.size());
  for (size_t i = 0; i < events.size(); ++i) EXPECT_EQ(Seq(events[i]), static_cast<int64_t>(i + 1));
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(events[i], seen[i]) << "event " << i;

  const int64_t last_seen = Seq(seen.back());
  const AfterRestart after = ReadAfterRestart(events, last_seen);
  EXPECT_EQ(after.states, (std::vector<std::string>{"RECOVERING", "QUEUED", "RUNNING", "SUCCEEDED"})) << logs();
  EXPECT_THAT(after.state_messages.at("RECOVERING"), HasSubstr("lease of daemon " + victim + " expired"));
  EXPECT_THAT(after.state_messages.at("RUNNING"), HasSubstr("of " + survivor + " (attempt 2)"));
  EXPECT_GE(after.resumed_at, after.last_checkpoint_before);
  EXPECT_GT(after.resumed_at, 0);
  EXPECT_EQ(after.first_step, after.resumed_at + 1);
  const json final_job = OombJson(endpoint(survivor), "get crash", dir());
  EXPECT_EQ(final_job["state"], "SUCCEEDED");
  EXPECT_EQ(final_job["attempt"], 2);
  EXPECT_EQ(final_job["progress"]["step"], std::to_string(kSteps));

  // The killed daemon restarts under its id: nothing of its is left to recover, and it serves
  // the shared queue again.
  daemon(victim).Start();
  ASSERT_GT(daemon(victim).port(), 0) << daemon(victim).log();
  EXPECT_EQ(OombJson(endpoint(victim), "get crash", dir()).value("state", ""), "SUCCEEDED");
  EXPECT_EQ(AllEvents(endpoint(victim), "crash", dir()).size(), events.size());
}

TEST_F(FleetTest, SigtermHandsTheRunningJobToTheOtherDaemonAtOnce) {
  constexpr int kSteps = 60;
  const fs::path spec = WriteJob("drain", kSteps, 1);
  ASSERT_EQ(OombJson(endpoint("b"), "submit " + spec.string() + " --job-id d", dir()).value("name", ""),
            "projects/default/jobs/d");
  const std::string stopping = RunningOn("d", "b");
  ASSERT_FALSE(stopping.empty()) << logs();
  const std::string taker = other(stopping);
  const auto stop_at = std::chrono::steady_clock::now();
  daemon(stopping).BeginStop();
  // The drain checkpoints the job and queues it: the other daemon claims it at once, not after
  // a lease.
  ASSERT_EQ(RunningOn("d", taker, taker), taker) << logs();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - stop_at).count(), kLeaseSeconds - 1.0);
  EXPECT_EQ(daemon(stopping).WaitExit(), 0) << daemon(stopping).log();
  const Result w = Oomb(endpoint(taker), "watch d", dir());
  EXPECT_EQ(w.rc, 0) << w.out << w.err << logs();
  const std::vector<json> events = AllEvents(endpoint(taker), "d", dir());
  EXPECT_EQ(States(events), (std::vector<std::string>{"QUEUED", "RUNNING", "QUEUED", "RUNNING", "SUCCEEDED"}));
  bool resumed = false;
  for (const json& e : events) {
    resumed |= e["type"] == "WARNING" && e["message"].get<std::string>().find("resumed from ") != std::string::npos;
  }
  EXPECT_TRUE(resumed);
  const json final_job = OombJson(endpoint(taker), "get d", dir());
  EXPECT_EQ(final_job["attempt"], 2);
  EXPECT_EQ(final_job["progress"]["step"], std::to_string(kSteps));
}

TEST_F(FleetTest, CancelAndPauseThroughTheOtherDaemonStopTheRun) {
  const fs::path spec = WriteJob("slow", 100000, 0);
  ASSERT_EQ(OombJson(endpoint("a"), "submit " + spec.string() + " --job-id c", dir()).value("name", ""),
            "projects/default/jobs/c");
  const std::string runner = RunningOn("c", "a");
  ASSERT_FALSE(runner.empty()) << logs();
  // Cancel through the daemon that does not run it: the runner hears it and stops.
  const json cancelling = OombJson(endpoint(other(runner)), "cancel c", dir());
  EXPECT_EQ(cancelling.value("state", ""), "CANCELLING");
  const Result w = Oomb(endpoint(other(runner)), "watch c", dir());
  EXPECT_NE(w.rc, 0);  // watch exits non-zero when the job ends CANCELLED
  EXPECT_THAT(w.out, HasSubstr("CANCELLED")) << w.err << logs();
  EXPECT_EQ(OombJson(endpoint(runner), "get c", dir()).value("state", ""), "CANCELLED");

  // Pause through the other daemon, resume, and cancel the resumed run.
  ASSERT_EQ(OombJson(endpoint("b"), "submit " + spec.string() + " --job-id p", dir()).value("name", ""),
            "projects/default/jobs/p");
  const std::string p_runner = RunningOn("p", "b");
  ASSERT_FALSE(p_runner.empty()) << logs();
  EXPECT_EQ(OombJson(endpoint(other(p_runner)), "pause p", dir()).value("state", ""), "PAUSING");
  EXPECT_TRUE(WaitFor([&] { return OombJson(endpoint("a"), "get p", dir()).value("state", "") == "PAUSED"; },
                      std::chrono::seconds(30)))
      << logs();
  EXPECT_EQ(OombJson(endpoint(other(p_runner)), "resume p", dir()).value("state", ""), "QUEUED");
  EXPECT_FALSE(RunningOn("p", "a").empty()) << logs();
  EXPECT_EQ(OombJson(endpoint("a"), "get p", dir()).value("attempt", 0), 2);
  EXPECT_EQ(OombJson(endpoint("a"), "cancel p", dir()).value("state", ""), "CANCELLING");
  EXPECT_TRUE(WaitFor([&] { return OombJson(endpoint("b"), "get p", dir()).value("state", "") == "CANCELLED"; },
                      std::chrono::seconds(30)))
      << logs();
}

}  // namespace
}  // namespace oomb::testing
