// Issue 79, item 3: every RPC passes one authorization step (server/authorization.h), driven by
// the (oomb.v1.auth) rule each method declares. The methods are not listed here: they are
// enumerated from the API's descriptors (every service of every oomb.v1 file in the descriptor
// set the daemon embeds), so a method added without a rule, or whose handler skips the step,
// fails these tests.
//
// AuthorizationTable: every method has a rule the table holds, and a service without rules is
// refused when the table is built (the daemon does not start).
// AuthorizationIntegrationTest: the real daemon, a tokens file of two teams (alice: nlp, bob:
// vision), alice's job and dataset in nlp. Each method is called over gRPC (a generic call, its
// request built from its descriptor with the rule's field naming alice's resource) and over HTTP
// (the path of its google.api.http rule): without credentials it is UNAUTHENTICATED (401); as
// bob it is NOT_FOUND exactly as for a resource that does not exist ("no job <name>", 404) for a
// job, checkpoint or dataset, PERMISSION_DENIED (403) for a project, and allowed for a method
// of the caller's own (AUTHENTICATED); as alice a read is not refused (the resource is there).
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "google/api/annotations.pb.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/dynamic_message.h"
#include "grpc/health/v1/health.pb.h"
#include "oomb/v1/rules.pb.h"
#include "server/authorization.h"
#include "server/http/api_descriptor.h"
#include "tests/client/daemon_harness.h"

namespace oomb::testing {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::MethodDescriptor;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Every method of every service the API's .proto files declare, from the generated pool.
std::vector<const MethodDescriptor*> ApiMethods() {
  google::protobuf::FileDescriptorSet set;
  const absl::string_view bytes = server::ApiDescriptorSet();
  EXPECT_TRUE(set.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())));
  std::vector<const MethodDescriptor*> out;
  for (const google::protobuf::FileDescriptorProto& file : set.file()) {
    if (file.package() != "oomb.v1") continue;
    for (const google::protobuf::ServiceDescriptorProto& s : file.service()) {
      const google::protobuf::ServiceDescriptor* service =
          google::protobuf::DescriptorPool::generated_pool()->FindServiceByName("oomb.v1." + s.name());
      EXPECT_NE(service, nullptr) << s.name();
      if (service == nullptr) continue;
      for (int i = 0; i < service->method_count(); ++i) out.push_back(service->method(i));
    }
  }
  return out;
}

std::string FullName(const MethodDescriptor* m) { return "/" + m->service()->full_name() + "/" + m->name(); }

TEST(AuthorizationTable, EveryMethodOfEveryServiceHasARule) {
  absl::StatusOr<std::unique_ptr<server::Authorizer>> table =
      server::Authorizer::Create(nullptr, nullptr, server::Authorizer::ApiServices());
  ASSERT_TRUE(table.ok()) << table.status();
  std::set<std::string> served;
  for (const auto* s : server::Authorizer::ApiServices()) served.insert(s->full_name());
  const std::vector<const MethodDescriptor*> methods = ApiMethods();
  EXPECT_GE(methods.size(), 19u);  // JobService's 15 and DatasetService's 4 at least
  for (const MethodDescriptor* m : methods) {
    EXPECT_TRUE(served.count(m->service()->full_name())) << m->service()->full_name() << " is not authorized";
    EXPECT_TRUE(m->options().HasExtension(v1::auth)) << m->full_name() << " has no (oomb.v1.auth) rule";
    const v1::AuthRule* rule = (*table)->RuleOf(FullName(m));
    ASSERT_NE(rule, nullptr) << m->full_name() << " is not in the table";
    EXPECT_NE(rule->action(), v1::AuthRule::ACTION_UNSPECIFIED) << m->full_name();
  }
}

TEST(AuthorizationTable, AServiceWithoutRulesIsRefused) {
  const absl::StatusOr<std::unique_ptr<server::Authorizer>> table = server::Authorizer::Create(
      nullptr, nullptr, {grpc::health::v1::HealthCheckRequest::descriptor()->file()->FindServiceByName("Health")});
  ASSERT_FALSE(table.ok());
  EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(table.status().message()), HasSubstr("grpc.health.v1.Health.Check"));
  EXPECT_THAT(std::string(table.status().message()), HasSubstr("is missing"));
}

TEST(AuthorizationTable, FieldAtPathReadsNestedFields) {
  v1::UpdateJobRequest req;
  req.mutable_job()->set_name("projects/a/jobs/b");
  EXPECT_EQ(server::FieldAtPath(req, "job.name"), "projects/a/jobs/b");
  EXPECT_EQ(server::FieldAtPath(v1::UpdateJobRequest(), "job.name"), "");
}

constexpr char kTokens[] = "alice-token,alice,1001,nlp\nbob-token,bob,1002,vision\n";
constexpr char kJob[] = "projects/nlp/jobs/nlp-job";
constexpr char kDataset[] = "projects/nlp/datasets/nlp-data";

