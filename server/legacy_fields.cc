// Old fields read into their present form: contract in server/legacy_fields.h.
#include "server/legacy_fields.h"

#include <google/protobuf/unknown_field_set.h>

#include <cstring>
#include <string>

namespace oomb::server {
namespace {

using google::protobuf::UnknownField;
using google::protobuf::UnknownFieldSet;

constexpr int kOldSuites = 1;  // EvaluationSpec: repeated string suites
// EvaluationResult: repeated Bucket positions, repeated Cell passkey, repeated Cell needle,
// optional double passkey_accuracy, optional double needle_accuracy.
constexpr int kOldPositions = 2, kOldPasskey = 3, kOldNeedle = 4, kOldPasskeyAccuracy = 5, kOldNeedleAccuracy = 6;

UnknownFieldSet* Unknown(google::protobuf::Message* m) { return m->GetReflection()->MutableUnknownFields(m); }

double AsDouble(const UnknownField& f) {
  const uint64_t bits = f.fixed64();
  double d = 0;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

}  // namespace

void UpgradeLegacyFields(v1::JobSpec* spec) {
  if (!spec->has_evaluation()) return;
  v1::EvaluationSpec* e = spec->mutable_evaluation();
  UnknownFieldSet* unknown = Unknown(e);
  UnknownFieldSet kept;
  for (int i = 0; i < unknown->field_count(); ++i) {
    const UnknownField& f = unknown->field(i);
    v1::Evaluation::Suite suite;
    if (f.number() != kOldSuites || f.type() != UnknownField::TYPE_LENGTH_DELIMITED) {
      kept.AddField(f);
    } else if (v1::Evaluation::Suite_Parse(f.length_delimited(), &suite) &&
               suite != v1::Evaluation::suite_unspecified) {
      e->add_suites(suite);
    }
  }
  unknown->Clear();
  unknown->MergeFrom(kept);
}

void UpgradeLegacyFields(v1::EvaluationResult* result) {
  UnknownFieldSet* unknown = Unknown(result);
  UnknownFieldSet kept;
  auto& suites = *result->mutable_suites();
  for (int i = 0; i < unknown->field_count(); ++i) {
    const UnknownField& f = unknown->field(i);
    const bool bytes = f.type() == UnknownField::TYPE_LENGTH_DELIMITED;
    const bool fixed = f.type() == UnknownField::TYPE_FIXED64;
    v1::EvaluationResult::Bucket bucket;
    v1::EvaluationResult::Cell cell;
    if (f.number() == kOldPositions && bytes && bucket.ParseFromString(f.length_delimited())) {
      *suites["positions"].add_buckets() = bucket;
    } else if ((f.number() == kOldPasskey || f.number() == kOldNeedle) && bytes &&
               cell.ParseFromString(f.length_delimited())) {
      *suites[f.number() == kOldPasskey ? "passkey" : "needle"].add_cells() = cell;
    } else if ((f.number() == kOldPasskeyAccuracy || f.number() == kOldNeedleAccuracy) && fixed) {
      suites[f.number() == kOldPasskeyAccuracy ? "passkey" : "needle"].set_accuracy(AsDouble(f));
    } else {
      kept.AddField(f);
    }
  }
  unknown->Clear();
  unknown->MergeFrom(kept);
}

void UpgradeLegacyFields(v1::Job* job) {
  if (job->has_spec()) UpgradeLegacyFields(job->mutable_spec());
  if (job->has_progress() && job->progress().has_evaluation()) {
    UpgradeLegacyFields(job->mutable_progress()->mutable_evaluation());
  }
}

void UpgradeLegacyFields(v1::JobEvent* event) {
  if (event->has_progress() && event->progress().has_evaluation()) {
    UpgradeLegacyFields(event->mutable_progress()->mutable_evaluation());
  }
}

}  // namespace oomb::server
