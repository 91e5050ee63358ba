// Issue 78: what the daemon sends on a tenant's behalf and reads back.
//   - the destination policy (server/notify/destination_policy.h): every non-public class
//     refused by default in every spelling, the operator's lists (most specific entry decides,
//     metadata opened only by its exact address), the config and projects-file keys, CreateJob's
//     errors naming the field;
//   - the MLflow client against real stand-in servers on loopback (cpp-httplib): every answer
//     shape that used to abort the daemon is that job's WARNING event instead; the operator's
//     token goes to the operator's server only; a job's own server on loopback is refused at
//     connect without the operator's entry, and nothing arrives.
// Only loopback is ever connected to; other addresses are judged, never reached (literals are
// not resolved, and no socket is opened at submit).
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/config.h"
#include "server/notify/destination_policy.h"
#include "server/notify/mlflow_tracker.h"
#include "server/notify/remote_answers.h"
#include "server/projects.h"
#include "server/store/job_store.h"

namespace oomb::server {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

IpAddress Ip(const std::string& text) { return *IpAddress::FromLiteral(text); }

void WriteFile(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

// --- The policy ---

TEST(DestinationPolicyTest, EveryClassButPublicIsRefusedByDefaultInEverySpelling) {
  const DestinationPolicy none;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"http://127.0.0.1:8080/hook", "127.0.0.1 is loopback"},
      {"http://[::1]:8080/hook", "::1 is loopback"},
      {"http://2130706433/", "127.0.0.1 is loopback"},
      {"http://0x7f000001/", "127.0.0.1 is loopback"},
      {"http://0177.0.0.1/", "127.0.0.1 is loopback"},
      {"http://127.1/", "127.0.0.1 is loopback"},
      {"https://[::ffff:127.0.0.1]/", "IPv4 127.0.0.1) is loopback"},
      {"http://[64:ff9b::7f00:1]/", "IPv4 127.0.0.1) is loopback"},
      {"http://[2002:7f00:1::1]/", "IPv4 127.0.0.1) is loopback"},
      {"http://10.1.2.3/", "is private"},
      {"http://172.16.0.1/", "is private"},
      {"http://192.168.1.1/", "is private"},
      {"http://100.64.0.1/", "is private (CGNAT)"},
      {"http://[fc00::1]/", "is private"},
      {"http://[fd12:3456::1]/", "is private"},
      {"http://169.254.169.254/latest/meta-data/", "is a cloud metadata service"},
      {"http://2852039166/", "169.254.169.254 is a cloud metadata service"},
      {"http://[::ffff:169.254.169.254]/", "is a cloud metadata service"},
      {"http://[fd00:ec2::254]/", "is a cloud metadata service"},
      {"http://168.63.129.16/", "is a cloud metadata service"},
      {"http://100.100.100.200/", "is a cloud metadata service"},
      {"http://169.254.1.1/", "is link-local"},
      {"http://[fe80::1]/", "is link-local"},
      {"http://0.0.0.0/", "is unspecified"},
      {"http://[::]/", "is unspecified"},
      {"http://224.0.0.1/", "is multicast"},
      {"http://[ff02::1]/", "is multicast"},
      {"http://240.0.0.1/", "is reserved"},
      {"http://255.255.255.255/", "is reserved"},
      {"http://localhost:1/", "destination localhost ("},
  };
  for (const auto& [url, what] : cases) {
    const absl::Status s = CheckDestinationUrl(url, none, "notifications.webhooks[0].url");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << url;
    EXPECT_THAT(s.message(), HasSubstr("notifications.webhooks[0].url: destination ")) << url;
    EXPECT_THAT(s.message(), HasSubstr(what)) << url;
  }
  EXPECT_THAT(CheckDestinationUrl("http://127.0.0.1/", none, "f").message(), HasSubstr("outbound.allow"));
  for (const char* url : {"http://93.184.216.34/hook", "https://[2606:4700::1111]:8443/x", "http://8.8.8.8:80/"}) {
    EXPECT_TRUE(CheckDestinationUrl(url, none, "f").ok()) << url;
  }
  for (const char* url : {"ftp://93.184.216.34/", "not a url", "http://"}) {
    EXPECT_EQ(CheckDestinationUrl(url, none, "tracking.mlflow.uri").code(), absl::StatusCode::kInvalidArgument) << url;
  }
}

