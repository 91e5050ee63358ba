// What the chunk-recurrent trainer's parts share (chunk_trainer.h, stage_one.h, attention.h):
// the trainer's options, one chunk of a sequence as the stages run it, the clock of its chunks,
// and what a sequence's training reports.
#ifndef OOMB_WORKER_TRAIN_CHUNK_H_
#define OOMB_WORKER_TRAIN_CHUNK_H_

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#if defined(OOMB_HAVE_CUDA)
#include <ATen/cuda/CUDAEvent.h>
#endif

#include "kernels/torch/page_select.h"
#include "kernels/torch/paged_attention.h"
#include "worker/data/sequence.h"
#include "worker/model/transformer.h"

namespace oomb {

struct ChunkTrainerOptions {
  int64_t chunk_tokens = 4096;
  int64_t ce_rows_per_block = 1024;    // sub-chunk of the fused LM head + cross-entropy
  int64_t attention_key_block = 2048;  // past tokens read at once by the attention (CPU)
  // The same on a GPU: the fused path's key blocks (kernels/torch/paged_attention.h), which
  // bound the attention's memory whatever the context's length.
  int64_t gpu_attention_key_block = 65536;
  // The fused GPU attention kernel, dense and sparse (kernels/torch/fused_attention.h).
  kernels::GpuAttentionKernel gpu_attention_kernel = kernels::GpuAttentionKernel::kCudnn;
  double chunk_fraction = 1.0;  // SpaCO's p, in (0, 1] (chunk_trainer.h)
  // Swap instead of recompute (attention_swap.h), dense exact training only: host bytes for
  // the attention results stage 1 keeps (0: stage 2 recomputes every attention forward), and
  // the fewest keys per query that make a chunk worth swapping (worker/paging/swap_layout.h).
  int64_t swap_budget_bytes = 0;
  int64_t swap_min_key_tokens = 0;
  // Sparse attention (attention.h); unset: dense. page_tokens is the pools' (ignored here), and
  // chunk_tokens must be a multiple of it.
  std::optional<kernels::PageSelectOptions> sparse;
  // Tests: called with every selection stage 1 makes, [n_tiles, kv_heads, n] int64.
  std::function<void(int64_t chunk, int64_t layer, const at::Tensor& selection)> on_selection;
  // Tests: which chunks stage 2 keeps (overrides the Bernoulli draws; the kept ones are still
  // weighted 1/chunk_fraction), to enumerate every selection.
  std::function<bool(int64_t chunk)> keep_chunk;
  // Asked after every chunk of either stage; when it returns true the sequence stops and the
  // trainer returns CANCELLED (gradients of the partial sequence must be discarded).
  std::function<bool()> should_stop;
};

struct SequenceLoss {
  double loss_sum = 0;       // sum of CE over label tokens (not scaled)
  int64_t label_tokens = 0;  // tokens that carried a label
  double router_aux = 0;     // training, MoeConfig::aux_loss_coef > 0: the router's auxiliary loss (not weighted)
};

// Per position of an evaluated sequence (ChunkTrainer::EvalSequence): the cross-entropy of its
// label, and whether greedy decoding would emit the label there (its logits' argmax); positions
// without a label: NaN and false. A span of labels is what greedy decoding continues its prefix
// with exactly when every one of its positions is a hit.
struct TokenScores {
  std::vector<double> loss;
  std::vector<bool> hit;
};

// Seconds of each chunk of the last sequence, in the order the chunks ran: wall clock on the
// CPU; on a CUDA device, device time between CUDA events recorded at the chunk boundaries on
// the current stream, read once when the sequence ends (no synchronisation per chunk).
struct ChunkTimes {
  std::vector<double> forward;   // stage 1 (sparse: chunks overlap, so from one chunk's end to the next's)
  std::vector<double> backward;  // stage 2 (recompute + backward)
};

// Sparse attention over the last sequence, summed over chunks, layers, query tiles and KV
// heads: the past pages attended, and the past pages there were. selected / past is the
// attention's density (1 for dense).
struct SparseStats {
  int64_t selected_pages = 0;
  int64_t past_pages = 0;
  // Query-key pairs attended, over layers and query heads (the chunks' own causal pairs
  // included): the attention's model FLOPs are 12 * head_dim * attended_pairs.
  double attended_pairs = 0;
};

// A chunk's inputs, on the device (uploaded without waiting for it), and what the host decides
// from: its document starts (the attention's path) and labels (the loss's blocks), on the CPU,
// so that no step of either stage waits for the device.
struct Chunk {
  int64_t index = 0;
  int64_t begin = 0, end = 0;
  bool last = false;  // the sequence's last chunk (end == its size)
  ChunkInput input;
  at::Tensor doc_start_host;  // [C] int64, CPU
  at::Tensor labels_host;     // [C] int64, CPU
  int64_t label_tokens = 0;   // labels that are not kIgnoreIndex
};

// Chunk `index` of `seq`, made when the chunk runs (not for the whole sequence up front: that
// would be O(T) memory beside the pages).
Chunk MakeChunk(const Transformer& model, const TokenSequence& seq, int64_t index, int64_t chunk_tokens, bool training,
                uint64_t dropout_seed);

// Laps between chunk boundaries (ChunkTimes). On CUDA the launches of a chunk return long
// before its kernels finish, so host time would measure launching, not the chunk.
class ChunkClock {
 public:
  explicit ChunkClock(const at::Device& device);
  // Ends the current lap; its seconds go to `out` (once Finish() ran, on CUDA).
  void Lap(std::vector<double>* out);
  // Resolves the laps taken on CUDA (waits for the last boundary's event).
  void Finish();

 private:
  void Mark();

  const bool cuda_;
  const c10::DeviceIndex device_index_;
  std::chrono::steady_clock::time_point last_;
  std::vector<std::vector<double>*> laps_;  // CUDA: lap i ends at events_[i + 1]
#if defined(OOMB_HAVE_CUDA)
  std::vector<at::cuda::CUDAEvent> events_;
#endif
};

}  // namespace oomb

#endif  // OOMB_WORKER_TRAIN_CHUNK_H_
