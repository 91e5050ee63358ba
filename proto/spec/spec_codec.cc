#include "proto/spec/spec_codec.h"

#include <google/protobuf/descriptor.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <set>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "oomb/v1/rules.pb.h"
#include "proto/spec/resource_names.h"

// Returns the status of `expr` when it is not OK (the client cannot use worker/'s macros).
#define OOMB_SPEC_TRY(expr)                                \
  do {                                                     \
    ::absl::Status oomb_spec_status_ = (expr);             \
    if (!oomb_spec_status_.ok()) return oomb_spec_status_; \
  } while (false)

namespace oomb::spec {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

constexpr uint32_t kDefaultMaxLength = 1024;
constexpr uint32_t kDefaultMaxItems = 64;

const v1::FieldRules& RulesOf(const FieldDescriptor* f) { return f->options().GetExtension(v1::rules); }

// What reading needs besides the node: where the document comes from and the lines seen.
struct Reader {
  const Source& source;
  Lines* lines;
  absl::Status Error(const std::string& path, absl::string_view what) const {
    return FieldError(source, lines, path, what);
  }
};

std::string Excerpt(absl::string_view s) {
  std::string out;
  for (unsigned char c : s.substr(0, 60))
    out += c < 0x20 || c >= 0x7f ? fmt::format("\\x{:02x}", c) : std::string(1, c);
  return s.size() > 60 ? absl::StrCat(out, "...") : out;
}

std::string Describe(const YAML::Node& node) {
  if (node.IsScalar()) {
    return node.Tag() == "!" ? absl::StrCat("the string \"", Excerpt(node.Scalar()), "\"")
                             : absl::StrCat("'", Excerpt(node.Scalar()), "'");
  }
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return "nothing";
}

bool Plain(const YAML::Node& node) { return node.IsScalar() && node.Tag() != "!"; }

// Whether `s` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool ValidUtf8(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7f >> n);
    for (size_t k = 1; k < n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3f);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n;
  }
  return true;
}

// UTF-8 without control characters: what a spec's text becomes (paths, labels, log lines).
std::string TextProblem(absl::string_view s) {
  if (!ValidUtf8(s)) return "is not valid UTF-8";
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) return absl::StrCat("contains a control character (at byte ", i, ")");
  }
  return "";
}

std::string KnownFields(const Descriptor* d) {
  std::vector<std::string> names;
  for (int i = 0; i < d->field_count(); ++i) names.push_back(d->field(i)->name());
  return absl::StrJoin(names, ", ");
}

std::string KnownValues(const EnumDescriptor* e) {
  std::vector<std::string> names;
  for (int i = 0; i < e->value_count(); ++i) {
    if (e->value(i)->number() != 0) names.push_back(e->value(i)->name());
  }
  return absl::StrJoin(names, ", ");
}

// "strings", "integers", ...: what a list of `f` holds, for messages.
const char* TypeWord(const FieldDescriptor* f) {
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      return "strings";
    case FieldDescriptor::CPPTYPE_BOOL:
      return "booleans";
    case FieldDescriptor::CPPTYPE_ENUM:
      return "names";
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return "mappings";
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT:
      return "numbers";
    default:
      return "integers";
  }
}

// ---------------------------------------------------------------------------------------------
// Scalars

// An integer, double, bool, enum or string from a YAML scalar, as one value of field `f`.
struct Scalar {
  int64_t i = 0;
  uint64_t u = 0;
  double d = 0;
  bool b = false;
  const EnumValueDescriptor* e = nullptr;
  std::string s;
};

