#include "worker/job/job_spec.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "worker/common/status.h"
#include "worker/model/unicode.h"

namespace oomb {
namespace {

// The document's shape is one table: sections (mappings) and fields, in JOBSPEC.md's order.
// Parsing, overrides, validation and emission all walk this table, so they cannot disagree.
enum class Kind { kSection, kString, kInt64, kInt32, kDouble, kBool, kStringList, kStringMap };

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Field {
  absl::string_view path;
  Kind kind;
  // Returns the field's address; for fields under an absent optional section (rope_scaling)
  // returns nullptr unless `create`. Sections have none.
  void* (*get)(JobSpec* spec, bool create) = nullptr;
  bool nullable = false;  // strings: null means empty; sections: null means absent
  bool required = false;
  std::vector<absl::string_view> allowed = {};  // strings: the allowed values
  double lo = -kInf;                            // numbers: the allowed range
  bool lo_open = false;
  double hi = kInf;
  bool hi_open = false;
};

#define OOMB_F(member) [](JobSpec* s, bool) -> void* { return &s->member; }
#define OOMB_ROPE_F(member)                   \
  [](JobSpec* s, bool create) -> void* {      \
    if (!s->model.rope_scaling.has_value()) { \
      if (!create) return nullptr;            \
      s->model.rope_scaling.emplace();        \
    }                                         \
    return &s->model.rope_scaling->member;    \
  }

const std::vector<Field>& Fields() {
  static const std::vector<Field>* const kFields = new std::vector<Field>{
      {.path = "display_name", .kind = Kind::kString, .get = OOMB_F(display_name)},
      {.path = "labels", .kind = Kind::kStringMap, .get = OOMB_F(labels)},
      {.path = "model", .kind = Kind::kSection},
      {.path = "model.path", .kind = Kind::kString, .get = OOMB_F(model.path), .required = true},
      {.path = "model.dtype", .kind = Kind::kString, .get = OOMB_F(model.dtype), .allowed = {"bfloat16", "float32"}},
      {.path = "model.rope_scaling", .kind = Kind::kSection, .nullable = true},
      {.path = "model.rope_scaling.type",
       .kind = Kind::kString,
       .get = OOMB_ROPE_F(type),
       .allowed = {"linear", "dynamic", "yarn", "llama3"}},
      {.path = "model.rope_scaling.factor",
       .kind = Kind::kDouble,
       .get = OOMB_ROPE_F(factor),
       .lo = 0,
       .lo_open = true},
      {.path = "model.rope_scaling.original_max_position_embeddings",
       .kind = Kind::kInt64,
       .get = OOMB_ROPE_F(original_max_position_embeddings),
       .lo = 0},
      {.path = "model.rope_scaling.low_freq_factor",
       .kind = Kind::kDouble,
       .get = OOMB_ROPE_F(low_freq_factor),
       .lo = 0},
      {.path = "model.rope_scaling.high_freq_factor",
       .kind = Kind::kDouble,
       .get = OOMB_ROPE_F(high_freq_factor),
       .lo = 0},
      {.path = "model.rope_scaling.beta_fast", .kind = Kind::kDouble, .get = OOMB_ROPE_F(beta_fast), .lo = 0},
      {.path = "model.rope_scaling.beta_slow", .kind = Kind::kDouble, .get = OOMB_ROPE_F(beta_slow), .lo = 0},
      {.path = "method", .kind = Kind::kSection},
      {.path = "method.type", .kind = Kind::kString, .get = OOMB_F(method.type), .allowed = {"lora", "full"}},
      {.path = "method.lora", .kind = Kind::kSection},
      {.path = "method.lora.rank", .kind = Kind::kInt32, .get = OOMB_F(method.lora.rank), .lo = 0, .lo_open = true},
      {.path = "method.lora.alpha", .kind = Kind::kDouble, .get = OOMB_F(method.lora.alpha), .lo = 0, .lo_open = true},
      {.path = "method.lora.dropout",
       .kind = Kind::kDouble,
       .get = OOMB_F(method.lora.dropout),
       .lo = 0,
       .hi = 1,
       .hi_open = true},
      {.path = "method.lora.target_modules", .kind = Kind::kStringList, .get = OOMB_F(method.lora.target_modules)},
      {.path = "data", .kind = Kind::kSection},
      {.path = "data.train", .kind = Kind::kString, .get = OOMB_F(data.train), .required = true},
      {.path = "data.validation", .kind = Kind::kString, .get = OOMB_F(data.validation), .nullable = true},
      {.path = "data.max_seq_len",
       .kind = Kind::kInt64,
       .get = OOMB_F(data.max_seq_len),
       .lo = 0,
       .lo_open = true,
       .hi = 2147483648.0},
      {.path = "data.packing", .kind = Kind::kBool, .get = OOMB_F(data.packing)},
      {.path = "data.too_long",
       .kind = Kind::kString,
       .get = OOMB_F(data.too_long),
       .allowed = {"truncate", "drop", "error"}},
      {.path = "data.shuffle_seed", .kind = Kind::kInt64, .get = OOMB_F(data.shuffle_seed)},
      {.path = "training", .kind = Kind::kSection},
      {.path = "training.max_steps", .kind = Kind::kInt64, .get = OOMB_F(training.max_steps), .lo = 0},
      {.path = "training.epochs", .kind = Kind::kInt64, .get = OOMB_F(training.epochs), .lo = 0},
      {.path = "training.batch_sequences",
       .kind = Kind::kInt64,
       .get = OOMB_F(training.batch_sequences),
       .lo = 0,
       .lo_open = true},
      {.path = "training.learning_rate",
       .kind = Kind::kDouble,
       .get = OOMB_F(training.learning_rate),
       .lo = 0,
       .lo_open = true},
      {.path = "training.lr_schedule",
       .kind = Kind::kString,
       .get = OOMB_F(training.lr_schedule),
       .allowed = {"constant", "linear", "cosine"}},
      {.path = "training.warmup_steps", .kind = Kind::kInt64, .get = OOMB_F(training.warmup_steps), .lo = 0},
      {.path = "training.weight_decay", .kind = Kind::kDouble, .get = OOMB_F(training.weight_decay), .lo = 0},
      {.path = "training.adam", .kind = Kind::kSection},
      {.path = "training.adam.beta1",
       .kind = Kind::kDouble,
       .get = OOMB_F(training.adam.beta1),
       .lo = 0,
       .hi = 1,
       .hi_open = true},
      {.path = "training.adam.beta2",
       .kind = Kind::kDouble,
       .get = OOMB_F(training.adam.beta2),
       .lo = 0,
       .hi = 1,
       .hi_open = true},
      {.path = "training.adam.eps", .kind = Kind::kDouble, .get = OOMB_F(training.adam.eps), .lo = 0, .lo_open = true},
      {.path = "training.max_grad_norm", .kind = Kind::kDouble, .get = OOMB_F(training.max_grad_norm), .lo = 0},
      {.path = "training.seed", .kind = Kind::kInt64, .get = OOMB_F(training.seed)},
      {.path = "training.eval_every_steps", .kind = Kind::kInt64, .get = OOMB_F(training.eval_every_steps), .lo = 0},
      {.path = "memory", .kind = Kind::kSection},
      {.path = "memory.chunk_tokens",
       .kind = Kind::kInt64,
       .get = OOMB_F(memory.chunk_tokens),
       .lo = 0,
       .lo_open = true},
      {.path = "memory.page_tokens", .kind = Kind::kInt64, .get = OOMB_F(memory.page_tokens), .lo = 0, .lo_open = true},
      {.path = "memory.kv_offload",
       .kind = Kind::kString,
       .get = OOMB_F(memory.kv_offload),
       .allowed = {"auto", "none", "host"}},
      {.path = "memory.kv_grad_dtype",
       .kind = Kind::kString,
       .get = OOMB_F(memory.kv_grad_dtype),
       .allowed = {"float32", "bfloat16"}},
      {.path = "attention", .kind = Kind::kSection},
      {.path = "attention.mode", .kind = Kind::kString, .get = OOMB_F(attention.mode), .allowed = {"dense", "sparse"}},
      {.path = "attention.sparse", .kind = Kind::kSection},
      {.path = "attention.sparse.page_budget",
       .kind = Kind::kInt64,
       .get = OOMB_F(attention.sparse.page_budget),
       .lo = 0,
       .lo_open = true},
      {.path = "attention.sparse.sink_pages",
       .kind = Kind::kInt64,
       .get = OOMB_F(attention.sparse.sink_pages),
       .lo = 0},
      {.path = "attention.sparse.local_pages",
       .kind = Kind::kInt64,
       .get = OOMB_F(attention.sparse.local_pages),
       .lo = 0},
      {.path = "attention.sparse.selection",
       .kind = Kind::kString,
       .get = OOMB_F(attention.sparse.selection),
       .allowed = {"mean_key", "min_max"}},
      {.path = "backward", .kind = Kind::kSection},
      {.path = "backward.chunk_fraction",
       .kind = Kind::kDouble,
       .get = OOMB_F(backward.chunk_fraction),
       .lo = 0,
       .lo_open = true,
       .hi = 1},
      {.path = "checkpoint", .kind = Kind::kSection},
      {.path = "checkpoint.every_steps", .kind = Kind::kInt64, .get = OOMB_F(checkpoint.every_steps), .lo = 0},
      {.path = "checkpoint.keep_last",
       .kind = Kind::kInt64,
       .get = OOMB_F(checkpoint.keep_last),
       .lo = 0,
       .lo_open = true},
      {.path = "checkpoint.dir", .kind = Kind::kString, .get = OOMB_F(checkpoint.dir), .nullable = true},
      {.path = "resources", .kind = Kind::kSection},
      {.path = "resources.device", .kind = Kind::kString, .get = OOMB_F(resources.device)},
      {.path = "resources.gpus", .kind = Kind::kInt32, .get = OOMB_F(resources.gpus), .lo = 0, .lo_open = true},
      {.path = "resources.priority", .kind = Kind::kInt32, .get = OOMB_F(resources.priority)},
      {.path = "resources.max_retries", .kind = Kind::kInt32, .get = OOMB_F(resources.max_retries), .lo = 0},
      {.path = "resources.max_runtime_seconds",
       .kind = Kind::kInt64,
       .get = OOMB_F(resources.max_runtime_seconds),
       .lo = 0},
  };
  return *kFields;
}

#undef OOMB_F
#undef OOMB_ROPE_F

const Field* FindField(absl::string_view path) {
  for (const Field& f : Fields()) {
    if (f.path == path) return &f;
  }
  return nullptr;
}

absl::string_view Parent(absl::string_view path) {
  const size_t dot = path.rfind('.');
  return dot == absl::string_view::npos ? absl::string_view() : path.substr(0, dot);
}

absl::string_view LastComponent(absl::string_view path) {
  const size_t dot = path.rfind('.');
  return dot == absl::string_view::npos ? path : path.substr(dot + 1);
}

std::string JoinPath(absl::string_view section, absl::string_view key) {
  return section.empty() ? std::string(key) : absl::StrCat(section, ".", key);
}

std::string KnownKeys(absl::string_view section) {
  std::vector<absl::string_view> keys;
  for (const Field& f : Fields()) {
    if (Parent(f.path) == section) keys.push_back(LastComponent(f.path));
  }
  return absl::StrJoin(keys, ", ");
}

// Where messages come from: the document's name, and the line of each field it set.
struct Origin {
  std::string source;                // "job.yaml", "--set training.max_steps=5", or empty
  std::map<std::string, int> lines;  // dotted path -> 1-based line
};

absl::Status Error(const Origin& origin, absl::string_view path, absl::string_view message) {
  std::string prefix;
  if (!origin.source.empty()) {
    auto it = origin.lines.find(std::string(path));
    prefix = it != origin.lines.end() && it->second > 0 ? absl::StrCat(origin.source, ":", it->second, ": ")
                                                        : absl::StrCat(origin.source, ": ");
  }
  return absl::InvalidArgumentError(absl::StrCat(prefix, path, ": ", message));
}

std::string FormatNumber(double v) { return fmt::format("{}", v); }

std::string DescribeScalar(const YAML::Node& node) {
  if (node.IsScalar()) {
    return node.Tag() == "!" ? absl::StrCat("the string \"", node.Scalar(), "\"")
                             : absl::StrCat("'", node.Scalar(), "'");
  }
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return "nothing";
}

bool IsPlainScalar(const YAML::Node& node) { return node.IsScalar() && node.Tag() != "!"; }

// Sets field `f` of `to` to its documented default (used for "null means default").
void ResetField(const Field& f, JobSpec* to) {
  static const JobSpec* const kDefaults = [] {
    auto* d = new JobSpec();
    d->model.rope_scaling.emplace();
    return d;
  }();
  void* src = f.get(const_cast<JobSpec*>(kDefaults), false);
  void* dst = f.get(to, true);
  switch (f.kind) {
    case Kind::kString:
      *static_cast<std::string*>(dst) = *static_cast<const std::string*>(src);
      break;
    case Kind::kInt64:
      *static_cast<int64_t*>(dst) = *static_cast<const int64_t*>(src);
      break;
    case Kind::kInt32:
      *static_cast<int32_t*>(dst) = *static_cast<const int32_t*>(src);
      break;
    case Kind::kDouble:
      *static_cast<double*>(dst) = *static_cast<const double*>(src);
      break;
    case Kind::kBool:
      *static_cast<bool*>(dst) = *static_cast<const bool*>(src);
      break;
    case Kind::kStringList:
      *static_cast<std::vector<std::string>*>(dst) = *static_cast<const std::vector<std::string>*>(src);
      break;
    case Kind::kStringMap:
      *static_cast<std::map<std::string, std::string>*>(dst) =
          *static_cast<const std::map<std::string, std::string>*>(src);
      break;
    case Kind::kSection:
      break;
  }
}

// Reads `node` into field `f` of `spec`: type checks only (ranges come in CheckField).
absl::Status SetFromNode(const Field& f, const YAML::Node& node, const Origin& origin, JobSpec* spec) {
  if (node.IsNull()) {
    if (f.kind == Kind::kString && f.nullable) {
      *static_cast<std::string*>(f.get(spec, true)) = "";
    } else {
      ResetField(f, spec);
    }
    return absl::OkStatus();
  }
  void* dst = f.get(spec, true);
  switch (f.kind) {
    case Kind::kString:
      if (!node.IsScalar()) return Error(origin, f.path, absl::StrCat("expected a string, got ", DescribeScalar(node)));
      *static_cast<std::string*>(dst) = node.Scalar();
      return absl::OkStatus();
    case Kind::kInt64:
    case Kind::kInt32: {
      int64_t v = 0;
      if (!IsPlainScalar(node) || !absl::SimpleAtoi(node.Scalar(), &v)) {
        return Error(origin, f.path, absl::StrCat("expected an integer, got ", DescribeScalar(node)));
      }
      if (f.kind == Kind::kInt32) {
        if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
          return Error(origin, f.path, absl::StrCat("must fit in 32 bits, got ", v));
        }
        *static_cast<int32_t*>(dst) = static_cast<int32_t>(v);
      } else {
        *static_cast<int64_t*>(dst) = v;
      }
      return absl::OkStatus();
    }
    case Kind::kDouble: {
      double v = 0;
      if (!IsPlainScalar(node) || !absl::SimpleAtod(node.Scalar(), &v) || !std::isfinite(v)) {
        return Error(origin, f.path, absl::StrCat("expected a finite number, got ", DescribeScalar(node)));
      }
      *static_cast<double*>(dst) = v;
      return absl::OkStatus();
    }
    case Kind::kBool: {
      const std::string s = IsPlainScalar(node) ? absl::AsciiStrToLower(node.Scalar()) : "";
      if (s != "true" && s != "false") {
        return Error(origin, f.path, absl::StrCat("expected true or false, got ", DescribeScalar(node)));
      }
      *static_cast<bool*>(dst) = s == "true";
      return absl::OkStatus();
    }
    case Kind::kStringList: {
      if (!node.IsSequence())
        return Error(origin, f.path, absl::StrCat("expected a list of strings, got ", DescribeScalar(node)));
      std::vector<std::string> out;
      for (const YAML::Node& item : node) {
        if (!item.IsScalar())
          return Error(origin, f.path,
                       absl::StrCat("expected a list of strings, got an item that is ", DescribeScalar(item)));
        out.push_back(item.Scalar());
      }
      *static_cast<std::vector<std::string>*>(dst) = std::move(out);
      return absl::OkStatus();
    }
    case Kind::kStringMap: {
      if (!node.IsMap())
        return Error(origin, f.path, absl::StrCat("expected a mapping of strings, got ", DescribeScalar(node)));
      std::map<std::string, std::string> out;
      for (const auto& kv : node) {
        if (!kv.first.IsScalar() || !kv.second.IsScalar()) {
          return Error(origin, f.path, "expected a mapping of strings to strings");
        }
        out[kv.first.Scalar()] = kv.second.Scalar();
      }
      *static_cast<std::map<std::string, std::string>*>(dst) = std::move(out);
      return absl::OkStatus();
    }
    case Kind::kSection:
      break;
  }
  return absl::InternalError("unreachable");
}

std::string DescribeRange(const Field& f) {
  const bool has_lo = f.lo != -kInf, has_hi = f.hi != kInf;
  if (has_lo && has_hi) {
    return absl::StrCat("must be in ", f.lo_open ? "(" : "[", FormatNumber(f.lo), ", ", FormatNumber(f.hi),
                        f.hi_open ? ")" : "]");
  }
  if (has_lo) return absl::StrCat("must be ", f.lo_open ? "> " : ">= ", FormatNumber(f.lo));
  return absl::StrCat("must be ", f.hi_open ? "< " : "<= ", FormatNumber(f.hi));
}

bool InRange(const Field& f, double v) {
  if (f.lo_open ? !(v > f.lo) : !(v >= f.lo)) return false;
  if (f.hi_open ? !(v < f.hi) : !(v <= f.hi)) return false;
  return true;
}

bool ValidDevice(const std::string& d) {
  if (d == "auto" || d == "cpu" || d == "cuda") return true;
  int64_t n = 0;
  absl::string_view rest = d;
  return absl::ConsumePrefix(&rest, "cuda:") && !rest.empty() && absl::SimpleAtoi(rest, &n) && n >= 0 &&
         rest.find_first_not_of("0123456789") == absl::string_view::npos;
}

// The field's own constraints: allowed values and ranges (not `required`).
// Text fields are UTF-8 without control characters: they become protobuf strings, file
// paths, label values and log lines.
absl::Status CheckText(const Origin& origin, absl::string_view path, const std::string& s) {
  size_t bad = 0;
  if (!IsValidUtf8(s, &bad)) return Error(origin, path, absl::StrCat("is not valid UTF-8 (at byte ", bad, ")"));
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f)
      return Error(origin, path, absl::StrCat("contains a control character (at byte ", i, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckField(const Field& f, const JobSpec& spec, const Origin& origin) {
  const void* p = f.get(const_cast<JobSpec*>(&spec), false);
  if (p == nullptr) return absl::OkStatus();
  switch (f.kind) {
    case Kind::kString: {
      const auto& s = *static_cast<const std::string*>(p);
      OOMB_RETURN_IF_ERROR(CheckText(origin, f.path, s));
      if (!f.allowed.empty() && !s.empty() && std::find(f.allowed.begin(), f.allowed.end(), s) == f.allowed.end()) {
        return Error(origin, f.path,
                     absl::StrCat("must be one of ", absl::StrJoin(f.allowed, ", "), "; got '", s, "'"));
      }
      if (!f.allowed.empty() && s.empty() && f.path != "model.rope_scaling.type") {
        return Error(origin, f.path, absl::StrCat("must be one of ", absl::StrJoin(f.allowed, ", ")));
      }
      if (f.path == "resources.device" && !ValidDevice(s)) {
        return Error(origin, f.path, absl::StrCat("must be auto, cpu, cuda or cuda:N; got '", s, "'"));
      }
      return absl::OkStatus();
    }
    case Kind::kInt64:
    case Kind::kInt32: {
      const int64_t v =
          f.kind == Kind::kInt64 ? *static_cast<const int64_t*>(p) : int64_t{*static_cast<const int32_t*>(p)};
      if (!InRange(f, static_cast<double>(v)))
        return Error(origin, f.path, absl::StrCat(DescribeRange(f), ", got ", v));
      return absl::OkStatus();
    }
    case Kind::kDouble: {
      const double v = *static_cast<const double*>(p);
      if (!std::isfinite(v)) return Error(origin, f.path, absl::StrCat("must be finite, got ", FormatNumber(v)));
      if (!InRange(f, v)) return Error(origin, f.path, absl::StrCat(DescribeRange(f), ", got ", FormatNumber(v)));
      return absl::OkStatus();
    }
    case Kind::kStringList: {
      const auto& list = *static_cast<const std::vector<std::string>*>(p);
      if (list.empty()) return Error(origin, f.path, "must not be empty");
      for (const std::string& s : list) {
        if (s.empty()) return Error(origin, f.path, "must not contain empty names");
        OOMB_RETURN_IF_ERROR(CheckText(origin, f.path, s));
      }
      return absl::OkStatus();
    }
    case Kind::kStringMap: {
      for (const auto& [k, v] : *static_cast<const std::map<std::string, std::string>*>(p)) {
        if (k.empty()) return Error(origin, f.path, "keys must not be empty");
        OOMB_RETURN_IF_ERROR(CheckText(origin, f.path, k));
        OOMB_RETURN_IF_ERROR(CheckText(origin, f.path, v));
      }
      return absl::OkStatus();
    }
    case Kind::kBool:
    case Kind::kSection:
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

// Constraints between fields.
absl::Status CheckCrossField(const JobSpec& spec, const Origin& origin) {
  const TrainingSpec& t = spec.training;
  if (t.epochs > 0 && t.max_steps > 0) {
    return Error(origin, "training.epochs", "cannot be combined with training.max_steps; set one of them");
  }
  if (t.epochs == 0 && t.max_steps == 0) {
    return Error(origin, "training.max_steps", "must be > 0 (or set training.epochs), got 0");
  }
  if (spec.model.rope_scaling.has_value() && spec.model.rope_scaling->type.empty()) {
    Origin o = origin;
    if (!o.lines.count("model.rope_scaling.type")) o.lines["model.rope_scaling.type"] = o.lines["model.rope_scaling"];
    return Error(o, "model.rope_scaling.type",
                 "is required when model.rope_scaling is set (one of linear, dynamic, yarn, llama3)");
  }
  if (t.batch_sequences < spec.resources.gpus) {
    return Error(
        origin, "training.batch_sequences",
        absl::StrCat("must be >= resources.gpus (", spec.resources.gpus,
                     "): each data-parallel rank trains whole sequences of the global batch; got ", t.batch_sequences));
  }
  const SparseAttentionSpec& sp = spec.attention.sparse;
  if (spec.attention.mode == "sparse" && spec.memory.chunk_tokens % spec.memory.page_tokens != 0) {
    return Error(origin, "memory.chunk_tokens",
                 absl::StrCat("must be a multiple of memory.page_tokens (", spec.memory.page_tokens,
                              ") with attention.mode: sparse (chunks start on page boundaries), got ",
                              spec.memory.chunk_tokens));
  }
  if (sp.sink_pages + sp.local_pages > sp.page_budget) {
    return Error(origin, "attention.sparse.page_budget",
                 absl::StrCat("must be >= sink_pages + local_pages (", sp.sink_pages + sp.local_pages, "), got ",
                              sp.page_budget));
  }
  return absl::OkStatus();
}

absl::Status Validate(const JobSpec& spec, const Origin& origin, bool check_required) {
  for (const Field& f : Fields()) {
    if (f.kind == Kind::kSection) continue;
    absl::Status s = CheckField(f, spec, origin);
    if (!s.ok()) return s;
    if (check_required && f.required &&
        static_cast<const std::string*>(f.get(const_cast<JobSpec*>(&spec), false))->empty()) {
      return Error(origin, f.path, "is required");
    }
  }
  return CheckCrossField(spec, origin);
}

// Reads the mapping `node` into section `section` of `spec`, recording each key's line.
absl::Status WalkSection(absl::string_view section, const YAML::Node& node, Origin* origin, JobSpec* spec) {
  std::set<std::string> seen;
  for (const auto& kv : node) {
    const int line = kv.first.Mark().line + 1;
    if (!kv.first.IsScalar()) {
      Origin o = *origin;
      o.lines[std::string(section)] = line;
      return Error(o, section.empty() ? "(top level)" : section, "keys must be strings");
    }
    const std::string path = JoinPath(section, kv.first.Scalar());
    origin->lines[path] = line;
    if (!seen.insert(path).second) return Error(*origin, path, "duplicate key");
    const Field* f = FindField(path);
    if (f == nullptr) {
      return Error(*origin, path,
                   absl::StrCat("unknown key (known keys", section.empty() ? "" : absl::StrCat(" under ", section),
                                ": ", KnownKeys(section), ")"));
    }
    if (f->kind == Kind::kSection) {
      if (kv.second.IsNull()) {
        if (f->nullable) spec->model.rope_scaling.reset();  // the only nullable section
        continue;
      }
      if (!kv.second.IsMap()) {
        return Error(*origin, path, absl::StrCat("expected a mapping, got ", DescribeScalar(kv.second)));
      }
      if (f->nullable) spec->model.rope_scaling.emplace();  // a new mapping replaces the old one
      OOMB_RETURN_IF_ERROR(WalkSection(path, kv.second, origin, spec));
      continue;
    }
    OOMB_RETURN_IF_ERROR(SetFromNode(*f, kv.second, *origin, spec));
  }
  return absl::OkStatus();
}

void EmitString(YAML::Emitter& out, const std::string& s) {
  const std::string lower = absl::AsciiStrToLower(s);
  if (s.empty() || lower == "null" || lower == "~") {
    out << YAML::DoubleQuoted << s;
  } else {
    out << s;
  }
}

void EmitSection(absl::string_view section, const JobSpec& spec, YAML::Emitter& out) {
  for (const Field& f : Fields()) {
    if (Parent(f.path) != section) continue;
    out << YAML::Key << std::string(LastComponent(f.path)) << YAML::Value;
    if (f.kind == Kind::kSection) {
      if (f.nullable && !spec.model.rope_scaling.has_value()) {
        out << YAML::Null;
        continue;
      }
      out << YAML::BeginMap;
      EmitSection(f.path, spec, out);
      out << YAML::EndMap;
      continue;
    }
    const void* p = f.get(const_cast<JobSpec*>(&spec), false);
    switch (f.kind) {
      case Kind::kString: {
        const auto& s = *static_cast<const std::string*>(p);
        if (f.nullable && s.empty()) {
          out << YAML::Null;
        } else {
          EmitString(out, s);
        }
        break;
      }
      case Kind::kInt64:
        out << *static_cast<const int64_t*>(p);
        break;
      case Kind::kInt32:
        out << *static_cast<const int32_t*>(p);
        break;
      case Kind::kDouble:
        // fmt's shortest representation that reads back to the same double.
        out << FormatNumber(*static_cast<const double*>(p));
        break;
      case Kind::kBool:
        out << (*static_cast<const bool*>(p) ? "true" : "false");
        break;
      case Kind::kStringList:
        out << YAML::Flow << YAML::BeginSeq;
        for (const std::string& s : *static_cast<const std::vector<std::string>*>(p)) EmitString(out, s);
        out << YAML::EndSeq;
        break;
      case Kind::kStringMap: {
        const auto& m = *static_cast<const std::map<std::string, std::string>*>(p);
        out << YAML::BeginMap;
        for (const auto& [k, v] : m) {
          out << YAML::Key;
          EmitString(out, k);
          out << YAML::Value;
          EmitString(out, v);
        }
        out << YAML::EndMap;
        break;
      }
      case Kind::kSection:
        break;
    }
  }
}

}  // namespace

absl::StatusOr<JobSpec> ParseJobSpecYaml(const std::string& yaml, const std::string& source_name) {
  Origin origin{.source = source_name.empty() ? "" : source_name, .lines = {}};
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    const std::string where = source_name.empty() ? "" : absl::StrCat(source_name, ":", e.mark.line + 1, ": ");
    return absl::InvalidArgumentError(absl::StrCat(where, "YAML syntax error: ", e.msg));
  }
  JobSpec spec;
  if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(source_name.empty() ? "" : absl::StrCat(source_name, ": "),
                                                   "expected a mapping at the top level, got ", DescribeScalar(root)));
  }
  try {
    OOMB_RETURN_IF_ERROR(WalkSection("", root, &origin, &spec));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source_name, ":", e.mark.line + 1, ": ", e.msg));
  }
  // `epochs` alone replaces the default max_steps.
  if (origin.lines.count("training.epochs") && !origin.lines.count("training.max_steps") && spec.training.epochs > 0) {
    spec.training.max_steps = 0;
  }
  OOMB_RETURN_IF_ERROR(Validate(spec, origin, /*check_required=*/true));
  return spec;
}

