// Integration tests of `oombd serve` with the real trainer on the tiny test model: a crash
// (kill -9) in the middle of a job and the restart on the same data dir; a clean shutdown
// (SIGTERM) that checkpoints the running job and exits in bounded time; bad datasets refused
// at CreateJob naming the line (or, when found only while the job runs, carried in
// JobError.message) while the daemon keeps serving; TLS and mTLS with generated certificates.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <thread>

#include "tests/client/daemon_harness.h"

namespace oomb::testing {
namespace {

using ::testing::HasSubstr;

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(TinyLlama() / "config.json")) {
      GTEST_SKIP() << "no test models under " << DataDir() << " (run scripts/fetch_test_data.sh)";
    }
    tmp_ = std::make_unique<TempDir>();
    daemon_ = std::make_unique<Daemon>(tmp_->path() / "data", DaemonOptions());
    ASSERT_GT(daemon_->port(), 0) << daemon_->log();
  }
  void TearDown() override {
    daemon_.reset();
    tmp_.reset();
  }

  std::string endpoint() const { return daemon_->tcp_endpoint(); }
  const fs::path& dir() const { return tmp_->path(); }

  fs::path WriteJob(const std::string& name, const std::string& yaml) {
    const fs::path p = dir() / (name + ".yaml");
    WriteFile(p, yaml);
    return p;
  }

  std::unique_ptr<TempDir> tmp_;
  std::unique_ptr<Daemon> daemon_;
};

// Steps of the STEP events (in order) and the losses by step.
std::map<int64_t, double> LossesByStep(const std::vector<json>& events) {
  std::map<int64_t, double> losses;
  for (const json& e : events) {
    if (e["type"] == "STEP") {
      losses[std::stoll(e["progress"]["step"].get<std::string>())] = e["progress"]["loss"].get<double>();
    }
  }
  return losses;
}

TEST_F(DaemonTest, KillNineMidJobThenRestartResumesFromTheLastCheckpoint) {
  constexpr int kSteps = 60;
  WriteIdsJsonl(dir() / "ids.jsonl", 8, 120);
  const fs::path spec = WriteJob("job", TinyJobYaml((dir() / "ids.jsonl").string(), kSteps));
  const std::string job = OombJson(endpoint(), "submit " + spec.string() + " --job-id crash", dir()).value("name", "");
  ASSERT_EQ(job, "projects/default/jobs/crash");
  // A second job queued behind it must survive the crash too.
  const json queued = OombJson(endpoint(), "submit " + spec.string() + " --job-id after-crash", dir());
  ASSERT_EQ(queued.value("state", ""), "QUEUED");

  // kill -9 the daemon once a client has seen two checkpoints while the job still runs.
  const std::vector<json> seen = WatchUntilTheSecondCheckpoint(endpoint(), "crash", [&] { daemon_->Kill(); });
  ASSERT_FALSE(seen.empty()) << "the job ended before the kill; make it longer";
  const int64_t last_seen = Seq(seen.back());

  daemon_->Start();
  ASSERT_GT(daemon_->port(), 0) << daemon_->log();
  // Recovered jobs: the crashed one resumes, the queued one is still there.
  const Result w = Oomb(endpoint(), "watch crash", dir());
  EXPECT_EQ(w.rc, 0) << w.out << w.err << daemon_->log();
  const std::vector<json> events = AllEvents(endpoint(), "crash", dir());
  ASSERT_GT(events.size(), seen.size());
  for (size_t i = 0; i < events.size(); ++i) EXPECT_EQ(Seq(events[i]), static_cast<int64_t>(i + 1));
  // No acknowledged event is lost or renumbered: the store's first events are those seen.
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(events[i], seen[i]) << "event " << i;

  // After the kill: RECOVERING -> QUEUED -> RUNNING, a resume from the newest checkpoint, and
  // steps continuing right after it up to the end.
  const AfterRestart after = ReadAfterRestart(events, last_seen);
  const std::vector<std::string>& states_after = after.states;
  EXPECT_THAT(states_after, ::testing::IsSupersetOf({"RECOVERING", "QUEUED", "RUNNING", "SUCCEEDED"}));
  ASSERT_GE(states_after.size(), 4u);
  EXPECT_EQ(std::vector<std::string>(states_after.begin(), states_after.begin() + 3),
            (std::vector<std::string>{"RECOVERING", "QUEUED", "RUNNING"}));
  EXPECT_EQ(states_after.back(), "SUCCEEDED");
  // The newest durable checkpoint: at least the last one a client saw, and ahead of step 1.
  EXPECT_GE(after.resumed_at, after.last_checkpoint_before);
  EXPECT_EQ(after.first_step, after.resumed_at + 1);
  const json final_job = OombJson(endpoint(), "get crash", dir());
  EXPECT_EQ(final_job["state"], "SUCCEEDED");
  EXPECT_EQ(final_job["attempt"], 2);
  EXPECT_EQ(final_job["progress"]["step"], std::to_string(kSteps));
  const json cps = OombJson(endpoint(), "checkpoints crash", dir());
  ASSERT_TRUE(cps.contains("checkpoints"));
  EXPECT_EQ(cps["checkpoints"].back().value("final", false), true);
  // 60 checkpoints were saved, keep_last 2 kept the newest: only what is on disk is listed.
  EXPECT_LE(cps["checkpoints"].size(), 3u);
  for (const json& c : cps["checkpoints"]) EXPECT_TRUE(fs::is_directory(c.value("path", ""))) << c.dump();

  // The resumed run computes what an uninterrupted one does: the queued twin ran start to
  // finish with the same spec after the restart.
  EXPECT_EQ(Oomb(endpoint(), "watch after-crash", dir()).rc, 0);
  const auto resumed = LossesByStep(events);
  const auto uninterrupted = LossesByStep(AllEvents(endpoint(), "after-crash", dir()));
  ASSERT_EQ(uninterrupted.size(), static_cast<size_t>(kSteps));
  for (const auto& [step, loss] : resumed) {
    ASSERT_TRUE(uninterrupted.count(step));
    EXPECT_NEAR(loss, uninterrupted.at(step), 1e-5 * std::max(1.0, std::abs(loss))) << "step " << step;
  }
}