absl::Status ReadNumber(const YAML::Node& node, const FieldDescriptor* f, const std::string& path, const Reader& r,
                        Scalar* out) {
  const std::string& text = node.Scalar();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64: {
      const int64_t lo = f->cpp_type() == FieldDescriptor::CPPTYPE_INT32 ? std::numeric_limits<int32_t>::min()
                                                                         : std::numeric_limits<int64_t>::min();
      const int64_t hi = f->cpp_type() == FieldDescriptor::CPPTYPE_INT32 ? std::numeric_limits<int32_t>::max()
                                                                         : std::numeric_limits<int64_t>::max();
      const std::string& zero_word = RulesOf(f).zero_word();
      if (!zero_word.empty() && Plain(node) && text == zero_word) {
        out->i = 0;
        return absl::OkStatus();
      }
      if (!Plain(node) || !absl::SimpleAtoi(text, &out->i)) {
        return r.Error(path, absl::StrCat("expected an integer", zero_word.empty() ? "" : " or " + zero_word, ", got ",
                                          Describe(node)));
      }
      if (out->i < lo || out->i > hi) {
        return r.Error(path, absl::StrCat("must fit in ", f->cpp_type() == FieldDescriptor::CPPTYPE_INT32 ? 32 : 64,
                                          " bits, got ", text));
      }
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64:
      if (!Plain(node) || !absl::SimpleAtoi(text, &out->u)) {
        return r.Error(path, absl::StrCat("expected a non-negative integer, got ", Describe(node)));
      }
      return absl::OkStatus();
    default:
      if (!Plain(node) || !absl::SimpleAtod(text, &out->d)) {
        return r.Error(path, absl::StrCat("expected a finite number, got ", Describe(node)));
      }
      if (!std::isfinite(out->d)) return r.Error(path, absl::StrCat("must be a finite number, got ", text));
      return absl::OkStatus();
  }
}

absl::Status ReadScalar(const YAML::Node& node, const FieldDescriptor* f, const std::string& path, const Reader& r,
                        Scalar* out) {
  if (!node.IsScalar()) return r.Error(path, absl::StrCat("expected a single value, got ", Describe(node)));
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING: {
      out->s = node.Scalar();
      const v1::FieldRules& rules = RulesOf(f);
      if (rules.path() && !r.source.base_dir.empty() && !out->s.empty() && out->s[0] != '/' &&
          !names::IsResourceName(rules.resource(), out->s)) {
        out->s = (std::filesystem::path(r.source.base_dir) / out->s).lexically_normal().string();
      }
      // After joining: the base directory's name is text of the spec too.
      if (std::string problem = TextProblem(out->s); !problem.empty()) return r.Error(path, problem);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_BOOL: {
      const std::string word = absl::AsciiStrToLower(node.Scalar());
      if (!Plain(node) || (word != "true" && word != "false")) {
        return r.Error(path, absl::StrCat("expected true or false, got ", Describe(node)));
      }
      out->b = word == "true";
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_ENUM:
      out->e = f->enum_type()->FindValueByName(node.Scalar());
      if (out->e == nullptr || out->e->number() == 0) {
        return r.Error(path, absl::StrCat("must be one of ", KnownValues(f->enum_type()), "; got ", Describe(node)));
      }
      return absl::OkStatus();
    default:
      return ReadNumber(node, f, path, r, out);
  }
}

void SetScalar(Message* msg, const FieldDescriptor* f, const Scalar& v) {
  const Reflection* refl = msg->GetReflection();
  const bool rep = f->is_repeated();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      rep ? refl->AddInt32(msg, f, static_cast<int32_t>(v.i)) : refl->SetInt32(msg, f, static_cast<int32_t>(v.i));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      rep ? refl->AddInt64(msg, f, v.i) : refl->SetInt64(msg, f, v.i);
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      rep ? refl->AddUInt32(msg, f, static_cast<uint32_t>(v.u)) : refl->SetUInt32(msg, f, static_cast<uint32_t>(v.u));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      rep ? refl->AddUInt64(msg, f, v.u) : refl->SetUInt64(msg, f, v.u);
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      rep ? refl->AddDouble(msg, f, v.d) : refl->SetDouble(msg, f, v.d);
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      rep ? refl->AddFloat(msg, f, static_cast<float>(v.d)) : refl->SetFloat(msg, f, static_cast<float>(v.d));
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      rep ? refl->AddBool(msg, f, v.b) : refl->SetBool(msg, f, v.b);
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      rep ? refl->AddEnum(msg, f, v.e) : refl->SetEnum(msg, f, v.e);
      break;
    case FieldDescriptor::CPPTYPE_STRING:
      rep ? refl->AddString(msg, f, v.s) : refl->SetString(msg, f, v.s);
      break;
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;
  }
}

