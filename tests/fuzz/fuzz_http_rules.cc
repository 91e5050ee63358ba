// libFuzzer target: the HTTP gateway's transcoder (server/http/http_rules.h) on arbitrary
// requests, as any HTTP client may send them: the API's own routes (JobService,
// DatasetService), Find/PathKnown on the path, FillRequest with the query and the body,
// ParsePathTemplate on the same text, and PercentDecode on the request line. Input: line 1
// "METHOD PATH", line 2 the query as `name=value` pairs joined by '&' (as decoded: the
// transport decodes them), the rest the body. Contract: no crash, leak, UB or hang; a refusal
// is INVALID_ARGUMENT and says why; a request filled holds each path variable's value in the
// field it names (the path wins over the body); a path Find matches is a path PathKnown knows;
// a template that parses names only its variables; decoding never lengthens.
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "oomb/v1/datasets.pb.h"
#include "oomb/v1/jobs.pb.h"
#include "server/http/http_rules.h"

namespace {

using google::protobuf::Message;

const oomb::server::HttpRoutes& Routes() {
  static const oomb::server::HttpRoutes* routes = [] {
    absl::StatusOr<oomb::server::HttpRoutes> r = oomb::server::HttpRoutes::FromServices(
        {oomb::v1::Job::descriptor()->file()->FindServiceByName("JobService"),
         oomb::v1::Dataset::descriptor()->file()->FindServiceByName("DatasetService")});
    if (!r.ok()) std::abort();
    return new oomb::server::HttpRoutes(*std::move(r));
  }();
  return *routes;
}

// The string the field at dotted `path` holds ("name", "job.name": the API's path variables
// name singular strings, in singular messages).
std::string StringAt(const Message& message, const std::string& path) {
  const Message* m = &message;
  const std::vector<std::string> parts = absl::StrSplit(path, '.');
  for (size_t i = 0; i < parts.size(); ++i) {
    const google::protobuf::FieldDescriptor* f = m->GetDescriptor()->FindFieldByName(parts[i]);
    if (f == nullptr || f->is_repeated()) std::abort();  // FromServices checked every variable's field
    if (i + 1 == parts.size()) {
      if (f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_STRING) std::abort();
      return m->GetReflection()->GetString(*m, f);
    }
    m = &m->GetReflection()->GetMessage(*m, f);
  }
  std::abort();
}

void CheckTemplate(const std::string& text) {
  oomb::server::HttpRoute route;
  if (!oomb::server::ParsePathTemplate(text, &route).ok()) return;
  for (const oomb::server::HttpRoute::Segment& s : route.segments) {
    if (s.variable >= static_cast<int>(route.variables.size())) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> lines = absl::StrSplit(input, absl::MaxSplits('\n', 2));
  lines.resize(3);
  const size_t space = lines[0].find(' ');
  const std::string method = lines[0].substr(0, space);
  const std::string path = space == std::string::npos ? "" : lines[0].substr(space + 1);
  CheckTemplate(path);
  std::multimap<std::string, std::string> query;
  for (absl::string_view pair : absl::StrSplit(lines[1], '&', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(pair, absl::MaxSplits('=', 1));
    query.emplace(std::move(kv));
  }
  // The transport's decoder (PercentDecode) on the raw request line: never longer, and text
  // without '%' comes back as it is.
  const std::string decoded = oomb::server::PercentDecode(lines[0]);
  if (decoded.size() > lines[0].size()) std::abort();
  if (lines[0].find('%') == std::string::npos && decoded != lines[0]) std::abort();
  const oomb::server::HttpRoutes& routes = Routes();
  std::optional<oomb::server::HttpMatch> match = routes.Find(method, path);
  if (!match) return 0;
  if (!routes.PathKnown(path)) std::abort();
  std::unique_ptr<Message> request(
      google::protobuf::MessageFactory::generated_factory()->GetPrototype(match->route->method->input_type())->New());
  const absl::Status filled = oomb::server::HttpRoutes::FillRequest(*match, query, lines[2], request.get());
  if (!filled.ok()) {
    if (filled.code() != absl::StatusCode::kInvalidArgument || filled.message().empty()) std::abort();
    return 0;
  }
  for (const auto& [field, value] : match->bindings) {
    if (StringAt(*request, field) != value) std::abort();
  }
  return 0;
}
