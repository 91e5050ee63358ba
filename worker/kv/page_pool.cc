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

SequenceKvCache::SequenceKvCache(KvPools pools, int64_t num_layers)
    : pools_(pools),
      page_tokens_(pools.kv->shape().page_tokens),
      kv_pages_(num_layers),
      grad_pages_(num_layers),
      tokens_(num_layers, 0) {
  TORCH_INTERNAL_ASSERT(!has_host() || pools_.copies != nullptr, "SequenceKvCache: host pools need a copy engine");
}

SequenceKvCache::~SequenceKvCache() { ReleaseFrom(0); }

PagePool* SequenceKvCache::Pool(PageKind kind, Tier tier) const {
  if (kind == PageKind::kKv) return tier == Tier::kHost ? pools_.kv_host : pools_.kv;
  return tier == Tier::kHost ? pools_.grad_host : pools_.grad;
}

absl::StatusOr<PageId> SequenceKvCache::AllocatePage(PageKind kind) {
  PagePool* device = Pool(kind, Tier::kDevice);
  PagePool* host = Pool(kind, Tier::kHost);
  // Append writes a host KV page whole before anything reads it (its image is built on the
  // device), so it is not zeroed: at the longest contexts that would be tens of GB of memset
  // on the training thread.
  if (host != nullptr && !device->CanAllocate(1)) return host->Allocate(/*zero=*/kind != PageKind::kKv);
  return device->Allocate();
}

absl::StatusOr<PageId> SequenceKvCache::AllocateGradPage(int64_t layer, int64_t page) {
  const auto& kv = kv_pages_[layer];
  PagePool* host = Pool(PageKind::kKvGrad, Tier::kHost);
  if (host == nullptr || page >= static_cast<int64_t>(kv.size()) || kv[page].tier() == Tier::kDevice) {
    return AllocatePage(PageKind::kKvGrad);
  }
  // The KV page is on the host: so is its gradient page, while the host has room. The device's
  // gradient pages are then those of the device's KV pages, the earliest: the pages the most
  // later chunks can select, so the most contributions are added on the device.
  if (host->CanAllocate(1)) return host->Allocate();
  return Pool(PageKind::kKvGrad, Tier::kDevice)->Allocate();
}

namespace {

template <typename T>
at::Tensor UploadValues(const std::vector<T>& values, const at::Device& device) {
  return kernels::Upload(at::tensor(at::ArrayRef<T>(values)), device);
}

}  // namespace

at::Tensor Upload(const std::vector<int32_t>& values, const at::Device& device) { return UploadValues(values, device); }
at::Tensor Upload(const std::vector<int64_t>& values, const at::Device& device) { return UploadValues(values, device); }