TEST(DestinationPolicyTest, TheMostSpecificOperatorEntryDecides) {
  absl::StatusOr<DestinationPolicy> p = DestinationPolicy::Parse(
      {"127.0.0.0/8", "localhost", "*.corp.example", "169.254.0.0/16"}, {"127.0.0.2", "bad.corp.example"}, "outbound");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->Check("127.0.0.1", Ip("127.0.0.1")).ok());
  EXPECT_THAT(p->Check("127.0.0.2", Ip("127.0.0.2")).message(), HasSubstr("denied by the operator (127.0.0.2)"));
  EXPECT_FALSE(p->Check("::1", Ip("::1")).ok());       // 127/8 is not ::1
  EXPECT_TRUE(p->Check("localhost", Ip("::1")).ok());  // the name is allowed, whatever it resolves to
  EXPECT_TRUE(p->Check("ml.corp.example", Ip("10.0.0.1")).ok());
  EXPECT_FALSE(p->Check("corp.example", Ip("10.0.0.1")).ok());  // a wildcard covers names below it only
  EXPECT_THAT(p->Check("bad.corp.example", Ip("93.184.216.34")).message(), HasSubstr("denied by the operator"));
  EXPECT_TRUE(p->Check("169.254.1.1", Ip("169.254.1.1")).ok());
  // Metadata: only an entry naming exactly its address opens it.
  EXPECT_THAT(p->Check("169.254.169.254", Ip("169.254.169.254")).message(), HasSubstr("only an address entry"));
  EXPECT_FALSE(p->Check("ml.corp.example", Ip("169.254.169.254")).ok());
  const DestinationPolicy everything = *DestinationPolicy::Parse({"0.0.0.0/0", "::/0"}, {}, "outbound");
  EXPECT_TRUE(everything.Check("10.0.0.1", Ip("10.0.0.1")).ok());
  EXPECT_FALSE(everything.Check("169.254.169.254", Ip("169.254.169.254")).ok());
  EXPECT_FALSE(everything.Check("fd00:ec2::254", Ip("fd00:ec2::254")).ok());
  EXPECT_TRUE(
      DestinationPolicy::Parse({"169.254.169.254/32"}, {}, "o")->Check("169.254.169.254", Ip("169.254.169.254")).ok());
  // A project's entries added to the daemon's: the longer prefix wins whichever list it is in.
  const DestinationPolicy daemon = *DestinationPolicy::Parse({}, {"10.1.0.0/16", "93.184.216.0/24"}, "outbound");
  const DestinationPolicy project = daemon.With(*DestinationPolicy::Parse({"10.0.0.0/8"}, {}, "projects.nlp"));
  EXPECT_FALSE(project.Check("10.1.2.3", Ip("10.1.2.3")).ok());
  EXPECT_TRUE(project.Check("10.2.0.1", Ip("10.2.0.1")).ok());
  EXPECT_FALSE(daemon.Check("10.2.0.1", Ip("10.2.0.1")).ok());
  EXPECT_THAT(daemon.Check("93.184.216.34", Ip("93.184.216.34")).message(), HasSubstr("denied by the operator"));
  EXPECT_TRUE(daemon.Check("93.184.217.1", Ip("93.184.217.1")).ok());
  EXPECT_TRUE(DestinationPolicy::Unrestricted().Check("127.0.0.1", Ip("127.0.0.1")).ok());
}

