// Webhooks (server/notify/webhooks.h, webhook_sender.h): the Standard Webhooks signature on the
// specification's own example, which events each endpoint hears and what the body carries, and
// the sender against a real HTTP receiver on loopback (cpp-httplib) through a real SQLite
// outbox: signed, retried with the same webhook-id, redirects not followed, given up in time.
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

// A receiver on loopback recording what it was sent, answering with `status` (then 200).
class Receiver {
 public:
  explicit Receiver(std::vector<int> statuses) : statuses_(std::move(statuses)) {
    server_.Post("/hook", [this](const httplib::Request& req, httplib::Response& res) {
      absl::MutexLock lock(&mu_);
      requests_.push_back(req);
      const int status = requests_.size() <= statuses_.size() ? statuses_[requests_.size() - 1] : 200;
      res.status = status;
      if (status == 302) res.set_header("Location", "/elsewhere");
      res.set_content(status >= 400 ? "busy" : "ok", "text/plain");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~Receiver() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return absl::StrCat("http://127.0.0.1:", port_, "/hook"); }
  std::vector<httplib::Request> requests() {
    absl::MutexLock lock(&mu_);
    return requests_;
  }

 private:
  std::vector<int> statuses_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  absl::Mutex mu_;
  std::vector<httplib::Request> requests_;
};

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

  // A job that ends SUCCEEDED at once, telling `url`.
  void Succeed(const std::string& id, const std::string& url) {
    v1::Job job = TestJob();
    job.set_name("projects/nlp/jobs/" + id);
    job.set_state(v1::Job::QUEUED);
    v1::WebhookSpec* w = job.mutable_spec()->mutable_notifications()->add_webhooks();
    w->set_url(url);
    w->set_secret_file((dir_ / "hook.secret").string());
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
  WebhookSender sender(store_.get(), &files_,
                       WebhookSenderOptions{.retry_initial = absl::Milliseconds(300), .retry_max = absl::Seconds(1)});
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
  WebhookSender sender(store_.get(), &files_,
                       WebhookSenderOptions{.retry_initial = absl::Hours(1), .give_up_after = absl::Hours(1)});
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
  WebhookSender impatient(store_.get(), &files_, WebhookSenderOptions{.give_up_after = absl::ZeroDuration()});
  EXPECT_EQ(impatient.SendDue(), 1);
  EXPECT_EQ(*store_->PendingWebhooks(), 1);  // "d" given up and dropped; "r" waits
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
