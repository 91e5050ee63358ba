// Integration tests of what deployments rely on in `oombd serve` (deploy/, docs/DEPLOY.md),
// through the real binary:
//   - systemd's notification protocol (Type=notify): the test is the service manager, an
//     AF_UNIX datagram socket named by NOTIFY_SOCKET. READY=1 comes only once every port file
//     is written and the plaintext health port answers SERVING; WATCHDOG=1 under
//     WATCHDOG_USEC; STATUS= names the addresses and the jobs; STOPPING=1 comes when SIGTERM's
//     drain begins, and from then on the health port answers NOT_SERVING until it closes; the
//     daemon exits 0.
//   - server.health_listen beside TLS and a bearer token on the main port: the health port
//     stays plaintext, needs no token, and serves grpc.health.v1 only.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/client/daemon_harness.h"

namespace oomb::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Clock = std::chrono::steady_clock;

// Whether the notification `message` (newline-separated VAR=VALUE lines) has the line `line`.
bool HasLine(const std::string& message, const std::string& line) {
  return ("\n" + message + "\n").find("\n" + line + "\n") != std::string::npos;
}

// The value of `var` in `message` ("" when absent).
std::string Var(const std::string& message, const std::string& var) {
  const std::string m = "\n" + message + "\n";
  const size_t at = m.find("\n" + var + "=");
  if (at == std::string::npos) return "";
  const size_t begin = at + var.size() + 2;
  return m.substr(begin, m.find('\n', begin) - begin);
}

// The service manager's end of sd_notify(3): an AF_UNIX datagram socket at `path`. A thread
// receives every message, calls `on_message` with it (in that thread, as it arrives) and keeps
// it with its arrival time.
class NotifySocket {
 public:
  struct Message {
    std::string text;
    Clock::time_point at;
  };

  NotifySocket(const fs::path& path, std::function<void(const std::string&)> on_message)
      : on_message_(std::move(on_message)) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    EXPECT_LT(path.string().size(), sizeof addr.sun_path) << path;
    std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
    timeval tv{0, 100000};  // recv wakes every 100 ms to see stop_
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    thread_ = std::thread([this] { Receive(); });
  }
  ~NotifySocket() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  NotifySocket(const NotifySocket&) = delete;
  NotifySocket& operator=(const NotifySocket&) = delete;

  // The first message with the line `line`, waiting up to `timeout`; nullopt when none came.
  std::optional<Message> WaitFor(const std::string& line, std::chrono::seconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    std::optional<Message> found;
    cv_.wait_for(lock, timeout, [&] {
      for (const Message& m : messages_) {
        if (HasLine(m.text, line)) found = m;
        if (found) return true;
      }
      return false;
    });
    return found;
  }

  std::vector<Message> messages() const {
    std::lock_guard<std::mutex> lock(mu_);
    return messages_;
  }

 private:
  void Receive() {
    char buf[4096];
    while (!stop_) {
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) continue;
      const std::string text(buf, static_cast<size_t>(n));
      on_message_(text);
      std::lock_guard<std::mutex> lock(mu_);
      messages_.push_back({text, Clock::now()});
      cv_.notify_all();
    }
  }

  const std::function<void(const std::string&)> on_message_;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Message> messages_;
  std::thread thread_;
};

// grpc.health.v1 Check on a plaintext channel: the status name ("SERVING", "NOT_SERVING");
// "UNAVAILABLE" once the port is closed, "CANCELLED" for a call the closing server cut short;
// "error ..." for any other failure.
std::string CheckHealth(grpc::health::v1::Health::Stub& stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  const grpc::Status s = stub.Check(&ctx, req, &resp);
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) return "UNAVAILABLE";
  if (s.error_code() == grpc::StatusCode::CANCELLED) return "CANCELLED";
  if (!s.ok()) return "error " + std::to_string(s.error_code()) + " " + s.error_message();
  return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status());
}

std::unique_ptr<grpc::health::v1::Health::Stub> HealthStub(int port) {
  return grpc::health::v1::Health::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
}

// One answer of the health port, and when its request began.
struct Probe {
  Clock::time_point started;
  std::string answer;
};

// Polls `health` until it answers UNAVAILABLE (the port closed), for at most a minute.
std::vector<Probe> ProbeUntilClosed(grpc::health::v1::Health::Stub& health) {
  std::vector<Probe> probes;
  const Clock::time_point give_up = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < give_up) {
    const Clock::time_point started = Clock::now();
    probes.push_back({started, CheckHealth(health)});
    if (probes.back().answer == "UNAVAILABLE") break;
  }
  return probes;
}

