// The chunk-recurrent trainer (ARCHITECTURE.md §3): exact gradients of a sequence of any
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
// Sparse attention (options.sparse set; ARCHITECTURE.md §5): stage 1 keeps a summary of every
// page it writes (kernels/torch/page_select.h) and, for each chunk and layer, selects the past
// pages each query tile attends to; stage 2 recomputes the chunk with that same selection
// (kept on the host, int32), so the contract above holds for the sparse model: the gradients
// are those of full-sequence backpropagation through attention restricted to the selected
// pages (the selection itself is piecewise constant, without gradient). KV-gradient pages are
// allocated only for pages some chunk selected.
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

#include <ATen/ATen.h>
#include <c10/core/Event.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/torch/page_select.h"
#include "kernels/torch/paged_attention.h"
#include "worker/data/sequence.h"
#include "worker/kv/page_pool.h"
#include "worker/model/transformer.h"

namespace oomb {

struct ChunkTrainerOptions {
  int64_t chunk_tokens = 4096;
  int64_t ce_rows_per_block = 1024;    // sub-chunk of the fused LM head + cross-entropy
  int64_t attention_key_block = 2048;  // past tokens read at once by the attention
  // The same on a GPU: the fused path's key blocks (kernels/torch/paged_attention.h), which
  // bound the attention's memory whatever the context's length.
  int64_t gpu_attention_key_block = 65536;
  // The fused GPU attention kernel, dense and sparse (kernels/torch/fused_attention.h).
  kernels::GpuAttentionKernel gpu_attention_kernel = kernels::GpuAttentionKernel::kCudnn;
  double chunk_fraction = 1.0;  // SpaCO's p, in (0, 1] (see above)
  // Sparse attention (see above); unset: dense. page_tokens is the pools' (ignored here), and
  // chunk_tokens must be a multiple of it.
  std::optional<kernels::PageSelectOptions> sparse;
  // Tests: called with every selection stage 1 makes, [n_tiles, kv_heads, n] int64.
  std::function<void(int64_t chunk, int64_t layer, const at::Tensor& selection)> on_selection;
  // Tests: which chunks stage 2 keeps (overrides the Bernoulli draws; the kept ones are still
  // weighted 1/chunk_fraction), to enumerate every selection.
  std::function<bool(int64_t chunk)> keep_chunk;
  // Asked after every chunk of either stage; when it returns true the sequence stops and
  // TrainSequence returns CANCELLED (gradients of the partial sequence must be discarded).
  std::function<bool()> should_stop;
};

struct SequenceLoss {
  double loss_sum = 0;       // sum of CE over label tokens (not scaled)
  int64_t label_tokens = 0;  // tokens that carried a label
};

// Seconds of each chunk of the last TrainSequence, in the order the chunks ran: wall clock on
// the CPU; on a CUDA device, device time between CUDA events recorded at the chunk boundaries
// on the current stream, read once when the sequence ends (no synchronisation per chunk).
struct ChunkTimes {
  std::vector<double> forward;   // stage 1 (sparse: chunks overlap, so from one chunk's end to the next's)
  std::vector<double> backward;  // stage 2 (recompute + backward)
};

// Sparse attention over the last sequence (TrainSequence or EvalSequence), summed over chunks,
// layers, query tiles and KV heads: the past pages attended, and the past pages there were.
// selected / past is the attention's density (1 for dense).
struct SparseStats {
  int64_t selected_pages = 0;
  int64_t past_pages = 0;
  // Query-key pairs attended, over layers and query heads (the chunks' own causal pairs
  // included): the attention's model FLOPs are 12 * head_dim * attended_pairs.
  double attended_pairs = 0;
};

// Peak bytes seen during the last TrainSequence: what the memory test and metrics report.
struct TrainerMemory {
  int64_t activation_peak_bytes = 0;  // tracked tensor allocations (graph, temporaries); no KV
  int64_t kv_peak_bytes = 0;          // device KV pages in use at the peak
  int64_t kv_grad_peak_bytes = 0;     // device KV-gradient pages in use at the peak
  int64_t host_kv_peak_bytes = 0;     // host-tier KV and KV-gradient pages in use at the peak
  int64_t bytes_to_device = 0;        // host pages copied to the device (PCIe, host to device)
  int64_t bytes_to_host = 0;          // pages written back to the host (PCIe, device to host)
};

class ChunkTrainer {
 public:
  // The pools must have the model's page shape; they are shared by the sequences trained one
  // after another and must hold a whole sequence's KV (layers * ceil(T / page) + layers pages),
  // on the device and the host together (placement: worker/kv/page_pool.h), and as many
  // gradient pages (SpaCO: those of the kept chunks' pages).
  ChunkTrainer(const Transformer* model, KvPools pools, ChunkTrainerOptions options);
  ChunkTrainer(const Transformer* model, PagePool* kv_pool, PagePool* grad_pool, ChunkTrainerOptions options)
      : ChunkTrainer(model, KvPools{kv_pool, grad_pool}, std::move(options)) {}