TEST(DestinationPolicyTest, EntriesThatAreNeitherAddressesNorNamesAreRefusedNamingTheList) {
  for (const char* bad : {"10.0.0.0/33", "::/129", "not a host!", "*.", "http://x", "300.1.2.3", "a..b"}) {
    absl::StatusOr<DestinationPolicy> p = DestinationPolicy::Parse({bad}, {}, "outbound");
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(p.status().message(), HasSubstr("outbound.allow: '")) << bad;
  }
  EXPECT_THAT(DestinationPolicy::Parse({}, {"10.0.0.0/-1"}, "outbound").status().message(), HasSubstr("outbound.deny"));
}

TEST(DestinationPolicyTest, SameServerIsSchemeHostPortAndPath) {
  EXPECT_TRUE(SameServer("http://mlflow:5000", "http://MLflow:5000/"));
  EXPECT_TRUE(SameServer("http://mlflow", "http://mlflow:80"));
  EXPECT_TRUE(SameServer("https://ml.example/prefix/", "https://ml.example:443/prefix"));
  EXPECT_FALSE(SameServer("http://mlflow:5000", "https://mlflow:5000"));
  EXPECT_FALSE(SameServer("http://mlflow:5000", "http://mlflow:5001"));
  EXPECT_FALSE(SameServer("http://mlflow:5000/a", "http://mlflow:5000/b"));
  EXPECT_FALSE(SameServer("http://mlflow.evil:5000", "http://mlflow:5000"));
  EXPECT_FALSE(SameServer("http://u:p@mlflow:5000", "http://mlflow:5000"));
  EXPECT_FALSE(SameServer("", "http://mlflow:5000"));
}

TEST(DestinationPolicyTest, CreateJobsCheckNamesTheFieldAndSparesTheOperatorsServer) {
  v1::JobSpec spec;
  spec.mutable_notifications()->add_webhooks()->set_url("https://93.184.216.34/hook");
  spec.mutable_notifications()->add_webhooks()->set_url("http://[::1]:9/hook");
  absl::Status s = CheckJobDestinations(spec, DestinationPolicy(), "");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("notifications.webhooks[1].url: destination ::1 is loopback"));
  spec.mutable_notifications()->clear_webhooks();
  spec.mutable_tracking()->mutable_mlflow()->set_uri("http://127.0.0.1:5000");
  EXPECT_TRUE(CheckJobDestinations(spec, DestinationPolicy(), "http://127.0.0.1:5000/").ok());  // the operator's
  s = CheckJobDestinations(spec, DestinationPolicy(), "http://127.0.0.1:5001");
  EXPECT_THAT(s.message(), HasSubstr("tracking.mlflow.uri: destination 127.0.0.1 is loopback"));
}

// --- Configuration ---

absl::StatusOr<ServerConfig> Load(std::vector<std::string> overrides) {
  return LoadServerConfig(ConfigSources{.file = "", .env = {{"HOME", "/tmp"}}, .overrides = std::move(overrides)});
}

TEST(OutboundConfigTest, ListsAreCheckedAndTheTokenIsBoundToTheOperatorsServer) {
  absl::StatusOr<ServerConfig> c =
      Load({"outbound.allow=10.20.0.0/16, mlflow.corp", "outbound.deny=*.partner.example"});
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<DestinationPolicy> p = OutboundPolicy(*c);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->Check("10.20.1.1", Ip("10.20.1.1")).ok());
  EXPECT_TRUE(p->Check("mlflow.corp", Ip("10.9.9.9")).ok());
  EXPECT_FALSE(p->Check("x.partner.example", Ip("93.184.216.34")).ok());
  EXPECT_THAT(Load({"outbound.allow=10.0.0.0/33"}).status().message(), HasSubstr("outbound.allow: '10.0.0.0/33'"));
  EXPECT_THAT(Load({"tracking.mlflow_token_file=/etc/oomb/mlflow.token"}).status().message(),
              HasSubstr("tracking.mlflow_token_file: needs tracking.mlflow_uri"));
  EXPECT_TRUE(Load({"tracking.mlflow_token_file=/t", "tracking.mlflow_uri=https://mlflow.corp"}).ok());
  EXPECT_THAT(Load({"notifications.max_concurrent_per_endpoint=0"}).status().message(),
              HasSubstr("max_concurrent_per_endpoint"));
}

