#include "worker/plan/step_time.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/hf/layer_spec.h"

namespace oomb {
namespace {

// The chunks of a T-token sequence: chunk i spans [i C, min((i + 1) C, T)).
struct Chunks {
  int64_t T, C;
  int64_t count() const { return (T + C - 1) / C; }
  int64_t begin(int64_t i) const { return i * C; }
  int64_t tokens(int64_t i) const { return std::min(T, (i + 1) * C) - i * C; }
};

// Query-key pairs of chunk i against its past in one layer of window W (0: the whole past):
// query S + t reads keys [max(0, S + t - W + 1), S) of the past.
double PastPairs(const Chunks& c, int64_t i, int64_t window) {
  const int64_t S = c.begin(i);
  double pairs = 0;
  if (window <= 0) return static_cast<double>(S) * c.tokens(i);
  // Queries t = 0..n-1 each read min(S, max(0, W - 1 - t)) past keys.
  for (int64_t t = 0; t < c.tokens(i); ++t)
    pairs += static_cast<double>(std::min(S, std::max<int64_t>(0, window - 1 - t)));
  return pairs;
}

}  // namespace

absl::StatusOr<StepTime> EstimateStepTime(const ModelConfig& config, const JobConfig& job, const MemoryPlan& plan,
                                          const EngineRates& rates) {
  if (job.method.type == TrainMethod::kEvaluate) {
    return absl::FailedPreconditionError("method.type evaluate runs no training step");
  }
  if (job.sparse.has_value()) {
    return absl::FailedPreconditionError("sparse attention's step time is not modelled (its page selection)");
  }
  const int64_t chunk_tokens = StepChunkTokens(plan);
  if (rates.chunk_tokens != chunk_tokens || chunk_tokens <= 0) {
    return absl::FailedPreconditionError(absl::StrCat("the rates were measured at chunks of ", rates.chunk_tokens,
                                                      " tokens, the plan runs chunks of ", chunk_tokens));
  }
  const Chunks chunks{plan.seq_len, chunk_tokens};
  const int64_t n = chunks.count();
  const double C = static_cast<double>(chunk_tokens);
  const double p = job.chunk_fraction;
  const bool exact = p >= 1.0;
  // Stage 1 runs chunks 0..N-2 (exact), every chunk with SpaCO (its LM head too: its losses).
  const int64_t stage1_chunks = exact ? n - 1 : n;
  const double stage1_tokens = static_cast<double>(exact ? chunks.begin(n - 1) : plan.seq_len);
  const double stage2_tokens = p * static_cast<double>(plan.seq_len);

  const double L = static_cast<double>(config.num_layers);
  StepTime t;
  t.compute_s = L * (stage1_tokens * rates.layer_forward_s + stage2_tokens * rates.layer_train_s) / C +
                (stage2_tokens + (exact ? 0.0 : stage1_tokens / 3)) * rates.head_train_s / C;

  // Swap instead of recompute: stage 2 replays the attention of chunks [swapped_from, N-1).
  const int64_t swapped_from = exact ? std::max<int64_t>(0, n - 1 - plan.swap_chunks) : n;
  double forward_pairs = 0, backward_pairs = 0;
  for (const int64_t window : DescribeModel(config).Windows()) {
    for (int64_t i = 0; i < n; ++i) {
      const double pairs = PastPairs(chunks, i, window);
      if (i < stage1_chunks) forward_pairs += pairs;
      if (i < swapped_from || i == n - 1) forward_pairs += p * pairs;
      backward_pairs += p * pairs;
    }
  }
  t.attention_s = forward_pairs * rates.past_forward_s_per_pair + backward_pairs * rates.past_backward_s_per_pair;
  t.compute_s += t.attention_s;

  // The host tier: pages fill the device first, in chunk order, layer by layer; and the swapped
  // attention results, down in stage 1 and back in stage 2.
  if (rates.host_copy_bytes_per_s > 0) {
    const double e = job.model.dtype == ModelDtype::kBFloat16 ? 2 : 4;
    const double record = C * static_cast<double>(config.q_dim()) * e + C * static_cast<double>(config.num_heads) * 4;
    t.host_copy_s = 2 * static_cast<double>(n - 1 - swapped_from > 0 ? n - 1 - swapped_from : 0) * L * record /
                    rates.host_copy_bytes_per_s;
  }
  if (plan.host_kv_pages > 0 && rates.host_copy_bytes_per_s > 0) {
    const double page_tokens = static_cast<double>(job.memory.page_tokens);
    const double device_pages_per_layer = static_cast<double>(plan.device_kv_pages) / L;
    const double e = job.model.dtype == ModelDtype::kBFloat16 ? 2 : 4;
    const double g = plan.kv_grad_dtype == KvGradDtype::kBFloat16 && e == 2 ? 2 : 4;
    const double kv_page = 2 * static_cast<double>(config.kv_dim()) * page_tokens * e;
    const double grad_page = 2 * static_cast<double>(config.kv_dim()) * page_tokens * g;
    double bytes = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double host_pages =
          std::max(0.0, static_cast<double>(chunks.begin(i)) / page_tokens - device_pages_per_layer);
      if (i < stage1_chunks) bytes += host_pages * kv_page;
      bytes += p * host_pages * (kv_page + 2 * grad_page);
    }
    t.host_copy_s += L * bytes / rates.host_copy_bytes_per_s;
  }

  // Data parallelism: sequence i of the batch runs on group i mod (gpus / parallel.tensor)
  // (worker/train/rank_group.h).
  const int64_t ranks = std::max<int64_t>(1, job.resources.gpus / std::max(1, job.parallel.tensor));
  const double sequences = static_cast<double>((job.training.batch_sequences + ranks - 1) / ranks);
  t.compute_s *= sequences;
  t.attention_s *= sequences;
  t.host_copy_s *= sequences;
  t.seconds = std::max(t.compute_s, t.host_copy_s);
  return t;
}

}  // namespace oomb
