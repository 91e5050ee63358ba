#include "worker/session/training_session.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <utility>
#include <vector>

#if defined(OOMB_HAVE_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "absl/strings/str_cat.h"
#include "kernels/torch/gpu_timeline.h"
#include "worker/common/status.h"
#include "worker/kv/copy_engine.h"
#include "worker/metrics/flops.h"
#include "worker/train/fused_adamw.h"
#include "worker/train/torch_status.h"

namespace oomb {
namespace {

using Clock = std::chrono::steady_clock;

// What a step's ranks sum (StepSync::Agree), by position.
enum Sum : size_t {
  kLoss,
  kSelectedPages,
  kPastPages,
  kAttendedPairs,
  kKeptTokens,
  kSwappedBytes,
  kSwappedChunks,
  kRouterAux,
  kSums
};

kernels::PageSelectOptions PageSelection(const JobConfig& job) {
  const JobConfig::Sparse& sp = *job.sparse;
  kernels::PageSelectOptions o;
  o.page_tokens = job.memory.page_tokens;
  o.page_budget = sp.page_budget;
  o.sink_pages = sp.sink_pages;
  o.local_pages = sp.local_pages;
  o.summary = sp.selection == PageSummaryKind::kMinMax ? kernels::PageSummary::kMinMax : kernels::PageSummary::kMeanKey;
  return o;
}

// Peak device memory since ResetPeak: the CUDA caching allocator's peak on a GPU; on the CPU the
// trainer's tracked allocations plus the KV pages in use.
int64_t PeakDeviceBytes(const at::Device& device, const TrainerMemory& m) {
#if defined(OOMB_HAVE_CUDA)
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
  }
#endif
  return m.activation_peak_bytes + m.kv_peak_bytes + m.kv_grad_peak_bytes;
}

void ResetPeak(const at::Device& device) {
#if defined(OOMB_HAVE_CUDA)
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
}

// The device's datasheet BF16 peak for MFU; 0 on the CPU and unlisted GPUs.
double PeakFlops(const at::Device& device) {
#if defined(OOMB_HAVE_CUDA)
  if (device.is_cuda()) return PeakDenseBf16Flops(at::cuda::getDeviceProperties(device.index())->name);
#endif
  return 0;
}

void KeepPeak(const TrainerMemory& m, TrainerMemory* peak) {
  peak->activation_peak_bytes = std::max(peak->activation_peak_bytes, m.activation_peak_bytes);
  peak->kv_peak_bytes = std::max(peak->kv_peak_bytes, m.kv_peak_bytes);
  peak->kv_grad_peak_bytes = std::max(peak->kv_grad_peak_bytes, m.kv_grad_peak_bytes);
  peak->host_kv_peak_bytes = std::max(peak->host_kv_peak_bytes, m.host_kv_peak_bytes);
}

}  // namespace

at::ScalarType ModelScalarType(const JobConfig& job) {
  return job.model.dtype == ModelDtype::kFloat32 ? at::kFloat : at::kBFloat16;
}

absl::Status PrepareTraining(Transformer& model, const JobConfig& job) {
  if (job.method.type == TrainMethod::kFull) {
    model.EnableFullFineTuning();
    return absl::OkStatus();
  }
  if (job.method.type == TrainMethod::kEvaluate) return absl::OkStatus();
  LoraOptions lora;
  lora.rank = job.method.lora.rank;
  lora.alpha = job.method.lora.alpha;
  lora.dropout = job.method.lora.dropout;
  lora.target_modules = job.method.lora.target_modules;
  lora.target_parameters = job.method.lora.target_parameters;
  return model.AddLora(lora, static_cast<uint64_t>(job.training.seed));
}

TrainingSession::TrainingSession(Transformer* model, const JobConfig& job, SessionOptions options)
    : model_(model), job_(job), options_(std::move(options)), sync_(options_.sync ? options_.sync : &one_device_) {}

absl::StatusOr<std::unique_ptr<TrainingSession>> TrainingSession::Create(Transformer* model, const JobConfig& job,
                                                                         SessionOptions options) {
  std::unique_ptr<TrainingSession> session(new TrainingSession(model, job, std::move(options)));
  OOMB_RETURN_IF_ERROR(Guarded([&] { return session->Init(); }));
  return session;
}

