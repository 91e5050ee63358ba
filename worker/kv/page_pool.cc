#include "worker/kv/page_pool.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/torch/page_ops.h"
#include "kernels/torch/upload.h"
#include "worker/common/status.h"
#include "worker/kv/copy_engine.h"

namespace oomb {

absl::StatusOr<std::unique_ptr<PagePool>> PagePool::Create(PageKind kind, Tier tier, PageShape shape,
                                                           at::TensorOptions options, int64_t capacity_pages) {
  if (shape.kv_heads <= 0 || shape.page_tokens <= 0 || shape.head_dim <= 0 || capacity_pages < 0) {
    return absl::InvalidArgumentError(absl::StrCat("page pool: bad shape or capacity (kv_heads ", shape.kv_heads,
                                                   ", page_tokens ", shape.page_tokens, ", head_dim ", shape.head_dim,
                                                   ", capacity ", capacity_pages, ")"));
  }
  at::Tensor arena;
  try {
    arena = at::empty({capacity_pages, 2, shape.kv_heads, shape.page_tokens, shape.head_dim}, options);
  } catch (const c10::Error& e) {
    return WithReason(absl::ResourceExhaustedError(absl::StrCat(
                          "cannot allocate a ", KindName(kind), " page arena of ", capacity_pages, " pages (",
                          capacity_pages * shape.elems() * static_cast<int64_t>(options.dtype().itemsize()),
                          " bytes) on ", TierName(tier), ": ", e.what_without_backtrace())),
                      Reason::kOutOfMemory);
  }
  std::unique_ptr<PagePool> pool(
      new PagePool(kind, tier, shape, arena.options(), capacity_pages, std::max<int64_t>(1, capacity_pages)));
  pool->slabs_.push_back(std::move(arena));
  pool->ready_slabs_ = 1;
  return pool;
}

std::unique_ptr<PagePool> PagePool::CreateHost(PageKind kind, PageShape shape, at::ScalarType dtype,
                                               int64_t capacity_pages, bool pinned, int64_t slab_bytes) {
  const int64_t page_bytes = shape.elems() * static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t slab_pages = std::max<int64_t>(1, slab_bytes / std::max<int64_t>(1, page_bytes));
  std::unique_ptr<PagePool> pool(new PagePool(kind, Tier::kHost, shape, at::TensorOptions().dtype(dtype),
                                              std::max<int64_t>(0, capacity_pages), slab_pages));
  pool->slabs_.resize((pool->capacity_ + slab_pages - 1) / slab_pages);
  PagePool* raw = pool.get();
  if (kind == PageKind::kKvGrad) pool->zero_thread_ = std::thread([raw] { raw->ZeroFreePages(); });
  pool->slab_thread_ = std::thread([raw, pinned] { raw->AllocateSlabs(pinned); });
  return pool;
}

PagePool::PagePool(PageKind kind, Tier tier, PageShape shape, at::TensorOptions options, int64_t capacity_pages,
                   int64_t slab_pages)
    : kind_(kind),
      tier_(tier),
      shape_(shape),
      options_(options),
      capacity_(capacity_pages),
      slab_pages_(slab_pages),
      in_use_(capacity_pages, false),
      zeroed_(capacity_pages, false) {
  for (int64_t i = 0; i < capacity_pages; ++i) free_.push_back(static_cast<uint32_t>(i));
}

PagePool::~PagePool() {
  {
    const std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  zero_cv_.notify_all();
  if (slab_thread_.joinable()) slab_thread_.join();
  if (zero_thread_.joinable()) zero_thread_.join();
}

void PagePool::ZeroFreePages() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    zero_cv_.wait(lock, [&] { return stop_ || !to_zero_.empty(); });
    if (stop_) return;
    const uint32_t slot = to_zero_.front();
    to_zero_.pop_front();
    if (in_use_[slot] || zeroed_[slot]) continue;
    zeroing_ = slot;
    lock.unlock();
    // The slab is there: its slots are queued only once it is (AllocateSlabs) or once freed.
    std::memset(PageData(PageId(tier_, slot)), 0, page_bytes());
    lock.lock();
    zeroed_[slot] = true;
    zeroing_ = -1;
    zero_cv_.notify_all();
  }
}

