// Fixed-size KV pages in preallocated arenas (worker/paging/page_id.h for the page, its id and
// its shape).
//
// A PagePool is one arena of page slots of one kind (KV or KV-gradient) on one tier (device or
// host), allocated once: allocation and free are O(1)
// (a free list, reused in FIFO order), there is no fragmentation, and every page handed out is
// zeroed first, so a recycled page never carries stale values.
//
// A device pool's arena is one tensor. A host pool's arena is a list of slabs (pinned host
// memory when the model is on a GPU) that a background thread allocates one after another
// from the pool's creation on: pinning is far slower than copying, so it must not sit on a
// step's critical path; Allocate waits only when it needs a slab that has not landed yet.
//
// A host pool of gradient pages also zeroes its free pages on a thread of its own: each new
// slab's, and each page as it is freed (oldest first, the order Allocate reuses them), so that
// Allocate finds them zeroed and does not memset on the training thread. (Host KV pages need
// no zeroing: the KV store writes them whole.)
//
// Thread-safety: none; a pool and the stores using it belong to one training thread (a host
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
#include "worker/metrics/kv_stats.h"
#include "worker/paging/page_id.h"

namespace oomb {

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

}  // namespace oomb

#endif  // OOMB_WORKER_KV_PAGE_POOL_H_
