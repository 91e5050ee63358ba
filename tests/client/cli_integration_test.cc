// Integration tests of the real binaries: `oombd serve` on 127.0.0.1:0 with a temporary data
// dir (the port is read from <data_dir>/oombd.port) and the `oomb` CLI against it. The
// scheduler is held (scheduler.hold=true) so jobs stay QUEUED: these tests cover the API and
// the CLI, not training.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

std::string BinaryDir() {
  const char* d = std::getenv("OOMB_BINARY_DIR");  // overrides the build tree the test was built in
  return d ? d : OOMB_TEST_BINARY_DIR;
}

std::string Slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Result {
  int rc = -1;
  std::string out, err;
};

class Daemon {
 public:
  Daemon(const fs::path& dir, const std::vector<std::string>& extra) : dir_(dir) {
    const std::string bin = BinaryDir() + "/server/oombd";
    std::vector<std::string> args = {bin,
                                     "serve",
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--data-dir",
                                     dir.string(),
                                     "--metrics-listen",
                                     "127.0.0.1:0",
                                     "--http-listen",
                                     "127.0.0.1:0",
                                     "--set",
                                     "scheduler.hold=true"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = ::fork();
    if (pid_ == 0) {
      const std::string log = (dir / "oombd.log").string();
      freopen(log.c_str(), "w", stderr);
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    const fs::path port_file = dir / "oombd.port";
    for (int i = 0; i < 400 && !fs::exists(port_file); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    port_ = std::atoi(Slurp(port_file).c_str());
  }
  ~Daemon() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }
  int port() const { return port_; }
  std::string log() const { return Slurp(dir_ / "oombd.log"); }

 private:
  fs::path dir_;
  pid_t pid_ = -1;
  int port_ = 0;
};

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("oomb_cli_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "model");
    // CreateJob reads the dataset (pre-tokenized ids need no tokenizer.json) and plans the
    // job's memory from config.json; no weights are needed while the scheduler holds jobs.
    std::ofstream(dir_ / "model" / "config.json")
        << R"({"model_type": "llama", "vocab_size": 256, "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000.0})";
    std::ofstream(dir_ / "train.jsonl") << "{\"input_ids\": [1, 2, 3]}\n";
    std::ofstream(dir_ / "job.yaml") << "display_name: t\nlabels: {team: nlp}\nmodel:\n  path: "
                                     << (dir_ / "model").string()
                                     << "\ndata:\n  train: " << (dir_ / "train.jsonl").string()
                                     << "\ntraining:\n  max_steps: 5\n";
    job_ = (dir_ / "job.yaml").string();
  }
  void TearDown() override {
    daemon_.reset();
    fs::remove_all(dir_);
  }

  void StartDaemon(const std::vector<std::string>& extra = {}) {
    fs::create_directories(dir_ / "data");
    daemon_ = std::make_unique<Daemon>(dir_ / "data", extra);
    ASSERT_GT(daemon_->port(), 0) << daemon_->log();
    endpoint_ = "127.0.0.1:" + std::to_string(daemon_->port());
  }

  // Runs the real CLI with --endpoint; stdout and stderr captured.
  Result Oomb(const std::string& args, const std::string& env = "") {
    const fs::path out = dir_ / "cli.out", err = dir_ / "cli.err";
    const std::string cmd = env + " " + BinaryDir() + "/client/oomb --endpoint " + endpoint_ + " --timeout 10 " + args +
                            " >" + out.string() + " 2>" + err.string();
    const int status = std::system(cmd.c_str());
    Result r;
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = Slurp(out);
    r.err = Slurp(err);
    return r;
  }

  json OombJson(const std::string& args) {
    Result r = Oomb(args + " -o json");
    EXPECT_EQ(r.rc, 0) << args << ": " << r.err;
    return r.rc == 0 ? json::parse(r.out) : json();
  }

  std::string Submit(const std::string& extra = "") { return OombJson("submit " + job_ + " " + extra)["name"]; }

  fs::path dir_;
  std::string job_;
  std::string endpoint_ = "127.0.0.1:1";
  std::unique_ptr<Daemon> daemon_;
};

TEST_F(CliTest, HealthAndServerInfo) {
  StartDaemon();
  Result h = Oomb("health");
  EXPECT_EQ(h.rc, 0) << h.err;
  EXPECT_EQ(h.out, "SERVING\n");
  json info = OombJson("server-info");
  EXPECT_EQ(info["version"], "0.1.0");
  // The git sha `oombd version` prints (issue 52).
  ASSERT_EQ(std::system((BinaryDir() + "/server/oombd version > " + (dir_ / "version.out").string()).c_str()), 0);
  ASSERT_TRUE(info.contains("git_sha")) << info.dump();
  EXPECT_THAT(Slurp(dir_ / "version.out"), HasSubstr("(" + info["git_sha"].get<std::string>() + ","));
  ASSERT_FALSE(info["devices"].empty());
  EXPECT_EQ(info["devices"][0]["name"], "cpu");
}