TEST_F(DaemonTest, BadDatasetsAreInvalidArgumentNamingTheLineAndTheDaemonKeepsServing) {
  WriteIdsJsonl(dir() / "good.jsonl", 2, 50);
  const std::string good = Slurp(dir() / "good.jsonl");
  struct Case {
    std::string name;
    std::string content;  // empty with missing: the file does not exist
    bool missing = false;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"missing", "", true, "data.train: " + (dir() / "missing.jsonl").string() + ": No such file"},
      {"json", good + "{\"input_ids\": [5, 6,\n", false, "bad_json.jsonl:3: invalid JSON"},
      {"empty", "", false, "empty.jsonl: no samples"},
      {"utf8", good + "{\"input_ids\": [5, 6], \"note\": \"caf\xC3\x28\"}\n", false,
       "bad_utf8.jsonl:3: invalid UTF-8 at byte"},
      {"too_long", good + json{{"input_ids", std::vector<int>(200, 7)}}.dump() + "\n", false,
       "bad_too_long.jsonl:3: sample of 200 tokens is longer than data.max_seq_len (128)"},
      {"vocab", good + "{\"input_ids\": [5, 256]}\n", false, "bad_vocab.jsonl:3: input_ids[1] = 256"},
      {"text_without_tokenizer", good + "{\"text\": \"hello\"}\n", false,
       "bad_text_without_tokenizer.jsonl:3: this sample needs the model's tokenizer"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const fs::path data = c.missing           ? dir() / "missing.jsonl"
                          : c.name == "empty" ? dir() / "empty.jsonl"
                                              : dir() / ("bad_" + c.name + ".jsonl");
    if (!c.missing) WriteFile(data, c.content);
    const fs::path spec = WriteJob(c.name, TinyJobYaml(data.string(), 1, 1, "error"));
    const Result r = Oomb(endpoint(), "submit " + spec.string(), dir());
    EXPECT_EQ(r.rc, 1) << r.out;
    EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT: spec: data.train: "));
    EXPECT_THAT(r.err, HasSubstr(c.expected));
    // --validate-only answers the same.
    const Result v = Oomb(endpoint(), "submit --validate-only " + spec.string(), dir());
    EXPECT_EQ(v.rc, 1);
    EXPECT_THAT(v.err, HasSubstr(c.expected));
  }
  // Nothing was created, and the daemon serves and trains.
  EXPECT_EQ(OombJson(endpoint(), "list", dir()).count("jobs"), 0u);
  EXPECT_EQ(Oomb(endpoint(), "health", dir()).out, "SERVING\n");
  const fs::path spec = WriteJob("good", TinyJobYaml((dir() / "good.jsonl").string(), 2));
  const Result ok = Oomb(endpoint(), "submit " + spec.string() + " --watch", dir());
  EXPECT_EQ(ok.rc, 0) << ok.out << ok.err << daemon_->log();
  EXPECT_THAT(ok.out, HasSubstr("state SUCCEEDED"));
}

