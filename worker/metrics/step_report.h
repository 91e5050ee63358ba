// What one optimizer step did and measured: emitted by the training session after every step
// (worker/session/training_session.h), completed by the executor with the step's place in the
// run, and reported as the job's events, its metrics.jsonl lines (metrics_log.h) and the CLI's
// progress display. Torch-free.
#ifndef OOMB_WORKER_METRICS_STEP_REPORT_H_
#define OOMB_WORKER_METRICS_STEP_REPORT_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "worker/metrics/eval_report.h"

namespace oomb {

struct StepReport {
  // The step's place in the run (the executor's).
  int64_t step = 0;  // 1-based, after the step
  int64_t total_steps = 0;
  int64_t tokens = 0;  // tokens trained so far, this step's included
  double learning_rate = 0;
  double eta_seconds = 0;
  double eval_loss = 0;  // > 0 when an eval ran at this step
  // What eval_loss is the mean over: data.validation's label tokens and samples.
  int64_t eval_tokens = 0;
  int64_t eval_samples = 0;
  // The evaluation section's suites, when they ran at this step.
  std::optional<EvalReport> evaluation = std::nullopt;

  // What the step did (the session's), over every rank of a data-parallel run.
  int64_t step_tokens = 0;  // tokens of this step's sequences
  double loss = 0;          // mean loss over the step's label tokens
  // A mixture of experts with the router's auxiliary loss (MoeConfig::aux_loss_coef > 0): its
  // mean over the step's sequences, not weighted (the training loss adds it times the
  // coefficient; `loss` above is the cross-entropy alone). 0 otherwise.
  double router_aux_loss = 0;
  double step_seconds = 0;  // wall clock of the step: forward, backward, optimizer
  double tokens_per_second = 0;
  int64_t peak_device_bytes = 0;  // peak allocated on the device (CPU: tracked tensors and pages)
  int64_t host_kv_bytes = 0;      // KV + KV-grad bytes in the host tier at the step's peak
  int64_t pcie_h2d_bytes = 0;     // the copy engine's traffic since the session began
  int64_t pcie_d2h_bytes = 0;
  // Swap instead of recompute (memory.swap_attention): the attention results stage 1 kept on
  // the host for stage 2 this step, and the chunks whose every layer stage 2 did not recompute.
  int64_t swapped_bytes = 0;
  int64_t swapped_chunks = 0;
  // Model FLOPs of this step and their rate against the devices' datasheet peak
  // (worker/metrics/flops.h); mfu is 0 where the peak is unknown (the CPU, unlisted GPUs).
  // Sparse steps count the attention's FLOPs of the query-key pairs attended; SpaCO steps the
  // backward of the kept chunks only.
  double model_flops = 0;
  double mfu = 0;
  // Sparse attention: past pages attended / past pages there were, over the step's chunks,
  // layers, query tiles and KV heads; 0 for dense attention.
  double attention_density = 0;
  // Seconds of each chunk of this rank's sequences, stage 1 (forward without a graph) and
  // stage 2 (recompute + backward), in the order they ran; on a GPU, device time between chunk
  // boundaries (CUDA events).
  std::vector<double> forward_chunk_seconds = {};
  std::vector<double> backward_chunk_seconds = {};
};

}  // namespace oomb

#endif  // OOMB_WORKER_METRICS_STEP_REPORT_H_