struct Answer {
  grpc::StatusCode code = grpc::StatusCode::UNKNOWN;
  std::string message;
};

class AuthorizationIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(TinyLlama() / "config.json")) GTEST_SKIP() << "no test models under " << DataDir();
    tmp_ = std::make_unique<TempDir>();
    WriteFile(dir() / "tokens.csv", kTokens);
    WriteIdsJsonl(dir() / "ids.jsonl", 4, 100);
    DaemonOptions o;
    o.extra = {"--set", "auth.tokens_file=" + (dir() / "tokens.csv").string(), "--set", "scheduler.hold=true"};
    daemon_ = std::make_unique<Daemon>(dir() / "data", o);
    ASSERT_GT(daemon_->port(), 0) << daemon_->log();
    ASSERT_GT(daemon_->http_port(), 0) << daemon_->log();
    channel_ = grpc::CreateChannel(daemon_->tcp_endpoint(), grpc::InsecureChannelCredentials());
    // alice's job and dataset in nlp: the resources bob must not see.
    WriteFile(dir() / "job.yaml", TinyJobYaml((dir() / "ids.jsonl").string(), 2, 1));
    const Result job = Shell("OOMB_TOKEN=alice-token " + OombCli() + " --endpoint " + daemon_->tcp_endpoint() +
                                 " submit " + (dir() / "job.yaml").string() + " --job-id nlp-job",
                             dir());
    ASSERT_EQ(job.rc, 0) << job.err;
    const Result data = Curl("PUT", "/v1/" + std::string(kDataset), "alice-token", (dir() / "ids.jsonl").string());
    ASSERT_EQ(data.out, "200") << data.out << " " << Slurp(dir() / "curl.body");
  }
  void TearDown() override {
    daemon_.reset();
    tmp_.reset();
  }
  const fs::path& dir() const { return tmp_->path(); }

  // curl's HTTP status on stdout; the body in dir()/curl.body.
  Result Curl(const std::string& verb, const std::string& path, const std::string& token, const std::string& file) {
    std::string cmd = "curl -sS --max-time 10 -o " + (dir() / "curl.body").string() + " -w '%{http_code}' -X " + verb;
    if (!token.empty()) cmd += " -H 'Authorization: Bearer " + token + "'";
    if (!file.empty()) cmd += " --data-binary @" + file;
    return Shell(cmd + " 'http://127.0.0.1:" + std::to_string(daemon_->http_port()) + path + "'", dir());
  }

  // A generic call of `m` with `request` (one message, for every kind of method), as `token`;
  // with `first_only` the call is cancelled after its first response.
  Answer CallGrpc(const MethodDescriptor* m, const Message& request, const std::string& token, bool first_only) {
    grpc::GenericStub stub(channel_);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    grpc::CompletionQueue cq;
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call = stub.PrepareCall(&ctx, FullName(m), &cq);
    void* tag = nullptr;
    bool ok = false;
    call->StartCall(reinterpret_cast<void*>(1));
    cq.Next(&tag, &ok);
    const std::string bytes = request.SerializeAsString();
    grpc::Slice slice(bytes);
    grpc::ByteBuffer buffer(&slice, 1);
    call->Write(buffer, reinterpret_cast<void*>(2));
    cq.Next(&tag, &ok);
    call->WritesDone(reinterpret_cast<void*>(3));
    cq.Next(&tag, &ok);
    for (int read = 0; read < 1000; ++read) {
      grpc::ByteBuffer response;
      call->Read(&response, reinterpret_cast<void*>(4));
      cq.Next(&tag, &ok);
      if (!ok) break;
      if (first_only) {
        ctx.TryCancel();
        break;
      }
    }
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(5));
    cq.Next(&tag, &ok);
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    return Answer{status.error_code(), status.error_message()};
  }

  // The method's HTTP call as its google.api.http rule says: the path with `value` for the
  // rule's field (and "x" for any other variable), a body where the rule takes one.
  Answer CallHttp(const MethodDescriptor* m, const std::string& field, const std::string& value,
                  const std::string& token) {
    const google::api::HttpRule& http = m->options().GetExtension(google::api::http);
    std::string verb, path;
    if (!http.get().empty()) verb = "GET", path = http.get();
    if (!http.post().empty()) verb = "POST", path = http.post();
    if (!http.put().empty()) verb = "PUT", path = http.put();
    if (!http.patch().empty()) verb = "PATCH", path = http.patch();
    if (!http.delete_().empty()) verb = "DELETE", path = http.delete_();
    EXPECT_FALSE(verb.empty()) << m->full_name() << " has no google.api.http rule";
    for (size_t open; (open = path.find('{')) != std::string::npos;) {
      const size_t close = path.find('}', open);
      const std::string var = path.substr(open + 1, path.find_first_of("=}", open) - open - 1);
      path.replace(open, close - open + 1, var == field ? value : "x");
    }
    std::string file;
    if (!http.body().empty()) {
      file = (dir() / "body").string();
      WriteFile(file, http.body() == "data" ? "{\"input_ids\": [1, 2]}\n" : "{}");
    }
    const Result r = Curl(verb, path, token, file);
    const json body = json::parse(Slurp(dir() / "curl.body"), nullptr, false);
    Answer a;
    a.code = static_cast<grpc::StatusCode>(std::atoi(r.out.c_str()));  // the HTTP status, compared below
    if (body.is_object() && body.contains("error")) a.message = body["error"].value("message", "");
    return a;
  }

  // `m`'s request with the rule's field naming alice's resource.
  static std::unique_ptr<Message> Request(const MethodDescriptor* m, const v1::AuthRule& rule, std::string* value) {
    std::unique_ptr<Message> req(
        google::protobuf::MessageFactory::generated_factory()->GetPrototype(m->input_type())->New());
    switch (rule.resource()) {
      case v1::AuthRule::JOB:
        *value = kJob;
        break;
      case v1::AuthRule::CHECKPOINT:
        *value = std::string(kJob) + "/checkpoints/final";
        break;
      case v1::AuthRule::DATASET:
        *value = kDataset;
        break;
      case v1::AuthRule::PROJECT:
        *value = "projects/nlp";
        break;
      default:
        return req;
    }
    Message* at = req.get();
    const std::vector<std::string> parts = absl::StrSplit(rule.field(), '.');
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      at = at->GetReflection()->MutableMessage(at, at->GetDescriptor()->FindFieldByName(parts[i]));
    }
    at->GetReflection()->SetString(at, at->GetDescriptor()->FindFieldByName(parts.back()), *value);
    return req;
  }

  std::unique_ptr<TempDir> tmp_;
  std::unique_ptr<Daemon> daemon_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(AuthorizationIntegrationTest, EveryMethodRefusesCallersWithoutTheRightOverGrpcAndHttp) {
  const std::vector<const MethodDescriptor*> methods = ApiMethods();
  ASSERT_GE(methods.size(), 19u);
  for (const MethodDescriptor* m : methods) {
    SCOPED_TRACE(m->full_name());
    ASSERT_TRUE(m->options().HasExtension(v1::auth));
    const v1::AuthRule& rule = m->options().GetExtension(v1::auth);
    std::string value;
    const std::unique_ptr<Message> req = Request(m, rule, &value);
    // No credentials.
    Answer a = CallGrpc(m, *req, "", false);
    EXPECT_EQ(a.code, grpc::StatusCode::UNAUTHENTICATED) << a.message;
    a = CallHttp(m, rule.field(), value, "");
    EXPECT_EQ(static_cast<int>(a.code), 401) << a.message;
    // bob, of another project.
    const bool resource = rule.resource() == v1::AuthRule::JOB || rule.resource() == v1::AuthRule::CHECKPOINT ||
                          rule.resource() == v1::AuthRule::DATASET;
    const std::string missing = rule.resource() == v1::AuthRule::DATASET ? std::string("no dataset ") + kDataset
                                                                         : std::string("no job ") + kJob;
    for (const bool http : {false, true}) {
      a = http ? CallHttp(m, rule.field(), value, "bob-token") : CallGrpc(m, *req, "bob-token", false);
      const int code = static_cast<int>(a.code);
      if (resource) {
        EXPECT_EQ(code, http ? 404 : grpc::StatusCode::NOT_FOUND) << a.message;
        EXPECT_EQ(a.message, missing);
      } else if (rule.action() == v1::AuthRule::AUTHENTICATED) {
        EXPECT_EQ(code, http ? 200 : grpc::StatusCode::OK) << a.message;
      } else {
        EXPECT_EQ(code, http ? 403 : grpc::StatusCode::PERMISSION_DENIED) << a.message;
        EXPECT_EQ(a.message, "bob may not act in project nlp");
      }
    }
    // alice reads what she owns: the resource is there, so bob's NOT_FOUND was the refusal.
    if (rule.action() == v1::AuthRule::READ) {
      a = CallGrpc(m, *req, "alice-token", /*first_only=*/true);
      EXPECT_NE(a.code, grpc::StatusCode::UNAUTHENTICATED);
      EXPECT_NE(a.code, grpc::StatusCode::PERMISSION_DENIED);
      EXPECT_THAT(a.message, ::testing::Not(StartsWith(missing))) << a.message;
    }
  }
  // Nothing of alice's changed: her job and dataset are still there, as they were.
  const Result job = Curl("GET", "/v1/" + std::string(kJob), "alice-token", "");
  EXPECT_EQ(job.out, "200");
  EXPECT_EQ(json::parse(Slurp(dir() / "curl.body"))["state"], "QUEUED");
  EXPECT_EQ(Curl("GET", "/v1/" + std::string(kDataset), "alice-token", "").out, "200");
}

}  // namespace
}  // namespace oomb::testing
