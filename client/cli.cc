#include "client/cli.h"

#include <google/protobuf/util/json_util.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include <fmt/format.h>

#include "proto/spec/spec_codec.h"

namespace oomb::client {
namespace {

const char* CodeName(grpc::StatusCode c) {
  static const char* const kNames[] = {
      "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
      "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
      "DATA_LOSS", "UNAUTHENTICATED"};
  const int i = static_cast<int>(c);
  return i >= 0 && i < 17 ? kNames[i] : "UNKNOWN";
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

}  // namespace

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

std::string Printable(const std::string& text) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7f) {  // C0 controls and DEL
      out += kReplacement;
      ++i;
      continue;
    }
    const size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 1;
    if (i + len > text.size()) break;
    uint32_t cp = len == 1 ? c : c & (0xff >> (len + 1));
    for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3f);
    const bool control = (cp >= 0x80 && cp < 0xa0) || cp == 0x061c || cp == 0x200e || cp == 0x200f ||
                         (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069);
    out += control ? std::string(kReplacement) : text.substr(i, len);
    i += len;
  }
  return out;
}

namespace {

// Tokens as "4K" where a whole number of K, else the number.
std::string Tokens(int64_t n) { return n % 1024 == 0 && n > 0 ? fmt::format("{}K", n / 1024) : std::to_string(n); }

}  // namespace

std::string EvaluationLine(const v1::EvaluationResult& e) {
  // A map's order is no order: the retrieval suites' accuracies by name, then the loss by position.
  const std::map<std::string, v1::EvaluationResult::Suite> suites(e.suites().begin(), e.suites().end());
  std::string line;
  const auto add = [&line](const std::string& part) { line += (line.empty() ? "" : ", ") + part; };
  for (const auto& [name, s] : suites) {
    if (s.has_accuracy()) add(fmt::format("{} {:.2f}", name, s.accuracy()));
  }
  for (const auto& [name, s] : suites) {
    if (s.buckets().empty()) continue;
    std::string part = "loss by position";
    for (const v1::EvaluationResult::Bucket& b : s.buckets()) {
      part += fmt::format(" [{}K, {}K) {:.3f}", b.begin() / 1024, b.end() / 1024, b.loss());
    }
    add(part);
  }
  for (const auto& [name, s] : suites) {
    if (!s.has_effective_length()) continue;
    std::vector<std::string> by_length;
    for (const auto& a : s.averages()) by_length.push_back(fmt::format("{} {:.1f}", Tokens(a.length()), a.score()));
    add(fmt::format("{} effective length {} (threshold {:.1f}; by length {})", name, Tokens(s.effective_length()),
                    s.threshold(), fmt::join(by_length, ", ")));
  }
  return e.step() > 0 ? fmt::format("step {}: {}", e.step(), line) : line;
}

std::vector<std::string> RulerLines(const v1::EvaluationResult& e) {
  const auto it = e.suites().find("ruler");
  if (it == e.suites().end()) return {};
  std::vector<std::string> out, order;  // tasks in the order run
  std::map<std::string, std::string> lines;
  for (const v1::EvaluationResult::TaskScore& t : it->second.tasks()) {
    if (!lines.contains(t.task())) order.push_back(t.task());
    lines[t.task()] += fmt::format("  {} {:.1f}", Tokens(t.length()), t.score());
  }
  for (const std::string& task : order) out.push_back(fmt::format("{:<16}{}", task, lines[task]));
  return out;
}

Client::Client(const Globals& g) : g_(g) {
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
  datasets_ = v1::DatasetService::NewStub(channel_);
  health_ = grpc::health::v1::Health::NewStub(channel_);
  if (!g.token_file.empty()) {
    token_ = Trim(ReadAll(g.token_file));
  } else if (const char* t = std::getenv("OOMB_TOKEN")) {
    token_ = t;
  }
}

std::unique_ptr<grpc::ClientContext> Client::Context(bool unary) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (!token_.empty()) ctx->AddMetadata("authorization", "Bearer " + token_);
  if (unary) {
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(static_cast<int64_t>(g_.timeout * 1000)));
  }
  return ctx;
}

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

int Fail(const grpc::Status& s) {
  std::cerr << "oomb: error: " << CodeName(s.error_code()) << ": " << s.error_message() << "\n";
  return ExitFor(s.error_code());
}

std::string ToJson(const google::protobuf::Message& m, bool pretty) {
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.add_whitespace = pretty;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

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

bool Color() { return ::isatty(1) && std::getenv("NO_COLOR") == nullptr; }

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
  std::tm tm{};
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", localtime_r(&secs, &tm));
  return buf;
}

std::string JobName(const Globals& g, const std::string& arg) {
  if (arg.rfind("projects/", 0) == 0 || arg.rfind("jobs/", 0) == 0) return arg;
  return g.project.empty() ? "jobs/" + arg : "projects/" + g.project + "/jobs/" + arg;
}

std::string Parent(const Globals& g) { return g.project.empty() ? "" : "projects/" + g.project; }

int LoadSpec(const std::string& file, const std::vector<std::string>& sets, v1::JobSpec* spec) {
  if (absl::Status s = spec::LoadYamlFile(file, sets, spec); !s.ok()) {
    std::cerr << "oomb: error: " << s.message() << "\n";
    return kError;
  }
  return kOk;
}

void OnRun(CLI::App* cmd, std::function<int()> body) {
  cmd->callback([body = std::move(body)] {
    const int rc = body();
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace oomb::client