TEST(OutboundConfigTest, AProjectsEntriesComeFromTheProjectsFile) {
  absl::StatusOr<std::map<std::string, ProjectSettings>> projects = ParseProjectsFile(
      "projects:\n  nlp:\n    outbound: {allow: [127.0.0.1, mlflow.corp], deny: [10.0.0.0/8]}\n  vision: {}\n",
      "projects.yaml");
  ASSERT_TRUE(projects.ok()) << projects.status();
  const DestinationPolicy& nlp = projects->at("nlp").outbound;
  EXPECT_TRUE(nlp.Check("127.0.0.1", Ip("127.0.0.1")).ok());
  EXPECT_FALSE(projects->at("vision").outbound.Check("127.0.0.1", Ip("127.0.0.1")).ok());
  EXPECT_THAT(
      ParseProjectsFile("projects:\n  nlp:\n    outbound: {allow: [300.1.2.3]}\n", "projects.yaml").status().message(),
      HasSubstr("projects.yaml:3: projects.nlp.outbound: allow: '300.1.2.3'"));
  EXPECT_THAT(ParseProjectsFile("projects:\n  nlp:\n    outbound: {permit: []}\n", "projects.yaml").status().message(),
              HasSubstr("permit: unknown key (allow, deny)"));
  // Issue 78, item 6: the priorities a project's jobs may have, and whether they preempt others'.
  projects = ParseProjectsFile("projects:\n  nlp: {max_priority: 10, preempt_other_projects: false}\n  cv: {}\n", "p");
  ASSERT_TRUE(projects.ok()) << projects.status();
  EXPECT_EQ(projects->at("nlp").max_priority, 10);
  EXPECT_FALSE(projects->at("nlp").preempt_other_projects);
  EXPECT_EQ(projects->at("cv").max_priority, std::nullopt);
  EXPECT_TRUE(projects->at("cv").preempt_other_projects);
  EXPECT_THAT(ParseProjectsFile("projects:\n  nlp: {max_priority: 2000000}\n", "p").status().message(),
              HasSubstr("projects.nlp.max_priority: must be -1000000 to 1000000"));
}

// --- MLflow answers (issue 78, item 1: each of these aborted the daemon) ---

const std::vector<std::string>& CrashingShapes() {
  static const auto* shapes = new std::vector<std::string>{
      "ok", "{}", "[]", "42", "\"run\"", "null", R"({"run": {"info": {"run_id": 7}}})",
  };
  return *shapes;
}

