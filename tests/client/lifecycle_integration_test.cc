// End-to-end tests of a job's life with the real trainer: `oombd serve` (TCP on 127.0.0.1:0,
// or only its Unix socket), the `oomb` CLI, a Python grpcio client generated from proto/ at
// test time, and `oomb watch` on a terminal (tmux) and off one.
//
// Training is kept tiny: SmolLM2-135M for 2 steps of 256 tokens where the model matters (text
// through the tokenizer, PEFT parity), else the 2-layer test model on pre-tokenized ids.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>
#include <set>

#include "tests/client/daemon_harness.h"

namespace oomb::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Austen text from the test data, the first `words` words after `skip` words.
std::string AustenWords(int skip, int words) {
  std::istringstream in(Slurp(DataDir() / "texts/austen/prideprejudice.txt"));
  std::string w, out;
  for (int i = 0; i < skip + words && in >> w; ++i) {
    if (i >= skip) out += (out.empty() ? "" : " ") + w;
  }
  return out;
}

// The checks every finished lifecycle shares: the job SUCCEEDED; its events have sequences
// 1, 2, ... and hold the QUEUED -> RUNNING -> SUCCEEDED states, one STEP per step and a final
// checkpoint; `oomb checkpoints` lists that checkpoint and it holds a PEFT adapter.
void ExpectSucceededLifecycle(const std::string& endpoint, const std::string& job, int steps, const fs::path& scratch) {
  const json got = OombJson(endpoint, "get " + job, scratch);
  EXPECT_EQ(got["state"], "SUCCEEDED") << got.dump(2);
  EXPECT_EQ(got["progress"]["step"], std::to_string(steps));

  const std::vector<json> events = AllEvents(endpoint, job, scratch);
  ASSERT_FALSE(events.empty());
  std::vector<std::string> states;
  std::vector<int64_t> step_numbers;
  int checkpoints = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(Seq(events[i]), static_cast<int64_t>(i + 1)) << events[i].dump();
    const std::string type = events[i]["type"];
    if (type == "STATE_CHANGED") states.push_back(events[i]["state"]);
    if (type == "STEP") step_numbers.push_back(std::stoll(events[i]["progress"]["step"].get<std::string>()));
    if (type == "CHECKPOINT_SAVED") ++checkpoints;
  }
  EXPECT_THAT(states, ::testing::ElementsAre("QUEUED", "RUNNING", "SUCCEEDED"));
  std::vector<int64_t> expected_steps;
  for (int s = 1; s <= steps; ++s) expected_steps.push_back(s);
  EXPECT_EQ(step_numbers, expected_steps);
  EXPECT_GE(checkpoints, 1);

  const Result events_table = Oomb(endpoint, "events " + job, scratch);
  EXPECT_EQ(events_table.rc, 0) << events_table.err;
  EXPECT_THAT(events_table.out, HasSubstr("state RUNNING"));
  EXPECT_THAT(events_table.out, HasSubstr("step " + std::to_string(steps) + "/" + std::to_string(steps) + " loss"));
  EXPECT_THAT(events_table.out, HasSubstr("checkpoint step " + std::to_string(steps)));
  EXPECT_THAT(events_table.out, HasSubstr("state SUCCEEDED"));

  const json cps = OombJson(endpoint, "checkpoints " + job, scratch);
  ASSERT_TRUE(cps.contains("checkpoints")) << cps.dump(2);
  const json& last = cps["checkpoints"].back();
  EXPECT_EQ(last.value("final", false), true) << cps.dump(2);
  EXPECT_EQ(last["step"], std::to_string(steps));
  const fs::path path = last["path"].get<std::string>();
  EXPECT_TRUE(fs::exists(path / "adapter_model.safetensors")) << path;
  EXPECT_TRUE(fs::exists(path / "adapter_config.json")) << path;
  const Result table = Oomb(endpoint, "checkpoints " + job, scratch);
  EXPECT_EQ(table.rc, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr(path.string()));
}

// The job name from `oomb submit`'s first line ("projects/default/jobs/job-x QUEUED ...").
std::string SubmittedName(const std::string& out) { return out.substr(0, out.find(' ')); }