namespace {

at::Tensor SlotTensor(const std::vector<PageId>& pages, int64_t first, int64_t last, const at::Device& device) {
  std::vector<int32_t> slots;
  for (int64_t p = first; p < last; ++p) slots.push_back(static_cast<int32_t>(pages[p].slot()));
  return Upload(slots, device);
}

at::Tensor Positions(const std::vector<int64_t>& v, const at::Device& device) { return Upload(v, device); }

// What gradient pages of `storage` dtype accumulate in: float32 for bfloat16 / float16 pages.
at::ScalarType AccumulationType(at::ScalarType storage) {
  return storage == at::kBFloat16 || storage == at::kHalf ? at::kFloat : storage;
}

bool AllOnDevice(const std::vector<PageId>& ids) {
  return std::all_of(ids.begin(), ids.end(), [](PageId id) { return !id.valid() || id.tier() == Tier::kDevice; });
}

// `ids` by tier: the positions in `ids` of the device pages and of the host pages, and their ids,
// in order.
struct TierSplit {
  std::vector<int64_t> device_pos, host_pos;
  std::vector<PageId> device_ids, host_ids;
};

TierSplit SplitByTier(const std::vector<PageId>& ids) {
  TierSplit t;
  for (size_t i = 0; i < ids.size(); ++i) {
    const bool host = ids[i].tier() == Tier::kHost;
    (host ? t.host_pos : t.device_pos).push_back(static_cast<int64_t>(i));
    (host ? t.host_ids : t.device_ids).push_back(ids[i]);
  }
  return t;
}

// [n, 2, H, P, D] page images -> K and V of their tokens, [n * P, H, D] each.
std::pair<at::Tensor, at::Tensor> TokenMajor(const at::Tensor& images) {
  const auto flat = [&](int64_t kv) {
    const at::Tensor x = images.select(1, kv);  // [n, H, P, D]
    return x.permute({0, 2, 1, 3}).reshape({x.size(0) * x.size(2), x.size(1), x.size(3)});
  };
  return {flat(0), flat(1)};
}

// The pages a sparse selection on the host ([n_tiles, kv_heads, n] page indices, -1: none)
// names, once each, ascending, and for each the KV heads whose lists name it (bit h: head h).
struct Selected {
  std::vector<int64_t> pages;
  std::vector<uint64_t> heads;
};

Selected SelectedPages(const at::Tensor& host_selection, int64_t num_pages) {
  TORCH_CHECK(host_selection.device().is_cpu() && host_selection.dim() == 3, "host_selection: expected a CPU tensor ",
              "[n_tiles, kv_heads, n], got ", host_selection.sizes(), " on ", host_selection.device());
  const int64_t kv_heads = host_selection.size(1), n = host_selection.size(2);
  TORCH_CHECK(kv_heads <= 64, "sparse page selection: at most 64 KV heads, got ", kv_heads);
  const at::Tensor flat = host_selection.to(at::kLong).contiguous();
  const int64_t* e = flat.data_ptr<int64_t>();
  std::vector<uint64_t> heads(num_pages, 0);
  for (int64_t i = 0; i < flat.numel(); ++i) {
    if (e[i] < 0) continue;
    TORCH_CHECK(e[i] < num_pages, "host_selection: page ", e[i], " of ", num_pages);
    heads[e[i]] |= uint64_t{1} << ((i / n) % kv_heads);
  }
  Selected s;
  for (int64_t page = 0; page < num_pages; ++page) {
    if (heads[page] == 0) continue;
    s.pages.push_back(page);
    s.heads.push_back(heads[page]);
  }
  return s;
}

// Of `pages` (a layer's page ids), the selected ones on the host, ascending, with the heads
// selecting each: what a gather of the selection fetches, and what an accumulation of its
// gradients adds into on the host.
SequenceKvCache::PagesInFlight HostPagesOf(const std::vector<PageId>& pages, const Selected& selected) {
  SequenceKvCache::PagesInFlight host;
  for (size_t i = 0; i < selected.pages.size(); ++i) {
    const PageId id = pages[selected.pages[i]];
    if (id.tier() != Tier::kHost) continue;
    host.ids.push_back(id);
    host.heads.push_back(selected.heads[i]);
  }
  return host;
}

// The slot of each entry of `host_selection` (on the CPU, as SelectedPages reads it; `selected`
// its pages) for the selected-pages kernels' second source (kernels/torch/page_ops.h): a device
// page's arena slot, or -1 - i for image i of the packed images of the host pages' selecting
// heads, one per (page, head) in HostPagesOf's order and each page's heads ascending.
std::vector<int32_t> EntrySlots(const std::vector<PageId>& pages, const Selected& selected,
                                const at::Tensor& host_selection) {
  std::vector<int32_t> first_image(pages.size(), 0);  // of a selected host page
  std::vector<uint64_t> heads(pages.size(), 0);
  int32_t images = 0;
  for (size_t i = 0; i < selected.pages.size(); ++i) {
    const int64_t page = selected.pages[i];
    if (pages[page].tier() != Tier::kHost) continue;
    first_image[page] = images;
    heads[page] = selected.heads[i];
    images += static_cast<int32_t>(std::popcount(selected.heads[i]));
  }
  const at::Tensor flat = host_selection.to(at::kLong).contiguous();
  const int64_t* entry = flat.data_ptr<int64_t>();
  const int64_t kv_heads = host_selection.size(1), n = host_selection.size(2);
  std::vector<int32_t> slots(flat.numel(), 0);
  for (int64_t e = 0; e < flat.numel(); ++e) {
    if (entry[e] < 0) continue;
    const PageId id = pages[entry[e]];
    const uint64_t below = (uint64_t{1} << ((e / n) % kv_heads)) - 1;  // the heads before this entry's
    slots[e] = id.tier() == Tier::kDevice
                   ? static_cast<int32_t>(id.slot())
                   : -1 - (first_image[entry[e]] + static_cast<int32_t>(std::popcount(heads[entry[e]] & below)));
  }
  return slots;
}

}  // namespace