TEST_F(DaemonTest, TextTooLongWithTheRealTokenizerIsRefusedAtCreate) {
  if (!fs::exists(SmolLm2() / "tokenizer.json")) GTEST_SKIP() << "no SmolLM2 under " << DataDir();
  std::string words;
  for (int i = 0; i < 300; ++i) words += " word";
  WriteFile(dir() / "text.jsonl", json{{"text", "short"}}.dump() + "\n" + json{{"text", words}}.dump() + "\n");
  WriteFile(dir() / "job.yaml", "model: {path: " + SmolLm2().string() +
                                    "}\ndata: {train: " + (dir() / "text.jsonl").string() +
                                    ", max_seq_len: 256, too_long: error}\nresources: {device: cpu}\n");
  const Result r = Oomb(endpoint(), "submit " + (dir() / "job.yaml").string(), dir());
  EXPECT_EQ(r.rc, 1);
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT: spec: data.train: " + (dir() / "text.jsonl").string() +
                               ":2: sample of 300 tokens is longer than data.max_seq_len (256)"));
}

// A dataset that goes bad after CreateJob checked it (here: rewritten while the job waits in
// the queue) fails the job when it runs, with the line in JobError.message; the daemon goes on.
TEST_F(DaemonTest, DataFoundBadWhileRunningFailsTheJobNamingTheLine) {
  WriteIdsJsonl(dir() / "ids.jsonl", 4, 100);
  WriteIdsJsonl(dir() / "later.jsonl", 2, 50);
  const fs::path blocker = WriteJob("blocker", TinyJobYaml((dir() / "ids.jsonl").string(), 100000));
  const fs::path later = WriteJob("later", TinyJobYaml((dir() / "later.jsonl").string(), 1));
  ASSERT_EQ(OombJson(endpoint(), "submit " + blocker.string() + " --job-id blocker", dir()).value("name", ""),
            "projects/default/jobs/blocker");
  ASSERT_EQ(OombJson(endpoint(), "submit " + later.string() + " --job-id later", dir()).value("state", ""), "QUEUED");
  WriteFile(dir() / "later.jsonl", Slurp(dir() / "later.jsonl") + "not json\n");
  EXPECT_EQ(OombJson(endpoint(), "cancel blocker", dir()).value("state", ""), "CANCELLING");
  const Result w = Oomb(endpoint(), "watch later", dir());
  EXPECT_EQ(w.rc, 6) << w.out << w.err;  // the watched job FAILED
  EXPECT_THAT(w.err, HasSubstr("later.jsonl:3: invalid JSON"));
  const json job = OombJson(endpoint(), "get later", dir());
  EXPECT_EQ(job["state"], "FAILED");
  EXPECT_EQ(job["error"]["code"], "INVALID_ARGUMENT");
  EXPECT_THAT(job["error"]["message"].get<std::string>(),
              HasSubstr("data.train: " + (dir() / "later.jsonl").string() + ":3: invalid JSON"));
  EXPECT_EQ(OombJson(endpoint(), "get blocker", dir()).value("state", ""), "CANCELLED");
  EXPECT_EQ(Oomb(endpoint(), "health", dir()).out, "SERVING\n");
}

