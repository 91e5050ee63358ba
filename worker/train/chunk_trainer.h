// The chunk-recurrent trainer (docs/ARCHITECTURE.md §3): exact gradients of a sequence of any
// length with activation memory of one chunk.
//
// Stage 1 (no graph), chunks 0..N-1: forward each chunk attending over the KV pages of the
// chunks before it, append its K (after RoPE) and V to the pages, add its loss.
// Stage 2, chunks N-1..0: recompute the chunk's forward with the autograd graph (reading the
// same past pages), backpropagate loss_i * loss_scale + sum_l <dK_i^l, K_i^l> + <dV_i^l, V_i^l>
// where dK_i, dV_i are what later chunks accumulated into chunk i's gradient pages (layer l's
// read when the backward reaches layer l, so it waits only for what was added there); the
// attention backward adds chunk i's contribution to the past's gradient pages in place; then
// chunk i's KV and gradient pages are released. No step waits for the device before the loss
// is read at the end: what the host decides from (document starts, labels) stays on the host.
//
// Contract: parameter gradients (the model's trainable parameters' .grad, accumulated, not
// overwritten) equal those of ordinary full-sequence backpropagation of
// loss_scale * sum(CE over label tokens) to rounding, for any chunk and page size.
//
// SpaCO (backward.chunk_fraction = p < 1): stage 2 backpropagates only a sample of the chunks.
// Chunk i is kept with probability p, independently of the others (z_i ~ Bernoulli(p), drawn
// from the sequence's seed and i, so a resumed step draws the same); a kept chunk
// backpropagates (1/p) * (loss_i * loss_scale + sum_l <dK_i, K_i> + <dV_i, V_i>), with the dK_i,
// dV_i that the kept later chunks left; a dropped chunk does nothing (no recompute, nothing
// added to its past's gradient pages) and its own pages get no gradient pages (what kept chunks
// would add there is never read), so gradient memory is about p of the exact trainer's. The
// estimate
//   g~ = sum_i (z_i / p) J_i^T u~_i,   u~_i = dloss_i + sum_{k > i} (z_k / p) A_ki^T u~_k
// (J_i: chunk i's Jacobian in the parameters, A_ki: chunk k's in chunk i's K and V, both at the
// stage-1 point) is unbiased: backpropagation is linear in u, z_i is independent of u~_i (which
// depends on the later draws only), so E[g~] = sum_i J_i^T E[u~_i] and E[u~_i] = u_i by
// induction from the last chunk. p = 1 is the exact trainer. Stage 2 then costs about p of the
// exact one; the variance grows as p falls.
//
// Attention (options.sparse set: sparse; worker/train/attention.h): stage 2 reads the past as
// stage 1 did, so with sparse attention the contract holds for the sparse model: the gradients
// are those of full-sequence backpropagation through attention restricted to the selected
// pages (the selection itself is piecewise constant, without gradient).
//
// Swap instead of recompute (options.swap_budget_bytes > 0, dense exact training): stage 1
// keeps the attention results of the sequence's latest chunks in host memory and stage 2 replays
// them instead of recomputing the attention forward (attention_swap.h); same gradients.
//
// The parts: chunk.h (a chunk, the options, the clock), attention.h (how a chunk attends over
// its past), attention_swap.h (the swapped results), stage_one.h (stage 1 and its schedule), the
// KV store (worker/kv/kv_store.h); this class is stage 2 and the sequence around both stages.
//
// The router's auxiliary loss (a mixture of experts with MoeConfig::aux_loss_coef > 0;
// RouterBalance, worker/model/transformer.h): the sequence's routing counts are tallied over
// stage 1's chunks, so stage 2 can add each chunk's share of the loss's gradient. Exact dense
// training's stage 1 does not run the last chunk: stage 2 runs it first, tallies it with its
// graph and backpropagates the loss itself, then the earlier chunks their shares. The loss is
// then aux_scale * aux_loss_coef * aux beside loss_scale * sum(CE), with the same contract.
//
// Labels: `labels[t]` is the target of position t (already shifted: the token at t+1), or
// kIgnoreIndex. The data pipeline shifts over the whole sequence before chunking, so the last
// token of chunk i predicts the first token of chunk i+1.
//
// Exact training (chunk_fraction 1) trims stage 1 to what stage 2 reads: stage 2 recomputes
// every chunk with its loss, so stage 1 skips the LM head (the losses are those of stage 2),
// and with dense attention it runs chunks 0..N-2 only (no later chunk reads chunk N-1's KV;
// sparse stage 2 needs the selections stage 1 makes for every chunk).
//
// Thread-safety: one trainer per training thread.
#ifndef OOMB_WORKER_TRAIN_CHUNK_TRAINER_H_
#define OOMB_WORKER_TRAIN_CHUNK_TRAINER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/sequence.h"
#include "worker/kv/kv_store.h"
#include "worker/model/transformer.h"
#include "worker/train/attention.h"
#include "worker/train/attention_swap.h"
#include "worker/train/chunk.h"
#include "worker/train/stage_one.h"