at::Tensor SequenceKvCache::HostImages(PageKind kind, const std::vector<PageId>& host_ids,
                                       const std::vector<uint64_t>* host_heads, PagesInFlight* started) {
  const std::vector<uint64_t> whole;
  const std::vector<uint64_t>& heads = host_heads != nullptr ? *host_heads : whole;
  const auto fetches_these = [&](const PagesInFlight& f) {
    return f.fetch != nullptr && f.ids == host_ids && f.heads == heads;
  };
  const auto pre = std::find_if(prefetched_.begin(), prefetched_.end(),
                                [&](const Prefetched& p) { return p.kind == kind && fetches_these(p.pages); });
  at::Tensor images;
  if (started != nullptr && fetches_these(*started)) {
    images = pools_.copies->Await(started->fetch);
    *started = PagesInFlight();
  } else if (pre != prefetched_.end()) {
    images = pools_.copies->Await(pre->pages.fetch);
    prefetched_.erase(pre);
  } else {
    images = pools_.copies->FetchPages(*Pool(kind, Tier::kHost), host_ids, host_heads);
  }
  return images;
}

at::Tensor SequenceKvCache::Images(PageKind kind, const std::vector<PageId>& ids) {
  PagePool* device = Pool(kind, Tier::kDevice);
  const auto [device_pos, host_pos, device_ids, host_ids] = SplitByTier(ids);
  const at::Device dev = device->options().device();
  if (host_ids.empty()) {
    return device->arena().index_select(0, SlotTensor(device_ids, 0, device_ids.size(), dev).to(at::kLong));
  }
  const at::Tensor host_images = HostImages(kind, host_ids, nullptr, nullptr);
  if (device_ids.empty()) return host_images;
  at::Tensor images = at::empty({static_cast<int64_t>(ids.size()), 2, device->shape().kv_heads,
                                 device->shape().page_tokens, device->shape().head_dim},
                                device->options());
  images.index_copy_(0, Positions(device_pos, dev),
                     device->arena().index_select(0, SlotTensor(device_ids, 0, device_ids.size(), dev).to(at::kLong)));
  images.index_copy_(0, Positions(host_pos, dev), host_images);
  return images;
}

void SequenceKvCache::StoreImages(PageKind kind, const std::vector<PageId>& ids, const at::Tensor& images) {
  PagePool* device = Pool(kind, Tier::kDevice);
  const at::Device dev = device->options().device();
  const auto [device_pos, host_pos, device_ids, host_ids] = SplitByTier(ids);
  if (!device_ids.empty()) {
    device->arena().index_copy_(0, SlotTensor(device_ids, 0, device_ids.size(), dev).to(at::kLong),
                                images.index_select(0, Positions(device_pos, dev)).to(device->options().dtype()));
  }
  if (!host_ids.empty()) {
    DropPrefetch(kind, host_ids);
    pools_.copies->WritePages(
        *Pool(kind, Tier::kHost), host_ids,
        host_ids.size() == ids.size() ? images : images.index_select(0, Positions(host_pos, dev)));
  }
}

