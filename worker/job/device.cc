#include "worker/job/device.h"

#include <torch/cuda.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace oomb {

absl::StatusOr<ComputeDevice> ResolveDevice(const std::string& requested, const std::string& field) {
  const std::string d = requested.empty() ? "auto" : requested;
  if (d == "cpu") return ComputeDevice{};
  const bool cuda = torch::cuda::is_available();
  if (d == "auto") return ComputeDevice{cuda, 0};
  int index = 0;
  const bool named = d == "cuda" || (d.rfind("cuda:", 0) == 0 && absl::SimpleAtoi(d.substr(5), &index) && index >= 0);
  if (named) {
    if (!cuda) return absl::FailedPreconditionError(absl::StrCat(field, ": '", d, "' but no CUDA device"));
    if (index >= static_cast<int>(torch::cuda::device_count())) {
      return absl::FailedPreconditionError(
          absl::StrCat(field, ": '", d, "' but only ", static_cast<int>(torch::cuda::device_count()), " CUDA devices"));
    }
    return ComputeDevice{true, index};
  }
  return absl::InvalidArgumentError(absl::StrCat(field, ": '", d, "' is not auto, cpu, cuda or cuda:N"));
}

}  // namespace oomb