TEST_F(CliTest, SubmitGetListEventsCheckpointsJsonAndYaml) {
  StartDaemon();
  json job = OombJson("submit " + job_ + " --set training.max_steps=7 --job-id first");
  EXPECT_EQ(job["name"], "projects/default/jobs/first");
  EXPECT_EQ(job["state"], "QUEUED");
  EXPECT_EQ(job["queue_position"], 1);
  EXPECT_EQ(job["spec"]["training"]["max_steps"], "7");  // int64 is a string in proto JSON
  EXPECT_EQ(job["spec"]["model"]["dtype"], "bfloat16");  // defaults are filled in
  EXPECT_EQ(job["labels"]["team"], "nlp");
  json got = OombJson("get first");
  EXPECT_EQ(got["name"], "projects/default/jobs/first");
  json list = OombJson("list --label team=nlp --state QUEUED");
  ASSERT_EQ(list["jobs"].size(), 1u);
  EXPECT_EQ(OombJson("list --label team=other").count("jobs"), 0u);
  json events = OombJson("events first");
  ASSERT_EQ(events["events"].size(), 2u);
  EXPECT_EQ(events["events"][0]["type"], "STATE_CHANGED");
  EXPECT_EQ(events["events"][0]["sequence"], "1");
  EXPECT_EQ(events["events"][1]["type"], "LOG");  // CreateJob's data scan
  EXPECT_EQ(OombJson("checkpoints first").count("checkpoints"), 0u);
  Result yaml = Oomb("get first -o yaml");
  EXPECT_EQ(yaml.rc, 0);
  EXPECT_THAT(yaml.out, HasSubstr("name: projects/default/jobs/first"));
  Result table = Oomb("list");
  EXPECT_THAT(table.out, HasSubstr("jobs/first"));
  Result valid = Oomb("submit " + job_ + " --validate-only");
  EXPECT_EQ(valid.rc, 0) << valid.err;
  EXPECT_EQ(OombJson("list")["jobs"].size(), 1u);  // validate-only stored nothing
}

// The model's window is 4096 (max_position_embeddings) and the one sample 5000 tokens long: it
// is accepted with a warning (on submit's stderr, in the job, as its WARNING event); with
// scaling that reaches it, no warning; with too little, a warning; yarn on a config.json with no
// window to extend is refused naming the field.
TEST_F(CliTest, ContextPastTheModelsWindowWarnsAndRopeScalingIsChecked) {
  StartDaemon();
  {
    std::ofstream long_data(dir_ / "long.jsonl");
    long_data << "{\"input_ids\": [1";
    for (int i = 1; i < 5000; ++i) long_data << ", " << i % 256;
    long_data << "]}\n";
  }
  const std::string job = job_ + " --set data.train=" + (dir_ / "long.jsonl").string();
  Result plain = Oomb("submit " + job + " --job-id long");
  ASSERT_EQ(plain.rc, 0) << plain.err;
  EXPECT_THAT(plain.err, HasSubstr("warning: the longest sample (5000 tokens) exceeds the model's window "
                                   "(max_position_embeddings 4096) and no RoPE scaling is set"));
  EXPECT_THAT(plain.err, HasSubstr("{type: yarn, factor: 2}"));
  json got = OombJson("get long");
  ASSERT_EQ(got["warnings"].size(), 1u);
  json events = OombJson("events long");
  ASSERT_EQ(events["events"].size(), 3u);  // QUEUED, the data scan, the warning
  EXPECT_EQ(events["events"][2]["type"], "WARNING");
  EXPECT_EQ(events["events"][2]["message"], got["warnings"][0]);

  Result scaled =
      Oomb("submit " + job + " --validate-only --set model.rope_scaling.type=yarn --set model.rope_scaling.factor=2");
  EXPECT_EQ(scaled.rc, 0) << scaled.err;
  EXPECT_THAT(scaled.err, Not(HasSubstr("warning")));
  Result too_little =
      Oomb("submit " + job + " --validate-only --set model.rope_scaling.type=yarn --set model.rope_scaling.factor=1.1");
  EXPECT_EQ(too_little.rc, 0) << too_little.err;
  EXPECT_THAT(too_little.err, HasSubstr("exceeds the window of the yarn RoPE scaling (factor 1.1 x 4096 = 4506"));
  Result short_data = Oomb("submit " + job_ + " --validate-only");  // 3 tokens
  EXPECT_THAT(short_data.err, Not(HasSubstr("warning")));

  fs::create_directories(dir_ / "no_window");
  std::ofstream(dir_ / "no_window" / "config.json")
      << R"({"model_type": "llama", "vocab_size": 256, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2})";
  Result refused = Oomb("submit " + job_ + " --validate-only --set model.path=" + (dir_ / "no_window").string() +
                        " --set model.rope_scaling.type=yarn --set model.rope_scaling.factor=4");
  EXPECT_EQ(refused.rc, 1) << refused.err;
  EXPECT_THAT(refused.err, HasSubstr("model.rope_scaling.original_max_position_embeddings: required for yarn"));
}