// Health went NOT_SERVING before STOPPING=1 was sent (at `stopping`): no probe begun after it saw
// SERVING; and the port answered NOT_SERVING while the job checkpointed, before it closed.
void ExpectNotServingBeforeStopping(const std::vector<Probe>& probes, Clock::time_point stopping) {
  int not_serving = 0, serving_after_stopping = 0;
  std::string answers;
  for (const Probe& probe : probes) {
    answers += probe.answer + " ";
    serving_after_stopping += probe.started > stopping && probe.answer == "SERVING";
    not_serving += probe.answer == "NOT_SERVING";
  }
  EXPECT_EQ(serving_after_stopping, 0) << answers;
  EXPECT_GT(not_serving, 0) << answers;
  EXPECT_EQ(probes.back().answer, "UNAVAILABLE") << answers;
  EXPECT_THAT(answers, Not(HasSubstr("error"))) << answers;
}

// A job whose steps take a while (1024 tokens in 32-token chunks), so that a drain has to wait
// for its step to end and its checkpoint to be written; submitted as `long`, and running.
void SubmitALongJob(const Daemon& daemon, const fs::path& scratch) {
  WriteIdsJsonl(scratch / "ids.jsonl", 4, 1000);
  std::string spec = TinyJobYaml((scratch / "ids.jsonl").string(), 100000, /*every_steps=*/0);
  spec.replace(spec.find("max_seq_len: 128"), 16, "max_seq_len: 1024");
  WriteFile(scratch / "job.yaml", spec);
  const std::string ep = daemon.tcp_endpoint();
  ASSERT_EQ(OombJson(ep, "submit " + (scratch / "job.yaml").string() + " --job-id long", scratch).value("name", ""),
            "projects/default/jobs/long");
  ASSERT_TRUE(WaitFor(
      [&] {
        const json j = OombJson(ep, "get long", scratch);
        return j.contains("progress") && std::stoll(j["progress"].value("step", "0")) >= 1;
      },
      std::chrono::seconds(60)))
      << daemon.log();
}

TEST(DaemonSystemdTest, ReadyOnlyOnceServingAndStoppingWhenTheDrainBegins) {
  if (!fs::exists(TinyLlama() / "config.json")) GTEST_SKIP() << "no test models under " << DataDir();
  TempDir tmp;
  const fs::path data = tmp.path() / "data";
  // Which port files existed when READY=1 arrived (looked at in the receiving thread, at once).
  std::atomic<bool> ports_at_ready{false}, health_port_at_ready{false}, metrics_port_at_ready{false};
  NotifySocket notify(tmp.path() / "notify.sock", [&](const std::string& m) {
    if (!HasLine(m, "READY=1")) return;
    ports_at_ready = fs::exists(data / "oombd.port");
    health_port_at_ready = fs::exists(data / "oombd.health.port");
    metrics_port_at_ready = fs::exists(data / "oombd.metrics.port");
  });
  DaemonOptions o;
  // As systemd with WatchdogSec=2s would set it (WATCHDOG_PID absent: any process may ping).
  o.env = {"NOTIFY_SOCKET=" + (tmp.path() / "notify.sock").string(), "WATCHDOG_USEC=2000000"};
  o.extra = {"--set", "server.health_listen=127.0.0.1:0"};
  Daemon daemon(data, o);
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  ASSERT_GT(daemon.health_port(), 0) << daemon.log();

  const std::optional<NotifySocket::Message> ready = notify.WaitFor("READY=1", std::chrono::seconds(30));
  ASSERT_TRUE(ready.has_value()) << "no READY=1; log:\n" << daemon.log();
  EXPECT_TRUE(ports_at_ready && health_port_at_ready && metrics_port_at_ready)
      << "READY=1 before the port files were written: " << ports_at_ready << health_port_at_ready
      << metrics_port_at_ready;
  const std::string p = std::to_string(daemon.port()), hp = std::to_string(daemon.health_port()),
                    mp = std::to_string(daemon.metrics_port()), htp = std::to_string(daemon.http_port());
  const std::string addresses = "serving on 127.0.0.1:" + p + ", health 127.0.0.1:" + hp + ", metrics 127.0.0.1:" + mp +
                                ", http 127.0.0.1:" + htp;
  EXPECT_EQ(Var(ready->text, "STATUS"), addresses + "; no jobs");
  // The watchdog is pinged at half its interval.
  EXPECT_TRUE(notify.WaitFor("WATCHDOG=1", std::chrono::seconds(10)).has_value()) << "no WATCHDOG=1";
  std::unique_ptr<grpc::health::v1::Health::Stub> health = HealthStub(daemon.health_port());
  EXPECT_EQ(CheckHealth(*health), "SERVING");
  // Only health there: the job API answers UNIMPLEMENTED on the plaintext health port.
  const Result list = Oomb("127.0.0.1:" + hp, "list", tmp.path());
  EXPECT_EQ(list.rc, 1);
  EXPECT_THAT(list.err, HasSubstr("UNIMPLEMENTED"));

  SubmitALongJob(daemon, tmp.path());
  if (::testing::Test::HasFatalFailure()) return;
  // STATUS= is refreshed (with each ping here) with the store's job counts.
  const std::optional<NotifySocket::Message> running =
      notify.WaitFor("STATUS=" + addresses + "; jobs 1 running", std::chrono::seconds(15));
  EXPECT_TRUE(running.has_value()) << "no STATUS= with the running job";

  // SIGTERM, and the health port polled until it closes.
  daemon.BeginStop();
  const std::vector<Probe> probes = ProbeUntilClosed(*health);
  EXPECT_EQ(daemon.WaitExit(), 0) << daemon.log();
  const std::optional<NotifySocket::Message> stopping = notify.WaitFor("STOPPING=1", std::chrono::seconds(1));
  ASSERT_TRUE(stopping.has_value()) << "no STOPPING=1; log:\n" << daemon.log();
  EXPECT_THAT(Var(stopping->text, "STATUS"),
              HasSubstr("draining: running jobs checkpoint (at most 60 s); jobs 1 running"));
  ExpectNotServingBeforeStopping(probes, stopping->at);
  EXPECT_FALSE(fs::exists(data / "oombd.health.port"));

  // The drain checkpointed the job and left it QUEUED for the next start.
  daemon.Start();
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  bool checkpointed = false;
  for (const json& e : AllEvents(daemon.tcp_endpoint(), "long", tmp.path())) {
    checkpointed |= e["type"] == "CHECKPOINT_SAVED";
  }
  EXPECT_TRUE(checkpointed);
}

