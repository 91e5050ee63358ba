#include "worker/train/attention.h"

#include <ATen/DeviceAccelerator.h>

#include <algorithm>
#include <array>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kernels/torch/gpu_timeline.h"
#include "kernels/torch/sparse_attention.h"
#include "worker/common/status.h"

namespace oomb {
namespace {

// A store operation's value, or its status thrown out of the attention kernel's autograd (which
// calls these adapters and can only throw) to the trainer's boundary (torch_status.h).
template <typename T>
T ValueOrThrow(absl::StatusOr<T> v) {
  if (!v.ok()) throw StatusError(v.status());
  return *std::move(v);
}
void OkOrThrow(const absl::Status& s) {
  if (!s.ok()) throw StatusError(s);
}

// The past of one layer for one chunk, read from and accumulated into the KV store.
class LayerPast final : public kernels::PastKv {
 public:
  // `key_block`: the attention's key block (what a prefetch of the next layer brings in, from
  // `next_first_key`, the first key the next layer's attention reads in the direction of travel;
  // -1: the next layer does not read a range, so nothing is prefetched for it).
  LayerPast(KvStore* store, int64_t layer, int64_t past_tokens, int64_t key_block,
            std::array<int64_t, 2> next_first_key)
      : store_(store),
        layer_(layer),
        past_tokens_(past_tokens),
        key_block_(key_block),
        next_first_key_(next_first_key) {}
  int64_t past_tokens() const override { return past_tokens_; }
  std::pair<at::Tensor, at::Tensor> Read(int64_t begin, int64_t end) override {
    return ValueOrThrow(store_->Read(layer_, begin, end));
  }
  void AccumulateGrad(int64_t begin, const at::Tensor& dk, const at::Tensor& dv) override {
    OkOrThrow(store_->AccumulateGrad(layer_, begin, dk, dv));
  }
  void Prefetch(int64_t begin, int64_t end, bool backward) override {
    OkOrThrow(store_->Prefetch(layer_, begin, end, backward));
  }
  // Forward goes up the layers, backward down: the next layer's first key block comes in while
  // the rest of this layer computes.
  void Finished(bool backward) override {
    const int64_t next = backward ? layer_ - 1 : layer_ + 1;
    if (next < 0) return;
    const int64_t first = next_first_key_[backward ? 0 : 1];
    if (first < 0) return;
    OkOrThrow(
        store_->Prefetch(next, first, std::min(past_tokens_, first / key_block_ * key_block_ + key_block_), backward));
  }

 private:
  KvStore* store_;
  int64_t layer_;
  int64_t past_tokens_;
  int64_t key_block_;
  std::array<int64_t, 2> next_first_key_;  // of the layer below, of the layer above
};

// How many layers ahead stage 2's sparse recompute prefetches (KvStore::kMaxPrefetches at most):
// between one layer's attention and the next, only the MLP and a projection run, about what a
// layer's selected host pages take to come in.
constexpr int64_t kRecomputeLead = 2;

// The selected past pages of one layer for one chunk. In stage 2, given the chunk's selections
// of every layer (stage 1's), it prefetches what the next attention reads: the recompute goes
// up the layers, the backward comes down, and the top layer's backward follows its recompute.
class LayerSparsePast final : public kernels::SparsePast {
 public:
  // `host_selection`: the layer's selection on the CPU. `selections`: empty (stage 1), or the
  // chunk's host selections, one per layer. `started`: stage 1's fetch of the selection's pages.
  LayerSparsePast(KvStore* store, int64_t layer, int64_t past_tokens, at::Tensor host_selection,
                  absl::Span<const at::Tensor> selections, KvStore::PagesInFlight* started = nullptr)
      : store_(store),
        layer_(layer),
        past_tokens_(past_tokens),
        host_selection_(std::move(host_selection)),
        selections_(selections),
        started_(started) {}
  int64_t past_tokens() const override { return past_tokens_; }
  std::pair<at::Tensor, at::Tensor> GatherPages(const at::Tensor& selection) override {
    return ValueOrThrow(store_->GatherPages(layer_, selection, host_selection_, started_));
  }
  void AccumulatePageGrad(const at::Tensor& selection, const at::Tensor& dk, const at::Tensor& dv) override {
    OkOrThrow(store_->AccumulatePageGrad(layer_, selection, host_selection_, dk, dv));
  }
  void Finished(bool backward) override {
    if (selections_.empty()) return;
    const int64_t layers = static_cast<int64_t>(selections_.size());
    if (backward) {
      if (layer_ > 0) Prefetch(layer_ - 1, /*with_grads=*/true);
    } else if (layer_ + 1 == layers) {  // the top layer's backward comes next
      Prefetch(layer_, /*with_grads=*/true);
    } else if (layer_ + kRecomputeLead < layers) {
      // The layers in between were prefetched by the layers below (the first ones before the
      // chunk's recompute, by BeforeRecompute).
      Prefetch(layer_ + kRecomputeLead, /*with_grads=*/false);
    }
  }

