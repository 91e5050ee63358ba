// The device a job or a model tool names, as LibTorch's device: the one parser of "auto", "cpu",
// "cuda" and "cuda:N" (the job spec's resources.device, `oombd model eval/generate --device`).
#ifndef OOMB_WORKER_JOB_DEVICE_H_
#define OOMB_WORKER_JOB_DEVICE_H_

#include <c10/core/Device.h>

#include <string>

#include "absl/status/statusor.h"

namespace oomb {

// "auto" (or empty): the first CUDA device when there is one, else the CPU; "cpu"; "cuda"
// (device 0) or "cuda:N". FAILED_PRECONDITION naming `field` for a CUDA device the machine does
// not have; INVALID_ARGUMENT naming it for anything else.
absl::StatusOr<at::Device> ResolveDevice(const std::string& requested, const std::string& field);

}  // namespace oomb

#endif  // OOMB_WORKER_JOB_DEVICE_H_