TEST(MlflowAnswerTest, EveryShapeThatCrashedIsAnErrorNamingThePath) {
  for (const std::string& body : CrashingShapes()) {
    absl::StatusOr<nlohmann::json> answer = ParseMlflowAnswer("runs/create", 200, body);
    ASSERT_TRUE(answer.ok()) << body;
    for (const auto& keys :
         {std::vector<const char*>{"run", "info", "run_id"}, std::vector<const char*>{"experiment", "experiment_id"}}) {
      const absl::StatusOr<std::string> id = keys.size() == 3
                                                 ? MlflowIdAt(*answer, {"run", "info", "run_id"}, "runs/create")
                                                 : MlflowIdAt(*answer, {"experiment", "experiment_id"}, "runs/create");
      EXPECT_EQ(id.status().code(), absl::StatusCode::kDataLoss) << body;
      EXPECT_THAT(id.status().message(), HasSubstr("MLflow runs/create: ")) << body;
    }
  }
  // Error answers with fields of the wrong types, and bytes that are no text.
  absl::StatusOr<nlohmann::json> e = ParseMlflowAnswer("runs/update", 404, R"({"error_code": 5, "message": []})");
  EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(e.status().message(), HasSubstr("HTTP 404"));
  e = ParseMlflowAnswer("runs/update", 503, std::string("\xff\x00\x1b[31m", 7));
  EXPECT_EQ(e.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(e.status().message(), HasSubstr("\\xff\\x00\\x1b"));
  e = ParseMlflowAnswer("experiments/get-by-name", 404, R"({"error_code": "RESOURCE_DOES_NOT_EXIST"})");
  EXPECT_EQ(e.status().code(), absl::StatusCode::kNotFound);
  // What is right is read.
  const nlohmann::json run = *ParseMlflowAnswer("runs/create", 200, R"({"run": {"info": {"run_id": "a1b2"}}})");
  EXPECT_EQ(*MlflowIdAt(run, {"run", "info", "run_id"}, "runs/create"), "a1b2");
  const nlohmann::json odd = *ParseMlflowAnswer("runs/create", 200, R"({"run": {"info": {"run_id": "../x?y"}}})");
  EXPECT_EQ(MlflowIdAt(odd, {"run", "info", "run_id"}, "runs/create").status().code(), absl::StatusCode::kDataLoss);
  // A million arrays deep: read without recursing.
  const std::string deep = std::string(1 << 20, '[') + std::string(1 << 20, ']');
  absl::StatusOr<nlohmann::json> nested = ParseMlflowAnswer("runs/create", 200, deep);
  if (nested.ok()) {
    EXPECT_FALSE(MlflowIdAt(*nested, {"run", "info", "run_id"}, "runs/create").ok());
  }
  EXPECT_EQ(WebhookAnswerError(204, "x"), "");
  EXPECT_EQ(WebhookAnswerError(500, std::string("a\nb\x01", 4)), "HTTP 500: a\\nb\\x01");
}

// A stand-in MLflow server on loopback: answers every call with `body` (valid answers where
// `valid` says), recording each request.
class StandIn {
 public:
  explicit StandIn(std::string body = "", bool valid_experiment = false)
      : body_(std::move(body)), valid_experiment_(valid_experiment) {
    const auto handle = [this](const httplib::Request& req, httplib::Response& res) {
      absl::MutexLock lock(&mu_);
      requests_.push_back(req);
      std::string answer = body_;
      if (answer.empty() || (valid_experiment_ && absl::StrContains(req.path, "experiments/"))) {
        answer = absl::StrContains(req.path, "experiments/get-by-name") ? R"({"experiment": {"experiment_id": "1"}})"
                 : absl::StrContains(req.path, "runs/create")           ? R"({"run": {"info": {"run_id": "r1"}}})"
                                                                        : "{}";
      }
      res.set_content(answer, "application/json");
    };
    server_.Get(R"(/api/2\.0/mlflow/.*)", handle);
    server_.Post(R"(/api/2\.0/mlflow/.*)", handle);
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~StandIn() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return absl::StrCat("http://127.0.0.1:", port_); }
  std::vector<httplib::Request> requests() {
    absl::MutexLock lock(&mu_);
    return requests_;
  }

 private:
  const std::string body_;
  const bool valid_experiment_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  absl::Mutex mu_;
  std::vector<httplib::Request> requests_;
};

DestinationPolicyOf LoopbackAllowed() {
  const DestinationPolicy p = *DestinationPolicy::Parse({"127.0.0.0/8"}, {}, "outbound");
  return [p](const std::string&) { return p; };
}

class MlflowTrackerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("oomb_outbound_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    absl::StatusOr<std::unique_ptr<JobStore>> s = OpenSqliteJobStore((dir_ / "oombd.db").string());
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
  }
  void TearDown() override {
    store_.reset();
    fs::remove_all(dir_);
  }

  // A running job of project nlp naming `uri` (empty: the daemon's), started on its own slot.
  v1::Job Run(MlflowTracker* tracker, const std::string& id, const std::string& uri) {
    v1::Job job;
    job.set_name("projects/nlp/jobs/" + id);
    job.set_state(v1::Job::RUNNING);
    if (!uri.empty()) job.mutable_spec()->mutable_tracking()->mutable_mlflow()->set_uri(uri);
    EXPECT_TRUE(store_->Create(job, "", {}).ok());
    tracker->RunStarted("slot-" + id, job, absl::ZeroDuration());
    StepReport step;
    step.step = 1;
    step.loss = 2.5;
    tracker->Step("slot-" + id, step);
    return job;
  }
  std::vector<std::string> Warnings(const std::string& id) {
    std::vector<std::string> out;
    absl::StatusOr<std::vector<v1::JobEvent>> events = store_->ListEvents(id, 0, 1000);
    EXPECT_TRUE(events.ok()) << events.status();
    if (!events.ok()) return out;
    for (const v1::JobEvent& e : *events) {
      if (e.type() == v1::JobEvent::WARNING) out.push_back(e.message());
    }
    return out;
  }

  fs::path dir_;
  std::unique_ptr<JobStore> store_;
};

