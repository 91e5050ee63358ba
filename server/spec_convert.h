// oomb.v1.JobSpec (the wire form, where unset means "the documented default") <-> oomb::JobSpec
// (worker/job/job_spec.h, every default applied).
#ifndef OOMB_SERVER_SPEC_CONVERT_H_
#define OOMB_SERVER_SPEC_CONVERT_H_

#include "absl/status/statusor.h"
#include "oomb/v1/job_spec.pb.h"
#include "oomb/v1/jobs.pb.h"
#include "worker/job/executor.h"
#include "worker/job/job_spec.h"
#include "worker/plan/memory_planner.h"

namespace oomb::server {

// Applies the defaults for unset fields, then ValidateJobSpec(): INVALID_ARGUMENT naming the
// dotted field path, e.g. "training.learning_rate: must be > 0, got -1".
absl::StatusOr<JobSpec> JobSpecFromProto(const v1::JobSpec& proto);

// Every field set (optional scalars included), so clients see the effective values.
// JobSpecFromProto(JobSpecToProto(s)) == s.
v1::JobSpec JobSpecToProto(const JobSpec& spec);

// The dataset summary stored on the job (Job.dataset).
v1::DatasetSummary DatasetSummaryToProto(const DataSummary& summary);

// The memory planner's answer as EstimateJob returns it.
v1::EstimateJobResponse MemoryPlanToProto(const MemoryPlan& plan);

}  // namespace oomb::server

#endif  // OOMB_SERVER_SPEC_CONVERT_H_
