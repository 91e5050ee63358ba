// What every `oomb` subcommand shares: the global options, the exit codes, the connection to
// oombd (with its token and deadlines), and how results and errors are printed (-o table |
// json | yaml; errors on stderr as "oomb: error: CODE: message").
#ifndef OOMB_CLIENT_CLI_H_
#define OOMB_CLIENT_CLI_H_

#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "google/protobuf/message.h"
#include "google/protobuf/timestamp.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "oomb/v1/datasets.grpc.pb.h"
#include "oomb/v1/jobs.grpc.pb.h"

namespace oomb::client {

inline constexpr const char* kExitCodes = R"(Exit codes:
  0  ok                     4  unauthenticated or permission denied
  1  error                  5  server unavailable (or deadline exceeded)
  2  usage                  6  the watched job FAILED
  3  not found              7  the watched job was CANCELLED)";

enum Exit {
  kOk = 0,
  kError = 1,
  kUsage = 2,
  kNotFound = 3,
  kAuth = 4,
  kUnavailable = 5,
  kJobFailed = 6,
  kJobCancelled = 7
};

struct Globals {
  std::string endpoint = "127.0.0.1:7070";
  std::string token_file;
  std::string ca, cert, key;
  std::string output = "table";
  double timeout = 30;
  std::string project;  // --project / OOMB_PROJECT; empty: the server's default
};

// A connection to oombd, made from the global options when a command first needs it.
class Client {
 public:
  // Reads the TLS files and the token (a file that cannot be read exits 1, naming it).
  explicit Client(const Globals& g);

  // A context with the token and, for unary calls, the deadline.
  std::unique_ptr<grpc::ClientContext> Context(bool unary = true) const;

  // One unary JobService call with Context()'s token and deadline, e.g.
  // Call(&v1::JobService::Stub::GetJob, req, &job).
  template <typename Request, typename Response>
  grpc::Status Call(grpc::Status (v1::JobService::Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                    const Request& req, Response* resp) {
    const std::unique_ptr<grpc::ClientContext> ctx = Context();
    return (jobs_.get()->*method)(ctx.get(), req, resp);
  }

  v1::JobService::Stub& jobs() { return *jobs_; }
  v1::DatasetService::Stub& datasets() { return *datasets_; }
  grpc::health::v1::Health::Stub& health() { return *health_; }
  const Globals& globals() const { return g_; }

 private:
  Globals g_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::DatasetService::Stub> datasets_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
  std::string token_;
};

// What a subcommand is registered with: the global options (filled by the time it runs) and
// the connection, made on first use.
struct Cli {
  Globals& globals;
  std::function<Client&()> client;
};

// Prints the RPC's error and returns the exit code its status maps to.
int Fail(const grpc::Status& s);
// The exit code of a gRPC status code.
int ExitFor(grpc::StatusCode code);

// Prints `m` as -o json or -o yaml; returns false for -o table (the caller prints).
bool PrintStructured(const Globals& g, const google::protobuf::Message& m);
std::string ToJson(const google::protobuf::Message& m, bool pretty);

// Table formatting: a state (coloured on a colour terminal), sizes, durations, times.
bool Color();
std::string StateName(v1::Job::State s);
std::string Bytes(int64_t b);
std::string Duration(double seconds);
std::string Time(const google::protobuf::Timestamp& t);
// The evaluation section's results, one line: "step N: passkey 0.90, needle 0.75, loss by
// position [0K, 1K) 2.310 ..." (without "step N:" for method.type evaluate's, step 0).
// With the ruler suite: "ruler effective length 8K (threshold 85.6; by length 4K 92.1, 8K
// 86.0, 16K 70.3)".
std::string EvaluationLine(const v1::EvaluationResult& e);
// The ruler suite's scores, a line a task: "niah_single_1  4K 100.0  8K 95.0" (RULER's 0-100),
// in RULER's order; none without it.
std::vector<std::string> RulerLines(const v1::EvaluationResult& e);
// Text a client chose (a display name, a label), safe to print on a terminal: control
// characters and the Unicode controls that reorder text (bidi overrides and isolates) become
// U+FFFD, so a name cannot rewrite the lines around it.
std::string Printable(const std::string& text);

// A job's name from what a user typed: a name ("projects/p/jobs/x", "jobs/x") as it is, an id
// as "projects/{--project}/jobs/{id}", or "jobs/{id}" without --project (the server finds its
// project).
std::string JobName(const Globals& g, const std::string& arg);
// A request's parent: "projects/{--project}", or empty (the server's default: the caller's only
// project).
std::string Parent(const Globals& g);

// The job spec file with its --set overrides, checked against the schema (defaults are the
// server's to fill). kOk, or kError with the error printed.
int LoadSpec(const std::string& file, const std::vector<std::string>& sets, v1::JobSpec* spec);

// The contents of a file the user named (a token, a certificate); exits 1 naming it when it
// cannot be read.
std::string ReadAll(const std::string& path);
// `s` without leading and trailing white space.
std::string Trim(std::string s);

// Makes `body` the subcommand's action; its return code becomes the process's exit code.
void OnRun(CLI::App* cmd, std::function<int()> body);

}  // namespace oomb::client

#endif  // OOMB_CLIENT_CLI_H_
