// The attacks of issue 36, performed for real against the real daemon, the real CLI and real
// files (docs/RELIABILITY.md, threat model): links placed in a model directory and swapped in
// for a queued job's paths, the daemon's own store as a dataset, a second daemon on the same
// data dir or port, two jobs on one checkpoint directory, huge input echoed into messages, and
// leftovers of interrupted checkpoints.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <thread>

#include "tests/client/daemon_harness.h"

namespace oomb::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kSecret[] = "the daemon user's secret, never to be read for a job";

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(TinyLlama() / "config.json")) GTEST_SKIP() << "no test models under " << DataDir();
    tmp_ = std::make_unique<TempDir>();
    // The allowed root is the test's own directory; the secret lies outside it, 0600.
    fs::create_directories(root());
    fs::create_directories(outside());
    WriteFile(outside() / "secret", kSecret);
    ::chmod((outside() / "secret").c_str(), 0600);
    fs::create_directories(model());
    for (const auto& e : fs::directory_iterator(TinyLlama())) fs::copy(e.path(), model() / e.path().filename());
    WriteIdsJsonl(root() / "ids.jsonl", 4, 100);
  }
  void TearDown() override {
    daemon_.reset();
    tmp_.reset();
  }

  fs::path root() const { return tmp_->path() / "root"; }
  fs::path outside() const { return tmp_->path() / "outside"; }
  fs::path model() const { return root() / "model"; }
  fs::path data_dir() const { return root() / "data"; }  // inside the allowed root, as ~/.local/share/oomb is in ~

  void StartDaemon(std::vector<std::string> extra = {}) {
    DaemonOptions o;
    o.extra = {"--set", "paths.allowed_roots=" + root().string()};
    o.extra.insert(o.extra.end(), extra.begin(), extra.end());
    daemon_ = std::make_unique<Daemon>(data_dir(), o);
    ASSERT_GT(daemon_->port(), 0) << daemon_->log();
  }
  std::string ep() const { return daemon_->tcp_endpoint(); }
  Result Cli(const std::string& args) { return Oomb(ep(), args, tmp_->path()); }

  // A job spec of the tiny model copy in the root.
  fs::path Spec(const std::string& name, const std::string& extra_yaml = "") {
    std::string yaml = TinyJobYaml((root() / "ids.jsonl").string(), 2, 1);
    const size_t at = yaml.find("model: {path: ");
    yaml.replace(at, yaml.find('\n', at) - at, "model: {path: " + model().string() + ", dtype: float32}");
    const fs::path p = root() / (name + ".yaml");
    WriteFile(p, yaml + extra_yaml);
    return p;
  }

  // Every file under `dir`, with its content, for "the secret was copied nowhere".
  static bool AnyFileHolds(const fs::path& dir, const std::string& needle) {
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
      if (it->is_regular_file() && !it->is_symlink() && Slurp(it->path()).find(needle) != std::string::npos) {
        return true;
      }
    }
    return false;
  }

  std::unique_ptr<TempDir> tmp_;
  std::unique_ptr<Daemon> daemon_;
};

// Item 1: a link in the model directory to a 0600 file outside the roots is never followed; the
// job fails naming the file, and nothing of the secret reaches a checkpoint.
TEST_F(SecurityTest, LinksPlacedInAModelDirectoryAreNeverFollowed) {
  StartDaemon();
  fs::create_symlink(outside() / "secret", model() / "special_tokens_map.json");
  ASSERT_EQ(OombJson(ep(), "submit " + Spec("j").string() + " --job-id links", tmp_->path())["name"],
            "projects/default/jobs/links");
  EXPECT_EQ(Cli("watch links").rc, 6);
  const json job = OombJson(ep(), "get links", tmp_->path());
  EXPECT_EQ(job["error"]["code"], "PERMISSION_DENIED") << job.dump();
  EXPECT_EQ(job["error"]["reason"], "PATH_DENIED");
  EXPECT_THAT(job["error"]["message"].get<std::string>(), HasSubstr("special_tokens_map.json: a symbolic link"));
  EXPECT_FALSE(AnyFileHolds(data_dir(), kSecret));
  // The same link in the place of the tokenizer of a text dataset.
  fs::remove(model() / "special_tokens_map.json");
  fs::create_symlink(outside() / "secret", model() / "tokenizer.json");
  WriteFile(root() / "text.jsonl", "{\"text\": \"hello\"}\n");
  const fs::path text = Spec("t");
  WriteFile(text, std::regex_replace(Slurp(text), std::regex("ids\\.jsonl"), "text.jsonl"));
  const Result r = Cli("submit " + text.string() + " --job-id tok");
  EXPECT_EQ(r.rc, 4) << r.err;  // refused at CreateJob (the scan reads the tokenizer)
  EXPECT_THAT(r.err, HasSubstr("tokenizer.json: a symbolic link"));
  EXPECT_FALSE(AnyFileHolds(data_dir(), kSecret));
}