void PagePool::AllocateSlabs(bool pinned) {
  for (size_t i = 0; i < slabs_.size() && !stop_; ++i) {
    const int64_t pages = std::min<int64_t>(slab_pages_, capacity_ - static_cast<int64_t>(i) * slab_pages_);
    try {
      slabs_[i] =
          at::empty({pages, 2, shape_.kv_heads, shape_.page_tokens, shape_.head_dim}, options_.pinned_memory(pinned));
    } catch (const c10::Error& e) {
      const std::lock_guard<std::mutex> lock(slab_mu_);
      slab_error_ = absl::StrCat("cannot allocate ", pinned ? "pinned " : "", "host memory for ", KindName(kind_),
                                 " pages (slab ", i, " of ", slabs_.size(), ", ",
                                 pages * shape_.elems() * static_cast<int64_t>(options_.dtype().itemsize()),
                                 " bytes): ", e.what_without_backtrace());
      slab_cv_.notify_all();
      return;
    }
    {
      const std::lock_guard<std::mutex> lock(slab_mu_);
      ready_slabs_.store(static_cast<int64_t>(i) + 1, std::memory_order_release);
      slab_cv_.notify_all();
    }
    if (zero_thread_.joinable()) {
      const std::lock_guard<std::mutex> lock(mu_);
      for (int64_t p = 0; p < pages; ++p) {
        to_zero_.push_back(static_cast<uint32_t>(static_cast<int64_t>(i) * slab_pages_ + p));
      }
      zero_cv_.notify_all();
    }
  }
}

absl::Status PagePool::WaitForSlab(uint32_t slot) {
  const int64_t slab = slot / slab_pages_;
  if (ready_slabs_.load(std::memory_order_acquire) > slab) return absl::OkStatus();
  std::unique_lock<std::mutex> lock(slab_mu_);
  slab_cv_.wait(lock, [&] { return ready_slabs_.load(std::memory_order_acquire) > slab || !slab_error_.empty(); });
  if (ready_slabs_.load(std::memory_order_acquire) > slab) return absl::OkStatus();
  return WithReason(absl::ResourceExhaustedError(slab_error_), Reason::kOutOfMemory);
}

int64_t PagePool::ready_pages() const {
  return std::min(capacity_, ready_slabs_.load(std::memory_order_acquire) * slab_pages_);
}

at::Tensor& PagePool::arena() {
  TORCH_INTERNAL_ASSERT(tier_ == Tier::kDevice, "PagePool::arena: a host pool's arena is slabs");
  return slabs_[0];
}

absl::StatusOr<PageId> PagePool::Allocate(bool zero) {
  if (free_.empty()) {
    return WithReason(absl::ResourceExhaustedError(
                          absl::StrCat(KindName(kind_), " page pool on ", TierName(tier_), " is full (", capacity_,
                                       " pages of ", shape_.elems() * options_.dtype().itemsize(), " bytes)")),
                      Reason::kDoesNotFit);
  }
  const uint32_t slot = free_.front();
  if (tier_ == Tier::kHost) {
    if (absl::Status s = WaitForSlab(slot); !s.ok()) return s;
  }
  free_.pop_front();
  bool zeroed = false;
  {
    std::unique_lock<std::mutex> lock(mu_);
    zero_cv_.wait(lock, [&] { return zeroing_ != slot; });
    in_use_[slot] = true;
    zeroed = zeroed_[slot];
    zeroed_[slot] = false;
  }
  ++used_;
  peak_used_ = std::max(peak_used_, used_);
  Publish();
  const PageId id(tier_, slot);
  if (zero && !zeroed) Page(id).zero_();
  return id;
}

void PagePool::Free(PageId id) {
  {
    const std::lock_guard<std::mutex> lock(mu_);
    TORCH_INTERNAL_ASSERT(id.valid() && id.tier() == tier_ && id.slot() < in_use_.size() && in_use_[id.slot()],
                          "PagePool::Free: page ", id.raw(), " is not in use in this pool");
    in_use_[id.slot()] = false;
    if (zero_thread_.joinable()) {
      to_zero_.push_back(id.slot());
      zero_cv_.notify_all();
    }
  }
  free_.push_back(id.slot());
  --used_;
  Publish();
}

at::Tensor PagePool::Page(PageId id) const { return slabs_[id.slot() / slab_pages_][id.slot() % slab_pages_]; }

PoolStats PagePool::stats() const {
  PoolStats s;
  s.kind = kind_;
  s.tier = tier_;
  s.capacity_pages = capacity_;
  s.used_pages = used_;
  s.peak_used_pages = peak_used_;
  s.bytes_per_page = shape_.elems() * static_cast<int64_t>(options_.dtype().itemsize());
  return s;
}

}  // namespace oomb
