#include "worker/kv/page_pool.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/torch/page_ops.h"

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
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate a ", KindName(kind), " page arena of ", capacity_pages, " pages (",
                     capacity_pages * shape.elems() * static_cast<int64_t>(options.dtype().itemsize()), " bytes) on ",
                     TierName(tier), ": ", e.what_without_backtrace()));
  }
  return std::unique_ptr<PagePool>(new PagePool(kind, tier, shape, std::move(arena)));
}

PagePool::PagePool(PageKind kind, Tier tier, PageShape shape, at::Tensor arena)
    : kind_(kind), tier_(tier), shape_(shape), arena_(std::move(arena)), in_use_(arena_.size(0), false) {
  for (int64_t i = 0; i < arena_.size(0); ++i) free_.push_back(static_cast<uint32_t>(i));
}

absl::StatusOr<PageId> PagePool::Allocate() {
  if (free_.empty()) {
    return absl::ResourceExhaustedError(absl::StrCat(KindName(kind_), " page pool on ", TierName(tier_), " is full (",
                                                     arena_.size(0), " pages of ",
                                                     shape_.elems() * arena_.element_size(), " bytes)"));
  }
  const uint32_t slot = free_.front();
  free_.pop_front();
  in_use_[slot] = true;
  ++used_;
  peak_used_ = std::max(peak_used_, used_);
  Publish();
  const PageId id(tier_, slot);
  Page(id).zero_();
  return id;
}

void PagePool::Free(PageId id) {
  TORCH_INTERNAL_ASSERT(id.valid() && id.tier() == tier_ && id.slot() < in_use_.size() && in_use_[id.slot()],
                        "PagePool::Free: page ", id.raw(), " is not in use in this pool");
  in_use_[id.slot()] = false;
  free_.push_back(id.slot());
  --used_;
  Publish();
}

at::Tensor PagePool::Page(PageId id) const { return arena_[id.slot()]; }

PoolStats PagePool::stats() const {
  PoolStats s;
  s.kind = kind_;
  s.tier = tier_;
  s.capacity_pages = arena_.size(0);
  s.used_pages = used_;
  s.peak_used_pages = peak_used_;
  s.bytes_per_page = shape_.elems() * static_cast<int64_t>(arena_.element_size());
  return s;
}

SequenceKvCache::SequenceKvCache(PagePool* kv_pool, PagePool* grad_pool, int64_t num_layers)
    : kv_(kv_pool),
      grad_(grad_pool),
      page_tokens_(kv_pool->shape().page_tokens),
      kv_pages_(num_layers),
      grad_pages_(num_layers),
      tokens_(num_layers, 0) {}

SequenceKvCache::~SequenceKvCache() { ReleaseFrom(0); }

absl::Status SequenceKvCache::Append(int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  const int64_t n = k.size(0);
  auto& pages = kv_pages_[layer];
  const int64_t needed = (tokens_[layer] + n + page_tokens_ - 1) / page_tokens_ - static_cast<int64_t>(pages.size());
  if (!kv_->CanAllocate(needed)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV pages: ", needed, " more needed at layer ", layer, ", ", kv_->stats().free_pages(), " free"));
  }
  const at::Tensor kt = k.to(kv_->arena().scalar_type()).permute({1, 0, 2});  // [H, n, D]
  const at::Tensor vt = v.to(kv_->arena().scalar_type()).permute({1, 0, 2});
  for (int64_t done = 0; done < n;) {
    const int64_t pos = tokens_[layer] + done;
    const int64_t page = pos / page_tokens_, offset = pos % page_tokens_;
    if (page == static_cast<int64_t>(pages.size())) {
      auto id = kv_->Allocate();
      if (!id.ok()) return id.status();
      pages.push_back(*id);
    }
    const int64_t take = std::min(n - done, page_tokens_ - offset);
    at::Tensor slot = kv_->Page(pages[page]);  // [2, H, P, D]
    slot[0].slice(1, offset, offset + take).copy_(kt.slice(1, done, done + take));
    slot[1].slice(1, offset, offset + take).copy_(vt.slice(1, done, done + take));
    done += take;
  }
  tokens_[layer] += n;
  return absl::OkStatus();
}

