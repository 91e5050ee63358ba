// Helpers for integration tests of the real binaries: a temporary directory, `oombd serve`
// as a child process (TCP on 127.0.0.1:0 and/or its Unix socket), the `oomb` CLI, shell
// commands with captured output, the test data (~/.cache/oomb/data, made by
// scripts/fetch_test_data.sh) and small job specs and datasets.
//
// Binaries come from the build tree the test was built in (OOMB_TEST_BINARY_DIR, overridden by
// env OOMB_BINARY_DIR); the data from env OOMB_DATA_DIR, else $HOME/.cache/oomb/data. Tests
// GTEST_SKIP when the data they need is absent.
#ifndef OOMB_TESTS_CLIENT_DAEMON_HARNESS_H_
#define OOMB_TESTS_CLIENT_DAEMON_HARNESS_H_

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace oomb::testing {

namespace fs = std::filesystem;
using json = nlohmann::json;

inline std::string BinaryDir() {
  const char* d = std::getenv("OOMB_BINARY_DIR");
  return d != nullptr ? d : OOMB_TEST_BINARY_DIR;
}
inline std::string Oombd() { return BinaryDir() + "/server/oombd"; }
inline std::string OombCli() { return BinaryDir() + "/client/oomb"; }
inline std::string SourceDir() { return OOMB_TEST_SOURCE_DIR; }

inline fs::path DataDir() {
  if (const char* d = std::getenv("OOMB_DATA_DIR"); d != nullptr && *d != '\0') return d;
  const char* home = std::getenv("HOME");
  return fs::path(home != nullptr ? home : "/root") / ".cache/oomb/data";
}
inline fs::path SmolLm2() { return DataDir() / "models/SmolLM2-135M-Instruct"; }
// A 2-layer Llama with a 256-token vocabulary and no tokenizer.json (tests/python/make_tiny_models.py).
inline fs::path TinyLlama() { return DataDir() / "tiny/llama-gqa"; }
inline fs::path VenvPython() {
  if (const char* p = std::getenv("OOMB_PYTHON"); p != nullptr && *p != '\0') return p;
  const char* home = std::getenv("HOME");
  return fs::path(home != nullptr ? home : "/root") / ".cache/oomb/venv/bin/python";
}

inline std::string Slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void WriteFile(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

// Polls `done` every `period` until it holds or `timeout` passes; returns its last value.
inline bool WaitFor(const std::function<bool()>& done, std::chrono::milliseconds timeout,
                    std::chrono::milliseconds period = std::chrono::milliseconds(50)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (done()) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(period);
  }
}

// A fresh directory under the system temp dir, removed on destruction.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("oomb_" + std::string(info != nullptr ? info->name() : "test") + "_" + std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

struct Result {
  int rc = -1;  // exit code; 128 + N when killed by signal N
  std::string out, err;
};

// Runs `command` with /bin/sh, stdout and stderr captured through files in `scratch`.
inline Result Shell(const std::string& command, const fs::path& scratch) {
  static int counter = 0;
  const std::string tag = std::to_string(::getpid()) + "_" + std::to_string(counter++);
  const fs::path out = scratch / ("sh_" + tag + ".out"), err = scratch / ("sh_" + tag + ".err");
  const int status = std::system((command + " >" + out.string() + " 2>" + err.string() + " </dev/null").c_str());
  Result r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
  r.out = Slurp(out);
  r.err = Slurp(err);
  fs::remove(out);
  fs::remove(err);
  return r;
}

// `oombd serve` in a child process, its stderr in <data_dir>/oombd.log; /metrics on
// 127.0.0.1:0 (the port is read from <data_dir>/oombd.metrics.port), so daemons of tests
// running in parallel never compete for metrics.listen's default port.
struct DaemonOptions {
  bool tcp = true;                 // listen on 127.0.0.1:0 (the port is read from <data_dir>/oombd.port)
  bool unix_socket = false;        // also (or only) <data_dir>/oombd.sock
  std::vector<std::string> extra;  // more flags, e.g. {"--set", "scheduler.hold=true"}
  std::vector<std::string> env;    // "NAME=value" set in the daemon's environment
  // A command the daemon runs under: argv before oombd's own (which follow as "$0" "$@" of a
  // `sh -c` prefix), e.g. {"/usr/bin/unshare", "-Urm", "sh", "-c", "mount ... && exec \"$0\" \"$@\""}.
  std::vector<std::string> prefix;

  static DaemonOptions UnixSocketOnly() {
    DaemonOptions o;
    o.tcp = false;
    o.unix_socket = true;
    return o;
  }
};

class Daemon {
 public:
  Daemon(fs::path data_dir, DaemonOptions options) : dir_(std::move(data_dir)), options_(std::move(options)) {
    fs::create_directories(dir_);
    Start();
  }
  ~Daemon() { Stop(); }
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Starts the process (again, after Kill or Stop) on the same data dir; waits until it serves.
  void Start() {
    fs::remove(dir_ / "oombd.port");
    fs::remove(dir_ / "oombd.metrics.port");
    fs::remove(dir_ / "oombd.health.port");
    fs::remove(dir_ / "oombd.http.port");
    std::vector<std::string> args = options_.prefix;
    args.insert(args.end(), {Oombd(), "serve", "--data-dir", dir_.string(), "--metrics-listen", "127.0.0.1:0",
                             "--http-listen", "127.0.0.1:0"});
    if (options_.tcp) {
      args.insert(args.end(), {"--listen", "127.0.0.1:0"});
    } else {
      args.insert(args.end(), {"--set", "server.listen="});
    }
    if (options_.unix_socket) args.push_back("--unix-socket");
    args.insert(args.end(), options_.extra.begin(), options_.extra.end());
    const std::string log = (dir_ / "oombd.log").string();
    const size_t log_offset = fs::exists(log) ? fs::file_size(log) : 0;
    pid_ = ::fork();
    if (pid_ == 0) {
      if (std::freopen(log.c_str(), "a", stderr) == nullptr) ::_exit(126);
      for (const std::string& e : options_.env) ::putenv(const_cast<char*>(e.c_str()));
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    WaitFor(
        [&] {
          if (!Alive()) return true;
          if (options_.tcp) return fs::exists(dir_ / "oombd.port") && !Slurp(dir_ / "oombd.port").empty();
          return Slurp(log).find("listening on unix:", log_offset) != std::string::npos;
        },
        std::chrono::seconds(30));
    if (options_.tcp && fs::exists(dir_ / "oombd.port")) port_ = std::atoi(Slurp(dir_ / "oombd.port").c_str());
    if (fs::exists(dir_ / "oombd.metrics.port")) {
      metrics_port_ = std::atoi(Slurp(dir_ / "oombd.metrics.port").c_str());
    }
    if (fs::exists(dir_ / "oombd.health.port")) health_port_ = std::atoi(Slurp(dir_ / "oombd.health.port").c_str());
    if (fs::exists(dir_ / "oombd.http.port")) http_port_ = std::atoi(Slurp(dir_ / "oombd.http.port").c_str());
  }

  // SIGTERM and wait (a clean shutdown).
  void Stop() { Signal(SIGTERM); }
  // SIGKILL and wait (a crash).
  void Kill() { Signal(SIGKILL); }
  // SIGTERM without waiting: the daemon drains while the test watches; then WaitExit().
  void BeginStop() const {
    if (pid_ > 0) ::kill(pid_, SIGTERM);
  }
  // Waits for the process to end; returns exit_code().
  int WaitExit() {
    Signal(0);
    return exit_code_;
  }

  bool Alive() const { return pid_ > 0 && ::waitpid(pid_, nullptr, WNOHANG) == 0; }
  // The process's peak resident memory so far (VmHWM), in bytes; 0 when it is not running.
  int64_t PeakRssBytes() const {
    if (pid_ <= 0) return 0;
    std::istringstream status(Slurp("/proc/" + std::to_string(pid_) + "/status"));
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
    }
    return 0;
  }
  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  // The plaintext health port (with --set server.health_listen=127.0.0.1:0); 0 when off.
  int health_port() const { return health_port_; }
  // The HTTP/JSON port (--http-listen 127.0.0.1:0); 0 when off.
  int http_port() const { return http_port_; }
  std::string tcp_endpoint() const { return "127.0.0.1:" + std::to_string(port_); }
  std::string unix_endpoint() const { return "unix:" + (dir_ / "oombd.sock").string(); }
  std::string log() const { return Slurp(dir_ / "oombd.log"); }
  const fs::path& data_dir() const { return dir_; }
  // How the last Stop or Kill ended: the exit code, or 128 + N when killed by signal N.
  int exit_code() const { return exit_code_; }

 private:
  void Signal(int sig) {  // 0: only wait
    if (pid_ <= 0) return;
    if (sig != 0) ::kill(pid_, sig);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
    pid_ = -1;
    port_ = 0;
    metrics_port_ = 0;
    health_port_ = 0;
    http_port_ = 0;
  }

  fs::path dir_;
  DaemonOptions options_;
  pid_t pid_ = -1;
  int port_ = 0;
  int exit_code_ = -1;
  int metrics_port_ = 0;
  int health_port_ = 0;
  int http_port_ = 0;
};

// Certificates made with the openssl command in `d`: a CA (ca.pem), a server certificate for
// 127.0.0.1 (server.pem, server.key) and a client certificate (client.pem, client.key), both
// signed by the CA. A failure is a fatal test failure.
inline void MakeCertificates(const fs::path& d) {
  const std::string cmd =
      "cd " + d.string() +
      " && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=oomb-test-ca"
      " && openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=127.0.0.1"
      " && printf 'subjectAltName=IP:127.0.0.1,DNS:localhost' > san.ext"
      " && openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2"
      " -extfile san.ext"
      " && openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj /CN=oomb-client"
      " && openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 2";
  const Result r = Shell(cmd, d);
  ASSERT_EQ(r.rc, 0) << r.err;
}

// The oomb CLI against `endpoint`.
inline Result Oomb(const std::string& endpoint, const std::string& args, const fs::path& scratch) {
  return Shell(OombCli() + " --endpoint " + endpoint + " --timeout 30 " + args, scratch);
}

// `oomb ... -o json`, parsed; a failed command fails the test and yields null.
inline json OombJson(const std::string& endpoint, const std::string& args, const fs::path& scratch) {
  const Result r = Oomb(endpoint, args + " -o json", scratch);
  EXPECT_EQ(r.rc, 0) << "oomb " << args << ": " << r.err;
  if (r.rc != 0) return json();
  return json::parse(r.out, nullptr, /*allow_exceptions=*/false);
}

// Every event of a job (ListJobEvents, all pages).
inline std::vector<json> AllEvents(const std::string& endpoint, const std::string& job, const fs::path& scratch) {
  std::vector<json> events;
  int64_t after = 0;
  for (;;) {
    const json page = OombJson(endpoint, "events " + job + " --after " + std::to_string(after), scratch);
    if (!page.is_object() || !page.contains("events")) break;
    for (const json& e : page["events"]) events.push_back(e);
    after = std::stoll(events.back()["sequence"].get<std::string>());
    if (!page.value("more", false)) break;
  }
  return events;
}

inline int64_t Seq(const json& event) { return std::stoll(event.at("sequence").get<std::string>()); }

// Follows `job` with `oomb watch -o json` and calls `kill` once a client has seen two
// checkpoints while the job still runs: the events seen (every one acknowledged to a client),
// empty when the job ended first.
inline std::vector<json> WatchUntilTheSecondCheckpoint(const std::string& endpoint, const std::string& job,
                                                       const std::function<void()>& kill) {
  FILE* watch =
      ::popen((OombCli() + " --endpoint " + endpoint + " watch " + job + " -o json 2>/dev/null").c_str(), "r");
  if (watch == nullptr) return {};
  std::vector<json> seen;
  int checkpoints_seen = 0;
  bool killed = false;
  char buf[1 << 16];
  while (std::fgets(buf, sizeof buf, watch) != nullptr) {
    const json r = json::parse(buf, nullptr, /*allow_exceptions=*/false);
    if (!r.contains("event")) continue;
    seen.push_back(r["event"]);
    if (r["event"]["type"] == "CHECKPOINT_SAVED" && !r["event"]["checkpoint"].value("final", false) &&
        ++checkpoints_seen == 2) {
      kill();
      killed = true;
      break;
    }
    if (r["event"]["type"] == "STATE_CHANGED" && r["event"]["state"] == "SUCCEEDED") break;
  }
  ::pclose(watch);
  return killed ? seen : std::vector<json>{};
}

// What the events after sequence `last_seen` (the restart) say: the states in order with the
// message of each, the step the job resumed at and its first step; and the newest checkpoint before.
struct AfterRestart {
  std::vector<std::string> states;
  std::map<std::string, std::string> state_messages;
  int64_t resumed_at = -1, first_step = -1, last_checkpoint_before = 0;
};
inline AfterRestart ReadAfterRestart(const std::vector<json>& events, int64_t last_seen) {
  AfterRestart out;
  for (const json& e : events) {
    const bool after = Seq(e) > last_seen;
    if (e["type"] == "CHECKPOINT_SAVED" && !after) {
      out.last_checkpoint_before = std::stoll(e["checkpoint"]["step"].get<std::string>());
    }
    if (!after) continue;
    if (e["type"] == "STATE_CHANGED") {
      out.states.push_back(e["state"]);
      out.state_messages[e["state"]] = e.value("message", "");
    }
    if (e["type"] == "WARNING" && e["message"].get<std::string>().find("resumed from ") != std::string::npos) {
      const std::string m = e["message"];
      out.resumed_at = std::stoll(m.substr(m.rfind("at step ") + 8));
    }
    if (e["type"] == "STEP" && out.first_step < 0)
      out.first_step = std::stoll(e["progress"]["step"].get<std::string>());
  }
  return out;
}

// A JSONL file of `lines` pre-tokenized samples of `length` ids in [3, vocab) (seeded).
inline void WriteIdsJsonl(const fs::path& path, int lines, int length, int vocab = 256, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  std::ofstream out(path);
  for (int i = 0; i < lines; ++i) {
    json ids = json::array();
    for (int k = 0; k < length; ++k) ids.push_back(3 + static_cast<int>(rng() % static_cast<uint32_t>(vocab - 3)));
    out << json{{"input_ids", ids}}.dump() << "\n";
  }
}

// A LoRA job on the tiny model (float32, CPU), small enough to take milliseconds a step:
// `steps` steps over `train` (pre-tokenized, max_seq_len 128), a checkpoint every
// `every_steps` steps (0: only the final one).
inline std::string TinyJobYaml(const std::string& train, int steps, int every_steps = 1,
                               const std::string& too_long = "truncate") {
  std::ostringstream y;
  y << "display_name: tiny\n"
    << "labels: {suite: integration}\n"
    << "model: {path: " << TinyLlama().string() << ", dtype: float32}\n"
    << "method: {type: lora, lora: {rank: 4, alpha: 8, target_modules: [q_proj, k_proj, v_proj, o_proj]}}\n"
    << "data: {train: " << train << ", max_seq_len: 128, too_long: " << too_long << ", packing: false}\n"
    << "training: {max_steps: " << steps
    << ", learning_rate: 1.0e-3, warmup_steps: 0, lr_schedule: constant, seed: 7}\n"
    << "memory: {chunk_tokens: 32, page_tokens: 16}\n"
    << "checkpoint: {every_steps: " << every_steps << ", keep_last: 2}\n"
    << "resources: {device: cpu, max_retries: 0}\n";
  return y.str();
}

}  // namespace oomb::testing

#endif  // OOMB_TESTS_CLIENT_DAEMON_HARNESS_H_