// ---------------------------------------------------------------------------------------------
// Reading YAML into a message

absl::Status ReadMessage(const YAML::Node& node, const std::string& prefix, Message* msg, const Reader& r);

absl::Status ReadMap(const YAML::Node& node, const FieldDescriptor* f, const std::string& path, Message* msg,
                     const Reader& r) {
  if (!node.IsMap()) return r.Error(path, absl::StrCat("expected a mapping, got ", Describe(node)));
  const FieldDescriptor* key_f = f->message_type()->map_key();
  const FieldDescriptor* value_f = f->message_type()->map_value();
  std::set<std::string> seen;
  for (const auto& kv : node) {
    Scalar key, value;
    OOMB_SPEC_TRY(ReadScalar(kv.first, key_f, path, r, &key));
    if (!seen.insert(key.s).second) return r.Error(path, absl::StrCat("duplicate key '", Excerpt(key.s), "'"));
    const std::string entry = absl::StrCat(path, ".", key.s);
    OOMB_SPEC_TRY(ReadScalar(kv.second, value_f, entry, r, &value));
    Message* e = msg->GetReflection()->AddMessage(msg, f);
    SetScalar(e, key_f, key);
    SetScalar(e, value_f, value);
  }
  return absl::OkStatus();
}

// Sets (or, for null, removes) the entry `key` of map field `f`.
absl::Status SetMapEntry(Message* msg, const FieldDescriptor* f, const std::string& key, const YAML::Node& value,
                         const std::string& path, const Reader& r) {
  const Reflection* refl = msg->GetReflection();
  const FieldDescriptor* key_f = f->message_type()->map_key();
  const FieldDescriptor* value_f = f->message_type()->map_value();
  if (key.empty()) return r.Error(path, "empty key");
  for (int i = 0; i < refl->FieldSize(*msg, f); ++i) {
    const Message& e = refl->GetRepeatedMessage(*msg, f, i);
    if (e.GetReflection()->GetString(e, key_f) != key) continue;
    refl->SwapElements(msg, f, i, refl->FieldSize(*msg, f) - 1);
    refl->RemoveLast(msg, f);
    break;
  }
  if (value.IsNull()) return absl::OkStatus();
  Scalar v;
  OOMB_SPEC_TRY(ReadScalar(value, value_f, absl::StrCat(path, ".", key), r, &v));
  Message* e = refl->AddMessage(msg, f);
  e->GetReflection()->SetString(e, key_f, key);
  SetScalar(e, value_f, v);
  return absl::OkStatus();
}

absl::Status ReadField(const YAML::Node& node, const FieldDescriptor* f, const std::string& path, Message* msg,
                       const Reader& r) {
  const Reflection* refl = msg->GetReflection();
  refl->ClearField(msg, f);
  if (node.IsNull()) return absl::OkStatus();  // unset: the default applies
  if (f->is_map()) return ReadMap(node, f, path, msg, r);
  if (f->is_repeated()) {
    if (!node.IsSequence()) {
      return r.Error(path, absl::StrCat("expected a list of ", TypeWord(f), ", got ", Describe(node)));
    }
    int index = 0;
    for (const YAML::Node& item : node) {
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {  // a list of sections: path[i].key
        const std::string item_path = absl::StrCat(path, "[", index++, "]");
        if (r.lines != nullptr) (*r.lines)[item_path] = item.Mark().line + 1;
        if (!item.IsMap()) return r.Error(item_path, absl::StrCat("expected a mapping, got ", Describe(item)));
        OOMB_SPEC_TRY(ReadMessage(item, item_path + ".", refl->AddMessage(msg, f), r));
        continue;
      }
      Scalar v;
      OOMB_SPEC_TRY(ReadScalar(item, f, path, r, &v));
      SetScalar(msg, f, v);
    }
    return absl::OkStatus();
  }
  if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    if (!node.IsMap()) return r.Error(path, absl::StrCat("expected a mapping, got ", Describe(node)));
    return ReadMessage(node, path + ".", refl->MutableMessage(msg, f), r);
  }
  Scalar v;
  OOMB_SPEC_TRY(ReadScalar(node, f, path, r, &v));
  SetScalar(msg, f, v);
  return absl::OkStatus();
}