TEST(Lifecycle, SubmitWatchEventsCheckpointsOverTcpWithSmolLm2Text) {
  if (!fs::exists(SmolLm2() / "tokenizer.json") || !fs::exists(DataDir() / "texts/austen")) {
    GTEST_SKIP() << "no SmolLM2 / Austen texts under " << DataDir() << " (run scripts/fetch_test_data.sh)";
  }
  TempDir tmp;
  Daemon daemon(tmp.path() / "data", DaemonOptions());
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  const fs::path train = tmp.path() / "austen.jsonl";
  WriteFile(train,
            json{{"text", AustenWords(0, 400)}}.dump() + "\n" + json{{"text", AustenWords(400, 400)}}.dump() + "\n");
  WriteFile(tmp.path() / "job.yaml",
            "display_name: austen-tiny\nmodel: {path: " + SmolLm2().string() +
                ", dtype: float32}\n"
                "method: {type: lora, lora: {rank: 8, alpha: 16, target_modules: [q_proj, k_proj, v_proj]}}\n"
                "data: {train: " +
                train.string() +
                ", max_seq_len: 256, too_long: truncate}\n"
                "training: {max_steps: 2, warmup_steps: 0}\n"
                "memory: {chunk_tokens: 128}\n"
                "checkpoint: {every_steps: 1}\n"
                "resources: {device: auto}\n");
  const Result submit =
      Oomb(daemon.tcp_endpoint(), "submit " + (tmp.path() / "job.yaml").string() + " --watch", tmp.path());
  ASSERT_EQ(submit.rc, 0) << submit.out << submit.err << daemon.log();
  // Off a terminal, watch prints one plain line per event and no progress bar.
  EXPECT_THAT(submit.out, HasSubstr("state RUNNING"));
  EXPECT_THAT(submit.out, HasSubstr("step 2/2 loss"));
  EXPECT_THAT(submit.out, HasSubstr("state SUCCEEDED"));
  EXPECT_THAT(submit.out + submit.err, Not(HasSubstr("\r")));
  ExpectSucceededLifecycle(daemon.tcp_endpoint(), SubmittedName(submit.out), 2, tmp.path());
}