absl::Status SequenceKvCache::Append(int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  const int64_t n = k.size(0);
  auto& pages = kv_pages_[layer];
  const int64_t last = (tokens_[layer] + n + page_tokens_ - 1) / page_tokens_;
  const int64_t needed = last - static_cast<int64_t>(pages.size());
  const int64_t free_pages =
      pools_.kv->stats().free_pages() + (pools_.kv_host != nullptr ? pools_.kv_host->stats().free_pages() : 0);
  if (needed > free_pages) {
    return WithReason(absl::ResourceExhaustedError(absl::StrCat("KV pages: ", needed, " more needed at layer ", layer,
                                                                ", ", free_pages, " free")),
                      Reason::kDoesNotFit);
  }
  while (static_cast<int64_t>(pages.size()) < last) {
    auto id = AllocatePage(PageKind::kKv);
    if (!id.ok()) return id.status();
    pages.push_back(*id);
  }
  const at::ScalarType dtype = pools_.kv->options().dtype().toScalarType();
  const at::Tensor kt = k.to(dtype).permute({1, 0, 2});  // [H, n, D]
  const at::Tensor vt = v.to(dtype).permute({1, 0, 2});
  if (tokens_[layer] % page_tokens_ == 0) {
    // From a page's start (a chunk of whole pages): every page's image at once, zeros past the
    // last token, stored to whichever tier each page is on.
    const int64_t first = tokens_[layer] / page_tokens_, m = last - first;
    const at::Tensor kv = at::constant_pad_nd(at::stack({kt, vt}), {0, 0, 0, m * page_tokens_ - n});
    const at::Tensor images =
        kv.view({2, kt.size(0), m, page_tokens_, kt.size(2)}).permute({2, 0, 1, 3, 4}).contiguous();
    StoreImages(PageKind::kKv, std::vector<PageId>(pages.begin() + first, pages.begin() + last), images);
    tokens_[layer] += n;
    return absl::OkStatus();
  }
  // Host pages are written whole: their images are built on the device (a partly filled first
  // page starts from its current contents) and written back in one batch.
  std::vector<PageId> host_ids;
  std::vector<at::Tensor> host_images;
  for (int64_t done = 0; done < n;) {
    const int64_t pos = tokens_[layer] + done;
    const int64_t page = pos / page_tokens_, offset = pos % page_tokens_;
    const int64_t take = std::min(n - done, page_tokens_ - offset);
    at::Tensor slot;  // [2, H, P, D]
    if (pages[page].tier() == Tier::kDevice) {
      slot = pools_.kv->Page(pages[page]);
    } else {
      slot = offset > 0 ? Images(PageKind::kKv, {pages[page]})[0]
                        : at::zeros({2, kt.size(0), page_tokens_, kt.size(2)}, kt.options());
      host_ids.push_back(pages[page]);
      host_images.push_back(slot);
    }
    slot[0].slice(1, offset, offset + take).copy_(kt.slice(1, done, done + take));
    slot[1].slice(1, offset, offset + take).copy_(vt.slice(1, done, done + take));
    done += take;
  }
  if (!host_ids.empty()) {
    DropPrefetch(PageKind::kKv, host_ids);
    pools_.copies->WritePages(*pools_.kv_host, host_ids, at::stack(host_images));
  }
  tokens_[layer] += n;
  return absl::OkStatus();
}

std::pair<at::Tensor, at::Tensor> SequenceKvCache::Read(int64_t layer, int64_t begin, int64_t end) {
  TORCH_INTERNAL_ASSERT(0 <= begin && begin <= end && end <= tokens_[layer], "Read [", begin, ", ", end,
                        ") beyond the ", tokens_[layer], " appended tokens");
  const int64_t first = begin / page_tokens_, last = (end + page_tokens_ - 1) / page_tokens_;
  const std::vector<PageId> ids(kv_pages_[layer].begin() + first, kv_pages_[layer].begin() + last);
  const int64_t off = begin - first * page_tokens_;
  if (AllOnDevice(ids)) {
    auto [k, v] = kernels::GatherPages(pools_.kv->arena(), SlotTensor(ids, 0, ids.size(), pools_.kv->arena().device()));
    return {k.slice(1, off, off + end - begin), v.slice(1, off, off + end - begin)};
  }
  const at::Tensor images = Images(PageKind::kKv, ids);
  const at::Tensor all = at::arange(static_cast<int64_t>(ids.size()), images.options().dtype(at::kInt));
  auto [k, v] = kernels::GatherPages(images, all);
  return {k.slice(1, off, off + end - begin), v.slice(1, off, off + end - begin)};
}

