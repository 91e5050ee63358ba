#include "worker/train/chunk_trainer.h"

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>

#if defined(OOMB_HAVE_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#endif

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kernels/torch/chunked_cross_entropy.h"
#include "kernels/torch/gpu_timeline.h"
#include "kernels/torch/paged_attention.h"
#include "kernels/torch/sparse_attention.h"
#include "kernels/torch/upload.h"
#include "worker/common/status.h"
#include "worker/kv/copy_engine.h"
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

// The past of one layer for one chunk, read from and accumulated into the sequence's pages.
class LayerPast final : public kernels::PastKv {
 public:
  // `key_block`: the attention's key block (what a prefetch of the next layer brings in).
  LayerPast(SequenceKvCache* cache, int64_t layer, int64_t past_tokens, int64_t key_block)
      : cache_(cache), layer_(layer), past_tokens_(past_tokens), key_block_(key_block) {}
  int64_t past_tokens() const override { return past_tokens_; }
  std::pair<at::Tensor, at::Tensor> Read(int64_t begin, int64_t end) override {
    return cache_->Read(layer_, begin, end);
  }
  void AccumulateGrad(int64_t begin, const at::Tensor& dk, const at::Tensor& dv) override {
    const absl::Status s = cache_->AccumulateGrad(layer_, begin, dk, dv);
    if (!s.ok()) throw StatusError(s);  // out of backward, to the trainer's boundary
  }
  void Prefetch(int64_t begin, int64_t end, bool backward) override {
    const absl::Status s = cache_->Prefetch(layer_, begin, end, backward);
    if (!s.ok()) throw StatusError(s);  // out of backward, to the trainer's boundary
  }
  // Forward goes up the layers, backward down: the next layer's first key block comes in while
  // the rest of this layer computes.
  void Finished(bool backward) override {
    const int64_t next = backward ? layer_ - 1 : layer_ + 1;
    if (next < 0) return;
    const absl::Status s = cache_->Prefetch(next, 0, std::min(past_tokens_, key_block_), backward);
    if (!s.ok()) throw StatusError(s);  // out of backward, to the trainer's boundary
  }

 private:
  SequenceKvCache* cache_;
  int64_t layer_;
  int64_t past_tokens_;
  int64_t key_block_;
};

// The selected past pages of one layer for one chunk (sparse attention). In stage 2, given the
// chunk's selections of every layer (stage 1's), it prefetches what the next attention reads:
// the recompute goes up the layers, the backward comes down, and the top layer's backward
// follows its recompute. The recompute prefetches kRecomputeLead (two) layers ahead: between
// one layer's attention and the next, only the MLP and a projection run (about 2.5 ms for
// Qwen2.5-7B's chunks of 4096 on an H100), about what a layer's selected host pages take to
// come in; three ahead were no faster at 1,342,720 tokens, before gathers read two sources
// (bench/results/2026-11-24-h100-two-source-gather).
class LayerSparsePast final : public kernels::SparsePast {
 public:
  // `host_selection`: the layer's selection on the CPU (the cache reads which pages to fetch
  // from it, not from the device's copy). `selections`: empty (stage 1), or the chunk's host
  // selections, one per layer. `started`: stage 1's fetch of the selection's host pages.
  LayerSparsePast(SequenceKvCache* cache, int64_t layer, int64_t past_tokens, at::Tensor host_selection,
                  absl::Span<const at::Tensor> selections, SequenceKvCache::PagesInFlight* started = nullptr)
      : cache_(cache),
        layer_(layer),
        past_tokens_(past_tokens),
        host_selection_(std::move(host_selection)),
        selections_(selections),
        started_(started) {}
  int64_t past_tokens() const override { return past_tokens_; }
  std::pair<at::Tensor, at::Tensor> GatherPages(const at::Tensor& selection) override {
    return cache_->GatherPages(layer_, selection, host_selection_, started_);
  }
  void AccumulatePageGrad(const at::Tensor& selection, const at::Tensor& dk, const at::Tensor& dv) override {
    const absl::Status s = cache_->AccumulatePageGrad(layer_, selection, host_selection_, dk, dv);
    if (!s.ok()) throw StatusError(s);  // out of backward, to the trainer's boundary
  }
  void Finished(bool backward) override {
    if (selections_.empty()) return;
    const int64_t layers = static_cast<int64_t>(selections_.size());
    absl::Status s;
    if (backward) {
      if (layer_ > 0) s = cache_->PrefetchPages(layer_ - 1, selections_[layer_ - 1], /*with_grads=*/true);
    } else if (layer_ + 1 == layers) {  // the top layer's backward comes next
      s = cache_->PrefetchPages(layer_, selections_[layer_], /*with_grads=*/true);
    } else if (layer_ + kRecomputeLead < layers) {
      // The layers in between were prefetched by the layers below (the first ones before the
      // chunk's recompute, by TrainSequence).
      s = cache_->PrefetchPages(layer_ + kRecomputeLead, selections_[layer_ + kRecomputeLead], /*with_grads=*/false);
    }
    if (!s.ok()) throw StatusError(s);  // out of backward, to the trainer's boundary
  }
  // How many layers ahead the recompute prefetches (SequenceKvCache::kMaxPrefetches at most).
  static constexpr int64_t kRecomputeLead = 2;

