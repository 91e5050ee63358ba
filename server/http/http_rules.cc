#include "server/http/http_rules.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/api/annotations.pb.h"
#include "google/protobuf/field_mask.pb.h"
#include "google/protobuf/util/json_util.h"
#include "worker/common/status.h"

namespace oomb::server {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// The rule's method and path ("GET", "/v1/..."); empty when it has neither.
std::pair<std::string, std::string> MethodAndPath(const google::api::HttpRule& rule) {
  switch (rule.pattern_case()) {
    case google::api::HttpRule::kGet:
      return {"GET", rule.get()};
    case google::api::HttpRule::kPost:
      return {"POST", rule.post()};
    case google::api::HttpRule::kPut:
      return {"PUT", rule.put()};
    case google::api::HttpRule::kPatch:
      return {"PATCH", rule.patch()};
    case google::api::HttpRule::kDelete:
      return {"DELETE", rule.delete_()};
    case google::api::HttpRule::kCustom:
      return {rule.custom().kind(), rule.custom().path()};
    default:
      return {"", ""};
  }
}

// The field of `type` named `name` (its proto name or its JSON name), or null.
const FieldDescriptor* FieldNamed(const google::protobuf::Descriptor* type, const std::string& name) {
  if (const FieldDescriptor* f = type->FindFieldByName(name); f != nullptr) return f;
  for (int i = 0; i < type->field_count(); ++i) {
    if (type->field(i)->json_name() == name) return type->field(i);
  }
  return nullptr;
}

// The field a dotted path names in `type`, or null.
const FieldDescriptor* FieldAt(const google::protobuf::Descriptor* type, const std::string& path) {
  const FieldDescriptor* f = nullptr;
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    if (type == nullptr) return nullptr;
    f = FieldNamed(type, std::string(part));
    if (f == nullptr) return nullptr;
    type = f->message_type();
  }
  return f;
}

// `message`'s field `name` if it is of `type` and singular; null otherwise.
const FieldDescriptor* Typed(const google::protobuf::Descriptor* message, const char* name,
                             FieldDescriptor::Type type) {
  const FieldDescriptor* f = message->FindFieldByName(name);
  return f != nullptr && f->type() == type && !f->is_repeated() ? f : nullptr;
}

// Whether `response` has the byte-stream shape (HttpByteStream), and its two fields if so.
bool ByteStreamShape(const google::protobuf::Descriptor* response, HttpByteStream* out) {
  if (response->oneof_decl_count() != 1 || response->field_count() != 2) return false;
  const google::protobuf::OneofDescriptor* oneof = response->oneof_decl(0);
  if (oneof->field_count() != 2) return false;
  for (int i = 0; i < 2; ++i) {
    const FieldDescriptor* a = oneof->field(i);
    const FieldDescriptor* b = oneof->field(1 - i);
    if (a->type() == FieldDescriptor::TYPE_MESSAGE && b->type() == FieldDescriptor::TYPE_BYTES) {
      out->header = a;
      out->data = b;
      return true;
    }
  }
  return false;
}

// The byte stream's resumable fields (HttpByteStream); INTERNAL naming the first one missing.
absl::Status ResumableFields(const google::protobuf::MethodDescriptor* method, HttpByteStream* b) {
  const google::protobuf::Descriptor* header = b->header->message_type();
  const google::protobuf::Descriptor* request = method->input_type();
  b->total_bytes = Typed(header, "total_bytes", FieldDescriptor::TYPE_INT64);
  b->offset = Typed(header, "offset", FieldDescriptor::TYPE_INT64);
  b->etag = Typed(header, "etag", FieldDescriptor::TYPE_STRING);
  b->root = Typed(header, "root", FieldDescriptor::TYPE_STRING);
  b->request_offset = Typed(request, "offset", FieldDescriptor::TYPE_INT64);
  b->request_etag = Typed(request, "etag", FieldDescriptor::TYPE_STRING);
  const std::pair<const FieldDescriptor*, std::string> needed[] = {
      {b->total_bytes, absl::StrCat(header->full_name(), ".total_bytes (int64)")},
      {b->offset, absl::StrCat(header->full_name(), ".offset (int64)")},
      {b->etag, absl::StrCat(header->full_name(), ".etag (string)")},
      {b->request_offset, absl::StrCat(request->full_name(), ".offset (int64)")},
      {b->request_etag, absl::StrCat(request->full_name(), ".etag (string)")}};
  for (const auto& [field, name] : needed) {
    if (field == nullptr) {
      return absl::InternalError(
          absl::StrCat(method->full_name(), ": a byte stream over HTTP must be resumable; it lacks ", name));
    }
  }
  return absl::OkStatus();
}