absl::Status SequenceKvCache::Prefetch(int64_t layer, int64_t begin, int64_t end, bool with_grads) {
  if (!has_host() || layer >= static_cast<int64_t>(kv_pages_.size())) return absl::OkStatus();
  end = std::min(end, tokens_[layer]);
  if (begin >= end) return absl::OkStatus();
  const int64_t first = begin / page_tokens_, last = (end + page_tokens_ - 1) / page_tokens_;
  if (with_grads) OOMB_RETURN_IF_ERROR(EnsureGradPages(layer, first, last));
  for (const PageKind kind : {PageKind::kKv, PageKind::kKvGrad}) {
    if (kind == PageKind::kKvGrad && !with_grads) continue;
    const auto& pages = kind == PageKind::kKv ? kv_pages_[layer] : grad_pages_[layer];
    std::vector<PageId> host_ids;
    for (int64_t p = first; p < last; ++p) {
      if (pages[p].valid() && pages[p].tier() == Tier::kHost) host_ids.push_back(pages[p]);
    }
    StartPrefetch(kind, std::move(host_ids));
  }
  return absl::OkStatus();
}

void SequenceKvCache::StartPrefetch(PageKind kind, std::vector<PageId> host_ids, std::vector<uint64_t> host_heads) {
  if (host_ids.empty()) return;
  for (const Prefetched& p : prefetched_) {
    if (p.kind == kind && p.pages.ids == host_ids && p.pages.heads == host_heads) return;
  }
  Prefetched p{kind, {}};
  p.pages.fetch =
      pools_.copies->StartFetch(*Pool(kind, Tier::kHost), host_ids, host_heads.empty() ? nullptr : &host_heads);
  p.pages.ids = std::move(host_ids);
  p.pages.heads = std::move(host_heads);
  prefetched_.push_back(std::move(p));
  if (prefetched_.size() > kMaxPrefetches) prefetched_.pop_front();
}

void SequenceKvCache::DropPrefetch(PageKind kind, const std::vector<PageId>& ids) {
  std::erase_if(prefetched_, [&](const Prefetched& p) {
    return p.kind == kind && std::any_of(ids.begin(), ids.end(), [&](const PageId& id) {
             return std::find(p.pages.ids.begin(), p.pages.ids.end(), id) != p.pages.ids.end();
           });
  });
}

absl::Status SequenceKvCache::EnsureGradPages(int64_t layer, int64_t first, int64_t last) {
  auto& gpages = grad_pages_[layer];
  if (static_cast<int64_t>(gpages.size()) < last) gpages.resize(last);
  for (int64_t p = first; p < last; ++p) {
    if (gpages[p].valid() || GradDropped(p)) continue;
    auto id = AllocateGradPage(layer, p);
    if (!id.ok()) return id.status();
    gpages[p] = *id;
  }
  return absl::OkStatus();
}