absl::Status ReadMessage(const YAML::Node& node, const std::string& prefix, Message* msg, const Reader& r) {
  const Descriptor* d = msg->GetDescriptor();
  const std::string section = prefix.empty() ? "(top level)" : prefix.substr(0, prefix.size() - 1);
  std::set<std::string> seen;
  std::map<const google::protobuf::OneofDescriptor*, std::string> oneofs;
  for (const auto& kv : node) {
    if (!kv.first.IsScalar()) return r.Error(section, "keys must be strings");
    const std::string path = prefix + kv.first.Scalar();
    if (r.lines != nullptr) (*r.lines)[path] = kv.first.Mark().line + 1;
    if (!seen.insert(path).second) return r.Error(path, "duplicate key");
    const FieldDescriptor* f = d->FindFieldByName(kv.first.Scalar());
    if (f == nullptr) {
      return r.Error(path, absl::StrCat("unknown key (known keys", prefix.empty() ? "" : " under " + section, ": ",
                                        KnownFields(d), ")"));
    }
    if (const auto* oneof = f->real_containing_oneof(); oneof != nullptr && !kv.second.IsNull()) {
      auto [it, first] = oneofs.emplace(oneof, f->name());
      if (!first) {
        return r.Error(path, absl::StrCat("cannot be combined with ", prefix, it->second, "; set one of them"));
      }
    }
    OOMB_SPEC_TRY(ReadField(kv.second, f, path, msg, r));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Rules

bool IsSet(const Message& msg, const FieldDescriptor* f) {
  const Reflection* refl = msg.GetReflection();
  if (f->is_repeated()) return refl->FieldSize(msg, f) > 0;
  if (f->has_presence()) return refl->HasField(msg, f);
  if (f->cpp_type() == FieldDescriptor::CPPTYPE_ENUM) return refl->GetEnumValue(msg, f) != 0;
  if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING) return !refl->GetString(msg, f).empty();
  return refl->HasField(msg, f);
}

std::string RangeText(const v1::FieldRules& rules) {
  const auto num = [](double v) { return fmt::format("{}", v); };
  if (rules.has_min() && rules.has_max()) {
    return absl::StrCat("must be in ", rules.min_exclusive() ? "(" : "[", num(rules.min()), ", ", num(rules.max()),
                        rules.max_exclusive() ? ")" : "]");
  }
  if (rules.has_min()) return absl::StrCat("must be ", rules.min_exclusive() ? "> " : ">= ", num(rules.min()));
  return absl::StrCat("must be ", rules.max_exclusive() ? "< " : "<= ", num(rules.max()));
}

absl::Status CheckNumber(double v, const v1::FieldRules& rules, const std::string& path, const Reader& r) {
  const bool low = rules.has_min() && (rules.min_exclusive() ? !(v > rules.min()) : !(v >= rules.min()));
  const bool high = rules.has_max() && (rules.max_exclusive() ? !(v < rules.max()) : !(v <= rules.max()));
  if (!std::isfinite(v)) return r.Error(path, absl::StrCat("must be a finite number, got ", fmt::format("{}", v)));
  if (low || high) return r.Error(path, absl::StrCat(RangeText(rules), ", got ", fmt::format("{}", v)));
  return absl::OkStatus();
}

absl::Status CheckText(const std::string& s, const v1::FieldRules& rules, const std::string& path, const Reader& r) {
  if (std::string problem = TextProblem(s); !problem.empty()) return r.Error(path, problem);
  const uint32_t max = rules.max_length() > 0 ? rules.max_length() : kDefaultMaxLength;
  if (s.size() > max) return r.Error(path, absl::StrCat("is longer than ", max, " bytes (", s.size(), ")"));
  if (!rules.pattern().empty() && !std::regex_match(s, std::regex(rules.pattern()))) {
    return r.Error(path, absl::StrCat("must be ", rules.pattern_help(), "; got '", Excerpt(s), "'"));
  }
  return absl::OkStatus();
}

// The value of the set, non-repeated scalar `f`, as a double (numbers) for range checks.
double NumberOf(const Message& msg, const FieldDescriptor* f, int index) {
  const Reflection* refl = msg.GetReflection();
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return rep ? refl->GetRepeatedInt32(msg, f, index) : refl->GetInt32(msg, f);
    case FieldDescriptor::CPPTYPE_INT64:
      return static_cast<double>(rep ? refl->GetRepeatedInt64(msg, f, index) : refl->GetInt64(msg, f));
    case FieldDescriptor::CPPTYPE_UINT32:
      return rep ? refl->GetRepeatedUInt32(msg, f, index) : refl->GetUInt32(msg, f);
    case FieldDescriptor::CPPTYPE_UINT64:
      return static_cast<double>(rep ? refl->GetRepeatedUInt64(msg, f, index) : refl->GetUInt64(msg, f));
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return rep ? refl->GetRepeatedDouble(msg, f, index) : refl->GetDouble(msg, f);
    case FieldDescriptor::CPPTYPE_FLOAT:
      return rep ? refl->GetRepeatedFloat(msg, f, index) : refl->GetFloat(msg, f);
    default:
      return 0;
  }
}