// Item 2: paths checked at CreateJob and swapped for links while the job waits are refused when
// the job opens them; nothing is read from or written outside the roots.
TEST_F(SecurityTest, PathsSwappedForLinksWhileAJobWaitsAreRefusedAtTheOpen) {
  StartDaemon({"--set", "scheduler.hold=true"});
  fs::create_directories(root() / "ckpt");
  const fs::path spec = Spec("j", "");
  WriteFile(spec, std::regex_replace(Slurp(spec), std::regex("checkpoint: \\{"),
                                     "checkpoint: {dir: " + (root() / "ckpt").string() + ", "));
  ASSERT_EQ(OombJson(ep(), "submit " + spec.string() + " --job-id swap", tmp_->path())["state"], "QUEUED");
  daemon_->Stop();
  // The attack: data.train becomes a link to the secret, checkpoint.dir a link out of the root.
  fs::remove(root() / "ids.jsonl");
  fs::create_symlink(outside() / "secret", root() / "ids.jsonl");
  fs::remove_all(root() / "ckpt");
  fs::create_directory_symlink(outside(), root() / "ckpt");
  StartDaemon();
  EXPECT_EQ(Cli("watch swap").rc, 6);
  const json job = OombJson(ep(), "get swap", tmp_->path());
  EXPECT_EQ(job["error"]["reason"], "PATH_DENIED") << job.dump();
  EXPECT_THAT(job["error"]["message"].get<std::string>(), HasSubstr("a symbolic link"));
  EXPECT_EQ(std::vector<fs::path>(fs::directory_iterator(outside()), fs::directory_iterator()),
            std::vector<fs::path>{outside() / "secret"});  // nothing written outside
  // Only the dataset a link: refused at the open too, the checkpoint dir untouched.
  fs::remove(root() / "ckpt");
  fs::create_directories(root() / "ckpt2");
  WriteFile(spec, std::regex_replace(Slurp(spec), std::regex("/ckpt,"), "/ckpt2,"));
  const Result r = Cli("submit " + spec.string() + " --job-id swap2");
  EXPECT_EQ(r.rc, 4) << r.err;
  EXPECT_THAT(r.err, HasSubstr("data.train: " + (root() / "ids.jsonl").string() + ": a symbolic link"));
}

// Item 3: the daemon's own store (and anything in its data dir) is never a job's input or
// output, whatever paths.allowed_roots says; so the daemon never opens and closes its database
// file for a job (which would drop its SQLite locks).
TEST_F(SecurityTest, TheDataDirIsNeverAJobsInputOrOutput) {
  StartDaemon();
  const std::string db = (data_dir() / "oombd.db").string();
  const Result train = Cli("submit " + Spec("j").string() + " --set data.train=" + db);
  EXPECT_EQ(train.rc, 4) << train.err;
  EXPECT_THAT(train.err, HasSubstr("data.train: " + db + " is inside the server's data directory"));
  for (const std::string& wal : {db + "-wal", db + "-shm", (data_dir() / "oombd.port").string()}) {
    EXPECT_EQ(Cli("submit " + Spec("j").string() + " --set data.validation=" + wal).rc, 4) << wal;
  }
  // Through a link in the root: refused at the open.
  fs::create_symlink(db, root() / "store.jsonl");
  const Result link = Cli("submit " + Spec("j").string() + " --set data.train=" + (root() / "store.jsonl").string());
  EXPECT_EQ(link.rc, 4) << link.err;
  // Through a hard link in the root (the same file under another name; issue 52): refused before
  // a descriptor that could drop the store's locks is opened.
  fs::create_hard_link(db, root() / "store-hard.jsonl");
  const Result hard =
      Cli("submit " + Spec("j").string() + " --job-id hard --set data.train=" + (root() / "store-hard.jsonl").string());
  std::string refusal = hard.err;
  if (hard.rc == 0) {  // refused in the VALIDATING state
    EXPECT_EQ(Cli("watch hard").rc, 6);
    refusal = OombJson(ep(), "get hard", tmp_->path())["error"]["message"].get<std::string>();
  }
  EXPECT_THAT(refusal, HasSubstr("is a hard link to a file of the server's data directory"));
  // As a checkpoint dir: the data dir itself, and another job's default checkpoint folder.
  ASSERT_EQ(OombJson(ep(), "submit " + Spec("j").string() + " --job-id first", tmp_->path())["name"],
            "projects/default/jobs/first");
  EXPECT_EQ(Cli("watch first").rc, 0);
  for (const fs::path& dir : {data_dir(), data_dir() / "jobs" / "first" / "checkpoints"}) {
    const Result r = Cli("submit " + Spec("j").string() + " --set checkpoint.dir=" + dir.string());
    EXPECT_EQ(r.rc, 4) << dir << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr("inside the server's data directory"));
  }
  // The store is intact: another process opens it, and the daemon's jobs survive a restart.
  const Result check = Shell("python3 -c \"import sqlite3; c = sqlite3.connect('" + db +
                                 "'); print(c.execute('pragma integrity_check').fetchone()[0]); c.close()\"",
                             tmp_->path());
  EXPECT_THAT(check.out, HasSubstr("ok"));
  daemon_->Stop();
  StartDaemon();
  EXPECT_EQ(OombJson(ep(), "get first", tmp_->path())["state"], "SUCCEEDED");
}

