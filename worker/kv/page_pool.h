// Fixed-size KV pages in preallocated arenas, and the per-sequence KV / KV-gradient cache.
//
// A page holds `page_tokens` tokens of one layer: K and V of every KV head,
// [2, kv_heads, page_tokens, head_dim]. A PagePool is one arena of such slots of one kind (KV
// or KV-gradient) on one tier (device or host), allocated once: allocation and free are O(1)
// (a free list, reused in FIFO order), there is no fragmentation, and every page handed out is
// zeroed first, so a recycled page never carries stale values (ARCHITECTURE.md §10: the
// reference implementation's reused pinned blocks did).
//
// A device pool's arena is one tensor. A host pool's arena is a list of slabs (pinned host
// memory when the model is on a GPU) that a background thread allocates one after another
// from the pool's creation on: pinning runs at 1.5-2 GB/s, so it must not sit on a step's
// critical path; Allocate waits only when it needs a slab that has not landed yet.
//
// A host pool of gradient pages also zeroes its free pages on a thread of its own: each new
// slab's, and each page as it is freed (oldest first, the order Allocate reuses them). Sparse
// backward allocates a host gradient page for nearly every host page, about 60 GB at 1.37M
// tokens for Qwen2.5-7B, so Allocate finds them zeroed and does not memset on the training
// thread. (Host KV pages need no zeroing: Append writes them whole.)
//
// A PageId carries its tier in the top bit (STYLE.md habit 7): the same 32-bit id says where
// the page lives and which slot of that tier's arena holds it.
//
// Thread-safety: none; a pool and the caches using it belong to one training thread (a host
// pool's slab and zeroing threads are internal).
#ifndef OOMB_WORKER_KV_PAGE_POOL_H_
#define OOMB_WORKER_KV_PAGE_POOL_H_

#include <ATen/core/Tensor.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/kv/tier.h"
#include "worker/metrics/kv_stats.h"

namespace oomb {

class PageId {
 public:
  static constexpr uint32_t kHostBit = uint32_t{1} << 31;
  static constexpr uint32_t kInvalid = ~uint32_t{0};

  PageId() = default;
  PageId(Tier tier, uint32_t slot) : raw_(slot | (tier == Tier::kHost ? kHostBit : 0)) {}

  bool valid() const { return raw_ != kInvalid; }
  Tier tier() const { return (raw_ & kHostBit) ? Tier::kHost : Tier::kDevice; }
  uint32_t slot() const { return raw_ & ~kHostBit; }
  uint32_t raw() const { return raw_; }
  bool operator==(const PageId& o) const { return raw_ == o.raw_; }

 private:
  uint32_t raw_ = kInvalid;
};

struct PageShape {
  int64_t kv_heads = 0;
  int64_t page_tokens = 0;
  int64_t head_dim = 0;
  int64_t elems() const { return 2 * kv_heads * page_tokens * head_dim; }
};

// A consistent snapshot of one pool's accounting.
struct PoolStats {
  PageKind kind = PageKind::kKv;
  Tier tier = Tier::kDevice;
  int64_t capacity_pages = 0;
  int64_t used_pages = 0;
  int64_t peak_used_pages = 0;
  int64_t bytes_per_page = 0;
  int64_t used_bytes() const { return used_pages * bytes_per_page; }
  int64_t free_pages() const { return capacity_pages - used_pages; }
};

class PagePool {
 public:
  // Allocates the arena [capacity_pages, 2, kv_heads, page_tokens, head_dim] of `options`'
  // dtype and device at once. RESOURCE_EXHAUSTED (naming the bytes) when that fails.
  static absl::StatusOr<std::unique_ptr<PagePool>> Create(PageKind kind, Tier tier, PageShape shape,
                                                          at::TensorOptions options, int64_t capacity_pages);

