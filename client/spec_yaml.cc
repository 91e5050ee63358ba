#include "client/spec_yaml.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/json_util.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include <fmt/format.h>

namespace oomb::client {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using json = nlohmann::json;

struct Error {
  std::string message;
};

std::string Where(const std::string& file, const YAML::Node& node) {
  const int line = node.Mark().line;
  return line >= 0 ? fmt::format("{}:{}: ", file, line + 1) : fmt::format("{}: ", file);
}

std::string Known(const Descriptor* d) {
  std::string out;
  for (int i = 0; i < d->field_count(); ++i) out += (i ? ", " : "") + d->field(i)->name();
  return out;
}

// A plain scalar as JSON for a field of `type`; quoted scalars are strings.
json Scalar(const YAML::Node& node, const FieldDescriptor* f, const std::string& where, const std::string& path) {
  const std::string& s = node.Scalar();
  const bool quoted = node.Tag() == "!";
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      return s;
    case FieldDescriptor::CPPTYPE_BOOL:
      if (!quoted && (s == "true" || s == "True" || s == "TRUE")) return true;
      if (!quoted && (s == "false" || s == "False" || s == "FALSE")) return false;
      throw Error{fmt::format("{}{}: expected true or false, got '{}'", where, path, s)};
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64:
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64: {
      size_t used = 0;
      long long v = 0;
      try {
        v = std::stoll(s, &used);
      } catch (...) {
        used = 0;
      }
      if (quoted || used != s.size() || s.empty()) {
        throw Error{fmt::format("{}{}: expected an integer, got '{}'", where, path, s)};
      }
      return v;
    }
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT: {
      size_t used = 0;
      double v = 0;
      try {
        v = std::stod(s, &used);
      } catch (...) {
        used = 0;
      }
      if (quoted || used != s.size() || s.empty()) {
        throw Error{fmt::format("{}{}: expected a number, got '{}'", where, path, s)};
      }
      return v;
    }
    default:
      throw Error{fmt::format("{}{}: unsupported field type", where, path)};
  }
}

json Convert(const YAML::Node& node, const Descriptor* d, const std::string& file, const std::string& prefix) {
  json out = json::object();
  if (!node.IsMap())
    throw Error{fmt::format("{}{}: expected a mapping", Where(file, node), prefix.empty() ? "(top level)" : prefix)};
  for (const auto& kv : node) {
    const std::string key = kv.first.Scalar();
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    const std::string where = Where(file, kv.first);
    const FieldDescriptor* f = d->FindFieldByName(key);
    if (f == nullptr) throw Error{fmt::format("{}{}: unknown field (known: {})", where, path, Known(d))};
    const YAML::Node& v = kv.second;
    if (v.IsNull()) continue;  // the server's default
    if (f->is_map()) {
      if (!v.IsMap()) throw Error{fmt::format("{}{}: expected a mapping", where, path)};
      json m = json::object();
      for (const auto& e : v) m[e.first.Scalar()] = e.second.IsScalar() ? e.second.Scalar() : "";
      out[key] = m;
    } else if (f->is_repeated()) {
      if (!v.IsSequence()) throw Error{fmt::format("{}{}: expected a list", where, path)};
      json a = json::array();
      for (const auto& e : v) {
        if (!e.IsScalar()) throw Error{fmt::format("{}{}: expected a list of scalars", where, path)};
        a.push_back(Scalar(e, f, where, path));
      }
      out[key] = a;
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      out[key] = Convert(v, f->message_type(), file, path);
    } else {
      if (!v.IsScalar()) throw Error{fmt::format("{}{}: expected a single value", where, path)};
      out[key] = Scalar(v, f, where, path);
    }
  }
  return out;
}

// Sets root[a][b][c] = YAML(value) for "a.b.c=value".
void ApplyOverride(YAML::Node root, const std::string& kv) {
  const size_t eq = kv.find('=');
  if (eq == std::string::npos || eq == 0) throw Error{fmt::format("--set {}: expected key=value", kv)};
  std::vector<std::string> parts;
  std::stringstream ss(kv.substr(0, eq));
  for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
  YAML::Node value;
  try {
    value = YAML::Load(kv.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    throw Error{fmt::format("--set {}: cannot read the value: {}", kv, e.msg)};
  }
  std::vector<YAML::Node> chain{root};
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    YAML::Node next = chain.back()[parts[i]];
    if (!next.IsMap()) next = YAML::Node(YAML::NodeType::Map);
    chain.back()[parts[i]] = next;
    chain.push_back(next);
  }
  chain.back()[parts.back()] = value;
}

// The spec's filesystem paths. The daemon reads them as absolute paths (its working directory
// is not the user's), so relative ones are made absolute here.
constexpr const char* kPathFields[][2] = {
    {"model", "path"}, {"data", "train"}, {"data", "validation"}, {"checkpoint", "dir"}};

std::string Absolute(const std::filesystem::path& base, const std::string& p) {
  if (p.empty() || std::filesystem::path(p).is_absolute()) return p;
  return (std::filesystem::absolute(base) / p).lexically_normal().string();
}

// Relative paths in the file are relative to the file's directory.
void ResolvePaths(YAML::Node root, const std::filesystem::path& base) {
  for (const auto& [section, key] : kPathFields) {
    if (!root.IsMap() || !root[section] || !root[section].IsMap()) continue;
    YAML::Node v = root[section][key];
    if (v && v.IsScalar()) v = Absolute(base, v.as<std::string>());
  }
}

// Relative paths given with --set are relative to the current directory.
std::string ResolveOverride(const std::string& kv) {
  const size_t eq = kv.find('=');
  if (eq == std::string::npos) return kv;
  const std::string key = kv.substr(0, eq);
  for (const auto& [section, field] : kPathFields) {
    if (key == std::string(section) + "." + field) return key + "=" + Absolute(".", kv.substr(eq + 1));
  }
  return kv;
}

}  // namespace

bool LoadJobSpec(const std::string& path, const std::vector<std::string>& overrides, v1::JobSpec* spec,
                 std::string* error) {
  try {
    std::ifstream in(path);
    if (!in) throw Error{fmt::format("{}: cannot open: {}", path, std::strerror(errno))};
    std::stringstream text;
    text << in.rdbuf();
    YAML::Node root;
    try {
      root = YAML::Load(text.str());
    } catch (const YAML::Exception& e) {
      throw Error{fmt::format("{}:{}: YAML syntax error: {}", path, e.mark.line + 1, e.msg)};
    }
    if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
    ResolvePaths(root, std::filesystem::path(path).parent_path());
    for (const std::string& o : overrides) ApplyOverride(root, ResolveOverride(o));
    const json j = Convert(root, v1::JobSpec::descriptor(), path, "");
    google::protobuf::util::JsonParseOptions opts;
    opts.ignore_unknown_fields = false;
    const auto st = google::protobuf::util::JsonStringToMessage(j.dump(), spec, opts);
    if (!st.ok()) throw Error{fmt::format("{}: {}", path, st.message().as_string())};
    return true;
  } catch (const Error& e) {
    *error = e.message;
    return false;
  }
}

}  // namespace oomb::client
