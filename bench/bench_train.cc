// Training-step benchmark of the chunk-recurrent trainer on one GPU (or the CPU), on a model
// with random weights of a given architecture (memory and speed do not depend on the values).
//
// For each sequence length: one optimizer step (stage 1 + stage 2 + AdamW) after a warm-up step
// on the first three chunks, timed with device synchronisation. Three chunks, so that the past's
// attention kernels run in the warm-up at the sparse budget's full width (64 pages of 128 after
// 8192 tokens): on a freshly started machine their first use took about 1.7 s more (likely
// one-time compilation, not shown directly), inside the measured step when the warm-up was one
// chunk (no past; the deferred-selection run in bench/results). Prints one JSON line per
// length:
//   {"S", "s_per_step", "tok_s", "peak_bytes", "kv_bytes", "model_tflops", "mfu", "planned_peak_bytes",
//    "planned_over_measured"} or {"S", "oom": true}
// planned_peak_bytes is the memory planner's prediction (worker/plan/memory_planner.h) for the
// same model, method, chunk, page and length: the check of its 10% promise.
// MFU as oomb reports it everywhere (worker/metrics/flops.h): model FLOPs / step time / the
// device's datasheet dense bf16 peak (989.4 TFLOP/s on an H100 SXM or H200; "peak_bf16_tflops" in
// the first line; no MFU on a device the table does not list), with model FLOPs = 6 N T + 12 d P
// (N active parameters of the base model, d = heads * head_dim, P the causal query-key pairs
// summed over the layers; the recomputation is not counted). With LoRA that counts the frozen
// base as if trained, as peers report; "mfu_4n" beside it counts 4 N T + 12 d P (no weight
// gradients for the frozen base). The first line's "matmul_bf16_tflops" is an 8192^3 bf16 matmul
// rate measured at the start of the run: a measurement of the machine, not a peak; no figure
// divides by it.
// --tensor N (CUDA): tensor parallelism over GPUs 0..N-1 (worker/model/tensor_parallel.h), one
// thread a rank over NCCL; the planner plans a rank (parallel.tensor N), memory figures are rank
// 0's, MFU divides by N GPUs' datasheet peak, and --sections shows the collectives' time
// ("tensor_parallel.sum", "tensor_parallel.vocab", "tensor_parallel.gradients").
// --grad-check T: LoRA gradients of a bfloat16 run against a float32 run of the same weights
// (the chunked trainer is exact, so the float32 run is the float32 reference), reported as
// cosine similarity and relative error; and against the same bfloat16 run with --swap the other
// way ("swap_vs_recompute": stage 2 replaying stage 1's attention results, or recomputing them).
//
// --sparse-budget B: page-level sparse attention (page_budget B, sink 1, local 4, --selection
// mean_key | min_max); model FLOPs then count the attention's query-key pairs attended, and the
// line carries the attention's density (pages attended / past pages).
//
// --kv-grad-dtype float32 | bfloat16 | auto: the KV-gradient pages' storage (auto: the planner's
// choice, as memory.kv_grad_dtype auto; each line says which: "planned_kv_grad_dtype"; the grad
// check's float32 reference keeps float32 pages).
// --swap on | off: memory.swap_attention (worker/train/attention_swap.h); the line carries the
// bytes and chunks the step swapped and the plan's ("planned_swap_bytes", "planned_swap_chunks").
// Every line also says in how many sparse layers the plan recomputes the experts' gate_up
// product ("planned_expert_recompute_layers", MemoryPlan::expert_recompute_layers).
// --kv-offload none | auto | host: where the pages go, as the job spec's memory.kv_offload, placed
// by the memory planner for this machine (device and host memory). The line then carries the
// pages on each tier, the pinned host bytes, the bytes the copy engine moved each way in the
// step, the planner's host peak and its longest context, and how long the step waited for the
// host slabs to be pinned after the warm-up (not part of the step).
// --sections: the measured step's GPU time split by section ("sections_s": the sparse
// attention's gather, kernels, merge, gradient accumulation, selection, ...; "model" is the
// rest), from events on the stream (kernels/torch/gpu_timeline.h); the events cost a little.
// Each section also appears per stage of the trainer, as "stage1/<section>" and "stage2/<section>".
// "sections_host_s" splits the host's wall clock between the same marks: a section whose host
// time is about its GPU time is set by the host; one much longer had the host waiting.
// --kernel-profile N: the measured step under LibTorch's profiler (Kineto, CUPTI): "gpu_busy_s",
// the time some GPU kernel or copy ran (the union of their intervals over every stream), and
// "gpu_kernels", the N kernels with the most GPU time, by name (total seconds, launches). The
// tracing costs some host time a launch.
// --attention-kernel cudnn | flash: the GPU attention's fused kernel, dense and sparse
// (kernels/torch/fused_attention.h, GpuAttentionKernel).
// --kernel-trace S:START:SECONDS (repeatable; CUDA): of the measured step at length S, every
// kernel and copy that ran from START seconds after the step began, for SECONDS, written to
// --kernel-trace-dir as trace_S.tsv (bench/kernel_trace.h; bench/kernel_trace.py summarizes).
// --chunk-fraction p: SpaCO (backward.chunk_fraction; worker/train/chunk_trainer.h): stage 2
// backpropagates each chunk with probability p. The line then carries the chunks kept, and model
// FLOPs count the backward of the kept tokens only: (2 T + 4 T_kept) / (6 T) of the exact count.
//
// --fit-check K: for lengths whose whole step takes too long to time (1M tokens dense: about
// 30 minutes on an H100), stage 1 of the whole sequence and the first K chunks of stage 2, where
// the device and host peaks are, then a stop (no optimizer step); the line's "fit_check" holds
// stage 1's seconds and rate, stage 2's chunk seconds and the measured host bytes (host-tier
// pages at their peak plus the swap's records), beside the plan's peaks.
//
// --estimate: before the model is built, the rates EstimateJob multiplies the work by
// (worker/job/calibration.h; one line per chunk size), and on each length's line the step time it
// predicts from them ("estimated_s_per_step", worker/plan/step_time.h) over the measured one
// ("estimated_over_measured").
//
// --device-mib N: the planner plans for a GPU of N MiB and the caching allocator is capped at it,
// so a larger GPU reproduces a smaller one's plan and fit (an H100's on an H200).
//
// --lengths takes "max" beside numbers: the memory planner's longest context for the configuration
// on this machine (what the planned_max_seq_len field reports), so a call need not know it.
//
// Usage: bench_train --model qwen2.5-7b|qwen3-8b|mistral-7b|gemma-3-12b[-global] --lengths 16384 65536 131072 [--chunk
// 4096] [--page 128]
//                    [--full] [--grad-check 65536] [--sparse-budget 64] [--kv-offload auto]
//                    [--attention-kernel cudnn] [--device cuda]
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#if defined(OOMB_HAVE_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "kernels/torch/gpu_timeline.h"
#if defined(OOMB_HAVE_CUDA)
#include "bench/kernel_trace.h"
#endif
#include "worker/common/status.h"
#include "worker/hf/family.h"
#include "worker/job/build_info.h"
#include "worker/job/calibration.h"
#include "worker/kv/copy_engine.h"
#include "worker/kv/kv_pools.h"
#include "worker/metrics/flops.h"
#include "worker/model/transformer.h"
#include "worker/plan/memory_planner.h"
#include "worker/plan/step_time.h"
#include "worker/session/training_session.h"
#include "worker/train/chunk_trainer.h"
#include "worker/train/rank_group.h"