TEST_F(CliTest, IdempotentCreateAndAlreadyExists) {
  StartDaemon();
  const std::string a = Submit("--request-id req-1");
  const std::string b = Submit("--request-id req-1");
  EXPECT_EQ(a, b);
  EXPECT_EQ(OombJson("list")["jobs"].size(), 1u);
  Submit("--job-id taken");
  Result again = Oomb("submit " + job_ + " --job-id taken");
  EXPECT_EQ(again.rc, 1);
  EXPECT_THAT(again.err, HasSubstr("ALREADY_EXISTS"));
  Result bad_id = Oomb("submit " + job_ + " --job-id Bad_Id");
  EXPECT_EQ(bad_id.rc, 1);
  EXPECT_THAT(bad_id.err, HasSubstr("INVALID_ARGUMENT: job_id"));
}

TEST_F(CliTest, PaginationIsStableAcrossInserts) {
  StartDaemon();
  std::vector<std::string> names;
  for (int i = 0; i < 5; ++i) names.push_back(Submit());
  json p1 = OombJson("list --page-size 2");
  ASSERT_EQ(p1["jobs"].size(), 2u);
  EXPECT_EQ(p1["jobs"][0]["name"], names[4]);
  Submit();  // a new job between pages does not shift them
  json p2 = OombJson("list --page-size 2 --page-token " + p1["next_page_token"].get<std::string>());
  ASSERT_EQ(p2["jobs"].size(), 2u);
  EXPECT_EQ(p2["jobs"][0]["name"], names[2]);
  EXPECT_EQ(p2["jobs"][1]["name"], names[1]);
  json p3 = OombJson("list --page-size 2 --page-token " + p2["next_page_token"].get<std::string>());
  ASSERT_EQ(p3["jobs"].size(), 1u);
  EXPECT_EQ(p3["jobs"][0]["name"], names[0]);
  EXPECT_EQ(p3.count("next_page_token"), 0u);
  Result bad = Oomb("list --page-token garbage");
  EXPECT_EQ(bad.rc, 1);
  EXPECT_THAT(bad.err, HasSubstr("page_token"));
}

TEST_F(CliTest, TransitionsAndIllegalOnes) {
  StartDaemon();
  Submit("--job-id j");
  Result resume = Oomb("resume j");
  EXPECT_EQ(resume.rc, 1);
  EXPECT_THAT(resume.err, HasSubstr("FAILED_PRECONDITION: cannot resume projects/default/jobs/j: it is QUEUED"));
  Result del = Oomb("delete j");
  EXPECT_EQ(del.rc, 1);
  EXPECT_THAT(del.err, HasSubstr("FAILED_PRECONDITION"));
  EXPECT_EQ(OombJson("pause j")["state"], "PAUSED");
  EXPECT_EQ(OombJson("resume j")["state"], "QUEUED");
  EXPECT_EQ(OombJson("cancel j")["state"], "CANCELLED");
  Result cancel_again = Oomb("cancel j");
  EXPECT_EQ(cancel_again.rc, 1);
  EXPECT_THAT(cancel_again.err, HasSubstr("FAILED_PRECONDITION"));
  // watch of a cancelled job: snapshot, replay, then the stream ends; exit code 7.
  Result watch = Oomb("watch j");
  EXPECT_EQ(watch.rc, 7) << watch.err;
  EXPECT_THAT(watch.out, HasSubstr("state CANCELLED"));
  EXPECT_EQ(OombJson("events j --after 2")["events"].size(), 3u);  // after QUEUED and the data scan
  EXPECT_EQ(Oomb("delete j").rc, 0);
  EXPECT_EQ(Oomb("get j").rc, 3);
}

TEST_F(CliTest, BadSpecsAreInvalidArgumentNamingTheFieldAndTheDaemonKeepsServing) {
  StartDaemon();
  Result lr = Oomb("submit " + job_ + " --set training.learning_rate=-1");
  EXPECT_EQ(lr.rc, 1);
  // The CLI checks the schema's rules itself (proto/spec), before any RPC, naming the --set.
  EXPECT_THAT(lr.err, HasSubstr("--set training.learning_rate=-1: training.learning_rate: must be in (0, 10], got -1"));
  const std::string missing = (dir_ / "nonexistent.jsonl").string();
  Result file = Oomb("submit " + job_ + " --set data.train=" + missing);
  EXPECT_EQ(file.rc, 1);
  EXPECT_THAT(file.err, HasSubstr("data.train: " + missing));
  Result dev = Oomb("submit " + job_ + " --set resources.device=cuda:7");
  EXPECT_EQ(dev.rc, 1);
  EXPECT_THAT(dev.err, HasSubstr("resources.device"));
  Result unknown = Oomb("submit " + job_ + " --set training.max_stepz=5");
  EXPECT_EQ(unknown.rc, 1);
  EXPECT_THAT(unknown.err, HasSubstr("training.max_stepz: unknown key"));
  Result type = Oomb("submit " + job_ + " --set training.max_steps=many");
  EXPECT_EQ(type.rc, 1);
  EXPECT_THAT(type.err, HasSubstr("training.max_steps: expected an integer"));
  EXPECT_EQ(Oomb("health").rc, 0);
  // The host tier is planned: every page placed there, none in the device's pools.
  const json offload = OombJson("estimate " + job_ + " --set memory.kv_offload=host");
  EXPECT_EQ(offload["kv_host_bytes"], offload["kv_bytes"]);
  EXPECT_THAT(offload["placement"].get<std::string>(), HasSubstr("in the host tier"));
  // Sparse attention is planned: with pages for the last chunk too (dense attention appends
  // none for it), its own working set and page summaries.
  const json sparse = OombJson("estimate " + job_ + " --set attention.mode=sparse --set memory.page_tokens=128");
  const json dense = OombJson("estimate " + job_);
  // (int64 fields are JSON strings, as protobuf writes them)
  EXPECT_GT(std::stoll(sparse["kv_bytes"].get<std::string>()), std::stoll(dense["kv_bytes"].get<std::string>()));
  // memory.kv_grad_dtype left auto: float32 pages while they fit in memory on the CPU, and the estimate says so.
  EXPECT_THAT(dense["choices"].dump(), HasSubstr("memory.kv_grad_dtype auto: float32"));
  EXPECT_NE(sparse["activation_bytes"], dense["activation_bytes"]);
  // Left auto, sparse attention's pages are of 256 and its budget 32 of them, and the estimate
  // says so.
  const json sparse_auto = OombJson("estimate " + job_ + " --set attention.mode=sparse");
  EXPECT_THAT(sparse_auto["choices"].dump(), HasSubstr("memory.page_tokens auto: 256 with attention.mode sparse"));
  EXPECT_THAT(sparse_auto["choices"].dump(), HasSubstr("attention.sparse.page_budget auto: 32 pages of 256"));
}

