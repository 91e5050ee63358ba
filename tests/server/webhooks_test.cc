// Webhooks (server/notify/webhooks.h, webhook_sender.h): the Standard Webhooks signature on the
// specification's own example, which events each endpoint hears and what the body carries, and
// the sender against a real HTTP receiver on loopback (cpp-httplib) through a real SQLite
// outbox: signed, retried with the same webhook-id, redirects not followed, given up in time;
// issue 78: a job's endpoint on loopback (in every spelling) reached only where the operator
// allows it, a redirect to a refused one not followed, a hanging endpoint delaying no other.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/job_files.h"
#include "server/notify/destination_policy.h"
#include "server/notify/webhook_sender.h"
#include "server/notify/webhooks.h"
#include "server/store/job_store.h"

namespace oomb::server {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// The example of the Standard Webhooks specification (its README, "Signature scheme").
constexpr char kSpecSecret[] = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

TEST(WebhookSignatureTest, SignsTheSpecificationsExample) {
  absl::StatusOr<std::string> key = ParseWebhookSecret(absl::StrCat("  ", kSpecSecret, "\n"), "s");
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(SignWebhook(*key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, "{\"test\": 2432232314}"),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
}

TEST(WebhookSignatureTest, SecretsThatAreNotOneAreRefusedNamingTheirSource) {
  for (const char* bad : {"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_!!!notbase64", "whsec_c2hvcnQ="}) {
    absl::StatusOr<std::string> key = ParseWebhookSecret(bad, "/etc/hook.secret");
    EXPECT_EQ(key.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(key.status().message(), HasSubstr("/etc/hook.secret")) << bad;
  }
}

v1::Job TestJob() {
  v1::Job job;
  job.set_name("projects/nlp/jobs/j1");
  job.set_state(v1::Job::SUCCEEDED);
  job.mutable_spec()->set_display_name("long run");
  (*job.mutable_labels())["team"] = "search";
  job.mutable_progress()->set_step(40);
  job.mutable_progress()->set_loss(1.25);
  job.set_checkpoint_dir("/ck/j1");
  return job;
}

v1::JobEvent StateChange(v1::Job::State state, const std::string& message = "") {
  v1::JobEvent e;
  e.set_type(v1::JobEvent::STATE_CHANGED);
  e.set_state(state);
  e.set_message(message);
  e.set_sequence(7);
  return e;
}

TEST(WebhookEventsTest, EachNotifiedEventHasItsType) {
  v1::Job job = TestJob();
  EXPECT_EQ(WebhookEventType(job, StateChange(v1::Job::SUCCEEDED)), "job.succeeded");
  EXPECT_EQ(WebhookEventType(job, StateChange(v1::Job::FAILED)), "job.failed");
  EXPECT_EQ(WebhookEventType(job, StateChange(v1::Job::CANCELLED)), "job.cancelled");
  EXPECT_EQ(WebhookEventType(job, StateChange(v1::Job::PAUSED)), "job.paused");
  EXPECT_EQ(WebhookEventType(job, StateChange(v1::Job::RUNNING)), "");
  EXPECT_EQ(WebhookEventType(job, StateChange(v1::Job::QUEUED)), "");  // queued, not preempted
  job.set_preempted_by("projects/nlp/jobs/urgent");
  EXPECT_EQ(WebhookEventType(job, StateChange(v1::Job::QUEUED)), "job.preempted");
  v1::JobEvent checkpoint;
  checkpoint.set_type(v1::JobEvent::CHECKPOINT_SAVED);
  EXPECT_EQ(WebhookEventType(job, checkpoint), "checkpoint.saved");
  v1::JobEvent step;
  step.set_type(v1::JobEvent::STEP);
  EXPECT_EQ(WebhookEventType(job, step), "");
  step.mutable_progress()->mutable_evaluation()->set_step(40);
  EXPECT_EQ(WebhookEventType(job, step), "evaluation.finished");
  EXPECT_EQ(WebhookEventType(v1::Notification::evaluation_finished), "evaluation.finished");
}

TEST(WebhookEventsTest, EachEndpointGetsTheEventsItListsWithTheJobsSummary) {
  v1::Job job = TestJob();
  v1::WebhookSpec* all = job.mutable_spec()->mutable_notifications()->add_webhooks();
  all->set_url("https://a.example/hook");
  all->set_secret_file("/data/nlp/a.secret");
  v1::WebhookSpec* failures = job.mutable_spec()->mutable_notifications()->add_webhooks();
  failures->set_url("https://b.example/hook");
  failures->set_secret_file("/data/nlp/b.secret");
  failures->add_events(v1::Notification::job_failed);
  v1::WebhookSpec project;
  project.set_url("https://platform.example/oomb");
  project.set_secret_file("/etc/oomb/nlp.secret");
  project.add_events(v1::Notification::job_succeeded);

  const std::vector<OutboxMessage> m =
      WebhookMessages(job, StateChange(v1::Job::SUCCEEDED, "completed 40 steps"), {project});
  ASSERT_EQ(m.size(), 2u);  // b hears only failures
  EXPECT_EQ(m[0].url, "https://a.example/hook");
  EXPECT_EQ(m[0].secret_project, "nlp");  // the job's secret: read beneath the project's roots
  EXPECT_EQ(m[1].url, "https://platform.example/oomb");
  EXPECT_EQ(m[1].secret_project, "");  // the daemon's own
  EXPECT_NE(m[0].webhook_id, m[1].webhook_id);
  EXPECT_THAT(m[0].webhook_id, ::testing::MatchesRegex("msg_[0-9a-f]{32}"));
  EXPECT_EQ(m[0].payload, m[1].payload);
  const nlohmann::json body = nlohmann::json::parse(m[0].payload);
  EXPECT_EQ(body["type"], "job.succeeded");
  EXPECT_EQ(body["data"]["job"], "projects/nlp/jobs/j1");
  EXPECT_EQ(body["data"]["project"], "nlp");
  EXPECT_EQ(body["data"]["display_name"], "long run");
  EXPECT_EQ(body["data"]["labels"]["team"], "search");
  EXPECT_EQ(body["data"]["state"], "SUCCEEDED");
  EXPECT_EQ(body["data"]["reason"], "completed 40 steps");
  EXPECT_EQ(body["data"]["sequence"], 7);
  EXPECT_EQ(body["data"]["progress"]["step"], "40");  // int64 as a string: the proto3 JSON mapping
  EXPECT_EQ(body["data"]["progress"]["loss"], 1.25);
  EXPECT_EQ(body["data"]["checkpoint_dir"], "/ck/j1");
  EXPECT_EQ(WebhookMessages(job, StateChange(v1::Job::FAILED), {project}).size(), 2u);  // a and b
  EXPECT_TRUE(WebhookMessages(job, StateChange(v1::Job::RUNNING), {project}).empty());
}

// A receiver on loopback (`host`) recording what it was sent, answering with `status` (then
// 200); a 302 points at `location`.
class Receiver {
 public:
  explicit Receiver(std::vector<int> statuses, std::string host = "127.0.0.1", std::string location = "/elsewhere")
      : statuses_(std::move(statuses)), host_(std::move(host)) {
    server_.Post("/hook", [this, location](const httplib::Request& req, httplib::Response& res) {
      absl::MutexLock lock(&mu_);
      requests_.push_back(req);
      const int status = requests_.size() <= statuses_.size() ? statuses_[requests_.size() - 1] : 200;
      res.status = status;
      if (status == 302) res.set_header("Location", location);
      res.set_content(status >= 400 ? "busy" : "ok", "text/plain");
    });
    port_ = server_.bind_to_any_port(host_.c_str());
    if (port_ <= 0) return;  // e.g. no IPv6 loopback here
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~Receiver() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }
  bool listening() const { return port_ > 0; }
  int port() const { return port_; }
  std::string url() const {
    return absl::StrCat("http://", host_.find(':') != std::string::npos ? "[" + host_ + "]" : host_, ":", port_,
                        "/hook");
  }
  std::vector<httplib::Request> requests() {
    absl::MutexLock lock(&mu_);
    return requests_;
  }

 private:
  std::vector<int> statuses_;
  const std::string host_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  absl::Mutex mu_;
  std::vector<httplib::Request> requests_;
};

// The operator's allow-list entry these tests need: their receivers listen on loopback.
DestinationPolicyOf LoopbackAllowed() {
  const DestinationPolicy p = *DestinationPolicy::Parse({"127.0.0.0/8", "::1"}, {}, "outbound");
  return [p](const std::string&) { return p; };
}

class WebhookSenderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("oomb_webhooks_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "hook.secret") << kSpecSecret << "\n";
    absl::StatusOr<std::unique_ptr<JobStore>> s = OpenSqliteJobStore((dir_ / "oombd.db").string());
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
    store_->SetOutboxPolicy(WebhookOutboxPolicy(nullptr, /*job_webhooks=*/true));
  }
  void TearDown() override {
    store_.reset();
    fs::remove_all(dir_);
  }

  // A job that ends SUCCEEDED at once, telling `url` (and `more`).
  void Succeed(const std::string& id, const std::string& url, const std::vector<std::string>& more = {}) {
    v1::Job job = TestJob();
    job.set_name("projects/nlp/jobs/" + id);
    job.set_state(v1::Job::QUEUED);
    std::vector<std::string> urls = {url};
    urls.insert(urls.end(), more.begin(), more.end());
    for (const std::string& u : urls) {
      v1::WebhookSpec* w = job.mutable_spec()->mutable_notifications()->add_webhooks();
      w->set_url(u);
      w->set_secret_file((dir_ / "hook.secret").string());
    }
    ASSERT_TRUE(store_->Create(job, "", {}).ok());
    ASSERT_TRUE(store_
                    ->Update(id,
                             [](v1::Job* j, std::vector<v1::JobEvent>* events) {
                               j->set_state(v1::Job::SUCCEEDED);
                               events->push_back(StateChange(v1::Job::SUCCEEDED, "done"));
                               return absl::OkStatus();
                             })
                    .ok());
  }

  fs::path dir_;
  std::unique_ptr<JobStore> store_;
  JobFiles files_ = JobFiles::Unconfined("/nonexistent");
};

TEST_F(WebhookSenderTest, DeliversSignedAndRetriesAFailureWithTheSameId) {
  Receiver receiver({503});
  Succeed("a", receiver.url());
  WebhookSender sender(
      store_.get(), &files_,
      WebhookSenderOptions{
          .retry_initial = absl::Milliseconds(300), .retry_max = absl::Seconds(1), .destinations = LoopbackAllowed()});
  EXPECT_EQ(sender.SendDue(), 1);  // 503: kept, due again in 300 ms
  EXPECT_EQ(*store_->PendingWebhooks(), 1);
  EXPECT_EQ(sender.SendDue(), 0);
  absl::SleepFor(absl::Milliseconds(400));
  EXPECT_EQ(sender.SendDue(), 1);  // 200: delivered
  EXPECT_EQ(*store_->PendingWebhooks(), 0);
  EXPECT_EQ(sender.SendDue(), 0);

  const std::vector<httplib::Request> got = receiver.requests();
  ASSERT_EQ(got.size(), 2u);
  const std::string key = *ParseWebhookSecret(kSpecSecret, "s");
  for (const httplib::Request& r : got) {
    EXPECT_EQ(r.get_header_value("Content-Type"), "application/json");
    const std::string id = r.get_header_value("webhook-id");
    const int64_t timestamp = std::stoll(r.get_header_value("webhook-timestamp"));
    EXPECT_LT(std::abs(timestamp - absl::ToUnixSeconds(absl::Now())), 60);
    EXPECT_EQ(r.get_header_value("webhook-signature"), SignWebhook(key, id, timestamp, r.body));
    EXPECT_EQ(nlohmann::json::parse(r.body)["type"], "job.succeeded");
  }
  EXPECT_EQ(got[0].get_header_value("webhook-id"), got[1].get_header_value("webhook-id"));
  EXPECT_EQ(got[0].body, got[1].body);
}

TEST_F(WebhookSenderTest, ARedirectIsNotFollowedAndADeadEndpointIsGivenUpInTime) {
  Receiver receiver({302});
  Succeed("r", receiver.url());
  WebhookSender sender(
      store_.get(), &files_,
      WebhookSenderOptions{
          .retry_initial = absl::Hours(1), .give_up_after = absl::Hours(1), .destinations = LoopbackAllowed()});
  EXPECT_EQ(sender.SendDue(), 1);
  EXPECT_EQ(receiver.requests().size(), 1u);  // not followed to /elsewhere
  EXPECT_EQ(*store_->PendingWebhooks(), 1);   // and kept: not a 2xx
  EXPECT_EQ(sender.SendDue(), 0);             // due in an hour

  // A port bound and closed again: connections to it are refused.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int closed_port = ntohs(addr.sin_port);
  ::close(fd);
  Succeed("d", absl::StrCat("http://127.0.0.1:", closed_port, "/hook"));
  WebhookSender impatient(
      store_.get(), &files_,
      WebhookSenderOptions{.give_up_after = absl::ZeroDuration(), .destinations = LoopbackAllowed()});
  EXPECT_EQ(impatient.SendDue(), 1);
  EXPECT_EQ(*store_->PendingWebhooks(), 1);  // "d" given up and dropped; "r" waits
}

// The job's WARNING events' messages.
std::vector<std::string> Warnings(JobStore* store, const std::string& id) {
  std::vector<std::string> out;
  absl::StatusOr<std::vector<v1::JobEvent>> events = store->ListEvents(id, 0, 1000);
  if (!events.ok()) return out;
  for (const v1::JobEvent& e : *events) {
    if (e.type() == v1::JobEvent::WARNING) out.push_back(e.message());
  }
  return out;
}

// Issue 78: a job naming loopback in every spelling reaches nothing without the operator's
// entry: each message is dropped at once, the job told why, and no request arrives.
TEST_F(WebhookSenderTest, AJobsLoopbackEndpointIsReachedInNoSpelling) {
  Receiver v4({});
  Receiver v6({}, "::1");
  const std::string port = std::to_string(v4.port());
  std::vector<std::string> urls;
  for (const char* host : {"127.0.0.1", "localhost", "2130706433", "0x7f000001", "0177.0.0.1", "127.1",
                           "[::ffff:127.0.0.1]", "[::ffff:7f00:1]"}) {
    urls.push_back(absl::StrCat("http://", host, ":", port, "/hook"));
  }
  if (v6.listening()) urls.push_back(v6.url());
  Succeed("attack", urls[0], std::vector<std::string>(urls.begin() + 1, urls.end()));
  WebhookSender sender(store_.get(), &files_, WebhookSenderOptions{});  // the default: public addresses only
  int attempted = 0;  // several spellings are one endpoint: a pass takes what its lane has room for
  for (int pass = 0; pass < 10 && attempted < static_cast<int>(urls.size()); ++pass) {
    attempted += sender.SendDue();
    if (attempted < static_cast<int>(urls.size())) absl::SleepFor(absl::Milliseconds(300));
  }
  EXPECT_EQ(attempted, static_cast<int>(urls.size()));
  EXPECT_EQ(*store_->PendingWebhooks(), 0);  // dropped: no retry would pass
  EXPECT_TRUE(v4.requests().empty());
  EXPECT_TRUE(v6.requests().empty());
  const std::vector<std::string> warnings = Warnings(store_.get(), "attack");
  ASSERT_EQ(warnings.size(), urls.size());
  for (const std::string& w : warnings) EXPECT_THAT(w, HasSubstr("is loopback")) << w;
  EXPECT_THAT(warnings, ::testing::Contains(HasSubstr("destination localhost (")));
}

// A redirect from an endpoint the operator allows to one it does not is never followed.
TEST_F(WebhookSenderTest, ARedirectToARefusedDestinationIsNotFollowed) {
  Receiver refused({}, "127.0.0.2");
  ASSERT_TRUE(refused.listening());
  Receiver allowed({302}, "127.0.0.1", refused.url());
  Succeed("redirect", allowed.url());
  const DestinationPolicy only = *DestinationPolicy::Parse({"127.0.0.1"}, {}, "outbound");
  WebhookSender sender(store_.get(), &files_,
                       WebhookSenderOptions{.retry_initial = absl::Hours(1),
                                            .destinations = [only](const std::string&) { return only; }});
  EXPECT_EQ(sender.SendDue(), 1);
  EXPECT_EQ(allowed.requests().size(), 1u);
  EXPECT_TRUE(refused.requests().empty());
  EXPECT_EQ(*store_->PendingWebhooks(), 1);  // a 302 is no delivery: retried in an hour
}

// A listener that takes connections and never answers: a receiver that hangs.
class HangingEndpoint {
 public:
  HangingEndpoint() : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd_, 64) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return;
    }
    port_ = ntohs(addr.sin_port);
  }
  ~HangingEndpoint() { ::close(fd_); }
  std::string url() const { return absl::StrCat("http://127.0.0.1:", port_, "/hook"); }

 private:
  int fd_;
  int port_ = 0;
};