namespace {

at::Tensor SlotTensor(const std::vector<PageId>& pages, int64_t first, int64_t last, const at::Device& device) {
  std::vector<int32_t> slots;
  for (int64_t p = first; p < last; ++p) slots.push_back(static_cast<int32_t>(pages[p].slot()));
  return at::tensor(slots, at::TensorOptions().dtype(at::kInt)).to(device);
}

}  // namespace

std::pair<at::Tensor, at::Tensor> SequenceKvCache::Read(int64_t layer, int64_t begin, int64_t end) const {
  TORCH_INTERNAL_ASSERT(0 <= begin && begin <= end && end <= tokens_[layer], "Read [", begin, ", ", end,
                        ") beyond the ", tokens_[layer], " appended tokens");
  const int64_t first = begin / page_tokens_, last = (end + page_tokens_ - 1) / page_tokens_;
  auto [k, v] = kernels::GatherPages(kv_->arena(), SlotTensor(kv_pages_[layer], first, last, kv_->arena().device()));
  const int64_t off = begin - first * page_tokens_;
  return {k.slice(1, off, off + end - begin), v.slice(1, off, off + end - begin)};
}

absl::Status SequenceKvCache::AccumulateGrad(int64_t layer, int64_t begin, const at::Tensor& dk, const at::Tensor& dv) {
  const int64_t end = begin + dk.size(1);
  const int64_t first = begin / page_tokens_, last = (end + page_tokens_ - 1) / page_tokens_;
  auto& gpages = grad_pages_[layer];
  if (static_cast<int64_t>(gpages.size()) < last) gpages.resize(last);
  for (int64_t p = first; p < last; ++p) {
    if (gpages[p].valid()) continue;
    auto id = grad_->Allocate();
    if (!id.ok()) return id.status();
    gpages[p] = *id;
  }
  const int64_t off = begin - first * page_tokens_, padded = (last - first) * page_tokens_;
  const auto dtype = grad_->arena().scalar_type();
  auto pad = [&](const at::Tensor& x) {
    if (off == 0 && x.size(1) == padded && x.scalar_type() == dtype) return x.contiguous();
    at::Tensor y = at::zeros({x.size(0), padded, x.size(2)}, x.options().dtype(dtype));
    y.slice(1, off, off + x.size(1)).copy_(x);
    return y;
  };
  kernels::ScatterAddPages(grad_->arena(), SlotTensor(gpages, first, last, grad_->arena().device()), pad(dk), pad(dv));
  return absl::OkStatus();
}

std::pair<at::Tensor, at::Tensor> SequenceKvCache::ReadGrad(int64_t layer, int64_t begin, int64_t end) const {
  const PageShape& s = grad_->shape();
  at::Tensor dk = at::zeros({end - begin, s.kv_heads, s.head_dim}, grad_->arena().options());
  at::Tensor dv = at::zeros_like(dk);
  const auto& gpages = grad_pages_[layer];
  for (int64_t pos = begin; pos < end;) {
    const int64_t page = pos / page_tokens_, offset = pos % page_tokens_;
    const int64_t take = std::min(end - pos, page_tokens_ - offset);
    if (page < static_cast<int64_t>(gpages.size()) && gpages[page].valid()) {
      const at::Tensor slot = grad_->Page(gpages[page]);  // [2, H, P, D]
      dk.slice(0, pos - begin, pos - begin + take).copy_(slot[0].slice(1, offset, offset + take).permute({1, 0, 2}));
      dv.slice(0, pos - begin, pos - begin + take).copy_(slot[1].slice(1, offset, offset + take).permute({1, 0, 2}));
    }
    pos += take;
  }
  return {dk, dv};
}