// Watchers that stop reading (their HTTP/2 window full) do not hold back the job, and catch up
// from the store without gaps afterwards (tests/python/grpc_slow_watcher.py).
TEST_F(DaemonTest, StalledWatchersDoNotHoldBackTraining) {
  if (!fs::exists(VenvPython())) GTEST_SKIP() << "no Python venv at " << VenvPython() << " (scripts/setup.sh)";
  WriteIdsJsonl(dir() / "ids.jsonl", 8, 100);
  const json spec = {{"model", {{"path", TinyLlama().string()}, {"dtype", "float32"}}},
                     {"method", {{"type", "lora"}, {"lora", {{"rank", 4}, {"alpha", 8}}}}},
                     {"data", {{"train", (dir() / "ids.jsonl").string()}, {"max_seq_len", 128}, {"packing", false}}},
                     {"training", {{"max_steps", 300}, {"learning_rate", 1e-3}}},
                     {"memory", {{"chunk_tokens", 32}, {"page_tokens", 16}}},
                     {"checkpoint", {{"every_steps", 0}}},
                     {"resources", {{"device", "cpu"}}}};
  WriteFile(dir() / "spec.json", spec.dump());
  const Result r = Shell(VenvPython().string() + " " + SourceDir() + "/tests/python/grpc_slow_watcher.py --endpoint " +
                             endpoint() + " --spec-json " + (dir() / "spec.json").string(),
                         dir());
  if (r.rc == 77) GTEST_SKIP() << r.out << r.err;
  EXPECT_EQ(r.rc, 0) << r.out << r.err << daemon_->log();
  EXPECT_THAT(r.out, HasSubstr("caught up"));
  std::cout << r.out;
}

TEST_F(DaemonTest, TwentyKillNinesAtRandomPointsLoseNothingAndDuplicateNothing) {
  // kill -9 at seeded random moments of a job's life (during steps, checkpoint writes, state
  // transitions, the restart's recovery), 20 times; then let it finish. Each kill waits for
  // 1-15 more steps and then a random 0-200 ms (every fifth comes 0-300 ms after the restart,
  // during recovery), so the job outlives the kills at any machine speed.
  constexpr int kSteps = 800, kBehindSteps = 100, kKills = 20;
  WriteIdsJsonl(dir() / "ids.jsonl", 8, 120);
  const fs::path spec = WriteJob("job", TinyJobYaml((dir() / "ids.jsonl").string(), kSteps, /*every_steps=*/10));
  const fs::path behind =
      WriteJob("behind", TinyJobYaml((dir() / "ids.jsonl").string(), kBehindSteps, /*every_steps=*/10));
  ASSERT_EQ(OombJson(endpoint(), "submit " + spec.string() + " --job-id loop", dir()).value("name", ""),
            "projects/default/jobs/loop");
  ASSERT_EQ(OombJson(endpoint(), "submit " + behind.string() + " --job-id behind", dir()).value("name", ""),
            "projects/default/jobs/behind");
  std::mt19937 rng(20261121);
  const auto step_of = [&] {
    const json j = OombJson(endpoint(), "get loop", dir());
    return j.contains("progress") ? std::stoll(j["progress"].value("step", "0")) : int64_t{0};
  };
  for (int k = 0; k < kKills; ++k) {
    if (rng() % 5 == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 300));
    } else {
      const int64_t target = step_of() + 1 + static_cast<int64_t>(rng() % 15);
      ASSERT_TRUE(WaitFor([&] { return step_of() >= target; }, std::chrono::seconds(60))) << "kill " << k;
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 200));
    }
    daemon_->Kill();
    daemon_->Start();
    ASSERT_GT(daemon_->port(), 0) << "restart " << k << ": " << daemon_->log();
  }
  const json before_end = OombJson(endpoint(), "get loop", dir());
  EXPECT_NE(before_end["state"], "SUCCEEDED") << "the job ended before the last kill; make it longer";
  EXPECT_EQ(Oomb(endpoint(), "watch loop", dir()).rc, 0) << daemon_->log();
  EXPECT_EQ(Oomb(endpoint(), "watch behind", dir()).rc, 0) << daemon_->log();

  // Nothing lost or duplicated: the two jobs, each SUCCEEDED exactly once, every step done.
  const json list = OombJson(endpoint(), "list", dir());
  ASSERT_EQ(list["jobs"].size(), 2u);
  for (const char* id : {"loop", "behind"}) {
    const std::vector<json> events = AllEvents(endpoint(), id, dir());
    for (size_t i = 0; i < events.size(); ++i) EXPECT_EQ(Seq(events[i]), static_cast<int64_t>(i + 1)) << id;
    int succeeded = 0, recoveries = 0, step_events = 0;
    std::map<int64_t, double> first_loss;
    for (const json& e : events) {
      if (e["type"] == "STATE_CHANGED" && e["state"] == "SUCCEEDED") ++succeeded;
      if (e["type"] == "STATE_CHANGED" && e["state"] == "RECOVERING") ++recoveries;
      if (e["type"] != "STEP") continue;
      ++step_events;
      // A step redone after a kill (it ran after the newest checkpoint) computes the same loss.
      const int64_t step = std::stoll(e["progress"]["step"].get<std::string>());
      const double loss = e["progress"]["loss"].get<double>();
      auto [it, fresh] = first_loss.emplace(step, loss);
      if (!fresh) {
        EXPECT_NEAR(loss, it->second, 1e-6 * std::max(1.0, std::abs(loss))) << id << " step " << step;
      }
    }
    EXPECT_EQ(succeeded, 1) << id;
    const int64_t steps = std::string(id) == "loop" ? kSteps : kBehindSteps;
    EXPECT_EQ(first_loss.size(), static_cast<size_t>(steps)) << id;
    // The figures the kill-loop runs in bench/results record.
    std::cout << "kill-loop: job " << id << ": " << events.size() << " events, " << recoveries
              << " recoveries (RUNNING at a kill), " << step_events << " STEP events for " << steps << " steps ("
              << step_events - steps << " redone after kills, all with equal losses), SUCCEEDED " << succeeded
              << " time(s)\n";
    EXPECT_EQ(OombJson(endpoint(), "get " + std::string(id), dir())["progress"]["step"], std::to_string(steps));
  }
  // The store is intact.
  daemon_->Stop();
  const Result check = Shell(
      "python3 -c \"import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute("
      "'PRAGMA integrity_check').fetchone()[0])\" " +
          (daemon_->data_dir() / "oombd.db").string(),
      dir());
  EXPECT_EQ(check.out, "ok\n") << check.err;
}