 private:
  // A layer without a selection (a sliding-window layer) reads its window itself.
  void Prefetch(int64_t layer, bool with_grads) const {
    if (selections_[layer].defined()) OkOrThrow(store_->PrefetchPages(layer, selections_[layer], with_grads));
  }

  KvStore* store_;
  int64_t layer_;
  int64_t past_tokens_;
  at::Tensor host_selection_;
  absl::Span<const at::Tensor> selections_;
  KvStore::PagesInFlight* started_;
};

// Dense attention of chunk `c` at `layer` over its past, read in key blocks from the store: the
// whole past of its document, or a sliding-window layer's window. Shared by both strategies
// (sparse attention attends densely in sliding-window layers).
class DensePast {
 public:
  // `prefetches(layer)`: whether `layer` reads ranges of the past (so a neighbour prefetches it).
  DensePast(const Transformer* model, const ChunkTrainerOptions& options, std::function<bool(int64_t)> prefetches)
      : model_(model),
        layers_(model->spec()),
        kernel_(options.gpu_attention_kernel),
        key_block_(model->device().is_cuda() ? options.gpu_attention_key_block : options.attention_key_block),
        prefetches_(std::move(prefetches)) {}

  at::Tensor Attend(const Chunk& c, int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    KvStore& store, kernels::AttentionSwap swap) const {
    std::shared_ptr<kernels::PastKv> past;
    if (c.begin > 0) {
      past = std::make_shared<LayerPast>(&store, layer, c.begin, key_block_,
                                         std::array<int64_t, 2>{FirstKey(c, layer - 1), FirstKey(c, layer + 1)});
    }
    const int64_t window = layers_.layers[layer].window;
    const at::Tensor first_key =
        window > 0 ? kernels::SlidingWindowStart(c.doc_start_host, c.begin, window) : c.doc_start_host;
    return kernels::PagedAttention(q, k, v, first_key, past, key_block_, kernel_, swap, model_->sinks(layer));
  }

 private:
  // The first key the chunk's queries see in `layer` (its first query's): its document's start,
  // or its window's; -1 for a layer that reads no range (nothing to prefetch).
  int64_t FirstKey(const Chunk& c, int64_t layer) const {
    const bool in_model = layer >= 0 && layer < static_cast<int64_t>(layers_.layers.size());
    if (in_model && !prefetches_(layer)) return -1;
    const int64_t doc = c.doc_start_host.numel() > 0 ? c.doc_start_host[0].item<int64_t>() : c.begin;
    const int64_t window = in_model ? layers_.layers[layer].window : 0;
    return window > 0 ? std::max(doc, c.begin - window + 1) : doc;
  }

  const Transformer* model_;
  const ModelSpec& layers_;
  const kernels::GpuAttentionKernel kernel_;
  const int64_t key_block_;
  const std::function<bool(int64_t)> prefetches_;
};

class DenseAttention final : public Attention {
 public:
  DenseAttention(const Transformer* model, const ChunkTrainerOptions& options, SwappedAttention* swap)
      : dense_(model, options, [](int64_t) { return true; }), swap_(swap) {}

  size_t lanes() const override { return 1; }
  void BeginSequence(const TokenSequence&, int64_t, bool) override {}

  absl::StatusOr<at::Tensor> Forward(const Chunk& c, int64_t layer, const at::Tensor& q, const at::Tensor& k,
                                     const at::Tensor& v, std::optional<LayerSelection>*, KvStore& store) override {
    kernels::AttentionResult kept;
    const bool swapped = swap_ != nullptr && swap_->Swaps(c.index);
    at::Tensor out = dense_.Attend(c, layer, q, k, v, store, {.keep = swapped ? &kept : nullptr, .replay = nullptr});
    if (swapped) swap_->Keep(c.index, layer, kept);
    // No later chunk reads the last one's KV: it takes no pages (attention.h).
    if (!c.last) OOMB_RETURN_IF_ERROR(store.Append(layer, k, v));
    return out;
  }
  absl::Status BeforeRecompute(const Chunk& c, KvStore&) override {
    if (swap_ != nullptr) swap_->StartUpload(c.index, 0);
    return absl::OkStatus();
  }
  at::Tensor Recompute(const Chunk& c, int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       KvStore& store) override {
    const std::optional<kernels::AttentionResult> kept =
        swap_ != nullptr ? swap_->Take(c.index, layer) : std::optional<kernels::AttentionResult>();
    return dense_.Attend(c, layer, q, k, v, store, {.keep = nullptr, .replay = kept.has_value() ? &*kept : nullptr});
  }