  // A host-tier pool of `capacity_pages` pages of `dtype`, allocated in slabs of about
  // `slab_bytes` by a background thread (pinned memory when `pinned`: needs a CUDA device).
  // Returns at once; a slab that cannot be allocated makes the Allocate that needs it fail with
  // RESOURCE_EXHAUSTED naming the bytes.
  static std::unique_ptr<PagePool> CreateHost(PageKind kind, PageShape shape, at::ScalarType dtype,
                                              int64_t capacity_pages, bool pinned,
                                              int64_t slab_bytes = int64_t{1} << 30);

  ~PagePool();
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  // A page, zeroed unless `zero` is false (for a caller that writes the whole page before any
  // read: zeroing a host page is a memset on the calling thread). RESOURCE_EXHAUSTED when the
  // pool is full (the message gives the capacity). Host tier: waits for the page's slab if it
  // has not been allocated yet.
  absl::StatusOr<PageId> Allocate(bool zero = true);
  // Returns the page to the free list. The id must come from this pool and be in use.
  void Free(PageId id);
  // Whether `n` more pages fit now. Changes nothing.
  bool CanAllocate(int64_t n) const { return n <= static_cast<int64_t>(free_.size()); }

  // [capacity_pages, 2, kv_heads, page_tokens, head_dim]; device tier only (a host arena is
  // slabs: reach its pages through Page or the copy engine).
  at::Tensor& arena();
  // The page's slot: [2, kv_heads, page_tokens, head_dim], a view into the arena.
  at::Tensor Page(PageId id) const;
  // The address of the page's slot, for copies of many pages: Page makes and frees a tensor
  // view, host time on the training thread for each of a fetch's thousands of pages.
  char* PageData(PageId id) const {
    return static_cast<char*>(slabs_[id.slot() / slab_pages_].data_ptr()) +
           static_cast<int64_t>(id.slot() % slab_pages_) * page_bytes();
  }
  const PageShape& shape() const { return shape_; }
  Tier tier() const { return tier_; }
  // The pages' dtype and device.
  at::TensorOptions options() const { return options_; }
  // Pages whose slabs have been allocated so far (the capacity, for a device pool).
  int64_t ready_pages() const;
  // The slab holding the page: one copy may span adjacent slots of one slab, never two slabs
  // (separate allocations, even where their addresses happen to meet).
  int64_t SlabOf(PageId id) const { return id.slot() / slab_pages_; }
  PoolStats stats() const;
  void ResetPeak() {
    peak_used_ = used_;
    Publish();
  }
  // From now on, mirrors the used and peak page counts into `counters` (for /metrics; see
  // worker/metrics/kv_stats.h), which the pool keeps alive. Null: stops.
  void AttachCounters(std::shared_ptr<PoolCounters> counters) {
    counters_ = std::move(counters);
    Publish();
  }

 private:
  PagePool(PageKind kind, Tier tier, PageShape shape, at::TensorOptions options, int64_t capacity_pages,
           int64_t slab_pages);
  void Publish() {
    if (counters_ != nullptr) counters_->Set(used_, peak_used_);
  }
  // Host tier: allocates the slabs in order (the background thread).
  void AllocateSlabs(bool pinned);
  // Host tier: waits until the slab holding `slot` is allocated; its error when that failed.
  absl::Status WaitForSlab(uint32_t slot);
  // Host gradient pools: zeroes the free pages queued in to_zero_ (the zeroing thread).
  void ZeroFreePages();
  int64_t page_bytes() const { return shape_.elems() * static_cast<int64_t>(options_.dtype().itemsize()); }