// Item 4: one daemon per data dir, and a TCP port is never shared.
TEST_F(SecurityTest, ASecondDaemonOnTheSameDataDirOrPortIsRefused) {
  StartDaemon();
  const Result second = Shell(Oombd() + " serve --data-dir " + data_dir().string() +
                                  " --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --http-listen 127.0.0.1:0",
                              tmp_->path());
  EXPECT_NE(second.rc, 0);
  EXPECT_THAT(second.err, HasSubstr("another oombd (pid "));
  EXPECT_THAT(second.err, HasSubstr("is serving the data dir " + data_dir().string()));
  const Result port = Shell(Oombd() + " serve --data-dir " + (tmp_->path() / "other").string() + " --listen " + ep() +
                                " --metrics-listen 127.0.0.1:0 --http-listen 127.0.0.1:0",
                            tmp_->path());
  EXPECT_NE(port.rc, 0);
  EXPECT_THAT(port.err, HasSubstr("cannot listen on " + ep()));
  EXPECT_EQ(Cli("health").rc, 0);  // the first one serves on
}

// Item 5: a checkpoint directory belongs to one job.
TEST_F(SecurityTest, ACheckpointDirectoryBelongsToOneJob) {
  StartDaemon({"--set", "scheduler.hold=true"});
  const std::string shared = (root() / "shared").string();
  ASSERT_EQ(OombJson(ep(), "submit " + Spec("j").string() + " --job-id one --set checkpoint.dir=" + shared,
                     tmp_->path())["name"],
            "projects/default/jobs/one");
  for (const std::string& dir : {shared, shared + "/inside"}) {
    const Result r = Cli("submit " + Spec("j").string() + " --set checkpoint.dir=" + dir);
    EXPECT_EQ(r.rc, 1) << dir << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr("FAILED_PRECONDITION")) << dir;
    EXPECT_THAT(r.err, HasSubstr("the checkpoint directory of projects/default/jobs/one")) << dir;
  }
  const Result above = Cli("submit " + Spec("j").string() + " --set checkpoint.dir=" + root().string());
  EXPECT_EQ(above.rc, 1) << above.err;
  EXPECT_THAT(above.err, HasSubstr("FAILED_PRECONDITION"));
  // Once the first job has claimed it, a job created elsewhere (its store record gone) finds
  // the claim on disk.
  daemon_->Stop();
  StartDaemon();
  EXPECT_EQ(Cli("watch one").rc, 0);
  EXPECT_EQ(Slurp(fs::path(shared) / "oomb_job"), "one\n");
  DaemonOptions o;
  o.extra = {"--set", "paths.allowed_roots=" + root().string()};
  Daemon other(tmp_->path() / "other-data", o);
  const Result r =
      Oomb(other.tcp_endpoint(), "submit " + Spec("j").string() + " --set checkpoint.dir=" + shared, tmp_->path());
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("is the checkpoint directory of job one"));
  // A directory holding someone else's files is not taken over either.
  fs::create_directories(root() / "mine");
  WriteFile(root() / "mine" / "notes.txt", "keep me");
  const Result foreign = Cli("submit " + Spec("j").string() + " --set checkpoint.dir=" + (root() / "mine").string());
  EXPECT_EQ(foreign.rc, 1) << foreign.err;
  EXPECT_THAT(foreign.err, HasSubstr("is not empty"));
  // `oomb checkpoints` lists only the job's own.
  const json cps = OombJson(ep(), "checkpoints one", tmp_->path());
  for (const json& c : cps["checkpoints"]) EXPECT_THAT(c["path"].get<std::string>(), HasSubstr(shared));
}

// Issue 78's low finding: a hard link placed in one's own checkpoint directory, to a file
// outside the roots, was served by download. The daemon writes each checkpoint file with one
// link, so a file of several is refused, naming it, and nothing of the secret reaches --dir.
TEST_F(SecurityTest, AHardLinkInACheckpointIsNeverServed) {
  StartDaemon();
  const fs::path ckpt = root() / "ckpt";
  ASSERT_EQ(OombJson(ep(), "submit " + Spec("j").string() + " --job-id linked --set checkpoint.dir=" + ckpt.string(),
                     tmp_->path())["name"],
            "projects/default/jobs/linked");
  ASSERT_EQ(Cli("watch linked").rc, 0);
  ASSERT_EQ(Cli("download linked --dir " + (tmp_->path() / "clean").string()).rc, 0);  // served before the link
  const fs::path final_dir = ckpt / "final";
  ASSERT_TRUE(fs::exists(final_dir / "adapter_config.json"));
  fs::create_hard_link(outside() / "secret", final_dir / "notes.txt");
  const fs::path dl = tmp_->path() / "dl";
  const Result r = Cli("download linked --dir " + dl.string());
  EXPECT_NE(r.rc, 0);
  EXPECT_THAT(r.err, HasSubstr("notes.txt has 2 hard links"));
  EXPECT_FALSE(fs::exists(dl) && AnyFileHolds(dl, kSecret));
  // A link in place of one of the checkpoint's own files, with the name the manifest lists.
  fs::remove(final_dir / "notes.txt");
  fs::remove(final_dir / "adapter_config.json");
  fs::create_hard_link(outside() / "secret", final_dir / "adapter_config.json");
  const Result named = Cli("download linked --dir " + (tmp_->path() / "dl2").string());
  EXPECT_NE(named.rc, 0);
  EXPECT_THAT(named.err, HasSubstr("adapter_config.json has 2 hard links"));
  EXPECT_FALSE(fs::exists(tmp_->path() / "dl2") && AnyFileHolds(tmp_->path() / "dl2", kSecret));
}

