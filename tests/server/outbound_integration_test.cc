// Issue 78's outbound attacks, performed for real against the real daemon and CLI: a tenant's
// job naming a loopback service as its webhook or MLflow server, in every spelling (127.0.0.1,
// [::1], 2130706433, 0x7f000001, localhost), is refused at submit naming the field; with the
// operator's entry for one loopback address, a receiver there that redirects to another
// loopback address is not followed. Real listeners on loopback record that no request reached
// what the policy refuses.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/client/daemon_harness.h"

namespace oomb::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kSecret[] = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

// A listener on a loopback address that records every request, answering `status` (a 302 points
// at `location`).
class Listener {
 public:
  Listener(const std::string& host, int status, std::string location = "")
      : host_(host), status_(status), location_(std::move(location)) {
    const auto record = [this](const httplib::Request& req, httplib::Response& res) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        paths_.push_back(req.method + " " + req.path);
      }
      res.status = status_;
      if (!location_.empty()) res.set_header("Location", location_);
    };
    server_.Get(".*", record);
    server_.Post(".*", record);
    port_ = server_.bind_to_any_port(host_.c_str());
    if (port_ <= 0) return;
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~Listener() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }
  bool listening() const { return port_ > 0; }
  int port() const { return port_; }
  std::string url(const std::string& host = "") const {
    const std::string h = host.empty() ? host_ : host;
    return "http://" + (h.find(':') != std::string::npos ? "[" + h + "]" : h) + ":" + std::to_string(port_) + "/hook";
  }
  std::vector<std::string> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return paths_;
  }

 private:
  const std::string host_;
  const int status_;
  const std::string location_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::string> paths_;
};

class OutboundTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(TinyLlama() / "config.json")) GTEST_SKIP() << "no test models under " << DataDir();
    tmp_ = std::make_unique<TempDir>();
    fs::create_directories(root());
    WriteIdsJsonl(root() / "ids.jsonl", 4, 100);
    WriteFile(root() / "hook.secret", kSecret);
  }
  void TearDown() override {
    daemon_.reset();
    tmp_.reset();
  }
  fs::path root() const { return tmp_->path() / "root"; }

  void StartDaemon(std::vector<std::string> extra = {}) {
    DaemonOptions o;
    o.extra = {"--set", "paths.allowed_roots=" + root().string() + "," + TinyLlama().string(), "--set",
               "notifications.retry_initial_seconds=1"};
    o.extra.insert(o.extra.end(), extra.begin(), extra.end());
    daemon_ = std::make_unique<Daemon>(root() / "data", o);
    ASSERT_GT(daemon_->port(), 0) << daemon_->log();
  }
  Result Cli(const std::string& args) { return Oomb(daemon_->tcp_endpoint(), args, tmp_->path()); }

  // A tiny job telling `url` of its events (or, with `mlflow`, tracked on `url`).
  fs::path Spec(const std::string& name, const std::string& url, bool mlflow = false) {
    std::string yaml = TinyJobYaml((root() / "ids.jsonl").string(), 2, 1);
    yaml += mlflow ? "tracking: {mlflow: {uri: '" + url + "'}}\n"
                   : "notifications: {webhooks: [{url: '" + url +
                         "', secret_file: " + (root() / "hook.secret").string() + "}]}\n";
    const fs::path p = root() / (name + ".yaml");
    WriteFile(p, yaml);
    return p;
  }

  std::unique_ptr<TempDir> tmp_;
  std::unique_ptr<Daemon> daemon_;
};

TEST_F(OutboundTest, ALoopbackServiceIsRefusedAtSubmitInEverySpelling) {
  Listener v4("127.0.0.1", 200);
  Listener v6("::1", 200);
  StartDaemon();
  std::vector<std::string> urls = {
      v4.url(),        v4.url("2130706433"),      v4.url("0x7f000001"), v4.url("localhost"),
      v4.url("127.1"), v4.url("::ffff:127.0.0.1")};
  if (v6.listening()) urls.push_back(v6.url());
  int i = 0;
  for (const std::string& url : urls) {
    for (const bool mlflow : {false, true}) {
      const Result r = Cli("submit " + Spec("j" + std::to_string(i++), url, mlflow).string());
      EXPECT_EQ(r.rc, 1) << url << ": " << r.err;
      EXPECT_THAT(r.err, HasSubstr(mlflow ? "tracking.mlflow.uri: destination "
                                          : "notifications.webhooks[0].url: "
                                            "destination "))
          << url;
      EXPECT_THAT(r.err, HasSubstr("is loopback")) << url;
    }
  }
  EXPECT_THAT(Cli("list -o json").out, Not(HasSubstr("projects/")));  // no job was created
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));       // anything sent would have arrived by now
  EXPECT_TRUE(v4.requests().empty());
  EXPECT_TRUE(v6.requests().empty());
}

TEST_F(OutboundTest, ARedirectFromAnAllowedReceiverToARefusedOneIsNotFollowed) {
  Listener refused("127.0.0.2", 200);
  ASSERT_TRUE(refused.listening());
  Listener allowed("127.0.0.1", 302, refused.url());
  StartDaemon({"--set", "outbound.allow=127.0.0.1"});
  // The allowed one is taken; the refused one, named directly, is not.
  const Result direct = Cli("submit " + Spec("direct", refused.url()).string());
  EXPECT_EQ(direct.rc, 1) << direct.err;
  EXPECT_THAT(direct.err, HasSubstr("destination 127.0.0.2 is loopback"));
  const Result r = Cli("submit " + Spec("redirected", allowed.url()).string() + " --job-id redirected --watch");
  EXPECT_EQ(r.rc, 0) << r.err;
  for (int waited = 0; waited < 100 && allowed.requests().size() < 2; ++waited)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_GE(allowed.requests().size(), 2u);  // checkpoint.saved and job.succeeded, answered 302
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_TRUE(refused.requests().empty());
}

}  // namespace
}  // namespace oomb::testing