absl::Status SequenceKvCache::AccumulateGrad(int64_t layer, int64_t begin, const at::Tensor& dk, const at::Tensor& dv) {
  const int64_t end = begin + dk.size(1);
  const int64_t first = begin / page_tokens_, last = (end + page_tokens_ - 1) / page_tokens_;
  OOMB_RETURN_IF_ERROR(EnsureGradPages(layer, first, last));
  const auto& gpages = grad_pages_[layer];
  const int64_t off = begin - first * page_tokens_, padded = (last - first) * page_tokens_;
  const at::ScalarType dtype = AccumulationType(pools_.grad->options().dtype().toScalarType());
  auto pad = [&](const at::Tensor& x) {
    if (off == 0 && x.size(1) == padded && x.scalar_type() == dtype) return x.contiguous();
    at::Tensor y = at::zeros({x.size(0), padded, x.size(2)}, x.options().dtype(dtype));
    y.slice(1, off, off + x.size(1)).copy_(x);
    return y;
  };
  std::vector<PageId> ids;
  std::vector<int64_t> kept;  // positions in [first, last) of the pages that keep gradients
  for (int64_t p = first; p < last; ++p) {
    if (!gpages[p].valid()) continue;  // dropped (DropGradients)
    ids.push_back(gpages[p]);
    kept.push_back(p - first);
  }
  if (ids.empty()) return absl::OkStatus();
  // [H, padded, D] -> the kept pages' tokens, [H, kept * P, D].
  auto rows = [&](const at::Tensor& x) {
    const at::Tensor padded_x = pad(x);
    if (static_cast<int64_t>(kept.size()) == last - first) return padded_x;
    return padded_x.view({x.size(0), last - first, page_tokens_, x.size(2)})
        .index_select(1, Positions(kept, x.device()))
        .view({x.size(0), -1, x.size(2)});
  };
  if (AllOnDevice(ids) && pools_.grad->options().dtype() == dtype) {
    kernels::ScatterAddPages(pools_.grad->arena(), SlotTensor(ids, 0, ids.size(), pools_.grad->arena().device()),
                             rows(dk), rows(dv));
    return absl::OkStatus();
  }
  // Host pages, or bfloat16 storage: the pages' images in the accumulation type, added to,
  // stored back (rounded once per contribution).
  at::Tensor images = Images(PageKind::kKvGrad, ids).to(dtype);
  kernels::ScatterAddPages(images, at::arange(static_cast<int64_t>(ids.size()), images.options().dtype(at::kInt)),
                           rows(dk), rows(dv));
  StoreImages(PageKind::kKvGrad, ids, images);
  return absl::OkStatus();
}

std::vector<PageId> SequenceKvCache::GradPagesIn(int64_t layer, int64_t begin, int64_t end,
                                                 std::vector<int64_t>* pos) const {
  const int64_t first = begin / page_tokens_, last = (end + page_tokens_ - 1) / page_tokens_;
  const auto& gpages = grad_pages_[layer];
  std::vector<PageId> ids;
  for (int64_t p = first; p < std::min<int64_t>(last, gpages.size()); ++p) {
    if (!gpages[p].valid()) continue;
    ids.push_back(gpages[p]);
    if (pos != nullptr) pos->push_back(p - first);
  }
  return ids;
}

void SequenceKvCache::PrefetchGrad(int64_t layer, int64_t begin, int64_t end) {
  if (!has_host() || layer < 0 || layer >= static_cast<int64_t>(grad_pages_.size())) return;
  StartPrefetch(PageKind::kKvGrad, SplitByTier(GradPagesIn(layer, begin, end, nullptr)).host_ids);
}

std::pair<at::Tensor, at::Tensor> SequenceKvCache::ReadGrad(int64_t layer, int64_t begin, int64_t end) {
  PagePool* grad = pools_.grad;
  const PageShape& s = grad->shape();
  const int64_t first = begin / page_tokens_, last = (end + page_tokens_ - 1) / page_tokens_;
  std::vector<int64_t> pos;
  const std::vector<PageId> ids = GradPagesIn(layer, begin, end, &pos);
  at::Tensor images = at::zeros({last - first, 2, s.kv_heads, s.page_tokens, s.head_dim}, grad->options());
  if (!ids.empty()) images.index_copy_(0, Positions(pos, images.device()), Images(PageKind::kKvGrad, ids));
  auto [dk, dv] = TokenMajor(images);
  const int64_t off = begin - first * page_tokens_;
  return {dk.slice(0, off, off + end - begin), dv.slice(0, off, off + end - begin)};
}

absl::Status SequenceKvCache::EnsureSelectedGradPages(int64_t layer, const std::vector<int64_t>& pages) {
  auto& gpages = grad_pages_[layer];
  if (gpages.size() < kv_pages_[layer].size()) gpages.resize(kv_pages_[layer].size());
  for (const int64_t page : pages) {
    if (gpages[page].valid() || GradDropped(page)) continue;
    auto id = AllocateGradPage(layer, page);
    if (!id.ok()) return id.status();
    gpages[page] = *id;
  }
  return absl::OkStatus();
}

