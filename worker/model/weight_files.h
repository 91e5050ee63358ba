// What the model's weight files (transformer_weights.cc: loading, SaveFull) and adapter files
// (transformer_lora.cc: LoRA, PEFT adapters) share: private to worker/model/.
//
// Thread-safety: functions of their arguments.
#ifndef OOMB_WORKER_MODEL_WEIGHT_FILES_H_
#define OOMB_WORKER_MODEL_WEIGHT_FILES_H_

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "worker/common/file_access.h"
#include "worker/hf/safetensors.h"

namespace oomb {

// Float type for LoRA parameters and RoPE tables: float64 models stay float64, others float32.
at::ScalarType MasterType(at::ScalarType t);
// Copies a safetensors view into a new tensor of `dtype` on `device`.
at::Tensor FromView(const TensorView& v, at::ScalarType dtype, at::Device device);
// Writes named tensors as safetensors `name` in `dir` (contiguous CPU copies in their own dtype).
absl::Status SaveTensors(const Dir& dir, const std::string& name,
                         const std::vector<std::pair<std::string, at::Tensor>>& named,
                         const std::map<std::string, std::string>& metadata);

}  // namespace oomb

#endif  // OOMB_WORKER_MODEL_WEIGHT_FILES_H_
