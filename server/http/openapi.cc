#include "server/http/openapi.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "google/protobuf/descriptor.pb.h"
#include "server/http/api_descriptor.h"

namespace oomb::server {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::FieldDescriptor;
using json = nlohmann::ordered_json;

// The .proto files with their comments (api_descriptor.h), to describe what the generated
// descriptors (which carry no comments) name.
const google::protobuf::DescriptorPool* CommentsPool() {
  static const google::protobuf::DescriptorPool* const pool = [] {
    google::protobuf::FileDescriptorSet set;
    auto* p = new google::protobuf::DescriptorPool();
    if (!set.ParseFromArray(ApiDescriptorSet().data(), static_cast<int>(ApiDescriptorSet().size()))) return p;
    for (const google::protobuf::FileDescriptorProto& f : set.file()) p->BuildFile(f);
    return p;
  }();
  return pool;
}

// A comment as a description: its lines joined, the "//" gone.
std::string Clean(const std::string& comment) {
  std::vector<std::string> lines;
  for (absl::string_view l : absl::StrSplit(comment, '\n')) lines.emplace_back(absl::StripAsciiWhitespace(l));
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  return absl::StrJoin(lines, "\n");
}

template <typename D>
std::string CommentOf(const D* d) {
  if (d == nullptr) return "";
  google::protobuf::SourceLocation loc;
  if (!d->GetSourceLocation(&loc)) return "";
  return Clean(loc.leading_comments.empty() ? loc.trailing_comments : loc.leading_comments);
}

std::string MessageComment(const Descriptor* m) {
  return CommentOf(CommentsPool()->FindMessageTypeByName(m->full_name()));
}
std::string FieldComment(const FieldDescriptor* f) {
  const Descriptor* m = CommentsPool()->FindMessageTypeByName(f->containing_type()->full_name());
  return m == nullptr ? "" : CommentOf(m->FindFieldByName(f->name()));
}
std::string MethodComment(const google::protobuf::MethodDescriptor* m) {
  return CommentOf(CommentsPool()->FindMethodByName(m->full_name()));
}
std::string EnumComment(const EnumDescriptor* e) {
  return CommentOf(CommentsPool()->FindEnumTypeByName(e->full_name()));
}

std::string SchemaName(const std::string& full_name) { return std::string(absl::StripPrefix(full_name, "oomb.v1.")); }

class Builder {
 public:
  json Ref(const Descriptor* m) {
    AddMessage(m);
    return {{"$ref", "#/components/schemas/" + SchemaName(m->full_name())}};
  }

  json FieldSchema(const FieldDescriptor* f) {
    if (f->is_map()) {
      return {{"type", "object"}, {"additionalProperties", ValueSchema(f->message_type()->map_value())}};
    }
    json one = ValueSchema(f);
    if (!f->is_repeated()) return one;
    return {{"type", "array"}, {"items", one}};
  }

  json schemas = json::object();

 private:
  json ValueSchema(const FieldDescriptor* f) {
    switch (f->type()) {
      case FieldDescriptor::TYPE_INT64:
      case FieldDescriptor::TYPE_SINT64:
      case FieldDescriptor::TYPE_SFIXED64:
        return {{"type", "string"}, {"format", "int64"}};
      case FieldDescriptor::TYPE_UINT64:
      case FieldDescriptor::TYPE_FIXED64:
        return {{"type", "string"}, {"format", "uint64"}};
      case FieldDescriptor::TYPE_INT32:
      case FieldDescriptor::TYPE_SINT32:
      case FieldDescriptor::TYPE_SFIXED32:
        return {{"type", "integer"}, {"format", "int32"}};
      case FieldDescriptor::TYPE_UINT32:
      case FieldDescriptor::TYPE_FIXED32:
        return {{"type", "integer"}, {"format", "int64"}, {"minimum", 0}};
      case FieldDescriptor::TYPE_DOUBLE:
        return {{"type", "number"}, {"format", "double"}};
      case FieldDescriptor::TYPE_FLOAT:
        return {{"type", "number"}, {"format", "float"}};
      case FieldDescriptor::TYPE_BOOL:
        return {{"type", "boolean"}};
      case FieldDescriptor::TYPE_STRING:
        return {{"type", "string"}};
      case FieldDescriptor::TYPE_BYTES:
        return {{"type", "string"}, {"format", "byte"}};
      case FieldDescriptor::TYPE_ENUM: {
        json values = json::array();
        for (int i = 0; i < f->enum_type()->value_count(); ++i) values.push_back(f->enum_type()->value(i)->name());
        json e = {{"type", "string"}, {"enum", values}};
        if (const std::string c = EnumComment(f->enum_type()); !c.empty()) e["description"] = c;
        return e;
      }
      case FieldDescriptor::TYPE_MESSAGE:
      case FieldDescriptor::TYPE_GROUP:
        return WellKnown(f->message_type());
    }
    return json::object();
  }

