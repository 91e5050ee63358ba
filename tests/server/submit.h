// Scheduler::Submit as CreateJob calls it (server/job_service.cc): the spec resolved (its
// defaults filled, server/job_spec.h) and its placement checked first.
#ifndef OOMB_TESTS_SERVER_SUBMIT_H_
#define OOMB_TESTS_SERVER_SUBMIT_H_

#include <string>

#include "server/job_spec.h"
#include "server/scheduler.h"
#include "worker/common/status.h"

namespace oomb::server {

inline absl::StatusOr<v1::Job> SubmitSpec(Scheduler& scheduler, const v1::JobSpec& spec, const std::string& job_id,
                                          const std::string& request_id, bool* created = nullptr,
                                          const SubmitOptions& options = {}) {
  v1::JobSpec effective = spec;
  OOMB_ASSIGN_OR_RETURN(const JobConfig job, ResolveJobSpec(&effective));
  OOMB_RETURN_IF_ERROR(scheduler.CheckPlacement(job));
  return scheduler.Submit(effective, job, job_id, request_id, created, options);
}

}  // namespace oomb::server

#endif  // OOMB_TESTS_SERVER_SUBMIT_H_