absl::Status SequenceKvCache::PrefetchPages(int64_t layer, const at::Tensor& host_selection, bool with_grads) {
  if (!has_host() || layer >= static_cast<int64_t>(kv_pages_.size())) return absl::OkStatus();
  const Selected selected = SelectedPages(host_selection, static_cast<int64_t>(kv_pages_[layer].size()));
  // Gradient pages are allocated, not fetched: AccumulatePageGrad adds into host ones on the
  // host. KV pages: the selecting heads only, as GatherPages fetches them.
  if (with_grads) OOMB_RETURN_IF_ERROR(EnsureSelectedGradPages(layer, selected.pages));
  PagesInFlight host = HostPagesOf(kv_pages_[layer], selected);
  StartPrefetch(PageKind::kKv, std::move(host.ids), std::move(host.heads));
  return absl::OkStatus();
}

SequenceKvCache::PagesInFlight SequenceKvCache::StartGather(int64_t layer, const at::Tensor& host_selection) {
  if (!has_host()) return PagesInFlight();
  const Selected selected = SelectedPages(host_selection, static_cast<int64_t>(kv_pages_[layer].size()));
  PagesInFlight host = HostPagesOf(kv_pages_[layer], selected);
  if (!host.ids.empty()) host.fetch = pools_.copies->StartFetch(*pools_.kv_host, host.ids, &host.heads);
  return host;
}

std::pair<at::Tensor, at::Tensor> SequenceKvCache::GatherPages(int64_t layer, const at::Tensor& selection,
                                                               const at::Tensor& host_selection,
                                                               PagesInFlight* started) {
  const auto& pages = kv_pages_[layer];
  const at::Device dev = selection.device();
  const Selected selected =
      AllOnDevice(pages) ? Selected() : SelectedPages(host_selection, static_cast<int64_t>(pages.size()));
  const PagesInFlight host = HostPagesOf(pages, selected);
  if (host.ids.empty()) {  // every selected page on the device (a host page's slot is never read)
    return kernels::GatherSelectedPages(pools_.kv->arena(),
                                        SlotTensor(pages, 0, static_cast<int64_t>(pages.size()), dev), selection);
  }
  // Some selected pages on the host: their selecting heads are fetched (packed, one image per
  // page and head), and one gather reads the arena and them, by a slot per selection entry.
  const at::Tensor slots = Upload(EntrySlots(pages, selected, host_selection), dev).view(selection.sizes());
  return kernels::GatherSelectedPages(pools_.kv->arena(), slots, selection,
                                      HostImages(PageKind::kKv, host.ids, &host.heads, started));
}

absl::Status SequenceKvCache::AccumulatePageGrad(int64_t layer, const at::Tensor& selection,
                                                 const at::Tensor& host_selection, const at::Tensor& dk,
                                                 const at::Tensor& dv) {
  auto& gpages = grad_pages_[layer];
  const auto num_pages = static_cast<int64_t>(kv_pages_[layer].size());
  Selected selected = SelectedPages(host_selection, num_pages);
  OOMB_RETURN_IF_ERROR(EnsureSelectedGradPages(layer, selected.pages));
  const at::Device dev = selection.device();
  const at::Tensor flat = host_selection.to(at::kLong).contiguous();
  std::vector<int64_t> entries(flat.data_ptr<int64_t>(), flat.data_ptr<int64_t>() + flat.numel());
  at::Tensor kept_selection = selection;
  if (std::any_of(selected.pages.begin(), selected.pages.end(), [&](int64_t page) { return !gpages[page].valid(); })) {
    // SpaCO: what the selection adds to pages whose gradients are dropped is left out.
    for (int64_t& e : entries) {
      if (e >= 0 && !gpages[e].valid()) e = -1;
    }
    kept_selection = Positions(entries, dev).view(selection.sizes());
    selected = SelectedPages(at::from_blob(entries.data(), selection.sizes(), at::kLong), num_pages);
    if (selected.pages.empty()) return absl::OkStatus();
  }
  const PagesInFlight host = AllOnDevice(gpages) ? PagesInFlight() : HostPagesOf(gpages, selected);
  if (host.ids.empty()) {
    kernels::AccumulateSelectedPages(pools_.grad->arena(), SlotTensor(gpages, 0, num_pages, dev), kept_selection, dk,
                                     dv);
    return absl::OkStatus();
  }
  // Some selected pages on the host. One kernel adds the device pages' contributions into the
  // arena in place and sums the host pages' into packed images of their selecting heads (as a
  // fetch packs them), which the copy engine adds into the host pages (never fetched to be
  // added to).
  const at::Tensor kept_host = at::from_blob(entries.data(), selection.sizes(), at::kLong);
  const at::Tensor slots = Upload(EntrySlots(gpages, selected, kept_host), dev).view(selection.sizes());
  const PageShape& s = pools_.grad->shape();
  const at::Tensor images = at::empty({PackedImages(host.heads), 2, s.page_tokens, s.head_dim}, pools_.grad->options());
  kernels::AccumulateSelectedPages(pools_.grad->arena(), slots, kept_selection, dk, dv, images);
  DropPrefetch(PageKind::kKvGrad, host.ids);
  pools_.copies->AddToPages(*pools_.grad_host, host.ids, host.heads, images);
  return absl::OkStatus();
}