  json WellKnown(const Descriptor* m) {
    const std::string& n = m->full_name();
    if (n == "google.protobuf.Timestamp") return {{"type", "string"}, {"format", "date-time"}};
    if (n == "google.protobuf.Duration") return {{"type", "string"}, {"pattern", "^-?[0-9]+(\\.[0-9]+)?s$"}};
    if (n == "google.protobuf.FieldMask") {
      return {{"type", "string"}, {"description", "comma-separated field paths"}};
    }
    if (n == "google.protobuf.Any") {
      return {{"type", "object"}, {"properties", {{"@type", {{"type", "string"}}}}}, {"additionalProperties", true}};
    }
    return Ref(m);
  }

  void AddMessage(const Descriptor* m) {
    const std::string name = SchemaName(m->full_name());
    if (schemas.contains(name)) return;
    schemas[name] = json::object();  // placeholder: recursive types
    json props = json::object();
    for (int i = 0; i < m->field_count(); ++i) {
      const FieldDescriptor* f = m->field(i);
      json s = FieldSchema(f);
      if (const std::string c = FieldComment(f); !c.empty()) {
        if (s.contains("$ref")) s = {{"allOf", json::array({s})}};
        s["description"] = c;
      }
      props[f->json_name()] = s;
    }
    json schema = {{"type", "object"}, {"properties", props}};
    if (const std::string c = MessageComment(m); !c.empty()) schema["description"] = c;
    schemas[name] = schema;
  }
};

// "/v1/{name=projects/*/jobs/*}:cancel" -> "/v1/projects/{project}/jobs/{job}:cancel", with the
// parameters' names; a variable's `*` after a collection literal takes its singular name.
std::string OpenApiPath(const HttpRoute& r, std::vector<std::pair<std::string, std::string>>* params) {
  std::string out;
  std::string previous;
  for (const HttpRoute::Segment& s : r.segments) {
    out += "/";
    if (s.kind == HttpRoute::Segment::kLiteral) {
      out += s.literal;
      previous = s.literal;
      continue;
    }
    const std::string variable = r.variables[static_cast<size_t>(s.variable)];
    std::string param = variable;
    const bool whole = std::count_if(r.segments.begin(), r.segments.end(),
                                     [&](const HttpRoute::Segment& o) { return o.variable == s.variable; }) == 1;
    // Named after the collection: AIP paths of one shape then share their parameters' names
    // (OpenAPI holds two templates that differ only in those names to be the same path).
    if (absl::EndsWith(previous, "s")) param = previous.substr(0, previous.size() - 1);
    absl::StrReplaceAll({{".", "_"}}, &param);
    out += "{" + param + "}";
    params->emplace_back(param, whole ? variable : absl::StrCat("part of ", variable));
    previous.clear();
  }
  if (!r.verb.empty()) out += ":" + r.verb;
  return out;
}

json ErrorSchema() {
  return {{"type", "object"},
          {"description",
           "AIP-193: code is the HTTP status, status the gRPC code's name, details the "
           "google.rpc.ErrorInfo (reason) and google.rpc.BadRequest (field) of the failure."},
          {"properties",
           {{"error",
             {{"type", "object"},
              {"properties",
               {{"code", {{"type", "integer"}}},
                {"message", {{"type", "string"}}},
                {"status", {{"type", "string"}}},
                {"details", {{"type", "array"}, {"items", {{"type", "object"}}}}}}}}}}}};
}

// The route's parameters: its path variables, then the request's fields a query string sets
// (scalars, maps, field masks; not those the path or the body set).
json Parameters(Builder& b, const HttpRoute& r, const std::vector<std::pair<std::string, std::string>>& path_params) {
  json parameters = json::array();
  for (const auto& [name, what] : path_params) {
    parameters.push_back(
        {{"name", name}, {"in", "path"}, {"required", true}, {"schema", {{"type", "string"}}}, {"description", what}});
  }
  std::set<std::string> taken(r.variables.begin(), r.variables.end());
  for (const std::string& v : r.variables) taken.insert(v.substr(0, v.find('.')));
  const Descriptor* in = r.method->input_type();
  for (int i = 0; i < in->field_count(); ++i) {
    const FieldDescriptor* f = in->field(i);
    if (taken.count(f->name()) || r.body == "*" || f->name() == r.body) continue;
    if (f->type() == FieldDescriptor::TYPE_MESSAGE && !f->is_map() &&
        f->message_type()->full_name() != "google.protobuf.FieldMask") {
      continue;
    }
    json p = {{"name", f->name()}, {"in", "query"}, {"schema", b.FieldSchema(f)}};
    if (f->is_map()) {
      p["style"] = "deepObject";
      p["explode"] = true;
    }
    if (const std::string c = FieldComment(f); !c.empty()) p["description"] = c;
    parameters.push_back(p);
  }
  return parameters;
}

// The route's responses: 200 (JSON; server-sent events for a stream of messages; the content for
// a byte stream: server/http/http_rules.h) and the error.
json Responses(Builder& b, const HttpRoute& r) {
  const google::protobuf::MethodDescriptor* m = r.method;
  json ok;
  if (r.answer == HttpAnswer::kEvents) {
    ok = {{"description", "Server-sent events: `data:` a " + SchemaName(m->output_type()->full_name()) +
                              " as JSON per event, `id:` its sequence"},
          {"content", {{"text/event-stream", {{"schema", {{"type", "string"}}}}}}}};
    b.Ref(m->output_type());
  } else if (r.answer == HttpAnswer::kBytes) {
    ok = {{"description", "The archive's bytes (206 with Content-Range for a Range request)"},
          {"content", {{MediaOf(r.bytes).first, {{"schema", {{"type", "string"}, {"format", "binary"}}}}}}}};
  } else {
    ok = {{"description", "OK"}, {"content", {{"application/json", {{"schema", b.Ref(m->output_type())}}}}}};
  }
  return {{"200", ok},
          {"default",
           {{"description", "An error"},
            {"content", {{"application/json", {{"schema", {{"$ref", "#/components/schemas/Error"}}}}}}}}}};
}

// The route's operation object; `path_params` from OpenApiPath.
json Operation(Builder& b, const HttpRoute& r, const std::vector<std::pair<std::string, std::string>>& path_params) {
  const google::protobuf::MethodDescriptor* m = r.method;
  json op = {{"operationId", m->name()}, {"tags", json::array({m->service()->name()})}};
  if (const std::string c = MethodComment(m); !c.empty()) op["description"] = c;
  if (json parameters = Parameters(b, r, path_params); !parameters.empty()) op["parameters"] = parameters;
  if (r.body_stream != nullptr) {
    op["requestBody"] = {
        {"required", true},
        {"content", {{"application/octet-stream", {{"schema", {{"type", "string"}, {"format", "binary"}}}}}}}};
  } else if (!r.body.empty()) {
    const Descriptor* in = m->input_type();
    const json schema = r.body == "*" ? b.Ref(in) : b.FieldSchema(in->FindFieldByName(r.body));
    op["requestBody"] = {{"required", true}, {"content", {{"application/json", {{"schema", schema}}}}}};
  }
  op["responses"] = Responses(b, r);
  return op;
}

}  // namespace