TEST_F(DaemonTest, SigtermCheckpointsTheRunningJobExitsCleanlyAndTheJobResumesAfterRestart) {
  constexpr int kSteps = 400;
  WriteIdsJsonl(dir() / "ids.jsonl", 8, 120);
  // Only a final checkpoint of its own: any other checkpoint is the shutdown's.
  const fs::path spec = WriteJob("job", TinyJobYaml((dir() / "ids.jsonl").string(), kSteps, /*every_steps=*/0));
  ASSERT_EQ(OombJson(endpoint(), "submit " + spec.string() + " --job-id drain", dir()).value("name", ""),
            "projects/default/jobs/drain");
  ASSERT_TRUE(WaitFor(
      [&] {
        const json j = OombJson(endpoint(), "get drain", dir());
        return j.contains("progress") && std::stoll(j["progress"].value("step", "0")) >= 3;
      },
      std::chrono::seconds(60)));

  const auto t0 = std::chrono::steady_clock::now();
  daemon_->Stop();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(daemon_->exit_code(), 0) << daemon_->log();
  EXPECT_LT(seconds, 30.0) << "shutdown_grace_seconds is 60 but a tiny job checkpoints in well under a second";

  daemon_->Start();
  ASSERT_GT(daemon_->port(), 0) << daemon_->log();
  EXPECT_EQ(Oomb(endpoint(), "watch drain", dir()).rc, 0);
  const std::vector<json> events = AllEvents(endpoint(), "drain", dir());
  int64_t drain_checkpoint = -1, resumed_at = -1, queued_for_shutdown = -1;
  std::vector<std::string> states;
  for (const json& e : events) {
    if (e["type"] == "STATE_CHANGED") states.push_back(e["state"]);
    if (e["type"] == "CHECKPOINT_SAVED" && !e["checkpoint"].value("final", false)) {
      drain_checkpoint = std::stoll(e["checkpoint"]["step"].get<std::string>());
    }
    if (e["type"] == "STATE_CHANGED" && e["state"] == "QUEUED" &&
        e["message"].get<std::string>().find("server shutdown") != std::string::npos) {
      queued_for_shutdown = Seq(e);
    }
    if (e["type"] == "WARNING" && e["message"].get<std::string>().find("resumed from ") != std::string::npos) {
      const std::string m = e["message"];
      resumed_at = std::stoll(m.substr(m.rfind("at step ") + 8));
    }
  }
  // RUNNING -> (checkpoint) -> QUEUED at shutdown, then RUNNING again from that checkpoint.
  EXPECT_GE(drain_checkpoint, 3);
  EXPECT_GT(queued_for_shutdown, 0);
  EXPECT_EQ(resumed_at, drain_checkpoint);
  EXPECT_EQ(states, (std::vector<std::string>{"QUEUED", "RUNNING", "QUEUED", "RUNNING", "SUCCEEDED"}));
  EXPECT_EQ(OombJson(endpoint(), "get drain", dir())["progress"]["step"], std::to_string(kSteps));
}

