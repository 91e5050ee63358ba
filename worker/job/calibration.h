// The rates a step-time estimate multiplies the work by (worker/plan/step_time.h), measured on
// the device that would run the job: the engine's own parts on a copy of the model with random
// weights, so every kernel, LoRA matmul and elementwise op the trainer runs is in the time.
// Torch-free header.
//
// What is measured, the median of a few repetitions after one warm-up each:
//   layers      one chunk (memory.chunk_tokens of the plan) through copies of the model with
//               one and with 1 + k decoder layers (the spec's dtype, LoRA or full fine-tuning;
//               chunk-local causal attention through the trainer's attention): forward without
//               graph, and forward with graph + LM head and loss + backward; a layer is the
//               difference of the two copies over k, the LM head what the one-layer copy has
//               beside. k layers (at most 8) hold at least 64 MiB of weights (a 7B model's one
//               layer; a 135M float32 model's five), so that, as in the whole model, they do
//               not stay in the CPU's caches from one chunk to the next
//   attention   one layer's attention of a chunk over a past of kPastChunks chunks (plain
//               tensors standing for the pages), forward and backward, less the same without
//               the past, per past query-key pair
//   host tier   a 256 MiB pinned host tensor copied to the device and back (CUDA only)
// On the CPU a chunk longer than 1,024 tokens is timed at 1,024 (and its attention over a past
// of at most 4,096 tokens), then scaled: the layers and the LM head by tokens, the chunk's own
// causal attention by the query-key pairs it adds, at the past's rate.
// On a GPU this takes a few seconds and the memory of the larger copy (its layers' weights, the
// embeddings and the LM head) beside whatever runs there; on the CPU, seconds for the small
// models CPU jobs train.
#ifndef OOMB_WORKER_JOB_CALIBRATION_H_
#define OOMB_WORKER_JOB_CALIBRATION_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "worker/hf/model_config.h"
#include "worker/plan/job_config.h"
#include "worker/plan/step_time.h"

namespace oomb {

// Past chunks the attention's rate is measured over: 64K keys at chunks of 8192, the GPU's key
// block (ChunkTrainerOptions::gpu_attention_key_block), as a long context reads them.
inline constexpr int64_t kPastChunks = 8;

// The rates of `job`'s model (`config`) on `device` ("cpu", "cuda:N") at chunks of
// `chunk_tokens`. Errors as the trainer reports them (worker/train/torch_status.h): an
// out-of-memory is RESOURCE_EXHAUSTED; CANCELLED once `should_stop` (asked between
// repetitions) returns true.
absl::StatusOr<EngineRates> MeasureEngineRates(const ModelConfig& config, const JobConfig& job, int64_t chunk_tokens,
                                               const std::string& device,
                                               const std::function<bool()>& should_stop = {});

// What rates of `config` in `job` at `chunk_tokens` on `device` are kept under: rates differ
// with every part of the model's shape, the dtype, the method and LoRA's rank and targets.
std::string EngineRatesKey(const ModelConfig& config, const JobConfig& job, int64_t chunk_tokens,
                           const std::string& device_name);

}  // namespace oomb

#endif  // OOMB_WORKER_JOB_CALIBRATION_H_