std::string OpenApiDocument(const HttpRoutes& routes) {
  Builder b;
  json paths = json::object();
  std::map<std::string, std::string> tags;
  for (const HttpRoute& r : routes.routes()) {
    const google::protobuf::MethodDescriptor* m = r.method;
    std::vector<std::pair<std::string, std::string>> path_params;
    const std::string path = OpenApiPath(r, &path_params);
    paths[path][absl::AsciiStrToLower(r.http_method)] = Operation(b, r, path_params);
    tags[m->service()->name()] = CommentOf(CommentsPool()->FindServiceByName(m->service()->full_name()));
  }
  b.schemas["Error"] = ErrorSchema();
  json tag_list = json::array();
  for (const auto& [name, comment] : tags) tag_list.push_back({{"name", name}, {"description", comment}});
  json doc = {
      {"openapi", "3.0.3"},
      {"info",
       {{"title", "oomb API"},
        {"version", "v1"},
        {"description",
         "The oomb job API over HTTP/JSON, transcoded from its gRPC methods by their google.api.http rules "
         "(AIP-127). Authentication: a bearer token, or a TLS client certificate when the daemon requires one."}}},
      {"tags", tag_list},
      {"security", json::array({{{"bearerAuth", json::array()}}})},
      {"paths", paths},
      {"components", json::object()}};
  doc["components"]["securitySchemes"]["bearerAuth"] = {{"type", "http"}, {"scheme", "bearer"}};
  doc["components"]["schemas"] = b.schemas;
  return doc.dump(2) + "\n";
}

}  // namespace oomb::server
