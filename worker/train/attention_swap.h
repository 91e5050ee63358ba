// Swap instead of recompute (docs/ARCHITECTURE.md §3; MEMO's token-wise choice): stage 1 keeps the
// attention results (kernels/torch/paged_attention.h AttentionResult: output and log-sum-exp)
// of the sequence's latest chunks in pinned host memory, and stage 2 hands them back to the
// attention instead of recomputing its forward over the past. The latest chunks go first: their
// attention reads the most keys, and what crosses the bus is the same for every chunk. Which
// chunks, and how a record is laid out: worker/paging/swap_layout.h (the memory
// planner sizes the budget and the trainer follows it).
//
// Exact: stage 2's recompute gives the attention the same inputs stage 1 did (deterministic
// kernels), so stage 1's result is the one stage 2 would compute, and the backward, which reads
// only q, k, v, the output and the log-sum-exp, is the recompute path's. A result that does not
// fit its record (the blockwise path on a GPU keeps float32) is not kept, and stage 2 recomputes
// that layer.
//
// The copies run on the copy engine's streams (worker/kv/copy_engine.h): stage 1 queues each
// result's copy to the host behind the work that computes it, stage 2 queues a layer's upload
// one layer ahead of the recompute that reads it. Dense exact training only (the trainer makes
// one only then): sparse attention recomputes with its selections, SpaCO drops chunks.
//
// The records' host memory is allocated once, when the trainer is made (budget_bytes of it), and
// reused by every sequence.
//
// Thread-safety: one per trainer, used by its thread.
#ifndef OOMB_WORKER_TRAIN_ATTENTION_SWAP_H_
#define OOMB_WORKER_TRAIN_ATTENTION_SWAP_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "kernels/torch/paged_attention.h"
#include "worker/kv/copy_engine.h"
#include "worker/model/transformer.h"
#include "worker/paging/swap_layout.h"

namespace oomb {

class SwappedAttention {
 public:
  // Records of chunks of `chunk_tokens` for `model`, as many as `budget_bytes` hold (allocated
  // now; when the host has no more pinned memory, fewer, with a warning), moved by `copies`
  // (which must outlive this).
  SwappedAttention(const Transformer* model, CopyEngine* copies, int64_t chunk_tokens, int64_t budget_bytes,
                   int64_t min_key_tokens);

  // A training sequence of `chunks` chunks begins: decides which are swapped.
  void BeginSequence(int64_t chunks);
  // The sequence is done (or failed): nothing is swapped until the next BeginSequence.
  void EndSequence();
  bool Swaps(int64_t chunk) const { return chunk >= first_ && chunk < end_; }

  // Stage 1: chunk `chunk`'s result at `layer`, on the device; queues its copy to the host.
  void Keep(int64_t chunk, int64_t layer, const kernels::AttentionResult& result);
  // Stage 2, going up the layers of `chunk`: the result kept at `layer`, on the device and
  // ready for the current stream (nullopt: not kept, recompute); starts the next layer's upload.
  // StartUpload(chunk, 0) before the chunk's recompute brings the first one in early.
  std::optional<kernels::AttentionResult> Take(int64_t chunk, int64_t layer);
  void StartUpload(int64_t chunk, int64_t layer);

  // This sequence's chunks whose every layer was kept, and the bytes kept on the host.
  int64_t swapped_chunks() const;
  int64_t swapped_bytes() const { return swapped_bytes_; }
  // The host memory the records hold.
  int64_t host_bytes() const { return static_cast<int64_t>(memory_.size()) * layout_.record_bytes; }
  const SwapLayout& layout() const { return layout_; }

 private:
  struct Record {
    bool kept = false;
    at::Tensor out, lse;            // views of the record's host memory, shaped as kept
    std::array<at::Tensor, 2> aux;  // the fused kernel's, left on the device (a few bytes)
    std::shared_ptr<PendingFetch> out_up, lse_up;
  };
  Record* Find(int64_t chunk, int64_t layer);

  CopyEngine* copies_;
  const int64_t layers_;
  const int64_t chunk_tokens_;
  const SwapLayout layout_;
  std::vector<at::Tensor> memory_;  // one per record, record_bytes each, pinned on a GPU
  int64_t first_ = 0, end_ = 0;     // chunks [first_, end_) are swapped
  std::vector<Record> records_;     // [(chunk - first_) * layers + layer], memory_[same index]
  int64_t swapped_bytes_ = 0;
};

}  // namespace oomb

#endif  // OOMB_WORKER_TRAIN_ATTENTION_SWAP_H_
