// The HTTP form of the API's methods (AIP-127): each method's google.api.http rule, read from the
// services' descriptors, as a route an HTTP request is matched against and turned into the
// method's request message. Nothing here is written per method: a method added to the .proto
// files with a rule is served over HTTP as it is.
//
// A rule's path template (google/api/http.proto) is literal segments, `*` (one segment), `**`
// (the rest) and variables `{field.path=segments}` (`{field}` is `{field=*}`), then an optional
// `:verb`. A request's message is filled, in this order, from:
//   1. the path's variables (the field paths they name, strings);
//   2. the query string, for fields neither the path nor the body holds: `field.path=value`
//      (scalars and enums by name; repeated fields by repeating the parameter; a map entry as
//      `map[key]=value`); an unknown parameter is INVALID_ARGUMENT naming it;
//   3. the body, for a rule with `body`: "*" the whole message, else the field it names, as
//      JSON (the proto3 JSON mapping: lowerCamelCase or the proto's names, enums by name, int64
//      as strings or numbers); a field the message lacks is INVALID_ARGUMENT.
// A path variable the body also sets keeps the path's value (AIP-127).
//
// Thread-safety: an HttpRoutes is immutable once built.
#ifndef OOMB_SERVER_HTTP_HTTP_RULES_H_
#define OOMB_SERVER_HTTP_HTTP_RULES_H_

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace oomb::server {

// One method's rule, parsed.
struct HttpRoute {
  struct Segment {
    enum Kind { kLiteral, kOne, kRest } kind = kLiteral;  // "jobs", "*", "**"
    std::string literal;
    int variable = -1;  // index into `variables` the segment belongs to; -1: none
  };
  std::string http_method;             // GET, POST, PUT, PATCH, DELETE
  std::string path_template;           // as the rule spells it: "/v1/{name=projects/*/jobs/*}:cancel"
  std::vector<Segment> segments;       // of the path before ":verb"
  std::string verb;                    // "cancel"; empty: none
  std::vector<std::string> variables;  // the field paths the variables bind, in order
  std::string body;                    // "", "*", or a top-level field of the request
  const google::protobuf::MethodDescriptor* method = nullptr;
};

// A request matched to a route.
struct HttpMatch {
  const HttpRoute* route = nullptr;
  std::vector<std::pair<std::string, std::string>> bindings;  // field path -> value
};

class HttpRoutes {
 public:
  // The routes of every method of `services` that has a google.api.http rule (additional
  // bindings too). INTERNAL for a rule that does not parse or names no field of the request:
  // an error in the .proto files.
  static absl::StatusOr<HttpRoutes> FromServices(
      const std::vector<const google::protobuf::ServiceDescriptor*>& services);

  // The route `http_method` and `path` (percent-decoded, without the query) match, with its
  // variables' values; nullopt when none does. Literal segments win over variables where two
  // templates could match.
  std::optional<HttpMatch> Find(const std::string& http_method, const std::string& path) const;
  // Whether some route matches `path` with another method (405 rather than 404).
  bool PathKnown(const std::string& path) const;

  // Fills `request` (of the route's input type) from the match, the query parameters and the
  // body, as the file comment says. INVALID_ARGUMENT naming the parameter or field otherwise.
  static absl::Status FillRequest(const HttpMatch& match, const std::multimap<std::string, std::string>& query,
                                  const std::string& body, google::protobuf::Message* request);

  const std::vector<HttpRoute>& routes() const { return routes_; }

 private:
  std::vector<HttpRoute> routes_;
};

// Parses one path template into `route` (segments, verb, variables); INVALID_ARGUMENT naming
// what is wrong.
absl::Status ParsePathTemplate(const std::string& path_template, HttpRoute* route);

// Sets the (scalar, enum, repeated scalar or map) field at dotted `path` of `message` from its
// text form, appending to a repeated field. INVALID_ARGUMENT naming `path`.
absl::Status SetFieldFromText(google::protobuf::Message* message, const std::string& path, const std::string& value);

}  // namespace oomb::server

#endif  // OOMB_SERVER_HTTP_HTTP_RULES_H_