TEST_F(CliTest, EstimateAndAdmissionByTheMemoryPlanner) {
  StartDaemon();
  // Fits: the plan's parts add up, and the longest context is beyond the spec's.
  json fit = OombJson("estimate " + job_ + " --set data.max_seq_len=4096");
  EXPECT_EQ(fit["fits"], true);
  EXPECT_EQ(fit["device"], "cpu");
  EXPECT_EQ(fit["seq_len"], "4096");
  const auto num = [](const json& j, const char* k) { return j.contains(k) ? std::stoll(j[k].get<std::string>()) : 0; };
  EXPECT_EQ(num(fit, "peak_device_bytes"), num(fit, "weights_bytes") + num(fit, "trainable_state_bytes") +
                                               num(fit, "kv_bytes") + num(fit, "activation_bytes"));
  // 2 layers, K and V of 2 heads x 8 dims: bfloat16 pages and float32 gradient pages.
  EXPECT_EQ(num(fit, "kv_bytes_per_token"), 2 * 2 * 16 * (2 + 4));
  EXPECT_GT(num(fit, "max_seq_len_that_fits"), 4096);
  Result table = Oomb("estimate " + job_);
  EXPECT_EQ(table.rc, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("longest context"));
  // The spec's defaults leave the chunk and the attention swap to the planner: it says what it
  // chose and why. 4096 tokens in chunks of 16384: one chunk, nothing to swap; 65536 in chunks of
  // 16384: the 3 chunks before the last swapped (the CPU moves no bytes over a bus).
  EXPECT_EQ(fit["choices"][0],
            "memory.chunk_tokens auto: 16384, the largest of 16384, 8192, 4096, 2048, 1024 "
            "whose plan leaves a sixteenth of cpu free at 4096 tokens (larger chunks run faster: "
            "fewer, larger matmuls and less of stage 1)");
  EXPECT_THAT(fit["choices"][1].get<std::string>(), HasSubstr("attention swap: none (a sequence of one chunk"));
  json longer = OombJson("estimate " + job_ + " --set data.max_seq_len=65536");
  EXPECT_THAT(longer["choices"][1].get<std::string>(), HasSubstr("attention swap: the last 3 chunks"));
  EXPECT_GT(num(longer, "swap_bytes"), 0);
  EXPECT_THAT(table.out, HasSubstr("chosen              memory.chunk_tokens auto: "));
  json fixed = OombJson("estimate " + job_ + " --set memory.chunk_tokens=1024 --set data.max_seq_len=4096");
  EXPECT_THAT(fixed["choices"][0].get<std::string>(), HasSubstr("attention swap: the last 3 chunks"));

  // Does not fit: the estimate says why (exit 1), and CreateJob refuses the job with
  // RESOURCE_EXHAUSTED naming the limit and the longest context that fits; nothing is created.
  Result no = Oomb("estimate " + job_ + " --set data.max_seq_len=2147483648 -o json");
  EXPECT_EQ(no.rc, 1);
  const json big = json::parse(no.out);
  EXPECT_EQ(big.value("fits", false), false);
  const std::string longest = big["max_seq_len_that_fits"];
  EXPECT_THAT(big["limit"].get<std::string>(), HasSubstr("the longest context that fits is " + longest));
  Result refused = Oomb("submit " + job_ + " --set data.max_seq_len=2147483648");
  EXPECT_EQ(refused.rc, 1);
  EXPECT_THAT(refused.err, HasSubstr("RESOURCE_EXHAUSTED"));
  EXPECT_THAT(refused.err, HasSubstr("cpu memory"));
  EXPECT_THAT(refused.err, HasSubstr("the longest context that fits is " + longest + " tokens"));
  EXPECT_TRUE(OombJson("list")["jobs"].empty());
  // The longest context the server named is accepted.
  EXPECT_EQ(Oomb("submit " + job_ + " --set data.max_seq_len=" + longest).rc, 0);
}

