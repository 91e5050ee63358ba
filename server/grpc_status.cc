#include "server/grpc_status.h"

#include <regex>
#include <vector>

#include "absl/strings/str_join.h"
#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"
#include "worker/common/status.h"

namespace oomb::server {

std::string LeadingField(absl::string_view message) {
  // A field path component: a proto field name, with list or map subscripts.
  static const std::regex kComponent(R"(^[a-z_][a-z0-9_]*(\[[^\]: ]*\])*(\.[a-z_][a-z0-9_]*(\[[^\]: ]*\])*)*$)");
  std::vector<std::string> parts;
  size_t at = 0;
  for (;;) {
    const size_t colon = message.find(": ", at);
    if (colon == absl::string_view::npos) break;
    const std::string part(message.substr(at, colon - at));
    if (!std::regex_match(part, kComponent)) break;
    parts.push_back(part);
    at = colon + 2;
  }
  return absl::StrJoin(parts, ".");
}

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  const std::string message = BoundedText(s.message());
  google::rpc::Status details;
  details.set_code(static_cast<int>(s.code()));
  details.set_message(message);
  google::rpc::ErrorInfo info;
  const std::optional<Reason> reason = ReasonOf(s);
  info.set_reason(reason.has_value() ? std::string(ReasonName(*reason)) : absl::StatusCodeToString(s.code()));
  info.set_domain("oomb.dev");
  const std::string field = LeadingField(message);
  if (!field.empty()) (*info.mutable_metadata())["field"] = field;
  details.add_details()->PackFrom(info);
  if (s.code() == absl::StatusCode::kInvalidArgument && !field.empty()) {
    google::rpc::BadRequest bad;
    google::rpc::BadRequest::FieldViolation* v = bad.add_field_violations();
    v->set_field(field);
    v->set_description(message);
    details.add_details()->PackFrom(bad);
  }
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(s.code())), message, details.SerializeAsString());
}

}  // namespace oomb::server