TEST(Lifecycle, SubmitWatchOverUnixSocketOnly) {
  if (!fs::exists(TinyLlama() / "config.json")) GTEST_SKIP() << "no test models under " << DataDir();
  TempDir tmp;
  Daemon daemon(tmp.path() / "d", DaemonOptions::UnixSocketOnly());
  ASSERT_TRUE(daemon.Alive()) << daemon.log();
  EXPECT_FALSE(fs::exists(tmp.path() / "d/oombd.port"));  // no TCP listener
  EXPECT_EQ(fs::status(tmp.path() / "d/oombd.sock").permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  const std::string endpoint = daemon.unix_endpoint();
  const Result health = Oomb(endpoint, "health", tmp.path());
  EXPECT_EQ(health.rc, 0) << health.err;
  WriteIdsJsonl(tmp.path() / "ids.jsonl", 3, 100);
  WriteFile(tmp.path() / "job.yaml", TinyJobYaml((tmp.path() / "ids.jsonl").string(), 3));
  const Result submit = Oomb(endpoint, "submit " + (tmp.path() / "job.yaml").string() + " --watch", tmp.path());
  ASSERT_EQ(submit.rc, 0) << submit.out << submit.err << daemon.log();
  EXPECT_THAT(submit.out, HasSubstr("state SUCCEEDED"));
  ExpectSucceededLifecycle(endpoint, SubmittedName(submit.out), 3, tmp.path());
}

// method.type evaluate over the API: an evaluation of SmolLM2 with the adapter a training job
// wrote, without training, listed and watched like any job (QUEUED -> RUNNING -> SUCCEEDED, one
// STEP event with the results, no checkpoint); its results are those of the training job's own
// evaluation after its last step, on the same model. The base model alone evaluates too.
TEST(Lifecycle, EvaluateJobScoresAnAdapterWithoutTraining) {
  if (!fs::exists(SmolLm2() / "tokenizer.json") || !fs::exists(DataDir() / "texts/austen")) {
    GTEST_SKIP() << "no SmolLM2 / Austen texts under " << DataDir() << " (run scripts/fetch_test_data.sh)";
  }
  TempDir tmp;
  Daemon daemon(tmp.path() / "data", DaemonOptions());
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  const std::string endpoint = daemon.tcp_endpoint();
  WriteFile(tmp.path() / "train.jsonl", json{{"text", AustenWords(0, 300)}}.dump() + "\n");
  WriteFile(tmp.path() / "val.jsonl", json{{"text", AustenWords(3000, 300)}}.dump() + "\n");
  const std::string common = "model: {path: " + SmolLm2().string() +
                             ", dtype: float32}\n"
                             "memory: {chunk_tokens: 128}\n"
                             "evaluation: {suites: [positions, passkey], lengths: [384], depths: 2}\n"
                             "resources: {device: cpu}\n";
  const std::string validation = "validation: " + (tmp.path() / "val.jsonl").string() + ", max_seq_len: 384";
  WriteFile(tmp.path() / "train.yaml", common +
                                           "method: {type: lora, lora: {rank: 4, alpha: 8, target_modules: "
                                           "[q_proj, v_proj]}}\n"
                                           "data: {train: " +
                                           (tmp.path() / "train.jsonl").string() + ", " + validation +
                                           "}\n"
                                           "training: {max_steps: 2, warmup_steps: 0, learning_rate: 1.0e-3}\n"
                                           // Outside the data dir, which jobs may not read.
                                           "checkpoint: {dir: " +
                                           (tmp.path() / "trained").string() + "}\n");
  const Result trained = Oomb(endpoint, "submit " + (tmp.path() / "train.yaml").string() + " --watch", tmp.path());
  ASSERT_EQ(trained.rc, 0) << trained.out << trained.err << daemon.log();
  const json train_job = OombJson(endpoint, "get " + SubmittedName(trained.out), tmp.path());
  const json cps = OombJson(endpoint, "checkpoints " + SubmittedName(trained.out), tmp.path());
  ASSERT_TRUE(cps.contains("checkpoints")) << cps.dump(2);
  const std::string adapter = cps["checkpoints"].back()["path"];

  WriteFile(tmp.path() / "eval.yaml", common +
                                          "display_name: eval-adapter\nmethod: {type: evaluate, lora: "
                                          "{init_adapter: " +
                                          adapter + "}}\ndata: {" + validation + "}\n");
  const Result evaluated = Oomb(endpoint, "submit " + (tmp.path() / "eval.yaml").string() + " --watch", tmp.path());
  ASSERT_EQ(evaluated.rc, 0) << evaluated.out << evaluated.err << daemon.log();
  const std::string job = SubmittedName(evaluated.out);
  const json got = OombJson(endpoint, "get " + job, tmp.path());
  EXPECT_EQ(got["state"], "SUCCEEDED") << got.dump(2);
  ASSERT_TRUE(got["progress"].contains("evaluation")) << got.dump(2);
  ASSERT_TRUE(train_job["progress"].contains("evaluation")) << train_job.dump(2);
  json mine = got["progress"]["evaluation"], theirs = train_job["progress"]["evaluation"];
  EXPECT_EQ(theirs["step"], "2");
  EXPECT_FALSE(mine.contains("step"));  // 0: no training step
  theirs.erase("step");
  EXPECT_EQ(mine, theirs);
  EXPECT_TRUE(mine["suites"]["passkey"].contains("accuracy")) << mine.dump(2);
  EXPECT_EQ(mine["suites"]["positions"]["buckets"].size(), 1u) << mine.dump(2);
  // The evaluate job takes the validation loss from the positions suite's buckets (the same
  // samples, one sequence each), the training job from a forward of its own over them packed:
  // float32 summation apart.
  const double want_loss = train_job["progress"]["eval_loss"].get<double>();
  EXPECT_NEAR(got["progress"]["eval_loss"].get<double>(), want_loss, 1e-6 * want_loss);

  std::vector<std::string> states;
  int steps = 0;
  for (const json& e : AllEvents(endpoint, job, tmp.path())) {
    if (e["type"] == "STATE_CHANGED") states.push_back(e["state"]);
    steps += e["type"] == "STEP" ? 1 : 0;
    EXPECT_NE(e["type"], "CHECKPOINT_SAVED");
  }
  EXPECT_THAT(states, ::testing::ElementsAre("QUEUED", "RUNNING", "SUCCEEDED"));
  EXPECT_EQ(steps, 1);
  EXPECT_FALSE(OombJson(endpoint, "checkpoints " + job, tmp.path()).contains("checkpoints"));
  EXPECT_THAT(Oomb(endpoint, "list", tmp.path()).out, HasSubstr("evaluate"));
  const Result detail = Oomb(endpoint, "get " + job, tmp.path());
  EXPECT_THAT(detail.out, HasSubstr("method:      evaluate (adapter " + adapter + ")"));
  EXPECT_THAT(detail.out, HasSubstr("evaluation:  passkey"));

  WriteFile(tmp.path() / "base.yaml", common + "method: {type: evaluate}\ndata: {" + validation + "}\n");
  const Result base = Oomb(endpoint, "submit " + (tmp.path() / "base.yaml").string() + " --watch", tmp.path());
  ASSERT_EQ(base.rc, 0) << base.out << base.err << daemon.log();
  EXPECT_THAT(base.out, HasSubstr("state SUCCEEDED"));
}

// tests/python/grpc_lifecycle.py: the Python SDK (client/python); create,
// watch (stream), events, a resumed watch with after_sequence; then the final adapter in PEFT
// against `oombd model eval --adapter`.
TEST(Lifecycle, PythonGrpcClientAndPeftParity) {
  if (!fs::exists(SmolLm2() / "tokenizer.json")) GTEST_SKIP() << "no SmolLM2 under " << DataDir();
  if (!fs::exists(VenvPython())) GTEST_SKIP() << "no Python venv at " << VenvPython() << " (scripts/setup.sh)";
  TempDir tmp;
  Daemon daemon(tmp.path() / "data", DaemonOptions());
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  const Result r = Shell(VenvPython().string() + " " + SourceDir() + "/tests/python/grpc_lifecycle.py --endpoint " +
                             daemon.tcp_endpoint() + " --oombd " + Oombd() + " --model " + SmolLm2().string() +
                             " --workdir " + tmp.path().string(),
                         tmp.path());
  if (r.rc == 77) GTEST_SKIP() << r.out << r.err;
  EXPECT_EQ(r.rc, 0) << r.out << r.err << daemon.log();
  EXPECT_THAT(r.out, HasSubstr("grpc_lifecycle: ok"));
  std::cout << r.out;
}

class WatchTerminal : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(TinyLlama() / "config.json")) GTEST_SKIP() << "no test models under " << DataDir();
    tmp_ = std::make_unique<TempDir>();
    daemon_ = std::make_unique<Daemon>(tmp_->path() / "data", DaemonOptions{});
    ASSERT_GT(daemon_->port(), 0) << daemon_->log();
    WriteIdsJsonl(tmp_->path() / "ids.jsonl", 4, 120);
  }
  void TearDown() override {
    daemon_.reset();
    tmp_.reset();
  }

  // Submits a tiny job of `steps` steps; returns its name.
  std::string Submit(int steps, int every_steps) {
    WriteFile(tmp_->path() / "job.yaml", TinyJobYaml((tmp_->path() / "ids.jsonl").string(), steps, every_steps));
    const json job = OombJson(endpoint(), "submit " + (tmp_->path() / "job.yaml").string(), tmp_->path());
    return job.value("name", "");
  }
  std::string endpoint() const { return daemon_->tcp_endpoint(); }

  // What `oomb watch` drew on a tmux terminal (a real pseudo-terminal) of `columns` columns
  // while a 400-step job ran: captures of the screen at increasing steps (at least two, the
  // later past step 2), then the screen once the job was cancelled, and watch's exit code.
  struct Screens {
    std::vector<std::string> bars;
    std::string job, final_screen, rc;
  };
  Screens WatchOnTerminal(int columns) {
    Screens out;
    const std::string job = Submit(/*steps=*/400, /*every_steps=*/0);
    EXPECT_FALSE(job.empty());
    out.job = job;
    const std::string server = "oomb-test-" + std::to_string(::getpid());  // a private tmux server
    const std::string tmux = "tmux -L " + server + " ";
    const fs::path watch_rc = tmp_->path() / "watch.rc";
    const std::string cmd =
        OombCli() + " --endpoint " + endpoint() + " watch " + job + "; echo $? > " + watch_rc.string() + "; sleep 600";
    EXPECT_EQ(Shell("TERM=xterm " + tmux + "new-session -d -x " + std::to_string(columns) + " -y 50 -s w '" + cmd + "'",
                    tmp_->path())
                  .rc,
              0);
    auto capture = [&] { return Shell(tmux + "capture-pane -p -t w", tmp_->path()).out; };
    WaitFor(
        [&] {
          const std::string screen = capture();
          const int step = BarStep(screen);
          if (step >= 0 && (out.bars.empty() || step > BarStep(out.bars.back()))) out.bars.push_back(screen);
          return out.bars.size() >= 2 && BarStep(out.bars.back()) >= 2;
        },
        std::chrono::seconds(40), std::chrono::milliseconds(100));
    Oomb(endpoint(), "cancel " + job, tmp_->path());
    WaitFor([&] { return fs::exists(watch_rc) && !Slurp(watch_rc).empty(); }, std::chrono::seconds(20));
    out.final_screen = capture();
    out.rc = Slurp(watch_rc);
    Shell(tmux + "kill-server", tmp_->path());
    return out;
  }
  // The bar's step ("step N/400 loss"), or -1 when the screen has no bar.
  static int BarStep(const std::string& screen) {
    std::smatch m;
    static const std::regex kBar(R"(RUNNING \[[#-]+\] step (\d+)/400 loss )");
    return std::regex_search(screen, m, kBar) ? std::stoi(m[1]) : -1;
  }
  // How many lines of `screen` carry the bar.
  static int BarLines(const std::string& screen) {
    std::istringstream lines(screen);
    std::string line;
    int n = 0;
    while (std::getline(lines, line)) n += BarStep(line) >= 0 ? 1 : 0;
    return n;
  }

  std::unique_ptr<TempDir> tmp_;
  std::unique_ptr<Daemon> daemon_;
};

