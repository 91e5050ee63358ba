// The KV and KV-gradient pages of one training sequence: the data operations over its page
// table (worker/paging/page_table.h), whose pages live in the pools (page_pool.h) on either tier
// and move through the copy engine (copy_engine.h). Every read returns device tensors; every
// accumulation lands in the page wherever it lives (host pages: fetched, added to on the device,
// written back; or, for sparse page gradients, added into in place by CopyEngine::AddToPages).
//
// Placement: a KV page goes to the device pool while it has room, else to the host pool (what
// fits stays on the GPU); a gradient page goes where its KV page is, while that pool has room,
// else to the other.
//
// Two families of operations, for the two attentions of worker/train/attention.h:
//   dense   Read, Prefetch, AccumulateGrad, ReadGrad, PrefetchGrad: ranges of tokens;
//   sparse  GatherPages, StartGather, PrefetchPages, AccumulatePageGrad: a page selection
//           [n_tiles, kv_heads, n] (page indices of the layer, -1: none), on the device, with
//           the same selection on the host (which pages to fetch is read from it, so no call
//           waits for the device).
// Prefetches: the store keeps the newest kMaxPrefetches (of either family); a read of pages no
// prefetch holds exactly fetches for itself, and a write to a prefetched page drops the
// prefetch (never a stale image).
//
// Errors: every operation returns a status: RESOURCE_EXHAUSTED with reason DOES_NOT_FIT when the
// pools are full, INVALID_ARGUMENT for a selection that names pages past the layer's. LibTorch's
// own exceptions (a failed allocation, a CUDA error) are not caught here: the trainer's boundary
// turns them into statuses (worker/train/torch_status.h).
//
// Thread-safety: none; a store belongs to one training thread.
#ifndef OOMB_WORKER_KV_KV_STORE_H_
#define OOMB_WORKER_KV_KV_STORE_H_

#include <ATen/core/Tensor.h>

#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/kv/kv_pools.h"
#include "worker/kv/page_pool.h"
#include "worker/paging/page_table.h"

namespace oomb {

class PendingFetch;
namespace kv_internal {
struct Selected;  // the pages a sparse selection names (kv_store.cc)
}

class KvStore {
 public:
  // Host pages being fetched ahead of the read that uses them: which pages, which KV heads of
  // each (empty: whole pages), and the fetch (null: nothing to fetch).
  struct PagesInFlight {
    std::vector<PageId> ids;
    std::vector<uint64_t> heads;
    std::shared_ptr<PendingFetch> fetch;
  };
  using KvPair = std::pair<at::Tensor, at::Tensor>;
  static constexpr size_t kMaxPrefetches = 4;

  // `reach`: which past pages later chunks read (sliding-window layers keep only those; see
  // worker/paging/page_table.h); Append releases the others once full.
  KvStore(KvPools pools, int64_t num_layers, PastReach reach = {});
  ~KvStore();  // releases every page
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  const PageTable& table() const { return table_; }

  // Appends one chunk's keys and values, [C, kv_heads, head_dim] each, after the layer's last
  // token (converted to the pool's dtype). Nothing is allocated unless every page fits. Then
  // frees the layer's full pages no later chunk reads (PastReach).
  absl::Status Append(int64_t layer, const at::Tensor& k, const at::Tensor& v);

  // --- dense ---
  // Keys and values of tokens [begin, end), [kv_heads, end - begin, head_dim] each: one batched
  // gather (host pages: one batched fetch).
  absl::StatusOr<KvPair> Read(int64_t layer, int64_t begin, int64_t end);
  // Starts fetching the host pages a later Read(layer, begin, end) needs; `with_grads`: also the
  // gradient pages of the range, for a later AccumulateGrad (allocating those not allocated).
  absl::Status Prefetch(int64_t layer, int64_t begin, int64_t end, bool with_grads = false);
  // Adds dK, dV of tokens [begin, begin + n), [kv_heads, n, head_dim] each, into the layer's
  // gradient pages (allocated, zeroed, on the first contribution; dropped pages skipped).
  absl::Status AccumulateGrad(int64_t layer, int64_t begin, const at::Tensor& dk, const at::Tensor& dv);
  // The accumulated dK, dV of tokens [begin, end), [end - begin, kv_heads, head_dim] each, in the
  // gradient pool's dtype: zero where no page received a contribution.
  absl::StatusOr<KvPair> ReadGrad(int64_t layer, int64_t begin, int64_t end);
  // Starts fetching the host gradient pages a later ReadGrad(layer, begin, end) reads. The copy
  // waits for the additions queued into those pages, and nothing else.
  absl::Status PrefetchGrad(int64_t layer, int64_t begin, int64_t end);

