// Stage 1 of chunk-recurrent training (docs/ARCHITECTURE.md §3): chunks 0..N-1 forward without a
// graph, each attending over the pages of the chunks before it and appending its own K and V;
// the loss when asked. What this class adds to that algorithm is its schedule.
//
// Chunk i at layer l reads what the chunks before it wrote at layer l (their KV pages and,
// sparse, the summaries its selection scores), and nothing else of theirs. So Attention::lanes()
// chunks run at once (one for dense attention, which knows what it reads in advance and
// prefetches it): chunk i + 1 prepares layer l as soon as chunk i has written it, and the chunk
// whose preparation is oldest runs its layer next. A sparse preparation (the page selection) is
// queued, another chunk's layer is queued behind it, and only then does the host wait for the
// selection and start the fetch (Attention::StartFetch): the device computes the other chunks'
// layers meanwhile, and the fetch comes in under them, where one chunk alone would wait for
// both (its selection needs the layer's queries, so it cannot be fetched earlier). Each chunk's
// own operations run in the same order as alone (Transformer::Cursor), so its values, its
// selections and what it writes are the same as without the schedule.
//
// Thread-safety: one per trainer, used by its thread.
#ifndef OOMB_WORKER_TRAIN_STAGE_ONE_H_
#define OOMB_WORKER_TRAIN_STAGE_ONE_H_

#include <ATen/ATen.h>

#include <array>
#include <deque>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "worker/kv/kv_store.h"
#include "worker/train/attention.h"
#include "worker/train/chunk.h"

namespace oomb {

class StageOne {
 public:
  StageOne(const Transformer* model, Attention* attention, const ChunkTrainerOptions& options)
      : model_(model), attention_(attention), options_(options) {}

  // Runs chunks [0, chunks) of `seq` into `store`, with their summed loss when `with_loss` (else
  // zero). `training`: the attention keeps what stage 2 needs. `clock`, when set, takes a lap
  // into times->forward after every chunk. `scores`, when set (with `with_loss`), gets every
  // position's (sized to the sequence by the caller). `balance`, when set, tallies the chunks'
  // routing (RouterBalance). CANCELLED when should_stop asked at a chunk boundary; the store's
  // errors otherwise.
  absl::StatusOr<SequenceLoss> Run(const TokenSequence& seq, int64_t chunks, bool with_loss, bool training,
                                   uint64_t dropout_seed, KvStore& store, ChunkClock* clock, ChunkTimes* times,
                                   TokenScores* scores = nullptr, RouterBalance* balance = nullptr);

 private:
  // A chunk in flight: its forward so far, the attention inputs of its next layer and, sparse,
  // that layer's selection once made.
  struct Lane {
    Chunk c;
    Transformer::Cursor cursor;
    std::array<at::Tensor, 3> qkv;
    std::optional<LayerSelection> selection;
  };
  struct Pass;  // one Run's state (stage_one.cc)

  // Starts chunks while lanes are free.
  void StartLanes(Pass& pass) const;
  // Prepares every layer that can be: a lane's next one, once the chunk before has written it.
  void PrepareReady(Pass& pass) const;
  // Runs the oldest prepared layer; when it ends its chunk, the chunk's loss and the lap.
  absl::Status RunNext(Pass& pass);
  // The loss of a lane whose chunk has run every layer.
  void AddLoss(Pass& pass, Lane& lane) const;

  const Transformer* model_;
  Attention* attention_;
  const ChunkTrainerOptions options_;
};

}  // namespace oomb

#endif  // OOMB_WORKER_TRAIN_STAGE_ONE_H_