absl::Status ApplyOverride(JobSpec* spec, const std::string& key_eq_value) {
  Origin origin{.source = absl::StrCat("--set ", key_eq_value), .lines = {}};
  const size_t eq = key_eq_value.find('=');
  if (eq == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(origin.source, ": expected key=value, e.g. training.max_steps=5"));
  }
  const std::string key(absl::StripAsciiWhitespace(absl::string_view(key_eq_value).substr(0, eq)));
  const std::string value = key_eq_value.substr(eq + 1);
  YAML::Node node;
  try {
    node = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(origin.source, ": ", key, ": cannot read the value: ", e.msg));
  }
  JobSpec copy = *spec;
  absl::string_view label;
  if (absl::string_view k = key; absl::ConsumePrefix(&k, "labels.")) {
    label = k;
    if (label.empty()) return Error(origin, key, "empty label name");
    if (node.IsNull()) {
      copy.labels.erase(std::string(label));
    } else if (node.IsScalar()) {
      copy.labels[std::string(label)] = node.Scalar();
    } else {
      return Error(origin, key, "expected a string");
    }
    *spec = std::move(copy);
    return absl::OkStatus();
  }
  const Field* f = FindField(key);
  if (f == nullptr) {
    const std::string section(Parent(key));
    return Error(origin, key,
                 absl::StrCat("unknown key (known keys", section.empty() ? "" : absl::StrCat(" under ", section), ": ",
                              KnownKeys(section), ")"));
  }
  try {
    if (f->kind == Kind::kSection) {
      if (node.IsNull()) {
        if (f->nullable) copy.model.rope_scaling.reset();
      } else if (!node.IsMap()) {
        return Error(origin, key, absl::StrCat("expected a mapping, got ", DescribeScalar(node)));
      } else {
        if (f->nullable) copy.model.rope_scaling.emplace();
        OOMB_RETURN_IF_ERROR(WalkSection(key, node, &origin, &copy));
      }
    } else {
      OOMB_RETURN_IF_ERROR(SetFromNode(*f, node, origin, &copy));
    }
  } catch (const YAML::Exception& e) {
    return Error(origin, key, e.msg);
  }
  origin.lines.clear();  // one-line source: no line numbers
  if (key == "training.epochs" && copy.training.epochs > 0) copy.training.max_steps = 0;
  if (key == "training.max_steps" && copy.training.max_steps > 0) copy.training.epochs = 0;
  OOMB_RETURN_IF_ERROR(Validate(copy, origin, /*check_required=*/false));
  *spec = std::move(copy);
  return absl::OkStatus();
}

absl::Status ValidateJobSpec(const JobSpec& spec) { return Validate(spec, Origin(), /*check_required=*/true); }

std::string JobSpecToYaml(const JobSpec& spec) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  EmitSection("", spec, out);
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace oomb
