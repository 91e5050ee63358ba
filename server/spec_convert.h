// oomb.v1.JobSpec (the wire form, where unset means "the documented default") <-> oomb::JobSpec
// (worker/job/job_spec.h, every default applied).
#ifndef OOMB_SERVER_SPEC_CONVERT_H_
#define OOMB_SERVER_SPEC_CONVERT_H_

#include "absl/status/statusor.h"
#include "oomb/v1/job_spec.pb.h"
#include "worker/job/job_spec.h"

namespace oomb::server {

// Applies the defaults for unset fields, then ValidateJobSpec(): INVALID_ARGUMENT naming the
// dotted field path, e.g. "training.learning_rate: must be > 0, got -1".
absl::StatusOr<JobSpec> JobSpecFromProto(const v1::JobSpec& proto);

// Every field set (optional scalars included), so clients see the effective values.
// JobSpecFromProto(JobSpecToProto(s)) == s.
v1::JobSpec JobSpecToProto(const JobSpec& spec);

}  // namespace oomb::server

#endif  // OOMB_SERVER_SPEC_CONVERT_H_
