#include "worker/train/chunk_trainer.h"

#include <ATen/ATen.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <limits>
#include <memory>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "kernels/torch/chunked_cross_entropy.h"
#include "kernels/torch/gpu_timeline.h"
#include "worker/common/status.h"
#include "worker/kv/copy_engine.h"
#include "worker/paging/page_table.h"
#include "worker/train/greedy_decoder.h"
#include "worker/train/torch_status.h"

namespace oomb {
namespace {

// Tracks the bytes of CPU tensor allocations made on this thread while installed (LibTorch's
// memory-profiling hook), and their peak. KV pages live in preallocated arenas and are not
// counted here.
class AllocationTracker : public c10::MemoryReportingInfoBase {
 public:
  void reportMemoryUsage(void*, int64_t alloc_size, size_t, size_t, c10::Device) override {
    const int64_t now = current_.fetch_add(alloc_size) + alloc_size;
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
  }
  bool memoryProfilingEnabled() const override { return true; }
  int64_t peak() const { return peak_.load(); }

 private:
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
};

// Stage 2's injection of what later chunks left in a chunk's gradient pages: the identity on a
// layer's K and V in forward; in backward it adds dK, dV (the layer's pages, as `read` returns
// them, [C, kv_heads, D] each, in K's dtype) to the gradients flowing back into K and V (one
// rounding, as autograd's own sum of the two would be). So a layer's pages are read only when
// the backward reaches that layer, not all before the backward starts: their copy from the host
// then waits for the additions into that layer's pages (which the chunk after queued a chunk
// earlier), not for every addition of the chunk after (the last of which, into layer 0, would
// hold up the whole backward). `read` may start the next layer's read.
struct LaterGradients : torch::CustomClassHolder {
  std::function<KvStore::KvPair()> read;
};

class InjectLaterGradients : public torch::autograd::Function<InjectLaterGradients> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& k,
                                                const at::Tensor& v, c10::intrusive_ptr<LaterGradients> later) {
    ctx->saved_data["later"] = c10::IValue::make_capsule(std::move(later));
    return {k, v};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto later = c10::static_intrusive_pointer_cast<LaterGradients>(ctx->saved_data["later"].toCapsule());
    const auto [dk, dv] = later->read();
    const auto add = [](const at::Tensor& flowing, const at::Tensor& injected) {
      return flowing.defined() ? flowing + injected : injected;
    };
    return {ctx->needs_input_grad(0) ? add(grads[0], dk) : at::Tensor(),
            ctx->needs_input_grad(1) ? add(grads[1], dv) : at::Tensor(), at::Tensor()};
  }
};

// The gradients that later chunks left in chunk `c`'s pages at `layer`, weighted by 1/p
// (SpaCO's weight of a kept chunk; 1 for the exact trainer), in `dtype`; reading them starts
// the read of the layer below (the backward comes down the layers). Called inside autograd's
// backward, which can only throw: a store error leaves as a StatusError (torch_status.h).
c10::intrusive_ptr<LaterGradients> LaterGradientsOf(KvStore& store, const Chunk& c, int64_t layer, double p,
                                                    at::ScalarType dtype) {
  auto later = c10::make_intrusive<LaterGradients>();
  later->read = [&store, &c, layer, p, dtype]() -> KvStore::KvPair {
    auto grads = store.ReadGrad(layer, c.begin, c.end);
    if (!grads.ok()) throw StatusError(grads.status());
    const absl::Status next = store.PrefetchGrad(layer - 1, c.begin, c.end);
    if (!next.ok()) throw StatusError(next);
    const auto& [dk, dv] = *grads;
    if (p == 1.0) return {dk.to(dtype), dv.to(dtype)};
    return {(dk / p).to(dtype), (dv / p).to(dtype)};
  };
  return later;
}