absl::Status CheckMessage(const Message& msg, const std::string& prefix, bool required, const Reader& r);

// One value (index >= 0: of a repeated field) of `f` against its rules.
absl::Status CheckValue(const Message& msg, const FieldDescriptor* f, int index, const std::string& path, bool required,
                        const Reader& r) {
  const Reflection* refl = msg.GetReflection();
  const v1::FieldRules& rules = RulesOf(f);
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_MESSAGE:
      // A list's item is named by its index: notifications.webhooks[1].url.
      return CheckMessage(index >= 0 ? refl->GetRepeatedMessage(msg, f, index) : refl->GetMessage(msg, f),
                          index >= 0 ? absl::StrCat(path, "[", index, "].") : path + ".", required, r);
    case FieldDescriptor::CPPTYPE_STRING:
      return CheckText(index >= 0 ? refl->GetRepeatedString(msg, f, index) : refl->GetString(msg, f), rules, path, r);
    case FieldDescriptor::CPPTYPE_BOOL:
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_ENUM: {  // proto3 keeps unknown numbers: a client may send one
      const int v = index >= 0 ? refl->GetRepeatedEnumValue(msg, f, index) : refl->GetEnumValue(msg, f);
      if (f->enum_type()->FindValueByNumber(v) != nullptr) return absl::OkStatus();
      return r.Error(path, absl::StrCat("must be one of ", KnownValues(f->enum_type()), "; got the number ", v));
    }
    default: {
      const double v = NumberOf(msg, f, index);
      if (rules.zero_word().empty()) return CheckNumber(v, rules, path, r);
      if (v == 0 || CheckNumber(v, rules, path, r).ok()) return absl::OkStatus();  // 0: the engine chooses
      return r.Error(path, absl::StrCat(RangeText(rules), " or ", rules.zero_word(), ", got ", fmt::format("{}", v)));
    }
  }
}

absl::Status CheckMapEntries(const Message& msg, const FieldDescriptor* f, const std::string& path, const Reader& r) {
  const v1::FieldRules& rules = RulesOf(f);
  const Reflection* refl = msg.GetReflection();
  for (int i = 0; i < refl->FieldSize(msg, f); ++i) {
    const Message& e = refl->GetRepeatedMessage(msg, f, i);
    const std::string key = e.GetReflection()->GetString(e, f->message_type()->map_key());
    if (key.empty()) return r.Error(path, "keys must not be empty");
    OOMB_SPEC_TRY(CheckText(key, rules, path, r));
    OOMB_SPEC_TRY(CheckText(e.GetReflection()->GetString(e, f->message_type()->map_value()), rules,
                            absl::StrCat(path, ".", key), r));
  }
  return absl::OkStatus();
}