namespace oomb {

// Peak bytes seen during the last TrainSequence: what the memory test and metrics report.
struct TrainerMemory {
  int64_t activation_peak_bytes = 0;  // tracked tensor allocations (graph, temporaries); no KV
  int64_t kv_peak_bytes = 0;          // device KV pages in use at the peak
  int64_t kv_grad_peak_bytes = 0;     // device KV-gradient pages in use at the peak
  int64_t host_kv_peak_bytes = 0;     // host-tier KV and KV-gradient pages in use at the peak
  int64_t bytes_to_device = 0;        // host pages copied to the device (PCIe, host to device)
  int64_t bytes_to_host = 0;          // pages written back to the host (PCIe, device to host)
  int64_t swapped_bytes = 0;          // attention results stage 1 swapped to the host
  int64_t swapped_chunks = 0;         // chunks whose every layer stage 2 did not recompute
  int64_t swap_host_bytes = 0;        // host memory the swap's records hold (allocated once)
};

class ChunkTrainer {
 public:
  // The pools must have the model's page shape; they are shared by the sequences trained one
  // after another and must hold a whole sequence's KV (layers * ceil(T' / page) + layers pages,
  // T' = T less the last chunk's tokens with dense attention, T with sparse),
  // on the device and the host together (placement: worker/kv/kv_store.h), and as many
  // gradient pages (SpaCO: those of the kept chunks' pages).
  ChunkTrainer(const Transformer* model, KvPools pools, ChunkTrainerOptions options);
  ChunkTrainer(const Transformer* model, PagePool* kv_pool, PagePool* grad_pool, ChunkTrainerOptions options)
      : ChunkTrainer(model, KvPools{kv_pool, grad_pool}, std::move(options)) {}

  // Stages 1 and 2 over the sequence; accumulates gradients of loss_scale * sum(CE) (plus
  // aux_scale * aux_loss_coef * the router's auxiliary loss, where the model has one) into the
  // trainable parameters' .grad (with chunk_fraction < 1: SpaCO's unbiased estimate of it).
  // `dropout_seed` makes LoRA dropout masks and SpaCO's draws reproducible.
  // Errors: RESOURCE_EXHAUSTED when the KV pages do not fit; CANCELLED when should_stop
  // asked; INTERNAL when LibTorch fails (the message carries its error).
  absl::StatusOr<SequenceLoss> TrainSequence(const TokenSequence& seq, double loss_scale, uint64_t dropout_seed,
                                             double aux_scale = 1.0);

  // Stage 1 only: the loss without gradients (evaluation); with `scores`, also every position's
  // (TokenScores; resized to the sequence).
  absl::StatusOr<SequenceLoss> EvalSequence(const TokenSequence& seq, TokenScores* scores = nullptr);

  // The greedy continuation of `prompt` by the model as it is (worker/train/greedy_decoder.h):
  // up to `max_new_tokens` tokens, ending after `stop` when it comes. The prompt runs forward in
  // chunks of options.chunk_tokens with dense attention over this trainer's pools, which must
  // hold the KV of prompt + max_new_tokens tokens (RESOURCE_EXHAUSTED otherwise: a plan for that
  // length plus one chunk holds them); CANCELLED when should_stop asks (before it starts).
  // LibTorch's errors are thrown, as EvalSequence's callers expect.
  absl::StatusOr<std::vector<int64_t>> Generate(const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                                                std::optional<int64_t> stop);

  const TrainerMemory& memory() const { return memory_; }
  // The chunks of the last TrainSequence, up to its end or its stop (should_stop).
  const ChunkTimes& chunk_times() const { return chunk_times_; }
  // Sparse attention over the last sequence (TrainSequence or EvalSequence).
  const SparseStats& sparse_stats() const { return attention_->stats(); }

  // The sequence's chunks, and SpaCO's draw: whether stage 2 backpropagates chunk `index` under
  // `dropout_seed` (always, at chunk_fraction 1).
  int64_t NumChunks(const TokenSequence& seq) const;
  // What later chunks read of each layer's past (sliding-window layers: the last window's tokens).
  PastReach Reach() const;
  bool KeepChunk(int64_t index, uint64_t dropout_seed) const;

 private:
  // What stage 2 backpropagates over a sequence, and what it sums.
  struct StageTwo {
    double loss_scale = 0, aux_scale = 0;
    uint64_t dropout_seed = 0;
    bool with_loss = false;            // stage 2 gives the losses (exact training)
    RouterBalance* balance = nullptr;  // the router's auxiliary loss, when the model has one
    at::Tensor loss_sum;               // on the device, float64, read once
    int64_t label_tokens = 0;
  };
  // Both stages over `seq` into `store`; the loss.
  absl::StatusOr<SequenceLoss> RunStages(const TokenSequence& seq, StageTwo& two, KvStore& store, ChunkClock& clock);
  // Stage 2's recompute and backward of chunk `index` (the sequence's last is `last`); adds its
  // loss to two.loss_sum when two.with_loss.
  absl::Status Backpropagate(const TokenSequence& seq, int64_t index, int64_t last, StageTwo& two, KvStore& store);
  // SpaCO: marks the gradients of the chunks stage 2 drops as never read (no gradient pages
  // for them, KvStore::DropGradients), and checks that the pools hold those of the kept ones
  // (RESOURCE_EXHAUSTED if not, before any work).
  absl::Status DropUnreadGradients(const TokenSequence& seq, uint64_t seed, KvStore& store) const;
  // CANCELLED when options_.should_stop asks (at a chunk boundary).
  absl::Status CheckStop() const;

  const Transformer* model_;
  KvPools pools_;
  ChunkTrainerOptions options_;
  std::unique_ptr<CopyEngine> own_copies_;  // the swap's, when the pools have no copy engine
  std::unique_ptr<SwappedAttention> swap_;  // null: no swap
  std::unique_ptr<Attention> attention_;
  StageOne stage_one_;
  TrainerMemory memory_;
  ChunkTimes chunk_times_;
};

}  // namespace oomb

#endif  // OOMB_WORKER_TRAIN_CHUNK_TRAINER_H_