// `yaml` with its top-level `key:` line replaced by `line`.
std::string WithLine(const std::string& yaml, const std::string& key, const std::string& line) {
  const size_t at = yaml.find(key + ":");
  return yaml.substr(0, at) + line + "\n" + yaml.substr(yaml.find('\n', at) + 1);
}

// A job's own out-of-memory error (a failpoint throws the c10::OutOfMemoryError an exhausted
// allocator throws) fails that job with RESOURCE_EXHAUSTED; the daemon keeps serving and the
// next job succeeds.
TEST(DaemonFaultTest, AnOutOfMemoryErrorFailsOnlyThatJob) {
  if (!fs::exists(TinyLlama() / "config.json")) GTEST_SKIP() << "no test models under " << DataDir();
  TempDir tmp;
  DaemonOptions o;
  o.env = {"OOMB_FAILPOINTS=1"};
  Daemon daemon(tmp.path() / "data", o);
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  const std::string ep = daemon.tcp_endpoint();
  WriteIdsJsonl(tmp.path() / "ids.jsonl", 4, 100);
  WriteFile(tmp.path() / "oom.yaml", WithLine(TinyJobYaml((tmp.path() / "ids.jsonl").string(), 6), "labels",
                                              "labels: {failpoint: oom-at-step-3}"));
  WriteFile(tmp.path() / "ok.yaml", TinyJobYaml((tmp.path() / "ids.jsonl").string(), 6));
  ASSERT_EQ(OombJson(ep, "submit " + (tmp.path() / "oom.yaml").string() + " --job-id oom", tmp.path())["name"],
            "projects/default/jobs/oom");
  EXPECT_EQ(Oomb(ep, "watch oom", tmp.path()).rc, 6);  // FAILED
  const json failed = OombJson(ep, "get oom", tmp.path());
  EXPECT_EQ(failed["error"]["code"], "RESOURCE_EXHAUSTED");
  EXPECT_EQ(failed["error"]["reason"], "OUT_OF_MEMORY");
  EXPECT_THAT(failed["error"]["message"].get<std::string>(), HasSubstr("oom-at-step-3"));
  EXPECT_EQ(failed["progress"]["step"], "2");
  ASSERT_EQ(OombJson(ep, "submit " + (tmp.path() / "ok.yaml").string() + " --job-id ok", tmp.path())["name"],
            "projects/default/jobs/ok");
  EXPECT_EQ(Oomb(ep, "watch ok", tmp.path()).rc, 0) << daemon.log();
  EXPECT_EQ(Oomb(ep, "health", tmp.path()).rc, 0);
}

// A full disk under the checkpoint directory (a 256 KiB tmpfs mounted in the daemon's own mount
// namespace) fails the job with RESOURCE_EXHAUSTED naming the path and the system's reason; the
// daemon keeps serving and a job checkpointing elsewhere succeeds.
TEST(DaemonFaultTest, AFullDiskFailsTheJobWithAClearReasonAndTheDaemonKeepsServing) {
  if (!fs::exists(TinyLlama() / "config.json")) GTEST_SKIP() << "no test models under " << DataDir();
  TempDir tmp;
  const fs::path full = tmp.path() / "full";
  fs::create_directories(full);
  if (Shell("unshare -Urm sh -c 'mount -t tmpfs -o size=256k tmpfs " + full.string() + "'", tmp.path()).rc != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs in a user and mount namespace here (unshare -Urm)";
  }
  DaemonOptions o;
  o.prefix = {"/usr/bin/unshare", "-Urm", "sh", "-c",
              "mount -t tmpfs -o size=256k tmpfs " + full.string() + " && exec \"$0\" \"$@\""};
  Daemon daemon(tmp.path() / "data", o);
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  const std::string ep = daemon.tcp_endpoint();
  WriteIdsJsonl(tmp.path() / "ids.jsonl", 4, 100);
  // Full fine-tuning of the tiny model: its checkpoint (weights and optimizer) is ~1.3 MB.
  const std::string yaml = WithLine(TinyJobYaml((tmp.path() / "ids.jsonl").string(), 4, /*every_steps=*/2), "method",
                                    "method: {type: full}");
  WriteFile(tmp.path() / "full.yaml",
            WithLine(yaml, "checkpoint", "checkpoint: {every_steps: 2, dir: " + (full / "ckpt").string() + "}"));
  WriteFile(tmp.path() / "ok.yaml", yaml);
  ASSERT_EQ(OombJson(ep, "submit " + (tmp.path() / "full.yaml").string() + " --job-id disk", tmp.path())["name"],
            "projects/default/jobs/disk");
  EXPECT_EQ(Oomb(ep, "watch disk", tmp.path()).rc, 6);
  const json failed = OombJson(ep, "get disk", tmp.path());
  EXPECT_EQ(failed["error"]["code"], "RESOURCE_EXHAUSTED") << failed.dump();
  EXPECT_EQ(failed["error"]["reason"], "DISK_FULL");
  EXPECT_THAT(failed["error"]["message"].get<std::string>(), HasSubstr("No space left on device"));
  EXPECT_THAT(failed["error"]["message"].get<std::string>(), HasSubstr((full / "ckpt").string()));
  ASSERT_EQ(OombJson(ep, "submit " + (tmp.path() / "ok.yaml").string() + " --job-id fine", tmp.path())["name"],
            "projects/default/jobs/fine");
  EXPECT_EQ(Oomb(ep, "watch fine", tmp.path()).rc, 0) << daemon.log();
}