// The route's HTTP form, from the method's streaming and its messages' shapes (http_rules.h).
absl::Status StreamForms(const google::protobuf::MethodDescriptor* method, HttpRoute* route) {
  if (method->client_streaming() && method->server_streaming()) {
    return absl::InternalError(absl::StrCat(method->full_name(), ": a bidirectional stream has no HTTP form"));
  }
  if (method->client_streaming()) {
    const FieldDescriptor* f = method->input_type()->FindFieldByName(route->body);
    if (f == nullptr || f->type() != FieldDescriptor::TYPE_BYTES || f->is_repeated()) {
      return absl::InternalError(
          absl::StrCat(method->full_name(), ": a client stream's rule must name a bytes field as its body"));
    }
    route->body_stream = f;
    return absl::OkStatus();
  }
  if (!method->server_streaming()) return absl::OkStatus();
  route->resume = Typed(method->input_type(), "after_sequence", FieldDescriptor::TYPE_INT64);
  if (!ByteStreamShape(method->output_type(), &route->bytes)) {
    route->answer = HttpAnswer::kEvents;
    return absl::OkStatus();
  }
  route->answer = HttpAnswer::kBytes;
  return ResumableFields(method, &route->bytes);
}

absl::Status AddRoute(const google::api::HttpRule& rule, const google::protobuf::MethodDescriptor* method,
                      std::vector<HttpRoute>* out) {
  const auto [verb, path] = MethodAndPath(rule);
  if (verb.empty()) return absl::InternalError(absl::StrCat(method->full_name(), ": google.api.http without a path"));
  HttpRoute route;
  route.http_method = verb;
  route.path_template = path;
  route.body = rule.body();
  route.method = method;
  OOMB_RETURN_IF_ERROR(Annotate(ParsePathTemplate(path, &route), method->full_name()));
  for (const std::string& v : route.variables) {
    if (FieldAt(method->input_type(), v) == nullptr) {
      return absl::InternalError(absl::StrCat(method->full_name(), ": ", path, ": no field ", v));
    }
  }
  if (!route.body.empty() && route.body != "*" && method->input_type()->FindFieldByName(route.body) == nullptr) {
    return absl::InternalError(absl::StrCat(method->full_name(), ": body: no field ", route.body));
  }
  OOMB_RETURN_IF_ERROR(StreamForms(method, &route));
  out->push_back(std::move(route));
  for (const google::api::HttpRule& more : rule.additional_bindings())
    OOMB_RETURN_IF_ERROR(AddRoute(more, method, out));
  return absl::OkStatus();
}

// Whether `segments` match `parts` from `at` on (and how `route`'s variables bind).
bool MatchSegments(const HttpRoute& route, const std::vector<std::string>& parts,
                   std::vector<std::pair<std::string, std::string>>* bindings) {
  std::vector<std::vector<std::string>> values(route.variables.size());
  size_t i = 0;
  for (const HttpRoute::Segment& s : route.segments) {
    if (s.kind == HttpRoute::Segment::kRest) {
      if (s.variable >= 0) {
        for (size_t k = i; k < parts.size(); ++k) values[static_cast<size_t>(s.variable)].push_back(parts[k]);
      }
      i = parts.size();
      continue;
    }
    if (i >= parts.size()) return false;
    if (s.kind == HttpRoute::Segment::kLiteral && parts[i] != s.literal) return false;
    if (s.kind == HttpRoute::Segment::kOne && parts[i].empty()) return false;
    if (s.variable >= 0) values[static_cast<size_t>(s.variable)].push_back(parts[i]);
    ++i;
  }
  if (i != parts.size()) return false;
  bindings->clear();
  for (size_t v = 0; v < values.size(); ++v) bindings->emplace_back(route.variables[v], absl::StrJoin(values[v], "/"));
  return true;
}