  // --- sparse ---
  // Keys and values of the layer's selected pages: [n_tiles, kv_heads, n * page_tokens,
  // head_dim] each, zeros where -1, in one kernel that reads device pages from their arena and
  // host pages from where they were fetched (of a host page, only the selecting heads' K and V,
  // packed one image per (page, head)). `started`: a StartGather of this layer and selection,
  // whose fetch this call collects (one started for another selection is left alone).
  absl::StatusOr<KvPair> GatherPages(int64_t layer, const at::Tensor& selection, const at::Tensor& host_selection,
                                     PagesInFlight* started = nullptr);
  // Starts fetching the host pages GatherPages(layer, selection, host_selection) reads, for the
  // caller to hand to that call; not kept by the store, so any number may be in flight. The
  // pages must not be written before the gather.
  absl::StatusOr<PagesInFlight> StartGather(int64_t layer, const at::Tensor& host_selection);
  // Starts fetching what a later GatherPages reads, as Prefetch does for a range (`with_grads`:
  // also allocates the gradient pages a later AccumulatePageGrad adds into).
  absl::Status PrefetchPages(int64_t layer, const at::Tensor& host_selection, bool with_grads);
  // Adds dK, dV [n_tiles, kv_heads, n * page_tokens, head_dim] of the selected pages into their
  // gradient pages (allocated, zeroed, on a page's first selection). Entries of -1 and of
  // dropped pages are skipped; repeated pages receive every contribution, summed first. Host
  // pages are not fetched: one kernel adds into the device pages and sums the host pages'
  // contributions into packed images, which the copy engine adds in place (a bfloat16 page is
  // then rounded twice, the sum and the page).
  absl::Status AccumulatePageGrad(int64_t layer, const at::Tensor& selection, const at::Tensor& host_selection,
                                  const at::Tensor& dk, const at::Tensor& dv);

  // Frees, in every layer, the KV and gradient pages whose first token is >= `token` (after
  // chunk i's backward nothing reads them again).
  void ReleaseFrom(int64_t token);
  // SpaCO (PageTable::DropGradients).
  void DropGradients(int64_t begin, int64_t end) { table_.DropGradients(begin, end); }

 private:
  struct Prefetched {
    PageKind kind;
    PagesInFlight pages;
  };
  PagePool* Pool(PageKind kind, Tier tier) const;
  // Frees released pages, once no copy reads or writes the host ones.
  void Free(const PageTable::Released& released);
  bool has_host() const { return pools_.kv_host != nullptr || pools_.grad_host != nullptr; }
  absl::StatusOr<PageId> AllocatePage(PageKind kind);
  // The gradient page of the layer's page `page`: on its KV page's tier while there is room.
  absl::StatusOr<PageId> AllocateGradPage(int64_t layer, int64_t page);
  absl::Status AllocateGradPages(int64_t layer, const std::vector<int64_t>& pages);
  // The device images [n, 2, kv_heads, page_tokens, head_dim] of `ids` (either tier), in order.
  at::Tensor Images(PageKind kind, const std::vector<PageId>& ids);
  // The device images of host pages as CopyEngine::StartFetch lays them out (`host_heads`: of
  // each page, the heads to bring; null: whole pages): started, prefetched or fetched now.
  at::Tensor HostImages(PageKind kind, const std::vector<PageId>& host_ids, const std::vector<uint64_t>* host_heads,
                        PagesInFlight* started);
  // Writes images of `ids` back where they live.
  void StoreImages(PageKind kind, const std::vector<PageId>& ids, const at::Tensor& images);
  // Writes appended tokens, [kv_heads, n, head_dim] each, from token `start` (inside a page).
  void StorePartial(int64_t layer, int64_t start, const at::Tensor& kt, const at::Tensor& vt);
  // Starts fetching `host_ids` as the newest prefetch of `kind`.
  void StartPrefetch(PageKind kind, std::vector<PageId> host_ids, std::vector<uint64_t> host_heads = {});
  // Drops the prefetches of `kind` that hold one of `ids` (about to be written).
  void DropPrefetch(PageKind kind, const std::vector<PageId>& ids);
  // AccumulatePageGrad's additions: the selection's pages, on either tier (`host_selection`:
  // the same selection on the CPU, int64).
  void AddSelectedGrads(int64_t layer, const kv_internal::Selected& selected, const at::Tensor& selection,
                        const at::Tensor& host_selection, const at::Tensor& dk, const at::Tensor& dv);

  KvPools pools_;
  PageTable table_;
  std::deque<Prefetched> prefetched_;  // oldest first
};

}  // namespace oomb

#endif  // OOMB_WORKER_KV_KV_STORE_H_