// Each shape that aborted the daemon, from a job's own tracking server: the job's WARNING, the
// daemon goes on (and tries again later).
TEST_F(MlflowTrackerTest, AnswersOfEveryShapeAreTheJobsWarningNeverACrash) {
  int i = 0;
  for (const std::string& shape : CrashingShapes()) {
    StandIn server(shape, /*valid_experiment=*/shape.find("run_id") != std::string::npos);
    MlflowTracker tracker(store_.get(), MlflowTrackerOptions{.destinations = LoopbackAllowed()});
    const std::string id = absl::StrCat("shape", i++);
    Run(&tracker, id, server.url());
    tracker.Flush();
    tracker.Flush();
    EXPECT_FALSE(server.requests().empty()) << shape;
    const std::vector<std::string> warnings = Warnings(id);
    ASSERT_EQ(warnings.size(), 1u) << shape;  // once until it works again
    EXPECT_THAT(warnings[0], HasSubstr("tracking: MLflow at " + server.url())) << shape;
    EXPECT_TRUE(store_->Get(id)->mlflow_run().empty()) << shape;
  }
}

// Issue 78, item 2: the operator's token goes to the operator's server (named or defaulted to)
// and never to a server a job names.
TEST_F(MlflowTrackerTest, TheOperatorsTokenGoesToTheOperatorsServerOnly) {
  StandIn operators, tenants;
  MlflowTracker tracker(store_.get(), MlflowTrackerOptions{.default_uri = operators.url(),
                                                           .token = "operator-secret-token",
                                                           .destinations = LoopbackAllowed()});
  Run(&tracker, "defaulted", "");
  Run(&tracker, "named", operators.url() + "/");
  Run(&tracker, "own", tenants.url());
  tracker.Flush();
  ASSERT_FALSE(operators.requests().empty());
  ASSERT_FALSE(tenants.requests().empty());
  for (const httplib::Request& r : operators.requests()) {
    EXPECT_EQ(r.get_header_value("Authorization"), "Bearer operator-secret-token") << r.path;
  }
  for (const httplib::Request& r : tenants.requests()) {
    EXPECT_FALSE(r.has_header("Authorization")) << r.path;
    EXPECT_EQ(r.body.find("operator-secret-token"), std::string::npos);
  }
  EXPECT_THAT(store_->Get("own")->mlflow_run(), HasSubstr(tenants.url()));
  EXPECT_TRUE(Warnings("own").empty());
}