// Item 6: every message a client receives, and every string stored, is bounded, whatever the
// input's size: a huge JSONL line without its closing quote, a bad inline line over 8 KB.
TEST_F(SecurityTest, HugeInputNeverReachesMessagesOrTheStore) {
  StartDaemon();
  // Inline (CreateJob scans it): 64 KB in one bad line.
  WriteFile(root() / "inline.jsonl", "{\"text\": \"" + std::string(64 << 10, 'a') + "\n");
  const Result inline_bad =
      Cli("submit " + Spec("j").string() + " --set data.train=" + (root() / "inline.jsonl").string());
  EXPECT_EQ(inline_bad.rc, 1) << inline_bad.err.substr(0, 2000);
  EXPECT_THAT(inline_bad.err, HasSubstr("inline.jsonl:1: invalid JSON"));
  EXPECT_LT(inline_bad.err.size(), 4096u);
  // In the VALIDATING state: a 20 MB line (over the 16 MiB inline limit).
  {
    std::ofstream big(root() / "big.jsonl");
    big << "{\"input_ids\": [1, 2, 3]}\n{\"text\": \"" << std::string(20 << 20, 'x') << "\n";
  }
  ASSERT_EQ(
      OombJson(ep(),
               "submit " + Spec("j").string() + " --job-id big --set data.train=" + (root() / "big.jsonl").string(),
               tmp_->path())["state"],
      "VALIDATING");
  EXPECT_EQ(Cli("watch big").rc, 6);
  const Result get = Cli("get big -o json");
  ASSERT_EQ(get.rc, 0) << get.err;
  const json job = json::parse(get.out);
  EXPECT_EQ(job["error"]["reason"], "BAD_DATA");
  EXPECT_THAT(job["error"]["message"].get<std::string>(), HasSubstr("big.jsonl:2: the line is longer than"));
  EXPECT_LT(job["error"]["message"].get<std::string>().size(), 4096u);
  EXPECT_LT(get.out.size(), 16384u);
  for (const char* cmd : {"list -o json", "events big -o json", "get big"}) {
    const Result r = Cli(cmd);
    EXPECT_EQ(r.rc, 0) << cmd << ": " << r.err.substr(0, 500);
  }
  EXPECT_LT(fs::file_size(data_dir() / "oombd.db"), 8u << 20);
  // A long job name is echoed short.
  const Result name = Cli("get " + std::string(100000, 'n'));
  EXPECT_NE(name.rc, 0);
  EXPECT_LT(name.err.size(), 4096u);
  EXPECT_THAT(name.err, HasSubstr("more bytes"));
}