namespace oomb {
namespace {

void Sync(const at::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize(d.index());
}

int64_t PeakBytes(const at::Device& d) {
#if defined(OOMB_HAVE_CUDA)
  if (d.is_cuda()) {
    const auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(d.index());
    return s.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
  }
#endif
  return 0;
}

// The caching allocator's counts of what costs the host time (and, for retries and syncs of
// every stream, the device's queue): retries after a failed allocation, which free cached
// blocks, syncs of all streams, and segments mapped and unmapped.
nlohmann::json AllocatorCounts(const at::Device& d) {
  nlohmann::json j = nlohmann::json::object();
#if defined(OOMB_HAVE_CUDA)
  if (d.is_cuda()) {
    const auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(d.index());
    j = {{"alloc_retries", s.num_alloc_retries},
         {"sync_all_streams", s.num_sync_all_streams},
         {"device_allocs", s.num_device_alloc},
         {"device_frees", s.num_device_free}};
  }
#endif
  return j;
}

void ResetPeak(const at::Device& d) {
#if defined(OOMB_HAVE_CUDA)
  if (d.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(d.index());
#endif
}

void EmptyCache(const at::Device& d) {
#if defined(OOMB_HAVE_CUDA)
  if (d.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

// The name CUDA reports for the device ("NVIDIA H100 80GB HBM3"); "cpu" for the CPU.
std::string DeviceName(const at::Device& d) {
#if defined(OOMB_HAVE_CUDA)
  if (d.is_cuda()) return at::cuda::getDeviceProperties(d.index())->name;
#endif
  return "cpu";
}

// bf16 matmul rate (TFLOP/s) on random 8192^3 products, median of 20.
double MatmulTflops(const at::Device& d) {
  const int64_t n = 8192;
  const auto opts = at::TensorOptions().dtype(at::kBFloat16).device(d);
  const at::Tensor a = at::randn({n, n}, opts), b = at::randn({n, n}, opts);
  for (int i = 0; i < 3; ++i) (void)at::matmul(a, b);
  std::vector<double> t;
  for (int i = 0; i < 20; ++i) {
    Sync(d);
    const auto s = std::chrono::steady_clock::now();
    (void)at::matmul(a, b);
    Sync(d);
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count());
  }
  std::sort(t.begin(), t.end());
  return 2.0 * n * n * n / t[t.size() / 2] / 1e12;
}

TokenSequence RandomSequence(int64_t T, int64_t vocab, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const at::Tensor ids = at::randint(0, vocab, {T}, gen, at::kLong);
  return TokenSequence::FromDocument(std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + T));
}

// Waits until the session's host slabs are pinned; the seconds waited.
double WaitForHost(const TrainingSession& session) {
  const auto start = std::chrono::steady_clock::now();
  for (const PagePool* p : session.pools().all()) {
    while (p->ready_pages() < p->stats().capacity_pages) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The job spec the benchmark's configuration amounts to, for the memory planner.
struct BenchSpec {
  bool full = false;
  int64_t rank = 16, chunk = 4096, page = 128, sparse_budget = 0;
  double chunk_fraction = 1.0;
  std::string selection = "mean_key", offload = "none", kv_grad_dtype = "float32", attention_kernel = "cudnn";
  bool swap = true;        // memory.swap_attention
  int64_t device_mib = 0;  // --device-mib: plan for a device of this size (0: this device's)
  int tensor = 1;          // --tensor: parallel.tensor over the GPUs 0..tensor-1
  // The machine the planner plans for: this one, its device memory replaced by --device-mib's.
  PlanTarget Machine(const at::Device& d) const {
    PlanTarget target = ThisMachine(d.is_cuda() ? "cuda:0" : "cpu");
    if (device_mib > 0) target.device_bytes = device_mib << 20;
    return target;
  }
  kernels::GpuAttentionKernel AttentionKernel() const {
    return attention_kernel == "flash" ? kernels::GpuAttentionKernel::kFlash : kernels::GpuAttentionKernel::kCudnn;
  }
  JobConfig At(int64_t T) const {
    JobConfig job;
    job.model.dtype = ModelDtype::kBFloat16;
    job.method.type = full ? TrainMethod::kFull : TrainMethod::kLora;
    job.method.lora.rank = static_cast<int32_t>(rank);
    job.memory.chunk_tokens = chunk;
    job.memory.page_tokens = page;
    job.memory.kv_offload = offload == "host"   ? KvOffload::kHost
                            : offload == "auto" ? KvOffload::kAuto
                                                : KvOffload::kNone;
    job.memory.kv_grad_dtype = kv_grad_dtype == "bfloat16" ? KvGradDtype::kBFloat16
                               : kv_grad_dtype == "auto"   ? KvGradDtype::kAuto
                                                           : KvGradDtype::kFloat32;
    job.memory.swap_attention = swap;
    job.data.max_seq_len = T;
    job.chunk_fraction = chunk_fraction;
    job.parallel.tensor = tensor;
    job.resources.gpus = tensor;
    if (sparse_budget > 0) {
      job.sparse =
          JobConfig::Sparse{.page_budget = sparse_budget,
                            .sink_pages = 1,
                            .local_pages = 4,
                            .selection = selection == "min_max" ? PageSummaryKind::kMinMax : PageSummaryKind::kMeanKey};
    }
    return job;
  }
};

// --tensor: what a rank's session agrees with the others: the partial gradients summed in the
// group (as the executor's run does), MFU over the group's GPUs.
class TensorParallelSync final : public StepSync {
 public:
  TensorParallelSync(const Transformer& m, RankGroup& group) : m_(m), group_(group) {}
  int world() const override { return group_.size(); }
  absl::Status AllReduceGradients(const std::vector<at::Tensor>&) override {
    kernels::timeline::Mark("tensor_parallel.gradients");
    absl::Status s = group_.AllReduceGradients(m_.PartialGradients());
    kernels::timeline::Mark("optimizer");
    return s;
  }

 private:
  const Transformer& m_;
  RankGroup& group_;
};
thread_local StepSync* tensor_parallel_sync = nullptr;  // the rank thread's, under --tensor

// A session (plan, pools, trainer, AdamW) for sequences of T tokens on `m`.
absl::StatusOr<std::unique_ptr<TrainingSession>> MakeSession(Transformer& m, int64_t T, const BenchSpec& b,
                                                             at::Device d, std::function<bool()> should_stop = {}) {
  SessionOptions o;
  o.sync = tensor_parallel_sync;
  o.should_stop = std::move(should_stop);
  o.device = d;
  o.machine = b.Machine(d);
  o.longest_sequence = T;
  o.attention_kernel = b.AttentionKernel();
  return TrainingSession::Create(&m, b.At(T), std::move(o));
}

// A --lengths entry: a number of tokens, or "max", the planner's longest context for this
// configuration on this machine (its answer does not depend on the length planned for).
absl::StatusOr<int64_t> ResolveLength(const std::string& length, const ModelConfig& c, const BenchSpec& b,
                                      at::Device d) {
  if (length == "max") {
    OOMB_ASSIGN_OR_RETURN(const MemoryPlan plan,
                          PlanMemory(c, b.At(b.chunk > 0 ? b.chunk : kAutoChunkMax), b.Machine(d)));
    if (plan.max_seq_len_that_fits <= 0) return absl::ResourceExhaustedError(plan.limit);
    return plan.max_seq_len_that_fits;
  }
  int64_t tokens = 0;
  if (!absl::SimpleAtoi(length, &tokens) || tokens <= 0) {
    return absl::InvalidArgumentError("expected a positive number of tokens or \"max\"");
  }
  return tokens;
}

// --plan-only DEVICE_MIB:HOST_MIB: the planner's answer for each length on such a machine, one
// JSON line each; "max" gives the longest context. Exit status 2 for a malformed argument.
int PrintPlans(const std::string& model, const ModelConfig& c, const BenchSpec& b, const std::string& machine,
               const std::vector<std::string>& lengths) {
  int64_t device_mib = 0, host_mib = 0;
  if (std::sscanf(machine.c_str(), "%ld:%ld", &device_mib, &host_mib) != 2 || device_mib <= 0 || host_mib <= 0) {
    std::cerr << "--plan-only " << machine << ": expected DEVICE_MIB:HOST_MIB, e.g. 81559:128299" << std::endl;
    return 2;
  }
  const PlanTarget target{.device = "cuda:0", .device_bytes = device_mib << 20, .host_bytes = host_mib << 20};
  for (const std::string& length : lengths) {
    int64_t T = b.chunk > 0 ? b.chunk : kAutoChunkMax;
    if (length != "max" && (!absl::SimpleAtoi(length, &T) || T <= 0)) {
      std::cerr << "--lengths " << length << ": expected a positive number of tokens or \"max\"" << std::endl;
      return 2;
    }
    absl::StatusOr<MemoryPlan> plan = PlanMemory(c, b.At(T), target);
    if (plan.ok() && length == "max" && plan->max_seq_len_that_fits > 0) {
      T = plan->max_seq_len_that_fits;
      plan = PlanMemory(c, b.At(T), target);
    }
    if (!plan.ok()) {
      std::cerr << model << " " << length << ": " << plan.status().message() << std::endl;
      return 1;
    }
    std::cout << nlohmann::json{{"model", model},
                                {"S", T},
                                {"device_mib", device_mib},
                                {"host_mib", host_mib},
                                {"fits", plan->fits},
                                {"chunk", plan->chunk_tokens},
                                {"planned_kv_grad_dtype", KvGradDtypeName(plan->kv_grad_dtype)},
                                {"planned_swap_chunks", plan->swap_chunks},
                                {"planned_expert_recompute_layers", plan->expert_recompute_layers},
                                {"planned_peak_bytes", plan->peak_device_bytes},
                                {"planned_host_bytes", plan->peak_host_bytes},
                                {"kv_bytes_per_token", plan->kv_bytes_per_token},
                                {"planned_max_seq_len", plan->max_seq_len_that_fits}}
                     .dump()
              << std::endl;
  }
  return 0;
}

// --kernel-profile: the GPU side of a profiled run (see the header).
nlohmann::json GpuProfile(const torch::autograd::profiler::ProfilerResult& result, size_t top) {
  std::map<std::string, std::pair<double, int64_t>> by_name;  // seconds, launches
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& e : result.events()) {
    if (e.deviceType() != c10::DeviceType::CUDA || e.endNs() <= e.startNs()) continue;
    auto& [sec, n] = by_name[e.name().substr(0, 160)];
    sec += static_cast<double>(e.durationNs()) * 1e-9;
    ++n;
    spans.emplace_back(e.startNs(), e.endNs());
  }
  std::sort(spans.begin(), spans.end());
  uint64_t busy = 0, end = 0;
  for (const auto& [b, e] : spans) {
    if (e <= end) continue;
    busy += e - std::max(b, end);
    end = e;
  }
  std::vector<std::pair<std::string, std::pair<double, int64_t>>> rows(by_name.begin(), by_name.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  nlohmann::json kernels = nlohmann::json::array();
  double total = 0;
  for (const auto& r : rows) total += r.second.first;
  for (size_t i = 0; i < std::min(top, rows.size()); ++i) {
    kernels.push_back({{"name", rows[i].first}, {"s", rows[i].second.first}, {"launches", rows[i].second.second}});
  }
  return {{"gpu_busy_s", static_cast<double>(busy) * 1e-9}, {"gpu_kernel_sum_s", total}, {"gpu_kernels", kernels}};
}

// Runs `step` under the profiler (CUDA activities) and returns its GPU side.
template <typename Fn>
nlohmann::json Profiled(Fn step, size_t top) {
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  const prof::ProfilerConfig config(prof::ProfilerState::KINETO);
  const std::set<ActivityType> activities = {ActivityType::CUDA};
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  step();
  return GpuProfile(*prof::disableProfiler(), top);
}

struct StepResult {
  double seconds = 0;
  StepReport report;
  int64_t chunks = 0, chunks_kept = 0;  // stage 2's (SpaCO)
  TrainerMemory memory;
  std::map<std::string, double> sections;       // --sections: GPU seconds per section
  std::map<std::string, double> host_sections;  // and host seconds between the same marks
};

// One optimizer step on a sequence of T tokens, timed with device synchronisation (`sections`:
// its GPU timeline by section).
absl::StatusOr<StepResult> Step(TrainingSession& session, int64_t T, at::Device d, bool sections = false) {
  const TokenSequence seq = RandomSequence(T, session.model().config().vocab_size, 1);
  Sync(d);
  kernels::timeline::Enable(sections);
  const auto s = std::chrono::steady_clock::now();
  auto report = session.Step({seq}, /*step=*/1, /*lr=*/1e-5);
  if (!report.ok()) return report.status();
  Sync(d);
  StepResult r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
  r.report = *report;
  r.memory = session.trainer().memory();
  r.sections = kernels::timeline::Collect(&r.host_sections);
  kernels::timeline::Enable(false);
  r.chunks = session.trainer().NumChunks(seq);
  for (int64_t i = 0; i < r.chunks; ++i) r.chunks_kept += session.trainer().KeepChunk(i, session.DropoutSeed(1, 0));
  return r;
}

std::map<std::string, at::Tensor> LoraGrads(Transformer& m, int64_t T, BenchSpec b, at::Device d) {
  std::map<std::string, at::Tensor> g;
  b.sparse_budget = 0;  // dense: the float32 reference has no fused path
  auto session = MakeSession(m, T, b, d);
  if (!session.ok()) return g;
  const TokenSequence seq = RandomSequence(T, m.config().vocab_size, 2);
  auto loss = (*session)->trainer().TrainSequence(seq, 1.0 / static_cast<double>(seq.label_tokens()), 0);
  if (!loss.ok()) {
    std::cerr << "grad check: " << loss.status() << "\n";
    return g;
  }
  for (auto& [name, p] : m.TrainableParameters()) {
    g[name] = p.grad().to(at::kCPU, at::kDouble);
    p.mutable_grad().reset();
  }
  return g;
}

// Cosine similarity and relative error ||got - want|| / ||want|| over the gradients `want` has.
nlohmann::json CompareGrads(const std::map<std::string, at::Tensor>& got,
                            const std::map<std::string, at::Tensor>& want) {
  double dot = 0, n_got = 0, n_want = 0, diff = 0;
  for (const auto& [name, a] : want) {
    if (!got.count(name)) continue;
    const at::Tensor& b = got.at(name);
    dot += (a * b).sum().item<double>();
    n_got += (b * b).sum().item<double>();
    n_want += (a * a).sum().item<double>();
    diff += ((a - b) * (a - b)).sum().item<double>();
  }
  return {{"cosine", dot / std::sqrt(n_got * n_want)}, {"relative_error", std::sqrt(diff / n_want)}};
}

// How a length is measured, beyond the configuration (see the header's flags).
struct Measurement {
  bool sections = false;
  int64_t kernel_profile = 0;
  std::map<int64_t, std::pair<double, double>> trace_windows;  // length -> (start, seconds)
  std::string kernel_trace_dir = ".";
  double peak_flops = 0;  // the device's datasheet dense bf16 peak (PeakDenseBf16Flops); 0: no MFU
  // LoRA: the base's active parameters (ModelSpec::ActiveParameterCount), frozen, for "mfu_4n";
  // 0 in full fine-tuning.
  double frozen_parameters = 0;
  int64_t fit_check = 0;  // --fit-check K: stage 1 and K chunks of stage 2 instead of a step
  // --estimate: the rates EstimateJob's step time would use (worker/job/calibration.h), measured
  // before the model is built, by chunk size.
  std::map<int64_t, EngineRates> rates;
};

// Runs the measured step under what `how` asks for (profiler, kernel trace, or nothing).
absl::StatusOr<StepResult> MeasuredStep(TrainingSession& session, int64_t T, const Measurement& how, at::Device d,
                                        nlohmann::json& r) {
  absl::StatusOr<StepResult> step;
  const auto run = [&] { step = Step(session, T, d, how.sections); };
  if (how.kernel_profile > 0) {
    r.update(Profiled(run, static_cast<size_t>(how.kernel_profile)));
  } else if (const auto w = how.trace_windows.find(T); w != how.trace_windows.end()) {
#if defined(OOMB_HAVE_CUDA)
    const KernelTrace trace(how.kernel_trace_dir + "/trace_" + std::to_string(T) + ".tsv", w->second.first,
                            w->second.second);
#else
    std::cerr << "--kernel-trace: a CUDA build only" << std::endl;
#endif
    run();
  } else {
    run();
  }
  return step;
}

// The plan's placement and predictions, beside what was measured.
void AddPlan(const MemoryPlan& plan, at::Device d, nlohmann::json& r) {
  r["kv_pool_bytes"] = plan.kv_device_bytes;
  r["kv_device_pages"] = plan.device_kv_pages;
  r["kv_host_pages"] = plan.host_kv_pages;
  r["kv_grad_device_pages"] = plan.device_grad_pages;
  r["kv_grad_host_pages"] = plan.host_grad_pages;
  r["host_pinned_bytes"] = plan.kv_host_bytes;
  r["planned_peak_bytes"] = plan.peak_device_bytes;
  r["planned_over_measured"] = static_cast<double>(plan.peak_device_bytes) / PeakBytes(d);
  r["planned_host_bytes"] = plan.peak_host_bytes;
  r["planned_max_seq_len"] = plan.max_seq_len_that_fits;
  r["chunk"] = plan.chunk_tokens;
  r["planned_kv_grad_dtype"] = KvGradDtypeName(plan.kv_grad_dtype);
  r["planned_swap_bytes"] = plan.swap_bytes;
  r["planned_swap_chunks"] = plan.swap_chunks;
  r["planned_expert_recompute_layers"] = plan.expert_recompute_layers;
}

// --estimate: EstimateJob's step time for this step (worker/plan/step_time.h) beside the measured one.
void AddEstimate(const ModelConfig& c, const JobConfig& job, const MemoryPlan& plan, const Measurement& how,
                 const StepResult& step, nlohmann::json& r) {
  const auto rates = how.rates.find(StepChunkTokens(plan));
  if (rates == how.rates.end()) return;
  const absl::StatusOr<StepTime> t = EstimateStepTime(c, job, plan, rates->second);
  if (!t.ok()) {
    r["estimated"] = std::string(t.status().message());
    return;
  }
  r["estimated_s_per_step"] = t->seconds;
  r["estimated_attention_s"] = t->attention_s;
  r["estimated_host_copy_s"] = t->host_copy_s;
  r["estimated_over_measured"] = t->seconds / step.seconds;
}

// The step's numbers: time, rate, memory, traffic, model FLOPs (the session's count: sparse, the
// query-key pairs attended; SpaCO, the backward of the kept tokens only).
void AddStep(const StepResult& step, int64_t T, const BenchSpec& bench, const Measurement& how, at::Device d,
             nlohmann::json& r) {
  const double s = step.seconds;
  r["s_per_step"] = s;
  if (how.sections) {
    r["sections_s"] = step.sections;
    r["sections_host_s"] = step.host_sections;
  }
  r["tok_s"] = T / s;
  if (bench.chunk_fraction < 1) {
    r["chunks"] = step.chunks;
    r["chunks_kept"] = step.chunks_kept;
  }
  if (step.report.attention_density > 0) r["attention_density"] = step.report.attention_density;
  r["peak_bytes"] = PeakBytes(d);
  r["host_kv_peak_bytes"] = step.memory.host_kv_peak_bytes;
  r["h2d_bytes"] = step.memory.bytes_to_device;
  r["d2h_bytes"] = step.memory.bytes_to_host;
  r["swapped_bytes"] = step.report.swapped_bytes;
  r["swapped_chunks"] = step.report.swapped_chunks;
  const double flops = step.report.model_flops;
  r["model_tflops"] = flops / s / 1e12;
  const double mfu = ModelFlopsUtilization(flops, s, how.peak_flops, bench.tensor);
  if (mfu <= 0) return;
  r["mfu"] = mfu;
  if (how.frozen_parameters > 0 && bench.chunk_fraction == 1) {
    const double frozen = FrozenBaseFlops(flops, how.frozen_parameters, static_cast<double>(T));
    r["mfu_4n"] = ModelFlopsUtilization(frozen, s, how.peak_flops, bench.tensor);
  }
}

// Stops a sequence at the trainer's `limit`-th chunk boundary (both stages count; stage 1 of
// dense exact training runs chunks 0..N-2, stage 2 then goes from chunk N-1 down).
struct ChunkLimit {
  int64_t calls = 0;
  int64_t limit = std::numeric_limits<int64_t>::max();
};

// --fit-check K: stage 1 of the whole sequence, then the first K chunks of stage 2 (the
// sequence's last, whose backward gives every past page its gradient page: the peaks), stopped
// there with no optimizer step. The measured device and host peaks beside the plan's, and stage
// 1's rate.
void FitCheck(TrainingSession& session, int64_t T, int64_t k, ChunkLimit& stop, at::Device d, nlohmann::json& r) {
  ChunkTrainer& trainer = session.trainer();
  const TokenSequence seq = RandomSequence(T, session.model().config().vocab_size, 1);
  const int64_t n = trainer.NumChunks(seq), C = session.plan().chunk_tokens;
  stop.calls = 0;
  stop.limit = n - 1 + k;
  Sync(d);
  const auto start = std::chrono::steady_clock::now();
  const absl::StatusOr<SequenceLoss> loss = trainer.TrainSequence(seq, 1.0 / static_cast<double>(T), 0);
  Sync(d);
  stop.limit = std::numeric_limits<int64_t>::max();
  if (!loss.ok() && !absl::IsCancelled(loss.status())) throw std::runtime_error(std::string(loss.status().message()));
  const ChunkTimes& times = trainer.chunk_times();
  double stage1 = 0;
  for (const double t : times.forward) stage1 += t;
  const TrainerMemory& mem = trainer.memory();
  r["fit_check"] = {{"stage2_chunks", times.backward.size()},
                    {"wall_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()},
                    {"stage1_s", stage1},
                    {"stage1_tok_s", stage1 > 0 ? static_cast<double>(std::min(T, (n - 1) * C)) / stage1 : 0},
                    {"stage2_chunk_s", times.backward},
                    {"swapped_bytes", mem.swapped_bytes},
                    {"measured_host_bytes", mem.host_kv_peak_bytes + mem.swap_host_bytes}};
  r["peak_bytes"] = PeakBytes(d);
  r["host_kv_peak_bytes"] = mem.host_kv_peak_bytes;
}

// One length: a session for it, the warm-up step, the measured step; one JSON line.
nlohmann::json MeasureLength(Transformer& m, int64_t T, const BenchSpec& bench, const Measurement& how, at::Device d) {
  nlohmann::json r = {{"S", T}};
  try {
    EmptyCache(d);
    auto stop = std::make_shared<ChunkLimit>();
    auto session = MakeSession(m, T, bench, d, [stop] { return ++stop->calls >= stop->limit; });
    if (!session.ok()) throw std::runtime_error(std::string(session.status().message()));
    auto warm = Step(**session, std::min<int64_t>(T, 3 * (*session)->plan().chunk_tokens), d);  // kernels, allocator
    if (!warm.ok()) throw std::runtime_error(std::string(warm.status().message()));
    r["host_pin_wait_s"] = WaitForHost(**session);  // pinning is not part of a step
    ResetPeak(d);
    if (how.fit_check > 0) {
      FitCheck(**session, T, how.fit_check, *stop, d, r);
      AddPlan((*session)->plan(), d, r);
      for (auto& [name, p] : m.TrainableParameters()) p.mutable_grad().reset();
      return r;
    }
    CopyEngine* copies = (*session)->pools().copies.get();
    // The copy engine's batches by way and kind: bytes, and the seconds their copies ran on
    // their streams (CUDA events around each; queueing behind earlier batches excluded).
    std::map<std::string, std::pair<int64_t, double>> transfers;
    if (copies != nullptr) {
      copies->set_observer([&transfers](TransferDirection dir, PageKind kind, int64_t bytes, double seconds) {
        auto& [b, t] = transfers[std::string(DirectionName(dir)) + "_" + KindName(kind)];
        b += bytes;
        t += seconds;
      });
    }
    const double add_wait_s = copies != nullptr ? copies->add_wait_seconds() : 0;
    const nlohmann::json allocator_before = AllocatorCounts(d);
    const absl::StatusOr<StepResult> step = MeasuredStep(**session, T, how, d, r);
    if (!step.ok()) throw std::runtime_error(std::string(step.status().message()));
    AddStep(*step, T, bench, how, d, r);
    nlohmann::json allocator = AllocatorCounts(d);
    for (auto& [name, count] : allocator.items()) count = count.get<int64_t>() - allocator_before[name].get<int64_t>();
    if (!allocator.empty()) r["allocator"] = allocator;
    AddPlan((*session)->plan(), d, r);
    AddEstimate(m.config(), bench.At(T), (*session)->plan(), how, *step, r);
    if (copies != nullptr) {
      r["add_wait_s"] = copies->add_wait_seconds() - add_wait_s;
      copies->Fence();  // the last batches' durations
      copies->set_observer(nullptr);
      for (const auto& [name, bt] : transfers) {
        r["transfers"][name] = {{"bytes", bt.first}, {"busy_s", bt.second}, {"gb_s", bt.first / bt.second / 1e9}};
      }
    }
  } catch (const std::exception& e) {
    r["oom"] = true;
    r["error"] = std::string(e.what()).substr(0, 300);
  }
  for (auto& [name, p] : m.TrainableParameters()) p.mutable_grad().reset();
  return r;
}

int Main(int argc, char** argv) {
  CLI::App app{"oomb training-step benchmark"};
  std::string model = "qwen2.5-7b", device = "cuda";
  std::vector<std::string> lengths = {"16384"};
  int64_t chunk = 4096, page = 128, rank = 16, grad_check = 0, kernel_profile = 0;
  double chunk_fraction = 1.0;
  bool full = false;
  bool estimate = false;
  bool sections = false;
  int64_t sparse_budget = 0;
  std::string selection = "mean_key", offload = "none", kv_grad_dtype = "float32", attention_kernel = "cudnn";
  std::string swap = "on", experts = "auto";
  app.add_option("--model", model, "a model preset (worker/hf/families/): " + absl::StrJoin(PresetNames(), " | "))
      ->check(CLI::IsMember(PresetNames()));
  app.add_option("--sparse-budget", sparse_budget, "page-level sparse attention with this page_budget (0: dense)");
  app.add_option("--selection", selection, "sparse page summaries: mean_key | min_max");
  app.add_option("--kv-offload", offload,
                 "page placement, as memory.kv_offload: none (every page on the device) | auto (what fits on "
                 "the device, the rest in pinned host memory) | host (every page in pinned host memory)");
  app.add_option("--kv-grad-dtype", kv_grad_dtype,
                 "KV-gradient page storage, as memory.kv_grad_dtype: float32 | bfloat16 | auto (the planner's choice)")
      ->check(CLI::IsMember({"float32", "bfloat16", "auto"}));
  app.add_option("--swap", swap,
                 "memory.swap_attention: on (stage 2 reads back the attention results of the chunks the planner "
                 "swaps) | off (stage 2 recomputes every attention forward)")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--attention-kernel", attention_kernel,
                 "the GPU attention's fused kernel: cudnn (flash where cuDNN's does not apply) | flash")
      ->check(CLI::IsMember({"cudnn", "flash"}));
  app.add_option("--experts", experts,
                 "a mixture of experts' kernel (ExpertKernel): auto (grouped GEMMs on a GPU of compute capability 9.0 "
                 "or more) | grouped | loop")
      ->check(CLI::IsMember({"auto", "grouped", "loop"}));
  app.add_option("--lengths", lengths,
                 "sequence lengths; \"max\": the memory planner's longest context on this machine for this "
                 "configuration");
  app.add_option("--chunk-fraction", chunk_fraction, "SpaCO: stage 2 backpropagates each chunk with this probability")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--chunk", chunk, "memory.chunk_tokens (0: auto, the planner's choice; each line says which)");
  app.add_option("--page", page);
  app.add_option("--lora-rank", rank);
  app.add_flag("--full", full, "full fine-tuning instead of LoRA");
  app.add_flag("--estimate", estimate,
               "also EstimateJob's step time (the device's rates measured first, as the daemon measures them)");
  app.add_flag("--sections", sections, "also the measured step's GPU time by section (kernels/torch/gpu_timeline.h)");
  app.add_option("--grad-check", grad_check, "length of the bf16-vs-fp32 LoRA gradient check (0: none)");
  app.add_option("--device", device, "cuda | cpu");
  app.add_option("--kernel-profile", kernel_profile,
                 "also the measured step's GPU busy time and its N costliest kernels (profiled)");
  std::vector<std::string> kernel_traces;
  std::string kernel_trace_dir = ".";
  app.add_option("--kernel-trace", kernel_traces,
                 "S:START:SECONDS: the kernels and copies of the step at length S from START seconds into it, for "
                 "SECONDS (CUDA)");
  app.add_option("--kernel-trace-dir", kernel_trace_dir, "where --kernel-trace writes trace_S.tsv");
  int64_t fit_check = 0;
  app.add_option("--fit-check", fit_check,
                 "K: instead of a step, stage 1 of the whole sequence and the first K chunks of stage 2 (where the "
                 "peaks are): measured device and host peaks against the plan's, and stage 1's rate");
  int64_t device_mib = 0;
  app.add_option("--device-mib", device_mib,
                 "plan for a GPU of this many MiB instead of this one's, and cap the caching allocator at it "
                 "(a smaller GPU's plan and fit on a larger one, e.g. 81559 for an H100 on an H200)")
      ->check(CLI::PositiveNumber);
  std::string plan_only;
  app.add_option("--plan-only", plan_only,
                 "DEVICE_MIB:HOST_MIB: print the memory planner's plan for each length (and its longest "
                 "context) on a machine of that much device and host memory, and run nothing");
  int tensor = 1;
  app.add_option("--tensor", tensor, "tensor parallelism over GPUs 0..N-1 (CUDA; parallel.tensor N)")
      ->check(CLI::Range(1, 8));
  CLI11_PARSE(app, argc, argv);
  if (tensor > 1 && device == "cpu") {
    std::cerr << "--tensor: GPUs only (the CPU path is tested with Gloo ranks in tests/)" << std::endl;
    return 2;
  }
  // --kernel-trace: length -> (start, seconds).
  std::map<int64_t, std::pair<double, double>> trace_windows;
  for (const std::string& t : kernel_traces) {
    int64_t length = 0;
    double start = 0, seconds = 0;
    if (std::sscanf(t.c_str(), "%ld:%lf:%lf", &length, &start, &seconds) != 3 || seconds <= 0) {
      std::cerr << "--kernel-trace " << t << ": expected LENGTH:START_SECONDS:SECONDS, e.g. 131072:10:2" << std::endl;
      return 2;
    }
    trace_windows[length] = {start, seconds};
  }
#if defined(OOMB_HAVE_CUDA)
  if (!trace_windows.empty() && !KernelTrace::Initialize()) return 1;
#endif

  const at::Device d = device == "cpu" ? at::Device(at::kCPU) : at::Device(at::kCUDA, 0);
  const absl::StatusOr<ModelConfig> preset = PresetConfig(model);
  if (!preset.ok()) {
    std::fprintf(stderr, "bench_train: %s\n", std::string(preset.status().message()).c_str());
    return 2;
  }
  const ModelConfig& config = *preset;
  if (const absl::Status s = CheckTensorParallel(config, tensor); !s.ok()) {
    std::cerr << "--tensor: " << s.message() << std::endl;
    return 2;
  }
  const BenchSpec bench{.full = full,
                        .rank = rank,
                        .chunk = chunk,
                        .page = page,
                        .sparse_budget = sparse_budget,
                        .chunk_fraction = chunk_fraction,
                        .selection = selection,
                        .offload = offload,
                        .kv_grad_dtype = kv_grad_dtype,
                        .attention_kernel = attention_kernel,
                        .swap = swap == "on",
                        .device_mib = device_mib,
                        .tensor = tensor};
  if (!plan_only.empty()) return PrintPlans(model, config, bench, plan_only, lengths);
#if defined(OOMB_HAVE_CUDA)
  if (device_mib > 0 && d.is_cuda()) {
    const double total = static_cast<double>(ThisMachine("cuda:0").device_bytes);
    if (total < static_cast<double>(device_mib << 20)) {
      std::cerr << "--device-mib " << device_mib << ": this GPU has only " << (static_cast<int64_t>(total) >> 20)
                << " MiB" << std::endl;
      return 2;
    }
    at::empty({1}, at::TensorOptions().device(d));  // the allocator's state for the device, to be capped
    c10::cuda::CUDACachingAllocator::setMemoryFraction(static_cast<double>(device_mib << 20) / total, d.index());
  }
#endif
  std::vector<int64_t> tokens;
  for (const std::string& length : lengths) {
    const absl::StatusOr<int64_t> resolved = ResolveLength(length, config, bench, d);
    if (!resolved.ok()) {
      std::cerr << "--lengths " << length << ": " << resolved.status().message() << std::endl;
      return 2;
    }
    tokens.push_back(*resolved);
  }
  const bool sparse = sparse_budget > 0;
  const double matmul_tflops = d.is_cuda() ? MatmulTflops(d) : 0;
  const std::string device_name = DeviceName(d);
  const double peak_flops = PeakDenseBf16Flops(device_name);
  std::map<int64_t, EngineRates> rates;
  for (int64_t T : estimate ? tokens : std::vector<int64_t>{}) {
    const absl::StatusOr<MemoryPlan> plan = PlanMemory(config, bench.At(T), bench.Machine(d));
    if (!plan.ok() || rates.contains(StepChunkTokens(*plan))) continue;
    absl::StatusOr<EngineRates> measured =
        MeasureEngineRates(config, bench.At(T), StepChunkTokens(*plan), d.is_cuda() ? "cuda:0" : "cpu");
    if (!measured.ok()) {
      std::cerr << "--estimate: " << measured.status().message() << std::endl;
      return 1;
    }
    std::cout << nlohmann::json{{"rates_chunk", StepChunkTokens(*plan)},
                                {"layer_forward_s", measured->layer_forward_s},
                                {"layer_train_s", measured->layer_train_s},
                                {"head_train_s", measured->head_train_s},
                                {"past_forward_s_per_pair", measured->past_forward_s_per_pair},
                                {"past_backward_s_per_pair", measured->past_backward_s_per_pair},
                                {"host_copy_bytes_per_s", measured->host_copy_bytes_per_s}}
                     .dump()
              << std::endl;
    rates[StepChunkTokens(*plan)] = *std::move(measured);
  }
  std::cout << nlohmann::json{{"model", model},
                              {"method", full ? "full" : "lora"},
                              {"chunk", chunk},
                              {"page", page},
                              {"device_name", device_name},
                              {"peak_bf16_tflops", peak_flops / 1e12},
                              {"matmul_bf16_tflops", matmul_tflops},
                              {"mfu_definition", "6NT+12dP model FLOPs over the datasheet dense bf16 peak"},
                              {"tensor", tensor},
                              {"device", d.is_cuda() ? "cuda" : "cpu"},
                              {"attention", sparse ? "sparse" : "dense"},
                              {"page_budget", sparse_budget},
                              {"chunk_fraction", chunk_fraction},
                              {"kv_offload", offload},
                              {"kv_grad_dtype", kv_grad_dtype},
                              {"attention_kernel", attention_kernel},
                              {"swap", swap},
                              {"experts", experts},
                              {"selection", sparse ? selection : ""}}
                   .dump()
            << std::endl;
  // One rank's models and lengths (--tensor: rank `group`'s on its GPU; only rank 0 prints).
  std::mutex draw;  // Random reseeds every device's generator: one rank draws at a time
  const auto run = [&](at::Device d, RankGroup* group) -> int {
    std::unique_ptr<Transformer> m;
    {
      std::lock_guard<std::mutex> lock(draw);
      m = Transformer::Random(config, at::kBFloat16, d, 0, 0.02, group);  // sharded as drawn
    }
    if (full) {
      m->EnableFullFineTuning();
    } else {
      LoraOptions lora;
      lora.rank = rank;
      if (!m->AddLora(lora, 0).ok()) return 1;
    }
    std::optional<TensorParallelSync> sync;
    if (group != nullptr) {
      sync.emplace(*m, *group);
      tensor_parallel_sync = &*sync;
    }
    const bool lead = group == nullptr || group->rank() == 0;
    m->set_expert_kernel(experts == "grouped" ? ExpertKernel::kGrouped
                         : experts == "loop"  ? ExpertKernel::kLoop
                                              : ExpertKernel::kAuto);
    if (config.moe.experts > 0 && lead) {
      std::cout
          << nlohmann::json{{"expert_kernel", m->expert_kernel() == ExpertKernel::kGrouped ? "grouped" : "loop"}}.dump()
          << std::endl;
    }
    const Measurement how{
        .sections = sections,
        .kernel_profile = kernel_profile,
        .trace_windows = trace_windows,
        .kernel_trace_dir = kernel_trace_dir,
        .peak_flops = peak_flops,
        .frozen_parameters = full ? 0 : static_cast<double>(m->spec().ActiveParameterCount(m->config())),
        .fit_check = fit_check,
        .rates = rates};
    for (int64_t T : tokens) {
      const nlohmann::json r = MeasureLength(*m, T, bench, how, d);
      if (lead) std::cout << r.dump() << std::endl;
    }
    return 0;
  };
  if (tensor == 1) {
    if (const int rc = run(d, nullptr); rc != 0) return rc;
  } else {
    const Rendezvous rendezvous = Rendezvous::InProcess();
    std::vector<int> rcs(tensor, 0);
    std::vector<std::thread> ranks;
    for (int r = 0; r < tensor; ++r) {
      ranks.emplace_back([&, r] {
        const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(r));
        auto group = RankGroup::Join(rendezvous, r, tensor, device);
        if (!group.ok()) {
          std::cerr << "--tensor: " << group.status() << std::endl;
          rcs[r] = 1;
          return;
        }
        rcs[r] = run(device, group->get());
      });
    }
    for (std::thread& t : ranks) t.join();
    for (const int rc : rcs) {
      if (rc != 0) return rc;
    }
  }
  if (grad_check > 0 && !full) {
    EmptyCache(d);
    // The same bfloat16 weights in both runs (the float32 model is the bfloat16 one upcast), so
    // the difference is the computation's precision alone.
    auto m16 = Transformer::Random(config, at::kBFloat16, d, 1, 0.02);
    LoraOptions lora;
    lora.rank = rank;
    if (!m16->AddLora(lora, 1).ok()) return 1;
    {
      at::NoGradGuard ng;
      for (auto& [n, p] : m16->TrainableParameters()) {
        if (n.find("lora_B") != std::string::npos) p.normal_(0, 0.02);  // PEFT's B = 0 gives dA = 0
      }
    }
    const std::map<std::string, at::Tensor> g16 = LoraGrads(*m16, grad_check, bench, d);
    // The same bfloat16 run with the attention swap the other way (the swap's exactness on the GPU).
    BenchSpec other = bench;
    other.swap = !bench.swap;
    const std::map<std::string, at::Tensor> g16_other = LoraGrads(*m16, grad_check, other, d);
    auto m32 = m16->CastTo(at::kFloat);
    m16.reset();
    EmptyCache(d);
    const auto g32 = LoraGrads(*m32, grad_check, bench, d);
    std::cout << nlohmann::json{{"grad_check_S", grad_check},
                                {"parameters", g32.size()},
                                {"bf16_vs_fp32", CompareGrads(g16, g32)},
                                {bench.swap ? "swap_vs_recompute" : "recompute_vs_swap", CompareGrads(g16, g16_other)}}
                     .dump()
              << std::endl;
  }
  return 0;
}

}  // namespace
}  // namespace oomb

int main(int argc, char** argv) {
  oomb::DisableFlightRecorder();  // NCCL ranks as threads (--tensor): before any thread starts
  return oomb::Main(argc, argv);
}
