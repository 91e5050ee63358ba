// The engine's answers as API messages: a dataset scan's summary (Job.dataset) and the memory
// planner's plan (EstimateJob).
#ifndef OOMB_SERVER_TO_PROTO_H_
#define OOMB_SERVER_TO_PROTO_H_

#include "oomb/v1/jobs.pb.h"
#include "worker/job/executor.h"
#include "worker/plan/memory_planner.h"

namespace oomb::server {

// The dataset summary stored on the job (Job.dataset).
v1::DatasetSummary DatasetSummaryToProto(const DataSummary& summary);

// The memory planner's answer as EstimateJob returns it.
v1::EstimateJobResponse MemoryPlanToProto(const MemoryPlan& plan);

}  // namespace oomb::server

#endif  // OOMB_SERVER_TO_PROTO_H_