// Item 8: input whose meaning used to change silently is an error naming file:line:field, through
// the real CLI (and, for what only the daemon can see, the real daemon).
TEST_F(SecurityTest, InputWhoseMeaningWouldChangeIsRefused) {
  StartDaemon({"--set", "scheduler.hold=true"});
  const std::string base =
      "model: {path: " + model().string() + ", dtype: float32}\ndata: {train: " + (root() / "ids.jsonl").string() +
      ", max_seq_len: 128}\nmemory: {chunk_tokens: 32, page_tokens: 16}\nresources: {device: cpu}\n";
  const auto refused = [&](const std::string& name, const std::string& yaml) {
    const fs::path p = root() / (name + ".yaml");
    WriteFile(p, yaml);
    return Cli("submit " + p.string());
  };
  Result r = refused("nan", base + "training: {learning_rate: nan}\n");
  EXPECT_EQ(r.rc, 1);
  EXPECT_THAT(r.err, HasSubstr("nan.yaml:5: training.learning_rate: must be a finite number"));
  r = refused("dup", base + "training: {max_steps: 5}\ntraining: {learning_rate: 0.1}\n");
  EXPECT_THAT(r.err, HasSubstr("dup.yaml:6: training: duplicate key"));
  r = refused("two", base + "---\nmodel: {path: /elsewhere}\n");
  EXPECT_THAT(r.err, HasSubstr("a second YAML document"));
  r = refused("label", base + "labels: {team: {name: nlp}}\n");
  EXPECT_THAT(r.err, HasSubstr("label.yaml:5: labels.team: expected a single value, got a mapping"));
  r = refused("factor", base + "model_extra: 1\n");
  EXPECT_THAT(r.err, HasSubstr("factor.yaml:5: model_extra: unknown key"));
  r = Cli("submit " + Spec("j").string() + " --set 'model.rope_scaling={type: yarn, factor: 0}'");
  EXPECT_THAT(r.err, HasSubstr("model.rope_scaling.factor: must be in (0, 1024], got 0"));
  r = Cli("submit " + Spec("j").string() + " --set memory.page_tokens=4611686018427387904");
  EXPECT_THAT(r.err, HasSubstr("memory.page_tokens: must be in (0, 65536]"));
  r = refused("bytes", base + "display_name: caf\xe9\n");
  EXPECT_EQ(r.rc, 1);  // not 134: an error, not an abort
  EXPECT_THAT(r.err, HasSubstr("bytes.yaml:5: display_name: is not valid UTF-8"));
  // A legal file name that is not UTF-8: named, not a crash.
  const fs::path odd = root() / "caf\xe9";
  fs::create_directories(odd);
  WriteFile(odd / "spec.yaml", "model: {path: m}\ndata: {train: t.jsonl}\n");
  r = Cli("submit " + (odd / "spec.yaml").string());
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("model.path: is not valid UTF-8"));
  // Absurd model dimensions: refused when the model is read, not planned into negative bytes.
  fs::create_directories(root() / "absurd");
  WriteFile(root() / "absurd" / "config.json",
            R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000,
                "hidden_size": 1099511627776, "intermediate_size": 11008, "num_hidden_layers": 32,
                "num_attention_heads": 32, "max_position_embeddings": 4096})");
  r = Cli("submit " + Spec("j").string() + " --set model.path=" + (root() / "absurd").string());
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("key 'hidden_size' must be in [1, 131072]"));
  // Every label masked: nothing to train on, said at CreateJob.
  WriteFile(root() / "masked.jsonl", "{\"input_ids\": [5, 6, 7], \"labels\": [-100, -100, -100]}\n");
  r = Cli("submit " + Spec("j").string() + " --set data.train=" + (root() / "masked.jsonl").string());
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("no token carries a label"));
  EXPECT_EQ(Cli("health").rc, 0);
}

// Item 9: every failure carries its reason as data (JobError.reason), also those that used to
// have none: a corrupt safetensors file, a spec the model cannot run. An unknown LoRA target
// module is refused at submit, naming the field.
TEST_F(SecurityTest, EveryFailureHasAReason) {
  StartDaemon();
  const Result unknown = Cli("submit " + Spec("j").string() + " --set method.lora.target_modules=[nope]");
  EXPECT_EQ(unknown.rc, 1) << unknown.err;
  EXPECT_THAT(unknown.err, HasSubstr("method.lora.target_modules: unknown module 'nope'"));
  // A spec the model cannot run, accepted at submit and refused when the job starts: a needle
  // evaluation of a model without a tokenizer (its training data is pre-tokenized).
  WriteFile(root() / "haystack.txt", "A haystack.");
  const json submitted = OombJson(ep(),
                                  "submit " + Spec("j").string() + " --job-id target --set evaluation.suites=[needle]" +
                                      " --set evaluation.haystack=" + (root() / "haystack.txt").string() +
                                      " --set evaluation.lengths=[64] --set resources.max_retries=2",
                                  tmp_->path());
  ASSERT_EQ(submitted["name"], "projects/default/jobs/target") << submitted.dump();
  EXPECT_EQ(Cli("watch target").rc, 6);
  const json target = OombJson(ep(), "get target", tmp_->path());
  EXPECT_EQ(target["error"]["reason"], "BAD_SPEC") << target.dump();
  EXPECT_THAT(target["error"]["message"].get<std::string>(),
              HasSubstr("evaluation.suites: passkey, needle and ruler need the model's tokenizer"));
  EXPECT_EQ(target.value("retries", 0), 0);  // a failure that would repeat is not retried
  EXPECT_EQ(target.value("attempt", 0), 1);
  // Sparse attention on a model with sliding-window layers (the tiny Llama made a Mistral with a
  // window) runs: the global layers select pages, the windowed ones attend over their window.
  const fs::path windowed = root() / "windowed";
  fs::create_directories(windowed);
  for (const auto& e : fs::directory_iterator(model())) fs::copy(e.path(), windowed / e.path().filename());
  json config = json::parse(Slurp(windowed / "config.json"));
  config["architectures"] = {"MistralForCausalLM"};
  config["model_type"] = "mistral";
  config["sliding_window"] = 8;
  WriteFile(windowed / "config.json", config.dump());
  ASSERT_EQ(OombJson(ep(),
                     "submit " + Spec("j").string() + " --job-id windowed --set model.path=" + windowed.string() +
                         " --set attention.mode=sparse",
                     tmp_->path())["name"],
            "projects/default/jobs/windowed");
  EXPECT_EQ(Cli("watch windowed").rc, 0);
  // The weights cut short after CreateJob accepted the model.
  const std::string weights = Slurp(model() / "model.safetensors");
  WriteFile(model() / "model.safetensors", weights.substr(0, weights.size() / 2));
  ASSERT_EQ(OombJson(ep(), "submit " + Spec("j").string() + " --job-id corrupt", tmp_->path())["name"],
            "projects/default/jobs/corrupt");
  EXPECT_EQ(Cli("watch corrupt").rc, 6);
  const json corrupt = OombJson(ep(), "get corrupt", tmp_->path());
  EXPECT_EQ(corrupt["error"]["reason"], "BAD_MODEL") << corrupt.dump();
  EXPECT_THAT(corrupt["error"]["message"].get<std::string>(), HasSubstr("model.safetensors"));
}

