// The engine's answers as API messages: a dataset scan's summary (Job.dataset), the memory
// planner's plan (EstimateJob) and an evaluation's results (Progress.evaluation).
#ifndef OOMB_SERVER_TO_PROTO_H_
#define OOMB_SERVER_TO_PROTO_H_

#include "oomb/v1/jobs.pb.h"
#include "worker/job/executor.h"
#include "worker/metrics/eval_report.h"
#include "worker/plan/memory_planner.h"

namespace oomb::server {

// The dataset summary stored on the job (Job.dataset).
v1::DatasetSummary DatasetSummaryToProto(const DataSummary& summary);

// The memory planner's answer as EstimateJob returns it.
v1::EstimateJobResponse MemoryPlanToProto(const MemoryPlan& plan);

// An evaluation's results after optimizer step `step` (Progress.evaluation).
v1::EvaluationResult EvaluationToProto(const EvalReport& report, int64_t step);

}  // namespace oomb::server

#endif  // OOMB_SERVER_TO_PROTO_H_