// Under tmux, `oomb watch` draws a progress line on stderr that updates in place as steps
// arrive: one line however many steps went by, other events printed above it.
TEST_F(WatchTerminal, ProgressBarRendersAndUpdatesOnATty) {
  if (Shell("tmux -V", tmp_->path()).rc != 0) GTEST_SKIP() << "tmux is not installed";
  const Screens s = WatchOnTerminal(200);
  ASSERT_GE(s.bars.size(), 2u) << "the progress bar did not update; last screen:\n" << s.final_screen;
  for (const std::string& bar : s.bars) {
    EXPECT_THAT(bar, HasSubstr("step "));
    EXPECT_THAT(bar, HasSubstr("loss "));
    EXPECT_THAT(bar, HasSubstr("tok/s"));
    EXPECT_THAT(bar, HasSubstr(s.job.substr(s.job.rfind('/') + 1) + " RUNNING ["));  // the bar, by job id
  }
  EXPECT_LT(BarStep(s.bars.front()), BarStep(s.bars.back()));
  EXPECT_EQ(BarLines(s.bars.back()), 1) << s.bars.back();
  EXPECT_THAT(s.final_screen, HasSubstr("state CANCELLED"));
  EXPECT_EQ(s.rc, "7\n");
}

// On an 80-column terminal the line fits (no wrapped remainder left behind by a redraw), keeps
// the step and the loss, and does not call a CPU job's memory a GPU's.
TEST_F(WatchTerminal, ProgressLineFitsAnEightyColumnTerminal) {
  if (Shell("tmux -V", tmp_->path()).rc != 0) GTEST_SKIP() << "tmux is not installed";
  const Screens s = WatchOnTerminal(80);
  ASSERT_GE(s.bars.size(), 2u) << "the progress line did not update; last screen:\n" << s.final_screen;
  for (const std::string& screen : s.bars) {
    EXPECT_EQ(BarLines(screen), 1) << screen;
    std::istringstream lines(screen);
    std::string line;
    while (std::getline(lines, line)) {
      if (BarStep(line) < 0) continue;
      EXPECT_LT(line.size(), 80u) << line;
      EXPECT_THAT(line, Not(HasSubstr("gpu"))) << line;
    }
  }
  // Every screen line that is not an event line is the bar: no stale half-line from a wrap.
  std::istringstream lines(s.bars.back());
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || BarStep(line) >= 0) continue;
    EXPECT_THAT(line, ::testing::ContainsRegex("^ *[0-9]+ [0-9-]+ [0-9:]+ ")) << "not an event line: " << line;
  }
}