// Item 10: partial checkpoints a kill -9 or a full disk leaves are removed when the job runs
// again; what the job wrote before stays.
TEST_F(SecurityTest, PartialCheckpointsAreRemovedWhenTheJobRunsAgain) {
  StartDaemon({"--set", "scheduler.hold=true"});
  ASSERT_EQ(OombJson(ep(), "submit " + Spec("j").string() + " --job-id left", tmp_->path())["name"],
            "projects/default/jobs/left");
  const fs::path ckpt = data_dir() / "jobs" / "left" / "checkpoints";
  fs::create_directories(ckpt / "checkpoint-7.tmp-4242");
  WriteFile(ckpt / "checkpoint-7.tmp-4242" / "optimizer.pt", std::string(1 << 20, 'z'));
  WriteFile(ckpt / ".trainer_state.json.tmp-4242-0", "{");
  daemon_->Stop();
  StartDaemon();
  EXPECT_EQ(Cli("watch left").rc, 0);
  for (const auto& e : fs::directory_iterator(ckpt)) {
    EXPECT_THAT(e.path().filename().string(), Not(HasSubstr(".tmp-"))) << e.path();
  }
  EXPECT_TRUE(fs::exists(ckpt / "final" / "adapter_model.safetensors"));
}

// Issue 52, item 1: every number read from a file a client names is bounded before anything is
// sized by it, with an error naming the file and the key. An adapter_config.json whose rank
// would have the daemon allocate gigabytes fails the job, and the daemon's memory stays put.
TEST_F(SecurityTest, NumbersInClientNamedFilesAreBoundedBeforeAnyAllocation) {
  StartDaemon();
  WriteFile(root() / "heldout.jsonl", Slurp(root() / "ids.jsonl"));
  const int64_t rss_before = daemon_->PeakRssBytes();
  for (const auto& [name, r] : {std::pair{"huge", "200000"}, {"float", "1e9"}, {"zero", "0"}}) {
    const fs::path adapter = root() / (std::string("adapter-") + name);
    fs::create_directories(adapter);
    WriteFile(adapter / "adapter_config.json", std::string(R"({"peft_type": "LORA", "r": )") + r +
                                                   R"(, "lora_alpha": 16, "target_modules": ["q_proj"]})");
    WriteFile(adapter / "adapter_model.safetensors", std::string("\x02\0\0\0\0\0\0\0{}", 10));  // no tensors
    const fs::path spec = root() / (std::string("eval-") + name + ".yaml");
    WriteFile(spec, "model: {path: " + model().string() +
                        ", dtype: float32}\nmethod: {type: evaluate, lora: " + "{init_adapter: " + adapter.string() +
                        "}}\ndata: {validation: " + (root() / "heldout.jsonl").string() + ", max_seq_len: 128}\n" +
                        "memory: {chunk_tokens: 32, page_tokens: 16}\nresources: {device: cpu}\n");
    const std::string id = std::string("eval-") + name;
    ASSERT_EQ(OombJson(ep(), "submit " + spec.string() + " --job-id " + id, tmp_->path())["name"],
              "projects/default/jobs/" + id);
    EXPECT_EQ(Cli("watch " + id).rc, 6) << name;
    const json job = OombJson(ep(), "get " + id, tmp_->path());
    const std::string message = job["error"]["message"].get<std::string>();
    EXPECT_THAT(message, HasSubstr((adapter / "adapter_config.json").string() + ": key 'r'")) << name;
    EXPECT_THAT(message, HasSubstr(std::string(name) == "float" ? "expected an integer" : "must be in [1, 4096]"));
  }
  EXPECT_LT(daemon_->PeakRssBytes() - rss_before, int64_t{256} << 20);
  // config.json (and the base_config.json a checkpoint carries, read by the same parser): values
  // that would overflow the planner's arithmetic or make the model meaningless are refused at
  // submission, naming the file and the key.
  const json base = json::parse(Slurp(model() / "config.json"));
  const auto refused = [&](const std::string& name, const json& patch) {
    const fs::path dir = root() / ("config-" + name);
    fs::create_directories(dir);
    for (const auto& e : fs::directory_iterator(model())) fs::copy(e.path(), dir / e.path().filename());
    json config = base;
    config.merge_patch(patch);
    WriteFile(dir / "config.json", config.dump());
    const Result r = Cli("submit " + Spec("j").string() + " --validate-only --set model.path=" + dir.string());
    EXPECT_EQ(r.rc, 1) << name << ": " << r.out;
    EXPECT_THAT(r.err, HasSubstr((dir / "config.json").string())) << name;
    return r.err;
  };
  EXPECT_THAT(refused("factor", {{"rope_parameters", {{"rope_type", "linear"}, {"factor", 1e300}}}}),
              HasSubstr("key 'factor' must be in (0, 1024], got 1e+300"));
  EXPECT_THAT(refused("theta", {{"rope_theta", -1}}), HasSubstr("key 'rope_theta' must be in (1, 1e+12], got -1"));
  EXPECT_THAT(refused("eps", {{"rms_norm_eps", 0}}), HasSubstr("key 'rms_norm_eps' must be in (0, 0.1], got 0"));
  EXPECT_THAT(refused("positions", {{"max_position_embeddings", int64_t{1} << 62}}),
              HasSubstr("key 'max_position_embeddings' must be in [1, 1073741824]"));
  EXPECT_THAT(refused("partial", {{"partial_rotary_factor", 2.0}}), HasSubstr("partial_rotary_factor 2"));
  EXPECT_THAT(refused("partial0", {{"partial_rotary_factor", 0.0}}), HasSubstr("partial_rotary_factor 0"));
  const json mistral = {{"architectures", {"MistralForCausalLM"}}, {"model_type", "mistral"}};
  for (const int64_t window : {int64_t{0}, int64_t{1} << 62}) {
    json patch = mistral;
    patch["sliding_window"] = window;
    EXPECT_THAT(refused("window" + std::to_string(window), patch),
                HasSubstr("key 'sliding_window' must be in [1, 1073741824], got " + std::to_string(window)));
  }
  EXPECT_EQ(Cli("health").rc, 0);
}

