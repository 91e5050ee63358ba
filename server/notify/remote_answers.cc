#include "server/notify/remote_answers.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/common/status.h"

namespace oomb::server {
namespace {

constexpr size_t kExcerptBytes = 200;  // of an answer's body, in a message
constexpr size_t kMaxIdBytes = 256;

// `body` as JSON; discarded when it is not. parse() with allow_exceptions false reports errors
// by value; the catch is for anything else the library may throw on hostile input.
nlohmann::json ParseJson(const std::string& body) {
  try {
    return nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  } catch (...) {
    return nlohmann::json(nlohmann::json::value_t::discarded);
  }
}

// The string at `key` of `json` when it is an object holding a string there; else empty.
std::string StringField(const nlohmann::json& json, const char* key) {
  if (!json.is_object()) return "";
  const auto it = json.find(key);
  return it != json.end() && it->is_string() ? it->get<std::string>() : "";
}

// What a value is, for a message: a string's excerpt, else its type. Never dump(): it recurses,
// and an answer may nest a million arrays deep.
std::string Describe(const nlohmann::json& value) {
  if (value.is_string()) return absl::StrCat("\"", Excerpt(value.get<std::string>(), 64), "\"");
  return absl::StrCat("a JSON ", value.type_name());
}

bool IsIdChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
}

}  // namespace

absl::StatusOr<nlohmann::json> ParseMlflowAnswer(const std::string& path, long status,  // NOLINT(runtime/int)
                                                 const std::string& body) {
  nlohmann::json json = ParseJson(body);
  if (status == 200) return json.is_discarded() ? nlohmann::json::object() : std::move(json);
  const std::string code = StringField(json, "error_code");
  std::string message = StringField(json, "message");
  if (message.empty()) message = body;
  const std::string what = absl::StrCat("MLflow ", path, ": HTTP ", status, code.empty() ? "" : " ", Excerpt(code, 64),
                                        ": ", Excerpt(message, kExcerptBytes));
  if (code == "RESOURCE_DOES_NOT_EXIST") return absl::NotFoundError(what);
  return status >= 500 ? absl::UnavailableError(what) : absl::FailedPreconditionError(what);
}

absl::StatusOr<std::string> MlflowIdAt(const nlohmann::json& answer, std::initializer_list<const char*> keys,
                                       const std::string& path) {
  const nlohmann::json* at = &answer;
  for (const char* key : keys) {
    const auto it = at->is_object() ? at->find(key) : at->end();
    if (!at->is_object() || it == at->end()) {
      return absl::DataLossError(absl::StrCat("MLflow ", path, ": the answer has no ", absl::StrJoin(keys, "."),
                                              " (got ", Describe(answer), ")"));
    }
    at = &*it;
  }
  const std::string id = at->is_string() ? at->get<std::string>() : "";
  bool ok = !id.empty() && id.size() <= kMaxIdBytes;
  for (char c : id) ok = ok && IsIdChar(c);
  if (!ok) {
    return absl::DataLossError(absl::StrCat("MLflow ", path, ": ", absl::StrJoin(keys, "."), " is not an id (1 to ",
                                            kMaxIdBytes, " characters of [A-Za-z0-9._-]): got ", Describe(*at)));
  }
  return id;
}

std::string WebhookAnswerError(long status, const std::string& body) {  // NOLINT(runtime/int)
  if (status >= 200 && status < 300) return "";
  return absl::StrCat("HTTP ", status, body.empty() ? "" : ": ", body.empty() ? "" : Excerpt(body, kExcerptBytes));
}

}  // namespace oomb::server
