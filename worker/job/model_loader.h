// Loading a model with its adapter: one place for a job's run (worker/job/executor.h) and the
// model tools (worker/job/model_tools.h), so both choose the RoPE scaling, load the adapter and
// name what failed the same way.
#ifndef OOMB_WORKER_JOB_MODEL_LOADER_H_
#define OOMB_WORKER_JOB_MODEL_LOADER_H_

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "worker/common/file_access.h"
#include "worker/hf/model_config.h"
#include "worker/model/transformer.h"
#include "worker/plan/job_config.h"

namespace oomb {

// A Hugging Face model directory and, optionally, a PEFT adapter directory, with the fields (or
// flags) that named them: errors are prefixed with them.
struct ModelSource {
  Dir model;
  std::optional<Dir> adapter = std::nullopt;
  const char* model_field = "model.path";
  const char* adapter_field = "method.lora.init_adapter";
};

// For evaluation (nothing trains): RoPE is `rope` when set, else the scaling the adapter was
// trained with (its base_config.json), else config.json's; the adapter is applied. A model that
// cannot be read is BAD_MODEL unless its error says otherwise.
absl::StatusOr<std::unique_ptr<Transformer>> LoadForEvaluation(const ModelSource& source, at::ScalarType dtype,
                                                               at::Device device,
                                                               std::optional<RopeScalingOverride> rope);

// For training `job` (method lora or full): RoPE is model.rope_scaling or config.json's, the
// router's auxiliary loss model.router_aux_loss_coef or config.json's; the model is prepared for
// the method (PrepareTraining) and LoRA starts from the adapter's weights. `tensor_parallel`:
// loaded sharded over that group (Transformer::Load), adapters included.
absl::StatusOr<std::unique_ptr<Transformer>> LoadForTraining(const ModelSource& source, const JobConfig& job,
                                                             at::Device device,
                                                             const kernels::Collectives* tensor_parallel = nullptr);

}  // namespace oomb

#endif  // OOMB_WORKER_JOB_MODEL_LOADER_H_