absl::Status CheckField(const Message& msg, const FieldDescriptor* f, const std::string& path, bool required,
                        const Reader& r) {
  const Reflection* refl = msg.GetReflection();
  if (!IsSet(msg, f)) {
    if (required && RulesOf(f).required()) return r.Error(path, "is required");
    return absl::OkStatus();
  }
  if (!f->is_repeated()) return CheckValue(msg, f, -1, path, required, r);
  const uint32_t max = RulesOf(f).max_items() > 0 ? RulesOf(f).max_items() : kDefaultMaxItems;
  const int n = refl->FieldSize(msg, f);
  if (static_cast<uint32_t>(n) > max) return r.Error(path, absl::StrCat("has more than ", max, " entries (", n, ")"));
  if (f->is_map()) return CheckMapEntries(msg, f, path, r);
  for (int i = 0; i < n; ++i) OOMB_SPEC_TRY(CheckValue(msg, f, i, path, required, r));
  return absl::OkStatus();
}

absl::Status CheckMessage(const Message& msg, const std::string& prefix, bool required, const Reader& r) {
  const Descriptor* d = msg.GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    OOMB_SPEC_TRY(CheckField(msg, d->field(i), prefix + d->field(i)->name(), required, r));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Defaults

bool HasDefaultsBeneath(const Descriptor* d) {
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (!RulesOf(f).default_().empty()) return true;
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !f->is_repeated() && HasDefaultsBeneath(f->message_type()))
      return true;
  }
  return false;
}

// Whether `f` is a member of a oneof another member of which (or itself) is set.
bool OneofTaken(const Message& msg, const FieldDescriptor* f) {
  const auto* oneof = f->real_containing_oneof();
  return oneof != nullptr && msg.GetReflection()->HasOneof(msg, oneof);
}

void FillMessage(Message* msg) {
  const Descriptor* d = msg->GetDescriptor();
  const Reflection* refl = msg->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !f->is_repeated()) {
      if (refl->HasField(*msg, f) || HasDefaultsBeneath(f->message_type())) FillMessage(refl->MutableMessage(msg, f));
      continue;
    }
    const std::string& text = RulesOf(f).default_();
    if (text.empty() || IsSet(*msg, f) || OneofTaken(*msg, f)) continue;
    const Source none;
    const absl::Status s = ReadField(YAML::Load(text), f, f->full_name(), msg, Reader{none, nullptr});
    // A default that does not read is a mistake in the .proto; CheckRules' tests catch it.
    if (!s.ok()) refl->ClearField(msg, f);
  }
}

// ---------------------------------------------------------------------------------------------
// Writing

void EmitString(YAML::Emitter& out, const std::string& s) {
  const std::string lower = absl::AsciiStrToLower(s);
  if (s.empty() || lower == "null" || lower == "~") {
    out << YAML::DoubleQuoted << s;
  } else {
    out << s;
  }
}

void EmitScalar(YAML::Emitter& out, const Message& msg, const FieldDescriptor* f, int index) {
  const Reflection* refl = msg.GetReflection();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      EmitString(out, index >= 0 ? refl->GetRepeatedString(msg, f, index) : refl->GetString(msg, f));
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      out << ((index >= 0 ? refl->GetRepeatedBool(msg, f, index) : refl->GetBool(msg, f)) ? "true" : "false");
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      out << (index >= 0 ? refl->GetRepeatedEnum(msg, f, index) : refl->GetEnum(msg, f))->name();
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT:
      out << fmt::format("{}", NumberOf(msg, f, index));  // the shortest text that reads back the same
      break;
    case FieldDescriptor::CPPTYPE_INT64: {
      const int64_t v = index >= 0 ? refl->GetRepeatedInt64(msg, f, index) : refl->GetInt64(msg, f);
      if (v == 0 && !RulesOf(f).zero_word().empty()) {
        out << RulesOf(f).zero_word();
      } else {
        out << v;
      }
      break;
    }
    case FieldDescriptor::CPPTYPE_UINT64:
      out << (index >= 0 ? refl->GetRepeatedUInt64(msg, f, index) : refl->GetUInt64(msg, f));
      break;
    default:
      out << static_cast<int64_t>(NumberOf(msg, f, index));
      break;
  }
}

