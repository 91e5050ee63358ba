#include "worker/kv/kv_store.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <bit>

#include "absl/strings/str_cat.h"
#include "kernels/torch/page_ops.h"
#include "kernels/torch/upload.h"
#include "worker/common/status.h"
#include "worker/kv/copy_engine.h"

namespace oomb {

// The pages a sparse selection on the host ([n_tiles, kv_heads, n] page indices, -1: none)
// names, once each, ascending, and for each the KV heads whose lists name it (bit h: head h).
struct kv_internal::Selected {
  std::vector<int64_t> pages;
  std::vector<uint64_t> heads;
};
namespace {

template <typename T>
at::Tensor UploadValues(const std::vector<T>& values, const at::Device& device) {
  return kernels::Upload(at::tensor(at::ArrayRef<T>(values)), device);
}

at::Tensor Upload(const std::vector<int32_t>& values, const at::Device& device) { return UploadValues(values, device); }
at::Tensor Upload(const std::vector<int64_t>& values, const at::Device& device) { return UploadValues(values, device); }

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

using kv_internal::Selected;

absl::StatusOr<Selected> SelectedPages(const at::Tensor& host_selection, int64_t num_pages) {
  if (!host_selection.device().is_cpu() || host_selection.dim() != 3 || host_selection.size(1) > 64) {
    return absl::InvalidArgumentError(absl::StrCat("host_selection: expected a CPU tensor [n_tiles, kv_heads <= 64, n]",
                                                   ", got ", host_selection.dim(), " dimensions on ",
                                                   host_selection.device().str()));
  }
  const int64_t kv_heads = host_selection.size(1), n = host_selection.size(2);
  const at::Tensor flat = host_selection.to(at::kLong).contiguous();
  const int64_t* e = flat.data_ptr<int64_t>();
  std::vector<uint64_t> heads(num_pages, 0);
  for (int64_t i = 0; i < flat.numel(); ++i) {
    if (e[i] < 0) continue;
    if (e[i] >= num_pages) {
      return absl::InvalidArgumentError(absl::StrCat("host_selection: page ", e[i], " of ", num_pages));
    }
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
KvStore::PagesInFlight HostPagesOf(const std::vector<PageId>& pages, const Selected& selected) {
  KvStore::PagesInFlight host;
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

KvStore::KvStore(KvPools pools, int64_t num_layers, PastReach reach)
    : pools_(pools), table_(num_layers, pools.kv->shape().page_tokens, std::move(reach)) {
  TORCH_INTERNAL_ASSERT(!has_host() || pools_.copies != nullptr, "KvStore: host pools need a copy engine");
}

KvStore::~KvStore() { ReleaseFrom(0); }

PagePool* KvStore::Pool(PageKind kind, Tier tier) const {
  if (kind == PageKind::kKv) return tier == Tier::kHost ? pools_.kv_host : pools_.kv;
  return tier == Tier::kHost ? pools_.grad_host : pools_.grad;
}

absl::StatusOr<PageId> KvStore::AllocatePage(PageKind kind) {
  PagePool* device = Pool(kind, Tier::kDevice);
  PagePool* host = Pool(kind, Tier::kHost);
  // Append writes a host KV page whole before anything reads it (its image is built on the
  // device), so it is not zeroed: at the longest contexts that would be tens of GB of memset
  // on the training thread.
  if (host != nullptr && !device->CanAllocate(1)) return host->Allocate(/*zero=*/kind != PageKind::kKv);
  return device->Allocate();
}

absl::StatusOr<PageId> KvStore::AllocateGradPage(int64_t layer, int64_t page) {
  const auto& kv = table_.kv_pages(layer);
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

absl::Status KvStore::AllocateGradPages(int64_t layer, const std::vector<int64_t>& pages) {
  for (const int64_t page : pages) {
    OOMB_ASSIGN_OR_RETURN(const PageId id, AllocateGradPage(layer, page));
    table_.SetGradPage(layer, page, id);
  }
  return absl::OkStatus();
}

at::Tensor KvStore::HostImages(PageKind kind, const std::vector<PageId>& host_ids,
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

at::Tensor KvStore::Images(PageKind kind, const std::vector<PageId>& ids) {
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

void KvStore::StoreImages(PageKind kind, const std::vector<PageId>& ids, const at::Tensor& images) {
  PagePool* device = Pool(kind, Tier::kDevice);
  const at::Device dev = device->options().device();
  const auto [device_pos, host_pos, device_ids, host_ids] = SplitByTier(ids);
  if (!device_ids.empty()) {
    // Every page on the device: the images in order, converted without a gathered copy.
    const at::Tensor device_images = host_ids.empty() ? images : images.index_select(0, Positions(device_pos, dev));
    device->arena().index_copy_(0, SlotTensor(device_ids, 0, device_ids.size(), dev).to(at::kLong),
                                device_images.to(device->options().dtype()));
  }
  if (!host_ids.empty()) {
    DropPrefetch(kind, host_ids);
    pools_.copies->WritePages(
        *Pool(kind, Tier::kHost), host_ids,
        host_ids.size() == ids.size() ? images : images.index_select(0, Positions(host_pos, dev)));
  }
}

absl::Status KvStore::Append(int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  const PageTable::AppendPlan plan = table_.PlanAppend(layer, k.size(0));
  const int64_t free_pages =
      pools_.kv->stats().free_pages() + (pools_.kv_host != nullptr ? pools_.kv_host->stats().free_pages() : 0);
  if (plan.new_pages > free_pages) {
    return WithReason(absl::ResourceExhaustedError(absl::StrCat("KV pages: ", plan.new_pages, " more needed at layer ",
                                                                layer, ", ", free_pages, " free")),
                      Reason::kDoesNotFit);
  }
  std::vector<PageId> pages;
  for (int64_t i = 0; i < plan.new_pages; ++i) {
    absl::StatusOr<PageId> id = AllocatePage(PageKind::kKv);
    if (!id.ok()) {
      for (const PageId& p : pages) Pool(PageKind::kKv, p.tier())->Free(p);
      return id.status();
    }
    pages.push_back(*id);
  }
  const int64_t P = table_.page_tokens(), start = table_.tokens(layer);
  table_.CommitAppend(plan, pages);
  const at::ScalarType dtype = pools_.kv->options().dtype().toScalarType();
  const at::Tensor kt = k.to(dtype).permute({1, 0, 2});  // [H, n, D]
  const at::Tensor vt = v.to(dtype).permute({1, 0, 2});
  if (!plan.page_aligned) {
    StorePartial(layer, start, kt, vt);
  } else {
    // From a page's start (a chunk of whole pages): every page's image at once, zeros past the
    // last token, stored to whichever tier each page is on.
    const int64_t m = plan.new_pages;
    const at::Tensor kv = at::constant_pad_nd(at::stack({kt, vt}), {0, 0, 0, m * P - plan.n});
    const at::Tensor images = kv.view({2, kt.size(0), m, P, kt.size(2)}).permute({2, 0, 1, 3, 4}).contiguous();
    StoreImages(PageKind::kKv, pages, images);
  }
  Free(table_.ReleaseUnreachable(layer));
  return absl::OkStatus();
}

void KvStore::StorePartial(int64_t layer, int64_t start, const at::Tensor& kt, const at::Tensor& vt) {
  // The tokens start inside a page. Host pages are written whole: their images are built on the
  // device (a partly filled first page starts from its current contents) and written back in
  // one batch.
  const int64_t P = table_.page_tokens(), n = kt.size(1);
  const auto& pages = table_.kv_pages(layer);
  std::vector<PageId> host_ids;
  std::vector<at::Tensor> host_images;
  for (int64_t done = 0; done < n;) {
    const int64_t pos = start + done;
    const int64_t page = pos / P, offset = pos % P;
    const int64_t take = std::min(n - done, P - offset);
    at::Tensor slot;  // [2, H, P, D]
    if (pages[page].tier() == Tier::kDevice) {
      slot = pools_.kv->Page(pages[page]);
    } else {
      slot = offset > 0 ? Images(PageKind::kKv, {pages[page]})[0]
                        : at::zeros({2, kt.size(0), P, kt.size(2)}, kt.options());
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
}

absl::StatusOr<KvStore::KvPair> KvStore::Read(int64_t layer, int64_t begin, int64_t end) {
  TORCH_INTERNAL_ASSERT(0 <= begin && begin <= end && end <= table_.tokens(layer), "Read [", begin, ", ", end,
                        ") beyond the ", table_.tokens(layer), " appended tokens");
  const PageTable::Range r = table_.PagesOf(begin, end);
  const auto& all = table_.kv_pages(layer);
  const std::vector<PageId> ids(all.begin() + r.first, all.begin() + r.last);
  TORCH_INTERNAL_ASSERT(std::all_of(ids.begin(), ids.end(), [](PageId id) { return id.valid(); }), "Read [", begin,
                        ", ", end, ") of layer ", layer, ": a page no later chunk reads was released");
  const int64_t off = begin - r.first * table_.page_tokens();
  if (AllOnDevice(ids)) {
    auto [k, v] = kernels::GatherPages(pools_.kv->arena(), SlotTensor(ids, 0, ids.size(), pools_.kv->arena().device()));
    return KvPair{k.slice(1, off, off + end - begin), v.slice(1, off, off + end - begin)};
  }
  const at::Tensor images = Images(PageKind::kKv, ids);
  const at::Tensor every = at::arange(static_cast<int64_t>(ids.size()), images.options().dtype(at::kInt));
  auto [k, v] = kernels::GatherPages(images, every);
  return KvPair{k.slice(1, off, off + end - begin), v.slice(1, off, off + end - begin)};
}

absl::Status KvStore::Prefetch(int64_t layer, int64_t begin, int64_t end, bool with_grads) {
  if (!has_host() || layer >= table_.num_layers()) return absl::OkStatus();
  end = std::min(end, table_.tokens(layer));
  if (begin >= end) return absl::OkStatus();
  const PageTable::Range r = table_.PagesOf(begin, end);
  if (with_grads) OOMB_RETURN_IF_ERROR(AllocateGradPages(layer, table_.MissingGradPages(layer, r)));
  for (const PageKind kind : {PageKind::kKv, PageKind::kKvGrad}) {
    if (kind == PageKind::kKvGrad && !with_grads) continue;
    const auto& pages = kind == PageKind::kKv ? table_.kv_pages(layer) : table_.grad_pages(layer);
    std::vector<PageId> host_ids;
    for (int64_t p = r.first; p < r.last; ++p) {
      if (pages[p].valid() && pages[p].tier() == Tier::kHost) host_ids.push_back(pages[p]);
    }
    StartPrefetch(kind, std::move(host_ids));
  }
  return absl::OkStatus();
}

void KvStore::StartPrefetch(PageKind kind, std::vector<PageId> host_ids, std::vector<uint64_t> host_heads) {
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

void KvStore::DropPrefetch(PageKind kind, const std::vector<PageId>& ids) {
  std::erase_if(prefetched_, [&](const Prefetched& p) {
    return p.kind == kind && std::any_of(ids.begin(), ids.end(), [&](const PageId& id) {
             return std::find(p.pages.ids.begin(), p.pages.ids.end(), id) != p.pages.ids.end();
           });
  });
}

absl::Status KvStore::AccumulateGrad(int64_t layer, int64_t begin, const at::Tensor& dk, const at::Tensor& dv) {
  const int64_t end = begin + dk.size(1), P = table_.page_tokens();
  const PageTable::Range r = table_.PagesOf(begin, end);
  OOMB_RETURN_IF_ERROR(AllocateGradPages(layer, table_.MissingGradPages(layer, r)));
  const auto& gpages = table_.grad_pages(layer);
  const int64_t off = begin - r.first * P, padded = r.size() * P;
  const at::ScalarType dtype = AccumulationType(pools_.grad->options().dtype().toScalarType());
  auto pad = [&](const at::Tensor& x) {
    if (off == 0 && x.size(1) == padded && x.scalar_type() == dtype) return x.contiguous();
    at::Tensor y = at::zeros({x.size(0), padded, x.size(2)}, x.options().dtype(dtype));
    y.slice(1, off, off + x.size(1)).copy_(x);
    return y;
  };
  std::vector<PageId> ids;
  std::vector<int64_t> kept;  // positions in [first, last) of the pages that keep gradients
  for (int64_t p = r.first; p < r.last; ++p) {
    if (!gpages[p].valid()) continue;  // dropped (DropGradients)
    ids.push_back(gpages[p]);
    kept.push_back(p - r.first);
  }
  if (ids.empty()) return absl::OkStatus();
  // [H, padded, D] -> the kept pages' tokens, [H, kept * P, D].
  auto rows = [&](const at::Tensor& x) {
    const at::Tensor padded_x = pad(x);
    if (static_cast<int64_t>(kept.size()) == r.size()) return padded_x;
    return padded_x.view({x.size(0), r.size(), P, x.size(2)})
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

absl::Status KvStore::PrefetchGrad(int64_t layer, int64_t begin, int64_t end) {
  if (!has_host() || layer < 0 || layer >= table_.num_layers()) return absl::OkStatus();
  StartPrefetch(PageKind::kKvGrad, SplitByTier(table_.GradPagesIn(layer, begin, end, nullptr)).host_ids);
  return absl::OkStatus();
}

absl::StatusOr<KvStore::KvPair> KvStore::ReadGrad(int64_t layer, int64_t begin, int64_t end) {
  PagePool* grad = pools_.grad;
  const PageShape& s = grad->shape();
  const PageTable::Range r = table_.PagesOf(begin, end);
  std::vector<int64_t> pos;
  const std::vector<PageId> ids = table_.GradPagesIn(layer, begin, end, &pos);
  at::Tensor images = at::zeros({r.size(), 2, s.kv_heads, s.page_tokens, s.head_dim}, grad->options());
  if (!ids.empty()) images.index_copy_(0, Positions(pos, images.device()), Images(PageKind::kKvGrad, ids));
  auto [dk, dv] = TokenMajor(images);
  const int64_t off = begin - r.first * table_.page_tokens();
  return KvPair{dk.slice(0, off, off + end - begin), dv.slice(0, off, off + end - begin)};
}

absl::Status KvStore::PrefetchPages(int64_t layer, const at::Tensor& host_selection, bool with_grads) {
  if (!has_host() || layer >= table_.num_layers()) return absl::OkStatus();
  const auto& pages = table_.kv_pages(layer);
  OOMB_ASSIGN_OR_RETURN(const Selected selected, SelectedPages(host_selection, static_cast<int64_t>(pages.size())));
  // Gradient pages are allocated, not fetched: AccumulatePageGrad adds into host ones on the
  // host. KV pages: the selecting heads only, as GatherPages fetches them.
  if (with_grads) OOMB_RETURN_IF_ERROR(AllocateGradPages(layer, table_.MissingGradPages(layer, selected.pages)));
  PagesInFlight host = HostPagesOf(pages, selected);
  StartPrefetch(PageKind::kKv, std::move(host.ids), std::move(host.heads));
  return absl::OkStatus();
}

absl::StatusOr<KvStore::PagesInFlight> KvStore::StartGather(int64_t layer, const at::Tensor& host_selection) {
  if (!has_host()) return PagesInFlight();
  const auto& pages = table_.kv_pages(layer);
  OOMB_ASSIGN_OR_RETURN(const Selected selected, SelectedPages(host_selection, static_cast<int64_t>(pages.size())));
  PagesInFlight host = HostPagesOf(pages, selected);
  if (!host.ids.empty()) host.fetch = pools_.copies->StartFetch(*pools_.kv_host, host.ids, &host.heads);
  return host;
}

absl::StatusOr<KvStore::KvPair> KvStore::GatherPages(int64_t layer, const at::Tensor& selection,
                                                     const at::Tensor& host_selection, PagesInFlight* started) {
  const auto& pages = table_.kv_pages(layer);
  const at::Device dev = selection.device();
  Selected selected;
  if (!AllOnDevice(pages)) {
    OOMB_ASSIGN_OR_RETURN(selected, SelectedPages(host_selection, static_cast<int64_t>(pages.size())));
  }
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

absl::Status KvStore::AccumulatePageGrad(int64_t layer, const at::Tensor& selection, const at::Tensor& host_selection,
                                         const at::Tensor& dk, const at::Tensor& dv) {
  const auto num_pages = static_cast<int64_t>(table_.kv_pages(layer).size());
  OOMB_ASSIGN_OR_RETURN(Selected selected, SelectedPages(host_selection, num_pages));
  OOMB_RETURN_IF_ERROR(AllocateGradPages(layer, table_.MissingGradPages(layer, selected.pages)));
  const auto& gpages = table_.grad_pages(layer);
  const at::Tensor flat = host_selection.to(at::kLong).contiguous();
  std::vector<int64_t> entries(flat.data_ptr<int64_t>(), flat.data_ptr<int64_t>() + flat.numel());
  at::Tensor kept_selection = selection;
  if (std::any_of(selected.pages.begin(), selected.pages.end(), [&](int64_t page) { return !gpages[page].valid(); })) {
    // SpaCO: what the selection adds to pages whose gradients are dropped is left out.
    for (int64_t& e : entries) {
      if (e >= 0 && !gpages[e].valid()) e = -1;
    }
    kept_selection = Positions(entries, selection.device()).view(selection.sizes());
    OOMB_ASSIGN_OR_RETURN(selected,
                          SelectedPages(at::from_blob(entries.data(), selection.sizes(), at::kLong), num_pages));
    if (selected.pages.empty()) return absl::OkStatus();
  }
  const at::Tensor kept_host = at::from_blob(entries.data(), selection.sizes(), at::kLong);
  AddSelectedGrads(layer, selected, kept_selection, kept_host, dk, dv);
  return absl::OkStatus();
}

void KvStore::AddSelectedGrads(int64_t layer, const kv_internal::Selected& selected, const at::Tensor& selection,
                               const at::Tensor& host_selection, const at::Tensor& dk, const at::Tensor& dv) {
  const auto& gpages = table_.grad_pages(layer);
  const auto num_pages = static_cast<int64_t>(gpages.size());
  const at::Device dev = selection.device();
  const PagesInFlight host = AllOnDevice(gpages) ? PagesInFlight() : HostPagesOf(gpages, selected);
  if (host.ids.empty()) {
    kernels::AccumulateSelectedPages(pools_.grad->arena(), SlotTensor(gpages, 0, num_pages, dev), selection, dk, dv);
    return;
  }
  // Some selected pages on the host. One kernel adds the device pages' contributions into the
  // arena in place and sums the host pages' into packed images of their selecting heads (as a
  // fetch packs them), which the copy engine adds into the host pages (never fetched to be
  // added to).
  const at::Tensor slots = Upload(EntrySlots(gpages, selected, host_selection), dev).view(selection.sizes());
  const PageShape& s = pools_.grad->shape();
  const at::Tensor images = at::empty({PackedImages(host.heads), 2, s.page_tokens, s.head_dim}, pools_.grad->options());
  kernels::AccumulateSelectedPages(pools_.grad->arena(), slots, selection, dk, dv, images);
  DropPrefetch(PageKind::kKvGrad, host.ids);
  pools_.copies->AddToPages(*pools_.grad_host, host.ids, host.heads, images);
}

void KvStore::ReleaseFrom(int64_t token) {
  Free(table_.ReleaseFrom(token));
  prefetched_.clear();
}

void KvStore::Free(const PageTable::Released& released) {
  if (released.kv.empty() && released.grad.empty()) return;
  // No copy may still read or write a host page once it is freed (and zeroed on reuse); the
  // additions into earlier pages go on.
  if (has_host()) {
    for (const PageKind kind : {PageKind::kKv, PageKind::kKvGrad}) {
      std::vector<PageId> freed;
      for (const PageId& id : kind == PageKind::kKv ? released.kv : released.grad) {
        if (id.tier() == Tier::kHost) freed.push_back(id);
      }
      if (!freed.empty()) pools_.copies->FencePages(*Pool(kind, Tier::kHost), freed);
    }
  }
  DropPrefetch(PageKind::kKv, released.kv);
  DropPrefetch(PageKind::kKvGrad, released.grad);
  for (const PageId& id : released.kv) Pool(PageKind::kKv, id.tier())->Free(id);
  for (const PageId& id : released.grad) Pool(PageKind::kKvGrad, id.tier())->Free(id);
}

}  // namespace oomb