// Off a terminal: one plain line per event, on stdout, with no escape sequences.
TEST_F(WatchTerminal, PlainLinesOffATty) {
  const std::string job = Submit(/*steps=*/5, /*every_steps=*/2);
  ASSERT_FALSE(job.empty());
  const Result r = Oomb(endpoint(), "watch " + job, tmp_->path());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, Not(HasSubstr("\r")));
  EXPECT_THAT(r.out, Not(HasSubstr("\033")));
  EXPECT_THAT(r.err, Not(HasSubstr("\033")));
  std::istringstream lines(r.out);
  std::string line;
  int steps = 0, checkpoints = 0, n = 0;
  while (std::getline(lines, line)) {
    ++n;
    if (line.find(" step ") != std::string::npos && line.find(" loss ") != std::string::npos) ++steps;
    if (line.find(" checkpoint step ") != std::string::npos) ++checkpoints;
  }
  EXPECT_EQ(steps, 5) << r.out;
  EXPECT_EQ(checkpoints, 3) << r.out;  // steps 2 and 4, and the final one
  EXPECT_THAT(r.out, HasSubstr("state SUCCEEDED"));
  // A resumed watch replays only what follows the sequence.
  const Result tail = Oomb(endpoint(), "watch " + job + " --after " + std::to_string(n - 1), tmp_->path());
  EXPECT_EQ(tail.rc, 0);
  EXPECT_EQ(std::count(tail.out.begin(), tail.out.end(), '\n'), 1) << tail.out;
  EXPECT_THAT(tail.out, HasSubstr("state SUCCEEDED"));
}

}  // namespace
}  // namespace oomb::testing