namespace {

// The rows holding head h's K (or V) of each selected page, in an arena viewed as
// [slots * 2 * kv_heads, page_tokens, head_dim]: slot * 2 * kv_heads + (V ? kv_heads : 0) + h.
// slots: [pages] int64, the layer's slot of each page; selection: [n_tiles, kv_heads, n]
// (-1 entries give the row of page 0's slot: the caller masks or filters them).
at::Tensor ArenaRows(const at::Tensor& slots, const at::Tensor& selection, bool values) {
  const int64_t kv_heads = selection.size(1);
  const at::Tensor slot = slots.index_select(0, selection.clamp_min(0).flatten()).view(selection.sizes());
  return slot * (2 * kv_heads) + (values ? kv_heads : 0) + at::arange(kv_heads, selection.options()).view({1, -1, 1});
}

}  // namespace

std::pair<at::Tensor, at::Tensor> SequenceKvCache::GatherPages(int64_t layer, const at::Tensor& selection) const {
  const PageShape& s = kv_->shape();
  const auto& pages = kv_pages_[layer];
  const at::Tensor slots = SlotTensor(pages, 0, static_cast<int64_t>(pages.size()), selection.device()).to(at::kLong);
  const at::Tensor rows = kv_->arena().view({-1, s.page_tokens, s.head_dim});
  const int64_t n_tiles = selection.size(0), n = selection.size(2);
  const at::Tensor none = (selection < 0).view({n_tiles, s.kv_heads, n, 1, 1});
  const auto take = [&](bool values) {
    return rows.index_select(0, ArenaRows(slots, selection, values).flatten())
        .view({n_tiles, s.kv_heads, n, s.page_tokens, s.head_dim})
        .masked_fill_(none, 0)
        .view({n_tiles, s.kv_heads, n * s.page_tokens, s.head_dim});
  };
  return {take(false), take(true)};
}

absl::Status SequenceKvCache::AccumulatePageGrad(int64_t layer, const at::Tensor& selection, const at::Tensor& dk,
                                                 const at::Tensor& dv) {
  const PageShape& s = grad_->shape();
  auto& gpages = grad_pages_[layer];
  if (gpages.size() < kv_pages_[layer].size()) gpages.resize(kv_pages_[layer].size());
  const at::Tensor selected = selection.to(at::kCPU).contiguous();
  const int64_t* page = selected.data_ptr<int64_t>();
  for (int64_t i = 0; i < selected.numel(); ++i) {
    if (page[i] < 0 || gpages[page[i]].valid()) continue;
    auto id = grad_->Allocate();
    if (!id.ok()) return id.status();
    gpages[page[i]] = *id;
  }
  const at::Tensor slots = SlotTensor(gpages, 0, static_cast<int64_t>(gpages.size()), selection.device()).to(at::kLong);
  const at::Tensor keep = (selection >= 0).flatten().nonzero().squeeze(1);
  at::Tensor rows = grad_->arena().view({-1, s.page_tokens, s.head_dim});
  const auto dtype = grad_->arena().scalar_type();
  for (const bool values : {false, true}) {
    const at::Tensor& d = values ? dv : dk;
    rows.index_add_(0, ArenaRows(slots, selection, values).flatten().index_select(0, keep),
                    d.reshape({-1, s.page_tokens, s.head_dim}).index_select(0, keep).to(dtype));
  }
  return absl::OkStatus();
}

void SequenceKvCache::ReleaseFrom(int64_t token) {
  const int64_t first_page = (token + page_tokens_ - 1) / page_tokens_;
  for (size_t layer = 0; layer < kv_pages_.size(); ++layer) {
    auto& pages = kv_pages_[layer];
    while (static_cast<int64_t>(pages.size()) > first_page) {
      kv_->Free(pages.back());
      pages.pop_back();
    }
    auto& gpages = grad_pages_[layer];
    while (static_cast<int64_t>(gpages.size()) > first_page) {
      if (gpages.back().valid()) grad_->Free(gpages.back());
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
