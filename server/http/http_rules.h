// The HTTP form of the API's methods (AIP-127): each method's google.api.http rule, read from the
// services' descriptors, as a route an HTTP request is matched against and turned into the
// method's request message. Nothing here is written per method, and nothing is chosen by a
// method's name: how a method's messages cross HTTP (HttpAnswer, HttpRoute::body_stream) is read
// from its descriptor, so a method added to the .proto files with a rule is served as it is
// declared, and one whose shape has no HTTP form is refused when the routes are built.
//
// A rule's path template (google/api/http.proto) is literal segments, `*` (one segment), `**`
// (the rest) and variables `{field.path=segments}` (`{field}` is `{field=*}`), then an optional
// `:verb`. A request's message is filled, in this order, from:
//   1. the body, for a rule with `body`: "*" the whole message, else the field it names, as
//      JSON (protobuf's own JSON parser, google::protobuf::util::JsonStringToMessage: the proto3
//      JSON mapping, lowerCamelCase or the proto's names, enums by name, int64 as strings or
//      numbers); a field the message lacks is INVALID_ARGUMENT. A body field of type `bytes` takes
//      the raw body (google.api.HttpBody's way);
//   2. the query string, for a rule whose body is not "*": `field.path=value` (scalars and enums
//      by name or number; repeated fields by repeating the parameter; a map entry as
//      `map[key]=value`; a FieldMask as comma-separated paths); an unknown parameter is
//      INVALID_ARGUMENT naming it;
//   3. the path's variables (the field paths they name), last: a path variable the body also sets
//      keeps the path's value (AIP-127).
// The path and the query arrive percent-decoded: the transport (server/http/http_server.h)
// decodes the path and each query name and value with PercentDecode, '+' in the query being a
// space first (form encoding).
//
// The method's shape decides its HTTP form:
//   - unary: the response as JSON (HttpAnswer::kJson);
//   - server streaming: each message a server-sent event (kEvents), unless the response message
//     is a byte stream (kBytes, HttpByteStream below: DownloadCheckpointResponse's shape), whose
//     content is the HTTP body;
//   - client streaming: the HTTP body streamed into the request's `bytes` field the rule's `body`
//     names (the other fields from the path and query, in the first message only);
//   - bidirectional streaming: no HTTP form (FromServices refuses a rule on one).
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
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace oomb::server {

// How a method's answer crosses HTTP (see the file comment).
enum class HttpAnswer { kJson, kEvents, kBytes };

// A byte stream's response: a message whose only fields are one oneof of exactly two, a message
// (the header, which comes first) and a `bytes` field (the content's next bytes, in order). It
// must be resumable, or FromServices refuses it: the header has int64 `total_bytes` (the whole
// content's size), int64 `offset` (where the bytes that follow start) and string `etag` (names
// this content), and the request has int64 `offset` (where to start) and string `etag` (the
// content the caller holds part of: another is ABORTED). A string `root` in the header names the
// file (Content-Disposition). server/http/gateway.h says how ranges map onto them.
struct HttpByteStream {
  const google::protobuf::FieldDescriptor* header = nullptr;  // of the response
  const google::protobuf::FieldDescriptor* data = nullptr;    // of the response
  const google::protobuf::FieldDescriptor *total_bytes = nullptr, *offset = nullptr, *etag = nullptr;  // header's
  const google::protobuf::FieldDescriptor* root = nullptr;            // header's; null: none
  const google::protobuf::FieldDescriptor* request_offset = nullptr;  // of the request
  const google::protobuf::FieldDescriptor* request_etag = nullptr;    // of the request
};

// A byte stream's media type and the suffix of its file name, by its header's type: a
// checkpoint's archive (oomb.v1.CheckpointArchive) is application/x-tar, ".tar"; any other
// content application/octet-stream, "".
std::pair<std::string, std::string> MediaOf(const HttpByteStream& stream);

// One server-sent event's name and id, read from a streamed message: the name is the oneof
// member it carries ("snapshot", "event"; "message" for a message without a set oneof); the id
// is that member's int64 `sequence` or, failing that, `last_sequence` (nullopt: none). A
// request's int64 `after_sequence` is what `Last-Event-ID` sets on resuming.
struct HttpEvent {
  std::string name;
  std::optional<int64_t> id;
};
HttpEvent EventOf(const google::protobuf::Message& message);

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
  HttpAnswer answer = HttpAnswer::kJson;  // from the method's streaming and response shape
  HttpByteStream bytes;                   // answer kBytes: its fields
  // Client streaming: the request's bytes field the HTTP body is streamed into; null: a unary body.
  const google::protobuf::FieldDescriptor* body_stream = nullptr;
  // Server streaming: the request's int64 `after_sequence`, set from Last-Event-ID; null: none.
  const google::protobuf::FieldDescriptor* resume = nullptr;
};

// A request matched to a route.
struct HttpMatch {
  const HttpRoute* route = nullptr;
  std::vector<std::pair<std::string, std::string>> bindings;  // field path -> value
};

class HttpRoutes {
 public:
  // The routes of every method of `services` that has a google.api.http rule (additional
  // bindings too). INTERNAL for a rule that does not parse or names no field of the request, a
  // client stream whose body is not a bytes field, a bidirectional stream, a byte stream that is
  // not resumable (HttpByteStream): an error in the .proto files.
  static absl::StatusOr<HttpRoutes> FromServices(
      const std::vector<const google::protobuf::ServiceDescriptor*>& services);

  // The route `http_method` and `path` (percent-decoded, without the query) match, with its
  // variables' values; nullopt when none does. Where several match, the one with the most
  // literal segments wins (then the first declared). A `*` or a variable's segment matches one
  // non-empty segment; `**` the rest, empty included; the verb must be the rule's exactly.
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

// `text` with each %XX (two hex digits, either case) replaced by its byte (RFC 3986 §2.1); a '%'
// not followed by two hex digits stays as it is. Never longer than `text`.
std::string PercentDecode(absl::string_view text);

// Parses one path template into `route` (segments, verb, variables); INVALID_ARGUMENT naming
// what is wrong.
absl::Status ParsePathTemplate(const std::string& path_template, HttpRoute* route);

// Sets the (scalar, enum, repeated scalar or map) field at dotted `path` of `message` from its
// text form, appending to a repeated field. INVALID_ARGUMENT naming `path`.
absl::Status SetFieldFromText(google::protobuf::Message* message, const std::string& path, const std::string& value);

}  // namespace oomb::server

#endif  // OOMB_SERVER_HTTP_HTTP_RULES_H_