// Malformed and oversized gRPC messages and absurd values (tests/python/grpc_bad_messages.py),
// and the permissions of what the daemon creates: its data dir 0700, its Unix socket 0600.
TEST(DaemonBadInput, MalformedAndOversizedMessagesAndRestrictivePermissions) {
  if (!fs::exists(TinyLlama() / "config.json")) GTEST_SKIP() << "no test models under " << DataDir();
  if (!fs::exists(VenvPython())) GTEST_SKIP() << "no Python venv at " << VenvPython() << " (scripts/setup.sh)";
  TempDir tmp;
  DaemonOptions o;
  o.unix_socket = true;
  o.extra = {"--set", "scheduler.hold=true"};
  Daemon daemon(tmp.path() / "data", o);
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  const auto mode = [](const fs::path& p) { return fs::status(p).permissions() & fs::perms::all; };
  EXPECT_EQ(mode(daemon.data_dir()), fs::perms::owner_all);
  EXPECT_EQ(mode(daemon.data_dir() / "oombd.sock"), fs::perms::owner_read | fs::perms::owner_write);
  WriteIdsJsonl(tmp.path() / "ids.jsonl", 1, 50);
  const Result r = Shell(VenvPython().string() + " " + SourceDir() + "/tests/python/grpc_bad_messages.py --endpoint " +
                             daemon.tcp_endpoint() + " --model " + TinyLlama().string() + " --train " +
                             (tmp.path() / "ids.jsonl").string(),
                         tmp.path());
  if (r.rc == 77) GTEST_SKIP() << r.out << r.err;
  EXPECT_EQ(r.rc, 0) << r.out << r.err << daemon.log();
  EXPECT_THAT(r.out, HasSubstr("grpc_bad_messages: ok"));
  EXPECT_TRUE(daemon.Alive());
}

