// oomb: the command-line client of oombd. See client/README.md for the commands and exit codes.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include <fmt/format.h>

#include "grpc/health/v1/health.grpc.pb.h"
#include "oomb/v1/jobs.grpc.pb.h"
#include "proto/spec/spec_codec.h"

namespace oomb::client {
namespace {

constexpr const char* kExitCodes = R"(Exit codes:
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
};

int ExitFor(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return kOk;
    case grpc::StatusCode::NOT_FOUND:
      return kNotFound;
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      return kAuth;
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return kUnavailable;
    default:
      return kError;
  }
}

const char* CodeName(grpc::StatusCode c) {
  static const char* const kNames[] = {
      "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
      "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
      "DATA_LOSS", "UNAUTHENTICATED"};
  const int i = static_cast<int>(c);
  return i >= 0 && i < 17 ? kNames[i] : "UNKNOWN";
}

int Fail(const grpc::Status& s) {
  std::cerr << "oomb: error: " << CodeName(s.error_code()) << ": " << s.error_message() << "\n";
  return ExitFor(s.error_code());
}

bool Color() { return ::isatty(1) && std::getenv("NO_COLOR") == nullptr; }
bool StderrTty() { return ::isatty(2); }

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::cerr << "oomb: error: cannot read " << path << "\n";
    throw CLI::RuntimeError(kError);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.erase(s.begin());
  return s;
}

class Client {
 public:
  explicit Client(const Globals& g) : g_(g) {
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
    if (!g.ca.empty() || !g.cert.empty()) {
      grpc::SslCredentialsOptions ssl;
      if (!g.ca.empty()) ssl.pem_root_certs = ReadAll(g.ca);
      if (!g.cert.empty()) ssl.pem_cert_chain = ReadAll(g.cert);
      if (!g.key.empty()) ssl.pem_private_key = ReadAll(g.key);
      creds = grpc::SslCredentials(ssl);
    }
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 60000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
    channel_ = grpc::CreateCustomChannel(g.endpoint, creds, args);
    jobs_ = v1::JobService::NewStub(channel_);
    health_ = grpc::health::v1::Health::NewStub(channel_);
    if (!g.token_file.empty()) {
      token_ = Trim(ReadAll(g.token_file));
    } else if (const char* t = std::getenv("OOMB_TOKEN")) {
      token_ = t;
    }
  }

  // A context with the token and, for unary calls, the deadline.
  std::unique_ptr<grpc::ClientContext> Context(bool unary = true) const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    if (!token_.empty()) ctx->AddMetadata("authorization", "Bearer " + token_);
    if (unary) {
      ctx->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(g_.timeout * 1000)));
    }
    return ctx;
  }

  v1::JobService::Stub& jobs() { return *jobs_; }
  grpc::health::v1::Health::Stub& health() { return *health_; }
  const Globals& globals() const { return g_; }

 private:
  Globals g_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
  std::string token_;
};

std::string JobName(const std::string& arg) { return arg.rfind("jobs/", 0) == 0 ? arg : "jobs/" + arg; }