 private:
  const DensePast dense_;
  SwappedAttention* swap_;  // null: stage 2 recomputes every attention forward
};

class SparseAttention final : public Attention {
 public:
  SparseAttention(const Transformer* model, const KvPools& pools, const ChunkTrainerOptions& options)
      : model_(model),
        pools_(pools),
        options_(options),
        select_(*options.sparse),
        dense_(model, options, [this](int64_t layer) { return Windowed(layer); }) {
    select_.page_tokens = pools.kv->shape().page_tokens;
    for (int64_t layer = 0; layer < L(); ++layer) {
      summary_row_.push_back(Windowed(layer) ? -1 : global_layers_++);
    }
  }

  // Three chunks in flight, not two: stage 1 then waits less for selected host pages, at the
  // same device peak.
  size_t lanes() const override { return 3; }

  void BeginSequence(const TokenSequence& seq, int64_t chunks, bool training) override;
  void Prepare(const Chunk& c, int64_t layer, const at::Tensor& q, std::optional<LayerSelection>* selection) override;
  absl::Status StartFetch(const Chunk& c, int64_t layer, LayerSelection* s, KvStore& store) override;
  absl::StatusOr<at::Tensor> Forward(const Chunk& c, int64_t layer, const at::Tensor& q, const at::Tensor& k,
                                     const at::Tensor& v, std::optional<LayerSelection>* selection,
                                     KvStore& store) override;
  absl::Status BeforeRecompute(const Chunk& c, KvStore& store) override;
  at::Tensor Recompute(const Chunk& c, int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       KvStore& store) override;

 private:
  int64_t P() const { return select_.page_tokens; }
  int64_t L() const { return model_->config().num_layers; }
  // A sliding-window layer attends densely over its window: no selection, no summaries.
  bool Windowed(int64_t layer) const { return model_->spec().layers[layer].window > 0; }