// While the daemon drains after SIGTERM (here: the validator finishing the scan of an ~80 MB text
// dataset), its health is NOT_SERVING and new jobs are refused with UNAVAILABLE; it then exits
// cleanly, and the job, still VALIDATING, is scanned again after the restart.
TEST(DaemonDrainTest, DrainingDaemonIsNotServingAndRefusesNewJobs) {
  if (!fs::exists(SmolLm2() / "tokenizer.json")) GTEST_SKIP() << "no SmolLM2 under " << DataDir();
  TempDir tmp;
  DaemonOptions o;
  o.extra = {"--set", "scheduler.hold=true", "--set", "scheduler.validate_inline_max_bytes=0"};
  Daemon daemon(tmp.path() / "data", o);
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  const std::string ep = daemon.tcp_endpoint();
  std::string text;
  for (const auto& book : fs::directory_iterator(DataDir() / "texts/austen")) text += Slurp(book.path());
  ASSERT_GT(text.size(), 1000000u);
  {
    std::ofstream out(tmp.path() / "books.jsonl");
    for (int copy = 0; copy < 20; ++copy) {
      for (size_t at = 0; at < text.size(); at += 100000) out << json{{"text", text.substr(at, 100000)}}.dump() << "\n";
    }
  }
  WriteFile(tmp.path() / "job.yaml", "model: {path: " + SmolLm2().string() + "}\ndata: {train: " +
                                         (tmp.path() / "books.jsonl").string() + "}\ntraining: {max_steps: 1}\n");
  const json job = OombJson(ep, "submit " + (tmp.path() / "job.yaml").string() + " --job-id books", tmp.path());
  ASSERT_EQ(job.value("state", ""), "VALIDATING");
  daemon.BeginStop();
  Result health;
  ASSERT_TRUE(WaitFor(
      [&] {
        health = Oomb(ep, "health", tmp.path());
        return health.out.find("NOT_SERVING") != std::string::npos;
      },
      std::chrono::seconds(10)))
      << "health: rc " << health.rc << " " << health.out << health.err;
  EXPECT_EQ(health.rc, 5);
  const Result refused = Oomb(ep, "submit " + (tmp.path() / "job.yaml").string(), tmp.path());
  EXPECT_EQ(refused.rc, 5) << refused.out << refused.err;
  EXPECT_THAT(refused.err, HasSubstr("UNAVAILABLE: the server is shutting down"));
  EXPECT_EQ(daemon.WaitExit(), 0) << daemon.log();

  daemon.Start();
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  json after;
  ASSERT_TRUE(WaitFor(
      [&] {
        after = OombJson(daemon.tcp_endpoint(), "get books", tmp.path());
        return after.value("state", "") != "VALIDATING";
      },
      std::chrono::seconds(120)));
  EXPECT_EQ(after["state"], "QUEUED");  // the scheduler holds jobs
  EXPECT_GT(std::stoll(after["dataset"]["tokens"].get<std::string>()), 10000000);
}

TEST(DaemonTlsTest, TlsAndMutualTlsWithGeneratedCertificates) {
  if (Shell("openssl version", fs::temp_directory_path()).rc != 0) GTEST_SKIP() << "no openssl command";
  TempDir tmp;
  const fs::path d = tmp.path();
  MakeCertificates(d);
  if (::testing::Test::HasFatalFailure()) return;
  const std::string ca = " --ca " + (d / "ca.pem").string();
  const std::string client = " --cert " + (d / "client.pem").string() + " --key " + (d / "client.key").string();

  {  // TLS: the server proves itself; a plaintext client cannot talk to it.
    DaemonOptions o;
    o.extra = {"--set", "tls.cert_file=" + (d / "server.pem").string(), "--set",
               "tls.key_file=" + (d / "server.key").string()};
    Daemon daemon(d / "tls", o);
    ASSERT_GT(daemon.port(), 0) << daemon.log();
    const std::string ep = daemon.tcp_endpoint();
    EXPECT_EQ(Oomb(ep, ca + " list", d).rc, 0);
    EXPECT_EQ(Oomb(ep, ca + " health", d).rc, 0);
    EXPECT_EQ(Oomb(ep, "list", d).rc, 5);  // UNAVAILABLE: no TLS handshake
  }
  {  // mTLS: the client must present a certificate from the CA.
    DaemonOptions o;
    o.extra = {"--set", "tls.cert_file=" + (d / "server.pem").string(),
               "--set", "tls.key_file=" + (d / "server.key").string(),
               "--set", "tls.client_ca_file=" + (d / "ca.pem").string()};
    Daemon daemon(d / "mtls", o);
    ASSERT_GT(daemon.port(), 0) << daemon.log();
    const std::string ep = daemon.tcp_endpoint();
    EXPECT_EQ(Oomb(ep, ca + client + " list", d).rc, 0);
    EXPECT_NE(Oomb(ep, ca + " list", d).rc, 0);  // no client certificate
    // A certificate from another CA is refused too.
    const Result other = Shell(
        "cd " + d.string() +
            " && openssl req -x509 -newkey rsa:2048 -nodes -keyout rogue.key -out rogue.pem -days 2 -subj /CN=rogue",
        d);
    ASSERT_EQ(other.rc, 0) << other.err;
    EXPECT_NE(
        Oomb(ep, ca + " --cert " + (d / "rogue.pem").string() + " --key " + (d / "rogue.key").string() + " list", d).rc,
        0);
  }
}

}  // namespace
}  // namespace oomb::testing