void EmitMessage(YAML::Emitter& out, const Message& msg);

void EmitField(YAML::Emitter& out, const Message& msg, const FieldDescriptor* f) {
  const Reflection* refl = msg.GetReflection();
  if (f->is_map()) {
    out << YAML::BeginMap;
    for (int i = 0; i < refl->FieldSize(msg, f); ++i) {
      const Message& e = refl->GetRepeatedMessage(msg, f, i);
      out << YAML::Key;
      EmitScalar(out, e, f->message_type()->map_key(), -1);
      out << YAML::Value;
      EmitScalar(out, e, f->message_type()->map_value(), -1);
    }
    out << YAML::EndMap;
  } else if (f->is_repeated() && f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    out << YAML::BeginSeq;
    for (int i = 0; i < refl->FieldSize(msg, f); ++i) EmitMessage(out, refl->GetRepeatedMessage(msg, f, i));
    out << YAML::EndSeq;
  } else if (f->is_repeated()) {
    out << YAML::Flow << YAML::BeginSeq;
    for (int i = 0; i < refl->FieldSize(msg, f); ++i) EmitScalar(out, msg, f, i);
    out << YAML::EndSeq;
  } else if (!IsSet(msg, f)) {
    out << YAML::Null;
  } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    EmitMessage(out, refl->GetMessage(msg, f));
  } else {
    EmitScalar(out, msg, f, -1);
  }
}

void EmitMessage(YAML::Emitter& out, const Message& msg) {
  const Descriptor* d = msg.GetDescriptor();
  out << YAML::BeginMap;
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    // Of a oneof, only the member that is set (or the first, as null, when none is).
    if (f->real_containing_oneof() != nullptr && msg.GetReflection()->HasOneof(msg, f->real_containing_oneof()) &&
        !IsSet(msg, f)) {
      continue;
    }
    out << YAML::Key << f->name() << YAML::Value;
    EmitField(out, msg, f);
  }
  out << YAML::EndMap;
}

// Counts the documents of a YAML text, up to `limit` (yaml-cpp's LoadAll loops forever on
// some malformed inputs, so the count is bounded).
class NullHandler : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

int CountDocuments(const std::string& yaml, int limit) {
  std::istringstream in(yaml);
  YAML::Parser parser(in);
  NullHandler handler;
  int docs = 0;
  while (docs < limit && parser.HandleNextDocument(handler)) ++docs;
  return docs;
}

// Parses `yaml` into one node: INVALID_ARGUMENT for syntax errors and for more than one
// document.
absl::StatusOr<YAML::Node> LoadOne(absl::string_view yaml, const std::string& name) {
  const std::string text(yaml);
  const std::string where = name.empty() ? "" : name + ":";
  YAML::Node node;
  try {
    node = YAML::Load(text);
    if (CountDocuments(text, 2) > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " a second YAML document: a job spec is one document (remove the '---' and what follows)"));
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(where, e.mark.line + 1, ": YAML syntax error: ", e.msg));
  }
  return node;
}

}  // namespace

absl::Status ParseYaml(absl::string_view yaml, const Source& source, Message* msg, Lines* lines) {
  msg->Clear();
  Lines local;
  Lines* seen = lines != nullptr ? lines : &local;
  absl::StatusOr<YAML::Node> root = LoadOne(yaml, source.name);
  if (!root.ok()) return root.status();
  if (root->IsNull()) *root = YAML::Node(YAML::NodeType::Map);
  if (!root->IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(source.name.empty() ? "" : source.name + ": ",
                                                   "expected a mapping at the top level, got ", Describe(*root)));
  }
  const Reader r{source, seen};
  try {
    OOMB_SPEC_TRY(ReadMessage(*root, "", msg, r));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source.name, ":", e.mark.line + 1, ": ", e.msg));
  }
  return CheckRules(*msg, /*check_required=*/false, source, seen);
}

