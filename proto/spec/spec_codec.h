// The job spec's YAML form, read and written through the messages' descriptors and the
// `(oomb.v1.rules)` options declared on their fields (proto/oomb/v1/rules.proto). Nothing here
// names a field of the spec: the .proto files are the one schema, and this library is shared by
// the CLI (client/) and the daemon (server/).
//
// Reading (ParseYaml, ApplyOverride) refuses, naming "<source>:<line>: <dotted.field>: ...":
//   - YAML syntax errors, a second document, duplicate keys, keys that are not strings;
//   - unknown keys (listing the known ones), two members of one oneof;
//   - a value of the wrong shape or type: a string where a number belongs (a quoted "5" too),
//     a fraction for an integer, NaN or infinity, an unknown enum word (listing the known),
//     a mapping where a string belongs (a label's value too);
//   - text that is not UTF-8 or holds control characters (text fields and map keys);
//   - what the field's rules refuse (CheckRules).
// A null value leaves the field unset (its default applies); an absent message field is
// unset. Paths (rules.path) are made absolute against a base directory when one is given.
//
// Defaults (FillDefaults): every unset field with a rules default takes it; a message field is
// created to hold its fields' defaults when any field beneath it has one (so `training:` left
// out still trains 100 steps at 2e-4, while `model.rope_scaling` left out stays absent).
//
// Thread-safety: pure functions of their arguments.
#ifndef OOMB_PROTO_SPEC_SPEC_CODEC_H_
#define OOMB_PROTO_SPEC_SPEC_CODEC_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace oomb::spec {

// Where a document comes from, for messages and relative paths.
struct Source {
  std::string name;      // "job.yaml", or empty (messages then start with the field)
  std::string base_dir;  // relative paths are made absolute against it; empty: left as they are
};

// Line numbers of the fields a document set: dotted path -> 1-based line.
using Lines = std::map<std::string, int>;

// Reads one YAML document into `msg` (cleared first) and checks the rules of the fields it set
// (CheckRules without `required`: a partial document may be completed by --set). `lines`
// (optional) receives each set field's line.
absl::Status ParseYaml(absl::string_view yaml, const Source& source, google::protobuf::Message* msg,
                       Lines* lines = nullptr);

// Applies "dotted.path=value" (value read as YAML) to `msg`, with ParseYaml's checks; "a.b=null"
// unsets; "labels.team=nlp" sets one entry of a map field. Setting a member of a oneof clears
// the others. Errors start with "--set <key=value>: ". `base_dir` as Source's.
absl::Status ApplyOverride(absl::string_view key_eq_value, const std::string& base_dir, google::protobuf::Message* msg);

// Fills the defaults of unset fields (see above).
void FillDefaults(google::protobuf::Message* msg);

// Checks every set field against its rules (ranges, lengths, item counts, patterns, text) and,
// when `check_required`, that required fields are set (in present messages). INVALID_ARGUMENT
// naming the dotted field path, prefixed with "<source.name>:<line>: " where `lines` knows it.
absl::Status CheckRules(const google::protobuf::Message& msg, bool check_required, const Source& source = {},
                        const Lines* lines = nullptr);

// Reads the YAML file at `path` into `msg`: ParseYaml (relative paths against the file's
// directory), then each override (relative paths against the current directory), then the
// required fields. `lines` as ParseYaml's. NOT_FOUND when the file cannot be read.
absl::Status LoadYamlFile(const std::string& path, const std::vector<std::string>& overrides,
                          google::protobuf::Message* msg, Lines* lines = nullptr);

// The error CheckRules would give for `path`: INVALID_ARGUMENT "<source>:<line>: <path>: <what>",
// the line being the path's or, when it has none, its nearest enclosing field's. For checks
// that relate fields, made where the rules end.
absl::Status FieldError(const Source& source, const Lines* lines, const std::string& path, absl::string_view what);

// The message as a YAML document: every set field in declaration order (absent messages as
// null), enum values by name. ParseYaml reads it back to an equal message.
std::string ToYaml(const google::protobuf::Message& msg);

}  // namespace oomb::spec

#endif  // OOMB_PROTO_SPEC_SPEC_CODEC_H_
