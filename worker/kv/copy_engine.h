// The copy engine between the host tier of KV pages and the device (docs/ARCHITECTURE.md §4).
//
// Host pages live in pinned host slabs (PagePool on Tier::kHost). The engine moves them in
// batches: FetchPages brings a list of host pages into one new device tensor, WritePages writes
// a device tensor of page images back into host pages. A batch is coalesced into runs of
// adjacent slots (pages written together are allocated together, so a chunk's pages of one
// layer are one run). How a batch moves (CUDA):
//   - a fetch of several runs is one copy kernel (kernels/page_copy.h LaunchCopyRuns) on a few
//     thread blocks (kCopyBlocks), reading the pinned pages through unified addressing: one
//     launch whatever the number of runs, where one cudaMemcpyAsync per run costs the host a
//     driver call per run and moves scattered runs slower; the few blocks leave most SMs to
//     the trainer;
//   - a write-back, and a fetch of one run, is DMA: one cudaMemcpyBatchAsync of every run (one
//     cudaMemcpyAsync for a single run). A kernel writing to the host slows the trainer's
//     kernels beside it, DMA does not; batching keeps the host's cost per run small.
// A fetch may bring only some KV heads of each page (sparse attention's selections are per
// head): its runs are then the K and V of those heads, and its destination holds only them,
// packed one image per (page, head), so its size follows what is fetched. (Destinations of
// whole page images, mostly unset, are large and of every size; near the device's capacity the
// caching allocator then maps memory and retries allocations, and each retry synchronizes
// every stream.) Fetches run on a high-priority stream: as SMs free up, the copy kernel's
// blocks go before the trainer's, so a fetch lands sooner and slows the trainer less than at
// normal priority.
//
// AddToPages adds into host pages instead of overwriting them, and moves only some heads of
// each: the selecting heads' rows. On the device (CUDA), on a third stream of high priority:
// the contributions come packed one image per (page, head), as a fetch of those heads packs
// them, and one addition kernel (kernels/page_copy.h LaunchAddRuns, on kAddBlocks thread
// blocks) reads each host row through unified addressing, adds the contribution and writes the
// sum back. Sparse backward adds each chunk's page gradients this way: a gradient page on the
// host crosses the bus twice per contribution, only the heads that selected it, with no host
// thread, no staging buffer, and one launch per addition. At most kHostAddBytesInFlight of
// additions are queued (worker/paging/page_id.h); beyond, a call waits for the oldest. On the
// CPU, AddToPages adds on the host, on up to 12 threads.
//
// Why one kernel: host threads adding from a pinned staging ring pass over host memory several
// times per byte added and block the training thread whenever the ring is full; moving the
// rows by batched DMA costs the host a driver call's time per run, and a step moves very many
// runs; and splitting the addition into a host-reading and a host-writing kernel disturbs the
// trainer's kernels more than the one kernel does.
//
// Ordering (CUDA), on dedicated streams, one per direction (and the additions' third):
//   - a fetch starts after the earlier fetches and after the newest write-back or addition
//     queued into any of its pages (only those: a fetch of other pages does not wait for the
//     additions), not after the caller's queued work: its destination is allocated on
//     the fetch stream, whose earlier users of that memory were fetches. So a fetch started
//     while the device is busy comes in at once. Await makes the current stream wait for the
//     fetch's event before anything it queues next (no read before the copy lands), and keeps
//     the destination from reuse until that stream is done with it;
//   - a write-back or addition starts after the current stream's queued work (which produced
//     the images) and after the newest write-back or addition into its pages (an addition
//     reads them); the images stay allocated until it is done (recordStream);
//   - Fence() waits for every stream, FencePages for the copies touching some pages: callers
//     fence before a host page is freed or reused, so no copy still reads or writes a page the
//     host zeroes or hands to someone else.
// StartFetch lets a caller queue a fetch early (prefetch) and collect it later with Await: the
// copy overlaps whatever the current stream does in between.
//
// On the CPU there is nothing to overlap: copies are done at once, and the "device" tensors are
// CPU tensors. Counters of bytes moved each way feed the PCIe metrics; an observer, when set,
// gets every batch with its duration (CUDA: between events around it on its stream, reported
// at the next Fence, when they are known).
//
// Thread-safety: none; one engine per training thread.
#ifndef OOMB_WORKER_KV_COPY_ENGINE_H_
#define OOMB_WORKER_KV_COPY_ENGINE_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "worker/kv/page_pool.h"
#include "worker/metrics/kv_stats.h"