absl::Status TrainingSession::Init() {
  for (auto& [name, p] : model_->TrainableParameters()) {
    params_.push_back(p);
    split_params_.push_back(model_->SplitOf(p).kind == Split::Kind::kSharded);
  }
  torch::optim::AdamWOptions adam(job_.training.learning_rate);
  adam.betas({job_.training.beta1, job_.training.beta2});
  adam.eps(job_.training.eps);
  adam.weight_decay(job_.training.weight_decay);
  optimizer_ = std::make_unique<FusedAdamW>(params_, adam);

  // KV and KV-gradient pages for the longest sequence (plus one straddling page a layer),
  // placed by the memory planner: what fits on the device, the rest in the host tier.
  const ModelConfig& c = model_->config();
  const at::Device device = options_.device;
  JobConfig planned = job_;
  planned.data.max_seq_len = std::max<int64_t>(options_.longest_sequence, 1);
  OOMB_ASSIGN_OR_RETURN(plan_, PlanMemory(c, planned, options_.machine));
  job_.memory.chunk_tokens = plan_.chunk_tokens;
  job_.memory.kv_grad_dtype = plan_.kv_grad_dtype;
  model_->set_expert_recompute_layers(plan_.expert_recompute_layers);
  const at::ScalarType dtype = model_->dtype();
  OOMB_ASSIGN_OR_RETURN(pools_, MakeKvPools({model_->local_kv_heads(), job_.memory.page_tokens, c.head_dim}, dtype,
                                            GradPageDtype(plan_.kv_grad_dtype == KvGradDtype::kBFloat16, dtype), device,
                                            PoolSizes(plan_)));
  AttachKvStats();
  peak_flops_ = PeakFlops(device);

  ChunkTrainerOptions trainer;
  trainer.chunk_tokens = job_.memory.chunk_tokens;
  trainer.chunk_fraction = job_.chunk_fraction;
  trainer.swap_budget_bytes = plan_.swap_bytes;
  trainer.swap_min_key_tokens = plan_.swap_min_key_tokens;
  trainer.gpu_attention_kernel = options_.attention_kernel;
  if (job_.sparse.has_value()) trainer.sparse = PageSelection(job_);
  trainer.should_stop = options_.should_stop;
  trainer_ = std::make_unique<ChunkTrainer>(model_, pools_.pools(), trainer);
  return absl::OkStatus();
}

void TrainingSession::AttachKvStats() {
  KvStatsRegistry* registry = options_.kv_stats;
  if (registry == nullptr) return;
  const std::string slot = options_.kv_stats_slot;
  if (pools_.copies != nullptr) {
    pools_.copies->set_observer([registry, slot](TransferDirection d, PageKind kind, int64_t bytes, double seconds) {
      registry->RecordTransfer(slot, d, kind, bytes, seconds);
    });
  }
  for (PagePool* pool : pools_.all()) {
    const PoolStats ps = pool->stats();
    pool->AttachCounters(registry->AddPool(slot, ps.tier, ps.kind, ps.capacity_pages, ps.bytes_per_page));
  }
}

absl::StatusOr<StepReport> TrainingSession::Step(const std::vector<TokenSequence>& batch, int64_t step, double lr) {
  const auto start = Clock::now();
  ResetPeak(options_.device);
  int64_t label_tokens = 0;
  for (const TokenSequence& s : batch) label_tokens += s.label_tokens();
  std::vector<double> sums(kSums, 0.0);
  StepReport report;
  TrainerMemory peak;
  absl::Status local = Guarded([&] {
    return TrainLocal(batch, step, label_tokens > 0 ? 1.0 / static_cast<double>(label_tokens) : 0.0, &sums, &report,
                      &peak);
  });
  if (absl::IsCancelled(local)) local = absl::OkStatus();  // the stop is seen by every rank next
  CountOncePerGroup(&sums, {kLoss, kRouterAux, kKeptTokens});
  OOMB_RETURN_IF_ERROR(sync_->Agree(local, &sums));
  if (sync_->stopping()) {
    optimizer_->zero_grad(/*set_to_none=*/true);
    return absl::CancelledError(absl::StrCat("stopped during step ", step));
  }
  OOMB_RETURN_IF_ERROR(sync_->AllReduceGradients(params_));
  if (!first_step_reach_.has_value()) first_step_reach_ = model_->Reach();
  report.loss = label_tokens > 0 ? sums[kLoss] / static_cast<double>(label_tokens) : 0.0;
  report.router_aux_loss = batch.empty() ? 0.0 : sums[kRouterAux] / static_cast<double>(batch.size());
  if (!std::isfinite(report.loss)) {
    return WithReason(absl::InternalError(absl::StrCat("loss is ", report.loss, " at step ", step)), Reason::kNanLoss);
  }
  OOMB_RETURN_IF_ERROR(sync_->Agree(Guarded([&] { return ApplyGradients(lr); }), nullptr));
  Measure(batch, sums, peak, std::chrono::duration<double>(Clock::now() - start).count(), &report);
  return report;
}