// Issue 52, item 3: a dataset's lines are read with memory bounded by a constant. A 3 GB file
// without a newline (sparse: nothing but its first bytes is written) is refused once 64 bytes a
// token of max_seq_len (at least 16 MiB) of its line were read, naming file:line, and the
// daemon's peak memory stays far below the line's size.
TEST_F(SecurityTest, AMultiGigabyteLineIsRefusedInBoundedMemory) {
  StartDaemon();
  const fs::path huge = root() / "huge.jsonl";
  WriteFile(huge, "{\"input_ids\": [1, 2, 3]}\n{\"text\": \"");
  fs::resize_file(huge, int64_t{3} << 30);
  ASSERT_EQ(OombJson(ep(), "submit " + Spec("j").string() + " --job-id huge --set data.train=" + huge.string(),
                     tmp_->path())["state"],
            "VALIDATING");
  EXPECT_EQ(Cli("watch huge").rc, 6);
  const json job = OombJson(ep(), "get huge", tmp_->path());
  EXPECT_EQ(job["error"]["reason"], "BAD_DATA") << job.dump();
  EXPECT_THAT(job["error"]["message"].get<std::string>(),
              HasSubstr("huge.jsonl:2: the line is longer than 16777216 bytes"));
  EXPECT_LT(daemon_->PeakRssBytes(), int64_t{1} << 30);
}

// Issue 52, item 2: a client told DEADLINE_EXCEEDED never finds a job created for it. Twelve
// CreateJobs at once, each scanning a 6 MB dataset inline, with deadlines too short for most:
// every client that failed finds no job with its label, every one that succeeded exactly one
// (the CLI retries with its request id, so a job created as the deadline passed is the one it
// is given).
TEST_F(SecurityTest, ACallerWhoseDeadlinePassedFindsNoJob) {
  StartDaemon({"--set", "scheduler.hold=true"});
  WriteIdsJsonl(root() / "six-mb.jsonl", 600, 2000);
  const int kClients = 12;
  std::vector<std::thread> clients;
  std::vector<Result> results(kClients);
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      const std::string timeout = i + 1 == kClients ? "60" : std::to_string(0.05 * (i + 1));
      results[i] = Shell(OombCli() + " --endpoint " + ep() + " --timeout " + timeout + " submit " +
                             Spec("j" + std::to_string(i)).string() + " --set labels.client=c" + std::to_string(i) +
                             " --set data.train=" + (root() / "six-mb.jsonl").string() + " --set data.max_seq_len=4096",
                         tmp_->path());
    });
  }
  for (std::thread& t : clients) t.join();
  const json list = OombJson(ep(), "list --page-size 1000", tmp_->path());
  std::map<std::string, int> jobs_of;
  for (const json& j : list.value("jobs", json::array())) jobs_of[j["labels"].value("client", "")]++;
  int failed = 0, past_deadline = 0;
  for (int i = 0; i < kClients; ++i) {
    const std::string label = "c" + std::to_string(i);
    if (results[i].rc == 0) {
      EXPECT_EQ(jobs_of[label], 1) << label;
    } else {
      ++failed;
      past_deadline += results[i].err.find("DEADLINE_EXCEEDED") != std::string::npos;
      EXPECT_EQ(jobs_of[label], 0) << label << " was told: " << results[i].err;
    }
  }
  std::cerr << failed << " of " << kClients << " clients were refused, " << past_deadline << " past their deadline\n";
  EXPECT_GT(past_deadline, 0);                            // the shortest deadlines pass while the datasets are read
  EXPECT_EQ(results.back().rc, 0) << results.back().err;  // a minute is enough
}