  // Stages 1 and 2 over the sequence; accumulates gradients of loss_scale * sum(CE) into the
  // trainable parameters' .grad (with chunk_fraction < 1: SpaCO's unbiased estimate of it).
  // `dropout_seed` makes LoRA dropout masks and SpaCO's draws reproducible.
  // Errors: RESOURCE_EXHAUSTED when the KV pages do not fit; CANCELLED when should_stop
  // asked; INTERNAL when LibTorch fails (the message carries its error).
  absl::StatusOr<SequenceLoss> TrainSequence(const TokenSequence& seq, double loss_scale, uint64_t dropout_seed);

  // Stage 1 only: the loss without gradients (evaluation).
  absl::StatusOr<SequenceLoss> EvalSequence(const TokenSequence& seq);

  const TrainerMemory& memory() const { return memory_; }
  const ChunkTimes& chunk_times() const { return chunk_times_; }
  const SparseStats& sparse_stats() const { return sparse_stats_; }

  // The sequence's chunks, and SpaCO's draw: whether stage 2 backpropagates chunk `index` under
  // `dropout_seed` (always, at chunk_fraction 1).
  int64_t NumChunks(const TokenSequence& seq) const;
  bool KeepChunk(int64_t index, uint64_t dropout_seed) const;

 private:
  // A chunk's inputs, on the device (uploaded without waiting for it), and what the host
  // decides from: its document starts (the attention's path) and labels (the loss's blocks),
  // on the CPU, so that no step of either stage waits for the device.
  struct Chunk {
    int64_t begin, end;
    ChunkInput input;
    at::Tensor doc_start_host;  // [C] int64, CPU
    at::Tensor labels_host;     // [C] int64, CPU
    int64_t label_tokens = 0;   // labels that are not kIgnoreIndex
  };
  // SpaCO: marks the gradients of the chunks stage 2 drops as never read (no gradient pages
  // for them, SequenceKvCache::DropGradients), and checks that the pools hold those of the kept
  // ones (RESOURCE_EXHAUSTED if not, before any work).
  absl::Status DropUnreadGradients(const TokenSequence& seq, uint64_t seed, SequenceKvCache& cache) const;
  // Chunk `index`'s tensors, made when the chunk runs (not for the whole sequence up front:
  // that would be O(T) memory beside the pages).
  Chunk MakeChunk(const TokenSequence& seq, int64_t index, bool training, uint64_t dropout_seed) const;
  class ChunkClock;
  struct Lane;
  // Stage 1's sparse selection of chunk `index`'s pages at one layer: on the device, its host
  // copy (pinned on a GPU, where it arrives asynchronously: `copied` is its end), and, once
  // StartFetch ran, the fetch of the host pages it names.
  struct LayerSelection {
    at::Tensor device, host;
    std::optional<c10::Event> copied;  // GPU only
    bool fetching = false;             // StartFetch ran
    SequenceKvCache::PagesInFlight pages;
  };
  // Stage 1: selects the past pages chunk `c` (number `index`) attends at `layer` from the
  // page summaries of every layer ([L, pages, ...]), and records the selection when
  // `training`. It queues the copy of the selection to the host without waiting for it.
  LayerSelection SelectPages(const Chunk& c, int64_t index, int64_t layer, const at::Tensor& q,
                             const at::Tensor& summaries, bool training);
  // Waits for the selection's host copy (GPU), counts it in sparse_stats_, and starts fetching
  // its host pages. Forward calls this once the device has other work queued behind the
  // selection, so that waiting leaves the device busy.
  void StartFetch(const Chunk& c, int64_t layer, LayerSelection& s, SequenceKvCache& cache);
  // Sparse attention of chunk `c` (number `index`) at `layer`. Stage 1 (`selection` and
  // `summaries` set): attends with SelectPages' selection, appends the chunk's KV and its pages'
  // summaries. Stage 2 (both null): attends with the recorded selection.
  at::Tensor SparseAttention(const Chunk& c, int64_t index, int64_t layer, const at::Tensor& q, const at::Tensor& k,
                             const at::Tensor& v, SequenceKvCache& cache, LayerSelection* selection,
                             at::Tensor* summaries, absl::Status* append_status);
  // Dense attention of chunk `c` at `layer` over its past in `cache` (the fused GPU kernel
  // options_ name).
  at::Tensor DenseAttention(const Chunk& c, int64_t layer, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, SequenceKvCache& cache) const;
  // Stage 1 over chunks [0, chunks); the loss only `with_loss` (else zero). `clock`, when set,
  // takes a lap after every chunk. Sparse: three chunks in flight, each a layer or more behind
  // the one before; a layer's selection is queued as soon as the chunk before has written that
  // layer's pages, its host pages start coming in once another chunk's layer is queued behind
  // it, and the chunk whose selection is oldest runs next, so each chunk's fetches overlap the
  // others' compute (see the .cc).
  absl::StatusOr<SequenceLoss> Forward(const TokenSequence& seq, int64_t chunks, bool with_loss, bool training,
                                       uint64_t dropout_seed, SequenceKvCache& cache, ChunkClock* clock);

  // The attention's key block on the model's device.
  int64_t KeyBlock() const;

  const Transformer* model_;
  KvPools pools_;
  ChunkTrainerOptions options_;
  TrainerMemory memory_;
  ChunkTimes chunk_times_;
  SparseStats sparse_stats_;
  std::vector<at::Tensor> selections_;  // sparse, training: [chunk * layers + layer], host int32
};

}  // namespace oomb

#endif  // OOMB_WORKER_TRAIN_CHUNK_TRAINER_H_
