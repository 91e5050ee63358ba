#include "worker/train/stage_one.h"

#include <algorithm>

#include "kernels/torch/chunked_cross_entropy.h"
#include "worker/common/status.h"

namespace oomb {

struct StageOne::Pass {
  const TokenSequence& seq;
  int64_t chunks;
  bool with_loss, training;
  uint64_t dropout_seed;
  KvStore& store;
  ChunkClock* clock;
  ChunkTimes* times;
  std::deque<std::unique_ptr<Lane>> lanes;  // in chunk order
  std::deque<Lane*> ready;                  // lanes whose next layer is prepared, oldest first
  int64_t next = 0;
  at::Tensor loss_sum;  // with_loss: on the device, in float64
  SequenceLoss loss;
  TokenScores* scores = nullptr;
  RouterBalance* balance = nullptr;
};

absl::StatusOr<SequenceLoss> StageOne::Run(const TokenSequence& seq, int64_t chunks, bool with_loss, bool training,
                                           uint64_t dropout_seed, KvStore& store, ChunkClock* clock, ChunkTimes* times,
                                           TokenScores* scores, RouterBalance* balance) {
  at::NoGradGuard no_grad;
  attention_->BeginSequence(seq, chunks, training);
  Pass pass{seq, chunks, with_loss, training, dropout_seed, store, clock, times, {}, {}, 0, {}, {}, scores, balance};
  StartLanes(pass);
  PrepareReady(pass);
  while (!pass.ready.empty()) OOMB_RETURN_IF_ERROR(RunNext(pass));
  if (pass.loss_sum.defined()) pass.loss.loss_sum = pass.loss_sum.item<double>();  // summed on the device, read once
  return pass.loss;
}

void StageOne::StartLanes(Pass& pass) const {
  while (pass.lanes.size() < attention_->lanes() && pass.next < pass.chunks) {
    auto lane = std::make_unique<Lane>();
    lane->c = MakeChunk(*model_, pass.seq, pass.next++, options_.chunk_tokens, pass.training, pass.dropout_seed);
    lane->c.input.balance = pass.balance;
    lane->cursor = model_->Begin(lane->c.input);
    lane->qkv = model_->AttentionInputs(lane->cursor);
    pass.lanes.push_back(std::move(lane));
  }
}

void StageOne::PrepareReady(Pass& pass) const {
  const int64_t L = model_->config().num_layers;
  for (size_t i = 0; i < pass.lanes.size(); ++i) {
    Lane& lane = *pass.lanes[i];
    if (lane.cursor.layer == L || std::find(pass.ready.begin(), pass.ready.end(), &lane) != pass.ready.end()) continue;
    if (i > 0 && pass.lanes[i - 1]->cursor.layer <= lane.cursor.layer) continue;
    attention_->Prepare(lane.c, lane.cursor.layer, lane.qkv[0], &lane.selection);
    pass.ready.push_back(&lane);
  }
}

absl::Status StageOne::RunNext(Pass& pass) {
  Lane& lane = *pass.ready.front();
  pass.ready.pop_front();
  const int64_t layer = lane.cursor.layer;
  // A no-op unless prepared just before: then there was no other work to queue behind it.
  if (lane.selection.has_value())
    OOMB_RETURN_IF_ERROR(attention_->StartFetch(lane.c, layer, &*lane.selection, pass.store));
  const auto& [q, k, v] = lane.qkv;
  OOMB_ASSIGN_OR_RETURN(const at::Tensor out, attention_->Forward(lane.c, layer, q, k, v, &lane.selection, pass.store));
  model_->FinishLayer(lane.cursor, out);
  if (lane.cursor.layer < model_->config().num_layers) {
    lane.qkv = model_->AttentionInputs(lane.cursor);
  } else {
    // The chunk is done. Chunks finish in order: a later one never passes an earlier one's layer.
    TORCH_INTERNAL_ASSERT(&lane == pass.lanes.front().get(), "stage 1: chunk ", lane.c.index, " finished out of order");
    if (pass.with_loss) AddLoss(pass, lane);
    pass.lanes.pop_front();
    if (pass.clock != nullptr) pass.clock->Lap(&pass.times->forward);
    if (options_.should_stop && options_.should_stop()) return absl::CancelledError("stopped at a chunk boundary");
    StartLanes(pass);
  }
  // The layers prepared before this one's work was queued can now fetch under it.
  const size_t queued_before = pass.ready.size();
  PrepareReady(pass);
  for (size_t i = 0; i < queued_before; ++i) {
    Lane* r = pass.ready[i];
    if (r->selection.has_value())
      OOMB_RETURN_IF_ERROR(attention_->StartFetch(r->c, r->cursor.layer, &*r->selection, pass.store));
  }
  return absl::OkStatus();
}

void StageOne::AddLoss(Pass& pass, Lane& lane) const {
  const at::Tensor hidden = model_->End(lane.cursor);
  if (!pass.loss_sum.defined()) pass.loss_sum = at::zeros({}, hidden.options().dtype(at::kDouble));
  pass.loss_sum.add_(model_->LmHeadLoss(hidden, lane.c.labels_host, options_.ce_rows_per_block));
  pass.loss.label_tokens += lane.c.label_tokens;
  if (pass.scores == nullptr) return;
  const auto [loss, hit] = model_->LmHeadScores(hidden, lane.c.labels_host, options_.ce_rows_per_block);
  const at::Tensor l = loss.to(at::kDouble).cpu(), h = hit.cpu();
  const int64_t* labels = lane.c.labels_host.data_ptr<int64_t>();
  for (int64_t i = 0; i < lane.c.end - lane.c.begin; ++i) {
    if (labels[i] == kernels::kIgnoreIndex) continue;
    pass.scores->loss[lane.c.begin + i] = l.data_ptr<double>()[i];
    pass.scores->hit[lane.c.begin + i] = h.data_ptr<bool>()[i];
  }
}

}  // namespace oomb