namespace oomb {

// The images of a packed (page, head) layout (StartFetch with heads, AddToPages): one per KV
// head set in each of `heads`.
int64_t PackedImages(const std::vector<uint64_t>& heads);

// A fetch in flight: its destination (StartFetch) and the event the current stream must wait for
// before using it.
class PendingFetch;
struct CopyRun;

class CopyEngine {
 public:
  // `device`: where the fetched pages go (the model's device).
  explicit CopyEngine(at::Device device);
  ~CopyEngine();
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  // Queues the copy of `ids` (host pages of `pool`) into a new device tensor: the pages
  // [n, 2, kv_heads, page_tokens, head_dim]; or, with `heads` (for each page, a bitmask of the
  // KV heads whose K and V to bring: sparse attention reads only the heads that selected a
  // page), one image per (page, head) set, [m, 2, page_tokens, head_dim], in order of page and
  // then head.
  std::shared_ptr<PendingFetch> StartFetch(const PagePool& pool, const std::vector<PageId>& ids,
                                           const std::vector<uint64_t>* heads = nullptr);
  // The fetched pages, as StartFetch lays them out, on the device, ready for the current stream.
  at::Tensor Await(const std::shared_ptr<PendingFetch>& pending);
  at::Tensor FetchPages(const PagePool& pool, const std::vector<PageId>& ids,
                        const std::vector<uint64_t>* heads = nullptr) {
    return Await(StartFetch(pool, ids, heads));
  }

  // Queues the copy of `images` [n, 2, kv_heads, page_tokens, head_dim] (device, the pool's
  // dtype) into the host pages `ids`.
  void WritePages(PagePool& pool, const std::vector<PageId>& ids, const at::Tensor& images);

  // Queues adding, into the host pages `ids` (distinct) of `pool`, the K and V of the KV heads
  // set in heads[i]: `images` packed as StartFetch packs a fetch of those heads, one image per
  // (page, head), [m, 2, page_tokens, head_dim], in order of page and then head (device, the
  // pool's dtype, contiguous). bfloat16 pages are added in float32, rounded once per addition,
  // the same on the device and on the host; a later fetch of these pages sees the sums.
  void AddToPages(PagePool& pool, const std::vector<PageId>& ids, const std::vector<uint64_t>& heads,
                  const at::Tensor& images);

  // Swap instead of recompute (worker/train/attention_swap.h): tensors rather than pages, on
  // the same streams. HostBuffer gives host memory for them: `bytes` bytes, pinned on a GPU
  // (cudaHostAlloc, exactly that size: LibTorch's pinned allocator rounds up to a power of
  // two); c10::Error when the host has no memory for it. WriteToHost queues the copy of `src`
  // (device, contiguous) into `host` (contiguous, as many bytes or more; pinned on a GPU)
  // after the current stream's queued work, like a write-back; `src` stays allocated until it
  // is done. StartUpload queues the copy of such a `host` tensor into a new device tensor of
  // its shape and dtype, like a fetch, after every WriteToHost queued before it; Await gives
  // it. Both count as PCIe traffic of kind kSwap.
  at::Tensor HostBuffer(int64_t bytes) const;
  void WriteToHost(const at::Tensor& src, const at::Tensor& host);
  std::shared_ptr<PendingFetch> StartUpload(const at::Tensor& host);

  // Waits until every queued copy is done.
  void Fence();
  // Waits until no queued copy reads or writes any of `ids` (host pages of `pool`): every fetch
  // queued so far, and the newest write-back or addition into them. Before freeing pages, this
  // lets additions into other pages run on behind the caller.
  void FencePages(const PagePool& pool, const std::vector<PageId>& ids);

  int64_t bytes_to_device() const { return bytes_to_device_; }
  int64_t bytes_to_host() const { return bytes_to_host_; }
  // Seconds AddToPages' callers waited for earlier additions to finish (CUDA: more than
  // kHostAddBytesInFlight of them queued).
  double add_wait_seconds() const { return static_cast<double>(add_wait_ns_) * 1e-9; }

  // Durations are reported when known: at Fence, or at a FencePages after the batch ended.
  using Observer = std::function<void(TransferDirection, PageKind, int64_t bytes, double seconds)>;
  void set_observer(Observer observer) { observer_ = std::move(observer); }

 private:
  struct Streams;
  // Queues `runs` on the direction's stream between two timing events (CUDA); on the CPU,
  // copies them.
  void Copy(TransferDirection direction, PageKind kind, const std::vector<CopyRun>& runs);
  at::Device device_;
  Observer observer_;
  std::unique_ptr<Streams> streams_;  // CUDA only
  int64_t bytes_to_device_ = 0;
  int64_t bytes_to_host_ = 0;
  int64_t add_wait_ns_ = 0;
};

}  // namespace oomb

#endif  // OOMB_WORKER_KV_COPY_ENGINE_H_