// Issue 78: deliveries are isolated per endpoint: with one endpoint hanging (its attempts
// running into their timeout), another endpoint's messages arrive within a second each.
TEST_F(WebhookSenderTest, AHangingEndpointDelaysNoOtherEndpoint) {
  HangingEndpoint hanging;
  Receiver fast({});
  for (int i = 0; i < 6; ++i) Succeed(absl::StrCat("slow", i), hanging.url());
  WebhookSender sender(store_.get(), &files_,
                       WebhookSenderOptions{.poll = absl::Milliseconds(100),
                                            .attempt_timeout = absl::Seconds(4),
                                            .destinations = LoopbackAllowed(),
                                            .max_concurrent = 4,
                                            .per_endpoint = 2});
  sender.Start();
  absl::SleepFor(absl::Milliseconds(300));  // the hanging endpoint's attempts are under way
  for (int i = 0; i < 3; ++i) {
    const absl::Time sent = absl::Now();
    Succeed(absl::StrCat("fast", i), fast.url());
    while (fast.requests().size() < static_cast<size_t>(i + 1) && absl::Now() - sent < absl::Seconds(5)) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_EQ(fast.requests().size(), static_cast<size_t>(i + 1));
    EXPECT_LT(absl::Now() - sent, absl::Seconds(1)) << "message " << i;
    absl::SleepFor(absl::Milliseconds(400));
  }
  sender.Stop();
  EXPECT_EQ(*store_->PendingWebhooks(), 6);  // the hanging endpoint's, kept for later
}

TEST(WebhookRetryTest, WaitsDoubleUpToTheMaximumUntilGivenUp) {
  JobFiles files = JobFiles::Unconfined("/nonexistent");
  WebhookSender sender(
      nullptr, &files,
      WebhookSenderOptions{
          .retry_initial = absl::Seconds(5), .retry_max = absl::Seconds(60), .give_up_after = absl::Hours(72)});
  OutboxMessage m;
  const absl::Time now = absl::Now();
  m.created = now;
  EXPECT_EQ(sender.RetryIn(m, now), absl::Seconds(5));
  m.attempts = 2;
  EXPECT_EQ(sender.RetryIn(m, now), absl::Seconds(20));
  m.attempts = 30;
  EXPECT_EQ(sender.RetryIn(m, now), absl::Seconds(60));
  EXPECT_EQ(sender.RetryIn(m, now + absl::Hours(72)), std::nullopt);
}

}  // namespace
}  // namespace oomb::server