TEST_F(CliTest, LargeDatasetsAreScannedInTheValidatingState) {
  // Every dataset goes through VALIDATING (nothing is scanned inside CreateJob).
  StartDaemon({"--set", "scheduler.validate_inline_max_bytes=0"});
  const std::string good = Submit();
  json job;
  for (int i = 0; i < 200; ++i) {
    job = OombJson("get " + good);
    if (job["state"] != "VALIDATING") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(job["state"], "QUEUED");  // the scheduler holds jobs
  EXPECT_EQ(job["dataset"]["samples"], "1");
  EXPECT_EQ(job["dataset"]["tokens"], "3");
  EXPECT_EQ(job["dataset"]["sequences"], "1");
  // The length histogram: the one 3-token sample in the first bucket, [0, 128).
  ASSERT_TRUE(job["dataset"].contains("length_counts"));
  EXPECT_EQ(job["dataset"]["length_bounds"][0], "128");
  EXPECT_EQ(job["dataset"]["length_counts"][0], "1");
  const json events = OombJson("events " + good)["events"];
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events[0]["state"], "VALIDATING");
  EXPECT_EQ(events[1]["state"], "QUEUED");
  EXPECT_THAT(events[1]["message"].get<std::string>(), HasSubstr("validated: 1 samples, 3 tokens"));

  // A bad line is found after CreateJob returned: the job FAILS naming the file and the line.
  std::ofstream(dir_ / "bad.jsonl") << "{\"input_ids\": [1, 2]}\n{\"input_ids\": [1, 999]}\n";
  const std::string bad = Submit("--set data.train=" + (dir_ / "bad.jsonl").string());
  Result watch = Oomb("watch " + bad);
  EXPECT_EQ(watch.rc, 6) << watch.out << watch.err;
  job = OombJson("get " + bad);
  EXPECT_EQ(job["state"], "FAILED");
  EXPECT_EQ(job["error"]["reason"], "BAD_DATA");
  EXPECT_THAT(job["error"]["message"].get<std::string>(), HasSubstr("bad.jsonl:2"));
}

// `oomb logs`: what the daemon said about a job (here CreateJob's data scan and the state
// changes), one line each; -o json one event a line; -f follows until the job ends.
TEST_F(CliTest, LogsShowTheDataScanAndStateChangesAndFollowToTheEnd) {
  StartDaemon();
  const std::string name = Submit("--job-id logged");
  Result logs = Oomb("logs logged");
  ASSERT_EQ(logs.rc, 0) << logs.err;
  EXPECT_THAT(logs.out, HasSubstr("info  state QUEUED: queued"));
  EXPECT_THAT(logs.out, ::testing::ContainsRegex("info  data scan: 1 samples, 3 tokens, 1 sequences per epoch, the "
                                                 "longest sample 3 tokens; 0 dropped, 0 truncated"));
  Result json_lines = Oomb("logs logged -o json");
  ASSERT_EQ(json_lines.rc, 0) << json_lines.err;
  std::istringstream lines(json_lines.out);
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    const json e = json::parse(line);
    EXPECT_NE(e.value("type", ""), "STEP");
    ++n;
  }
  EXPECT_EQ(n, 2);  // QUEUED, the data scan
  // Following: the cancel's events arrive, and the exit code is the job's (7: CANCELLED).
  std::thread cancel([&] {  // its own output files: Oomb's are the follower's
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const std::string cmd = BinaryDir() + "/client/oomb --endpoint " + endpoint_ + " cancel logged >/dev/null 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0);
  });
  Result follow = Oomb("logs logged -f");
  cancel.join();
  EXPECT_EQ(follow.rc, 7) << follow.out << follow.err;
  EXPECT_THAT(follow.out, HasSubstr("state CANCELLED"));
  EXPECT_EQ(Oomb("logs nope").rc, 3);
}

