// Time and cost before submitting (EstimateJob, `oomb estimate`): one optimizer step's seconds
// predicted from the work the chunk-recurrent trainer does (worker/train/chunk_trainer.h) at
// rates measured on the device for the model's shape (worker/job/calibration.h). Torch-free.
//
// The work of one sequence of T tokens in chunks of C (N chunks, the last one c_N <= C tokens):
//   stage 1   chunks 0..N-2 (exact dense; every chunk when SpaCO or sparse attention needs it),
//             each layer's forward without graph, no LM head (exact) or with it (SpaCO)
//   stage 2   chunks N-1..0 (SpaCO: the expected p N of them), each layer's forward with its
//             graph and its backward, the LM head and the loss forward and backward
//   attention each chunk's queries against its own keys (causal; inside the layer's rate) and
//             against its past: a chunk starting at S reads min(S, W) past keys per query
//             (W: the layer's window, or S); stage 1 forward, stage 2 forward and backward
//   swap      the chunks whose attention results stage 1 keeps (MemoryPlan::swap_chunks, the
//             latest of 0..N-2; worker/paging/swap_layout.h): stage 2 replays their attention
//             forward over the past instead of computing it
//   host tier with pages on the host (MemoryPlan::host_kv_pages): the past's host pages read by
//             every chunk of both stages, and in stage 2 their gradient pages read and written
//             back; pages fill the device first, in chunk order (worker/kv/kv_store.h); and the
//             swapped results, down and back
// Tensor parallelism (parallel.tensor N): the step of one rank, whose model is its shard
// (ShardConfig, worker/hf/layer_spec.h; its rates measured on that shape, one device), the
// groups data-parallel over the batch; the group's sums are not counted.
// Every sequence is taken to be data.max_seq_len tokens long (packing makes them so; without it
// the estimate is an upper bound). Seconds = batch sequences per rank x (layers x (stage-1 tokens x layer_forward_s +
// stage-2 tokens x layer_train_s) / C + stage-2 tokens x head_train_s / C + past pairs x the
// attention's seconds per pair), and the host tier's bytes / host_copy_bytes_per_s where they
// take longer (the copies overlap the computation: the step takes the longer of the two).
//
// Not counted: the optimizer step, the data pipeline, evaluation and checkpoints (the job's
// device-hours add none of them), the chunk-local part of a swapped chunk's attention forward
// (counted in layer_train_s). SpaCO's stage 1 runs the LM head forward too (a third of
// head_train_s). Sparse
// attention is not estimated (its selection's cost is not modelled): step_seconds 0 and the
// reason in `rates`.
//
// Checked against measured steps: on the CPU in CI (tests/python/test_estimate.py, ctest estimate_time,
// within a factor, the machine being shared), on a GPU in bench/results (the README beside the
// numbers).
#ifndef OOMB_WORKER_PLAN_STEP_TIME_H_
#define OOMB_WORKER_PLAN_STEP_TIME_H_

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "worker/hf/model_config.h"
#include "worker/plan/job_config.h"
#include "worker/plan/memory_planner.h"

namespace oomb {

// What the engine's parts take on one device, for one model shape, dtype and chunk size,
// measured by worker/job/calibration.h and kept by the daemon (server/engine_rates_store.h).
struct EngineRates {
  std::string device_name;  // "NVIDIA H200", "cpu"
  std::string measured_at;  // RFC 3339
  int64_t chunk_tokens = 0;
  double layer_forward_s = 0;  // one decoder layer over one chunk without graph (attention inside the chunk included)
  double layer_train_s = 0;    // the same with its graph, and its backward
  double head_train_s = 0;     // the final norm, LM head and loss over one chunk, forward and backward
  // One layer's attention of a chunk over its past, per query-key pair (all heads).
  double past_forward_s_per_pair = 0;
  double past_backward_s_per_pair = 0;
  double host_copy_bytes_per_s = 0;  // pinned host <-> device; 0 on the CPU (no host tier)
};

struct StepTime {
  double seconds = 0;      // one optimizer step
  double compute_s = 0;    // the layers, the LM head and the attention
  double attention_s = 0;  // of which the attention over the past
  double host_copy_s = 0;  // the host tier's copies (overlapping compute_s)
};

// The chunk size a step of `plan` runs (and its rates are measured at): plan.chunk_tokens, or the
// whole sequence when it is shorter.
inline int64_t StepChunkTokens(const MemoryPlan& plan) { return std::min(plan.chunk_tokens, plan.seq_len); }

// The step of `job` as `plan` (its chunk size, KV-gradient dtype and page placement) lays it
// out, at `rates` (measured at StepChunkTokens(plan)); `config` is one rank's model (ShardConfig
// under parallel.tensor). FAILED_PRECONDITION for what is not
// estimated (sparse attention, evaluation-only jobs), saying why.
absl::StatusOr<StepTime> EstimateStepTime(const ModelConfig& config, const JobConfig& job, const MemoryPlan& plan,
                                          const EngineRates& rates);

}  // namespace oomb

#endif  // OOMB_WORKER_PLAN_STEP_TIME_H_