 private:
  SequenceKvCache* cache_;
  int64_t layer_;
  int64_t past_tokens_;
  at::Tensor host_selection_;
  absl::Span<const at::Tensor> selections_;
  SequenceKvCache::PagesInFlight* started_;
};

// Stage 2's injection of what later chunks left in a chunk's gradient pages: the identity on a
// layer's K and V in forward; in backward it adds dK, dV (the layer's pages, as `read` returns
// them, [C, kv_heads, D] each, in K's dtype) to the gradients flowing back into K and V (one
// rounding, as autograd's own sum of the two would be). So a layer's pages
// are read only when the backward reaches that layer, not all before the backward starts: their
// copy from the host then waits for the additions into that layer's pages (which the chunk
// after queued a chunk earlier), not for every addition of the chunk after (the last of which,
// into layer 0, would hold up the whole backward). `read` may start the next layer's read.
struct LaterGradients : torch::CustomClassHolder {
  std::function<std::pair<at::Tensor, at::Tensor>()> read;
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

at::Tensor I64(const std::vector<int64_t>& v, int64_t begin, int64_t end) {
  return at::tensor(at::ArrayRef<int64_t>(v.data() + begin, end - begin), at::kLong);
}

}  // namespace

// Laps between chunk boundaries (see ChunkTimes). On CUDA the launches of a chunk return long
// before its kernels finish, so host time would measure launching, not the chunk.
class ChunkTrainer::ChunkClock {
 public:
  explicit ChunkClock(const at::Device& device) : cuda_(device.is_cuda()), device_index_(device.index()) { Mark(); }

  // Ends the current lap; its seconds go to `out` (once Finish() ran, on CUDA).
  void Lap(std::vector<double>* out) {
    if (!cuda_) {
      const auto now = std::chrono::steady_clock::now();
      out->push_back(std::chrono::duration<double>(now - last_).count());
      last_ = now;
      return;
    }
    Mark();
    laps_.push_back(out);
  }

  // Resolves the laps taken on CUDA (waits for the last boundary's event).
  void Finish() {
#if defined(OOMB_HAVE_CUDA)
    if (!cuda_ || events_.empty()) return;
    events_.back().synchronize();
    for (size_t i = 0; i < laps_.size(); ++i) {
      laps_[i]->push_back(static_cast<double>(events_[i].elapsed_time(events_[i + 1])) / 1000.0);
    }
    laps_.clear();
#endif
  }

 private:
  void Mark() {
    if (!cuda_) {
      last_ = std::chrono::steady_clock::now();
      return;
    }
#if defined(OOMB_HAVE_CUDA)
    events_.emplace_back(cudaEventDefault);
    events_.back().record(at::cuda::getCurrentCUDAStream(device_index_));
#endif
  }

  const bool cuda_;
  const c10::DeviceIndex device_index_;
  std::chrono::steady_clock::time_point last_;
  std::vector<std::vector<double>*> laps_;  // CUDA: lap i ends at events_[i + 1]
#if defined(OOMB_HAVE_CUDA)
  std::vector<at::cuda::CUDAEvent> events_;
#endif
};