TEST_F(CliTest, JobPathsAreConfinedToTheAllowedRoots) {
  StartDaemon({"--set", "paths.allowed_roots=" + dir_.string()});
  Result shadow = Oomb("submit " + job_ + " --set data.train=/etc/shadow");
  EXPECT_EQ(shadow.rc, 4);
  EXPECT_THAT(shadow.err, HasSubstr("PERMISSION_DENIED: spec: data.train: /etc/shadow is outside the directories"));
  // ".." that climbs out, from the current directory (the CLI makes it absolute).
  Result up = Oomb("submit " + job_ + " --set data.train=../../../../../../../../etc/passwd");
  EXPECT_EQ(up.rc, 4);
  EXPECT_THAT(up.err, HasSubstr("data.train: /etc/passwd is outside"));
  // A symlink inside the root that points out of it.
  fs::create_directory_symlink("/etc", dir_ / "etc-link");
  Result link = Oomb("submit " + job_ + " --set model.path=" + (dir_ / "etc-link").string());
  EXPECT_EQ(link.rc, 4);
  EXPECT_THAT(link.err, HasSubstr("model.path:"));
  Result ckpt = Oomb("submit " + job_ + " --set checkpoint.dir=/usr/local/bin/oomb-ckpt");
  EXPECT_EQ(ckpt.rc, 4);
  EXPECT_THAT(ckpt.err, HasSubstr("checkpoint.dir: /usr/local/bin/oomb-ckpt is outside"));
  Result est = Oomb("estimate " + job_ + " --set data.train=/etc/shadow");
  EXPECT_EQ(est.rc, 4);
  // Relative paths in the spec file are relative to the file's directory.
  fs::create_directories(dir_ / "specs");
  std::ofstream(dir_ / "specs" / "rel.yaml") << "model: {path: ../model}\ndata: {train: ../train.jsonl}\n";
  const json rel = OombJson("submit " + (dir_ / "specs" / "rel.yaml").string());
  EXPECT_EQ(rel["spec"]["data"]["train"], (dir_ / "train.jsonl").string());
  EXPECT_EQ(rel["spec"]["model"]["path"], (dir_ / "model").string());
  // The daemon refuses to start on a root that does not exist.
  const std::string bin = BinaryDir() + "/server/oombd";
  const int status =
      std::system((bin + " serve --listen 127.0.0.1:0 --data-dir " + (dir_ / "d2").string() +
                   " --set paths.allowed_roots=/nonexistent-root >" + (dir_ / "d2.log").string() + " 2>&1")
                      .c_str());
  EXPECT_NE(WEXITSTATUS(status), 0);
  EXPECT_THAT(Slurp(dir_ / "d2.log"), HasSubstr("paths.allowed_roots: /nonexistent-root"));
}

TEST_F(CliTest, QueuedJobsPerClientAreLimited) {
  StartDaemon({"--set", "scheduler.max_queued_jobs_per_client=3"});
  std::vector<std::string> names;
  for (int i = 0; i < 3; ++i) names.push_back(Submit());
  EXPECT_EQ(OombJson("get " + names[0])["creator"], "ipv4:127.0.0.1");
  Result fourth = Oomb("submit " + job_);
  EXPECT_EQ(fourth.rc, 1);
  EXPECT_THAT(fourth.err, HasSubstr("RESOURCE_EXHAUSTED: ipv4:127.0.0.1 already has 3 jobs waiting"));
  // A job that ends frees its place.
  EXPECT_EQ(Oomb("cancel " + names[0]).rc, 0);
  EXPECT_EQ(Oomb("submit " + job_).rc, 0);
}

TEST_F(CliTest, ExitCodes) {
  Result unavailable = Oomb("list");  // no server on 127.0.0.1:1
  EXPECT_EQ(unavailable.rc, 5);
  EXPECT_EQ(Oomb("health").rc, 5);
  EXPECT_EQ(Oomb("no-such-command").rc, 2);
  EXPECT_EQ(Oomb("list -o xml").rc, 2);
  StartDaemon();
  EXPECT_EQ(Oomb("get jobs/nope").rc, 3);
  EXPECT_EQ(Oomb("cancel nope").rc, 3);
}

TEST_F(CliTest, BearerTokenAuth) {
  std::ofstream(dir_ / "token") << "s3cret-token\n";
  std::ofstream(dir_ / "wrong") << "nope\n";
  StartDaemon({"--token-file", (dir_ / "token").string()});
  Result none = Oomb("list");
  EXPECT_EQ(none.rc, 4);
  EXPECT_THAT(none.err, HasSubstr("UNAUTHENTICATED"));
  EXPECT_EQ(Oomb("list --token-file " + (dir_ / "wrong").string()).rc, 4);
  EXPECT_EQ(Oomb("list --token-file " + (dir_ / "token").string()).rc, 0);
  EXPECT_EQ(Oomb("list", "OOMB_TOKEN=s3cret-token").rc, 0);
  EXPECT_EQ(Oomb("health").rc, 0);  // health needs no token
  EXPECT_THAT(daemon_->log(), ::testing::Not(HasSubstr("s3cret-token")));
  // The token file was made with the default umask (0644): the daemon says so.
  EXPECT_THAT(daemon_->log(), HasSubstr("is readable by every user (mode 0644)"));
}