// The swap of `options` (null when they ask for none, or the training is sparse or SpaCO's), its
// results moved by `pools`' copy engine or by `own_copies` (made here if they have none).
std::unique_ptr<SwappedAttention> MakeSwap(const Transformer* model, const KvPools& pools,
                                           const ChunkTrainerOptions& options,
                                           std::unique_ptr<CopyEngine>* own_copies) {
  if (options.swap_budget_bytes <= 0 || options.sparse.has_value() || options.chunk_fraction < 1.0) return nullptr;
  CopyEngine* copies = pools.copies;
  if (copies == nullptr) {
    *own_copies = std::make_unique<CopyEngine>(model->device());
    copies = own_copies->get();
  }
  return std::make_unique<SwappedAttention>(model, copies, options.chunk_tokens, options.swap_budget_bytes,
                                            options.swap_min_key_tokens);
}

}  // namespace

ChunkTrainer::ChunkTrainer(const Transformer* model, KvPools pools, ChunkTrainerOptions options)
    : model_(model),
      pools_(pools),
      options_(std::move(options)),
      swap_(MakeSwap(model, pools_, options_, &own_copies_)),
      attention_(MakeAttention(model, pools_, options_, swap_.get())),
      stage_one_(model, attention_.get(), options_) {}

int64_t ChunkTrainer::NumChunks(const TokenSequence& seq) const {
  return (seq.size() + options_.chunk_tokens - 1) / options_.chunk_tokens;
}

bool ChunkTrainer::KeepChunk(int64_t index, uint64_t seed) const {
  if (options_.keep_chunk) return options_.keep_chunk(index);
  if (options_.chunk_fraction >= 1.0) return true;
  // Output `index` of the SplitMix64 stream seeded with mix(seed): a uniform draw in [0, 1) per
  // chunk, independent across chunks and sequences.
  const auto mix = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  const uint64_t z = mix(mix(seed) + static_cast<uint64_t>(index + 1) * 0x9E3779B97F4A7C15ull);
  return static_cast<double>(z >> 11) * 0x1.0p-53 < options_.chunk_fraction;
}

absl::Status ChunkTrainer::CheckStop() const {
  if (options_.should_stop && options_.should_stop()) return absl::CancelledError("stopped at a chunk boundary");
  return absl::OkStatus();
}

absl::Status ChunkTrainer::DropUnreadGradients(const TokenSequence& seq, uint64_t seed, KvStore& store) const {
  const int64_t n = NumChunks(seq), C = options_.chunk_tokens, T = seq.size();
  int64_t kept = 0;
  for (int64_t index = 0; index < n; ++index) {
    if (KeepChunk(index, seed)) {
      ++kept;
    } else {
      store.DropGradients(index * C, std::min(T, (index + 1) * C));
    }
  }
  if (kept == n) return absl::OkStatus();
  // The plan makes room for all but the unlikeliest draws (worker/plan/memory_planner.h); this
  // one is checked before any work. No later chunk adds to the last chunk's pages.
  const int64_t needed = store.table().GradPagesKept(TokensBeforeLastChunk(T, C)) * model_->config().num_layers;
  int64_t free_pages = pools_.grad->stats().free_pages();
  if (pools_.grad_host != nullptr) free_pages += pools_.grad_host->stats().free_pages();
  if (needed > free_pages) {
    return WithReason(absl::ResourceExhaustedError(absl::StrCat(
                          "backward.chunk_fraction ", options_.chunk_fraction, ": this sequence's draw backpropagates ",
                          kept, " of its ", n, " chunks, whose KV-gradient pages (up to ", needed, ") exceed the ",
                          free_pages, " free in the pools")),
                      Reason::kDoesNotFit);
  }
  return absl::OkStatus();
}

PastReach ChunkTrainer::Reach() const {
  return PastReach{.windows = model_->spec().Windows(), .chunk_tokens = options_.chunk_tokens};
}

absl::StatusOr<std::vector<int64_t>> ChunkTrainer::Generate(const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                                                            std::optional<int64_t> stop) {
  OOMB_RETURN_IF_ERROR(CheckStop());
  GreedyDecoder decoder(*model_, pools_, options_.chunk_tokens);
  return decoder.Continue(prompt, max_new_tokens, stop);
}