  PageKind kind_;
  Tier tier_;
  PageShape shape_;
  at::TensorOptions options_;
  int64_t capacity_;
  int64_t slab_pages_;
  // Slabs [slab_pages, 2, kv_heads, page_tokens, head_dim]: slabs_[i] is written once, by the
  // slab thread, before ready_slabs_ passes i (release); read only after (acquire).
  std::vector<at::Tensor> slabs_;
  std::atomic<int64_t> ready_slabs_{0};
  std::mutex slab_mu_;
  std::condition_variable slab_cv_;
  std::string slab_error_;  // guarded by slab_mu_: why the slab thread stopped early
  std::atomic<bool> stop_{false};
  std::thread slab_thread_;
  std::deque<uint32_t> free_;  // FIFO: the least recently freed slot is reused first
  // Guards in_use_ and the zeroing state below, which the zeroing thread reads.
  std::mutex mu_;
  std::condition_variable zero_cv_;
  std::vector<bool> in_use_;
  std::vector<bool> zeroed_;      // a free slot known to hold zeros
  std::deque<uint32_t> to_zero_;  // free slots for the zeroing thread, oldest first
  int64_t zeroing_ = -1;          // the slot the zeroing thread is zeroing now
  std::thread zero_thread_;       // host gradient pools only
  int64_t used_ = 0;
  int64_t peak_used_ = 0;
  std::shared_ptr<PoolCounters> counters_;
};

// `values` on `device`, without waiting for the device (kernels/torch/upload.h).
at::Tensor Upload(const std::vector<int32_t>& values, const at::Device& device);
at::Tensor Upload(const std::vector<int64_t>& values, const at::Device& device);

class CopyEngine;
class PendingFetch;

// The pools a sequence's pages come from. Placement: a KV page goes to its device pool while
// that has room, else to its host pool (ARCHITECTURE.md §4: what fits stays on the GPU); a
// gradient page goes where its KV page is, while that pool has room, else to the other. The
// host pools are optional; with them, `copies` moves their pages (worker/kv/copy_engine.h).
struct KvPools {
  PagePool* kv = nullptr;
  PagePool* grad = nullptr;
  PagePool* kv_host = nullptr;
  PagePool* grad_host = nullptr;
  CopyEngine* copies = nullptr;
};

// The KV and KV-gradient pages of one training sequence, per layer: the page table is one
// append-only list of page ids per layer (truncated from the end only when pages are
// released, in reverse chunk order). Pages may live on either tier; every read returns device
// tensors and every accumulation lands in the page wherever it lives (host pages: fetched,
// added to on the device, written back; or, for sparse page gradients, added into in place by
// the copy engine, CopyEngine::AddToPages).
class SequenceKvCache {
 public:
  // Host pages being fetched ahead of the read that uses them: which pages, which KV heads of
  // each (empty: whole pages), and the fetch (null: nothing to fetch).
  struct PagesInFlight {
    std::vector<PageId> ids;
    std::vector<uint64_t> heads;
    std::shared_ptr<PendingFetch> fetch;
  };

  SequenceKvCache(KvPools pools, int64_t num_layers);
  SequenceKvCache(PagePool* kv_pool, PagePool* grad_pool, int64_t num_layers)
      : SequenceKvCache(KvPools{kv_pool, grad_pool}, num_layers) {}
  ~SequenceKvCache();
  SequenceKvCache(const SequenceKvCache&) = delete;
  SequenceKvCache& operator=(const SequenceKvCache&) = delete;

  // Appends one chunk's keys and values, [C, kv_heads, head_dim] each, after the layer's last
  // token (the page dtype is the pool's; values are converted).
  absl::Status Append(int64_t layer, const at::Tensor& k, const at::Tensor& v);
  int64_t tokens(int64_t layer) const { return tokens_[layer]; }

  // Keys and values of tokens [begin, end) of the layer, [kv_heads, end - begin, head_dim]
  // each: one batched gather of the pages covering the range (host pages: one batched fetch).
  std::pair<at::Tensor, at::Tensor> Read(int64_t layer, int64_t begin, int64_t end);
  // Starts fetching the host pages a later Read(layer, begin, end) needs, so the copy overlaps
  // what runs before that Read; `with_grads`: also the gradient pages of the range, for a later
  // AccumulateGrad(layer, begin, ...) (allocating those not allocated yet). The cache keeps the
  // newest kMaxPrefetches prefetches (of either kind, this one's and PrefetchGrad's and
  // PrefetchPages'); a read of pages no prefetch holds exactly fetches for itself, and a write to
  // a prefetched page drops the prefetch (never a stale image). Errors: as AccumulateGrad's.
  absl::Status Prefetch(int64_t layer, int64_t begin, int64_t end, bool with_grads = false);
  static constexpr size_t kMaxPrefetches = 4;