// Issue 52, item 4: global options that used to mean something else silently are usage errors,
// naming the option; so is a listening address without a port.
TEST_F(CliTest, MisleadingOptionsAreUsageErrors) {
  const std::string oomb = BinaryDir() + "/client/oomb";
  const fs::path out = dir_ / "opt.out";
  const auto run = [&](const std::string& cmd) {
    const int status = std::system((cmd + " > " + out.string() + " 2>&1").c_str());
    return std::pair{WEXITSTATUS(status), Slurp(out)};
  };
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {oomb + " --timeout 0 list", "--timeout"},
           {oomb + " --cert " + (dir_ / "c.pem").string() + " list", "--key"},
           {oomb + " --key " + (dir_ / "k.pem").string() + " list", "--cert"},
           {oomb + " --endpoint :99999 list", "the port must be a number in [1, 65535], got '99999'"},
           {"OOMB_ENDPOINT=127.0.0.1: " + oomb + " list", "the port must be a number in [1, 65535], got ''"},
           {BinaryDir() + "/server/oombd config print --set server.listen=127.0.0.1:",
            "server.listen: expected host:port with a port in [0, 65535]"},
           {BinaryDir() + "/server/oombd config print --set metrics.listen=127.0.0.1:65536",
            "metrics.listen: expected host:port"},
           {BinaryDir() + "/server/oombd model eval --model " + (dir_ / "model").string() + " --chunk-tokens 0",
            "--chunk-tokens"},
           {BinaryDir() + "/server/oombd model eval --model " + (dir_ / "model").string() + " --chunk-tokens -5",
            "--chunk-tokens"},
           {BinaryDir() + "/server/oombd model eval --model " + (dir_ / "model").string() + " --trials 100000000",
            "--trials"},
           {BinaryDir() + "/server/oombd model eval --model " + (dir_ / "model").string() +
                " --lengths 9223372036854775807",
            "--lengths"}}) {
    const auto [rc, text] = run(args);
    EXPECT_EQ(rc, 2) << args << ": " << text;
    EXPECT_THAT(text, HasSubstr(message)) << args;
  }
}

// An idempotency key is stored with its job: a huge one is refused, naming the field.
TEST_F(CliTest, RequestIdsAreBounded) {
  StartDaemon();
  const Result r = Oomb("submit " + job_ + " --request-id " + std::string(300, 'k'));
  EXPECT_EQ(r.rc, 1);
  EXPECT_THAT(r.err, HasSubstr("request_id: at most 256 bytes, got 300"));
  EXPECT_EQ(Oomb("submit " + job_ + " --request-id " + std::string(256, 'k')).rc, 0);
}

// A display name cannot rewrite the table around it (issue 78's low finding: a bidi override was
// accepted and stored, then shown as U+FFFD): bidi controls and control characters are refused
// at submit and at update, INVALID_ARGUMENT naming display_name and the spec's line; nothing is
// stored. (`list` and `get` still show any such character of a job stored before as U+FFFD.)
TEST_F(CliTest, DisplayNamesCannotReorderTheTable) {
  StartDaemon();
  const std::string name = "evil\xE2\x80\xAEgnp.exe";
  std::ofstream(dir_ / "bidi.yaml") << "model: {path: " << (dir_ / "model").string() << "}\ndisplay_name: \"" << name
                                    << "\"\ndata: {train: " << (dir_ / "train.jsonl").string() << "}\n";
  const Result r = Oomb("submit " + (dir_ / "bidi.yaml").string());
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(r.err, HasSubstr("display_name: must not hold control or bidirectional formatting characters "
                               "(bytes e2 80 ae at byte 5)"));
  EXPECT_THAT(r.err, Not(HasSubstr("\xE2\x80\xAE")));
  EXPECT_EQ(OombJson("list").count("jobs"), 0u);
  // A bidi isolate and a C1 control are the daemon's to refuse; C0 controls the CLI refuses first.
  for (const auto& [bad, message] : std::vector<std::pair<std::string, std::string>>{
           {"a\xE2\x81\xA6"
            "b",
            "display_name: must not hold control or bidirectional formatting"},
           {"c1\xC2\x9B", "display_name: must not hold control or bidirectional formatting"},
           {"tab\there", "display_name: contains a control character"}}) {
    const Result other = Oomb("submit " + job_ + " --set 'display_name=" + bad + "'");
    EXPECT_EQ(other.rc, 1) << bad;
    EXPECT_THAT(other.err, HasSubstr(message)) << bad;
  }
  // Accepted names stay as they are, other scripts included; an update is checked the same way.
  const json ok =
      OombJson("submit " + job_ + " --set 'display_name=r\xC3\xA9sum\xC3\xA9 \xD7\xA9\xD7\x9C\xD7\x95\xD7\x9D'");
  ASSERT_TRUE(ok.contains("name"));
  EXPECT_EQ(ok["spec"]["display_name"], "r\xC3\xA9sum\xC3\xA9 \xD7\xA9\xD7\x9C\xD7\x95\xD7\x9D");
  const std::string job = ok["name"].get<std::string>();
  const Result updated = Oomb("update " + job + " --display-name '" + name + "'");
  EXPECT_EQ(updated.rc, 1) << updated.err;
  EXPECT_THAT(updated.err, HasSubstr("job: display_name: must not hold control or bidirectional formatting"));
  EXPECT_EQ(OombJson("get " + job)["spec"]["display_name"], "r\xC3\xA9sum\xC3\xA9 \xD7\xA9\xD7\x9C\xD7\x95\xD7\x9D");
}