absl::Status ApplyOverride(absl::string_view key_eq_value, const std::string& base_dir, Message* msg) {
  const Source source{absl::StrCat("--set ", key_eq_value), base_dir};
  const size_t eq = key_eq_value.find('=');
  if (eq == absl::string_view::npos || eq == 0) {
    return absl::InvalidArgumentError(absl::StrCat(source.name, ": expected key=value, e.g. training.max_steps=5"));
  }
  const std::string key(absl::StripAsciiWhitespace(key_eq_value.substr(0, eq)));
  absl::StatusOr<YAML::Node> value = LoadOne(key_eq_value.substr(eq + 1), source.name);
  if (!value.ok()) return value.status();
  std::unique_ptr<Message> copy(msg->New());
  copy->CopyFrom(*msg);
  const Reader r{source, nullptr};
  Message* at = copy.get();
  std::string path;
  for (absl::string_view rest = key;;) {
    const size_t dot = rest.find('.');
    const std::string name(rest.substr(0, dot));
    path = path.empty() ? name : absl::StrCat(path, ".", name);
    const FieldDescriptor* f = at->GetDescriptor()->FindFieldByName(name);
    if (f == nullptr) {
      const size_t last = path.rfind('.');
      return r.Error(path, absl::StrCat("unknown key (known keys",
                                        last == std::string::npos ? "" : " under " + path.substr(0, last), ": ",
                                        KnownFields(at->GetDescriptor()), ")"));
    }
    if (f->is_map() && dot != absl::string_view::npos) {  // labels.team=nlp: one entry
      OOMB_SPEC_TRY(SetMapEntry(at, f, std::string(rest.substr(dot + 1)), *value, path, r));
      break;
    }
    if (dot == absl::string_view::npos) {
      try {
        OOMB_SPEC_TRY(ReadField(*value, f, path, at, r));
      } catch (const YAML::Exception& e) {
        return r.Error(path, e.msg);
      }
      break;
    }
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE || f->is_repeated()) {
      return r.Error(path, "is not a section; it has no keys");
    }
    at = at->GetReflection()->MutableMessage(at, f);
    rest = rest.substr(dot + 1);
  }
  OOMB_SPEC_TRY(CheckRules(*copy, /*check_required=*/false, source));
  msg->CopyFrom(*copy);
  return absl::OkStatus();
}

void FillDefaults(Message* msg) { FillMessage(msg); }

absl::Status FieldError(const Source& source, const Lines* lines, const std::string& path, absl::string_view what) {
  std::string where;
  if (!source.name.empty()) {
    int line = 0;
    for (std::string p = path; lines != nullptr && line == 0 && !p.empty();) {
      if (auto it = lines->find(p); it != lines->end()) line = it->second;
      const size_t dot = p.rfind('.');
      p = dot == std::string::npos ? "" : p.substr(0, dot);
    }
    where = line > 0 ? absl::StrCat(source.name, ":", line, ": ") : absl::StrCat(source.name, ": ");
  }
  return absl::InvalidArgumentError(absl::StrCat(where, path, ": ", what));
}

absl::Status LoadYamlFile(const std::string& path, const std::vector<std::string>& overrides, Message* msg,
                          Lines* lines) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::NotFoundError(absl::StrCat(path, ": cannot read: ", std::strerror(errno)));
  std::error_code ec;
  const std::filesystem::path file = std::filesystem::absolute(path, ec);
  const Source source{path, file.parent_path().string()};
  Lines local;
  Lines* seen = lines != nullptr ? lines : &local;
  OOMB_SPEC_TRY(ParseYaml(text.str(), source, msg, seen));
  const std::string cwd = std::filesystem::current_path(ec).string();
  for (const std::string& o : overrides) OOMB_SPEC_TRY(ApplyOverride(o, cwd, msg));
  return CheckRules(*msg, /*check_required=*/true, source, seen);
}

absl::Status CheckRules(const Message& msg, bool check_required, const Source& source, const Lines* lines) {
  const Reader r{source, const_cast<Lines*>(lines)};
  return CheckMessage(msg, "", check_required, r);
}

std::string ToYaml(const Message& msg) {
  YAML::Emitter out;
  EmitMessage(out, msg);
  return std::string(out.c_str()) + "\n";
}

}  // namespace oomb::spec