  const Transformer* model_;
  const KvPools pools_;
  const ChunkTrainerOptions options_;
  kernels::PageSelectOptions select_;
  const DensePast dense_;
  std::vector<int64_t> summary_row_;  // [layer]: its row of summaries_ (-1: a sliding-window layer)
  int64_t global_layers_ = 0;
  bool training_ = false;
  at::Tensor summaries_;                // the page summaries of the global layers, [G, pages, (2,) kv_heads, D]
  std::vector<at::Tensor> selections_;  // training: [chunk * layers + layer], host int32 (undefined: windowed)
};

void SparseAttention::BeginSequence(const TokenSequence& seq, int64_t chunks, bool training) {
  const PageShape& ps = pools_.kv->shape();
  const int64_t pages = (seq.size() + ps.page_tokens - 1) / ps.page_tokens;
  std::vector<int64_t> shape = {global_layers_, pages, ps.kv_heads, ps.head_dim};
  if (select_.summary == kernels::PageSummary::kMinMax) shape.insert(shape.begin() + 2, 2);
  summaries_ = at::empty(shape, pools_.kv->arena().options());
  stats_ = SparseStats();
  training_ = training;
  selections_.clear();
  if (training) selections_.resize((seq.size() + options_.chunk_tokens - 1) / options_.chunk_tokens * L());
  (void)chunks;
}

void SparseAttention::Prepare(const Chunk& c, int64_t layer, const at::Tensor& q,
                              std::optional<LayerSelection>* selection) {
  TORCH_CHECK(c.begin % P() == 0, "sparse attention: chunk_tokens (", options_.chunk_tokens,
              ") must be a multiple of page_tokens (", P(), ")");
  if (Windowed(layer)) return;
  kernels::timeline::Mark("sparse.select");
  LayerSelection& s = selection->emplace();
  s.device = kernels::SelectPages(q, summaries_[summary_row_[layer]].slice(0, 0, c.begin / P()), c.input.doc_start,
                                  c.begin, select_);
  if (options_.on_selection) options_.on_selection(c.index, layer, s.device);
  // The host copy (which pages to fetch, and stage 2's selection): pinned on a GPU, so that the
  // copy does not wait here and stage 2 uploads it without waiting for the device.
  const bool gpu = s.device.is_cuda();
  s.host = at::empty(s.device.sizes(), at::TensorOptions().dtype(at::kInt).pinned_memory(gpu));
  s.host.copy_(s.device, /*non_blocking=*/gpu);
  if (gpu) {
    s.copied.emplace(s.device.device().type());
    s.copied->record(at::accelerator::getCurrentStream(s.device.device().index()));
  }
  if (training_) selections_[c.index * L() + layer] = s.host;
  kernels::timeline::Mark("model");
}

absl::Status SparseAttention::StartFetch(const Chunk& c, int64_t layer, LayerSelection* s, KvStore& store) {
  if (s->fetching) return absl::OkStatus();
  s->fetching = true;
  if (s->copied.has_value()) s->copied->synchronize();
  const int64_t C = c.end - c.begin;
  const int64_t H = model_->local_heads(), G = H / model_->local_kv_heads();
  const at::Tensor per_tile = s->host.ge(0).sum(at::IntArrayRef{1, 2}).to(at::kDouble);  // [n_tiles]
  const at::Tensor rows = (C - at::arange(0, C, P(), at::kLong)).clamp_max(P()).to(at::kDouble);
  stats_.selected_pages += s->host.ge(0).sum().item<int64_t>();
  stats_.past_pages += s->host.size(0) * s->host.size(1) * (c.begin / P());
  stats_.attended_pairs +=
      static_cast<double>(G * P()) * (per_tile * rows).sum().item<double>() + static_cast<double>(H) * C * (C + 1) / 2;
  if (c.begin > 0) {
    OOMB_ASSIGN_OR_RETURN(s->pages, store.StartGather(layer, s->host));
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> SparseAttention::Forward(const Chunk& c, int64_t layer, const at::Tensor& q,
                                                    const at::Tensor& k, const at::Tensor& v,
                                                    std::optional<LayerSelection>* selection, KvStore& store) {
  if (Windowed(layer)) {
    at::Tensor out = dense_.Attend(c, layer, q, k, v, store, {});
    OOMB_RETURN_IF_ERROR(store.Append(layer, k, v));
    return out;
  }
  LayerSelection& s = **selection;
  std::shared_ptr<kernels::SparsePast> past;
  if (c.begin > 0) {
    past = std::make_shared<LayerSparsePast>(&store, layer, c.begin, s.host, absl::Span<const at::Tensor>(), &s.pages);
  }
  at::Tensor out = kernels::SparsePagedAttention(q, k, v, c.doc_start_host, past, s.device, P(),
                                                 options_.gpu_attention_kernel, model_->sinks(layer));
  kernels::timeline::Mark("sparse.append_summarize");
  OOMB_RETURN_IF_ERROR(store.Append(layer, k, v));
  const at::ScalarType summary_type = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor chunk_summaries = kernels::SummarizePages(k.to(summary_type), P(), select_.summary);
  summaries_[summary_row_[layer]]
      .slice(0, c.begin / P(), c.begin / P() + chunk_summaries.size(0))
      .copy_(chunk_summaries);
  kernels::timeline::Mark("model");
  selection->reset();
  return out;
}

absl::Status SparseAttention::BeforeRecompute(const Chunk& c, KvStore& store) {
  // The recompute's first layers read their pages before any layer could prefetch them
  // (LayerSparsePast::Finished prefetches the ones after).
  for (int64_t layer = 0; layer < std::min(kRecomputeLead, L()); ++layer) {
    if (Windowed(layer)) continue;
    OOMB_RETURN_IF_ERROR(store.PrefetchPages(layer, selections_[c.index * L() + layer], /*with_grads=*/false));
  }
  return absl::OkStatus();
}

at::Tensor SparseAttention::Recompute(const Chunk& c, int64_t layer, const at::Tensor& q, const at::Tensor& k,
                                      const at::Tensor& v, KvStore& store) {
  if (Windowed(layer)) return dense_.Attend(c, layer, q, k, v, store, {});
  kernels::timeline::Mark("sparse.selection_upload");
  const at::Tensor& host = selections_[c.index * L() + layer];
  // Pinned: the upload does not wait for the device.
  const at::Tensor device = host.to(q.device(), /*non_blocking=*/true).to(at::kLong);
  std::shared_ptr<kernels::SparsePast> past;
  if (c.begin > 0) {
    past = std::make_shared<LayerSparsePast>(&store, layer, c.begin, host,
                                             absl::MakeConstSpan(selections_).subspan(c.index * L(), L()));
  }
  return kernels::SparsePagedAttention(q, k, v, c.doc_start_host, past, device, P(), options_.gpu_attention_kernel,
                                       model_->sinks(layer));
}

}  // namespace

std::unique_ptr<Attention> MakeAttention(const Transformer* model, const KvPools& pools,
                                         const ChunkTrainerOptions& options, SwappedAttention* swap) {
  if (options.sparse.has_value()) return std::make_unique<SparseAttention>(model, pools, options);
  return std::make_unique<DenseAttention>(model, options, swap);
}

}  // namespace oomb
