// How chunk-recurrent training attends over a sequence's past (docs/ARCHITECTURE.md §3, §5): two
// strategies, chosen once per trainer (MakeAttention), behind one interface the trainer's
// stages call without knowing which.
//
//   dense   every past token, read in key blocks from the KV store (what is read is known in
//           advance, so the store prefetches it); stage 1 runs one chunk at a time. Stage 2
//           replays the results stage 1 swapped to the host instead of recomputing them
//           (attention_swap.h).
//   sparse  per query tile, the past pages a selection scores highest from the page summaries
//           (plus sink and local pages; kernels/torch/page_select.h). Stage 1 makes the
//           selection of every chunk and layer, keeps it (int32, on the host) and stage 2
//           recomputes with that same selection, so the gradients are those of full-sequence
//           backpropagation through attention restricted to the selected pages. Which host
//           pages to fetch is known only once a selection reaches the host, so stage 1 runs
//           kSparseLanes chunks at once (stage_one.h) and fetches one chunk's pages under the
//           others' compute. KV-gradient pages are allocated only for pages some chunk selected.
//           Sliding-window layers (Gemma 3's local layers) select nothing: they attend densely
//           over their window, as dense attention does, in both stages; the selection, the page
//           summaries and stats() are the global layers'.
//
// Both read the past exactly as stage 1 did when stage 2 recomputes (deterministic kernels), and
// both add the past's gradient contributions into the KV store in place, outside autograd.
//
// Thread-safety: one strategy per trainer, used by its thread.
#ifndef OOMB_WORKER_TRAIN_ATTENTION_H_
#define OOMB_WORKER_TRAIN_ATTENTION_H_

#include <ATen/ATen.h>
#include <c10/core/Event.h>

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "worker/kv/kv_store.h"
#include "worker/train/attention_swap.h"
#include "worker/train/chunk.h"

namespace oomb {

// A sparse selection of one chunk's pages at one layer, in stage 1: on the device, its host
// copy (pinned on a GPU, where it arrives asynchronously: `copied` is its end), and once
// StartFetch ran, the fetch of the host pages it names. Dense attention has none.
struct LayerSelection {
  at::Tensor device, host;
  std::optional<c10::Event> copied;  // GPU only
  bool fetching = false;             // StartFetch ran
  KvStore::PagesInFlight pages;
};

class Attention {
 public:
  virtual ~Attention() = default;

  // How many chunks stage 1 runs at once.
  virtual size_t lanes() const = 0;
  // A sequence's stage 1 begins (`chunks` of it will run; `training`: keep what stage 2 needs).
  virtual void BeginSequence(const TokenSequence& seq, int64_t chunks, bool training) = 0;
  // Stage 1: chunk `c` may run `layer` (the chunk before has written it). Sparse: selects the
  // pages from the layer's queries `q` into `selection` and queues its copy to the host without
  // waiting for it.
  virtual void Prepare(const Chunk& c, int64_t layer, const at::Tensor& q, std::optional<LayerSelection>* selection) {}
  // Stage 1: the device has other work queued behind `c`'s preparation of `layer`. Sparse: waits
  // for the selection on the host, counts it in stats(), and starts fetching its host pages (once).
  virtual absl::Status StartFetch(const Chunk& c, int64_t layer, LayerSelection* selection, KvStore& store) {
    return absl::OkStatus();
  }
  // Stage 1: chunk `c` attends at `layer` over its past, and appends its own K and V (after
  // RoPE) to the store; dense attention does not append the sequence's last chunk (`c.last`),
  // which no later chunk reads, so a sequence's pages are those of its other chunks.
  virtual absl::StatusOr<at::Tensor> Forward(const Chunk& c, int64_t layer, const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v, std::optional<LayerSelection>* selection,
                                             KvStore& store) = 0;
  // Stage 2: before chunk `c`'s recompute.
  virtual absl::Status BeforeRecompute(const Chunk& c, KvStore& store) { return absl::OkStatus(); }
  // Stage 2: the recompute's attention at `layer`, with the graph, reading the past as stage 1
  // did; its backward adds the past's dK, dV into the store's gradient pages.
  virtual at::Tensor Recompute(const Chunk& c, int64_t layer, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, KvStore& store) = 0;

  // Sparse: the pages attended over the sequence's stage 1 in the global layers (zero for dense).
  const SparseStats& stats() const { return stats_; }

 protected:
  SparseStats stats_;
};

// The strategy `options` name (options.sparse set: sparse), over `pools`' pages. Dense attention
// with `swap` keeps the results of the chunks it swaps in stage 1 and replays them in stage 2
// (attention_swap.h); sparse attention ignores it.
std::unique_ptr<Attention> MakeAttention(const Transformer* model, const KvPools& pools,
                                         const ChunkTrainerOptions& options, SwappedAttention* swap = nullptr);

}  // namespace oomb

#endif  // OOMB_WORKER_TRAIN_ATTENTION_H_