absl::Status TrainingSession::TrainLocal(const std::vector<TokenSequence>& batch, int64_t step, double loss_scale,
                                         std::vector<double>* sums, StepReport* report, TrainerMemory* peak) {
  if (step == options_.oom_at_step) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, "injected by the failpoint label 'failpoint: oom-at-step-", step,
                     "' (OOMB_FAILPOINTS=1)");
  }
  kernels::timeline::Mark("model");
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!sync_->Owns(static_cast<int64_t>(i))) continue;
    const uint64_t dropout_seed = DropoutSeed(step, i);
    // The router's auxiliary loss, where the model has one: the mean of the batch's sequences'.
    OOMB_ASSIGN_OR_RETURN(SequenceLoss l, trainer_->TrainSequence(batch[i], loss_scale, dropout_seed,
                                                                  1.0 / static_cast<double>(batch.size())));
    (*sums)[kLoss] += l.loss_sum;
    (*sums)[kRouterAux] += l.router_aux;
    const ChunkTimes& times = trainer_->chunk_times();
    auto& fwd = report->forward_chunk_seconds;
    auto& bwd = report->backward_chunk_seconds;
    fwd.insert(fwd.end(), times.forward.begin(), times.forward.end());
    bwd.insert(bwd.end(), times.backward.begin(), times.backward.end());
    KeepPeak(trainer_->memory(), peak);
    const SparseStats& st = trainer_->sparse_stats();
    (*sums)[kSelectedPages] += static_cast<double>(st.selected_pages);
    (*sums)[kPastPages] += static_cast<double>(st.past_pages);
    (*sums)[kAttendedPairs] += st.attended_pairs;
    (*sums)[kSwappedBytes] += static_cast<double>(trainer_->memory().swapped_bytes);
    (*sums)[kSwappedChunks] += static_cast<double>(trainer_->memory().swapped_chunks);
    const int64_t C = job_.memory.chunk_tokens, T = batch[i].size();
    for (int64_t chunk = 0; chunk < trainer_->NumChunks(batch[i]); ++chunk) {
      if (trainer_->KeepChunk(chunk, dropout_seed)) (*sums)[kKeptTokens] += std::min(T, (chunk + 1) * C) - chunk * C;
    }
  }
  return absl::OkStatus();
}

uint64_t TrainingSession::DropoutSeed(int64_t step, size_t index) const {
  return static_cast<uint64_t>(job_.training.seed) * 1000003u + static_cast<uint64_t>(step - 1) * 131u + index;
}

absl::Status TrainingSession::ApplyGradients(double lr) {
  kernels::timeline::Mark("optimizer");
  for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
  if (job_.training.max_grad_norm > 0) ClipGradients(job_.training.max_grad_norm);
  optimizer_->step();
  optimizer_->zero_grad(/*set_to_none=*/true);
  return absl::OkStatus();
}

