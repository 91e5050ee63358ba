// The device a job or a model tool names: the one parser of "auto", "cpu", "cuda" and "cuda:N"
// (the job spec's resources.device, `oombd model eval/generate --device`). Torch-free, as every
// header of job/ is (worker/CMakeLists.txt): the torch side turns a ComputeDevice into
// LibTorch's device itself (at::Device(d.cuda ? at::kCUDA : at::kCPU, ...)), in its .cc files.
#ifndef OOMB_WORKER_JOB_DEVICE_H_
#define OOMB_WORKER_JOB_DEVICE_H_

#include <string>

#include "absl/status/statusor.h"

namespace oomb {

// A CPU, or CUDA device `index`.
struct ComputeDevice {
  bool cuda = false;
  int index = 0;  // the CUDA device's ordinal; 0 for the CPU
  bool operator==(const ComputeDevice&) const = default;
};

// "auto" (or empty): the first CUDA device when there is one, else the CPU; "cpu"; "cuda"
// (device 0) or "cuda:N". FAILED_PRECONDITION naming `field` for a CUDA device the machine does
// not have; INVALID_ARGUMENT naming it for anything else.
absl::StatusOr<ComputeDevice> ResolveDevice(const std::string& requested, const std::string& field);

}  // namespace oomb

#endif  // OOMB_WORKER_JOB_DEVICE_H_