  // Adds dK, dV of tokens [begin, begin + n), [kv_heads, n, head_dim] each, into the layer's
  // gradient pages; a gradient page is allocated (zeroed) on its first contribution. What
  // falls in pages whose gradients are dropped (DropGradients) is not added.
  absl::Status AccumulateGrad(int64_t layer, int64_t begin, const at::Tensor& dk, const at::Tensor& dv);

  // The accumulated dK, dV of tokens [begin, end), [end - begin, kv_heads, head_dim] each, in
  // the gradient pool's dtype: zero where no page has received a contribution.
  std::pair<at::Tensor, at::Tensor> ReadGrad(int64_t layer, int64_t begin, int64_t end);
  // Starts fetching the host gradient pages a later ReadGrad(layer, begin, end) reads (as
  // Prefetch does). The copy waits for the additions queued into those pages, and nothing else.
  void PrefetchGrad(int64_t layer, int64_t begin, int64_t end);

  // Sparse attention (kernels/torch/sparse_attention.h): keys and values of the layer's pages
  // selection [n_tiles, kv_heads, n] (page indices below tokens(layer) / page_tokens, -1:
  // none; on the pages' device) -> [n_tiles, kv_heads, n * page_tokens, head_dim] each, zeros
  // where -1: one batched gather per call. `host_selection` is the same selection on the CPU
  // (any integer dtype): which pages to fetch or allocate is read from it, so no call here
  // waits for the device. Of a host page, only the K and V of the heads that select it are
  // fetched, packed one image per (page, head). The gather reads device pages from their arena
  // and host pages from where they were fetched, in one kernel; copying both into one tensor
  // first cost about 1 ms a gather at 1,342,720 tokens on an H100
  // (bench/results/2026-11-24-h100-two-source-gather).
  // `started`: a StartGather of this layer and selection, whose fetch this call collects
  // (one started for another selection is left alone, and the pages fetched here).
  std::pair<at::Tensor, at::Tensor> GatherPages(int64_t layer, const at::Tensor& selection,
                                                const at::Tensor& host_selection, PagesInFlight* started = nullptr);
  // Starts fetching the host pages GatherPages(layer, selection, host_selection) reads, for
  // the caller to hand to that call. The cache does not keep it (unlike PrefetchPages), so any
  // number may be in flight: stage 1 of sparse training starts one chunk's next layer while
  // the other chunk in flight computes. The pages must not be written before the gather
  // (stage 1 writes only new pages).
  PagesInFlight StartGather(int64_t layer, const at::Tensor& host_selection);
  // Adds dK, dV [n_tiles, kv_heads, n * page_tokens, head_dim] of the selected pages into their
  // gradient pages (allocated, zeroed, on a page's first selection: pages no chunk selects
  // never get one). Entries of -1, and of pages whose gradients are dropped (DropGradients),
  // are skipped; repeated pages receive every contribution,
  // summed first and added to the page once. Host pages are not fetched: one kernel adds into
  // the device pages and sums the host pages' contributions into packed images of their
  // selecting heads, which the copy engine adds into the host pages in place
  // (CopyEngine::AddToPages); a bfloat16 page is then rounded twice, the sum and the page.
  // Zeroed whole-page images and a row gather before cost 3 s more GPU time a step at
  // 1,370,752 tokens on an H100 (bench/results/2026-11-25-h100-packed-additions).
  absl::Status AccumulatePageGrad(int64_t layer, const at::Tensor& selection, const at::Tensor& host_selection,
                                  const at::Tensor& dk, const at::Tensor& dv);
  // Starts fetching the host pages a later GatherPages(layer, selection, host_selection) reads,
  // as Prefetch does for a range (`with_grads`: also allocates the gradient pages a later
  // AccumulatePageGrad adds into, which need no fetch). Errors: as AccumulatePageGrad's.
  absl::Status PrefetchPages(int64_t layer, const at::Tensor& host_selection, bool with_grads);