void TrainingSession::ClipGradients(double max_norm) {
  const kernels::Collectives* group = model_->tensor_parallel();
  if (params_.empty()) return;
  if (group == nullptr) {
    // clip_grad_norm_'s values as PyTorch's foreach path computes them: two multi-tensor kernels
    // and no wait for the device (LibTorch's runs two kernels per parameter and reads the norm).
    std::vector<at::Tensor> grads;
    for (const at::Tensor& p : params_) {
      if (p.grad().defined()) grads.push_back(p.grad());
    }
    if (grads.empty()) return;
    const at::Tensor norm = at::linalg_vector_norm(at::stack(at::_foreach_norm(grads, 2)), 2);
    at::_foreach_mul_(grads, at::clamp_max(max_norm / (norm + 1e-6), 1.0));
    return;
  }
  // As clip_grad_norm_: the coefficient max_norm / (norm + 1e-6), applied where it is below 1.
  at::Tensor split = at::zeros({1}, params_.front().options().dtype(at::kDouble)), replicated = split.clone();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].grad().defined()) continue;
    (split_params_[i] ? split : replicated).add_(params_[i].grad().norm().to(at::kDouble).square());
  }
  group->AllReduce(split, kernels::ReduceOp::kSum);
  const double coef = max_norm / (std::sqrt((split + replicated).item<double>()) + 1e-6);
  if (coef >= 1.0) return;
  for (const at::Tensor& p : params_) {
    if (p.grad().defined()) p.grad().mul_(coef);
  }
}

void TrainingSession::CountOncePerGroup(std::vector<double>* sums, std::initializer_list<size_t> fields) const {
  if (model_->tensor_parallel_rank() == 0) return;
  for (const size_t f : fields) (*sums)[f] = 0;
}

void TrainingSession::Measure(const std::vector<TokenSequence>& batch, const std::vector<double>& sums,
                              const TrainerMemory& peak, double seconds, StepReport* report) const {
  const ModelConfig& c = model_->config();
  // N of 6 N T: the weights a token computes with (a mixture of experts' routed ones only).
  const double N = static_cast<double>(model_->spec().ActiveParameterCount(c));
  double flops = 0;
  int64_t tokens = 0;
  for (const TokenSequence& s : batch) {
    tokens += s.size();
    flops += model_->spec().TrainingFlops(c, s.size());
  }
  if (job_.sparse.has_value()) {
    report->attention_density = sums[kPastPages] > 0 ? sums[kSelectedPages] / sums[kPastPages] : 1.0;
    flops = 6.0 * N * static_cast<double>(tokens) + 12.0 * static_cast<double>(c.head_dim) * sums[kAttendedPairs];
  }
  // SpaCO: the backward (4 of the 6) of the kept tokens only.
  if (job_.chunk_fraction < 1.0 && tokens > 0) flops *= (2.0 + 4.0 * sums[kKeptTokens] / tokens) / 6.0;
  report->step_tokens = tokens;
  report->model_flops = flops;
  report->step_seconds = seconds;
  report->tokens_per_second = seconds > 0 ? static_cast<double>(tokens) / seconds : 0;
  report->mfu = ModelFlopsUtilization(flops, seconds, peak_flops_, sync_->world());
  report->peak_device_bytes = PeakDeviceBytes(options_.device, peak);
  report->host_kv_bytes = peak.host_kv_peak_bytes;
  report->swapped_bytes = static_cast<int64_t>(sums[kSwappedBytes]);
  report->swapped_chunks = static_cast<int64_t>(sums[kSwappedChunks]);
  if (pools_.copies != nullptr) {
    report->pcie_h2d_bytes = pools_.copies->bytes_to_device();
    report->pcie_d2h_bytes = pools_.copies->bytes_to_host();
  }
}

absl::StatusOr<double> TrainingSession::Evaluate(const std::vector<TokenSequence>& sequences) {
  std::vector<double> sums = {0, 0};  // loss, label tokens
  absl::Status local = Guarded([&]() -> absl::Status {
    for (size_t i = 0; i < sequences.size(); ++i) {
      if (!sync_->Owns(static_cast<int64_t>(i))) continue;
      OOMB_ASSIGN_OR_RETURN(SequenceLoss l, trainer_->EvalSequence(sequences[i]));
      sums[0] += l.loss_sum;
      sums[1] += static_cast<double>(l.label_tokens);
    }
    return absl::OkStatus();
  });
  if (absl::IsCancelled(local)) local = absl::OkStatus();  // the stop is seen by every rank next
  CountOncePerGroup(&sums, {0, 1});
  OOMB_RETURN_IF_ERROR(sync_->Agree(local, &sums));
  if (sync_->stopping()) return 0.0;
  return sums[1] > 0 ? sums[0] / sums[1] : 0.0;
}

}  // namespace oomb
