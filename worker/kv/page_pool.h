// Fixed-size KV pages in a preallocated arena, and the per-sequence KV / KV-gradient cache.
//
// A page holds `page_tokens` tokens of one layer: K and V of every KV head,
// [2, kv_heads, page_tokens, head_dim]. A PagePool is one arena of such slots of one kind (KV
// or KV-gradient) on one tier (device or host), allocated once: allocation and free are O(1)
// (a free list, reused in FIFO order), there is no fragmentation, and every page handed out is
// zeroed first, so a recycled page never carries stale values (ARCHITECTURE.md §10: the
// reference implementation's reused pinned blocks did).
//
// A PageId carries its tier in the top bit (STYLE.md habit 7): the same 32-bit id says where
// the page lives and which slot of that tier's arena holds it.
//
// Thread-safety: none; a pool and the caches using it belong to one training thread.
#ifndef OOMB_WORKER_KV_PAGE_POOL_H_
#define OOMB_WORKER_KV_PAGE_POOL_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <deque>
#include <memory>
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

  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  // A zeroed page. RESOURCE_EXHAUSTED when the pool is full (the message gives the capacity).
  absl::StatusOr<PageId> Allocate();
  // Returns the page to the free list. The id must come from this pool and be in use.
  void Free(PageId id);
  // Whether `n` more pages fit now. Changes nothing.
  bool CanAllocate(int64_t n) const { return n <= static_cast<int64_t>(free_.size()); }

  // [capacity_pages, 2, kv_heads, page_tokens, head_dim]
  at::Tensor& arena() { return arena_; }
  // The page's slot: [2, kv_heads, page_tokens, head_dim], a view into the arena.
  at::Tensor Page(PageId id) const;
  const PageShape& shape() const { return shape_; }
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
  PagePool(PageKind kind, Tier tier, PageShape shape, at::Tensor arena);
  void Publish() {
    if (counters_ != nullptr) counters_->Set(used_, peak_used_);
  }

  PageKind kind_;
  Tier tier_;
  PageShape shape_;
  at::Tensor arena_;
  std::deque<uint32_t> free_;  // FIFO: the least recently freed slot is reused first
  std::vector<bool> in_use_;
  int64_t used_ = 0;
  int64_t peak_used_ = 0;
  std::shared_ptr<PoolCounters> counters_;
};

// The KV and KV-gradient pages of one training sequence, per layer: the page table is one
// append-only list of page ids per layer (truncated from the end only when pages are
// released, in reverse chunk order).
class SequenceKvCache {
 public:
  SequenceKvCache(PagePool* kv_pool, PagePool* grad_pool, int64_t num_layers);
  ~SequenceKvCache();
  SequenceKvCache(const SequenceKvCache&) = delete;
  SequenceKvCache& operator=(const SequenceKvCache&) = delete;

  // Appends one chunk's keys and values, [C, kv_heads, head_dim] each, after the layer's last
  // token (the page dtype is the pool's; values are converted).
  absl::Status Append(int64_t layer, const at::Tensor& k, const at::Tensor& v);
  int64_t tokens(int64_t layer) const { return tokens_[layer]; }

  // Keys and values of tokens [begin, end) of the layer, [kv_heads, end - begin, head_dim]
  // each: one batched gather of the pages covering the range.
  std::pair<at::Tensor, at::Tensor> Read(int64_t layer, int64_t begin, int64_t end) const;

  // Adds dK, dV of tokens [begin, begin + n), [kv_heads, n, head_dim] each, into the layer's
  // gradient pages; a gradient page is allocated (zeroed) on its first contribution.
  absl::Status AccumulateGrad(int64_t layer, int64_t begin, const at::Tensor& dk, const at::Tensor& dv);

  // The accumulated dK, dV of tokens [begin, end), [end - begin, kv_heads, head_dim] each, in
  // the gradient pool's dtype: zero where no page has received a contribution.
  std::pair<at::Tensor, at::Tensor> ReadGrad(int64_t layer, int64_t begin, int64_t end) const;

  // Sparse attention (kernels/torch/sparse_attention.h): keys and values of the layer's pages
  // selection [n_tiles, kv_heads, n] (page indices below tokens(layer) / page_tokens, -1:
  // none) -> [n_tiles, kv_heads, n * page_tokens, head_dim] each, zeros where -1: one batched
  // gather per call.
  std::pair<at::Tensor, at::Tensor> GatherPages(int64_t layer, const at::Tensor& selection) const;
  // Adds dK, dV [n_tiles, kv_heads, n * page_tokens, head_dim] of the selected pages into their
  // gradient pages (allocated, zeroed, on a page's first selection: pages no chunk selects
  // never get one). Entries of -1 are skipped; repeated pages receive every contribution.
  absl::Status AccumulatePageGrad(int64_t layer, const at::Tensor& selection, const at::Tensor& dk,
                                  const at::Tensor& dv);

  // Frees, in every layer, the KV and gradient pages whose first token is >= `token`: after
  // chunk i's backward nothing reads them again.
  void ReleaseFrom(int64_t token);

  int64_t grad_pages_allocated() const;

 private:
  PagePool* kv_;
  PagePool* grad_;
  int64_t page_tokens_;
  std::vector<std::vector<PageId>> kv_pages_;    // [layer][page]
  std::vector<std::vector<PageId>> grad_pages_;  // [layer][page]; invalid until first use
  std::vector<int64_t> tokens_;
};

}  // namespace oomb

#endif  // OOMB_WORKER_KV_PAGE_POOL_H_