// The number of literal segments: the more, the more specific.
int Literals(const HttpRoute& route) {
  return static_cast<int>(std::count_if(route.segments.begin(), route.segments.end(), [](const HttpRoute::Segment& s) {
    return s.kind == HttpRoute::Segment::kLiteral;
  }));
}

// Splits "/v1/a/b:verb" into its segments and verb (the verb: after the last ':' of the last
// segment).
void SplitPath(const std::string& path, std::vector<std::string>* parts, std::string* verb) {
  std::string p = path;
  verb->clear();
  const size_t slash = p.rfind('/');
  const size_t colon = p.rfind(':');
  if (colon != std::string::npos && (slash == std::string::npos || colon > slash)) {
    *verb = p.substr(colon + 1);
    p.resize(colon);
  }
  *parts = absl::StrSplit(absl::StripPrefix(p, "/"), '/');
}

absl::Status BadValue(const std::string& path, const FieldDescriptor* f, const std::string& value) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": expected ", f->type_name(), ", got '", Excerpt(value), "'"));
}

// Sets (or appends to) scalar field `f` of `m` from `value`.
absl::Status SetScalar(Message* m, const FieldDescriptor* f, const std::string& path, const std::string& value) {
  const Reflection* r = m->GetReflection();
  const bool rep = f->is_repeated();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string v = value;
      if (f->type() == FieldDescriptor::TYPE_BYTES && !absl::Base64Unescape(value, &v) &&
          !absl::WebSafeBase64Unescape(value, &v)) {
        return BadValue(path, f, value);
      }
      rep ? r->AddString(m, f, v) : r->SetString(m, f, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_INT32: {
      int32_t v = 0;
      if (!absl::SimpleAtoi(value, &v)) return BadValue(path, f, value);
      rep ? r->AddInt32(m, f, v) : r->SetInt32(m, f, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_INT64: {
      int64_t v = 0;
      if (!absl::SimpleAtoi(value, &v)) return BadValue(path, f, value);
      rep ? r->AddInt64(m, f, v) : r->SetInt64(m, f, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_UINT32: {
      uint32_t v = 0;
      if (!absl::SimpleAtoi(value, &v)) return BadValue(path, f, value);
      rep ? r->AddUInt32(m, f, v) : r->SetUInt32(m, f, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_UINT64: {
      uint64_t v = 0;
      if (!absl::SimpleAtoi(value, &v)) return BadValue(path, f, value);
      rep ? r->AddUInt64(m, f, v) : r->SetUInt64(m, f, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT: {
      double v = 0;
      if (!absl::SimpleAtod(value, &v)) return BadValue(path, f, value);
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_FLOAT) {
        rep ? r->AddFloat(m, f, static_cast<float>(v)) : r->SetFloat(m, f, static_cast<float>(v));
      } else {
        rep ? r->AddDouble(m, f, v) : r->SetDouble(m, f, v);
      }
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_BOOL: {
      const std::string v = absl::AsciiStrToLower(value);
      if (v != "true" && v != "false") return BadValue(path, f, value);
      rep ? r->AddBool(m, f, v == "true") : r->SetBool(m, f, v == "true");
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_ENUM: {
      const google::protobuf::EnumValueDescriptor* e = f->enum_type()->FindValueByName(value);
      int number = 0;
      if (e == nullptr && absl::SimpleAtoi(value, &number)) e = f->enum_type()->FindValueByNumber(number);
      if (e == nullptr) return BadValue(path, f, value);
      rep ? r->AddEnum(m, f, e) : r->SetEnum(m, f, e);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat(path, ": cannot be set from the query string"));
}

}  // namespace

std::pair<std::string, std::string> MediaOf(const HttpByteStream& stream) {
  if (stream.header != nullptr && stream.header->message_type()->full_name() == "oomb.v1.CheckpointArchive") {
    return {"application/x-tar", ".tar"};
  }
  return {"application/octet-stream", ""};
}

HttpEvent EventOf(const Message& message) {
  HttpEvent e{"message", std::nullopt};
  const google::protobuf::Descriptor* type = message.GetDescriptor();
  const Reflection* r = message.GetReflection();
  for (int i = 0; i < type->oneof_decl_count(); ++i) {
    const FieldDescriptor* f = r->GetOneofFieldDescriptor(message, type->oneof_decl(i));
    if (f == nullptr) continue;
    e.name = f->name();
    if (f->type() != FieldDescriptor::TYPE_MESSAGE) return e;
    const Message& member = r->GetMessage(message, f);
    for (const char* name : {"sequence", "last_sequence"}) {
      if (const FieldDescriptor* id = Typed(member.GetDescriptor(), name, FieldDescriptor::TYPE_INT64); id != nullptr) {
        e.id = member.GetReflection()->GetInt64(member, id);
        return e;
      }
    }
    return e;
  }
  return e;
}

std::string PercentDecode(absl::string_view text) {
  const auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const int hi = text[i] == '%' && i + 2 < text.size() ? hex(text[i + 1]) : -1;
    const int lo = hi >= 0 ? hex(text[i + 2]) : -1;
    if (lo < 0) {
      out.push_back(text[i]);
      continue;
    }
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return out;
}

absl::Status ParsePathTemplate(const std::string& path_template, HttpRoute* route) {
  if (!absl::StartsWith(path_template, "/")) {
    return absl::InvalidArgumentError(absl::StrCat("path template '", path_template, "' does not start with /"));
  }
  // The verb: after the last ':' outside braces.
  std::string path = path_template;
  int depth = 0;
  size_t verb_at = std::string::npos;
  for (size_t i = 0; i < path.size(); ++i) {
    if (path[i] == '{') ++depth;
    if (path[i] == '}') --depth;
    if (path[i] == ':' && depth == 0) verb_at = i;
  }
  if (verb_at != std::string::npos) {
    route->verb = path.substr(verb_at + 1);
    path.resize(verb_at);
  }
  route->segments.clear();
  route->variables.clear();
  size_t i = 1;
  while (i <= path.size()) {
    if (i < path.size() && path[i] == '{') {
      const size_t close = path.find('}', i);
      if (close == std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat("path template '", path_template, "': unclosed {"));
      }
      const std::string inside = path.substr(i + 1, close - i - 1);
      const size_t eq = inside.find('=');
      const int v = static_cast<int>(route->variables.size());
      route->variables.push_back(inside.substr(0, eq));
      const std::string pattern = eq == std::string::npos ? "*" : inside.substr(eq + 1);
      for (absl::string_view p : absl::StrSplit(pattern, '/')) {
        HttpRoute::Segment s;
        s.variable = v;
        s.kind = p == "**"  ? HttpRoute::Segment::kRest
                 : p == "*" ? HttpRoute::Segment::kOne
                            : HttpRoute::Segment::kLiteral;
        s.literal = std::string(p);
        route->segments.push_back(std::move(s));
      }
      i = close + 2;  // past "}/"
      continue;
    }
    const size_t end = std::min(path.find('/', i), path.size());
    const std::string p = path.substr(i, end - i);
    HttpRoute::Segment s;
    s.kind = p == "**" ? HttpRoute::Segment::kRest : p == "*" ? HttpRoute::Segment::kOne : HttpRoute::Segment::kLiteral;
    s.literal = p;
    route->segments.push_back(std::move(s));
    i = end + 1;
  }
  return absl::OkStatus();
}

absl::StatusOr<HttpRoutes> HttpRoutes::FromServices(
    const std::vector<const google::protobuf::ServiceDescriptor*>& services) {
  HttpRoutes out;
  for (const google::protobuf::ServiceDescriptor* s : services) {
    for (int i = 0; i < s->method_count(); ++i) {
      const google::protobuf::MethodDescriptor* m = s->method(i);
      if (!m->options().HasExtension(google::api::http)) continue;
      OOMB_RETURN_IF_ERROR(AddRoute(m->options().GetExtension(google::api::http), m, &out.routes_));
    }
  }
  return out;
}

std::optional<HttpMatch> HttpRoutes::Find(const std::string& http_method, const std::string& path) const {
  std::vector<std::string> parts;
  std::string verb;
  SplitPath(path, &parts, &verb);
  std::optional<HttpMatch> best;
  int best_literals = -1;
  for (const HttpRoute& r : routes_) {
    if (r.http_method != http_method || r.verb != verb) continue;
    std::vector<std::pair<std::string, std::string>> bindings;
    if (!MatchSegments(r, parts, &bindings)) continue;
    if (Literals(r) > best_literals) {
      best = HttpMatch{&r, std::move(bindings)};
      best_literals = Literals(r);
    }
  }
  return best;
}

bool HttpRoutes::PathKnown(const std::string& path) const {
  std::vector<std::string> parts;
  std::string verb;
  SplitPath(path, &parts, &verb);
  std::vector<std::pair<std::string, std::string>> bindings;
  return std::any_of(routes_.begin(), routes_.end(),
                     [&](const HttpRoute& r) { return r.verb == verb && MatchSegments(r, parts, &bindings); });
}

absl::Status SetFieldFromText(Message* message, const std::string& path, const std::string& value) {
  Message* m = message;
  const std::vector<std::string> parts = absl::StrSplit(path, '.');
  for (size_t i = 0; i < parts.size(); ++i) {
    std::string name = parts[i];
    std::string key;  // map[key]
    if (const size_t open = name.find('['); open != std::string::npos && absl::EndsWith(name, "]")) {
      key = name.substr(open + 1, name.size() - open - 2);
      name.resize(open);
    }
    const FieldDescriptor* f = FieldNamed(m->GetDescriptor(), name);
    if (f == nullptr) return absl::InvalidArgumentError(absl::StrCat(path, ": no such field"));
    const Reflection* r = m->GetReflection();
    if (f->is_map()) {
      if (i + 1 != parts.size() || key.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": a map entry is set as ", name, "[key]=value"));
      }
      Message* entry = r->AddMessage(m, f);
      OOMB_RETURN_IF_ERROR(SetScalar(entry, entry->GetDescriptor()->map_key(), path, key));
      return SetScalar(entry, entry->GetDescriptor()->map_value(), path, value);
    }
    if (!key.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", name, " is not a map"));
    if (i + 1 == parts.size()) {
      if (f->message_type() != nullptr &&
          f->message_type()->full_name() == google::protobuf::FieldMask::descriptor()->full_name() &&
          !f->is_repeated()) {
        Message* mask = r->MutableMessage(m, f);
        const FieldDescriptor* paths = mask->GetDescriptor()->FindFieldByName("paths");
        for (absl::string_view p : absl::StrSplit(value, ',', absl::SkipEmpty())) {
          mask->GetReflection()->AddString(mask, paths, std::string(absl::StripAsciiWhitespace(p)));
        }
        return absl::OkStatus();
      }
      return SetScalar(m, f, path, value);
    }
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE || f->is_repeated()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", name, " holds no fields"));
    }
    m = r->MutableMessage(m, f);
  }
  return absl::OkStatus();
}

absl::Status HttpRoutes::FillRequest(const HttpMatch& match, const std::multimap<std::string, std::string>& query,
                                     const std::string& body, Message* request) {
  const HttpRoute& route = *match.route;
  if (!route.body.empty() && !body.empty()) {
    google::protobuf::util::JsonParseOptions options;
    options.ignore_unknown_fields = false;
    Message* target = request;
    const FieldDescriptor* field = nullptr;
    if (route.body != "*") {
      field = request->GetDescriptor()->FindFieldByName(route.body);
      if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        target = request->GetReflection()->MutableMessage(request, field);
      } else if (field->type() == FieldDescriptor::TYPE_BYTES) {  // the raw body (google.api.HttpBody's way)
        request->GetReflection()->SetString(request, field, body);
        target = nullptr;
      }
    }
    if (target != nullptr) {
      const google::protobuf::util::Status parsed = google::protobuf::util::JsonStringToMessage(body, target, options);
      if (!parsed.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(field != nullptr ? field->name() : "body", ": not a JSON ",
                                                       target->GetDescriptor()->name(), ": ",
                                                       Excerpt(std::string(parsed.message()), 300)));
      }
    }
  } else if (route.body.empty() && !body.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(route.http_method, " ", route.path_template, " takes no body"));
  }
  for (const auto& [name, value] : query) {
    if (route.body == "*") {
      return absl::InvalidArgumentError(absl::StrCat("query parameter ", Excerpt(name),
                                                     ": this method takes its "
                                                     "fields in the body"));
    }
    OOMB_RETURN_IF_ERROR(Annotate(SetFieldFromText(request, name, value), "query parameter"));
  }
  for (const auto& [path, value] : match.bindings) {
    // The path's value wins over the body's (AIP-127): clear what the body may have set first.
    OOMB_RETURN_IF_ERROR(SetFieldFromText(request, path, value));
  }
  return absl::OkStatus();
}

}  // namespace oomb::server