  // Frees, in every layer, the KV and gradient pages whose first token is >= `token`: after
  // chunk i's backward nothing reads them again.
  void ReleaseFrom(int64_t token);

  // SpaCO (worker/train/chunk_trainer.h): the gradients of tokens [begin, end) will never be
  // read, their chunk not being backpropagated. A page all of whose tokens are such (in every
  // layer) never gets a gradient page: AccumulateGrad and AccumulatePageGrad drop what they
  // would add to it, and the prefetches allocate none. Calls add up; tokens never named keep
  // their gradients (so does a page that runs past the last token named).
  void DropGradients(int64_t begin, int64_t end);
  // Of the pages of tokens [0, tokens), how many keep their gradients (in each layer).
  int64_t GradPagesKept(int64_t tokens) const;

  int64_t grad_pages_allocated() const;

 private:
  // The device images [n, 2, kv_heads, page_tokens, head_dim] of `ids` (either tier, valid),
  // in order: device pages read from their arena, host pages fetched (or the prefetch's, if it
  // fetches exactly these pages' host ones).
  at::Tensor Images(PageKind kind, const std::vector<PageId>& ids);
  // The device images of host pages `host_ids` as CopyEngine::StartFetch lays them out
  // (`host_heads`: of each page, the heads to bring, packed one image per page and head; null:
  // whole pages): started, prefetched or fetched now.
  at::Tensor HostImages(PageKind kind, const std::vector<PageId>& host_ids, const std::vector<uint64_t>* host_heads,
                        PagesInFlight* started);
  // Writes images of `ids` back where they live (device: index_copy_ into the arena; host:
  // through the copy engine).
  void StoreImages(PageKind kind, const std::vector<PageId>& ids, const at::Tensor& images);
  absl::StatusOr<PageId> AllocatePage(PageKind kind);
  // The gradient page of the layer's page `page`: on the tier of its KV page while that tier
  // has room, else on the other.
  absl::StatusOr<PageId> AllocateGradPage(int64_t layer, int64_t page);
  PagePool* Pool(PageKind kind, Tier tier) const;
  bool has_host() const { return pools_.kv_host != nullptr || pools_.grad_host != nullptr; }

  KvPools pools_;
  int64_t page_tokens_;
  std::vector<std::vector<PageId>> kv_pages_;    // [layer][page]
  std::vector<std::vector<PageId>> grad_pages_;  // [layer][page]; invalid until first use
  std::vector<int64_t> tokens_;
  std::vector<bool> token_grad_dropped_;  // DropGradients, per token
  std::vector<bool> page_grad_dropped_;   // per page: every token of it dropped
  // A prefetch: host pages of one kind in flight.
  struct Prefetched {
    PageKind kind;
    PagesInFlight pages;
  };
  // Drops the prefetches of `kind` that hold one of `ids` (about to be written).
  void DropPrefetch(PageKind kind, const std::vector<PageId>& ids);
  // The layer's valid gradient pages among those of tokens [begin, end), and their positions
  // in the range's pages.
  std::vector<PageId> GradPagesIn(int64_t layer, int64_t begin, int64_t end, std::vector<int64_t>* pos) const;
  // Whether page `page`'s gradients are dropped (DropGradients).
  bool GradDropped(int64_t page) const {
    return page < static_cast<int64_t>(page_grad_dropped_.size()) && page_grad_dropped_[page];
  }
  // Allocates the layer's gradient pages [first, last), or `pages`, that have none yet and are
  // not dropped.
  absl::Status EnsureGradPages(int64_t layer, int64_t first, int64_t last);
  absl::Status EnsureSelectedGradPages(int64_t layer, const std::vector<int64_t>& pages);
  // Starts fetching `host_ids` as the newest prefetch of `kind` (none if empty or already in
  // flight), dropping the oldest beyond kMaxPrefetches.
  void StartPrefetch(PageKind kind, std::vector<PageId> host_ids, std::vector<uint64_t> host_heads = {});
  std::deque<Prefetched> prefetched_;  // oldest first
};

}  // namespace oomb

#endif  // OOMB_WORKER_KV_PAGE_POOL_H_