// TLS (and a bearer token) on the main port, plaintext on the health port: Kubernetes' gRPC
// probes reach health without either, and nothing else is served there.
TEST(DaemonHealthPortTest, StaysPlaintextBesideTlsAndATokenAndServesOnlyHealth) {
  if (Shell("openssl version", fs::temp_directory_path()).rc != 0) GTEST_SKIP() << "no openssl command";
  TempDir tmp;
  const fs::path d = tmp.path();
  MakeCertificates(d);
  if (::testing::Test::HasFatalFailure()) return;
  WriteFile(d / "token", "s3cret\n");
  DaemonOptions o;
  o.extra = {"--set",        "tls.cert_file=" + (d / "server.pem").string(),
             "--set",        "tls.key_file=" + (d / "server.key").string(),
             "--token-file", (d / "token").string(),
             "--set",        "server.health_listen=127.0.0.1:0"};
  Daemon daemon(d / "data", o);
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  ASSERT_GT(daemon.health_port(), 0) << daemon.log();
  EXPECT_THAT(daemon.log(), HasSubstr("oombd: health (plaintext grpc.health.v1) on 127.0.0.1:" +
                                      std::to_string(daemon.health_port())));
  const std::string main = daemon.tcp_endpoint(), health = "127.0.0.1:" + std::to_string(daemon.health_port());
  const std::string ca = " --ca " + (d / "ca.pem").string(), token = " --token-file " + (d / "token").string();

  const Result plain = Oomb(health, "health", d);
  EXPECT_EQ(plain.rc, 0) << plain.err;
  EXPECT_EQ(plain.out, "SERVING\n");
  EXPECT_EQ(Oomb(health, ca + " health", d).rc, 5);  // no TLS there: the handshake fails
  EXPECT_EQ(Oomb(main, "health", d).rc, 5);          // the main port is TLS only
  EXPECT_EQ(Oomb(main, ca + " health", d).rc, 0);
  EXPECT_EQ(Oomb(main, ca + token + " list", d).rc, 0);
  EXPECT_EQ(Oomb(main, ca + " list", d).rc, 4);  // UNAUTHENTICATED without the token
  for (const std::string& args : {std::string("list"), token + " list", token + " server-info"}) {
    const Result r = Oomb(health, args, d);
    EXPECT_EQ(r.rc, 1) << args;
    EXPECT_THAT(r.err, HasSubstr("UNIMPLEMENTED")) << args;
  }
}

}  // namespace
}  // namespace oomb::testing
