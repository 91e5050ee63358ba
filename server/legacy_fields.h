// Fields the API and the job store once held in another form, read into their present form: a
// job stored by an older daemon, or a spec sent by a client built against an older
// proto/oomb/v1 (its old field arrives as an unknown field; proto3 keeps those). A changed field's
// number is reserved in the .proto and its reader lives here (docs/CONVENTIONS.md, "Changing a
// field"):
//   - EvaluationSpec field 1, `repeated string suites` -> `suites` (Evaluation.Suite, field 8);
//   - EvaluationResult fields 2-6, `positions`, `passkey`, `needle` and their accuracies ->
//     `suites` (field 7, a map by suite name).
// Each function is idempotent and leaves a record without old fields as it is.
#ifndef OOMB_SERVER_LEGACY_FIELDS_H_
#define OOMB_SERVER_LEGACY_FIELDS_H_

#include "oomb/v1/jobs.pb.h"

namespace oomb::server {

void UpgradeLegacyFields(v1::JobSpec* spec);
void UpgradeLegacyFields(v1::EvaluationResult* result);
// Its spec and its progress's evaluation.
void UpgradeLegacyFields(v1::Job* job);
// Its progress's evaluation.
void UpgradeLegacyFields(v1::JobEvent* event);

}  // namespace oomb::server

#endif  // OOMB_SERVER_LEGACY_FIELDS_H_