// Issue 78's low finding: `oombd config print -c relative.yaml` refused the relative path; it
// is read against the current directory, as every other path flag is. And the upload limits'
// keys are printed with their defaults and checked.
TEST_F(CliTest, ConfigFilesMayBeNamedRelativeToTheCurrentDirectory) {
  const std::string bin = BinaryDir() + "/server/oombd";
  fs::create_directories(dir_ / "conf");
  std::ofstream(dir_ / "conf" / "relative.yaml")
      << "server:\n  listen: 127.0.0.1:9911\nuploads:\n  max_concurrent: 5\n";
  const auto Shell = [&](const std::string& command, const fs::path&) {
    const fs::path out = dir_ / "sh.out", err = dir_ / "sh.err";
    const int status = std::system(("(" + command + ") >" + out.string() + " 2>" + err.string()).c_str());
    Result r;
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = Slurp(out);
    r.err = Slurp(err);
    return r;
  };
  const Result r = Shell("cd " + (dir_ / "conf").string() + " && " + bin + " config print -c relative.yaml", dir_);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("listen: \"127.0.0.1:9911\""));
  EXPECT_THAT(r.out, HasSubstr("max_concurrent: 5"));
  EXPECT_THAT(r.out, HasSubstr("max_concurrent_per_project: 2"));
  EXPECT_THAT(r.out, HasSubstr("max_line_bytes: 16777216"));
  const Result sub = Shell("cd " + dir_.string() + " && " + bin + " config print --config conf/./relative.yaml", dir_);
  EXPECT_EQ(sub.rc, 0) << sub.err;
  EXPECT_THAT(sub.out, HasSubstr("listen: \"127.0.0.1:9911\""));
  const Result missing = Shell("cd " + dir_.string() + " && " + bin + " config print -c nowhere.yaml", dir_);
  EXPECT_EQ(missing.rc, 2);
  EXPECT_THAT(missing.err, HasSubstr((dir_ / "nowhere.yaml").string()));
  for (const auto& [flags, message] : std::vector<std::pair<std::string, std::string>>{
           {"--set uploads.max_concurrent=0", "uploads.max_concurrent / max_concurrent_per_project: need 1 <="},
           {"--set uploads.max_concurrent_per_project=9", "need 1 <= per project <= all; got 8 and 9"},
           {"--set uploads.max_line_bytes=100", "uploads.max_line_bytes: must be 1048576 to 268435456"}}) {
    const Result bad = Shell(bin + " config print " + flags, dir_);
    EXPECT_EQ(bad.rc, 2) << flags;
    EXPECT_THAT(bad.err, HasSubstr(message)) << flags;
  }
}

TEST_F(CliTest, ConfigPrintRedactsAndRejectsUnknownKeys) {
  const std::string bin = BinaryDir() + "/server/oombd";
  const fs::path out = dir_ / "cfg.out";
  int status = std::system(
      (bin + " config print --set auth.token=hunter2 --set server.listen=0.0.0.0:9 > " + out.string() + " 2>&1")
          .c_str());
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_THAT(Slurp(out), HasSubstr("token: <redacted>"));
  EXPECT_THAT(Slurp(out), ::testing::Not(HasSubstr("hunter2")));
  EXPECT_THAT(Slurp(out), HasSubstr("listen: \"0.0.0.0:9\""));
  status = std::system(("OOMB_SERVER__LISSTEN=x " + bin + " config print > " + out.string() + " 2>&1").c_str());
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_THAT(Slurp(out), HasSubstr("environment OOMB_SERVER__LISSTEN: server.lissten: unknown key"));
  // The store section: the PostgreSQL URL (it may hold a password) is redacted; environment
  // variables reach it; bad combinations are refused naming the key.
  status = std::system(("OOMB_STORE__BACKEND=postgres OOMB_STORE__LEASE_SECONDS=45 " + bin +
                        " config print --set store.postgres_url=postgresql://oomb:pa55word@db/oomb > " + out.string() +
                        " 2>&1")
                           .c_str());
  EXPECT_EQ(WEXITSTATUS(status), 0) << Slurp(out);
  EXPECT_THAT(Slurp(out), HasSubstr("backend: \"postgres\""));
  EXPECT_THAT(Slurp(out), HasSubstr("postgres_url: <redacted>"));
  EXPECT_THAT(Slurp(out), HasSubstr("lease_seconds: 45"));
  EXPECT_THAT(Slurp(out), ::testing::Not(HasSubstr("pa55word")));
  for (const auto& [flags, message] : std::vector<std::pair<std::string, std::string>>{
           {"--set store.backend=postgres", "store.backend: postgres needs store.postgres_url_file"},
           {"--set store.backend=mysql", "store.backend: must be sqlite or postgres; got 'mysql'"},
           {"--set store.postgres_url=x", "set, but store.backend is sqlite"},
           {"--set store.lease_seconds=10", "store.lease_seconds: must be longer than store.heartbeat_seconds (10)"},
           {"--set store.leese_seconds=10", "store.leese_seconds: unknown key"}}) {
    status = std::system((bin + " config print " + flags + " > " + out.string() + " 2>&1").c_str());
    EXPECT_EQ(WEXITSTATUS(status), 2) << flags;
    EXPECT_THAT(Slurp(out), HasSubstr(message)) << flags;
  }
}

}  // namespace