// Issue 52, item 4: `oombd data retrieval -o` replaces a link at its output path, never writes
// through it.
TEST_F(SecurityTest, DataRetrievalNeverWritesThroughALink) {
  if (!fs::exists(SmolLm2() / "tokenizer.json")) GTEST_SKIP() << "no SmolLM2 under " << DataDir();
  WriteFile(outside() / "target", kSecret);
  fs::create_symlink(outside() / "target", root() / "out.jsonl");
  const Result r = Shell(Oombd() + " data retrieval --model " + SmolLm2().string() +
                             " --suite passkey --lengths 256 --depths 1 --seed 7 -o " + (root() / "out.jsonl").string(),
                         tmp_->path());
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(Slurp(outside() / "target"), kSecret);
  EXPECT_FALSE(fs::is_symlink(root() / "out.jsonl"));
  EXPECT_THAT(Slurp(root() / "out.jsonl"), HasSubstr("\"input_ids\""));
}

// Issue 52, item 4: an adapter whose weights are NaN fails its evaluation (NAN_LOSS), never a
// success with the loss left out.
TEST_F(SecurityTest, ANonFiniteAdapterFailsItsEvaluation) {
  StartDaemon();
  ASSERT_EQ(
      OombJson(ep(),
               "submit " + Spec("j").string() + " --job-id trained --set checkpoint.dir=" + (root() / "run").string(),
               tmp_->path())["name"],
      "projects/default/jobs/trained");
  ASSERT_EQ(Cli("watch trained").rc, 0);
  const fs::path adapter = root() / "run" / "final";
  std::string weights = Slurp(adapter / "adapter_model.safetensors");
  ASSERT_GT(weights.size(), 8u);
  uint64_t header = 0;
  std::memcpy(&header, weights.data(), 8);
  std::fill(weights.begin() + 8 + static_cast<std::ptrdiff_t>(header), weights.end(), '\xff');  // NaN bit patterns
  WriteFile(adapter / "adapter_model.safetensors", weights);
  WriteFile(root() / "heldout.jsonl", Slurp(root() / "ids.jsonl"));
  const fs::path spec = root() / "eval-nan.yaml";
  WriteFile(spec, "model: {path: " + model().string() +
                      ", dtype: float32}\nmethod: {type: evaluate, lora: " + "{init_adapter: " + adapter.string() +
                      "}}\ndata: {validation: " + (root() / "heldout.jsonl").string() + ", max_seq_len: 128}\n" +
                      "memory: {chunk_tokens: 32, page_tokens: 16}\nresources: {device: cpu}\n");
  ASSERT_EQ(OombJson(ep(), "submit " + spec.string() + " --job-id nan", tmp_->path())["name"],
            "projects/default/jobs/nan");
  EXPECT_EQ(Cli("watch nan").rc, 6);
  const json job = OombJson(ep(), "get nan", tmp_->path());
  EXPECT_EQ(job["error"]["reason"], "NAN_LOSS") << job.dump();
  EXPECT_THAT(job["error"]["message"].get<std::string>(), HasSubstr("non-finite weights in method.lora.init_adapter"));
}

// Issue 52, item 4: a file the spec names that is gone when the job runs (here the dataset,
// deleted while the job waited) fails it as BAD_SPEC naming the path, not a reasonless INTERNAL.
TEST_F(SecurityTest, AFileGoneBeforeTheRunIsTheSpecsFault) {
  StartDaemon({"--set", "scheduler.hold=true"});
  WriteFile(root() / "doomed.jsonl", Slurp(root() / "ids.jsonl"));
  ASSERT_EQ(
      OombJson(ep(),
               "submit " + Spec("j").string() + " --job-id gone --set data.train=" + (root() / "doomed.jsonl").string(),
               tmp_->path())["state"],
      "QUEUED");
  fs::remove(root() / "doomed.jsonl");
  daemon_->Stop();
  StartDaemon();
  EXPECT_EQ(Cli("watch gone").rc, 6);
  const json job = OombJson(ep(), "get gone", tmp_->path());
  EXPECT_EQ(job["error"]["reason"], "BAD_SPEC") << job.dump();
  EXPECT_THAT(job["error"]["message"].get<std::string>(), HasSubstr("doomed.jsonl"));
}

}  // namespace
}  // namespace oomb::testing