void SequenceKvCache::DropGradients(int64_t begin, int64_t end) {
  if (begin >= end) return;
  if (static_cast<int64_t>(token_grad_dropped_.size()) < end) token_grad_dropped_.resize(end, false);
  std::fill(token_grad_dropped_.begin() + begin, token_grad_dropped_.begin() + end, true);
  const int64_t first = begin / page_tokens_, last = (end + page_tokens_ - 1) / page_tokens_;
  if (static_cast<int64_t>(page_grad_dropped_.size()) < last) page_grad_dropped_.resize(last, false);
  for (int64_t p = first; p < last; ++p) {
    const int64_t page_end = (p + 1) * page_tokens_;
    page_grad_dropped_[p] = page_end <= static_cast<int64_t>(token_grad_dropped_.size()) &&
                            std::all_of(token_grad_dropped_.begin() + p * page_tokens_,
                                        token_grad_dropped_.begin() + page_end, [](bool dropped) { return dropped; });
  }
}

int64_t SequenceKvCache::GradPagesKept(int64_t tokens) const {
  int64_t kept = 0;
  for (int64_t p = 0; p < (tokens + page_tokens_ - 1) / page_tokens_; ++p) kept += GradDropped(p) ? 0 : 1;
  return kept;
}

void SequenceKvCache::ReleaseFrom(int64_t token) {
  const int64_t first_page = (token + page_tokens_ - 1) / page_tokens_;
  // No copy may still read or write a host page once it is freed (and zeroed on reuse); the
  // additions into earlier pages go on.
  if (has_host()) {
    for (const PageKind kind : {PageKind::kKv, PageKind::kKvGrad}) {
      std::vector<PageId> freed;
      for (const auto& layer : kind == PageKind::kKv ? kv_pages_ : grad_pages_) {
        for (auto p = static_cast<int64_t>(layer.size()) - 1; p >= first_page; --p) {
          if (layer[p].valid() && layer[p].tier() == Tier::kHost) freed.push_back(layer[p]);
        }
      }
      if (!freed.empty()) pools_.copies->FencePages(*Pool(kind, Tier::kHost), freed);
    }
  }
  prefetched_.clear();
  for (size_t layer = 0; layer < kv_pages_.size(); ++layer) {
    auto& pages = kv_pages_[layer];
    while (static_cast<int64_t>(pages.size()) > first_page) {
      Pool(PageKind::kKv, pages.back().tier())->Free(pages.back());
      pages.pop_back();
    }
    auto& gpages = grad_pages_[layer];
    while (static_cast<int64_t>(gpages.size()) > first_page) {
      if (gpages.back().valid()) Pool(PageKind::kKvGrad, gpages.back().tier())->Free(gpages.back());
      gpages.pop_back();
    }
    tokens_[layer] = std::min(tokens_[layer], token);
  }
}

int64_t SequenceKvCache::grad_pages_allocated() const {
  int64_t n = 0;
  for (const auto& layer : grad_pages_) {
    for (const PageId& id : layer) n += id.valid() ? 1 : 0;
  }
  return n;
}

}  // namespace oomb