// Issue 78, item 1: a tenant's own credentials come from its project's secrets (the operator's
// projects file), named by the spec's tracking.mlflow.token_secret, never its literal: that
// token goes to the job's server (its own, or the operator's in place of the operator's token),
// the operator's token never with it, and another project's secret is not this project's.
TEST_F(MlflowTrackerTest, AJobsOwnTokenComesFromItsProjectsSecrets) {
  StandIn operators, tenants;
  WriteFile(dir_ / "nlp.token", "nlp-tenant-token\n");
  WriteFile(dir_ / "projects.yaml", "projects:\n  nlp:\n    secrets: {mlflow: " + (dir_ / "nlp.token").string() +
                                        "}\n  vision:\n    secrets: {other: " + (dir_ / "nlp.token").string() + "}\n");
  absl::StatusOr<std::shared_ptr<const ProjectRegistry>> projects =
      ProjectRegistry::Create((dir_ / "projects.yaml").string());
  ASSERT_TRUE(projects.ok()) << projects.status();
  const auto secret = [projects = *projects](const std::string& project,
                                             const std::string& name) -> absl::StatusOr<std::string> {
    const ProjectSettings settings = projects->Get(project);
    if (settings.secrets.count(name) == 0) return absl::InvalidArgumentError("no secret " + name);
    std::ifstream in(settings.secrets.at(name));
    std::string token;
    in >> token;
    return token;
  };
  MlflowTracker tracker(store_.get(), MlflowTrackerOptions{.default_uri = operators.url(),
                                                           .token = "operator-secret-token",
                                                           .destinations = LoopbackAllowed(),
                                                           .secret = secret});
  const auto with_secret = [&](const std::string& id, const std::string& uri, const std::string& name) {
    v1::Job job;
    job.set_name("projects/nlp/jobs/" + id);
    job.set_state(v1::Job::RUNNING);
    job.mutable_spec()->mutable_tracking()->mutable_mlflow()->set_uri(uri);
    job.mutable_spec()->mutable_tracking()->mutable_mlflow()->set_token_secret(name);
    ASSERT_TRUE(store_->Create(job, "", {}).ok());
    tracker.RunStarted("slot-" + id, job, absl::ZeroDuration());
    StepReport step;
    step.step = 1;
    tracker.Step("slot-" + id, step);
  };
  with_secret("own", tenants.url(), "mlflow");
  tracker.Flush();
  ASSERT_FALSE(tenants.requests().empty());
  for (const httplib::Request& r : tenants.requests()) {
    EXPECT_EQ(r.get_header_value("Authorization"), "Bearer nlp-tenant-token") << r.path;
  }
  EXPECT_TRUE(Warnings("own").empty());
  // On the operator's server the tenant's token replaces the operator's.
  with_secret("theirs", "", "mlflow");
  tracker.Flush();
  ASSERT_FALSE(operators.requests().empty());
  for (const httplib::Request& r : operators.requests()) {
    EXPECT_EQ(r.get_header_value("Authorization"), "Bearer nlp-tenant-token") << r.path;
  }
  // A name the project has not: nothing is sent, the job is told.
  const size_t before = tenants.requests().size();
  with_secret("unknown", tenants.url(), "other");
  tracker.Flush();
  EXPECT_EQ(tenants.requests().size(), before);
  ASSERT_EQ(Warnings("unknown").size(), 1u);
  EXPECT_THAT(Warnings("unknown")[0], HasSubstr("no secret other"));
  for (const httplib::Request& r : tenants.requests()) {
    EXPECT_EQ(r.body.find("operator-secret-token"), std::string::npos);
    EXPECT_NE(r.get_header_value("Authorization"), "Bearer operator-secret-token");
  }
}

// A job's own tracking server on loopback without the operator's entry: refused at connect,
// nothing arrives, the job is told once and its run is not tracked.
TEST_F(MlflowTrackerTest, AJobsOwnServerOnLoopbackIsRefusedAtConnect) {
  StandIn tenants;
  MlflowTracker tracker(store_.get(), MlflowTrackerOptions{});
  Run(&tracker, "own", tenants.url());
  Run(&tracker, "spelled", absl::StrCat("http://2130706433:", tenants.url().substr(tenants.url().rfind(':') + 1)));
  tracker.Flush();
  tracker.Flush();
  EXPECT_TRUE(tenants.requests().empty());
  for (const char* id : {"own", "spelled"}) {
    const std::vector<std::string> warnings = Warnings(id);
    ASSERT_EQ(warnings.size(), 1u) << id;
    EXPECT_THAT(warnings[0], HasSubstr("destination 127.0.0.1 is loopback")) << id;
    EXPECT_THAT(warnings[0], HasSubstr("not tracked")) << id;
  }
}

}  // namespace
}  // namespace oomb::server