absl::StatusOr<SequenceLoss> ChunkTrainer::EvalSequence(const TokenSequence& seq, TokenScores* scores) {
  SequenceLoss loss;
  if (scores != nullptr) {
    scores->loss.assign(seq.size(), std::numeric_limits<double>::quiet_NaN());
    scores->hit.assign(seq.size(), false);
  }
  const absl::Status s = Guarded([&]() -> absl::Status {
    KvStore store(pools_, model_->config().num_layers, Reach());
    OOMB_ASSIGN_OR_RETURN(loss, stage_one_.Run(seq, NumChunks(seq), /*with_loss=*/true, /*training=*/false, 0, store,
                                               /*clock=*/nullptr, /*times=*/nullptr, scores));
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return loss;
}

absl::StatusOr<SequenceLoss> ChunkTrainer::TrainSequence(const TokenSequence& seq, double loss_scale,
                                                         uint64_t dropout_seed, double aux_scale) {
  auto tracker = std::make_shared<AllocationTracker>();
  c10::DebugInfoGuard track(c10::DebugInfoKind::PROFILER_STATE, tracker);
  for (PagePool* pool : {pools_.kv, pools_.grad, pools_.kv_host, pools_.grad_host}) {
    if (pool != nullptr) pool->ResetPeak();
  }
  const int64_t to_device = pools_.copies != nullptr ? pools_.copies->bytes_to_device() : 0;
  const int64_t to_host = pools_.copies != nullptr ? pools_.copies->bytes_to_host() : 0;
  chunk_times_ = ChunkTimes();
  SequenceLoss loss;
  const absl::Status s = Guarded([&]() -> absl::Status {
    ChunkClock clock(model_->device());
    KvStore store(pools_, model_->config().num_layers, Reach());
    StageTwo two;
    two.loss_scale = loss_scale;
    two.aux_scale = aux_scale;
    two.dropout_seed = dropout_seed;
    absl::StatusOr<SequenceLoss> stages = RunStages(seq, two, store, clock);
    if (absl::IsCancelled(stages.status())) clock.Finish();  // the laps until the stop (chunk_times)
    OOMB_ASSIGN_OR_RETURN(loss, std::move(stages));
    return absl::OkStatus();
  });
  memory_.activation_peak_bytes = tracker->peak();
  const auto peak = [](const PagePool* pool) {
    return pool == nullptr ? 0 : pool->stats().peak_used_pages * pool->stats().bytes_per_page;
  };
  memory_.kv_peak_bytes = peak(pools_.kv);
  memory_.kv_grad_peak_bytes = peak(pools_.grad);
  memory_.host_kv_peak_bytes = peak(pools_.kv_host) + peak(pools_.grad_host);
  if (pools_.copies != nullptr) {
    memory_.bytes_to_device = pools_.copies->bytes_to_device() - to_device;
    memory_.bytes_to_host = pools_.copies->bytes_to_host() - to_host;
  }
  memory_.swapped_bytes = swap_ != nullptr ? swap_->swapped_bytes() : 0;
  memory_.swapped_chunks = swap_ != nullptr ? swap_->swapped_chunks() : 0;
  memory_.swap_host_bytes = swap_ != nullptr ? swap_->host_bytes() : 0;
  if (swap_ != nullptr) swap_->EndSequence();
  if (!s.ok()) return s;
  return loss;
}

absl::StatusOr<SequenceLoss> ChunkTrainer::RunStages(const TokenSequence& seq, StageTwo& two, KvStore& store,
                                                     ChunkClock& clock) {
  const int64_t last = NumChunks(seq) - 1;
  OOMB_RETURN_IF_ERROR(DropUnreadGradients(seq, two.dropout_seed, store));
  // Exact training: stage 2 gives every chunk's loss; dense, chunk N-1's KV is never read (see
  // the header).
  two.with_loss = options_.chunk_fraction == 1.0;
  const bool trimmed = two.with_loss && !options_.sparse.has_value();
  RouterBalance balance;
  if (model_->config().moe.aux_loss_coef > 0) two.balance = &balance;
  if (swap_ != nullptr) swap_->BeginSequence(last + 1);
  kernels::timeline::Stage("stage1");
  const absl::Cleanup no_stage = [] { kernels::timeline::Stage(nullptr); };
  OOMB_ASSIGN_OR_RETURN(SequenceLoss loss, stage_one_.Run(seq, trimmed ? last : last + 1, /*with_loss=*/!two.with_loss,
                                                          /*training=*/true, two.dropout_seed, store, &clock,
                                                          &chunk_times_, /*scores=*/nullptr, two.balance));
  if (two.balance != nullptr && !trimmed) balance.Weigh();  // stage 1 tallied every chunk
  kernels::timeline::Stage("stage2");
  kernels::timeline::Mark("model");
  two.loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(model_->device()));
  for (int64_t index = last; index >= 0; --index) {
    if (KeepChunk(index, two.dropout_seed)) OOMB_RETURN_IF_ERROR(Backpropagate(seq, index, last, two, store));
    // After chunk `index`'s backward (or its drop, SpaCO's: it passes nothing on), nothing reads
    // its pages again.
    store.ReleaseFrom(index * options_.chunk_tokens);
    clock.Lap(&chunk_times_.backward);
    OOMB_RETURN_IF_ERROR(CheckStop());
  }
  clock.Finish();
  if (two.with_loss) {
    loss.loss_sum = two.loss_sum.item<double>();
    loss.label_tokens = two.label_tokens;
  }
  if (balance.weighed()) loss.router_aux = balance.value.item<double>();
  return loss;
}

absl::Status ChunkTrainer::Backpropagate(const TokenSequence& seq, int64_t index, int64_t last, StageTwo& two,
                                         KvStore& store) {
  Chunk c = MakeChunk(*model_, seq, index, options_.chunk_tokens, /*training=*/true, two.dropout_seed);
  c.input.balance = two.balance;
  OOMB_RETURN_IF_ERROR(attention_->BeforeRecompute(c, store));
  const double p = options_.chunk_fraction;
  const AttentionFn attention = [&](int64_t layer, const at::Tensor& q, const at::Tensor& k_in,
                                    const at::Tensor& v_in) {
    at::Tensor k = k_in, v = v_in;
    if (index != last && (k.requires_grad() || v.requires_grad())) {
      auto kv = InjectLaterGradients::apply(k, v, LaterGradientsOf(store, c, layer, p, k.scalar_type()));
      k = kv[0];
      v = kv[1];
    }
    return attention_->Recompute(c, layer, q, k, v, store);
  };
  const at::Tensor hidden = model_->Hidden(c.input, attention);
  // The top layer's gradients are read first in backward.
  if (index != last) OOMB_RETURN_IF_ERROR(store.PrefetchGrad(model_->config().num_layers - 1, c.begin, c.end));
  const at::Tensor chunk_loss = model_->LmHeadLoss(hidden, c.labels_host, options_.ce_rows_per_block);
  if (two.with_loss) {
    two.loss_sum.add_(chunk_loss.detach());
    two.label_tokens += c.label_tokens;
  }
  at::Tensor objective = chunk_loss * two.loss_scale;
  if (two.balance != nullptr) {
    // Weighed: this chunk's share of the auxiliary loss's gradient; else the chunk completed the
    // tally (stage 1 skipped it) and the loss itself carries it.
    RouterBalance& b = *two.balance;
    const at::Tensor aux = b.weighed() ? b.term : b.Loss();
    if (aux.defined())
      objective = objective + aux.to(objective.scalar_type()) * (two.aux_scale * model_->config().moe.aux_loss_coef);
    if (!b.weighed()) b.Weigh();
    b.term = at::Tensor();
  }
  torch::autograd::backward({objective}, {at::full({}, 1.0 / p, chunk_loss.options())});
  return absl::OkStatus();
}

}  // namespace oomb
