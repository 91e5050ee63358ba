// Loading a model with its adapter: contract in worker/job/model_loader.h.
#include "worker/job/model_loader.h"

#include <utility>

#include "worker/common/status.h"
#include "worker/session/training_session.h"

namespace oomb {
namespace {

absl::StatusOr<std::unique_ptr<Transformer>> Load(const ModelSource& source, at::ScalarType dtype, at::Device device,
                                                  const std::optional<RopeScalingOverride>& rope,
                                                  const kernels::Collectives* tensor_parallel = nullptr) {
  absl::StatusOr<std::unique_ptr<Transformer>> model =
      Transformer::Load(source.model, dtype, device, rope, tensor_parallel);
  if (model.ok()) return model;
  const absl::Status named = Annotate(model.status(), source.model_field);
  return ReasonOf(model.status()).has_value() ? named : WithReason(named, Reason::kBadModel);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transformer>> LoadForEvaluation(const ModelSource& source, at::ScalarType dtype,
                                                               at::Device device,
                                                               std::optional<RopeScalingOverride> rope) {
  if (source.adapter.has_value() && !rope.has_value()) {
    absl::StatusOr<std::optional<RopeScalingOverride>> trained = AdapterRopeScaling(*source.adapter);
    if (!trained.ok()) return Annotate(trained.status(), source.adapter_field);
    rope = *trained;
  }
  OOMB_ASSIGN_OR_RETURN(std::unique_ptr<Transformer> model, Load(source, dtype, device, rope));
  if (source.adapter.has_value()) {
    OOMB_RETURN_IF_ERROR(Annotate(model->LoadAdapter(*source.adapter), source.adapter_field));
  }
  return model;
}

absl::StatusOr<std::unique_ptr<Transformer>> LoadForTraining(const ModelSource& source, const JobConfig& job,
                                                             at::Device device,
                                                             const kernels::Collectives* tensor_parallel) {
  OOMB_ASSIGN_OR_RETURN(std::unique_ptr<Transformer> model,
                        Load(source, ModelScalarType(job), device, job.model.rope_scaling, tensor_parallel));
  if (job.model.router_aux_loss_coef.has_value()) model->set_router_aux_loss_coef(*job.model.router_aux_loss_coef);
  OOMB_RETURN_IF_ERROR(PrepareTraining(*model, job));
  if (job.method.type == TrainMethod::kFull || !source.adapter.has_value()) return model;
  OOMB_RETURN_IF_ERROR(Annotate(model->LoadLoraWeights(*source.adapter), source.adapter_field));
  return model;
}

}  // namespace oomb