std::string ToJson(const google::protobuf::Message& m, bool pretty) {
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.add_whitespace = pretty;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

void EmitYaml(YAML::Emitter& out, const nlohmann::json& j) {
  if (j.is_object()) {
    out << YAML::BeginMap;
    for (auto it = j.begin(); it != j.end(); ++it) {
      out << YAML::Key << it.key() << YAML::Value;
      EmitYaml(out, it.value());
    }
    out << YAML::EndMap;
  } else if (j.is_array()) {
    out << YAML::BeginSeq;
    for (const auto& e : j) EmitYaml(out, e);
    out << YAML::EndSeq;
  } else if (j.is_string()) {
    out << j.get<std::string>();
  } else {
    out << j.dump();
  }
}

// Prints a message as -o json or -o yaml; returns false for -o table (the caller prints).
bool PrintStructured(const Globals& g, const google::protobuf::Message& m) {
  if (g.output == "json") {
    std::cout << ToJson(m, true) << "\n";
    return true;
  }
  if (g.output == "yaml") {
    YAML::Emitter out;
    EmitYaml(out, nlohmann::json::parse(ToJson(m, false)));
    std::cout << out.c_str() << "\n";
    return true;
  }
  return false;
}

std::string StateName(v1::Job::State s) {
  std::string name = v1::Job::State_Name(s);
  if (!Color()) return name;
  const char* color = "";
  switch (s) {
    case v1::Job::SUCCEEDED:
      color = "\033[32m";
      break;
    case v1::Job::FAILED:
      color = "\033[31m";
      break;
    case v1::Job::RUNNING:
      color = "\033[36m";
      break;
    case v1::Job::CANCELLED:
    case v1::Job::PAUSED:
      color = "\033[33m";
      break;
    default:
      return name;
  }
  return fmt::format("{}{}\033[0m", color, name);
}

std::string Bytes(int64_t b) {
  if (b >= (int64_t{1} << 30)) return fmt::format("{:.1f} GiB", b / double(int64_t{1} << 30));
  if (b >= (1 << 20)) return fmt::format("{:.1f} MiB", b / double(1 << 20));
  return fmt::format("{} B", b);
}

std::string Duration(double s) {
  const int64_t t = static_cast<int64_t>(s);
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

std::string Time(const google::protobuf::Timestamp& t) {
  if (t.seconds() == 0) return "-";
  const time_t secs = t.seconds();
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::localtime(&secs));
  return buf;
}

void PrintJobTable(const std::vector<const v1::Job*>& jobs) {
  std::cout << fmt::format("{:<24} {:<12} {:>13} {:>8} {:<19} {}\n", "NAME", "STATE", "STEP", "LOSS", "CREATED",
                           "DISPLAY_NAME");
  for (const v1::Job* j : jobs) {
    const std::string state = StateName(j->state());
    const int pad = 12 + static_cast<int>(state.size() - v1::Job::State_Name(j->state()).size());
    std::cout << fmt::format("{:<24} {:<{}} {:>13} {:>8} {:<19} {}\n", j->name(), state, pad,
                             fmt::format("{}/{}", j->progress().step(), j->progress().total_steps()),
                             j->progress().step() > 0 ? fmt::format("{:.4f}", j->progress().loss()) : "-",
                             Time(j->create_time()), j->spec().display_name());
  }
}

void PrintJobDetail(const v1::Job& j) {
  std::cout << fmt::format("name:        {}\n", j.name());
  std::cout << fmt::format("state:       {}\n", StateName(j.state()));
  if (j.queue_position() > 0) std::cout << fmt::format("queue:       position {}\n", j.queue_position());
  if (!j.daemon().empty()) std::cout << fmt::format("daemon:      {}\n", j.daemon());
  if (!j.spec().display_name().empty()) std::cout << fmt::format("display:     {}\n", j.spec().display_name());
  std::cout << fmt::format("model:       {}\n", j.spec().model().path());
  std::cout << fmt::format("data:        {}\n", j.spec().data().train());
  std::cout << fmt::format("progress:    step {}/{}, {} tokens, loss {:.4f}\n", j.progress().step(),
                           j.progress().total_steps(), j.progress().tokens(), j.progress().loss());
  std::cout << fmt::format("attempt:     {} (retries {})\n", j.attempt(), j.retries());
  std::cout << fmt::format("created:     {}\n", Time(j.create_time()));
  std::cout << fmt::format("started:     {}\n", Time(j.start_time()));
  std::cout << fmt::format("ended:       {}\n", Time(j.end_time()));
  std::cout << fmt::format("checkpoints: {}\n", j.checkpoint_dir());
  if (j.has_error()) {
    std::cout << fmt::format("error:       {} {}: {}\n", j.error().code(), j.error().reason(), j.error().message());
  }
}

std::string EventLine(const v1::JobEvent& e) {
  std::string what;
  switch (e.type()) {
    case v1::JobEvent::STATE_CHANGED:
      what = fmt::format("state {}{}", v1::Job::State_Name(e.state()), e.message().empty() ? "" : ": " + e.message());
      break;
    case v1::JobEvent::STEP:
      what =
          fmt::format("step {}/{} loss {:.4f} lr {:.3g} {:.0f} tok/s", e.progress().step(), e.progress().total_steps(),
                      e.progress().loss(), e.progress().learning_rate(), e.progress().tokens_per_second());
      break;
    case v1::JobEvent::CHECKPOINT_SAVED:
      what = fmt::format("checkpoint step {} {} ({})", e.checkpoint().step(), e.checkpoint().path(),
                         Bytes(e.checkpoint().bytes()));
      break;
    case v1::JobEvent::WARNING:
      what = "warning: " + e.message();
      break;
    default:
      what = e.message();
  }
  return fmt::format("{:>5} {} {}", e.sequence(), Time(e.time()), what);
}

// The live progress bar for `watch` on a TTY (stderr).
class ProgressBar {
 public:
  void Update(const std::string& name, v1::Job::State state, const v1::Progress& p) {
    double pcie = 0;
    const int64_t bytes = p.pcie_h2d_bytes() + p.pcie_d2h_bytes();
    const auto now = std::chrono::steady_clock::now();
    if (last_bytes_ >= 0 && p.step() > last_step_) {
      const double dt = std::chrono::duration<double>(now - last_time_).count();
      if (dt > 0) pcie = (bytes - last_bytes_) / dt;
    }
    if (p.step() > last_step_) {
      last_bytes_ = bytes;
      last_step_ = p.step();
      last_time_ = now;
      if (pcie > 0) pcie_ = pcie;
    }
    const int width = 24;
    const double frac = p.total_steps() > 0 ? std::min(1.0, double(p.step()) / p.total_steps()) : 0;
    const int filled = static_cast<int>(frac * width);
    std::string bar = std::string(filled, '#') + std::string(width - filled, '-');
    std::cerr << fmt::format("\r\033[K{} {} [{}] step {}/{} loss {:.4f} {:.0f} tok/s gpu {} host {} pcie {}/s eta {}",
                             name, v1::Job::State_Name(state), bar, p.step(), p.total_steps(), p.loss(),
                             p.tokens_per_second(), Bytes(p.gpu_memory_bytes()), Bytes(p.host_memory_bytes()),
                             Bytes(static_cast<int64_t>(pcie_)), Duration(p.eta_seconds()))
              << std::flush;
  }
  void Line(const std::string& s) { std::cerr << "\r\033[K" << s << "\n"; }

 private:
  int64_t last_step_ = -1;
  int64_t last_bytes_ = -1;
  double pcie_ = 0;
  std::chrono::steady_clock::time_point last_time_;
};

// Streams a job until it ends; the exit code follows its final state.
int Watch(Client& c, const std::string& name, int64_t after) {
  v1::WatchJobRequest req;
  req.set_name(name);
  req.set_after_sequence(after);
  auto ctx = c.Context(/*unary=*/false);
  auto reader = c.jobs().WatchJob(ctx.get(), req);
  const bool tty = StderrTty() && c.globals().output == "table";
  ProgressBar bar;
  v1::WatchJobResponse r;
  v1::Job::State state = v1::Job::STATE_UNSPECIFIED;
  v1::Progress progress;
  std::string failure;
  while (reader->Read(&r)) {
    if (c.globals().output == "json") {
      std::cout << ToJson(r, false) << std::endl;
    }
    if (r.has_snapshot()) {
      state = r.snapshot().state();
      progress = r.snapshot().progress();
      if (r.snapshot().has_error()) failure = r.snapshot().error().message();
    } else {
      const v1::JobEvent& e = r.event();
      if (e.type() == v1::JobEvent::STATE_CHANGED) state = e.state();
      if (e.type() == v1::JobEvent::STEP) progress = e.progress();
      if (e.has_error()) failure = e.error().message();
      if (c.globals().output == "table") {
        if (tty) {
          if (e.type() != v1::JobEvent::STEP) bar.Line(EventLine(e));
        } else {
          std::cout << EventLine(e) << std::endl;
        }
      }
    }
    if (tty) bar.Update(name, state, progress);
  }
  if (tty) std::cerr << "\n";
  const grpc::Status s = reader->Finish();
  if (!s.ok()) return Fail(s);
  if (state == v1::Job::FAILED) {
    std::cerr << "oomb: " << name << " FAILED" << (failure.empty() ? "" : ": " + failure) << "\n";
    return kJobFailed;
  }
  if (state == v1::Job::CANCELLED) {
    std::cerr << "oomb: " << name << " was CANCELLED\n";
    return kJobCancelled;
  }
  return kOk;
}

// The job spec file with its --set overrides, checked against the schema (defaults are the
// server's to fill).
int LoadSpec(const std::string& file, const std::vector<std::string>& sets, v1::JobSpec* spec) {
  if (absl::Status s = spec::LoadYamlFile(file, sets, spec); !s.ok()) {
    std::cerr << "oomb: error: " << s.message() << "\n";
    return kError;
  }
  return kOk;
}

// Runs `body`, turning its return code into the process exit code through CLI11.
template <typename Fn>
void Run(CLI::App* cmd, Fn body) {
  cmd->callback([body] {
    const int rc = body();
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace

int Main(int argc, char** argv) {
  CLI::App app{"oomb: submit and watch long-context fine-tuning jobs on an oombd server"};
  app.footer(std::string("\nEnvironment: OOMB_ENDPOINT (host:port or unix:/path), OOMB_TOKEN, NO_COLOR.\n\n") +
             kExitCodes +
             "\n\nExamples:\n  oomb submit job.yaml --set training.max_steps=5 --watch\n"
             "  oomb list --state RUNNING -o json\n  oomb watch job-abc123\n");
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Help for every subcommand");
  app.fallthrough();  // global options may follow the subcommand: `oomb list -o json`
  Globals g;
  if (const char* e = std::getenv("OOMB_ENDPOINT")) g.endpoint = e;
  app.add_option("--endpoint", g.endpoint, "Server: host:port or unix:/path (env OOMB_ENDPOINT)")
      ->capture_default_str();
  app.add_option("--token-file", g.token_file, "File holding the bearer token (else env OOMB_TOKEN)");
  app.add_option("--ca", g.ca, "CA certificate (PEM) to verify the server: enables TLS");
  app.add_option("--cert", g.cert, "Client certificate (PEM) for mTLS");
  app.add_option("--key", g.key, "Client private key (PEM) for mTLS");
  app.add_option("-o,--output", g.output, "Output format")
      ->check(CLI::IsMember({"table", "json", "yaml"}))
      ->capture_default_str();
  app.add_option("--timeout", g.timeout, "Deadline of each unary call, seconds")->capture_default_str();
  std::unique_ptr<Client> client;
  auto C = [&client, &g]() -> Client& {
    if (!client) client = std::make_unique<Client>(g);
    return *client;
  };

  // submit
  auto* submit = app.add_subcommand("submit", "Create a job from a JOBSPEC.md YAML file")
                     ->footer(
                         "Examples:\n  oomb submit job.yaml\n  oomb submit job.yaml --set training.max_steps=5 "
                         "--set labels.team=nlp --watch\n  oomb submit job.yaml --job-id austen-1 --request-id "
                         "$(uuidgen)");
  struct SubmitArgs {
    std::string file, job_id, request_id;
    std::vector<std::string> sets;
    bool watch = false, validate_only = false;
  };
  auto sa = std::make_shared<SubmitArgs>();
  submit->add_option("file", sa->file, "Job spec (YAML)")->required();
  submit->add_option("--set", sa->sets, "Override a field: dotted.key=value (repeatable)");
  submit->add_option("--job-id", sa->job_id, "Choose the job id ([a-z0-9][a-z0-9-]{0,62})");
  submit->add_option("--request-id", sa->request_id, "Idempotency key: a retried submit returns the same job");
  submit->add_flag("--validate-only", sa->validate_only, "Check the spec on the server; create nothing");
  submit->add_flag("--watch", sa->watch, "Watch the job after creating it (exit code follows the job)");
  Run(submit, [&, sa] {
    v1::CreateJobRequest req;
    if (int rc = LoadSpec(sa->file, sa->sets, req.mutable_spec()); rc) return rc;
    req.set_job_id(sa->job_id);
    req.set_request_id(sa->request_id);
    req.set_validate_only(sa->validate_only);
    v1::Job job;
    auto ctx = C().Context();
    const grpc::Status s = C().jobs().CreateJob(ctx.get(), req, &job);
    if (!s.ok()) return Fail(s);
    if (!PrintStructured(g, job)) {
      if (sa->validate_only) {
        std::cout << "valid\n";
      } else {
        std::cout << job.name() << " " << StateName(job.state())
                  << (job.queue_position() ? fmt::format(" (queue position {})", job.queue_position()) : "") << "\n";
      }
    }
    if (sa->watch && !sa->validate_only) return Watch(C(), job.name(), 0);
    return 0;
  });

  // list
  auto* list = app.add_subcommand("list", "List jobs, newest first")
                   ->footer(
                       "Examples:\n  oomb list\n  oomb list --state RUNNING --state QUEUED --label team=nlp\n"
                       "  oomb list --page-size 10 -o json   # next_page_token in the output");
  struct ListArgs {
    std::vector<std::string> states, labels;
    int page_size = 0;
    std::string page_token;
  };
  auto la = std::make_shared<ListArgs>();
  list->add_option("--state", la->states, "Only jobs in this state (repeatable)");
  list->add_option("--label", la->labels, "Only jobs with this label, k=v (repeatable)");
  list->add_option("--page-size", la->page_size, "Jobs per page (server default 50, max 1000)");
  list->add_option("--page-token", la->page_token, "Continue from a previous page's next_page_token");
  Run(list, [&, la] {
    v1::ListJobsRequest req;
    for (const std::string& s : la->states) {
      v1::Job::State st;
      if (!v1::Job::State_Parse(s, &st)) {
        std::cerr << "oomb: error: --state: unknown state '" << s << "'\n";
        return int{kUsage};
      }
      req.add_states(st);
    }
    for (const std::string& l : la->labels) {
      const size_t eq = l.find('=');
      if (eq == std::string::npos) {
        std::cerr << "oomb: error: --label: expected k=v, got '" << l << "'\n";
        return int{kUsage};
      }
      (*req.mutable_labels())[l.substr(0, eq)] = l.substr(eq + 1);
    }
    req.set_page_size(la->page_size);
    req.set_page_token(la->page_token);
    v1::ListJobsResponse resp;
    auto ctx = C().Context();
    const grpc::Status s = C().jobs().ListJobs(ctx.get(), req, &resp);
    if (!s.ok()) return Fail(s);
    if (!PrintStructured(g, resp)) {
      std::vector<const v1::Job*> jobs;
      for (const v1::Job& j : resp.jobs()) jobs.push_back(&j);
      PrintJobTable(jobs);
      if (!resp.next_page_token().empty()) std::cerr << "more: --page-token " << resp.next_page_token() << "\n";
    }
    return 0;
  });

  // Commands taking one JOB argument.
  auto job_arg = [](CLI::App* cmd, std::string* job) {
    cmd->add_option("job", *job, "Job id or jobs/{id}")->required();
  };

  auto get_job = std::make_shared<std::string>();
  auto* get = app.add_subcommand("get", "Show one job")
                  ->footer("Examples:\n  oomb get job-abc123\n  oomb get jobs/job-abc123 -o yaml");
  job_arg(get, get_job.get());
  Run(get, [&, get_job] {
    v1::GetJobRequest req;
    req.set_name(JobName(*get_job));
    v1::Job job;
    auto ctx = C().Context();
    const grpc::Status s = C().jobs().GetJob(ctx.get(), req, &job);
    if (!s.ok()) return Fail(s);
    if (!PrintStructured(g, job)) PrintJobDetail(job);
    return 0;
  });

  struct WatchArgs {
    std::string job;
    int64_t after = 0;
  };
  auto wa = std::make_shared<WatchArgs>();
  auto* watch = app.add_subcommand("watch", "Follow a job until it ends (progress bar on a TTY)")
                    ->footer(
                        "Examples:\n  oomb watch job-abc123\n  oomb watch job-abc123 --after 120 -o json\n"
                        "Exits 0 when the job SUCCEEDED, 6 when it FAILED, 7 when it was CANCELLED.");
  job_arg(watch, &wa->job);
  watch->add_option("--after", wa->after, "Replay events after this sequence number");
  Run(watch, [&, wa] { return Watch(C(), JobName(wa->job), wa->after); });

  auto ea = std::make_shared<WatchArgs>();
  auto ea_page = std::make_shared<int>(0);
  auto* events = app.add_subcommand("events", "List a job's events")
                     ->footer("Examples:\n  oomb events job-abc123\n  oomb events job-abc123 --after 10 -o json");
  job_arg(events, &ea->job);
  events->add_option("--after", ea->after, "Only events after this sequence number");
  events->add_option("--page-size", *ea_page, "Events per call (server default 500)");
  Run(events, [&, ea, ea_page] {
    v1::ListJobEventsRequest req;
    req.set_name(JobName(ea->job));
    req.set_after_sequence(ea->after);
    req.set_page_size(*ea_page);
    v1::ListJobEventsResponse resp;
    auto ctx = C().Context();
    const grpc::Status s = C().jobs().ListJobEvents(ctx.get(), req, &resp);
    if (!s.ok()) return Fail(s);
    if (!PrintStructured(g, resp)) {
      for (const v1::JobEvent& e : resp.events()) std::cout << EventLine(e) << "\n";
      if (resp.more()) std::cerr << "more: --after " << resp.events(resp.events_size() - 1).sequence() << "\n";
    }
    return 0;
  });

  // cancel / pause / resume: same shape.
  auto state_cmd = [&](const char* name, const char* help, auto call) {
    auto job = std::make_shared<std::string>();
    auto* cmd = app.add_subcommand(name, help)->footer(fmt::format("Example:\n  oomb {} job-abc123", name));
    job_arg(cmd, job.get());
    Run(cmd, [&, job, call] {
      v1::Job out;
      auto ctx = C().Context();
      const grpc::Status s = call(C().jobs(), ctx.get(), JobName(*job), &out);
      if (!s.ok()) return Fail(s);
      if (!PrintStructured(g, out)) std::cout << out.name() << " " << StateName(out.state()) << "\n";
      return 0;
    });
  };
  state_cmd("cancel", "Cancel a job (it stops at the next chunk boundary)",
            [](v1::JobService::Stub& st, grpc::ClientContext* ctx, const std::string& n, v1::Job* out) {
              v1::CancelJobRequest r;
              r.set_name(n);
              return st.CancelJob(ctx, r, out);
            });
  state_cmd("pause", "Pause a job (checkpoint, release the device)",
            [](v1::JobService::Stub& st, grpc::ClientContext* ctx, const std::string& n, v1::Job* out) {
              v1::PauseJobRequest r;
              r.set_name(n);
              return st.PauseJob(ctx, r, out);
            });
  state_cmd("resume", "Queue a paused job again (it continues from its checkpoint)",
            [](v1::JobService::Stub& st, grpc::ClientContext* ctx, const std::string& n, v1::Job* out) {
              v1::ResumeJobRequest r;
              r.set_name(n);
              return st.ResumeJob(ctx, r, out);
            });

  auto del_job = std::make_shared<std::string>();
  auto* del = app.add_subcommand("delete", "Delete a finished job's record (checkpoint files are kept)")
                  ->footer("Example:\n  oomb delete job-abc123");
  job_arg(del, del_job.get());
  Run(del, [&, del_job] {
    v1::DeleteJobRequest req;
    req.set_name(JobName(*del_job));
    v1::DeleteJobResponse resp;
    auto ctx = C().Context();
    const grpc::Status s = C().jobs().DeleteJob(ctx.get(), req, &resp);
    if (!s.ok()) return Fail(s);
    if (!PrintStructured(g, resp)) std::cout << "deleted " << req.name() << "\n";
    return 0;
  });

  auto ck_job = std::make_shared<std::string>();
  auto* ck = app.add_subcommand("checkpoints", "List a job's checkpoints")
                 ->footer("Example:\n  oomb checkpoints job-abc123 -o json");
  job_arg(ck, ck_job.get());
  Run(ck, [&, ck_job] {
    v1::ListCheckpointsRequest req;
    req.set_name(JobName(*ck_job));
    v1::ListCheckpointsResponse resp;
    auto ctx = C().Context();
    const grpc::Status s = C().jobs().ListCheckpoints(ctx.get(), req, &resp);
    if (!s.ok()) return Fail(s);
    if (!PrintStructured(g, resp)) {
      std::cout << fmt::format("{:>8} {:>10} {:<6} {:<19} {}\n", "STEP", "SIZE", "FINAL", "CREATED", "PATH");
      for (const v1::Checkpoint& c : resp.checkpoints()) {
        std::cout << fmt::format("{:>8} {:>10} {:<6} {:<19} {}\n", c.step(), Bytes(c.bytes()), c.final() ? "yes" : "",
                                 Time(c.create_time()), c.path());
      }
    }
    return 0;
  });

  auto es = std::make_shared<SubmitArgs>();
  auto* estimate = app.add_subcommand("estimate", "Ask the server's memory planner whether a job fits")
                       ->footer("Example:\n  oomb estimate job.yaml --set data.max_seq_len=1048576");
  estimate->add_option("file", es->file, "Job spec (YAML)")->required();
  estimate->add_option("--set", es->sets, "Override a field: dotted.key=value (repeatable)");
  Run(estimate, [&, es] {
    v1::EstimateJobRequest req;
    if (int rc = LoadSpec(es->file, es->sets, req.mutable_spec()); rc) return rc;
    v1::EstimateJobResponse resp;
    auto ctx = C().Context();
    const grpc::Status s = C().jobs().EstimateJob(ctx.get(), req, &resp);
    if (!s.ok()) return Fail(s);
    if (!PrintStructured(g, resp)) {
      std::cout << fmt::format("device              {}\n", resp.device())
                << fmt::format("fits                {}\n", resp.fits() ? "yes" : "no")
                << fmt::format("sequence length     {} tokens\n", resp.seq_len())
                << fmt::format("peak device memory  {} of {} usable\n", Bytes(resp.peak_device_bytes()),
                               Bytes(resp.device_capacity_bytes()))
                << fmt::format("  weights           {}\n", Bytes(resp.weights_bytes()))
                << fmt::format("  trainable state   {}\n", Bytes(resp.trainable_state_bytes()))
                << fmt::format("  KV pages          {} ({} bytes per token)\n", Bytes(resp.kv_bytes()),
                               resp.kv_bytes_per_token())
                << fmt::format("  activations       {}\n", Bytes(resp.activation_bytes()))
                << fmt::format("peak host memory    {} of {}\n", Bytes(resp.peak_host_bytes()),
                               Bytes(resp.host_capacity_bytes()))
                << fmt::format("placement           {}\n", resp.placement())
                << fmt::format("longest context     {} tokens\n", resp.max_seq_len_that_fits());
      if (!resp.fits()) std::cout << "limit: " << resp.limit() << "\n";
    }
    return resp.fits() ? 0 : int{kError};
  });

  auto* health = app.add_subcommand("health", "Check the server's health (grpc.health.v1; no token needed)")
                     ->footer("Example:\n  oomb health --endpoint unix:/run/oomb/oombd.sock");
  Run(health, [&] {
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    auto ctx = C().Context();
    const grpc::Status s = C().health().Check(ctx.get(), req, &resp);
    if (!s.ok()) return Fail(s);
    if (!PrintStructured(g, resp)) {
      std::cout << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status()) << "\n";
    }
    return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : int{kUnavailable};
  });

  auto* info = app.add_subcommand("server-info", "Show the server's versions and devices")
                   ->footer("Example:\n  oomb server-info -o json");
  Run(info, [&] {
    v1::GetServerInfoRequest req;
    v1::ServerInfo resp;
    auto ctx = C().Context();
    const grpc::Status s = C().jobs().GetServerInfo(ctx.get(), req, &resp);
    if (!s.ok()) return Fail(s);
    if (!PrintStructured(g, resp)) {
      std::cout << fmt::format("version: {} (torch {}, cuda {})\nhost memory: {}\nstarted: {}{}\n", resp.version(),
                               resp.torch_version(), resp.cuda_version().empty() ? "none" : resp.cuda_version(),
                               Bytes(resp.host_memory_bytes()), Time(resp.start_time()),
                               resp.draining() ? "\ndraining: yes" : "");
      for (const auto& d : resp.devices()) {
        std::cout << fmt::format("  {:<8} {} {}\n", d.name(), d.model(),
                                 d.memory_bytes() ? Bytes(d.memory_bytes()) : "");
      }
    }
    return 0;
  });

  app.add_subcommand("version", "Print the client version")->callback([] { std::cout << "oomb 0.1.0\n"; });

  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : int{kUsage};
  }
  return 0;
}

}  // namespace oomb::client

int main(int argc, char** argv) { return oomb::client::Main(argc, argv); }