ChunkTrainer::ChunkTrainer(const Transformer* model, KvPools pools, ChunkTrainerOptions options)
    : model_(model), pools_(pools), options_(std::move(options)) {}

int64_t ChunkTrainer::KeyBlock() const {
  return model_->device().is_cuda() ? options_.gpu_attention_key_block : options_.attention_key_block;
}

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

absl::Status ChunkTrainer::DropUnreadGradients(const TokenSequence& seq, uint64_t seed, SequenceKvCache& cache) const {
  const int64_t n = NumChunks(seq), C = options_.chunk_tokens, T = seq.size();
  int64_t kept = 0;
  for (int64_t index = 0; index < n; ++index) {
    if (KeepChunk(index, seed)) {
      ++kept;
    } else {
      cache.DropGradients(index * C, std::min(T, (index + 1) * C));
    }
  }
  if (kept == n) return absl::OkStatus();
  // The plan makes room for all but the unlikeliest draws (worker/plan/memory_planner.h); this
  // one is checked before any work.
  const int64_t needed = cache.GradPagesKept(T) * model_->config().num_layers;
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

ChunkTrainer::Chunk ChunkTrainer::MakeChunk(const TokenSequence& seq, int64_t index, bool training,
                                            uint64_t dropout_seed) const {
  const int64_t rope_seq_len =
      seq.positions.empty() ? 0 : *std::max_element(seq.positions.begin(), seq.positions.end()) + 1;
  Chunk c;
  c.begin = index * options_.chunk_tokens;
  c.end = std::min(seq.size(), c.begin + options_.chunk_tokens);
  c.doc_start_host = I64(seq.doc_start, c.begin, c.end);
  c.labels_host = I64(seq.labels, c.begin, c.end);
  c.label_tokens = c.labels_host.ne(kernels::kIgnoreIndex).sum().item<int64_t>();
  c.input.ids = kernels::Upload(I64(seq.ids, c.begin, c.end), model_->device());
  c.input.positions = kernels::Upload(I64(seq.positions, c.begin, c.end), model_->device());
  c.input.doc_start = kernels::Upload(c.doc_start_host, model_->device());
  c.input.rope_seq_len = rope_seq_len;
  c.input.training = training;
  c.input.dropout_seed = dropout_seed * 1000003u + static_cast<uint64_t>(index);
  return c;
}

ChunkTrainer::LayerSelection ChunkTrainer::SelectPages(const Chunk& c, int64_t index, int64_t layer,
                                                       const at::Tensor& q, const at::Tensor& summaries,
                                                       bool training) {
  kernels::PageSelectOptions select = *options_.sparse;
  select.page_tokens = pools_.kv->shape().page_tokens;
  const int64_t P = select.page_tokens, L = model_->config().num_layers;
  TORCH_CHECK(c.begin % P == 0, "sparse attention: chunk_tokens (", options_.chunk_tokens,
              ") must be a multiple of page_tokens (", P, ")");
  kernels::timeline::Mark("sparse.select");
  LayerSelection s;
  s.device = kernels::SelectPages(q, summaries[layer].slice(0, 0, c.begin / P), c.input.doc_start, c.begin, select);
  if (options_.on_selection) options_.on_selection(index, layer, s.device);
  // The host copy (which pages to fetch, and stage 2's selection): pinned on a GPU, so that
  // the copy does not wait here and stage 2 uploads it without waiting for the device.
  const bool gpu = s.device.is_cuda();
  s.host = at::empty(s.device.sizes(), at::TensorOptions().dtype(at::kInt).pinned_memory(gpu));
  s.host.copy_(s.device, /*non_blocking=*/gpu);
  if (gpu) {
    s.copied.emplace(s.device.device().type());
    s.copied->record(at::accelerator::getCurrentStream(s.device.device().index()));
  }
  if (training) selections_[index * L + layer] = s.host;
  kernels::timeline::Mark("model");
  return s;
}

void ChunkTrainer::StartFetch(const Chunk& c, int64_t layer, LayerSelection& s, SequenceKvCache& cache) {
  if (s.fetching) return;
  s.fetching = true;
  if (s.copied.has_value()) s.copied->synchronize();
  const int64_t P = pools_.kv->shape().page_tokens, C = c.end - c.begin;
  const int64_t H = model_->config().num_heads, G = H / model_->config().num_kv_heads;
  const at::Tensor per_tile = s.host.ge(0).sum(at::IntArrayRef{1, 2}).to(at::kDouble);  // [n_tiles]
  const at::Tensor rows = (C - at::arange(0, C, P, at::kLong)).clamp_max(P).to(at::kDouble);
  sparse_stats_.selected_pages += s.host.ge(0).sum().item<int64_t>();
  sparse_stats_.past_pages += s.host.size(0) * s.host.size(1) * (c.begin / P);
  sparse_stats_.attended_pairs +=
      static_cast<double>(G * P) * (per_tile * rows).sum().item<double>() + static_cast<double>(H) * C * (C + 1) / 2;
  if (c.begin > 0) s.pages = cache.StartGather(layer, s.host);
}

at::Tensor ChunkTrainer::SparseAttention(const Chunk& c, int64_t index, int64_t layer, const at::Tensor& q,
                                         const at::Tensor& k, const at::Tensor& v, SequenceKvCache& cache,
                                         LayerSelection* selection, at::Tensor* summaries,
                                         absl::Status* append_status) {
  const int64_t P = pools_.kv->shape().page_tokens, L = model_->config().num_layers;
  if (selection == nullptr) {  // stage 2: the selection stage 1 made
    kernels::timeline::Mark("sparse.selection_upload");
    const at::Tensor& host = selections_[index * L + layer];
    // Pinned: the upload does not wait for the device.
    const at::Tensor device = host.to(q.device(), /*non_blocking=*/true).to(at::kLong);
    std::shared_ptr<kernels::SparsePast> past;
    if (c.begin > 0) {
      past = std::make_shared<LayerSparsePast>(&cache, layer, c.begin, host,
                                               absl::MakeConstSpan(selections_).subspan(index * L, L));
    }
    return kernels::SparsePagedAttention(q, k, v, c.doc_start_host, past, device, P, options_.gpu_attention_kernel);
  }
  std::shared_ptr<kernels::SparsePast> past;
  if (c.begin > 0) {
    past = std::make_shared<LayerSparsePast>(&cache, layer, c.begin, selection->host, absl::Span<const at::Tensor>(),
                                             &selection->pages);
  }
  at::Tensor out = kernels::SparsePagedAttention(q, k, v, c.doc_start_host, past, selection->device, P,
                                                 options_.gpu_attention_kernel);
  kernels::timeline::Mark("sparse.append_summarize");
  if (append_status->ok()) *append_status = cache.Append(layer, k, v);
  const at::ScalarType summary_type = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor chunk_summaries = kernels::SummarizePages(k.to(summary_type), P, options_.sparse->summary);
  (*summaries)[layer].slice(0, c.begin / P, c.begin / P + chunk_summaries.size(0)).copy_(chunk_summaries);
  kernels::timeline::Mark("model");
  return out;
}

at::Tensor ChunkTrainer::DenseAttention(const Chunk& c, int64_t layer, const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, SequenceKvCache& cache) const {
  std::shared_ptr<kernels::PastKv> past;
  if (c.begin > 0) past = std::make_shared<LayerPast>(&cache, layer, c.begin, KeyBlock());
  return kernels::PagedAttention(q, k, v, c.doc_start_host, past, KeyBlock(), options_.gpu_attention_kernel);
}

// A chunk in flight in stage 1: its forward so far, the attention inputs of its next layer
// and, sparse, that layer's selection once made.
struct ChunkTrainer::Lane {
  int64_t index;
  Chunk c;
  Transformer::Cursor cursor;
  std::array<at::Tensor, 3> qkv;
  std::optional<LayerSelection> selection;
  absl::Status append_status;
};

// Stage 1's schedule. Chunk i at layer l reads what chunks before it wrote at layer l (their
// KV pages and, sparse, the summaries its selection scores), and nothing else of theirs. So
// with sparse attention kSparseLanes chunks run at once: chunk i + 1 selects its pages at
// layer l as soon as chunk i has written layer l, and the chunk whose selection is oldest runs
// its layer next. Which host pages to fetch is known only once the selection reaches the host,
// so a selection is queued, another chunk's layer is queued behind it, and only then does the
// host wait for the selection and start the fetch (StartFetch): the device computes the other
// chunks' layers meanwhile, and the fetch comes in under them, where one chunk alone would wait
// for both (its selection needs the layer's queries, so it cannot be fetched earlier). The
// device idles only when every ready selection was queued after the newest layer (at the
// start, and at times when a chunk ends). Each chunk's own operations run in the same order as
// alone (Transformer::Cursor), so its values, its selections and what it writes are the same.
// Dense attention knows what it reads in advance (the cache prefetches it) and runs one chunk
// at a time.
//
// Three chunks, not two: at 1,370,752 tokens on an H100, stage 1 waited 17 s for selected host
// pages against 24-29 s with two, for the same GPU peak (the stage-2 graph sets it)
// (bench/results/2026-11-23-h100-deferred-selection).
constexpr size_t kSparseLanes = 3;

absl::StatusOr<SequenceLoss> ChunkTrainer::Forward(const TokenSequence& seq, int64_t chunks, bool with_loss,
                                                   bool training, uint64_t dropout_seed, SequenceKvCache& cache,
                                                   ChunkClock* clock) {
  SequenceLoss loss;
  at::Tensor loss_sum;  // with_loss: on the device, in float64
  at::NoGradGuard no_grad;
  const int64_t L = model_->config().num_layers;
  at::Tensor summaries;  // sparse: the page summaries of every layer, [L, pages, (2,) kv_heads, D]
  sparse_stats_ = SparseStats();
  selections_.clear();
  if (options_.sparse.has_value()) {
    const PageShape& ps = pools_.kv->shape();
    const int64_t pages = (seq.size() + ps.page_tokens - 1) / ps.page_tokens;
    std::vector<int64_t> shape = {L, pages, ps.kv_heads, ps.head_dim};
    if (options_.sparse->summary == kernels::PageSummary::kMinMax) shape.insert(shape.begin() + 2, 2);
    summaries = at::empty(shape, pools_.kv->arena().options());
    if (training) selections_.resize(NumChunks(seq) * L);
  }
  const bool sparse = summaries.defined();
  const size_t max_lanes = sparse ? kSparseLanes : 1;
  std::deque<std::unique_ptr<Lane>> lanes;  // in chunk order
  std::deque<Lane*> ready;                  // lanes whose next layer is selected, oldest selection first
  int64_t next = 0;
  const auto start_lanes = [&] {
    while (lanes.size() < max_lanes && next < chunks) {
      auto lane = std::make_unique<Lane>();
      lane->index = next++;
      lane->c = MakeChunk(seq, lane->index, training, dropout_seed);
      lane->cursor = model_->Begin(lane->c.input);
      lane->qkv = model_->AttentionInputs(lane->cursor);
      lanes.push_back(std::move(lane));
    }
  };
  // Selects every layer that can be: the lane's next one, once the chunk before has written it.
  const auto select_ready = [&] {
    for (size_t i = 0; i < lanes.size(); ++i) {
      Lane& lane = *lanes[i];
      if (lane.cursor.layer == L || std::find(ready.begin(), ready.end(), &lane) != ready.end()) continue;
      if (i > 0 && lanes[i - 1]->cursor.layer <= lane.cursor.layer) continue;
      if (sparse) lane.selection = SelectPages(lane.c, lane.index, lane.cursor.layer, lane.qkv[0], summaries, training);
      ready.push_back(&lane);
    }
  };
  // Starts the fetches of the first `n` ready lanes' selections (those queued before the
  // device's newest work).
  const auto start_fetches = [&](size_t n) {
    if (!sparse) return;
    for (size_t i = 0; i < n; ++i) StartFetch(ready[i]->c, ready[i]->cursor.layer, *ready[i]->selection, cache);
  };
  start_lanes();
  select_ready();
  while (!ready.empty()) {
    Lane& lane = *ready.front();
    ready.pop_front();
    const int64_t layer = lane.cursor.layer;
    if (sparse) StartFetch(lane.c, layer, *lane.selection, cache);  // a no-op unless selected just before
    const auto& [q, k, v] = lane.qkv;
    at::Tensor out;
    if (sparse) {
      out =
          SparseAttention(lane.c, lane.index, layer, q, k, v, cache, &*lane.selection, &summaries, &lane.append_status);
      lane.selection.reset();
    } else {
      out = DenseAttention(lane.c, layer, q, k, v, cache);
      if (lane.append_status.ok()) lane.append_status = cache.Append(layer, k, v);
    }
    if (!lane.append_status.ok()) return lane.append_status;
    model_->FinishLayer(lane.cursor, out);
    if (lane.cursor.layer < L) {
      lane.qkv = model_->AttentionInputs(lane.cursor);
    } else {
      // The chunk is done. Chunks finish in order: a later one never passes an earlier one's layer.
      TORCH_INTERNAL_ASSERT(&lane == lanes.front().get(), "stage 1: chunk ", lane.index, " finished out of order");
      if (with_loss) {
        const at::Tensor hidden = model_->End(lane.cursor);
        if (!loss_sum.defined()) loss_sum = at::zeros({}, hidden.options().dtype(at::kDouble));
        loss_sum.add_(kernels::ChunkedLmHeadCrossEntropy(hidden, model_->lm_head(), lane.c.labels_host,
                                                         options_.ce_rows_per_block));
        loss.label_tokens += lane.c.label_tokens;
      }
      lanes.pop_front();
      if (clock != nullptr) clock->Lap(&chunk_times_.forward);
      if (options_.should_stop && options_.should_stop()) return absl::CancelledError("stopped at a chunk boundary");
      start_lanes();
    }
    const size_t queued_before = ready.size();
    select_ready();
    start_fetches(queued_before);
  }
  if (loss_sum.defined()) loss.loss_sum = loss_sum.item<double>();  // summed on the device, read once
  return loss;
}

absl::StatusOr<SequenceLoss> ChunkTrainer::EvalSequence(const TokenSequence& seq) {
  SequenceLoss loss;
  const absl::Status s = Guarded([&]() -> absl::Status {
    SequenceKvCache cache(pools_, model_->config().num_layers);
    auto r = Forward(seq, NumChunks(seq), /*with_loss=*/true, /*training=*/false, 0, cache, nullptr);
    if (!r.ok()) return r.status();
    loss = *r;
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return loss;
}

absl::StatusOr<SequenceLoss> ChunkTrainer::TrainSequence(const TokenSequence& seq, double loss_scale,
                                                         uint64_t dropout_seed) {
  auto tracker = std::make_shared<AllocationTracker>();
  c10::DebugInfoGuard track(c10::DebugInfoKind::PROFILER_STATE, tracker);
  for (PagePool* pool : {pools_.kv, pools_.grad, pools_.kv_host, pools_.grad_host}) {
    if (pool != nullptr) pool->ResetPeak();
  }
  const int64_t to_device = pools_.copies != nullptr ? pools_.copies->bytes_to_device() : 0;
  const int64_t to_host = pools_.copies != nullptr ? pools_.copies->bytes_to_host() : 0;
  SequenceLoss loss;
  chunk_times_ = ChunkTimes();
  const absl::Status s = Guarded([&]() -> absl::Status {
    ChunkClock clock(model_->device());
    SequenceKvCache cache(pools_, model_->config().num_layers);
    const int64_t last = NumChunks(seq) - 1;
    const double p = options_.chunk_fraction;
    OOMB_RETURN_IF_ERROR(DropUnreadGradients(seq, dropout_seed, cache));
    // Exact training: stage 2 gives every chunk's loss; dense, chunk N-1's KV is never read
    // (see the header).
    const bool stage2_losses = p == 1.0;
    const bool trimmed = stage2_losses && !options_.sparse.has_value();
    kernels::timeline::Stage("stage1");
    const absl::Cleanup no_stage = [] { kernels::timeline::Stage(nullptr); };
    auto forward = Forward(seq, trimmed ? last : last + 1, /*with_loss=*/!stage2_losses, /*training=*/true,
                           dropout_seed, cache, &clock);
    if (!forward.ok()) return forward.status();
    kernels::timeline::Stage("stage2");
    kernels::timeline::Mark("model");
    loss = *forward;
    // Stage 2's losses, summed on the device and read once.
    at::Tensor stage2_loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(model_->device()));
    int64_t stage2_label_tokens = 0;
    const int64_t L = model_->config().num_layers;
    for (int64_t index = last; index >= 0; --index) {
      if (!KeepChunk(index, dropout_seed)) {  // SpaCO: this chunk and what it would pass on are dropped
        cache.ReleaseFrom(index * options_.chunk_tokens);
        clock.Lap(&chunk_times_.backward);
        if (options_.should_stop && options_.should_stop()) return absl::CancelledError("stopped at a chunk boundary");
        continue;
      }
      // Sparse: the recompute's first layers read their pages before any layer could prefetch
      // them (LayerSparsePast::Finished prefetches the ones after).
      for (int64_t layer = 0; options_.sparse.has_value() && layer < std::min(LayerSparsePast::kRecomputeLead, L);
           ++layer) {
        OOMB_RETURN_IF_ERROR(cache.PrefetchPages(layer, selections_[index * L + layer], /*with_grads=*/false));
      }
      const Chunk c = MakeChunk(seq, index, /*training=*/true, dropout_seed);
      // Gradients that later chunks left in this chunk's pages (none for the last chunk), each
      // layer's added to its K and V when the backward reaches them; 1/p: SpaCO's weight of a
      // kept chunk (1 for the exact trainer).
      const auto later_gradients = [&](int64_t layer, at::ScalarType dtype) {
        auto later = c10::make_intrusive<LaterGradients>();
        later->read = [&cache, &c, layer, p, dtype]() -> std::pair<at::Tensor, at::Tensor> {
          auto [dk, dv] = cache.ReadGrad(layer, c.begin, c.end);
          cache.PrefetchGrad(layer - 1, c.begin, c.end);  // the backward comes down the layers
          if (p == 1.0) return {dk.to(dtype), dv.to(dtype)};
          return {(dk / p).to(dtype), (dv / p).to(dtype)};
        };
        return later;
      };
      const AttentionFn attention = [&](int64_t layer, const at::Tensor& q, const at::Tensor& k_in,
                                        const at::Tensor& v_in) {
        at::Tensor k = k_in, v = v_in;
        if (index != last && (k.requires_grad() || v.requires_grad())) {
          auto kv = InjectLaterGradients::apply(k, v, later_gradients(layer, k.scalar_type()));
          k = kv[0];
          v = kv[1];
        }
        if (options_.sparse.has_value()) {
          return SparseAttention(c, index, layer, q, k, v, cache, nullptr, nullptr, nullptr);
        }
        return DenseAttention(c, layer, q, k, v, cache);
      };
      const at::Tensor hidden = model_->Hidden(c.input, attention);
      if (index != last) cache.PrefetchGrad(L - 1, c.begin, c.end);  // read first in backward
      const at::Tensor chunk_loss =
          kernels::ChunkedLmHeadCrossEntropy(hidden, model_->lm_head(), c.labels_host, options_.ce_rows_per_block);
      if (stage2_losses) {
        stage2_loss_sum.add_(chunk_loss.detach());
        stage2_label_tokens += c.label_tokens;
      }
      torch::autograd::backward({chunk_loss * loss_scale}, {at::full({}, 1.0 / p, chunk_loss.options())});
      cache.ReleaseFrom(c.begin);
      clock.Lap(&chunk_times_.backward);
      if (options_.should_stop && options_.should_stop()) return absl::CancelledError("stopped at a chunk boundary");
    }
    clock.Finish();
    if (stage2_losses) {
      loss.loss_sum = stage2_loss_sum.item<double>();
      loss.label_tokens = stage2_label_tokens;
    }
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
  if (!s.ok()) return s;
  return loss;
}

}  // namespace oomb
